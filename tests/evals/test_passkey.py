"""Passkey prompts (exact lengths, the needle's place) and scoring with copying models."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench.hf import tiny_tokenizer
from attnlab.evals.passkey import (
    ANSWER_TOKENS,
    FILLER,
    INTRO,
    NEEDLE,
    QUESTION,
    answer_prompts,
    first_number,
    passkey_prompts,
)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def encode_with(tokenizer):
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_prompts_have_the_exact_length_and_the_needle_at_its_depth(tokenizer, depth):
    prompts = passkey_prompts(encode_with(tokenizer), 1500, depth, n=5, seed=3)
    needle = encode_with(tokenizer)(" The pass key is")
    for p in prompts:
        assert len(p.ids) == 1500 and len(p.key) == 5
        assert p.ids[p.needle_at:p.needle_at + len(needle)] == needle
        text = tokenizer.decode(p.ids)
        assert text.count(p.key) == 2 and text.endswith("The pass key is")
    assert len({p.key for p in prompts}) == 5
    assert passkey_prompts(encode_with(tokenizer), 1500, depth, n=5, seed=3) == prompts


def test_the_needle_moves_from_after_the_instruction_to_before_the_question(tokenizer):
    encode = encode_with(tokenizer)
    at = [passkey_prompts(encode, 1500, d, n=1)[0] for d in (0.0, 0.1, 0.5, 0.9, 1.0)]
    assert at[0].needle_at == len(encode(INTRO))
    needle = len(encode(NEEDLE.format(key=at[-1].key)))
    gap = 1500 - len(encode(QUESTION)) - (at[-1].needle_at + needle)
    assert 0 <= gap < len(encode(FILLER))  # at a sentence boundary: less than a filler unit
    assert [p.needle_at for p in at] == sorted({p.needle_at for p in at})
    assert abs(at[2].needle_at - 750) < 0.05 * 1500


def test_a_length_too_short_for_the_prompt_is_refused(tokenizer):
    with pytest.raises(ValueError, match="needs at least"):
        passkey_prompts(encode_with(tokenizer), 20, 0.5, n=1)
    with pytest.raises(ValueError, match="depth must be between 0 and 1"):
        passkey_prompts(encode_with(tokenizer), 500, 1.5, n=1)


def test_first_number():
    assert first_number(" 48213. Remember") == "48213"
    assert first_number("the key is four") is None


def copier(tokenizer, window):
    """A 'model' built to copy: it answers the digits after 'The pass key is' when that
    needle lies within its last ``window`` tokens, else digits of its own."""
    needle = tokenizer(" The pass key is", add_special_tokens=False)["input_ids"]

    def generate(ids):
        out = []
        for row in ids.tolist():
            seen = row[-window:]
            starts = [i for i in range(len(seen) - len(needle))
                      if seen[i:i + len(needle)] == needle]
            text = tokenizer.decode(seen[starts[0] + len(needle):])[:7] if starts else " 00000."
            answer = tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append((answer + [0] * ANSWER_TOKENS)[:ANSWER_TOKENS])
        return torch.tensor(out)

    return generate


def test_a_copying_model_finds_the_key_and_a_short_sighted_one_does_not(tokenizer):
    prompts = passkey_prompts(encode_with(tokenizer), 1200, 0.1, n=4)
    calls = []
    right = answer_prompts(copier(tokenizer, 1200), tokenizer.decode, prompts, batch_size=3,
                           progress=calls.append)
    assert right == [True] * 4 and calls == [3, 1]
    assert answer_prompts(copier(tokenizer, 300), tokenizer.decode, prompts) == [False] * 4
