"""The CUDA paths against the CPU ones; skipped without a GPU (``scripts/gpu-check.sh`` runs
them with the GPU benchmarks).

Float64 on both devices, so any difference beyond rounding is a bug of a CUDA path and not a
top-k choice flipped by float32 noise: every registered attention core (forward and the
gradients of q, k, v), whole SwitchHead / SwitchAll / SEA models (``expert_matmul`` through
the backend "auto" picks on CUDA and through Triton; the SEA core's sparse attention has a
CPU-only C++ kernel, so the CUDA side runs its PyTorch path), cached decoding on the GPU, and
bf16-autocast training; the page selectors' prefill through FlexAttention with no host
synchronisation. tests/ops/test_expert_matmul.py runs every expert-matmul backend on the GPU too."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from attnlab.bench.attention import build_core
from attnlab.config import ConfigError, PartSpec, builtin_config
from attnlab.layers import CORES
from attnlab.models import DecoderLM
from attnlab.ops.attention.pages import paged_attention
from attnlab.ops.expert_matmul import dispatch
from attnlab.ops.sparse_attention.executors import executor_for
from attnlab.train import load_run_config, train
from attnlab.utils.testing import assert_close
from tests.models.test_lm import decode_token_by_token

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")
F64 = torch.float64
EXACT = 1e-10  # float64 on both sides: only summation order differs


def _on_both(*tensors):
    """CPU leaves and their CUDA copies, all requiring grad."""
    cpu = [t.clone().requires_grad_() for t in tensors]
    gpu = [t.detach().to(CUDA).requires_grad_() for t in tensors]
    return cpu, gpu


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", CORES.names())
def test_every_core_on_cuda_equals_the_cpu(name, causal):
    try:
        core = build_core(PartSpec(name), heads=4, d_head=16, seq_len=256, causal=causal,
                          dtype=F64).eval()
    except (ConfigError, ValueError) as err:
        pytest.skip(f"{name} is not built {'causal' if causal else 'bidirectional'}: {err}")
    gpu_core = copy.deepcopy(core).to(CUDA)
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(2, 4, 256, 16, generator=gen, dtype=F64) for _ in range(3)]
    (cpu, gpu), upstream = _on_both(*qkv), torch.randn(2, 4, 256, 16, generator=gen, dtype=F64)
    ref = core(*cpu, scale=0.25).out
    out = gpu_core(*gpu, scale=0.25).out
    assert out.device.type == "cuda"
    assert_close(f"{name} out", ref, out.cpu(), EXACT)
    ref_grads = torch.autograd.grad(ref, cpu, upstream, allow_unused=True)  # reformer: no k
    grads = torch.autograd.grad(out, gpu, upstream.to(CUDA), allow_unused=True)
    for axis, r, g in zip("qkv", ref_grads, grads, strict=True):
        assert (r is None) == (g is None), axis
        if r is not None:
            assert_close(f"{name} d{axis}", r, g.cpu(), EXACT)


def _model(config: str, *overrides: str) -> DecoderLM:
    torch.manual_seed(0)
    cfg = load_run_config(builtin_config(config), ["model.vocab_size=256", *overrides])
    return DecoderLM(cfg.model).to(F64).eval()


# SEA's estimate upsamples K bins to T keys, so its scores hold near-ties that top-k may break
# differently on the two devices (once seen: a loss 1.6e-5 apart at the trained k=16): in whole
# models its budget covers every key (k = T), the selection itself is compared core by core above
EVERY_KEY = "model.attention.core.k=128"


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("config", [("tiny/switchhead",), ("tiny/switchall",),
                                    ("tiny/cores/sea", EVERY_KEY),
                                    ("tiny/cores/switchhead-sea", EVERY_KEY)], ids=" ".join)
def test_a_model_on_cuda_equals_the_cpu(config, backend, monkeypatch):
    """Loss and every parameter's gradient, SwitchHead's experts through the backend "auto"
    picks on CUDA or through Triton."""
    if backend == "triton":
        auto = dispatch.choose_backend
        monkeypatch.setattr(dispatch, "choose_backend",
                            lambda layout, device: "triton" if device.type == "cuda"
                            else auto(layout, device))
    model = _model(*config)
    gpu_model = copy.deepcopy(model).to(CUDA)
    ids = torch.randint(0, 256, (2, 128), generator=torch.Generator().manual_seed(1))
    ref = model(ids, targets=ids).loss
    out = gpu_model(ids.to(CUDA), targets=ids.to(CUDA)).loss
    assert abs(ref.item() - out.item()) < EXACT * abs(ref.item())
    ref.backward()
    out.backward()
    for (name, p), g in zip(model.named_parameters(), gpu_model.parameters(), strict=True):
        if p.grad is None:
            assert g.grad is None or torch.count_nonzero(g.grad) == 0, name
            continue
        assert_close(name, p.grad, g.grad.cpu(), 1e-8)


@pytest.mark.parametrize("config", ["tiny/switchhead", "tiny/cores/sea"])
def test_cached_decoding_on_cuda_equals_the_full_pass(config):
    model = _model(config).to(CUDA)
    ids = torch.randint(0, 256, (2, 40), device=CUDA)
    steps, _ = decode_token_by_token(model, ids, 17)
    assert_close("logits", model(ids).logits, steps, EXACT)


def test_bf16_autocast_training_on_cuda_learns(tiny_run_config, tmp_path):
    base = tiny_run_config(steps=60, device="cuda", bf16=True)
    base["model"]["attention"]["projections"] = {"name": "switchhead", "n_experts": 4, "k": 2}
    summary = train(load_run_config(base=base), tmp_path / "run", progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert summary["steps"] == 60 and losses[-1] < losses[0] - 1.0


@pytest.mark.parametrize("scorer", ["quest", "mean"])
def test_a_page_prefill_on_cuda_runs_flex_with_no_host_sync(scorer):
    """``auto`` picks FlexAttention for a prefill on the GPU; after the first call (which
    compiles), a call reads nothing back to the host, and gives the CPU executor's result.
    float32, so rounding flips no page choice (bfloat16 is the contract suite's, on CPU)."""
    gen = torch.Generator().manual_seed(0)
    t = 1024
    q = torch.randn(2, 6, t, 64, generator=gen)
    k, v = (torch.randn(2, 2, t, 64, generator=gen) for _ in range(2))
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[0, :37] = False
    kw = dict(scale=0.125, budget=128, page=16, scorer=scorer)
    ref = paged_attention(*(x.double() for x in (q, k, v)), **kw, key_padding_mask=mask,
                          executor="torch")
    on_gpu = [x.to(CUDA) for x in (q, k, v)]
    assert executor_for("auto", *on_gpu, biased=False) == "flex"
    with torch.no_grad():
        paged_attention(*on_gpu, **kw, key_padding_mask=mask.to(CUDA))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = paged_attention(*on_gpu, **kw, key_padding_mask=mask.to(CUDA))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    real = mask[:, None, :, None].expand_as(ref)  # padded queries' outputs are undefined
    assert_close("flex prefill", ref[real], out.cpu().double()[real], 1e-4)


@pytest.mark.parametrize(("name", "options"), [
    ("quest", {"budget": 128}), ("sea_pages", {"budget": 128}),
    ("window", {"sinks": 4, "window": 124})])
def test_a_sparse_core_prefill_on_cuda_has_no_host_sync(name, options):
    """The core's whole prefill (a page core's decoding state started; the attention through
    flex) after a first call that compiles."""
    core = build_core(PartSpec(name, options), heads=6, d_head=64, seq_len=1024, causal=True,
                      device=CUDA).eval()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 1024, 64, generator=gen).to(CUDA) for _ in range(3))
    mask = torch.ones(2, 1024, dtype=torch.bool, device=CUDA)
    mask[0, :37] = False
    with torch.no_grad():
        core(q, k, v, scale=0.125, key_padding_mask=mask)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = core(q, k, v, scale=0.125, key_padding_mask=mask)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(out.out).all()


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
@pytest.mark.parametrize("name", ["quest", "sea_pages"])
def test_a_page_core_decoding_step_on_cuda_runs_triton_with_no_host_sync(name, split,
                                                                          monkeypatch):
    """A step from the decoding state (no padding) through the Triton step kernel (or the
    split selection and the block-table kernel); after a first step (which compiles them) a
    step reads nothing back to the host, and equals the CPU core's step (float32)."""
    from attnlab.ops.sparse_attention import triton_pages

    monkeypatch.setattr(triton_pages, "SPLIT_MIN_PAGES", 0 if split else 10**9)
    options = {"budget": 128}
    core = build_core(PartSpec(name, options), heads=6, d_head=64, seq_len=1100, causal=True)
    core = core.eval()
    gpu_core = copy.deepcopy(core).to(CUDA)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 1026, 64, generator=gen) for _ in range(3))
    on_gpu = [x.to(CUDA) for x in (q, k, v)]
    assert executor_for("auto", on_gpu[0][..., -1:, :], *on_gpu[1:], flex_fits=False,
                        triton_fits=True) == "triton"
    outs = []
    with torch.no_grad():
        for layer, (q_, k_, v_) in ((core, (q, k, v)), (gpu_core, on_gpu)):
            state = layer(q_[..., :1024, :], k_[..., :1024, :], v_[..., :1024, :],
                          scale=0.125).state
            first = layer(q_[..., 1024:1025, :], k_[..., :1025, :], v_[..., :1025, :],
                          scale=0.125, state=state)
            if layer is gpu_core:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                step = layer(q_[..., 1025:, :], k_, v_, scale=0.125, state=first.state)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            outs.append(step.out.cpu())
    assert_close(f"{name} step on cuda", outs[0].double(), outs[1].double(), 1e-4)
