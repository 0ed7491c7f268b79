"""``attnlab distill`` for attnlab teachers: the distillation loop, in one readable file.

``distill(run_cfg, out_dir)`` loads the teacher run, builds the student (teacher weights, new
attention core), trains it with SEA's recipe (:mod:`attnlab.distill.config`) and evaluates
teacher and student on the same held-out tokens at the same context, then the student at
every dynamic-k / query-skip setting, then both at ``long_context`` times the context after
position interpolation. ``out_dir`` is an attnlab run folder of the student (``config.yaml``,
``tokenizer.json``, ``checkpoints/``, ``metrics.jsonl``: ``attnlab eval`` / ``generate``
work on it) plus ``distill.yaml`` and ``summary.json``.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnlab.config import ConfigError, dump_yaml
from attnlab.data import load_corpus, random_batch
from attnlab.distill.config import DistillConfig, DistillRunConfig
from attnlab.distill.record import LayerRecorder, attention_targets
from attnlab.distill.student import extend_context, init_student, param_groups, student_config
from attnlab.models import DecoderLM
from attnlab.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from attnlab.train.distributed import Dist, rank_device
from attnlab.train.evaluate import evaluate_lm, loss_metrics
from attnlab.train.loop import MetricsLog, TrainingDiverged, peak_rss_mb, prepare_run_dir
from attnlab.train.run import load_run
from attnlab.utils.io import atomic_write_json, atomic_write_text

logger = logging.getLogger(__name__)


def lr_at(step: int, d: DistillConfig) -> float:
    """Linear warm-up, then constant (SEA distils at a constant rate)."""
    return d.lr * min(1.0, (step + 1) / max(1, d.warmup_steps))


def distill_loss(d: DistillConfig, student_out, teacher_logits, s_rec: LayerRecorder,
                 t_rec: LayerRecorder) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted loss and its parts (floats) for one batch."""
    vocab = teacher_logits.shape[-1]
    kl = F.kl_div(F.log_softmax(student_out.logits.float().view(-1, vocab), -1),
                  F.log_softmax(teacher_logits.float().view(-1, vocab), -1),
                  log_target=True, reduction="batchmean")
    hidden = torch.stack([F.mse_loss(s, t) for s, t in zip(s_rec.hidden, t_rec.hidden,
                                                            strict=True)]).mean()
    context = torch.stack([F.mse_loss(s.float(), t.float()) for s, t in
                           zip(s_rec.context, t_rec.context, strict=True)]).mean()
    attention = student_out.aux_loss + context  # aux: SEA's per-layer terms, layer-averaged
    total = (d.ce_weight * student_out.loss + d.hidden_weight * hidden
             + d.logits_weight * kl + d.attention_weight * attention)
    parts = {"loss": total.item(), "ce": student_out.loss.item(), "kl": kl.item(),
             "hidden": hidden.item(), "context": context.item(),
             **{k: v.item() for k, v in student_out.aux.items()}}
    return total, parts


def _ppl(result: dict[str, float], unit: str, bytes_per_token: float) -> dict[str, float]:
    """Perplexity per token (and bpc) of an evaluation."""
    return {"loss": result["loss"], "ppl": math.exp(min(result["loss"], 50.0)),
            "bpc": loss_metrics(result["loss"], unit, bytes_per_token)["bpc"]}


def sea_cores(model: torch.nn.Module) -> list:
    """The attention cores of ``model`` that accept SEA's inference settings."""
    return [b.attn.core for b in model.blocks if hasattr(b.attn.core, "set_inference")]


def distill(run_cfg: DistillRunConfig, out_dir: str | Path, *, resume: bool = False,
            progress: bool = True) -> dict[str, Any]:
    """Distil (or resume) into ``out_dir``; returns the summary also written to JSON."""
    out_dir, d = Path(out_dir), run_cfg.distill
    dist = Dist()
    prepare_run_dir(out_dir, resume, dist)
    if not d.teacher:
        raise ConfigError("distill.teacher is empty: give an attnlab run folder or a Hugging "
                          "Face model (--teacher)")
    teacher_dir = Path(d.teacher)
    if not (teacher_dir / "config.yaml").is_file():
        raise ConfigError(f"teacher {d.teacher!r}: not an attnlab run folder (no config.yaml); "
                          "Hugging Face teachers go through attnlab.hf")
    torch.manual_seed(d.seed)
    device = rank_device(d.device, dist)
    teacher = load_run(teacher_dir, device=device)
    cfg = student_config(teacher.cfg, d.student_attention)
    if run_cfg.data is not None:
        cfg.data = run_cfg.data
    seq_len = d.seq_len or teacher.cfg.train.seq_len
    if seq_len > cfg.model.max_seq_len:
        raise ConfigError(f"distill.seq_len {seq_len} exceeds the teacher's max_seq_len "
                          f"{cfg.model.max_seq_len}")
    cfg.train.seq_len, cfg.train.steps = seq_len, d.steps
    corpus = load_corpus(cfg.data, tokenizer=teacher.tokenizer)
    student, new_params = init_student(teacher.model, cfg)
    student.to(device)
    if not resume:
        atomic_write_text(out_dir / "config.yaml", dump_yaml(cfg))
        atomic_write_text(out_dir / "distill.yaml", dump_yaml(run_cfg))
        teacher.tokenizer.save(out_dir)
    optimizer = torch.optim.AdamW(
        param_groups(student, new_params, d.weight_decay, d.new_lr_mult, d.pretrained_lr_mult),
        lr=d.lr,
    )
    step, wall = 0, 0.0
    if resume and latest_checkpoint(out_dir) is not None:
        ckpt = load_checkpoint(out_dir, student, map_location=device, optimizer=optimizer)
        torch.set_rng_state(ckpt.state["rng"])
        step, wall = ckpt.step, ckpt.state["wall_s"]
        logger.info("resumed from %s", ckpt.path)
    metrics = MetricsLog(out_dir, step if resume else None, tensorboard=False)
    bytes_per_token = corpus.bytes_per_token("valid")

    def evaluate(model: DecoderLM, context: int, max_tokens: int | None) -> dict[str, float]:
        result = evaluate_lm(model, corpus.valid, batch_size=d.eval_batch_size,
                             seq_len=context, max_tokens=max_tokens, device=device)
        return _ppl(result, corpus.unit, bytes_per_token)

    def checkpoint() -> None:
        save_checkpoint(out_dir, step, student, {"rng": torch.get_rng_state(), "wall_s": wall},
                        keep=d.keep_checkpoints, optimizer=optimizer)

    t_rec = LayerRecorder(teacher.model, probs=True)
    s_rec = LayerRecorder(student, probs=False)
    tokens_per_step = d.batch_size * seq_len
    bar = tqdm(total=d.steps, initial=step, disable=not progress, unit="step", dynamic_ncols=True)
    window: list[dict[str, float]] = []
    student.train()
    while step < d.steps:
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, d) * group["lr_mult"]
        x, y = (t.to(device) for t in random_batch(corpus.train, d.batch_size, seq_len, d.seed,
                                                   step))
        t_rec.clear()
        s_rec.clear()
        with torch.no_grad():
            teacher_logits = teacher.model(x).logits
        with attention_targets(student, t_rec.probs):
            out = student(x, targets=y)
        loss, parts = distill_loss(d, out, teacher_logits, s_rec, t_rec)
        if not math.isfinite(parts["loss"]):
            bar.close()
            raise TrainingDiverged(
                f"distillation loss became {parts['loss']} at step {step}; stopping. The last "
                f"good checkpoint is {latest_checkpoint(out_dir) or 'none (none written yet)'}."
                " Try a lower distill.lr or distill.new_lr_mult."
            )
        loss.backward()
        if d.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(student.parameters(), d.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        elapsed = time.perf_counter() - start
        wall += elapsed
        window.append({**parts, "time": elapsed})
        if step % d.log_every == 0 or step == d.steps:
            record = {k: sum(w[k] for w in window) / len(window) for k in window[0]
                      if k != "time"}
            record.update(step=step, lr=lr_at(step - 1, d), tokens=step * tokens_per_step,
                          tokens_per_s=len(window) * tokens_per_step / sum(w["time"]
                                                                           for w in window))
            metrics.write(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            window = []
        if d.eval_every and step % d.eval_every == 0 and step < d.steps:
            result = evaluate(student, seq_len, d.eval_tokens)
            metrics.write({"step": step, **{f"eval_{k}": v for k, v in result.items()}})
            student.train()
        if d.ckpt_every and step % d.ckpt_every == 0 and step < d.steps:
            checkpoint()
        bar.update(1)
    bar.close()
    t_rec.close()
    s_rec.close()
    checkpoint()

    student.eval()
    summary: dict[str, Any] = {"teacher": str(d.teacher), "student_attention":
                               d.student_attention.to_yaml(), "steps": step,
                               "tokens": step * tokens_per_step, "seq_len": seq_len,
                               "params": student.num_params(), "new_params": sum(
                                   p.numel() for n, p in student.named_parameters()
                                   if n in set(new_params))}
    teacher_eval = evaluate(teacher.model, seq_len, d.final_eval_tokens)
    student_eval = evaluate(student, seq_len, d.final_eval_tokens)
    metrics.write({"step": step, **{f"eval_{k}": v for k, v in student_eval.items()}})
    summary.update(teacher_ppl=teacher_eval["ppl"], student_ppl=student_eval["ppl"],
                   teacher_bpc=teacher_eval["bpc"], student_bpc=student_eval["bpc"],
                   ppl_ratio=student_eval["ppl"] / teacher_eval["ppl"],
                   inference=_inference_grid(student, d, evaluate, seq_len))
    if d.long_context > 1:
        context = seq_len * d.long_context
        summary["long_context"] = {
            "seq_len": context, "factor": d.long_context,
            "teacher_ppl": evaluate(extend_context(teacher.model, d.long_context), context,
                                    d.final_eval_tokens)["ppl"],
            "student_ppl": evaluate(extend_context(student, d.long_context), context,
                                    d.final_eval_tokens)["ppl"],
        }
    summary.update(wall_s=wall, peak_rss_mb=peak_rss_mb(), device=str(device),
                   torch=torch.__version__)
    metrics.close()
    atomic_write_json(out_dir / "summary.json", summary)
    return summary


def _inference_grid(student: DecoderLM, d: DistillConfig, evaluate, seq_len: int) -> list[dict]:
    """The student's perplexity at every dynamic-k x query-skip setting (SEA cores only), each
    on the same first ``eval_tokens`` held-out tokens (the grid compares within itself)."""
    cores = sea_cores(student)
    if not cores:
        return []
    trained_k, trained_skip = cores[0].k, cores[0].query_skip
    ks = d.dynamic_k or sorted({max(1, trained_k // 2), trained_k, 2 * trained_k})
    grid = []
    for k in ks:
        for skip in d.query_skip:
            for core in cores:
                core.set_inference(k=k, query_skip=skip)
            result = evaluate(student, seq_len, d.eval_tokens)
            grid.append({"k": k, "query_skip": skip, "ppl": result["ppl"], "bpc": result["bpc"]})
            logger.info("student k=%d query_skip=%d: ppl %.3f", k, skip, result["ppl"])
    for core in cores:
        core.set_inference(k=trained_k, query_skip=trained_skip)
    return grid
