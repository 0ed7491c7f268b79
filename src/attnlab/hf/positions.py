"""Converted models at a longer context than their SEA cores were trained at."""

from __future__ import annotations

import copy

import torch
import transformers

from attnlab.hf.convert import CONFIG_KEY
from attnlab.layers.sea.estimator import stretched_rows

TABLE_SUFFIX = "position_table"


def trained_length(model: transformers.PreTrainedModel) -> int | None:
    """Tokens the model's SEA cores were distilled at (``attnlab distill`` records it in the
    student's config), or None when not recorded."""
    saved = getattr(model.config, CONFIG_KEY, None) or {}
    return saved.get("trained_seq_len")


def stretched(model: transformers.PreTrainedModel, factor: int) -> transformers.PreTrainedModel:
    """``model`` itself when ``factor == 1`` or it has no SEA position tables, else a copy in
    which each table (trained on the first ranks only) is stretched ``factor`` times by
    nearest neighbour (rank ``r`` reads row ``r // factor``), as SEA's long-context runs do.
    The model's own positions (e.g. RoPE) are untouched: it reads them as trained."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    tables = [name for name, _ in model.named_parameters() if name.endswith(TABLE_SUFFIX)]
    if factor == 1 or not tables:
        return model
    longer = copy.deepcopy(model)
    with torch.no_grad():
        for name in tables:
            table = longer.get_parameter(name)
            table.copy_(stretched_rows(table, factor, table.shape[0]))
    return longer
