"""``attnlab export``: a finished ``attnlab train`` (or native ``attnlab distill``) run as a
Hugging Face folder: ``config.json`` (``model_type: attnlab``), safetensors weights, the run's
tokenizer as a fast tokenizer (``tokenizer.json``) and ``generation_config.json``.
``AutoModelForCausalLM.from_pretrained`` loads it after ``import attnlab.hf``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import transformers

from attnlab.config import ConfigError
from attnlab.hf.native import from_decoder
from attnlab.utils.outputs import OutputFolder

logger = logging.getLogger(__name__)


def export_run(run_dir: str | Path, out_dir: str | Path, *, force: bool = False) -> Path:
    """Write the run's newest checkpoint and tokenizer as a Hugging Face folder ``out_dir``
    (crash-safely: a complete folder or none). Raises ``ConfigError`` for a folder that is
    not a finished run and ``OutputRefused`` for an ``out_dir`` the write policy refuses
    (:mod:`attnlab.utils.outputs`: one holding anything but an earlier export, unless
    ``force``; never the run folder itself)."""
    from attnlab.train.run import load_run
    from attnlab.train.runner import resume_command, run_kind

    run_dir = Path(run_dir)
    out = OutputFolder.of(out_dir, "export", force=force, inputs=[run_dir])
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not an attnlab run folder (no config.yaml)")
    if not (run_dir / "summary.json").is_file():
        raise ConfigError(f"{run_dir} is not a finished run (no summary.json): finish it with "
                          f"{resume_command(run_dir, run_kind(run_dir) or 'run')}, then export")
    out.check()
    run = load_run(run_dir)
    model = from_decoder(run.model)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=run.tokenizer.to_tokenizers(),
        model_max_length=run.cfg.model.max_seq_len)
    model.generation_config = transformers.GenerationConfig(do_sample=False)

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    out.write(write)
    logger.info("exported %s (step %d) to %s", run_dir, run.step, out_dir)
    return Path(out_dir)
