"""Move-quality metrics (ACPL, expected-score loss, bands), best of k, standard errors and `--split` of
`rookworld eval`, on constructed completions whose answers are known, with the real engine."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import replace

import numpy as np
import pytest
from conftest import one_error_line

from rookworld import cli, metrics, text
from rookworld.analysis import Analysis, expected_score
from rookworld.data.record import Sample, a_sample
from rookworld.data.rows import from_line
from rookworld.data.splits import split_of
from rookworld.evaluate import EvalConfig, evaluate_completions, evaluate_model
from rookworld.quality import LOSS_CAP_PAWNS, judge_moves
from rookworld.stockfish import Limit, StockfishPool

MATE_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30"  # a1a8#; a1a2 keeps a rook but gives up the mate
FAST = Limit(depth=8)


def completion(best: str | None) -> str:
    """A well-formed P completion naming `best` after B: (None: the B: field left out)."""
    full = text.p_target(MATE_IN_ONE, ["a1a8", "a1a2", "g1f1", "g1f2", "g1h1"], [99.0, 5.0, 4.0, 4.0, 4.0],
                         best or "a1a8")
    return full if best else full.rsplit("B:", 1)[0]


@pytest.fixture(scope="module")
def engine():
    with StockfishPool(processes=1) as pool:
        yield pool


@pytest.fixture(scope="module")
def sample(engine):
    """A P sample of the mate in one whose stored analysis is the engine's at FAST (so it is the truth)."""
    analysis = engine.analyse([MATE_IN_ONE], FAST)[0]
    return Sample("P", text.p_prompt(MATE_IN_ONE), text.p_target(MATE_IN_ONE, analysis.moves, analysis.evals,
                                                                 analysis.moves[0]), analysis)


@pytest.fixture(scope="module")
def blunder_loss(engine, sample) -> float:
    return judge_moves(engine, [(MATE_IN_ONE, "a1a2")], FAST, [sample.analysis])[0].loss


@pytest.mark.stockfish
def test_acpl_expected_score_loss_and_bands_of_known_moves(engine, sample, blunder_loss):
    groups = [[completion("a1a8")], [completion("a1a2")], [completion("e1e3")], [completion(None)]]
    result = evaluate_completions([sample] * 4, groups, engine, limit=FAST)
    assert 3.0 < blunder_loss < LOSS_CAP_PAWNS
    # best 0, the blunder its loss, an illegal and a missing B: move the cap
    assert result["P/acpl"] == pytest.approx((0.0 + blunder_loss + 2 * LOSS_CAP_PAWNS) / 4)
    assert result["P/acpl/n"] == 4
    # the legal moves alone: the best move and the blunder
    assert result["P/acpl_legal"] == pytest.approx(blunder_loss / 2) and result["P/acpl_legal/n"] == 2
    mate = expected_score(sample.analysis.evals[0])
    assert 0.0 < result["P/expected_score_loss"] < 3 * mate / 4  # the blunder loses less than a forfeit
    assert result["P/expected_score_loss"] > 2 * mate / 4  # the two forfeits lose all the mate's expected score
    assert {k.removeprefix(metrics.BAND_PREFIX): v for k, v in result.items()
            if k.startswith(metrics.BAND_PREFIX) and not metrics.is_statistic(k)} == {
        "best": 0.25, "excellent": 0.0, "good": 0.0, "inaccuracy": 0.0, "mistake": 0.0, "blunder": 0.75}
    assert result["P/best_move_acc"] == 0.25 and result["P/best_move_legal"] == 0.5


@pytest.mark.stockfish
def test_best_of_k_takes_each_prompts_smallest_loss(engine, sample, blunder_loss):
    groups = [[completion("a1a2"), completion("a1a8"), completion("e1e3")],
              [completion("e1e3"), completion(None), completion("a1a2")]]
    result = evaluate_completions([sample, sample], groups, engine, limit=FAST)
    assert result["P/acpl@3"] == pytest.approx(blunder_loss / 2) and result["P/acpl@3/n"] == 2
    assert result["P/best_move_acc@3"] == 0.5
    assert result["P/acpl"] == pytest.approx((2 * blunder_loss + 3 * LOSS_CAP_PAWNS) / 6)
    # clustered by prompt: the two prompts' means differ by 10/3 pawns, so SE = (10/3) / 2
    assert result["P/acpl/n"] == 2 and result["P/acpl/se"] == pytest.approx(10 / 6)


@pytest.mark.stockfish
def test_the_vote_takes_the_completion_naming_the_most_frequent_legal_move(engine, sample, blunder_loss):
    # prompt 1: the blunder twice beats the best move once and the illegal move three times (not counted);
    # prompt 2: a tie of the best move and the blunder goes to the move named first; prompt 3: nothing legal
    groups = [[completion("e1e3"), completion("a1a8"), completion("a1a2"), completion("e1e3"), completion("a1a2"),
               completion("e1e3")],
              [completion(None), completion("a1a8"), completion("a1a2"), completion("a1a2"), completion("a1a8"),
               completion("e1e3")],
              [completion("e1e3"), completion(None), completion("e1e3"), completion(None), completion("e1e3"),
               completion("e1e3")]]
    result = evaluate_completions([sample] * 3, groups, engine, limit=FAST)
    assert result["P/acpl@vote"] == pytest.approx((blunder_loss + 0.0 + LOSS_CAP_PAWNS) / 3)
    assert result["P/best_move_acc@vote"] == pytest.approx(1 / 3) and result["P/best_move_legal@vote"] == 2 / 3
    assert result["P/acpl@vote/n"] == 3 and result["P/expected_score_loss@vote/n"] == 3
    assert result["P/acpl@6"] == pytest.approx(LOSS_CAP_PAWNS / 3)  # best of 6 beside it: the oracle's pick
    single = evaluate_completions([sample], [[completion("a1a8")]], engine, limit=FAST)
    assert "P/acpl@vote" not in single  # one completion: nothing to vote on


@pytest.mark.stockfish
def test_positions_in_check_get_their_own_acpl_legality_and_accuracy(engine, sample):
    # White in check from an unguarded rook: Kxe2 is best, Kd1 and Kf1 are the only other legal moves.
    check = "4k3/8/8/8/8/8/4r3/4K3 w - - 0 1"
    analysis = engine.analyse([check], FAST)[0]
    assert analysis.moves[0] == "e1e2" and sorted(analysis.moves) == ["e1d1", "e1e2", "e1f1"]
    in_check = Sample("P", text.p_prompt(check), text.p_target(check, analysis.moves, analysis.evals, "e1e2"),
                      analysis)

    def answer(best: str) -> str:
        return text.p_target(check, analysis.moves, analysis.evals, best)

    groups = [[answer("e1e2")], [answer("e1e3")], [completion("a1a8")]]
    result = evaluate_completions([in_check, in_check, sample], groups, engine, limit=FAST)
    # the best move and an illegal one on the two positions in check; the mate in one is not in check
    assert result["P/best_move_legal/check"] == 0.5 and result["P/best_move_legal/check/n"] == 2
    assert result["P/best_move_acc/check"] == 0.5
    assert result["P/acpl/check"] == pytest.approx(LOSS_CAP_PAWNS / 2)
    assert result["P/acpl"] == pytest.approx(LOSS_CAP_PAWNS / 3) and result["P/acpl/n"] == 3
    assert not any(name.endswith("/check") for name in evaluate_completions([sample], [[completion("a1a8")]],
                                                                             engine, limit=FAST))


@pytest.mark.stockfish
def test_trainers_call_gets_the_quality_metrics(engine, gpt2_tokenizer):
    """evaluate_model(model, tokenizer, samples, cfg, pool), as train.py calls it, at the label limit; a random
    model writes no B: move, so every move is the cap."""
    import torch

    from rookworld.model import GPT, GPTConfig

    stale = Analysis(MATE_IN_ONE, ("a1a2",), (5.0,), "depth=2")  # not the label limit: the engine is asked
    p = Sample("P", text.p_prompt(MATE_IN_ONE), text.p_target(MATE_IN_ONE, ["a1a2"], [5.0], "a1a2"), stale)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=gpt2_tokenizer.vocab_size, n_positions=512, n_embd=32, n_layer=2, n_head=2))
    result = evaluate_model(model, gpt2_tokenizer, [p], EvalConfig(), engine)
    assert result["P/acpl"] == LOSS_CAP_PAWNS and result["P/band/blunder"] == 1.0
    assert result["P/expected_score_loss"] == pytest.approx(expected_score(999.0), abs=1e-3)  # the mate, forfeit
    assert math.isnan(result["P/acpl/se"]) and result["P/acpl/n"] == 1


def test_standard_error_on_constructed_values():
    rate = metrics.estimate([[1.0], [0.0], [1.0], [1.0]])
    assert rate.mean == 0.75 and rate.n == 4
    assert rate.se == pytest.approx(math.sqrt(0.75 * 0.25 / 3))  # sqrt(p (1 - p) / (n - 1))
    values = [2.0, 7.0, 1.0, 4.0, 4.0]
    assert metrics.estimate([[v] for v in values]).se == pytest.approx(np.std(values, ddof=1) / math.sqrt(5))
    # k completions per prompt: the SE of the per-prompt means
    clustered = metrics.estimate([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    assert clustered.mean == pytest.approx(0.5) and clustered.n == 3
    assert clustered.se == pytest.approx(np.std([0.5, 1.0, 0.0], ddof=1) / math.sqrt(3))
    # unequal sizes: r = 11/4, residuals -0.75 and 0.75, sqrt(1.125 / 2) / mean size 2
    assert metrics.estimate([[2.0], [1.0, 3.0, 5.0]]).se == pytest.approx(0.375)
    assert math.isnan(metrics.estimate([[1.0, 0.0]]).se)


def test_positions_of_one_game_are_one_cluster_of_the_standard_error():
    per_prompt = [{"P/best_move_acc": [1.0]}, {"P/best_move_acc": [1.0]}, {"P/best_move_acc": [0.0]},
                  {"P/best_move_acc": [0.0], "P/eval_mae": [2.0]}]
    alone = metrics.summarize(per_prompt)["P/best_move_acc"]
    assert alone.mean == 0.5 and alone.n == 4 and alone.se == pytest.approx(math.sqrt(0.25 / 3))
    # two games of two positions each: their outcomes agree within a game, so only 2 clusters vary
    games = metrics.summarize(per_prompt, ["g1", "g1", "g2", "g2"])
    assert games["P/best_move_acc"].n == 4 and games["P/best_move_acc"].mean == 0.5
    assert games["P/best_move_acc"].se == pytest.approx(metrics.estimate([[1.0, 1.0], [0.0, 0.0]]).se)
    assert games["P/best_move_acc"].se == pytest.approx(0.5) and alone.se < 0.5
    assert games["P/eval_mae"].n == 1  # n counts the prompts that have the metric
    # None: a prompt without a game is a cluster of its own
    mixed = metrics.summarize(per_prompt, [None, None, "g2", "g2"])["P/best_move_acc"]
    assert mixed.se == pytest.approx(metrics.estimate([[1.0], [1.0], [0.0, 0.0]]).se)


def test_paired_delta_is_the_mean_change_per_prompt_with_its_paired_se():
    before = [{"P/acpl": [4.0]}, {"P/acpl": [1.0]}, {"P/acpl": [9.0], "P/eval_mae": [1.0]}, {"P/acpl": [2.0]}]
    after = [{"P/acpl": [3.0]}, {"P/acpl": [1.0]}, {"P/acpl": [7.0]}, {"P/acpl": [0.5, 1.5]}]  # k = 2 on the last
    delta = metrics.paired_delta(after, before)
    changes = [-1.0, 0.0, -2.0, -1.0]
    assert delta["P/acpl/delta"] == pytest.approx(-1.0)
    assert delta["P/acpl/delta/se"] == pytest.approx(np.std(changes, ddof=1) / 2)  # 0.41; unpaired SEs: about 3.6
    assert "P/eval_mae/delta" not in delta  # only metrics both models have on a prompt
    assert delta["P/acpl/delta/n"] == 4
    partial = metrics.paired_delta([{"P/eval_mae": [0.5]}, {"P/eval_mae": [2.0]}], [{}, {"P/eval_mae": [1.0]}])
    assert (partial["P/eval_mae/delta"], partial["P/eval_mae/delta/n"]) == (1.0, 1)  # the prompt both have
    from rookworld.evaluate import _cell
    assert _cell({"m": 1.25, "m/se": 0.5, "m/n": 2, "m/delta": 1.0, "m/delta/se": 0.0, "m/delta/n": 1}, "m") == \
        "1.2500 ± 0.5000 (n=2) Δ +1.0000 ± 0.0000 (paired n=1)"
    by_game = metrics.paired_delta(after, before, ["g1", "g1", "g2", "g2"])
    assert by_game["P/acpl/delta/se"] == pytest.approx(metrics.estimate([[-1.0, 0.0], [-2.0, -1.0]]).se)
    assert metrics.is_statistic("P/acpl/delta") and metrics.is_statistic("P/acpl/delta/se")
    assert metrics.is_statistic("P/acpl/delta/n")


@pytest.mark.integration
@pytest.mark.stockfish
def test_eval_of_two_models_gives_the_second_its_paired_change(tmp_path, fixtures_dir, capsys):
    import torch

    from rookworld.hub import load_model, resolve_default_model, save_model

    model, tokenizer = load_model(resolve_default_model())
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    save_model(model, tokenizer, tmp_path / "noisy")
    data = tmp_path / "mine.txt"
    data.write_text("\n".join(file_rows(fixtures_dir)) + "\n")
    out = tmp_path / "two.json"
    assert cli.main(["eval", "--model", str(resolve_default_model()), "--model", str(tmp_path / "noisy"), "--data",
                     str(data), "--split", "all", "--threads", "1", "--processes", "1", "--self-play", "4",
                     "--out", str(out)]) == 0
    first, second = json.loads(out.read_text()).values()
    assert not any(key.endswith("/delta") for key in first)
    assert first["selfplay/legal_half_moves/n"] == second["selfplay/ended_illegal/n"] == 4
    assert first["selfplay/legal_half_moves"] > 0  # the embedded model plays legal moves before it errs
    for name in ("P/acpl", "A/exact", "reward/mean", "selfplay/legal_half_moves"):  # self-play: paired by game
        assert second[name + "/delta"] == pytest.approx(second[name] - first[name])  # one completion per prompt
        assert second[name + "/delta/se"] >= 0
    assert second["reward/mean/delta"] < 0 < second["reward/mean/delta/se"]  # the noise costs reward
    assert "Δ " in capsys.readouterr().out


def test_eval_clusters_its_standard_errors_by_the_samples_games(sample):
    in_games = [replace(sample, meta={"game": game}) for game in ("0-0-1", "0-0-1", "0-0-2", "0-0-2")]
    groups = [[completion("a1a8")], [completion("a1a8")], [completion("g1h1")], [completion("g1h1")]]
    alone = evaluate_completions([sample] * 4, groups)
    by_game = evaluate_completions(in_games, groups)
    assert alone["P/best_move_acc"] == by_game["P/best_move_acc"] == 0.5 and by_game["P/best_move_acc/n"] == 4
    assert alone["P/best_move_acc/se"] == pytest.approx(math.sqrt(0.25 / 3))
    assert by_game["P/best_move_acc/se"] == pytest.approx(0.5)


FEN = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"


def test_results_carry_se_and_n_beside_each_metric():
    a = a_sample("A: " + FEN + "+f1b5+f1b5+")
    result = evaluate_completions([a] * 4, [[a.target], [a.target], [a.target], ["garbage"]])
    assert result["A/exact"] == 0.75 and result["A/exact/n"] == 4
    assert result["A/exact/se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 3))
    assert "count/A/se" not in result and "P/acpl" not in result  # no pool: no move quality


def file_rows(fixtures_dir, p_per_split: int = 1, a_per_split: int = 3) -> list[str]:
    """Real P lines and A rows, `p_per_split` / `a_per_split` of each in the eval split, twice as many in
    train (chosen by the position hash, so the file's split is known)."""
    p_lines = (fixtures_dir / "rook_val_sample.txt").read_text().splitlines()
    a_items = json.loads((fixtures_dir / "a_task_openings_sample.json").read_text())
    a_lines = [item["prompt"] + item["expected_fen"] + "+0.001+0+0" for item in a_items]
    chosen = []
    for lines, per_split in ((p_lines, p_per_split), (a_lines, a_per_split)):
        for split, count in (("eval", per_split), ("train", 2 * per_split)):
            chosen += [line for line in lines if split_of(from_line(line).fen) == split][:count]
    return chosen


@pytest.mark.stockfish
def test_split_scores_the_eval_rows_by_default_and_every_row_with_all(tmp_path, fixtures_dir, capsys):
    rows = file_rows(fixtures_dir)
    data = tmp_path / "mine.txt"
    data.write_text("\n".join(rows) + "\n")
    cache = tmp_path / "sf.sqlite"
    common = ["eval", "--data", str(data), "--threads", "1", "--processes", "1", "--cache", str(cache)]
    for split, scored in ((None, 4), ("train", 8), ("all", 12)):
        out = tmp_path / f"{split}.json"
        assert cli.main(common + ["--out", str(out)] + (["--split", split] if split else [])) == 0
        printed = capsys.readouterr().out
        said = printed.splitlines()[0]
        which = "--split all" if split == "all" else f"the {split or 'eval'} split; --split all scores every row"
        assert said == f"scoring {scored} of 12 rows of {data} ({which}): {scored // 4} P + {scored - scored // 4} A"
        (result,) = json.loads(out.read_text()).values()
        assert result["count/P"] + result["count/A"] == scored and result["P/acpl/n"] == scored // 4
        assert "P/acpl/se" in result and f"(n={scored // 4})" in printed
    with sqlite3.connect(cache) as db:  # the judged positions, kept for the next eval
        assert db.execute("SELECT COUNT(DISTINCT fen) FROM results").fetchone()[0] >= 3


def test_split_is_for_data_not_predictions(tmp_path, capsys):
    path = tmp_path / "pred.jsonl"
    path.write_text(json.dumps({"prompt": "A: " + FEN + "+f1b5+f1b5+", "completion": ""}) + "\n")
    assert cli.main(["eval", "--predictions", str(path), "--split", "all", "--processes", "1"]) == 2
    assert "--split" in capsys.readouterr().err
    assert cli.main(["eval", "--predictions", str(path), "--self-play", "2", "--processes", "1"]) == 2
    assert "leave out --model, --split, --self-play and --world-games" in capsys.readouterr().err


@pytest.mark.stockfish
def test_fast_decode_false_decodes_as_on_cpu_and_true_needs_cuda(tmp_path, fixtures_dir, capsys):
    data = tmp_path / "mine.txt"
    data.write_text("\n".join(file_rows(fixtures_dir)) + "\n")
    common = ["eval", "--data", str(data), "--threads", "1", "--processes", "1", "--device", "cpu"]
    outs = [tmp_path / "default.json", tmp_path / "false.json"]
    assert cli.main(common + ["--out", str(outs[0])]) == 0
    assert cli.main(common + ["--out", str(outs[1]), "--fast-decode", "false"]) == 0
    assert outs[0].read_text() == outs[1].read_text()  # on CPU the default is the fp32 eager path
    capsys.readouterr()
    assert cli.main(common + ["--fast-decode", "true"]) == 2
    assert "--fast-decode true needs a CUDA device" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.stockfish
def test_sampled_eval_flags_limit_and_markdown(tmp_path, fixtures_dir, capsys):
    data = tmp_path / "mine.txt"
    data.write_text("\n".join(file_rows(fixtures_dir)) + "\n")
    common = ["eval", "--data", str(data), "--split", "all", "--limit", "6", "--threads", "1", "--processes", "1"]
    runs = {"greedy": [], "nucleus": ["--samples", "2", "--top-p", "1e-9"],
            "hot": ["--samples", "2", "--temperature", "3", "--seed", "5"]}
    results = {}
    for name, flags in runs.items():
        out, markdown = tmp_path / f"{name}.json", tmp_path / f"{name}.md"
        assert cli.main(common + flags + ["--out", str(out), "--markdown", str(markdown)]) == 0
        seed = flags[-1] if "--seed" in flags else "0"
        assert capsys.readouterr().out.startswith(
            f"scoring 6 of the 12 rows of the all split of {data}, each task in its share (--limit 6, --seed {seed}): "
            "2 P + 4 A\n")
        ((model, results[name]),) = json.loads(out.read_text()).items()
        table = markdown.read_text().splitlines()
        assert table[0] == f"| metric | {model} |" and any(line.startswith("| A/exact | ") for line in table)
    greedy, nucleus, hot = results["greedy"], results["nucleus"], results["hot"]
    assert greedy["count/P"] + greedy["count/A"] == 6 and "A/exact@2" not in greedy
    # a nucleus that keeps one token samples the greedy completion twice
    assert nucleus["A/exact"] == nucleus["A/exact@2"] == greedy["A/exact"]
    assert nucleus["P/acpl"] == nucleus["P/acpl@2"] == pytest.approx(greedy["P/acpl"])
    assert hot["reward/mean"] < greedy["reward/mean"]  # three times as hot: worse completions
    assert cli.main(common + ["--samples", "2", "--temperature", "3", "--seed", "5", "--out",
                              str(tmp_path / "again.json")]) == 0
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads((tmp_path / "hot.json").read_text())


@pytest.mark.parametrize("flags, message", [
    (["--samples", "2", "--temperature", "0"], "temperature, top_p: temperature must be finite and > 0"),
    (["--top-p", "1.5"], "temperature, top_p: top_p must be in (0, 1]"),
    (["--samples", "0"], "samples must be >= 1, got 0"),
    (["--seed", "-1"], "seed must be >= 0, got -1"),
    (["--self-play", "-1"], "self_play must be >= 0, got -1"),
    (["--limit", "0"], "--limit 0: must be >= 1"),
    (["--threads", "0"], "--threads 0: must be >= 1"),
])
def test_bad_eval_flags_are_one_clear_line(flags, message, capsys):
    assert cli.main(["eval", "--processes", "1", *flags]) == 2
    assert message in one_error_line(capsys)
