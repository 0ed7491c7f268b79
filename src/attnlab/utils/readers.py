"""Reading the small text, JSON and JSON-lines files the commands take from users' folders
(summaries, metrics, bench results, checkpoint metadata, text to look at).

Each failure is a ``ValueError`` naming the file (and line), what is wrong and what was
expected, never a bare parser message: ``runs/x/metrics.jsonl:12: not valid JSON (Expecting
value, column 20); expected one JSON object per line``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def decode_utf8(data: bytes, name: str | os.PathLike[str], expected: str, offset: int = 0
                ) -> str:
    """``data`` (the bytes of file ``name`` from byte ``offset`` on) as UTF-8 text;
    ``ValueError`` with the file offset of the first byte that is not UTF-8 (nothing is
    replaced silently). ``expected``: what the file should hold."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{name}: not UTF-8 text (invalid byte at offset "
                         f"{offset + err.start}); expected {expected}") from err


def read_text(path: str | os.PathLike[str], expected: str) -> str:
    """The UTF-8 text of ``path`` (:func:`decode_utf8`)."""
    return decode_utf8(Path(path).read_bytes(), path, expected)


def parse_json(path: str | os.PathLike[str], expected: str, hint: str = "") -> Any:
    """The JSON value in ``path``; ``ValueError`` for a file that is not UTF-8 or not JSON.
    ``expected``: what it should hold; ``hint``: what to do about a bad one (``"; ..."``)."""
    text = read_text(path, expected)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column "
                         f"{err.colno}); expected {expected}{hint}") from err


def read_json(path: str | os.PathLike[str], expected: str, hint: str = "") -> dict[str, Any]:
    """The JSON object in ``path`` (:func:`parse_json`; also ``ValueError`` for another
    JSON value)."""
    return _object(parse_json(path, expected, hint), str(path), expected, hint)


def read_jsonl(path: str | os.PathLike[str], expected: str, hint: str = "",
               keys: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one a line (blank lines skipped), each holding ``keys``;
    ``ValueError`` naming the line of the first bad one. A last line without its line break
    that does not parse is a record still being written (or cut off by a crash): it is left
    out, as its writer would redo it."""
    text = read_text(path, expected)
    lines = text.splitlines()
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            if lineno == len(lines) and not text.endswith("\n"):
                break
            raise ValueError(f"{where}: not valid JSON ({err.msg}, column {err.colno}); "
                             f"expected {expected}{hint}") from err
        record = _object(value, where, expected, hint)
        if missing := [key for key in keys if key not in record]:
            raise ValueError(f"{where}: a record without {', '.join(map(repr, missing))}; "
                             f"expected {expected}{hint}")
        records.append(record)
    return records


JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


def _object(value: Any, where: str, expected: str, hint: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {JSON_TYPES[type(value)]}, not a JSON object; expected "
                         f"{expected}{hint}")
    return value
