"""Rollout setup: the completion limits each task samples with, on the embedded data and tokenizer."""

from __future__ import annotations

import pytest

from rookworld import rollout, train
from rookworld.errors import UserError
from rookworld.hub import resolve_default_model
from rookworld.tokenizer import Tokenizer


@pytest.mark.integration
def test_default_completion_limits_must_fit_the_context_as_given_ones_do():
    cfg = train.TrainConfig(data="embedded", threads=1, processes=1)
    tokenizer, rows = Tokenizer.from_dir(resolve_default_model()), train.load_data(cfg)[0]
    samples = [s for s in rows if s.task == "P"][:300] + [s for s in rows if s.task == "A"][:300]
    defaults = rollout.completion_limits({}, tokenizer, samples, 320)  # the embedded model's context
    longest = max(map(len, tokenizer.encode_prompts([s.prompt for s in samples if s.task == "A"])))
    context = longest + defaults["A"] - 1  # one position short of the default A limit
    short_p = {"P": 8}
    with pytest.raises(UserError, match=f"^default --max-new-tokens-a {defaults['A']}: the longest A prompt has "
                                        f"{longest} tokens and the model's context is {context}; use at most "
                                        f"{defaults['A'] - 1}$"):
        rollout.completion_limits(short_p, tokenizer, samples, context)
    fitting = {**short_p, "A": defaults["A"] - 1}  # what the error says to pass
    assert rollout.completion_limits(fitting, tokenizer, samples, context) == {"P": 8, "A": defaults["A"] - 1}


@pytest.mark.integration
def test_the_longest_prompt_is_bounded_by_its_bytes_only_where_the_bound_leaves_room():
    tokenizer = Tokenizer.from_dir(resolve_default_model())
    samples = train.load_data(train.TrainConfig(data="embedded", threads=1, processes=1))[0][:500]
    prompts = [s.prompt for s in samples]
    exact = max(map(len, tokenizer.encode_prompts(prompts)))
    bound = max(len(p.encode()) + 1 for p in prompts)
    assert bound >= exact
    assert rollout.longest_prompt(tokenizer, prompts, room=bound) == bound  # fits: no prompt encoded
    assert rollout.longest_prompt(tokenizer, prompts, room=bound - 1) == exact  # may not fit: counted exactly
