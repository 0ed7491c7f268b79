#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script: the CUDA tests (Triton expert matmul and every
# attention core against the CPU references), then the GPU benchmarks. Every step has its own
# time limit and log, so one failing or slow step never costs the others; each finished step's
# files are in OUT_DIR at once (and in the tar.gz ARCHIVE, if set, rewritten after every step).
# Usage: [STEPS="tests bench-serve ..."] scripts/gpu-check.sh [OUT_DIR] (default
# runs/gpu-check; STEPS: run only these steps, default all; bench-serve needs smollm2-shape).
# Runs from the repository root with the python that has torch + triton (PYTHON, default
# python3); attnlab from src/ when it is not installed.
set -u
ALL_STEPS="tests bench-attention-fwd bench-pages-fwd bench-expert-matmul profile-sea bench-train \
smollm2-shape bench-serve bench-triton-step bench-serve-pages bench-attention-fwdbwd bench-layer"
for name in ${STEPS:-}; do
    if [[ " $ALL_STEPS " != *" $name "* ]]; then
        echo "error: unknown step '$name' in STEPS; valid: $ALL_STEPS" >&2
        exit 2
    fi
done
if [ $# -gt 1 ]; then echo "usage: [STEPS=...] $0 [OUT_DIR]" >&2; exit 2; fi
out=${1:-runs/gpu-check}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
attnlab=("$py" -m attnlab)

step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log to OUT_DIR/NAME.log
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return 0; fi
    echo "== $name (limit ${limit}s): $*"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.log"
    echo "$name rc=$rc $((SECONDS - start))s" | tee -a "$out/steps.txt"
    if [ -n "${ARCHIVE:-}" ]; then tar czf "$ARCHIVE" -C "$out" --exclude smollm2-shape .; fi
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$py" -c "import torch, triton, transformers as t; print('torch', torch.__version__,
'triton', triton.__version__, 'transformers', t.__version__, torch.cuda.get_device_name())"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

step tests 200 "$py" -m pytest -q -p no:cacheprovider -rs \
    tests/test_cuda.py tests/ops/test_expert_matmul.py tests/ops/test_triton_pages.py

# SEA, Performer, Reformer against FlashAttention-class sdpa: inference (fwd) and training
step bench-attention-fwd 90 "${attnlab[@]}" bench attention --device cuda --dtype bfloat16 \
    --pass fwd --heads 12 --d-head 64 --seq-lens 1024,4096,16384,32768,65536 --reps 5 \
    --json "$out/bench-attention-fwd-h200.json" --plot "$out/bench-attention-fwd-h200.png"
# the page selectors' prefill: FlexAttention's block-sparse kernel ("auto" on CUDA) against
# the PyTorch executor and FlashAttention-backed sdpa, 256 keys per query token
step bench-pages-fwd 90 "${attnlab[@]}" bench attention --device cuda --dtype bfloat16 \
    --pass fwd --heads 12 --d-head 64 --seq-lens 4096,16384,65536 --reps 5 \
    --mechanisms sdpa,quest,sea_pages,quest@torch --set quest@torch.executor=torch \
    --json "$out/bench-pages-fwd-h200.json"
step bench-expert-matmul 40 "${attnlab[@]}" bench expert-matmul --device cuda --dtype bfloat16 \
    --tokens 65536 --passes fwd fwdbwd --backends grouped dense triton \
    --json "$out/bench-expert-matmul-h200.json"
# where SEA's time goes on the GPU: kernel launches of its PyTorch path at one length
step profile-sea 40 "$py" - <<'EOF'
import torch
from attnlab.bench.attention import build_core
from attnlab.config import PartSpec
core = build_core(PartSpec("sea"), heads=12, d_head=64, seq_len=4096, causal=True,
                  device="cuda", dtype=torch.bfloat16).eval()
q, k, v = (torch.randn(1, 12, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for _ in range(3):
        core(q, k, v, scale=0.125)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        core(q, k, v, scale=0.125)
        torch.cuda.synchronize()
events = prof.events()
kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
syncs = [e for e in events if e.name in ("aten::item", "aten::_local_scalar_dense",
                                          "cudaStreamSynchronize", "cudaDeviceSynchronize")]
gpu_ms = sum(e.device_time for e in kernels) / 1e3
print(f"one sea forward at T=4096: {len(kernels)} GPU kernels, {gpu_ms:.1f} ms of GPU time, "
      f"{len(syncs)} host syncs")
print(prof.key_averages().table(sort_by="device_time_total", row_limit=15))
EOF
# SwitchHead's training claim at the paper's shapes (bf16 autocast, the paper's batch)
step bench-train 80 "${attnlab[@]}" bench train --device cuda --set train.bf16=true \
    --configs paper/wt103-47m-dense-h10 paper/wt103-47m-dense-h2 paper/wt103-47m-moa-h8 \
    paper/wt103-47m-switchhead paper/wt103-47m-switchall \
    paper/wt103-262m-dense-h16 paper/wt103-262m-switchhead \
    --json "$out/bench-train-h200.json"
# SEA converted into a SmolLM2-135M-shaped Llama (random weights: speed does not depend on
# them; the real checkpoint does not fit the transfer), prefill and cached decoding, bf16
step smollm2-shape 60 "$py" - "$out/smollm2-shape" <<'EOF'
import sys, torch, transformers
config = transformers.LlamaConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=32768,
    rope_theta=100000.0, tie_word_embeddings=True, torch_dtype="bfloat16")
torch.manual_seed(0)
transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])
EOF
step bench-serve 150 "${attnlab[@]}" bench serve --device cuda --model "$out/smollm2-shape" \
    --dtypes bfloat16 --seq-lens 2048,8192 --batches 1,8 --prefill-batches 1 \
    --json "$out/bench-serve-smollm2-shape-h200.json" \
    --plot "$out/bench-serve-smollm2-shape-h200.png"
# one decoding step's kernels for one SmolLM2-shaped layer (9 query heads, 3 KV heads of 64,
# pages of 16, 256 keys per KV head, Quest's features): the fused step kernel against the
# split selection + block-table kernel, and sdpa's dense step; sets SPLIT_* in triton_pages
step bench-triton-step 40 "$py" - "$out/bench-triton-step-h200.json" <<'EOF'
import json, sys, torch
import torch.nn.functional as F
from attnlab.ops.sparse_attention.triton_pages import best_pages_kernel

def timed(fn, reps=50):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps * 1e3  # us

rows, dev, bf = [], "cuda", torch.bfloat16
for t in (8192, 32768):
    for b in (1, 8):
        q = torch.randn(b, 9, 1, 64, device=dev, dtype=bf)
        k, v = (torch.randn(b, 3, t, 64, device=dev, dtype=bf) for _ in range(2))
        feats = torch.randn(b, 3, t // 16, 128, device=dev, dtype=bf)
        qf = torch.randn(b, 9, 1, 128, device=dev, dtype=torch.float32)
        ranks = torch.full((b, 1), t - 1, device=dev)
        n_real = torch.full((b,), t, device=dev)
        args = dict(page=16, sink_pages=1, local_pages=1, n_top=14, causal=True,
                    scale=0.125, rank_to_pos=None)
        row = {"seq_len": t, "batch": b}
        for split in (False, True):
            row["split_us" if split else "fused_us"] = timed(lambda: best_pages_kernel(
                q, k, v, qf, feats, None, ranks, n_real, split=split, **args))
        row["sdpa_us"] = timed(lambda: F.scaled_dot_product_attention(
            q, k, v, enable_gqa=True))
        rows.append(row)
        print(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
EOF
# the page selectors' decoding on the GPU (each step through the Triton step kernel, fused or
# split by triton_pages' SPLIT_* rule) against the dense model, 256 keys per query token per
# KV head
step bench-serve-pages 200 "${attnlab[@]}" bench serve --device cuda --model "$out/smollm2-shape" \
    --dtypes bfloat16 --seq-lens 8192,32768 --batches 1,8 --prefill-batches '' \
    --core "{name: quest, budget: 256}" \
    --core "{name: sea_pages, budget: 256, estimators: smollm2-135m}" \
    --json "$out/bench-serve-pages-smollm2-shape-h200.json"
rm -rf "$out/smollm2-shape"
step bench-attention-fwdbwd 60 "${attnlab[@]}" bench attention --device cuda \
    --dtype bfloat16 --pass fwdbwd --heads 12 --d-head 64 --seq-lens 1024,4096,16384,32768 \
    --reps 5 --json "$out/bench-attention-fwdbwd-h200.json"
step bench-layer 35 "${attnlab[@]}" bench layer --device cuda \
    --json "$out/bench-layer-wt103-47m-h200.json"
