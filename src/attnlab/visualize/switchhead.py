"""SwitchHead's expert choices on one text: which value / output experts each token uses,
per head, and how evenly the text's tokens load each head's experts."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from attnlab.layers.attention import Attention
from attnlab.layers.switchhead import SwitchHeadProjections
from attnlab.visualize.capture import captured_calls
from attnlab.visualize.subject import Subject

ROLE_NAMES = {"q": "query", "k": "key", "v": "value (source token)",
              "o": "output (destination token)"}


@dataclasses.dataclass
class ExpertChoices:
    """One layer's choices: per MoE projection (``"v"``, ``"o"``, ...) the gate of each
    token and expert, ``[H, T, E]`` (0 where the expert was not chosen)."""

    layer: int
    gates: dict[str, Tensor]
    k: int

    def load(self, role: str) -> Tensor:
        """``[H, E]``: the share of the text's tokens that chose each expert (sums to k)."""
        return (self.gates[role] > 0).float().mean(1)


def _attention_layers(subject: Subject) -> list[Attention]:
    return [m for m in subject.model.modules() if isinstance(m, Attention)]


def switchhead_layers(subject: Subject) -> list[int]:
    """The layers of the subject's model with SwitchHead projections."""
    return [i for i, layer in enumerate(_attention_layers(subject))
            if isinstance(layer.projections, SwitchHeadProjections)]


def switchhead_heads(subject: Subject, layer: int) -> int:
    """The number of heads of SwitchHead layer ``layer``."""
    return _attention_layers(subject)[layer].projections.n_heads


def expert_choices(subject: Subject, layers: Sequence[int]) -> list[ExpertChoices]:
    """The choices of ``layers`` (see :func:`switchhead_layers`) on the subject's text."""
    modules = [_attention_layers(subject)[i] for i in layers]
    with captured_calls(modules) as calls:
        subject.run(subject.model)
    found = []
    with torch.no_grad():
        for i, module, call in zip(layers, modules, calls, strict=True):
            projections = module.projections
            gates = {}
            for role, chosen in projections.expert_choices(call.args[0]).items():
                dense = torch.zeros(*chosen.index.shape[1:3], projections.n_experts,
                                    dtype=chosen.gate.dtype, device=chosen.gate.device)
                dense.scatter_(-1, chosen.index[0], chosen.gate[0])  # [T, H, E]
                gates[role] = dense.transpose(0, 1).float()
            found.append(ExpertChoices(i, gates, projections.opts.k))
    return found


def draw_switchhead(choices: Sequence[ExpertChoices], pairs: Sequence[tuple[int, int]],
                    labels: Sequence[str], path: str | os.PathLike[str],
                    title: str = "") -> Path:
    """One row per ``(layer, head)``: each MoE projection's gates (experts x tokens) and the
    experts' load over the text. Writes a PNG."""
    import numpy as np

    from attnlab.results.figures import new_figure, save_figure

    by_layer = {c.layer: c for c in choices}
    roles = list(choices[0].gates)
    fig, axes = new_figure(len(roles) + 1, width=max(3.4, 0.11 * len(labels) + 1.0),
                           height=2.6, nrows=len(pairs), squeeze=False)
    image = None
    for row, (layer, head) in zip(axes, pairs, strict=True):
        c = by_layer[layer]
        for ax, role in zip(row, roles, strict=False):
            gates = c.gates[role][head].T.cpu().numpy()  # [E, T]
            image = ax.imshow(np.ma.masked_equal(gates, 0.0), cmap="magma_r", vmin=0, vmax=1,
                              aspect="auto", interpolation="nearest")
            ax.set_title(f"layer {layer} head {head}: {ROLE_NAMES[role]}", fontsize=8)
            ax.set_ylabel("expert", fontsize=8)
            ax.set_yticks(range(gates.shape[0]))
            if len(labels) <= 64:
                ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
            else:
                ax.set_xlabel("token position", fontsize=8)
        ax = row[-1]
        n_experts = c.gates[roles[0]].shape[-1]
        width = 0.8 / len(roles)
        for j, role in enumerate(roles):
            ax.bar(np.arange(n_experts) + (j - (len(roles) - 1) / 2) * width,
                   c.load(role)[head].cpu().numpy(), width, label=role.upper())
        ax.axhline(c.k / n_experts, color="grey", linestyle="--", linewidth=1,
                   label="even load (k/E)")
        ax.set_xticks(range(n_experts))
        ax.set_xlabel("expert", fontsize=8)
        ax.set_ylabel("share of tokens", fontsize=8)
        ax.set_title(f"layer {layer} head {head}: expert load over {len(labels)} tokens",
                     fontsize=8)
        ax.legend(fontsize=7)
    fig.colorbar(image, ax=axes[:, :-1].ravel().tolist(), shrink=0.6,
                 label="gate (blank: not chosen)")
    return save_figure(fig, path, title)
