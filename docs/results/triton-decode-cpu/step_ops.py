"""What a page core's decoding step asks of a device, counted on CPU: the PyTorch ops it
dispatches (each is at least one kernel launch on a GPU) and the values it reads back to
the host (``aten::_local_scalar_dense``: a ``.item()``, ``int()`` or ``bool()`` of a tensor,
which on a GPU waits for the device), per executor.

One layer in SmolLM2-135M's shape (9 query heads, 3 KV heads of 64), 256 keys per query
token per KV head in pages of 16, random inputs, float32; the decoding state is started by
a prefill of T keys, then one step of batch B (no padding) is profiled:

- ``torch``: the selection and the attention in PyTorch ops (what ran on a GPU before the
  Triton executor);
- ``triton``: the page scores, the selection and the attention in one Triton kernel (run
  here in Triton's interpreter, so its time means nothing);
- ``triton-split``: the split selection (page logits over many programs, then the group's
  choice) and the block-table kernel, three Triton kernels.

The Triton kernels launch nothing while the step is counted (``kernel_launches`` counts
them; the interpreter's own tensor work is not the device's); the output is checked with
them run.

``top_level_ops`` counts the ATen calls the step makes from Python, ``kernel_ops`` those of
them that are not views (each launches at least one kernel on a GPU); ``host_reads`` counts
every ``aten::_local_scalar_dense``; ``max_abs_diff_vs_torch``: the step's output against the
``torch`` executor's.

Writes step_ops.json beside this file. Run from the repository root:
.venv/bin/python docs/results/triton-decode-cpu/step_ops.py
"""

import copy
import json
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is defined

import torch  # noqa: E402

from attnlab.config import PartSpec  # noqa: E402
from attnlab.layers import CORES, LayerContext  # noqa: E402
from attnlab.ops.sparse_attention import triton_pages, triton_select  # noqa: E402
from attnlab.results import machine_info  # noqa: E402

H, HK, D, T, BUDGET = 9, 3, 64, 4096, 256
SYNC = "aten::_local_scalar_dense"


def core(name: str, executor: str):
    """The core with random (trained-looking) parameters, seeded: the same for each
    executor."""
    built = CORES.build(PartSpec(name, {"budget": BUDGET, "executor": executor}),
                        ctx=LayerContext(d_model=H * D, n_heads=H, d_head=D), dropout=0.0)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in built.parameters():
            param.normal_(0.0, 0.3)
    return built.eval()


VIEWS = {"aten::unsqueeze", "aten::slice", "aten::view", "aten::expand", "aten::expand_as",
         "aten::reshape", "aten::transpose", "aten::detach", "aten::promote_types",
         "aten::select", "aten::permute", "aten::alias", "aten::as_strided", "aten::empty"}
"""Ops that make a view, allocate, or answer a question about dtypes: no kernel on a GPU
(nor does an ``aten::to`` or ``aten::contiguous`` that returns its input: no child op)."""
RETURNS_INPUT = {"aten::to", "aten::contiguous"}


def launches_kernel(event) -> bool:
    return event.name not in VIEWS and not (event.name in RETURNS_INPUT
                                            and not event.cpu_children)


KERNELS = ((triton_pages, "_best_pages_kernel"), (triton_pages, "_selected_pages_kernel"),
           (triton_select, "_page_logits_kernel"), (triton_select, "_choose_pages_kernel"))


class NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` is counted and runs nothing."""

    def __init__(self, launches: list) -> None:
        self.launches = launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(grid)


def profile_step(name: str, executor: str, batch: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, H, T + 1, D, generator=gen)
    k, v = (torch.randn(batch, HK, T + 1, D, generator=gen) for _ in range(2))
    step = q[..., T:, :]
    triton_pages.SPLIT_MIN_PAGES = 0 if executor == "triton-split" else 10**9
    layer = core(name, executor.removesuffix("-split"))
    launches: list = []
    with torch.no_grad():
        state = core(name, "torch")(q[..., :T, :], k[..., :T, :], v[..., :T, :],
                                    scale=D ** -0.5).state
        out = layer(step, k, v, scale=D ** -0.5, state=copy.deepcopy(state)).out
        ref = core(name, "torch")(step, k, v, scale=D ** -0.5, state=copy.deepcopy(state)).out
        kernels = [(module, kernel, getattr(module, kernel)) for module, kernel in KERNELS]
        for module, kernel, _ in kernels:
            setattr(module, kernel, NoLaunch(launches))
        fresh = copy.deepcopy(state)
        try:
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                layer(step, k, v, scale=D ** -0.5, state=fresh)
        finally:
            for module, kernel, real in kernels:
                setattr(module, kernel, real)
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten")]
    return {"core": name, "executor": executor, "batch": batch, "keys": T + 1,
            "budget": BUDGET, "top_level_ops": len(top),
            "kernel_ops": sum(launches_kernel(e) for e in top),
            "host_reads": sum(e.name == SYNC for e in events),
            "kernel_launches": len(launches),
            "max_abs_diff_vs_torch": float((out - ref).abs().max())}


def main() -> None:
    records = [profile_step(name, executor, batch)
               for name in ("quest", "sea_pages") for batch in (1, 8)
               for executor in ("torch", "triton", "triton-split")]
    for r in records:
        print(f"{r['core']:>9} batch {r['batch']} {r['executor']:>12}: "
              f"{r['top_level_ops']:3d} PyTorch ops ({r['kernel_ops']} not views) + "
              f"{r['kernel_launches']} Triton kernels, {r['host_reads']} host reads, "
              f"max |diff| {r['max_abs_diff_vs_torch']:.1e}")
    out = {"bench": "decode-step-ops", "machine": machine_info(), "records": records}
    Path(__file__).with_name("step_ops.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
