// apportion's dashboard: reads the API every few seconds and draws the cluster GPU by GPU,
// the jobs with their typed reasons, the rounds' solver reports and two plots over time.
// Plain JS, no build step. Every value from the store is written with textContent (job ids
// and reasons are user input, never markup).
//
// The lists are polled with If-None-Match: an unchanged list is a 304 without a body, and
// only what changed is drawn again. Writes (cancel) send the API token in the
// Authorization header, never in a cookie: the operator pastes it once and it stays in
// this tab's sessionStorage, so no other site's page can make the browser send it.
"use strict";

const REFRESH_MS = 2000;
const TERMINAL = new Set(["finished", "failed", "dropped"]);
const $ = (sel) => document.querySelector(sel);
let busy = false;
// path -> {etag, body}: the last answer of each list, sent back as If-None-Match
const lists = new Map();
// what the polling did (for whoever looks: polls made, 304s among them, sections drawn)
const stats = { polls: 0, unchanged: 0, drawn: { cluster: 0, jobs: 0, rounds: 0 } };
window.apportionStats = stats;
let lastCluster = "";

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") e.textContent = v;
    else if (k === "class") e.className = v;
    else if (k.startsWith("data-") || k === "title" || k === "type") e.setAttribute(k, v);
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

function when(t) {
  return t ? new Date(t * 1000).toLocaleTimeString() : "";
}

function token() {
  return sessionStorage.getItem("apportion-token") || "";
}

// {body, changed}: a list's answer, or the last one when the server says it is unchanged
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

function drawCluster(c) {
  $("#cluster-name").textContent = `${c.name} · executor ${c.executor} · a round every ${c.interval_s} s`;
  $("#token-box").hidden = !(c.writes_need_token || c.reads_need_token);
  const root = $("#cluster");
  root.replaceChildren();
  for (const t of c.gpu_types) {
    const nodes = el("div", { class: "nodes" });
    for (const n of t.nodes) {
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
      nodes.append(el("div", { class: "node" + (n.state === "up" ? "" : " down"),
                               "data-node": n.name, title: n.reason || "" },
                      el("div", { class: "node-name", text: label }), gpus));
    }
    root.append(el("div", { class: "gtype", "data-gpu-type": t.gpu_type },
      el("h3", { text: `${t.gpu_type}: ${t.allocated} of ${t.capacity} allocated, ${t.free} free` }),
      nodes));
  }
}

function reasonOf(j) {
  if (j.pending_reason) {
    return el("span", {},
      el("span", { class: "reason-code", text: j.pending_reason }),
      j.pending_detail ? ` ${j.pending_detail}` : "");
  }
  return el("span", { text: j.reason || "" });
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

function drawJobs(data) {
  const showDone = $("#show-done").checked;
  $("#counts").textContent = Object.entries(data.counts).map(([k, v]) => `${k} ${v}`).join(", ");
  const body = $("#jobs tbody");
  body.replaceChildren();
  for (const j of data.jobs) {
    if (TERMINAL.has(j.state) && !showDone) continue;
    const gpus = j.running ? `${j.running.gpus} × ${j.running.gpu_type}`
      : `requests ${j.requested_gpus}${j.requested_gpu_type ? " " + j.requested_gpu_type : ""}`;
    const frac = j.iterations ? j.iterations_done / j.iterations : 0;
    const bar = el("span", { class: "bar" }, el("span"));
    bar.firstChild.style.width = `${Math.min(100, 100 * frac).toFixed(1)}%`;
    let action = null;
    if (!TERMINAL.has(j.state)) {
      action = el("button", { class: "cancel", type: "button", "data-cancel": j.id, text: "cancel" });
      action.addEventListener("click", () => cancel(j.id));
    }
    const sw = el("span", { class: "swatch" });
    sw.style.background = colour(j.id);
    body.append(el("tr", { "data-job-row": j.id },
      el("td", {}, sw), el("td", { text: j.id }), el("td", { text: j.state, class: "state" }),
      el("td", { text: gpus }),
      el("td", {}, bar, `${j.iterations_done}/${j.iterations}`),
      el("td", {}, sourceOf(j)), el("td", {}, reasonOf(j)), el("td", {}, action)));
  }
}

function drawRounds(data) {
  const body = $("#rounds tbody");
  body.replaceChildren();
  for (const r of data.rounds.slice(-25).reverse()) {
    const s = r.solver || {};
    const fb = r.fallback ? `yes: ${r.fallback_reason || ""}` : "no";
    body.append(el("tr", { "data-round": String(r.id) },
      el("td", { text: String(r.id) }), el("td", { text: when(r.committed_at) }),
      el("td", { text: s.backend || r.backend }), el("td", { text: s.status || r.status }),
      el("td", { class: "num", text: num(r.objective) }), el("td", { class: "num", text: num(r.bound) }),
      el("td", { class: "num", text: r.gap === null ? "n/a" : `${(100 * r.gap).toFixed(2)} %` }),
      el("td", { class: "num", text: num(r.wall_s) }), el("td", { text: fb }),
      el("td", { class: "num", text: String(r.placed) }),
      el("td", { class: "num", text: String(r.pending) })));
  }
}

// a small SVG chart: points [{x: unix seconds, y}], drawn as a line or as dots
function plot(svg, points, { line = true } = {}) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 480, H = 220, L = 48, R = 10, T = 10, B = 30;
  svg.replaceChildren();
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
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
  } else {
    for (const p of points) add("circle", { class: "dot", cx: sx(p.x), cy: sy(p.y), r: 3 });
  }
}

function drawPlots(jobs, rounds) {
  plot($("#plot-queue"), rounds.rounds.map((r) => ({ x: r.committed_at, y: r.pending })));
  const done = jobs.jobs.filter((j) => j.jct_s !== null)
    .map((j) => ({ x: j.updated_at, y: j.jct_s / 3600 })).sort((a, b) => a.x - b.x);
  plot($("#plot-jct"), done, { line: false });
}

async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const [cluster, jobs, rounds, readyAnswer] = await Promise.all([
      getJSON("api/v1/cluster"), getJSON("api/v1/jobs"), getJSON("api/v1/rounds?limit=500"),
      getJSON("readyz")]);
    const ready = readyAnswer.body;
    const clusterText = JSON.stringify(cluster.body);
    if (clusterText !== lastCluster) {  // the cluster has no ETag: its health ages with time
      drawCluster(cluster.body);
      lastCluster = clusterText;
      stats.drawn.cluster++;
    }
    if (jobs.changed) {
      drawJobs(jobs.body);
      stats.drawn.jobs++;
    }
    if (rounds.changed) {
      drawRounds(rounds.body);
      stats.drawn.rounds++;
    }
    if (jobs.changed || rounds.changed) drawPlots(jobs.body, rounds.body);
    const badge = $("#ready");
    badge.textContent = ready.ready ? "ready" : `not ready (${ready.store === "ok" ? "no recent round" : ready.store})`;
    badge.className = "badge " + (ready.ready ? "ok" : "bad");
    $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    showError("");
  } catch (err) {
    showError(`cannot reach the scheduler: ${err.message}`);
  } finally {
    busy = false;
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
$("#show-done").addEventListener("change", () => {
  const jobs = lists.get("api/v1/jobs");
  if (jobs) drawJobs(jobs.body);
});
refresh();
setInterval(refresh, REFRESH_MS);
