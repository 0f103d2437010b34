"""The dashboard in a real headless Chromium (Debian's, driven by Selenium through
chromium-driver): the page loads from ``apportion serve``, draws the cluster GPU by GPU and
a submitted job, and a cancel clicked on the page reaches the store.

Chromium and chromedriver come from Debian's packages (.ci/run installs them). Without
them the test is skipped, unless APPORTION_REQUIRE_BROWSER=1 (CI) makes that a failure.
"""

from __future__ import annotations

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
from serve_server import Served, status, wait_for  # noqa: E402

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
                         "iterations": 5000, "requested_gpus": 2},
                        {"id": "web-big", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 10, "requested_gpus": 4096}]}
        r = httpx.post(f"{served.url}/api/v1/jobs", json=doc, timeout=30)
        assert r.status_code == 201, r.text
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
        # cancel from the page: the confirm dialog accepted, the store says dropped
        browser.find_element(By.CSS_SELECTOR, 'button[data-cancel="web-1"]').click()

        def accepted() -> bool:
            try:
                browser.switch_to.alert.accept()
            except NoAlertPresentException:
                return False
            return True

        wait_for("the confirm dialog", accepted, 30)
        wait_for("web-1 dropped in the store", lambda: {
            j["id"]: j["state"] for j in status(tmp_path)["jobs"]}["web-1"] == "dropped", 60)
        # and the page follows: the job's GPUs are free again after the next round
        wait_for("web-1's GPUs freed on the page",
                 lambda: not _found(browser, '.gpu[data-job="web-1"]'))
        try:
            logs = browser.get_log("browser")
        except WebDriverException:  # not every driver keeps the console log
            logs = []
        assert not [e for e in logs if e.get("level") == "SEVERE"], logs
