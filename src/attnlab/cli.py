"""The ``attnlab`` command line: train, distill, eval, long-context, generate, macs, bench,
report, demo."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from attnlab import __version__
from attnlab.config import ConfigError, builtin_config
from attnlab.demo.plan import BUDGET_MINUTES as DEMO_BUDGET_MINUTES
from attnlab.demo.plan import PRECISIONS as DEMO_PRECISIONS
from attnlab.demo.plan import REAL_MODEL_CHOICES, REAL_MODEL_MINUTES

logger = logging.getLogger("attnlab")


def resolve_config_path(value: str) -> Path:
    path = Path(value)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return builtin_config(value)


def cmd_train(args: argparse.Namespace) -> int:
    from attnlab.train import load_run_config, train
    from attnlab.train.distributed import is_main_process
    from attnlab.train.runner import RunFolder

    folder = RunFolder(args.out, "config.yaml", "run", resume=args.resume)
    folder.check()  # before reading anything: "no run there" rather than "no config.yaml"
    if args.config is None and not args.resume:
        raise ConfigError("attnlab train needs --config FILE (or --resume)")
    source = args.config or str(folder.config_path)
    cfg = load_run_config(resolve_config_path(source), args.set)
    summary = train(cfg, folder.path, resume=args.resume, progress=not args.quiet)
    if is_main_process():  # under torchrun every rank returns the summary; one prints it
        print(json.dumps(summary, indent=2))
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    from attnlab.distill import distill, load_distill_config
    from attnlab.train.runner import RunFolder

    folder = RunFolder(args.out, "distill.yaml", "distillation", resume=args.resume)
    folder.check()
    overrides = [a if a.startswith(("distill.", "data.")) else f"distill.{a}" for a in args.set]
    if args.teacher:
        overrides.insert(0, f"distill.teacher={json.dumps(args.teacher)}")
    if args.gguf_file:
        overrides.insert(0, f"distill.gguf_file={json.dumps(args.gguf_file)}")
    if args.student_attention:
        overrides.insert(0, f"distill.student_attention={args.student_attention}")
    source = args.config or (folder.config_path if args.resume else None)
    cfg = load_distill_config(source, overrides)
    summary = distill(cfg, folder.path, resume=args.resume, progress=not args.quiet)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from attnlab.config import apply_override, from_dict, to_dict
    from attnlab.data import DataConfig, load_corpus
    from attnlab.train.evaluate import evaluate_lm, loss_metrics
    from attnlab.train.run import load_run

    if args.threads:
        torch.set_num_threads(args.threads)
    run = load_run(args.run, args.device)
    data = to_dict(run.cfg.data)
    for assignment in args.set:
        apply_override(data, assignment.removeprefix("data."))
    corpus = load_corpus(from_dict(DataConfig, data, "data"), tokenizer=run.tokenizer)
    tokens = getattr(corpus, args.split)
    seq_len = args.seq_len or run.cfg.train.seq_len
    result = evaluate_lm(run.model, tokens, batch_size=args.batch_size, seq_len=seq_len,
                         max_tokens=args.max_tokens, device=args.device,
                         progress=not args.quiet)
    bytes_per_token = corpus.bytes_per_token(args.split)
    report = {"run": str(args.run), "step": run.step, "split": args.split, "seq_len": seq_len,
              "loss": result["loss"], "tokens": result["tokens"],
              **loss_metrics(result["loss"], corpus.unit, bytes_per_token)}
    print(json.dumps(report, indent=2))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from attnlab.train.run import load_run

    run = load_run(args.run, args.device)
    ids = run.tokenizer.encode(args.prompt)
    if not ids:
        raise ConfigError("--prompt encodes to no tokens")
    generator = torch.Generator(args.device).manual_seed(args.seed)
    out = run.model.generate(
        torch.tensor([ids], device=args.device), args.max_new_tokens,
        temperature=args.temperature, top_k=args.top_k, generator=generator,
    )
    print(run.tokenizer.decode(out[0].tolist()))
    return 0


def cmd_macs(args: argparse.Namespace) -> int:
    from attnlab.metrics import attention_cost
    from attnlab.train import load_run_config

    cost = attention_cost(load_run_config(resolve_config_path(args.config), args.set),
                          args.convention)
    if args.json:
        print(json.dumps(cost, indent=2))
    else:
        for key, value in cost.items():
            print(f"{key:>26}: {value:,}" if isinstance(value, int) else f"{key:>26}: {value}")
    return 0


def print_records(records: list, json_path: str | None) -> int:
    from attnlab.bench.common import format_table

    print(format_table(records))
    if json_path:
        print(f"saved {json_path}")
    return 0


def cmd_bench_expert_matmul(args: argparse.Namespace) -> int:
    import torch

    from attnlab.bench import expert_matmul

    records = expert_matmul.run(
        tokens=args.tokens, preset=args.preset, passes=args.passes, reps=args.reps,
        naive_reps=args.naive_reps, json_path=args.json, dtype=getattr(torch, args.dtype),
        device=args.device, backends=args.backends,
    )
    return print_records(records, args.json)


def _number(kind: type, low: float | None = None, *, above: float | None = None):
    """An argparse type: a ``kind`` number ``>= low`` (or ``> above``)."""
    def parse(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {value!r}") from err
        if low is not None and number < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if above is not None and not number > above:
            raise argparse.ArgumentTypeError(f"must be greater than {above}, got {value}")
        return number

    return parse


def _at_least(low: int):
    """An argparse type: an integer ``>= low``."""
    return _number(int, low)


MIN_REPS = 5  # attnlab.bench.common.MIN_REPS, spelled out: that module imports torch


def _csv(kind: type, low: float | None = None):
    """An argparse type: a comma-separated list of ``kind`` values (each ``>= low`` when
    given)."""
    item = _number(kind, low) if kind in (int, float) else kind

    def parse(value: str) -> list:
        try:
            return [item(v.strip()) for v in value.split(",") if v.strip()]
        except (ValueError, argparse.ArgumentTypeError) as err:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__} values: {err}") from err

    return parse


def cmd_bench_attention(args: argparse.Namespace) -> int:
    import torch

    from attnlab.bench import attention

    records = attention.run(
        mechanisms=args.mechanisms, seq_lens=args.seq_lens, causal=args.causal,
        pass_=args.pass_, heads=args.heads, d_head=args.d_head, batch=args.batch,
        dtype=getattr(torch, args.dtype), options=args.set, reps=args.reps,
        max_mem_gb=args.max_mem_gb, json_path=args.json, plot_path=args.plot,
        device=args.device,
    )
    print_records(records, args.json)
    print()
    print(attention.format_summary(records))
    if args.plot:
        print(f"saved {args.plot}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from attnlab.report import build_report, collect, compact_table

    paths = [*args.paths, *(args.runs or [])]
    if not paths:
        raise ConfigError("attnlab report needs run folders, bench JSON files or a demo "
                          "folder")
    results = build_report(collect(paths), Path(args.out), title=args.title)
    print(compact_table(results))
    print(f"saved {Path(args.out) / 'report.md'}")
    return 0


def cmd_bench_layer(args: argparse.Namespace) -> int:
    from attnlab.bench import layer

    records = layer.run(preset=args.preset, batch=args.batch, passes=args.passes, reps=args.reps,
                        json_path=args.json, device=args.device)
    return print_records(records, args.json)


def cmd_bench_train(args: argparse.Namespace) -> int:
    from attnlab.bench import train_step

    configs = [resolve_config_path(c) for c in args.configs]
    records = train_step.run(configs, steps=args.steps, overrides=args.set,
                             json_path=args.json, device=args.device)
    return print_records(records, args.json)


def _yaml_core(text: str) -> object:
    """A ``--core`` value: a name or a YAML mapping; ``ValueError`` for invalid YAML."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"--core {text!r} is not valid YAML: {err}") from err


def cmd_bench_hf(args: argparse.Namespace) -> int:
    from attnlab.bench import hf  # ImportError without transformers: one line

    records = hf.run(
        args.model, gguf_file=args.gguf_file,
        cores=[_yaml_core(c) for c in args.core] or ["sea"], seq_lens=args.seq_lens,
        batch=args.batch, new_tokens=args.new_tokens, reps=args.reps, json_path=args.json,
        device=args.device,
    )
    print_records(records, args.json)
    print()
    print(hf.format_summary(records))
    return 0


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from attnlab.bench import serve, serve_report  # ImportError without transformers

    cores = [_yaml_core(c) for c in args.core] or list(serve.DEFAULT_CORES)
    records = serve.run(
        args.model, gguf_file=args.gguf_file, cores=cores, seq_lens=args.seq_lens,
        batches=args.batches, prefill_batches=args.prefill_batches, dtypes=args.dtypes,
        steps=args.steps, warmup=args.warmup, reps=args.reps, threads=args.threads,
        device=args.device, json_path=args.json, plot_path=args.plot,
    )
    print(serve_report.format_summary(records))
    for path in (args.json, args.plot):
        if path:
            print(f"saved {path}")
    return 0


def cmd_long_context(args: argparse.Namespace) -> int:
    from attnlab.evals import long_context  # ImportError without transformers: one line

    cfg = long_context.LongContextConfig(
        lengths=tuple(args.lengths), tasks=tuple(args.tasks), corpus=args.corpus,
        split=args.split, stride=args.stride, ppl_tokens=args.ppl_tokens,
        depths=tuple(args.depths), prompts=args.prompts, seed=args.seed)
    result = long_context.run(args.model, args.variant, cfg, gguf_file=args.gguf_file,
                              device=args.device, json_path=args.json, progress=not args.quiet)
    print(long_context.format_table(result))
    if args.json:
        print(f"saved {args.json}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from attnlab.demo import run_demo
    from attnlab.report import compact_table

    results = run_demo(Path(args.out), budget_minutes=args.budget_minutes,
                       scale="smoke" if args.smoke else "full", device=args.device,
                       progress=not args.quiet, strict_budget=args.strict_budget,
                       precision=args.precision, train_jobs=args.train_jobs,
                       real_model=args.real_model)
    print(compact_table(results))
    print(f"report: {Path(args.out) / 'report.md'}")
    return 0


def _add_model_args(p: argparse.ArgumentParser, required: bool) -> None:
    """``--model FOLDER`` (optional: a small random Llama) and ``--gguf-file NAME``."""
    p.add_argument("--model", required=required, default=None, metavar="FOLDER",
                   help="Hugging Face model folder"
                        + ("" if required else " (default: a small random Llama)"))
    p.add_argument("--gguf-file", default=None, metavar="NAME",
                   help="a GGUF file in --model to load, e.g. SmolLM2-135M-Instruct.Q4_1.gguf")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a language model from a YAML config")
    p.add_argument("--config", help="YAML file, or a built-in name such as 'tiny'")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--out", required=True, help="run folder to create (or resume)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("distill", help="distil a teacher into an efficient-attention student")
    p.add_argument("--teacher", default=None, metavar="SPEC",
                   help="attnlab run folder (a model trained with attnlab train), Hugging Face "
                        "model folder, or model name in the local Hugging Face cache")
    p.add_argument("--gguf-file", default=None, metavar="NAME",
                   help="load this GGUF file of the --teacher folder (dequantised)")
    p.add_argument("--student-attention", default=None, metavar="CORE",
                   help="student attention core: a name (sea, performer, reformer) or YAML "
                        "with options, e.g. '{name: sea, k: 16, predictor_length: 32}'")
    p.add_argument("--config", default=None, help="YAML with distill: and data: sections")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override, e.g. steps=200 (= distill.steps) or data.corpus=wiki")
    p.add_argument("--out", required=True, help="the student's run folder")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_distill)

    p = sub.add_parser("eval", help="evaluate a trained run on held-out text")
    p.add_argument("--run", required=True, help="run folder written by attnlab train")
    p.add_argument("--set", action="append", default=[], metavar="data.KEY=VALUE",
                   help="change the data, e.g. --set data.corpus=wiki (tokenizer stays the run's)")
    p.add_argument("--split", choices=["valid", "test"], default="test")
    p.add_argument("--seq-len", type=_at_least(1), default=None,
                   help="tokens per evaluated window (default: the run's train.seq_len)")
    p.add_argument("--batch-size", type=_at_least(1), default=8, help="windows per forward")
    p.add_argument("--max-tokens", type=_at_least(1), default=None,
                   help="evaluate only the first N tokens of the split (default: all)")
    p.add_argument("--threads", type=_at_least(1), default=None,
                   help="torch threads (default: torch's choice, like train.threads)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("generate", help="sample text from a trained run")
    p.add_argument("--run", required=True, help="run folder written by attnlab train")
    p.add_argument("--prompt", required=True, help="text the sample continues")
    p.add_argument("--max-new-tokens", type=_at_least(1), default=200,
                   help="tokens to generate (with the KV cache)")
    p.add_argument("--temperature", type=_number(float, 0.0), default=0.8,
                   help="softmax temperature, >= 0 (lower: likelier tokens; 0: greedy)")
    p.add_argument("--top-k", type=_at_least(1), default=None,
                   help="sample among the k most likely tokens only (default: all)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the sampling")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("macs", help="attention MACs, activation memory and parameters")
    p.add_argument("--config", required=True, help="YAML file or built-in config name")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--convention", choices=["paper", "exact"], default="exact",
                   help="paper: the SwitchHead paper's formulas; exact: what attnlab executes")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_macs)

    bench = sub.add_parser("bench", help="side-by-side benchmarks (table + JSON)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    p = bench_sub.add_parser("expert-matmul", help="expert matmul vs naive vs dense-equal-MACs")
    p.add_argument("--tokens", type=_at_least(1), default=4096, help="tokens per call")
    p.add_argument("--preset", default="wt103-47m")
    p.add_argument("--passes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    p.add_argument("--reps", type=_at_least(MIN_REPS), default=10,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--naive-reps", type=_at_least(MIN_REPS), default=MIN_REPS,
                   help=f"timed repetitions of the slow reference (>= {MIN_REPS})")
    # attnlab.bench.expert_matmul.FORCEABLE, spelled out: that module imports torch
    p.add_argument("--backends", nargs="+", choices=["grouped", "dense", "triton"], default=[],
                   help="also time these backends forced (auto's choice is 'fast')")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    p.set_defaults(func=cmd_bench_expert_matmul)

    p = bench_sub.add_parser("attention", help="attention cores (q, k, v -> o) vs seq_len")
    p.add_argument("--mechanisms", type=_csv(str), default=None, metavar="A,B,...",
                   help="registered core names (default: those of sdpa,eager,sea,performer,"
                        "reformer that are registered); sdpa, the baseline, is always run")
    p.add_argument("--seq-lens", type=_csv(int, 1), default=[1024, 2048, 4096, 8192, 16384],
                   metavar="T1,T2,...")
    causal = p.add_mutually_exclusive_group()
    causal.add_argument("--causal", dest="causal", action="store_true", default=True,
                        help="causal attention (default)")
    causal.add_argument("--bidirectional", dest="causal", action="store_false")
    p.add_argument("--pass", dest="pass_", choices=["fwd", "fwdbwd"], default="fwd")
    p.add_argument("--heads", type=_at_least(1), default=12)
    p.add_argument("--d-head", type=_at_least(1), default=64)
    p.add_argument("--batch", type=_at_least(1), default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--set", action="append", default=[], metavar="MECH.OPTION=VALUE",
                   help="a core option, e.g. --set sea.k=32 (repeatable)")
    p.add_argument("--max-mem-gb", type=_number(float, above=0.0), default=None,
                   help="skip a mechanism whose estimated peak exceeds this many GiB "
                        "(default: 40%% of the device's memory)")
    p.add_argument("--reps", type=_at_least(MIN_REPS), default=10,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="time and memory vs seq_len (needs matplotlib: attnlab[plot])")
    p.set_defaults(func=cmd_bench_attention)

    p = bench_sub.add_parser("layer", help="one attention layer: dense-h10/h2, switchhead, moa")
    p.add_argument("--preset", default="wt103-47m")
    p.add_argument("--batch", type=_at_least(1), default=1)
    p.add_argument("--passes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwdbwd"])
    p.add_argument("--reps", type=_at_least(MIN_REPS), default=10,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    p.set_defaults(func=cmd_bench_layer)

    p = bench_sub.add_parser("train", help="whole training steps of several configs")
    p.add_argument("--configs", nargs="+", required=True,
                   help="YAML files or built-in names; the first is the baseline")
    p.add_argument("--steps", type=_at_least(MIN_REPS), default=MIN_REPS,
                   help=f"timed steps per config (>= {MIN_REPS})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every config")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    p.set_defaults(func=cmd_bench_train)

    p = bench_sub.add_parser("hf", help="a Hugging Face model vs its attnlab-converted copy: "
                                        "forward latency and cached generation")
    _add_model_args(p, required=False)
    p.add_argument("--core", action="append", default=[], metavar="CORE",
                   help="converted core: a name or YAML with options, e.g. '{name: sea, k: 64, "
                        "predictor_length: 64}' (repeatable; default: sea)")
    p.add_argument("--seq-lens", type=_csv(int, 1), default=[256, 512, 1024, 2048],
                   metavar="T1,T2,...")
    p.add_argument("--batch", type=_at_least(1), default=1)
    p.add_argument("--new-tokens", type=_at_least(1), default=32,
                   help="tokens generated per prompt")
    p.add_argument("--reps", type=_at_least(MIN_REPS), default=MIN_REPS,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    p.set_defaults(func=cmd_bench_hf)

    p = bench_sub.add_parser(
        "serve", help="serving: prefill latency and decode tokens/s of a Hugging Face model vs "
                      "its attnlab-converted copies, with in-place KV caches",
        description="Prefill (real left-padded prompts) and cached decoding (from random "
                    "caches of each context length) of the original model and each converted "
                    "core, side by side. A CPU prefill of the original is quadratic in T: at "
                    "T=8192 and batch 8 it takes minutes on SmolLM2-135M, hence "
                    "--prefill-batches 1 by default.")
    _add_model_args(p, required=False)
    p.add_argument("--core", action="append", default=[], metavar="CORE",
                   help="converted core: a name or YAML with options (repeatable; default: "
                        "'{name: sea, k: 256, predictor_length: 64}')")
    p.add_argument("--seq-lens", type=_csv(int, 1), default=[2048, 4096, 8192],
                   metavar="T1,T2,...", help="context lengths (decode: keys the last timed "
                   "step attends to; at most the model's max_position_embeddings)")
    p.add_argument("--batches", type=_csv(int, 1), default=[1, 4, 8], metavar="B1,B2,...",
                   help="decode batch sizes (rows beyond the first are left-padded)")
    p.add_argument("--prefill-batches", type=_csv(int, 1), default=[1], metavar="B1,B2,...",
                   help="prefill batch sizes; '' (empty) for no prefill")
    p.add_argument("--dtypes", type=_csv(str), default=["float32"], metavar="D1,D2,...",
                   help="float32, bfloat16 (float16 on cuda only)")
    p.add_argument("--steps", type=_at_least(1), default=8,
                   help="timed decode steps per model in each round")
    p.add_argument("--warmup", type=_at_least(1), default=2,
                   help="untimed decode steps first (the first builds the cores' state)")
    p.add_argument("--reps", type=_at_least(1), default=3,
                   help="rounds of alternation (prefill: timed prefills per model)")
    p.add_argument("--threads", type=_at_least(1), default=None,
                   help="torch threads during the run (default: unchanged)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="save records and the summary as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="decode tokens/s vs context length (needs matplotlib: attnlab[plot])")
    p.set_defaults(func=cmd_bench_serve)

    p = sub.add_parser(
        "long-context", help="perplexity and passkey retrieval at long contexts of a Hugging "
                             "Face model and its variants (window, oracle, SEA students)",
        description="Sliding-window perplexity on whole held-out documents and passkey "
                    "retrieval (greedy) at each length, for the original model and each "
                    "--variant, side by side on the same tokens and prompts.")
    _add_model_args(p, required=True)
    p.add_argument("--variant", action="append", default=[], metavar="YAML",
                   help="'original', a core with options ('{name: window, sinks: 4, window: "
                        "252}', '{name: oracle, k: 256}') or a distilled student ('{name: sea, "
                        "student: OUT/student, k: 256}'); repeatable (default: original)")
    p.add_argument("--tasks", type=_csv(str), default=["perplexity", "passkey"],
                   metavar="T1,T2", help="perplexity, passkey")
    p.add_argument("--lengths", type=_csv(int, 2), default=[2048, 4096, 8192],
                   metavar="T1,T2,...")
    p.add_argument("--corpus", default="shakespeare", choices=["shakespeare", "wiki", "pystdlib"],
                   help="built-in corpus of the perplexity documents")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--stride", type=float, default=0.5,
                   help="sliding-window stride as a fraction of the length")
    p.add_argument("--ppl-tokens", type=_at_least(1), default=16384,
                   help="perplexity targets per length")
    p.add_argument("--depths", type=_csv(float), default=[0.1, 0.5, 0.9], metavar="D1,D2,...",
                   help="passkey depths (fractions of the filler before the key)")
    p.add_argument("--prompts", type=_at_least(1), default=20,
                   help="passkey prompts per length x depth")
    p.add_argument("--seed", type=int, default=0, help="passkey keys")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save the records as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_long_context)

    p = sub.add_parser("report", help="the report of runs and benchmarks: Markdown, PNG, JSON")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="run folders (attnlab train / distill), bench JSON files, or folders "
                        "holding them (e.g. a demo's output)")
    p.add_argument("--runs", nargs="+", default=None, metavar="DIR",
                   help="more run folders (same as giving them as PATHs)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="writes DIR/report.md, DIR/*.png (with matplotlib), DIR/results.json")
    p.add_argument("--title", default="attnlab report")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("demo", help="the main job: train, distil, benchmark and report, "
                                    "within a time budget")
    p.add_argument("--out", default="runs/demo", help="output folder (re-run to resume)")
    p.add_argument("--budget-minutes", type=_number(float, above=0.0),
                   default=DEMO_BUDGET_MINUTES,
                   help="wall-clock budget of the stages (steps are scaled to fit)")
    p.add_argument("--strict-budget", action="store_true",
                   help="never go over the budget: a stage it cuts below its minimum is "
                        "marked inconclusive (default: keep every stage at its minimum and go "
                        "over the budget, saying by how much)")
    p.add_argument("--precision", choices=DEMO_PRECISIONS, default="auto",
                   help="how the models train: auto = bf16 autocast where the device computes "
                        "bf16 natively, else fp32 (distillation and benchmark: fp32)")
    p.add_argument("--train-jobs", type=_at_least(1), default=None, metavar="N",
                   help="models trained at once, each in its own process (default: on a CPU "
                        "one per thread, one thread each; on a GPU 1)")
    p.add_argument("--real-model", choices=REAL_MODEL_CHOICES, default="auto",
                   help="the real-model stage: SEA distilled into SmolLM2-135M against the "
                        "original and a sliding window, quality and serving speed at long "
                        f"context (~25 min on 2 cores); auto = on from --budget-minutes "
                        f"{REAL_MODEL_MINUTES:.0f}")
    p.add_argument("--smoke", action="store_true",
                   help="toy sizes, every stage in seconds (for tests)")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)
    return parser


def _check_before_work(args: argparse.Namespace) -> None:
    """``ConfigError`` for a device this machine lacks or an output it cannot write, before
    any work starts (train and distill check their ``--out`` themselves)."""
    from attnlab.utils.device import resolve_device
    from attnlab.utils.io import unwritable_reason

    if getattr(args, "device", None) not in (None, "auto"):
        resolve_device(args.device)
    outputs = {"--json": (getattr(args, "json", None), False),
               "--plot": (getattr(args, "plot", None), False)}
    if args.command in ("report", "demo"):
        outputs["--out"] = (args.out, True)
    for option, (path, folder) in outputs.items():
        if isinstance(path, str) and (reason := unwritable_reason(path, folder=folder)):
            raise ConfigError(f"{option} {path}: cannot write there: {reason}")


def _user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that report a user's mistake (or a stop the user can act on): one
    ``error:`` line, exit status 2. Anything else is a bug and keeps its traceback."""
    from attnlab.train import CheckpointError, RankFailure, RunDirError, TrainingDiverged

    return (ValueError, OSError, ImportError, RunDirError, CheckpointError, TrainingDiverged,
            RankFailure)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from attnlab.train.distributed import is_main_process

    level = logging.INFO if is_main_process() else logging.WARNING  # torchrun: rank 0 informs
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
    )
    if getattr(args, "bench", None) or args.command == "demo":  # benchmarks: on the tuned heap
        from attnlab.utils.allocator import tune_cpu_allocator

        tune_cpu_allocator()
    from attnlab.demo.parallel import RunFailed
    from attnlab.train import RunInterrupted

    try:
        _check_before_work(args)
        return args.func(args)
    except RunInterrupted as err:  # Ctrl-C / SIGTERM in train or distill: saved, resumable
        return _stop(args, f"{err}; continue with: attnlab {args.command} --out {err.folder} "
                           "--resume", err.exit_code)
    except KeyboardInterrupt:
        return _stop(args, "interrupted", 130)
    except RunFailed as err:  # a training process of the demo: its error and log
        return _stop(args, f"error: {err}", 1)
    except _user_errors() as err:
        return _stop(args, f"error: {str(err).strip() or type(err).__name__}", 2)


def _stop(args: argparse.Namespace, message: str, code: int) -> int:
    """Print ``message`` (after the traceback with ``-v``) and return the exit status."""
    if args.verbose:
        traceback.print_exc()
    print(message, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
