"""A-task cases, synthetic rare positions, the A mix and position facts (no engine needed)."""

import chess
import numpy as np
import pytest

from rookworld import arbiter, text
from rookworld.data.a_mix import RARE_SHARES, SYNTHETIC_CASES, AMixer, rare_quotas
from rookworld.data.cases import case_moves, classify_a, illegal_move, mating_moves
from rookworld.data.games import Game, plies
from rookworld.data.position import game_phase, move_number, position_key
from rookworld.data.record import a_sample
from rookworld.data.synthetic import synthetic_case

# (fen, move, case): one real example of every case
EXAMPLES = [
    (chess.STARTING_FEN, "e2e5", "illegal"),
    ("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2", "d8h4", "checkmate"),
    ("7k/8/6K1/8/8/8/8/5Q2 w - - 0 50", "f1f7", "stalemate"),
    ("8/8/8/4k3/8/8/2n5/2K5 w - - 0 60", "c1c2", "insufficient_material"),
    ("8/8/8/4k3/8/8/8/R3K3 w - - 149 100", "e1d1", "draw"),
    ("8/P7/8/8/8/8/8/k6K w - - 0 50", "a7a8q", "promotion"),
    ("4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 30", "e5d6", "en_passant"),
    ("4k3/8/8/8/8/8/8/4K2R w K - 0 10", "e1g1", "castling"),
    (chess.STARTING_FEN, "g1f3", "first_move"),
    ("4k3/8/8/8/8/8/8/4K2R w K - 0 10", "h1h2", "normal"),
]


@pytest.mark.parametrize("fen,move,case", EXAMPLES)
def test_classify_a_names_the_case(fen, move, case):
    assert classify_a(fen, move, arbiter.transition(fen, move, [move])) == case


@pytest.mark.parametrize("fen,move,case", [e for e in EXAMPLES if e[2] in
                                           ("checkmate", "stalemate", "insufficient_material", "promotion",
                                            "en_passant", "castling")])
def test_case_moves_finds_the_example(fen, move, case):
    found = case_moves(chess.Board(fen))
    assert chess.Move.from_uci(move) in found[case]
    outcomes = ("checkmate", "stalemate", "insufficient_material", "draw")
    for listed, moves in found.items():  # every move listed produces its case (an outcome outranks a kind)
        for m in moves:
            got = a_sample(text.a_prompt(fen, m.uci(), [m.uci()])).meta["case"]
            assert got == listed if listed in outcomes else got in (listed, *outcomes)


def test_mating_moves_are_every_mate_in_one():
    assert mating_moves(chess.Board("7k/6pp/8/8/8/8/8/R2Q2K1 w - - 0 1")) == {"d1d8", "a1a8"}
    assert mating_moves(chess.Board("7k/P5pp/8/8/8/8/8/6K1 w - - 0 1")) == {"a7a8q", "a7a8r"}  # promotions mate
    assert mating_moves(chess.Board("7k/6pp/8/8/8/8/8/R2Q2K1 b - - 0 1")) == set()  # the other side to move
    assert mating_moves(chess.Board()) == set()


def test_case_moves_of_the_initial_position_are_none():
    assert all(not moves for moves in case_moves(chess.Board()).values())


def test_illegal_move_is_well_formed_and_illegal():
    rng = np.random.default_rng(0)
    for fen in [chess.STARTING_FEN, EXAMPLES[1][0], EXAMPLES[6][0], EXAMPLES[2][0]]:
        board = chess.Board(fen)
        for _ in range(50):
            move = illegal_move(board, rng)
            assert chess.Move.from_uci(move.uci()) == move and not board.is_legal(move)
            assert arbiter.transition(fen, move.uci()).truncated


@pytest.mark.parametrize("case", SYNTHETIC_CASES)
def test_synthetic_positions_hold_their_case(case):
    rng = np.random.default_rng(1)
    made = 0
    for _ in range(3000):
        found = synthetic_case(case, rng)
        if found is None:
            continue
        board, move, history = found
        assert board.is_valid() and not board.is_game_over()
        sample = a_sample(text.a_prompt(board.fen(), move.uci(), [*history, move.uci()]))
        made += sample.meta["case"] == case
        if made == 3:
            return
    pytest.fail(f"only {made} synthetic {case} positions in 3000 attempts")


def _random_games(count: int, seed: int) -> list[Game]:
    rng = np.random.default_rng(seed)
    games = []
    for _ in range(count):
        board = chess.Board()
        while not board.is_game_over() and board.ply() < 120:
            moves = list(board.legal_moves)
            board.push(moves[int(rng.integers(len(moves)))])
        games.append(Game(tuple(m.uci() for m in board.move_stack)))
    return games


def test_a_mix_has_the_count_the_rare_cases_and_unique_prompts():
    games = [list(plies(g)) for g in _random_games(8, seed=2)]
    samples = AMixer(np.random.default_rng(0), set()).build(games, 300)
    assert len(samples) == 300
    assert len({s.prompt for s in samples}) == 300
    cases = [s.meta["case"] for s in samples]
    quotas = rare_quotas(300)
    assert cases.count("illegal") >= quotas["illegal"] == 18
    for case in SYNTHETIC_CASES:  # filled from games or synthetic positions: always reached
        assert cases.count(case) >= quotas[case] > 0
    assert cases.count("normal") > 300 * (1 - sum(RARE_SHARES.values())) - 30
    for sample in samples:
        parsed = text.parse_a_prompt(sample.prompt)
        assert parsed.history[-1] == parsed.move and len(parsed.history) <= 10
        assert sample.target == arbiter.a_target(arbiter.transition(parsed.fen, parsed.move, parsed.history))


def test_a_mix_game_moves_keep_the_original_history():
    game = _random_games(1, seed=3)[0]
    game_plies = list(plies(game))
    ply = game_plies[25]
    assert ply.move == game.moves[25] and ply.history == game.moves[16:25]
    prompt = text.a_prompt(ply.fen, ply.move, [*ply.history, ply.move])
    assert prompt.endswith("+" + " ".join(game.moves[16:26]) + "+")


def test_a_mix_is_deterministic_and_respects_seen_prompts():
    games = [list(plies(g)) for g in _random_games(4, seed=4)]
    first = AMixer(np.random.default_rng(5), set()).build(games, 120)
    second = AMixer(np.random.default_rng(5), set()).build(games, 120)
    assert [s.prompt for s in first] == [s.prompt for s in second]
    seen = {s.prompt for s in first}
    third = AMixer(np.random.default_rng(5), set(seen)).build(games, 60)
    assert not seen & {s.prompt for s in third}


def test_position_facts():
    assert position_key("4k3/8/8/8/8/8/8/4K2R w K - 13 40") == "4k3/8/8/8/8/8/8/4K2R w K -"
    assert move_number("4k3/8/8/8/8/8/8/4K2R w K - 13 40") == 40
    assert game_phase(chess.STARTING_FEN) == "opening"
    middlegame = "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 11"
    assert game_phase(middlegame) == "middlegame"
    assert game_phase("4k3/8/8/8/8/8/8/4K2R w K - 0 5") == "endgame"  # few pieces: endgame even at move 5
    # 26 points of non-pawn material (R+R+B each) is still an endgame; one more knight is not
    assert game_phase("r1b1k2r/8/8/8/8/8/8/R1B1K2R w - - 0 30") == "endgame"
    assert game_phase("r1b1k1nr/8/8/8/8/8/8/R1B1K2R w - - 0 30") == "middlegame"
