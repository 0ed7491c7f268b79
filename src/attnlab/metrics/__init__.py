"""Compute and memory accounting (MACs, activation floats, parameters) of attnlab models,
and parameter matching of SwitchHead / MoA configs to dense ones."""

from attnlab.metrics.macs import (
    CONVENTIONS,
    MOA_INFERRED,
    PAPER_KINDS,
    attention_cost,
    exact_attention_cost,
    paper_attention_cost,
)
from attnlab.metrics.match import MatchReport, format_match, match_header, match_params

__all__ = [
    "CONVENTIONS",
    "MOA_INFERRED",
    "PAPER_KINDS",
    "MatchReport",
    "attention_cost",
    "exact_attention_cost",
    "format_match",
    "match_header",
    "match_params",
    "paper_attention_cost",
]
