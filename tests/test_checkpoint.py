"""Atomic checkpoints: layout, best/keep-last bookkeeping, crash recovery, exact resume of all RNG streams."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from rookworld import checkpoint
from rookworld.errors import UserError


def weights_writer(model: torch.nn.Module):
    def write_model(model_dir: Path) -> None:
        model_dir.mkdir()
        save_file(model.state_dict(), model_dir / "model.safetensors")
    return write_model


def save_step(out: Path, step: int, **kwargs) -> Path:
    model = torch.nn.Linear(2, 2)
    return checkpoint.save(out, step, {"marker": torch.full((3,), float(step))}, weights_writer(model), **kwargs)


def saved_step(ckpt_dir: Path | None) -> int:
    assert ckpt_dir is not None
    state = checkpoint.load_state(ckpt_dir)
    assert torch.equal(state["marker"], torch.full((3,), float(state["step"])))
    return state["step"]


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".tmp-") or p.name.endswith(".old"))


class Trainer:
    """A tiny training loop whose every step draws from all the random streams a real run uses."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0 / (1 + s))
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.sampler_position = 0
        self.beta = 0.04

    def step(self) -> list[float]:
        x = torch.randn(8, 4, generator=self.generator)  # (B, 4)
        noise = torch.randn(8, 1)  # global torch stream
        target = x.sum(dim=1, keepdim=True) + noise * random.gauss(0, 1) + float(np.random.standard_normal())
        loss = torch.nn.functional.mse_loss(self.model(x), target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.sampler_position += 8
        self.beta *= 1.1
        return [loss.item(), random.random()]

    def state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": checkpoint.capture_rng_state({"sampling": self.generator}),
                "sampler": {"position": self.sampler_position}, "beta": self.beta}

    def restore(self, ckpt_dir: Path) -> int:
        self.model.load_state_dict(load_file(ckpt_dir / "model.safetensors"))
        state = checkpoint.load_state(ckpt_dir)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        checkpoint.restore_rng_state(state["rng"], {"sampling": self.generator})
        self.sampler_position = state["sampler"]["position"]
        self.beta = state["beta"]
        return state["step"]


def test_resumed_run_continues_exactly_like_the_uninterrupted_one(tmp_path):
    random.seed(0)
    np.random.seed(0)
    run = Trainer(seed=0)
    for _ in range(3):
        run.step()
    checkpoint.save(tmp_path, 3, run.state(), weights_writer(run.model))
    uninterrupted = [run.step() for _ in range(3)]
    final_weights = run.model.weight.detach().clone()

    random.seed(123)  # the restarted process starts from other streams and other weights
    np.random.seed(123)
    resumed = Trainer(seed=99)
    step = resumed.restore(checkpoint.latest(tmp_path))
    assert step == 3 and resumed.sampler_position == 24 and resumed.beta == pytest.approx(0.04 * 1.1 ** 3)
    assert [resumed.step() for _ in range(3)] == uninterrupted
    assert torch.equal(resumed.model.weight, final_weights)


def test_capture_and_restore_rng_state_replays_every_stream():
    generator = torch.Generator().manual_seed(5)
    random.gauss(0, 1)  # leaves a cached second gaussian in the state
    np.random.standard_normal()  # likewise for numpy's legacy generator

    def draws():
        return (random.gauss(0, 1), random.random(), float(np.random.standard_normal()), np.random.randint(1 << 30),
                torch.rand(3).tolist(), torch.rand(3, generator=generator).tolist())

    state = checkpoint.capture_rng_state({"g": generator})
    first = draws()
    checkpoint.restore_rng_state(state, {"g": generator})
    assert draws() == first
    with pytest.raises(ValueError, match="'other'"):
        checkpoint.restore_rng_state(state, {"other": torch.Generator()})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_streams_are_replayed():
    generator = torch.Generator(device="cuda").manual_seed(7)
    state = checkpoint.capture_rng_state({"g": generator})
    first = (torch.rand(3, device="cuda").tolist(), torch.rand(3, device="cuda", generator=generator).tolist())
    checkpoint.restore_rng_state(state, {"g": generator})
    assert (torch.rand(3, device="cuda").tolist(), torch.rand(3, device="cuda", generator=generator).tolist()) == first


def test_layout_keeps_last_k_step_checkpoints_and_shares_files(tmp_path):
    for step in range(1, 6):
        last = save_step(tmp_path, step, metrics={"reward/mean": step / 10}, keep_last=2)
    assert last == tmp_path / "checkpoint-last"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-last", "checkpoint-step-000004", "checkpoint-step-000005"]
    assert saved_step(last) == 5 and saved_step(tmp_path / "checkpoint-step-000004") == 4
    info = checkpoint.read_info(last)
    assert info["step"] == 5 and info["metrics"] == {"reward/mean": 0.5}
    # the step copy costs no disk: same inode as checkpoint-last's file
    assert os.stat(last / "model.safetensors").st_ino == \
        os.stat(tmp_path / "checkpoint-step-000005" / "model.safetensors").st_ino


def test_keep_last_zero_writes_only_checkpoint_last(tmp_path):
    save_step(tmp_path, 1, keep_last=0)
    save_step(tmp_path, 2, keep_last=0)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-last"]
    assert saved_step(checkpoint.latest(tmp_path)) == 2


@pytest.mark.parametrize("resumed_at", [4, 7], ids=["an earlier step", "the next step"])
def test_keep_last_zero_deletes_the_step_checkpoints_kept_before(tmp_path, resumed_at):
    for step in (4, 5, 6):
        save_step(tmp_path, step, keep_last=3)
    save_step(tmp_path, resumed_at, keep_last=0)  # a run resumed with --keep-last 0
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-last"]
    assert saved_step(checkpoint.latest(tmp_path)) == resumed_at


def test_a_full_disk_says_how_to_go_on_by_whether_a_checkpoint_was_saved(tmp_path):
    target = tmp_path / "metrics.jsonl"
    assert str(checkpoint.disk_full_error(target, tmp_path)) == (
        f"could not save {target}: No space left on device (or quota exceeded). No checkpoint was saved yet: free "
        f"some space, then start the run over with --out {tmp_path}")
    save_step(tmp_path, 1)
    assert str(checkpoint.disk_full_error(target, tmp_path)).endswith(
        f"The checkpoints saved before are intact: free some space, then continue the run with --resume {tmp_path}")


@pytest.mark.parametrize("higher_is_better, expected", [(True, 2), (False, 3)])
def test_best_checkpoint_follows_the_metric_direction(tmp_path, higher_is_better, expected):
    scores = {1: 0.5, 2: 0.7, 3: 0.2, 4: math.nan}
    for step, score in scores.items():
        save_step(tmp_path, step, metrics={"eval/A/exact": score}, best_metric="eval/A/exact",
                  higher_is_better=higher_is_better)
    save_step(tmp_path, 5, metrics={"reward/mean": 1.0}, best_metric="eval/A/exact")  # no eval this time
    assert saved_step(checkpoint.best(tmp_path)) == expected
    assert checkpoint.read_info(checkpoint.best(tmp_path))["metrics"]["eval/A/exact"] == scores[expected]
    assert checkpoint.read_info(tmp_path / "checkpoint-step-000004")["metrics"]["eval/A/exact"] is None  # NaN


def test_exception_in_write_model_keeps_the_previous_checkpoint(tmp_path):
    save_step(tmp_path, 1)

    def broken(model_dir: Path) -> None:
        model_dir.mkdir()
        (model_dir / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(tmp_path, 2, {"marker": torch.full((3,), 2.0)}, broken)
    assert saved_step(checkpoint.latest(tmp_path)) == 1
    assert leftovers(tmp_path) == []


def test_process_killed_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    save_step(tmp_path, 1)
    crash = (
        "import os, sys, torch\n"
        "from rookworld import checkpoint\n"
        "def dies(model_dir):\n"
        "    model_dir.mkdir()\n"
        "    (model_dir / 'model.safetensors').write_bytes(b'half written')\n"
        "    os._exit(9)\n"
        "checkpoint.save(sys.argv[1], 2, {'marker': torch.full((3,), 2.0)}, dies)\n"
    )
    result = subprocess.run([sys.executable, "-c", crash, str(tmp_path)], capture_output=True)
    assert result.returncode == 9, result.stderr
    assert len(leftovers(tmp_path)) == 1  # the killed save's temporary directory
    assert saved_step(checkpoint.latest(tmp_path)) == 1
    save_step(tmp_path, 3)  # the next save cleans the debris up
    assert saved_step(checkpoint.latest(tmp_path)) == 3
    assert leftovers(tmp_path) == []


def test_crash_between_the_two_renames_falls_back_to_the_old_copy(tmp_path, monkeypatch):
    save_step(tmp_path, 1, keep_last=0)
    real_rename = os.rename

    def rename_then_crash(src, dst):
        if Path(src).parent.name.startswith(".tmp-") and Path(dst).name == "checkpoint-last":
            raise KeyboardInterrupt  # the moment checkpoint-last is renamed away and the new one not yet in
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_then_crash)
    with pytest.raises(KeyboardInterrupt):
        save_step(tmp_path, 2, keep_last=0)
    monkeypatch.setattr(os, "rename", real_rename)

    assert not (tmp_path / "checkpoint-last").exists()
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoint-last.old"
    assert saved_step(checkpoint.latest(tmp_path)) == 1
    save_step(tmp_path, 3, keep_last=0)
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoint-last"
    assert saved_step(checkpoint.latest(tmp_path)) == 3
    assert leftovers(tmp_path) == []


def test_a_stray_old_copy_next_to_a_complete_checkpoint_is_ignored_and_removed(tmp_path):
    save_step(tmp_path, 1, keep_last=0)
    old = tmp_path / "checkpoint-last.old"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"partly deleted")  # a crash while deleting the old copy
    assert saved_step(checkpoint.latest(tmp_path)) == 1
    save_step(tmp_path, 2, keep_last=0)
    assert saved_step(checkpoint.latest(tmp_path)) == 2 and leftovers(tmp_path) == []


def test_clear_debris_removes_what_a_cut_off_final_save_left(tmp_path):
    save_step(tmp_path, 1, keep_last=0)
    (tmp_path / ".tmp-checkpoint-last-abc").mkdir()  # a save killed before its rename
    old = tmp_path / "checkpoint-last.old"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"partly deleted")
    checkpoint.clear_debris(tmp_path)
    assert leftovers(tmp_path) == [] and saved_step(checkpoint.latest(tmp_path)) == 1
    # without a whole checkpoint-last the .old copy is the checkpoint to resume from: it stays
    (tmp_path / "checkpoint-last").rename(old)
    checkpoint.clear_debris(tmp_path)
    assert leftovers(tmp_path) == ["checkpoint-last.old"] and saved_step(checkpoint.latest(tmp_path)) == 1


def test_resuming_from_an_earlier_checkpoint_drops_the_abandoned_later_ones(tmp_path):
    for step in (100, 200, 300):
        save_step(tmp_path, step, keep_last=5)
    save_step(tmp_path, 150, keep_last=5)  # the run went on from checkpoint-step-000100
    assert [step for step, _ in checkpoint.step_checkpoints(tmp_path)] == [100, 150]
    assert saved_step(checkpoint.latest(tmp_path)) == 150


def test_state_that_weights_only_load_refuses_is_rejected_at_save_time(tmp_path):
    save_step(tmp_path, 1)
    with pytest.raises(TypeError, match="numpy"):
        checkpoint.save(tmp_path, 2, {"positions": np.arange(3)}, weights_writer(torch.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="'step'"):
        checkpoint.save(tmp_path, 2, {"step": 2}, weights_writer(torch.nn.Linear(2, 2)))
    assert saved_step(checkpoint.latest(tmp_path)) == 1 and leftovers(tmp_path) == []


def test_empty_run_directory_and_non_checkpoint(tmp_path):
    assert checkpoint.latest(tmp_path) is None and checkpoint.best(tmp_path) is None
    with pytest.raises(UserError, match="trainer_state.pt"):
        checkpoint.load_state(tmp_path)


def test_checkpoint_with_the_hub_writer_is_a_loadable_model_directory(tmp_path):
    from rookworld import hub
    from rookworld.model import GPT, GPTConfig
    from rookworld.tokenizer import Tokenizer

    tokenizer = Tokenizer.train_chess(["P: 8/8/8/4k3/8/8/8/4K3 w - - 0 1 M: e1e2 e1d1"] * 10, vocab_size=300)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                          layer_norm_epsilon=1e-5))
    last = checkpoint.save(tmp_path, 7, {"beta": 0.1}, lambda d: hub.save_model(model, tokenizer, d))
    loaded, _tokenizer = hub.load_model(last)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert checkpoint.load_state(last) == {"beta": 0.1, "step": 7}


def truncate(path: Path) -> None:
    with path.open("r+b") as f:  # in place: the step copy sharing the file is damaged as well
        f.truncate(path.stat().st_size // 2)


def garble(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(b"\x00{ not JSON")


@pytest.mark.parametrize("name, damage", [("model.safetensors", truncate), ("trainer_state.pt", truncate),
                                          ("trainer_state.json", garble)])
def test_a_damaged_checkpoint_last_falls_back_to_the_previous_whole_one_with_a_warning(tmp_path, caplog, name,
                                                                                        damage):
    for step in (1, 2, 3):
        save_step(tmp_path, step, keep_last=2)
    damage(tmp_path / "checkpoint-last" / name)
    # checkpoint-step-000003 holds the same (hard-linked, so damaged) files: step 2 is the whole one
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoint-step-000002"
    assert saved_step(checkpoint.latest(tmp_path)) == 2
    warning = caplog.records[-1].getMessage()
    assert f"checkpoint-last ({name}" in warning and f"checkpoint-step-000003 ({name}" in warning
    assert warning.endswith("using checkpoint-step-000002")
    save_step(tmp_path, 3, keep_last=2)  # the resumed run saves over the damaged ones
    assert saved_step(checkpoint.latest(tmp_path)) == 3


def test_a_changed_file_of_the_same_size_is_found_by_its_checksum(tmp_path, caplog):
    save_step(tmp_path, 1, keep_last=2)
    save_step(tmp_path, 2, keep_last=2)
    model = tmp_path / "checkpoint-last" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    assert saved_step(checkpoint.latest(tmp_path)) == 1
    assert "model.safetensors differs from the saved file (CRC-32)" in caplog.text


def test_no_whole_checkpoint_is_a_clear_error_not_a_fresh_start(tmp_path):
    save_step(tmp_path, 1, keep_last=0)
    truncate(tmp_path / "checkpoint-last" / "model.safetensors")
    with pytest.raises(UserError, match=r"every checkpoint is damaged: checkpoint-last \(model.safetensors has"):
        checkpoint.latest(tmp_path)


def test_a_checkpoint_saved_before_checksums_were_recorded_still_loads(tmp_path):
    last = save_step(tmp_path, 1)
    info = checkpoint.read_info(last)
    del info["files"]
    (last / "trainer_state.json").write_text(json.dumps(info))
    assert saved_step(checkpoint.latest(tmp_path)) == 1


def test_a_garbled_checkpoint_best_is_replaced_by_the_next_best(tmp_path):
    save_step(tmp_path, 1, metrics={"eval/A/exact": 0.9}, best_metric="eval/A/exact")
    garble(tmp_path / "checkpoint-best" / "trainer_state.json")
    save_step(tmp_path, 2, metrics={"eval/A/exact": 0.1}, best_metric="eval/A/exact")
    assert saved_step(checkpoint.best(tmp_path)) == 2
