"""Field credit: each field of a P completion is credited with its own reward component (credit.py, train)."""

from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES

from rookworld import credit, grpo, rollout, text, train
from rookworld.data.record import Sample
from rookworld.rewards import DEFAULT_CONFIG, reweigh
from rookworld.tokenizer import Tokenizer

WEIGHTS = DEFAULT_CONFIG.p_weights  # best_move 0.5, candidates 0.2, evals 0.2, format 0.1
COMPLETION = "  M: e2e4 d2d4  E: 0.3 0.1  B: e2e4"


def test_field_rewards_blend_each_component_with_format():
    components = {"best_move": 1.0, "candidates": 0.0, "evals": 0.5, "format": 1.0}
    assert credit.field_rewards(components, WEIGHTS) == pytest.approx([0.1 / 0.3, 0.2 / 0.3, 0.6 / 0.6])
    no_format = {**WEIGHTS, "format": 0.0, "candidates": 0.0, "best_move": 0.7}
    assert credit.field_rewards(components, no_format) == pytest.approx([0.0, 0.5, 1.0])  # a field of weight 0: 0


def test_token_fields_split_at_the_markers():
    starts = list(range(len(COMPLETION) + 1))  # one token per character, then EOS
    fields = credit.token_fields(COMPLETION, starts)
    e, b = COMPLETION.index("E:"), COMPLETION.index("B:")
    assert fields == [0] * e + [1] * (b - e) + [2] * (len(COMPLETION) - b + 1)  # padding with M:, EOS with B:
    assert credit.token_fields("  M: e2e4  E: 0.3", starts) is None
    assert credit.token_fields(COMPLETION.replace("e2e4", "e2é4"), starts) is None  # not ASCII: no offsets


def _group(tokenizer: Tokenizer, sample: Sample, completions: list[str], components: list[dict]) -> rollout.Group:
    """A group as sampling leaves it: prompt ids, completion ids + EOS, right-padded, masks."""
    prompt = tokenizer.encode_prompts([sample.prompt])[0]
    rows = [tokenizer.encode(c) + [tokenizer.eos_id] for c in completions]
    width = len(prompt) + max(map(len, rows))
    sequences = torch.zeros(len(rows), width, dtype=torch.long)
    completion_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        sequences[i, :len(prompt) + len(row)] = torch.tensor(prompt + row)
        completion_mask[i, len(prompt):len(prompt) + len(row)] = True
    return rollout.Group(sample, sequences, completion_mask | (sequences != 0), completion_mask,
                       torch.zeros(len(rows), width), torch.ones(len(rows), dtype=torch.bool), completions,
                       [reweigh(c, WEIGHTS) if "best_move" in c else c["r"] for c in components], components, 1.0)


@pytest.mark.parametrize("name", ["char", "gpt2"])
def test_each_field_of_a_p_completion_gets_its_own_components_advantage(name, gpt2_tokenizer):
    lines = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()
    tokenizer = Tokenizer.train_chess(lines, vocab_size=257) if name == "char" else gpt2_tokenizer
    task, prompt, target = text.split_line(lines[0])
    p = Sample(task, prompt, target)
    completions = [COMPLETION, COMPLETION.replace("B: e2e4", "B: d2d4"), COMPLETION, "garbage"]
    components = [{"best_move": 1.0, "candidates": 0.5, "evals": 0.2, "format": 1.0},
                  {"best_move": 0.2, "candidates": 0.5, "evals": 0.9, "format": 1.0},
                  {"best_move": 0.6, "candidates": 0.5, "evals": 0.5, "format": 1.0},
                  {"best_move": -0.25, "candidates": 0.0, "evals": 0.0, "format": -1.0}]
    a = Sample("A", "A: 8/8/8/8/8/8/8/K6k w - - 0 1+a1a2+a1a2+", "x")
    groups = [_group(tokenizer, p, completions, components),
              _group(tokenizer, a, ["x", "y", "x", "z"], [{"r": r} for r in (1.0, 0.0, 1.0, 0.5)])]
    summaries = [rollout.GroupSummary.of(g) for g in groups]
    gcfg = grpo.GRPOConfig(credit="field")
    adv = train.step_advantages(summaries, gcfg, None)
    tokens = train.group_advantages(groups, [0, 1], summaries, adv, gcfg, WEIGHTS, tokenizer, torch.device("cpu"))
    p_tokens, a_tokens = (t[g.completion_mask] for t, g in zip(tokens, groups))
    sizes = groups[0].completion_mask.sum(1).tolist()
    per_row = p_tokens.split(sizes)

    def field_values(row: int, marker: str) -> set[float]:  # the advantages of the tokens of one field
        ids = groups[0].sequences[row][groups[0].completion_mask[row]].tolist()
        owner = credit.token_fields(completions[row], tokenizer.token_starts(ids))
        return {float(v) for v, f in zip(per_row[row], owner) if f == text.P_MARKERS.index(marker)}

    # B: rewards (0.5 b + 0.1 f) / 0.6 = 1, 1/3, 2/3, -0.375: mean 0.40625, unbiased std 0.58766
    (best,) = field_values(0, "B:")
    assert best == pytest.approx(0.59375 / 0.587661, abs=1e-4)
    b_adv = [field_values(r, "B:").pop() for r in range(3)]
    e_adv = [field_values(r, "E:").pop() for r in range(3)]
    assert b_adv[0] > b_adv[2] > b_adv[1] and e_adv[1] > e_adv[2] > e_adv[0]  # by best_move, and by evals
    assert len({field_values(r, "M:").pop() for r in range(3)}) == 1  # equal candidates and format: equal credit
    assert set(per_row[3].tolist()) == {float(adv.values[0, 3])}  # no fields: the sequence's advantage
    assert a_tokens.tolist() == adv.values[1].repeat_interleave(groups[1].completion_mask.sum(1)).tolist()

    batch = train.Batch.of(groups, tokens)  # per-token advantages follow their tokens into the batch
    assert torch.equal(batch.advantages[batch.completion_mask], torch.cat([p_tokens, a_tokens]))
    sequence = train.group_advantages(groups, [0, 1], summaries, adv, grpo.GRPOConfig(), WEIGHTS, tokenizer,
                                      torch.device("cpu"))
    assert [t.tolist() for t in sequence] == adv.values.tolist()
