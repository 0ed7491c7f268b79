"""What ``attnlab demo`` trains, distils and benchmarks, and how its time budget becomes steps.

The models are the built-in tiny configs. ``dense-h8``, ``dense-h2`` and ``switchhead``
(``configs/tiny/``, parameter-matched to 888k, Transformer-XL positions with one memory chunk:
the SwitchHead paper's main setting) answer "SwitchHead or dense?". SEA and Performer cannot
take XL's score bias, so they are distilled from ``dense-h8-rope`` (``configs/tiny/cores/
sdpa.yaml``: the same 8 heads of 16 with RoPE, sequences of 256, no memory), trained on the
same tokens as the others; a student is only compared with that teacher. The length-scaling
benchmark builds every mechanism as an attention layer of the teacher's shape with RoPE
(SwitchHead: ``tiny/switchhead``'s projections with RoPE positions).

Budget: a probe times one training step of every trained model and of the students'
architectures side by side (:func:`attnlab.bench.train_step.run_configs`); the training
steps, equal for every model (same tokens), are what fits in ``train_share`` of the time left
after the probe and the reserves (benchmark and report), evaluations included. Distillation
steps are planned the same way from the time left once training is done.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

BUDGET_MINUTES = 13.0
"""The default budget: 15 minutes of ``make demo`` on 2 CPU cores, less set-up."""

TEACHER = "dense-h8-rope"
BASELINE = "dense-h8"
TRAINED: dict[str, str] = {
    "dense-h8": "tiny/dense-h8",
    "dense-h2": "tiny/dense-h2",
    "switchhead": "tiny/switchhead",
    TEACHER: "tiny/cores/sdpa",
}
"""Models trained from scratch on the same tokens: name -> built-in config. The first is the
baseline of every speed ratio."""

STUDENTS: dict[str, str] = {"sea": "tiny/cores/sea", "performer": "tiny/cores/performer"}
"""Students distilled from ``TEACHER``: name -> the built-in config whose attention core the
student gets (and whose training step the probe times)."""

_ROPE_SWITCHHEAD = ("model.attention.positions=rope", "model.memory_len=0")
LAYERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sdpa": ("tiny/cores/sdpa", ()),
    "eager": ("tiny/cores/sdpa", ("model.attention.core=eager",)),
    "switchhead": ("tiny/switchhead", _ROPE_SWITCHHEAD),
    "sea": ("tiny/cores/sea", ()),
    "performer": ("tiny/cores/performer", ()),
    "reformer": ("tiny/cores/reformer", ()),
}
"""Attention layers of the length-scaling benchmark: name -> (built-in config, overrides);
the first is the baseline."""

RUN_OVERHEAD_S = 3.0
"""Seconds a training or distillation run spends outside its steps and evaluations (data,
model, checkpoints), assumed by the planner."""

FORWARD_FRACTION = 1 / 3
"""An evaluation forward costs about this fraction of a training step on as many tokens."""

DISTILL_STEP_FACTOR = 1.8
"""A student's distillation step costs about this multiple of its plain training step (the
probed one): the teacher-target attention losses send gradients into q and k and are
recomputed in backward (measured 1.8x for SEA, 1.2x for Performer on 2 CPU cores)."""

SAFETY = 0.92
"""The planners fill this fraction of the seconds they are given (step times drift)."""


@dataclasses.dataclass(frozen=True)
class Scale:
    """Sizes of one demo mode.

    ``overrides`` apply to every trained and probed config; steps are clamped to
    ``[min_steps, max_steps]`` (``[min_distill_steps, max_distill_steps]``); each training run
    evaluates ``evals`` times on ``eval_tokens`` plus once on ``final_eval_tokens``;
    ``distill`` are overrides of the distillation config (``distill.KEY=VALUE``);
    ``seq_lens`` (``gpu_seq_lens`` on CUDA) are the benchmark's lengths, skipping on CPU a
    layer whose peak would pass ``cpu_max_mem_gb`` GiB (the machine is shared); ``reps`` the
    timed repetitions of every side-by-side measurement; ``train_share`` is the part of the time
    left after the probe and the reserves that training gets; the benchmark gets at most
    ``bench_share`` of the budget; ``report_reserve_s`` is kept for the report.
    """

    name: str
    overrides: tuple[str, ...] = ()
    min_steps: int = 30
    max_steps: int = 4000
    evals: int = 4
    eval_tokens: int = 16384
    final_eval_tokens: int = 65536
    distill: tuple[str, ...] = ()
    min_distill_steps: int = 10
    max_distill_steps: int = 2000
    seq_lens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
    gpu_seq_lens: tuple[int, ...] = (256, 1024, 4096, 8192, 16384, 32768)
    cpu_max_mem_gb: float = 4.0
    reps: int = 5
    train_share: float = 0.62
    bench_share: float = 0.12
    report_reserve_s: float = 20.0


FULL = Scale(
    "full",
    distill=("distill.eval_tokens=8192", "distill.final_eval_tokens=32768",
             "distill.long_context=1", "distill.eval_every=0"),
)
"""The default: fits ``--budget-minutes`` (13 by default) on 2 CPU cores, more steps and
longer sequences on a GPU."""

SMOKE = Scale(
    "smoke",
    overrides=("model.n_layers=1", "train.batch_size=2", "train.seq_len=32",
               "train.eval_batch_size=2"),
    min_steps=4, max_steps=4, evals=2, eval_tokens=128, final_eval_tokens=256,
    distill=("distill.batch_size=2", "distill.eval_batch_size=2", "distill.eval_tokens=128",
             "distill.final_eval_tokens=256", "distill.long_context=1", "distill.eval_every=0",
             "distill.query_skip=[1, 2]"),
    min_distill_steps=2, max_distill_steps=2, seq_lens=(32, 64), gpu_seq_lens=(32, 64),
    report_reserve_s=0.0,
)
"""Seconds-long run of every stage at toy sizes (one layer, batch 2 x 32), for tests."""

SCALES = {s.name: s for s in (FULL, SMOKE)}


def _clamp(value: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(value)))


def plan_train_steps(step_s: Mapping[str, float], seconds: float, scale: Scale,
                     tokens_per_step: int) -> int:
    """Steps, equal for every model, so that training all ``step_s`` models (seconds per
    step, side by side) with their evaluations fits in ``seconds``; clamped to the scale's
    range."""
    evals = (scale.evals * scale.eval_tokens + scale.final_eval_tokens) / tokens_per_step
    per_round = sum(step_s.values())
    usable = SAFETY * seconds - RUN_OVERHEAD_S * len(step_s)
    return _clamp(usable / per_round - evals * FORWARD_FRACTION, scale.min_steps,
                  scale.max_steps)


def plan_distill_steps(student_s: Mapping[str, float], teacher_s: float, seconds: float,
                       scale: Scale, tokens_per_step: int, eval_tokens: int,
                       final_eval_tokens: int, grid: Mapping[str, int]) -> int:
    """Distillation steps, equal for every student, fitting in ``seconds``: a step costs
    :data:`DISTILL_STEP_FACTOR` x the student's training step plus a teacher forward with its
    attention maps (half a teacher step); then teacher and student evaluate on
    ``final_eval_tokens`` and a student with ``grid[name]`` inference settings evaluates each
    on ``eval_tokens``."""
    per_round = sum(DISTILL_STEP_FACTOR * s + teacher_s / 2 for s in student_s.values())
    evals = sum(
        ((2 * final_eval_tokens + grid.get(name, 0) * eval_tokens) / tokens_per_step
         * FORWARD_FRACTION * max(s, teacher_s))
        for name, s in student_s.items()
    )
    usable = SAFETY * seconds - RUN_OVERHEAD_S * len(student_s) - evals
    return _clamp(usable / per_round, scale.min_distill_steps, scale.max_distill_steps)
