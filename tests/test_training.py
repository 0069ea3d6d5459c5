"""What `rookworld sft` and `rookworld train` share (training.py): flags, AdamW, the schedule, run configs."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os

import pytest
import torch
from conftest import one_error_line

from rookworld import cli, grpo, training
from rookworld.errors import UserError
from rookworld.rewards import RewardConfig
from rookworld.sft import SFTConfig
from rookworld.train import RunState, TrainConfig, runaway_reason


@pytest.mark.parametrize("config_cls", [SFTConfig, TrainConfig])
def test_lr_schedules(config_cls):
    cfg = config_cls(steps=10, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.0)
    factors = [training.lr_factor(cfg, s) for s in range(11)]
    assert factors[:3] == [0.5, 1.0, 1.0] and factors[10] == pytest.approx(0.0)
    assert factors[6] == pytest.approx(0.5)  # half way through the decay
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))
    floor = dataclasses.replace(cfg, min_lr_ratio=0.1)
    assert training.lr_factor(floor, 10) == pytest.approx(0.1)
    # the floor falls at step `steps`, one past the last: PyTorch's and Hugging Face's count (docs/grpo.md)
    assert training.lr_factor(floor, 9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))
    assert training.lr_factor(floor, 5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 8)))
    linear = dataclasses.replace(cfg, lr_schedule="linear")
    assert training.lr_factor(linear, 6) == pytest.approx(0.5)
    assert training.lr_factor(dataclasses.replace(cfg, lr_schedule="constant", min_lr_ratio=0.5), 9) == 1.0


def test_shared_flags_mean_the_same_in_both_commands():
    sft = {f.name: f for f in dataclasses.fields(SFTConfig)}
    grpo_run = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for name, help_text in training.SHARED_HELP.items():
        assert sft[name].metadata["help"] == grpo_run[name].metadata["help"] == help_text
    for cfg in (SFTConfig(steps=10, eval_every=0, checkpoint_every=0), TrainConfig(steps=10, eval_every=0,
                                                                                  checkpoint_every=0)):
        assert not any(training.eval_due(cfg, s) for s in range(1, 11))  # 0: off
        assert [s for s in range(1, 11) if training.checkpoint_due(cfg, s)] == [10]  # 0: only at the end
    cfg = TrainConfig(steps=10, eval_every=4, checkpoint_every=3)
    assert [s for s in range(1, 11) if training.eval_due(cfg, s)] == [4, 8, 10]
    assert [s for s in range(1, 11) if training.checkpoint_due(cfg, s)] == [3, 6, 9, 10]
    for config_cls in (SFTConfig, TrainConfig):
        for bad in ({"lr": 0}, {"lr_schedule": "step"}, {"min_lr_ratio": 1.5}, {"eval_every": -1},
                    {"beta2": 1.0}, {"threads": 0}):
            with pytest.raises(ValueError):
                config_cls(**bad)


def test_optimizer_decays_only_matrices_with_the_configured_betas():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    opt = training.make_optimizer(model, SFTConfig(weight_decay=0.3, beta1=0.8, beta2=0.95))
    decayed, plain = opt.param_groups
    assert [p.shape for p in decayed["params"]] == [(4, 3)] and decayed["weight_decay"] == 0.3
    assert len(plain["params"]) == 3 and plain["weight_decay"] == 0.0
    assert decayed["betas"] == (0.8, 0.95)


def test_a_resumed_adamw_keeps_its_moments_and_takes_the_betas_and_weight_decay_given():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    before = training.make_optimizer(model, SFTConfig(weight_decay=0.0, beta1=0.9, beta2=0.99))
    model(torch.ones(2, 3)).sum().backward()
    before.step()
    given = SFTConfig(weight_decay=0.1, beta1=0.5, beta2=0.9)
    resumed = training.make_optimizer(model, SFTConfig())
    training.load_optimizer(resumed, copy.deepcopy(before.state_dict()), given)
    decayed, plain = resumed.param_groups
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)
    assert decayed["betas"] == plain["betas"] == (0.5, 0.9)
    assert all(torch.equal(resumed.state[p]["exp_avg"], before.state[p]["exp_avg"]) for p in model.parameters())


def test_guards_turn_off_with_zero_from_flags_and_toml(tmp_path):
    history = [1.0] * 10 + [0.0] * 5
    on = TrainConfig(kl_max=0.1, reward_drop=0.5)
    assert "KL" in runaway_reason(on, {"kl/mean": 5.0}, RunState())
    assert "collapse" in runaway_reason(on, {}, RunState(reward_history=history))
    off = TrainConfig(kl_max=0, reward_drop=0)
    assert runaway_reason(off, {"kl/mean": 5.0}, RunState(reward_history=history)) is None
    parser = argparse.ArgumentParser()
    from rookworld.train import add_arguments, configs_from_args

    add_arguments(parser)
    toml = tmp_path / "run.toml"
    toml.write_text("kl_max = 0\nreward_drop = 0\n[grpo]\nbeta = 0.05\n[reward]\nbest_move_shape = \"linear\"\n")
    cfg, gcfg, rcfg = configs_from_args(parser.parse_args(["--config", str(toml)]))
    assert (cfg.kl_max, cfg.reward_drop, gcfg.beta, rcfg.best_move_shape) == (0, 0, 0.05, "linear")
    cfg, _, rcfg = configs_from_args(parser.parse_args(["--kl-max", "0", "--best-move-scale", "0.3"]))
    assert rcfg.best_move_scale == 0.3 and rcfg.best_move_shape == "exp"
    assert cfg.kl_max == 0 and cfg.reward_drop == 0.5


def _parse(command: str, argv: list[str]) -> argparse.Namespace:
    from rookworld import sft, train

    parser = argparse.ArgumentParser()
    (sft if command == "sft" else train).add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("command,classes", [("sft", {"sft": SFTConfig}),
                                             ("train", {"train": TrainConfig, "grpo": grpo.GRPOConfig,
                                                        "reward": RewardConfig})])
def test_resume_rules_are_the_same_in_both_commands(command, classes, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(UserError, match="no config.json"):
        training.run_configs(_parse(command, ["--resume", str(run)]), classes)
    first = next(iter(classes))
    saved = {name: dataclasses.asdict(cls()) for name, cls in classes.items()}
    saved[first].update(steps=20, lr_schedule="cosine", out="elsewhere")
    (run / "config.json").write_text(json.dumps(saved))
    toml = tmp_path / "c.toml"
    toml.write_text("steps = 5\n")
    with pytest.raises(UserError, match="leave out --config"):
        training.run_configs(_parse(command, ["--resume", str(run), "--config", str(toml)]), classes)
    with pytest.raises(UserError, match="leave out --out"):
        training.run_configs(_parse(command, ["--resume", str(run), "--out", str(tmp_path / "x")]), classes)
    configs = training.run_configs(_parse(command, ["--resume", str(run), "--lr", "0.5"]), classes)
    cfg = configs[first]
    assert (cfg.out, cfg.steps, cfg.lr, cfg.lr_schedule) == (str(run), 20, 0.5, "cosine")  # saved, flag over it
    assert "stretched" not in capsys.readouterr().err
    training.run_configs(_parse(command, ["--resume", str(run), "--steps", "40"]), classes)
    assert "stretched to end at step 40" in capsys.readouterr().err  # never silently
    # a flag that made the model cannot change it on resume: an error, never ignored; its saved value is fine
    kept, saved_value, other_value = (("--tokenizer-view", "fen", "named") if command == "sft"
                                      else ("--model", "runs/base", "runs/other"))
    saved[first][kept[2:].replace("-", "_")] = saved_value
    (run / "config.json").write_text(json.dumps(saved))
    with pytest.raises(UserError, match=f"{kept} {other_value}: --resume .* continues the model it saved"):
        training.run_configs(_parse(command, ["--resume", str(run), kept, other_value]), classes)
    training.run_configs(_parse(command, ["--resume", str(run), kept, saved_value]), classes)
    assert set(classes[first].KEPT_ON_RESUME) <= {f.name for f in dataclasses.fields(classes[first])}
    last = list(classes)[-1]  # a field another version had, in any table: refused, not ignored
    (run / "config.json").write_text(json.dumps({**saved, last: {**saved[last], "consolidate_steps": 50}}))
    with pytest.raises(UserError, match=f"its config.json sets consolidate_steps, which this version of rookworld "
                                        f"does not have .* --model {run}/checkpoint-last"):
        training.run_configs(_parse(command, ["--resume", str(run)]), classes)
    other = "train" if command == "sft" else "sft"
    (run / "config.json").write_text(json.dumps({other: {}}))
    with pytest.raises(UserError, match=f"no '{first}' table"):
        training.run_configs(_parse(command, ["--resume", str(run)]), classes)


def test_resume_without_checkpoint_is_one_clear_line(tmp_path, capsys):
    for command in ("sft", "train"):
        run = tmp_path / command
        run.mkdir()
        table = {"sft": {"out": str(run)}} if command == "sft" else {"train": {"out": str(run)}, "grpo": {}}
        (run / "config.json").write_text(json.dumps(table))
        assert cli.main([command, "--resume", str(run)]) == 2
        assert f"no complete checkpoint there (expected {run}/checkpoint-last), so no step to keep; start the run " \
               f"over with --out {run}" in one_error_line(capsys)


@pytest.mark.parametrize("command,elsewhere", [("sft", ["--init-from", "missing"]), ("train", ["--model", "missing"])])
def test_an_out_that_is_a_file_or_under_one_is_one_clear_line_before_any_work(command, elsewhere, tmp_path, capsys):
    (tmp_path / "notes").write_text("mine")
    for out in (tmp_path / "notes", tmp_path / "notes" / "run"):
        assert cli.main([command, "--out", str(out), "--data", str(tmp_path / "missing"), *elsewhere]) == 2
        assert f"--out {out}: {tmp_path / 'notes'} is a file, not a directory" in one_error_line(capsys)
    assert (tmp_path / "notes").read_text() == "mine"


# /proc takes no new files or directories, even from root (a chmod-ed directory would not stop root)
UNWRITABLE = "/proc/rookworld-test"
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")


@needs_proc
@pytest.mark.parametrize("command,elsewhere", [("sft", ["--init-from", "missing"]), ("train", ["--model", "missing"])])
def test_an_out_that_cannot_be_written_is_one_clear_line_before_any_work(command, elsewhere, tmp_path, capsys):
    out = f"{UNWRITABLE}/run"
    assert cli.main([command, "--out", out, "--data", str(tmp_path / "missing"), *elsewhere]) == 2
    assert f"--out {out}: cannot write in /proc (" in one_error_line(capsys)  # its nearest existing directory


def test_a_new_out_is_checked_but_not_made_before_any_work(tmp_path):
    training.check_new_out(tmp_path / "a" / "run")
    assert not (tmp_path / "a").exists() and list(tmp_path.iterdir()) == []  # no trace: the probe file is gone
