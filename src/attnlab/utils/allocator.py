"""Keep freed CPU memory in the process heap (glibc), as tcmalloc or jemalloc would.

By default glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh
``mmap`` and unmaps it on free, and trims the heap top past a threshold. PyTorch on CPU frees and
re-allocates many multi-MB tensors per step, so each of them page-faults again on first touch:
measured on the project's 2-core VM, ``x * 2`` on a 25 MB tensor took 8.8 ms into a fresh
tensor and 1.2 ms into a reused one. :func:`tune_cpu_allocator` switches ``mmap`` off for
``malloc`` and stops trimming, so freed blocks are reused.

The cost is that the process keeps its peak heap (RSS does not shrink after a large free).
The benchmark commands call it, for every mechanism alike; ``ATTNLAB_MALLOC_TUNING=0`` turns it
off. It is a no-op (returning False) where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 64 * 2**20))
_state = {"tuned": False}


def cpu_allocator_tuned() -> bool:
    """Whether :func:`tune_cpu_allocator` has been applied in this process."""
    return _state["tuned"]


def tune_cpu_allocator() -> bool:
    """Apply :data:`SETTINGS` with glibc's ``mallopt``; True when applied."""
    if os.environ.get("ATTNLAB_MALLOC_TUNING", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    applied = all(libc.mallopt(ctypes.c_int(p), ctypes.c_int(v)) == 1 for p, v in SETTINGS)
    logger.debug("glibc malloc tuning %s", "applied" if applied else "rejected")
    _state["tuned"] = _state["tuned"] or applied
    return applied
