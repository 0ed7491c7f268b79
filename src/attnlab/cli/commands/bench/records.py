"""What the benchmarks print: their records as a table, and where the JSON went."""

from __future__ import annotations


def print_records(records: list, json_path: str | None) -> int:
    """Print ``records`` as a table (and ``saved PATH`` when saved); exit status 0."""
    from attnlab.results import format_table

    print(format_table(records))
    if json_path:
        print(f"saved {json_path}")
    return 0
