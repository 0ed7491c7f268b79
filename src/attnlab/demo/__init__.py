"""``attnlab demo``: train, distil, benchmark and report in one command (see
:mod:`attnlab.demo.run`; what runs and how the budget becomes steps: :mod:`attnlab.demo.plan`).

``run_demo`` is imported on first use, so that the command line can read the demo's defaults
(:mod:`attnlab.demo.plan`) without loading torch."""

from typing import Any

__all__ = ["run_demo"]


def __getattr__(name: str) -> Any:
    if name == "run_demo":
        from attnlab.demo.run import run_demo

        return run_demo
    raise AttributeError(f"module 'attnlab.demo' has no attribute {name!r}")
