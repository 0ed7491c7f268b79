"""Training: run config, the loop, checkpoints and evaluation."""

from attnlab.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from attnlab.train.config import RunConfig, TrainConfig, load_run_config
from attnlab.train.loop import RankFailure, RunDirError, TrainingDiverged, train

__all__ = [
    "CheckpointError",
    "RankFailure",
    "RunConfig",
    "RunDirError",
    "TrainConfig",
    "TrainingDiverged",
    "load_checkpoint",
    "load_run_config",
    "save_checkpoint",
    "train",
]
