"""Games in the model's own world (world.py, `rookworld play --world model`, `rookworld eval --world-games`): the
divergence of hand-made A completions of each kind from the arbiter's truth, what the model's world makes of a
completion, and real games of the embedded model and of a model writing garbage."""

import json

import chess
import chess.pgn
import pytest

from rookworld import metrics
from rookworld.arbiter import a_target, transition
from rookworld.cli import main
from rookworld.evaluate import EvalConfig, self_play_values
from rookworld.play import ILLEGAL, SELF_PLY_LIMIT, Game, RandomMover, play_games
from rookworld.player import Choice, ModelPlayer
from rookworld.tokenizer import Tokenizer
from rookworld.world import (
    DRAWN,
    ILLEGAL_ACCEPTED,
    KINDS,
    LEGAL_REFUSED,
    MALFORMED,
    MATED,
    REFUSED,
    UNUSABLE,
    WRONG_FEN,
    WRONG_FLAGS,
    WRONG_REWARD,
    Line,
    World,
    after,
    divergence,
)

START = chess.STARTING_FEN
AFTER_E4 = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
FOOLS = "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2"  # black mates with d8h4
MATED_FEN = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"


def test_an_exact_completion_has_no_divergence_and_the_truth_is_the_arbiters():
    legal, illegal, mate = transition(START, "e2e4"), transition(START, "e2e5"), transition(FOOLS, "d8h4")
    assert a_target(legal) == AFTER_E4 + "+0.001+0+0" and a_target(illegal) == START + "+-1.0+0+1"
    assert a_target(mate) == MATED_FEN + "+1.0+1+0"
    for truth in (legal, illegal, mate):
        assert divergence(truth, a_target(truth)) is None
        assert divergence(truth, f"  {a_target(truth)}\n") is None  # outer whitespace, as A/exact strips it


@pytest.mark.parametrize("fen, move, completion, kind", [
    (START, "e2e4", "garbage", MALFORMED),
    (START, "e2e4", AFTER_E4 + "+0.001+0", MALFORMED),  # three fields
    (START, "e2e4", AFTER_E4 + "+0.01+0+0", MALFORMED),  # not one of the four rewards
    (START, "e2e4", AFTER_E4 + "+0.001+0+2", MALFORMED),  # a flag neither 0 nor 1
    (START, "e2e4", "rnbqkbnr/pppppppp/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0", MALFORMED),  # 7 ranks
    (START, "e2e4", AFTER_E4 + " + 0.001+0+0", MALFORMED),  # every field right, the text not the target's
    (START, "e2e5", AFTER_E4 + "+0.001+0+0", ILLEGAL_ACCEPTED),
    (START, "e2e5", START + "+0.001+0+1", ILLEGAL_ACCEPTED),  # the FEN unchanged, but not called illegal
    (START, "e2e5", START + "+1.0+1+0", ILLEGAL_ACCEPTED),
    (START, "e2e4", START + "+-1.0+0+1", LEGAL_REFUSED),
    (FOOLS, "d8h4", FOOLS + "+-1.0+0+1", LEGAL_REFUSED),
    (START, "e2e4", START + "+0.001+0+0", WRONG_FEN),  # the move not made
    (START, "e2e4", AFTER_E4.replace(" b ", " w ") + "+0.001+0+0", WRONG_FEN),  # the side to move not passed
    (START, "e2e5", AFTER_E4 + "+-1.0+0+1", WRONG_FEN),  # refused, yet the position changed
    (FOOLS, "d8h4", MATED_FEN + "+0.001+1+0", WRONG_REWARD),
    (FOOLS, "d8h4", MATED_FEN + "+0.5+1+0", WRONG_REWARD),
    (FOOLS, "d8h4", MATED_FEN + "+1.0+0+0", WRONG_FLAGS),  # mate, yet the game goes on
    (START, "e2e4", AFTER_E4 + "+0.001+1+0", WRONG_FLAGS),
    (START, "e2e5", START + "+-1.0+0+0", WRONG_FLAGS),
])
def test_each_kind_of_divergence_from_a_hand_made_completion(fen, move, completion, kind):
    assert divergence(transition(fen, move), completion) == kind


def test_what_the_models_world_makes_of_a_completion():
    board, outcome, termination = after(AFTER_E4 + "+0.001+0+0", chess.WHITE)
    assert board.fen() == AFTER_E4 and outcome is None and termination is None
    wrong = "rnbqkbnr/pppppppp/8/8/8/4P3/PPPP1PPP/RNBQKBNR b KQkq - 0 1"  # e2e3 for e2e4: a state all the same
    assert after(wrong + "+0.001+0+0", chess.WHITE)[0].fen() == wrong
    assert after("garbage", chess.WHITE)[1:] == (chess.Outcome(chess.Termination.VARIANT_DRAW, None), UNUSABLE)
    no_kings = "8/8/8/8/8/8/8/8 w - - 0 1+0.001+0+0"  # a FEN python-chess rejects
    assert after(no_kings, chess.WHITE)[::2] == (None, UNUSABLE)
    assert after(MATED_FEN + "+0.001+0+0", chess.BLACK)[::2] == (None, UNUSABLE)  # no legal move, the game going on
    board, outcome, termination = after(START + "+-1.0+0+1", chess.WHITE)
    assert board is None and outcome.winner == chess.BLACK and termination == REFUSED  # the mover loses
    board, outcome, termination = after(MATED_FEN + "+1.0+1+0", chess.BLACK)
    assert board is None and outcome.winner == chess.BLACK and termination == MATED
    assert after(AFTER_E4 + "+0.5+1+0", chess.WHITE)[1:] == (chess.Outcome(chess.Termination.VARIANT_DRAW, None),
                                                                DRAWN)
    assert after(AFTER_E4 + "+0.001+0+1", chess.WHITE)[2] == DRAWN  # truncated ends it too


@pytest.mark.parametrize("best, world, self_play, sent", [
    ("e2e5", True, True, "e2e5"),  # in the model's world an illegal B: move goes to the world, which judges it
    ("e2e5", True, False, "e2e5"),
    ("e2e5", False, False, "g1f3"),  # in the rules' world the fallback's move replaces it
    ("e2e5", False, True, None),  # and self-play stops at it
    ("a1a1", True, False, "g1f3"),  # no UCI move to send: the fallback's, in self-play none
    ("zz", True, True, None),
    ("e2e4", True, True, "e2e4"),  # the model's own legal move, in either world
    ("e2e4", False, True, "e2e4"),
])
def test_which_move_a_choice_sends_to_the_game(best, world, self_play, sent):
    own = best == "e2e4"
    choice = Choice(chess.Move.from_uci("e2e4" if own else "g1f3"), own, f"M: e2e4 E: 0.1 B: {best}")
    game = Game(0, None if self_play else chess.WHITE, world=Line() if world else None)
    game.take(choice, game.model_moves, self_play)
    assert game.model_moves == [(START, best if own else None)]  # an illegal or missing move counts as illegal
    played = game.world.pending if world else game.board.peek() if game.board.move_stack else None
    assert (played and played.uci()) == sent and (game.termination == ILLEGAL) == (sent is None)


def _garbage_model(tiny_gpt):
    tokenizer = Tokenizer.train_chess(["P: rnbqkp RNBQKP/ 0123456789 abcdefgh +-.MEB"], vocab_size=257)
    return tiny_gpt(vocab_size=tokenizer.vocab_size, n_positions=160), tokenizer


@pytest.mark.parametrize("random_opponent", [False, True])
def test_a_world_writing_garbage_ends_each_game_at_its_first_transition(random_opponent, tiny_gpt, one_thread):
    model, tokenizer = _garbage_model(tiny_gpt)
    player = ModelPlayer(model, tokenizer, readout="first")  # legal moves, whatever the model
    opponent = RandomMover(1) if random_opponent else None  # game 1: the opponent's move goes to the world
    played = play_games(player, opponent, games=2, max_plies=8, opening_plies=2, seed=1,
                        world=World(model, tokenizer))
    for game in played:
        (step,) = game.world.steps
        assert step.kind == MALFORMED and game.termination == UNUSABLE and game.outcome.winner is None
        assert step.fen == game.board.fen() and step.move in {m.uci() for m in game.board.legal_moves}
        assert game.world.moves == game.uci_moves() and len(game.uci_moves()) == 3  # the opening and the move
        assert step.truth == transition(step.fen, step.move, game.world.moves)
        assert game.world.plies_to_divergence() == 0 and game.world.first() == 0


def test_eval_world_games_of_a_garbage_model(tiny_gpt, one_thread):
    model, tokenizer = _garbage_model(tiny_gpt)
    values = self_play_values(model, tokenizer, EvalConfig(self_play=1, world_games=2))
    # its first B: move is no UCI move: no transition to check, each world game censored at 0 plies
    assert values == [{"selfplay/legal_half_moves": [0.0], "selfplay/ended_illegal": [1.0]}] + [
        {"world/plies_to_divergence": [0.0], "world/censored": [1.0], "world/a_exact": []}] * 2
    found = metrics.flatten(metrics.summarize(values))
    assert (found["world/plies_to_divergence"], found["world/plies_to_divergence/n"]) == (0.0, 2)
    assert "world/a_exact" not in found and found["selfplay/legal_half_moves/n"] == 1


def test_the_embedded_model_plays_on_in_its_own_world_after_a_divergence(one_thread):
    """Self-play game 0 of --seed 1: the model drops the en-passant square of d2d4 (e4 could take it) and the game
    goes on from its state."""
    player = ModelPlayer.load(threads=1)
    played = play_games(player, None, games=2, max_plies=11, opening_plies=4, seed=1,
                        world=World(player.model, player.tokenizer))
    line = played[0].world
    assert line.first() == 0 and line.steps[0].kind == WRONG_FEN and line.steps[0].move == "d2d4"
    truth, model = line.steps[0].truth.fen, line.steps[0].completion.split("+")[0]
    assert truth.endswith(" KQkq d3 0 3") and model == truth.replace(" d3 ", " - ")
    assert line.steps[1].fen == model != truth  # the next move is played in the model's state
    for game in played:
        assert game.termination == SELF_PLY_LIMIT and len(game.world.steps) == 7 == len(game.uci_moves()) - 4
        for step, following in zip(game.world.steps, game.world.steps[1:]):
            assert following.fen == chess.Board(step.completion.split("+")[0]).fen()
    assert played[1].world.first() is None and played[1].world.plies_to_divergence() == 7  # censored


@pytest.mark.integration
def test_play_world_model_reports_the_divergence_in_json_and_pgn(tmp_path, capsys):
    out, pgn = tmp_path / "world.json", tmp_path / "world.pgn"
    flags = ["play", "--world", "model", "--opponent", "self", "--games", "2", "--max-plies", "11", "--seed", "3",
             "--threads", "1", "--out", str(out), "--pgn", str(pgn)]
    assert main(flags) == 0
    results = json.loads(out.read_text())
    world = results["world"]
    assert results["settings"]["world"] == "model"
    assert (world["plies_to_divergence"], world["diverged"], world["censored"], world["transitions"]) == (5.0, 1, 1, 14)
    assert world["plies_to_divergence_se"] == pytest.approx(2.0)
    assert world["first_divergences"] == {kind: int(kind == WRONG_FEN) for kind in KINDS}
    assert world["a_exact"] == pytest.approx(13 / 14) and world["wrong_transitions"][WRONG_FEN] == 1
    first, second = (game["world"] for game in results["per_game"])
    assert second == {"plies_to_divergence": 7, "censored": True, "transitions": 7, "exact": 7, "divergence": None}
    assert not first["censored"] and first["plies_to_divergence"] == 3
    assert first["divergence"]["kind"] == WRONG_FEN and first["divergence"]["move"] == "e7e5"  # e6 dropped
    assert "plies to the first divergence 5.0 ± 2.0 (1 of 2 games without one" in capsys.readouterr().out
    with open(pgn, encoding="utf-8") as handle:
        games = [chess.pgn.read_game(handle), chess.pgn.read_game(handle)]
    assert games[1].end().comment == "the model's world kept to the rules for all 7 plies"
    assert games[0].end().move.uci() == "e7e5"  # the game as the rules see it, to the move that diverged
    assert games[0].end().comment.startswith("world diverged at e7e5, 3 plies after the opening: wrong fen")
    rules = tmp_path / "rules.json"
    assert main(["play", "--opponent", "self", "--games", "1", "--max-plies", "5", "--threads", "1",
                 "--out", str(rules)]) == 0  # --world rules, the default: no world totals
    assert "world" not in json.loads(rules.read_text()) and "world" not in json.loads(rules.read_text())["per_game"][0]


@pytest.mark.parametrize("flags, named", [
    (["--world", "model", "--avoid-repetition", "1"], "--avoid-repetition 1: the model's world has no game history"),
    (["--world", "model", "--opponent", "model", "--opponent-avoid-repetition", "0.5"],
     "--opponent-avoid-repetition 0.5: the model's world has no game history"),
])
def test_bad_world_flags_are_one_line_errors(flags, named, capsys):
    if "--opponent" not in flags:
        flags = [*flags, "--opponent", "self"]
    assert main(["play", *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"rookworld play: error: {named}") and error.count("\n") == 1


def test_eval_refuses_world_games_with_predictions_and_below_0(tmp_path, capsys):
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"prompt": "P: " + START, "completion": "x"}) + "\n")
    assert main(["eval", "--predictions", str(predictions), "--world-games", "2"]) == 2
    assert "leave out --model, --split, --self-play and --world-games" in capsys.readouterr().err
    assert main(["eval", "--world-games", "-1", "--threads", "1"]) == 2
    assert capsys.readouterr().err == "rookworld eval: error: invalid EvalConfig: world_games must be >= 0, got -1\n"
