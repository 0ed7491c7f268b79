"""``attnlab bench serve``: prefill latency and decoding throughput of a Hugging Face model,
original vs converted, in the way a serving system runs them.

For the original model (``original``, its own SDPA attention) and a copy converted to each
given core (default: SEA with ``k = 256, predictor_length = 64``), all in one dtype, over a
grid of dtypes x batches x context lengths ``T``:

* ``op: prefill``: one forward of a batch of prompts ``[batch, T]`` into a fresh KV cache, as
  a server admits requests: left padding (row ``i`` of ``B > 1`` prompts has
  ``(T // 8) * i // (B - 1)`` pad tokens in front, so the last row has ``T - T // 8`` real
  tokens; batch 1 has none), ``attention_mask`` and ``position_ids`` from it, and only the
  last position's logits (``logits_to_keep=1``, what sampling the first new token needs).
  The prompts are real tokens, so this is a real prefill.
* ``op: decode``: tokens/s of cached single-token steps alone (``batch`` tokens per step).
  Each model starts from a cache filled with *random* keys and values (shape field
  ``"cache": "random"``) with the same left-padding mask, instead of a real prefill: a decode
  step's cost depends on the sizes of the cache, not on the values in it (the attention reads
  every cached key whatever they hold; SEA selects a fixed budget of ``k`` keys per head),
  and skipping the prefill keeps long contexts and large batches affordable on a CPU. The
  first ``warmup`` steps are untimed (the first lets an attnlab core build its decoding state
  from the cached keys, as after any cache it did not fill itself), one more is traced for
  memory, then the models alternate: in each of ``reps`` rounds every model runs ``steps``
  timed steps continuing its own cache. The cache holds ``T - n`` tokens at the start, ``n``
  being the steps run (``warmup + 1 + reps * steps``), so the last timed step attends to
  ``T`` keys (shape field ``"contexts"``: the first and last timed step's) and no position
  goes past ``T``: ``T`` up to the model's ``max_position_embeddings`` is accepted.

Both sides use :class:`attnlab.hf.cache.InPlaceCache`, which writes new keys into reserved
room like a serving system's KV memory: transformers' ``DynamicCache`` would copy the whole
cache on every step (``torch.cat``), a cost that would dominate the original's decoding and
flatter the converted cores.

Timing alternates the models (round-robin, so drift hits all alike) and takes medians; peak
memory (:func:`attnlab.results.peak_memory_mb`) comes from a separate untimed call (a
prefill, which also warms the prefill up; for decode, one step plus the cache's own bytes,
computed from its shapes, and the bytes of the cores' decoding states,
:func:`attnlab.hf.attention.decoding_state_bytes`). Records follow
:mod:`attnlab.results`'s schema (``bench: "serve"``, ``pass: "fwd"``, baseline
``original``); :func:`summarize` gives decode tokens/s and speedups per model, dtype, batch
and length.

Cost on a CPU: a prefill is quadratic in ``T`` for the original (minutes at ``T = 8192`` and
batch 8 on SmolLM2-135M), hence the default ``prefill_batches=(1,)``; decoding from random
caches is cheap to set up at any size (memory: every model holds its own cache, ``batch *
Hk * T * D * 2`` elements per layer).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import transformers
from torch import Tensor
from tqdm import tqdm

from attnlab.bench.hf import (
    BASELINE,
    add_options,
    check_max_length,
    core_specs,
    load_original,
    model_names,
    original_fingerprint,
    side_by_side,
)
from attnlab.bench.serve_inputs import (
    CacheShape,
    Grid,
    check_cores,
    decode_steps,
    left_padding_mask,
    pad_lengths,
    padding_label,
    positions,
    random_cache,
    validated_grid,
)
from attnlab.bench.serve_reference import DecodeReference, Stepper
from attnlab.config import ConfigError, PartSpec
from attnlab.hf.attention import CORE_ATTR, decoding_state_bytes
from attnlab.hf.cache import InPlaceCache
from attnlab.layers.registry import check_budget, keys_per_row
from attnlab.models.quantize import quantize_linears
from attnlab.results import (
    Record,
    Timing,
    fill_ratios,
    peak_memory_mb,
    time_call,
    write_json,
)
from attnlab.results.figures import require_matplotlib
from attnlab.results.serve import plot_decode, summarize
from attnlab.utils.device import resolve_device

logger = logging.getLogger(__name__)

BENCH = "serve"
DEFAULT_CORES: tuple[dict[str, Any], ...] = ({"name": "sea", "k": 256, "predictor_length": 64},)
DEFAULT_SEQ_LENS = (2048, 4096, 8192)
DEFAULT_BATCHES = (1, 4, 8)
DEFAULT_PREFILL_BATCHES = (1,)
DEFAULT_DTYPES = ("float32",)
WEIGHTS = ("float", "int8")
"""The models' linear weights: in the dtype of the cell, or weight-only int8."""
QUIET_LOGGER = "attnlab.hf.attention"  # warns once per core type about rebuilt states


# ---------------------------------------------------------------- calls


def prefill_call(model: transformers.PreTrainedModel, ids: Tensor, mask: Tensor,
                 capacity: int) -> Callable[[], None]:
    """One prefill of ``ids`` ``[B, T]`` (mask ``[B, T]``) into a fresh ``InPlaceCache``."""
    pos = positions(mask)

    def call() -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=pos,
                  cache=InPlaceCache(capacity=capacity), use_cache=True, logits_to_keep=1)

    return call


class Decoder:
    """Single-token decoding steps of one model continuing its own cache.

    ``mask``: ``[B, T]``, the whole left-padded mask of the cell; the cache holds its first
    ``cache.get_seq_length()`` positions, and each :meth:`step` appends one token."""

    def __init__(self, model: transformers.PreTrainedModel, cache: InPlaceCache, mask: Tensor,
                 token: Tensor) -> None:
        self.model, self.cache, self.mask, self.token = model, cache, mask, token  # token [B, 1]
        self.length = cache.get_seq_length()
        self.next_pos = positions(mask[:, : self.length])[:, -1:] + 1  # [B, 1]

    def step(self) -> None:
        """One forward of ``token`` with the mask of ``length + 1`` positions."""
        self.length += 1
        with torch.no_grad():
            self.model(input_ids=self.token, attention_mask=self.mask[:, : self.length],
                       position_ids=self.next_pos, cache=self.cache, use_cache=True)
        self.next_pos += 1  # in place: nothing allocated before a traced step is freed in it


def alternate(fns: Mapping[str, Callable[[], object]], rounds: int, per_round: int = 1,
              device: torch.device | str = "cpu") -> dict[str, Timing]:
    """Time candidates round-robin: each of ``rounds`` rounds runs every candidate in turn,
    ``per_round`` timed calls in a row (a block, as a server runs one model's steps). Unlike
    :func:`attnlab.results.time_side_by_side` there is no warmup and no minimum count:
    the caller warms up (a decode cell's warmup steps, a prefill's memory call)."""
    device = torch.device(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name] += [time_call(fn, device) for _ in range(per_round)]
    return {name: Timing(tuple(ts)) for name, ts in times.items()}


# ---------------------------------------------------------------- cells


def _shape(model: Mapping[str, str], op: str, seq_len: int, batch: int, dtype: torch.dtype,
           **extra: Any) -> dict[str, Any]:
    """A record's shape: ``model`` (its label and fingerprint), then the cell's sizes."""
    return {**model, "op": op, "seq_len": seq_len, "batch": batch,
            "dtype": str(dtype).removeprefix("torch."), "padding": padding_label(batch), **extra}


def prefill_cell(models: Mapping[str, transformers.PreTrainedModel], model: Mapping[str, str],
                 batch: int, seq_len: int, dtype: torch.dtype, grid: Grid,
                 device: torch.device, generator: torch.Generator) -> list[Record]:
    """Records of one prefill of random prompts ``[batch, seq_len]`` by every model."""
    vocab = next(iter(models.values())).config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq_len), generator=generator).to(device)
    mask = left_padding_mask(pad_lengths(batch, seq_len), seq_len, device)
    fns = {name: prefill_call(m, ids, mask, seq_len + grid.steps) for name, m in models.items()}
    peaks = {name: peak_memory_mb(fn, device) for name, fn in fns.items()}  # also the warmup
    timings = alternate(fns, grid.reps, device=device)
    shape = _shape(model, "prefill", seq_len, batch, dtype)
    return [Record(BENCH, name, "fwd", dict(shape), timings[name].median, timings[name].min,
                   peaks[name]) for name in models]


def decode_cell(models: Mapping[str, transformers.PreTrainedModel], model: Mapping[str, str],
                batch: int, seq_len: int, dtype: torch.dtype, grid: Grid,
                device: torch.device, generator: torch.Generator,
                references: Sequence[DecodeReference] = ()) -> list[Record]:
    """Records of cached decoding steps by every model from random caches, the last timed
    step attending to ``seq_len`` keys, and by every reference engine that runs the cell
    (its own cache, the same steps; a skipped record with the reason where it does not)."""
    config = next(iter(models.values())).config
    kv = CacheShape.of(config)
    start = seq_len - decode_steps(grid.steps, grid.warmup, grid.reps)
    mask = left_padding_mask(pad_lengths(batch, seq_len), seq_len, device)
    token = torch.randint(0, config.vocab_size, (batch, 1), generator=generator).to(device)
    steppers: dict[str, Stepper] = {}
    peaks: dict[str, float | None] = {}
    for name, m in models.items():
        cache = random_cache(kv, batch, start, seq_len, dtype, device, generator)
        dec = Decoder(m, cache, mask, token)
        for _ in range(grid.warmup):
            dec.step()
        cache_mb = (kv.nbytes(batch, dec.length + 1, dtype)
                    + decoding_state_bytes(dec.cache)) / 2**20
        with _native_stderr_muted():
            peaks[name] = cache_mb + peak_memory_mb(dec.step, device)
        steppers[name] = dec
    skipped = {ref.name: ref.why_not(batch) for ref in references}
    for ref in references:
        if skipped[ref.name] is None:
            stepper = ref.decoder(seq_len, start, torch.get_num_threads())
            for _ in range(grid.warmup + 1):  # the models' warmup and memory steps
                stepper.step()
            steppers[ref.name], peaks[ref.name] = stepper, None
    first = start + grid.warmup + 2
    timings = alternate({name: s.step for name, s in steppers.items()}, grid.reps, grid.steps,
                        device)
    shape = _shape(model, "decode", seq_len, batch, dtype, cache="random",
                   steps=grid.reps * grid.steps, contexts=[first, seq_len])
    records = [Record(BENCH, name, "fwd", dict(shape), timings[name].median,
                      timings[name].min, peaks[name]) for name in steppers]
    return records + [Record(BENCH, name, "fwd", dict(shape), None, None, None, skipped=why)
                      for name, why in skipped.items() if why is not None]


# ---------------------------------------------------------------- run


@contextlib.contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """Send file descriptor 2 to the null device for a while. A traced decode step frees the
    core's previous decoding state, allocated before the trace began, and torch's allocator
    then prints a one-time C++ warning ("Memory block of unknown size ...") that no Python
    setting silences; the peak is unaffected (the state is live at the peak either way)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def _quiet_and_threads(threads: int | None) -> Iterator[None]:
    """Silence :data:`QUIET_LOGGER` below ERROR and set torch's threads, restoring both."""
    quiet = logging.getLogger(QUIET_LOGGER)
    level, old_threads = quiet.level, torch.get_num_threads()
    quiet.setLevel(logging.ERROR)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        quiet.setLevel(level)
        torch.set_num_threads(old_threads)


def _cast(masters: Mapping[str, transformers.PreTrainedModel], dtype: torch.dtype,
          device: torch.device, weights: str) -> dict[str, transformers.PreTrainedModel]:
    """The models in ``dtype`` on ``device``, their linear layers in int8 when ``weights`` is
    ``int8``: the masters themselves when they already are, else copies (the masters stay as
    loaded for the next dtype)."""
    out = {}
    for name, model in masters.items():
        param = next(model.parameters())
        same = param.dtype == dtype and param.device == device and weights == "float"
        out[name] = model if same else copy.deepcopy(model).to(device, dtype)
        if weights == "int8":  # the model's own layers; a core's parts keep their numerics
            quantize_linears(out[name], keep=_core_part)
    return out


def _core_part(name: str, _: torch.nn.Linear) -> bool:
    """Whether the module ``name`` belongs to a converted layer's attnlab core."""
    return f".{CORE_ATTR}." in f".{name}."


def run(
    model: str | None = None,
    *,
    gguf_file: str | None = None,
    cores: Sequence[str | dict | PartSpec] = DEFAULT_CORES,
    seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
    batches: Sequence[int] = DEFAULT_BATCHES,
    prefill_batches: Sequence[int] = DEFAULT_PREFILL_BATCHES,
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    steps: int = 8,
    warmup: int = 2,
    reps: int = 3,
    threads: int | None = None,
    device: str = "cpu",
    json_path: str | os.PathLike[str] | None = None,
    plot_path: str | os.PathLike[str] | None = None,
    seed: int = 0,
    progress: bool = True,
    references: Sequence[DecodeReference] = (),
    weights: str = "float",
) -> list[Record]:
    """Benchmark the original model against each converted core over the grid dtypes x
    (prefill batches x seq_lens, then batches x seq_lens); returns the records, ratios
    against ``original`` filled, and writes the JSON (with :func:`summarize`) and the plot
    (:func:`plot_decode`) when paths are given. Each record's shape names the model
    (``model``: its label; ``model_sha256``: the fingerprint of its files,
    :func:`attnlab.bench.hf.original_fingerprint`), a converted core's options and its
    ``keys_per_row`` (None: every key); the JSON's machine the threads and the cores.

    ``model``: a Hugging Face model folder (None: the tiny random Llama of ``bench hf``);
    ``gguf_file``: a GGUF file in it. ``cores``: names or mappings with options.
    ``prefill_batches`` may be empty (no prefill). ``dtypes``: names among
    :data:`~attnlab.bench.serve_inputs.DTYPES` (float16 on CUDA only). ``steps``: timed
    decode steps per model per round; ``reps``: rounds (prefills: timed calls per model).
    ``threads``: torch threads during the run (None: unchanged; either way at most the
    machine's cores). ``references``: other engines' decoding beside the models (e.g.
    :class:`attnlab.bench.serve_reference.LlamaCpp`), in the decode cells they run and as
    skipped records, with the reason, in the others. ``weights``: ``float`` (each dtype's) or
    ``int8`` (every model's own linear layers weight-only int8, not its cores' parts:
    :func:`attnlab.models.quantize.quantize_linears`; activations in the dtype); records
    carry it in their shape. Everything is validated
    (``ValueError`` / ``ConfigError``, nothing written) before the models are converted, a
    core's key budget too: one not smaller than the shortest length is dense attention
    there."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r} is not valid; valid: {', '.join(WEIGHTS)}")
    dev = resolve_device(device)
    grid = validated_grid(seq_lens, batches, prefill_batches, dtypes, steps, warmup, reps, threads,
                          dev)
    specs = core_specs(cores)
    check_cores(specs)
    names = model_names(specs)
    for name, spec in zip(names, specs, strict=True):
        check_budget(f"core {name}", spec, grid.seq_lens[0])
    for ref in references:
        if ref.name in (BASELINE, *names):
            raise ConfigError(f"reference {ref.name!r} has the name of a model of the run")
        ref.check(dev)
    if plot_path is not None:
        require_matplotlib()
    fingerprint = original_fingerprint(model, gguf_file=gguf_file, seed=seed)
    original, label = load_original(model, gguf_file=gguf_file, seed=seed)
    if not original.can_generate():
        raise ConfigError(f"{label} is not a generating (causal) language model")
    identity = {"model": label, "model_sha256": fingerprint, "weights": weights}
    check_max_length(original, grid.seq_lens[-1])
    masters = side_by_side(original, specs, seed)
    gen = torch.Generator().manual_seed(seed)
    records: list[Record] = []
    cells = grid.cells()
    with _quiet_and_threads(threads), tqdm(total=len(cells), desc="bench serve", unit="cell",
                                           file=sys.stderr, disable=None if progress else True,
                                           dynamic_ncols=True) as bar:
        models, models_dtype = {}, None
        for dtype, op, batch, seq_len in cells:
            if dtype != models_dtype:
                models.clear()  # free the previous dtype's copies first
                models, models_dtype = _cast(masters, dtype, dev, weights), dtype
            bar.set_postfix_str(f"{str(dtype).removeprefix('torch.')} {op} B={batch} "
                                f"T={seq_len}")
            cell = prefill_cell if op == "prefill" else decode_cell
            extra = {"references": references} if op == "decode" else {}
            done = cell(models, identity, batch, seq_len, dtype, grid, dev, gen, **extra)
            for r in done:
                logger.debug("%s %s B=%d T=%d %s: %s ms (min %s), %s MiB", dtype, op, batch,
                             seq_len, r.name, r.ms_median, r.ms_min, r.peak_mem_mb)
            records += done
            bar.update()
        fill_ratios(records, BASELINE)
        add_options(records, specs)
        by_name = {ref.name: ref for ref in references}
        for r in records:
            if r.name in by_name:
                r.shape = {**r.shape, **by_name[r.name].shape(r.shape["seq_len"])}
        budgets = {name: keys_per_row(spec) for name, spec in zip(names, specs, strict=True)}
        for r in records:
            r.shape["keys_per_row"] = budgets.get(r.name)
        if json_path is not None:  # machine_info() inside both: with the run's threads
            write_json(json_path, records, summary=summarize(records))
        if plot_path is not None:
            plot_decode(records, plot_path)
    return records
