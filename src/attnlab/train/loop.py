"""The training loop, in one readable file (nanoGPT spirit).

``train(cfg, out_dir)`` trains a :class:`DecoderLM` and leaves in ``out_dir``:
``config.yaml`` (resolved), ``tokenizer.json``, ``metrics.jsonl``, ``checkpoints/`` and, when
it finishes, ``summary.json``. Batches are a pure function of (seed, step), and the
checkpoint carries model, optimizer, RNG and XL-memory state, so ``resume=True`` continues
exactly where the last checkpoint left off. This file holds the step and the evaluation;
the run's lifecycle around them (folder, cadence, divergence, Ctrl-C) is
:mod:`attnlab.train.runner`'s.

Under ``torchrun`` (``WORLD_SIZE`` > 1) each rank trains on its rows of the same global batch
(see :mod:`attnlab.train.distributed`), the model is wrapped in DDP or FSDP2
(``train.distributed``), and only rank 0 writes logs, metrics, checkpoints and the summary.
"""

from __future__ import annotations

import logging
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
from attnlab.train.runner import (
    Cadence,
    MetricsLog,
    RunFolder,
    Runner,
    StepResult,
    peak_rss_mb,
    read_metrics,
)
from attnlab.train.schedules import warmup_cosine
from attnlab.utils.io import atomic_write_json

logger = logging.getLogger(__name__)

KEPT_ON_RESUME = {"data.tokenizer": DataConfig.tokenizer, "data.vocab_size": DataConfig.vocab_size}
"""Settings a resumed run cannot change (flat key -> default): its tokenizer is the folder's."""


class RankFailure(RuntimeError):
    """A multi-process run stopped because one of its processes failed or was stopped."""


def lr_at(step: int, cfg: RunConfig) -> float:
    """The rate of ``step``: linear warm-up, then cosine decay to ``lr * min_lr_ratio``."""
    t = cfg.train
    return warmup_cosine(step, t.lr, t.warmup_steps, t.steps, t.min_lr_ratio)


def make_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors (norms, biases) do not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.train.lr, betas=(cfg.train.beta1, cfg.train.beta2))


def load_data(cfg: RunConfig, out_dir: Path, resume: bool, dist: Dist) -> TokenizedCorpus:
    """The corpus; rank 0 builds caches (and a BPE tokenizer) first, the others reuse them."""
    with dist.main_first():
        tokenizer = load_tokenizer(out_dir) if resume else None
        return load_corpus(cfg.data, tokenizer=tokenizer)


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
            return _train(cfg, out_dir, resume, progress, dist, device, pause_at, force)
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


def _train(
    cfg: RunConfig, out_dir: Path, resume: bool, progress: bool, dist: Dist, device: torch.device,
    pause_at: int | None = None, force: bool = False,
) -> dict[str, Any]:
    folder = RunFolder(out_dir, "config.yaml", "run", resume=resume, main=dist.is_main,
                       force=force)
    folder.check()
    folder.check_kept(dump_yaml(cfg), KEPT_ON_RESUME, "a resumed run reads its text with the "
                      "tokenizer it started with (tokenizer.json in the folder); start a new "
                      "run for another tokenizer")
    dist.barrier()  # every rank has looked before rank 0 writes
    with folder.lifetime():
        return _run(cfg, folder, progress, dist, device, pause_at)


def _run(
    cfg: RunConfig, folder: RunFolder, progress: bool, dist: Dist, device: torch.device,
    pause_at: int | None,
) -> dict[str, Any]:
    t, out_dir, resume = cfg.train, folder.path, folder.resume
    for what, rows in (("train.batch_size", t.batch_size),
                       ("train.eval_batch_size", t.eval_batch_size)):
        try:  # both are global batches: each rank takes 1 / world_size of the rows
            dist.rows(rows, what)
        except ValueError as err:
            raise ConfigError(str(err)) from err
    torch.manual_seed(t.seed)
    if t.threads:
        torch.set_num_threads(t.threads)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.bf16)

    corpus = load_data(cfg, out_dir, resume, dist)
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = corpus.tokenizer.vocab_size
    elif cfg.model.vocab_size < corpus.tokenizer.vocab_size:
        raise ConfigError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
            f"{corpus.tokenizer.vocab_size}"
        )
    plain = DecoderLM(cfg.model).to(device)  # same seed on every rank: the same model
    n_params = plain.num_params()
    model = wrap_model(plain, t.distributed, plain.blocks, t.find_unused_parameters)
    optimizer = make_optimizer(model, cfg)
    sharded = t.distributed == "fsdp"  # FSDP runs write sharded checkpoints, on any world size
    logger.info("model: %.2fM parameters on %s", n_params / 1e6, device)

    memory: ModelCache | None = None

    def save(step: int, state: dict[str, Any]) -> None:
        save_checkpoint(out_dir, step, model, {
            **state, "rng": torch.get_rng_state(),
            "memory": map_tensors(dist.all_gather_rows, memory.to_state())  # every rank's lanes
            if memory is not None else None,
        }, keep=t.keep_checkpoints, optimizer=optimizer, sharded=sharded, dist=dist)

    bytes_per_token = corpus.bytes_per_token("valid")

    def evaluate(max_tokens: int | None = t.eval_tokens) -> dict[str, float]:
        result = evaluate_lm(
            unwrap(model), corpus.valid, batch_size=t.eval_batch_size, seq_len=t.seq_len,
            max_tokens=max_tokens, device=device,
            autocast_dtype=torch.bfloat16 if t.bf16 else None, dist=dist,
        )
        return {"eval_loss": result["loss"], "eval_tokens": result["tokens"],
                **{f"eval_{k}": v for k, v in loss_metrics(result["loss"], corpus.unit,
                                                           bytes_per_token).items()}}

    runner = Runner(
        folder, Cadence(t.steps, t.log_every, t.eval_every, t.ckpt_every),
        tokens_per_step=t.batch_size * t.seq_len * t.grad_accum, save=save, evaluate=evaluate,
        metrics=None, what="training", progress=progress and dist.is_main,
        divergence_hint="Try a lower train.lr, train.grad_clip > 0, or train.warmup_steps.",
        graceful_stop=not dist.enabled,  # under torchrun, SIGTERM means a peer failed
    )
    if resume and latest_checkpoint(out_dir) is not None:
        ckpt = load_checkpoint(out_dir, model, map_location=device, optimizer=optimizer)
        torch.set_rng_state(ckpt.state["rng"])
        runner.restore(ckpt.step, ckpt.state)
        memory = ModelCache.from_state(map_tensors(dist.shard, ckpt.state["memory"]))
        logger.info("resumed from %s", ckpt.path)
        if (done := folder.finished_summary(runner.step, t.steps)) is not None:
            return dist.broadcast_object(done)
    folder.create()
    if not resume and dist.is_main:
        corpus.tokenizer.save(out_dir)
    folder.write_config(dump_yaml(cfg), runner.step)
    if dist.is_main:
        runner.metrics = MetricsLog(out_dir, runner.step if resume else None, t.tensorboard)

    sequential = None
    if cfg.sequential:
        sequential = SequentialBatches(corpus.train, t.batch_size, t.seq_len)

    def batch(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of global batch ``index``: int64 [batch_size / world_size, seq_len]."""
        if sequential is not None:
            x, y = sequential.get(index)
        else:
            x, y = random_batch(corpus.train, t.batch_size, t.seq_len, t.seed, index)
        return dist.shard(x).to(device), dist.shard(y).to(device)

    check_unused = model is not plain and not t.find_unused_parameters  # DDP wraps, FSDP not

    def train_step(step: int) -> StepResult:
        nonlocal memory, check_unused
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        step_loss = step_aux = 0.0
        for micro in range(t.grad_accum):
            x, y = batch(step * t.grad_accum + micro)
            with grad_sync(model, micro == t.grad_accum - 1):  # reduce on the last micro-step
                with autocast:
                    out = model(x, targets=y, cache=memory, use_cache=cfg.model.memory_len > 0)
                if cfg.model.memory_len:
                    memory = out.cache.trimmed(cfg.model.memory_len)
                loss = out.loss + out.aux_loss
                # one all-reduce: the job's LM and aux loss (NaN on any rank: NaN on every one)
                lm_loss, aux_loss = dist.all_reduce(
                    torch.stack([out.loss, out.aux_loss]).detach().float(), "mean"
                ).tolist()
                (loss / t.grad_accum).backward()
            step_loss += lm_loss / t.grad_accum
            step_aux += aux_loss / t.grad_accum
        if check_unused:  # once; DDP itself would fail a step later, naming no config key
            check_unused = False
            if unused := unused_parameters(model):
                raise ConfigError(
                    f"parameters {unused[:4]} got no gradient, which DDP cannot reduce: set "
                    "train.find_unused_parameters=true (e.g. Reformer's shared-QK core ignores "
                    "the key projection)"
                )
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        values = {"loss": step_loss}
        if out.aux:  # the model has auxiliary losses (e.g. MoE balancing)
            values["aux_loss"] = step_aux
        return StepResult(values, lr)

    model.train()
    if not runner.run(train_step, pause_at):
        if runner.metrics is not None:
            runner.metrics.close()
        return {"paused_at": runner.step}

    last_eval = evaluate(t.final_eval_tokens)
    if runner.metrics is None:  # not rank 0: rank 0 writes the summary, and every rank returns it
        return dist.broadcast_object(None)
    runner.metrics.write({"step": runner.step, **last_eval})
    runner.metrics.close()
    summary = {
        "params": n_params,
        "steps": runner.step,
        "tokens": runner.tokens,
        "unit": corpus.unit,
        "train_loss": last_train_loss(out_dir),
        **last_eval,
        "tokens_per_s": runner.tokens / max(runner.wall, 1e-9),
        "peak_rss_mb": peak_rss_mb(),
        "wall_s": runner.wall_s,
        "train_wall_s": runner.wall,
        "device": str(device),
        "torch": torch.__version__,
    }
    if changes := folder.config_changes():
        summary["config_changes"] = changes
    if dist.enabled:
        summary.update(processes=dist.world_size, distributed=t.distributed)
    atomic_write_json(out_dir / "summary.json", summary)
    return dist.broadcast_object(summary)


def last_train_loss(out_dir: Path) -> float | None:
    """The last logged training loss in ``metrics.jsonl``."""
    train_records = [r["loss"] for r in read_metrics(out_dir) if "loss" in r]
    return train_records[-1] if train_records else None
