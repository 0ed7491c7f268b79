"""Hugging Face transformers models whose attention runs attnlab cores (SEA, Performer, ...).

>>> import attnlab.hf
>>> model = attnlab.hf.load(folder)                                  # a pretrained model
>>> attnlab.hf.convert(model, "sea", {"k": 64, "predictor_length": 64})
>>> model.generate(ids, max_new_tokens=20)                           # cached SEA decoding
>>> model.save_pretrained(out)                                       # cores included
>>> student = attnlab.hf.load(out)                                   # converted again

Supported: Llama-family (grouped-query), OPT, GPT-2 and BERT (:mod:`attnlab.hf.families`).
attnlab's own models load as ``model_type: attnlab`` (:mod:`attnlab.hf.native`; ``attnlab
export`` writes a run as such a folder); importing this package registers them with the Auto
classes.
The attention runs through transformers' attention registry together with a mask function
(:mod:`attnlab.hf.attention`). Needs the ``hf`` extra: ``pip install 'attnlab[hf]'``.
"""

try:
    import transformers  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("attnlab.hf needs transformers: pip install 'attnlab[hf]'") from err

from attnlab.hf.attention import ATTN_IMPLEMENTATION, Collected
from attnlab.hf.convert import (
    check_model_folder,
    check_student,
    collect,
    convert,
    cores,
    load,
    load_fingerprinted,
    load_tokenizer,
    set_inference,
)
from attnlab.hf.export import export_run
from attnlab.hf.families import FAMILIES, UnsupportedModelError
from attnlab.hf.native import AttnlabConfig, AttnlabForCausalLM, from_decoder, register

register()

__all__ = [
    "ATTN_IMPLEMENTATION",
    "AttnlabConfig",
    "AttnlabForCausalLM",
    "FAMILIES",
    "Collected",
    "UnsupportedModelError",
    "check_model_folder",
    "check_student",
    "collect",
    "convert",
    "cores",
    "export_run",
    "from_decoder",
    "load",
    "load_fingerprinted",
    "load_tokenizer",
    "set_inference",
]
