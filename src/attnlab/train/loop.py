"""The training loop, in one readable file (nanoGPT spirit).

``train(cfg, out_dir)`` trains a :class:`DecoderLM` and leaves in ``out_dir``:
``config.yaml`` (resolved), ``tokenizer.json``, ``metrics.jsonl``, ``checkpoints/`` and, when
it finishes, ``summary.json``. Batches are a pure function of (seed, step), and the
checkpoint carries model, optimizer, RNG and XL-memory state, so ``resume=True`` continues
exactly where the last checkpoint left off.

Top to bottom: :func:`train` checks the run folder once, then :func:`build` (data, model,
optimizer; the schedule is :func:`lr_at`), :func:`resume_from_checkpoint`,
:func:`start_writing`, :func:`run_steps` (the step loop: :func:`train_step`,
:func:`evaluate`, :func:`checkpoint`) and :func:`finish` (the final evaluation and the
summary). The bookkeeping shared with ``attnlab distill`` is elsewhere: the folder's rules in
:mod:`attnlab.train.runner`; progress bar, logged loss window, cadence, divergence and
Ctrl-C in :mod:`attnlab.train.steps`.

Under ``torchrun`` (``WORLD_SIZE`` > 1) each rank trains on its rows of the same global batch
(see :mod:`attnlab.train.distributed`), the model is wrapped in DDP or FSDP2
(``train.distributed``), and only rank 0 writes logs, metrics, checkpoints and the summary.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.config import ConfigError, dump_yaml
from attnlab.data import (
    DataConfig,
    SequentialBatches,
    TokenizedCorpus,
    load_corpus,
    load_tokenizer,
    random_batch,
)
from attnlab.models import DecoderLM, ModelCache
from attnlab.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from attnlab.train.config import RunConfig
from attnlab.train.distributed import (
    Dist,
    JobStopped,
    grad_sync,
    lost_peer,
    map_tensors,
    process_group,
    rank_device,
    unused_parameters,
    unwrap,
    wrap_model,
)
from attnlab.train.evaluate import evaluate_lm, loss_metrics
from attnlab.train.runner import MetricsLog, RunFolder, peak_rss_mb, read_metrics
from attnlab.train.schedules import warmup_cosine
from attnlab.train.steps import Cadence, StepResult, StepTracker
from attnlab.utils.io import atomic_write_json

logger = logging.getLogger(__name__)

KEPT_ON_RESUME = {"data.tokenizer": DataConfig.tokenizer, "data.vocab_size": DataConfig.vocab_size}
"""Settings a resumed run cannot change (flat key -> default): its tokenizer is the folder's."""


class RankFailure(RuntimeError):
    """A multi-process run stopped because one of its processes failed or was stopped."""


@dataclasses.dataclass
class Training:
    """One rank's run, as :func:`build` makes it: what every later step reads, plus the two
    things that change from step to step (``memory``, ``check_unused``)."""

    cfg: RunConfig  # resolved: model.vocab_size is set
    folder: RunFolder
    dist: Dist
    device: torch.device
    corpus: TokenizedCorpus
    model: torch.nn.Module  # DDP- or FSDP-wrapped under torchrun, else the DecoderLM
    n_params: int
    optimizer: torch.optim.AdamW
    sequential: SequentialBatches | None  # consecutive chunks (XL memory), else random rows
    memory: ModelCache | None = None  # Transformer-XL memory, carried from step to step
    check_unused: bool = False  # DDP: after the first step, check every parameter got a grad


def train(
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True,
    pause_at: int | None = None, force: bool = False,
) -> dict[str, Any]:
    """Train (or resume) a run in ``out_dir``; returns the summary also written to JSON.

    Under torchrun every rank calls this and gets the same summary. ``pause_at``: stop once
    this step is done, with a checkpoint there and no final evaluation or summary (returns
    ``{"paused_at": step}``); ``resume`` continues it, with the same or a changed
    ``train.steps`` (the learning rate stays continuous while the pause is in the warm-up).
    ``force``: start a new run in a folder that holds other files (see :class:`RunFolder`).
    """
    out_dir = Path(out_dir)
    dist = Dist.from_env()
    device = rank_device(cfg.train.device, dist)
    with process_group(dist, device):
        try:
            folder = RunFolder(out_dir, "config.yaml", "run", resume=resume, main=dist.is_main,
                               force=force)
            folder.check()
            folder.check_kept(dump_yaml(cfg), KEPT_ON_RESUME, "a resumed run reads its text "
                              "with the tokenizer it started with (tokenizer.json in the "
                              "folder); start a new run for another tokenizer")
            dist.barrier()  # every rank has looked before rank 0 writes
            with folder.lifetime():
                return _run(cfg, folder, dist, device, progress, pause_at)
        except RuntimeError as err:
            if not (dist.enabled and lost_peer(err)):
                raise
            last = latest_checkpoint(out_dir)
            reason = err if isinstance(err, JobStopped) else (
                "lost contact with another process, which failed or was stopped (see its error "
                "or torchrun's report)"
            )
            raise RankFailure(
                f"rank {dist.rank} of {dist.world_size}: {reason}. The last complete checkpoint is "
                f"{last or 'none (none written yet)'}; continue with --resume, on any number of "
                "processes"
            ) from err


def _run(
    cfg: RunConfig, folder: RunFolder, dist: Dist, device: torch.device, progress: bool,
    pause_at: int | None,
) -> dict[str, Any]:
    """The run in a checked folder: build, resume, train, finish."""
    run = build(cfg, folder, dist, device)
    t = run.cfg.train
    tracker = StepTracker(
        folder, Cadence(t.steps, t.log_every, t.eval_every, t.ckpt_every),
        tokens_per_step=t.batch_size * t.seq_len * t.grad_accum,
        save=functools.partial(checkpoint, run), metrics=None, what="training",
        divergence_hint="Try a lower train.lr, train.grad_clip > 0, or train.warmup_steps.",
        progress=progress and dist.is_main,
        graceful_stop=not dist.enabled,  # under torchrun, SIGTERM means a peer failed
    )
    if (done := resume_from_checkpoint(run, tracker)) is not None:
        return dist.broadcast_object(done)
    start_writing(run, tracker)
    if not run_steps(run, tracker, pause_at):
        if tracker.metrics is not None:
            tracker.metrics.close()
        return {"paused_at": tracker.step}
    return finish(run, tracker)


# -- build: data, model, optimizer, schedule -------------------------------------------------


def load_data(cfg: RunConfig, out_dir: Path, resume: bool, dist: Dist) -> TokenizedCorpus:
    """The corpus; rank 0 builds caches (and a BPE tokenizer) first, the others reuse them."""
    with dist.main_first():
        tokenizer = load_tokenizer(out_dir) if resume else None
        return load_corpus(cfg.data, tokenizer=tokenizer)


def with_vocab_size(cfg: RunConfig, tokenizer_vocab: int) -> RunConfig:
    """``cfg`` with ``model.vocab_size`` resolved (a new config; ``cfg`` is left as it is):
    the tokenizer's when unset; ``ConfigError`` when it is smaller than the tokenizer's."""
    if cfg.model.vocab_size is None:
        return dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, vocab_size=tokenizer_vocab))
    if cfg.model.vocab_size < tokenizer_vocab:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the "
                          f"tokenizer's {tokenizer_vocab}")
    return cfg


def make_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors (norms, biases) do not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.train.lr, betas=(cfg.train.beta1, cfg.train.beta2))


def lr_at(step: int, cfg: RunConfig) -> float:
    """The rate of ``step``: linear warm-up, then cosine decay to ``lr * min_lr_ratio``."""
    t = cfg.train
    return warmup_cosine(step, t.lr, t.warmup_steps, t.steps, t.min_lr_ratio)


def build(cfg: RunConfig, folder: RunFolder, dist: Dist, device: torch.device) -> Training:
    """This rank's data, model and optimizer; writes nothing (a config that fails here leaves
    no folder behind)."""
    t = cfg.train
    for what, rows in (("train.batch_size", t.batch_size),
                       ("train.eval_batch_size", t.eval_batch_size)):
        try:  # both are global batches: each rank takes 1 / world_size of the rows
            dist.rows(rows, what)
        except ValueError as err:
            raise ConfigError(str(err)) from err
    torch.manual_seed(t.seed)
    if t.threads:
        torch.set_num_threads(t.threads)
    corpus = load_data(cfg, folder.path, folder.resume, dist)
    cfg = with_vocab_size(cfg, corpus.tokenizer.vocab_size)
    plain = DecoderLM(cfg.model).to(device)  # same seed on every rank: the same model
    n_params = plain.num_params()
    model = wrap_model(plain, t.distributed, plain.blocks, t.find_unused_parameters)
    optimizer = make_optimizer(model, cfg)
    logger.info("model: %.2fM parameters on %s", n_params / 1e6, device)
    sequential = None
    if cfg.sequential:
        sequential = SequentialBatches(corpus.train, t.batch_size, t.seq_len)
    return Training(
        cfg=cfg, folder=folder, dist=dist, device=device, corpus=corpus, model=model,
        n_params=n_params, optimizer=optimizer, sequential=sequential,
        check_unused=model is not plain and not t.find_unused_parameters,  # DDP wraps, FSDP not
    )


# -- resume ----------------------------------------------------------------------------------


def resume_from_checkpoint(run: Training, tracker: StepTracker) -> dict[str, Any] | None:
    """On resume, load the newest checkpoint (if any): model, optimizer, RNG, XL memory and
    the step, tokens and training time. Returns the summary of a run that had already
    finished (nothing left to do), else None."""
    if not (run.folder.resume and latest_checkpoint(run.folder.path) is not None):
        return None
    ckpt = load_checkpoint(run.folder.path, run.model, map_location=run.device,
                           optimizer=run.optimizer)
    torch.set_rng_state(ckpt.state["rng"])
    tracker.restore(ckpt.step, ckpt.state)
    run.memory = ModelCache.from_state(map_tensors(run.dist.shard, ckpt.state["memory"]))
    logger.info("resumed from %s", ckpt.path)
    return run.folder.finished_summary(tracker.step, run.cfg.train.steps)


def start_writing(run: Training, tracker: StepTracker) -> None:
    """The run's first writes (rank 0 only): the folder, a new run's tokenizer, the resolved
    config (a resumed run records what changed) and ``metrics.jsonl`` (cut back to the
    resumed step)."""
    folder = run.folder
    folder.create()
    if not folder.resume and run.dist.is_main:
        run.corpus.tokenizer.save(folder.path)
    folder.write_config(dump_yaml(run.cfg), tracker.step)
    if run.dist.is_main:
        tracker.metrics = MetricsLog(folder.path, tracker.step if folder.resume else None,
                                   run.cfg.train.tensorboard)


# -- the step loop ---------------------------------------------------------------------------


def run_steps(run: Training, tracker: StepTracker, pause_at: int | None) -> bool:
    """Train to ``train.steps`` (True) or to ``pause_at`` (False), logging, evaluating and
    checkpointing on the run's cadence, with a checkpoint at either end. A NaN or infinite
    loss stops it (:class:`TrainingDiverged`); so does a SIGINT / SIGTERM, once the step is
    saved (:class:`RunInterrupted`)."""
    t = run.cfg.train
    run.model.train()
    with tracker.session():
        while tracker.step < t.steps:
            start = time.perf_counter()
            result = train_step(run, tracker.step)
            tracker.count(result, time.perf_counter() - start)
            if tracker.eval_due():
                tracker.log_eval(evaluate(run, t.eval_tokens))
            if tracker.ckpt_due():
                tracker.save()
            if tracker.end_step(pause_at):
                return False
    tracker.save()
    return True


def train_step(run: Training, step: int) -> StepResult:
    """One optimizer step at the rate :func:`lr_at` over ``train.grad_accum`` micro-batches;
    reports the job's mean LM loss (and aux loss, when the model has one), the same on every
    rank."""
    cfg, t = run.cfg, run.cfg.train
    lr = lr_at(step, cfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    step_loss = step_aux = 0.0
    for micro in range(t.grad_accum):
        x, y = batch(run, step * t.grad_accum + micro)
        with grad_sync(run.model, micro == t.grad_accum - 1):  # reduce on the last micro-step
            with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=t.bf16):
                out = run.model(x, targets=y, cache=run.memory,
                                use_cache=cfg.model.memory_len > 0)
            if cfg.model.memory_len:
                run.memory = out.cache.trimmed(cfg.model.memory_len)
            loss = out.loss + out.aux_loss
            # one all-reduce: the job's LM and aux loss (NaN on any rank: NaN on every one)
            lm_loss, aux_loss = run.dist.all_reduce(
                torch.stack([out.loss, out.aux_loss]).detach().float(), "mean"
            ).tolist()
            (loss / t.grad_accum).backward()
        step_loss += lm_loss / t.grad_accum
        step_aux += aux_loss / t.grad_accum
    if run.check_unused:  # once; DDP itself would fail a step later, naming no config key
        run.check_unused = False
        if unused := unused_parameters(run.model):
            raise ConfigError(
                f"parameters {unused[:4]} got no gradient, which DDP cannot reduce: set "
                "train.find_unused_parameters=true (e.g. Reformer's shared-QK core ignores "
                "the key projection)"
            )
    if t.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), t.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    values = {"loss": step_loss}
    if out.aux:  # the model has auxiliary losses (e.g. MoE balancing)
        values["aux_loss"] = step_aux
    return StepResult(values, lr)


def batch(run: Training, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of global batch ``index``: int64 [batch_size / world_size, seq_len]."""
    t = run.cfg.train
    if run.sequential is not None:
        x, y = run.sequential.get(index)
    else:
        x, y = random_batch(run.corpus.train, t.batch_size, t.seq_len, t.seed, index)
    return run.dist.shard(x).to(run.device), run.dist.shard(y).to(run.device)


def evaluate(run: Training, max_tokens: int | None) -> dict[str, float]:
    """The ``eval_*`` fields of one held-out evaluation of ``max_tokens`` of the valid split
    (None: all of it); every rank calls it and gets the whole job's result."""
    t = run.cfg.train
    result = evaluate_lm(
        unwrap(run.model), run.corpus.valid, batch_size=t.eval_batch_size, seq_len=t.seq_len,
        max_tokens=max_tokens, device=run.device,
        autocast_dtype=torch.bfloat16 if t.bf16 else None, dist=run.dist,
    )
    metrics = loss_metrics(result["loss"], run.corpus.unit, run.corpus.bytes_per_token("valid"))
    return {"eval_loss": result["loss"], "eval_tokens": result["tokens"],
            **{f"eval_{k}": v for k, v in metrics.items()}}


def checkpoint(run: Training, step: int, state: dict[str, Any]) -> None:
    """Save ``step``: model, optimizer, the tracker's ``state``, the RNG and the XL memory
    (every rank's lanes); every rank calls it."""
    t = run.cfg.train
    memory = None if run.memory is None else map_tensors(run.dist.all_gather_rows,
                                                         run.memory.to_state())
    save_checkpoint(run.folder.path, step, run.model,
                    {**state, "rng": torch.get_rng_state(), "memory": memory},
                    keep=t.keep_checkpoints, optimizer=run.optimizer,
                    sharded=t.distributed == "fsdp",  # sharded checkpoints, on any world size
                    dist=run.dist)


# -- finish ----------------------------------------------------------------------------------


def finish(run: Training, tracker: StepTracker) -> dict[str, Any]:
    """The final evaluation (every rank), then on rank 0 its record and ``summary.json``;
    every rank returns the summary."""
    t, out_dir = run.cfg.train, run.folder.path
    last_eval = evaluate(run, t.final_eval_tokens)
    if tracker.metrics is None:  # not rank 0: rank 0 writes the summary, and every rank gets it
        return run.dist.broadcast_object(None)
    tracker.metrics.write({"step": tracker.step, **last_eval})
    tracker.metrics.close()
    summary = {
        "params": run.n_params,
        "steps": tracker.step,
        "tokens": tracker.tokens,
        "unit": run.corpus.unit,
        "train_loss": last_train_loss(out_dir),
        **last_eval,
        "tokens_per_s": tracker.tokens / max(tracker.wall, 1e-9),
        "peak_rss_mb": peak_rss_mb(),
        "wall_s": tracker.wall_s,
        "train_wall_s": tracker.wall,
        "device": str(run.device),
        "torch": torch.__version__,
    }
    if changes := run.folder.config_changes():
        summary["config_changes"] = changes
    if run.dist.enabled:
        summary.update(processes=run.dist.world_size, distributed=t.distributed)
    atomic_write_json(out_dir / "summary.json", summary)
    return run.dist.broadcast_object(summary)


def last_train_loss(out_dir: Path) -> float | None:
    """The last logged training loss in ``metrics.jsonl``."""
    train_records = [r["loss"] for r in read_metrics(out_dir) if "loss" in r]
    return train_records[-1] if train_records else None
