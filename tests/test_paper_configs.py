"""The SwitchHead paper's configs (configs/paper/): they load, and reproduce Table 1."""

from pathlib import Path

import pytest

from attnlab.config import builtin_config
from attnlab.metrics import attention_cost
from attnlab.train import load_run_config

PAPER = Path(builtin_config("tiny")).parent / "paper"
CONFIGS = sorted(PAPER.glob("*.yaml"))

# Table 1 (Wikitext-103): attention MACs and memory floats per layer and sequence
TABLE_1 = {
    "wt103-47m-dense-h10": ("453.4M", "3.5M"),
    "wt103-47m-switchhead": ("170.4M", "0.8M"),
    "wt103-47m-moa-h2": ("140.1M", "0.7M"),
    "wt103-47m-moa-h4": ("223.5M", "1.3M"),
    "wt103-47m-moa-h6": ("306.8M", "1.9M"),
    "wt103-47m-moa-h8": ("390.2M", "2.6M"),
    "wt103-262m-dense-h16": ("5.4G", "21.0M"),
    "wt103-262m-switchhead": ("2.0G", "2.9M"),
    "wt103-262m-moa-h2": ("1.1G", "2.7M"),
    "wt103-262m-moa-h4": ("1.7G", "5.1M"),
    "wt103-262m-moa-h8": ("2.9G", "9.9M"),
    "wt103-262m-moa-h12": ("4.1G", "14.7M"),
}


def printed(value: int, like: str) -> str:
    unit = like[-1]
    return f"{value / (1e9 if unit == 'G' else 1e6):.1f}{unit}"


def test_every_table_is_covered():
    names = {p.stem for p in CONFIGS}
    assert set(TABLE_1) <= names
    for dataset in ("wt103", "c4", "pes2o"):
        for size in ("47m", "262m"):
            assert {f"{dataset}-{size}-switchhead", f"{dataset}-{size}-switchall"} <= names
    assert {"enwik8-41m-dense-h8", "enwik8-41m-dense-h2", "enwik8-41m-switchhead"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_paper_config_loads_and_has_its_size(path):
    cfg = load_run_config(path)
    cost = attention_cost(cfg, "exact")
    size = float(path.stem.split("-")[1].rstrip("m")) * 1e6
    assert abs(cost["params"] - size) / size < 0.12, cost["params"]


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_paper_convention_reproduces_table_1(name):
    cost = attention_cost(load_run_config(PAPER / f"{name}.yaml"), "paper")
    macs, memory = TABLE_1[name]
    assert printed(cost["attention_macs"], macs) == macs
    assert printed(cost["attention_memory_floats"], memory) == memory
