// apportion's dashboard: the queue and its reasons first, then the GPUs per type and node
// group (nodes collapsed; a group expands to its nodes GPU by GPU, a page at a time), the
// tenants against their quotas, the jobs a page at a time, the rounds; and a page per job
// (#job/ID: what every round decided about it, its state moves and its launches).
// Plain JS, no build step. Every value from the store is written with textContent (job ids
// and reasons are user input, never markup).
//
// What it reads is bounded whatever the cluster's and the queue's size: summaries
// (/api/v1/queue, /api/v1/cluster/summary, /api/v1/tenants, /api/v1/rounds/summary), one
// page of jobs, one page of nodes per expanded group. Every answer carries an ETag and is
// polled with If-None-Match: an unchanged one is a 304 without a body, and only what
// changed is drawn again. window.apportionStats counts the polls, the 304s, the sections
// drawn and the elements created (the DOM work a refresh costs).
//
// Writes (cancel) send the API token in the Authorization header, never in a cookie: the
// operator pastes it once and it stays in this tab's sessionStorage, so no other site's
// page can make the browser send it.
"use strict";

const REFRESH_MS = 2000;
const JOBS_PAGE = 50;      // jobs per page of the jobs table
const NODES_PAGE = 64;     // nodes per page of an expanded node group
const TOP = 10;            // longest waits listed
const ROUNDS = 200;        // rounds in the queue-length plot (the table shows 25)
const TENANTS = 30;        // tenants listed (most GPUs held first)
const JOB_ROWS = 200;      // rows of a job page's tables
const AUTO_OPEN_NODES = 16;  // a cluster this small opens its groups by itself
const TERMINAL = new Set(["finished", "failed", "dropped"]);
const $ = (sel) => document.querySelector(sel);
let busy = false;
let again = false;  // asked to refresh while a refresh ran: run once more when it ends
// path -> {etag, body}: the last answer of each resource, sent back as If-None-Match
const lists = new Map();
const stats = {
  polls: 0, unchanged: 0, created: 0, refreshes: 0,
  drawn: { cluster: 0, queue: 0, tenants: 0, jobs: 0, rounds: 0, groups: 0, job: 0 },
  last: null,  // the last refresh: elements it created, the sections it drew, its ms
  first: null,  // the first refresh that drew anything (the first render)
  log: [],  // the last 30 refreshes, oldest first
};
window.apportionStats = stats;
// what the operator chose: the reason whose waits are listed, the jobs' filter, tenant and
// page (a stack of cursors), the node groups open and the page each shows
const view = {
  reason: null, filter: "waiting,running", tenant: null, cursors: [null],
  open: new Set(), closed: new Set(), groupCursor: new Map(), lastSummary: null,
};
// the server's clock at its last answer against ours: waits age between answers
const clock = { server: null, client: 0 };

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  stats.created++;
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined) continue;
    if (k === "text") e.textContent = v;
    else if (k === "class") e.className = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "title" || k === "type"
             || k === "href") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

// one stable colour per job id: an FNV-1a hash of the id, spread over the hues by the
// golden angle so that ids differing in one character still look different
function colour(id) {
  let h = 0x811c9dc5;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 0x01000193) >>> 0;
  return `hsl(${((h % 997) * 137.508) % 360}, 65%, ${42 + (h >>> 12) % 18}%)`;
}

function num(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "n/a";
  if (Math.abs(x) >= 1e5 || (Math.abs(x) > 0 && Math.abs(x) < 1e-3)) return x.toExponential(2);
  return Number(x).toFixed(digits);
}

const count = (n) => Number(n || 0).toLocaleString("en-US");

function when(t) {
  return t ? new Date(t * 1000).toLocaleTimeString() : "";
}

function whenFull(t) {
  return t ? new Date(t * 1000).toLocaleString() : "";
}

function duration(s) {
  if (s === null || s === undefined) return "";
  s = Math.max(0, s);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
}

// seconds since `t` (Unix seconds) on the server's clock, as of now
function since(t) {
  const now = clock.server === null ? Date.now() / 1000
    : clock.server + (Date.now() - clock.client) / 1000;
  return now - t;
}

function token() {
  return sessionStorage.getItem("apportion-token") || "";
}

// {body, changed}: an answer, or the last one when the server says it is unchanged
async function getJSON(path) {
  const last = lists.get(path);
  const headers = last ? { "If-None-Match": last.etag } : {};
  if (token()) headers.Authorization = `Bearer ${token()}`;  // reads too (--read-token-file)
  const r = await fetch(path, { cache: "no-store", headers });
  if (r.status === 401) $("#token-box").hidden = false;
  stats.polls++;
  if (r.status === 304 && last) {
    stats.unchanged++;
    return { body: last.body, changed: false };
  }
  const body = await r.json().catch(() => ({}));
  if (!r.ok && path !== "readyz") throw new Error(`${path}: ${r.status} ${body.detail || ""}`);
  const etag = r.headers.get("ETag");
  if (r.ok && etag) lists.set(path, { etag, body });
  return { body, changed: true };
}

function showError(msg) {
  const e = $("#error");
  e.textContent = msg || "";
  e.hidden = !msg;
}

function jobLink(id) {
  return el("a", { href: `#job/${encodeURIComponent(id)}`, "data-job-link": id, text: id });
}

// a bar of used, free and unavailable parts (one element per part)
function useBar(used, free, total) {
  const bar = el("span", { class: "usebar", title: `${count(used)} allocated, ${count(free)} free, ${count(Math.max(0, total - used - free))} unavailable of ${count(total)}` });
  const parts = [["used", used], ["free", free], ["off", Math.max(0, total - used - free)]];
  for (const [cls, n] of parts) {
    if (!n) continue;
    const p = el("span", { class: cls });
    p.style.width = `${(100 * n / Math.max(1, total)).toFixed(2)}%`;
    bar.append(p);
  }
  return bar;
}

function reasonOf(j) {
  if (j.pending_reason) {
    return el("span", {},
      el("span", { class: "reason-code", text: j.pending_reason }),
      j.pending_detail ? ` ${j.pending_detail}` : "");
  }
  return el("span", { text: j.reason || "" });
}

// ---- the queue ------------------------------------------------------------------------

function queuePath() {
  const q = new URLSearchParams({ top: String(TOP) });
  if (view.reason) q.set("reason", view.reason);
  return `api/v1/queue?${q}`;
}

function drawQueue(q) {
  clock.server = q.now;
  clock.client = Date.now();
  const others = Object.entries(q.counts).filter(([k]) => !["submitted", "queued", "checkpointed"].includes(k))
    .map(([k, v]) => `${k} ${count(v)}`).join(", ");
  $("#queue-summary").textContent = `${count(q.waiting)} waiting for ${count(q.waiting_gpus)} GPUs${others ? " · " + others : ""}`;
  const list = $("#reasons");
  list.replaceChildren();
  const most = Math.max(1, ...q.reasons.map((r) => r.jobs));
  for (const r of q.reasons) {
    const bar = el("span", { class: "rbar" }, el("span"));
    bar.firstChild.style.width = `${(100 * r.jobs / most).toFixed(1)}%`;
    const b = el("button", { type: "button", class: "reason" + (view.reason === r.reason ? " chosen" : ""),
                             "data-reason": r.reason, "aria-pressed": String(view.reason === r.reason),
                             title: `${count(r.jobs)} jobs asking for ${count(r.gpus)} GPUs; the longest has waited since ${whenFull(r.oldest_submitted_at)}` },
      bar, el("span", { class: "reason-code", text: r.reason }),
      el("span", { class: "num", text: count(r.jobs) }),
      el("span", { class: "muted", "data-submitted": String(r.oldest_submitted_at), text: duration(r.longest_wait_s) }));
    b.addEventListener("click", () => {
      view.reason = view.reason === r.reason ? null : r.reason;
      refresh();
    });
    list.append(el("li", {}, b));
  }
  if (!q.reasons.length) list.append(el("li", { class: "muted", text: "no job waits" }));
  const title = $("#longest-title");
  title.replaceChildren(q.reason ? `Longest waits: ${q.reason} (${count(q.matching)} jobs) ` : "Longest waits ");
  if (q.reason) {
    const all = el("button", { type: "button", id: "reason-clear", text: "every reason" });
    all.addEventListener("click", () => { view.reason = null; refresh(); });
    title.append(all);
  }
  const body = $("#longest tbody");
  body.replaceChildren();
  for (const j of q.longest) {
    const asks = `${count(j.requested_gpus)}${j.requested_gpu_type ? " " + j.requested_gpu_type : ""}`;
    body.append(el("tr", { "data-wait-row": j.id },
      el("td", { class: "id" }, jobLink(j.id)), el("td", { text: j.tenant }),
      el("td", { text: asks, title: `${asks} GPUs, ${j.guaranteed ? "guaranteed" : "best-effort"}` }),
      el("td", { class: "num", "data-submitted": String(j.submitted_at), text: duration(j.wait_s),
                 title: `submitted ${whenFull(j.submitted_at)}; ${j.state} since ${whenFull(j.since)}` }),
      el("td", { class: "why", title: [j.pending_reason, j.pending_detail].filter(Boolean).join(": ") }, reasonOf(j))));
  }
  plot($("#plot-jct"), q.finished.map((f) => ({ x: f.finished_at, y: f.jct_s / 3600 })), { line: false });
}

// the waits shown, aged on the server's clock (no element is created)
function ageWaits() {
  for (const e of document.querySelectorAll("[data-submitted]")) {
    const text = duration(since(Number(e.getAttribute("data-submitted"))));
    if (e.textContent !== text) e.textContent = text;
  }
}

// ---- the cluster ----------------------------------------------------------------------

function isOpen(group) {
  return view.open.has(group);
}

function drawCluster(c) {
  $("#cluster-name").textContent = `${c.name} · executor ${c.executor} · a round every ${c.interval_s} s at the latest`;
  $("#token-box").hidden = !(c.writes_need_token || c.reads_need_token);
  const first = view.lastSummary === null;
  view.lastSummary = c;
  if (first && c.nodes <= AUTO_OPEN_NODES) {
    for (const t of c.gpu_types) for (const g of t.groups) view.open.add(g.group);
  }
  let cap = 0, used = 0, free = 0;
  for (const t of c.gpu_types) { cap += t.capacity; used += t.allocated; free += t.free; }
  $("#cluster-summary").textContent = `${count(c.gpus)} GPUs on ${count(c.nodes)} nodes: ${count(used)} allocated, ${count(free)} free${c.gpus > cap ? `, ${count(c.gpus - cap)} on nodes down or quarantined` : ""}`;
  const root = $("#cluster");
  root.replaceChildren();
  for (const t of c.gpu_types) {
    const box = el("div", { class: "gtype", "data-gpu-type": t.gpu_type },
      el("h3", {},
        `${t.gpu_type}: ${count(t.allocated)} of ${count(t.capacity)} allocated, ${count(t.free)} free`,
        el("span", { class: "muted", text: ` · ${count(t.nodes)} nodes${t.nodes_down ? `, ${t.nodes_down} down` : ""}${t.nodes_quarantined ? `, ${t.nodes_quarantined} quarantined` : ""}` })),
      useBar(t.allocated, t.free, t.gpus));
    for (const g of t.groups) {
      const open = isOpen(g.group);
      const toggle = el("button", { type: "button", class: "toggle", "data-toggle": g.group,
                                    "aria-expanded": String(open), text: `${open ? "▾" : "▸"} ${g.group}` });
      toggle.addEventListener("click", () => {
        if (view.open.has(g.group)) view.open.delete(g.group); else view.open.add(g.group);
        drawCluster(view.lastSummary);
        refresh();
      });
      const health = [["full", g.nodes_full], ["partly used", g.nodes_partly_used], ["idle", g.nodes_idle],
                      ["down", g.nodes_down], ["quarantined", g.nodes_quarantined]]
        .filter(([, n]) => n).map(([k, n]) => `${count(n)} ${k}`).join(", ");
      box.append(el("div", { class: "group", "data-group": g.group },
        el("div", { class: "group-head" }, toggle, useBar(g.allocated, g.free, g.gpus),
          el("span", { text: `${count(g.allocated)} of ${count(g.capacity)} allocated, ${count(g.free)} free` }),
          el("span", { class: "muted", text: `${count(g.nodes)} nodes × ${g.gpus_per_node}: ${health}` })),
        open ? el("div", { class: "nodes", "data-nodes-of": g.group }) : null));
    }
    root.append(box);
  }
  // the open groups' pages were drawn into the old elements: draw them again, unchanged
  for (const g of view.open) {
    const last = lists.get(groupPath(g));
    if (last) drawGroup(g, last.body);
  }
}

function groupPath(group) {
  const q = new URLSearchParams({ limit: String(NODES_PAGE) });
  const c = view.groupCursor.get(group);
  if (c) q.set("cursor", c);
  return `api/v1/cluster/groups/${encodeURIComponent(group)}?${q}`;
}

function drawGroup(group, page) {
  const host = [...document.querySelectorAll("[data-nodes-of]")].find((e) => e.getAttribute("data-nodes-of") === group);
  if (!host) return;
  host.replaceChildren();
  for (const n of page.nodes) {
    const gpus = el("div", { class: "gpus" });
    n.slots.forEach((job, i) => {
      const cell = el("span", { class: "gpu", title: `${n.name} GPU ${i}: ${job || "free"}` });
      if (job) {
        cell.style.background = colour(job);
        cell.setAttribute("data-job", job);
      }
      gpus.append(cell);
    });
    const label = n.state === "up" ? n.name : `${n.name} (${n.state})`;
    host.append(el("div", { class: "node" + (n.state === "up" ? "" : " down"), "data-node": n.name,
                            title: n.reason || "" },
                   el("div", { class: "node-name", text: label }), gpus));
  }
  if (page.nodes_total > page.nodes.length) {
    const pager = el("div", { class: "pager" });
    const prev = el("button", { type: "button", text: "‹ previous", disabled: page.offset === 0 });
    prev.addEventListener("click", () => {
      const back = Math.max(0, page.offset - NODES_PAGE);
      if (back) view.groupCursor.set(group, String(back)); else view.groupCursor.delete(group);
      refresh();
    });
    const next = el("button", { type: "button", text: "next ›", disabled: !page.next_cursor });
    next.addEventListener("click", () => { view.groupCursor.set(group, page.next_cursor); refresh(); });
    pager.append(prev, el("span", { class: "muted", text: ` nodes ${count(page.offset + 1)}–${count(page.offset + page.nodes.length)} of ${count(page.nodes_total)} ` }), next);
    host.append(pager);
  }
}

// ---- tenants, jobs, rounds ------------------------------------------------------------

function drawTenants(data) {
  const body = $("#tenants tbody");
  body.replaceChildren();
  for (const t of data.tenants.slice(0, TENANTS)) {
    const name = el("button", { type: "button", class: "linkish", "data-tenant": t.tenant, text: t.tenant,
                                title: "list this tenant's jobs" });
    name.addEventListener("click", () => {
      view.tenant = t.tenant;
      view.cursors = [null];
      refresh();
      $("#jobs-section").scrollIntoView();
    });
    const types = Object.entries(t.gpus).map(([k, v]) => `${count(v)} ${k}`).join(", ");
    let quota = el("span", { class: "muted", text: t.guaranteed_gpus ? `${count(t.guaranteed_gpus)} (no quota)` : "" });
    if (t.quota_gpus !== null) {
      const over = t.guaranteed_gpus > t.quota_gpus;
      quota = el("span", { class: over ? "over" : "" },
        useBar(Math.min(t.guaranteed_gpus, t.quota_gpus), Math.max(0, t.quota_gpus - t.guaranteed_gpus), t.quota_gpus),
        ` ${count(t.guaranteed_gpus)} of ${count(t.quota_gpus)}`);
    }
    body.append(el("tr", { "data-tenant-row": t.tenant },
      el("td", {}, name), el("td", { class: "num", text: count(t.running) }),
      el("td", { class: "num", text: count(t.waiting) }),
      el("td", { class: "num", text: count(t.gpus_held), title: types }),
      el("td", {}, quota),
      el("td", t.oldest_waiting_since === null ? {} : { class: "num", "data-submitted": String(t.oldest_waiting_since), text: duration(t.longest_wait_s) })));
  }
  const more = $("#tenants-more");
  more.hidden = data.tenants.length <= TENANTS;
  more.textContent = `and ${count(data.tenants.length - TENANTS)} more tenants (the metrics have every one)`;
}

function jobsPath() {
  const q = new URLSearchParams({ limit: String(JOBS_PAGE) });
  const c = view.cursors[view.cursors.length - 1];
  if (c) q.set("cursor", c);
  if (view.filter) q.set("state", view.filter);
  if (view.tenant) q.set("tenant", view.tenant);
  return `api/v1/jobs?${q}`;
}

// where a running job's estimate came from: the kind (measured, fitted, profiled,
// analytic) shown, the estimator and the detail on hover
function sourceOf(j) {
  const s = j.estimate_source;
  if (!s) return el("span", { class: "muted", text: j.estimator || "" });
  const title = [j.estimator, s.detail, ...(s.refused || []).map((r) => `refused: ${r}`)]
    .filter(Boolean).join("\n");
  return el("span", { class: "source", "data-source": s.kind, title, text: s.kind });
}

function cancelButton(id) {
  const b = el("button", { class: "cancel", type: "button", "data-cancel": id, text: "cancel" });
  b.addEventListener("click", () => cancel(id));
  return b;
}

function drawJobs(data) {
  $("#counts").textContent = Object.entries(data.counts).map(([k, v]) => `${k} ${count(v)}`).join(", ");
  $("#tenant-filter").hidden = !view.tenant;
  $("#tenant-name").textContent = view.tenant || "";
  const page = view.cursors.length;
  $("#jobs-page").textContent = `page ${page}`;
  $("#jobs-prev").disabled = page === 1;
  $("#jobs-next").disabled = !data.next_cursor;
  $("#jobs-next").dataset.cursor = data.next_cursor || "";
  const body = $("#jobs tbody");
  body.replaceChildren();
  for (const j of data.jobs) {
    const gpus = j.running ? `${j.running.gpus} × ${j.running.gpu_type}`
      : `requests ${j.requested_gpus}${j.requested_gpu_type ? " " + j.requested_gpu_type : ""}`;
    const frac = j.iterations ? j.iterations_done / j.iterations : 0;
    const bar = el("span", { class: "bar" }, el("span"));
    bar.firstChild.style.width = `${Math.min(100, 100 * frac).toFixed(1)}%`;
    const sw = el("span", { class: "swatch" });
    sw.style.background = colour(j.id);
    body.append(el("tr", { "data-job-row": j.id },
      el("td", {}, sw), el("td", {}, jobLink(j.id)), el("td", { text: j.state, class: "state" }),
      el("td", { text: gpus }),
      el("td", {}, bar, `${j.iterations_done}/${j.iterations}`),
      el("td", {}, sourceOf(j)), el("td", {}, reasonOf(j)),
      el("td", {}, TERMINAL.has(j.state) ? null : cancelButton(j.id))));
  }
  if (!data.jobs.length) body.append(el("tr", {}, el("td", { colSpan: 8, class: "muted", text: "no such job" })));
}

function drawRounds(data) {
  const body = $("#rounds tbody");
  body.replaceChildren();
  for (const r of data.rounds.slice(-25).reverse()) {
    const fb = r.fallback ? `yes: ${r.fallback_reason || ""}` : "no";
    body.append(el("tr", { "data-round": String(r.id) },
      el("td", { text: String(r.id) }), el("td", { text: when(r.committed_at) }),
      el("td", { text: r.backend }), el("td", { text: r.status }),
      el("td", { class: "num", text: num(r.objective) }), el("td", { class: "num", text: num(r.bound) }),
      el("td", { class: "num", text: r.gap === null ? "n/a" : `${(100 * r.gap).toFixed(2)} %` }),
      el("td", { class: "num", text: num(r.wall_s) }), el("td", { text: fb }),
      el("td", { class: "num", text: String(r.placed) }),
      el("td", { class: "num", text: String(r.pending) })));
  }
  plot($("#plot-queue"), data.rounds.map((r) => ({ x: r.committed_at, y: r.pending })));
}

// a small SVG chart: points [{x: unix seconds, y}], drawn as one path or as dots
function plot(svg, points, { line = true } = {}) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 480, H = 220, L = 48, R = 10, T = 10, B = 30;
  svg.replaceChildren();
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    stats.created++;
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  add("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B });
  add("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B });
  if (!points.length) {
    add("text", { x: L + 10, y: H / 2 }, "no data yet");
    return;
  }
  const xs = points.map((p) => p.x), ys = points.map((p) => p.y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y1 = Math.max(1, ...ys);
  const sx = (x) => L + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - L - R);
  const sy = (y) => H - B - (y / y1) * (H - T - B);
  add("text", { x: 4, y: T + 10 }, num(y1, y1 >= 10 ? 0 : 1));
  add("text", { x: 4, y: H - B }, "0");
  add("text", { x: L, y: H - 8 }, when(x0));
  add("text", { x: W - R, y: H - 8, "text-anchor": "end" }, when(x1));
  if (line) {
    const d = points.map((p, i) => `${i ? "L" : "M"}${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`);
    add("path", { class: "series", d: d.join(" ") });
  } else {  // one path of tiny segments: a dot per job, one element for all of them
    const d = points.map((p) => `M${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}h0`);
    add("path", { class: "dots", d: d.join(" ") });
  }
}

// ---- a job's page ---------------------------------------------------------------------

function jobFromHash() {
  const m = /^#job\/(.+)$/.exec(location.hash);
  if (!m) return null;
  try {
    return decodeURIComponent(m[1]);
  } catch (err) {
    return m[1];
  }
}

function jobPath(id) {
  return `api/v1/jobs/${encodeURIComponent(id)}?history=true`;
}

function fact(list, term, ...value) {
  list.append(el("dt", { text: term }), el("dd", {}, ...value));
}

function drawJobPage(j) {
  const title = $("#job-title");
  const sw = el("span", { class: "swatch" });
  sw.style.background = colour(j.id);
  title.replaceChildren(sw, ` ${j.id} `, el("span", { class: "badge state-" + j.state, "data-job-state": j.state, text: j.state }),
                        TERMINAL.has(j.state) ? null : cancelButton(j.id));
  const dl = $("#job-facts");
  dl.replaceChildren();
  fact(dl, "tenant", j.tenant || "default");
  fact(dl, "model", String(j.model));
  fact(dl, "asks", `${j.requested_gpus} GPUs${j.requested_gpu_type ? " " + j.requested_gpu_type : ""}`);
  fact(dl, "submitted", `${whenFull(j.submitted_at)} (`, el("span", { "data-submitted": String(j.submitted_at), text: duration(since(j.submitted_at)) }), " ago)");
  if (j.pending_reason || !TERMINAL.has(j.state) && j.state !== "running") {
    fact(dl, "why it waits", reasonOf(j),
         j.can_ever_fit === false ? el("b", { text: " (it can never fit this cluster)" }) : null);
  }
  if (j.allocation) {
    const nodes = Object.entries(j.allocation.placement || {}).map(([n, k]) => `${n}: ${k}`).join(", ");
    fact(dl, "running on", `${j.allocation.gpus} × ${j.allocation.gpu_type} (${nodes})`);
  }
  if (j.plan) {
    fact(dl, "plan", Object.entries(j.plan).map(([k, v]) => `${k} ${v}`).join(", "));
  }
  if (j.estimate_source) fact(dl, "estimate", sourceOf(j));
  const bar = el("span", { class: "bar" }, el("span"));
  bar.firstChild.style.width = `${Math.min(100, 100 * j.progress.fraction).toFixed(1)}%`;
  fact(dl, "progress", bar, `${count(j.progress.iterations_done)} of ${count(j.progress.iterations)} iterations (checkpoint at ${count(j.progress.checkpoint_iterations)})`);
  fact(dl, "restarts", `${j.restarts} (${j.starts} starts, ${j.preemptions} preemptions, ${j.interruptions} interruptions)`);
  if (j.jct_s !== null) fact(dl, "JCT", duration(j.jct_s));

  const note = $("#job-decisions-note");
  note.hidden = !j.decisions_truncated && j.decisions.length <= JOB_ROWS;
  note.textContent = "Only the newest rounds are shown; older rounds decided about it too.";
  const dec = $("#job-decisions tbody");
  dec.replaceChildren();
  for (const d of j.decisions.slice(0, JOB_ROWS)) {
    const rounds = d.rounds > 1 ? `${d.first_round}–${d.last_round} (${count(d.rounds)})` : String(d.first_round);
    const span = d.rounds > 1 ? `${when(d.first_at)} – ${when(d.last_at)}` : when(d.first_at);
    const nodes = Object.entries(d.placement || {});
    const where = nodes.slice(0, 4).map(([n, k]) => `${n}: ${k}`).join(", ") + (nodes.length > 4 ? ` and ${nodes.length - 4} more` : "");
    dec.append(el("tr", { "data-decision": d.action, class: d.applied ? "" : "muted", title: d.applied ? "" : "not applied: the job changed while the round solved" },
      el("td", { text: rounds }), el("td", { text: span }), el("td", { text: d.action }),
      el("td", { text: d.gpus ? `${d.gpus} × ${d.gpu_type}` : "" }), el("td", { text: where }),
      el("td", {}, d.reason ? el("span", { class: "reason-code", text: d.reason }) : "")));
  }
  // the state moves, newest first; a running job's keep of every round is one row
  const moves = [];
  for (const e of j.events) {
    const last = moves[moves.length - 1];
    if (last && e.src === e.dst && last.src === e.src && last.dst === e.dst && last.why === e.why) {
      last.n++;
      last.to = e;
    } else moves.push({ ...e, n: 1, to: e });
  }
  const ev = $("#job-events tbody");
  ev.replaceChildren();
  for (const m of moves.reverse().slice(0, JOB_ROWS)) {
    ev.append(el("tr", { "data-move": m.dst },
      el("td", { text: m.n > 1 ? `${whenFull(m.at)} – ${when(m.to.at)}` : whenFull(m.at) }),
      el("td", { text: m.src || "" }), el("td", { text: m.dst }),
      el("td", { text: m.round_id === null ? "" : (m.n > 1 ? `${m.round_id}–${m.to.round_id}` : String(m.round_id)) }),
      el("td", { text: m.n > 1 ? `${m.why} (${count(m.n)} rounds)` : m.why })));
  }
  const la = $("#job-launches tbody");
  la.replaceChildren();
  for (const l of j.launches.slice(-JOB_ROWS).reverse()) {
    la.append(el("tr", { "data-launch": String(l.id) },
      el("td", { text: String(l.id) }), el("td", { text: l.executor }), el("td", { text: l.action }),
      el("td", { text: l.state }), el("td", { text: l.outcome || "" }),
      el("td", { text: `${l.checkpoint_start} → ${l.checkpoint_end ?? ""}` }),
      el("td", { text: whenFull(l.created_at) }), el("td", { text: l.detail || "" })));
  }
  if (!j.launches.length) la.append(el("tr", {}, el("td", { colSpan: 8, class: "muted", text: "none (dry-run, or not started yet)" })));
}

// ---- polling --------------------------------------------------------------------------

async function refreshDashboard(drew) {
  const groups = [...view.open];
  const [summary, queue, tenants, rounds, jobs, ...pages] = await Promise.all([
    getJSON("api/v1/cluster/summary"), getJSON(queuePath()), getJSON("api/v1/tenants"),
    getJSON(`api/v1/rounds/summary?limit=${ROUNDS}`), getJSON(jobsPath()),
    ...groups.map((g) => getJSON(groupPath(g)))]);
  const t0 = performance.now();  // the drawing alone, not the waits for answers
  if (queue.changed) { drawQueue(queue.body); stats.drawn.queue++; drew.push("queue"); }
  if (summary.changed) { drawCluster(summary.body); stats.drawn.cluster++; drew.push("cluster"); }
  pages.forEach((p, i) => {  // (a new summary drew the open groups' pages already)
    if (p.changed && !summary.changed) {
      drawGroup(groups[i], p.body);
      stats.drawn.groups++;
      drew.push(`group ${groups[i]}`);
    }
  });
  // groups opened by this summary (a small cluster opens its own): their first page now
  const opened = [...view.open].filter((g) => !groups.includes(g));
  const t1 = performance.now();
  const more = await Promise.all(opened.map((g) => getJSON(groupPath(g))));
  const waited = performance.now() - t1;
  more.forEach((p, i) => { drawGroup(opened[i], p.body); stats.drawn.groups++; });
  if (tenants.changed) { drawTenants(tenants.body); stats.drawn.tenants++; drew.push("tenants"); }
  if (jobs.changed) { drawJobs(jobs.body); stats.drawn.jobs++; drew.push("jobs"); }
  if (rounds.changed) { drawRounds(rounds.body); stats.drawn.rounds++; drew.push("rounds"); }
  return performance.now() - t0 - waited;
}

async function refresh() {
  if (busy) {
    again = true;
    return;
  }
  busy = true;
  again = false;
  const created = stats.created, t0 = performance.now(), drew = [];
  let drawMs = 0;
  const job = jobFromHash();
  $("#dashboard").hidden = job !== null;
  $("#job-page").hidden = job === null;
  try {
    const readyAnswer = getJSON("readyz");
    if (job === null) {
      drawMs = await refreshDashboard(drew);
    } else {
      const answer = await getJSON(jobPath(job));
      const t1 = performance.now();
      if (answer.changed) { drawJobPage(answer.body); stats.drawn.job++; drew.push("job"); }
      drawMs = performance.now() - t1;
      document.title = `${job} · apportion`;
    }
    if (job === null) document.title = "apportion";
    ageWaits();
    const ready = (await readyAnswer).body;
    const badge = $("#ready");
    badge.textContent = ready.ready ? "ready" : `not ready (${ready.store === "ok" ? "no recent round" : ready.store})`;
    badge.className = "badge " + (ready.ready ? "ok" : "bad");
    $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    showError("");
  } catch (err) {
    showError(`cannot reach the scheduler: ${err.message}`);
  } finally {
    stats.refreshes++;
    // created: the elements this refresh made; drawMs: its drawing alone (script time,
    // without the waits for answers); ms: the whole refresh, waits included
    stats.last = { created: stats.created - created, drew, drawMs, ms: performance.now() - t0,
                   at: stats.refreshes };
    if (stats.first === null && drew.length) stats.first = stats.last;
    stats.log.push(stats.last);
    if (stats.log.length > 30) stats.log.shift();
    busy = false;
    if (again) refresh();
  }
}

async function cancel(id) {
  if (!window.confirm(`Cancel job ${id}? It is dropped and its GPUs go to the next round.`)) return;
  const headers = {};
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const r = await fetch(`api/v1/jobs/${encodeURIComponent(id)}`,
                        { method: "DELETE", headers, credentials: "omit" });
  if (!r.ok) {
    const body = await r.json().catch(() => ({}));
    const hint = r.status === 401 ? " Paste the API token in the box above." : "";
    showError(`cancel ${id}: ${r.status} ${body.detail || ""}${hint}`);
    return;
  }
  await refresh();
}

function keepToken(e) {
  sessionStorage.setItem("apportion-token", e.target.value.trim());
}

$("#token").value = token();
$("#token").addEventListener("input", keepToken);
$("#token").addEventListener("change", keepToken);
$("#job-filter").addEventListener("change", (e) => {
  view.filter = e.target.value;
  view.cursors = [null];
  refresh();
});
$("#tenant-clear").addEventListener("click", () => {
  view.tenant = null;
  view.cursors = [null];
  refresh();
});
$("#jobs-next").addEventListener("click", (e) => {
  if (!e.target.dataset.cursor) return;
  view.cursors.push(e.target.dataset.cursor);
  refresh();
});
$("#jobs-prev").addEventListener("click", () => {
  if (view.cursors.length > 1) view.cursors.pop();
  refresh();
});
window.addEventListener("hashchange", () => {
  window.scrollTo(0, 0);
  refresh();
});
refresh();
setInterval(refresh, REFRESH_MS);
