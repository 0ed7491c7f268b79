"""The teacher / student pair of a Hugging Face teacher (needs the ``hf`` extra).

The teacher is a transformers model of a family :mod:`attnlab.hf` converts: a model folder,
a GGUF file in a folder (``distill.gguf_file``, dequantised to float32) or a model name found
in the local Hugging Face cache (nothing is downloaded). The student is
``attnlab.hf.convert(copy of the teacher, core, options)``; the teacher itself is converted
to the exact ``sdpa`` core (the same attention to float rounding) so that hooks on its cores
read each layer's q, k, context and attention probabilities the same way as the student's
(:class:`~attnlab.distill.record.LayerRecorder`); hidden states come from
``output_hidden_states``. The estimator parameters (the ``attnlab_core`` submodules) are the
new parameters.

Data: a built-in corpus (default ``wiki``) tokenised with the teacher's tokenizer, training
windows at random offsets, held-out evaluation on the valid split.

* Causal language models (Llama / SmolLM2, OPT, GPT-2): SEA's loss as for attnlab teachers;
  quality = perplexity of teacher and student on the same held-out tokens.
* Bidirectional encoders (BERT, all-MiniLM-L6-v2): every window is framed as
  ``[CLS] ... [SEP]``; there is no task, so ``ce_weight`` and ``logits_weight`` do nothing
  and the hidden-state, context and attention terms drive the student. Quality = the cosine
  similarity of the student's sentence embeddings (mean pooling over the real tokens, L2
  normalised) to the teacher's, per held-out window: mean and min.

The student is written as a Hugging Face folder ``OUT/student`` (``save_pretrained`` with
the tokenizer; ``attnlab.hf.load(OUT/student)`` restores it converted, trained cores
included) after every checkpoint and at the end, crash-safely (:func:`write_folder`).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
import torch
import torch.nn.functional as F
import transformers
from torch import Tensor, nn

import attnlab.hf
from attnlab.config import ConfigError
from attnlab.data import DataConfig, SequentialBatches, Tokenizer, load_corpus
from attnlab.data.sources import Chunk
from attnlab.distill.config import DistillRunConfig
from attnlab.distill.pair import CausalLMPair, DistillPair, Forward, perplexity
from attnlab.distill.record import LayerRecorder, attention_targets
from attnlab.hf.attention import CORE_ATTR
from attnlab.hf.convert import CONFIG_KEY
from attnlab.hf.positions import stretched
from attnlab.layers.base import merge_aux
from attnlab.utils.io import write_folder

logger = logging.getLogger(__name__)

DEFAULT_CORPUS = "wiki"
STUDENT_DIR = "student"


class HFTokenizer(Tokenizer):
    """A transformers (fast) tokenizer behind attnlab's :class:`~attnlab.data.Tokenizer`
    interface, so that :func:`~attnlab.data.load_corpus` tokenises and caches the built-in
    corpora with it. Texts are encoded whole: no special tokens, and without the padding or
    truncation a ``tokenizer.json`` may carry (all-MiniLM-L6-v2's pads and cuts at 128)."""

    unit = "ppl"

    def __init__(self, tokenizer: transformers.PreTrainedTokenizerBase) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ConfigError(f"the teacher's tokenizer ({type(tokenizer).__name__}) is not a "
                              "fast (tokenizers-backed) tokenizer")
        self.hf = tokenizer
        self._backend = tokenizers.Tokenizer.from_str(backend.to_str())
        self._backend.no_padding()
        self._backend.no_truncation()
        self._json = self._backend.to_str()
        self._identity = "hf-" + hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def identity(self) -> str:
        return self._identity

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, chunks: Sequence[Chunk]) -> np.ndarray:
        if any(isinstance(c, bytes) for c in chunks):
            raise TypeError("a Hugging Face tokenizer encodes text, not raw bytes")
        encodings = self._backend.encode_batch(list(chunks), add_special_tokens=False)
        return np.fromiter((i for enc in encodings for i in enc.ids), dtype=np.uint32)

    def decode(self, ids) -> str:
        return self.hf.decode(list(ids))

    def to_json(self) -> str:
        return self._json


def resolve_teacher(spec: str) -> Path:
    """The model folder of ``spec``: a folder (with ``config.json``, or ``gguf_file``), or a
    model name (``org/name``) already in the local Hugging Face cache. Raises
    ``ConfigError`` saying what was looked for."""
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return folder
    if folder.exists() or spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        raise ConfigError(
            f"teacher {spec!r}: not an attnlab run folder (no config.yaml) nor any folder; give "
            "an attnlab run folder, a Hugging Face model folder (config.json, or a GGUF file "
            "with distill.gguf_file) or a model name in the local Hugging Face cache"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec, local_files_only=True))
    except Exception as err:  # hub raises several types for a missing cache entry
        raise ConfigError(
            f"teacher {spec!r}: not a folder, and not in the local Hugging Face cache "
            f"({type(err).__name__}); nothing is downloaded: give the model's folder"
        ) from err


def sentence_embeddings(hidden: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean of ``hidden`` ``[B, T, d]`` over the real tokens (``mask`` ``[B, T]``, True =
    real; None = all), L2-normalised: ``[B, d]``."""
    if mask is None:
        pooled = hidden.mean(1)
    else:
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
    return F.normalize(pooled, dim=-1)


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block, then back to its mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class HFPair(DistillPair):
    """A Hugging Face teacher and its converted student (causal: :class:`HFCausalPair`;
    bidirectional: :class:`HFEncoderPair`; :func:`open_hf_pair` picks)."""

    def __init__(self, run_cfg: DistillRunConfig, device: torch.device,
                 teacher: transformers.PreTrainedModel, student: transformers.PreTrainedModel,
                 tokenizer: transformers.PreTrainedTokenizerBase) -> None:
        d = run_cfg.distill
        self.device, self.eval_batch_size = device, d.eval_batch_size
        self.max_positions = int(teacher.config.max_position_embeddings)
        self.seq_len = d.seq_len or min(self.max_positions, 1024)
        if self.seq_len > self.max_positions:
            raise ConfigError(f"distill.seq_len {self.seq_len} exceeds the teacher's "
                              f"max_position_embeddings {self.max_positions}")
        self.teacher = teacher.to(device).eval().requires_grad_(False)
        self.student = student.to(device)
        self.new_params = [n for n, _ in student.named_parameters() if f".{CORE_ATTR}." in n]
        self.tokenizer = HFTokenizer(tokenizer)
        self.corpus = load_corpus(run_cfg.data or DataConfig(corpus=DEFAULT_CORPUS),
                                  tokenizer=self.tokenizer)
        self._student_cores = attnlab.hf.cores(student)
        self._teacher_rec = LayerRecorder(attnlab.hf.cores(teacher), probs=True)
        self._student_rec = LayerRecorder(self._student_cores, probs=False)

    def write_setup(self, out_dir: Path) -> None:
        """Nothing more: the student folder (:meth:`export`) holds config and tokenizer."""

    def _forward(self, model: nn.Module, x: Tensor) -> Any:
        """``model``'s output with every hidden state (no KV cache)."""
        return model(input_ids=x, output_hidden_states=True, use_cache=False)

    def _logits(self, out: Any) -> Tensor | None:
        return getattr(out, "logits", None)

    def infer(self, model: nn.Module, x: Tensor) -> None:
        model(input_ids=x)

    def teacher_forward(self, x: Tensor) -> Forward:
        with self._teacher_rec.recording() as rec:
            out = self._forward(self.teacher, x)
        return Forward(self._logits(out), list(out.hidden_states[1:]), rec.context, rec.probs)

    def student_forward(self, x: Tensor, y: Tensor, teacher: Forward) -> Forward:
        with self._student_rec.recording() as rec, \
                attention_targets(self._student_cores, teacher.probs), \
                attnlab.hf.collect(self.student) as collected:
            out = self._forward(self.student, x)
        logits = self._logits(out)
        ce = None
        if logits is not None:
            ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        return Forward(logits, list(out.hidden_states[1:]), rec.context, ce=ce,
                       aux=merge_aux(*collected.aux.values()))

    def held_out(self, context: int, max_tokens: int | None) -> Iterator[tuple[Tensor, Tensor]]:
        """Inputs and targets ``[eval_batch_size, context]`` of the valid split: consecutive
        chunks of its lanes, at most ``max_tokens`` tokens (at least one chunk)."""
        batches = SequentialBatches(self.corpus.valid, self.eval_batch_size, context)
        n_chunks = len(batches)
        if max_tokens is not None:
            n_chunks = max(1, min(n_chunks, max_tokens // (self.eval_batch_size * context)))
        for i in range(n_chunks):
            x, y = batches.get(i)
            yield x.to(self.device), y.to(self.device)

    def check_context(self, factor: int) -> None:
        """Raise ``ConfigError`` unless the models read ``factor * seq_len`` positions (no
        interpolation: Hugging Face models are evaluated within their own positions)."""
        context = self.seq_len * factor
        if context > self.max_positions:
            raise ConfigError(f"{context} tokens exceed the model's max_position_embeddings "
                              f"{self.max_positions} (no position interpolation for Hugging "
                              "Face models)")

    def sea_cores(self) -> list[nn.Module]:
        return [c for c in self._student_cores if c.traits["tunable_inference"]]

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "model_type": self.teacher.config.model_type,
                "student_folder": STUDENT_DIR}

    def export(self, out_dir: Path) -> None:
        """``OUT/student``: the student and the tokenizer, saved crash-safely; its config
        records the distillation length (:func:`attnlab.hf.positions.trained_length`)."""

        getattr(self.student.config, CONFIG_KEY)["trained_seq_len"] = self.seq_len

        def write(folder: Path) -> None:
            self.student.save_pretrained(folder)
            self.tokenizer.hf.save_pretrained(folder)

        write_folder(out_dir / STUDENT_DIR, write)
        logger.info("saved the student to %s", out_dir / STUDENT_DIR)

    def close(self) -> None:
        self._teacher_rec.close()
        self._student_rec.close()


class HFCausalPair(HFPair, CausalLMPair):
    """A causal language model teacher: next-token loss, logit KL, perplexity."""

    def infer(self, model: nn.Module, x: Tensor) -> None:
        model(input_ids=x, use_cache=False)

    @torch.no_grad()
    def evaluate_model(self, model: nn.Module, context: int,
                       max_tokens: int | None) -> dict[str, float]:
        total, count = 0.0, 0
        with _eval_mode(model):
            for x, y in self.held_out(context, max_tokens):
                logits = model(input_ids=x, use_cache=False).logits
                total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                         reduction="sum").item()
                count += y.numel()
        return perplexity(total / count, self.corpus.unit, self.corpus.bytes_per_token("valid"))

    def extended(self, model: nn.Module, factor: int) -> nn.Module:
        """``model`` at ``factor`` times ``seq_len``: its own positions (no interpolation),
        SEA position tables stretched (:func:`attnlab.hf.positions.stretched`)."""
        self.check_context(factor)
        return stretched(model, factor)


class HFEncoderPair(HFPair):
    """A bidirectional encoder teacher (BERT, MiniLM): hidden / context / attention
    distillation, quality = cosine similarity of sentence embeddings to the teacher's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        hf = self.tokenizer.hf
        self.frame = (hf.cls_token_id, hf.sep_token_id)
        if None in self.frame:
            raise ConfigError("the encoder's tokenizer has no [CLS] / [SEP] tokens to frame "
                              "the windows with")
        self._teacher_embeddings: dict[tuple[int, int | None], Tensor] = {}

    def _framed(self, x: Tensor) -> Tensor:
        """``[CLS] x[:, :T-2] [SEP]``: windows of ``T`` tokens as the encoder reads texts."""
        b = x.shape[0]
        cls, sep = (torch.full((b, 1), i, dtype=x.dtype, device=x.device) for i in self.frame)
        return torch.cat([cls, x[:, :-2], sep], dim=1)

    def batch(self, batch_size: int, seed: int, step: int) -> tuple[Tensor, Tensor]:
        x, y = super().batch(batch_size, seed, step)
        return self._framed(x), y

    def _forward(self, model: nn.Module, x: Tensor) -> Any:
        return model(input_ids=x, output_hidden_states=True)

    def _logits(self, out: Any) -> Tensor | None:
        return None  # a masked-LM head (if any) is no task here

    @torch.no_grad()
    def _embeddings(self, model: nn.Module, context: int, max_tokens: int | None) -> Tensor:
        """Sentence embeddings ``[N, d]`` of the held-out windows of ``context`` tokens."""
        with _eval_mode(model):
            return torch.cat([
                sentence_embeddings(model(input_ids=self._framed(x), output_hidden_states=True)
                                    .hidden_states[-1].float())
                for x, _ in self.held_out(context, max_tokens)
            ])

    def _cosine(self, model: nn.Module, context: int, max_tokens: int | None) -> dict[str, float]:
        key = (context, max_tokens)
        if key not in self._teacher_embeddings:
            self._teacher_embeddings[key] = self._embeddings(self.teacher, context, max_tokens)
        cosine = (self._embeddings(model, context, max_tokens)
                  * self._teacher_embeddings[key]).sum(-1)
        return {"cosine_mean": cosine.mean().item(), "cosine_min": cosine.min().item(),
                "texts": float(cosine.numel())}

    def evaluate_student(self, context: int, max_tokens: int | None) -> dict[str, float]:
        return self._cosine(self.student, context, max_tokens)

    def compare(self, context: int,
                max_tokens: int | None) -> tuple[dict[str, Any], dict[str, float]]:
        result = self._cosine(self.student, context, max_tokens)
        return {"teacher_student_cosine": {"mean": result["cosine_mean"],
                                           "min": result["cosine_min"],
                                           "texts": int(result["texts"])}}, result

    def long_context(self, factor: int, max_tokens: int | None) -> dict[str, Any]:
        context = self.seq_len * factor
        entry: dict[str, Any] = {"seq_len": context, "factor": factor}
        try:
            self.check_context(factor)
        except ConfigError as err:
            return {**entry, "skipped": str(err)}
        return {**entry, **self._cosine(self.student, context, max_tokens)}


def open_hf_pair(run_cfg: DistillRunConfig, device: torch.device) -> HFPair:
    """Load the teacher of ``run_cfg`` and build its student (see the module docstring)."""
    d = run_cfg.distill
    folder = resolve_teacher(d.teacher)
    try:
        teacher = attnlab.hf.load(folder, gguf_file=d.gguf_file)
    except attnlab.hf.UnsupportedModelError as err:
        raise ConfigError(f"teacher {d.teacher!r}: {err}") from err
    if getattr(teacher.config, CONFIG_KEY, None):
        raise ConfigError(f"teacher {d.teacher!r} is already converted to attnlab "
                          f"{getattr(teacher.config, CONFIG_KEY)['core']} attention (a student "
                          "folder); give the original model as the teacher")
    tokenizer = attnlab.hf.load_tokenizer(folder, gguf_file=d.gguf_file)
    spec = d.student_attention
    student = attnlab.hf.convert(copy.deepcopy(teacher), spec.name, spec.options)
    teacher = attnlab.hf.convert(teacher, "sdpa")
    cls = HFCausalPair if attnlab.hf.cores(teacher)[0].causal else HFEncoderPair
    return cls(run_cfg, device, teacher, student, tokenizer)
