"""``attnlab bench layer``: one attention layer, dense vs SwitchHead vs MoA, side by side.

Times forward+backward of one :class:`attnlab.layers.Attention` (the part SwitchHead changes;
the MLP is left out) on ``[batch, T, d_model]`` with a Transformer-XL memory of ``T`` cached
keys (the paper's setting), and measures its peak activation memory.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence

import torch

from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.metrics import MOA_INFERRED
from attnlab.results import (
    Record,
    fill_ratios,
    fwd,
    fwdbwd,
    peak_memory_mb,
    time_side_by_side,
    write_json,
)

logger = logging.getLogger(__name__)

BENCH = "layer"
BASELINE = "dense-h10"


@dataclasses.dataclass(frozen=True)
class LayerPreset:
    """Shapes of one paper model: width, depth (for the init scale), chunk length."""

    d_model: int
    n_layers: int
    seq_len: int
    variants: dict[str, dict]


_XL = {"name": "xl", "content_bias": True}
_XL_SWITCHHEAD = {"name": "xl", "content_bias": False}

PRESETS = {
    "wt103-47m": LayerPreset(
        d_model=412, n_layers=16, seq_len=256,
        variants={
            "dense-h10": {"n_heads": 10, "d_head": 41, "positions": _XL},
            "dense-h2": {"n_heads": 2, "d_head": 205, "positions": _XL},
            "switchhead": {"n_heads": 2, "d_head": 76, "positions": _XL_SWITCHHEAD,
                           "projections": {"name": "switchhead", "n_experts": 5, "k": 2}},
            "moa": {"n_heads": MOA_INFERRED["k"], "d_head": MOA_INFERRED["47M"]["d_head"],
                    "positions": _XL,
                    "projections": {"name": "moa",
                                    "n_experts": MOA_INFERRED["47M"]["n_experts"]}},
        },
    ),
}


def build_layer(preset: LayerPreset, variant: dict, device: torch.device) -> Attention:
    cfg = AttentionConfig(core="sdpa", **variant)
    ctx = LayerContext(
        d_model=preset.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head, causal=True,
        max_seq_len=2 * preset.seq_len, layer_idx=0, n_layers=preset.n_layers,
        init_scale=(2.0 / preset.n_layers) ** 0.5,
    )
    return Attention(ctx, cfg).to(device)


def run(
    preset: str = "wt103-47m",
    batch: int = 1,
    passes: Sequence[str] = ("fwdbwd",),
    reps: int = 10,
    json_path: str | os.PathLike[str] | None = None,
    *,
    device: str = "cpu",
    seed: int = 0,
) -> list[Record]:
    """Benchmark every variant of ``preset``; ratios are against ``dense-h10``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
    p = PRESETS[preset]
    dev = torch.device(device)
    torch.manual_seed(seed)
    x = torch.randn(batch, p.seq_len, p.d_model, device=dev, requires_grad=True)
    memory_input = torch.randn(batch, p.seq_len, p.d_model, device=dev)
    calls: dict[str, dict[str, object]] = {pass_: {} for pass_ in passes}
    common = {"preset": preset, "batch": batch, "seq_len": p.seq_len, "memory_len": p.seq_len,
              "d_model": p.d_model}
    shapes = {}
    for name, variant in p.variants.items():
        layer = build_layer(p, variant, dev).train()
        with torch.no_grad():
            memory = layer(memory_input, use_cache=True).cache.trimmed(p.seq_len)

        def forward(layer: Attention = layer, memory=memory) -> torch.Tensor:
            return layer(x, cache=memory).hidden

        leaves = [x, *layer.parameters()]
        for pass_ in passes:
            calls[pass_][name] = fwd(forward) if pass_ == "fwd" else fwdbwd(forward, leaves)
        shapes[name] = {**common, "n_heads": variant["n_heads"], "d_head": variant["d_head"],
                        "params": sum(t.numel() for t in layer.parameters())}
    records = []
    for pass_ in passes:
        timings = time_side_by_side(calls[pass_], reps, device=dev)
        for name, call in calls[pass_].items():
            mem = peak_memory_mb(call, dev)
            t = timings[name]
            # grouped by the common shape so ratios compare variants; details added after
            records.append(Record(BENCH, name, pass_, common, t.median, t.min, mem))
            logger.info("%s %s: %.1f ms, %.1f MiB", name, pass_, t.median, mem)
    fill_ratios(records, BASELINE)
    for record in records:
        record.shape = shapes[record.name]  # each variant's own heads and parameter count
    if json_path is not None:
        write_json(json_path, records)
    return records
