"""Distillation recipes: named defaults for the ``distill`` section of a config.

* ``attnlab`` (the default): attnlab's own settings, as :class:`~attnlab.distill.config.
  DistillConfig` declares them.
* ``sea-paper``: the settings of SEA's public code for SEA and the baselines it compares in
  its distillation-convergence figure (Fig. 4b): learning rate 1e-5, pretrained weights
  trained at 1.0x it (attnlab: 0.2x), the attention-output (context) MSE only for students
  that learn attention (SEA), Performer students with SEA's estimator's feature count
  (``feature_rule: sea``: 33 at ``d_head = 64``, causal), Reformer students with 8 hashes
  and buckets of SEA's default ``k`` (64).

A recipe fills only what the config leaves unset: an explicit setting always wins.
"""

from __future__ import annotations

from typing import Any

from attnlab.config import ConfigError, PartSpec
from attnlab.layers import CORES
from attnlab.layers.sea import SEAOptions

RECIPES = ("attnlab", "sea-paper")

SEA_PAPER_STUDENTS: dict[str, dict[str, Any]] = {
    "performer": {"feature_rule": "sea"},
    "reformer": {"n_hashes": 8, "bucket_size": SEAOptions().k},
}
"""The sea-paper recipe's options per student core (others: none)."""


def apply_recipe(section: dict[str, Any]) -> None:
    """Fill the unset keys of a ``distill`` section (a plain mapping, before it becomes a
    :class:`~attnlab.distill.config.DistillConfig`) from its ``recipe``, in place."""
    recipe = section.get("recipe", "attnlab")
    if recipe not in RECIPES:
        raise ConfigError(f"distill.recipe: unknown recipe {recipe!r}; choose one of "
                          f"{list(RECIPES)}")
    if recipe == "attnlab":
        return
    section.setdefault("lr", 1e-5)
    section.setdefault("pretrained_lr_mult", 1.0)
    spec = PartSpec.parse(section.get("student_attention", "sea"), "distill.student_attention")
    if not CORES.trait(spec.name, "learns_attention"):
        section.setdefault("context_weight", 0.0)
    options = {**SEA_PAPER_STUDENTS.get(spec.name, {}), **spec.options}
    section["student_attention"] = {"name": spec.name, **options}
