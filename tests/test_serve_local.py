"""``apportion serve --executor local --cluster local``: a job submitted through the API
trains for real on this host, finishes, and the API, ``status`` and ``/metrics`` say so."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serve_server import Served, status, wait_for  # noqa: E402


def test_a_job_submitted_through_the_api_trains_and_finishes(tmp_path: Path) -> None:
    with Served(tmp_path, executor="local") as served:
        doc = {"jobs": [{"id": "tiny", "model": "bert-tiny", "global_batch_size": 8,
                         "iterations": 8, "requested_gpus": 1}]}
        r = httpx.post(f"{served.url}/api/v1/jobs", json=doc, headers=served.auth, timeout=30)
        assert r.status_code == 201, r.text
        job = wait_for("tiny finished", lambda: (j := httpx.get(
            f"{served.url}/api/v1/jobs/tiny", timeout=30).json())["state"] == "finished" and j,
            300, 1.0)
        assert job["progress"]["iterations_done"] == 8 and job["progress"]["fraction"] == 1.0
        assert job["jct_s"] > 0  # what the dashboard's JCT plot draws
        text = httpx.get(f"{served.url}/metrics", timeout=30).text
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples[("apportion_launches_total", (("executor", "local"),))] >= 1
        assert samples[("apportion_launch_failures_total", (("executor", "local"),))] == 0
        assert samples[("apportion_jobs", (("state", "finished"),))] == 1
        assert ("apportion_estimator_refits_total", ()) in samples
        assert served.stop() == 0, served.stderr()[-3000:]
    assert {j["id"]: j["state"] for j in status(tmp_path)["jobs"]} == {"tiny": "finished"}
