"""InPlaceCache: the same results as DynamicCache, with keys written into reserved room."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from attnlab.hf.cache import InPlaceCache, InPlaceLayer
from tests.hf.models import CAUSAL, SEA_SPARSE, converted, token_ids

CORES = {"sdpa": ("sdpa", None), "sea": ("sea", SEA_SPARSE)}


def _left_padded(length: int = 14) -> tuple[torch.Tensor, torch.Tensor]:
    ids = token_ids(length=length)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("capacity", [0, 40])  # grows from nothing, or never
@pytest.mark.parametrize("core", list(CORES))
@pytest.mark.parametrize("family", CAUSAL)
def test_decoding_equals_the_dynamic_cache(family, core, capacity):
    model = converted(family, *CORES[core])
    ids, mask = _left_padded()
    logits = []
    for cache in (DynamicCache(), InPlaceCache(capacity)):
        pieces = []
        with torch.no_grad():
            for start, stop in ((0, 9), (9, 10), (10, 13), (13, 14)):
                out = model(input_ids=ids[:, start:stop], attention_mask=mask[:, :stop],
                            cache=cache, use_cache=True)
                pieces.append(out.logits)
        logits.append(torch.cat(pieces, 1))
        assert cache.get_seq_length() == 14
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("family", CAUSAL)
def test_generate_gives_the_same_tokens(family):
    model = converted(family, "sea", SEA_SPARSE)
    ids, mask = _left_padded(10)
    runs = [model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                           cache=cache) for cache in (DynamicCache(), InPlaceCache(12))]
    assert torch.equal(runs[0], runs[1])


def test_keys_are_views_of_one_buffer_that_grows_by_doubling():
    layer = InPlaceLayer(capacity=4)
    first = torch.randn(2, 3, 3, 5)
    keys, values = layer.update(first, first + 1)
    buffer = keys.data_ptr()
    keys, _ = layer.update(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5))
    assert keys.data_ptr() == buffer and keys.shape[-2] == 4  # written in place
    keys, values = layer.update(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 5))
    assert keys.shape[-2] == layer.get_seq_length() == 5
    assert layer._key_buffer.shape[-2] == 8  # doubled, the old keys copied once
    torch.testing.assert_close(keys[..., :3, :], first)
    torch.testing.assert_close(values[..., :3, :], first + 1)
    layer.crop(-2)
    assert layer.get_seq_length() == 3 and layer.update(first[..., :1, :], first[..., :1, :])[
        0].shape[-2] == 4


def test_bad_capacity_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        InPlaceCache(-1)
