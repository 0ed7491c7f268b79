"""The demo's four models, N steps each, in arrangements JOBSxTHREADS (e.g. 1x2: one at a
time on two threads; 2x1: two at once on one thread each), one after the other:

    python docs/results/demo-parallel-cpu/measure.py 80 2x1 4x1 1x2 OUT_DIR

Prints and writes OUT_DIR/arrangements.json: each arrangement's wall seconds for all four runs,
each run's seconds and its mean training step."""

import json
import sys
import time
from pathlib import Path

from attnlab.demo.budget import Budget
from attnlab.demo.parallel import Run, train_runs
from attnlab.demo.plan import FULL, TRAINED
from attnlab.demo.run import Demo
from attnlab.utils.allocator import tune_cpu_allocator

SLOWEST_FIRST = ["dense-h8", "dense-h8-rope", "dense-h2", "switchhead"]


def main() -> None:
    steps, arrangements, out = int(sys.argv[1]), sys.argv[2:-1], Path(sys.argv[-1])
    assert sorted(SLOWEST_FIRST) == sorted(TRAINED)
    tune_cpu_allocator()
    demo = Demo(out, FULL, Budget(1e9), "cpu", progress=False, precision="bf16")
    results = []
    for arrangement in arrangements:
        jobs, threads = map(int, arrangement.split("x"))
        runs = [Run(name, demo.trained_config(name, (
            f"train.steps={steps}", "train.eval_every=0", "train.ckpt_every=0",
            "train.final_eval_tokens=2048", "train.warmup_steps=10", "train.log_every=10")),
            out / arrangement / name, resume=False) for name in SLOWEST_FIRST]
        start = time.perf_counter()
        seconds = train_runs(runs, jobs, threads, progress=False)
        step_ms = {r.name: 1e3 * json.loads((r.out_dir / "summary.json").read_text())[
            "train_wall_s"] / steps for r in runs}
        results.append({"arrangement": arrangement, "makespan": time.perf_counter() - start,
                        "runs": seconds, "step_ms": step_ms})
        print(json.dumps(results[-1]), flush=True)
    (out / "arrangements.json").write_text(json.dumps({"steps": steps, "runs_in_order": results},
                                                      indent=1))


if __name__ == "__main__":
    main()
