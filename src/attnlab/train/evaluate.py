"""Held-out evaluation of a language model over consecutive chunks of a token stream."""

from __future__ import annotations

import math

import numpy as np
import torch
from tqdm import tqdm

from attnlab.data import SequentialBatches
from attnlab.models import DecoderLM
from attnlab.train.distributed import Dist


@torch.no_grad()
def evaluate_lm(
    model: DecoderLM,
    tokens: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    max_tokens: int | None = None,
    device: torch.device | str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    dist: Dist | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Mean next-token loss (nats) over non-overlapping ``seq_len`` chunks of ``tokens``.

    The stream is cut into ``batch_size`` lanes read front to back; with Transformer-XL
    memory (``model.cfg.memory_len``) each chunk attends to the previous one, as in training.
    ``max_tokens`` caps the number of predicted tokens. Returns ``{"loss", "tokens"}``.
    With ``dist`` every rank of the job calls this, reads its own share of the lanes, and
    gets the whole evaluation's result (the one-process result up to float rounding).
    ``progress``: a progress bar over the chunks.
    """
    dist = dist or Dist()
    batches = SequentialBatches(tokens, batch_size, seq_len)
    n_chunks = len(batches)
    if max_tokens is not None:
        n_chunks = max(1, min(n_chunks, max_tokens // (batch_size * seq_len)))
    was_training = model.training
    model.eval()
    memory_len = model.cfg.memory_len
    memory = None
    total, count = 0.0, 0
    device_type = torch.device(device).type
    for i in tqdm(range(n_chunks), desc="eval", unit="chunk", disable=not progress,
                  dynamic_ncols=True):
        x, y = (dist.shard(t).to(device) for t in batches.get(i))
        with torch.autocast(device_type, dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            out = model(x, targets=y, cache=memory, use_cache=memory_len > 0)
        if memory_len:
            memory = out.cache.trimmed(memory_len)
        total += out.loss.item() * y.numel()
        count += y.numel()
    model.train(was_training)
    if dist.enabled:
        total, count = dist.all_reduce(torch.tensor([total, count], dtype=torch.float64,
                                                    device=device)).tolist()
    return {"loss": total / count, "tokens": float(count)}


def loss_metrics(loss: float, unit: str, bytes_per_token: float) -> dict[str, float]:
    """Bits per character (always) and perplexity (for sub-word tokenizers) from a loss."""
    metrics = {"bpc": loss / math.log(2) / bytes_per_token}
    if unit == "ppl":
        metrics["ppl"] = math.exp(min(loss, 50.0))
    return metrics
