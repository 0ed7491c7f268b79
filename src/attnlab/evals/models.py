"""The model of each long-context variant, built from one loaded Hugging Face model."""

from __future__ import annotations

import copy
import math

import transformers

import attnlab.hf
from attnlab.config import ConfigError
from attnlab.evals.variants import Variant
from attnlab.hf.positions import stretched, trained_length


class Models:
    """Builds each variant of ``base`` (a loaded, unconverted Hugging Face model)."""

    def __init__(self, base: transformers.PreTrainedModel) -> None:
        self.base = base

    def build(self, variant: Variant) -> transformers.PreTrainedModel:
        """The variant's model (the base itself for the original; otherwise a new model)."""
        if variant.core is None:
            return self.base
        if variant.student is None:
            return attnlab.hf.convert(copy.deepcopy(self.base), variant.core, variant.options)
        try:
            student = attnlab.hf.load(variant.student, teacher=self.base)
        except (OSError, ValueError) as err:
            raise ConfigError(f"variant {variant.label!r}: {err}") from err
        if "k" in variant.options:
            attnlab.hf.set_inference(student, k=variant.options["k"])
        return student.eval()

    @staticmethod
    def at_length(variant: Variant, model: transformers.PreTrainedModel,
                  context: int) -> transformers.PreTrainedModel:
        """``model`` ready for ``context`` tokens: a student's SEA position tables stretched
        by ``ceil(context / trained_len)``."""
        if variant.student is None:
            return model
        trained = variant.trained_len or trained_length(model)
        if trained is None:
            raise ConfigError(f"variant {variant.label!r}: the student folder does not record "
                              "its distillation length; give trained_len")
        return stretched(model, max(1, math.ceil(context / trained)))
