"""Config files: their values must have the fields' types (a TOML string is not a boolean)."""

import dataclasses

import pytest

from rookworld import cli
from rookworld.config import build_config
from rookworld.errors import UserError


@dataclasses.dataclass
class Example:
    flag: bool = False
    steps: int = 1
    lr: float = 1e-3
    name: str = "x"
    limit: int | None = None
    tags: list[str] = dataclasses.field(default_factory=list)


def test_file_values_of_the_fields_types_are_taken_and_an_int_serves_as_a_float():
    cfg = build_config(Example, None, {"flag": True, "steps": 3, "lr": 1, "name": "y", "limit": None, "tags": ["a"]})
    assert cfg == Example(flag=True, steps=3, lr=1.0, name="y", limit=None, tags=["a"])
    assert isinstance(cfg.lr, float)


@pytest.mark.parametrize(("key", "value", "wanted"), [
    ("flag", "false", "expected bool"),  # a non-empty string would be true
    ("flag", 0, "expected bool"),
    ("steps", 1.5, "expected int"),  # would run 2 steps
    ("steps", True, "expected int"),
    ("lr", "0.1", "expected float"),
    ("lr", False, "expected float"),
    ("name", 3, "expected str"),
    ("limit", "3", "expected int"),
    ("tags", "a", "expected a list of str"),
    ("tags", ["a", 1], "expected a list of str"),
    ("steps", None, "expected int"),  # only an optional field takes None (a saved config's null)
])
def test_a_file_value_of_another_type_names_the_field_and_the_fix(key, value, wanted):
    with pytest.raises(UserError, match=f"config field {key} = .*: {wanted} .*fix the config file"):
        build_config(Example, None, {key: value})


def test_train_refuses_a_toml_string_for_a_boolean(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('tensorboard = "false"\nsteps = 1\n')
    assert cli.main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "config field tensorboard = 'false': expected bool" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("toml", "message"), [
    ("beta = 0.01\n", "beta is a field of the [grpo] table; put it under [grpo]"),
    ("p_best_move_weight = 0.5\n", "p_best_move_weight is a field of the [reward] table; put it under [reward]"),
    ("grpo = 5\n", "grpo = 5 must be a [grpo] table of its fields"),
])
def test_train_names_the_table_a_key_belongs_in(tmp_path, capsys, toml, message):
    config = tmp_path / "run.toml"
    config.write_text(toml)
    assert cli.main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_file_value_that_is_not_finite_is_refused(value):
    # A run's config is saved as JSON (null for inf or nan), so such a value could not be resumed.
    with pytest.raises(UserError, match="config field lr = .*: expected a finite number; fix the config file"):
        build_config(Example, None, {"lr": value})


@pytest.mark.parametrize(("argv", "flag"), [
    (["train", "--grad-clip", "inf"], "--grad-clip"),
    (["sft", "--weight-decay", "nan"], "--weight-decay"),
    (["sample", "--prompt", "P: x", "--temperature", "inf"], "--temperature"),
    (["play", "--opponent", "random", "--adjudicate=-inf"], "--adjudicate"),
])
def test_a_float_flag_that_is_not_finite_is_refused_before_any_work(tmp_path, capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, *(["--out", str(tmp_path / "run")] if argv[0] in ("train", "sft") else [])])
    assert exit_.value.code == 2
    assert f"argument {flag}: expected a finite number" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
