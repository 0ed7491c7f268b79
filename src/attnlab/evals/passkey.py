"""Passkey retrieval: find a random 5-digit key hidden in a long stretch of filler text.

A prompt of exactly ``length`` tokens (the model's own tokenizer) is an instruction, filler
sentences with one needle sentence ("The pass key is 48213. Remember it. ...") placed after
a fraction ``depth`` of the filler (at a sentence boundary), and the question "What is the
pass key? The pass key is". The model answers by greedy decoding; the answer is right when
the first number in it is the key. Sparse attention fails this test when its selection
misses the needle's keys, which a perplexity average can hide. The prompts are generated
here from a seed (no data files), the same for every model compared.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

INTRO = ("There is an important piece of information hidden inside a lot of irrelevant "
         "text. Find it and memorize it. I will quiz you about it.\n")
FILLER = (" The grass is green. The sky is blue. The sun is yellow. Here we go. There and "
          "back again.")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "\nWhat is the pass key? The pass key is"
ANSWER_TOKENS = 8
"""Greedy tokens generated: the 5 digits (one token each in SmolLM2 / Llama tokenizers) and
the spaces and punctuation around them."""

Encode = Callable[[str], list[int]]


@dataclasses.dataclass(frozen=True)
class PasskeyPrompt:
    """``ids``: exactly the requested number of tokens; ``needle_at``: its token index;
    ``question_at``: where the question starts (the dense-prefill protocol prefills
    ``ids[:question_at]`` densely and decodes the rest with the variant)."""

    ids: list[int]
    key: str
    depth: float
    needle_at: int
    question_at: int


def check_depth(depth: float) -> None:
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"passkey depth must be between 0 and 1 (a fraction of the filler), "
                         f"got {depth}")


def passkey_prompts(encode: Encode, length: int, depth: float, n: int,
                    seed: int = 0) -> list[PasskeyPrompt]:
    """``n`` prompts of ``length`` tokens with random keys (from ``seed``, ``length`` and
    ``depth``), the needle after ``depth`` of the filler. ``ValueError`` when ``length``
    cannot hold the instruction, the needle and the question."""
    check_depth(depth)
    rng = random.Random(f"{seed}-{length}-{depth}")
    intro, question, unit = encode(INTRO), encode(QUESTION), encode(FILLER)
    prompts = []
    for _ in range(n):
        key = str(rng.randint(10000, 99999))
        needle = encode(NEEDLE.format(key=key))
        n_filler = length - len(intro) - len(needle) - len(question)
        if n_filler < 0:
            raise ValueError(f"a passkey prompt needs at least "
                             f"{length - n_filler} tokens, got length {length}")
        filler = (unit * (n_filler // len(unit) + 1))[:n_filler]
        at = min(round(depth * n_filler / len(unit)) * len(unit), n_filler)
        ids = intro + filler[:at] + needle + filler[at:] + question
        prompts.append(PasskeyPrompt(ids, key, depth, len(intro) + at, len(ids) - len(question)))
    return prompts


def first_number(text: str) -> str | None:
    """The first run of digits in ``text`` (None if there is none)."""
    found = re.search(r"\d+", text)
    return found.group(0) if found else None


GenerateFn = Callable[[Tensor], Tensor]
"""``[B, T]`` prompt ids -> ``[B, ANSWER_TOKENS]`` greedily generated ids."""


@torch.no_grad()
def answer_prompts(generate: GenerateFn, decode: Callable[[list[int]], str],
                   prompts: Sequence[PasskeyPrompt], batch_size: int = 1,
                   progress: Callable[[int], None] | None = None) -> list[bool]:
    """Whether each prompt was answered right (prompts of one length run ``batch_size`` at
    a time; ``progress`` gets the number answered by each batch)."""
    right = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        out = generate(torch.tensor([p.ids for p in batch]))
        for prompt, ids in zip(batch, out.tolist(), strict=True):
            right.append(first_number(decode(ids)) == prompt.key)
        if progress is not None:
            progress(len(batch))
    return right
