"""Run logging: JSONL files (null for non-finite), resume without duplicates, TensorBoard, rank 0 only, progress."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import re

import pytest
import torch

from rookworld.errors import UserError
from rookworld.log import Progress, RunLogger, eval_change, eval_line, read_records


def strict_lines(path) -> list[dict]:
    """Parse JSONL refusing NaN/Infinity tokens, which are not JSON."""
    def refuse(token):
        raise AssertionError(f"{path} contains {token}")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_writes_config_metrics_eval_and_samples_with_null_for_non_finite(tmp_path):
    logger = RunLogger(tmp_path, {"lr": 1e-5, "out": tmp_path, "tasks": ["P", "A"]}, tensorboard=False)
    logger.log(1, {"reward/mean": 0.25, "kl/mean": math.nan, "grad_norm": math.inf, "tokens": 12})
    # each line reaches the file at once: a crash loses nothing already logged
    assert strict_lines(tmp_path / "metrics.jsonl") == [
        {"step": 1, "reward/mean": 0.25, "kl/mean": None, "grad_norm": None, "tokens": 12}]
    logger.log_eval(1, {"eval/A/exact": 0.5})
    logger.log_samples(1, [{"prompt": "A: x", "completion": "y", "reward": -math.inf}])
    logger.close()
    assert json.loads((tmp_path / "config.json").read_text()) == {"lr": 1e-5, "out": str(tmp_path), "tasks": ["P", "A"]}
    assert strict_lines(tmp_path / "eval.jsonl") == [{"step": 1, "eval/A/exact": 0.5}]
    assert strict_lines(tmp_path / "samples.jsonl") == [
        {"step": 1, "prompt": "A: x", "completion": "y", "reward": None}]


def test_resume_truncates_records_after_the_checkpoint_step(tmp_path):
    with RunLogger(tmp_path, {}, tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log(step, {"reward/mean": step / 10})
            logger.log_samples(step, [{"completion": str(step)}])
        logger.log_eval(2, {"eval/A/exact": 0.1})
        logger.log_eval(4, {"eval/A/exact": 0.2})
    with (tmp_path / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 6, "rew')  # the process died in the middle of a line

    with RunLogger(tmp_path, {}, tensorboard=False, resume_step=3) as logger:
        for step in (4, 5, 6):
            logger.log(step, {"reward/mean": step})
    assert [(r["step"], r["reward/mean"]) for r in strict_lines(tmp_path / "metrics.jsonl")] == \
        [(1, 0.1), (2, 0.2), (3, 0.3), (4, 4), (5, 5), (6, 6)]
    assert [r["step"] for r in strict_lines(tmp_path / "eval.jsonl")] == [2]
    assert [r["step"] for r in strict_lines(tmp_path / "samples.jsonl")] == [1, 2, 3]


def test_a_fresh_run_refuses_a_directory_with_metrics(tmp_path):
    with RunLogger(tmp_path, {}, tensorboard=False) as logger:
        logger.log(1, {"loss": 1.0})
    with pytest.raises(UserError, match="already holds"):
        RunLogger(tmp_path, {}, tensorboard=False)


def test_a_run_that_saved_no_checkpoint_is_started_over_and_its_records_replaced(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, {}) as logger:
        logger.log_eval(0, {"eval/A/exact": 0.5})  # killed after its step-0 eval, before its first step
    with pytest.raises(UserError, match="already holds a run's records"):
        RunLogger(tmp_path, {}, tensorboard=False)
    with RunLogger(tmp_path, {}, start_over=True) as logger:
        logger.log_eval(0, {"eval/A/exact": 0.75})
        logger.log(1, {"loss": 1.0})
        logger.log_samples(1, [{"completion": "x"}])
    assert "starting it over (its logs are replaced)" in capsys.readouterr().err
    assert strict_lines(tmp_path / "eval.jsonl") == [{"step": 0, "eval/A/exact": 0.75}]  # the old one's is gone
    assert [r["step"] for r in strict_lines(tmp_path / "metrics.jsonl")] == [1]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/A/exact")] == [(0, 0.75)]


def test_non_zero_rank_writes_nothing(tmp_path):
    out = tmp_path / "run"
    with RunLogger(out, {"a": 1}, rank=1) as logger:
        logger.log(1, {"loss": 1.0})
        logger.log_eval(1, {"eval/A/exact": 1.0})
        logger.log_samples(1, [{"completion": "x"}])
    assert not out.exists()


@pytest.mark.parametrize("value", ["0.5", torch.tensor(0.5), None, True])
def test_metrics_must_be_plain_numbers(tmp_path, value):
    with RunLogger(tmp_path, {}, tensorboard=False) as logger, pytest.raises(TypeError, match="reward/mean"):
        logger.log(1, {"reward/mean": value})


def test_tensorboard_gets_the_same_slash_names(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, {}) as logger:
        logger.log(1, {"reward/mean": 0.5, "kl/mean": 0.01})
        logger.log(2, {"reward/mean": 0.75, "kl/mean": 0.02})
        logger.log_eval(2, {"eval/A/exact": 0.9})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward/mean", "kl/mean", "eval/A/exact"}
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.5), (2, 0.75)]


def test_tensorboard_forgets_the_re_run_steps_of_a_resumed_run(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, {}) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"loss": float(step)})
    with RunLogger(tmp_path, {}, resume_step=1) as logger:
        for step in (2, 3):
            logger.log(step, {"loss": step * 10.0})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0), (2, 20.0), (3, 30.0)]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_without_the_package_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="pip install wandb"):
        RunLogger(tmp_path, {}, tensorboard=False, wandb_project="rookworld")


def test_read_records_reports_a_bad_line_that_is_not_the_last(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(UserError, match="metrics.jsonl:2"):
        read_records(path)
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    assert read_records(path) == [{"step": 1}]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_is_a_live_bar_with_metrics_speed_and_eta():
    screen = Terminal()
    with Progress(10, start=2, stream=screen) as bar:
        bar.update(4, {"reward/mean": 0.51234, "kl/mean": 0.003})
        text = bar.stats_text(4, {"reward/mean": 0.51234, "kl/mean": 0.003})
    assert re.fullmatch(r"reward 0\.5123 \| kl 0\.003 \| [0-9.e-]+ s/step \| ETA \d+:\d\d:\d\d", text)
    assert "reward 0.5123" in screen.getvalue() and "4/10" in screen.getvalue()
    assert "train step" not in screen.getvalue()  # no plain lines beside the bar


def test_progress_without_a_terminal_prints_the_first_every_nth_and_last_step():
    log_file = io.StringIO()  # a pipe or file: isatty() is False
    with Progress(25, every=10, stream=log_file) as bar:
        for step in range(1, 26):
            bar.update(step, {"reward/mean": step / 100, "kl/mean": 0.001})
    lines = log_file.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "train step 1/25", "train step 10/25", "train step 20/25", "train step 25/25"]
    assert re.fullmatch(r"train step 10/25 \| reward 0\.1 \| kl 0\.001 \| [0-9.e-]+ s/step \| "
                        r"ETA \d+:\d\d:\d\d", lines[1])
    assert lines[-1].endswith("ETA 0:00:00")


def test_progress_of_a_resumed_run_starts_its_lines_at_the_first_new_step():
    log_file = io.StringIO()
    with Progress(30, start=12, every=10, description="sft", fields={"loss": "loss"}, stream=log_file) as bar:
        for step in range(13, 31):
            bar.update(step, {"loss": 1.5})
    assert [line.split(" | ")[:2] for line in log_file.getvalue().splitlines()] == [
        ["sft step 13/30", "loss 1.5"], ["sft step 20/30", "loss 1.5"], ["sft step 30/30", "loss 1.5"]]


def test_progress_prints_nothing_on_other_ranks_and_refuses_a_zero_interval():
    for stream in (io.StringIO(), Terminal()):
        with Progress(10, rank=1, stream=stream) as bar:
            bar.update(1, {"reward/mean": 0.5})
            bar.note("eval step 1")
        assert stream.getvalue() == ""
    with pytest.raises(ValueError, match="every"):
        Progress(10, every=0)


START = {"step": 0, "eval/P/acpl": 3.5, "eval/P/acpl/se": 0.3, "eval/P/best_move_acc": 0.09,
         "eval/P/best_move_acc/se": 0.012, "eval/A/exact": 0.95, "eval/A/exact/se": 0.009, "eval/reward/mean": 0.6}
END = {"step": 100, "eval/P/acpl": 3.1, "eval/P/acpl/se": 0.4, "eval/P/best_move_acc": 0.1,
       "eval/P/best_move_acc/se": 0.012, "eval/A/exact": 0.94, "eval/selfplay/legal_half_moves": 18.0}


def test_an_eval_line_shows_the_headline_metrics_with_their_errors():
    assert eval_line(0, START) == "eval step 0 | P/acpl 3.5 ± 0.3 | best-move 0.09 ± 0.012 | A/exact 0.95 ± 0.009"
    assert eval_line(100, END) == ("eval step 100 | P/acpl 3.1 ± 0.4 | best-move 0.1 ± 0.012 | A/exact 0.94 | "
                                   "self-play 18")
    assert eval_line(5, {"eval/reward/mean": 0.5}) == "eval step 5"


def test_the_change_of_a_run_is_its_first_eval_against_its_last():
    assert eval_change([START, {"step": 50, "eval/P/acpl": 9.0}, END]) == (
        "held-out change, step 0 → 100 (unpaired SE): P/acpl 3.5 → 3.1 (Δ -0.4 ± 0.5) | "  # hypot(0.3, 0.4)
        "best-move 0.09 → 0.1 (Δ +0.01 ± 0.017) | A/exact 0.95 → 0.94 (Δ -0.01)")  # the last eval has no SE
    assert eval_change([START]) is None and eval_change([]) is None
    deltas = {"eval/P/acpl/delta/se": 0.12, "eval/P/best_move_acc/delta/se": 0.008, "eval/A/exact/delta/se": 0.002}
    assert eval_change([START, END | deltas]) == (
        "held-out change, step 0 → 100 (paired SE): P/acpl 3.5 → 3.1 (Δ -0.4 ± 0.12) | "
        "best-move 0.09 → 0.1 (Δ +0.01 ± 0.008) | A/exact 0.95 → 0.94 (Δ -0.01 ± 0.002)")
    partly = {k: v for k, v in deltas.items() if "A/" not in k}  # one metric unpaired: all unpaired
    assert "(unpaired SE): P/acpl 3.5 → 3.1 (Δ -0.4 ± 0.5)" in eval_change([START, END | partly])
    resumed = {**START, "step": 60}  # a first eval after step 0 is not what the deltas are paired with
    assert "(unpaired SE)" in eval_change([resumed, END | deltas])


def test_a_note_is_a_line_of_its_own_beside_the_steps_and_above_a_bar():
    log_file, screen = io.StringIO(), Terminal()
    for stream in (log_file, screen):
        with Progress(2, stream=stream) as bar:
            bar.update(1, {"reward/mean": 0.5})
            bar.note("eval step 1 | P/acpl 3.5 ± 0.3")
            bar.update(2, {"reward/mean": 0.5})
    assert log_file.getvalue().splitlines()[1] == "eval step 1 | P/acpl 3.5 ± 0.3"
    assert "eval step 1 | P/acpl 3.5 ± 0.3\n" in screen.getvalue()
