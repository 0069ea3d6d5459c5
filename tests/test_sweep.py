"""`rookworld sweep`: the space file, and real sweeps of tiny trials (a real `rookworld train` process each, with
a tiny random model and real fixture rows): trial directories, summary.json, the PNG, a resumed study, failed
trials with their reasons, pruning, --jobs 2, a journal storage, an interrupted sweep."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import one_error_line

from rookworld import cli, sweep
from rookworld.errors import UserError

pytestmark = pytest.mark.stockfish  # every trial runs rookworld train, which starts Stockfish


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> list[str]:
    """Train flags of a trial that takes seconds: a random 2-layer model with a chess tokenizer, trained on
    every fixture row (their eval split: 13 P and 30 A samples), 2 steps, an eval after each."""
    import torch
    from conftest import FIXTURES

    from rookworld.data.record import a_sample
    from rookworld.hub import save_model
    from rookworld.model import GPT, GPTConfig
    from rookworld.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("sweep_inputs")
    rows = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()
    rows += [s.prompt.removeprefix("A: ") + s.target for s in
             (a_sample(r["prompt"]) for r in json.loads((FIXTURES / "a_task_openings_sample.json").read_text()))]
    (root / "data.txt").write_text("\n".join(rows) + "\n")
    tokenizer = Tokenizer.train_chess(rows, vocab_size=257)
    torch.manual_seed(0)
    save_model(GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_positions=256, n_embd=32, n_layer=2, n_head=2)),
               tokenizer, root / "model")
    return ["--model", str(root / "model"), "--data", str(root / "data.txt"), "--max-new-tokens-p", "16",
            "--max-new-tokens-a", "16", "--steps", "2", "--batch-size", "2", "--group-size", "2", "--eval-every",
            "1", "--eval-limit", "4", "--eval-draws", "0", "--threads", "1", "--processes", "1", "--tensorboard",
            "false", "--checkpoint-every", "0", "--keep-last", "0"]


def space_file(tmp_path: Path, text: str, name: str = "space.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def with_flag(flags: list[str], flag: str, value: str | None) -> list[str]:
    """`flags` with `flag`'s value replaced by `value`, or the flag left out (value None)."""
    at = flags.index(flag)
    return flags[:at] + ([flag, value] if value is not None else []) + flags[at + 2:]


def summary(out: Path) -> dict:
    return json.loads((out / sweep.SUMMARY_FILE).read_text())


# ---------------------------------------------------------------- the space file


def test_space_ranges_and_choices_by_field_type(tmp_path):
    space = sweep.parse_space(space_file(tmp_path, """
lr = { low = 1e-5, high = 1e-3, log = true }
group_size = { low = 2, high = 8, step = 2 }
best_move_scale = { low = 0, high = 1 }          # a float field: ints are floats too
zero_std = { choices = ["keep", "drop"] }
mask_truncated = { choices = [true, false] }
eps_high = { choices = [0.2, 0.28] }
"""))
    assert space["lr"] == sweep.Dimension("lr", float, 1e-5, 1e-3, log=True)
    assert space["group_size"] == sweep.Dimension("group_size", int, 2, 8, step=2)
    assert space["best_move_scale"].low == 0.0 and isinstance(space["best_move_scale"].low, float)
    assert space["zero_std"].choices == ("keep", "drop") and space["mask_truncated"].kind is bool
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        values = {name: dim.suggest(trial) for name, dim in space.items()}
        assert 1e-5 <= values["lr"] <= 1e-3 and values["group_size"] in (2, 4, 6, 8)
        assert values["zero_std"] in ("keep", "drop") and values["mask_truncated"] in (True, False)
        # each value goes back to rookworld train as its flag
        assert sweep.flag_args({"mask_truncated": values["mask_truncated"]})[0] == "--mask-truncated"
        study.tell(trial, 0.0)
    assert sweep.flag_args({"lr": 1e-05, "mask_truncated": False, "zero_std": "keep"}) == [
        "--lr", "1e-05", "--mask-truncated", "false", "--zero-std", "keep"]


@pytest.mark.parametrize(("text", "message"), [
    ("lrr = { low = 1e-5, high = 1e-3 }", r"unknown field 'lrr'.*did you mean lr"),
    ("colour = { choices = [1] }", r"unknown field 'colour'.*rookworld train --help"),
    ("lr = 0.001", r"lr must be a table"),
    ("lr = { low = 1e-5, hi = 1e-3 }", r"unknown key\(s\) \['hi'\]"),
    ("lr = { low = 1e-5 }", r"needs both low and high"),
    ("lr = { low = 1e-3, high = 1e-5 }", r"low 0.001 must be below high"),
    ("lr = { low = 0, high = 1e-3, log = true }", r"log scale needs low > 0"),
    ("group_size = { low = 2.5, high = 8 }", r"2.5 is not a int"),
    ("zero_std = { low = 1, high = 2 }", r"zero_std is a str field: give choices"),
    ("zero_std = { choices = [] }", r"non-empty list"),
    ("zero_std = { choices = ['keep', 1] }", r"1 is not a str"),
    ("mask_truncated = { choices = [1, 0] }", r"1 is not a bool"),
    ("lr = { choices = [1e-5], low = 1e-5 }", r"either choices or low/high"),
    ("out = { choices = ['a', 'b'] }", r"out cannot be searched"),
    ("", r"names no field"),
])
def test_bad_space_files_name_the_field_and_the_fix(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        sweep.parse_space(space_file(tmp_path, text))


def test_failure_reasons_from_the_train_output():
    kl = ("step 2: KL 0.0031 above kl_max 1e-12; rolled back\n"
          "rookworld train: error: 1 rollbacks (KL 0.0031 above kl_max 1e-12); the last good state is saved in d")
    drop = "rookworld train: error: 4 rollbacks (reward collapse: 5-step mean 0.1 vs best 0.7); the last good ..."
    assert sweep.failure_reason(kl, 2) == "guard: kl runaway"
    assert sweep.failure_reason(drop, 2) == "guard: reward drop"
    assert sweep.failure_reason("rookworld train: error: model not found: x\n", 2) == "error: model not found: x"
    assert sweep.failure_reason("Traceback ...\n  File x\nRuntimeError: boom\n", 1) == "crash: RuntimeError: boom"
    assert sweep.failure_reason("", -9) == "crash: killed by SIGKILL"


def test_a_resumed_seeded_sweep_draws_new_points_and_a_new_one_repeats_them(tmp_path):
    """The sampler's seed goes on with the study's trials. Optuna's own ask and tell stand for the trials."""
    space_path = space_file(tmp_path, "lr = { low = 1e-5, high = 1e-3, log = true }")
    space = sweep.parse_space(space_path)
    parser = argparse.ArgumentParser()
    sweep.add_arguments(parser)

    def command(out: Path, trials: int = 2) -> list[float]:
        """The lr values one `sweep --sampler-seed 0` command draws."""
        args = parser.parse_args(["--space", space_path, "--trials", str(trials), "--out", str(out),
                                  "--sampler-seed", "0"])
        out.mkdir(exist_ok=True)
        study = sweep.open_study(args, space, out)
        drawn = []
        for _ in range(trials):
            trial = study.ask()
            drawn.append(space["lr"].suggest(trial))
            study.tell(trial, 0.0)
        return drawn

    first, again = command(tmp_path / "a"), command(tmp_path / "a")
    assert len(set(first + again)) == 4  # the same command again: two new points
    assert command(tmp_path / "b") + command(tmp_path / "b") == first + again  # a new study: the same draws


# ---------------------------------------------------------------- bad commands: refused before any trial


@pytest.mark.parametrize(("flags", "message"), [
    (["--lr", "1e-4"], "--lr given as a flag and searched"),
    (["--eval-every", "0"], "eval_every 0 turns off the periodic eval"),
    (["--resume", "x"], "--resume is a train flag"),
    (["--metric", "reward/mean"], "metrics start with eval/"),
    (["--storage", "study.txt"], "an Optuna RDB URL"),
    (["--steps", "0"], "steps must be >= 1"),
])
def test_bad_commands_fail_before_any_trial(tmp_path, capsys, flags, message):
    space = space_file(tmp_path, "lr = { low = 1e-5, high = 1e-3, log = true }")
    assert cli.main(["sweep", "--space", space, "--trials", "1", "--out", str(tmp_path / "s"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("s/trial-*"))


# ---------------------------------------------------------------- real sweeps


@pytest.mark.integration
def test_sweep_writes_trials_summary_and_plot_and_resumes(tiny, tmp_path, capsys):
    out = tmp_path / "sweep"
    space = space_file(tmp_path, "lr = { low = 1e-5, high = 1e-3, log = true }\nzero_std = { choices = "
                                 "['keep', 'drop'] }\n")
    command = ["sweep", "--space", space, "--trials", "2", "--jobs", "2", "--out", str(out), "--pruner", "none",
               *tiny]
    assert cli.main(command) == 0
    first = summary(out)
    assert (first["trials"], first["complete"], first["pruned"], first["failed"], first["failures"]) == (2, 2, 0, 0, {})
    assert first["best_trial_dir"] in (str(out / "trial-0000"), str(out / "trial-0001"))
    assert set(first["best_params"]) == {"lr", "zero_std"} and isinstance(first["best_value"], float)
    assert (out / sweep.PLOT_FILE).stat().st_size > 10_000 and (out / sweep.DB_FILE).exists()
    for trial in ("trial-0000", "trial-0001"):  # a normal run directory: its config holds the trial's values
        config = json.loads((out / trial / "config.json").read_text())
        assert config["train"]["threads"] == 1 and config["train"]["steps"] == 2
        assert [json.loads(line)["step"] for line in (out / trial / "eval.jsonl").read_text().splitlines()] == [0, 1, 2]
    best = json.loads((Path(first["best_trial_dir"]) / "config.json").read_text())["train"]
    assert (best["lr"], best["zero_std"]) == (first["best_params"]["lr"], first["best_params"]["zero_std"])
    printed = capsys.readouterr().out
    assert "2 trials: 2 complete, 0 pruned, 0 failed" in printed and "trial 1 complete" in printed
    assert cli.main(["plot", first["best_trial_dir"]]) == 0  # rookworld plot reads a trial directory

    assert cli.main(command) == 0  # the same command again: the study goes on
    again = summary(out)
    assert (again["trials"], again["complete"]) == (4, 4)
    assert sorted(p.name for p in out.glob("trial-*")) == [f"trial-{n:04d}" for n in range(4)]
    assert again["best_value"] >= first["best_value"]

    # another base or space cannot join the study: the error names the fields that differ
    fix = "run the same command, or start a new study in another --out DIR"
    assert cli.main([*command[:-len(tiny)], *tiny, "--beta", "0.5"]) == 2
    assert f"was started with another base (base.grpo.beta: saved 0.02, given 0.5); {fix}" in one_error_line(capsys)
    other = space_file(tmp_path, "lr = { low = 1e-5, high = 1e-2, log = true }\nzero_std = { choices = ['keep', "
                                 "'drop'] }\n", "other.toml")
    assert cli.main(["sweep", "--space", other, *command[3:]]) == 2
    assert f"another space (space.lr.high: saved 0.001, given 0.01); {fix}" in one_error_line(capsys)

    # nor can a new study (another --study, or the same name in another storage) take over DIR: its trial 0
    # would be DIR/trial-0000; refused before any trial, nothing of the first study's replaced
    kept = {path: path.read_bytes() for path in (out / sweep.SUMMARY_FILE, out / "trial-0000" / sweep.TRIAL_LOG)}
    for new_study in (["--study", "s2"], ["--storage", str(tmp_path / "new.journal")]):
        assert cli.main([*command, *new_study]) == 2
        assert (f"--out {out} holds the sweep of another study ({out / sweep.SUMMARY_FILE} of study 'sweep' with 4 "
                f"trials; study ") in one_error_line(capsys)
    assert all(path.read_bytes() == data for path, data in kept.items())
    # ... and the refused new studies are not left behind, empty, in their storages
    assert optuna.get_all_study_names(f"sqlite:///{out / sweep.DB_FILE}") == ["sweep"]
    journal = optuna.storages.journal.JournalFileBackend(str(tmp_path / "new.journal"))
    assert optuna.get_all_study_names(optuna.storages.JournalStorage(journal)) == []
    (out / sweep.SUMMARY_FILE).unlink()  # the trial directories alone tell too
    assert cli.main([*command, "--study", "s2"]) == 2
    error = one_error_line(capsys)
    assert "(trial-0000, trial-0001, trial-0002, ...; study 's2' in this storage has 0 trials)" in error
    assert len(list(out.glob("trial-*"))) == 4 and not (out / sweep.SUMMARY_FILE).exists()


@pytest.mark.integration
def test_failed_trials_are_recorded_with_their_reason_and_the_sweep_goes_on(tiny, tmp_path, capsys):
    journal = str(tmp_path / "study.journal")  # a journal file storage
    # kl_max far below any KL with one rollback allowed: the train process stops on its guard at step 2
    guard = space_file(tmp_path, "kl_max = { choices = [1e-12] }")
    learn = ["--zero-std", "keep", "--entropy-coef", "0.01", "--lr", "1e-3", "--beta", "0.1", "--max-rollbacks", "0"]
    out = tmp_path / "guard"
    assert cli.main(["sweep", "--space", guard, "--trials", "1", "--out", str(out), "--storage", journal,
                     "--study", "guarded", *tiny, *learn]) == 0
    found = summary(out)
    assert (found["trials"], found["failed"], found["failures"]) == (1, 1, {"guard: kl runaway": 1})
    assert found["study"] == "guarded"
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["guarded"]
    assert found["best_value"] is None and not (out / sweep.PLOT_FILE).exists()
    assert "rollbacks (KL" in (out / "trial-0000" / sweep.TRIAL_LOG).read_text()
    assert Path(journal).stat().st_size > 0 and not (out / sweep.DB_FILE).exists()

    # a value train refuses fails its trial at once; a metric no eval logs fails each trial; the sweep goes on
    bad = space_file(tmp_path, "zero_std = { choices = ['bogus'] }\nlr = { low = 1e-4, high = 1e-3 }", "bad.toml")
    out = tmp_path / "bad"
    assert cli.main(["sweep", "--space", bad, "--trials", "2", "--out", str(out), *tiny]) == 0
    found = summary(out)
    assert (found["trials"], found["failed"]) == (2, 2)
    assert list(found["failures"]) == ["invalid TrainConfig: zero_std must be one of ('keep', 'drop', 'resample')"]
    out = tmp_path / "metric"
    lr = space_file(tmp_path, "lr = { low = 1e-4, high = 1e-3 }", "lr.toml")
    base = space_file(tmp_path, "threads = 1\nprocesses = 1\n", "base.toml")  # the trial's, not cores / jobs
    flags = with_flag(with_flag(tiny, "--threads", None), "--processes", None)
    assert cli.main(["sweep", "--space", lr, "--trials", "1", "--out", str(out), "--metric", "eval/reward/meen",
                     "--config", base, *flags]) == 0
    (reason,) = summary(out)["failures"]
    assert reason.startswith("eval/reward/meen is not an eval metric (eval.jsonl has eval/reward/mean")
    command = (out / "trial-0000" / sweep.TRIAL_LOG).read_text().splitlines()[0]
    assert "--threads" not in command and "--processes" not in command
    trained = json.loads((out / "trial-0000" / "config.json").read_text())["train"]
    assert (trained["threads"], trained["processes"]) == (1, 1)
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.integration
def test_median_pruner_its_warm_up_and_the_direction(tiny, tmp_path, capsys):
    # eval/reward/mean/n counts the eval samples: 4 with eval_limit 4, 16 with 16, so a trial of 4 is worse
    # than the median of trials of 16. The seeded sampler draws 16 then 4.
    space = space_file(tmp_path, "eval_limit = { choices = [4, 16] }")
    flags = ["--space", space, "--trials", "2", "--metric", "eval/reward/mean/n", "--sampler-seed", "0",
             "--pruner-startup-trials", "1", *with_flag(tiny, "--eval-limit", None)]
    assert cli.main(["sweep", "--out", str(tmp_path / "median"), *flags]) == 0
    found = summary(tmp_path / "median")
    assert (found["complete"], found["pruned"], found["best_params"]) == (1, 1, {"eval_limit": 16})
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{tmp_path / 'median' / sweep.DB_FILE}")
    assert study.trials[1].intermediate_values == {1: 4.0}  # pruned at its first report: the eval after step 1

    for name, extra, best in (("none", ["--pruner", "none"], 16), ("warm-up", ["--pruner-warmup-steps", "3"], 16),
                              ("minimize", ["--pruner", "none", "--direction", "minimize"], 4)):
        # no pruner, or none before step 3: a trial reports after steps 1 and 2
        assert cli.main(["sweep", "--out", str(tmp_path / name), *extra, *flags]) == 0
        found = summary(tmp_path / name)
        assert (found["complete"], found["pruned"], found["best_params"]) == (2, 0, {"eval_limit": best})
    assert cli.main(["sweep", "--out", str(tmp_path / "none"), "--direction", "minimize", *flags]) == 2
    assert "was started with --direction maximize" in capsys.readouterr().err


@pytest.mark.integration
def test_sigterm_ends_the_trial_processes_and_records_the_trial(tiny, tmp_path):
    space = space_file(tmp_path, "lr = { low = 1e-5, high = 1e-3, log = true }")
    out = tmp_path / "sweep"
    flags = with_flag(tiny, "--steps", "1000")
    proc = subprocess.Popen([sys.executable, "-m", "rookworld.cli", "sweep", "--space", space, "--trials", "1",
                             "--out", str(out), *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "trial-0000" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while not (metrics.exists() and metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    command = (out / "trial-0000" / sweep.TRIAL_LOG).read_text().splitlines()[0]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in err
    found = summary(out)
    assert (found["trials"], found["failures"]) == (1, {"interrupted": 1})
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid) == command]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
