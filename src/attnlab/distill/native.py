"""The teacher / student pair of an attnlab teacher (a run folder of ``attnlab train``).

The student is the teacher's :class:`~attnlab.models.DecoderLM` with another attention core
(:mod:`attnlab.distill.student`); the run folder it distils into is an ordinary attnlab run
(``config.yaml``, ``tokenizer.json``, checkpoints: ``attnlab eval`` / ``generate`` work on it).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.config import ConfigError, dump_yaml
from attnlab.data import load_corpus
from attnlab.distill.config import DistillRunConfig
from attnlab.distill.pair import CausalLMPair, Forward, perplexity
from attnlab.distill.record import LayerRecorder, attention_targets, model_cores
from attnlab.distill.student import extend_context, init_student, student_config
from attnlab.train.evaluate import evaluate_lm
from attnlab.train.run import load_run
from attnlab.utils.io import atomic_write_text


class AttnlabPair(CausalLMPair):
    """An attnlab teacher run and its student (same model, ``student_attention`` core)."""

    def __init__(self, run_cfg: DistillRunConfig, device: torch.device) -> None:
        d = run_cfg.distill
        run = load_run(Path(d.teacher), device=device)
        self.teacher, self.tokenizer, self.device = run.model, run.tokenizer, device
        self.eval_batch_size = d.eval_batch_size
        self.cfg = student_config(run.cfg, d.student_attention)
        if run_cfg.data is not None:
            self.cfg.data = run_cfg.data
        self.seq_len = d.seq_len or run.cfg.train.seq_len
        if self.seq_len > self.cfg.model.max_seq_len:
            raise ConfigError(f"distill.seq_len {self.seq_len} exceeds the teacher's "
                              f"max_seq_len {self.cfg.model.max_seq_len}")
        self.cfg.train.seq_len, self.cfg.train.steps = self.seq_len, d.steps
        self.corpus = load_corpus(self.cfg.data, tokenizer=run.tokenizer)
        self.student, self.new_params = init_student(self.teacher, self.cfg)
        self.student.to(device)
        self._teacher_rec = LayerRecorder.of_model(self.teacher, probs=True)
        self._student_rec = LayerRecorder.of_model(self.student, probs=False)

    def write_setup(self, out_dir: Path) -> None:
        atomic_write_text(out_dir / "config.yaml", dump_yaml(self.cfg))
        self.tokenizer.save(out_dir)

    def teacher_forward(self, x: Tensor) -> Forward:
        with self._teacher_rec.recording() as rec:
            logits = self.teacher(x).logits
        return Forward(logits, rec.hidden, rec.context, rec.probs)

    def student_forward(self, x: Tensor, y: Tensor, teacher: Forward) -> Forward:
        with self._student_rec.recording() as rec, \
                attention_targets(model_cores(self.student), teacher.probs):
            out = self.student(x, targets=y)
        return Forward(out.logits, rec.hidden, rec.context, ce=out.loss, aux=out.aux)

    def evaluate_model(self, model: nn.Module, context: int,
                       max_tokens: int | None) -> dict[str, float]:
        result = evaluate_lm(model, self.corpus.valid, batch_size=self.eval_batch_size,
                             seq_len=context, max_tokens=max_tokens, device=self.device)
        return perplexity(result["loss"], self.corpus.unit, self.corpus.bytes_per_token("valid"))

    def extended(self, model: nn.Module, factor: int) -> nn.Module:
        return extend_context(model, factor)

    def export(self, out_dir: Path) -> None:
        """Nothing more: the checkpoint is the student of an attnlab run folder."""

    def sea_cores(self) -> list[nn.Module]:
        return [c for c in model_cores(self.student) if c.traits["tunable_inference"]]

    def close(self) -> None:
        self._teacher_rec.close()
        self._student_rec.close()
