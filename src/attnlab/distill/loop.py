"""``attnlab distill``: the distillation loop, one for every kind of teacher.

``distill(run_cfg, out_dir)`` opens the teacher and builds the student (a
:class:`~attnlab.distill.pair.DistillPair`: an attnlab run, :mod:`attnlab.distill.native`, or
a Hugging Face model, :mod:`attnlab.distill.hf`), trains the student with SEA's recipe
(:mod:`attnlab.distill.config`) and evaluates teacher and student on the same held-out tokens
at the same context, then the student at every dynamic-k / query-skip setting, then both at
``long_context`` times the context. ``out_dir`` holds ``distill.yaml``, ``checkpoints/``
(resumable), ``metrics.jsonl`` and ``summary.json``, plus the student in its own format: an
attnlab run folder around it (``config.yaml``, ``tokenizer.json``) for attnlab teachers, the
Hugging Face folder ``student/`` for Hugging Face teachers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.config import ConfigError, dump_yaml
from attnlab.distill.config import DistillConfig, DistillRunConfig
from attnlab.distill.grid import inference_grid
from attnlab.distill.pair import DistillPair, Forward
from attnlab.distill.student import param_groups
from attnlab.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from attnlab.train.distributed import Dist, rank_device
from attnlab.train.runner import MetricsLog, RunFolder, Runner, peak_rss_mb
from attnlab.train.schedules import warmup_constant
from attnlab.train.steps import Cadence, StepResult
from attnlab.utils.io import atomic_write_json

logger = logging.getLogger(__name__)


def _mean_mse(students: list, teachers: list) -> torch.Tensor:
    """Mean over layers of the elementwise MSE (0 when nothing was recorded)."""
    if not students:
        return torch.zeros(())
    return torch.stack([F.mse_loss(s.float(), t.float())
                        for s, t in zip(students, teachers, strict=True)]).mean()


def distill_loss(d: DistillConfig, student: Forward,
                 teacher: Forward) -> tuple[torch.Tensor, dict[str, float]]:
    """SEA's weighted loss and its parts (floats) for one batch: ``ce_weight * CE +
    hidden_weight * mean MSE(hidden) + logits_weight * KL(logits) + attention_weight *
    (the cores' terms + context_weight * mean MSE(context))``; CE and KL only where the models
    have logits."""
    hidden = _mean_mse(student.hidden, teacher.hidden)
    context = _mean_mse(student.context, teacher.context)
    attention = sum(student.aux.values(), torch.zeros(())) + d.context_weight * context
    total = d.hidden_weight * hidden + d.attention_weight * attention
    parts = {"hidden": hidden.item(), "context": context.item()}
    if student.ce is not None:
        total = total + d.ce_weight * student.ce
        parts["ce"] = student.ce.item()
    if student.logits is not None and teacher.logits is not None:
        vocab = teacher.logits.shape[-1]
        kl = F.kl_div(F.log_softmax(student.logits.float().view(-1, vocab), -1),
                      F.log_softmax(teacher.logits.float().view(-1, vocab), -1),
                      log_target=True, reduction="batchmean")
        total = total + d.logits_weight * kl
        parts["kl"] = kl.item()
    parts.update({k: v.item() for k, v in student.aux.items()})
    return total, {"loss": total.item(), **parts}


def open_pair(run_cfg: DistillRunConfig, device: torch.device) -> DistillPair:
    """The pair of ``distill.teacher``: an attnlab run folder (``config.yaml``) or a Hugging
    Face model (folder, GGUF file or cached name)."""
    d = run_cfg.distill
    if not d.teacher:
        raise ConfigError("distill.teacher is empty: give an attnlab run folder or a Hugging "
                          "Face model (--teacher)")
    if (Path(d.teacher) / "config.yaml").is_file():
        from attnlab.distill.native import AttnlabPair

        if d.gguf_file:
            raise ConfigError("distill.gguf_file applies to Hugging Face teachers; "
                              f"{d.teacher!r} is an attnlab run")
        return AttnlabPair(run_cfg, device)
    try:
        from attnlab.distill.hf import open_hf_pair
    except ImportError as err:
        raise ConfigError(f"teacher {d.teacher!r} is not an attnlab run folder (no "
                          f"config.yaml), and Hugging Face teachers need the hf extra: {err}"
                          ) from err
    return open_hf_pair(run_cfg, device)


def distill(run_cfg: DistillRunConfig, out_dir: str | Path, *, resume: bool = False,
            progress: bool = True, force: bool = False) -> dict[str, Any]:
    """Distil (or resume) into ``out_dir``; returns the summary also written to JSON.
    ``force``: start in a folder that holds other files (see :class:`RunFolder`)."""
    folder = RunFolder(out_dir, "distill.yaml", "distillation", resume=resume, force=force)
    folder.check()
    folder.check_kept(dump_yaml(run_cfg), {"distill.recipe": DistillConfig.recipe},
                      "a resumed distillation keeps its recipe, whose settings it recorded "
                      "when it started; start a new run (another --out) for another recipe, "
                      "or change single settings with --set (e.g. --set lr=1e-5)")
    with folder.lifetime():
        return _run(run_cfg, folder, progress)


def _run(run_cfg: DistillRunConfig, folder: RunFolder, progress: bool) -> dict[str, Any]:
    out_dir, d = folder.path, run_cfg.distill
    torch.manual_seed(d.seed)
    device = rank_device(d.device, Dist(), "distill.device")
    pair = open_pair(run_cfg, device)
    student, seq_len = pair.student, pair.seq_len
    optimizer = torch.optim.AdamW(
        param_groups(student, pair.new_params, d.weight_decay, d.new_lr_mult,
                     d.pretrained_lr_mult),
        lr=d.lr,
    )

    def save(step: int, state: dict[str, Any]) -> None:
        save_checkpoint(out_dir, step, student, {**state, "rng": torch.get_rng_state()},
                        keep=d.keep_checkpoints, optimizer=optimizer)
        pair.export(out_dir)

    def evaluate() -> dict[str, float]:
        return {f"eval_{k}": v for k, v in pair.evaluate_student(seq_len, d.eval_tokens).items()}

    runner = Runner(folder, Cadence(d.steps, d.log_every, d.eval_every, d.ckpt_every),
                    tokens_per_step=d.batch_size * seq_len, save=save, evaluate=evaluate,
                    metrics=None, what="distillation", progress=progress,
                    divergence_hint="Try a lower distill.lr or distill.new_lr_mult.")
    if folder.resume and latest_checkpoint(out_dir) is not None:
        ckpt = load_checkpoint(out_dir, student, map_location=device, optimizer=optimizer)
        torch.set_rng_state(ckpt.state["rng"])
        runner.restore(ckpt.step, ckpt.state)
        logger.info("resumed from %s", ckpt.path)
        if (done := folder.finished_summary(runner.step, d.steps)) is not None:
            pair.close()
            return done
    folder.create()
    pair.write_setup(out_dir)
    folder.write_config(dump_yaml(run_cfg), runner.step)
    runner.metrics = MetricsLog(out_dir, runner.step if folder.resume else None)

    def distill_step(step: int) -> StepResult:
        lr = warmup_constant(step, d.lr, d.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_mult"]
        x, y = (t.to(device) for t in pair.batch(d.batch_size, d.seed, step))
        with torch.no_grad():
            teacher = pair.teacher_forward(x)
        loss, parts = distill_loss(d, pair.student_forward(x, y, teacher), teacher)
        del teacher
        loss.backward()
        if d.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(student.parameters(), d.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return StepResult(parts, lr)

    student.train()
    runner.run(distill_step)
    pair.close()

    student.eval()
    summary: dict[str, Any] = {"teacher": str(d.teacher), "student_attention":
                               d.student_attention.to_yaml(), "steps": runner.step,
                               "tokens": runner.tokens, "seq_len": seq_len, **pair.summary()}
    entries, final = pair.compare(seq_len, d.final_eval_tokens)
    summary.update(entries)
    runner.metrics.write({"step": runner.step, **{f"eval_{k}": v for k, v in final.items()}})
    summary["inference"], inference_teacher = inference_grid(pair, d, device)
    if inference_teacher is not None:
        summary["inference_teacher"] = inference_teacher
    if d.long_context > 1:
        summary["long_context"] = pair.long_context(d.long_context, d.final_eval_tokens)
    summary.update(wall_s=runner.wall, peak_rss_mb=peak_rss_mb(), device=str(device),
                   torch=torch.__version__)
    if changes := folder.config_changes():
        summary["config_changes"] = changes
    runner.metrics.close()
    atomic_write_json(out_dir / "summary.json", summary)
    return summary
