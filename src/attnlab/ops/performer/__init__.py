"""Performer / FAVOR+ linear attention: random feature maps, the fast path and its reference."""

from attnlab.ops.performer.features import (
    orthogonal_gaussian,
    relu_features,
    softmax_feature_logits,
    softmax_features,
)
from attnlab.ops.performer.linear import PerformerState, performer_attention
from attnlab.ops.performer.naive import performer_attention_naive, performer_attention_weights

__all__ = [
    "PerformerState",
    "orthogonal_gaussian",
    "performer_attention",
    "performer_attention_naive",
    "performer_attention_weights",
    "relu_features",
    "softmax_feature_logits",
    "softmax_features",
]
