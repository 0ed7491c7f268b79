"""Token-mixing and feed-forward modules, composed from registered parts.

Importing this package registers the built-in parts; see ``PROJECTIONS``, ``POSITIONS``,
``CORES`` and ``MLPS`` for what is available.
"""

from attnlab.layers import (  # noqa: F401  (registration)
    cores,
    flex,
    mlp,
    moa,
    oracle,
    pages,
    performer,
    positions,
    projections,
    reformer,
    sea,
    sigma_moe,
    switchhead,
    window,
)
from attnlab.layers.attention import Attention, AttentionConfig, AttentionOutput, LayerCache
from attnlab.layers.base import (
    AttentionCore,
    CoreOutput,
    LayerContext,
    Positions,
    Projected,
    Projections,
)
from attnlab.layers.bias import ScoreBias
from attnlab.layers.mlp import MLPContext
from attnlab.layers.registry import CORES, MLPS, POSITIONS, PROJECTIONS, Registry

__all__ = [
    "CORES",
    "MLPS",
    "POSITIONS",
    "PROJECTIONS",
    "Attention",
    "AttentionConfig",
    "AttentionCore",
    "AttentionOutput",
    "CoreOutput",
    "LayerCache",
    "LayerContext",
    "MLPContext",
    "Positions",
    "Projected",
    "Projections",
    "Registry",
    "ScoreBias",
]
