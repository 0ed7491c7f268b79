"""``attnlab visualize``: what a model's efficient attention does on a text, as PNGs.

- SEA layers (the authors' Fig. 3): the teacher's attention, the Performer's implicit
  attention, the CNN's compressed estimate and the keys attended, side by side on the same
  (query, key) axes and colour scale: ``sea-attention.png``;
- SwitchHead layers: each token's value and output experts per head and the experts' load
  over the text: ``switchhead-experts.png``;

plus ``visualize.json`` with the figures' numbers (per layer and head: the share of cells
attended and of the teacher's attention they hold; the experts' load).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.config import ConfigError
from attnlab.layers.sea.core import PREFILL_ROWS
from attnlab.utils.io import atomic_write_text
from attnlab.utils.outputs import OutputFolder
from attnlab.visualize.sea import draw_sea, reference_label, sea_heads, sea_layers, sea_maps
from attnlab.visualize.subject import Subject, open_subject
from attnlab.visualize.switchhead import (
    draw_switchhead,
    expert_choices,
    switchhead_heads,
    switchhead_layers,
)

__all__ = ["MAX_PANEL_ROWS", "Subject", "open_subject", "visualize"]

logger = logging.getLogger(__name__)

# (layer, head) rows one figure holds; more are unreadable.
MAX_PANEL_ROWS = 16
MAX_TOKENS = PREFILL_ROWS  # one estimator call per layer


def _chosen(choice: int | None, count: int, what: str, valid: Sequence[int]) -> list[int]:
    """``[choice]`` (negative counts from the end) or every valid index for None."""
    if choice is None:
        return list(valid)
    index = choice + count if choice < 0 else choice
    if index not in valid:
        raise ConfigError(f"--{what} {choice}: the model's {what}s that can be shown are "
                          f"{list(valid)}")
    return [index]


def _pairs(layers: list[int], heads: list[int]) -> list[tuple[int, int]]:
    pairs = [(layer, head) for layer in layers for head in heads]
    if len(pairs) > MAX_PANEL_ROWS:
        raise ConfigError(f"{len(layers)} layers x {len(heads)} heads = {len(pairs)} rows; at "
                          f"most {MAX_PANEL_ROWS} fit one figure: choose one --layer or --head")
    return pairs


def visualize(path: str | Path, text: str, out_dir: str | Path, *, layer: int | None = 0,
              head: int | None = None, teacher: str | None = None, max_tokens: int = 96,
              device: str = "cpu", force: bool = False) -> dict[str, Any]:
    """Draw the figures of the model at ``path`` (see :func:`open_subject`) on ``text``'s
    first ``max_tokens`` tokens into ``out_dir``; ``layer`` / ``head`` None = all (tiled).
    Returns the summary written to ``visualize.json``. ``out_dir`` follows the write policy
    (:mod:`attnlab.utils.outputs`; ``force`` writes beside files it did not write)."""
    if not 1 <= max_tokens <= MAX_TOKENS:
        raise ConfigError(f"--max-tokens must be in [1, {MAX_TOKENS}], got {max_tokens}")
    destination = OutputFolder.of(out_dir, "visualize", force=force,
                                  inputs=[p for p in (path, teacher) if p is not None])
    destination.check()
    subject = open_subject(path, text, teacher=teacher, max_tokens=max_tokens, device=device)
    n_layers = len(subject.cores(subject.model))
    sea, switch = sea_layers(subject), switchhead_layers(subject)
    if not sea and not switch:
        raise ConfigError(f"{path}: the model has no SEA attention and no SwitchHead "
                          "projections: nothing to draw (visualize shows attention: sea "
                          "and projections: switchhead)")
    jobs = []
    for name, valid, heads_of in (("sea", sea, sea_heads), ("switchhead", switch,
                                                            switchhead_heads)):
        if valid:
            layers = _chosen(layer, n_layers, "layer", valid)
            n_heads = heads_of(subject, layers[0])
            jobs.append((name, layers, _pairs(layers, _chosen(head, n_heads, "head",
                                                              range(n_heads)))))
    summary: dict[str, Any] = {"model": str(path), "tokens": len(subject.labels),
                               "text": text[:200]}
    out = destination.claim()
    for name, layers, pairs in jobs:
        if name == "sea":
            maps = sea_maps(subject, layers)
            reference = reference_label(subject)
            png = draw_sea(maps, pairs, subject.labels, reference, out / "sea-attention.png",
                           title=f"SEA on {len(subject.labels)} tokens of the text")
            by_layer = {m.layer: m for m in maps}
            summary["sea"] = {"png": png.name, "reference": reference, "heads": [
                {"layer": lay, "head": h,
                 "attended_fraction": float(by_layer[lay].attended_fraction()[h]),
                 "reference_weight_attended":
                     float(by_layer[lay].reference_weight_attended()[h])}
                for lay, h in pairs]}
        else:
            choices = expert_choices(subject, layers)
            png = draw_switchhead(choices, pairs, subject.labels, out / "switchhead-experts.png",
                                  title=f"SwitchHead experts on {len(subject.labels)} tokens")
            by_layer = {c.layer: c for c in choices}
            summary["switchhead"] = {"png": png.name, "heads": [
                {"layer": lay, "head": h,
                 "load": {role: by_layer[lay].load(role)[h].tolist()
                          for role in by_layer[lay].gates}}
                for lay, h in pairs]}
        logger.info("wrote %s", png)
    atomic_write_text(out / "visualize.json", json.dumps(summary, indent=2))
    return summary
