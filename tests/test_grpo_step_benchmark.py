"""benchmarks/grpo_step.py end to end at the tiniest size: both sides run, the table and the ratio line come out."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "grpo_step.py"


@pytest.mark.integration
def test_grpo_step_benchmark_runs_both_sides_and_ends_with_the_ratio(tmp_path):
    # Two fresh processes (rookworld, then TRL), 8 new tokens: about 10 s on 2 idle cores, 30 s on busy ones.
    # --profile rides along: the rookworld side's timed step under torch.profiler.
    done = subprocess.run([sys.executable, str(SCRIPT), "--batch-size", "2", "--group-size", "2", "--steps", "1",
                           "--max-new-tokens", "8", "--threads", "1", "--fast-decode", "false",
                           "--profile", str(tmp_path / "prof")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"speed ratio \(TRL s/step / rookworld s/step\): \d+\.\d\d", lines[-1]), lines[-1]
    rows = [line for line in lines if line.startswith(("| rookworld |", "| TRL GRPOTrainer |"))]
    assert len(rows) == 2, done.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 8 and all(c != "-" for c in cells[1:]), row
        assert int(cells[5]) <= 2 * 2 * 8  # completion tokens per step within B x G x max new tokens
    assert "identical prompt ids" in done.stdout
    ops = (tmp_path / "prof" / "rookworld-ops.txt").read_text()
    assert "rookworld/collect" in ops and "rookworld/update" in ops and "aten::" in ops
    trace = json.loads((tmp_path / "prof" / "rookworld-trace.json").read_text())
    spans = sorted(e["name"] for e in trace["traceEvents"]
                   if e.get("name", "").startswith("rookworld/") and e.get("ph") == "X")
    assert spans == ["rookworld/collect", "rookworld/update"], spans  # the timed step only, not the warm-up
    assert str(tmp_path / "prof" / "rookworld-ops.txt") in done.stdout


def test_grpo_step_benchmark_refuses_the_fast_path_on_cpu():
    done = subprocess.run([sys.executable, str(SCRIPT), "--fast-decode", "true"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "--fast-decode true needs --device cuda" in done.stderr
