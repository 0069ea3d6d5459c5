"""`rookworld play`: the model's move choice and its fallback, game ends, adjudication at the ply limit, random
openings, self-play stopped at the first illegal move, matches against a second model, the Elo difference, and
real games of the embedded model against the random mover, Stockfish, itself and a second copy of itself (JSON
totals, PGN, seeds, flag errors)."""

import json
import random

import chess
import chess.pgn
import pytest

from rookworld.arbiter import legal_move
from rookworld.cli import main
from rookworld.evaluate import EvalConfig, self_play_values
from rookworld.metrics import estimate
from rookworld.play import (
    ILLEGAL,
    PLY_LIMIT,
    POINTS,
    SELF_PLY_LIMIT,
    Game,
    ModelOpponent,
    RandomMover,
    adjudicate,
    elo_difference,
    elo_interval,
    elo_text,
    ended,
    mates_missed,
    play_games,
    summary,
)
from rookworld.player import ModelPlayer, best_listed, choose_move, repeats, vote
from rookworld.quality import LOSS_CAP_PAWNS
from rookworld.text import p_prompt, parse_p_completion
from rookworld.tokenizer import Tokenizer

COMPLETION = "{pad}M: g1f3 e2e4      E: 0.3 0.2                B: {best}"


def test_choose_move_takes_a_legal_best_move_and_replaces_any_other():
    board = chess.Board()
    own = choose_move(board, COMPLETION.format(pad=" " * 30, best="g1f3"), random.Random(0))
    assert own.own and own.move == chess.Move.from_uci("g1f3")
    for completion in (COMPLETION.format(pad="", best="e2e5"), COMPLETION.format(pad="", best="0000"),
                       "M: e2e4 E: 0.1", "garbage", ""):
        first = choose_move(board, completion, random.Random(7))
        assert not first.own and first.move in board.legal_moves and first.completion == completion
        assert choose_move(board, completion, random.Random(7)).move == first.move  # seeded
    moves = {choose_move(board, "", random.Random(seed)).move for seed in range(40)}
    assert len(moves) > 5  # drawn among the legal moves, not one fixed move
    # the listed fallback: the best-rated legal M: candidate (e2e4 beats the illegal e2e5 and g1f3), else random
    listed = choose_move(board, "M: g1f3 e2e5 e2e4 E: 0.1 0.9 0.3 B: e2e5", random.Random(7), fallback="listed")
    assert not listed.own and listed.move == chess.Move.from_uci("e2e4")
    assert choose_move(board, "garbage", random.Random(7), fallback="listed").move == first.move
    with pytest.raises(ValueError, match="fallback 'engine': use one of random, listed"):
        ModelPlayer(None, None, fallback="engine")


def test_vote_picks_the_completion_naming_the_most_frequent_legal_move():
    board = chess.Board()

    def completions(*moves):
        return [COMPLETION.format(pad="", best=move) for move in moves]

    assert vote(board, completions("e2e5", "g1f3", "e2e4", "e2e4", "g1f3")) == 1  # a tie: the move named first
    assert vote(board, completions("e2e5", "e2e5", "e2e5", "d2d4")) == 3  # an illegal move gets no vote
    assert vote(board, completions("d2d4", "e2e4", "e2e4", "d2d4", "e2e4")) == 1
    assert vote(board, completions("e2e5", "0000") + ["garbage"]) == 0  # none legal: the first
    assert vote(board, ["garbage"]) == 0
    with pytest.raises(ValueError, match="votes 0: must be >= 1"):
        ModelPlayer(None, None, votes=0)


def _knights_out_and_back() -> chess.Board:
    """White's knight out and back, black's knight out: black's f6g8 would bring back the starting position."""
    board = chess.Board()
    for uci in ("g1f3", "g8f6", "f3g1"):
        board.push_uci(uci)
    return board


def test_repeats_names_a_move_that_brings_back_an_earlier_position():
    board = _knights_out_and_back()
    assert repeats(board, chess.Move.from_uci("f6g8"))  # the starting position again (castling rights unchanged)
    assert not repeats(board, chess.Move.from_uci("e7e5"))
    assert len(board.move_stack) == 3  # the board is left as it was
    assert not repeats(chess.Board(), chess.Move.from_uci("g1f3"))


def test_best_listed_takes_the_highest_eval_among_legal_kept_candidates():
    board = chess.Board()
    parsed = parse_p_completion("M: e2e5 g1f3 d2d4 b1c3 a2a3 E: 0.9 0.1 0.3 0.3")  # a2a3 has no eval
    assert best_listed(board, parsed) == chess.Move.from_uci("d2d4")  # e2e5 is illegal; d2d4 ties b1c3, earlier
    assert best_listed(board, parsed, keep=lambda m: m.uci() != "d2d4") == chess.Move.from_uci("b1c3")
    only_unrated = lambda m: m.uci() == "a2a3"  # noqa: E731
    assert best_listed(board, parsed, keep=only_unrated) == chess.Move.from_uci("a2a3")
    assert best_listed(board, parsed, keep=lambda m: False) is None
    assert best_listed(board, parse_p_completion("garbage")) is None


@pytest.mark.parametrize("completion, threshold, played, avoided", [
    # rated ahead (best eval 1.5 >= 1): the repeating B: is set aside for the best-rated candidate that does not repeat
    ("M: f6g8 e7e5 d7d5 E: 1.5 0.9 1.2 B: f6g8", 1.0, "d7d5", "f6g8"),
    ("M: f6g8 e7e5 d7d5 E: 1.5 0.9 1.2 B: f6g8", -3.0, "d7d5", "f6g8"),
    ("M: f6g8 e7e5 d7d5 E: 1.5 0.9 1.2 B: f6g8", 2.0, "f6g8", None),  # not ahead enough: the draw may be taken
    ("M: f6g8 e7e5 d7d5 E: 1.5 0.9 1.2 B: f6g8", None, "f6g8", None),  # off
    ("M: f6g8 e7e5 E: -0.5 -0.9 B: f6g8", 0.0, "f6g8", None),  # rated behind
    ("M: f6g8 e7e9 E: 1.5 0.9 B: f6g8", 1.0, "f6g8", None),  # no legal candidate avoids it
    ("M: f6g8 e7e5 B: f6g8", 1.0, "f6g8", None),  # no evals: no rating
    ("M: f6g8 e7e5 d7d5 E: 1.5 0.9 1.2 B: e7e5", 1.0, "e7e5", None),  # B: does not repeat
])
def test_choose_move_avoids_a_repetition_when_the_model_rates_itself_ahead(completion, threshold, played, avoided):
    board = _knights_out_and_back()
    choice = choose_move(board, completion, random.Random(0), threshold)
    assert choice.own and choice.move == chess.Move.from_uci(played) and choice.completion == completion
    assert choice.avoided == (None if avoided is None else chess.Move.from_uci(avoided))
    illegal = choose_move(board, "M: e7e5 E: 2.0 B: e7e4", random.Random(0), 1.0)
    assert not illegal.own and illegal.avoided is None  # the random fallback is not the rule's


def test_ended_claims_threefold_and_fifty_moves_and_follows_the_rules():
    board = chess.Board()
    for uci in ["g1f3", "g8f6", "f3g1", "f6g8"] * 2:
        assert ended(board) is None
        board.push_uci(uci)
    assert ended(board).termination == chess.Termination.THREEFOLD_REPETITION
    fifty = chess.Board("4k3/8/8/8/8/8/8/R3K3 w - - 99 80")
    fifty.push_uci("a1a2")
    assert ended(fifty).termination == chess.Termination.FIFTY_MOVES and ended(fifty).winner is None
    mate = chess.Board("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30")
    mate.push_uci("a1a8")
    assert ended(mate).termination == chess.Termination.CHECKMATE and ended(mate).winner == chess.WHITE


def test_mate_in_one_counts_the_model_turns_with_a_mate_and_the_mates_played():
    mate = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30"  # a1a8 mates
    game = Game(0, chess.WHITE)
    game.model_moves = [(chess.STARTING_FEN, "e2e4"),  # no mate on the board: not a chance
                        (mate, "a1a8"), (mate, "a1a7"), (mate, None)]  # mated, missed, an illegal move missed
    assert mates_missed(game) == (3, 2)
    other = Game(1, chess.BLACK)
    other.model_moves = [(chess.STARTING_FEN, "e2e4")]
    for g in (game, other):
        g.adjudicate(None, 0)
    totals = summary([game, other], [0.0] * 5)
    assert (totals["mate_chances"], totals["mate_in_one"]) == (3, pytest.approx(1 / 3))
    assert [(g["mate_chances"], g["mates_missed"]) for g in totals["per_game"]] == [(3, 2), (0, 0)]
    assert summary([other], [0.0])["mate_in_one"] is None  # never on the board: no rate


def test_a_model_that_writes_garbage_has_every_move_replaced_and_counted(tiny_gpt, one_thread):
    tokenizer = Tokenizer.train_chess(["P: rnbqkp RNBQKP/ 0123456789 abcdefgh +-.MEB"], vocab_size=257)
    player = ModelPlayer(tiny_gpt(vocab_size=tokenizer.vocab_size, n_positions=96), tokenizer, seed=3)
    played = play_games(player, RandomMover(3), games=2, max_plies=10)
    assert [g.model_color for g in played] == [chess.WHITE, chess.BLACK]
    assert [len(g.model_moves) for g in played] == [5, 5]
    assert all(uci is None for g in played for _, uci in g.model_moves)
    assert all(g.outcome is None for g in played)  # running at the ply limit: left to adjudicate
    adjudicate(played, None, 0)  # 0 pawns: drawn, no engine needed
    assert all(g.termination == PLY_LIMIT and g.model_result == "draw" and g.final_eval is None for g in played)
    totals = summary(played, [10.0] * 10)
    assert totals["score"] == 0.5 and totals["score_se"] == 0.0 and totals["adjudicated"] == 2
    assert totals["illegal_rate"] == 1.0 and totals["illegal_moves"] == 10
    assert totals["acpl"] == 10.0 and totals["acpl_legal"] is None
    again = play_games(ModelPlayer(player.model, tokenizer, seed=3), RandomMover(3), games=2, max_plies=10)
    assert [g.board.move_stack for g in again] == [g.board.move_stack for g in played]


def test_self_play_stops_at_the_first_illegal_move_after_seeded_random_openings(tiny_gpt, one_thread):
    tokenizer = Tokenizer.train_chess(["P: rnbqkp RNBQKP/ 0123456789 abcdefgh +-.MEB"], vocab_size=257)
    player = ModelPlayer(tiny_gpt(vocab_size=tokenizer.vocab_size, n_positions=96), tokenizer, seed=3)
    played = play_games(player, None, games=3, max_plies=10, opening_plies=3, seed=4)
    for game in played:  # the garbage model's first move ends every game, and is not played
        assert game.model_color is None and game.termination == ILLEGAL and game.legal_half_moves() == 0
        assert game.board.ply() == 3 and game.outcome.winner == chess.WHITE  # black to move forfeits
        assert len(game.model_moves) == 1 and game.model_moves[0] == (game.board.fen(), None)
        replay = Game(game.index, None)
        replay.open(3, RandomMover(4, f"opening/{game.index}"))
        assert replay.board.move_stack == game.board.move_stack  # the opening: game i's own seeded stream
    assert len({tuple(g.board.move_stack) for g in played}) == 3  # each game its own opening
    totals = summary(played, [10.0] * 3)
    assert (totals["legal_half_moves"], totals["legal_half_moves_se"], totals["legal_half_moves_median"]) == (0, 0, 0)
    assert (totals["ended_illegal"], totals["ended_by_rules"], totals["at_ply_limit"]) == (3, 0, 0)
    assert "score" not in totals and all(g["result"] == "1-0" for g in totals["per_game"])
    player.model.train()
    values = self_play_values(player.model, tokenizer, EvalConfig(self_play=2))  # `rookworld eval --self-play 2`
    assert values == [{"selfplay/legal_half_moves": [0.0], "selfplay/ended_illegal": [1.0]}] * 2
    assert player.model.training  # its mode restored


def test_a_model_opponent_has_its_moves_recorded_its_illegal_ones_replaced(tiny_gpt, one_thread):
    tokenizer = Tokenizer.train_chess(["P: rnbqkp RNBQKP/ 0123456789 abcdefgh +-.MEB"], vocab_size=257)
    model = tiny_gpt(vocab_size=tokenizer.vocab_size, n_positions=96)
    player = ModelPlayer(model, tokenizer, seed=3)
    opponent = ModelOpponent(ModelPlayer(model, tokenizer, seed=3, stream="opponent-fallback"), "garbage")
    played = play_games(player, opponent, games=4, max_plies=10, opening_plies=2, seed=4)
    assert [g.model_color for g in played] == [chess.WHITE, chess.BLACK] * 2
    for game in played:  # games 2k and 2k + 1 open alike, from the stream of opening k
        opening = Game(game.index, None)
        opening.open(2, RandomMover(4, f"opening/{game.index // 2}"))
        assert game.board.move_stack[:2] == opening.board.move_stack
        assert len(game.model_moves) == 4 and all(uci is None for _, uci in game.model_moves)
        assert len(game.opponent_moves) == 4 and all(uci is None for _, uci in game.opponent_moves)  # replaced
        replay, theirs = chess.Board(), []
        for ply, move in enumerate(game.board.move_stack):  # the boards the opponent moved on, after the opening
            if ply >= 2 and replay.turn != game.model_color:
                theirs.append(replay.fen())
            replay.push(move)
        assert [fen for fen, _ in game.opponent_moves] == theirs
    assert played[0].board.move_stack[:2] != played[2].board.move_stack[:2]
    adjudicate(played, None, 0)  # running at the ply limit: drawn
    totals = summary(played, [10.0] * 16, opponent_losses=[10.0] * 16)  # an illegal move loses the cap
    assert (totals["opponent_moves"], totals["opponent_illegal_moves"]) == (16, 16)
    assert totals["opponent_illegal_rate"] == 1.0
    assert totals["opponent_acpl"] == 10.0 and totals["opponent_acpl_legal"] is None
    assert all(g["opponent_moves"] == g["opponent_illegal_moves"] == 4 for g in totals["per_game"])
    assert "opponent_acpl" not in summary(played, [10.0] * 16)  # not judged: no opponent fields
    # the two sides' fallbacks draw from their own streams: the same model, yet not one game mirrors the other
    assert played[0].board.move_stack[2:] != played[1].board.move_stack[2:]


def test_the_elo_difference_follows_the_score_on_the_logistic_curve():
    assert elo_difference(0.5) == 0.0 and elo_difference(0.0) is None and elo_difference(1.0) is None
    assert elo_difference(10 / 11) == pytest.approx(400.0)  # odds of 10 to 1
    assert elo_difference(0.25) == pytest.approx(-elo_difference(0.75)) == pytest.approx(-190.8485, abs=1e-4)
    score = estimate([[1.0], [0.5], [0.5], [0.0], [1.0], [1.0]])  # 0.667 ± 0.167
    low, high = elo_interval(score)
    assert low == pytest.approx(elo_difference(score.mean - 1.96 * score.se))
    assert low < elo_difference(score.mean) < high and high is not None
    assert elo_interval(estimate([[1.0], [0.0]]))[1] is None  # 0.5 ± 1.96 × 0.5 passes a score of 1: unbounded
    assert elo_interval(estimate([[1.0]])) is None  # one game: no SE, no interval
    # 20 draws (or 10 pairs each split win and loss) have an SE of 0, which is no certainty: no interval either,
    # where 19 draws and a loss give one from -52 to +17
    assert elo_interval(estimate([[0.5]] * 20)) is None and elo_interval(estimate([[1.0, 0.0]] * 10)) is None
    assert elo_interval(estimate([[0.5]] * 19 + [[0.0]])) == [pytest.approx(-51.8, abs=0.1),
                                                               pytest.approx(16.7, abs=0.1)]


def test_the_score_of_games_paired_by_opening_has_its_se_clustered_by_pair():
    games = [Game(i, chess.WHITE if i % 2 == 0 else chess.BLACK) for i in range(4)]
    for game in games[:3]:  # white wins: the model wins, loses, wins
        game.outcome = chess.Outcome(chess.Termination.VARIANT_WIN, chess.WHITE)
    games[3].outcome = chess.Outcome(chess.Termination.VARIANT_DRAW, None)
    plain, paired = summary(games, []), summary(games, [], paired=True)
    assert plain["score"] == paired["score"] == 0.625 and paired["elo"] == elo_difference(0.625)
    assert plain["score_se"] == pytest.approx((0.6875 / 3 / 4) ** 0.5)  # four independent games
    assert paired["score_se"] == pytest.approx(0.125)  # pair totals 1 and 1.5 around 1.25: sqrt(0.125 / 2) / 2
    assert paired["elo_interval"][0] == pytest.approx(elo_difference(0.625 - 1.96 * 0.125))
    assert elo_text(paired) == "+89 (95%: -85 to +330)"
    for game in games:  # the model wins every game: no finite difference, nor an upper bound
        game.outcome = chess.Outcome(chess.Termination.VARIANT_WIN, game.model_color)
    # the lower bound is exact: two pairs all won have probability p^2 = 2.5% at p = 0.158, Elo -291
    assert elo_text(summary(games, [], paired=True)) == "+inf (95%: -291 to +inf)"
    assert elo_text(summary(games, [])) == "+inf (95%: -72 to +inf)"  # four games: p^4 = 2.5% at p = 0.398
    assert elo_text(summary(games[:1], [])) == "+inf"  # one game: no interval
    for game in games[1::2]:  # every pair split: won with one colour, lost with the other
        game.outcome = chess.Outcome(chess.Termination.VARIANT_WIN, not game.model_color)
    split = summary(games, [], paired=True)
    assert split["score_se"] == 0.0 and split["elo_interval"] is None
    assert elo_text(split) == "+0 (no 95% interval: every game or pair scored the same)"
    for game in games:
        game.outcome = chess.Outcome(chess.Termination.VARIANT_WIN, not game.model_color)
    assert summary(games, [])["elo_interval"] == [None, pytest.approx(elo_difference(1 - 0.025 ** 0.25))]
    assert elo_text(summary(games, [], paired=True)) == "-inf (95%: -inf to +291)"


def test_the_exact_bound_of_a_clean_sweep_tightens_with_the_games_and_covers_the_truth():
    bounds = [elo_interval(estimate([[0.0]] * n))[1] for n in (5, 20, 100)]
    assert bounds[0] > bounds[1] > bounds[2] and bounds[1] == pytest.approx(-277.4, abs=0.1)
    rng = random.Random(0)
    for truth in (0.05, 0.1, 0.2):  # a player winning that share of 20 games, else losing: it loses all 20 in 36%,
        misses = 0                  # 12% and 1.2% of matches; the sweep's bound excludes the truth in at most 2.5%
        for _ in range(2000):
            points = [float(rng.random() < truth) for _ in range(20)]
            misses += max(points) == 0.0 and elo_interval(estimate([[p] for p in points]))[1] < elo_difference(truth)
        assert misses / 2000 <= 0.025 + 3 * (0.025 * 0.975 / 2000) ** 0.5


def test_self_play_totals_count_legal_half_moves_and_how_games_stopped():
    games = [Game(i, None) for i in range(4)]
    games[0].model_moves = [(chess.STARTING_FEN, "e2e4")] * 3 + [(chess.STARTING_FEN, None)]
    games[0].forfeit()
    games[1].model_moves = [(chess.STARTING_FEN, "e2e4")] * 8
    games[1].termination = SELF_PLY_LIMIT  # unfinished at the limit
    mated = chess.Board("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30")
    games[2].board = mated
    games[2].model_moves = [(mated.fen(), "a1a8")]
    games[2].push(chess.Move.from_uci("a1a8"))
    games[3].model_moves = [(chess.STARTING_FEN, None)]  # illegal at once, white to move: black wins
    games[3].forfeit()
    totals = summary(games, [1.0] * 14)
    assert [g["legal_half_moves"] for g in totals["per_game"]] == [3, 8, 1, 0]
    assert totals["legal_half_moves"] == 3.0 and totals["legal_half_moves_median"] == 2.0
    assert totals["legal_half_moves_se"] == pytest.approx(((0 + 25 + 4 + 9) / 3 / 4) ** 0.5)
    assert (totals["ended_illegal"], totals["ended_by_rules"], totals["at_ply_limit"]) == (2, 1, 1)
    assert [g["result"] for g in totals["per_game"]] == ["0-1", "*", "1-0", "0-1"]
    assert [g["termination"] for g in totals["per_game"]] == [ILLEGAL, SELF_PLY_LIMIT, "checkmate", ILLEGAL]
    assert totals["illegal_moves"] == 2 and totals["model_moves"] == 14 and totals["mate_in_one"] == 1.0


@pytest.mark.stockfish
def test_games_at_the_ply_limit_go_to_the_side_stockfish_puts_ahead():
    from rookworld.stockfish import StockfishPool

    white_ahead = "4k3/8/8/8/8/8/8/R2QK3 {} - - 0 60"  # a queen and a rook: mate in 2 with white to move
    games = [Game(0, chess.WHITE, chess.Board(white_ahead.format("w"))),
             Game(1, chess.WHITE, chess.Board(white_ahead.format("b"))),  # the eval turned to the model's view
             Game(2, chess.BLACK, chess.Board(white_ahead.format("w"))),
             Game(3, chess.WHITE, chess.Board()),  # level: a draw
             Game(4, chess.BLACK, chess.Board("4k3/8/8/8/8/8/8/2R1K3 w - - 0 60"))]  # a rook down: about 5 pawns
    mated = chess.Board("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30")
    over = Game(5, chess.BLACK, mated)
    over.push(chess.Move.from_uci("a1a8"))  # already ended by the rules: not adjudicated
    with StockfishPool(processes=1) as pool:
        adjudicate([*games, over], pool, 6.0)
    assert [g.model_result for g in games] == ["win", "win", "loss", "draw", "draw"]
    assert [g.outcome.result() for g in games] == ["1-0", "1-0", "1-0", "1/2-1/2", "1/2-1/2"]
    assert all(g.termination == PLY_LIMIT for g in games)
    assert games[0].final_eval > 900 and games[1].final_eval > 10 and games[2].final_eval < -900  # mates count
    assert abs(games[3].final_eval) < 1 and -6 < games[4].final_eval < -3
    assert over.termination == "checkmate" and over.final_eval is None and over.model_result == "loss"
    totals = summary([*games, over], [0.0] * sum(len(g.model_moves) for g in [*games, over]))
    assert totals["adjudicated"] == 5 and (totals["wins"], totals["draws"], totals["losses"]) == (2, 2, 2)
    assert totals["score_se"] == pytest.approx((sum((p - 0.5) ** 2 for p in [1, 1, 0, .5, .5, 0]) / 5 / 6) ** 0.5)


def _play(tmp_path, name, *flags):
    out, pgn = tmp_path / "out" / f"{name}.json", tmp_path / "games" / f"{name}.pgn"  # directories made by play
    assert main(["play", *flags, "--threads", "1", "--out", str(out), "--pgn", str(pgn)]) == 0
    return json.loads(out.read_text()), pgn


def _check_consistent(results, max_plies):
    games, pawns = results["per_game"], results["settings"]["adjudicate"]
    assert results["wins"] + results["draws"] + results["losses"] == results["games"] == len(games)
    assert results["score"] == pytest.approx(
        (results["wins"] + 0.5 * results["draws"]) / results["games"])
    assert results["score"] == pytest.approx(sum(POINTS[g["model_result"]] for g in games) / len(games))
    assert results["elo"] == elo_difference(results["score"])
    assert 0.0 <= results["illegal_rate"] <= 1.0
    assert results["illegal_rate"] == results["illegal_moves"] / results["model_moves"]
    assert 0.0 <= results["acpl_legal"] <= results["acpl"] <= LOSS_CAP_PAWNS
    legal, illegal = results["model_moves"] - results["illegal_moves"], results["illegal_moves"]
    assert results["acpl"] * results["model_moves"] == pytest.approx(
        results["acpl_legal"] * legal + LOSS_CAP_PAWNS * illegal)  # an illegal move loses the cap
    assert results["plies"] == sum(g["plies"] for g in games) == sum(len(g["moves"]) for g in games)
    for game in games:
        assert game["model_color"] == ("white" if game["index"] % 2 == 0 else "black")
        # the model moves on the plies of its colour after the opening
        model_white, opening = game["model_color"] == "white", results["settings"]["opening_plies"]
        assert game["model_moves"] == sum((ply % 2 == 0) == model_white for ply in range(opening, game["plies"]))
        assert game["plies"] <= max_plies
        if game["termination"] == PLY_LIMIT:
            assert game["plies"] == max_plies
            ahead = game["final_eval"] is not None and pawns > 0 and abs(game["final_eval"]) >= pawns
            expected = "draw" if not ahead else "win" if game["final_eval"] > 0 else "loss"
            assert game["model_result"] == expected
            assert (game["final_eval"] is None) == (pawns == 0)
        else:
            assert game["final_eval"] is None
    assert results["adjudicated"] == sum(g["termination"] == PLY_LIMIT for g in games)
    assert results["mate_chances"] == sum(g["mate_chances"] for g in games)
    assert (results["mate_in_one"] is None) == (results["mate_chances"] == 0)


def _check_pgn(path, results, opponent):
    with open(path, encoding="utf-8") as handle:
        games = [chess.pgn.read_game(handle) for _ in range(results["games"] + 1)]
    assert games[-1] is None  # exactly one PGN game per game played
    for pgn, game in zip(games, results["per_game"]):
        names = [results["settings"]["model"], opponent]
        assert [pgn.headers["White"], pgn.headers["Black"]] == (names if game["model_color"] == "white" else
                                                                names[::-1])
        assert pgn.headers["Result"] == game["result"] and pgn.headers["Termination"] == game["termination"]
        assert not pgn.errors
        board = pgn.board()
        for move in pgn.mainline_moves():
            assert board.is_legal(move)
            board.push(move)
        assert [m.uci() for m in board.move_stack] == game["moves"]


def _match(tmp_path, name, max_plies, *flags):
    """A match of the embedded model against itself with `flags`, its JSON and PGN checked."""
    results, pgn = _play(tmp_path, name, *flags)
    _check_consistent(results, max_plies)
    _check_pgn(pgn, results, "rookworld embedded model")
    return results


@pytest.mark.integration
@pytest.mark.stockfish
def test_games_against_random_are_consistent_and_repeat_with_the_seed(tmp_path):
    flags = ["--opponent", "random", "--games", "2", "--max-plies", "8"]
    results, pgn = _play(tmp_path, "a", *flags, "--seed", "5")
    _check_consistent(results, 8)
    _check_pgn(pgn, results, "random")
    assert results["settings"] == {"model": "rookworld embedded model", "opponent": "random", "skill": None,
                                   "depth": None, "opponent_model": None, "seed": 5, "max_plies": 8, "opening_plies": 0,
                                   "adjudicate": 5.0, "fallback": "random",
                                   "avoid_repetition": None, "votes": 1, "opponent_fallback": None,
                                   "opponent_avoid_repetition": None, "opponent_votes": None, "readout": "b",
                                   "opponent_readout": None, "world": "rules", "judge_limit": "depth=10"}
    assert results["adjudicated"] == 2 and all(g["final_eval"] is not None for g in results["per_game"])
    again, again_pgn = _play(tmp_path, "b", *flags, "--seed", "5")
    for timing in ("play_s", "wall_s"):
        del results[timing], again[timing]
    assert again == results
    assert again_pgn.read_text() == pgn.read_text()
    other, _ = _play(tmp_path, "c", *flags, "--seed", "6")
    assert [g["moves"] for g in other["per_game"]] != [g["moves"] for g in results["per_game"]]
    drawn, _ = _play(tmp_path, "d", *flags, "--seed", "5", "--adjudicate", "0")  # the ply limit is a draw
    _check_consistent(drawn, 8)
    assert [g["moves"] for g in drawn["per_game"]] == [g["moves"] for g in results["per_game"]]
    assert drawn["draws"] == 2 and drawn["settings"]["adjudicate"] == 0


@pytest.mark.integration
@pytest.mark.stockfish
def test_games_against_stockfish_skill_0(tmp_path):
    results, pgn = _play(tmp_path, "sf", "--opponent", "stockfish", "--skill", "0", "--depth", "1",
                         "--games", "2", "--max-plies", "12")
    _check_consistent(results, 12)
    _check_pgn(pgn, results, "Stockfish skill 0")
    assert results["settings"]["skill"] == 0 and results["settings"]["depth"] == 1


@pytest.mark.stockfish
def test_a_model_that_never_moved_has_no_acpl(tmp_path, capsys):
    # the model is white; one opening ply, then the random mover's ply reaches the limit
    results, _ = _play(tmp_path, "unmoved", "--opponent", "random", "--games", "1", "--opening-plies", "1",
                       "--max-plies", "2")
    assert results["model_moves"] == 0 and results["acpl"] is None and results["acpl_legal"] is None
    assert "acpl n/a, illegal rate 0.000" in capsys.readouterr().out


@pytest.mark.integration
@pytest.mark.stockfish
def test_self_play_of_the_embedded_model_is_consistent_and_repeats_with_the_seed(tmp_path):
    flags = ["--opponent", "self", "--games", "2", "--max-plies", "14", "--seed", "1"]
    results, pgn = _play(tmp_path, "self", *flags)
    assert results["settings"]["opening_plies"] == 4 and results["settings"]["adjudicate"] is None  # self's default
    games = results["per_game"]
    assert results["games"] == len(games) == 2 and "score" not in results
    ends = [g["termination"] for g in games]
    assert results["ended_illegal"] + results["ended_by_rules"] + results["at_ply_limit"] == 2
    assert (results["ended_illegal"], results["at_ply_limit"]) == (ends.count(ILLEGAL), ends.count(SELF_PLY_LIMIT))
    for game in games:
        assert game["model_color"] == "both" and game["illegal_moves"] == (game["termination"] == ILLEGAL)
        assert game["legal_half_moves"] == game["model_moves"] - game["illegal_moves"] == game["plies"] - 4
        assert game["plies"] == len(game["moves"]) <= 14
        assert (game["plies"] == 14) == (game["termination"] == SELF_PLY_LIMIT) == (game["result"] == "*")
    assert results["legal_half_moves"] == pytest.approx(sum(g["legal_half_moves"] for g in games) / 2)
    assert results["illegal_rate"] == results["illegal_moves"] / results["model_moves"]
    with open(pgn, encoding="utf-8") as handle:
        first = chess.pgn.read_game(handle)
    assert first.headers["White"] == first.headers["Black"] == "rookworld embedded model"
    assert first.headers["Result"] == games[0]["result"] and first.headers["Termination"] == games[0]["termination"]
    again, _ = _play(tmp_path, "again", *flags)
    assert [g["moves"] for g in again["per_game"]] == [g["moves"] for g in games]
    start, _ = _play(tmp_path, "start", "--opponent", "self", "--games", "1", "--max-plies", "6",
                     "--opening-plies", "0")
    game = start["per_game"][0]  # no random plies: every move played is the model's own
    assert start["settings"]["opening_plies"] == 0 and game["legal_half_moves"] == game["plies"] > 0


@pytest.mark.integration
@pytest.mark.stockfish
def test_random_openings_start_games_against_an_opponent(tmp_path):
    flags = ["--opponent", "random", "--games", "2", "--max-plies", "8", "--opening-plies", "3", "--seed", "2"]
    results, _ = _play(tmp_path, "open", *flags, "--adjudicate", "0")
    assert results["settings"]["opening_plies"] == 3
    for game in results["per_game"]:
        opening = Game(game["index"], None)
        opening.open(3, RandomMover(2, f"opening/{game['index'] // 2}"))  # one opening, both colours
        assert game["moves"][:3] == [move.uci() for move in opening.board.move_stack]
    _check_consistent(results, 8)
    plain, _ = _play(tmp_path, "plain", *flags[:-4], "--seed", "2", "--adjudicate", "0")
    assert [g["moves"][:3] for g in plain["per_game"]] != [g["moves"][:3] for g in results["per_game"]]


@pytest.mark.integration
@pytest.mark.stockfish
def test_a_match_of_the_embedded_model_against_a_second_copy_of_itself(tmp_path):
    model = "src/rookworld/assets/model"
    results, pgn = _play(tmp_path, "match", "--opponent", "model", "--opponent-model", model, "--games", "4",
                         "--max-plies", "12", "--seed", "3")
    _check_consistent(results, 12)
    _check_pgn(pgn, results, model)
    assert results["settings"]["opponent_model"] == model and results["settings"]["opening_plies"] == 4  # default
    games = results["per_game"]
    assert games[0]["moves"][:4] == games[1]["moves"][:4] != games[2]["moves"][:4] == games[3]["moves"][:4]
    # the opponent moved on the plies after the opening that are not the model's, judged as the model's moves are
    assert [g["opponent_moves"] for g in games] == [g["plies"] - 4 - g["model_moves"] for g in games]
    assert results["opponent_moves"] == sum(g["opponent_moves"] for g in games)
    assert results["opponent_illegal_moves"] == sum(g["opponent_illegal_moves"] for g in games)
    assert results["opponent_illegal_rate"] == results["opponent_illegal_moves"] / results["opponent_moves"]
    assert 0.0 <= results["opponent_acpl_legal"] <= results["opponent_acpl"] <= LOSS_CAP_PAWNS
    assert results["opponent_acpl"] == pytest.approx(
        sum(g["opponent_acpl"] * g["opponent_moves"] for g in games) / results["opponent_moves"])
    pairs = [[POINTS[g["model_result"]] for g in games[i:i + 2]] for i in (0, 2)]  # one opening each
    assert results["score_se"] == pytest.approx(estimate(pairs).se)
    default, _ = _play(tmp_path, "default", "--opponent", "model", "--games", "2", "--max-plies", "12", "--seed", "3")
    assert default["settings"]["opponent_model"] == "rookworld embedded model"
    assert [g["moves"] for g in default["per_game"]] == [g["moves"] for g in games[:2]]  # the same model


def _first_difference(run: dict, before: dict) -> tuple[dict, chess.Board, str, str]:
    """The game of `run` that parts first from the same game of `before` (the earliest ply over all games), the
    board there, and the two games' moves on it."""
    parted = [(next(i for i, (a, b) in enumerate(zip(game["moves"], earlier["moves"])) if a != b), k)
              for k, (game, earlier) in enumerate(zip(run["per_game"], before["per_game"]))
              if game["moves"] != earlier["moves"]]
    ply, k = min(parted)
    board = chess.Board()
    for uci in before["per_game"][k]["moves"][:ply]:
        board.push_uci(uci)
    return run["per_game"][k], board, run["per_game"][k]["moves"][ply], before["per_game"][k]["moves"][ply]


@pytest.mark.integration
@pytest.mark.stockfish
def test_the_models_avoid_repetitions_only_where_they_would_repeat(tmp_path, capsys):
    flags = ["--opponent", "model", "--games", "4", "--max-plies", "60", "--seed", "0"]
    plain, _ = _play(tmp_path, "plain", *flags)
    results, pgn = _play(tmp_path, "avoid", *flags, "--avoid-repetition", "-10")  # whatever its evals say
    assert "repetitions avoided" in capsys.readouterr().out
    both, _ = _play(tmp_path, "both", *flags, "--avoid-repetition", "-10", "--opponent-avoid-repetition", "-10")
    for run in (results, both):
        _check_consistent(run, 60)
    _check_pgn(pgn, results, "rookworld embedded model")
    assert [(r["settings"]["avoid_repetition"], r["settings"]["opponent_avoid_repetition"])
            for r in (plain, results, both)] == [(None, None), (-10, None), (-10, -10)]
    for run in (plain, results, both):
        for side in ("repetitions_avoided", "opponent_repetitions_avoided"):
            assert run[side] == sum(g[side] for g in run["per_game"])
    assert plain["repetitions_avoided"] == plain["opponent_repetitions_avoided"] == 0
    assert results["repetitions_avoided"] > 0 == results["opponent_repetitions_avoided"]
    assert both["opponent_repetitions_avoided"] > 0
    # each run plays the games of the one before it move for move until its new rule first acts: there a move that
    # repeated a position is replaced by one that does not, played by the side the rule is for (later the games'
    # shared fallback streams may part games where the rule never acted)
    for run, before, side in ((results, plain, "model"), (both, results, "opponent")):
        game, board, move, replaced = _first_difference(run, before)
        assert (board.turn == (game["model_color"] == "white")) == (side == "model")
        assert repeats(board, chess.Move.from_uci(replaced)) and not repeats(board, chess.Move.from_uci(move))
        counted = "repetitions_avoided" if side == "model" else "opponent_repetitions_avoided"
        assert all(g["moves"] != e["moves"] for g, e in zip(run["per_game"], before["per_game"]) if g[counted])


@pytest.mark.integration
@pytest.mark.stockfish
def test_the_listed_fallback_plays_the_models_best_rated_legal_candidate(tmp_path):
    flags = ["--opponent", "model", "--games", "4", "--max-plies", "40", "--seed", "0"]
    plain, _ = _play(tmp_path, "plain", *flags)
    listed = _match(tmp_path, "listed", 40, *flags, "--fallback", "listed", "--opponent-fallback", "listed")
    assert (listed["settings"]["fallback"], listed["settings"]["opponent_fallback"]) == ("listed", "listed")
    assert (plain["settings"]["fallback"], plain["settings"]["opponent_fallback"]) == ("random", "random")
    assert listed["illegal_moves"] + listed["opponent_illegal_moves"] > 0  # still counted as illegal
    # the games part first where a side's B: move is illegal: there the listed run plays the candidate its own
    # evals rate best, the plain run a random legal move
    game, board, move, replaced = _first_difference(listed, plain)
    parsed = parse_p_completion(ModelPlayer.load(threads=1).choose([board])[0].completion)
    assert legal_move(board, parsed.best) is None
    assert best_listed(board, parsed) == chess.Move.from_uci(move) != chess.Move.from_uci(replaced)


@pytest.mark.integration
def test_a_voting_player_plays_the_vote_of_its_seeded_samples(one_thread):
    import torch

    from rookworld.generation import SamplingSettings, generate_groups
    from rookworld.sample import DEFAULT_MAX_NEW_TOKENS

    player = ModelPlayer.load(threads=1, seed=3, votes=6)
    boards = [chess.Board(), chess.Board("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 30")]
    choices = player.choose(boards)
    # the same samples drawn again from the player's stream: the choice is their vote's completion
    tokenizer = player.tokenizer
    ids = tokenizer.encode_prompts([p_prompt(board.fen()) for board in boards])
    generator = torch.Generator().manual_seed(random.Random("3/fallback/votes").getrandbits(63))
    settings = [SamplingSettings(max_new_tokens=min(DEFAULT_MAX_NEW_TOKENS, player.model.config.n_positions - len(p)))
                for p in ids]
    texts = tokenizer.decode_batch(generate_groups(player.model, ids, 6, settings, eos_id=tokenizer.eos_id,
                                                   generator=generator).completions())
    for k, (board, choice) in enumerate(zip(boards, choices)):
        group = texts[6 * k:6 * k + 6]
        assert choice.completion == group[vote(board, group)] and choice.move in board.legal_moves
    assert [c.move for c in ModelPlayer.load(threads=1, seed=3, votes=6).choose(boards)] == [c.move for c in choices]
    greedy = ModelPlayer.load(threads=1).choose(boards)
    assert [c.completion for c in ModelPlayer.load(threads=1, votes=1, seed=9).choose(boards)] == [
        c.completion for c in greedy]  # one vote: the greedy completion, whatever the seed


@pytest.mark.integration
@pytest.mark.stockfish
def test_games_with_votes_on_both_sides_and_in_self_play(tmp_path):
    flags = ["--opponent", "model", "--games", "2", "--max-plies", "12", "--seed", "1"]
    plain, _ = _play(tmp_path, "plain", *flags)
    voted = _match(tmp_path, "voted", 12, *flags, "--votes", "4", "--opponent-votes", "3")
    assert (voted["settings"]["votes"], voted["settings"]["opponent_votes"]) == (4, 3)
    assert (plain["settings"]["votes"], plain["settings"]["opponent_votes"]) == (1, 1)
    assert [g["moves"][:4] for g in voted["per_game"]] == [g["moves"][:4] for g in plain["per_game"]]  # openings
    assert [g["moves"] for g in voted["per_game"]] != [g["moves"] for g in plain["per_game"]]
    again, _ = _play(tmp_path, "again", *flags, "--votes", "4", "--opponent-votes", "3")
    assert [g["moves"] for g in again["per_game"]] == [g["moves"] for g in voted["per_game"]]  # seeded
    self_play, _ = _play(tmp_path, "self", "--opponent", "self", "--games", "2", "--max-plies", "12", "--votes", "4")
    assert self_play["settings"]["votes"] == 4 and self_play["settings"]["opponent_votes"] is None


@pytest.mark.parametrize("flags, named", [
    (["--opponent", "gnuchess"], "--opponent gnuchess: unknown; use one of random, stockfish, self, model"),
    (["--opponent", "random", "--opponent-model", "m"], "--opponent-model m: names the opponent of --opponent model"),
    (["--opponent", "self", "--opponent-avoid-repetition", "1"],
     "--opponent-avoid-repetition 1: sets the opponent of --opponent model"),
    (["--opponent", "random", "--opponent-fallback", "listed"], "--opponent-fallback listed: sets the opponent of"),
    (["--opponent", "random", "--opponent-votes", "2"], "--opponent-votes 2: sets the opponent of --opponent model"),
    (["--opponent", "random", "--votes", "0"], "--votes 0: must be >= 1"),
    (["--opponent", "self", "--fallback", "listed"], "--fallback listed: self-play stops at the model's first illegal"),
    (["--opponent", "model", "--skill", "3"], "--skill and --depth set Stockfish; use them with --opponent"),
    (["--opponent", "model", "--opening-plies", "0"], "--opening-plies 0 with --opponent model and --games 10:"),
    (["--opponent", "self", "--depth", "3"], "--skill and --depth set Stockfish; use them with --opponent"),
    (["--opponent", "random", "--opening-plies", "-1"], "--opening-plies -1: must be >= 0 and below --max-plies"),
    (["--opponent", "self", "--opening-plies", "8", "--max-plies", "8"], "--opening-plies 8: must be >= 0 and"),
    (["--opponent", "self", "--opening-plies", "0"], "--opening-plies 0 with --opponent self and --games 10:"),
    (["--opponent", "stockfish", "--skill", "21"], "--skill 21: Stockfish's skill level is 0..20"),
    (["--opponent", "stockfish", "--skill", "-1"], "--skill -1: Stockfish's skill level is 0..20"),
    (["--opponent", "stockfish", "--depth", "0"], "--depth 0: Stockfish's search depth must be >= 1"),
    (["--opponent", "random", "--skill", "3"], "--skill and --depth set Stockfish; use them with --opponent"),
    (["--opponent", "random", "--games", "0"], "--games 0: must be >= 1"),
    (["--opponent", "random", "--max-plies", "0"], "--max-plies 0: must be >= 1"),
    (["--opponent", "random", "--adjudicate", "-1"], "--adjudicate -1: pawns must be >= 0"),
    (["--opponent", "random", "--games", "1", "--max-plies", "2", "--pgn", "/proc/no/x.pgn"],
     "--pgn /proc/no/x.pgn: cannot write in /proc/no"),
    (["--opponent", "random", "--games", "1", "--max-plies", "2", "--out", "/"], "--out / is a directory"),
])
def test_bad_flags_are_one_line_errors(flags, named, capsys):
    assert main(["play", *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"rookworld play: error: {named}") and error.count("\n") == 1
