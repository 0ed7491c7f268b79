"""Frozen per-layer distillation of page estimators (``attnlab distill-estimators``).

The pretrained model stays frozen. One dense forward per training sequence records, at
every layer, the rotated keys of all positions and the queries of ``rows`` sampled positions
(the teacher's own hidden states, so no layer sees another's approximation). Each layer's
:class:`~attnlab.layers.page_estimator.PageEstimator` then trains alone against that layer's
attention: per query head and sampled row, the teacher's attention mass on each page the
selector chooses among (every readable page but the always-kept sink and local ones),
renormalised, is the target of the estimator's softmax over the same pages (KL). No
backward pass goes through the model, so a layer costs seconds and the 8k context fits on
a laptop. This is the recipe of DeepSeek's indexer warm-up and SeerAttention's gates.

A held-out sequence measures each layer before and after: the KL, and the **kept mass**,
the share of the teacher's candidate-page mass in the pages the estimator would keep at
``eval_budget`` (against block top-k's pages, the untrained estimator, and the best pages).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config import ConfigError
from attnlab.layers.page_estimator import PageEstimator, page_summaries
from attnlab.ops.attention.masks import expand_kv_heads
from attnlab.ops.attention.page_rules import check_pages, page_masks

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FrozenRecipe:
    """How the estimators are distilled (``configs/smollm2/estimators.yaml``).

    ``corpus``/``split``: the built-in text (never the evaluation's split); ``seq_len``
    tokens per sequence, ``sequences`` for training plus one held out; ``rows`` query rows
    sampled per sequence and layer (uniform over the positions that have a page to choose);
    ``steps`` of Adam at ``lr`` per layer (cosine to 0); ``page``/``width``/
    ``distance_buckets``: the estimator; ``sink_pages``/``local_pages``: the pages always
    kept, outside the targets; ``eval_budget``: keys per KV head of the kept-mass measure,
    taken on the held-out sequence every ``check_every`` steps (early stopping); ``layers``:
    the layers to distil (None: all; the others keep the untrained estimator)."""

    corpus: str = "shakespeare"
    split: str = "train"
    seq_len: int = 8192
    sequences: int = 8
    rows: int = 512
    steps: int = 120
    lr: float = 3e-3
    page: int = 16
    width: int = 64
    distance_buckets: int = 12
    sink_pages: int = 1
    local_pages: int = 1
    eval_budget: int = 256
    check_every: int = 20
    layers: tuple[int, ...] | None = None
    seed: int = 0

    def validate(self) -> None:
        for name in ("seq_len", "sequences", "rows", "steps", "width", "distance_buckets",
                     "check_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        try:
            check_pages(self.eval_budget, self.page, self.sink_pages, self.local_pages)
        except ValueError as err:
            raise ConfigError(f"eval_budget: {err}") from err
        if self.layers is not None and (not self.layers or min(self.layers) < 0):
            raise ConfigError(f"layers must be layer indices >= 0 (or null: all), got "
                              f"{list(self.layers)}")
        first = self.first_row
        if self.seq_len <= first:
            raise ConfigError(f"seq_len {self.seq_len} leaves no query with a page to choose "
                              f"(the first is at {first}); give a longer seq_len")

    @property
    def first_row(self) -> int:
        """The first position whose row has a candidate page beside the kept ones."""
        return (self.sink_pages + self.local_pages) * self.page


@dataclasses.dataclass
class LayerSample:
    """One sequence at one layer: ``keys`` ``[Hk, T, D]`` and their page ``summary``
    ``[Hk, P, 3D]``, ``queries`` ``[H, R, D]`` of the rows at ``positions`` ``[R]``, and the
    teacher's candidate-page ``target`` ``[H, R, P]`` with its ``candidates`` ``[R, P]``."""

    keys: Tensor
    summary: Tensor
    queries: Tensor
    positions: Tensor
    target: Tensor
    candidates: Tensor


def sample_rows(recipe: FrozenRecipe, generator: torch.Generator) -> Tensor:
    """``rows`` distinct sorted positions in ``[first_row, seq_len)``."""
    span = recipe.seq_len - recipe.first_row
    chosen = torch.randperm(span, generator=generator)[:min(recipe.rows, span)]
    return chosen.sort().values + recipe.first_row


def candidate_pages(positions: Tensor, n_keys: int, recipe: FrozenRecipe) -> Tensor:
    """``[R, P]``: the pages a causal row at each position chooses among."""
    n_pages = -(-n_keys // recipe.page)
    readable, forced = page_masks(torch.tensor([n_keys]), positions[None], n_pages, recipe.page,
                                  recipe.sink_pages, recipe.local_pages, causal=True)
    return (readable & ~forced)[0, 0]


def page_targets(queries: Tensor, keys: Tensor, positions: Tensor, candidates: Tensor,
                 page: int, scale: float, block: int = 256) -> Tensor:
    """The teacher's attention mass per candidate page, renormalised: queries ``[H, R, D]``
    at ``positions`` ``[R]`` over causal keys ``[Hk, T, D]`` -> ``[H, R, P]`` (rows sum to 1
    over their candidates)."""
    h, n_rows = queries.shape[:2]
    n_keys = keys.shape[1]
    n_pages = candidates.shape[-1]
    keys = expand_kv_heads(keys[None], h)[0]
    key_page = torch.arange(n_keys) // page
    out = []
    for start in range(0, n_rows, block):
        rows = slice(start, start + block)
        scores = (queries[:, rows] @ keys.transpose(-1, -2)) * scale
        future = torch.arange(n_keys)[None] > positions[rows, None]
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        mass = probs.new_zeros(h, probs.shape[1], n_pages).index_add_(-1, key_page, probs)
        mass = mass * candidates[rows]
        out.append(mass / mass.sum(-1, keepdim=True).clamp_min(torch.finfo(mass.dtype).tiny))
    return torch.cat(out, dim=1)


def estimator_logits(estimator: PageEstimator, sample: LayerSample, page: int,
                     scale: float) -> Tensor:
    """The estimator's log-probabilities ``[H, R, P]`` over each row's candidate pages."""
    logits = estimator.logits_from_summaries(sample.queries[None], sample.summary[None],
                                             (sample.positions // page)[None], scale)[0]
    logits = logits.masked_fill(~sample.candidates, float("-inf"))
    return torch.log_softmax(logits, -1)


def kl_loss(log_probs: Tensor, sample: LayerSample) -> Tensor:
    """Mean over heads and rows of ``KL(target || estimate)`` on the candidate pages."""
    target = sample.target
    terms = torch.where(target > 0, target * (target.clamp_min(1e-30).log() - log_probs), 0.0)
    return terms.sum(-1).mean()


def kept_mass(scores: Tensor, sample: LayerSample, n_keep: int, kv_heads: int) -> float:
    """Share of the teacher's candidate mass in the ``n_keep`` pages each KV group keeps by
    ``scores`` ``[H, R, P]`` (the group's summed softmax, as the selector ranks)."""
    h, n_rows, n_pages = scores.shape
    probs = torch.softmax(scores.masked_fill(~sample.candidates, float("-inf")), -1)
    group = probs.nan_to_num(0.0).view(kv_heads, h // kv_heads, n_rows, n_pages).sum(1)
    ranked = group.masked_fill(~sample.candidates, -1.0)
    top = ranked.topk(min(n_keep, n_pages), dim=-1).indices
    chosen = torch.zeros_like(ranked, dtype=torch.bool).scatter_(-1, top, True)
    chosen = chosen & sample.candidates
    mass = sample.target.view(kv_heads, h // kv_heads, n_rows, n_pages)
    return float((mass * chosen[:, None]).sum(-1).mean())


def best_kept_mass(sample: LayerSample, n_keep: int, kv_heads: int) -> float:
    """:func:`kept_mass` of the teacher's own page mass (the best any page choice keeps)."""
    return kept_mass(sample.target.clamp_min(1e-30).log(), sample, n_keep, kv_heads)


def train_layer(estimator: PageEstimator, train: Sequence[LayerSample], held_out: LayerSample,
                recipe: FrozenRecipe, scale: float, kv_heads: int,
                on_step: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Fit one layer's estimator; its curves and held-out measures (module docstring).

    Every ``check_every`` steps (and before the first) the held-out kept mass is measured,
    and the estimator ends with the weights that kept the most (early stopping: with a few
    sequences the larger layers can fit their training rows and lose on new text; the
    untrained start, block top-k's scores, is among the candidates)."""
    n_keep = recipe.eval_budget // recipe.page - recipe.sink_pages - recipe.local_pages

    def held_out_measures() -> tuple[float, float]:
        with torch.no_grad():
            log_probs = estimator_logits(estimator, held_out, recipe.page, scale)
            return (float(kl_loss(log_probs, held_out)),
                    kept_mass(log_probs, held_out, n_keep, kv_heads))

    kl_before, kept_before = held_out_measures()
    best = (kept_before, 0, copy.deepcopy(estimator.state_dict()))
    checks = [{"step": 0, "kl": kl_before, "kept_mass": kept_before}]
    optimizer = torch.optim.Adam(estimator.parameters(), lr=recipe.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / recipe.steps)))
    curve = []
    for step in range(1, recipe.steps + 1):
        loss = sum(kl_loss(estimator_logits(estimator, s, recipe.page, scale), s)
                   for s in train) / len(train)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"the estimator's loss is {float(loss)} at step {step}; "
                                     "lower lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        curve.append(loss.item())
        if on_step is not None:
            on_step(step, curve[-1])
        if step % recipe.check_every == 0 or step == recipe.steps:
            kl, kept = held_out_measures()
            checks.append({"step": step, "kl": kl, "kept_mass": kept})
            if kept > best[0]:
                best = (kept, step, copy.deepcopy(estimator.state_dict()))
    estimator.load_state_dict(best[2])
    return {"train_kl": curve, "held_out_checks": checks, "kept_step": best[1], "held_out": {
        "kl_before": kl_before, "kl_after": held_out_measures()[0],
        "kept_mass_block": kept_before, "kept_mass_after": best[0],
        "kept_mass_best": best_kept_mass(held_out, n_keep, kv_heads)}}


class QueryKeyRecorder:
    """Records each converted layer's rotated keys and sampled queries during a forward of
    a model converted to the exact ``sdpa`` core (:func:`attnlab.hf.convert`)."""

    def __init__(self, cores: Sequence[nn.Module]) -> None:
        self.positions: Tensor | None = None
        self.seen: dict[int, tuple[Tensor, Tensor]] = {}
        self._hooks = [core.register_forward_hook(self._hook(i)) for i, core in
                       enumerate(cores)]

    def _hook(self, layer: int) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple, output: Any) -> None:
            q, k = args[0], args[1]
            self.seen[layer] = (k[0].detach().float().clone(),
                                q[0][:, self.positions].detach().float().clone())
        return record

    def record(self, run: Callable[[], Any], positions: Tensor) -> dict[int, tuple[Tensor, Tensor]]:
        """``{layer: (keys [Hk, T, D], queries [H, R, D])}`` of one forward ``run()``."""
        self.positions, self.seen = positions, {}
        run()
        return self.seen

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def layer_samples(recorded: Sequence[dict[int, tuple[Tensor, Tensor]]],
                  positions: Sequence[Tensor], layer: int, recipe: FrozenRecipe,
                  scale: float) -> Iterator[LayerSample]:
    """The :class:`LayerSample` of each recorded sequence at ``layer``."""
    for seen, rows in zip(recorded, positions, strict=True):
        keys, queries = seen[layer]
        candidates = candidate_pages(rows, keys.shape[1], recipe)
        target = page_targets(queries, keys, rows, candidates, recipe.page, scale)
        pages = (torch.arange(keys.shape[1]) // recipe.page)[None]
        summary = page_summaries(keys[None], pages, candidates.shape[-1])[0]
        yield LayerSample(keys, summary, queries, rows, target, candidates)
