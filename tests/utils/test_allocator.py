"""glibc heap tuning used by the benchmark commands."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
PROBE = ("from attnlab.utils.allocator import cpu_allocator_tuned, tune_cpu_allocator; "
         "print(cpu_allocator_tuned(), tune_cpu_allocator(), cpu_allocator_tuned())")


def _probe(env_value: str) -> str:
    env = {"ATTNLAB_MALLOC_TUNING": env_value, "PATH": ""}
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, check=True).stdout.strip()


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_tuning_applies_on_glibc_and_is_recorded():
    assert _probe("1") == "False True True"


def test_tuning_can_be_turned_off():
    assert _probe("0") == "False False False"
