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
from attnlab.utils.io import write_folder

logger = logging.getLogger(__name__)


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the run's newest checkpoint and tokenizer as a Hugging Face folder ``out_dir``
    (crash-safely: a complete folder or none). Raises ``ConfigError`` for a folder that is
    not a finished run."""
    from attnlab.train.run import load_run

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not an attnlab run folder (no config.yaml)")
    if not (run_dir / "summary.json").is_file():
        raise ConfigError(f"{run_dir} is not a finished run (no summary.json): finish it with "
                          f"attnlab train --out {run_dir} --resume, then export")
    run = load_run(run_dir)
    model = from_decoder(run.model)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=run.tokenizer.to_tokenizers(),
        model_max_length=run.cfg.model.max_seq_len)
    model.generation_config = transformers.GenerationConfig(do_sample=False)

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    write_folder(out_dir, write)
    logger.info("exported %s (step %d) to %s", run_dir, run.step, out_dir)
    return out_dir
