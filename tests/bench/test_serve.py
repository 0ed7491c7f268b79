"""``attnlab bench serve`` on the default small random Llama at tiny lengths: records per grid
cell, ratios, summary, JSON, plot, CLI and its errors. One torch thread (fast and steady on a
loaded machine); no timing upper bounds (a loaded machine may stall any call)."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("transformers")

from attnlab.bench import serve, serve_inputs  # noqa: E402
from attnlab.bench.hf import (  # noqa: E402
    TINY_LLAMA,
    TINY_MODEL,
    original_fingerprint,
    tiny_llama,
)
from attnlab.cli import main  # noqa: E402
from attnlab.config import ConfigError  # noqa: E402
from attnlab.results import read_json, read_summary  # noqa: E402
from attnlab.results import serve as serve_report  # noqa: E402
from attnlab.utils.provenance import available_cores  # noqa: E402

SEA = {"name": "sea", "k": 4, "predictor_length": 8}
SEQ_LENS, BATCHES, STEPS, WARMUP, REPS = (32, 64), (1, 2), 2, 2, 2
TINY = ["--core", "{name: sea, k: 4, predictor_length: 8}", "--seq-lens", "32",
        "--batches", "2", "--steps", "1", "--reps", "1", "--threads", "1"]


@pytest.fixture(autouse=True)
def one_thread():
    """Direct model calls on one thread too (the runs set it themselves and restore it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "serve.json"
    records = serve.run(cores=[SEA], seq_lens=list(reversed(SEQ_LENS)), batches=BATCHES,
                        prefill_batches=BATCHES, steps=STEPS, warmup=WARMUP, reps=REPS,
                        threads=1, json_path=path, progress=False)
    return records, path


def _cell(r):
    return r.shape["dtype"], r.shape["op"], r.shape["batch"], r.shape["seq_len"], r.name


def test_records_per_cell_with_ratios(tiny_run):
    records, _ = tiny_run
    assert [_cell(r) for r in records] == [
        ("float32", op, b, t, name) for op in ("prefill", "decode") for b in BATCHES
        for t in SEQ_LENS for name in ("original", "sea")]
    base = {_cell(r)[:-1]: r for r in records if r.name == "original"}
    for r in records:
        assert r.bench == "serve" and r.pass_ == "fwd" and r.baseline == "original"
        assert r.shape["model"] == TINY_MODEL
        assert r.shape["model_sha256"] == original_fingerprint(seed=0) != original_fingerprint(
            seed=1)  # the tiny Llama of seed 0, not another one
        assert r.shape["keys_per_row"] == (SEA["k"] if r.name == "sea" else None)
        assert r.shape["padding"] == ("left" if r.shape["batch"] > 1 else "none")
        assert r.ratio == pytest.approx(r.ms_median / base[_cell(r)[:-1]].ms_median)
        assert 0 < r.ms_min <= r.ms_median and r.peak_mem_mb > 0
        assert ("options" in r.shape) == (r.name == "sea")
        if r.shape["op"] == "decode":
            t = r.shape["seq_len"]
            assert r.shape["cache"] == "random" and r.shape["steps"] == REPS * STEPS
            assert r.shape["contexts"] == [t - REPS * STEPS + 1, t]
        else:
            assert "cache" not in r.shape
    assert records[1].shape["options"] == {"k": 4, "predictor_length": 8}


def test_decode_peak_counts_the_cache(tiny_run):
    records, _ = tiny_run
    kv = serve_inputs.CacheShape.of(tiny_llama().config)
    assert (kv.layers, kv.kv_heads, kv.head_dim) == (4, 4, 32)
    for r in records:
        if r.shape["op"] == "decode":
            cache = kv.nbytes(r.shape["batch"], r.shape["seq_len"] - REPS * STEPS,
                              torch.float32) / 2**20
            assert r.peak_mem_mb > cache


def test_summary_matches_records(tiny_run):
    records, _ = tiny_run
    summary = serve_report.summarize(records)
    assert set(summary) == {"original", "sea"}
    by_cell = {_cell(r): r for r in records}
    for name, dtypes in summary.items():
        assert set(dtypes) == {"float32"}
        assert set(dtypes["float32"]) == {"1", "2"}
        for batch, lengths in dtypes["float32"].items():
            assert set(lengths) == {"32", "64"}
            for t, v in lengths.items():
                dec = by_cell["float32", "decode", int(batch), int(t), name]
                pre = by_cell["float32", "prefill", int(batch), int(t), name]
                assert v["decode_tokens_per_s"] == pytest.approx(
                    int(batch) / (dec.ms_median / 1e3))
                assert v["decode_speedup"] == pytest.approx(1 / dec.ratio)
                assert v["prefill_ms"] == pre.ms_median
                assert v["prefill_speedup"] == pytest.approx(1 / pre.ratio)
                assert v["decode_peak_mem_ratio"] > 0 and v["prefill_peak_mem_ratio"] > 0
                if name == "original":
                    assert v["decode_speedup"] == v["prefill_speedup"] == 1.0
    table = serve_report.format_summary(records)
    assert "sea decode tok/s" in table and "original prefill ms" in table
    assert "| float32 | 2 | 64 |" in table and len(table.splitlines()) == 2 + 4


def test_json_round_trip(tiny_run):
    records, path = tiny_run
    machine, back = read_json(path)
    assert back == records and machine["threads"] == 1
    assert machine["cores"] == available_cores()
    assert read_summary(path) == json.loads(json.dumps(serve_report.summarize(records)))


def test_left_padding_and_positions():
    assert serve_inputs.pad_lengths(1, 64) == [0]
    assert serve_inputs.pad_lengths(2, 64) == [0, 8]
    assert serve_inputs.pad_lengths(8, 64) == [0, 1, 2, 3, 4, 5, 6, 8]
    mask = serve_inputs.left_padding_mask(serve_inputs.pad_lengths(3, 16), 16)
    assert mask.shape == (3, 16) and mask.sum(-1).tolist() == [16, 15, 14]
    pos = serve_inputs.positions(mask)
    assert pos[2].tolist() == [0, 0] + list(range(14))
    assert pos[:, -1].tolist() == [15, 14, 13]


def test_decoder_continues_its_cache():
    model = tiny_llama()
    kv = serve_inputs.CacheShape.of(model.config)
    mask = serve_inputs.left_padding_mask(serve_inputs.pad_lengths(2, 24), 24)
    cache = serve_inputs.random_cache(kv, 2, 20, 24, torch.float32, torch.device("cpu"),
                               torch.Generator().manual_seed(0))
    assert cache.layers[0].keys.shape == (2, 4, 20, 32) and len(cache.layers) == 4
    dec = serve.Decoder(model, cache, mask, torch.zeros(2, 1, dtype=torch.long))
    assert dec.next_pos.tolist() == [[20], [17]]  # row 1 has 3 pads
    for _ in range(4):
        dec.step()
    assert cache.get_seq_length() == dec.length == 24
    assert dec.next_pos.tolist() == [[24], [21]]


def test_bfloat16_cells():
    records = serve.run(cores=[SEA], seq_lens=[32], batches=[2], prefill_batches=[1],
                        dtypes=["bfloat16", "float32"], steps=1, warmup=1, reps=1, threads=1,
                        progress=False)
    assert [_cell(r) for r in records] == [
        (dtype, op, b, 32, name) for dtype in ("bfloat16", "float32")
        for op, b in (("prefill", 1), ("decode", 2)) for name in ("original", "sea")]
    assert all(r.ms_median > 0 for r in records)
    assert "| bfloat16 | 2 | 32 |" in serve_report.format_summary(records)


def test_validation():
    cpu = torch.device("cpu")
    assert serve_inputs.resolve_dtypes(["float32", "bfloat16", "float32"], cpu) == [
        torch.float32, torch.bfloat16]
    with pytest.raises(ValueError, match="float16 only on cuda.*valid: float32, bfloat16"):
        serve_inputs.resolve_dtypes(["float16"], cpu)
    with pytest.raises(ValueError, match="'fp8'.*valid: float32, bfloat16"):
        serve_inputs.resolve_dtypes(["fp8"], cpu)
    kwargs = {"cores": [SEA], "progress": False}
    with pytest.raises(ValueError, match="batches must be positive"):
        serve.run(seq_lens=[32], batches=[0], **kwargs)
    with pytest.raises(ValueError, match="empty list"):
        serve.run(seq_lens=[32], prefill_batches=[0], **kwargs)
    with pytest.raises(ValueError, match="too short to decode 19 steps.*the shortest is 22"):
        serve.run(seq_lens=[21, 64], steps=8, warmup=2, reps=2, **kwargs)
    with pytest.raises(ConfigError, match="reformer"):
        serve.run(cores=["reformer"], seq_lens=[32])
    cores = available_cores()
    with pytest.raises(ValueError, match=f"{cores + 1} threads on {cores} CPU cores"):
        serve.run(seq_lens=[32], threads=cores + 1, **kwargs)
    torch.set_num_threads(cores + 1)  # e.g. OMP_NUM_THREADS: torch's own setting counts too
    try:
        with pytest.raises(ValueError, match=f"{cores + 1} threads on {cores} CPU cores"):
            serve.run(seq_lens=[32], **kwargs)
    finally:
        torch.set_num_threads(1)
    with pytest.raises(ConfigError, match="core sea keeps 32 keys per row, not fewer than the "
                                          "context 32"):
        serve.run(cores=[{**SEA, "k": 32}], seq_lens=[64, 32], progress=False)
    with pytest.raises(ConfigError, match="core window keeps 64 keys per row"):
        serve.run(cores=[{"name": "window", "sinks": 4, "window": 60}], seq_lens=[64],
                  progress=False)
    with pytest.raises(ConfigError, match="core window keeps 1028 keys per row"):
        serve.run(cores=["window"], seq_lens=[64], progress=False)  # its defaults count
    with pytest.raises(ConfigError, match="seq_len 16384 .* 8192"):
        serve.run(seq_lens=[TINY_LLAMA["max_position_embeddings"] * 2], **kwargs)


def test_cli(tmp_path, capsys):
    path, png = tmp_path / "serve.json", tmp_path / "serve.png"
    plot = [] if _no_matplotlib() else ["--plot", str(png)]
    assert main(["bench", "serve", *TINY, "--prefill-batches", "", "--json", str(path),
                 *plot]) == 0
    out = capsys.readouterr().out
    assert "| float32 | 2 | 32 |" in out and "original decode tok/s" in out
    results = json.loads(path.read_text())["results"]
    assert [(r["name"], r["shape"]["op"]) for r in results] == [("original", "decode"),
                                                                ("sea", "decode")]
    if plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _no_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return True
    return False


BAD = {
    "too long": (["--seq-lens", "9000"], "9000.*max_position_embeddings 8192"),
    "dtype": (["--dtypes", "float64"], "'float64'.*valid: float32, bfloat16"),
    "core option": (["--core", "{name: sea, kk: 3}"], "unknown config key 'core:sea.kk'"),
    "cuda": (["--device", "cuda"], "'cuda' is not available"),
    "llama.cpp without a GGUF": (["--llama-cpp"], "--llama-cpp runs llama.cpp on the model's "
                                                  "GGUF file: give --model FOLDER and "
                                                  "--gguf-file NAME"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_cli_bad_input(case, tmp_path, capsys):
    if case == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available")
    args, message = BAD[case]
    path = tmp_path / "serve.json"
    assert main(["bench", "serve", *TINY, *args, "--json", str(path),
                 "--plot", str(tmp_path / "serve.png")]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert re.search(message, lines[0])
    assert list(tmp_path.iterdir()) == []


def test_int8_weights_for_every_model_and_the_masters_kept():
    from attnlab.models.quantize import Int8Linear

    master = serve.side_by_side(tiny_llama(), serve.core_specs([SEA]))["sea"]
    (model,) = serve._cast({"sea": master}, torch.float32, torch.device("cpu"),
                           "int8").values()
    assert model is not master and isinstance(model.lm_head, Int8Linear)
    assert isinstance(master.lm_head, torch.nn.Linear)
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, Int8Linear)
    assert isinstance(attention.attnlab_core.estimator.scalers, torch.nn.Linear)  # the core's
    records = serve.run(cores=[SEA], seq_lens=[32], batches=[1], prefill_batches=[],
                        steps=1, warmup=1, reps=1, threads=1, weights="int8", progress=False)
    assert {r.shape["weights"] for r in records} == {"int8"}
    assert "| float32, int8 weights | 1 | 32 |" in serve_report.format_summary(records)
    with pytest.raises(ValueError, match="weights 'int4' is not valid; valid: float, int8"):
        serve.run(seq_lens=[32], weights="int4", progress=False)
