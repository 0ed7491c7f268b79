import pytest

from attnlab.config import ConfigError, PartSpec, dump_yaml, from_dict
from attnlab.train.config import RunConfig, load_run_config


def test_unknown_key_names_the_closest_valid_one():
    with pytest.raises(ConfigError, match=r"key 'train.lrr' \(did you mean 'lr'\?\)"):
        load_run_config(base={"train": {"lrr": 0.1}})
    with pytest.raises(ConfigError, match=r"'model.attention.n_head' \(did you mean 'n_heads'"):
        load_run_config(base={"model": {"attention": {"n_head": 2}}})


def test_wrong_types_are_rejected():
    with pytest.raises(ConfigError, match="train.steps: expected an integer"):
        load_run_config(base={"train": {"steps": "many"}})
    with pytest.raises(ConfigError, match="train.bf16: expected true or false"):
        load_run_config(base={"train": {"bf16": "yes"}})
    with pytest.raises(ConfigError, match="model: expected a mapping"):
        load_run_config(base={"model": 3})


def test_overrides_parse_values_and_part_options():
    cfg = load_run_config(base={}, overrides=[
        "train.lr=3e-4", "train.steps=7", "model.attention.positions.name=rope",
        "model.attention.positions.fraction=0.5", "model.attention.core=eager",
    ])
    assert cfg.train.lr == pytest.approx(3e-4) and cfg.train.steps == 7
    assert cfg.model.attention.positions == PartSpec("rope", {"fraction": 0.5})
    assert cfg.model.attention.core == PartSpec("eager")


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key.path=value"):
        load_run_config(base={}, overrides=["train.lr"])


def test_yaml_round_trip(tmp_path):
    cfg = load_run_config(base={"model": {"attention": {"positions": {"name": "rope",
                                                                      "fraction": 0.5}}}})
    path = tmp_path / "c.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_run_config(path) == cfg


def test_cross_section_validation():
    with pytest.raises(ConfigError, match="exceeds model.max_seq_len"):
        load_run_config(base={"model": {"max_seq_len": 64}, "train": {"seq_len": 128}})
    with pytest.raises(ConfigError, match="needs consecutive chunks"):
        load_run_config(base={"model": {"memory_len": 32}, "train": {"sampling": "random"}})
    assert load_run_config(base={"model": {"memory_len": 32}}).sequential


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_run_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_run_config(bad)


def test_value_errors_from_validate_become_config_errors():
    with pytest.raises(ConfigError, match="train: lr must be > 0"):
        from_dict(RunConfig, {"train": {"lr": 0}})
