"""Expert matmul (SwitchHead's CVMM): per-slot expert matrices, gated and reduced.

``expert_matmul`` is the op (backends "grouped", "dense", "triton", picked by "auto");
``expert_matmul_naive`` the reference; ``expert_matmul_macs`` the useful MAC count.
"""

from attnlab.ops.expert_matmul.dispatch import BACKENDS, choose_backend, expert_matmul
from attnlab.ops.expert_matmul.macs import expert_matmul_macs
from attnlab.ops.expert_matmul.naive import expert_matmul_naive

__all__ = [
    "BACKENDS",
    "choose_backend",
    "expert_matmul",
    "expert_matmul_macs",
    "expert_matmul_naive",
]
