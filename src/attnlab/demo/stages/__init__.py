"""The stages of ``attnlab demo``, one module each, in the order they run: the probe
(:mod:`~attnlab.demo.stages.probe`), training (:mod:`~attnlab.demo.stages.train`),
distillation (:mod:`~attnlab.demo.stages.distill`), the length benchmark
(:mod:`~attnlab.demo.stages.bench`), the real-model stage
(:mod:`~attnlab.demo.stages.real_model`) and the report (:mod:`~attnlab.demo.stages.report`).
Each is a :class:`~attnlab.demo.stages.base.Stage`: its minimum, its plan, its work, and how it
resumes."""

from attnlab.demo.stages.base import Stage
from attnlab.demo.stages.bench import BenchStage
from attnlab.demo.stages.distill import DistillStage
from attnlab.demo.stages.probe import ProbeStage
from attnlab.demo.stages.real_model import RealModelStage
from attnlab.demo.stages.report import ReportStage
from attnlab.demo.stages.train import TrainStage

__all__ = ["BenchStage", "DistillStage", "ProbeStage", "RealModelStage", "ReportStage", "Stage",
           "TrainStage"]
