"""The dashboard in a real headless Chromium (Debian's, driven by Selenium through
chromium-driver): the page loads from ``apportion serve``, draws the cluster GPU by GPU and
a submitted job, and a cancel clicked on the page reaches the store once the operator has
pasted the API token (sent in the Authorization header, never a cookie); the lists are
polled with If-None-Match and drawn again only when they changed.

Chromium and chromedriver come from Debian's packages (.ci/run installs them). Without
them the test is skipped, unless APPORTION_REQUIRE_BROWSER=1 (CI) makes that a failure.
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
from selenium.common.exceptions import NoAlertPresentException, WebDriverException  # noqa: E402
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
                "--window-size=1280,1600", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER),
                              options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _found(driver: webdriver.Chrome, css: str) -> list:
    return driver.find_elements(By.CSS_SELECTOR, css)


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
        # the cluster, node by node and GPU by GPU, grouped by GPU type
        for t in cluster["gpu_types"]:
            group = wait_for(f"GPU type {t['gpu_type']}", lambda t=t: _found(
                browser, f'[data-gpu-type="{t["gpu_type"]}"]'))[0]
            for n in t["nodes"]:
                node = group.find_element(By.CSS_SELECTOR, f'[data-node="{n["name"]}"]')
                assert len(node.find_elements(By.CSS_SELECTOR, ".gpu")) == n["gpus"]
        # the job, placed by a round: its GPUs coloured, its row in the table
        cells = wait_for("web-1's GPUs", lambda: _found(browser, '.gpu[data-job="web-1"]'))
        assert len(cells) >= 1
        assert cells[0].value_of_css_property("background-color") not in (
            "rgba(0, 0, 0, 0)", "")
        row = wait_for("web-1's row", lambda: _found(browser, 'tr[data-job-row="web-1"]'))[0]
        assert "running" in row.text
        # the queue: the job that can never fit, with its typed reason
        wait_for("web-big's reason", lambda: "too-large" in " ".join(
            e.text for e in _found(browser, 'tr[data-job-row="web-big"]')))
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
        browser.find_element(By.CSS_SELECTOR, 'button[data-cancel="web-1"]').click()
        wait_for("the confirm dialog", accepted, 30)
        error = wait_for("the 401 on the page", lambda: (
            e := browser.find_element(By.ID, "error")).is_displayed() and "401" in e.text and e)
        assert "token" in error.text
        assert {j["id"]: j["state"] for j in status(tmp_path)["jobs"]}["web-1"] != "dropped"
        # the operator pastes the token once; the cancel goes through
        browser.find_element(By.ID, "token").send_keys(served.token)
        assert browser.execute_script(
            "return sessionStorage.getItem('apportion-token')") == served.token
        browser.find_element(By.CSS_SELECTOR, 'button[data-cancel="web-1"]').click()
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
    """No round for an hour: the lists stay as they are, so every poll after the first is
    a 304 and the tables are not drawn again; a submission changes the jobs list, and the
    page draws it at its next poll."""
    with Served(tmp_path, "--interval", "3600") as served:
        with served.client() as c:
            doc = {"jobs": [{"id": "still", "model": "gpt-tiny", "global_batch_size": 8,
                             "iterations": 10, "requested_gpus": 1}]}
            assert c.post("/api/v1/jobs", json=doc).status_code == 201
        browser.get(served.url + "/")
        wait_for("still's row", lambda: _found(browser, 'tr[data-job-row="still"]'))

        def stats() -> dict:
            return browser.execute_script("return window.apportionStats")

        wait_for("two polls of unchanged lists", lambda: stats()["unchanged"] >= 4)
        drawn = stats()["drawn"]
        assert drawn["jobs"] == 1 and drawn["rounds"] == 1, drawn
        assert _found(browser, 'tr[data-job-row="still"]')  # a 304 keeps what was drawn
        with served.client() as c:
            doc["jobs"][0]["id"] = "new"
            assert c.post("/api/v1/jobs", json=doc).status_code == 201
        wait_for("new's row", lambda: _found(browser, 'tr[data-job-row="new"]'))
        assert stats()["drawn"]["jobs"] == 2  # (the rounds' tag, the store's, moved too)
