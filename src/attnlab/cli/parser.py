"""The argument parser of ``attnlab``: every subcommand, option and help text."""

from __future__ import annotations

import argparse

from attnlab import __version__
from attnlab.cli import commands
from attnlab.cli.args import MIN_REPS, at_least, csv_list, layer_or_all, number
from attnlab.demo.plan import BUDGET_MINUTES as DEMO_BUDGET_MINUTES
from attnlab.demo.plan import PRECISIONS as DEMO_PRECISIONS
from attnlab.demo.plan import REAL_MODEL_CHOICES, REAL_MODEL_MINUTES

DESCRIPTION = (
    "Train, distil, evaluate, benchmark and report efficient attention: train, distill, eval, "
    "long-context, generate, macs, match, bench, export, visualize, report, demo."
)


def _add_model_args(p: argparse.ArgumentParser, required: bool) -> None:
    """``--model FOLDER`` (optional: a small random Llama) and ``--gguf-file NAME``."""
    p.add_argument("--model", required=required, default=None, metavar="FOLDER",
                   help="Hugging Face model folder"
                        + ("" if required else " (default: a small random Llama)"))
    p.add_argument("--gguf-file", default=None, metavar="NAME",
                   help="a GGUF file in --model to load, e.g. SmolLM2-135M-Instruct.Q4_1.gguf")


def _add_run_folder_args(p: argparse.ArgumentParser, out_help: str) -> None:
    """``--out``, ``--resume`` and ``--quiet`` of the commands that write a run folder."""
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_force(p)


def _add_force(p: argparse.ArgumentParser) -> None:
    """``--force`` of every command that writes (the write policy: attnlab.utils.outputs)."""
    p.add_argument("--force", action="store_true",
                   help="write even where the output holds files attnlab did not write there "
                        "(only this command's own files are replaced; inputs never are)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import this Python module (a name, or a .py file's path) "
                             "first, e.g. one that registers your own attention parts "
                             "(repeatable)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a language model from a YAML config")
    p.add_argument("--config", help="YAML file, or a built-in name such as 'tiny'")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-4 (repeatable)")
    _add_run_folder_args(p, "run folder to create (or resume)")
    p.set_defaults(func=commands.cmd_train)

    p = sub.add_parser("distill", help="distil a teacher into an efficient-attention student")
    p.add_argument("--teacher", default=None, metavar="SPEC",
                   help="attnlab run folder (a model trained with attnlab train), Hugging Face "
                        "model folder, or model name in the local Hugging Face cache")
    p.add_argument("--gguf-file", default=None, metavar="NAME",
                   help="load this GGUF file of the --teacher folder (dequantised)")
    p.add_argument("--student-attention", default=None, metavar="CORE",
                   help="student attention core: a name (sea, performer, reformer) or YAML "
                        "with options, e.g. '{name: sea, k: 16, predictor_length: 32}'")
    p.add_argument("--recipe", default=None, metavar="NAME",
                   help="whose defaults fill unset keys: attnlab (default) or sea-paper (SEA's "
                        "public code: lr 1e-5, pretrained weights at 1x, its baselines' "
                        "settings)")
    p.add_argument("--config", default=None, help="YAML with distill: and data: sections")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override, e.g. steps=200 (= distill.steps) or data.corpus=wiki")
    _add_run_folder_args(p, "the student's run folder")
    p.set_defaults(func=commands.cmd_distill)

    p = sub.add_parser(
        "distill-estimators", help="distil sea_pages' page estimators of a Hugging Face model, "
                                   "frozen and layer by layer",
        description="Each layer's page estimator learns the frozen model's own attention over "
                    "pages (no backward pass through the model); writes OUT/estimators."
                    "safetensors for '{name: sea_pages, estimators: OUT/estimators."
                    "safetensors}', with curves.json, loss.png and recipe.yaml.")
    _add_model_args(p, required=True)
    p.add_argument("--config", default=None, metavar="YAML",
                   help="recipe file or built-in name, e.g. smollm2/estimators (default: the "
                        "recipe's defaults)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe value, e.g. --set steps=50 (repeatable)")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_force(p)
    p.set_defaults(func=commands.cmd_distill_estimators)

    p = sub.add_parser("eval", help="evaluate a trained run on held-out text")
    p.add_argument("--run", required=True, help="run folder written by attnlab train")
    p.add_argument("--set", action="append", default=[], metavar="data.KEY=VALUE",
                   help="change the data, e.g. --set data.corpus=wiki (tokenizer stays the run's)")
    p.add_argument("--split", choices=["valid", "test"], default="test")
    p.add_argument("--seq-len", type=at_least(1), default=None,
                   help="tokens per evaluated window (default: the run's train.seq_len)")
    p.add_argument("--batch-size", type=at_least(1), default=8, help="windows per forward")
    p.add_argument("--max-tokens", type=at_least(1), default=None,
                   help="evaluate only the first N tokens of the split (default: all)")
    p.add_argument("--threads", type=at_least(1), default=None,
                   help="torch threads (default: torch's choice, like train.threads)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=commands.cmd_eval)

    p = sub.add_parser("generate", help="sample text from a trained run")
    p.add_argument("--run", required=True, help="run folder written by attnlab train")
    p.add_argument("--prompt", required=True, help="text the sample continues")
    p.add_argument("--max-new-tokens", type=at_least(1), default=200,
                   help="tokens to generate (with the KV cache)")
    p.add_argument("--temperature", type=number(float, 0.0), default=0.8,
                   help="softmax temperature, >= 0 (lower: likelier tokens; 0: greedy)")
    p.add_argument("--top-k", type=at_least(1), default=None,
                   help="sample among the k most likely tokens only (default: all)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the sampling")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.set_defaults(func=commands.cmd_generate)

    p = sub.add_parser("macs", help="attention MACs, activation memory and parameters")
    p.add_argument("--config", required=True, help="YAML file or built-in config name")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--convention", choices=["paper", "exact"], default="exact",
                   help="paper: the SwitchHead paper's formulas; exact: what attnlab executes")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=commands.cmd_macs)

    p = sub.add_parser(
        "match", help="a SwitchHead or MoA config with the parameters of a dense one",
        description="Solve d_head and/or d_ff so that a SwitchHead (or MoA) model has the "
                    "parameter count of a dense baseline (the SwitchHead paper's recipe), "
                    "print dense vs matched and write the config. The authors' head-count "
                    "rule: start at 2 heads, double to 4 if worse than the dense baseline.")
    p.add_argument("--config", required=True, help="the dense baseline: YAML file or built-in "
                                                    "config name")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of the dense config (repeatable)")
    p.add_argument("--projections", choices=["switchhead", "moa"], default="switchhead")
    p.add_argument("--heads", type=at_least(1), required=True, help="attention heads H")
    p.add_argument("--experts", type=at_least(1), required=True,
                   help="experts E (switchhead: per head; moa: in all)")
    p.add_argument("--k", type=at_least(1), default=None,
                   help="switchhead: experts chosen per head and token (default 2); moa: none")
    p.add_argument("--solve", choices=["both", "d_head", "d_ff"], default="both",
                   help="both (default, the paper's recipe): the largest d_head within the "
                        "dense parameters, then d_ff nudged; d_head: d_head alone; d_ff: d_ff "
                        "alone")
    p.add_argument("--d-head", type=at_least(1), default=None,
                   help="with --solve d_ff: the d_head to keep (default: the dense one)")
    p.add_argument("--d-head-multiple", type=at_least(1), default=None,
                   help="a solved d_head is a multiple of this (default: 4 with --solve both, "
                        "as the paper's, else 1)")
    p.add_argument("--out", default=None, metavar="NEW.yaml", help="write the matched config")
    p.add_argument("--json", default=None, metavar="FILE", help="save the report as JSON")
    _add_force(p)
    p.set_defaults(func=commands.cmd_match)

    bench = sub.add_parser("bench", help="side-by-side benchmarks (table + JSON)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    p = bench_sub.add_parser("expert-matmul", help="expert matmul vs naive vs dense-equal-MACs")
    p.add_argument("--tokens", type=at_least(1), default=4096, help="tokens per call")
    p.add_argument("--preset", default="wt103-47m")
    p.add_argument("--passes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    p.add_argument("--reps", type=at_least(MIN_REPS), default=10,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--naive-reps", type=at_least(MIN_REPS), default=MIN_REPS,
                   help=f"timed repetitions of the slow reference (>= {MIN_REPS})")
    # attnlab.bench.expert_matmul.FORCEABLE, spelled out: that module imports torch
    p.add_argument("--backends", nargs="+", choices=["grouped", "dense", "triton"], default=[],
                   help="also time these backends forced (auto's choice is 'fast')")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    _add_force(p)
    p.set_defaults(func=commands.cmd_bench_expert_matmul)

    p = bench_sub.add_parser("attention", help="attention cores (q, k, v -> o) vs seq_len")
    p.add_argument("--mechanisms", type=csv_list(str), default=None, metavar="A,B,...",
                   help="registered core names (default: those of sdpa,eager,sea,performer,"
                        "reformer that are registered); sdpa, the baseline, is always run")
    p.add_argument("--seq-lens", type=csv_list(int, 1), default=[1024, 2048, 4096, 8192, 16384],
                   metavar="T1,T2,...")
    causal = p.add_mutually_exclusive_group()
    causal.add_argument("--causal", dest="causal", action="store_true", default=True,
                        help="causal attention (default)")
    causal.add_argument("--bidirectional", dest="causal", action="store_false")
    p.add_argument("--pass", dest="pass_", choices=["fwd", "fwdbwd"], default="fwd")
    p.add_argument("--heads", type=at_least(1), default=12)
    p.add_argument("--d-head", type=at_least(1), default=64)
    p.add_argument("--batch", type=at_least(1), default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--set", action="append", default=[], metavar="MECH.OPTION=VALUE",
                   help="a core option, e.g. --set sea.k=32 (repeatable)")
    p.add_argument("--max-mem-gb", type=number(float, above=0.0), default=None,
                   help="skip a mechanism whose estimated peak exceeds this many GiB "
                        "(default: 40%% of the device's memory)")
    p.add_argument("--reps", type=at_least(MIN_REPS), default=10,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="time and memory vs seq_len (needs matplotlib: attnlab[plot])")
    _add_force(p)
    p.set_defaults(func=commands.cmd_bench_attention)

    p = bench_sub.add_parser("layer", help="one attention layer: dense-h10/h2, switchhead, moa")
    p.add_argument("--preset", default="wt103-47m")
    p.add_argument("--batch", type=at_least(1), default=1)
    p.add_argument("--passes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwdbwd"])
    p.add_argument("--reps", type=at_least(MIN_REPS), default=10,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    _add_force(p)
    p.set_defaults(func=commands.cmd_bench_layer)

    p = bench_sub.add_parser(
        "bias", help="a position bias (alibi, xl) through sdpa, eager and flex vs no bias",
        description="Causal attention forwards with a position scheme's score bias: SDPA "
                    "without a bias (the baseline), SDPA with the bias materialised, the "
                    "eager reference and the flex core (bias as a compiled score_mod).")
    p.add_argument("--positions", type=csv_list(str), default=["alibi", "xl"],
                   metavar="A,B", help="position schemes with a score bias")
    p.add_argument("--seq-lens", type=csv_list(int, 1), default=[1024, 2048, 4096, 8192],
                   metavar="T1,T2,...")
    p.add_argument("--heads", type=at_least(1), default=8)
    p.add_argument("--d-head", type=at_least(1), default=64)
    p.add_argument("--batch", type=at_least(1), default=1)
    p.add_argument("--reps", type=at_least(MIN_REPS), default=MIN_REPS,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    _add_force(p)
    p.set_defaults(func=commands.cmd_bench_bias)

    p = bench_sub.add_parser("train", help="whole training steps of several configs")
    p.add_argument("--configs", nargs="+", required=True,
                   help="YAML files or built-in names; the first is the baseline")
    p.add_argument("--steps", type=at_least(MIN_REPS), default=MIN_REPS,
                   help=f"timed steps per config (>= {MIN_REPS})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every config")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    _add_force(p)
    p.set_defaults(func=commands.cmd_bench_train)

    p = bench_sub.add_parser("hf", help="a Hugging Face model vs its attnlab-converted copy: "
                                        "forward latency and cached generation")
    _add_model_args(p, required=False)
    p.add_argument("--core", action="append", default=[], metavar="CORE",
                   help="converted core: a name or YAML with options, e.g. '{name: sea, k: 64, "
                        "predictor_length: 64}' (repeatable; default: sea)")
    p.add_argument("--seq-lens", type=csv_list(int, 1), default=[256, 512, 1024, 2048],
                   metavar="T1,T2,...")
    p.add_argument("--batch", type=at_least(1), default=1)
    p.add_argument("--new-tokens", type=at_least(1), default=32,
                   help="tokens generated per prompt")
    p.add_argument("--reps", type=at_least(MIN_REPS), default=MIN_REPS,
                   help=f"timed repetitions per candidate (>= {MIN_REPS})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save records as JSON")
    _add_force(p)
    p.set_defaults(func=commands.cmd_bench_hf)

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
    p.add_argument("--seq-lens", type=csv_list(int, 1), default=[2048, 4096, 8192],
                   metavar="T1,T2,...", help="context lengths (decode: keys the last timed "
                   "step attends to; at most the model's max_position_embeddings)")
    p.add_argument("--batches", type=csv_list(int, 1), default=[1, 4, 8], metavar="B1,B2,...",
                   help="decode batch sizes (rows beyond the first are left-padded)")
    p.add_argument("--prefill-batches", type=csv_list(int, 1), default=[1], metavar="B1,B2,...",
                   help="prefill batch sizes; '' (empty) for no prefill")
    p.add_argument("--dtypes", type=csv_list(str), default=["float32"], metavar="D1,D2,...",
                   help="float32, bfloat16 (float16 on cuda only)")
    p.add_argument("--steps", type=at_least(1), default=8,
                   help="timed decode steps per model in each round")
    p.add_argument("--warmup", type=at_least(1), default=2,
                   help="untimed decode steps first (the first builds the cores' state)")
    p.add_argument("--reps", type=at_least(1), default=3,
                   help="rounds of alternation (prefill: timed prefills per model)")
    p.add_argument("--threads", type=at_least(1), default=None,
                   help="torch threads during the run, at most the machine's cores (default: "
                        "unchanged)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="save records and the summary as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="decode tokens/s vs context length (needs matplotlib: attnlab[plot])")
    _add_force(p)
    p.set_defaults(func=commands.cmd_bench_serve)

    p = sub.add_parser(
        "long-context", help="perplexity and passkey retrieval at long contexts of a Hugging "
                             "Face model and its variants (window, oracle, SEA students)",
        description="Sliding-window perplexity on whole held-out documents and passkey "
                    "retrieval (greedy) at each length, for the original model and each "
                    "--variant, side by side on the same tokens and prompts.")
    _add_model_args(p, required=True)
    p.add_argument("--variant", action="append", default=[], metavar="YAML",
                   help="'original', a core with options ('{name: window, sinks: 4, window: "
                        "252}', '{name: quest, budget: 256}', '{name: oracle, k: 256}', "
                        "'{name: sea_pages, budget: 256, estimators: smollm2-135m}') or a "
                        "distilled student ('{name: sea, student: OUT/student, k: 256}'); "
                        "repeatable (default: original)")
    p.add_argument("--tasks", type=csv_list(str), default=["perplexity", "passkey"],
                   metavar="T1,T2", help="perplexity, passkey")
    p.add_argument("--lengths", type=csv_list(int, 2), default=[2048, 4096, 8192],
                   metavar="T1,T2,...")
    p.add_argument("--corpus", default="shakespeare", choices=["shakespeare", "wiki", "pystdlib"],
                   help="built-in corpus of the perplexity documents")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--stride", type=float, default=0.5,
                   help="sliding-window stride as a fraction of the length")
    p.add_argument("--ppl-tokens", type=at_least(1), default=16384,
                   help="perplexity targets per length")
    p.add_argument("--depths", type=csv_list(float), default=[0.1, 0.5, 0.9], metavar="D1,D2,...",
                   help="passkey depths (fractions of the filler before the key)")
    p.add_argument("--prompts", type=at_least(1), default=20,
                   help="passkey prompts per length x depth")
    p.add_argument("--passkey-protocols", type=csv_list(str), default=["sparse"],
                   metavar="P1,P2", help="sparse (the variant reads the whole prompt) and/or "
                                         "dense-prefill (the original prefills up to the "
                                         "question; each variant decodes the rest)")
    p.add_argument("--seed", type=int, default=0, help="passkey keys")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, metavar="FILE", help="save the records as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_force(p)
    p.set_defaults(func=commands.cmd_long_context)

    p = sub.add_parser(
        "export", help="a finished run as a Hugging Face folder (AutoModelForCausalLM)",
        description="Write the run's newest checkpoint, tokenizer and a generation config as "
                    "a Hugging Face folder (model_type attnlab, safetensors). Load it with "
                    "AutoModelForCausalLM.from_pretrained(OUT) after `import attnlab.hf`.")
    p.add_argument("--run", required=True, metavar="DIR",
                   help="a finished attnlab train (or distill) run folder")
    p.add_argument("--out", required=True, metavar="HF_DIR", help="the folder to write")
    _add_force(p)
    p.set_defaults(func=commands.cmd_export)

    p = sub.add_parser(
        "visualize", help="what a model's SEA or SwitchHead attention does on a text (PNG)",
        description="SEA layers: the teacher's attention, the Performer's implicit attention, "
                    "the CNN's compressed estimate and the attended keys side by side (SEA's "
                    "Fig. 3); SwitchHead layers: each token's value and output experts per "
                    "head and the experts' load. Writes OUT/sea-attention.png, "
                    "OUT/switchhead-experts.png and OUT/visualize.json.")
    p.add_argument("model", metavar="PATH",
                   help="an attnlab run folder (train or distill), a distillation folder of a "
                        "Hugging Face teacher, or a Hugging Face student folder")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", default=None, help="the text to run the model on")
    text.add_argument("--text-file", default=None, metavar="FILE", help="read the text from FILE")
    p.add_argument("--layer", type=layer_or_all, default=0, metavar="N|all",
                   help="layer to draw (negative: from the end) or all, tiled (default 0)")
    p.add_argument("--head", type=layer_or_all, default=None, metavar="N|all",
                   help="head to draw or all, tiled (default all)")
    p.add_argument("--teacher", default=None, metavar="PATH",
                   help="the teacher to compare SEA with (default: the one the distillation "
                        "recorded; none known: the model's own exact attention)")
    p.add_argument("--max-tokens", type=at_least(1), default=96,
                   help="tokens of the text to use (at most 1024; token labels up to 40)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--device", default="cpu")
    _add_force(p)
    p.set_defaults(func=commands.cmd_visualize)

    p = sub.add_parser("report", help="the report of runs and benchmarks: Markdown, PNG, JSON")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="run folders (attnlab train / distill), bench JSON files, or folders "
                        "holding them (e.g. a demo's output)")
    p.add_argument("--runs", nargs="+", default=None, metavar="DIR",
                   help="more run folders (same as giving them as PATHs)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="writes DIR/report.md, DIR/*.png (with matplotlib), DIR/results.json")
    p.add_argument("--title", default="attnlab report")
    _add_force(p)
    p.set_defaults(func=commands.cmd_report)

    p = sub.add_parser("demo", help="the main job: train, distil, benchmark and report, "
                                    "within a time budget")
    p.add_argument("--out", default="runs/demo", help="output folder (re-run to resume)")
    p.add_argument("--budget-minutes", type=number(float, above=0.0),
                   default=DEMO_BUDGET_MINUTES,
                   help="wall-clock budget of the stages (steps are scaled to fit)")
    p.add_argument("--strict-budget", action="store_true",
                   help="never go over the budget: a stage it cuts below its minimum is "
                        "marked inconclusive (default: keep every stage at its minimum and go "
                        "over the budget, saying by how much)")
    p.add_argument("--precision", choices=DEMO_PRECISIONS, default="auto",
                   help="how the models train: auto = bf16 autocast where the device computes "
                        "bf16 natively, else fp32 (distillation and benchmark: fp32)")
    p.add_argument("--train-jobs", type=at_least(1), default=None, metavar="N",
                   help="models trained at once, each in its own process (default: on a CPU "
                        "one per thread, one thread each; on a GPU 1)")
    p.add_argument("--real-model", choices=REAL_MODEL_CHOICES, default="auto",
                   help="the real-model stage: SEA's page selection (sea_pages, the shipped "
                        "SmolLM2-135M estimators) against the original, Quest and a sliding "
                        "window at one key budget, quality and serving speed at long "
                        f"context (~20 min on 2 cores); auto = on from --budget-minutes "
                        f"{REAL_MODEL_MINUTES:.0f}")
    p.add_argument("--smoke", action="store_true",
                   help="toy sizes, every stage in seconds (for tests)")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_force(p)
    p.set_defaults(func=commands.cmd_demo)
    return parser
