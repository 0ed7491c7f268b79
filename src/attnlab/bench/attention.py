"""``attnlab bench attention``: one attention core (q, k, v -> o) per mechanism and length.

Every mechanism is a core name from the :data:`attnlab.layers.CORES` registry (``sdpa``,
``eager``, ``performer``, ``reformer``, and any core registered later), built exactly as the
attention layer builds it (``CORES.build(PartSpec(name, options), ctx=..., dropout=0)``), with
the context of one layer of ``heads`` x ``d_head`` trained at ``max_seq_len = seq_len``. Inputs
are random ``[batch, heads, seq_len, d_head]`` q, k, v (fixed seed, shared by all mechanisms);
the call is the core's forward with ``scale = d_head ** -0.5`` and no mask or bias, in eval
mode for ``fwd`` and train mode for ``fwdbwd`` (q, k, v and the core's parameters get grads).

Per length, all mechanisms are timed side by side (alternating reps, ``time_side_by_side``)
and each one's peak memory is measured (``peak_memory_mb``); ratios are against ``sdpa`` at the
same length, measured in the same rounds.

Memory guard: before a length is run, each mechanism's peak is extrapolated from the two
largest lengths measured so far (two small probe lengths before the first) as
``a * T + b * T^2`` with ``a, b >= 0``, plus its inputs; one needing more than ``max_mem_gb``
GiB is not run and gets a record with ``"skipped": reason``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from attnlab.config import ConfigError, PartSpec, apply_override, to_dict
from attnlab.layers import CORES, AttentionCore, LayerContext
from attnlab.models.config import ModelConfig
from attnlab.results import (
    PASSES,
    Record,
    fill_ratios,
    fwd,
    fwdbwd,
    machine_info,
    peak_memory_mb,
    time_side_by_side,
    write_json,
)
from attnlab.results.scaling import scaling_title, summarize

logger = logging.getLogger(__name__)

BENCH = "attention"
LAYER_BENCH = "attention-layer"
BASELINE = "sdpa"
PREFERRED = ("sdpa", "eager", "sea", "performer", "reformer")
DEFAULT_SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
MAX_MEM_FRACTION = 0.4
MIB = 2**20
GIB = 2**30


def default_mechanisms() -> list[str]:
    """The cores of ``PREFERRED`` that are registered, in that order."""
    registered = set(CORES.names())
    return [m for m in PREFERRED if m in registered]


def default_max_mem_gb(device: torch.device | str = "cpu") -> float:
    """``MAX_MEM_FRACTION`` of the device's memory (CUDA: the GPU's; CPU: physical RAM), GiB."""
    device = torch.device(device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return MAX_MEM_FRACTION * total / GIB


def core_specs(mechanisms: Sequence[str], overrides: Sequence[str] = ()) -> dict[str, PartSpec]:
    """One validated :class:`PartSpec` per mechanism; ``overrides`` are ``MECH.OPTION=VALUE``
    (value parsed as YAML) setting the mechanism's core options. A mechanism is a core name,
    or ``CORE@LABEL`` for a second copy of a core with its own options (``quest@flex`` with
    ``--set quest@flex.executor=flex``). Raises ``ConfigError`` for an unknown core (listing
    the registered ones) or option."""
    for m in mechanisms:
        core, at, label = m.partition("@")
        if at and not (core and label):
            raise ConfigError(f"mechanism {m!r} must look like CORE or CORE@LABEL")
    data: dict[str, Any] = {m: {"name": m.partition("@")[0]} for m in mechanisms}
    for assignment in overrides:
        key = assignment.split("=", 1)[0].strip()
        mech, dot, option = key.partition(".")
        if "=" not in assignment or not dot or not option:
            raise ConfigError(f"--set {assignment!r} must look like MECHANISM.OPTION=VALUE")
        if mech not in data:
            raise ConfigError(f"--set {assignment!r}: {mech!r} is not a benchmarked mechanism "
                              f"({list(data)})")
        apply_override(data, assignment)
    specs = {m: PartSpec.parse(d, f"mechanism {m}") for m, d in data.items()}
    for spec in specs.values():
        CORES.options(spec)  # unknown name or option -> ConfigError
    return specs


def build_core(
    spec: PartSpec,
    *,
    heads: int,
    d_head: int,
    seq_len: int,
    causal: bool,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> AttentionCore:
    """The core as an attention layer of ``heads`` x ``d_head`` (``max_seq_len = seq_len``)
    would build it."""
    ctx = LayerContext(
        d_model=heads * d_head, n_heads=heads, d_head=d_head, causal=causal,
        max_seq_len=seq_len, layer_idx=0, n_layers=1, init_scale=1.0,
    )
    return CORES.build(spec, ctx=ctx, dropout=0.0).to(device=device, dtype=dtype)


def _inputs(
    batch: int, heads: int, seq_len: int, d_head: int, *, grad: bool, dtype: torch.dtype,
    device: torch.device, seed: int,
) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, heads, seq_len, d_head, generator=gen)
        .to(device=device, dtype=dtype).requires_grad_(grad)
        for _ in range(3)
    ]


def _call(core: AttentionCore, qkv: Sequence[Tensor], pass_: str) -> Callable[[], None]:
    q, k, v = qkv
    scale = q.shape[-1] ** -0.5

    def forward() -> Tensor:
        return core(q, k, v, scale=scale).out

    if pass_ == "fwd":
        core.eval()
        return fwd(forward)
    core.train()
    return fwdbwd(forward, [*qkv, *core.parameters()])


def extrapolate_bytes(points: Sequence[tuple[int, float]], seq_len: int) -> float:
    """Peak bytes at ``seq_len`` from the last two ``(seq_len, bytes)`` points, as
    ``a * T + b * T^2`` through both with ``a, b >= 0`` (when the exact fit has a negative
    term, the other term alone is fitted to the steeper of the two points). Of points at the
    same length, the last counts."""
    (t1, m1), (t2, m2) = list(dict(points).items())[-2:]
    det = t1 * t2 * (t2 - t1)
    a = (m1 * t2 * t2 - m2 * t1 * t1) / det
    b = (m2 * t1 - m1 * t2) / det
    if b < 0:
        a, b = max(m1 / t1, m2 / t2), 0.0
    elif a < 0:
        a, b = 0.0, max(m1 / t1**2, m2 / t2**2)
    return a * seq_len + b * seq_len**2


def probe_lengths(seq_lens: Sequence[int]) -> tuple[int, int]:
    """Two small lengths (``P``, ``2P``; ``P = smallest / 4``, within [4, 256]) whose peak
    memory seeds the extrapolation for the first real length."""
    p = max(4, min(256, min(seq_lens) // 4))
    return p, 2 * p


def _shape(seq_len: int, heads: int, d_head: int, batch: int, causal: bool,
           dtype: torch.dtype) -> dict[str, Any]:
    return {"seq_len": seq_len, "heads": heads, "d_head": d_head, "batch": batch,
            "causal": causal, "dtype": str(dtype).removeprefix("torch.")}


def run(
    mechanisms: Sequence[str] | None = None,
    seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
    *,
    causal: bool = True,
    pass_: str = "fwd",
    heads: int = 12,
    d_head: int = 64,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    options: Sequence[str] = (),
    reps: int = 10,
    max_mem_gb: float | None = None,
    json_path: str | os.PathLike[str] | None = None,
    plot_path: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
) -> list[Record]:
    """Benchmark every mechanism at every length (ascending); returns the records, ratios
    against ``sdpa`` filled (``sdpa`` is added first when missing). Writes the JSON (with the
    ``summarize`` summary) and the plot when paths are given. Defaults: OPT-125M's 12 heads of
    64, batch 1, causal, forward only."""
    if pass_ not in PASSES:
        raise ValueError(f"unknown pass {pass_!r}; known: {PASSES}")
    if plot_path is not None:
        from attnlab.results.figures import require_matplotlib

        require_matplotlib()  # fail before the measurements, not after
    mechs = list(dict.fromkeys(default_mechanisms() if mechanisms is None else mechanisms))
    if not mechs:
        raise ConfigError(f"no mechanisms given; registered cores: {CORES.names()}")
    if BASELINE not in mechs:
        logger.info("adding the baseline %r to the mechanisms", BASELINE)
        mechs.insert(0, BASELINE)
    specs = core_specs(mechs, options)
    lengths = _lengths(seq_lens)
    dev = torch.device(device)
    budget = (default_max_mem_gb(dev) if max_mem_gb is None else max_mem_gb) * GIB
    grad = pass_ == "fwdbwd"
    elt = torch.empty((), dtype=dtype).element_size()
    logger.info("attention %s, %s, batch %d, %d heads x %d, %s; memory budget %.1f GiB",
                pass_, "causal" if causal else "bidirectional", batch, heads, d_head,
                str(dtype).removeprefix("torch."), budget / GIB)

    def prepared(seq_len: int) -> dict[str, Callable[[], None]]:
        qkv = _inputs(batch, heads, seq_len, d_head, grad=grad, dtype=dtype, device=dev,
                      seed=seed)
        calls = {}
        for m in mechs:
            torch.manual_seed(seed)  # random features / rotations drawn alike every run
            core = build_core(specs[m], heads=heads, d_head=d_head, seq_len=seq_len,
                              causal=causal, device=dev, dtype=dtype)
            calls[m] = _call(core, qkv, pass_)
        return calls

    records = measure_lengths(
        mechs, lengths, prepared, bench=BENCH, baseline=BASELINE, pass_=pass_, reps=reps,
        mem_budget=budget,
        inputs_bytes=lambda t: 3 * batch * heads * t * d_head * elt * (2 if grad else 1),
        shape=lambda t: _shape(t, heads, d_head, batch, causal, dtype), device=dev,
    )
    fill_ratios(records, BASELINE)
    for r in records:  # after the ratios: options are per mechanism, the grouping is by shape
        if specs[r.name].options:
            r.shape = {**r.shape, "options": dict(specs[r.name].options)}
    if json_path is not None:
        write_json(json_path, records, summary=summarize(records))
    if plot_path is not None:
        from attnlab.results.figures import machine_label, plot_scaling

        title = scaling_title(records, machine_label(machine_info()))
        plot_scaling(records, plot_path, title=title)
    return records


def run_layers(
    models: Mapping[str, ModelConfig],
    seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
    *,
    batch: int = 1,
    reps: int = 10,
    max_mem_gb: float | None = None,
    time_budget_s: float | None = None,
    min_seq_len: int = 0,
    json_path: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
) -> list[Record]:
    """Whole attention layers against length: for a mechanism that is not an attention core
    (SwitchHead changes the projections), or to include projections and positions in the
    cost. ``models`` maps a name to the model config whose first layer's attention is
    benchmarked (built as that model builds it, ``max_seq_len = T``); the first one is the
    baseline. Forward (eval mode, no autograd) of ``[batch, T, d_model]`` random input, causal;
    ``time_budget_s`` and ``min_seq_len`` as in :func:`measure_lengths`. Each record's shape
    holds the common
    ``seq_len``, ``d_model``, ``batch``, then (after the ratios) the layer's ``attention``
    config and ``macs``, its forward MACs (:func:`attnlab.metrics.exact_attention_cost`; None
    for cores without MAC accounting)."""
    from attnlab.metrics.macs import counted, exact_attention_cost
    from attnlab.models.lm import Block

    names = list(models)
    if not names:
        raise ValueError("run_layers needs at least one model config")
    widths = {cfg.d_model for cfg in models.values()}
    if len(widths) > 1:
        raise ValueError(f"layers of one benchmark share d_model, got {sorted(widths)}")
    (d_model,) = widths
    dev = torch.device(device)
    budget = (default_max_mem_gb(dev) if max_mem_gb is None else max_mem_gb) * GIB

    def prepared(seq_len: int) -> dict[str, Callable[[], None]]:
        x = torch.randn(batch, seq_len, d_model, generator=torch.Generator().manual_seed(seed))
        x = x.to(dev)
        calls = {}
        for name, cfg in models.items():
            torch.manual_seed(seed)
            layer = Block(dataclasses.replace(cfg, max_seq_len=seq_len), 0).attn.to(dev).eval()
            calls[name] = fwd(lambda layer=layer: layer(x).hidden)
        return calls

    def shape(seq_len: int) -> dict[str, Any]:
        return {"seq_len": seq_len, "d_model": d_model, "batch": batch, "causal": True,
                "dtype": "float32"}

    records = measure_lengths(
        names, _lengths(seq_lens), prepared, bench=LAYER_BENCH, baseline=names[0], pass_="fwd",
        reps=reps, mem_budget=budget, inputs_bytes=lambda t: 4 * batch * t * d_model,
        shape=shape, device=dev, time_budget_s=time_budget_s, min_seq_len=min_seq_len,
    )
    fill_ratios(records, names[0])
    for r in records:
        cfg = models[r.name]
        att = cfg.attention
        macs = None
        if counted(att.projections, att.positions, att.core):
            macs = exact_attention_cost(att.projections, att.positions, d_model=d_model,
                                        n_heads=att.n_heads, d_head=cfg.d_head,
                                        seq_len=r.shape["seq_len"], memory_len=0,
                                        core=att.core)["macs"]
        r.shape = {**r.shape, "attention": to_dict(att), "macs": macs}
    if json_path is not None:
        write_json(json_path, records, summary=summarize(records))
    return records


def _lengths(seq_lens: Sequence[int]) -> list[int]:
    lengths = sorted(set(seq_lens))
    if not lengths or lengths[0] < 1:
        raise ValueError(f"seq_lens must be positive, got {list(seq_lens)}")
    return lengths


def measure_lengths(
    mechs: Sequence[str],
    lengths: Sequence[int],
    prepared: Callable[[int], Mapping[str, Callable[[], None]]],
    *,
    bench: str,
    baseline: str,
    pass_: str,
    reps: int,
    mem_budget: float,
    inputs_bytes: Callable[[int], float],
    shape: Callable[[int], dict[str, Any]],
    device: torch.device,
    time_budget_s: float | None = None,
    min_seq_len: int = 0,
) -> list[Record]:
    """The measuring loop of every scaling benchmark: at each length (ascending),
    ``prepared(T)`` gives one call per mechanism; they are timed side by side and each one's
    peak memory is measured. The memory guard (module docstring) skips, with a record saying
    why, a mechanism whose extrapolated peak plus ``inputs_bytes(T)`` exceeds ``mem_budget``
    bytes (all of them when ``baseline`` is skipped). With ``time_budget_s``,
    lengths stop (unrecorded) once the next one would end past that many seconds, predicted
    at 4x (twice the length of a quadratic mechanism) the last length's time of the
    mechanisms the memory guard keeps; lengths up to ``min_seq_len`` are measured whatever the
    time budget. Records have no ratios yet."""
    start = time.perf_counter()
    history: dict[str, list[tuple[int, float]]] = {m: [] for m in mechs}
    for t in probe_lengths(lengths):
        for m, call in prepared(t).items():
            history[m].append((t, peak_memory_mb(call, device) * MIB))

    records: list[Record] = []
    last_s: dict[str, float] = {}  # seconds each mechanism took at the last length
    for seq_len in lengths:
        skipped: dict[str, str] = {}
        for m in mechs:
            need = extrapolate_bytes(history[m], seq_len) + inputs_bytes(seq_len)
            if need > mem_budget:
                (t1, _), (t2, _) = history[m][-2:]
                skipped[m] = (f"needs ~{need / GIB:.1f} GiB (extrapolated from seq_len {t1} and "
                              f"{t2}), over the {mem_budget / GIB:.1f} GiB limit (--max-mem-gb)")
        if baseline in skipped:
            for m in mechs:
                skipped.setdefault(m, f"baseline {baseline!r} skipped: {skipped[baseline]}")
        elapsed = time.perf_counter() - start
        predicted = 4 * sum(s for m, s in last_s.items() if m not in skipped)
        if (time_budget_s is not None and records and seq_len > min_seq_len
                and elapsed + predicted > time_budget_s):
            logger.warning("stopping before seq_len %d: %.0f s of the %.0f s time budget spent, "
                           "the next length needs ~%.0f s", seq_len, elapsed, time_budget_s,
                           predicted)
            break
        for m, reason in skipped.items():
            logger.warning("skipping %s at seq_len %d: %s", m, seq_len, reason)
        length_start = time.perf_counter()
        calls = {m: c for m, c in prepared(seq_len).items() if m not in skipped}
        timings = time_side_by_side(calls, reps, device=device) if calls else {}
        for m in mechs:
            if m in skipped:
                records.append(Record(bench, m, pass_, shape(seq_len), None, None, None,
                                      skipped=skipped[m]))
                continue
            mem = peak_memory_mb(calls[m], device)
            history[m].append((seq_len, mem * MIB))
            timing = timings[m]
            records.append(Record(bench, m, pass_, shape(seq_len), timing.median, timing.min,
                                  mem))
            logger.info("seq_len %d %s %s: %.2f ms (min %.2f), %.1f MiB",
                        seq_len, m, pass_, timing.median, timing.min, mem)
        del calls
        # the length's time (side-by-side timing and memory runs), shared by median time
        total_ms = sum(timings[m].median for m in timings) or 1.0
        length_s = time.perf_counter() - length_start
        last_s = {m: length_s * timings[m].median / total_ms for m in timings}
    return records
