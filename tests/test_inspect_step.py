"""`rookworld inspect` on a real tiny run: --resume takes the run's next step from its checkpoint, and --json
paths are checked before the step. (The step told in full: tests/test_train.py, test_inspect_*.)"""

from __future__ import annotations

import json

import pytest
from conftest import one_error_line
from test_train import tiny_run_inputs  # noqa: F401 (the fixture: a tiny random model and real data rows)

from rookworld import cli

pytestmark = pytest.mark.stockfish


def test_inspect_resume_takes_the_runs_next_step_from_its_latest_checkpoint(tiny_run_inputs, tmp_path):  # noqa: F811
    """Inspecting `--resume RUN` is the step `train --resume RUN` takes next: the checkpoint's weights (no longer
    the KL reference's), the sampler's position, the optimizer's moments, and the learning rate of that step
    from the flags given (with 2 PPO epochs the second one's loss follows the first update), so both report the
    same rewards and update."""
    model_dir, data = tiny_run_inputs
    run = tmp_path / "run"
    flags = ["--data", str(data), "--batch-size", "3", "--group-size", "4", "--max-new-tokens-p", "16",
             "--max-new-tokens-a", "16", "--processes", "1", "--threads", "1", "--beta", "0.05", "--entropy-coef",
             "0.01", "--zero-std", "keep", "--lr", "1e-2", "--warmup-steps", "5", "--num-iterations", "2",
             "--eval-every", "0", "--tensorboard", "false"]
    assert cli.main(["train", "--model", str(model_dir), *flags, "--steps", "2", "--out", str(run)]) == 0
    report_file = tmp_path / "reports" / "step3.json"  # its directory is made
    resumed = ["--steps", "3", "--lr", "5e-3"]  # warm-up: step 3 learns at 3/5 of it
    assert cli.main(["inspect", "--resume", str(run), *resumed, "--json", str(report_file)]) == 0
    report = json.loads(report_file.read_text())
    assert report["step"] == 3
    assert all(c["kl/mean"] > 1e-6 for p in report["prompts"] for c in p["completions"])  # trained weights

    assert cli.main(["train", "--resume", str(run), *resumed]) == 0
    third = json.loads((run / "metrics.jsonl").read_text().splitlines()[2])
    assert third["step"] == 3
    assert report["reward_before"] == pytest.approx(third["reward/mean"])
    for key in ("loss", "pg_loss", "kl/mean", "grad_norm"):
        assert report["update"][key] == pytest.approx(third[key], rel=1e-4), key


def test_inspect_refuses_a_json_path_that_is_a_directory_before_the_step(tmp_path, capsys):
    code = cli.main(["inspect", "--model", str(tmp_path / "no-model"), "--json", str(tmp_path)])
    assert code == 2
    assert one_error_line(capsys) == (f"rookworld inspect: error: --json {tmp_path} is a directory: give the path "
                                      "of a file")
