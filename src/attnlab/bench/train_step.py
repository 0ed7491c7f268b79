"""``attnlab bench train``: one whole training step of several run configs, side by side.

For every config it builds the model (``vocab_size`` 256 when the config leaves it None) and
its AdamW optimizer (:func:`attnlab.train.loop.make_optimizer`), and times one training step
as the training loop does it: ``train.grad_accum`` micro-batches of random tokens
(``train.batch_size x train.seq_len``) forward (bf16 autocast if ``train.bf16``) and
backward, gradient clipping when ``train.grad_clip > 0``, the optimizer step and
``zero_grad``. With ``model.memory_len > 0`` the Transformer-XL memory is carried from step
to step, starting from the untimed warm-up step, so every timed step attends to a full
memory chunk.

The configs are timed round-robin by :func:`time_side_by_side`. Each record's shape holds
``batch``, ``seq_len``, ``memory_len``, ``params``, ``tokens_per_step`` and ``tokens_per_s``
(from ``ms_median``). The shapes differ between configs (parameter counts), so the ratio is
set here against the first config rather than by ``fill_ratios``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from attnlab.models import DecoderLM, ModelCache
from attnlab.results import Record, peak_memory_mb, time_side_by_side, write_json
from attnlab.train.config import RunConfig, load_run_config
from attnlab.train.loop import make_optimizer

logger = logging.getLogger(__name__)

BENCH = "train"
PASS = "fwdbwd"
DEFAULT_VOCAB = 256


def load_configs(
    configs: Sequence[str | os.PathLike[str]], overrides: Sequence[str] = ()
) -> dict[str, RunConfig]:
    """``{file stem: RunConfig}`` with ``overrides`` applied to each, in the given order.

    Raises ``FileNotFoundError`` naming every missing file, ``ValueError`` when no config is
    given or two share a stem (the stems name the records).
    """
    if not configs:
        raise ValueError("bench train needs at least one config file")
    paths = [Path(c) for c in configs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"config file(s) not found: {', '.join(missing)}")
    stems = [p.stem for p in paths]
    dupes = sorted({s for s in stems if stems.count(s) > 1})
    if dupes:
        raise ValueError(f"configs must have distinct file names (record names); repeated: {dupes}")
    return {p.stem: load_run_config(p, overrides) for p in paths}


def make_step(cfg: RunConfig, device: torch.device) -> tuple[DecoderLM, Callable[[], None]]:
    """The model of ``cfg`` and a closure doing one whole training step on random tokens."""
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = DEFAULT_VOCAB
    t, memory_len = cfg.train, cfg.model.memory_len
    torch.manual_seed(t.seed)
    model = DecoderLM(cfg.model).to(device)
    model.train()
    optimizer = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(t.seed)
    tokens = torch.randint(
        0, cfg.model.vocab_size, (t.grad_accum, t.batch_size, t.seq_len + 1), generator=gen
    ).to(device)
    memory: list[ModelCache | None] = [None]

    def step() -> None:
        for micro in tokens:
            x, y = micro[:, :-1], micro[:, 1:]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.bf16):
                out = model(x, targets=y, cache=memory[0], use_cache=memory_len > 0)
            if memory_len:
                memory[0] = out.cache.trimmed(memory_len)
            ((out.loss + out.aux_loss) / t.grad_accum).backward()
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def run(
    configs: Sequence[str | os.PathLike[str]],
    steps: int = 5,
    overrides: Sequence[str] = (),
    json_path: str | os.PathLike[str] | None = None,
    device: str = "cpu",
) -> list[Record]:
    """Time a training step of every config side by side (``steps`` reps each, >= 5) and
    measure one step's peak memory; returns one record per config (named by the file stem,
    ratio against the first config) and writes them to ``json_path`` when given."""
    return run_configs(load_configs(configs, overrides), steps, json_path, device)


def run_configs(
    cfgs: Mapping[str, RunConfig],
    steps: int = 5,
    json_path: str | os.PathLike[str] | None = None,
    device: str = "cpu",
) -> list[Record]:
    """:func:`run` for configs already loaded, ``{record name: RunConfig}`` (the first is the
    baseline of the ratios)."""
    dev = torch.device(device)
    models: dict[str, DecoderLM] = {}
    calls: dict[str, Callable[[], None]] = {}
    for name, cfg in cfgs.items():
        models[name], calls[name] = make_step(cfg, dev)
        logger.info("%s: %d parameters", name, models[name].num_params())
    timings = time_side_by_side(calls, steps, device=dev)
    records: list[Record] = []
    for name, cfg in cfgs.items():
        t = timings[name]
        mem = peak_memory_mb(calls[name], dev)
        tokens_per_step = cfg.train.batch_size * cfg.train.seq_len * cfg.train.grad_accum
        shape = {
            "batch": cfg.train.batch_size,
            "seq_len": cfg.train.seq_len,
            "memory_len": cfg.model.memory_len,
            "params": models[name].num_params(),
            "tokens_per_step": tokens_per_step,
            "tokens_per_s": round(tokens_per_step / (t.median / 1e3), 1),
        }
        records.append(Record(BENCH, name, PASS, shape, t.median, t.min, mem))
        logger.info("%s: %.1f ms/step (min %.1f), %.1f MiB", name, t.median, t.min, mem)
    base = records[0]
    for r in records:
        r.baseline, r.ratio = base.name, r.ms_median / base.ms_median
    if json_path is not None:
        write_json(json_path, records)
    return records
