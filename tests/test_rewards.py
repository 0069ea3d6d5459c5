"""Rewards: exact targets score 1.0, corruption lowers the reward step by step, garbage never raises.

P truth comes from the real rook_val lines (Stockfish 30 s labels; M/E are shuffled there, so the
rank order is the evals sorted high to low); A truth from the arbiter.
"""

import json
import math
import random
import statistics
import time

import chess
import pytest
from conftest import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rookworld import arbiter, quality, rewards, text
from rookworld.analysis import Analysis, expected_score
from rookworld.config import build_config, load_toml
from rookworld.errors import UserError
from rookworld.rewards import BEST_MOVE_SHAPES, WEIGHTS, RewardConfig

VAL_LINES = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()
A_PROMPTS = [row["prompt"] for row in json.loads((FIXTURES / "a_task_openings_sample.json").read_text())]
A_PROMPTS += [row["prompt"] for row in json.loads((FIXTURES / "rookworld_lm_a_generations.json").read_text())]
# white to move, distinct evals: b6d5 4.75, f1c1 4.66, f1d1 4.94, e3g5 4.55, f1e1 4.76
LINE = next(line for line in VAL_LINES if line.startswith("P: 5rkb/4np1p/1Nr1b1p1/2P1p3/Q3P3/3qB1P1/5PBP/1R3RK1 w"))


def truth_of(line: str) -> tuple[str, Analysis]:
    parsed = text.parse_p_line(line)
    ranked = sorted(zip(parsed.moves, parsed.evals), key=lambda pair: -pair[1])
    return (text.p_prompt(parsed.fen),
            Analysis(parsed.fen, tuple(m for m, _ in ranked), tuple(e for _, e in ranked), "rook_val"))


def exact_p(analysis: Analysis, fen_width: int = 90) -> str:
    return text.p_target(analysis.fen, analysis.moves, analysis.evals, analysis.best, fen_width)


def outside_moves(analysis: Analysis) -> list[str]:
    return sorted(m.uci() for m in chess.Board(analysis.fen).legal_moves if m.uci() not in analysis.moves)


def illegal_move(analysis: Analysis) -> str:
    board = chess.Board(analysis.fen)
    return next(f"{a}{b}" for a in chess.SQUARE_NAMES for b in chess.SQUARE_NAMES
                if a != b and not board.is_legal(chess.Move.from_uci(a + b)))


def completion(moves, evals, best) -> str:
    return f"M: {' '.join(moves)} E: {' '.join(text.format_eval(e) for e in evals)} B: {best}"


PROMPT, ANALYSIS = truth_of(LINE)
# every shape, at a scale where 'linear' never reaches its floor (expected-score losses stay below 1)
SHAPES = [RewardConfig(best_move_shape=shape, best_move_scale=1.0) for shape in BEST_MOVE_SHAPES]


def test_weights_sum_to_one_and_name_the_components():
    for task, weights in WEIGHTS.items():
        assert math.isclose(sum(weights.values()), 1.0), task
    assert set(rewards.score_p(PROMPT, "", ANALYSIS).components) == set(WEIGHTS["P"])
    assert set(rewards.score_a(A_PROMPTS[0], "").components) == set(WEIGHTS["A"])


@pytest.mark.parametrize("config", [None, *SHAPES, RewardConfig(0.7, 0.01, 0.29, 0.0)])  # float sum != 1
@pytest.mark.parametrize("fen_width", [90, 89, 0])
def test_exact_p_target_scores_one_for_every_validation_position(fen_width, config):
    for line in VAL_LINES:
        prompt, analysis = truth_of(line)
        assert rewards.score_p(prompt, exact_p(analysis, fen_width), analysis, config=config).reward == 1.0, line


def test_the_files_own_label_scores_one_unless_its_best_move_is_not_top_ranked():
    quirk = 0
    for line in VAL_LINES:
        prompt, analysis = truth_of(line)
        label = text.parse_p_line(line).best
        reward = rewards.score_p(prompt, text.split_line(line)[2], analysis).reward
        top = quality.judge(analysis.evals[0], analysis.eval_of(label)).score_loss == 0  # e.g. two mates
        assert (reward == 1.0) == top, line
        quirk += not top
    assert quirk > 50  # RookWorld's label quirk: black's B: is the 5th-ranked move


def test_exact_a_target_scores_one_for_every_fixture_prompt():
    assert len(A_PROMPTS) == 890
    for prompt in A_PROMPTS:
        truth = arbiter.transition_for_prompt(prompt)
        assert rewards.score_a(prompt, arbiter.a_target(truth), truth).reward == 1.0
        assert rewards.score_a(prompt, arbiter.a_target(truth)).reward == 1.0


def test_reward_is_the_weighted_sum_of_its_components():
    for score, task in [(rewards.score_p(PROMPT, "M: f1d1 a1a8 E: -3 B: f1e1", ANALYSIS), "P"),
                        (rewards.score_a(A_PROMPTS[0], "8/8/8/8/8/8/8/8 w - - 0 1+0.5+1+0"), "A")]:
        assert math.isclose(score.reward, sum(WEIGHTS[task][k] * v for k, v in score.components.items()))


# Hand-computed P cases on LINE (ranked: f1d1 4.94, f1e1 4.76, b6d5 4.75, f1c1 4.66, e3g5 4.55):
# reward = 0.5 best_move + 0.2 candidates + 0.2 evals + 0.1 format.
TOP = ["f1d1", "f1e1", "b6d5", "f1c1", "e3g5"]
EVALS = [4.94, 4.76, 4.75, 4.66, 4.55]


def dense(best: float, move: float) -> float:
    """The default best_move credit: exp(-expected-score loss / 0.2)."""
    return math.exp(-(expected_score(best) - expected_score(move)) / 0.2)


# The default best_move credit: exp, scale 0.2, illegal -0.25; candidates, evals and format are 0.2 + 0.2 + 0.1
# where they are whole.
@pytest.mark.parametrize(("name", "completion_text", "extra", "expected"), [
    # every eval half a pawn high: evals = 1 / (1 + 0.5) -> 0.5 + 0.2 + 0.2 / 1.5 + 0.1
    ("evals +0.5", completion(TOP, [e + 0.5 for e in EVALS], "f1d1"), None, 0.8 + 0.2 / 1.5),
    # one illegal candidate (a1 is empty): candidates = (4 hits - 1 illegal) / 5 -> 0.5 + 0.12 + 0.2 + 0.1
    ("illegal candidate", completion(TOP[:4] + ["a1a8"], EVALS, "f1d1"), None, 0.92),
    # wrong sign on f1d1: error 9.88 + 1 sign pawn, MAE 10.88 / 5 -> 0.5 + 0.2 + 0.2 / 3.176 + 0.1
    ("sign error", completion(TOP, [-4.94] + EVALS[1:], "f1d1"), None, 0.8 + 0.2 / 3.176),
    ("rank 2", completion(TOP, EVALS, "f1e1"), None, 0.5 * dense(4.94, 4.76) + 0.5),  # 0.5 * 0.960 + 0.5
    ("outside, eval known", completion(TOP, EVALS, "a4a7"), {"a4a7": 4.44}, 0.5 * dense(4.94, 4.44) + 0.5),
    # an engine eval above the last stored move's (another depth) counts as that move's eval
    ("outside, eval above", completion(TOP, EVALS, "a4a7"), {"a4a7": 6.0}, 0.5 * dense(4.94, 4.55) + 0.5),
    # no eval available: half the last stored move's credit
    ("outside, eval unknown", completion(TOP, EVALS, "a4a7"), None, 0.5 * 0.5 * dense(4.94, 4.55) + 0.5),
    ("no best move", completion(TOP, EVALS, "").removesuffix(" B: "), None, -0.125 + 0.4 + 0.05),
    ("garbage", "hello world", None, -0.125 - 0.1),
    ("empty", "", None, -0.125 - 0.05),
])
def test_hand_computed_p_rewards(name, completion_text, extra, expected):
    assert chess.Board(ANALYSIS.fen).is_legal(chess.Move.from_uci("a4a7"))
    assert RewardConfig(0.5, 0.2, 0.2, 0.1, "exp", 0.2, -0.25) == rewards.DEFAULT_CONFIG
    reward = rewards.score_p(PROMPT, completion_text, ANALYSIS, extra).reward
    assert reward == pytest.approx(expected, abs=1e-9), name


def test_mate_scores_compare_capped_at_10_pawns():
    # line 20 of rook_val: black mates; ranked d1e2 999.85, d1c2 999.83, a5e1 999.83, h6g5 999.81, d1d2 999.8
    prompt, analysis = truth_of(next(line for line in VAL_LINES if line.startswith("P: 8/3R4/p6k/b2N4/8/7P/6K1/3q4")))
    moves = list(analysis.moves)
    # any eval of 10 pawns or more is a perfect eval of a mate
    assert rewards.score_p(prompt, completion(moves, [12.0, 10.0, 50.0, 999.0, 10.5], moves[0]), analysis).reward == 1.0
    # 8 pawns instead of a mate: error 2 on each move -> evals = 1 / 3, reward 0.8 + 0.2 / 3
    assert rewards.score_p(prompt, completion(moves, [8.0] * 5, moves[0]), analysis).reward == pytest.approx(
        0.8 + 0.2 / 3)
    # the wrong side mating: error 20 + 1 sign pawn on each -> 0.8 + 0.2 / 22
    assert rewards.score_p(prompt, completion(moves, [-999.8] * 5, moves[0]), analysis).reward == pytest.approx(
        0.8 + 0.2 / 22)


def strictly_decreasing(values: list[float]) -> bool:
    return all(a > b for a, b in zip(values, values[1:]))


def distinct_positions(count: int) -> list[tuple[str, Analysis]]:
    """Validation positions with 5 distinct evals within +-4 pawns (drifts stay below the +-10 clip) and
    at least 3 legal moves outside the top 5."""
    found = []
    for line in VAL_LINES:
        prompt, analysis = truth_of(line)
        if (len(set(analysis.evals)) == 5 and max(map(abs, analysis.evals)) < 4
                and len(outside_moves(analysis)) >= 3):
            found.append((prompt, analysis))
    assert len(found) >= count
    return found[:count]


@pytest.mark.parametrize("config", [None, *SHAPES])
@pytest.mark.parametrize(("prompt", "analysis"), distinct_positions(20))
def test_p_reward_falls_with_each_worse_best_move(prompt, analysis, config):
    moves, evals = list(analysis.moves), list(analysis.evals)
    outside = outside_moves(analysis)[0]
    chain = [completion(moves, evals, best) for best in moves]          # ranks 1..5
    chain.append(completion(moves, evals, outside))                        # legal, outside the top 5
    chain.append(completion(moves, evals, illegal_move(analysis)))         # illegal
    chain.append(completion(moves, evals, "").removesuffix(" B: "))      # missing
    extra = {outside: analysis.evals[-1] - 0.3}
    assert strictly_decreasing([rewards.score_p(prompt, c, analysis, extra, config).reward for c in chain])


# A constructed truth for the start position: the stored top 5, and engine evals of moves outside it.
START = chess.STARTING_FEN
START_PROMPT = text.p_prompt(START)
START_ANALYSIS = Analysis(START, ("e2e4", "d2d4", "g1f3", "c2c4", "e2e3"), (0.35, 0.3, 0.25, 0.1, 0.0), "test")
START_EXTRA = {"b1c3": -0.1, "g2g4": -1.2, "f2f3": -0.6, "h2h4": 0.5}  # h2h4: another depth's eval above the best


def best_move_credit(move: str, config: RewardConfig | None = None, extra=START_EXTRA) -> float:
    return rewards.score_p(START_PROMPT, f"M: E: B: {move}", START_ANALYSIS, extra, config).components["best_move"]


@pytest.mark.parametrize("config", [None, *SHAPES[:2], RewardConfig(best_move_scale=0.1),
                                    RewardConfig(best_move_shape="exp", best_move_scale=2.0)])
def test_dense_best_move_credit_follows_the_moves_quality(config):
    """best > second best > outside with a small loss > outside with a large loss > illegal > nothing."""
    credits = [best_move_credit(move, config) for move in ("e2e4", "d2d4", "b1c3", "f2f3", "g2g4", "e2e5", "")]
    assert credits[0] == 1.0
    assert strictly_decreasing(credits[:-1]) and credits[-1] == credits[-2] < 0 <= min(credits[:-2])
    assert credits[-1] == (config or RewardConfig()).best_move_illegal
    # the stored search ranks every move it does not list at or below its last one
    assert best_move_credit("h2h4", config) == best_move_credit("e2e3", config) < credits[1]


@pytest.mark.parametrize("config", [None, *SHAPES[:2]])
def test_dense_credit_of_an_unknown_eval_is_half_the_last_stored_moves(config):
    """Without an engine a legal move outside the analysis is known to be no better than its last move."""
    unknown = best_move_credit("b1c3", config, extra={})
    assert unknown == pytest.approx(0.5 * best_move_credit("e2e3", config))
    assert (config or RewardConfig()).best_move_illegal < unknown < best_move_credit("e2e3", config)
    lone = Analysis(START, (), (), "test")  # nothing to compare with: half credit for a legal move
    assert rewards.score_p(START_PROMPT, "B: e2e4", lone).components["best_move"] == 0.5


def test_dense_credit_is_the_expected_score_loss_under_the_shape():
    loss = expected_score(0.35) - expected_score(-0.6)  # f2f3 against e2e4
    assert best_move_credit("f2f3", RewardConfig(best_move_shape="linear", best_move_scale=0.5)) == \
        pytest.approx(1 - loss / 0.5)
    assert best_move_credit("f2f3", RewardConfig(best_move_shape="exp", best_move_scale=0.5)) == \
        pytest.approx(math.exp(-loss / 0.5))
    assert best_move_credit("g2g4", RewardConfig(best_move_shape="linear", best_move_scale=0.05)) == 0.0
    assert best_move_credit("", RewardConfig(best_move_illegal=-0.6)) == -0.6


@pytest.mark.parametrize(("values", "message"), [
    ({"p_best_move_weight": 0.6}, "sum to 1"),
    ({"p_best_move_weight": 0.8, "p_format_weight": -0.2}, ">= 0"),
    ({"best_move_shape": "cubic"}, "best_move_shape must be one of"),
    ({"best_move_scale": 0.0}, "best_move_scale must be > 0"),
    ({"best_move_illegal": 0.0}, r"best_move_illegal must be in \[-1, 0\)"),
    ({"best_move_illegal": -1.5}, r"best_move_illegal must be in \[-1, 0\)"),
])
def test_reward_config_rejects_bad_values(values, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**values)
    with pytest.raises(UserError, match=message):
        build_config(RewardConfig, file_values=values)


def test_reward_config_from_toml(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[reward]\np_best_move_weight = 0.6\np_format_weight = 0.0\nbest_move_shape = 'exp'\n"
                    "best_move_scale = 0.3\nbest_move_illegal = -0.5\n")
    config = build_config(RewardConfig, file_values=load_toml(path)["reward"])
    assert config == RewardConfig(0.6, 0.2, 0.2, 0.0, "exp", 0.3, -0.5)
    assert build_config(RewardConfig, file_values={}) == RewardConfig() == rewards.DEFAULT_CONFIG
    with pytest.raises(UserError, match="unknown config field 'best_move_weight'"):
        build_config(RewardConfig, file_values={"best_move_weight": 0.5})


def test_reward_config_weights_and_range():
    """Weights move the reward; with all weight on best_move the range is the component's, [-1, 1]."""
    only_move = RewardConfig(1.0, 0.0, 0.0, 0.0, best_move_illegal=-1.0)
    assert rewards.score_p(PROMPT, "garbage", ANALYSIS, config=only_move).reward == -1.0
    assert rewards.score_p(PROMPT, exact_p(ANALYSIS), ANALYSIS, config=only_move).reward == 1.0
    half = rewards.score_p(PROMPT, completion(TOP, EVALS, "a1a8"), ANALYSIS, config=RewardConfig(0.5, 0.5, 0.0, 0.0))
    assert half.reward == pytest.approx(0.5 * -0.25 + 0.5 * 1.0)


MALFORMED = ["", "hello world", "B:", "B: ", "B: e2e4e2e4", "B: a1a1", "B: 0000", "B: e7e8q", "M: E: B:",
             "M: e2e4 " * 50 + "E: nan inf -inf 1e999 B: e2e4", "B: \u0661\u0662", "\x00" * 1000, "B: e1h1 " * 10_000]


@pytest.mark.parametrize("config", SHAPES)
def test_malformed_completions_score_low_and_never_raise(config):
    for prompt, analysis, extra in [(PROMPT, ANALYSIS, {"a4a7": 4.0}), (PROMPT, ANALYSIS, None),
                                    (START_PROMPT, START_ANALYSIS, START_EXTRA)]:
        for completion_text in MALFORMED:
            score = rewards.score_p(prompt, completion_text, analysis, extra, config)
            assert -1.0 <= score.reward < 1.0 and all(math.isfinite(v) for v in score.components.values())


@pytest.mark.parametrize(("prompt", "analysis"), distinct_positions(20))
def test_p_reward_falls_as_evals_drift(prompt, analysis):
    moves, evals = list(analysis.moves), list(analysis.evals)
    drifts = [0.0, 0.05, 0.3, 1.0, 2.5, 6.0]
    scores = [rewards.score_p(prompt, completion(moves, [e + d for e in evals], moves[0]), analysis).reward
              for d in drifts]
    assert strictly_decreasing(scores)
    signs = [rewards.score_p(prompt, completion(moves, [-e if i < k else e for i, e in enumerate(evals)],
                                                moves[0]), analysis).reward for k in range(6)]
    assert strictly_decreasing([s for s, e in zip(signs, [1.0] + evals) if e != 0])


@pytest.mark.parametrize(("prompt", "analysis"), distinct_positions(20))
def test_p_reward_falls_as_candidates_leave_the_top5(prompt, analysis):
    moves, evals = list(analysis.moves), list(analysis.evals)
    outside = outside_moves(analysis)
    chain = [moves, moves[:4] + outside[:1], moves[:3] + outside[:2], moves[:2] + outside[:3],
             moves[:2] + outside[:2] + [illegal_move(analysis)], moves[:1] + outside[:2] + ["a1a1", "h8h8"]]
    # evals of the outside moves stay unknown (no extra_evals), so only the candidates part moves
    scores = [rewards.score_p(prompt, completion(c, evals, moves[0]), analysis).reward for c in chain]
    assert strictly_decreasing(scores)


def corrupt_fen(fen: str, step: int) -> str:
    """The first `step` corruptions of a FEN, each in a different field or square."""
    placement, side, castling, ep, half, full = fen.split(" ")
    changes = [
        lambda: (placement, side, castling, ep, half, str(int(full) + 1)),
        lambda: (placement, side, castling, ep, str(int(half) + 3), str(int(full) + 1)),
        lambda: (placement, side, castling, "e3" if ep == "-" else "-", str(int(half) + 3), str(int(full) + 1)),
        lambda: (placement, side, "Kq" if castling != "Kq" else "-", "e3" if ep == "-" else "-",
                 str(int(half) + 3), str(int(full) + 1)),
    ]
    fields = changes[min(step, 4) - 1]() if step else (placement, side, castling, ep, half, full)
    placement, side, castling, ep, half, full = fields
    if step >= 5:
        side = "w" if side == "b" else "b"
    board = chess.Board(f"{placement} w - - 0 1")
    empty = [sq for sq in chess.SQUARES if board.piece_at(sq) is None]
    for square in empty[:max(0, step - 5)]:  # steps 6, 7, ...: one more wrong square each
        board.set_piece_at(square, chess.Piece(chess.QUEEN, chess.WHITE))
    return " ".join([board.board_fen(), side, castling, ep, half, full])


@pytest.mark.parametrize("prompt", A_PROMPTS[::60])
def test_a_reward_falls_with_each_wrong_field(prompt):
    truth = arbiter.transition_for_prompt(prompt)
    flags = f"{int(truth.terminated)}+{int(truth.truncated)}"
    chain = [arbiter.a_target(truth)]
    chain += [f"{corrupt_fen(truth.fen, step)}+{truth.reward}+{flags}" for step in range(1, 9)]
    wrong_reward = "0.5" if truth.reward != "0.5" else "1.0"
    chain.append(f"{corrupt_fen(truth.fen, 8)}+{wrong_reward}+{flags}")
    chain.append(f"{corrupt_fen(truth.fen, 8)}+{wrong_reward}+{1 - truth.terminated}+{int(truth.truncated)}")
    chain.append(f"{corrupt_fen(truth.fen, 8)}+{wrong_reward}+{1 - truth.terminated}+{1 - truth.truncated}")
    chain.append(f"{corrupt_fen(truth.fen, 8)}+{wrong_reward}+{1 - truth.terminated}")    # truncated
    chain.append("<|endoftext|>")                                                       # nothing right
    chain.append("+" * 5)                                                               # nothing parseable
    assert strictly_decreasing([rewards.score_a(prompt, c, truth).reward for c in chain])


def test_hand_computed_a_rewards():
    prompt = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
    target = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    assert rewards.score_a(prompt, target).reward == 1.0
    # copying the input board: squares e2/e4 wrong (changed half 0), 62 kept right (half 1) -> placement 0.5;
    # side wrong; exact 0 -> 1 - 0.2 - 0.3 * 0.5 - 0.05
    copied = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+0.001+0+0"
    assert rewards.score_a(prompt, copied).reward == pytest.approx(0.6)
    # everything right but the fullmove number: 1 - 0.2 (exact) - 0.05
    assert rewards.score_a(prompt, target.replace("- 0 1+", "- 0 2+")).reward == pytest.approx(0.75)
    # a rank of 9 squares (RookWorld-LM's typical slip) loses that whole rank: 8 of 62 kept squares
    nine = "rnbqkbnr/ppppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    assert rewards.score_a(prompt, nine).reward == pytest.approx(0.8 - 0.3 * 0.5 * 8 / 62)
    # the illegal-move answer to a legal move (input copied, -1.0+0+1): also reward and truncated wrong
    assert rewards.score_a(prompt, copied.replace("+0.001+0+0", "+-1.0+0+1")).reward == pytest.approx(0.475)


REAL_P_COMPLETIONS = [text.split_line(line)[2] for line in VAL_LINES[:40]]
REAL_A_COMPLETIONS = [arbiter.a_target(arbiter.transition_for_prompt(p)) for p in A_PROMPTS[:40]]


def splice(base: str, insert: str, cut: int, where: int) -> str:
    """`base` cut short at `cut`, with `insert` put in at `where`: a realistic broken completion."""
    cut %= len(base) + 1
    where %= cut + 1
    return base[:where] + insert + base[where:cut]


def repeat_to(piece: str, size: int) -> str:
    return (piece * (size // max(1, len(piece)) + 1))[:size] if piece else ""


ODD_TEXT = st.text(alphabet=st.characters() | st.sampled_from(list("MEB: +-./0123456789e2e4\u2003\u200b\ufeff١")),
                   max_size=200)
A_TRUTH = arbiter.transition_for_prompt(A_PROMPTS[0])
FUZZ_EXAMPLES = 2_500  # x 4 strings each = 10,000 strings


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(piece=ODD_TEXT, base=st.sampled_from(REAL_P_COMPLETIONS + REAL_A_COMPLETIONS),
       cut=st.integers(0, 300), where=st.integers(0, 300), size=st.integers(1_000, 100_000))
@pytest.mark.integration
def test_any_string_gets_a_finite_reward_in_range(piece, base, cut, where, size):
    """Each example scores 4 strings: odd unicode text, that text spliced into a real completion, and
    both repeated to `size` characters (up to 100 kB); hypothesis makes the small parts, which is cheap."""
    spliced = splice(base, piece, cut, where)
    for completion_text in (piece, spliced, repeat_to(spliced, size), repeat_to(piece, size)):
        for score in (rewards.score_p(PROMPT, completion_text, ANALYSIS, {"a4a7": 4.0}),
                      rewards.score_a(A_PROMPTS[0], completion_text, A_TRUTH)):
            assert math.isfinite(score.reward) and -1.0 <= score.reward <= 1.0
            assert all(math.isfinite(v) and -1.0 <= v <= 1.0 for v in score.components.values())


def test_score_batch_without_engine_equals_single_scores():
    items = []
    for i, line in enumerate(VAL_LINES[:30]):
        prompt, analysis = truth_of(line)
        items.append((prompt, REAL_P_COMPLETIONS[(i * 7) % 40], analysis))
    items += [(p, c, None) for p, c in zip(A_PROMPTS[:30], reversed(REAL_A_COMPLETIONS))]
    expected = [rewards.score_p(p, c, a) if a else rewards.score_a(p, c) for p, c, a in items]
    assert rewards.score_batch(items, None) == expected
    assert [rewards.score(text.task_of(p), p, c, a) for p, c, a in items] == expected


def test_score_batch_needs_analysis_or_engine():
    with pytest.raises(ValueError, match="no analysis"):
        rewards.score_batch([(PROMPT, "", None)], None)
    with pytest.raises(ValueError, match="analysis of"):
        rewards.score_p(truth_of(VAL_LINES[0])[0], "", ANALYSIS)


def test_uncovered_moves():
    outside = outside_moves(ANALYSIS)
    got = rewards.uncovered_moves(PROMPT, completion(TOP[:2] + outside[:2] + ["a1a8"], EVALS, outside[3]), ANALYSIS)
    assert got == outside[:2] + [outside[3]]
    assert rewards.needs_engine([(PROMPT, completion(TOP, EVALS, outside[0]), ANALYSIS)])
    assert not rewards.needs_engine([(PROMPT, completion(TOP, EVALS, TOP[0]), ANALYSIS), (A_PROMPTS[0], "", None)])


def test_median_reward_time_is_well_under_5ms():
    """A generous guard (measured ~0.3 ms); benchmarks/reward_speed.py reports the real numbers."""
    rng = random.Random(0)
    cases = [("P", PROMPT, exact_p(ANALYSIS)[:200], ANALYSIS)] + [
        ("A", p, arbiter.a_target(arbiter.transition_for_prompt(p)), None) for p in rng.sample(A_PROMPTS, 5)]
    for task in ("P", "A"):
        times = []
        for _ in range(200):
            _, prompt, completion_text, analysis = rng.choice([c for c in cases if c[0] == task])
            start = time.perf_counter()
            rewards.score(task, prompt, completion_text, analysis)
            times.append(time.perf_counter() - start)
        assert statistics.median(times) < 0.005, task


@pytest.mark.stockfish
@pytest.mark.stockfish
def test_score_batch_with_the_engine_scores_uncovered_moves(tmp_path):
    from rookworld.stockfish import StockfishPool

    outside = outside_moves(ANALYSIS)[:2]
    items = [(PROMPT, completion(TOP[:4] + outside[:1], EVALS, outside[1]), ANALYSIS),
             (PROMPT, completion(TOP, EVALS, TOP[0]), None),  # analysed by the engine
             (A_PROMPTS[0], REAL_A_COMPLETIONS[0], None)]
    with StockfishPool(processes=2, cache_path=tmp_path / "cache.sqlite") as pool:
        scores = rewards.score_batch(items, pool)
        evals = pool.evaluate_moves([(ANALYSIS.fen, move) for move in outside])  # cached by now
        fresh = pool.analyse([ANALYSIS.fen])[0]
        uncovered = rewards.uncovered_moves(PROMPT, items[1][1], fresh)
        fresh_extra = dict(zip(uncovered, pool.evaluate_moves([(ANALYSIS.fen, m) for m in uncovered])))
    assert all(isinstance(e, float) for e in evals)
    assert scores[0] == rewards.score_p(PROMPT, items[0][1], ANALYSIS, dict(zip(outside, evals)))
    loss = expected_score(4.94) - expected_score(min(evals[1], 4.55))  # capped at the last stored move's eval
    assert scores[0].components["best_move"] == pytest.approx(math.exp(-loss / 0.2))
    assert scores[1] == rewards.score_p(PROMPT, items[1][1], fresh, fresh_extra)
    assert scores[2] == rewards.score_a(A_PROMPTS[0], REAL_A_COMPLETIONS[0])


# ---------------------------------------------------------------- the reward warm-up

def test_warmup_weights_move_linearly_from_format_first_to_the_configured_weights():
    config = rewards.RewardConfig(reward_warmup_steps=4)
    start, middle, end = (rewards.weights_at(config, step) for step in (0, 2, 4))
    assert start == rewards.WARMUP_WEIGHTS
    assert end == {"P": config.p_weights, "A": rewards.WEIGHTS["A"]}
    assert rewards.weights_at(config, 100) == end
    for task in ("P", "A"):
        assert math.fsum(rewards.WARMUP_WEIGHTS[task].values()) == pytest.approx(1.0)
        assert set(rewards.WARMUP_WEIGHTS[task]) == set(end[task])
        for name, weight in middle[task].items():
            assert weight == pytest.approx((start[task][name] + end[task][name]) / 2)
    # format first: the warm-up weighs P's format above its best move, A's format above the board
    assert start["P"]["format"] > start["P"]["best_move"] and start["A"]["format"] > start["A"]["placement"]
    assert rewards.weights_at(rewards.RewardConfig(), 0) == end  # 0 steps: off


def test_reweigh_scores_the_same_components_under_other_weights():
    # A well-formed P completion that names an illegal best move: full format credit, the illegal move's
    # best_move credit; the warm-up weighting rewards it more than the configured one.
    score = rewards.score_p(START_PROMPT, completion(START_ANALYSIS.moves, START_ANALYSIS.evals, "e2e5"),
                            START_ANALYSIS)
    assert score.components["format"] == 1.0 and score.components["best_move"] == RewardConfig().best_move_illegal
    assert rewards.reweigh(score.components, rewards.DEFAULT_CONFIG.p_weights) == score.reward
    warm = rewards.reweigh(score.components, rewards.WARMUP_WEIGHTS["P"])
    expected = math.fsum(rewards.WARMUP_WEIGHTS["P"][name] * value for name, value in score.components.items())
    assert warm == pytest.approx(expected) and warm > score.reward


def test_reward_warmup_steps_must_not_be_negative():
    with pytest.raises(ValueError, match="reward_warmup_steps must be >= 0"):
        rewards.RewardConfig(reward_warmup_steps=-1)


def test_castling_written_king_takes_rook_earns_what_the_castling_move_earns():
    fen = "r3k2r/pppq1ppp/2npbn2/2b1p3/2B1P3/2NPBN2/PPPQ1PPP/R3K2R w KQkq - 4 8"
    analysis = Analysis(fen, ("e1g1", "e1c1", "h2h3", "a2a3", "c3d5"), (0.5, 0.4, 0.3, 0.2, 0.1), "depth=10")
    standard, written = (rewards.score_p(text.p_prompt(fen), text.p_target(fen, moves, analysis.evals, best), analysis)
                         for moves, best in ((analysis.moves, "e1g1"), (("e1h1", *analysis.moves[1:]), "e1h1")))
    assert written.components == standard.components and written.reward == standard.reward == pytest.approx(1.0)
