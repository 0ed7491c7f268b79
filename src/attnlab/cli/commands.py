"""The ``attnlab`` subcommands: each takes the parsed arguments and returns the exit status.

Heavy modules (torch, transformers) are imported inside each command, so ``--help`` and
argument errors stay fast."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.cli.args import resolve_config_path, yaml_core
from attnlab.config import ConfigError


def cmd_train(args: argparse.Namespace) -> int:
    from attnlab.train import load_run_config, train
    from attnlab.train.distributed import is_main_process
    from attnlab.train.runner import RunFolder

    folder = RunFolder(args.out, "config.yaml", "run", resume=args.resume, force=args.force)
    folder.check()  # before reading anything: "no run there" rather than "no config.yaml"
    if args.config is None and not args.resume:
        raise ConfigError("attnlab train needs --config FILE (or --resume)")
    source = args.config or str(folder.config_path)
    cfg = load_run_config(resolve_config_path(source), args.set)
    summary = train(cfg, folder.path, resume=args.resume, progress=not args.quiet,
                    force=args.force)
    if is_main_process():  # under torchrun every rank returns the summary; one prints it
        print(json.dumps(summary, indent=2))
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    from attnlab.distill import distill, load_distill_config
    from attnlab.train.runner import RunFolder

    folder = RunFolder(args.out, "distill.yaml", "distillation", resume=args.resume,
                       force=args.force)
    folder.check()
    overrides = [a if a.startswith(("distill.", "data.")) else f"distill.{a}" for a in args.set]
    if args.teacher is not None:
        overrides.insert(0, f"distill.teacher={json.dumps(args.teacher)}")
    if args.gguf_file is not None:
        overrides.insert(0, f"distill.gguf_file={json.dumps(args.gguf_file)}")
    if args.student_attention is not None:
        overrides.insert(0, f"distill.student_attention={args.student_attention}")
    if args.recipe is not None:
        overrides.insert(0, f"distill.recipe={json.dumps(args.recipe)}")
    source = args.config or (folder.config_path if args.resume else None)
    cfg = load_distill_config(source, overrides)
    summary = distill(cfg, folder.path, resume=args.resume, progress=not args.quiet,
                      force=args.force)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_distill_estimators(args: argparse.Namespace) -> int:
    from attnlab.distill.estimators import distill_estimators, load_recipe

    recipe = load_recipe(args.config, args.set)
    summary = distill_estimators(args.model, recipe, args.out, gguf_file=args.gguf_file,
                                 force=args.force, progress=not args.quiet)
    held = [row["held_out"] for row in summary["layers"]]
    print(json.dumps({
        "out": args.out, "minutes": round(summary["minutes"], 2),
        "backbone_unchanged": summary["backbone_unchanged"],
        "mean_held_out_kept_mass": {key: round(sum(h[key] for h in held) / len(held), 4)
                                    for key in ("kept_mass_block", "kept_mass_after",
                                                "kept_mass_best")}}, indent=2))
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
        assignment = assignment.removeprefix("data.")
        if assignment.split("=", 1)[0] in ("tokenizer", "vocab_size"):
            raise ConfigError(f"--set data.{assignment}: eval encodes text with the run's own "
                              "tokenizer, which cannot be changed")
        apply_override(data, assignment)
    seq_len = args.seq_len or run.cfg.train.seq_len
    model_cfg = run.cfg.model
    if seq_len + model_cfg.memory_len > model_cfg.max_seq_len:
        raise ConfigError(
            f"--seq-len {seq_len} + model.memory_len {model_cfg.memory_len} exceeds the "
            f"model's max_seq_len {model_cfg.max_seq_len}"
        )
    corpus = load_corpus(from_dict(DataConfig, data, "data"), tokenizer=run.tokenizer)
    tokens = getattr(corpus, args.split)
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


def cmd_match(args: argparse.Namespace) -> int:
    from attnlab.config import dump_yaml
    from attnlab.metrics import format_match, match_header, match_params
    from attnlab.train import load_run_config
    from attnlab.utils.io import atomic_write_json, atomic_write_text

    source = resolve_config_path(args.config)
    matched, report = match_params(
        load_run_config(source, args.set), args.projections, n_heads=args.heads,
        n_experts=args.experts, k=args.k, solve=args.solve, d_head=args.d_head,
        d_head_multiple=args.d_head_multiple,
    )
    print(format_match(report))
    if args.out:
        atomic_write_text(args.out, match_header(report, args.config) + dump_yaml(matched))
        print(f"saved {args.out}")
    if args.json:
        atomic_write_json(args.json, {"written_by": "attnlab match", **report.to_dict(),
                                      "config": str(source), "out": args.out})
        print(f"saved {args.json}")
    return 0


def print_records(records: list, json_path: str | None) -> int:
    from attnlab.results import format_table

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


def cmd_bench_attention(args: argparse.Namespace) -> int:
    import torch

    from attnlab.bench import attention
    from attnlab.results import scaling

    records = attention.run(
        mechanisms=args.mechanisms, seq_lens=args.seq_lens, causal=args.causal,
        pass_=args.pass_, heads=args.heads, d_head=args.d_head, batch=args.batch,
        dtype=getattr(torch, args.dtype), options=args.set, reps=args.reps,
        max_mem_gb=args.max_mem_gb, json_path=args.json, plot_path=args.plot,
        device=args.device,
    )
    print_records(records, args.json)
    print()
    print(scaling.format_summary(records))
    if args.plot:
        print(f"saved {args.plot}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from attnlab.hf import export_run

    print(f"saved {export_run(args.run, args.out, force=args.force)}")
    return 0


def cmd_visualize(args: argparse.Namespace) -> int:
    from attnlab.visualize import visualize

    text = args.text
    if args.text_file is not None:
        from attnlab.utils.readers import read_text

        text = read_text(args.text_file, "UTF-8 text (--text-file)")
    if not text.strip():
        raise ConfigError("the text is empty: give --text or a --text-file with text")
    summary = visualize(args.model, text, args.out, layer=args.layer, head=args.head,
                        teacher=args.teacher, max_tokens=args.max_tokens, device=args.device,
                        force=args.force)
    for part in ("sea", "switchhead"):
        if part in summary:
            print(f"saved {Path(args.out) / summary[part]['png']}")
    for row in summary.get("sea", {}).get("heads", []):
        print(f"layer {row['layer']} head {row['head']}: attended "
              f"{row['attended_fraction']:.1%} of cells, holding "
              f"{row['reference_weight_attended']:.1%} of the {summary['sea']['reference']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from attnlab.report import build_report, collect, compact_table
    from attnlab.utils.outputs import OutputFolder

    paths = [*args.paths, *(args.runs or [])]
    if not paths:
        raise ConfigError("attnlab report needs run folders, bench JSON files or a demo "
                          "folder")
    out = OutputFolder.of(args.out, "report", force=args.force, inputs=paths)
    out.check()
    inputs = collect(paths)
    results = build_report(inputs, out.claim(), title=args.title)
    print(compact_table(results))
    print(f"saved {Path(args.out) / 'report.md'}")
    return 0


def cmd_bench_layer(args: argparse.Namespace) -> int:
    from attnlab.bench import layer

    records = layer.run(preset=args.preset, batch=args.batch, passes=args.passes, reps=args.reps,
                        json_path=args.json, device=args.device)
    return print_records(records, args.json)


def cmd_bench_bias(args: argparse.Namespace) -> int:
    from attnlab.bench import bias

    records = bias.run(positions=args.positions, seq_lens=args.seq_lens, heads=args.heads,
                       d_head=args.d_head, batch=args.batch, reps=args.reps,
                       json_path=args.json)
    return print_records(records, args.json)


def cmd_bench_train(args: argparse.Namespace) -> int:
    from attnlab.bench import train_step

    configs = [resolve_config_path(c) for c in args.configs]
    records = train_step.run(configs, steps=args.steps, overrides=args.set,
                             json_path=args.json, device=args.device)
    return print_records(records, args.json)



def cmd_bench_hf(args: argparse.Namespace) -> int:
    from attnlab.bench import hf  # ImportError without transformers: one line

    records = hf.run(
        args.model, gguf_file=args.gguf_file,
        cores=[yaml_core(c) for c in args.core] or ["sea"], seq_lens=args.seq_lens,
        batch=args.batch, new_tokens=args.new_tokens, reps=args.reps, json_path=args.json,
        device=args.device,
    )
    print_records(records, args.json)
    print()
    print(hf.format_summary(records))
    return 0


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from attnlab.bench import serve  # ImportError without transformers
    from attnlab.results import serve as serve_report

    cores = [yaml_core(c) for c in args.core] or list(serve.DEFAULT_CORES)
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
        depths=tuple(args.depths), prompts=args.prompts,
        passkey_protocols=tuple(args.passkey_protocols), seed=args.seed)
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
                       real_model=args.real_model, force=args.force)
    print(compact_table(results))
    print(f"report: {Path(args.out) / 'report.md'}")
    return 0
