"""The long-context frontier: quality kept against serving speed, per context length.

Quality comes from an ``attnlab long-context`` JSON (perplexity ratio and passkey accuracy of
each variant against the original model), speed from an ``attnlab bench serve`` JSON (decode
tokens/s and prefill time of each converted core against the original, measured side by
side). Only figures of one model are joined: a long-context result and the serve records
must carry the same model fingerprint (``model_sha256``, of the model's files); serve records
of another model, or with no fingerprint, are left out, with a warning in the report and in
the log. A variant is matched to its serve records by core, keys per row and page size (a SEA
student runs exactly as fast as the untrained SEA core of the same budget: same shapes, same
ops; distilled weights change no speed, the page size does).
Variants the serve run did not measure keep their quality figures and get no speed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.config import PartSpec
from attnlab.evals.variants import ORIGINAL
from attnlab.layers.registry import CORES, keys_per_row
from attnlab.report.frontier_plots import DECODE_BATCH, plot_budget, plot_frontier
from attnlab.report.inputs import model_name, model_of
from attnlab.results import Record
from attnlab.results.serve import summarize

logger = logging.getLogger(__name__)


def _speed_key(core: str | None, options: Mapping[str, Any]) -> tuple:
    """``(core, keys per row, page size)``: what sets a core's speed (None for the original;
    page None for a core without pages)."""
    if core is None:
        return None, None, None
    weights = CORES.trait(core, "weights_option")  # a file: it sets no speed
    spec = PartSpec(core, {k: v for k, v in options.items() if k != weights})
    return core, keys_per_row(spec), getattr(CORES.options(spec), "page", None)


def _speeds(serve: Sequence[Record], dtype: str, batch: int) -> dict[tuple, dict[int, dict]]:
    """``{speed key (_speed_key): {seq_len: {decode_speedup, prefill_speedup}}}``."""
    summary = summarize(serve)
    options = {r.name: r.shape.get("options", {}) for r in serve}
    out: dict[tuple, dict[int, dict]] = {}
    for name, by_dtype in summary.items():
        core = None if name == ORIGINAL else name.split("(")[0]
        if core is not None and core not in CORES.names():  # another engine (llama.cpp)
            continue
        cells = out.setdefault(_speed_key(core, options[name]), {})
        for b, by_len in by_dtype.get(dtype, {}).items():
            for seq_len, values in by_len.items():
                cell = cells.setdefault(int(seq_len), {})
                if int(b) == batch and "decode_speedup" in values:
                    cell["decode_speedup"] = values["decode_speedup"]
                if "prefill_speedup" in values:
                    cell["prefill_speedup"] = values["prefill_speedup"]
    return out


def _by_name_only(long_context: Mapping[str, Any], r: Record) -> bool:
    """Both written before fingerprints existed: the model's file name is all they say."""
    return (long_context.get("model_sha256") is None and r.shape.get("model_sha256") is None
            and r.shape.get("model") is not None
            and Path(long_context["model"]).name == Path(r.shape["model"]).name)


def _is_of(long_context: Mapping[str, Any], r: Record) -> bool:
    fingerprint = long_context.get("model_sha256")  # None in files written before it existed
    return (fingerprint is not None and r.shape.get("model_sha256") == fingerprint
            or _by_name_only(long_context, r))


def of_model(long_context: Mapping[str, Any], serve: Sequence[Record]) -> list[Record]:
    """The serve records of the long-context result's model: those with its fingerprint, or,
    when neither side has one (files written before fingerprints), with its file name."""
    return [r for r in serve if _is_of(long_context, r)]


def foreign_models(long_context: Mapping[str, Any], serve: Sequence[Record]) -> list[str]:
    """The models (Markdown names) of the serve records that are not the long-context
    result's (:func:`of_model`)."""
    return sorted({model_name(*model_of(r)) for r in serve if not _is_of(long_context, r)})


PROTOCOL_ORDER = ("dense-prefill", "sparse")
"""Passkey protocols, the one a point's ``passkey`` reports first (``attnlab long-context``'s
``--passkey-protocols``; files without the field ran ``sparse``)."""


def _passkey_cells(point: dict[str, Any], r: Mapping[str, Any]) -> None:
    """Add a passkey record's answers to its protocol's cell of ``point``."""
    cell = point.setdefault("passkey_by_protocol", {}).setdefault(
        r.get("protocol", "sparse"), {"correct": 0, "prompts": 0, "inconclusive": False})
    cell["correct"] += r["correct"]
    cell["prompts"] += r["prompts"]
    cell["inconclusive"] = cell["inconclusive"] or r["inconclusive"]


def _protocols(by_protocol: Mapping[str, Any]) -> list[str]:
    """The protocols of ``by_protocol``: those of :data:`PROTOCOL_ORDER` first, in its
    order, then any other by name."""
    return ([p for p in PROTOCOL_ORDER if p in by_protocol]
            + sorted(set(by_protocol) - set(PROTOCOL_ORDER)))


def frontier_points(long_context: Mapping[str, Any], serve: Sequence[Record], *,
                    dtype: str = "float32", decode_batch: int = DECODE_BATCH) -> list[dict]:
    """One point per (variant, length): ``ppl_ratio``, ``passkey`` (accuracy over every
    depth, under the first protocol of :data:`PROTOCOL_ORDER` measured: ``passkey_protocol``;
    every protocol's answers in ``passkey_by_protocol``), ``correct`` and
    ``passkey_prompts`` (its counts), ``passkey_ratio`` (to the original's under the same
    protocol), ``ppl_inconclusive`` / ``passkey_inconclusive`` (fewer tokens or prompts than
    a sure figure needs), and ``decode_speedup`` / ``prefill_speedup`` where measured.
    ``ValueError`` when a serve record is not of the long-context result's model
    (:func:`of_model`)."""
    if others := foreign_models(long_context, serve):
        raise ValueError(f"the serve records of {', '.join(others)} cannot give the speed of "
                         f"{model_name(long_context['model'], long_context.get('model_sha256'))}: "
                         "another model, or one not recorded")
    speeds = _speeds(serve, dtype, decode_batch)
    variants = {v["label"]: v for v in long_context["variants"]}
    points: dict[tuple[str, int], dict[str, Any]] = {}
    for r in long_context["records"]:
        v = variants[r["variant"]]
        core = None if v["core"] == ORIGINAL else v["core"]
        point = points.setdefault((r["variant"], r["seq_len"]), {
            "variant": r["variant"], "core": v["core"], "keys_per_row": v["keys_per_row"],
            "seq_len": r["seq_len"], "correct": 0, "passkey_prompts": 0,
            **speeds.get(_speed_key(core, v["options"]), {}).get(r["seq_len"], {})})
        if r["task"] == "perplexity":
            point["ppl_ratio"] = r.get("ppl_ratio")
            point["ppl_inconclusive"] = r.get("inconclusive", False)  # older files: none
        else:
            _passkey_cells(point, r)
    for point in points.values():
        by_protocol = point.get("passkey_by_protocol", {})
        if protocols := _protocols(by_protocol):
            protocol = protocols[0]
            cell = by_protocol[protocol]
            point.update(passkey_protocol=protocol, correct=cell["correct"],
                         passkey_prompts=cell["prompts"],
                         passkey_inconclusive=cell["inconclusive"],
                         passkey=cell["correct"] / cell["prompts"] if cell["prompts"] else None)
    originals = {p["seq_len"]: p for p in points.values() if p["core"] == ORIGINAL}
    for point in points.values():
        ref = originals.get(point["seq_len"], {}).get("passkey_by_protocol", {}).get(
            point.get("passkey_protocol"))
        if point.get("passkey") is not None and ref and ref["correct"]:
            point["passkey_ratio"] = point["passkey"] / (ref["correct"] / ref["prompts"])
    return list(points.values())


def _fmt(value: Any, spec: str, inconclusive: bool = False) -> str:
    return "-" if value is None else format(value, spec) + ("*" if inconclusive else "")


def _passkey_text(point: Mapping[str, Any]) -> str:
    """``"29/30*"``, or each protocol's (``"29/30* dense-prefill; 28/30* sparse"``)."""
    by_protocol = point.get("passkey_by_protocol", {})
    cells = [(protocol, by_protocol[protocol]) for protocol in _protocols(by_protocol)]
    texts = [f"{c['correct']}/{c['prompts']}" + ("*" if c["inconclusive"] else "")
             + (f" {protocol}" if len(cells) > 1 else "") for protocol, c in cells]
    return "; ".join(texts) or "-"


def frontier_table(points: Sequence[Mapping[str, Any]], decode_batch: int = DECODE_BATCH) -> str:
    """Markdown: per length and variant, quality against speed; * = inconclusive."""
    lines = ["| T | variant | keys/row | ppl x original | passkey | decode speedup "
             f"(batch {decode_batch}) | prefill speedup |", "|" + "---|" * 7]
    for p in sorted(points, key=lambda p: (p["seq_len"], p["core"] != ORIGINAL,
                                           p["keys_per_row"] or 0, p["variant"])):
        passkey = _passkey_text(p)
        lines.append(f"| {p['seq_len']} | {p['variant']} | {p['keys_per_row'] or 'all'} | "
                     f"{_fmt(p.get('ppl_ratio'), '.3f', p.get('ppl_inconclusive', False))} | "
                     f"{passkey} | {_fmt(p.get('decode_speedup'), '.2f')} | "
                     f"{_fmt(p.get('prefill_speedup'), '.2f')} |")
    if any(p.get("ppl_inconclusive") or any(
            c["inconclusive"] for c in p.get("passkey_by_protocol", {}).values())
           for p in points):  # any starred cell, under any protocol
        lines += ["", "\\* inconclusive: a perplexity of fewer tokens than asked, or passkey "
                      "cells of fewer prompts than `attnlab long-context` calls sure."]
    return "\n".join(lines)


def budget_curves(records: Sequence[Mapping[str, Any]], seq_len: int
                  ) -> dict[str, list[tuple[int, float, list[float] | None]]]:
    """``{name: [(budget, ppl_ratio, 95% interval or None), ...]}`` at ``seq_len``, sorted
    by budget; a variant's name is its label without the budget (``quest 256`` and ``quest
    1024`` make the ``quest`` curve, ``oracle p16 256`` the ``oracle p16`` one). Names
    measured at one budget only are left out: no curve."""
    curves: dict[str, list] = {}
    for r in records:
        if (r["task"] == "perplexity" and r["seq_len"] == seq_len and r.get("budget")
                and "ppl_ratio" in r):
            name = r["variant"].removesuffix(f" {r['budget']}")
            curves.setdefault(name, []).append(
                (r["budget"], r["ppl_ratio"], r.get("ppl_ratio_ci95")))
    return {name: sorted(pts, key=lambda p: p[0]) for name, pts in curves.items()
            if len({p[0] for p in pts}) > 1}


HOW_TO_READ = (
    "Each marker is one model at this context length, labelled with its keys per row per "
    "head (all = the original's dense attention): up is more quality kept in the top row "
    "(perplexity ratio: down is better) and right is faster. Speeds are the serve benchmark's "
    "ratios to the original measured side by side; quality is measured on the same documents "
    "and prompts for every model. The oracle computes every score (an upper bound of what a "
    "selector of that budget can keep, never a fast path). A passkey point is as sure as its "
    "prompt count in the table: below 20 prompts per depth it is inconclusive.")


def merged(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One result per model: the variants and records of several ``attnlab long-context``
    runs of the same model (e.g. perplexity and passkey run separately, or one length per
    run; each run carries its own original, which its ratios refer to: runs at the same
    length that measured the original alike, e.g. one budget per run, keep it once).
    ``ValueError`` when two runs give one label different specs or measure the same cell
    twice (the original with different figures included)."""
    by_model: dict[tuple[str, str | None], dict[str, Any]] = {}
    for result in results:
        fingerprint = result.get("model_sha256")  # None in files written before it existed
        into = by_model.setdefault((result["model"], fingerprint), {
            "model": result["model"], "model_sha256": fingerprint, "variants": [],
            "records": []})
        known = {v["label"]: v for v in into["variants"]}
        for v in result["variants"]:
            if v["label"] in known and known[v["label"]] != v:
                raise ValueError(f"variant {v['label']!r} of {result['model']} has different "
                                 "specs in two long-context runs; label them apart")
            if v["label"] not in known:
                into["variants"].append(v)
        def cell(r: Mapping[str, Any]) -> tuple:
            return r["variant"], r["task"], r["seq_len"], r.get("depth"), r.get("protocol")

        cells = {cell(r): r for r in into["records"]}
        for r in result["records"]:
            if r["variant"] == ORIGINAL and _same_figure(cells.get(cell(r)), r):
                continue  # each run measures its own original: the same figure, kept once
            if cell(r) in cells:
                raise ValueError(f"{r['variant']} {r['task']} at {r['seq_len']} tokens is in "
                                 "two long-context runs; give each cell once")
            into["records"].append(r)
    return list(by_model.values())


def _same_figure(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    return a is not None and all(a.get(k) == b.get(k) for k in ("ppl", "tokens", "correct",
                                                                  "prompts"))


def report_section(results: Sequence[Mapping[str, Any]], serve: Sequence[Record],
                   figure: Any, label: str) -> tuple[list[str], list[dict]]:
    """The report's frontier section (Markdown lines) and its points, for the long-context
    results (:func:`merged` per model); ``figure(key, file name, draw)`` draws a PNG (see
    ``build_report``) and records it under ``key``, returning its file name or None."""
    md: list[str] = ["## Long context: quality kept against serving speed", ""]
    all_points = []
    models = merged(results)
    for i, result in enumerate(models):
        mine = of_model(result, serve)
        points = frontier_points(result, mine)
        all_points += points
        md += [f"Model: {model_name(result['model'], result['model_sha256'])}.", "",
               frontier_table(points), ""]
        suffix = "" if len(models) == 1 else f"-{i + 1}"  # one set of files per model
        for seq_len in sorted({r["seq_len"] for r in result["records"]}):
            curves = budget_curves(result["records"], seq_len)
            if curves:
                name = figure(f"budget{suffix}-{seq_len}", f"budget{suffix}-{seq_len}.png",
                              lambda path, c=curves, t=seq_len: plot_budget(
                                  c, path, f"quality against budget at {t} tokens\n{label}"))
                if name:
                    md += [f"![quality against budget at {seq_len}]({name})", ""]
        if others := foreign_models(result, serve):
            warning = (f"the serve records of {', '.join(others)} are not this model's: "
                       "their speeds are left out of its frontier (quality and speed of "
                       "different models, or of a model not recorded, are never joined)")
            logger.warning("frontier of %s: %s", result["model"], warning)
            md += [f"**Warning**: {warning}.", ""]
        if not mine:
            md += ["(No `attnlab bench serve` JSON of this model given: no speed axis.)", ""]
            continue
        if any(_by_name_only(result, r) for r in mine):
            md += [f"Speeds joined by the model's file name only (`{Path(result['model']).name}`"
                   "): these files were written before attnlab recorded model fingerprints, "
                   "so the same name is all that ties the two measurements together.", ""]
        sha = result["model_sha256"]  # None in files written before fingerprints
        model = Path(result["model"]).name + (f" ({sha})" if sha else "")
        timed = {p["seq_len"] for p in points
                 if p.get("decode_speedup") is not None or p.get("prefill_speedup") is not None}
        for seq_len in sorted(timed):  # a length with no speed has no frontier to draw
            name = figure(f"frontier{suffix}-{seq_len}", f"frontier{suffix}-{seq_len}.png",
                          lambda path, t=seq_len, pts=points, m=model: plot_frontier(
                              pts, t, path, f"{m}: quality against speed at {t} tokens\n{label}"))
            if name:
                md += [f"![frontier at {seq_len}]({name})", ""]
        md += [HOW_TO_READ, ""]
    return md, all_points
