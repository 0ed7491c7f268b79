"""Multi-process training under torchrun: the helpers every attnlab trainer shares.

torchrun starts one process per device and sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``.
With ``WORLD_SIZE`` > 1, :func:`process_group` joins the job (NCCL on GPUs, gloo on CPU); with
one process no process group exists and every helper is a no-op, so a single-process run is
exactly what it was before.

Conventions:

- A *global* batch of B rows is the same for any number of processes W; rank r trains on its
  contiguous B / W rows (:meth:`Dist.shard`). Gradients are averaged over ranks, so the
  update equals the single-process one up to float reduction order.
- Every rank starts from the same seed and keeps the same RNG stream: models are built
  identically (FSDP does not broadcast them) and random buffers (e.g. Performer features)
  stay equal. Dropout masks are therefore drawn alike on every rank's rows.
- Only rank 0 writes files (:attr:`Dist.is_main`); sharded checkpoints are the exception,
  where every rank writes its own shard.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from attnlab.config import ConfigError
from attnlab.utils.device import resolve_device

logger = logging.getLogger(__name__)

MODES = ("ddp", "fsdp")
"""How a model is spread over processes: replicated (DDP) or sharded (FSDP2)."""

T = TypeVar("T")


class JobStopped(RuntimeError):
    """This rank was told to stop (SIGTERM: torchrun stops every rank once one fails)."""


@dataclasses.dataclass(frozen=True)
class Dist:
    """This process's place in the job; ``Dist()`` is the single-process job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls) -> Dist:
        """Read torchrun's ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` (absent: one process)."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return cls()
        return cls(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world_size)

    @property
    def enabled(self) -> bool:
        """True when the job has more than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, the one process that writes logs, metrics and summaries."""
        return self.rank == 0

    def rows(self, n: int, what: str = "a batch") -> slice:
        """This rank's contiguous share of ``n`` rows; ``n`` must divide evenly."""
        if n % self.world_size:
            raise ValueError(
                f"{what} of {n} rows does not split evenly among {self.world_size} processes; "
                f"make it a multiple of {self.world_size}"
            )
        size = n // self.world_size
        return slice(self.rank * size, (self.rank + 1) * size)

    def shard(self, x: Tensor) -> Tensor:
        """This rank's rows of a global batch: ``x [B, ...] -> [B / world_size, ...]``."""
        return x[self.rows(x.shape[0])]

    def all_reduce(self, x: Tensor, op: str = "sum") -> Tensor:
        """``x`` summed (``op="sum"``) or averaged (``"mean"``) over ranks, same shape as ``x``."""
        if op not in ("sum", "mean"):
            raise ValueError(f"op must be sum or mean, got {op!r}")
        if not self.enabled:
            return x
        out = x.clone()
        dist.all_reduce(out)
        return out / self.world_size if op == "mean" else out

    def all_gather_rows(self, x: Tensor) -> Tensor:
        """Every rank's rows in rank order: ``x [b, ...] -> [b * world_size, ...]``."""
        if not self.enabled:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.enabled:
            dist.barrier()

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's ``obj`` (picklable) on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. to build a cache), then the others."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()


def is_main_process() -> bool:
    """Whether this process is rank 0 (or alone), from torchrun's environment."""
    return Dist.from_env().is_main


def rank_device(name: str, d: Dist, key: str = "train.device") -> torch.device:
    """The device for config ``key``'s value ``name`` (auto, cpu, cuda, cuda:N) on this rank.

    With several processes a CUDA device is always the rank's own, ``cuda:LOCAL_RANK``.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = resolve_device(name)
    except ValueError as err:
        raise ConfigError(f"{key}: {err} (or auto)") from err
    if device.type == "cuda" and d.enabled:
        device = torch.device("cuda", d.local_rank)
    return device


@contextlib.contextmanager
def process_group(d: Dist, device: torch.device, timeout_s: float = 1800.0) -> Iterator[None]:
    """Join the job (NCCL for CUDA devices, gloo otherwise) and leave it at the end.

    A no-op for one process. While the job runs, SIGTERM (torchrun's way of stopping every
    rank once one has failed) raises :class:`JobStopped` in the main thread. Once an error
    leaves the block, SIGTERM stays ignored so that the error gets reported before the
    process exits (torchrun SIGKILLs a rank that has not exited 30 s later).
    """
    if not d.enabled:
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    logger.info("rank %d of %d joined the job (%s on %s)", d.rank, d.world_size, backend, device)
    try:
        with _sigterm_raises():
            yield
        dist.barrier()  # no rank closes its connections while a peer still reads from them
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough
        raise JobStopped("stopped by SIGTERM (torchrun stops every rank once one has failed)")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except BaseException:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise
    signal.signal(signal.SIGTERM, previous)


def lost_peer(err: BaseException) -> bool:
    """Whether ``err`` means another rank of the job is gone (or this one was stopped)."""
    gloo_lost = isinstance(err, RuntimeError) and "gloo" in str(err) and "peer" in str(err)
    return gloo_lost or isinstance(err, (JobStopped, dist.DistError))


def wrap_model(
    model: nn.Module,
    mode: str,
    units: Iterable[nn.Module] = (),
    find_unused_parameters: bool = False,
) -> nn.Module:
    """DDP or FSDP2 around ``model`` when a process group is up, else ``model`` itself.

    ``mode``: ``"ddp"`` (every rank holds the whole model, gradients are all-reduced) or
    ``"fsdp"`` (``fully_shard`` on each of ``units``, e.g. the transformer blocks, then on
    the root, so only one unit's parameters are gathered at a time). Build the optimizer
    *after* wrapping.

    ``find_unused_parameters`` (DDP) is only needed for a model with parameters that get no
    gradient (see :func:`unused_parameters`). attnlab's mixture-of-experts layers do not
    need it: each one's experts are a single tensor, so an expert that receives no tokens
    on a rank gets a zero gradient there, not none.
    """
    if mode not in MODES:
        raise ValueError(f"distributed mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not (dist.is_available() and dist.is_initialized()):
        return model
    if mode == "ddp":
        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(
            model, device_ids=ids, find_unused_parameters=find_unused_parameters
        )
    from torch.distributed.fsdp import fully_shard

    for unit in units:
        fully_shard(unit)
    return fully_shard(model)


def unused_parameters(model: nn.Module) -> list[str]:
    """Names of trainable parameters without a gradient (call after a backward)."""
    return [name for name, p in unwrap(model).named_parameters()
            if p.requires_grad and p.grad is None]


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``fully_shard`` made ``model`` an FSDP2 module (its parameters are shards)."""
    return hasattr(model, "set_requires_gradient_sync")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (FSDP2 shards in place: the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Wrap forward and backward of a micro-step; ``enabled=False`` skips the gradient
    reduction (gradients accumulate locally), as wanted on all but the last micro-step."""
    if enabled:
        yield
    elif isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif is_fsdp(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer | None = None
                     ) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}``, keyed by parameter names, for torch's DCP format.

    Under FSDP the tensors are this rank's shards (DTensors): saving writes one file per rank,
    and loading reshards to any number of processes. Without ``optimizer`` only ``"model"``.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def load_checkpoint_state(model: nn.Module, state: dict[str, Any],
                          optimizer: torch.optim.Optimizer | None = None) -> None:
    """Put a :func:`checkpoint_state` dict (filled by ``torch.distributed.checkpoint.load``)
    back into ``model`` and, if given, ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])


def map_tensors(fn: Callable[[Tensor], Tensor], tree: Any) -> Any:
    """``tree`` (nested dicts, lists, tuples) with ``fn`` applied to every tensor in it."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {key: map_tensors(fn, value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_tensors(fn, value) for value in tree)
    return tree
