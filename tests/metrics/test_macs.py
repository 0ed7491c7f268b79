"""MAC / memory accounting: the paper's Table 1 figures, and ``exact`` vs FlopCounterMode."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attnlab.ops.expert_matmul.dispatch as dispatch
from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.metrics import (
    MOA_INFERRED,
    attention_cost,
    exact_attention_cost,
    paper_attention_cost,
)
from attnlab.models.lm import DecoderLM
from attnlab.train.config import load_run_config

SIZE_47M = {"d_model": 412, "seq_len": 256, "mem_chunks": 1}
SIZE_262M = {"d_model": 1024, "seq_len": 512, "mem_chunks": 1}


def printed(value: int) -> str:
    """A figure as the paper prints it: one decimal, in G from 1e9 on, else in M."""
    return f"{value / 1e9:.1f}G" if value >= 1e9 else f"{value / 1e6:.1f}M"


@pytest.mark.parametrize(
    ("size", "kind", "params", "macs", "memory"),
    [
        (SIZE_47M, "dense", {"n_heads": 10, "d_head": 41}, "453.4M", "3.5M"),
        (SIZE_47M, "switchhead", {"n_heads": 2, "d_head": 76, "n_experts": 5, "k": 2},
         "170.4M", "0.8M"),
        (SIZE_262M, "dense", {"n_heads": 16, "d_head": 64}, "5.4G", "21.0M"),
        (SIZE_262M, "switchhead", {"n_heads": 2, "d_head": 132, "n_experts": 8, "k": 4},
         "2.0G", "2.9M"),
    ],
)
def test_paper_table1_dense_and_switchhead(
    size: dict[str, int], kind: str, params: dict[str, int], macs: str, memory: str
) -> None:
    cost = paper_attention_cost(kind, **size, **params)
    assert (printed(cost["macs"]), printed(cost["memory_floats"])) == (macs, memory)


@pytest.mark.parametrize(
    ("size", "label", "rows"),
    [
        (SIZE_47M, "47M", {2: ("140.1M", "0.7M"), 4: ("223.5M", "1.3M"),
                           6: ("306.8M", "1.9M"), 8: ("390.2M", "2.6M")}),
        (SIZE_262M, "262M", {2: ("1.1G", "2.7M"), 4: ("1.7G", "5.1M"),
                             8: ("2.9G", "9.9M"), 12: ("4.1G", "14.7M")}),
    ],
)
def test_paper_table1_moa_with_inferred_settings(
    size: dict[str, int], label: str, rows: dict[int, tuple[str, str]]
) -> None:
    inferred = MOA_INFERRED[label]
    for n_heads, expected in rows.items():
        cost = paper_attention_cost(
            "moa", **size, n_heads=n_heads, d_head=inferred["d_head"],
            n_experts=inferred["n_experts"], k=MOA_INFERRED["k"],
        )
        assert (printed(cost["macs"]), printed(cost["memory_floats"])) == expected, n_heads


def test_switchhead_position_term_quirk() -> None:
    """Counting SwitchHead's XL position term over T(1+C) like the baseline: 202.4M."""
    args = {**SIZE_47M, "n_heads": 2, "d_head": 76, "n_experts": 5, "k": 2}
    assert printed(paper_attention_cost("switchhead", **args)["macs"]) == "170.4M"
    quirk = paper_attention_cost("switchhead", **args, baseline_position_term=True)
    assert printed(quirk["macs"]) == "202.4M"


def test_rope_drops_the_position_term() -> None:
    args = {"d_model": 64, "n_heads": 4, "d_head": 16, "seq_len": 32, "mem_chunks": 0}
    xl = paper_attention_cost("dense", **args)["macs"]
    rope = paper_attention_cost("dense", **args, positions="rope")["macs"]
    assert xl - rope == 2 * 4 * 64 * 32 * 16


def test_paper_rejects_bad_arguments() -> None:
    args = {"d_model": 64, "n_heads": 4, "d_head": 16, "seq_len": 32, "mem_chunks": 1}
    with pytest.raises(ValueError, match="kind"):
        paper_attention_cost("performer", **args)
    with pytest.raises(ValueError, match="n_experts"):
        paper_attention_cost("switchhead", **args)
    with pytest.raises(ValueError, match="positions"):
        paper_attention_cost("dense", **args, positions="alibi")


def switchhead_47m_config(**model: Any) -> dict[str, Any]:
    """The WT103 47M SwitchHead run (XL without u/v biases, one 256-token memory chunk)."""
    return {
        "model": {
            "d_model": 412, "n_layers": 16, "d_ff": 2080, "memory_len": 256, "max_seq_len": 512,
            "vocab_size": 8000, "tie_embeddings": False,
            "attention": {
                "n_heads": 2, "d_head": 76,
                "projections": {"name": "switchhead", "n_experts": 5, "k": 2},
                "positions": {"name": "xl", "content_bias": False},
            },
            **model,
        },
        "train": {"seq_len": 256},
    }


def test_attention_cost_paper_matches_table1() -> None:
    cost = attention_cost(load_run_config(base=switchhead_47m_config()), "paper")
    assert printed(cost["attention_macs"]) == "170.4M"
    assert printed(cost["attention_memory_floats"]) == "0.8M"
    json.dumps(cost)


def test_attention_cost_is_json_and_counts_the_model() -> None:
    cfg = load_run_config(base=switchhead_47m_config(n_layers=2, vocab_size=None))
    cost = attention_cost(cfg, "exact")
    assert json.loads(json.dumps(cost)) == cost
    assert set(cost) == {"convention", "attention_macs", "attention_memory_floats", "params",
                         "model_macs_per_token"}
    assert all(isinstance(cost[key], int) for key in cost if key != "convention")
    built = DecoderLM(dataclasses.replace(cfg.model, vocab_size=256))
    assert cost["params"] == built.num_params()
    mlp_and_head = 2 * (2 * 412 * 2080) + 412 * 256
    assert cost["model_macs_per_token"] == 2 * cost["attention_macs"] // 256 + mlp_and_head


def test_attention_cost_rejects_unknown_convention_and_core() -> None:
    cfg = load_run_config(base=switchhead_47m_config())
    with pytest.raises(ValueError, match="convention"):
        attention_cost(cfg, "approximate")
    performer = load_run_config(base={"model": {"attention": {"core": "performer"}}})
    with pytest.raises(ValueError, match="cores"):
        attention_cost(performer, "exact")


SWITCHHEAD = {"name": "switchhead", "n_experts": 4, "k": 2}


@pytest.mark.parametrize(
    ("projections", "positions"),
    [("dense", "rope"), ("dense", "xl"), (SWITCHHEAD, "xl"),
     (SWITCHHEAD, {"name": "xl", "content_bias": False}), ({"name": "moa", "n_experts": 6}, "xl"),
     ({**SWITCHHEAD, "expert_q": True, "shared_selection": True}, "rope"),
     ({**SWITCHHEAD, "expert_k": True, "separate_kq_selection": True}, "rope"),
     ({"name": "dense", "n_kv_heads": 2}, "rope")],
)
def test_exact_matches_flop_counter(
    projections: Any, positions: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One layer's forward on T tokens over a memory_len cache, counted by FlopCounterMode.

    The core is ``eager`` (FlopCounterMode counts nothing for CPU SDPA) and the expert matmul
    is forced onto the grouped backend, whose per-expert ``mm`` calls are counted and which
    does only the useful MACs. FlopCounterMode does not see the gate-weighted reductions
    (``index_add_``), which ``exact`` counts, so the two differ by about 1% here.
    """
    monkeypatch.setattr(dispatch, "choose_backend", lambda *args: "grouped")
    d, h, dh, t, mem = 128, 4, 16, 32, 32
    att = AttentionConfig(
        n_heads=h, d_head=dh, projections=projections, positions=positions, core="eager"
    )
    ctx = LayerContext(
        d_model=d, n_heads=h, d_head=dh, causal=True, max_seq_len=t + mem, layer_idx=0,
        n_layers=2, init_scale=1.0,
    )
    layer = Attention(ctx, att)
    with torch.no_grad():
        cache = layer(torch.randn(1, mem, d), use_cache=True).cache.trimmed(mem)
        with FlopCounterMode(display=False) as counter:
            layer(torch.randn(1, t, d), cache=cache)
    counted = counter.get_total_flops() // 2
    expected = exact_attention_cost(
        att.projections, att.positions, d_model=d, n_heads=h, d_head=dh, seq_len=t,
        memory_len=mem,
    )["macs"]
    assert abs(expected - counted) <= 0.02 * counted
    if att.projections.name == "dense":
        assert expected == counted


@pytest.mark.parametrize("mlp", ["dense", {"name": "sigma_moe", "n_experts": 8, "k": 2,
                                           "expert_size": 32}])
def test_model_macs_per_token_matches_flop_counter(
    mlp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole DecoderLM forward (no memory) against ``model_macs_per_token * T``."""
    monkeypatch.setattr(dispatch, "choose_backend", lambda *args: "grouped")
    t = 32
    cfg = load_run_config(base={
        "model": {
            "d_model": 64, "n_layers": 2, "d_ff": 256, "max_seq_len": t, "vocab_size": 100,
            "mlp": mlp,
            "attention": {"n_heads": 2, "d_head": 16, "projections": SWITCHHEAD,
                          "positions": "xl", "core": "eager"},
        },
        "train": {"seq_len": t},
    })
    cost = attention_cost(cfg, "exact")
    model = DecoderLM(cfg.model)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 100, (1, t)))
    counted = counter.get_total_flops() // 2
    assert abs(cost["model_macs_per_token"] * t - counted) <= 0.02 * counted


@pytest.mark.parametrize("name", ["dense", "swiglu", "sigma_moe"])
def test_a_built_mlp_carries_a_picklable_cost(name: str) -> None:
    """A built part holds its traits (its MAC formula among them), so the formula must be a
    named function: a lambda would make the model unpicklable."""
    import pickle

    from attnlab.config import PartSpec
    from attnlab.layers import MLPS, MLPContext

    mlp = MLPS.build(PartSpec(name), ctx=MLPContext(16, 64, 0.0, 0, 1, 1.0))
    assert mlp.traits["macs_per_token"](16, 64, MLPS.options(PartSpec(name))) > 0
    pickle.loads(pickle.dumps(mlp))
