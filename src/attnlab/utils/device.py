"""Which devices attnlab runs on, checked before any work starts."""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``; ``ValueError`` when it is not ``cpu`` or an available
    ``cuda`` device."""
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"unknown device {device!r}; valid: cpu, cuda, cuda:N") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} is not available: torch finds no CUDA "
                             "GPU (or was built without CUDA); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r} is not available: "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise ValueError(f"device {str(device)!r} is not supported; valid: cpu, cuda, cuda:N")
    return dev
