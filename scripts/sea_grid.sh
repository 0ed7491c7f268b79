#!/usr/bin/env bash
# SEA's Table A.6 on CPU: a tiny dense teacher trained at SEQ_LEN tokens, a SEA student
# distilled from it at the same length, then the student at every dynamic k x query skip:
# perplexity, and each setting's forward time and peak memory against the teacher's,
# measured side by side in one run; then the report (table + heatmaps).
#
#   scripts/sea_grid.sh OUT_DIR [SEQ_LEN]     # SEQ_LEN: default 1024
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: scripts/sea_grid.sh OUT_DIR [SEQ_LEN]" >&2
    exit 2
fi
out=$1
seq_len=${2:-1024}
attnlab=${ATTNLAB:-attnlab}
mkdir -p "$out"
batch=$(( seq_len >= 2048 ? 1 : 2048 / seq_len ))  # the tiny config's 2048 tokens per step
[ -f "$out/teacher/summary.json" ] || $attnlab train --config tiny --out "$out/teacher" \
    --set model.max_seq_len="$seq_len" --set train.seq_len="$seq_len" \
    --set train.batch_size="$batch" \
    --set train.final_eval_tokens=65536 --quiet
[ -f "$out/sea/summary.json" ] || $attnlab distill --teacher "$out/teacher" \
    --student-attention '{name: sea, k: 32, predictor_length: 64}' \
    --set steps=100 --set batch_size=2 --set eval_every=25 --set eval_batch_size=2 \
    --set eval_tokens=16384 --set final_eval_tokens=65536 --set long_context=1 \
    --set 'dynamic_k=[16, 32, 64, 128]' --set 'query_skip=[1, 2, 4]' --set grid_reps=7 \
    --out "$out/sea" --quiet >/dev/null
$attnlab report "$out/teacher" "$out/sea" --out "$out/report"
