#!/bin/bash
# The GPU checks of a session lent a CUDA machine (nothing in CI runs this: CI has no GPU).
# On the device machine, from the repository root, with the wheels apportion needs beside
# the image's torch in .whl/ (see experiments/device_checks.py): figures land in $OUT.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 APPORTION_LOG=WARNING
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
OUT=$(cd "$OUT" && pwd)
# from /tmp: the repository root's apportion/ would shadow the installed package's layout
(cd /tmp && python3 -c "import apportion, torch; print('apportion', apportion.__file__,
'torch', torch.__version__, torch.cuda.is_available())")
timeout 330 python3 experiments/device_checks.py "$OUT" trainer spill run deepspeed
(cd /tmp && timeout 150 python3 -m apportion.cli bench estimate --against local \
  --json "$OUT/estimate_local.json" --markdown "$OUT/estimate_local.md")
echo "bench estimate rc=$?"
cat "$OUT/estimate_local.md" 2>/dev/null | head -40
