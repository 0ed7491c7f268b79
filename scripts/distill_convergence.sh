#!/usr/bin/env bash
# SEA's Fig. 4b on CPU: one tiny dense teacher, then SEA, Performer and Reformer students
# distilled from it with the same settings, each evaluated every 25 steps; then the report
# (its "Distillation convergence" table and plot).
#
#   scripts/distill_convergence.sh OUT_DIR [RECIPE]     # RECIPE: attnlab (default) or sea-paper
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: scripts/distill_convergence.sh OUT_DIR [RECIPE]" >&2
    exit 2
fi
out=$1
recipe=${2:-attnlab}
attnlab=${ATTNLAB:-attnlab}
mkdir -p "$out"
[ -f "$out/teacher/summary.json" ] || $attnlab train --config tiny --out "$out/teacher" --quiet
common=(--teacher "$out/teacher" --recipe "$recipe" --set steps=200 --set eval_every=25
        --set eval_tokens=16384 --set final_eval_tokens=65536 --set ckpt_every=100
        --set 'query_skip=[1]' --set long_context=1 --quiet)
for student in '{name: sea, k: 16, predictor_length: 32}' performer reformer; do
    name=$(echo "$student" | sed 's/{name: \([a-z]*\).*/\1/')
    [ -f "$out/$name/summary.json" ] || \
        $attnlab distill "${common[@]}" --student-attention "$student" --out "$out/$name" >/dev/null
done
$attnlab report "$out/teacher" "$out/sea" "$out/performer" "$out/reformer" --out "$out/report"
