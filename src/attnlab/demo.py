"""``attnlab demo``: the main job on built-in data.

For now: train the dense baseline (``configs/tiny.yaml``) on the built-in Shakespeare corpus
and print its results table. A finished stage is reused when the demo is run again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from attnlab.train import load_run_config, train

logger = logging.getLogger(__name__)


def results_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of run summaries."""
    header = "| model | params | steps | tokens | eval bpc | tokens/s | peak RSS MB | wall s |"
    lines = [header, "|" + "---|" * 8]
    for row in rows:
        lines.append(
            f"| {row['name']} | {row['params'] / 1e6:.2f}M | {row['steps']} | {row['tokens']} | "
            f"{row['eval_bpc']:.3f} | {row['tokens_per_s']:.0f} | {row['peak_rss_mb']:.0f} | "
            f"{row['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def run_stage(name: str, config: Path, out: Path, quiet: bool) -> dict[str, Any]:
    run_dir = out / name
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        logger.info("%s: finished earlier, reusing %s", name, summary_path)
        return {"name": name, **json.loads(summary_path.read_text())}
    resume = (run_dir / "config.yaml").exists()
    cfg = load_run_config(run_dir / "config.yaml" if resume else config)
    return {"name": name, **train(cfg, run_dir, resume=resume, progress=not quiet)}


def run_demo(out: Path, quiet: bool = False) -> list[dict[str, Any]]:
    from attnlab.cli import builtin_config

    rows = [run_stage("dense", builtin_config("tiny"), out, quiet)]
    table = results_table(rows)
    (out / "results.md").write_text(table + "\n")
    print(table)
    return rows
