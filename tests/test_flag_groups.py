"""`rookworld --version`, and the `--help` sections of `rookworld train` and `rookworld sft`: every flag has
exactly one place."""

import argparse
import dataclasses
import importlib.metadata
from dataclasses import dataclass, field

import pytest

from rookworld import cli, grpo
from rookworld.config import add_config_arguments
from rookworld.flag_groups import ADVANCED, SFT, TRAIN
from rookworld.rewards import RewardConfig
from rookworld.sft import SFTConfig
from rookworld.train import TrainConfig


def _placed(sections):
    return [name for names in sections.values() for name in names]


@pytest.mark.parametrize("sections, classes", [(TRAIN, [TrainConfig, grpo.GRPOConfig, RewardConfig]),
                                               (SFT, [SFTConfig])])
def test_every_field_in_exactly_one_section(sections, classes):
    placed = _placed(sections)
    fields = [f.name for cls in classes for f in dataclasses.fields(cls)]
    assert sorted(placed) == sorted(fields)  # no field missing, none listed twice, no stale names


def test_advanced_names_are_real_fields():
    known = {f.name for cls in (TrainConfig, grpo.GRPOConfig, RewardConfig, SFTConfig) for f in dataclasses.fields(cls)}
    assert known >= ADVANCED


def test_version_and_unknown_command(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"rookworld {importlib.metadata.version('rookworld')}"
    with pytest.raises(SystemExit) as done:
        cli.main(["bogus"])
    assert done.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err


def _help(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return capsys.readouterr().out


def _section_of(text, flag, titles):
    """The last section title printed before the flag's line."""
    at = text.index(f"  {flag} ")
    return max((text.rfind(f"\n{title}:", 0, at), title) for title in titles)[1]


def test_train_help_has_sections_and_marks_advanced(capsys):
    text = _help("train", capsys)
    assert _section_of(text, "--kl-max", TRAIN) == "guards (0 turns one off)"
    assert _section_of(text, "--beta", TRAIN) == "the default run's knobs: KL and the A task"
    assert _section_of(text, "--temperature-p", TRAIN) == "the default run's knobs: sampling"
    assert _section_of(text, "--aggregation", TRAIN) == "seed controls: advantages and loss (GRPO, DAPO, Dr. GRPO, TRL)"
    assert _section_of(text, "--micro-batch-size", TRAIN) == "hardware"
    flat = " ".join(text.split())
    assert "--std-floor STD_FLOOR advanced:" in flat
    assert "--lr LR advanced:" not in flat


def test_sft_help_has_sections(capsys):
    text = _help("sft", capsys)
    assert _section_of(text, "--init-from", SFT) == "model and data"
    assert _section_of(text, "--export", SFT) == "checkpoints and logging"


def test_field_without_section_is_refused():
    @dataclass
    class Extra:
        placed: int = field(default=1, metadata={"help": "in a section"})
        stray: int = field(default=2, metadata={"help": "in none"})

    with pytest.raises(ValueError, match="'stray'.*flag_groups"):
        add_config_arguments(argparse.ArgumentParser(), Extra, {"section": ["placed"]})


def test_grouped_flags_still_parse():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TrainConfig, TRAIN, ADVANCED)
    args = parser.parse_args(["--kl-max", "0", "--lr", "1e-4"])
    assert args.kl_max == 0 and args.lr == 1e-4 and args.steps is None
