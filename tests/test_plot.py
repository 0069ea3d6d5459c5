"""Dashboards from real RunLogger output, and the `rookworld plot` command."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from conftest import one_error_line

from rookworld import cli
from rookworld.errors import UserError
from rookworld.log import RunLogger
from rookworld.plot import dashboard, figure_of, isolated, load_run, moving_average, panels_for

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir, seed: int, steps: int = 40, with_eval: bool = True) -> None:
    rng = np.random.default_rng(seed)
    with RunLogger(run_dir, {"seed": seed}, tensorboard=False) as logger:
        for step in range(1, steps + 1):
            reward_p, reward_a = rng.uniform(0, 1, size=2)
            logger.log(step, {
                "reward/mean": (reward_p + reward_a) / 2, "reward/P": reward_p, "reward/A": reward_a,
                "kl/mean": math.nan if step == 5 else step * 1e-3, "beta": 0.04, "entropy": 2.0 - step / 40,
                "grad_norm": float(rng.uniform(0.5, 2)), "time/step": 1.5, "frac_zero_std": 0.25,
                "kl_share": 0.1,
            })
            if with_eval and step % 10 == 0:
                logger.log_eval(step, {"eval/A/exact": step / 100, "eval/sampled/A/exact": step / 120,
                                       "eval/P/best_move_acc": 0.3, "eval/count/A": 5.0})


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_dashboard_of_two_runs_is_a_png_with_a_panel_per_metric(tmp_path):
    write_run(tmp_path / "run-a", seed=1)
    write_run(tmp_path / "run-b", seed=2, with_eval=False)
    out = dashboard([tmp_path / "run-a", tmp_path / "run-b"], smooth=5)
    assert out == tmp_path / "run-a" / "dashboard.png"
    assert out.stat().st_size > 50_000
    assert png_size(out) == (1650, 1360)  # 3 columns x 4 rows of panels at 100 dpi
    runs = [load_run(tmp_path / "run-a"), load_run(tmp_path / "run-b")]
    assert [title for title, _keys, _source in panels_for(runs)] == [
        "reward", "KL to reference", "KL coefficient beta", "entropy", "gradient norm", "seconds per step",
        "groups with zero reward std (fraction)", "KL share of the loss", "held-out A/exact",
        "held-out P/best_move_acc"]


def test_panels_only_for_logged_metrics(tmp_path):
    with RunLogger(tmp_path, {}, tensorboard=False) as logger:
        logger.log(1, {"reward/A": 0.5, "custom/thing": 1.0})
        logger.log_eval(1, {"eval/reward/mean": 0.2})
    run = load_run(tmp_path)
    assert panels_for([run]) == [("reward", ("reward/mean", "reward/P", "reward/A"), "train"),
                                 ("held-out reward/mean", ("eval/reward/mean", "eval/sampled/reward/mean"), "eval")]
    steps, values = run.train["reward/A"]
    assert steps.tolist() == [1] and values.tolist() == [0.5]


def test_nothing_to_plot_is_a_user_error(tmp_path):
    with RunLogger(tmp_path, {}, tensorboard=False) as logger:
        logger.log(1, {"custom/thing": 1.0})
    with pytest.raises(UserError, match="nothing to plot"):
        dashboard([tmp_path])


def test_moving_average_is_trailing_and_skips_nulls():
    values = np.array([1.0, 3.0, math.nan, 5.0, 7.0])
    assert moving_average(values, 2).tolist() == [1.0, 2.0, 3.0, 5.0, 6.0]
    assert moving_average(values, 1) is values
    assert np.isnan(moving_average(np.array([math.nan, 1.0]), 1)[0])


def test_a_value_without_a_logged_neighbour_is_drawn_as_a_dot(tmp_path):
    """A line shows no point that stands alone: the one step of a run cut short, or a value between nulls."""
    with RunLogger(tmp_path, {}, tensorboard=False) as logger:
        logger.log(1, {"reward/mean": 0.5})
    (reward_ax,) = [ax for ax in figure_of([load_run(tmp_path)]).axes if ax.get_visible()]
    (line,) = reward_ax.lines
    assert (line.get_marker(), line.get_markevery()) == (".", [True])
    values = np.array([1.0, math.nan, 2.0, 3.0, math.nan, 4.0, math.nan])
    assert isolated(values) == [True, False, False, False, False, True, False]


def test_cli_writes_the_dashboard_where_asked(tmp_path, capsys):
    write_run(tmp_path / "run", seed=3, steps=12)
    out = tmp_path / "plots" / "run.png"
    assert cli.main(["plot", str(tmp_path / "run"), "--out", str(out), "--smooth", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert png_size(out)[0] > 0
    # a name without a suffix gets .png, as matplotlib writes it; the path printed is the file written
    assert cli.main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "plots" / "noext")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "plots" / "noext.png")
    assert png_size(tmp_path / "plots" / "noext.png")[0] > 0 and not (tmp_path / "plots" / "noext").exists()


@pytest.mark.parametrize(("out", "message"), [
    ("run", "--out {tmp}/run is a directory: give the path of a file"),
    ("/proc/x.png", "--out /proc/x.png: cannot write in /proc (No such file or directory): give another path"),
])
def test_cli_refuses_an_out_it_cannot_write_in_one_line(tmp_path, capsys, out, message):
    write_run(tmp_path / "run", seed=3, steps=3)
    out = out if out.startswith("/") else str(tmp_path / out)
    assert cli.main(["plot", str(tmp_path / "run"), "--out", out]) == 2
    assert one_error_line(capsys) == "rookworld plot: error: " + message.format(tmp=tmp_path)


def test_cli_names_a_missing_run_directory(tmp_path, capsys):
    write_run(tmp_path / "run", seed=4, steps=3)
    missing = tmp_path / "no-such-run"
    assert cli.main(["plot", str(tmp_path / "run"), str(missing)]) == 2
    error = capsys.readouterr().err
    assert str(missing) in error and "does not exist" in error
    assert not (tmp_path / "run" / "dashboard.png").exists()

    assert cli.main(["plot", str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
    assert cli.main(["plot", str(tmp_path / "run"), "--smooth", "0"]) == 2
    assert "--smooth" in capsys.readouterr().err


def write_quality_run(run_dir, evals: int = 3) -> None:
    """A run whose evals logged what evaluate_completions gives with an engine: bands, SEs and counts."""
    from rookworld.quality import BANDS

    with RunLogger(run_dir, {}, tensorboard=False) as logger:
        for step in range(1, 10 * evals + 1):
            logger.log(step, {"reward/mean": 0.5})
            if step % 10 == 0:
                best = step / (20 * evals)  # the best band grows, the rest share what is left
                shares = [best] + [(1 - best) / (len(BANDS) - 1)] * (len(BANDS) - 1)
                logger.log_eval(step, {"eval/P/acpl": 3.0 - best, "eval/P/acpl/se": 0.2, "eval/P/acpl/n": 90,
                                       **{f"eval/P/band/{name}": share for (name, _), share in zip(BANDS, shares)},
                                       **{f"eval/P/band/{name}/se": 0.05 for name, _ in BANDS}})


def test_move_quality_bands_get_one_stacked_bar_panel(tmp_path):
    write_quality_run(tmp_path / "run")
    runs = [load_run(tmp_path / "run")]
    titles = [title for title, _keys, _source in panels_for(runs)]
    # one line panel for ACPL (its /se and /n are no panels of their own), the bands in one bar chart
    assert titles == ["reward", "held-out P/acpl", "held-out move quality of the greedy B: move"]
    figure = figure_of(runs)
    _reward_ax, acpl_ax, bands_ax = [ax for ax in figure.axes if ax.get_visible()]
    assert len(acpl_ax.collections) == 1  # the ± SE band around the ACPL curve
    assert bands_ax.get_title() == titles[-1]
    assert len(bands_ax.patches) == 3 * 6  # a stacked bar of 6 bands at each of the 3 eval steps
    assert [bar.get_height() for bar in bands_ax.patches[:3]] == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    assert bands_ax.get_legend() is not None
    out = dashboard([tmp_path / "run"])
    assert png_size(out) == (1650, 340)  # one row of 3 panels


def test_band_bars_of_two_runs_stand_side_by_side(tmp_path):
    write_quality_run(tmp_path / "a", evals=2)
    write_run(tmp_path / "b", seed=5, steps=20)  # no bands logged: no bars
    write_quality_run(tmp_path / "c", evals=3)
    figure = figure_of([load_run(tmp_path / d) for d in ("a", "b", "c")])
    bands_ax = [ax for ax in figure.axes if ax.get_title() == "held-out move quality of the greedy B: move"][0]
    assert len(bands_ax.patches) == (2 + 3) * 6
    centers = sorted({bar.get_x() + bar.get_width() / 2 for bar in bands_ax.patches if bar.get_x() < 15})
    assert centers == pytest.approx([8.0, 12.0])  # at step 10 the two runs' bars side by side, 0.8 x 10 / 2 wide
    assert [text.get_text() for text in bands_ax.get_legend().get_texts()][-2:] == ["a", "c"]
