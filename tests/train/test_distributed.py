"""Multi-process training under torchrun: 2 CPU processes (gloo) against 1.

The launched jobs use a 2-layer d_model-32 model, 32-token windows and a few steps, so each
``torchrun`` costs mostly its start-up (two Python + torch imports on two cores).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from attnlab.config import ConfigError, from_dict
from attnlab.models import DecoderLM, ModelConfig
from attnlab.train import load_checkpoint, load_run_config, train
from attnlab.train.checkpoint import is_sharded, latest_checkpoint
from attnlab.train.distributed import Dist, unused_parameters, wrap_model
from attnlab.train.run import load_run
from tests.helpers import dump_config

# 1 process x batch B and 2 processes x B/2 do the same arithmetic in another order: the
# matmuls run on half as many rows (other BLAS blocking), each rank averages its own rows'
# losses, and gloo sums the two ranks' gradients. Each reordering changes a float32 result
# by ~1e-7 relative, and Adam can amplify such differences over steps (it divides small
# gradients by their own small RMS). Measured after 10 steps: at most 5e-8 relative, on the
# losses and on the evaluations. 1e-5 leaves a 200x margin for other BLAS builds, yet is
# ~1000x below what a real mismatch does: another data order, or a learning rate 10% off,
# moves the logged losses by ~1e-2 relative (measured).
RTOL = 1e-5
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _one_thread():
    """Train in this process on one thread, like each torchrun worker (OMP_NUM_THREADS=1):
    two busy threads here would also starve the two workers of the two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _torchrun_cmd(out: Path, *args: str, program: tuple[str, ...] = ("-m", "attnlab")
                  ) -> list[str]:
    """``attnlab train`` (or ``program``, taking its arguments) on 2 processes.

    ``--standalone``: the launcher binds a free port itself (a port picked here and released
    could be taken by another process before torchrun binds it).
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", *program, "train", "--out", str(out), "--quiet", *args]


def _torchrun(out: Path, *args: str) -> dict:
    """Run ``attnlab train`` on 2 processes; returns the run's summary."""
    proc = subprocess.run(_torchrun_cmd(out, *args), env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-8000:]  # the workers' errors, torchrun's report
    return json.loads((out / "summary.json").read_text())


def _losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def _assert_same_run(a: Path, b: Path) -> None:
    assert _losses(b) == pytest.approx(_losses(a), rel=RTOL)
    sa, sb = (json.loads((run / "summary.json").read_text()) for run in (a, b))
    assert sb["steps"] == sa["steps"] and sb["tokens"] == sa["tokens"]
    assert sb["eval_loss"] == pytest.approx(sa["eval_loss"], rel=RTOL)
    assert sb["eval_tokens"] == sa["eval_tokens"]


def _resume(run: Path, steps: int) -> dict:
    """Continue ``run`` on this one process up to ``steps``."""
    cfg = load_run_config(run / "config.yaml", [f"train.steps={steps}"])
    return train(cfg, run, resume=True, progress=False)


def _two_processes_match_one(cfg: dict, tmp_path: Path) -> tuple[Path, Path]:
    """Train ``cfg`` on 1 process and on 2; same global batch and schedule, same losses."""
    one, two = tmp_path / "one", tmp_path / "two"
    train(load_run_config(base=cfg), one, progress=False)
    summary = _torchrun(two, "--config", dump_config(cfg, tmp_path / "cfg.yaml"))
    assert summary["processes"] == 2 and summary["distributed"] == cfg["train"]["distributed"]
    _assert_same_run(one, two)
    return one, two


def test_switchhead_on_two_ddp_processes_matches_one_and_resumes_on_one(
    tiny_run_config, tmp_path
):
    """One expert of 4 per token (so experts get no tokens on a rank), Transformer-XL memory
    (lanes split between ranks, gathered into the checkpoint) and gradient accumulation (no
    gradient sync on the first micro-step); the checkpoint of 2 processes then continues on
    1 exactly as the 1-process run's own does."""
    cfg = tiny_run_config(steps=8, eval_every=4, ckpt_every=4, log_every=2, grad_accum=2,
                          distributed="ddp")
    cfg["model"]["attention"].update(
        projections={"name": "switchhead", "n_experts": 4, "k": 1}, positions="xl"
    )
    cfg["model"]["memory_len"] = 32
    one, two = _two_processes_match_one(cfg, tmp_path)
    for run in (one, two):
        _resume(run, steps=10)
    _assert_same_run(one, two)


def test_dense_on_two_fsdp_processes_matches_one_and_resumes_on_two_or_one(
    tiny_run_config, tmp_path
):
    """FSDP writes sharded checkpoints (on 1 process too); they load on any process count."""
    cfg = tiny_run_config(steps=8, eval_every=4, ckpt_every=4, log_every=2,
                          distributed="fsdp")
    one, two = _two_processes_match_one(cfg, tmp_path)
    assert is_sharded(latest_checkpoint(two)) and is_sharded(latest_checkpoint(one))
    two_on_one = tmp_path / "two-on-one"
    shutil.copytree(two, two_on_one)
    _resume(one, steps=10)
    _resume(two_on_one, steps=10)  # 2 ranks' shards onto 1 process
    _torchrun(two, "--resume", "--set", "train.steps=10")  # and onto 2 again
    _assert_same_run(one, two_on_one)
    _assert_same_run(one, two)
    assert load_run(two).step == 10  # attnlab eval / generate read sharded checkpoints


def _worker_pid(launcher: int, local_rank: int) -> int:
    """The pid of torchrun's worker ``local_rank`` (a child of the launcher process)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"LOCAL_RANK={local_rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no worker with LOCAL_RANK={local_rank} among {children}")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_a_killed_rank_stops_the_fsdp_job_and_the_last_checkpoint_resumes(
    tiny_run_config, tmp_path
):
    """SIGKILL one rank of a sharded (FSDP) run, whose every rank writes checkpoint shards."""
    cfg = tiny_run_config(steps=100_000, eval_every=0, ckpt_every=5, log_every=5,
                          distributed="fsdp")
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _torchrun_cmd(out, "--config", dump_config(cfg, tmp_path / "cfg.yaml")), env=ENV,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 90
        while not (out / "checkpoints" / "latest").exists() or (
            latest_checkpoint(out).name < "step-00000010"
        ):
            assert time.time() < deadline and proc.poll() is None, "no checkpoint to kill after"
            time.sleep(0.05)
        os.kill(_worker_pid(proc.pid, local_rank=1), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    # torchrun names the dead rank; rank 0 (which lost its peer, or was stopped by torchrun)
    # names the checkpoint to resume from
    assert "Signal 9 (SIGKILL) received by PID" in stderr and "rank      : 1" in stderr, stderr
    assert "error: rank 0 of 2: " in stderr, stderr
    assert not (out / "summary.json").exists()

    ckpt = latest_checkpoint(out)
    step = load_checkpoint(out, DecoderLM(load_run_config(out / "config.yaml").model)).step
    assert step >= 10 and ckpt.name == f"step-{step:08d}"
    assert f"The last complete checkpoint is {ckpt}; continue with --resume" in stderr
    assert _resume(out, steps=step + 2)["steps"] == step + 2  # the 2 ranks' shards, on 1


# ``attnlab`` whose model returns a NaN loss on rank 1 only, from the 14th training forward on
POISONED_ON_RANK_1 = """
import os, sys
from attnlab.cli import main
from attnlab.models import DecoderLM

original, calls = DecoderLM.forward, [0]

def poisoned(self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    calls[0] += self.training
    if calls[0] > 13 and os.environ["RANK"] == "1":
        out.loss = out.loss * float("nan")
    return out

DecoderLM.forward = poisoned
sys.exit(main())
"""


@pytest.mark.slow  # one more torchrun job (~10 s on 2 loaded cores)
def test_a_nan_loss_on_one_rank_stops_every_rank(tiny_run_config, tmp_path):
    script = tmp_path / "poisoned.py"
    script.write_text(POISONED_ON_RANK_1)
    cfg = tiny_run_config(steps=30, ckpt_every=5, eval_every=0)
    out = tmp_path / "run"
    proc = subprocess.run(
        _torchrun_cmd(out, "--config", dump_config(cfg, tmp_path / "cfg.yaml"),
                      program=(str(script),)),
        env=ENV, capture_output=True, text=True, timeout=120,
    )
    # both ranks stop at the same step with the CLI's error (exit code 2), not a hang
    message = ("error: training loss became nan at step 13; stopping. The last good checkpoint "
               f"is {out / 'checkpoints' / 'step-00000010'}")
    assert proc.returncode != 0 and proc.stderr.count(message) == 2, proc.stderr[-3000:]
    assert proc.stderr.count("exitcode  : 2 (pid") == 2, proc.stderr[-3000:]
    assert latest_checkpoint(out).name == "step-00000010"


def test_distributed_mode_is_ddp_or_fsdp(tiny_run_config):
    with pytest.raises(ConfigError, match="distributed must be one of ddp, fsdp, got 'zero'"):
        load_run_config(base=tiny_run_config(distributed="zero"))


def test_each_rank_takes_contiguous_rows_of_the_global_batch():
    x = torch.arange(12).view(6, 2)
    shards = [Dist(rank=r, world_size=3).shard(x) for r in range(3)]
    assert torch.equal(torch.cat(shards), x) and shards[1].tolist() == [[4, 5], [6, 7]]
    with pytest.raises(ValueError, match="train.batch_size of 8 rows does not split evenly "
                                         "among 3 processes"):
        Dist(rank=0, world_size=3).rows(8, "train.batch_size")


@pytest.fixture
def one_process_group():
    """A real gloo process group of one process (DDP runs its reducer as with many)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_experts_without_tokens_need_no_find_unused_parameters(one_process_group, tiny_run_config):
    """One token, one expert of 8 per head (SwitchHead) and per MLP (sigma-MoE): most experts
    get no tokens, yet every parameter gets a gradient, so DDP (which raises on the next
    step if one does not) trains without ``find_unused_parameters``."""
    model_cfg = tiny_run_config()["model"]
    model_cfg["attention"]["projections"] = {"name": "switchhead", "n_experts": 8, "k": 1}
    model_cfg["mlp"] = {"name": "sigma_moe", "n_experts": 8, "expert_size": 8, "k": 1}
    plain = DecoderLM(from_dict(ModelConfig, {**model_cfg, "vocab_size": 64}))
    model = wrap_model(plain, "ddp")
    assert model is not plain
    token = torch.tensor([[3]])
    for _ in range(3):
        out = model(token, targets=token)
        (out.loss + out.aux_loss).backward()
        assert unused_parameters(model) == []
        model.zero_grad(set_to_none=True)
    up = plain.blocks[0].mlp.up  # [experts, d_model, expert_size]
    out = model(token, targets=token)
    out.loss.backward()
    idle = up.grad.flatten(1).abs().sum(1) == 0
    assert idle.sum() == 7  # 7 experts got no token: zero gradient, not None


def test_unused_parameters_names_what_ddp_could_not_reduce(tiny_run_config):
    """Reformer's shared-QK core ignores the key projection (train.find_unused_parameters)."""
    model_cfg = tiny_run_config()["model"]
    model_cfg["attention"]["core"] = "reformer"
    model = DecoderLM(from_dict(ModelConfig, {**model_cfg, "vocab_size": 64}))
    tokens = torch.randint(0, 64, (1, 16))
    model(tokens, targets=tokens).loss.backward()
    assert unused_parameters(model) == [f"blocks.{i}.attn.projections.k_proj.weight"
                                        for i in range(2)]
