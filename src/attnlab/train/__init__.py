"""Training: run config, the loop, checkpoints and evaluation."""

from attnlab.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from attnlab.train.config import RunConfig, TrainConfig, load_run_config
from attnlab.train.loop import RankFailure, train
from attnlab.train.runner import RunDirError
from attnlab.train.steps import RunInterrupted, TrainingDiverged

__all__ = [
    "CheckpointError",
    "RankFailure",
    "RunConfig",
    "RunDirError",
    "RunInterrupted",
    "TrainConfig",
    "TrainingDiverged",
    "load_checkpoint",
    "load_run_config",
    "save_checkpoint",
    "train",
]
