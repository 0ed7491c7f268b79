"""Where a SEA forward spends its time: wall clock per phase of every SEA core in a model.

:func:`sea_breakdown` wraps the phases' functions with timers for the duration of a block
(every SEA core of every model is timed; nothing is changed outside the block):

* ``performer``: the estimator's Performer (full pass or decoding step);
* ``encoder``: the per-row encoder, scalers and decoder MLPs;
* ``cnn``: the CNN decoder;
* ``estimator other``: the rest of the estimator (position code, slicing, query skip);
* ``probs + ranking``: the estimate's softmax over each row's bins and its tie-break;
* ``selection + attention``: grouped top-k, decompression and the exact attention on the
  selected keys (one native kernel where it builds);
* ``average context``: the causal mean the output is mixed with;
* ``core other``: the rest of the core (key ranks, gates, mixing);
* ``sea core``: all of the above.

The caller adds the whole forward's time; what is not ``sea core`` is the rest of the model.
Timers add a few microseconds per call: compare phases, not sub-millisecond totals.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

from attnlab.layers.performer import PerformerCore
from attnlab.layers.sea import core as sea_core
from attnlab.layers.sea.cnn import BidirectionalCNN, CausalCNN
from attnlab.layers.sea.core import SEACore
from attnlab.layers.sea.estimator import SEAEstimator

LEAVES = ("performer", "encoder", "cnn", "estimator other", "probs + ranking",
          "selection + attention", "average context", "core other")


class Breakdown:
    """Seconds per phase, summed over calls (``seconds``), and calls per phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._open: set[str] = set()

    def timed(self, phase: str, fn: Callable) -> Callable:
        """``fn`` timed into ``phase`` (a call inside another of the same phase is not counted
        twice, e.g. the Performer's forward calling its extend)."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if phase in self._open:
                return fn(*args, **kwargs)
            self._open.add(phase)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start
                self.calls[phase] += 1
                self._open.discard(phase)

        return wrapper

    def phases(self) -> dict[str, float]:
        """Milliseconds of each leaf phase (the ``other`` ones by difference) and of the
        ``sea core``."""
        s = self.seconds
        estimator_parts = s["performer"] + s["encoder"] + s["cnn"]
        core_parts = (s["estimator"] + s["probs"] + s["ranking"] + s["selection + attention"]
                      + s["average context"])
        out = {
            "performer": s["performer"], "encoder": s["encoder"], "cnn": s["cnn"],
            "estimator other": s["estimator"] - estimator_parts,
            "probs + ranking": s["probs"] + s["ranking"],
            "selection + attention": s["selection + attention"],
            "average context": s["average context"],
            "core other": s["sea core"] - core_parts,
            "sea core": s["sea core"],
        }
        return {name: 1e3 * max(0.0, value) for name, value in out.items()}


@contextlib.contextmanager
def sea_breakdown() -> Iterator[Breakdown]:
    """Time the phases of every SEA core called inside the block (see the module doc)."""
    result = Breakdown()
    targets = [
        (PerformerCore, "forward", "performer"), (PerformerCore, "extend", "performer"),
        (SEAEstimator, "_features", "encoder"), (CausalCNN, "forward", "cnn"),
        (CausalCNN, "last_rows", "cnn"),
        (BidirectionalCNN, "forward", "cnn"), (SEAEstimator, "forward", "estimator"),
        (SEACore, "_estimate_probs", "probs"), (SEACore, "_ranking", "ranking"),
        (SEACore, "forward", "sea core"),
        (sea_core, "selected_attention", "selection + attention"),
        (sea_core, "causal_mean", "average context"),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in targets]
    try:
        for owner, name, phase in targets:
            original = owner.__dict__[name]
            setattr(owner, name, staticmethod(result.timed(phase, original.__func__))
                    if isinstance(original, staticmethod) else result.timed(phase, original))
        yield result
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
