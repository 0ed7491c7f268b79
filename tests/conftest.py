import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import inspect  # noqa: E402
import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers import triton_on_this_machine  # noqa: E402

# before any module defines a Triton kernel (the op contracts import every op module)
triton_on_this_machine()


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(False)
    yield


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory):
    """Real English-ish text: the standard library's own docstrings and sources."""
    import argparse
    import collections
    import logging

    text = "\n".join(inspect.getsource(m) for m in (argparse, collections, logging, json))
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(text)
    return path


@pytest.fixture
def tiny_run_config(text_corpus, tmp_path):
    def make(**train):
        return {
            "model": {"d_model": 32, "n_layers": 2, "d_ff": 64, "max_seq_len": 64,
                      "attention": {"n_heads": 2}},
            "data": {"corpus": "text", "path": str(text_corpus),
                     "cache_dir": str(tmp_path / "cache")},
            "train": {"steps": 20, "batch_size": 4, "seq_len": 32, "lr": 3e-3, "eval_every": 10,
                      "eval_tokens": 1024, "final_eval_tokens": 4096, "ckpt_every": 10,
                      "log_every": 5, **train},
        }

    return make

