"""expert_matmul: every backend against the naive reference (forward and the gradients of x,
weight and gate), dtype-scaled tolerances, edge cases, argument errors, memory, MAC count.

The grouped backend runs in two plans, "padded" (one bmm) and "ragged" (one mm per expert); the
pseudo-backends "grouped-padded" and "grouped-ragged" force one of them, "grouped" lets the
``PAD_MAX_WASTE`` rule choose."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from attnlab.ops.expert_matmul import (
    BACKENDS,
    choose_backend,
    expert_matmul,
    expert_matmul_macs,
    expert_matmul_naive,
    segments,
)
from attnlab.ops.expert_matmul.layout import check_inputs
from attnlab.ops.expert_matmul.segments import plan_segments
from attnlab.utils.testing import assert_close, rel_rms_error
from tests.helpers import triton_on_this_machine

F64 = torch.float64
HAS_TRITON = triton_on_this_machine()
# every backend runs on the GPU where there is one (Triton compiled for it), else on the CPU
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TRITON = pytest.param(
    "triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
)
FAST = ["grouped-padded", "grouped-ragged", "dense", "auto", TRITON]
GROUPED_PLANS = {"grouped-padded": float("inf"), "grouped-ragged": 0.0}  # PAD_MAX_WASTE
LAYOUTS = {"x2d": False, "x3d": True}


@pytest.fixture
def backend(request, monkeypatch):
    """The backend name to pass (parametrized indirectly); "grouped-padded" / "grouped-ragged"
    run "grouped" with its plan forced through ``segments.PAD_MAX_WASTE``."""
    if request.param in GROUPED_PLANS:
        monkeypatch.setattr(segments, "PAD_MAX_WASTE", GROUPED_PLANS[request.param])
        return "grouped"
    return request.param


def _case(per_group, gated, dtype=F64, n=11, groups=3, k=2, experts=7, k_in=5, k_out=6):
    """Random inputs (requiring grad) on ``DEVICE`` with distinct ids per group, like a top-k
    router."""
    x = torch.randn((n, groups, k_in) if per_group else (n, k_in), dtype=dtype, device=DEVICE)
    weight = torch.randn(experts, k_in, k_out, dtype=dtype, device=DEVICE) / k_in**0.5
    sel = torch.rand(n, groups, experts, device=DEVICE).topk(k, dim=-1).indices
    gate = torch.rand(n, groups, k, dtype=dtype, device=DEVICE) if gated else None
    leaves = [t.requires_grad_() for t in (x, weight, gate) if t is not None]
    return x, weight, sel, gate, leaves


def _grads(out, leaves, upstream):
    return torch.autograd.grad(out, leaves, upstream)


@pytest.mark.parametrize("gated", [True, False], ids=["gate", "nogate"])
@pytest.mark.parametrize("reduce", ["none", "slots", "all"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", FAST, indirect=True)
def test_float64_matches_reference(backend, layout, reduce, gated):
    x, weight, sel, gate, leaves = _case(LAYOUTS[layout], gated)
    out = expert_matmul(x, weight, sel, gate, reduce=reduce, backend=backend)
    ref = expert_matmul_naive(x, weight, sel, gate, reduce=reduce)
    assert_close("out", ref, out, 1e-12)
    upstream = torch.randn_like(ref)
    names = ["dx", "dweight", "dgate"]
    for name, g_out, g_ref in zip(
        names, _grads(out, leaves, upstream), _grads(ref, leaves, upstream), strict=False
    ):
        assert_close(name, g_ref, g_out, 1e-12)


# SwitchHead 47M-like V ([N, d] -> [N, H, d_head]) and O ([N, H, d_head] -> [N, d]) at reduced size
LOW_PRECISION_CASES = {
    "V": dict(per_group=False, reduce="slots", k_in=96, k_out=24),
    "O": dict(per_group=True, reduce="all", k_in=24, k_out=96),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(LOW_PRECISION_CASES))
@pytest.mark.parametrize("backend", FAST, indirect=True)
def test_low_precision_error_within_twice_reference_error(backend, case, dtype):
    """FlashAttention's rule: against a float64 truth, the fast path may be at most 2x as wrong
    as the naive reference computed in the same low dtype (forward and every gradient)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "triton" and dtype == torch.bfloat16 and interpreted:
        pytest.skip("the Triton interpreter's tl.dot gets bf16 wrong (16x16 product off by 2e10)")
    spec = LOW_PRECISION_CASES[case]
    x, weight, sel, gate, leaves = _case(
        spec["per_group"], True, n=160, groups=2, k=2, experts=10,
        k_in=spec["k_in"], k_out=spec["k_out"],
    )
    low = [t.detach().to(dtype).requires_grad_() for t in leaves]
    truth = expert_matmul_naive(x, weight, sel, gate, reduce=spec["reduce"])
    upstream = torch.randn_like(truth)
    ref = expert_matmul_naive(low[0], low[1], sel, low[2], reduce=spec["reduce"])
    out = expert_matmul(low[0], low[1], sel, low[2], reduce=spec["reduce"], backend=backend)
    assert out.dtype == dtype
    pairs = [("out", truth, ref, out)]
    for name, t, r, o in zip(
        ["dx", "dweight", "dgate"],
        _grads(truth, leaves, upstream),
        _grads(ref, low, upstream.to(dtype)),
        _grads(out, low, upstream.to(dtype)),
        strict=True,
    ):
        pairs.append((name, t, r, o))
    for name, t, r, o in pairs:
        ref_err = rel_rms_error(t, r)
        assert ref_err > 0, f"{name}: the low-precision reference is exact; the test is void"
        assert_close(name, t, o, 2 * ref_err)


@pytest.mark.parametrize("backend", FAST, indirect=True)
def test_experts_without_tokens(backend):
    x, weight, sel, gate, leaves = _case(False, True, experts=8)
    sel = torch.where(sel % 2 == 0, 0, 3)[..., :1].expand(-1, -1, 2).clone()
    sel[..., 1] = 5  # experts 1, 2, 4, 6, 7 receive nothing
    out = expert_matmul(x, weight, sel, gate, backend=backend)
    ref = expert_matmul_naive(x, weight, sel, gate)
    assert_close("out", ref, out, 1e-12)
    (dweight,) = torch.autograd.grad(out.sum(), [weight])
    unused = [1, 2, 4, 6, 7]
    assert torch.count_nonzero(dweight[unused]) == 0
    assert torch.count_nonzero(dweight[[0, 3, 5]]) > 0


@pytest.mark.parametrize("reduce", ["none", "slots", "all"])
@pytest.mark.parametrize("n", [0, 1])
@pytest.mark.parametrize("backend", FAST + ["naive"], indirect=True)
def test_zero_and_one_row(backend, n, reduce):
    x, weight, sel, gate, leaves = _case(True, True, n=n)
    out = expert_matmul(x, weight, sel, gate, reduce=reduce, backend=backend)
    ref = expert_matmul_naive(x, weight, sel, gate, reduce=reduce)
    assert out.shape == ref.shape == check_inputs(x, weight, sel, gate, reduce, True).out_shape
    grads = torch.autograd.grad(out.sum(), leaves)
    assert [g.shape for g in grads] == [t.shape for t in leaves]
    if n == 0:
        assert all(torch.count_nonzero(g) == 0 for g in grads)
    else:
        assert_close("out", ref, out, 1e-12)
        for g, r in zip(grads, torch.autograd.grad(ref.sum(), leaves), strict=True):
            assert_close("grad", r, g, 1e-12)


@pytest.mark.parametrize("backend", FAST, indirect=True)
def test_duplicate_ids_in_a_group_are_summed(backend):
    x, weight, _, _, _ = _case(False, False)
    sel = torch.full((11, 3, 2), 4, device=DEVICE)
    out = expert_matmul(x, weight, sel, backend=backend)
    assert_close("out", 2 * (x @ weight[4]).unsqueeze(1).expand(-1, 3, -1), out, 1e-12)


def test_naive_backend_is_the_reference():
    x, weight, sel, gate, _ = _case(True, True)
    out = expert_matmul(x, weight, sel, gate, reduce="all", backend="naive")
    assert torch.equal(out, expert_matmul_naive(x, weight, sel, gate, reduce="all"))


def _valid():
    x, weight, sel, gate, _ = _case(False, True)
    return dict(x=x.detach(), weight=weight.detach(), sel=sel, gate=gate.detach())


ERRORS = {
    "sel-too-large": (lambda a: a["sel"].fill_(7), r"sel ids must lie in \[0, 7\).*\[7, 7\]"),
    "sel-negative": (lambda a: a["sel"].fill_(-1), r"\[0, 7\)"),
    "sel-float": (lambda a: a.update(sel=a["sel"].double()), "sel must be an integer"),
    "sel-2d": (lambda a: a.update(sel=a["sel"][:, 0]), r"sel must be \[N, G, k\]"),
    "weight-dtype": (lambda a: a.update(weight=a["weight"].float()), "weight dtype"),
    "gate-dtype": (lambda a: a.update(gate=a["gate"].float()), "gate dtype"),
    "x-int": (lambda a: a.update(x=a["x"].long(), weight=a["weight"].long()), "floating-point"),
    "weight-noncontiguous": (
        lambda a: a.update(weight=a["weight"].transpose(0, 1).contiguous().transpose(0, 1)),
        "weight must be contiguous",
    ),
    "k_in": (lambda a: a.update(x=a["x"][:, :4]), "feature size 4 != weight K_in=5"),
    "rows": (lambda a: a.update(x=a["x"][:5]), "x has 5 rows but sel has N=11"),
    "groups": (lambda a: a.update(x=a["x"][:, None].expand(-1, 2, -1)), "2 groups but sel has G=3"),
    "gate-shape": (lambda a: a.update(gate=a["gate"][..., :1]), "gate shape"),
    "k-greater-than-E": (
        lambda a: a.update(sel=torch.zeros(11, 3, 8, dtype=torch.long, device=DEVICE),
                           gate=None),
        "k=8 slots per group but weight has only E=7",
    ),
    "x-1d": (lambda a: a.update(x=a["x"][0]), r"x must be \[N, K_in\]"),
    "reduce": (lambda a: a.update(reduce="mean"), "reduce must be one of"),
    "backend": (
        lambda a: a.update(backend="cuda"), re.escape(f"backend must be one of {BACKENDS}")
    ),
}


@pytest.mark.parametrize("problem", list(ERRORS))
def test_bad_arguments_raise_clear_errors(problem):
    args = _valid()
    change, message = ERRORS[problem]
    change(args)
    with pytest.raises(ValueError, match=message):
        expert_matmul(**args)


def test_check_false_skips_the_range_reduction(monkeypatch):
    args = _valid()
    expected = expert_matmul(**args)

    def forbidden(*_a, **_k):
        raise AssertionError("aminmax called although check=False")

    monkeypatch.setattr(torch, "aminmax", forbidden)
    assert torch.equal(expert_matmul(**args, check=False), expected)


@pytest.mark.parametrize("backend", ["grouped-padded", "grouped-ragged"], indirect=True)
@pytest.mark.parametrize("per_group", [False, True], ids=["V-like", "O-like"])
def test_grouped_backward_saves_no_per_slot_input_rows(backend, per_group):
    """The grouped backend keeps x, weight, gate, the slot map (slot per position ``[P]``,
    position per slot ``[M]``, pad positions ``[P - M]``) and, only when K_out < K_in, the
    [P, K_out] products: never the gathered [P, K_in] input rows."""
    k_in, k_out = (12, 40) if per_group else (40, 12)
    x, weight, sel, gate, leaves = _case(per_group, True, n=50, k_in=k_in, k_out=k_out)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        expert_matmul(x, weight, sel, gate, reduce="all", backend=backend)
    padded = segments.PAD_MAX_WASTE == float("inf")  # "grouped-padded"
    positions = 7 * int(torch.bincount(sel.reshape(-1)).max()) if padded else sel.numel()
    inputs = sum(t.numel() for t in leaves)
    products = 0 if per_group else positions * k_out
    assert sum(t.numel() for t in saved) == inputs + 2 * positions + products


def _imbalanced(n=40, groups=2, k=2, experts=6):
    """Ids where expert 0 is in almost every group: E * max(count) is ~E/k times the slots."""
    sel = torch.stack([torch.zeros(n, groups, dtype=torch.long),
                       torch.randint(1, experts, (n, groups))], dim=-1).to(DEVICE)
    return sel[..., :k]


def test_plan_pads_while_the_rows_stay_within_max_waste():
    balanced = torch.arange(60) % 6
    seg = plan_segments(balanced, 6)
    assert seg.padded and seg.pads.numel() == 0 and seg.lengths == [10] * 6
    skewed = torch.cat([torch.zeros(10, dtype=torch.long), torch.arange(1, 6).repeat(8)])
    seg = plan_segments(skewed, 6, max_waste=1.2)  # 6 * 10 = 60 rows for 50 slots: padded
    assert seg.padded and seg.slot.numel() == 60 and seg.pads.numel() == 10
    assert torch.equal(seg.slot[seg.pos], torch.arange(50))  # pos and slot are inverse
    assert torch.equal(skewed[seg.slot].view(6, 10)[:, :8], torch.arange(6)[:, None].expand(6, 8))
    tails = (torch.arange(1, 6) * 10)[:, None] + torch.tensor([8, 9])  # experts 1-5: 8 of 10
    assert torch.equal(seg.pads, tails.ravel())
    seg = plan_segments(skewed, 6, max_waste=1.19)
    assert not seg.padded and seg.lengths == [10, 8, 8, 8, 8, 8] and seg.pads.numel() == 0
    imbalanced = _imbalanced().reshape(-1)
    seg = plan_segments(imbalanced, 6)  # default rule: 6 * 80 rows for 160 slots is ragged
    assert not seg.padded and seg.slot.numel() == 160 and seg.pads.numel() == 0
    assert torch.equal(imbalanced[seg.slot], imbalanced.sort().values)
    assert plan_segments(torch.zeros(0, dtype=torch.long), 3).slot.numel() == 0


@pytest.mark.parametrize("gated", [True, False], ids=["gate", "nogate"])
@pytest.mark.parametrize("reduce", ["none", "slots", "all"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_imbalanced_routing_falls_back_to_ragged_and_matches(layout, reduce, gated):
    x, weight, _, gate, leaves = _case(LAYOUTS[layout], gated, n=40, groups=2, experts=6)
    sel = _imbalanced()
    assert not plan_segments(sel.reshape(-1), 6).padded
    out = expert_matmul(x, weight, sel, gate, reduce=reduce, backend="grouped")
    ref = expert_matmul_naive(x, weight, sel, gate, reduce=reduce)
    assert_close("out", ref, out, 1e-12)
    upstream = torch.randn_like(ref)
    for g_out, g_ref in zip(_grads(out, leaves, upstream), _grads(ref, leaves, upstream),
                            strict=True):
        assert_close("grad", g_ref, g_out, 1e-12)


def test_auto_rule(monkeypatch):
    def layout(experts, groups, k, per_group=False, reduce="slots"):
        x = torch.zeros((1, groups, 3) if per_group else (1, 3))
        sel = torch.zeros(1, groups, k, dtype=torch.long)
        return check_inputs(x, torch.zeros(experts, 3, 2), sel, None, reduce, True)

    cpu = torch.device("cpu")
    assert choose_backend(layout(4, 1, 2), cpu) == "dense"  # 2x MACs
    assert choose_backend(layout(8, 2, 2), cpu) == "dense"  # 2x: tiny SwitchHead V (2 x 4)
    assert choose_backend(layout(8, 2, 2, per_group=True, reduce="all"), cpu) == "dense"  # O
    assert choose_backend(layout(16, 1, 1), cpu) == "grouped"  # 16x MACs
    assert choose_backend(layout(10, 2, 2), cpu) == "grouped"  # 2.5x: SwitchHead 47M V
    cuda = torch.device("cuda")  # dense up to 4x the MACs, triton only when asked for
    monkeypatch.setattr("attnlab.ops.expert_matmul.dispatch.triton_available", lambda: True)
    assert choose_backend(layout(10, 2, 2), cuda) == "dense"  # 2.5x: SwitchHead 47M V
    assert choose_backend(layout(16, 1, 4), cuda) == "dense"  # 4x: SwitchAll 47M sigma-MoE
    assert choose_backend(layout(16, 1, 1), cuda) == "grouped"


def test_macs():
    # SwitchHead 47M V projection: 4096 tokens, H=2, k=2, 412 -> 76
    assert expert_matmul_macs(4096, 2, 2, 412, 76, "slots") == 4096 * 4 * 76 * (412 + 1)
    assert expert_matmul_macs(4096, 2, 2, 412, 76, "slots", gated=False) == 4096 * 4 * 412 * 76
    assert expert_matmul_macs(10, 1, 4, 8, 16, "none") == 10 * 4 * 8 * 16
    with pytest.raises(ValueError, match="reduce must be one of"):
        expert_matmul_macs(1, 1, 1, 1, 1, "sum")


@pytest.mark.skipif(HAS_TRITON, reason="checks the behaviour without triton")
def test_without_triton_import_is_silent_and_triton_backend_explains():
    code = (
        "import sys, warnings; warnings.simplefilter('error');"
        "import attnlab.ops.expert_matmul; assert 'triton' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(RuntimeError, match="needs triton"):
        expert_matmul(**_valid(), backend="triton")
