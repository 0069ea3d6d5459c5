"""Metric definitions on hand-made predictions, and batched evaluation equal to unbatched."""

from __future__ import annotations

import json

import pytest
import torch

from rookworld import cli, metrics, text
from rookworld.analysis import Analysis
from rookworld.data.record import Sample, a_sample
from rookworld.data.rows import from_line
from rookworld.data.sources import load_source
from rookworld.evaluate import EvalConfig, complete, evaluate_completions, limited, markdown_table, task_mix

FEN = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
ANALYSIS = Analysis(FEN, ("f1b5", "d2d4", "f1c4", "b1c3", "d2d3"), (0.45, 0.4, 0.3, 0.2, 0.1), "depth=10")
P = Sample("P", text.p_prompt(FEN), text.p_target(FEN, ANALYSIS.moves, ANALYSIS.evals, "f1b5"), ANALYSIS,
           {"label_best": "d2d4"})


def p_completion(moves, evals, best):
    return text.p_target(FEN, moves, evals, best)


def test_exact_p_target_scores_full_marks():
    m = metrics.p_metrics(P, P.target)
    assert m == {"P/format_valid": 1.0, "P/best_move_legal": 1.0, "P/best_move_acc": 1.0, "P/top5_overlap": 1.0,
                 "P/best_listed": 1.0, "P/best_chosen": 1.0, "P/follows_evals": 1.0,
                 "P/best_move_acc_label": 0.0, "P/eval_mae": 0.0}


def test_illegal_best_move():
    m = metrics.p_metrics(P, p_completion(ANALYSIS.moves, ANALYSIS.evals, "e1e3"))
    assert m["P/best_move_legal"] == 0.0 and m["P/best_move_acc"] == 0.0 and m["P/format_valid"] == 1.0


def test_best_move_outside_top5_and_partial_overlap():
    # h2h3 is legal but not in the top 5; two of five candidates are right; evals off by 0.5 and 1.0 pawns.
    completion = p_completion(["f1b5", "d2d4", "h2h3", "a2a3", "g1h1"], [0.95, -0.6, 0.0, 0.0, 0.0], "h2h3")
    m = metrics.p_metrics(P, completion)
    assert m["P/best_move_legal"] == 1.0 and m["P/best_move_acc"] == 0.0
    assert m["P/top5_overlap"] == pytest.approx(2 / 5)
    assert m["P/eval_mae"] == pytest.approx((0.5 + 1.0) / 2)


def test_best_listed_but_not_chosen_against_its_own_highest_eval():
    m = metrics.p_metrics(P, p_completion(ANALYSIS.moves, ANALYSIS.evals, "d2d4"))
    assert (m["P/best_listed"], m["P/best_chosen"], m["P/follows_evals"]) == (1.0, 0.0, 0.0)


def test_best_not_listed_and_a_choice_that_follows_its_evals():
    # f1b5 (the engine's best) is missing; h2h3 carries the completion's own highest eval and is chosen.
    m = metrics.p_metrics(P, p_completion(["d2d4", "h2h3", "a2a3", "g1h1", "b1c3"], [0.1, 0.9, 0.0, -0.2, 0.3], "h2h3"))
    assert m["P/best_listed"] == 0.0 and m["P/follows_evals"] == 1.0
    assert "P/best_chosen" not in m  # averaged only over completions that list the best move


def test_follows_evals_needs_one_eval_per_move():
    completion = p_completion(["f1b5", "d2d4"], [0.45, 0.4], "f1b5").replace("0.45 0.4", "0.45")
    m = metrics.p_metrics(P, completion)
    assert m["P/best_listed"] == 1.0 and "P/follows_evals" not in m


def test_label_accuracy_follows_the_datas_own_b_label():
    m = metrics.p_metrics(P, p_completion(ANALYSIS.moves, ANALYSIS.evals, "d2d4"))
    assert m["P/best_move_acc_label"] == 1.0 and m["P/best_move_acc"] == 0.0


def test_castling_written_king_takes_rook_is_the_castling_move_as_move_quality_reads_it():
    fen = "r3k2r/pppq1ppp/2npbn2/2b1p3/2B1P3/2NPBN2/PPPQ1PPP/R3K2R w KQkq - 4 8"
    analysis = Analysis(fen, ("e1g1", "e1c1", "h2h3", "a2a3", "c3d5"), (0.5, 0.4, 0.3, 0.2, 0.1), "depth=10")
    sample = Sample("P", text.p_prompt(fen), text.p_target(fen, analysis.moves, analysis.evals, "e1g1"), analysis,
                    {"label_best": "e1g1"})
    for written in ("e1g1", "e1h1"):
        m = metrics.p_metrics(sample, text.p_target(fen, analysis.moves, analysis.evals, written))
        assert (m["P/best_move_legal"], m["P/best_move_acc"], m["P/best_move_acc_label"]) == (1.0, 1.0, 1.0), written
    m = metrics.p_metrics(sample, text.p_target(fen, analysis.moves, analysis.evals, "e1a1"))  # queenside
    assert (m["P/best_move_legal"], m["P/best_move_acc"]) == (1.0, 0.0)


MATE_FEN = "7k/6pp/8/8/8/8/8/R2Q2K1 w - - 0 1"  # two mates in one: d1d8 and a1a8
MATE_ANALYSIS = Analysis(MATE_FEN, ("d1d8", "a1a8", "d1d4", "g1f2", "a1a2"), (10.0, 10.0, 9.0, 8.0, 7.0), "depth=10")
MATE = Sample("P", text.p_prompt(MATE_FEN), text.p_target(MATE_FEN, MATE_ANALYSIS.moves, MATE_ANALYSIS.evals, "d1d8"),
              MATE_ANALYSIS)


@pytest.mark.parametrize("best, mates, best_move", [
    ("d1d8", 1.0, 1.0),  # the engine's mate
    ("a1a8", 1.0, 0.0),  # another mate: not the rank-1 move, still a mate in one
    ("d1d4", 0.0, 0.0),  # a strong legal move that does not mate
    ("d1d9", 0.0, 0.0),  # not a move
])
def test_mate_in_one_counts_any_mating_move(best, mates, best_move):
    m = metrics.p_metrics(MATE, text.p_target(MATE_FEN, MATE_ANALYSIS.moves, MATE_ANALYSIS.evals, best))
    assert (m["P/mate_in_one"], m["P/best_move_acc"]) == (mates, best_move)


def test_a_metrics_exact_and_wrong_flags():
    sample = a_sample("A: " + FEN + "+f1b5+e2e4 e7e5 g1f3 b8c6 f1b5+")
    exact = metrics.a_metrics(sample, sample.target)
    assert exact["A/exact"] == exact["A/fen_exact"] == exact["A/similarity"] == exact["A/fen_field_acc"] == 1.0
    fen, reward, _, _ = sample.target.split("+")
    wrong = metrics.a_metrics(sample, f"{fen}+{reward}+1+1")
    assert wrong["A/exact"] == 0.0 and wrong["A/fen_exact"] == 1.0 and wrong["A/reward_acc"] == 1.0
    assert wrong["A/terminated_acc"] == 0.0 and wrong["A/truncated_acc"] == 0.0
    assert 0.9 < wrong["A/similarity"] < 1.0


def test_a_fen_field_accuracy_counts_fields():
    sample = a_sample("A: " + FEN + "+f1b5+f1b5+")
    fen = sample.target.split("+")[0].split(" ")
    fen[4], fen[5] = "9", "9"  # wrong half-move clock and move number: 4 of 6 fields right
    m = metrics.a_metrics(sample, " ".join(fen) + "+0.001+0+0")
    assert m["A/fen_field_acc"] == pytest.approx(4 / 6) and m["A/fen_exact"] == 0.0


def test_rare_case_accuracy_is_reported_by_case():
    illegal = a_sample("A: " + FEN + "+e1e3+e1e3+")
    m = metrics.a_metrics(illegal, illegal.target)
    assert illegal.meta["case"] == "illegal" and m["A/exact/illegal"] == 1.0


def test_false_illegal_counts_legal_moves_called_illegal():
    legal = a_sample("A: " + FEN + "+f1b5+f1b5+")
    unchanged_board = FEN + "+-1.0+0+1"  # what an illegal move's target looks like
    assert metrics.a_metrics(legal, unchanged_board)["A/false_illegal"] == 1.0
    assert metrics.a_metrics(legal, legal.target)["A/false_illegal"] == 0.0
    illegal = a_sample("A: " + FEN + "+e1e3+e1e3+")
    assert "A/false_illegal" not in metrics.a_metrics(illegal, unchanged_board)


def test_aggregate_counts_and_rewards():
    a = a_sample("A: " + FEN + "+f1b5+f1b5+")
    result = evaluate_completions([P, a], [[P.target], ["garbage"]])
    assert result["count/P"] == 1 and result["count/A"] == 1
    assert result["reward/P"] == pytest.approx(1.0) and result["reward/A"] < 0.5
    assert result["reward/mean"] == pytest.approx((result["reward/P"] + result["reward/A"]) / 2)


def test_pass_at_n_counts_prompts_with_one_right_answer():
    a = a_sample("A: " + FEN + "+f1b5+f1b5+")
    result = evaluate_completions([a], [["wrong", a.target, "wrong"]])
    assert result["A/exact@3"] == 1.0 and result["A/exact"] == pytest.approx(1 / 3)


def test_markdown_table_shows_value_se_and_n():
    a = a_sample("A: " + FEN + "+f1b5+f1b5+")
    results = {"m1": evaluate_completions([a, a], [[a.target], ["garbage"]]),
               "m2": evaluate_completions([P], [[P.target]])}
    lines = markdown_table(results).splitlines()
    assert lines[:2] == ["| metric | m1 | m2 |", "|---|---|---|"]
    assert "| A/exact | 0.5000 ± 0.5000 (n=2) | - |" in lines
    assert "| P/best_move_acc | - | 1.0000 ± nan (n=1) |" in lines  # one value: no standard error
    assert "| count/A | 2.0000 | 0.0000 |" in lines
    assert not any("/se" in line or "/n " in line for line in lines)


def test_batched_evaluation_equals_unbatched(tiny_gpt, gpt2_tokenizer, fixtures_dir):
    rows = json.loads((fixtures_dir / "a_task_openings_sample.json").read_text())[:6]
    samples = [a_sample(r["prompt"]) for r in rows] + [P]
    torch.manual_seed(0)
    from rookworld.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=gpt2_tokenizer.vocab_size, n_positions=512, n_embd=32, n_layer=2,
                          n_head=2)).eval()
    one = complete(model, gpt2_tokenizer, samples, EvalConfig(batch_size=1))
    many = complete(model, gpt2_tokenizer, samples, EvalConfig(batch_size=4))
    assert one == many


@pytest.mark.stockfish
def test_eval_command_scores_a_predictions_file(tmp_path, capsys):
    a = a_sample("A: " + FEN + "+f1b5+f1b5+")
    path = tmp_path / "pred.jsonl"
    path.write_text(json.dumps({"prompt": a.prompt, "completion": a.target}) + "\n"
                    + json.dumps({"prompt": a.prompt, "completion": "nonsense"}) + "\n")
    out = tmp_path / "m.json"
    assert cli.main(["eval", "--predictions", str(path), "--out", str(out), "--processes", "1"]) == 0
    result = json.loads(out.read_text())["pred.jsonl"]
    assert result["A/exact"] == 0.5 and result["count/A"] == 2
    assert result["A/exact/se"] == pytest.approx(0.5) and result["A/exact/n"] == 2  # sqrt(p (1 - p) / (n - 1))


def test_limit_draws_each_task_in_its_share_by_seed():
    """The rows `eval --limit 600` scores of the embedded eval split (1,500 P rows, then 5,000 A rows)."""
    samples = load_source("embedded", "eval").samples
    assert task_mix(samples) == "1,500 P + 5,000 A"
    rows = limited(samples, 600, seed=0)
    assert task_mix([samples[i] for i in rows]) == "138 P + 462 A"  # the split's mix, not its first 600 rows
    assert rows == sorted(set(rows)) and rows == limited(samples, 600, seed=0)  # in order, seeded
    other = limited(samples, 600, seed=1)
    assert task_mix([samples[i] for i in other]) == "138 P + 462 A" and len(set(other) & set(rows)) < 100
    assert limited(samples, 6500, seed=0) == limited(samples, None, seed=0) == list(range(6500))


@pytest.mark.stockfish
def test_eval_limit_scores_a_seeded_share_of_each_task_and_says_so(tmp_path, fixtures_dir, capsys):
    p_rows, a_rows = ([from_line(line) for line in (fixtures_dir / name).read_text().splitlines()[:n]]
                      for name, n in (("rook_val_sample.txt", 8), ("a_openings.txt", 32)))
    rows = [{"prompt": s.prompt, "completion": ""} for s in p_rows]
    for i, s in enumerate(a_rows):  # every third A answer right: which rows are drawn shows in A/exact
        rows.append({"prompt": s.prompt, "completion": s.target if i % 3 == 0 else ""})
    path = tmp_path / "pred.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    results = {}
    for seed in (0, 0, 1):
        out = tmp_path / f"seed{seed}.json"
        assert cli.main(["eval", "--predictions", str(path), "--limit", "10", "--seed", str(seed), "--out", str(out),
                         "--processes", "1"]) == 0
        said = capsys.readouterr().out.splitlines()[0]
        assert said == f"scoring 10 of the 40 rows of {path}, each task in its share (--limit 10, --seed {seed}): " \
                       "2 P + 8 A"
        result = results.setdefault(seed, json.loads(out.read_text())["pred.jsonl"])
        assert result == json.loads(out.read_text())["pred.jsonl"]  # the same rows for the same seed
        assert result["count/P"] == 2 and result["count/A"] == 8
    assert results[0]["A/exact"] != results[1]["A/exact"]  # another seed, other rows


@pytest.mark.stockfish
def test_eval_command_bad_predictions_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "pred.jsonl"
    path.write_text('{"prompt": "X: nothing", "completion": ""}\n')
    assert cli.main(["eval", "--predictions", str(path), "--processes", "1"]) == 2
    assert "line 1" in capsys.readouterr().err
    path.write_bytes(b'\xff\xfe{"prompt": 1}\n')
    assert cli.main(["eval", "--predictions", str(path), "--processes", "1"]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err


def test_eval_output_paths_are_checked_before_the_work(tmp_path, capsys):
    a = a_sample("A: " + FEN + "+f1b5+f1b5+")
    path = tmp_path / "pred.jsonl"
    path.write_text(json.dumps({"prompt": a.prompt, "completion": a.target}) + "\n")
    for flag in ("--out", "--markdown"):
        assert cli.main(["eval", "--predictions", str(path), flag, str(tmp_path)]) == 2
        err = capsys.readouterr()
        assert f"{flag} {tmp_path} is a directory" in err.err and "A/exact" not in err.out  # nothing evaluated
    out, table = tmp_path / "new" / "m.json", tmp_path / "other" / "m.md"
    assert cli.main(["eval", "--predictions", str(path), "--out", str(out), "--markdown", str(table)]) == 0
    assert json.loads(out.read_text())["pred.jsonl"]["A/exact"] == 1.0 and "A/exact" in table.read_text()


def test_forced_choice_gives_the_target_up_to_b_and_scores_the_greedy_move():
    """The model reads the target's own M: and E: fields and its greedy move (decoded here by argmax, token by
    token) is judged against the target's B: move; an A sample or a P target without B: has no value."""
    from dataclasses import replace

    from rookworld.evaluate import forced_choice_values
    from rookworld.hub import load_model, resolve_default_model

    model, tokenizer = load_model(resolve_default_model())
    ids = tokenizer.encode_prompts([P.prompt])[0] + tokenizer.encode(P.target[:P.target.index("B:") + 2])
    start = len(ids)
    with torch.no_grad():
        while len(ids) < start + 6 and (len(ids) == start or ids[-1] != tokenizer.eos_id):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    said = tokenizer.decode([i for i in ids[start:] if i != tokenizer.eos_id]).split()[0]
    other = next(move for move in ANALYSIS.moves if move != said)
    right, wrong = (replace(P, target=p_completion(ANALYSIS.moves, ANALYSIS.evals, move)) for move in (said, other))
    cut = replace(P, target=P.target[:P.target.index("B:")])
    a = a_sample("A: " + FEN + "+f1b5+f1b5+")
    values = forced_choice_values(model, tokenizer, [right, a, wrong, cut], EvalConfig(batch_size=2))
    assert values == [{"P/forced_choice": [1.0]}, {}, {"P/forced_choice": [0.0]}, {}]
    assert forced_choice_values(model, tokenizer, [a, cut], EvalConfig()) == [{}, {}]


def test_model_values_report_the_forced_choice_of_every_p_prompt():
    from rookworld.evaluate import model_values
    from rookworld.hub import load_model, resolve_default_model

    split = load_source("embedded", "eval").samples
    samples = [s for s in split if s.task == "P"][:6] + [s for s in split if s.task == "A"][:6]
    result, values = model_values(*load_model(resolve_default_model()), samples, EvalConfig(batch_size=8))
    assert result["P/forced_choice/n"] == 6
    assert [bool(v.get("P/forced_choice")) for v in values.per_prompt] == [s.task == "P" for s in samples]


@pytest.mark.integration
def test_a_labels_as_drafts_give_the_same_greedy_completions(monkeypatch):
    """--draft-a (default true): eval decodes an A prompt from its label, which changes nothing greedy: the same
    completions as decoding every row, right and wrong ones alike, with a fraction of the rows decoded."""
    import argparse
    import random
    from dataclasses import replace

    from rookworld import evaluate
    from rookworld.hub import load_model, resolve_default_model

    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    assert parser.parse_args(["--draft-a", "false"]).draft_a is False
    model, tokenizer = load_model(resolve_default_model())
    split = load_source("embedded", "eval").samples
    a_rows = [s for s in split if s.task == "A"]
    samples = random.Random(0).sample(a_rows, 120) + [s for s in split if s.task == "P"][:4]
    steps = []
    original = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda *args: steps.append(len(args[0])) or original(*args))
    cfg = EvalConfig(batch_size=32)
    assert cfg.draft_a
    drafted = complete(model, tokenizer, samples, cfg)
    drafted_rows = sum(steps)  # rows decoded, summed over decode steps
    plain = complete(model, tokenizer, samples, replace(cfg, draft_a=False))
    assert drafted == plain
    exact = sum(c == s.target for (c,), s in zip(plain, samples))
    assert 100 <= exact < 120  # most A labels reproduced, some not: both kinds compared
    assert drafted_rows < 0.2 * (sum(steps) - drafted_rows)
