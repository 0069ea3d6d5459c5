"""One GRPO step's groups: prompts sampled G times in chunks (one prefill per prompt), scored while the next
chunk samples, and zero-std groups replaced by new prompts (`collect`).

Completions of chunk c at step s come from a generator seeded by (seed, s, c), so a step is reproducible
from the run state alone and ranks under torchrun sample exactly what one process would (they split the
chunks).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from rookworld.data.record import Sample
from rookworld.evaluate import label_drafts, max_new_tokens
from rookworld.generation import FastDecoder, Generation, SamplingSettings, check_room, decoding, generate_groups
from rookworld.rewards import RewardConfig, Score, reweigh, score_batch, weights_at
from rookworld.runtime import Dist, gather_indexed

if TYPE_CHECKING:
    from rookworld.train import TrainConfig


@dataclass
class Group:
    """One prompt's G completions: the unit of sampling, scoring, advantages and distribution."""

    sample: Sample
    sequences: torch.Tensor       # (G, T) prompt (left-padded to its chunk) + completion
    attention_mask: torch.Tensor  # (G, T)
    completion_mask: torch.Tensor  # (G, T)
    logprobs: torch.Tensor        # (G, T) sampling log-probs of the completion tokens (at `temperature`)
    finished: torch.Tensor        # (G,) ended with EOS
    completions: list[str]
    rewards: list[float]
    components: list[dict[str, float]]
    temperature: float            # of the distribution that sampled it: log-probs are taken at it


@dataclass
class GroupSummary:
    """What every rank needs of every group (advantages, resampling, step metrics); the tensors of a
    group stay on the rank that sampled it."""

    task: str
    rewards: list[float]
    components: list[dict[str, float]]
    lengths: list[int]
    truncated: list[bool]

    @classmethod
    def of(cls, g: Group) -> GroupSummary:
        return cls(g.sample.task, g.rewards, g.components, g.completion_mask.sum(1).tolist(),
                   (~g.finished).tolist())

    @property
    def zero_std(self) -> bool:
        return max(self.rewards) == min(self.rewards)


def chunk_generator(seed: int, step: int, chunk: int, device: torch.device) -> torch.Generator:
    state = np.random.SeedSequence([seed, step, chunk]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state) & (2**63 - 1))


def chunk_size(cfg: TrainConfig, d: Dist) -> int:
    return cfg.rollout_chunk or math.ceil(cfg.batch_size / d.world)


def completion_limits(cfg: TrainConfig, tokenizer, samples: list[Sample], context: int) -> dict[str, int]:
    """Max new tokens per task: the flags, else the longest target of the task + margin. Either must leave
    the longest prompt of its task room in the model's `context` (a model with a short one needs the flags)."""
    found = max_new_tokens(tokenizer, samples)
    limits = {}
    for task, given in (("P", cfg.max_new_tokens_p), ("A", cfg.max_new_tokens_a)):
        flag = f"--max-new-tokens-{task.lower()}"
        limits[task] = found.get(task, 1) if given is None else given
        check_room(flag if given is not None else f"default {flag}", limits[task], f"{task} prompt",
                   longest_prompt(tokenizer, [s.prompt for s in samples if s.task == task], context - limits[task]),
                   context)
    return limits


def longest_prompt(tokenizer, prompts: list[str], room: int) -> int:
    """The token count of the longest of `prompts` (with the EOS before each), or a bound on it within `room`:
    a FEN-view tokenizer is byte level, so a prompt is at most its bytes + 1 tokens, and counting exactly
    means encoding every prompt (seconds for the embedded set's 120,000)."""
    if tokenizer.view == "fen":
        bound = max((len(prompt.encode()) + 1 for prompt in prompts), default=0)
        if bound <= room:
            return bound
    return max(map(len, tokenizer.encode_prompts(prompts)), default=0)


def sampling_settings(cfg: TrainConfig, limits: dict[str, int], task: str) -> SamplingSettings:
    if task == "P":
        return SamplingSettings(cfg.temperature_p, top_p=cfg.top_p_p, max_new_tokens=limits["P"])
    return SamplingSettings(cfg.temperature_a, top_p=cfg.top_p_a, max_new_tokens=limits["A"])


@torch.no_grad()
def sample_chunk(policy, tokenizer, samples: list[Sample], cfg: TrainConfig, limits: dict[str, int],
                 generator: torch.Generator,
                 decoder: FastDecoder | None = None) -> tuple[Generation, list[str], list[SamplingSettings]]:
    """G completions of each prompt of one chunk (by `decoder`, the CUDA fast path, when given): the
    generation, its texts and each prompt's sampling settings."""
    ids = tokenizer.encode_prompts([s.prompt for s in samples])
    settings = [sampling_settings(cfg, limits, s.task) for s in samples]
    runner, step = decoding(policy, decoder)
    drafts = label_drafts(tokenizer, samples) if cfg.draft_a else None
    gen = generate_groups(runner, ids, cfg.group_size, settings, eos_id=tokenizer.eos_id, generator=generator,
                          decode_step=step, drafts=drafts)
    return gen, tokenizer.decode_batch(gen.completions()), settings


def score_chunk(samples: list[Sample], texts: list[str], cfg: TrainConfig, pool,
                rcfg: RewardConfig | None) -> tuple[list[Score], float]:
    """The rewards of one chunk's completions (texts[i] answers samples[i // G]) and the seconds they took."""
    t0 = time.perf_counter()
    G = cfg.group_size
    truth = [s.analysis if cfg.p_truth == "stored" else None for s in samples]  # None: score_batch searches it
    items = [(samples[i // G].prompt, text, truth[i // G]) for i, text in enumerate(texts)]
    scores = score_batch(items, pool if cfg.engine_rewards else None, rcfg)
    return scores, time.perf_counter() - t0


def chunk_groups(samples: list[Sample], gen: Generation, texts: list[str], settings: list[SamplingSettings],
                 scores: list[Score], G: int) -> list[Group]:
    """The chunk's groups from `score_chunk`'s scores: G per prompt."""
    groups = []
    for b, sample in enumerate(samples):
        rows = slice(b * G, (b + 1) * G)
        groups.append(Group(sample, gen.sequences[rows], gen.attention_mask[rows], gen.completion_mask[rows],
                            gen.logprobs[rows], gen.finished[rows], texts[rows], [s.reward for s in scores[rows]],
                            [s.components for s in scores[rows]], settings[b].temperature))
    return groups


def rollout(policy, tokenizer, samples: list[Sample], cfg: TrainConfig, limits: dict[str, int], step: int,
            first_chunk: int, pool, d: Dist, timings: dict[str, float],
            rcfg: RewardConfig | None = None, decoder: FastDecoder | None = None) -> list[Group | None]:
    """Groups of all prompts, in order; this rank fills the chunks c with c % world == rank, others None.

    A chunk is scored on a second thread while the next one is sampled (Stockfish works in its own
    processes meanwhile): `time/reward` is the wait for scores after the last chunk is sampled, the part
    on the step's critical path; `time/reward_total` the scoring's own time."""
    device = policy.wte.weight.device
    size = chunk_size(cfg, d)
    rcfg = rcfg or RewardConfig()
    warmup = weights_at(rcfg, step) if step < rcfg.reward_warmup_steps else None  # the step's reward weights
    groups: list[Group | None] = [None] * len(samples)
    pending = []
    with ThreadPoolExecutor(max_workers=1) as scorer:
        for c, start in enumerate(range(0, len(samples), size)):
            chunk = first_chunk + c
            if chunk % d.world != d.rank:
                continue
            part = samples[start:start + size]
            t0 = time.perf_counter()
            gen, texts, settings = sample_chunk(policy, tokenizer, part, cfg, limits,
                                                chunk_generator(cfg.seed, step, chunk, device), decoder)
            _add_time(timings, "time/generate", time.perf_counter() - t0)
            pending.append((start, part, gen, texts, settings, scorer.submit(score_chunk, part, texts, cfg, pool,
                                                                             rcfg)))
        for start, part, gen, texts, settings, future in pending:
            t0 = time.perf_counter()
            scores, seconds = future.result()
            _add_time(timings, "time/reward", time.perf_counter() - t0)
            _add_time(timings, "time/reward_total", seconds)
            made = chunk_groups(part, gen, texts, settings, scores, cfg.group_size)
            if warmup:  # the reward warm-up: the same components under the step's weights
                made = [reweighed(g, warmup[g.sample.task]) for g in made]
            groups[start:start + len(part)] = made
    return groups


def reweighed(g: Group, weights: dict[str, float]) -> Group:
    """The group's rewards from the same components under other weights."""
    return replace(g, rewards=[reweigh(c, weights) for c in g.components])


def _add_time(timings: dict[str, float], name: str, seconds: float) -> None:
    timings[name] = timings.get(name, 0.0) + seconds


def shared_summaries(groups: list[Group | None], d: Dist) -> list[GroupSummary]:
    """Every group's summary on every rank: a rank without groups still learns the step's rewards."""
    merged = gather_indexed({i: GroupSummary.of(g) for i, g in enumerate(groups) if g is not None}, d)
    return [merged[i] for i in range(len(groups))]


def collect(policy, tokenizer, sampler, samples: list[Sample], cfg: TrainConfig, limits: dict[str, int], step: int,
            pool, d: Dist, timings: dict[str, float], rcfg: RewardConfig | None = None,
            decoder: FastDecoder | None = None) -> tuple[list[Group | None], list[GroupSummary]]:
    """One step's groups (this rank's; None where another rank holds one) and all their summaries. With
    zero_std 'resample', groups whose G rewards are equal are replaced by groups of new prompts (up to
    resample_rounds rounds); a replacement lives on the rank that sampled it. With overfit_single_batch
    nothing is replaced: every step trains on the one batch, its zero-std groups dropped as with 'drop'."""
    groups = rollout(policy, tokenizer, samples, cfg, limits, step, 0, pool, d, timings, rcfg, decoder)
    summaries = shared_summaries(groups, d)
    size = chunk_size(cfg, d)
    chunks = math.ceil(len(samples) / size)
    resamples = cfg.zero_std == "resample" and not cfg.overfit_single_batch
    for _ in range(cfg.resample_rounds if resamples else 0):
        flat = [i for i, s in enumerate(summaries) if s.zero_std]
        if not flat:
            break
        extra = sampler.next(len(flat))
        new_groups = rollout(policy, tokenizer, extra, cfg, limits, step, chunks, pool, d, timings, rcfg, decoder)
        chunks += math.ceil(len(extra) / size)
        for i, g, summary in zip(flat, new_groups, shared_summaries(new_groups, d)):
            if not summary.zero_std:
                groups[i], summaries[i] = g, summary
    return groups, summaries


