"""``attnlab bench``: side-by-side benchmarks (table + JSON), one module a benchmark."""

from __future__ import annotations

from attnlab.cli.command import CommandGroup
from attnlab.cli.commands.bench import attention, bias, expert_matmul, hf, layer, serve, train

GROUP = CommandGroup(
    "bench", "side-by-side benchmarks (table + JSON)", dest="bench",
    commands=[module.COMMAND for module in (expert_matmul, attention, layer, bias, train, hf,
                                            serve)])
