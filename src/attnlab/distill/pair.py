"""The teacher / student interface of the distillation loop, one implementation per teacher
kind: attnlab runs (:mod:`attnlab.distill.native`) and Hugging Face models
(:mod:`attnlab.distill.hf`).

The loop (:func:`attnlab.distill.distill`) only draws batches, runs the two forwards, applies
SEA's loss to what they return (:class:`Forward`), steps the optimizer over
``pair.student`` and asks the pair for evaluations; everything model-specific lives here.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from attnlab.config import ConfigError
from attnlab.data import TokenizedCorpus, random_batch
from attnlab.train.evaluate import loss_metrics


@dataclasses.dataclass
class Forward:
    """What one forward of the teacher or the student gives the loss.

    Attributes:
        logits: ``[B, T, V]``; None for encoders without a language-model head.
        hidden: each layer's output hidden state ``[B, T, d]``.
        context: each layer's attention output before the output projection ``[B, H, T, D]``.
        probs: teacher only: each layer's attention probabilities ``[B, H, T, T]``.
        ce: student only: next-token cross-entropy (None for encoders).
        aux: student only: the cores' auxiliary losses summed over layers (SEA's
            ``sea_estimate`` / ``sea_attention``, each already divided by the layer count).
    """

    logits: Tensor | None
    hidden: list[Tensor]
    context: list[Tensor]
    probs: list[Tensor] = dataclasses.field(default_factory=list)
    ce: Tensor | None = None
    aux: dict[str, Tensor] = dataclasses.field(default_factory=dict)


class DistillPair(ABC):
    """A frozen teacher and the student built from it.

    Attributes:
        teacher: the frozen model.
        student: the trained model (its parameters go to the optimizer).
        new_params: names of the student's freshly initialised parameters (the new
            attention modules: they learn at ``lr * new_lr_mult``).
        seq_len: the training and evaluation context.
        corpus: the tokenised training / held-out text.
    """

    teacher: nn.Module
    student: nn.Module
    new_params: list[str]
    seq_len: int
    corpus: TokenizedCorpus

    @abstractmethod
    def write_setup(self, out_dir: Path) -> None:
        """Write the student's own record next to ``distill.yaml``, at every start (so that
        a resumed run's changes, e.g. of ``data``, reach it as they reach ``distill.yaml``)."""

    def batch(self, batch_size: int, seed: int, step: int) -> tuple[Tensor, Tensor]:
        """Step ``step``'s inputs and next-token targets ``[B, T]`` (random training windows,
        the same whenever the step is drawn)."""
        return random_batch(self.corpus.train, batch_size, self.seq_len, seed, step)

    def infer(self, model: nn.Module, x: Tensor) -> None:
        """One plain inference forward of ``model`` (teacher or student) on ``x [B, T]``:
        what the inference grid's latency and memory measure."""
        model(x)

    @abstractmethod
    def teacher_forward(self, x: Tensor) -> Forward:
        """The teacher on ``x`` (called under ``torch.no_grad``), with its attention."""

    @abstractmethod
    def student_forward(self, x: Tensor, y: Tensor, teacher: Forward) -> Forward:
        """The student on ``x`` (train mode), its SEA cores given ``teacher.probs``."""

    @abstractmethod
    def evaluate_student(self, context: int, max_tokens: int | None) -> dict[str, float]:
        """The student's held-out quality at ``context`` (perplexity, or similarity to the
        teacher for encoders); logged as ``eval_*`` and listed in the inference grid."""

    @abstractmethod
    def compare(self, context: int,
                max_tokens: int | None) -> tuple[dict[str, Any], dict[str, float]]:
        """The summary's teacher-vs-student entries on the same held-out tokens, and the
        student's :meth:`evaluate_student` metrics from that evaluation."""

    @abstractmethod
    def long_context(self, factor: int, max_tokens: int | None) -> dict[str, Any]:
        """The summary's ``long_context`` entry: both models at ``factor * seq_len``
        (``{"seq_len", "factor", "skipped": reason}`` when they cannot read that far)."""

    @abstractmethod
    def sea_cores(self) -> list[nn.Module]:
        """The student's cores that take SEA's inference settings (``set_inference``)."""

    def summary(self) -> dict[str, Any]:
        """Entries of the summary that describe the pair (default: parameter counts)."""
        fresh = set(self.new_params)
        params = dict(self.student.named_parameters())
        return {"params": sum(p.numel() for p in params.values()),
                "new_params": sum(p.numel() for n, p in params.items() if n in fresh)}

    @abstractmethod
    def export(self, out_dir: Path) -> None:
        """Write the student in its own format after each checkpoint."""

    @abstractmethod
    def close(self) -> None:
        """Remove the recording hooks (the models stay usable)."""


def perplexity(loss: float, unit: str, bytes_per_token: float) -> dict[str, float]:
    """``{"loss", "ppl", "bpc"}`` of a mean next-token loss (nats)."""
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)),
            "bpc": loss_metrics(loss, unit, bytes_per_token)["bpc"]}


class CausalLMPair(DistillPair):
    """A pair of language models: quality is perplexity on the held-out split."""

    @abstractmethod
    def evaluate_model(self, model: nn.Module, context: int,
                       max_tokens: int | None) -> dict[str, float]:
        """``perplexity(...)`` of ``model`` on the valid split in ``context``-token chunks."""

    @abstractmethod
    def extended(self, model: nn.Module, factor: int) -> nn.Module:
        """``model`` reading ``factor`` times the context; raises ``ConfigError`` if it
        cannot."""

    def evaluate_student(self, context: int, max_tokens: int | None) -> dict[str, float]:
        return self.evaluate_model(self.student, context, max_tokens)

    def compare(self, context: int,
                max_tokens: int | None) -> tuple[dict[str, Any], dict[str, float]]:
        teacher = self.evaluate_model(self.teacher, context, max_tokens)
        student = self.evaluate_model(self.student, context, max_tokens)
        return {"teacher_ppl": teacher["ppl"], "student_ppl": student["ppl"],
                "teacher_bpc": teacher["bpc"], "student_bpc": student["bpc"],
                "ppl_ratio": student["ppl"] / teacher["ppl"]}, student

    def long_context(self, factor: int, max_tokens: int | None) -> dict[str, Any]:
        context = self.seq_len * factor
        entry: dict[str, Any] = {"seq_len": context, "factor": factor}
        try:
            models = {name: self.extended(model, factor)
                      for name, model in (("teacher", self.teacher), ("student", self.student))}
        except ConfigError as err:
            return {**entry, "skipped": str(err)}
        for name, model in models.items():
            entry[f"{name}_ppl"] = self.evaluate_model(model, context, max_tokens)["ppl"]
        return entry
