"""Decoder-only language model over the composable attention layer."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers import MLPS, POSITIONS, Attention, LayerCache, LayerContext, MLPContext
from attnlab.layers.base import Aux, merge_aux
from attnlab.models.config import ModelConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ModelCache:
    """One :class:`LayerCache` per layer; also serves as Transformer-XL memory."""

    layers: list[LayerCache]

    @property
    def length(self) -> int:
        """Cached tokens per layer (fewer than seen when a ``window`` core dropped some)."""
        return self.layers[0].length if self.layers else 0

    @property
    def next_position(self) -> int:
        """Position of the next token: the tokens seen so far."""
        return self.layers[0].next_position if self.layers else 0

    def trimmed(self, max_len: int, detach: bool = True) -> ModelCache:
        return ModelCache([layer.trimmed(max_len, detach) for layer in self.layers])

    def to_state(self) -> list[dict[str, Any]]:
        """Plain tensors/dicts (loadable with ``torch.load(weights_only=True)``)."""
        return [dataclasses.asdict(layer) for layer in self.layers]

    @classmethod
    def from_state(cls, state: list[dict[str, Any]] | None) -> ModelCache | None:
        return None if state is None else cls([LayerCache(**layer) for layer in state])


@dataclasses.dataclass
class LMOutput:
    logits: Tensor  # [B, T, vocab]
    loss: Tensor | None  # mean next-token cross-entropy over targets != -100 (nats)
    aux_loss: Tensor  # weighted sum of auxiliary losses (0 when none); add it to ``loss``
    aux: Aux
    cache: ModelCache | None


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The normalisation of ``cfg.norm`` over ``d_model`` (``nn.LayerNorm`` or
    ``nn.RMSNorm``, with ``cfg.norm_eps``)."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        ctx = LayerContext(
            d_model=cfg.d_model, n_heads=cfg.attention.n_heads, d_head=cfg.d_head, causal=True,
            max_seq_len=cfg.max_seq_len, layer_idx=layer_idx, n_layers=cfg.n_layers,
            init_scale=cfg.resolved_init_scale,
        )
        self.ln_attn = make_norm(cfg)
        self.attn = Attention(ctx, cfg.attention)
        self.ln_mlp = make_norm(cfg)
        mlp_ctx = MLPContext(
            d_model=cfg.d_model, d_ff=cfg.d_ff, dropout=cfg.dropout, layer_idx=layer_idx,
            n_layers=cfg.n_layers, init_scale=cfg.resolved_init_scale,
        )
        self.mlp = MLPS.build(cfg.mlp, ctx=mlp_ctx)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None, cache: LayerCache | None, use_cache: bool
    ) -> tuple[Tensor, Aux, LayerCache | None]:
        attn = self.attn(
            self.ln_attn(x), key_padding_mask=key_padding_mask, cache=cache, use_cache=use_cache
        )
        x = x + self.dropout(attn.hidden)
        mlp_out, mlp_aux = self.mlp(self.ln_mlp(x))
        x = x + self.dropout(mlp_out)
        return x, merge_aux(attn.aux, mlp_aux), attn.cache


class DecoderLM(nn.Module):
    """Causal language model: ``forward(input_ids [B, T]) -> LMOutput``.

    Auxiliary losses of the layers (e.g. MoE balancing) are returned, summed over layers,
    in ``LMOutput.aux`` and, weighted, in ``LMOutput.aux_loss``; nothing is stashed.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("model.vocab_size is unset; take it from the tokenizer first")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.pos_embed = None
        if POSITIONS.trait(cfg.attention.positions.name, "input_embedding"):
            self.pos_embed = nn.Embedding(cfg.max_seq_len, cfg.d_model)
            nn.init.normal_(self.pos_embed.weight, std=0.02)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.ln_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        else:
            nn.init.normal_(self.lm_head.weight, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _check_ids(self, input_ids: Tensor, cache: ModelCache | None) -> None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got {tuple(input_ids.shape)}")
        if input_ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"input_ids must be int64 or int32 token ids, got {input_ids.dtype}")
        total = input_ids.shape[1] + (cache.next_position if cache is not None else 0)
        if total > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence of {total} positions (cache {total - input_ids.shape[1]} + "
                f"input {input_ids.shape[1]}) exceeds model.max_seq_len={self.cfg.max_seq_len}"
            )

    def forward(
        self,
        input_ids: Tensor,
        *,
        targets: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        cache: ModelCache | None = None,
        use_cache: bool = False,
    ) -> LMOutput:
        """Args:
        input_ids: ``[B, T]`` token ids, following the cached tokens if ``cache`` is given.
        targets: ``[B, T]`` next-token ids, ``-100`` = ignored.
        key_padding_mask: ``[B, T]`` (or ``[B, Tc + T]``) bool, True = real token.
        cache: past keys/values (KV cache or XL memory); returned updated if ``use_cache``.
        """
        self._check_ids(input_ids, cache)
        x = self.embed(input_ids)
        offset = cache.next_position if cache is not None else 0
        if self.pos_embed is not None:
            positions = torch.arange(offset, offset + input_ids.shape[1], device=input_ids.device)
            x = x + self.pos_embed(positions)
        x = self.dropout(x)
        aux: Aux = {}
        new_layers = []
        for i, block in enumerate(self.blocks):
            x, block_aux, layer_cache = block(
                x, key_padding_mask, cache.layers[i] if cache is not None else None, use_cache
            )
            aux = merge_aux(aux, block_aux)
            new_layers.append(layer_cache)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:  # in float32 under bf16 autocast, never narrower than the logits
            wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
            loss = F.cross_entropy(
                wide.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
            )
        aux_loss = sum(aux.values(), torch.zeros((), device=logits.device))
        return LMOutput(logits, loss, aux_loss, aux, ModelCache(new_layers) if use_cache else None)

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Sample ``max_new_tokens`` continuations of ``input_ids [B, T]`` with a KV cache.

        ``temperature`` 0 means greedy. When the context would exceed ``max_seq_len`` the
        cache is rebuilt from the last ``max_seq_len // 2`` tokens. Returns ``[B, T + new]``.
        """
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and not 1 <= top_k <= self.cfg.vocab_size:
            raise ValueError(f"top_k must be in [1, vocab_size={self.cfg.vocab_size}], got {top_k}")
        was_training = self.training
        self.eval()
        window = self.cfg.max_seq_len
        tokens = input_ids[:, -window:]
        out = self(tokens, use_cache=True)
        for _ in range(max_new_tokens):
            logits = out.logits[:, -1].float()
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            input_ids = torch.cat((input_ids, nxt), dim=1)
            if out.cache.next_position + 1 > window:
                out = self(input_ids[:, -(window // 2):], use_cache=True)
            else:
                out = self(nxt, cache=out.cache, use_cache=True)
        self.train(was_training)
        return input_ids
