"""The training loop, in one readable file (nanoGPT spirit).

``train(cfg, out_dir)`` trains a :class:`DecoderLM` and leaves in ``out_dir``:
``config.yaml`` (resolved), ``tokenizer.json``, ``metrics.jsonl``, ``checkpoints/`` and, when
it finishes, ``summary.json``. Batches are a pure function of (seed, step), and the
checkpoint carries model, optimizer, RNG and XL-memory state, so ``resume=True`` continues
exactly where the last checkpoint left off.

Under ``torchrun`` (``WORLD_SIZE`` > 1) each rank trains on its rows of the same global batch
(see :mod:`attnlab.train.distributed`), the model is wrapped in DDP or FSDP2
(``train.distributed``), and only rank 0 writes logs, metrics, checkpoints and the summary.
"""

from __future__ import annotations

import json
import logging
import math
import resource
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from attnlab.config import ConfigError, dump_yaml
from attnlab.data import (
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
from attnlab.utils.io import atomic_write_json, atomic_write_text

logger = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class RunDirError(RuntimeError):
    """The output folder already holds a run (or holds none to resume)."""


class RankFailure(RuntimeError):
    """A multi-process run stopped because one of its processes failed or was stopped."""


def lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warm-up, then cosine decay from ``lr`` to ``lr * min_lr_ratio``."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return t.lr * (t.min_lr_ratio + (1.0 - t.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors (norms, biases) do not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.train.lr, betas=(cfg.train.beta1, cfg.train.beta2))


def prepare_run_dir(out_dir: Path, resume: bool, dist: Dist) -> None:
    has_run = (out_dir / "config.yaml").exists() or (out_dir / "checkpoints").exists()
    if resume and not has_run:
        raise RunDirError(f"--resume: {out_dir} holds no run to resume (no config.yaml)")
    if not resume and has_run:
        raise RunDirError(
            f"{out_dir} already holds a run; pass --resume to continue it, or choose another --out"
        )
    dist.barrier()  # every rank has looked before rank 0 writes
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)


def load_data(cfg: RunConfig, out_dir: Path, resume: bool, dist: Dist) -> TokenizedCorpus:
    """The corpus; rank 0 builds caches (and a BPE tokenizer) first, the others reuse them."""
    with dist.main_first():
        tokenizer = load_tokenizer(out_dir) if resume else None
        corpus = load_corpus(cfg.data, tokenizer=tokenizer)
        if not resume and dist.is_main:
            corpus.tokenizer.save(out_dir)
    return corpus


class MetricsLog:
    """Append-only ``metrics.jsonl`` (plus optional TensorBoard), truncated on resume."""

    def __init__(self, out_dir: Path, resume_step: int | None, tensorboard: bool) -> None:
        self.path = out_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [
                line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= resume_step
            ]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ImportError(
                    "train.tensorboard needs: pip install 'attnlab[tensorboard]'"
                ) from err
            self.writer = SummaryWriter(str(out_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def train(
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True,
    pause_at: int | None = None,
) -> dict[str, Any]:
    """Train (or resume) a run in ``out_dir``; returns the summary also written to JSON.

    Under torchrun every rank calls this and gets the same summary. ``pause_at``: stop once
    this step is done, with a checkpoint there and no final evaluation or summary (returns
    ``{"paused_at": step}``); ``resume`` continues it, with the same or a changed
    ``train.steps`` (the learning rate stays continuous while the pause is in the warm-up).
    """
    out_dir = Path(out_dir)
    dist = Dist.from_env()
    device = rank_device(cfg.train.device, dist)
    with process_group(dist, device):
        try:
            return _train(cfg, out_dir, resume, progress, dist, device, pause_at)
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
    pause_at: int | None = None,
) -> dict[str, Any]:
    prepare_run_dir(out_dir, resume, dist)
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
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.bf16)

    corpus = load_data(cfg, out_dir, resume, dist)
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = corpus.tokenizer.vocab_size
    elif cfg.model.vocab_size < corpus.tokenizer.vocab_size:
        raise ValueError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
            f"{corpus.tokenizer.vocab_size}"
        )
    if not resume and dist.is_main:
        atomic_write_text(out_dir / "config.yaml", dump_yaml(cfg))

    plain = DecoderLM(cfg.model).to(device)  # same seed on every rank: the same model
    n_params = plain.num_params()
    model = wrap_model(plain, t.distributed, plain.blocks, t.find_unused_parameters)
    optimizer = make_optimizer(model, cfg)
    sharded = t.distributed == "fsdp"  # FSDP runs write sharded checkpoints, on any world size
    logger.info("model: %.2fM parameters on %s", n_params / 1e6, device)

    step, tokens_seen, train_wall = 0, 0, 0.0
    memory: ModelCache | None = None
    if resume and latest_checkpoint(out_dir) is not None:
        ckpt = load_checkpoint(out_dir, model, map_location=device, optimizer=optimizer)
        torch.set_rng_state(ckpt.state["rng"])
        step, tokens_seen = ckpt.step, ckpt.state["tokens"]
        train_wall = ckpt.state["train_wall_s"]
        memory = ModelCache.from_state(map_tensors(dist.shard, ckpt.state["memory"]))
        logger.info("resumed from %s", ckpt.path)
    metrics = MetricsLog(out_dir, step if resume else None, t.tensorboard) if dist.is_main else None

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

    def log(record: dict[str, Any]) -> None:
        if metrics is not None:
            metrics.write(record)

    bytes_per_token = corpus.bytes_per_token("valid")

    def run_eval(max_tokens: int | None) -> dict[str, float]:
        result = evaluate_lm(
            unwrap(model), corpus.valid, batch_size=t.eval_batch_size, seq_len=t.seq_len,
            max_tokens=max_tokens, device=device,
            autocast_dtype=torch.bfloat16 if t.bf16 else None, dist=dist,
        )
        return {"eval_loss": result["loss"], "eval_tokens": result["tokens"],
                **{f"eval_{k}": v for k, v in loss_metrics(result["loss"], corpus.unit,
                                                           bytes_per_token).items()}}

    def checkpoint() -> None:
        save_checkpoint(out_dir, step, model, {
            "rng": torch.get_rng_state(), "tokens": tokens_seen, "train_wall_s": train_wall,
            "memory": map_tensors(dist.all_gather_rows, memory.to_state())  # every rank's lanes
            if memory is not None else None,
        }, keep=t.keep_checkpoints, optimizer=optimizer, sharded=sharded, dist=dist)

    wall_start = time.perf_counter()
    tokens_per_step = t.batch_size * t.seq_len * t.grad_accum
    bar = tqdm(total=t.steps, initial=step, disable=not (progress and dist.is_main), unit="step",
               dynamic_ncols=True)
    loss_sum, aux_sum, loss_count, window_time, window_tokens = 0.0, 0.0, 0, 0.0, 0
    last_eval: dict[str, float] = {}
    check_unused = model is not plain and not t.find_unused_parameters  # DDP wraps, FSDP not
    model.train()
    while step < t.steps:
        step_start = time.perf_counter()
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
                # one all-reduce: the job's loss, LM loss and aux loss (NaN on any rank: NaN)
                total, lm_loss, aux_loss = dist.all_reduce(
                    torch.stack([loss, out.loss, out.aux_loss]).detach().float(), "mean"
                ).tolist()
                if not math.isfinite(total):  # every rank sees it and stops
                    bar.close()
                    last = latest_checkpoint(out_dir)
                    raise TrainingDiverged(
                        f"loss became {total} at step {step}; stopping. The last good "
                        f"checkpoint is {last or 'none (no checkpoint written yet)'}. Try a lower "
                        "train.lr, train.grad_clip > 0, or train.warmup_steps."
                    )
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
        step += 1
        tokens_seen += tokens_per_step
        step_time = time.perf_counter() - step_start
        train_wall += step_time
        loss_sum, aux_sum, loss_count = loss_sum + step_loss, aux_sum + step_aux, loss_count + 1
        window_time, window_tokens = window_time + step_time, window_tokens + tokens_per_step

        if step % t.log_every == 0 or step == t.steps:
            record = {"step": step, "loss": loss_sum / loss_count, "lr": lr, "tokens": tokens_seen,
                      "tokens_per_s": window_tokens / max(window_time, 1e-9),
                      "wall_s": time.perf_counter() - wall_start}
            if out.aux:  # the model has auxiliary losses (e.g. MoE balancing)
                record["aux_loss"] = aux_sum / loss_count
            log(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            loss_sum, aux_sum, loss_count, window_time, window_tokens = 0.0, 0.0, 0, 0.0, 0
        if t.eval_every and step % t.eval_every == 0 and step < t.steps:
            last_eval = run_eval(t.eval_tokens)
            log({"step": step, **last_eval})
            logger.info("step %d: eval loss %.4f", step, last_eval["eval_loss"])
        if t.ckpt_every and step % t.ckpt_every == 0 and step < t.steps:
            checkpoint()
        bar.update(1)
        if pause_at is not None and step >= pause_at and step < t.steps:
            bar.close()
            checkpoint()
            if metrics is not None:
                metrics.close()
            return {"paused_at": step}
    bar.close()

    checkpoint()
    last_eval = run_eval(t.final_eval_tokens)
    if metrics is None:  # not rank 0: rank 0 writes the summary, and every rank returns it
        return dist.broadcast_object(None)
    metrics.write({"step": step, **last_eval})
    metrics.close()
    summary = {
        "params": n_params,
        "steps": step,
        "tokens": tokens_seen,
        "unit": corpus.unit,
        "train_loss": last_train_loss(out_dir),
        **last_eval,
        "tokens_per_s": tokens_seen / max(train_wall, 1e-9),
        "peak_rss_mb": peak_rss_mb(),
        "wall_s": time.perf_counter() - wall_start,
        "train_wall_s": train_wall,
        "device": str(device),
        "torch": torch.__version__,
    }
    if dist.enabled:
        summary.update(processes=dist.world_size, distributed=t.distributed)
    atomic_write_json(out_dir / "summary.json", summary)
    return dist.broadcast_object(summary)


def last_train_loss(out_dir: Path) -> float | None:
    """The last logged training loss in ``metrics.jsonl``."""
    losses = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train_records = [r["loss"] for r in losses if "loss" in r]
    return train_records[-1] if train_records else None
