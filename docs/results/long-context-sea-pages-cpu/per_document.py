"""Perplexity ratios per document of a ``long-context`` perplexity file.

The records keep each window's NLL; this script rebuilds which document each window came
from (the file's own config: corpus, split, lengths, stride and the targets taken per
document) and prints, per variant, the ratio to the original on each document's windows,
with the 95% paired bootstrap interval over those windows. Usage (from the repository
root, after ``make setup``)::

    .venv/bin/python docs/results/long-context-sea-pages-cpu/per_document.py FILE.json [OUT.json]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

import attnlab.hf
from attnlab.data import DataConfig
from attnlab.data.load import open_source
from attnlab.evals.long_context import LongContextConfig
from attnlab.evals.perplexity import plan_windows, ratio_interval


def window_documents(result: dict) -> tuple[list[str], dict[int, list[int]]]:
    """The document names, and per length the document index of each scored window."""
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in result["config"].items()}
    cfg = LongContextConfig(**config)
    model = Path(result["model"])
    tokenizer = attnlab.hf.load_tokenizer(model.parent, gguf_file=model.name)
    names, lengths = [], []
    for name, text in open_source(DataConfig(corpus=cfg.corpus)).read_documents(cfg.split):
        names.append(name)
        lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    plans = {t: [i for i, _ in plan_windows(lengths, t, cfg.stride_tokens(t), cfg.ppl_tokens,
                                            cfg.ppl_document_tokens).windows]
             for t in cfg.lengths}
    return names, plans


def per_document(result: dict) -> list[dict]:
    """One row per (variant, length, document): the document's targets, ratio and interval."""
    names, plans = window_documents(result)
    records = [r for r in result["records"] if r["task"] == "perplexity"]
    original = {r["seq_len"]: r for r in records if r["variant"] == "original"}
    rows = []
    for r in records:
        ref, docs = original[r["seq_len"]], plans[r["seq_len"]]
        if len(docs) != len(r["window_nll"]):
            raise SystemExit(f"{r['variant']} @ {r['seq_len']}: {len(r['window_nll'])} windows,"
                             f" the config plans {len(docs)}")
        for d in sorted(set(docs)):
            at = [i for i, doc in enumerate(docs) if doc == d]
            nll = [r["window_nll"][i] for i in at]
            ref_nll = [ref["window_nll"][i] for i in at]
            tokens = [r["window_tokens"][i] for i in at]
            ratio = math.exp((sum(nll) - sum(ref_nll)) / sum(tokens))
            rows.append({"variant": r["variant"], "seq_len": r["seq_len"],
                         "document": names[d], "windows": len(at), "tokens": sum(tokens),
                         "ppl": math.exp(sum(nll) / sum(tokens)), "ppl_ratio": ratio,
                         "ppl_ratio_ci95": list(ratio_interval(nll, ref_nll, tokens))})
    return rows


def main() -> None:
    torch.set_num_threads(1)
    if len(sys.argv) > 2 and Path(sys.argv[2]).resolve() == Path(sys.argv[1]).resolve():
        raise SystemExit("per_document.py: OUT.json is the input file; give another path")
    result = json.loads(Path(sys.argv[1]).read_text())
    rows = per_document(result)
    documents = list(dict.fromkeys(r["document"] for r in rows))
    print("| T | variant | " + " | ".join(documents) + " |")
    print("|---" * (len(documents) + 2) + "|")
    for key in dict.fromkeys((r["seq_len"], r["variant"]) for r in rows):
        cells = {r["document"]: r for r in rows if (r["seq_len"], r["variant"]) == key}
        print(f"| {key[0]} | {key[1]} | " + " | ".join(
            "{:.3f} [{:.3f}, {:.3f}]".format(cells[d]["ppl_ratio"], *cells[d]["ppl_ratio_ci95"])
            if d in cells else "-" for d in documents) + " |")
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
