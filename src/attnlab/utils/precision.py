"""Whether a device computes in bfloat16 natively (where bf16 autocast pays off)."""

from __future__ import annotations

import torch


def native_bf16(device: str | torch.device) -> bool:
    """True on a CUDA device with bf16 support, and on a CPU with AVX-512 BF16 or AMX
    instructions; elsewhere bf16 autocast runs emulated, slower than float32."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    # private helpers of torch.cpu (present since torch 2.1): guarded, never required
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
