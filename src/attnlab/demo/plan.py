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
architectures side by side (:func:`attnlab.bench.train_step.run_configs`); on a CPU a second
probe times the trained models in several processes at once, one thread each, and the models
train that way when it predicts the training sooner (:class:`Lanes`). Every stage has a
minimum below which its figure means little (:class:`Scale`; :data:`FULL` says where each
comes from). The training steps, equal for every model (same tokens), are what fits in
``train_share`` of the time left after the probe, the later stages' minimums and the reserves,
evaluations included, never below the minimum. Distillation steps are planned the same way
from the time left once training is done. The planner's predictions and the functions that
invert them (:func:`train_seconds`, :func:`distill_seconds`) let the demo re-plan after every
stage from the pace it measured (:mod:`attnlab.demo.stages`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from attnlab.demo.real_model import SMOLLM2, TINY, RealModel

BUDGET_MINUTES = 13.0
"""The default budget: 15 minutes of ``make demo`` on 2 CPU cores, less set-up."""

REAL_MODEL_MINUTES = 45.0
"""The budget from which ``--real-model auto`` adds the real-model stage
(:mod:`attnlab.demo.real_model`): the default budget's stages and the ~20 minutes reserved
for the stage (what it takes on the reference machine, with a margin)."""

REAL_MODEL_CHOICES = ("auto", "on", "off")

PRECISIONS = ("auto", "fp32", "bf16")
"""How the demo trains its models: ``auto`` is bf16 autocast where the device computes bf16
natively (:func:`attnlab.utils.precision.native_bf16`; on the reference CPU it makes a
training step 1.1-1.3x faster), else float32."""

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

DISTILL_STEP_FACTORS: dict[str, float] = {"sea": 1.5, "performer": 1.0}
"""What a student's distillation step costs, as a multiple of its probed plain training step
(besides the teacher's forward): the teacher-target attention losses send gradients into q
and k and are recomputed in backward. Solved from two demos of 2026-12-04 on the reference
machine (113 and 115 steps; the first in docs/results/demo-calibration-cpu/demo-distill-
factors.json): SEA 1.65 and 1.35, Performer 0.95 and 1.0 against the probe
(:class:`attnlab.demo.stages.probe.ProbeStage`); the first calibration's 1.8 for both left a
quarter of the distillation's time unused."""

SAFETY = 0.92
"""The planners fill this fraction of the seconds they are given (step times drift)."""


@dataclasses.dataclass(frozen=True)
class Scale:
    """Sizes of one demo mode, and the minimum each stage needs for its figure to mean
    something (:data:`FULL` says where each minimum comes from).

    ``overrides`` apply to every trained and probed config. Training runs at least
    ``min_train_tokens`` tokens per model and at most ``max_steps`` steps; each evaluates
    ``evals`` times on ``eval_tokens`` plus once on ``final_eval_tokens``. Students distil at
    least ``min_distill_steps`` and at most ``max_distill_steps`` steps, with ``distill``
    overrides of the distillation config (``distill.KEY=VALUE``), evaluating ``distill_evals``
    times on the way (0: only at the end); ``unconverged`` names the
    students known not to converge in steps the demo can afford (name -> the evidence): their
    figures are always reported inconclusive. The benchmark measures
    ``seq_lens`` (``gpu_seq_lens`` on CUDA) and reaches at least ``min_seq_len``
    (``gpu_min_seq_len``), skipping on CPU a layer whose peak would pass ``cpu_max_mem_gb`` GiB
    (the machine is shared); ``bench_reference_s`` is what the benchmark took up to
    ``min_seq_len`` on the reference machine (:data:`REFERENCE_PROBE_S`); ``reps`` are the
    timed repetitions of every side-by-side measurement, ``probe_reps`` those of the probe
    (the training steps are planned from it once, so it gets more), ``together_reps`` those
    of the second probe, which only chooses how many models train at once. ``train_share`` is the
    part of the time left after the probe, every stage's minimum and the benchmark's share
    that training gets beyond its minimum; the benchmark gets ``bench_share`` of the budget,
    or its minimum if that is more; ``report_reserve_s`` is kept for the report.
    ``real_model``: the real-model stage of this mode.
    """

    name: str
    overrides: tuple[str, ...] = ()
    min_train_tokens: int = 0
    max_steps: int = 4000
    evals: int = 4
    eval_tokens: int = 16384
    final_eval_tokens: int = 65536
    distill: tuple[str, ...] = ()
    distill_evals: int = 0
    min_distill_steps: int = 1
    max_distill_steps: int = 2000
    unconverged: Mapping[str, str] = dataclasses.field(default_factory=dict)
    seq_lens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
    gpu_seq_lens: tuple[int, ...] = (256, 1024, 4096, 8192, 16384, 32768)
    min_seq_len: int = 8192
    gpu_min_seq_len: int = 32768
    bench_reference_s: float = 0.0
    cpu_max_mem_gb: float = 4.0
    reps: int = 5
    probe_reps: int = 5
    together_reps: int = 5
    train_share: float = 0.95
    bench_share: float = 0.03
    report_reserve_s: float = 20.0
    real_model: RealModel = SMOLLM2

    def min_train_steps(self, tokens_per_step: int) -> int:
        return max(1, -(-self.min_train_tokens // tokens_per_step))

    def bench_min_len(self, cuda: bool) -> int:
        return self.gpu_min_seq_len if cuda else self.min_seq_len


FULL = Scale(
    "full",
    # dense-h8 alone, bf16 autocast, the demo's evaluation sizes (docs/results/demo-lr-cpu):
    # 2.656 / 2.632 bits per character after 680 steps at lr 5e-3 / 4e-3, 2.573 / 2.575 after
    # 800 at 4e-3 / 3e-3 (configs/tiny's 2e-3 gave 2.643 after 600 in float32); earlier, 430
    # steps: 2.887 / 2.941 / 3.04 at 4e-3 / 8e-3 / 1.6e-2. The tiny configs keep 2e-3 (600
    # steps); the demo's shorter runs learn fastest at 4e-3.
    overrides=("train.lr=4e-3",),
    # dense-h8's held-out bits per character: float32 at lr 2e-3 (the first published demo)
    # 3.85 at 174k tokens, 3.43 at 348k, 3.20 at 522k, 3.03 at 702k; bf16 at lr 4e-3
    # (docs/results/demo-cpu) 3.36 at 342k, 3.00 at 684k, 2.82 at 1.03M, 2.65 at 1.37M. Before
    # ~400k tokens one evaluation interval moves a model by more than the gaps between the
    # architectures at the end (0.05-0.22 bpc): the models are still leaving the bigram
    # regime, and a gap means little.
    min_train_tokens=400_000,
    distill=("distill.eval_tokens=8192", "distill.final_eval_tokens=32768",
             "distill.long_context=1"),
    # four evaluations during each distillation draw its convergence curve (SEA's Fig. 4b)
    distill_evals=4,
    # SEA and Performer distilled 160 steps from the demo's teacher, evaluated every 10 steps
    # (docs/results/demo-calibration-cpu): SEA's held-out perplexity is 23.4 at step 10, 10.6
    # at 40, 9.15 at 60, 8.98 at 80, 8.89 at 150: from 80 steps on it is within 1% of where it
    # ends. Performer's is 21.9 at step 40 and still falling at 160 (17.8).
    min_distill_steps=80,
    unconverged={"performer": "in a 160-step calibration run (docs/results/demo-calibration-"
                              "cpu) its perplexity still fell from 21.9 at step 40 to 17.8 at "
                              "160"},
    # the benchmark's CPU curves cross sdpa at 512 (SwitchHead), 1024 (Performer) and 4096
    # (SEA) in the reference run; 8192 is where SEA's lead is clear (0.45x); on a GPU sdpa
    # (flash) stays ahead longer, so 32768.
    min_seq_len=8192,
    bench_reference_s=24.0,
    # the training steps are planned once from the probe: with 5 steps, two probes of one
    # machine 13 minutes apart put dense-h8 at 217 and 259 ms (704 and 648 planned steps)
    probe_reps=11,
)
"""The default: fits ``--budget-minutes`` (13 by default) on 2 CPU cores, more steps and
longer sequences on a GPU."""

SMOKE = Scale(
    "smoke",
    overrides=("model.n_layers=1", "train.batch_size=2", "train.seq_len=32",
               "train.eval_batch_size=2"),
    min_train_tokens=4 * 64, max_steps=4, evals=2, eval_tokens=128, final_eval_tokens=256,
    distill=("distill.batch_size=2", "distill.eval_batch_size=2", "distill.eval_tokens=128",
             "distill.final_eval_tokens=256", "distill.long_context=1",
             "distill.query_skip=[1, 2]"),
    distill_evals=2,
    min_distill_steps=2, max_distill_steps=2, seq_lens=(32, 64), gpu_seq_lens=(32, 64),
    min_seq_len=64, gpu_min_seq_len=64, report_reserve_s=0.0, real_model=TINY,
)
"""Seconds-long run of every stage at toy sizes (one layer, batch 2 x 32), for tests."""

SCALES = {s.name: s for s in (FULL, SMOKE)}

SPEED_PROBE = "performer"
"""The probed architecture that says how fast this machine is in float32, as the benchmark
runs (students are probed in float32 whatever ``--precision``)."""

REFERENCE_PROBE_S = 0.170
"""The reference machine's probed training step of :data:`SPEED_PROBE` (2-core EPYC, fp32;
midpoint of median and fastest, as :class:`attnlab.demo.stages.probe.ProbeStage` reads it) in
the run whose benchmark took ``FULL.bench_reference_s`` (docs/results/demo-cpu)."""


def bench_min_seconds(scale: Scale, speed_step_s: float, cuda: bool) -> float:
    """Predicted seconds of the benchmark up to its minimum length: the reference machine's,
    scaled by how much slower this machine's probed :data:`SPEED_PROBE` step is (0 on CUDA,
    which has no reference: the benchmark still measures up to its minimum length)."""
    return 0.0 if cuda else scale.bench_reference_s * speed_step_s / REFERENCE_PROBE_S


def real_model_seconds(real: RealModel, speed_step_s: float) -> float:
    """Predicted seconds of the real-model stage: the reference machine's, scaled as
    :func:`bench_min_seconds` (on CUDA too: with no GPU reference, the CPU's is reserved)."""
    return real.reference_s * speed_step_s / REFERENCE_PROBE_S


def _clamp(value: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(value)))


def _train_evals(scale: Scale, tokens_per_step: int) -> float:
    """Evaluation forwards of one training run, in training steps."""
    return (scale.evals * scale.eval_tokens + scale.final_eval_tokens) / tokens_per_step \
        * FORWARD_FRACTION


@dataclasses.dataclass(frozen=True)
class Lanes:
    """How the trained models share the machine: up to ``jobs`` training runs at once, of
    which ``cores`` can run at full speed (more share the cores). The step times planned with
    are those measured in the same arrangement
    (:meth:`attnlab.demo.stages.probe.ProbeStage.choose_lanes`)."""

    jobs: int = 1
    cores: int = 1

    def schedule(self, work: Sequence[float]) -> list[tuple[float, float]]:
        """``(start, end)`` seconds of runs needing ``work`` seconds each at full speed,
        started in order, up to ``jobs`` at once, each running at ``min(1, cores / running)``
        of full speed."""
        left, spans, running, now = list(work), [(0.0, 0.0)] * len(work), [], 0.0
        waiting = list(range(len(work)))
        while waiting or running:
            while waiting and len(running) < self.jobs:
                running.append(waiting.pop(0))
                spans[running[-1]] = (now, now)
            rate = min(1.0, self.cores / len(running))
            first = min(running, key=lambda i: left[i])
            dt = left[first] / rate
            now += dt
            for i in running:
                left[i] -= dt * rate
            running.remove(first)
            spans[first] = (spans[first][0], now)
        return spans


def train_spans(step_s: Mapping[str, float], steps: int, scale: Scale, tokens_per_step: int,
                lanes: Lanes = Lanes(), done: Mapping[str, int] | None = None,
                ) -> dict[str, tuple[float, float]]:
    """``(start, end)`` seconds of each model's training to ``steps`` steps with its
    evaluations, in ``step_s``'s order (seconds per step) on ``lanes``; ``done``: steps some
    models have already trained."""
    done = done or {}
    evals = _train_evals(scale, tokens_per_step)
    work = [((steps - done.get(name, 0) + evals) * s + RUN_OVERHEAD_S) / SAFETY
            for name, s in step_s.items()]
    return dict(zip(step_s, lanes.schedule(work), strict=True))


def train_seconds(step_s: Mapping[str, float], steps: int, scale: Scale,
                  tokens_per_step: int, lanes: Lanes = Lanes(),
                  done: Mapping[str, int] | None = None) -> float:
    """Seconds until every model has trained ``steps`` steps (:func:`train_spans`)."""
    return max(end for _, end in train_spans(step_s, steps, scale, tokens_per_step,
                                             lanes, done).values())


def plan_train_steps(step_s: Mapping[str, float], seconds: float, scale: Scale,
                     tokens_per_step: int, floor: int = 1, lanes: Lanes = Lanes(),
                     done: Mapping[str, int] | None = None) -> int:
    """Steps, equal for every model, so that training all ``step_s`` models (seconds per
    step; ``done``: steps some have trained already) with their evaluations on ``lanes``
    fits in ``seconds``; clamped to ``[floor, max_steps]``."""
    lo, hi = 0, scale.max_steps  # the most steps that fit, by bisection (time grows with steps)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if train_seconds(step_s, mid, scale, tokens_per_step, lanes, done) <= seconds:
            lo = mid
        else:
            hi = mid - 1
    return _clamp(lo, floor, scale.max_steps)


@dataclasses.dataclass(frozen=True)
class DistillCost:
    """What a distillation step and the evaluations cost: ``student_s`` probed training step
    per student, ``teacher_s`` the teacher's; ``tokens_per_step``; teacher and student
    evaluate on ``final_eval_tokens``, a student with ``grid[name]`` inference settings
    evaluates each on ``eval_tokens`` and, with ``grid_reps``, times each and the teacher on
    one sequence of ``seq_len`` tokens; every student evaluates ``evals`` times on
    ``eval_tokens`` during its distillation (its convergence curve)."""

    student_s: Mapping[str, float]
    teacher_s: float
    tokens_per_step: int
    eval_tokens: int
    final_eval_tokens: int
    grid: Mapping[str, int]
    evals: int = 0
    grid_reps: int = 0
    seq_len: int = 0

    def per_step(self) -> float:
        """:data:`DISTILL_STEP_FACTORS` x each student's step plus a teacher forward with its
        attention maps (half a teacher step)."""
        return sum(DISTILL_STEP_FACTORS[name] * s + self.teacher_s / 2
                   for name, s in self.student_s.items())

    def fixed(self) -> float:
        """Seconds outside the steps: evaluations and run overheads."""
        evals = sum(
            ((2 * self.final_eval_tokens + (self.grid.get(name, 0) + self.evals)
              * self.eval_tokens + self._timed_tokens(name))
             / self.tokens_per_step * FORWARD_FRACTION * max(s, self.teacher_s))
            for name, s in self.student_s.items()
        )
        return evals + RUN_OVERHEAD_S * len(self.student_s)

    def _timed_tokens(self, name: str) -> int:
        """Tokens of the grid's cost measurement: every setting and the teacher, each timed
        ``grid_reps`` times after a warm-up and profiled once (counted as 3 forwards)."""
        if not (self.grid.get(name) and self.grid_reps):
            return 0
        return (self.grid[name] + 1) * (self.grid_reps + 4) * self.seq_len


def plan_distill_steps(cost: DistillCost, seconds: float, scale: Scale, floor: int = 1) -> int:
    """Distillation steps, equal for every student, fitting in ``seconds``; clamped to
    ``[floor, max_distill_steps]``."""
    usable = SAFETY * seconds - cost.fixed()
    return _clamp(usable / cost.per_step(), floor, scale.max_distill_steps)


def distill_seconds(cost: DistillCost, steps: int) -> float:
    """The seconds :func:`plan_distill_steps` would plan ``steps`` in (its inverse)."""
    return (steps * cost.per_step() + cost.fixed()) / SAFETY
