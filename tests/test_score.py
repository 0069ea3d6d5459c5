"""`rookworld score` end to end on files built from the real fixtures."""

import json

import chess
import pytest
from conftest import FIXTURES

from rookworld import arbiter, cli, rewards, text
from rookworld.analysis import Analysis
from rookworld.score import ScoreConfig
from rookworld.stockfish import StockfishPool

K4 = json.loads((FIXTURES / "rookworld_lm_completions_k4.json").read_text())["sample_results"]
A_GENERATIONS = json.loads((FIXTURES / "rookworld_lm_a_generations.json").read_text())
VAL_LINES = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()

BAD_LINES = [
    ("not json at all", "is not JSON"),
    ("[1, 2, 3]", "is not a JSON object"),
    (json.dumps({"prompt": "P: 8/8/8/8/8/8/8/k1K5 w - - 0 1"}), "needs the string fields"),
    (json.dumps({"prompt": "Q: what is chess?", "completion": "M: e2e4"}), "must start with 'P: ' or 'A: '"),
    (json.dumps({"prompt": "P: not a fen", "completion": ""}), "must have 6 fields"),
    (json.dumps({"prompt": "A: " + arbiter.parse_fen("8/8/8/8/8/8/8/k1K5 w - - 0 1").fen() + "+zz+zz+",
                 "completion": ""}), "not a UCI move"),
    (json.dumps({"prompt": "P: 8/8/8/8/8/8/8/k1K5 w - - 0 1", "completion": "", "analysis": {"fen": 1}}),
     "'analysis' is not a usable Analysis.to_json() object: an analysis needs a FEN string"),
    *[(json.dumps({"prompt": "P: 8/8/8/8/8/8/8/k1K5 w - - 0 1", "completion": "B: c1d2",
                   "analysis": {"fen": fen, "moves": moves, "evals": evals}}), reason)
      for fen, moves, evals, reason in [
          (None, ["c1d2"], [0.0], "needs a FEN string"),
          ("8/8/8/8/8/8/8/k1K5 w - - 0 1", ["c1d2"], [float("nan")], "finite numbers"),
          ("8/8/8/8/8/8/8/k1K5 w - - 0 1", [], [], "names no move"),
          ("8/8/8/8/8/8/8/k1K5 w - - 0 1", ["c1b1"], [0.0], "moves not legal"),
          ("8/8/8/8/8/8/8/k1K5 w - - 0 1", ["c1d2", "c1d2"], [0.0, 0.0], "named twice"),
          ("8/8/8/8/8/8/8/8 w - - 0 1", ["c1d2"], [0.0], "not a legal chess position")]],
    (json.dumps({"prompt": "P: 8/8/8/8/8/8/8/k1K5 w - - 0 1", "completion": "",
                 "analysis": Analysis("8/8/8/8/8/8/8/K1k5 w - - 0 1", ("a1a2",), (0.0,), "x").to_json()}),
     "analysis of"),
    ("", "is not JSON"),
]


def stored_p_lines() -> list[dict]:
    """P lines of rook_val with their Stockfish truth stored, completed by the file's own label."""
    records = []
    for line in VAL_LINES[:30]:
        parsed = text.parse_p_line(line)
        ranked = sorted(zip(parsed.moves, parsed.evals), key=lambda pair: -pair[1])
        analysis = Analysis(parsed.fen, tuple(m for m, _ in ranked), tuple(e for _, e in ranked), "rook_val")
        records.append({"prompt": text.p_prompt(parsed.fen), "completion": text.split_line(line)[2].lstrip(),
                        "analysis": analysis.to_json()})
    return records


def write_jsonl(path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def score_cli(*args) -> int:
    return cli.main(["score", *map(str, args)])


def test_a_and_stored_p_lines_score_without_starting_the_engine(tmp_path):
    good = stored_p_lines() + [{"prompt": row["prompt"], "completion": row["generated"]} for row in A_GENERATIONS]
    lines = [json.dumps(record) for record in good]
    bad_at = list(range(3, 3 + 2 * len(BAD_LINES), 2))  # interleave the bad lines with the good ones
    for at, (bad, _) in zip(bad_at, BAD_LINES):
        lines.insert(at, bad)
    write_jsonl(tmp_path / "in.jsonl", lines)
    # a binary that does not exist: any engine start would fail the run
    assert score_cli("--input", tmp_path / "in.jsonl", "--output", tmp_path / "out.jsonl",
                     "--stockfish", tmp_path / "no-stockfish", "--batch-size", 7) == 0

    out = read_jsonl(tmp_path / "out.jsonl")
    assert len(out) == len(lines)
    assert not (tmp_path / "out.jsonl.partial").exists()
    for at, (_, message) in zip(bad_at, BAD_LINES):
        assert message in out[at]["error"] and "reward" not in out[at], (at, out[at])
    scored = [record for i, record in enumerate(out) if i not in bad_at]
    for record, given in zip(scored, good, strict=True):
        assert (record["prompt"], record["completion"]) == (given["prompt"], given["completion"])
        assert record["task"] == text.task_of(given["prompt"])
        if record["task"] == "A":
            truth = arbiter.transition_for_prompt(given["prompt"])
            assert record["target"] == arbiter.a_target(truth)
            expected = rewards.score_a(given["prompt"], given["completion"], truth)
        else:
            assert "target" not in record and record["analysis"] == given["analysis"]
            expected = rewards.score_p(given["prompt"], given["completion"], Analysis.from_json(given["analysis"]))
        assert (record["reward"], record["components"]) == (expected.reward, expected.components)
    # 13 of RookWorld-LM's 20 greedy A generations are exactly right
    assert sum(record.get("components", {}).get("exact", 0) for record in out) == 13
    # the reward flags of `rookworld train` apply here too
    assert score_cli("--input", tmp_path / "in.jsonl", "--output", tmp_path / "linear.jsonl", "--stockfish",
                     tmp_path / "no-stockfish", "--best-move-shape", "linear") == 0
    linear = rewards.RewardConfig(best_move_shape="linear")
    shaped = [record for record in read_jsonl(tmp_path / "linear.jsonl") if record.get("task") == "P"]
    for record in shaped:
        expected = rewards.score_p(record["prompt"], record["completion"], Analysis.from_json(record["analysis"]),
                                   config=linear)
        assert record["reward"] == expected.reward
    dense = [record["reward"] for record in out if record.get("task") == "P"]
    assert any(record["reward"] != value for record, value in zip(shaped, dense))  # the flag changed something


@pytest.mark.stockfish
@pytest.mark.stockfish
def test_real_completions_with_the_engine(tmp_path):
    records = [{"prompt": row["prompt"], "completion": completion} for row in K4 for completion in row["completions"]]
    stored = stored_p_lines()[0]
    board = chess.Board(stored["analysis"]["fen"])
    move = next(m.uci() for m in board.legal_moves if m.uci() not in stored["analysis"]["moves"])
    records.append({**stored, "completion": f"M: {move} E: -3.0 B: {move}"})  # legal, outside the stored top 5
    write_jsonl(tmp_path / "in.jsonl", [json.dumps(r) for r in records])
    cache = tmp_path / "cache.sqlite"
    args = ("--input", tmp_path / "in.jsonl", "--output", tmp_path / "out.jsonl", "--processes", 2,
            "--cache", cache, "--batch-size", 5)
    assert score_cli(*args) == 0
    out = read_jsonl(tmp_path / "out.jsonl")
    assert [(r["prompt"], r["completion"]) for r in out] == [(r["prompt"], r["completion"]) for r in records]
    assert all("error" not in r and -1.0 <= r["reward"] <= 1.0 for r in out)
    # RookWorld-LM's completions start at "M:" (padding stripped) and parse without errors
    assert all(r["components"]["format"] == 1.0 for r in out[:-1])
    for record in out:
        if record["task"] == "A":
            assert record["reward"] == 1.0 and record["target"] == record["completion"]
    assert cache.exists()
    with StockfishPool(processes=1, cache_path=cache) as pool:  # the outside move was scored by the engine
        extra = dict(zip([move], pool.evaluate_moves([(stored["analysis"]["fen"], move)])))
    analysis = Analysis.from_json(stored["analysis"])
    expected = rewards.score_p(stored["prompt"], records[-1]["completion"], analysis, extra)
    assert (out[-1]["reward"], out[-1]["components"]) == (expected.reward, expected.components)
    assert score_cli(*args) == 0  # again, from the cache: the same numbers
    assert read_jsonl(tmp_path / "out.jsonl") == out


def test_missing_input_is_a_user_error(tmp_path, capsys):
    assert score_cli("--input", tmp_path / "missing.jsonl", "--output", tmp_path / "out.jsonl") == 2
    assert "input file not found" in capsys.readouterr().err
    write_jsonl(tmp_path / "in.jsonl", [])
    assert score_cli("--input", tmp_path / "in.jsonl", "--output", tmp_path) == 2  # refused before any scoring
    assert f"--output {tmp_path} is a directory" in capsys.readouterr().err
    assert score_cli("--input", tmp_path / "in.jsonl", "--output", tmp_path / "new" / "out.jsonl") == 0
    assert (tmp_path / "new" / "out.jsonl").read_text() == ""  # its directory made
    assert score_cli("--input", tmp_path / "in.jsonl") == 2
    assert "needs --input" in capsys.readouterr().err


def test_bad_flags_are_user_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="batch_size"):
        ScoreConfig(input="a", output="b", batch_size=0)
    assert score_cli("--input", tmp_path / "a", "--output", tmp_path / "b", "--batch-size", 0) == 2
    assert "batch_size must be >= 1" in capsys.readouterr().err


def test_p_weight_and_illegal_move_flags_reach_the_reward(tmp_path):
    records = stored_p_lines()[:10]
    records[0] = {**records[0], "completion": records[0]["completion"].rsplit("B:", 1)[0] + "B: a1a1"}  # illegal
    write_jsonl(tmp_path / "in.jsonl", [json.dumps(record) for record in records])
    weights = {"best_move": 0.1, "candidates": 0.5, "evals": 0.3, "format": 0.1}
    flags = ["--p-best-move-weight", "0.1", "--p-candidates-weight", "0.5", "--p-evals-weight", "0.3",
             "--p-format-weight", "0.1"]
    scored = {}
    for run, extra in (("default", []), ("weights", flags), ("illegal", ["--best-move-illegal", "-1"])):
        assert score_cli("--input", tmp_path / "in.jsonl", "--output", tmp_path / f"{run}.jsonl", "--stockfish",
                         tmp_path / "no-stockfish", *extra) == 0
        scored[run] = read_jsonl(tmp_path / f"{run}.jsonl")
    for record in scored["weights"]:  # the reward is the flags' weighted sum of the components
        assert record["reward"] == pytest.approx(sum(w * record["components"][n] for n, w in weights.items()))
    assert [r["components"] for r in scored["weights"]] == [r["components"] for r in scored["default"]]
    assert any(a["reward"] != b["reward"] for a, b in zip(scored["weights"], scored["default"]))
    assert scored["default"][0]["components"]["best_move"] == -0.25  # the dense shapes' default
    assert scored["illegal"][0]["components"]["best_move"] == -1.0
    assert [r["reward"] for r in scored["illegal"][1:]] == [r["reward"] for r in scored["default"][1:]]


def test_an_output_in_a_directory_that_cannot_be_written_is_refused_before_scoring(tmp_path, capsys):
    write_jsonl(tmp_path / "in.jsonl", [])
    assert score_cli("--input", tmp_path / "in.jsonl", "--output", "/proc/out.jsonl") == 2  # /proc takes no files
    assert "--output /proc/out.jsonl: cannot write in /proc" in capsys.readouterr().err
