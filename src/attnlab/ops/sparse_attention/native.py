"""The optional native CPU kernel of :func:`~attnlab.ops.sparse_attention.run_attention`.

``csrc/run_attention.cpp`` (no torch headers) is compiled on first use with the system C++
compiler (``$CXX`` or ``c++``; ``-O3 -march=native -fopenmp`` and reassociation) into
``<cache>/kernels/run_attention-<hash>.so`` and loaded with :mod:`ctypes`; the hash covers the
source, the flags and this CPU's model and feature flags, so a shared cache never serves a
library built for another processor. The build takes about a second and is written atomically
(temp file, rename), so concurrent processes are safe.

When no compiler is available, the build fails, or ``ATTNLAB_NATIVE=0`` is set,
:func:`available` is False (logged once) and callers use the pure-PyTorch path, which computes
the same result.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from attnlab.ops.attention.bias import DistanceBias
from attnlab.utils.io import default_cache_dir

logger = logging.getLogger(__name__)

# The reassociation flags of -ffast-math without -ffast-math itself, which would link
# crtfastmath.o: loading the library would then flush denormals to zero process-wide.
FAST_MATH = ("-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
             "-freciprocal-math")
FLAGS = ("-O3", "-march=native", *FAST_MATH, "-fopenmp", "-std=c++17", "-shared", "-fPIC")
DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}
# what scores, sums, the ranking and the row scale are computed in, per storage dtype
COMPUTE = {torch.float32: torch.float32, torch.float64: torch.float64,
           torch.bfloat16: torch.float32}
# the page kernel per (q, k, v dtype; page features' dtype): features like the keys, or
# bfloat16 beside float32 keys (half the bytes a step scores)
_PAGE_KERNELS = {**{(dtype, dtype): suffix for dtype, suffix in DTYPES.items()},
                 (torch.float32, torch.bfloat16): "f32_bf16"}
# keys a page kernel's rows read, per key held, from which it reads them transposed per page
TRANSPOSE_READS = 4


def _cpu_fingerprint() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(keep))  # first core's lines, de-duplicated


def _build(source: str, target: Path) -> None:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set $CXX)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / "run_attention.cpp", Path(tmp) / target.name
        src.write_text(source)
        result = subprocess.run([compiler, *FLAGS, str(src), "-o", str(out)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{result.stderr.strip()[-2000:]}")
        os.replace(out, target)


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("ATTNLAB_NATIVE", "1") == "0":
        logger.info("native CPU kernels disabled by ATTNLAB_NATIVE=0")
        return None
    source = (resources.files("attnlab.ops.sparse_attention") / "csrc" /
              "run_attention.cpp").read_text()
    key = hashlib.sha256("\0".join((source, *FLAGS, _cpu_fingerprint())).encode()).hexdigest()
    target = default_cache_dir() / "kernels" / f"run_attention-{key[:16]}.so"
    try:
        if not target.exists():
            logger.info("compiling the native run-attention kernel into %s", target)
            _build(source, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as err:
        logger.warning("native CPU kernel unavailable, using the PyTorch path: %s", err)
        return None
    i64, ptr, dbl, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double, ctypes.c_int
    # q k v rank_to_pos row_scale out ks vs, shapes, scale, slopes q_pos k_pos, symmetric
    inputs = [ptr] * 8 + [i64] * 7 + [dbl] + [ptr] * 3 + [i32]
    for suffix in DTYPES.values():
        run = getattr(lib, f"attnlab_run_attention_{suffix}")
        run.argtypes = inputs + [ptr] * 4 + [i64] * 2 + [i32]
        select = getattr(lib, f"attnlab_select_attention_{suffix}")
        select.argtypes = inputs + [ptr] * 2 + [i64] * 3 + [i32]
        run.restype = select.restype = None
    for suffix in _PAGE_KERNELS.values():
        pages = getattr(lib, f"attnlab_page_attention_{suffix}")
        # qf feat fs, Hf P F, bias, n_buckets, q_rank n_real, page sinks local n_top, causal,
        # logit_scale, transposed keys, threads
        pages.argtypes = inputs + [ptr] * 3 + [i64] * 3 + [ptr, i64] + [ptr] * 2 + [i64] * 4 + [
            i32, dbl, ptr, i32]
        pages.restype = None
    return lib


def available() -> bool:
    """Whether the native kernel is built and loaded (builds it on the first call)."""
    return _library() is not None


def supports(q: Tensor, k: Tensor, v: Tensor, *others: Tensor) -> bool:
    """Whether the native kernel can serve these inputs: CPU; q, k, v of one dtype of
    :data:`DTYPES` (float32, float64, bfloat16); no autograd. ``others`` (ranking, row scale)
    are cast to the compute dtype."""
    tensors = (q, k, v, *others)
    return (
        q.device.type == "cpu" and q.dtype in DTYPES and k.dtype == v.dtype == q.dtype
        and all(t.device == q.device for t in tensors)
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        and available()
    )


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _threads(threads: int | None, rows: int) -> int:
    """OpenMP threads for ``rows`` query rows: ``threads`` (None: torch's), at most one per
    row (an idle thread still waits at the region's end, at length when a core is busy)."""
    return max(1, min(torch.get_num_threads() if threads is None else threads, rows))


def _common_inputs(q: Tensor, k: Tensor, v: Tensor, row_scale: Tensor | None,
                   rank_to_pos: Tensor | None, scale: float, distance: DistanceBias | None
                   ) -> tuple[Tensor, list, list]:
    """(output ``[B, H, Tq, Dv]``, the leading arguments both kernels take, the tensors they
    point to: the caller keeps them referenced while the kernel runs)."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the native run-attention kernel is not available")
    b, h, t_q, d = q.shape
    hk, t_k, d_v = k.shape[1], k.shape[2], v.shape[-1]
    q = q.contiguous()
    # K and V are read in place through their strides (a reserved KV cache's views are not
    # contiguous); only a row of head_dim values must be
    k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (k, v))
    strides = [(ctypes.c_int64 * 3)(*x.stride()[:3]) for x in (k, v)]
    r2p = None if rank_to_pos is None else rank_to_pos.to(torch.int64).contiguous()
    rs = None if row_scale is None else row_scale.to(COMPUTE[q.dtype]).contiguous()
    out = q.new_empty(b, h, t_q, d_v)
    penalty = [None] * 3
    if distance is not None:
        penalty = [x.to(COMPUTE[q.dtype]).contiguous()
                   for x in (distance.slopes, distance.q_positions, distance.k_positions)]
    args = [_ptr(q), _ptr(k), _ptr(v), _ptr(r2p), _ptr(rs), _ptr(out), *strides,
            b, h, hk, t_q, t_k, d, d_v, float(scale), *(_ptr(x) for x in penalty),
            int(distance is not None and distance.symmetric)]
    return out, args, [q, k, v, r2p, rs, *penalty]


def run_attention_native(
    q: Tensor, k: Tensor, v: Tensor, cell_head: Tensor, cell_lo: Tensor, cell_count: Tensor,
    cell_width: Tensor, *, scale: float, row_scale: Tensor | None,
    rank_to_pos: Tensor | None, distance: DistanceBias | None = None,
) -> Tensor:
    """The kernel on validated inputs (see :func:`~attnlab.ops.sparse_attention.run_attention`);
    callers check :func:`supports` first. ``distance``: an ALiBi-form score bias, or None.
    Returns ``[B, H, Tq, Dv]``."""
    out, args, _alive = _common_inputs(q, k, v, row_scale, rank_to_pos, scale, distance)
    cells = [x.to(torch.int64).contiguous() for x in (cell_head, cell_lo, cell_count, cell_width)]
    width = int(cells[2].max()) if cells[2].numel() else 0
    getattr(_library(), f"attnlab_run_attention_{DTYPES[q.dtype]}")(
        *args, *(_ptr(x) for x in cells), cell_head.shape[-1], width,
        _threads(None, cell_head.shape[0] * cell_head.shape[1]),
    )
    return out


def select_attention_native(
    q: Tensor, k: Tensor, v: Tensor, ranking: Tensor, lengths: Tensor, k_per_head: int, *,
    cap: int, scale: float, row_scale: Tensor | None, rank_to_pos: Tensor | None,
    threads: int | None = None, distance: DistanceBias | None = None,
) -> Tensor:
    """SEA's grouped (across heads) top-k selection and the attention over it in one kernel
    (see :func:`~attnlab.ops.sea.selected_attention`); callers check :func:`supports` first.
    ranking ``[B, H, Tq, K]``, lengths ``[B, Tq]``; ``threads``: OpenMP threads (None:
    torch's), at most one per row; ``distance``: an ALiBi-form score bias, or None. Returns
    ``[B, H, Tq, Dv]``."""
    out, args, _alive = _common_inputs(q, k, v, row_scale, rank_to_pos, scale, distance)
    ranking = ranking.to(COMPUTE[q.dtype]).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    getattr(_library(), f"attnlab_select_attention_{DTYPES[q.dtype]}")(
        *args, _ptr(ranking), _ptr(lengths), ranking.shape[-1], k_per_head, cap,
        _threads(threads, lengths.numel()),
    )
    return out


def page_attention_native(
    q: Tensor, k: Tensor, v: Tensor, query_features: Tensor, features: Tensor,
    bias: Tensor | None, q_rank: Tensor, n_real: Tensor, *, page: int, sink_pages: int,
    local_pages: int, n_top: int, causal: bool, scale: float, rank_to_pos: Tensor | None,
) -> Tensor:
    """A page selector's selection and attention in one kernel (see
    :func:`~attnlab.ops.attention.page_step.attend_best_pages`); callers check
    :func:`supports` first. query_features ``[B, H, Tq, F]``, features ``[B, Hk or H, P, F]``
    (a row of F contiguous), bias ``[H, n_buckets]`` or None, q_rank ``[B, Tq]``, n_real
    ``[B]``. The features are read in their own dtype where the kernel has it (q's, or
    bfloat16 beside float32 q), else in q's; the rest in the compute dtype. Returns
    ``[B, H, Tq, Dv]``."""
    out, args, _alive = _common_inputs(q, k, v, None, rank_to_pos, scale, None)
    compute = COMPUTE[q.dtype]
    query = query_features.to(compute).contiguous()
    kernel = _PAGE_KERNELS.get((q.dtype, features.dtype))
    feats = features if kernel is not None else features.to(q.dtype)
    feats = feats if feats.stride(-1) == 1 else feats.contiguous()
    strides = (ctypes.c_int64 * 3)(*feats.stride()[:3])
    table = None if bias is None else bias.detach().to(compute).contiguous()
    ranks, counts = (x.to(torch.int64).contiguous() for x in (q_rank, n_real))
    b, h_kv, t_q = q.shape[0], k.shape[1], q.shape[2]
    # a long prefill scores its keys from a copy transposed per page (a page's scores are then
    # lanes of one product, no sum across lanes per key), which the kernel fills: worth its
    # one pass over the keys where the rows read many times as many keys as there are
    reads = t_q * (q.shape[1] // h_kv) * (n_top + sink_pages + local_pages) * page
    transposed = (k.new_zeros(b, h_kv, feats.shape[2], k.shape[-1], page)
                  if reads >= TRANSPOSE_READS * k.shape[2] else None)
    getattr(_library(), f"attnlab_page_attention_{kernel or DTYPES[q.dtype]}")(
        *args, _ptr(query), _ptr(feats), strides, feats.shape[1], feats.shape[2],
        feats.shape[3], _ptr(table), 0 if table is None else table.shape[1], _ptr(ranks),
        _ptr(counts), page, sink_pages, local_pages, n_top, int(causal), float(scale),
        _ptr(transposed), _threads(None, b * t_q * h_kv),
    )
    return out
