import math

import pytest
import torch

from attnlab.models import DecoderLM, ModelConfig

POSITIONS = ["none", "learned", "rope", "xl"]


def make_model(positions="rope", core="sdpa", **kw):
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=2, d_ff=64, max_seq_len=32,
                      attention={"n_heads": 4, "positions": positions, "core": core}, **kw)
    return DecoderLM(cfg).double().eval()


def decode_token_by_token(model, ids, prefix):
    """Logits of ``ids`` from a pass over ``ids[:, :prefix]``, then one token at a time
    through the cache; and the last cache."""
    out = model(ids[:, :prefix], use_cache=True)
    pieces, cache = [out.logits], out.cache
    for t in range(prefix, ids.shape[1]):
        out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
        pieces.append(out.logits)
        cache = out.cache
    return torch.cat(pieces, 1), cache


def test_initial_loss_is_near_uniform():
    model = make_model()
    ids = torch.randint(0, 40, (4, 16))
    out = model(ids, targets=ids)
    assert out.logits.shape == (4, 16, 40)
    assert abs(out.loss.item() - math.log(40)) < 0.5
    assert out.aux_loss.item() == 0.0


@pytest.mark.parametrize("positions", POSITIONS)
def test_cached_decoding_equals_full_forward(positions):
    model = make_model(positions)
    ids = torch.randint(0, 40, (2, 14))
    steps, _ = decode_token_by_token(model, ids, 5)
    assert (steps - model(ids).logits).abs().max() < 1e-5


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_a_window_model_decodes_from_a_bounded_cache(positions):
    """With the ``window`` core the cache stops growing at sinks + window - 1 keys, the
    positions keep counting, and cached decoding equals the full pass."""
    model = make_model(positions, core={"name": "window", "sinks": 2, "window": 6})
    ids = torch.randint(0, 40, (2, 24))
    steps, cache = decode_token_by_token(model, ids, 9)
    assert (steps - model(ids).logits).abs().max() < 1e-10
    assert cache.length == 2 + 5 and cache.next_position == 24


@pytest.mark.parametrize("positions", ["xl", "rope"])
def test_xl_memory_chunk_equals_one_causal_pass(positions):
    """Chunk 2 attending to chunk 1 as memory gives one causal pass's outputs for chunk 2."""
    model = make_model(positions, memory_len=8)
    ids = torch.randint(0, 40, (2, 16))
    full = model(ids).logits
    first = model(ids[:, :8], use_cache=True)
    memory = first.cache.trimmed(model.cfg.memory_len)
    second = model(ids[:, 8:], cache=memory, use_cache=True)
    assert (second.logits - full[:, 8:]).abs().max() < 1e-5
    # and the memory is detached and bounded
    nxt = second.cache.trimmed(model.cfg.memory_len)
    assert nxt.length == 8 and not nxt.layers[0].k.requires_grad


@pytest.mark.parametrize("positions", POSITIONS)
def test_model_is_causal(positions):
    model = make_model(positions)
    ids = torch.randint(0, 40, (1, 12))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 40
    a, b = model(ids).logits, model(changed).logits
    assert (a[:, :7] - b[:, :7]).abs().max() < 1e-12
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-6


def test_padding_mask_hides_padded_tokens():
    model = make_model("rope")
    ids = torch.randint(0, 40, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[:, :3] = False  # left padding
    other = ids.clone()
    other[:, :3] = (other[:, :3] + 7) % 40
    a = model(ids, key_padding_mask=mask).logits
    b = model(other, key_padding_mask=mask).logits
    assert (a[:, 3:] - b[:, 3:]).abs().max() < 1e-12


def test_too_long_sequence_is_rejected():
    model = make_model()
    with pytest.raises(ValueError, match=r"exceeds model.max_seq_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    out = model(torch.zeros(1, 30, dtype=torch.long), use_cache=True)
    with pytest.raises(ValueError, match=r"cache 30 \+ input 3"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=out.cache)


def test_bad_token_ids_are_rejected():
    model = make_model()
    with pytest.raises(TypeError, match="token ids"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        model(torch.zeros(4, dtype=torch.long))


def test_tied_and_untied_embeddings():
    tied, untied = make_model(), make_model(tie_embeddings=False)
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.lm_head.weight is not untied.embed.weight
    assert untied.num_params() == tied.num_params() + 40 * 32


def test_generate_greedy_matches_argmax_of_full_pass_and_crops_context():
    model = make_model("rope")
    prompt = torch.randint(0, 40, (2, 4))
    out = model.generate(prompt, 40, temperature=0)  # runs past max_seq_len=32
    assert out.shape == (2, 44)
    assert torch.equal(out[:, :4], prompt)
    # the first generated tokens are the greedy choices of an uncached forward
    seq = out[:, :20]
    logits = model(seq[:, :-1]).logits
    assert torch.equal(logits[:, 3:].argmax(-1), seq[:, 4:])


def test_generate_sampling_respects_top_k_and_seed():
    model = make_model()
    prompt = torch.randint(0, 40, (1, 3))
    a = model.generate(prompt, 10, top_k=1, generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, 10, temperature=0)
    assert torch.equal(a, b)  # top_k=1 sampling is greedy
    c = model.generate(prompt, 10, generator=torch.Generator().manual_seed(3))
    d = model.generate(prompt, 10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(c, d)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(prompt, 2, top_k=0)


def test_bad_model_configs():
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        ModelConfig(d_model=30, attention={"n_heads": 4}).validate()
    with pytest.raises(ValueError, match="memory_len"):
        ModelConfig(max_seq_len=16, memory_len=16).validate()
    with pytest.raises(ValueError, match="core 'reformer' cannot attend to Transformer-XL memory"):
        ModelConfig(memory_len=8, attention={"core": "reformer"}).validate()
