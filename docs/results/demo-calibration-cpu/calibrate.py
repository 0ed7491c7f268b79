"""How the demo's distillation minimum was calibrated (see attnlab/demo/plan.py, FULL).

The demo's teacher (dense-h8-rope, 343 steps as in the reference run), then SEA and Performer
distilled from it for 160 steps with a held-out evaluation (8192 tokens) every 10 steps.
Run from the repository root: .venv/bin/python docs/results/demo-calibration-cpu/calibrate.py
(about 15 minutes on 2 CPU cores); results in runs/demo-calibration/runs/<name>/metrics.jsonl.
"""

import dataclasses
import logging
from pathlib import Path

from attnlab.demo.budget import Budget
from attnlab.demo.plan import FULL
from attnlab.demo.run import Demo
from attnlab.distill import distill
from attnlab.train import train

logging.basicConfig(level=logging.INFO)
out = Path("runs/demo-calibration")
demo = Demo(out, FULL, Budget(float("inf")), "cpu", progress=True)
teacher = "dense-h8-rope"
train(demo.trained_config(teacher, ("train.steps=343",)), out / "runs" / teacher, progress=True)
for name in ("sea", "performer"):
    cfg = demo.distillation.config(name, 160)
    cfg = dataclasses.replace(cfg, distill=dataclasses.replace(
        cfg.distill, eval_every=10, eval_tokens=8192, ckpt_every=1000))
    distill(cfg, out / "runs" / name, resume=False, progress=True)
