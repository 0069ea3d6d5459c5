"""A prompts from the policy's own games (`rookworld train --a-source play|mix`)."""

from __future__ import annotations

import functools

import chess
import pytest
import torch
from test_train import records, straight_and_resumed, tiny_config, tiny_run_inputs, weights  # noqa: F401

from rookworld import grpo, train
from rookworld.arbiter import a_target, transition
from rookworld.data.batches import TaskSampler
from rookworld.data.sources import load_source
from rookworld.errors import UserError
from rookworld.generation import SamplingSettings
from rookworld.played import GAMES, Games, PlayedSampler
from rookworld.runtime import Dist
from rookworld.text import parse_a_prompt


@functools.cache
def _embedded():
    from rookworld.hub import load_model, resolve_default_model

    policy, tokenizer = load_model(str(resolve_default_model()))
    return policy, tokenizer, load_source("embedded", "train").samples[::50]


def _games(seed: int = 0) -> Games:
    policy, tokenizer, samples = _embedded()
    return Games(samples, policy, tokenizer, SamplingSettings(1.0, max_new_tokens=120), seed, Dist())


def test_each_played_prompt_asks_about_the_policys_move_and_the_game_goes_on_from_the_arbiters_answer():
    games = _games()
    starts = {parse_a_prompt(prompt).fen for prompt in games.starts}
    before = list(games.games)
    samples = games.next(GAMES)  # every game moved once
    ended = 0
    for sample, (fen, history), (next_fen, next_history) in zip(samples, before, games.games):
        asked = parse_a_prompt(sample.prompt)
        assert asked.fen == fen and asked.history == [*history, asked.move][-10:]
        truth = transition(fen, asked.move, asked.history)
        assert sample.target == a_target(truth) and sample.meta["source"] == "play"
        if truth.reward == "-1.0" or truth.terminated or truth.truncated:
            ended += 1
            assert next_fen in starts  # begun again at a data position
        else:
            assert (next_fen, next_history) == (truth.fen, asked.history)  # played on from the arbiter's answer
    assert 0 < ended < len(samples)  # the sampled B: moves include illegal ones, and legal ones go on


def test_a_completion_without_a_usable_move_falls_back_to_its_first_candidate_then_a_random_legal_move():
    games = _games()
    fen = chess.STARTING_FEN
    asked = lambda completion: parse_a_prompt(games._ask(fen, [], completion).prompt).move  # noqa: E731
    assert asked("M: e2e4 d2d4 E: 0.3 0.2 B: e2e5") == "e2e5"  # illegal, asked about as written
    assert games._ask(fen, [], "B: e2e5").target == f"{fen}+-1.0+0+1"
    assert asked("M: g1f3 d2d4 E: 0.3 0.2 B: zz") == "g1f3"
    assert asked("nothing here") in {move.uci() for move in chess.Board().legal_moves}


@pytest.mark.parametrize("source", ["play", "mix"])
def test_the_played_sampler_keeps_the_data_p_prompts_and_plays_its_a_prompts(source):
    policy, tokenizer, samples = _embedded()
    plain = TaskSampler(samples, 0.5, seed=3)
    data = [plain.next(6) for _ in range(3)]
    played = PlayedSampler(TaskSampler(samples, 0.5, seed=3), _games(), source)
    batches = [played.next(6) for _ in range(3)]
    a_flags = []
    for mine, theirs in zip(batches, data):
        assert [s.task for s in mine] == [s.task for s in theirs]
        assert [s for s in mine if s.task == "P"] == [s for s in theirs if s.task == "P"]
        a_flags += [s.meta.get("source") == "play" for s in mine if s.task == "A"]
    assert a_flags == ([True] * len(a_flags) if source == "play" else [n % 2 == 1 for n in range(len(a_flags))])


def test_a_restored_sampler_draws_what_the_saved_one_would_have():
    _, _, samples = _embedded()
    first = PlayedSampler(TaskSampler(samples, 0.5, seed=1), _games(1), "mix")
    first.next(12)
    state = first.state_dict()
    again = PlayedSampler(TaskSampler(samples, 0.5, seed=1), _games(1), "mix")
    again.load_state_dict(state)
    assert [s.prompt for s in again.next(12)] == [s.prompt for s in first.next(12)]


def test_no_a_prompt_in_the_data_is_a_clear_error():
    policy, tokenizer, samples = _embedded()
    with pytest.raises(UserError, match="none of its 3 samples is an A prompt; use --a-source data"):
        Games([s for s in samples if s.task == "P"][:3], policy, tokenizer, SamplingSettings(1.0), 0, Dist())


@pytest.mark.stockfish
def test_a_played_run_resumes_bit_identical_and_refuses_another_source(tiny_run_inputs, tmp_path):  # noqa: F811
    gcfg = grpo.GRPOConfig(beta=0.05, entropy_coef=0.01)
    straight, resumed = straight_and_resumed(tiny_run_inputs, tmp_path, gcfg, 3, 2, a_source="play",
                                             checkpoint_every=1)
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["reward/A"] for r in records(straight)] == [r["reward/A"] for r in records(resumed)]
    model_dir, data = tiny_run_inputs
    with pytest.raises(UserError, match="drew its A prompts with --a-source play, this run with --a-source data"):
        train.main(tiny_config(model_dir, data, resumed, steps=4), gcfg, resume=str(resumed))
