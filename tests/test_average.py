"""`rookworld average`: the mean of checkpoints' weights, and its refusals."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import one_error_line

from rookworld import cli
from rookworld.hub import load_model, save_model
from rookworld.model import GPT, GPTConfig
from rookworld.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train_chess(["P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"], vocab_size=257)


def checkpoint(directory, tokenizer, seed: int, n_embd: int = 16, n_head: int = 2):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_positions=64, n_embd=n_embd, n_layer=1, n_head=n_head))
    save_model(model, tokenizer, directory)
    return model.state_dict()


def test_the_average_is_the_element_wise_mean(tmp_path, tokenizer):
    states = [checkpoint(tmp_path / f"m{i}", tokenizer, seed=i) for i in range(3)]
    code = cli.main(["average", *(f"--model={tmp_path / f'm{i}'}" for i in range(3)), "--out", str(tmp_path / "avg")])
    assert code == 0
    averaged = load_model(tmp_path / "avg")[0].state_dict()
    for k, v in averaged.items():
        torch.testing.assert_close(v, (states[0][k] + states[1][k] + states[2][k]) / 3, rtol=0, atol=1e-7)
    assert all(not torch.equal(averaged[k], states[0][k]) for k in averaged if k.endswith("attn.c_attn.weight"))


def test_one_model_or_another_architecture_is_one_clear_line(tmp_path, tokenizer, capsys):
    checkpoint(tmp_path / "a", tokenizer, seed=0)
    checkpoint(tmp_path / "wide", tokenizer, seed=1, n_embd=32)
    checkpoint(tmp_path / "heads", tokenizer, seed=1, n_head=4)  # the same weight shapes, another model of them
    code = cli.main(["average", "--model", str(tmp_path / "a"), "--out", str(tmp_path / "avg")])
    assert code == 2 and "an average needs two or more checkpoints" in one_error_line(capsys)
    for other, field in (("wide", "n_embd is 32"), ("heads", "n_head is 4")):
        code = cli.main(["average", "--model", str(tmp_path / "a"), "--model", str(tmp_path / other),
                         "--out", str(tmp_path / "avg")])
        assert code == 2 and f"{tmp_path / other}: its {field}, {tmp_path / 'a'}'s is " in one_error_line(capsys)
    assert not (tmp_path / "avg").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, which takes no new directory")
def test_an_out_that_cannot_be_written_is_one_clear_line_before_any_work(tmp_path, capsys):
    code = cli.main(["average", "--model", str(tmp_path / "missing"), "--model", str(tmp_path / "missing"),
                     "--out", "/proc/rookworld-test/avg"])
    assert code == 2 and one_error_line(capsys).endswith(
        "--out /proc/rookworld-test/avg: cannot write in /proc/rookworld-test (No such file or directory): give "
        "another path")


def test_another_tokenizer_is_refused(tmp_path, tokenizer, capsys):
    other = Tokenizer.train_chess(["A: 8/8/8/4k3/8/8/4P3/4K3 w - - 0 1+e2e4+"] * 50, vocab_size=270)  # with merges
    checkpoint(tmp_path / "a", tokenizer, seed=0)
    checkpoint(tmp_path / "b", other, seed=0)
    code = cli.main(["average", "--model", str(tmp_path / "a"), "--model", str(tmp_path / "b"),
                     "--out", str(tmp_path / "avg")])
    assert code == 2 and "its tokenizer differs" in one_error_line(capsys)


def test_another_board_view_is_refused_in_either_order(tmp_path, tokenizer, capsys):
    checkpoint(tmp_path / "fen", tokenizer, seed=0)
    checkpoint(tmp_path / "named", tokenizer.with_view("named"), seed=1)  # the same tokens, boards read otherwise
    for first, second in (("fen", "named"), ("named", "fen")):
        code = cli.main(["average", "--model", str(tmp_path / first), "--model", str(tmp_path / second),
                         "--out", str(tmp_path / "avg")])
        assert code == 2 and "its tokenizer differs" in one_error_line(capsys)
    assert not (tmp_path / "avg").exists()


def test_an_out_holding_other_files_is_refused_and_kept(tmp_path, tokenizer, capsys):
    mine = tmp_path / "mine"
    checkpoint(mine / "ckpt", tokenizer, seed=0)  # an input inside --out
    checkpoint(tmp_path / "b", tokenizer, seed=1)
    (mine / "notes.txt").write_text("important")
    code = cli.main(["average", "--model", str(mine / "ckpt"), "--model", str(tmp_path / "b"), "--out", str(mine)])
    assert code == 2 and f"--out {mine}: holds {mine / 'ckpt'}" in one_error_line(capsys)
    assert (mine / "notes.txt").read_text() == "important" and load_model(mine / "ckpt")
    # a model directory is replaced, as before
    assert cli.main(["average", "--model", str(mine / "ckpt"), "--model", str(tmp_path / "b"),
                     "--out", str(tmp_path / "b")]) == 0
