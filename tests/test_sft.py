"""`rookworld sft`: rows and masks, packing, the schedule, fresh A samples, overfitting, exact resume, the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import FIXTURES, one_error_line

from rookworld import arbiter, checkpoint, cli
from rookworld.data.batches import balanced_subset
from rookworld.data.fresh import FreshASamples
from rookworld.data.record import Sample, a_sample
from rookworld.data.rows import from_line
from rookworld.data.splits import split_of
from rookworld.hub import load_model, read_metadata, resolve_default_model
from rookworld.sft import (
    Packer,
    SFTConfig,
    batch_nll,
    by_task,
    encode_samples,
    main,
    packed_document,
    target_batch,
)
from rookworld.tokenizer import Tokenizer

# A model small enough that a few steps take well under a second.
TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "n_positions": 320, "tensorboard": False, "eval_samples": 4,
        "eval_loss_samples": 8, "eval_batch_size": 8, "batch_size": 8}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    """Real RookWorld rows: 250 P lines and 120 A prompts (their targets computed by the arbiter)."""
    p_lines = [line for line in (FIXTURES / "rook_val_sample.txt").read_text().splitlines() if line.strip()]
    a_prompts = [row["prompt"] for row in json.loads((FIXTURES / "a_task_openings_sample.json").read_text())[:120]]
    path = tmp_path_factory.mktemp("sft") / "tiny.jsonl"
    with open(path, "w") as handle:
        for line in p_lines:
            handle.write(json.dumps({"text": line}) + "\n")
        for prompt in a_prompts:
            handle.write(json.dumps({"task": "A", "prompt": prompt}) + "\n")
    return path


@pytest.fixture(scope="module")
def char_tokenizer() -> Tokenizer:
    return Tokenizer.train_chess(["P: A: rnbqkp RNBQKP/ 0123456789 abcdefgh +-.MEB"], vocab_size=257)


def p_example():
    line = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()[0]
    return from_line(line)


def test_target_mask_covers_exactly_the_target_and_final_eos(char_tokenizer):
    sample = p_example()
    a = a_sample("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+")
    encoded = encode_samples(char_tokenizer, [sample, a])
    rows, mask = target_batch(encoded, pad_id=char_tokenizer.eos_id)
    eos = char_tokenizer.eos_id
    for row, (s, (ids, prompt_length)) in enumerate(zip([sample, a], encoded)):
        # The prompt part is what generation feeds the model: [eos] + prompt ids.
        assert ids[:prompt_length] == char_tokenizer.encode_prompts([s.prompt])[0]
        assert rows[row, 0] == eos
        assert char_tokenizer.decode(rows[row][mask[row]].tolist()) == s.target + "<|endoftext|>"
        assert not mask[row, :prompt_length].any()
        assert int(mask[row].sum()) == len(s.target) + 1  # one token per character, and the EOS
    # The shorter row is right-padded; its pad positions are not in the loss.
    short = min(range(2), key=lambda r: len(encoded[r][0]))
    assert not mask[short, len(encoded[short][0]):].any()
    assert a.target == "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"


def test_rows_padded_by_task_score_every_sample_as_one_width_does():
    model, tokenizer = load_model(resolve_default_model())
    lines = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()[:2]
    prompts = sorted((item["prompt"] for item in json.loads((FIXTURES / "a_task_openings_sample.json").read_text())),
                     key=len)
    a_rows = [a_sample(prompts[0]), a_sample(prompts[-1])]
    samples = [from_line(lines[0]), a_rows[0], from_line(lines[1]), a_rows[1]]
    groups = by_task(samples)
    assert groups == [[samples[0], samples[2]], [samples[1], samples[3]]]
    one_width = target_batch(encode_samples(tokenizer, groups[0] + groups[1]), tokenizer.eos_id)
    per_task = [target_batch(encode_samples(tokenizer, group), tokenizer.eos_id) for group in groups]
    assert per_task[0][0].shape[1] < one_width[0].shape[1]  # the P rows no longer padded to the long A row
    with torch.no_grad():
        torch.testing.assert_close(torch.cat([batch_nll(model, *rows) for rows in per_task]),
                                   batch_nll(model, *one_width))


def test_packed_rows_put_eos_before_each_document_and_predict_every_token_once(char_tokenizer):
    eos = char_tokenizer.eos_id
    texts = [("P: 8/8/8/4k3/8/8/8/4K3 w - - 0 1", "  M: e1e2"), ("A: x+e2e4+e2e4+", "y+0.001+0+0"),
             ("P: k7/8/8/8/8/8/8/7K b - - 0 1", " M: a8b8")] * 4
    docs = [packed_document(char_tokenizer.encode_prompts([p])[0], char_tokenizer.encode(t)) for p, t in texts]
    queue = list(docs)
    packer = Packer(seq_len=16)
    rows1, mask1 = packer.rows(3, lambda: [queue.pop(0)])
    rows2, _ = packer.rows(2, lambda: [queue.pop(0)])
    assert rows1.shape == (3, 17) and rows2.shape == (2, 17)
    assert not mask1[:, 0].any() and mask1[:, 1:].all()
    # Consecutive rows overlap by one token: the stream is the documents back to back.
    all_rows = torch.cat([rows1, rows2])
    stream = [all_rows[0, 0].item()] + [t for row in all_rows for t in row[1:].tolist()]
    flat = [t for doc in docs for t in doc]
    assert stream == flat[:len(stream)]
    # Every document starts with EOS, so a target is followed by the next document's EOS.
    starts = [sum(len(d) for d in docs[:i]) for i in range(len(docs))]
    assert all(flat[s] == eos for s in starts)
    assert flat.count(eos) == len(docs)
    assert char_tokenizer.decode(flat[starts[0]:starts[1] + 1]) == \
        "<|endoftext|>" + texts[0][0] + texts[0][1] + "<|endoftext|>"


def test_fresh_a_samples_are_true_train_split_and_resumable(data_file):
    from rookworld.data.sources import load_source

    samples = load_source(str(data_file), "train").samples
    first = FreshASamples(samples, seed=3)
    drawn = [first.next() for _ in range(40)]
    for sample in drawn:
        assert sample.task == "A"
        assert sample.target == arbiter.a_target(arbiter.transition_for_prompt(sample.prompt))
        assert split_of(sample.fen) == "train"
    assert len({s.prompt for s in drawn}) == len(drawn)
    assert {s.prompt for s in drawn}.isdisjoint(s.prompt for s in samples)
    # Same seed, same stream; a state restored mid-stream continues it.
    second = FreshASamples(samples, seed=3)
    assert [second.next().prompt for _ in range(25)] == [s.prompt for s in drawn[:25]]
    third = FreshASamples(samples, seed=3)
    third.load_state_dict(second.state_dict())
    assert [third.next().prompt for _ in range(15)] == [s.prompt for s in drawn[25:]]


def test_balanced_subset_draws_half_of_each_task_at_random():
    samples = [Sample("P", f"P: {i}", "") for i in range(100)] + [Sample("A", f"A: {i}", "") for i in range(30)]
    chosen = balanced_subset(samples, 40)
    assert [s.task for s in chosen] == ["P"] * 20 + ["A"] * 20
    assert chosen == balanced_subset(samples, 40)  # seeded
    assert chosen[:20] != samples[:20]  # not simply the first ones: files group rare cases first
    assert len({s.prompt for s in chosen}) == 40
    short = balanced_subset(samples, 80)  # only 30 A samples: P fills the rest
    assert [s.task for s in short].count("A") == 30 and len(short) == 80


def _config(data_file: Path, out: Path, **overrides) -> SFTConfig:
    return SFTConfig(**{"data": str(data_file), "out": str(out), **TINY, **overrides})


def test_loss_decreases_when_overfitting_a_few_samples(data_file, tmp_path, capsys):
    cfg = _config(data_file, tmp_path / "run", data_limit=8, p_fraction=1.0, steps=40, lr=1e-2, warmup_steps=2,
                  eval_every=0, checkpoint_every=0, keep_last=0)
    main(cfg)
    losses = [r["loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    # stdout is no terminal here: plain progress lines instead of a bar
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sft step ")]
    assert [line.split(" | ")[0] for line in progress] == ["sft step 1/40", "sft step 10/40", "sft step 20/40",
                                                          "sft step 30/40", "sft step 40/40"]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(ckpt / "model.safetensors")


@pytest.mark.parametrize("mode,fresh_a", [("target", 0.5), ("packed", 0.0)])
def test_resume_continues_bit_identically(data_file, tmp_path, mode, fresh_a):
    cfg = _config(data_file, tmp_path / "full", mode=mode, fresh_a=fresh_a, seq_len=64, steps=6,
                  checkpoint_every=3, eval_every=0, keep_last=2, grad_accum=2)
    main(cfg)
    full = _weights(tmp_path / "full" / checkpoint.LAST)
    # The same run cut off after step 3: only its step-3 checkpoint survives.
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    shutil.rmtree(cut / checkpoint.LAST)
    shutil.rmtree(cut / checkpoint.step_dir_name(6))
    main(_config(data_file, cut, mode=mode, fresh_a=fresh_a, seq_len=64, steps=6, checkpoint_every=3,
                 eval_every=0, keep_last=2, grad_accum=2), resume=True)
    resumed = _weights(cut / checkpoint.LAST)
    assert full.keys() == resumed.keys()
    assert all(torch.equal(full[name], resumed[name]) for name in full)
    assert checkpoint.read_info(cut / checkpoint.LAST)["step"] == 6
    steps = [r["step"] for r in map(json.loads, (cut / "metrics.jsonl").read_text().splitlines())]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_resume_may_turn_fresh_a_on(data_file, tmp_path):
    main(_config(data_file, tmp_path / "run", steps=2, eval_every=0))  # fresh_a 0: no fresh stream saved
    main(_config(data_file, tmp_path / "run", steps=4, eval_every=0, fresh_a=0.5), resume=True)
    assert checkpoint.read_info(tmp_path / "run" / checkpoint.LAST)["step"] == 4


def test_resume_takes_the_adamw_flags_given_and_refuses_steps_already_taken(data_file, tmp_path, capsys):
    out = tmp_path / "run"
    main(_config(data_file, out, steps=2, eval_every=0))
    config = (out / "config.json").read_text()
    assert cli.main(["sft", "--resume", str(out), "--steps", "2"]) == 2
    assert f"--steps 2: {out} is already at step 2; give --steps > 2" in one_error_line(capsys)
    assert cli.main(["sft", "--resume", str(out), "--steps", "1"]) == 2  # the refusal alone: nothing is stretched
    assert f"--steps 1: {out} is already at step 2" in one_error_line(capsys)
    assert (out / "config.json").read_text() == config  # it says the steps the run took
    # a finished run resumes to write the export it lacks (one stopped between its last checkpoint and export)
    assert cli.main(["sft", "--resume", str(out), "--export", str(tmp_path / "model")]) == 0
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert cli.main(["sft", "--resume", str(out), "--steps", "3", "--weight-decay", "0.2", "--beta1", "0.5",
                     "--beta2", "0.9"]) == 0
    decayed, plain = checkpoint.load_state(out / checkpoint.LAST)["optimizer"]["param_groups"]
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.2, 0.0)  # as config.json now says
    assert decayed["betas"] == plain["betas"] == (0.5, 0.9)


@pytest.mark.integration
def test_best_metric_where_lower_is_better_keeps_the_lowest(data_file, tmp_path):
    from rookworld.hub import resolve_default_model

    main(_config(data_file, tmp_path / "run", init_from=str(resolve_default_model()), n_layer=None, n_head=None,
                 n_embd=None, n_positions=None, steps=3, lr=3e-4, warmup_steps=0, eval_every=1, checkpoint_every=1,
                 keep_last=3, best_metric="eval/P/eval_mae", threads=1))
    values = [checkpoint.read_info(tmp_path / "run" / checkpoint.step_dir_name(step))["metrics"]["eval/P/eval_mae"]
              for step in (1, 2, 3)]
    assert len(set(values)) > 1  # the highest is another checkpoint than the lowest
    best = checkpoint.read_info(tmp_path / "run" / checkpoint.BEST)
    assert best["metrics"]["eval/P/eval_mae"] == min(values)


def test_every_eval_competes_for_the_best_checkpoint_not_only_those_on_checkpoint_steps(data_file, tmp_path):
    # a learning rate that overshoots: the eval loss is lowest before the last step, the only checkpoint step
    main(_config(data_file, tmp_path / "run", steps=4, lr=0.3, warmup_steps=0, eval_every=1, checkpoint_every=4,
                 keep_last=0, threads=1))
    evals = (tmp_path / "run" / "eval.jsonl").read_text().splitlines()
    losses = {r["step"]: r["eval/loss"] for r in map(json.loads, evals)}
    lowest = min(losses, key=losses.get)
    assert lowest < 4
    best = checkpoint.read_info(tmp_path / "run" / checkpoint.BEST)
    assert best["step"] == lowest and best["metrics"]["eval/loss"] == losses[lowest]
    assert checkpoint.read_info(tmp_path / "run" / checkpoint.LAST)["step"] == 4


@pytest.mark.parametrize("export, message", [
    ("run", "overlaps the run directory --out"),  # the export would replace the run's checkpoints and logs
    (".", "overlaps the run directory --out"),
    ("run/model", "overlaps the run directory --out"),
    ("mine", "holds"),  # a folder of other files
])
def test_an_export_that_would_delete_other_files_is_refused_before_training(data_file, tmp_path, capsys, export,
                                                                            message):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("important")
    code = cli.main(["sft", "--data", str(data_file), "--out", str(tmp_path / "run"), "--export",
                     str(tmp_path / export), "--steps", "1", "--tensorboard", "false"])
    assert code == 2 and f"--export {tmp_path / export}: {message}" in one_error_line(capsys)
    assert not (tmp_path / "run").exists() and (tmp_path / "mine" / "notes.txt").read_text() == "important"


def test_cli_trains_and_writes_a_loadable_checkpoint_and_export(data_file, tmp_path):
    config = tmp_path / "sft.toml"
    config.write_text(f'data = "{data_file}"\npreset = "tiny"\nsteps = 3\nbatch_size = 4\neval_samples = 4\n'
                      'eval_loss_samples = 4\ntensorboard = false\n')
    out, export = tmp_path / "run", tmp_path / "model"
    code = cli.main(["sft", "--config", str(config), "--out", str(out), "--export", str(export),
                     "--export-dtype", "float16", "--checkpoint-every", "2"])
    assert code == 0
    model, tokenizer = load_model(out / checkpoint.LAST)
    assert tokenizer.vocab_size == 257 and model.config.n_layer == 4  # the tiny preset
    exported, _ = load_model(export)
    assert exported.wte.weight.dtype == torch.float32  # stored as float16, read back as float32
    assert torch.equal(exported.wte.weight, model.wte.weight.half().float())
    meta = read_metadata(export)
    assert meta["command"].startswith("rookworld sft ") and "--steps 3" in meta["command"]
    assert meta["step"] == 3 and "eval/A/exact" in meta["metrics"]
    assert checkpoint.read_info(out / checkpoint.step_dir_name(2))["step"] == 2
    # Resuming the finished run with more steps continues it.
    assert cli.main(["sft", "--resume", str(out), "--steps", "4"]) == 0
    assert checkpoint.read_info(out / checkpoint.LAST)["step"] == 4
    # A second stage from the export records the first stage's training record: the model's lineage.
    stage2 = tmp_path / "stage2"
    assert cli.main(["sft", "--config", str(config), "--init-from", str(export), "--out", str(tmp_path / "run2"),
                     "--export", str(stage2), "--steps", "1"]) == 0
    first = read_metadata(export)  # rewritten by the resumed run
    assert first["step"] == 4 and "init_from_record" not in first
    assert read_metadata(stage2)["init_from_record"] == first


def test_init_from_with_more_layers_deepens_the_model_from_the_same_function(data_file, tmp_path, capsys):
    main(_config(data_file, tmp_path / "base", steps=1, eval_every=0))
    base = tmp_path / "base" / checkpoint.LAST
    assert cli.main(["sft", "--data", str(data_file), "--init-from", str(base), "--n-layer", "3", "--steps", "1",
                     "--lr", "1e-9", "--eval-every", "0", "--out", str(tmp_path / "deep"), "--tensorboard",
                     "false"]) == 0
    small, _ = load_model(base)
    deep, _ = load_model(tmp_path / "deep" / checkpoint.LAST)
    assert (small.config.n_layer, deep.config.n_layer) == (1, 3)
    assert deep.num_parameters() == small.num_parameters() + 2 * sum(p.numel() for p in small.h[0].parameters())
    ids = torch.tensor([[0, 80, 58, 32, 114, 110, 98]])
    torch.testing.assert_close(deep(ids), small(ids), rtol=0, atol=1e-5)  # one step at lr 1e-9 from the same
    for flags, message in ((["--n-layer", "0"], "n_layer must be >= 1"),
                           (["--n-layer", "2"], "--n-layer 2: "),  # the model has 3 now: layers are only added
                           (["--n-embd", "64"], "--n-embd 64: "),
                           (["--n-head", "1", "--n-positions", "64"], "--n-head 1, --n-positions 64: ")):
        code = cli.main(["sft", "--data", str(data_file), "--init-from", str(tmp_path / "deep" / checkpoint.LAST),
                         *flags, "--steps", "1", "--eval-every", "0", "--out", str(tmp_path / "bad"),
                         "--tensorboard", "false"])
        assert code == 2 and message in one_error_line(capsys)


def test_cli_resume_of_a_directory_that_is_no_run_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["sft", "--resume", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_tokenizer_vocab_trains_a_bpe_whose_size_the_model_takes(data_file, tmp_path):
    main(_config(data_file, tmp_path / "run", tokenizer_vocab=300, steps=1, eval_every=0))
    model, tokenizer = load_model(tmp_path / "run" / checkpoint.LAST)
    assert 257 < tokenizer.vocab_size <= 300 and model.config.vocab_size == tokenizer.vocab_size
    line = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()[0]
    assert len(tokenizer.encode(line)) < len(line.encode())  # merges: fewer tokens than bytes


@pytest.mark.parametrize("view, length", [("squares", 71), ("named", 72)])
def test_tokenizer_view_trains_on_boards_square_by_square_and_answers_in_fen(data_file, tmp_path, view, length):
    code = cli.main(["sft", "--data", str(data_file), "--preset", "tiny", "--n-layer", "1", "--n-embd", "32",
                     "--n-head", "2", "--tokenizer-view", view, "--steps", "1", "--batch-size", "4",
                     "--eval-samples", "4", "--eval-loss-samples", "4", "--out", str(tmp_path / "run"),
                     "--tensorboard", "false"])
    assert code == 0
    model, tokenizer = load_model(tmp_path / "run" / checkpoint.LAST)  # the flag travels with the checkpoint
    assert tokenizer.view == view
    line = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()[0]
    sample = from_line(line)
    (ids, prompt_length), = encode_samples(tokenizer, [sample])
    board = sample.prompt.split()[1]
    assert ids[1:prompt_length] == tokenizer.encode(sample.prompt)
    assert len(tokenizer.encode(sample.prompt)) == len(sample.prompt) - len(board) + length  # the board's squares
    assert tokenizer.decode(ids[1:prompt_length]) == sample.prompt  # decoded back in FEN


def test_tokenizer_view_with_init_from_converts_a_model_to_the_view(data_file, tmp_path):
    common = ["--data", str(data_file), "--steps", "1", "--batch-size", "4", "--eval-every", "0",
              "--tensorboard", "false"]
    assert cli.main(["sft", *common, "--preset", "tiny", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
                     "--out", str(tmp_path / "fen")]) == 0
    before, fen = load_model(tmp_path / "fen" / checkpoint.LAST)
    assert fen.view == "fen"
    assert cli.main(["sft", *common, "--init-from", str(tmp_path / "fen" / checkpoint.LAST), "--tokenizer-view",
                     "named", "--out", str(tmp_path / "named")]) == 0
    after, named = load_model(tmp_path / "named" / checkpoint.LAST)
    assert named.view == "named" and named.vocab_size == fen.vocab_size  # the same tokens, boards read anew
    assert after.config.n_embd == before.config.n_embd and after.config.n_layer == before.config.n_layer


@pytest.mark.parametrize("flags, message", [
    (["--n-head", "0"], "n_head must be >= 1, got 0"),
    (["--data-limit", "0"], "data_limit must be >= 1, got 0"),
    (["--seed", "-1"], "seed must be >= 0, got -1"),
    (["--tokenizer-vocab", "100"], "vocab_size=100 is too small"),
    (["--tokenizer-view", "ranks"], "tokenizer_view must be one of fen, squares, named, got 'ranks'"),
    (["--best-metric", "P/acpl"], "best_metric must name a metric of the run's evaluation"),
])
def test_bad_sft_flags_are_one_clear_line(data_file, tmp_path, capsys, flags, message):
    assert cli.main(["sft", "--data", str(data_file), "--out", str(tmp_path / "run"), "--steps", "1", *flags]) == 2
    assert message in one_error_line(capsys)
