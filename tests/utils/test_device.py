"""``resolve_device``: the devices attnlab accepts, and the CLI's one-line refusal."""

from __future__ import annotations

import pytest
import torch

from attnlab.cli import main
from attnlab.utils.device import resolve_device


def test_cpu_and_available_cuda_are_accepted():
    assert resolve_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        assert resolve_device("cuda:0").type == "cuda"


@pytest.mark.parametrize("device, message", [
    ("tpu", "unknown device 'tpu'; valid: cpu, cuda, cuda:N"),
    ("meta", "device 'meta' is not supported; valid: cpu, cuda, cuda:N"),
    ("cuda:99", "device 'cuda:99' is not available"),
])
def test_other_devices_are_refused_by_name(device, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(device)


@pytest.mark.parametrize("command", [
    ["bench", "attention", "--seq-lens", "64"],
    ["bench", "layer"],
    ["bench", "expert-matmul", "--tokens", "8"],
])
def test_the_cli_refuses_a_missing_gpu_in_one_line(command, tmp_path, capsys):
    out = tmp_path / "never.json"
    assert main([*command, "--device", "cuda:99", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: device 'cuda:99' is not available")
    assert not out.exists()
