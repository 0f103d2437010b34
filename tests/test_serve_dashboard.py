"""The dashboard in a real headless Chromium (Debian's, driven by Selenium through
chromium-driver).

On the host's own small cluster: the page loads from ``apportion serve``, draws the
cluster GPU by GPU (a cluster this small opens its node groups by itself) and a submitted
job, and a cancel clicked on the page reaches the store once the operator has pasted the
API token (sent in the Authorization header, never a cookie); every read is polled with
If-None-Match and drawn again only when it changed.

At 1,280 GPUs (Crius's simulated cluster, 420 nodes) and at 20,000 GPUs (4,000 nodes),
each with a queue of thousands of jobs decided by a real round: the queue and its reasons
are on the first screen without scrolling, no GPU is drawn until a node group is opened,
the page's elements stay under one bound at both sizes, and the work of a refresh is
counted in elements created (none when nothing changed), not timed. A group opens a page
of nodes at a time, a reason lists its own longest waits, a job's page shows what every
round decided about it. With ``APPORTION_SCREENSHOTS=DIR`` the pages are saved there as
PNG (docs/img holds those of docs/service.md).

Chromium and chromedriver come from Debian's packages (.ci/run installs them). Without
them the tests are skipped, unless APPORTION_REQUIRE_BROWSER=1 (CI) makes that a failure.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from serve_server import Served, cli, status, wait_for  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM and DRIVER):
        if os.environ.get("APPORTION_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium and chromium-driver are required (apt-get install chromium "
                        "chromium-driver)")
        pytest.skip("no chromium / chromedriver on this machine")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER),
                              options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _found(driver: webdriver.Chrome, css: str) -> list:
    return driver.find_elements(By.CSS_SELECTOR, css)


def _texts(driver: webdriver.Chrome, css: str) -> list[str]:
    """The text of every element ``css`` selects, read at once (a refresh that redraws
    between a find and a read would leave stale elements)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)", css)


def _press(driver: webdriver.Chrome, css: str) -> None:
    """A real click (one that may open a dialog), found again if a refresh replaced the
    element between the find and the click."""
    def pressed() -> bool:
        try:
            driver.find_element(By.CSS_SELECTOR, css).click()
        except StaleElementReferenceException:
            return False
        return True

    wait_for(f"a click on {css}", pressed)


def _click(driver: webdriver.Chrome, css: str) -> None:
    """Click the element ``css`` selects, found and clicked at once: a refresh redraws the
    sections it changed, so an element found earlier may be gone by the click."""
    assert driver.execute_script(
        "const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e;", css), css


def _stats(driver: webdriver.Chrome) -> dict:
    return driver.execute_script("return window.apportionStats")


def _idle_refresh(driver: webdriver.Chrome) -> dict:
    """A refresh after the last one drawn, in which nothing changed (every read a 304)."""
    seen = _stats(driver)["refreshes"]
    return wait_for("a refresh with nothing to draw", lambda: next(
        (r for r in _stats(driver)["log"] if r["at"] > seen and not r["drew"]), None))


def test_the_dashboard_shows_the_cluster_and_a_job_and_cancels_it(
        tmp_path: Path, browser: webdriver.Chrome) -> None:
    with Served(tmp_path) as served:
        doc = {"jobs": [{"id": "web-1", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 5000, "requested_gpus": 2}]}
        r = httpx.post(f"{served.url}/api/v1/jobs", json=doc, headers=served.auth, timeout=30)
        assert r.status_code == 201, r.text
        # a job larger than the cluster: the API refuses it, `submit` (no cluster) stores it
        big = {"jobs": [{"id": "web-big", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 10, "requested_gpus": 4096}]}
        (tmp_path / "big.json").write_text(json.dumps(big))
        assert cli("submit", "big.json", "--state", "s.db", cwd=tmp_path).returncode == 0
        cluster = httpx.get(f"{served.url}/api/v1/cluster", timeout=30).json()
        browser.get(served.url + "/")
        assert browser.title == "apportion"
        # the cluster, node by node and GPU by GPU, grouped by GPU type (a cluster this
        # small opens its node groups by itself)
        for t in cluster["gpu_types"]:
            for n in t["nodes"]:
                css = f'[data-gpu-type="{t["gpu_type"]}"] [data-node="{n["name"]}"] .gpu'
                wait_for(f"{n['name']}'s GPUs", lambda css=css, n=n: len(
                    _texts(browser, css)) == n["gpus"])
        # the job, placed by a round: its GPUs coloured, its row in the table
        colours = wait_for("web-1's GPUs", lambda: browser.execute_script(
            "return [...document.querySelectorAll('.gpu[data-job=\"web-1\"]')].map("
            "(e) => getComputedStyle(e).backgroundColor)"))
        assert colours[0] not in ("rgba(0, 0, 0, 0)", "")
        wait_for("web-1's row", lambda: "running" in " ".join(
            _texts(browser, 'tr[data-job-row="web-1"]')))
        # the queue: the job that can never fit, with its typed reason
        wait_for("web-big's reason", lambda: "too-large" in " ".join(
            _texts(browser, 'tr[data-job-row="web-big"]')))
        # the rounds' solver reports and the plots
        wait_for("a round in the table", lambda: _found(browser, "#rounds tbody tr"))
        assert _found(browser, "#plot-queue path.series")
        assert browser.find_element(By.ID, "ready").text == "ready"
        browser.save_screenshot(str(tmp_path / "dashboard.png"))
        # cancel from the page without the token: refused (401), the page says what to do
        def accepted() -> bool:
            try:
                browser.switch_to.alert.accept()
            except NoAlertPresentException:
                return False
            return True

        assert browser.find_element(By.ID, "token-box").is_displayed()
        _press(browser, 'button[data-cancel="web-1"]')
        wait_for("the confirm dialog", accepted, 30)
        error = wait_for("the 401 on the page", lambda: (
            e := browser.find_element(By.ID, "error")).is_displayed() and "401" in e.text and e)
        assert "token" in error.text
        assert {j["id"]: j["state"] for j in status(tmp_path)["jobs"]}["web-1"] != "dropped"
        # the operator pastes the token once; the cancel goes through
        browser.find_element(By.ID, "token").send_keys(served.token)
        assert browser.execute_script(
            "return sessionStorage.getItem('apportion-token')") == served.token
        _press(browser, 'button[data-cancel="web-1"]')
        wait_for("the confirm dialog", accepted, 30)
        wait_for("web-1 dropped in the store", lambda: {
            j["id"]: j["state"] for j in status(tmp_path)["jobs"]}["web-1"] == "dropped", 60)
        assert browser.get_cookies() == []  # nothing a cross-site request could carry
        # and the page follows: the job's GPUs are free again after the next round
        wait_for("web-1's GPUs freed on the page",
                 lambda: not _found(browser, '.gpu[data-job="web-1"]'))
        try:
            logs = browser.get_log("browser")
        except WebDriverException:  # not every driver keeps the console log
            logs = []
        # the one error the browser logs is the deliberate 401 of the cancel without a token
        assert not [e for e in logs if e.get("level") == "SEVERE"
                    and "401 (Unauthorized)" not in e.get("message", "")], logs


def test_the_dashboard_polls_with_if_none_match_and_draws_what_changed(
        tmp_path: Path, browser: webdriver.Chrome) -> None:
    """No tick for an hour: once the round the submission brought forward has decided the
    job, every read stays as it is, so every poll is a 304 and nothing is drawn again
    (no element created); a submission changes the store, and the page draws it at its
    next poll."""
    with Served(tmp_path, "--interval", "3600") as served:
        with served.client() as c:
            doc = {"jobs": [{"id": "still", "model": "gpt-tiny", "global_batch_size": 8,
                             "iterations": 10, "requested_gpus": 1}]}
            assert c.post("/api/v1/jobs", json=doc).status_code == 201
            wait_for("still decided", lambda: c.get("/api/v1/jobs/still").json()["state"]
                     != "submitted")
        browser.get(served.url + "/")
        wait_for("still's row", lambda: _found(browser, 'tr[data-job-row="still"]'))
        idle = _idle_refresh(browser)
        assert idle["created"] == 0, idle
        stats = _stats(browser)
        assert stats["unchanged"] >= 5, stats  # the reads of that refresh, each a 304
        drawn = stats["drawn"]
        assert drawn["jobs"] == 1 and drawn["rounds"] == 1 and drawn["queue"] == 1, drawn
        assert _found(browser, 'tr[data-job-row="still"]')  # a 304 keeps what was drawn
        with served.client() as c:
            doc["jobs"][0]["id"] = "new"
            assert c.post("/api/v1/jobs", json=doc).status_code == 201
        wait_for("new's row", lambda: _found(browser, 'tr[data-job-row="new"]'))
        assert _stats(browser)["drawn"]["jobs"] >= 2


# -- at 1,280 and at 20,000 GPUs --------------------------------------------------------------

#: the page's elements with every node group closed: the same bound at either size
MAX_ELEMENTS = 2000
#: elements the first render may create (the page's own markup comes with the HTML)
MAX_FIRST_RENDER = 1600
#: one node group opened: a page of 64 nodes, each with its GPUs
NODES_PAGE = 64
BIG = {"name": "big-20000", "node_groups": [
    {"prefix": "h100", "count": 1000, "gpu_type": "H100-80GB", "gpus_per_node": 8},
    {"prefix": "a100", "count": 750, "gpu_type": "A100-80GB", "gpus_per_node": 8},
    {"prefix": "l4", "count": 750, "gpu_type": "L4", "gpus_per_node": 4},
    {"prefix": "a10", "count": 1500, "gpu_type": "A10", "gpus_per_node": 2}]}
SIZES = {
    # cluster, its GPUs and nodes, jobs in the queue, the GPU types jobs may ask for
    "1280": ("crius-1280", 1280, 420, 1500, ["A100-40GB", "A40", "A10", "V100-32GB"]),
    "20000": ("big.yaml", 20000, 4000, 5000, ["H100-80GB", "A100-80GB", "L4", "A10"]),
}


def _queue(n: int, types: list[str]) -> dict:
    """``n`` jobs of six tenants: sizes from 1 GPU to 64, a third asking for a GPU type, a
    quarter guaranteed, and a few larger than any cluster here (too-large)."""
    sizes = (1, 1, 2, 4, 8, 8, 16, 32, 64)
    tenants = ("vision", "nlp", "speech", "research", "ads", "search")
    return {"jobs": [{"id": f"job-{i:05d}", "model": ("gpt-tiny", "bert-tiny")[i % 2],
                      "global_batch_size": 64, "iterations": 100_000,
                      "requested_gpus": 40_000 if i % 97 == 0 else sizes[i % len(sizes)],
                      **({"requested_gpu_type": types[i % len(types)]} if i % 3 == 0 else {}),
                      "tenant": tenants[(i * 7) % len(tenants)], "guaranteed": i % 4 == 0}
                     for i in range(n)]}


def _geometry(driver: webdriver.Chrome) -> dict:
    return driver.execute_script("""
        const bottom = (sel) => [...document.querySelectorAll(sel)].map(
            (e) => e.getBoundingClientRect().bottom);
        return {height: window.innerHeight, scrollY: window.scrollY,
                queueTop: document.querySelector('#queue-section').getBoundingClientRect().top,
                reasons: bottom('#reasons li'), longest: bottom('#longest tbody tr'),
                elements: document.getElementsByTagName('*').length,
                gpus: document.querySelectorAll('.gpu').length,
                nodes: document.querySelectorAll('[data-node]').length};""")


def _work(driver: webdriver.Chrome) -> dict[str, float]:
    """Chromium's own counters (DevTools' Performance domain): DOM nodes, layouts, style
    recalculations and their CPU time; only the counts are asserted."""
    got = driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]
    return {m["name"]: m["value"] for m in got if m["name"] in (
        "Nodes", "LayoutCount", "RecalcStyleCount", "LayoutDuration", "RecalcStyleDuration",
        "ScriptDuration", "JSHeapUsedSize")}


def _shot(driver: webdriver.Chrome, name: str) -> None:
    where = os.environ.get("APPORTION_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(where) / f"{name}.png"))


@pytest.mark.parametrize("size", sorted(SIZES))
def test_the_dashboard_at_scale(tmp_path: Path, browser: webdriver.Chrome, size: str) -> None:
    cluster, gpus, nodes, n, types = SIZES[size]
    (tmp_path / "big.yaml").write_text(json.dumps(BIG))
    (tmp_path / "jobs.json").write_text(json.dumps(_queue(n, types)))
    r = cli("submit", "jobs.json", "--state", "s.db", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # FCFS decides thousands of jobs in seconds: the page is under test, not the policy
    with Served(tmp_path, "--cluster", cluster, "--policy", "fcfs", "--interval",
                "3600") as served, served.client() as c:
        wait_for("the first round", lambda: "submitted" not in c.get(
            "/api/v1/queue?top=0").json()["counts"], 300)
        summary = c.get("/api/v1/cluster/summary").json()
        assert (summary["gpus"], summary["nodes"]) == (gpus, nodes)
        queue = c.get("/api/v1/queue?top=0").json()
        assert queue["waiting"] >= n // 3 and len(queue["reasons"]) >= 2, queue["reasons"]
        browser.execute_cdp_cmd("Performance.enable", {})
        browser.get(served.url + "/")
        first = wait_for("the first render", lambda: (s := _stats(browser))["first"] and {
            "queue", "cluster"} <= set(s["first"]["drew"]) and s["first"])
        wait_for("the longest waits", lambda: len(_found(browser, "#longest tbody tr")) == 10)
        # the queue first: its reasons and longest waits on the first screen, unscrolled
        g = _geometry(browser)
        assert g["scrollY"] == 0 and g["queueTop"] < 100, g
        assert len(g["reasons"]) == len(queue["reasons"])
        assert max(g["reasons"] + g["longest"]) <= g["height"], g
        # nodes collapsed: no GPU drawn, and the page bounded whatever the cluster's size
        assert g["gpus"] == 0 and g["nodes"] == 0, g
        assert g["elements"] <= MAX_ELEMENTS, g
        assert first["created"] <= MAX_FIRST_RENDER, first
        _shot(browser, f"dashboard-{size}")
        # a refresh with nothing new creates nothing and lays out (almost) nothing
        before = _work(browser)
        idle = _idle_refresh(browser)
        after = _work(browser)
        assert idle["created"] == 0, idle
        assert after["Nodes"] <= before["Nodes"] + 50, (before, after)
        # a submission: the next refreshes draw what changed, each within the bound
        seen = _stats(browser)["refreshes"]
        doc = {"jobs": [{"id": "late-one", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 100, "requested_gpus": 1, "tenant": "speech"}]}
        assert c.post("/api/v1/jobs", json=doc).status_code == 201
        wait_for("the submission drawn", lambda: any(
            "queue" in r["drew"] for r in _stats(browser)["log"] if r["at"] > seen))
        changed = [r for r in _stats(browser)["log"] if r["at"] > seen and r["drew"]]
        assert all(r["created"] <= MAX_FIRST_RENDER for r in changed), changed
        # the largest group opens a page of its nodes, GPU by GPU; the next page follows
        group = max((gr for t in summary["gpu_types"] for gr in t["groups"]),
                    key=lambda gr: gr["nodes"])
        _click(browser, f'[data-toggle="{group["group"]}"]')
        nodes_css = f'[data-nodes-of="{group["group"]}"] [data-node] .node-name'
        first_page = wait_for("its nodes", lambda: _texts(browser, nodes_css))
        assert len(first_page) == min(NODES_PAGE, group["nodes"])
        g = _geometry(browser)
        assert g["gpus"] == len(first_page) * group["gpus_per_node"], g
        assert g["elements"] <= MAX_ELEMENTS + NODES_PAGE * (3 + group["gpus_per_node"]), g
        if size == "20000":
            _shot(browser, f"dashboard-{size}-group")
        _click(browser, f'[data-nodes-of="{group["group"]}"] .pager button:last-child')
        wait_for("the next page of nodes", lambda: (
            t := _texts(browser, nodes_css)) and t[0] not in first_page)
        _click(browser, f'[data-toggle="{group["group"]}"]')
        wait_for("the group closed", lambda: not _found(browser, ".gpu"))
        # one reason's longest waits
        reason = queue["reasons"][-1]["reason"]
        _click(browser, f'button[data-reason="{reason}"]')
        wait_for(f"the waits of {reason}", lambda: set(
            _texts(browser, "#longest tbody tr .reason-code")) == {reason})
        assert reason in _texts(browser, "#longest-title")[0]
        # a job's page: what every round decided about it
        job = _texts(browser, "#longest tbody a[data-job-link]")[0]
        _click(browser, f'#longest a[data-job-link="{job}"]')
        wait_for("the job's page", lambda: browser.find_element(By.ID, "job-page").is_displayed()
                 and _found(browser, "#job-decisions tbody tr"))
        assert job in _texts(browser, "#job-title")[0]
        assert not browser.find_element(By.ID, "dashboard").is_displayed()
        decisions = _texts(browser, "#job-decisions tbody tr .reason-code")
        assert decisions and decisions[0] == reason
        assert browser.execute_script("return document.getElementsByTagName('*').length") \
            <= MAX_ELEMENTS
        if size == "20000":
            _shot(browser, "dashboard-job")
        browser.back()
        wait_for("the dashboard again", lambda: browser.find_element(
            By.ID, "dashboard").is_displayed())
        work = _work(browser)
        print(f"\n{size} GPUs: first render {first}, idle refresh {idle}, "
              f"Chromium before/after an idle refresh {before} / {after}, at the end {work}")
