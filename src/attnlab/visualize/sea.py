"""SEA's intermediate attention maps (the authors' Fig. 3), read from a model on one text.

Per SEA layer and head, all ``[T, T]`` over (query, key) positions: the reference attention
(the teacher's, or the layer's own exact attention when no teacher is known), the attention
the estimator's Performer applies implicitly, the CNN's compressed estimate with each bin's
probability spread over its keys, and the keys the exact attention then used.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from attnlab.config import ConfigError
from attnlab.layers.sea import SEACore, record_estimates
from attnlab.ops.attention.masks import allowed_keys
from attnlab.visualize.capture import Call, captured_calls
from attnlab.visualize.subject import Subject

# Weights below this are drawn at it (the colour scale is logarithmic).
FLOOR = 1e-4
_SCORING = ("scale", "key_padding_mask", "score_bias")


@dataclasses.dataclass
class SEAMaps:
    """One SEA layer's maps, each ``[H, T, T]`` (``attended`` bool); ``visible`` ``[T, T]``
    the keys each query row may see."""

    layer: int
    reference: Tensor
    performer: Tensor
    estimate: Tensor
    attended: Tensor
    visible: Tensor

    def attended_fraction(self) -> Tensor:
        """``[H]``: the share of the visible cells that were attended."""
        return (self.attended & self.visible).sum((-2, -1)) / self.visible.sum()

    def reference_weight_attended(self) -> Tensor:
        """``[H]``: the reference attention's weight on the attended keys, averaged over the
        query rows (1 = nothing the reference attends to was left out)."""
        return (self.reference * self.attended).sum(-1).mean(-1)


def _scoring(call: Call) -> dict:
    return {name: call.kwargs[name] for name in _SCORING if name in call.kwargs}


def sea_layers(subject: Subject) -> list[int]:
    """The layers of the subject's model whose core is SEA."""
    return [i for i, core in enumerate(subject.cores(subject.model)) if isinstance(core, SEACore)]


def sea_heads(subject: Subject, layer: int) -> int:
    """The number of heads of SEA layer ``layer``."""
    return subject.cores(subject.model)[layer].estimator.n_heads


def reference_label(subject: Subject) -> str:
    return "teacher's attention" if subject.teacher is not None else "exact attention (own q, k)"


def _reference(subject: Subject, layers: Sequence[int], calls: dict[int, Call]) -> dict:
    """``layer -> [H, T, T]``: the teacher's attention, or the model's own exact one."""
    model_cores = subject.cores(subject.model)
    if subject.teacher is None:
        cores, used = model_cores, [calls[i] for i in layers]
    else:
        cores = subject.cores(subject.teacher)
        if len(cores) != len(model_cores):
            raise ConfigError(f"the teacher has {len(cores)} layers and the model "
                              f"{len(model_cores)}: not its teacher")
        with captured_calls([cores[i] for i in layers]) as used:
            subject.run(subject.teacher)
    return {i: cores[i].attention_weights(*call.args, **_scoring(call))[0]
            for i, call in zip(layers, used, strict=True)}


def sea_maps(subject: Subject, layers: Sequence[int]) -> list[SEAMaps]:
    """The maps of ``layers`` (SEA layers of the subject's model, see :func:`sea_layers`)."""
    cores = subject.cores(subject.model)
    all_sea = sea_layers(subject)
    with captured_calls([cores[i] for i in all_sea]) as captured, \
            record_estimates(subject.model) as estimates:
        subject.run(subject.model)
    if len(estimates) != len(all_sea):  # one call per core: texts up to PREFILL_ROWS tokens
        raise RuntimeError(f"{len(estimates)} SEA estimates for {len(all_sea)} SEA layers")
    calls = dict(zip(all_sea, captured, strict=True))
    by_layer = dict(zip(all_sea, estimates, strict=True))
    with torch.no_grad():
        reference = _reference(subject, layers, calls)
        maps = []
        for i in layers:
            q, k = calls[i].args[:2]
            scoring = _scoring(calls[i])
            performer = cores[i].estimator.performer.attention_weights(
                q, k, scale=scoring["scale"], key_padding_mask=scoring.get("key_padding_mask"))
            t_q, t_k = q.shape[-2], k.shape[-2]
            visible = allowed_keys(t_q, t_k, causal=cores[i].causal, key_padding_mask=None,
                                   device=q.device)
            if visible is None:
                visible = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device)
            estimate = by_layer[i]
            maps.append(SEAMaps(i, reference[i].float(), performer[0].float(),
                                estimate.dense()[0].float(), estimate.attended()[0],
                                visible.reshape(t_q, t_k)))
    return maps


def _with_labels(ax, labels: Sequence[str] | None) -> None:
    """Token labels on both axes of a ``[T, T]`` panel, or position numbers."""
    if labels is None:
        ax.set_xlabel("key position", fontsize=8)
        ax.set_ylabel("query position", fontsize=8)
        return
    ticks = range(len(labels))
    ax.set_xticks(ticks, labels, rotation=90, fontsize=5)
    ax.set_yticks(ticks, labels, fontsize=5)


def draw_sea(maps: Sequence[SEAMaps], pairs: Sequence[tuple[int, int]], labels: Sequence[str],
             reference: str, path: str | os.PathLike[str], title: str = "") -> Path:
    """One row per ``(layer, head)`` of ``pairs``: reference attention, Performer, CNN
    estimate (one logarithmic colour scale) and the attended keys. Writes a PNG."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    from attnlab.results.figures import new_figure, save_figure

    by_layer = {m.layer: m for m in maps}
    fig, axes = new_figure(4, width=3.4, height=3.3, nrows=len(pairs), squeeze=False)
    weights_cmap = colormaps["viridis"].with_extremes(bad="#d9d9d9")  # grey: not visible
    mask_cmap = colormaps["Greys"].with_extremes(bad="#d9d9d9")
    norm = LogNorm(vmin=FLOOR, vmax=1.0)
    tick_labels = list(labels) if len(labels) <= 40 else None
    image = None
    for row, (layer, head) in zip(axes, pairs, strict=True):
        m = by_layer[layer]
        hidden = ~m.visible.cpu().numpy()
        panels = [(reference, m.reference[head]), ("Performer's implicit attention",
                                                  m.performer[head]),
                  ("CNN estimate (bins spread over keys)", m.estimate[head])]
        for ax, (name, weights) in zip(row, panels, strict=False):
            shown = np.ma.masked_where(hidden, weights.clamp(FLOOR, 1.0).cpu().numpy())
            image = ax.imshow(shown, cmap=weights_cmap, norm=norm, interpolation="nearest")
            ax.set_title(f"layer {layer} head {head}: {name}", fontsize=8)
            _with_labels(ax, tick_labels)
        attended = np.ma.masked_where(hidden, m.attended[head].float().cpu().numpy())
        row[3].imshow(attended, cmap=mask_cmap, vmin=0, vmax=1, interpolation="nearest")
        share = float(m.attended_fraction()[head])
        covered = float(m.reference_weight_attended()[head])
        row[3].set_title(f"attended keys (black): {share:.0%} of cells,\n{covered:.0%} of the "
                         f"{reference.split(' (')[0]}", fontsize=8)
        _with_labels(row[3], tick_labels)
    fig.colorbar(image, ax=axes[:, :3].ravel().tolist(), shrink=0.6, label="attention weight")
    return save_figure(fig, path, title)
