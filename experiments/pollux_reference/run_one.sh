#!/bin/bash
# One run of Pollux's simulator, unmodified: run_one.sh POLICY FOLDER N
#   POLICY: pollux | optimus | tiresias; FOLDER: workloads | workloads-0.5 | workloads-1.5 |
#   workloads-2.0; N: 1..8. Writes $OUT/POLICY-FOLDER-N.{jsonl.gz,done,tail,err}; a run
#   whose .done exists is skipped. README.md beside this file says how SIM and PY are made.
set -u
policy=$1; dir=$2; n=$3
SIM=${SIM:-/tmp/adaptdl/simulator}       # the artifact's simulator/ folder
PY=${PY:-/tmp/pollux-venv/bin/python}    # Python 3.8 with its requirements.txt
OUT=${OUT:-/tmp/pollux-runs/out}
tag=$policy-$dir-$n
mkdir -p "$OUT"
[ -f "$OUT/$tag.done" ] && exit 0
cd "$SIM" || exit 1
start=$(date +%s.%N)
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
  "$PY" simulator.py --policy "$policy" --output "$OUT/$tag.jsonl" "$dir/workload-$n.csv" \
  2>"$OUT/$tag.err" | tail -n 2 > "$OUT/$tag.tail"
rc=${PIPESTATUS[0]}
end=$(date +%s.%N)
echo "$policy,$dir,$n,$rc,$start,$end" > "$OUT/$tag.done"
gzip -f "$OUT/$tag.jsonl"
