#!/usr/bin/env bash
# The estimated rows of the quality tables replayed with another scaling model (issue 45):
# every policy sees the same profiled points (1 GPU and the request, on every type) and,
# between and beyond them, ESTIMATOR's scaling (`compare --estimator`). The tables' own rows
# use `analytic`; experiments/results/estimation/replay_rates.md says which estimator is most
# accurate on which cells of which family. Rows in cost order; a row whose summary.csv exists
# is skipped, so the script resumes. Writes runs_ESTIMATOR/ROW-estimated/; the table beside the
# analytic rows: python experiments/results/quality/estimated_rows.py runs_ESTIMATOR
#   ESTIMATOR=morphling ROWS="morphling-base morphling-mt" experiments/results/quality/estimated_rows.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
EST=${ESTIMATOR:-auto}
OUT=experiments/results/quality/runs_$EST
CRIUS=fcfs,fcfs-backfill,srtf,tiresias,gandiva,gavel,gavel-max-min-fairness,sia,elasticflow-ls,crius-greedy,apportion
MORPH=morphling,sia,synergy,antman,apportion-plans
ALL=fcfs,fcfs-backfill,srtf,tiresias,fifo,gandiva,gandiva-migrate,gavel-max-min-fairness,gavel-max-sum-throughput,sia,elasticflow,elasticflow-ls,crius-greedy,morphling,synergy,antman,apportion,apportion-plans,apportion-deadline,apportion-na,apportion-nh,ymir-normal
O="--information estimated --estimator $EST --seeds 3 --deterministic --workers ${WORKERS:-1} --out $OUT"
row() {  # NAME ARGS...: one compare run unless it is written
    local name=$1; shift
    [ -f "$OUT/$name/summary.csv" ] && return 0
    echo "== $name ($EST) $(date +%T)"
    apportion compare "$@" $O --run "$name"
}
for r in ${ROWS:-crius-pai fm-1 morphling-base morphling-mt gavel-mmf crius-venus elasticflow philly-d7 philly-d13 philly-d10 philly-d4 philly-d1}; do
    case $r in
        crius-pai|crius-venus) row "$r-estimated" --trace "$r" --cluster crius-1280 --policies $CRIUS ;;
        morphling-*) row "$r-estimated" --trace "$r" --cluster morphling-64 --policies $MORPH ;;
        fm-1) row fm-1-roberta-base-estimated --trace fm-1-roberta-base --cluster 32:0:0 \
                  --profile ymir --policies $ALL,ymir,ymir-spatial,ymir-temporal ;;
        gavel-mmf) row gavel-mmf-estimated --trace gavel-max-min-fairness --cluster 8:8:8 \
                       --profile gavel --policies $ALL ;;
        elasticflow) row elasticflow-philly-estimated --trace elasticflow-philly --max-jobs 100 \
                         --cluster experiments/results/quality/elasticflow-n32g8.yaml --policies $ALL ;;
        philly-d*) d=${r#philly-d}
                   [ -f "traces/philly-d$d.csv" ] || python experiments/results/quality/philly_days.py traces "$d"
                   row "$r-estimated" --trace "traces/philly-d$d.csv" --cluster crius-1280 --policies $CRIUS ;;
        *) echo "unknown row $r" >&2; exit 2 ;;
    esac
done
