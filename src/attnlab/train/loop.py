"""The training loop, in one readable file (nanoGPT spirit).

``train(cfg, out_dir)`` trains a :class:`DecoderLM` and leaves in ``out_dir``:
``config.yaml`` (resolved), ``tokenizer.json``, ``metrics.jsonl``, ``checkpoints/`` and, when
it finishes, ``summary.json``. Batches are a pure function of (seed, step), and the
checkpoint carries model, optimizer, RNG and XL-memory state, so ``resume=True`` continues
exactly where the last checkpoint left off.
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

from attnlab.config import dump_yaml
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
from attnlab.train.evaluate import evaluate_lm, loss_metrics
from attnlab.utils.io import atomic_write_json, atomic_write_text

logger = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class RunDirError(RuntimeError):
    """The output folder already holds a run (or holds none to resume)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name!r} but CUDA is not available; use cpu or auto")
    return device


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


def prepare_run_dir(out_dir: Path, resume: bool) -> None:
    has_run = (out_dir / "config.yaml").exists() or (out_dir / "checkpoints").exists()
    if resume and not has_run:
        raise RunDirError(f"--resume: {out_dir} holds no run to resume (no config.yaml)")
    if not resume and has_run:
        raise RunDirError(
            f"{out_dir} already holds a run; pass --resume to continue it, or choose another --out"
        )
    out_dir.mkdir(parents=True, exist_ok=True)


def load_data(cfg: RunConfig, out_dir: Path, resume: bool) -> TokenizedCorpus:
    tokenizer = load_tokenizer(out_dir) if resume else None
    corpus = load_corpus(cfg.data, tokenizer=tokenizer)
    if not resume:
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
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Train (or resume) a run in ``out_dir``; returns the summary also written to JSON."""
    out_dir = Path(out_dir)
    prepare_run_dir(out_dir, resume)
    t = cfg.train
    torch.manual_seed(t.seed)
    if t.threads:
        torch.set_num_threads(t.threads)
    device = resolve_device(t.device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.bf16)

    corpus = load_data(cfg, out_dir, resume)
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = corpus.tokenizer.vocab_size
    elif cfg.model.vocab_size < corpus.tokenizer.vocab_size:
        raise ValueError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
            f"{corpus.tokenizer.vocab_size}"
        )
    if not resume:
        atomic_write_text(out_dir / "config.yaml", dump_yaml(cfg))

    model = DecoderLM(cfg.model).to(device)
    optimizer = make_optimizer(model, cfg)
    n_params = model.num_params()
    logger.info("model: %.2fM parameters on %s", n_params / 1e6, device)

    step, tokens_seen, train_wall = 0, 0, 0.0
    memory: ModelCache | None = None
    if resume and latest_checkpoint(out_dir) is not None:
        ckpt = load_checkpoint(out_dir, model, map_location=device)
        optimizer.load_state_dict(ckpt.state["optimizer"])
        torch.set_rng_state(ckpt.state["rng"])
        step, tokens_seen = ckpt.step, ckpt.state["tokens"]
        train_wall = ckpt.state["train_wall_s"]
        memory = ModelCache.from_state(ckpt.state["memory"])
        logger.info("resumed from %s", ckpt.path)
    metrics = MetricsLog(out_dir, step if resume else None, t.tensorboard)

    sequential = None
    if cfg.sequential:
        sequential = SequentialBatches(corpus.train, t.batch_size, t.seq_len)

    def batch(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if sequential is not None:
            x, y = sequential.get(index)
        else:
            x, y = random_batch(corpus.train, t.batch_size, t.seq_len, t.seed, index)
        return x.to(device), y.to(device)

    bytes_per_token = corpus.bytes_per_token("valid")

    def run_eval(max_tokens: int | None) -> dict[str, float]:
        result = evaluate_lm(
            model, corpus.valid, batch_size=t.eval_batch_size, seq_len=t.seq_len,
            max_tokens=max_tokens, device=device,
            autocast_dtype=torch.bfloat16 if t.bf16 else None,
        )
        return {"eval_loss": result["loss"], "eval_tokens": result["tokens"],
                **{f"eval_{k}": v for k, v in loss_metrics(result["loss"], corpus.unit,
                                                           bytes_per_token).items()}}

    def checkpoint() -> None:
        save_checkpoint(out_dir, step, model, {
            "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
            "tokens": tokens_seen, "train_wall_s": train_wall,
            "memory": memory.to_state() if memory is not None else None,
        }, keep=t.keep_checkpoints)

    wall_start = time.perf_counter()
    tokens_per_step = t.batch_size * t.seq_len * t.grad_accum
    bar = tqdm(total=t.steps, initial=step, disable=not progress, unit="step", dynamic_ncols=True)
    loss_sum, loss_count, window_time, window_tokens = 0.0, 0, 0.0, 0
    last_eval: dict[str, float] = {}
    model.train()
    while step < t.steps:
        step_start = time.perf_counter()
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        step_loss = 0.0
        for micro in range(t.grad_accum):
            x, y = batch(step * t.grad_accum + micro)
            with autocast:
                out = model(x, targets=y, cache=memory, use_cache=cfg.model.memory_len > 0)
            if cfg.model.memory_len:
                memory = out.cache.trimmed(cfg.model.memory_len)
            loss = out.loss + out.aux_loss
            if not torch.isfinite(loss):
                bar.close()
                last = latest_checkpoint(out_dir)
                raise TrainingDiverged(
                    f"loss became {loss.item()} at step {step}; stopping. The last good "
                    f"checkpoint is {last or 'none (no checkpoint written yet)'}. Try a lower "
                    "train.lr, train.grad_clip > 0, or train.warmup_steps."
                )
            (loss / t.grad_accum).backward()
            step_loss += out.loss.item() / t.grad_accum
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += tokens_per_step
        step_time = time.perf_counter() - step_start
        train_wall += step_time
        loss_sum, loss_count = loss_sum + step_loss, loss_count + 1
        window_time, window_tokens = window_time + step_time, window_tokens + tokens_per_step

        if step % t.log_every == 0 or step == t.steps:
            record = {"step": step, "loss": loss_sum / loss_count, "lr": lr, "tokens": tokens_seen,
                      "tokens_per_s": window_tokens / max(window_time, 1e-9),
                      "wall_s": time.perf_counter() - wall_start}
            metrics.write(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            loss_sum, loss_count, window_time, window_tokens = 0.0, 0, 0.0, 0
        if t.eval_every and step % t.eval_every == 0 and step < t.steps:
            last_eval = run_eval(t.eval_tokens)
            metrics.write({"step": step, **last_eval})
            logger.info("step %d: eval loss %.4f", step, last_eval["eval_loss"])
        if t.ckpt_every and step % t.ckpt_every == 0 and step < t.steps:
            checkpoint()
        bar.update(1)
    bar.close()

    checkpoint()
    last_eval = run_eval(t.final_eval_tokens)
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
    atomic_write_json(out_dir / "summary.json", summary)
    return summary


def last_train_loss(out_dir: Path) -> float | None:
    """The last logged training loss in ``metrics.jsonl``."""
    losses = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train_records = [r["loss"] for r in losses if "loss" in r]
    return train_records[-1] if train_records else None
