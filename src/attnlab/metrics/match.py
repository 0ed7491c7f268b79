"""Parameter matching: a SwitchHead or MoA config with the parameters of a dense baseline.

The SwitchHead paper compares its models to dense ones of equal parameter count (Sec. 3;
``../shared/specs/switchhead.md`` section 1):

1. Set ``H * E`` to the baseline's head count.
2. Start with ``H = 2, k = 2``; if that underperforms the dense baseline, raise ``k``; if
   ``k = 4`` still does, use ``H = 4, k = 2`` (the authors' head-count rule: start at 2
   heads, double to 4 if worse than the dense baseline).
3. Pick ``d_head``, and nudge ``d_ff``, so the parameter count matches the baseline.

:func:`match_params` automates step 3. Parameters are counted exactly, by building
``DecoderLM`` on the meta device (vocabulary 256 when the config leaves it unset), for every
candidate it looks at; the count is non-decreasing in ``d_head`` and ``d_ff``, so an affine
guess from two counts, galloping and bisection find the solution in about ten builds.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable
from typing import Any

from attnlab.config import ConfigError, closest, from_dict, to_dict
from attnlab.metrics.macs import DEFAULT_VOCAB, attention_cost, count_params
from attnlab.models.config import ModelConfig
from attnlab.train.config import RunConfig, TrainConfig

MATCH_PROJECTIONS = ("moa", "switchhead")
DENSE_MLPS = ("dense", "swiglu")
"""The MLPs of a dense baseline (not a mixture of experts)."""
SOLVES = ("both", "d_head", "d_ff")
PAPER_D_HEAD_MULTIPLE = 4
"""Every ``d_head`` of the paper's SwitchHead configs (64, 76, 112, 132) is a multiple of 4."""
SWITCHHEAD_K = 2  # the paper's starting k
WRAP = 90  # columns of the printed rule and the YAML header
MAX_SIZE_RATIO = 64  # a solved d_head or d_ff is at most this times d_model


@dataclasses.dataclass(frozen=True)
class MatchReport:
    """What :func:`match_params` chose and how close it came.

    ``step_params``: parameters that one unit of the last-solved size adds (the granularity:
    the match is within half of it). ``*_attention_macs``: forward attention MACs per token
    of the whole model (all layers, "exact" convention of :func:`attention_cost`, at
    ``train.seq_len`` tokens plus the XL memory), None where that accounting does not cover
    the config. ``vocab_size`` None: unset in the config, counted as 256.
    ``content_bias_dropped``: the dense XL positions' u/v biases were left out, as the
    paper's SwitchHead has none.
    """

    projections: str
    n_heads: int
    n_experts: int
    k: int | None
    solve: str
    d_head_multiple: int | None
    dense_n_heads: int
    dense_d_head: int
    dense_d_ff: int
    d_head: int
    d_ff: int
    dense_params: int
    params: int
    step_params: int
    vocab_size: int | None
    dense_attention_macs: int | None
    attention_macs: int | None
    content_bias_dropped: bool

    @property
    def rel_diff(self) -> float:
        """``(params - dense_params) / dense_params``."""
        return (self.params - self.dense_params) / self.dense_params

    def to_dict(self) -> dict[str, Any]:
        """The fields plus ``rel_diff``, JSON-able."""
        return {**dataclasses.asdict(self), "rel_diff": self.rel_diff}

    def target(self) -> str:
        """``"switchhead H2, E5, k2"`` / ``"moa H2 of E8"``: the matched attention."""
        if self.projections == "moa":
            return f"moa H{self.n_heads} of E{self.n_experts}"
        return f"{self.projections} H{self.n_heads}, E{self.n_experts}, k{self.k}"

    def rule(self) -> str:
        """One sentence saying how ``d_head`` and ``d_ff`` were chosen."""
        nudge = f"d_ff {self.dense_d_ff} -> {self.d_ff}"
        if self.solve == "both":
            return (f"d_head {self.d_head} = the largest multiple of {self.d_head_multiple} "
                    "whose model at the dense d_ff has at most the dense parameters (paper "
                    f"recipe), then {nudge} closes the gap")
        if self.solve == "d_head":
            step = "" if self.d_head_multiple == 1 else f" (multiples of {self.d_head_multiple})"
            return f"d_head {self.d_head} solved{step}, d_ff kept at {self.d_ff}"
        return f"d_head {self.d_head} given, {nudge} solved"


def _run_config(model: ModelConfig) -> RunConfig:
    """``model`` with the default data and train sections, ``train.seq_len`` set to the
    positions left after the XL memory (``max_seq_len - memory_len``)."""
    return RunConfig(model=model, train=TrainConfig(seq_len=model.max_seq_len - model.memory_len))


def _check_choice(
    projections: str, n_heads: int, n_experts: int, k: int | None, solve: str,
    d_head: int | None, d_head_multiple: int | None,
) -> None:
    """ConfigError naming the valid choices when the target attention or solve is invalid."""
    if projections not in MATCH_PROJECTIONS:
        raise ConfigError(f"cannot match projections {projections!r}"
                          f"{closest(projections, MATCH_PROJECTIONS)}; choices: "
                          f"{list(MATCH_PROJECTIONS)}")
    if solve not in SOLVES:
        raise ConfigError(f"solve must be one of {list(SOLVES)}, got {solve!r}")
    for name, value in (("n_heads", n_heads), ("n_experts", n_experts), ("k", k),
                        ("d_head", d_head), ("d_head_multiple", d_head_multiple)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if projections == "moa":
        if k is not None:
            raise ConfigError("moa takes no k: each token picks n_heads of the n_experts "
                              "query/output experts; leave k out")
        if n_experts < n_heads:
            raise ConfigError(f"moa picks n_heads={n_heads} of n_experts={n_experts} per "
                              f"token; choose n_experts >= {n_heads}")
    elif k is not None and k > n_experts:
        raise ConfigError(f"k={k} exceeds n_experts={n_experts}: switchhead picks k of each "
                          f"head's experts; choose k in 1..{n_experts}")
    if d_head is not None and solve != "d_ff":
        raise ConfigError(f"a given d_head is kept only with solve 'd_ff' (solve {solve!r} "
                          "solves d_head)")
    if d_head_multiple is not None and solve == "d_ff":
        raise ConfigError("d_head_multiple applies to a solved d_head; solve 'd_ff' keeps "
                          "d_head fixed")


def _check_dense(model: ModelConfig) -> None:
    """ConfigError unless ``model`` is a dense baseline: dense projections and a dense MLP
    (what the report calls it)."""
    projections, mlp = model.attention.projections.name, model.mlp.name
    if projections != "dense" or mlp not in DENSE_MLPS:
        raise ConfigError(f"match needs a dense baseline (projections 'dense', mlp one of "
                          f"{list(DENSE_MLPS)}); the given config has projections "
                          f"{projections!r} and mlp {mlp!r}: give the dense config it is "
                          "compared with")


def _target_attention(
    model: ModelConfig, projections: str, n_heads: int, n_experts: int, k: int | None
) -> tuple[dict[str, Any], bool]:
    """The matched ``model.attention`` mapping without ``d_head``, and whether the dense XL
    content biases were dropped (SwitchHead only, as in the paper)."""
    att = to_dict(model.attention)
    options: dict[str, Any] = {"n_experts": n_experts}
    if projections == "switchhead":
        options["k"] = k
    positions = model.attention.positions
    drop_bias = (projections == "switchhead" and positions.name == "xl"
                 and positions.options.get("content_bias", True))
    if drop_bias:
        att["positions"] = {"name": "xl", **positions.options, "content_bias": False}
    att.update(n_heads=n_heads, projections={"name": projections, **options})
    att.pop("d_head")
    return att, bool(drop_bias)


def _counter(cfg: RunConfig, attention: dict[str, Any]) -> Callable[[int, int], int]:
    """``count(d_head, d_ff)``: parameters of ``cfg``'s model with ``attention`` of that
    ``d_head`` and that ``d_ff``, built on meta; memoised. ConfigError if it cannot be built."""
    seen: dict[tuple[int, int], int] = {}

    def count(d_head: int, d_ff: int) -> int:
        if (d_head, d_ff) not in seen:
            try:
                model = dataclasses.replace(cfg.model, d_ff=d_ff, attention={
                    **attention, "d_head": d_head})
                seen[d_head, d_ff] = count_params(dataclasses.replace(cfg, model=model))
            except ValueError as err:
                raise ConfigError(f"{attention['projections']['name']} with d_head={d_head}, "
                                  f"d_ff={d_ff} cannot be built: {err}") from err
        return seen[d_head, d_ff]

    return count


def _largest_within(count: Callable[[int], int], target: int, start: int, hi: int) -> int | None:
    """The largest ``x`` in ``[1, hi]`` with ``count(x) <= target`` (``count`` non-decreasing),
    or None when ``count(1) > target``: an affine guess through ``start`` and ``start + 1``,
    then galloping to a bracket ``inside < outside`` and bisection."""
    start = min(max(start, 1), hi - 1)
    slope = count(start + 1) - count(start)
    guess = start + (target - count(start)) // slope if slope > 0 else start
    guess = min(max(guess, 1), hi)
    step = 1
    if count(guess) <= target:
        inside, outside = guess, hi + 1
        while outside > hi and inside < hi:
            probe = min(inside + step, hi)
            inside, outside = (probe, outside) if count(probe) <= target else (inside, probe)
            step *= 2
        if outside > hi:
            return inside
    else:
        inside, outside = 0, guess
        while inside < 1 and outside > 1:
            probe = max(outside - step, 1)
            inside, outside = (probe, outside) if count(probe) <= target else (inside, probe)
            step *= 2
        if inside < 1:
            return None
    while outside - inside > 1:
        mid = (inside + outside) // 2
        inside, outside = (mid, outside) if count(mid) <= target else (inside, mid)
    return inside


def _closest(
    count: Callable[[int], int], target: int, start: int, hi: int, what: str, unit: int = 1
) -> int:
    """The ``x`` in ``[1, hi]`` whose ``count(x)`` is nearest ``target`` (ties: the smaller);
    ConfigError when every ``x`` overshoots or ``hi`` still falls short. ``what`` names
    ``unit * x`` in the message."""
    below = _largest_within(count, target, start, hi)
    if below is None:
        raise ConfigError(f"no {what} matches: even {what}={unit} gives {count(1):,} "
                          f"parameters, more than the dense {target:,}; choose fewer heads or "
                          "experts, or solve another size")
    if below == hi:
        if count(hi) < target:
            raise ConfigError(f"no {what} up to {unit * hi} reaches the dense {target:,} "
                              "parameters; choose more heads or experts, or solve another size")
        return hi
    return below if target - count(below) <= count(below + 1) - target else below + 1


def _solve_d_head(
    count: Callable[[int, int], int], target: int, model: ModelConfig, multiple: int,
    nearest: bool,
) -> int:
    """A multiple of ``multiple`` for ``d_head`` at the dense ``d_ff``: the one whose count is
    ``nearest`` the target, or else the largest within it (at least ``multiple``)."""
    def by_head(i: int) -> int:
        return count(multiple * i, model.d_ff)

    start, hi = model.d_head // multiple, max(MAX_SIZE_RATIO * model.d_model // multiple, 2)
    if nearest:
        return multiple * _closest(by_head, target, start, hi, "d_head", multiple)
    return multiple * (_largest_within(by_head, target, start, hi) or 1)


def _solve_d_ff(
    count: Callable[[int, int], int], target: int, model: ModelConfig, d_head: int
) -> int:
    """The ``d_ff`` whose count with ``d_head`` is nearest the target."""
    def by_ff(d_ff: int) -> int:
        return count(d_head, d_ff)

    return _closest(by_ff, target, model.d_ff, MAX_SIZE_RATIO * model.d_model, "d_ff")


def _attention_macs(cfg: RunConfig) -> int | None:
    """Forward attention MACs per token, all layers ("exact"), or None if not covered."""
    try:
        macs = attention_cost(cfg)["attention_macs"]
    except ValueError:
        return None
    return cfg.model.n_layers * macs // cfg.train.seq_len


def match_params(
    dense: RunConfig | ModelConfig,
    projections: str,
    *,
    n_heads: int,
    n_experts: int,
    k: int | None = None,
    solve: str = "both",
    d_head: int | None = None,
    d_head_multiple: int | None = None,
) -> tuple[RunConfig, MatchReport]:
    """A ``projections`` ("switchhead" or "moa") config with the parameter count of ``dense``.

    The matched config is ``dense`` with ``n_heads`` heads of ``projections`` (``n_experts``
    experts; SwitchHead picks ``k`` of each head's, default 2, MoA takes no ``k``), XL
    content biases dropped for SwitchHead (the paper's has none), and ``solve``:

    * ``"both"`` (default, the paper's recipe): ``d_head`` is the largest multiple of
      ``d_head_multiple`` (default 4, like every paper d_head; at least that multiple) whose
      model at the dense ``d_ff`` has at most the dense parameters, then ``d_ff`` is nudged
      to the count nearest the dense one. This reproduces the shipped paper configs' d_head
      (47M: 76, 262M: 132) and their d_ff within 3.
    * ``"d_head"``: ``d_head`` (a multiple of ``d_head_multiple``, default 1) nearest the
      dense count, ``d_ff`` kept.
    * ``"d_ff"``: ``d_head`` as given (default: the dense one), ``d_ff`` nearest.

    The match is within half of ``MatchReport.step_params`` (one unit of the last-solved
    size): for a dense MLP ``d_ff`` moves the count by ``2 * d_model * n_layers``.

    Returns the matched :class:`RunConfig` (validated like a loaded one; a ``dense``
    ModelConfig gets the default data and train sections, ``train.seq_len`` =
    ``max_seq_len - memory_len``) and a :class:`MatchReport`.
    ConfigError for a baseline that is not dense, an invalid choice, or when no size within
    ``[1, 64 * d_model]`` matches.
    """
    _check_choice(projections, n_heads, n_experts, k, solve, d_head, d_head_multiple)
    cfg = dense if isinstance(dense, RunConfig) else _run_config(dense)
    _check_dense(cfg.model)
    if projections == "switchhead" and k is None:
        k = SWITCHHEAD_K
    if d_head_multiple is None and solve != "d_ff":
        d_head_multiple = PAPER_D_HEAD_MULTIPLE if solve == "both" else 1
    model = cfg.model
    target = count_params(cfg)
    attention, dropped = _target_attention(model, projections, n_heads, n_experts, k)
    count = _counter(cfg, attention)
    if solve == "d_ff":
        d_head = d_head or model.d_head
    else:
        d_head = _solve_d_head(count, target, model, d_head_multiple, nearest=solve == "d_head")
    d_ff = model.d_ff if solve == "d_head" else _solve_d_ff(count, target, model, d_head)
    if solve == "d_head":
        step = count(d_head + d_head_multiple, d_ff) - count(d_head, d_ff)
    else:
        step = count(d_head, d_ff + 1) - count(d_head, d_ff)
    data = to_dict(cfg)
    data["model"].update(d_ff=d_ff, attention={**attention, "d_head": d_head})
    matched = from_dict(RunConfig, data)
    report = MatchReport(
        projections=projections, n_heads=n_heads, n_experts=n_experts, k=k, solve=solve,
        d_head_multiple=d_head_multiple, dense_n_heads=model.attention.n_heads,
        dense_d_head=model.d_head, dense_d_ff=model.d_ff, d_head=d_head, d_ff=d_ff,
        dense_params=target, params=count(d_head, d_ff), step_params=step,
        vocab_size=model.vocab_size, dense_attention_macs=_attention_macs(cfg),
        attention_macs=_attention_macs(matched), content_bias_dropped=dropped,
    )
    return matched, report


def format_match(report: MatchReport) -> str:
    """A plain-text table, dense vs matched (heads, d_head, d_ff, params, attention MACs per
    token), then the relative difference and the rule."""
    def cell(value: int | None) -> str:
        return "n/a" if value is None else f"{value:,}"

    head = ("", f"dense H{report.dense_n_heads}", report.target())
    rows = [
        head,
        ("n_heads", cell(report.dense_n_heads), cell(report.n_heads)),
        ("d_head", cell(report.dense_d_head), cell(report.d_head)),
        ("d_ff", cell(report.dense_d_ff), cell(report.d_ff)),
        ("params", cell(report.dense_params), cell(report.params)),
        ("attention MACs/token", cell(report.dense_attention_macs), cell(report.attention_macs)),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows]
    diff = report.params - report.dense_params
    lines.append(f"params vs dense: {report.rel_diff:+.4%} ({diff:+,}; one step of the solved "
                 f"size: {report.step_params:,})")
    lines += textwrap.wrap(f"{report.rule()}.", WRAP)
    if report.content_bias_dropped:
        lines.append("XL content biases (u, v) dropped, as in the paper's SwitchHead.")
    return "\n".join(lines)


def match_header(report: MatchReport, source: str) -> str:
    """YAML comment lines (ending in a newline) saying how the config was matched."""
    vocab = report.vocab_size or f"{DEFAULT_VOCAB} (unset, as counted)"
    lines = [
        f"Matched by `attnlab match` to {source} (dense H{report.dense_n_heads}, "
        f"d_head {report.dense_d_head}): {report.target()}.",
        f"{report.rule()}.",
        f"Parameters (vocab {vocab}; counted by building DecoderLM): "
        f"{report.params:,} ({report.rel_diff:+.4%} vs {report.dense_params:,}).",
    ]
    if report.content_bias_dropped:
        lines.append("XL content biases (u, v) dropped, as in the paper's SwitchHead.")
    return "".join(f"# {part}\n" for line in lines for part in textwrap.wrap(line, WRAP))
