"""The JAX worker on an 8-virtual-device CPU mesh (in a subprocess: XLA_FLAGS must be set
before jax is imported), and the Alpa adapter's clear error when alpa is missing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from apportion.runtime.workers.alpa_adapter import AlpaUnavailable, parallel_method, require_alpa

from apportion.plans import ExecutionPlan

SCRIPT = """
import json
from apportion.runtime.workers.jax_worker import train
dp = train("gpt-tiny", 8, 1, 3, 8)
tp = train("gpt-tiny", 2, 4, 3, 8)
print(json.dumps({"dp": dp, "tp": tp}))
"""


def test_dp_and_tp_shardings_train_the_same_losses() -> None:
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    dp, tp = res["dp"], res["tp"]
    assert dp["devices"] == tp["devices"] == 8
    assert dp["fc1_shard_shape"] == dp["fc1_shape"]  # replicated under DP
    assert tp["fc1_shard_shape"] == [dp["fc1_shape"][0], dp["fc1_shape"][1] // 4]  # split by tp
    assert len(dp["losses"]) == 3
    for a, b in zip(dp["losses"], tp["losses"]):
        assert a == pytest.approx(b, abs=1e-4)


def test_alpa_adapter_names_the_missing_package() -> None:
    if importlib.util.find_spec("alpa") is not None:
        pytest.skip("alpa is installed; the adapter uses it")
    with pytest.raises(AlpaUnavailable, match="'alpa' package"):
        require_alpa()
    with pytest.raises(AlpaUnavailable):
        parallel_method(ExecutionPlan(pp=2, micro_batches=4))
