"""The first-candidate readout: each legal move's score is the model's log-probability of writing it first after
`M: ` and ending it there (checked against a plain forward pass, with the embedded char-level model and with
GPT-2's BPE, whose tokens merge a move with the space before it); the player plays the best-scored move, legal by
construction, in `rookworld play` and `rookworld uci`."""

import io
import json
import math

import chess
import pytest
import torch

from rookworld.cli import main
from rookworld.hub import load_model, resolve_default_model
from rookworld.player import ModelPlayer, choose_first
from rookworld.readout import best_first_candidate, first_candidate_prefix, first_candidate_scores, word_start_ids
from rookworld.uci import serve

POSITIONS = [chess.Board(),
             chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"),
             chess.Board("8/P7/8/8/8/8/6k1/4K3 w - - 0 1")]  # promotions: e.g. a7a8q and a7a8n, never a7a8


@pytest.fixture(scope="module")
def embedded():
    model, tokenizer = load_model(resolve_default_model(), device="cpu")
    return model.eval(), tokenizer


def _by_full_forward(model, tokenizer, board: chess.Board, move: chess.Move) -> float:
    """log p(move's tokens, then a token starting a new word | prefix), from one unshared forward pass."""
    prefix = first_candidate_prefix(board.fen())
    ids = tokenizer.encode_prompts([prefix + move.uci()])[0]
    others = [tokenizer.encode_prompts([prefix + m.uci()])[0] for m in board.legal_moves]
    start = min(next((i for i, (a, b) in enumerate(zip(ids, o)) if a != b), len(ids)) for o in others if o != ids)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).float(), -1)[0]
    written = sum(float(logprobs[i - 1, ids[i]]) for i in range(start, len(ids)))
    return written + float(torch.logsumexp(logprobs[-1, word_start_ids(tokenizer)], 0))


def test_scores_are_the_models_log_probabilities_of_each_first_candidate(embedded):
    model, tokenizer = embedded
    scores = first_candidate_scores(model, tokenizer, POSITIONS)
    for board, scored in zip(POSITIONS, scores):
        assert list(scored) == list(board.legal_moves)
        for move in list(board.legal_moves)[:6]:
            assert scored[move] == pytest.approx(_by_full_forward(model, tokenizer, board, move), abs=1e-4)
        # moves are prefix-free once ended, so their probabilities are disjoint events: they sum to at most 1
        assert sum(math.exp(s) for s in scored.values()) <= 1 + 1e-5
    # the trained model puts most of its first-candidate mass on legal moves in the opening
    assert sum(math.exp(s) for s in scores[0].values()) > 0.5


def test_scores_with_gpt2_bpe_merge_the_space_into_the_move(tiny_gpt, gpt2_tokenizer):
    model = tiny_gpt(seed=1, vocab_size=gpt2_tokenizer.vocab_size, n_positions=128)
    board = POSITIONS[1]
    ends = word_start_ids(gpt2_tokenizer)
    assert len(ends) > 1000 and gpt2_tokenizer.decode([int(ends[0])])[:1].isspace()
    scored = first_candidate_scores(model, gpt2_tokenizer, [board], ends)[0]
    for move in list(board.legal_moves)[:4]:
        assert scored[move] == pytest.approx(_by_full_forward(model, gpt2_tokenizer, board, move), abs=1e-4)


def test_the_best_scored_move_is_played_and_a_repetition_avoided_only_when_ahead():
    board = chess.Board()
    for move in ("g1f3", "g8f6", "f3g1", "f6g8"):  # back at the start: g1f3 now repeats a position
        board.push_uci(move)
    g1f3, e2e4, d2d4 = (chess.Move.from_uci(m) for m in ("g1f3", "e2e4", "d2d4"))
    scores = {e2e4: -2.0, g1f3: -0.5, d2d4: -1.0}
    assert best_first_candidate(scores) == g1f3
    assert best_first_candidate({e2e4: -1.0, d2d4: -1.0}) == e2e4  # a tie: the first listed
    assert best_first_candidate(scores, keep=lambda m: m != g1f3) == d2d4
    assert choose_first(board, scores).move == g1f3  # no rule: the repetition stands
    ahead, behind = "M: g1f3 E: 1.5 B: g1f3", "M: g1f3 E: 0.2 B: g1f3"
    avoided = choose_first(board, scores, ahead, avoid_repetition=1.0)
    assert (avoided.move, avoided.avoided, avoided.own) == (d2d4, g1f3, True)
    assert choose_first(board, scores, behind, avoid_repetition=1.0).move == g1f3


def test_the_player_reads_the_first_candidate_and_never_plays_an_illegal_move(embedded):
    model, tokenizer = embedded
    first = ModelPlayer(model, tokenizer, readout="first")
    choices = first.choose(POSITIONS)
    scores = first_candidate_scores(model, tokenizer, POSITIONS)
    assert [c.move for c in choices] == [max(s, key=s.get) for s in scores]
    assert all(c.own and c.move in b.legal_moves for c, b in zip(choices, POSITIONS))
    with pytest.raises(ValueError, match="readout 'argmax': use one of b, first"):
        ModelPlayer(model, tokenizer, readout="argmax")


def test_play_with_the_readout_records_it_and_plays_no_illegal_move(tmp_path, capsys):
    out = tmp_path / "games.json"
    assert main(["play", "--opponent", "random", "--games", "2", "--max-plies", "16", "--readout", "first",
                 "--threads", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["settings"]["readout"] == "first" and results["illegal_rate"] == 0.0
    greedy = tmp_path / "greedy.json"
    assert main(["play", "--opponent", "random", "--games", "2", "--max-plies", "16", "--threads", "1",
                 "--out", str(greedy)]) == 0
    assert json.loads(greedy.read_text())["settings"]["readout"] == "b"
    assert main(["play", "--opponent", "random", "--opponent-readout", "first", "--games", "2"]) == 2
    assert "--opponent-readout first: sets the opponent of --opponent model" in capsys.readouterr().err


def test_uci_offers_the_readout_as_an_option_and_plays_it(embedded):
    model, tokenizer = embedded
    player = ModelPlayer(model, tokenizer, fallback="listed", votes=8)
    out = io.StringIO()
    serve(player, "test", io.StringIO("uci\nsetoption name Readout value first\nsetoption name Readout value x\n"
                                      "position fen " + POSITIONS[1].fen() + "\ngo depth 1\n"), out)
    lines = out.getvalue().splitlines()
    assert "option name Readout type combo default b var b var first" in lines
    assert "info string ignored setoption Readout 'x': give one of b, first" in lines
    expected = best_first_candidate(first_candidate_scores(model, tokenizer, [POSITIONS[1]])[0])
    assert lines[-1] == f"bestmove {expected.uci()}" and player.readout == "first"
