"""``native_bf16``: where bf16 autocast pays off."""

from __future__ import annotations

import torch

from attnlab.utils.precision import native_bf16


def test_a_cpu_needs_avx512_bf16_or_amx(monkeypatch):
    for avx512_bf16, amx, expected in [(False, False, False), (True, False, True),
                                       (False, True, True)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert native_bf16("cpu") is expected


def test_a_torch_without_the_cpu_checks_says_no(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert native_bf16(torch.device("cpu")) is False


def test_other_devices(monkeypatch):
    assert native_bf16("meta") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert native_bf16("cuda") is False
