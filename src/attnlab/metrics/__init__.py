"""Compute and memory accounting (MACs, activation floats, parameters) of attnlab models."""

from attnlab.metrics.macs import (
    CONVENTIONS,
    MOA_INFERRED,
    PAPER_KINDS,
    attention_cost,
    exact_attention_cost,
    paper_attention_cost,
)

__all__ = [
    "CONVENTIONS",
    "MOA_INFERRED",
    "PAPER_KINDS",
    "attention_cost",
    "exact_attention_cost",
    "paper_attention_cost",
]
