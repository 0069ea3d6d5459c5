"""Faults a long run meets, each with the real thing, then `--resume`: `rookworld train` killed (SIGKILL)
while it writes a checkpoint, a full disk (a tmpfs mounted in a private mount namespace), a damaged
checkpoint-last under `rookworld train` and `rookworld sft`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rookworld import checkpoint, hub
from rookworld.hub import load_model
from rookworld.model import GPT, GPTConfig
from rookworld.tokenizer import Tokenizer

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
TRAIN = ["train", "--steps", "4", "--checkpoint-every", "1", "--keep-last", "2", "--batch-size", "2",
         "--group-size", "2", "--eval-every", "0", "--tensorboard", "false", "--processes", "1", "--threads", "1"]
SFT = ["sft", "--preset", "tiny", "--data-limit", "2000", "--steps", "4", "--checkpoint-every", "1", "--keep-last",
       "2", "--eval-every", "0", "--batch-size", "4", "--eval-samples", "4", "--eval-loss-samples", "4",
       "--tensorboard", "false", "--threads", "1"]
# A mount namespace of its own: the tmpfs is seen by this command only and goes with it.
UNSHARE = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]


def rookworld(*args: str) -> list[str]:
    return [sys.executable, "-m", "rookworld.cli", *args]


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)


def outcome(run_dir: Path) -> tuple[int, dict[str, torch.Tensor], list[dict]]:
    """Final step, weights and per-step metrics (timings and speeds left out) of a run."""
    last = run_dir / checkpoint.LAST
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return (checkpoint.read_info(last)["step"], load_file(last / "model.safetensors"),
            [{k: v for k, v in r.items() if not k.startswith("time/") and not k.endswith("/per_s")} for r in records])


def assert_same_run(run_dir: Path, reference: Path) -> None:
    step, weights, records = outcome(run_dir)
    ref_step, ref_weights, ref_records = outcome(reference)
    assert step == ref_step and records == ref_records
    assert weights.keys() == ref_weights.keys() and all(torch.equal(weights[k], ref_weights[k]) for k in weights)


def tmpfs_script(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """Run the shell `script` with MNT (a tmpfs it mounts) and PY (this Python) set, in a private mount
    namespace; skipped where no tmpfs can be mounted (no root, no user namespaces)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    probe = subprocess.run([*UNSHARE, "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {mnt}"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.decode().strip()}")
    env = {**ENV, "MNT": str(mnt), "PY": sys.executable}
    return subprocess.run([*UNSHARE, "sh", "-c", script], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("overflowing", ["model", "state"])
def test_full_disk_mid_save_is_a_clear_error_and_the_previous_checkpoint_stays_loadable(tmp_path, overflowing):
    # 4 MB of model (its embedding) and no state to speak of, or the reverse: the 6 MB disk holds one
    # checkpoint but not a second one beside it
    vocab, floats = (250_000, 1) if overflowing == "model" else (260, 1_000_000)
    save_twice = f"""
import sys, torch
from rookworld import checkpoint, hub
from rookworld.errors import UserError
from rookworld.model import GPT, GPTConfig
from rookworld.tokenizer import Tokenizer
tokenizer = Tokenizer.train_chess(["P: 8/8/8/4k3/8/8/8/4K3 w - - 0 1 M: e1e2 e1d1"] * 10, vocab_size=260)
model = GPT(GPTConfig(vocab_size={vocab}, n_positions=32, n_embd=4, n_layer=1, n_head=1))
write_model = lambda d: hub.save_model(model, tokenizer, d)
for step in (1, 2):
    try:
        checkpoint.save(sys.argv[1], step, {{"blob": torch.zeros({floats})}}, write_model)
    except UserError as error:
        print(error)
"""
    (tmp_path / "save_twice.py").write_text(save_twice)
    result = tmpfs_script(tmp_path, f'mount -t tmpfs -o size=6m tmpfs "$MNT" && "$PY" {tmp_path}/save_twice.py '
                                    f'"$MNT/run" && cp -a "$MNT/run" {tmp_path}/run')
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"could not save {tmp_path}/mnt/run/checkpoint-last: No space left on device")
    assert f"--resume {tmp_path}/mnt/run" in result.stdout
    kept = checkpoint.latest(tmp_path / "run")
    assert checkpoint.load_state(kept)["step"] == 1 and load_model(kept)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint-last", "checkpoint-step-000001"]


def test_full_disk_in_the_first_save_says_to_start_over(tmp_path):
    # the model's 4 MB embedding does not fit on the 2 MB disk: no checkpoint is left to resume from
    save_once = """
import sys
from rookworld import checkpoint, hub
from rookworld.errors import UserError
from rookworld.model import GPT, GPTConfig
from rookworld.tokenizer import Tokenizer
tokenizer = Tokenizer.train_chess(["P: 8/8/8/4k3/8/8/8/4K3 w - - 0 1 M: e1e2 e1d1"] * 10, vocab_size=260)
model = GPT(GPTConfig(vocab_size=250_000, n_positions=32, n_embd=4, n_layer=1, n_head=1))
try:
    checkpoint.save(sys.argv[1], 1, {}, lambda d: hub.save_model(model, tokenizer, d))
except UserError as error:
    print(error)
"""
    (tmp_path / "save_once.py").write_text(save_once)
    result = tmpfs_script(tmp_path, f'mount -t tmpfs -o size=2m tmpfs "$MNT" && "$PY" {tmp_path}/save_once.py '
                                    f'"$MNT/run"')
    run_dir = tmp_path / "mnt" / "run"
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"could not save {run_dir}/checkpoint-last: No space left on device (or quota exceeded). No checkpoint was "
        f"saved yet: free some space, then start the run over with --out {run_dir}"]


@pytest.mark.integration
def test_full_disk_while_writing_a_model_outside_a_checkpoint_is_one_line(tmp_path):
    # `rookworld average --out` (as `sft --export`) writes a model of 4 MB to a 2 MB disk
    model = GPT(GPTConfig(vocab_size=250_000, n_positions=32, n_embd=4, n_layer=1, n_head=1))
    tokenizer = Tokenizer.train_chess(["P: 8/8/8/4k3/8/8/8/4K3 w - - 0 1 M: e1e2 e1d1"] * 10, vocab_size=260)
    hub.save_model(model, tokenizer, tmp_path / "a")
    result = tmpfs_script(tmp_path, f'mount -t tmpfs -o size=2m tmpfs "$MNT" && "$PY" -m rookworld.cli average '
                                    f'--model {tmp_path / "a"} --model {tmp_path / "a"} --out "$MNT/soup"')
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"rookworld average: error: {tmp_path}/mnt/soup: the disk is full (or over quota) while writing the model; "
        f"{tmp_path}/mnt/soup is as it was: free some space and run the command again"]


@pytest.mark.parametrize("tensorboard", [False, True])
def test_full_disk_while_logging_is_one_clear_line(tmp_path, tensorboard):
    log_on = f"""
import sys
from rookworld.errors import UserError
from rookworld.log import RunLogger
try:
    with RunLogger(sys.argv[1], {{"lr": 1e-5}}, tensorboard={tensorboard}) as logger:
        for step in range(1, 100_000):
            logger.log(step, {{f"loss/{{i}}": step / 3 for i in range(40)}})
            logger.log_samples(step, [{{"completion": "e2e4 " * 80}}])
except UserError as error:
    print(error)
"""
    (tmp_path / "log_on.py").write_text(log_on)
    result = tmpfs_script(tmp_path, f'mount -t tmpfs -o size=64k tmpfs "$MNT" && "$PY" {tmp_path}/log_on.py "$MNT/run"')
    run_dir = tmp_path / "mnt" / "run"
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith(f"could not save {run_dir}/") and ": No space left on device (or quota exceeded). No " \
        f"checkpoint was saved yet: free some space, then start the run over with --out {run_dir}" in line


def truncate(path: Path) -> None:
    with path.open("r+b") as f:  # in place: a step copy hard-linked to the file is damaged as well
        f.truncate(1000)


def kill_when(command: list[str], out: Path, moment: Callable[[list[str]], bool]) -> bool:
    """Run `command`, SIGKILL it as soon as the names in `out` show `moment`; False if it ended before."""
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while process.poll() is None:
            if moment(os.listdir(out) if out.is_dir() else []):
                process.send_signal(signal.SIGKILL)
                return True
            time.sleep(0.001)
        return False
    finally:
        process.kill()
        process.wait()


def staging(kind: str) -> Callable[[list[str]], bool]:
    return lambda names: any(name.startswith(f".tmp-checkpoint-{kind}") for name in names)


@pytest.fixture(scope="module")
def train_reference(tmp_path_factory) -> Path:
    """An uninterrupted tiny `rookworld train` run (embedded model and data)."""
    out = tmp_path_factory.mktemp("train") / "reference"
    result = run(rookworld(*TRAIN, "--out", str(out)))
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.slow
@pytest.mark.stockfish
@pytest.mark.parametrize("moment", [
    pytest.param(lambda names: "checkpoint-last" in names and staging("last")(names), id="writing-checkpoint-last"),
    pytest.param(lambda names: "checkpoint-last.old" in names, id="replacing-checkpoint-last"),
    pytest.param(staging("step"), id="writing-a-step-copy"),
])
def test_train_killed_while_saving_resumes_like_an_uninterrupted_run(tmp_path, train_reference, moment):
    out = tmp_path / "run"
    for _attempt in range(3):  # a short moment can pass between two looks on a busy machine: run again
        if kill_when(rookworld(*TRAIN, "--out", str(out)), out, moment):
            break
        shutil.rmtree(out)
    else:
        pytest.fail("three runs ended without that moment being seen")
    resumed_from = checkpoint.read_info(checkpoint.latest(out))["step"]
    result = run(rookworld("train", "--resume", str(out)))
    if resumed_from == 4:  # killed after its last step was saved: nothing is left to train, and it says so
        assert result.returncode == 2 and "is already at step 4" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
    assert_same_run(out, train_reference)
    if resumed_from < 4:  # the next save deletes the killed one's debris; a finished run saves no more
        assert not [name for name in os.listdir(out) if name.startswith(".tmp-") or name.endswith(".old")]


@pytest.mark.slow
@pytest.mark.stockfish
def test_train_killed_in_its_first_save_cannot_resume_and_starts_over_as_it_says(tmp_path, train_reference):
    out = tmp_path / "run"
    assert kill_when(rookworld(*TRAIN, "--out", str(out)), out, staging("last"))
    result = run(rookworld("train", "--resume", str(out)))
    assert result.returncode == 2 and f"error: --resume {out}: no " in result.stderr.strip().splitlines()[-1]
    assert f"start the run over with --out {out}" in result.stderr
    result = run(rookworld(*TRAIN, "--out", str(out)))  # the advice followed: the same command again
    assert result.returncode == 0, result.stderr
    assert_same_run(out, train_reference)


@pytest.mark.slow
@pytest.mark.stockfish
def test_train_on_a_full_disk_stops_with_a_clear_error_then_resumes_once_there_is_space(tmp_path, train_reference):
    # A checkpoint of the embedded model is 23 MB (7.6 MB of weights, 15 MB of AdamW state): 32 MB hold the
    # first one, and the second fails while its optimizer state is written beside it.
    script = (f'mount -t tmpfs -o size=32m tmpfs "$MNT" && "$PY" -m rookworld.cli {" ".join(TRAIN)} --out "$MNT/run"; '
              f'echo "exit $?"; cp -a "$MNT/run" {tmp_path}/full && mount -o remount,size=256m "$MNT" && '
              f'"$PY" -m rookworld.cli train --resume "$MNT/run" && cp -a "$MNT/run" {tmp_path}/resumed')
    result = tmpfs_script(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert "exit 2" in result.stdout
    error = [line for line in result.stderr.splitlines() if "error:" in line]
    assert error == [f"rookworld train: error: could not save {tmp_path}/mnt/run/checkpoint-last: No space left on "
                     f"device (or quota exceeded). The checkpoints saved before are intact: free some space, then "
                     f"continue the run with --resume {tmp_path}/mnt/run"]
    kept = checkpoint.latest(tmp_path / "full")
    assert checkpoint.load_state(kept)["step"] == 1 and load_model(kept)
    assert_same_run(tmp_path / "resumed", train_reference)


@pytest.mark.slow
@pytest.mark.stockfish
def test_train_resume_skips_a_damaged_checkpoint_last(tmp_path, train_reference):
    out = tmp_path / "run"
    shutil.copytree(train_reference, out)  # copies, not links: the reference stays whole
    for damaged in ("checkpoint-last", "checkpoint-step-000004"):  # as one truncation in a real run directory
        truncate(out / damaged / "trainer_state.pt")
    result = run(rookworld("train", "--resume", str(out)))
    assert result.returncode == 0, result.stderr
    assert "skipped the damaged checkpoint-last (trainer_state.pt has 1000 bytes" in result.stderr
    assert "using checkpoint-step-000003" in result.stderr
    assert_same_run(out, train_reference)


@pytest.mark.slow
def test_sft_resume_skips_a_damaged_checkpoint_last(tmp_path):
    reference, out = tmp_path / "reference", tmp_path / "run"
    for run_dir in (reference, out):
        result = run(rookworld(*SFT, "--out", str(run_dir)))
        assert result.returncode == 0, result.stderr
    truncate(out / "checkpoint-last" / "model.safetensors")  # and so checkpoint-step-000004's
    result = run(rookworld("sft", "--resume", str(out)))
    assert result.returncode == 0, result.stderr
    assert "skipped the damaged checkpoint-last (model.safetensors has 1000 bytes" in result.stderr
    assert "using checkpoint-step-000003" in result.stderr
    assert_same_run(out, reference)
