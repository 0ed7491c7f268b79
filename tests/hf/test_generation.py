"""Cached decoding of converted causal models: equal to the full pass, padding, stale caches."""

from __future__ import annotations

import pytest
import torch

import attnlab.hf
from tests.hf.models import CAUSAL, SEA_SPARSE, converted, outputs, token_ids

CORES = {
    "sdpa": ("sdpa", None),
    "sea": ("sea", SEA_SPARSE),
    "sea-skip3": ("sea", {**SEA_SPARSE, "query_skip": 3}),
    "performer": ("performer", None),
    "reformer": ("reformer", None),
    "window": ("window", {"sinks": 2, "window": 5}),
    "oracle": ("oracle", {"k": 3}),
    "quest": ("quest", {"budget": 6, "page": 2}),
    "sea_pages": ("sea_pages", {"budget": 6, "page": 2}),
}


def decode(model, ids, bounds):
    """Logits of ``ids`` fed in the pieces ``[bounds[i], bounds[i+1])`` through the cache
    (the first call creates it)."""
    pieces, cache = [], None
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        out = model(input_ids=ids[:, start:stop], cache=cache, use_cache=True)
        pieces.append(out.logits)
        cache = out.cache
    return torch.cat(pieces, dim=1), cache


@pytest.mark.parametrize("core", list(CORES))
@pytest.mark.parametrize("family", CAUSAL)
def test_cached_decoding_equals_the_full_pass(family, core):
    model = converted(family, *CORES[core])
    ids = token_ids(length=20)
    steps, _ = decode(model, ids, [0, 9, 12, *range(13, 21)])  # prefix, 3 tokens, then 1 by 1
    torch.testing.assert_close(steps, outputs(model, ids), rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", CAUSAL)
def test_generate_with_the_cache_equals_generate_without(family):
    model = converted(family, "sea", SEA_SPARSE)
    ids = token_ids(length=10)
    runs = [model.generate(ids, max_new_tokens=8, do_sample=False, use_cache=use_cache,
                           output_logits=True, return_dict_in_generate=True)
            for use_cache in (True, False)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    torch.testing.assert_close(torch.stack(runs[0].logits), torch.stack(runs[1].logits))


@pytest.mark.parametrize(("family", "core"), [
    *((family, core) for family in CAUSAL
      for core in ("sdpa", "performer", "reformer", "sea", "window", "oracle", "quest",
                   "sea_pages")),
])
def test_left_padded_generation_equals_the_unpadded_prompt(family, core):
    model = converted(family, *CORES[core])
    ids = token_ids(length=12)
    prompt = ids[1:, :8]
    batch = torch.cat([ids[:1], torch.cat([torch.zeros(1, 4, dtype=torch.long), prompt], 1)])
    mask = torch.ones_like(batch)
    mask[1, :4] = 0

    def logits(inputs, attention_mask=None):
        out = model.generate(inputs, attention_mask=attention_mask, max_new_tokens=4,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
        return torch.stack(out.logits, 1)

    torch.testing.assert_close(logits(batch, mask)[1], logits(prompt)[0], rtol=0, atol=1e-6)


def test_a_reordered_cache_does_not_reuse_decoding_states():
    """Beam search reorders the cache's rows; states made for the old order are dropped (the
    Performer then recomputes its sums from the cached keys, the Reformer refuses)."""
    ids = token_ids(length=14)
    swapped = ids.flip(0)
    model = converted("llama", "performer")
    _, cache = decode(model, ids, [0, 10])
    cache.reorder_cache(torch.tensor([1, 0]))
    step = model(input_ids=swapped[:, 10:], cache=cache).logits
    torch.testing.assert_close(step, outputs(model, swapped)[:, 10:], rtol=0, atol=1e-10)

    model = converted("llama", "reformer")
    _, cache = decode(model, ids, [0, 10])
    cache.reorder_cache(torch.tensor([1, 0]))
    with pytest.raises(RuntimeError, match="need their queries"):
        model(input_ids=swapped[:, 10:], cache=cache)


@pytest.mark.parametrize("core", ["performer", "quest"])
def test_a_state_rebuilt_exactly_from_a_reordered_cache_is_not_warned_about(caplog, core):
    """Cores whose state is a function of the cached keys rebuild it exactly: the result
    equals the full pass and no "rebuilt what it could" warning is logged."""
    ids = token_ids(length=14)
    model = converted("llama", *CORES[core])
    _, cache = decode(model, ids, [0, 10])
    cache.reorder_cache(torch.tensor([1, 0]))
    with caplog.at_level("WARNING", logger="attnlab.hf.attention"):
        step = model(input_ids=ids.flip(0)[:, 10:], cache=cache).logits
    torch.testing.assert_close(step, outputs(model, ids.flip(0))[:, 10:], rtol=0, atol=1e-10)
    assert "rebuilt what it could" not in caplog.text


def test_the_decoding_states_bytes_are_counted():
    """What a page core keeps beside the KV cache (its pages' features) is memory the serving
    benchmark must count."""
    model = converted("llama", *CORES["quest"])
    _, cache = decode(model, token_ids(length=14), [0, 10, 11])
    states = [entry.state for entry in attnlab.hf.attention._STATES[cache].values()]
    assert len(states) == model.config.num_hidden_layers
    held = sum(s.pages.features.untyped_storage().nbytes() + s.n_real.untyped_storage().nbytes()
               for s in states)
    assert attnlab.hf.attention.decoding_state_bytes(cache) == held > 0


def test_static_caches_are_refused():
    model = converted("llama", "sea", SEA_SPARSE)
    with pytest.raises(ValueError, match="static"):
        model.generate(token_ids(length=6), max_new_tokens=2, cache_implementation="static")


def test_set_inference_changes_k_and_query_skip_on_every_layer():
    model = converted("llama", "sea", SEA_SPARSE)
    ids = token_ids(length=24)
    before = outputs(model, ids)
    attnlab.hf.set_inference(model, k=24, query_skip=2)
    assert all(c.k == 24 and c.query_skip == 2 for c in attnlab.hf.cores(model))
    assert model.config.attnlab["options"] == {**SEA_SPARSE, "k": 24, "query_skip": 2}
    assert (outputs(model, ids) - before).abs().max() > 1e-6
