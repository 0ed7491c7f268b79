"""Stage 4, the length benchmark: ``bench-attention-layers.json``, every attention layer of
:data:`~attnlab.demo.plan.LAYERS` against sequence length (bench JSON)."""

from __future__ import annotations

from attnlab.bench.attention import run_layers
from attnlab.config import builtin_config
from attnlab.demo.plan import LAYERS, SPEED_PROBE, bench_min_seconds
from attnlab.demo.stages.base import Stage
from attnlab.train import load_run_config


class BenchStage(Stage):
    """Attention layers against length: up to the minimum length whatever the time (unless
    ``strict_budget``), longer within the benchmark's share of the budget (:meth:`seconds`)."""

    name = "bench"

    def minimum_s(self) -> float:
        """The benchmark up to its minimum length (:func:`~attnlab.demo.plan.bench_min_seconds`)."""
        demo = self.demo
        return bench_min_seconds(demo.scale, demo.probe.step_s[SPEED_PROBE], demo.cuda)

    def seconds(self) -> float:
        """Its time: the benchmark's share of the budget, or what the time left after the
        real-model stage and the report allows if that is less."""
        demo, s, budget = self.demo, self.demo.scale, self.demo.budget
        return min(s.bench_share * budget.budget_s,
                   budget.remaining() - demo.report.minimum_s()
                   - budget.pace() * demo.real_model.minimum_s())

    def run(self, part: str) -> None:
        """The benchmark, in :meth:`seconds` (reused when an earlier invocation finished it)."""
        demo, s, cuda = self.demo, self.demo.scale, self.demo.cuda
        path = demo.out / "bench-attention-layers.json"
        if self.reused("benchmark", path):
            return
        models = {name: load_run_config(builtin_config(src), overrides).model
                  for name, (src, overrides) in LAYERS.items()}
        run_layers(models, s.gpu_seq_lens if cuda else s.seq_lens, reps=s.reps,
                   max_mem_gb=None if cuda else s.cpu_max_mem_gb,
                   time_budget_s=max(self.seconds(), 1.0),
                   min_seq_len=0 if demo.budget.strict else s.bench_min_len(cuda),
                   json_path=path, device=demo.device)
