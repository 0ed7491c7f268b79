"""Equal-steps quality of the tiny models under each position scheme and score activation.

    python scripts/positions_grid.py OUT_DIR [--jobs 2] [--steps 600]

Trains dense H8, dense H2 and SwitchHead (``configs/tiny/``) with RoPE, Transformer-XL
(each config's own XL settings) and ALiBi positions (default slopes and a steeper set), each
with softmax and softmax1: 24 runs on the same tokens (same data, seed, steps and batch),
``--jobs`` at a time with one thread each. A finished run is kept, an unfinished one
resumed. Writes ``grid.json``, ``grid.md`` (held-out bits per character) and ``grid.png``
to OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MODELS = {"dense H8": "tiny/dense-h8", "dense H2": "tiny/dense-h2",
          "SwitchHead": "tiny/switchhead"}
# label -> (run-name part, positions override); None: the config's own XL settings. ALiBi's
# default slopes span 2^-1..2^-8 only with 8 heads; "ALiBi e=4" is a steeper set for few heads.
POSITIONS = {"RoPE": ("rope", "rope"), "XL": ("xl", None), "ALiBi": ("alibi", "alibi"),
             "ALiBi e=4": ("alibi-e4", "{name: alibi, exponent: 4}")}
ACTIVATIONS = ("softmax", "softmax1")


def run_name(model: str, label: str, activation: str) -> str:
    return f"{model.replace(' ', '-').lower()}-{POSITIONS[label][0]}-{activation}"


def runs(steps: int) -> dict[str, tuple[str, list[str]]]:
    """Run folder name -> (config, overrides)."""
    grid = {}
    for model, config in MODELS.items():
        for label, (_, positions) in POSITIONS.items():
            for activation in ACTIVATIONS:
                sets = [f"model.attention.core={{name: sdpa, activation: {activation}}}",
                        f"train.steps={steps}", "train.threads=1"]
                if positions is not None:
                    sets.append(f"model.attention.positions={positions}")
                grid[run_name(model, label, activation)] = (config, sets)
    return grid


def train(out: Path, name: str, config: str, sets: list[str]) -> None:
    folder = out / name
    if (folder / "summary.json").exists():
        return
    cmd = [sys.executable, "-m", "attnlab", "train", "--config", config, "--out", str(folder),
           "--quiet", *[arg for s in sets for arg in ("--set", s)]]
    if (folder / "config.yaml").exists():
        cmd.append("--resume")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(out / f"{name}.log", "w") as log:
        subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    print(f"finished {name}", flush=True)


def collect(out: Path, steps: int) -> list[dict]:
    rows = []
    for model in MODELS:
        for label in POSITIONS:
            for activation in ACTIVATIONS:
                name = run_name(model, label, activation)
                summary = json.loads((out / name / "summary.json").read_text())
                rows.append({"model": model, "positions": label, "activation": activation,
                             "run": name, "params": summary["params"],
                             "eval_bpc": summary["eval_bpc"], "steps": summary["steps"],
                             "tokens": summary["tokens"], "wall_s": summary["wall_s"]})
    return rows


def table(rows: list[dict]) -> str:
    cell = {(r["model"], r["positions"], r["activation"]): r["eval_bpc"] for r in rows}
    lines = ["| model | positions | softmax | softmax1 | softmax1 vs softmax |",
             "|---|---|---|---|---|"]
    for model in MODELS:
        for label in POSITIONS:
            a, b = cell[model, label, "softmax"], cell[model, label, "softmax1"]
            lines.append(f"| {model} | {label} | {a:.3f} | {b:.3f} | {100 * (b / a - 1):+.1f}% |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cell = {(r["model"], r["positions"], r["activation"]): r["eval_bpc"] for r in rows}
    groups = [(m, p) for m in MODELS for p in POSITIONS]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.38
    for shift, activation in zip((-width / 2, width / 2), ACTIVATIONS, strict=True):
        values = [cell[m, p, activation] for m, p in groups]
        ax.bar([i + shift for i in range(len(groups))], values, width, label=activation)
    ax.set_xticks(range(len(groups)), [f"{m}\n{p}" for m, p in groups], fontsize=8)
    low = min(r["eval_bpc"] for r in rows)
    ax.set_ylim(low - 0.1, max(r["eval_bpc"] for r in rows) + 0.05)
    ax.set_ylabel("held-out bits per character (lower is better)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(train, args.out, name, config, sets)
                       for name, (config, sets) in runs(args.steps).items()]:
            future.result()
    rows = collect(args.out, args.steps)
    tokens = rows[0]["tokens"]
    title = (f"tiny models, byte-level Shakespeare, {rows[0]['steps']} steps = {tokens:,} "
             "tokens each, one seed")
    (args.out / "grid.json").write_text(json.dumps(rows, indent=1))
    (args.out / "grid.md").write_text(f"{title}; held-out bits per character:\n\n"
                                      f"{table(rows)}\n")
    plot(rows, args.out / "grid.png", title)
    print(table(rows))


if __name__ == "__main__":
    main()
