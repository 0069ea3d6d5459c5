"""benchmarks/sft_step.py at the tiniest size: both arrangements run and the ratio line comes out."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sft_step.py"


def test_sft_step_benchmark_times_both_paddings_and_ends_with_the_ratio():
    done = subprocess.run([sys.executable, str(SCRIPT), "--batch-size", "8", "--steps", "1", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    padded = {}
    for line in lines[1:3]:
        match = re.fullmatch(r"  (one width|by task) +\d+\.\d\d s/step +([\d,]+) padded tokens", line)
        assert match, line
        padded[match[1]] = int(match[2].replace(",", ""))
    assert padded["by task"] < padded["one width"]  # 8 rows of both tasks: the P rows padded less
    assert re.fullmatch(r"  by task is \d+\.\d\dx as fast", lines[-1]), lines[-1]
