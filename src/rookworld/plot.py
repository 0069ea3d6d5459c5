"""`rookworld plot RUN_DIR [RUN_DIR ...] [--out FILE.png] [--smooth N]`: one PNG overlaying the metrics of
one or more runs.

Reads the files RunLogger writes (metrics.jsonl, eval.jsonl); draws a panel for each known training
metric that some run has, one per eval metric (greedy solid, sampled dashed, a band of ± one standard
error where NAME/se was logged), and a stacked bar chart of the greedy move-quality bands (P/band/...)
at each eval step. Matplotlib draws off-screen (no display needed).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rookworld.errors import UserError
from rookworld.fsutil import output_file
from rookworld.log import EVAL_FILE, METRICS_FILE, read_records
from rookworld.metrics import BAND_PREFIX, SE_SUFFIX, is_statistic
from rookworld.quality import BANDS

# (panel title, metric keys drawn in it); a panel appears when some run logged one of its keys
TRAIN_PANELS: list[tuple[str, tuple[str, ...]]] = [
    ("reward", ("reward/mean", "reward/P", "reward/A")),
    ("KL to reference", ("kl/mean",)),
    ("KL coefficient beta", ("beta", "kl/beta")),
    ("entropy", ("entropy", "entropy/mean")),
    ("gradient norm", ("grad_norm",)),
    ("loss", ("loss", "loss/total")),
    ("learning rate", ("lr",)),
    ("seconds per step", ("time/step",)),
    ("groups with zero reward std (fraction)", ("frac_zero_std",)),
    ("KL share of the loss", ("kl_share",)),
]
SAMPLED_PREFIX = "eval/sampled/"  # the trainer's sampled eval; its greedy twin is "eval/" + the same name
LINE_STYLES = ("-", "--", ":", "-.")
BAND_KEYS = tuple(f"eval/{BAND_PREFIX}{name}" for name, _ in BANDS)  # the greedy eval's band shares, best first
BAND_COLORS = ("#1a9850", "#91cf60", "#d9ef8b", "#fee08b", "#fc8d59", "#d73027")  # green (best) to red (blunder)
RUN_HATCHES = ("", "//", "..", "xx")  # tells the runs' bars apart
Series = tuple[np.ndarray, np.ndarray]  # (steps, values), values NaN where logged as null


@dataclass
class Run:
    name: str
    train: dict[str, Series]
    eval: dict[str, Series]

    def series(self, source: str) -> dict[str, Series]:
        return self.train if source == "train" else self.eval


def _series(records: list[dict]) -> dict[str, Series]:
    points: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not (value is None or isinstance(value, (int, float))):
                continue
            steps, values = points.setdefault(key, ([], []))
            steps.append(int(record["step"]))
            values.append(math.nan if value is None else float(value))
    return {key: (np.array(steps), np.array(values, dtype=float)) for key, (steps, values) in points.items()}


def load_run(run_dir: str | Path, name: str | None = None) -> Run:
    """A run's training and eval series; UserError when the directory holds no metrics.jsonl."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        what = "does not exist" if not run_dir.exists() else f"has no {METRICS_FILE}"
        raise UserError(f"run directory {run_dir} {what}: pass the output directory of rookworld train or sft")
    eval_path = run_dir / EVAL_FILE
    eval_series = _series(read_records(eval_path)) if eval_path.is_file() else {}
    return Run(name or run_dir.resolve().name, _series(read_records(metrics_path)), eval_series)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` finite values at each point (NaN where there are none)."""
    if window <= 1:
        return values
    valid = np.isfinite(values)
    kernel = np.ones(window)
    sums = np.convolve(np.where(valid, values, 0.0), kernel)[: len(values)]
    counts = np.convolve(valid.astype(float), kernel)[: len(values)]
    averaged = np.full(len(values), math.nan)
    np.divide(sums, counts, out=averaged, where=counts > 0)
    return averaged


Panel = tuple[str, tuple[str, ...], str]  # (title, keys, "train", "eval" or "bands")
BANDS_PANEL: Panel = ("held-out move quality of the greedy B: move", BAND_KEYS, "bands")


def panels_for(runs: Sequence[Run]) -> list[Panel]:
    """The known training panels that some run has a key of, then one panel per eval metric holding its greedy
    and sampled keys, then the move-quality bands when some run logged them."""
    panels = [(title, keys, "train") for title, keys in TRAIN_PANELS if any(k in r.train for r in runs for k in keys)]
    names = sorted({key.removeprefix(SAMPLED_PREFIX).removeprefix("eval/") for run in runs for key in run.eval})
    # counts and standard errors are not curves of their own; the bands share one bar chart
    names = [name for name in names if not (name.startswith(("count/", BAND_PREFIX)) or is_statistic(name))]
    panels += [(f"held-out {name}", (f"eval/{name}", f"{SAMPLED_PREFIX}{name}"), "eval") for name in names]
    return panels + [BANDS_PANEL] * any(BAND_KEYS[0] in run.eval for run in runs)


def _run_names(run_dirs: Sequence[str | Path]) -> list[str]:
    names = [Path(d).resolve().name for d in run_dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in run_dirs]


def isolated(values: np.ndarray) -> list[bool]:
    """Where a finite value has no finite neighbour: a line alone does not show it (one logged step, or a value
    between nulls)."""
    finite = np.isfinite(values)
    before, after = np.r_[False, finite[:-1]], np.r_[finite[1:], False]
    return (finite & ~before & ~after).tolist()


def _draw_panel(ax, panel: Panel, runs: Sequence[Run], smooth: int) -> None:
    """One color per run, one line style per metric key; a smoothed training curve over its faint raw one,
    with a dot where a value stands alone; eval curves have a marker at every eval."""
    title, keys, source = panel
    logged = [key for key in keys if any(key in run.series(source) for run in runs)]
    for index, run in enumerate(runs):
        color = f"C{index % 10}"
        series = run.series(source)
        for key, style in zip(logged, LINE_STYLES):
            if key not in series:
                continue
            steps, values = series[key]
            parts = (run.name if len(runs) > 1 else "", key if len(logged) > 1 else "")
            label = " ".join(part for part in parts if part) or None
            if smooth > 1 and source == "train":
                ax.plot(steps, values, color=color, linestyle=style, alpha=0.25, linewidth=0.8)
                values = moving_average(values, smooth)
            markers = {"marker": "o"} if source == "eval" else {"marker": ".", "markevery": isolated(values)}
            ax.plot(steps, values, color=color, linestyle=style, markersize=3, label=label, **markers)
            if key + SE_SUFFIX in series:
                _se_steps, se = series[key + SE_SUFFIX]
                ax.fill_between(steps, values - se, values + se, color=color, alpha=0.15, linewidth=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8)


def _draw_bands(ax, runs: Sequence[Run]) -> None:
    """Stacked bars of the band shares at each eval step, the runs side by side (hatched apart)."""
    from matplotlib.patches import Patch

    with_bands = [run for run in runs if BAND_KEYS[0] in run.eval]
    steps = np.unique(np.concatenate([run.eval[BAND_KEYS[0]][0] for run in with_bands]))
    width = 0.8 * (np.diff(steps).min() if len(steps) > 1 else 1.0) / len(with_bands)
    handles = []
    for index, run in enumerate(with_bands):
        hatch = RUN_HATCHES[index % len(RUN_HATCHES)]
        x = run.eval[BAND_KEYS[0]][0] + (index - (len(with_bands) - 1) / 2) * width
        bottom = np.zeros(len(x))
        for (name, _), key, color in zip(BANDS, BAND_KEYS, BAND_COLORS):
            shares = np.nan_to_num(run.eval[key][1])
            ax.bar(x, shares, width, bottom=bottom, color=color, hatch=hatch, edgecolor="white",
                   label=name if index == 0 else None)
            bottom += shares
        handles.append(Patch(facecolor="lightgray", hatch=hatch, label=run.name))
    ax.set_title(BANDS_PANEL[0], fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("share of moves")
    ax.set_ylim(0, 1)
    band_handles, _labels = ax.get_legend_handles_labels()
    ax.legend(handles=band_handles + (handles if len(with_bands) > 1 else []), fontsize=7,
              loc="center left", bbox_to_anchor=(1.0, 0.5))  # beside the bars, which fill the height


def figure_of(runs: Sequence[Run], smooth: int = 1):
    """The dashboard figure of loaded runs: a grid of their panels, 3 columns wide."""
    from matplotlib.figure import Figure  # Figure without pyplot: no GUI backend, no global state

    panels = panels_for(runs)
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(5.5 * columns, 3.4 * rows), layout="constrained")
    figure.suptitle(" vs ".join(run.name for run in runs) + (f"  (smoothed over {smooth} steps)" if smooth > 1 else ""))
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        if panel[2] == "bands":
            _draw_bands(ax, runs)
        else:
            _draw_panel(ax, panel, runs, smooth)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return figure


def dashboard(run_dirs: Sequence[str | Path], out: str | Path | None = None, smooth: int = 1) -> Path:
    """Draw the dashboard of `run_dirs` into `out` (default: RUN_DIR/dashboard.png of the first run)."""
    if not run_dirs:
        raise UserError("no run directory given: pass at least one RUN_DIR")
    if smooth < 1:
        raise UserError(f"--smooth must be a window of at least 1 step, got {smooth}")
    runs = [load_run(d, name) for d, name in zip(run_dirs, _run_names(run_dirs))]
    if not panels_for(runs):
        known = ", ".join(k for _title, keys in TRAIN_PANELS for k in keys)
        raise UserError(f"nothing to plot in {', '.join(map(str, run_dirs))}: none of {known} was logged, "
                        f"and there is no {EVAL_FILE}")
    out_path = output_file(Path(out) if out is not None else Path(run_dirs[0]) / "dashboard.png", "--out")
    out_path = out_path if out_path.suffix else out_path.with_suffix(".png")  # the name matplotlib writes
    figure = figure_of(runs, smooth)
    try:
        figure.savefig(out_path, dpi=100)
    except ValueError as exc:  # an output suffix matplotlib cannot write
        raise UserError(f"cannot write the dashboard to {out_path}: {exc}; use a .png path") from None
    except OSError as exc:
        raise UserError(f"--out {out_path}: cannot write it ({exc.strerror or exc}): give another path") from None
    return out_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="output directory of rookworld train or sft (holds metrics.jsonl)")
    parser.add_argument("--out", default=None, metavar="FILE.png",
                        help="where to write the PNG (default: dashboard.png in the first RUN_DIR)")
    parser.add_argument("--smooth", type=int, default=1, metavar="N",
                        help="trailing moving average over N steps of the training curves (default: 1, raw)")


def run(args: argparse.Namespace) -> int:
    print(dashboard(args.runs, args.out, args.smooth))
    return 0
