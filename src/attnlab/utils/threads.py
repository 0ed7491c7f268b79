"""Running a block of tiny tensor ops on one thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

FEW_ROWS = 64
"""Query rows (batch x new tokens) up to which a core's call runs on one thread: a decoding
step's ops are tiny, and a parallel region per op costs more than it saves, most of all on a
busy machine (see :func:`single_threaded`)."""


@contextlib.contextmanager
def single_threaded(enabled: bool = True) -> Iterator[None]:
    """Run the block's torch ops (and attnlab's native kernels) on one intra-op thread.

    For ops on a few rows (a decoding step) a parallel region costs more than it saves; and
    when another process holds a core, each region waits for a descheduled worker: measured on
    the 2-core machine, a LayerNorm of ``[8, 9, 1, 128]`` took 8 ms with 2 threads against
    12 us with one. The setting is process-wide while the block runs (threads that run torch
    concurrently see it too) and is restored afterwards.
    """
    threads = torch.get_num_threads()
    if not enabled or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
