"""Converted tiny models of every family: parity when every key is attended, and padding."""

from __future__ import annotations

import pytest
import torch

from tests.hf.models import (
    FAMILIES,
    SEA_ALL_KEYS,
    SEA_SPARSE,
    converted,
    make_model,
    open_gates,
    outputs,
    token_ids,
)


def right_padded(length: int = 24, real: int = 17):
    """Two rows; the second has ``real`` tokens then padding (True = real token)."""
    ids = token_ids(length=length)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, real:] = False
    return ids, mask


@pytest.mark.parametrize("core", ["sdpa", "eager", "sea"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_key_attended_equals_the_original_model(family, core):
    """sdpa / eager cores, and SEA with k >= T (every key of every row) and its gates open,
    reproduce the original model on the real tokens of a padded batch."""
    ids, mask = right_padded()
    want = outputs(make_model(family), ids, mask)
    model = converted(family, core, SEA_ALL_KEYS if core == "sea" else None)
    if core == "sea":
        open_gates(model)
    got = outputs(model, ids, mask)
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-10)


@pytest.mark.parametrize(("core", "options"), [("sea", SEA_SPARSE), ("performer", None),
                                               ("reformer", None)], ids=["sea", "performer",
                                                                         "reformer"])
@pytest.mark.parametrize("family", FAMILIES)
def test_right_padded_batch_equals_the_unpadded_rows(family, core, options):
    ids, mask = right_padded()
    model = converted(family, core, options)
    batch = outputs(model, ids, mask)
    alone = outputs(model, ids[1:, :17])
    torch.testing.assert_close(batch[1:, :17], alone, rtol=0, atol=1e-10)
    dense = outputs(make_model(family), ids, mask)
    assert (batch - dense)[mask].abs().max() > 1e-6  # the approximation is really in use


def test_bidirectional_padding_is_not_dropped():
    """Without the registered mask function BERT's padded keys would be attended."""
    ids, mask = right_padded()
    model = converted("bert", "sea", SEA_SPARSE)
    padded = outputs(model, ids, mask)[1, :17]
    unmasked = outputs(model, ids)[1, :17]
    assert (padded - unmasked).abs().max() > 1e-3
