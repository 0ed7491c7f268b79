"""``attnlab demo``: train, distil, benchmark and report in one command (see
:mod:`attnlab.demo.run`; what runs and how the budget becomes steps: :mod:`attnlab.demo.plan`)."""

from attnlab.demo.run import run_demo

__all__ = ["run_demo"]
