"""One GRPO step's groups: prompts sampled G times in chunks (one prefill per prompt), scored while the next
chunk samples, and zero-std groups replaced by new prompts (`collect`); this rank's groups packed for the
update (`Batch`).

Completions of chunk c at step s come from a generator seeded by (seed, s, c), so a step is reproducible
from the run state alone and ranks under torchrun sample exactly what one process would (they split the
chunks).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from rookworld.data.record import Sample
from rookworld.evaluate import label_drafts, max_new_tokens
from rookworld.generation import FastDecoder, Generation, SamplingSettings, check_room, decoding, generate_groups
from rookworld.model import SharedPrompts
from rookworld.rewards import RewardConfig, Score, reweigh, score_batch, weights_at
from rookworld.runtime import Dist, gather_indexed


@dataclass(frozen=True)
class RolloutConfig:
    """How a step's groups are sampled and scored (`step.rollout_config` builds it from a run's config)."""

    seed: int
    group_size: int                       # G completions per prompt
    chunk: int                            # prompts per generation call and random stream
    settings: dict[str, SamplingSettings]  # per task ('P', 'A'): temperature, top-p, max new tokens
    draft_a: bool = True                  # A rows sampled speculatively with the label as the draft
    stored_truth: bool = True             # P scored against the data's analysis (False: a search of each prompt)
    engine_rewards: bool = True           # P moves outside the analysis evaluated by Stockfish
    resample_rounds: int = 0              # rounds that replace zero-std groups with new prompts (0: none)
    reward: RewardConfig = field(default_factory=RewardConfig)


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


def completion_limits(given: dict[str, int | None], tokenizer, samples: list[Sample], context: int) -> dict[str, int]:
    """Max new tokens per task: `given` ('P', 'A': a flag's value or None), else the longest target of the task +
    margin. Either must leave the longest prompt of its task room in the model's `context` (a model with a short
    one needs the flags)."""
    found = max_new_tokens(tokenizer, samples)
    limits = {}
    for task in ("P", "A"):
        given_task = given.get(task)
        flag = f"--max-new-tokens-{task.lower()}"
        limits[task] = found.get(task, 1) if given_task is None else given_task
        check_room(flag if given_task is not None else f"default {flag}", limits[task], f"{task} prompt",
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


@torch.no_grad()
def sample_chunk(policy, tokenizer, samples: list[Sample], cfg: RolloutConfig, generator: torch.Generator,
                 decoder: FastDecoder | None = None) -> tuple[Generation, list[str], list[SamplingSettings]]:
    """G completions of each prompt of one chunk (by `decoder`, the CUDA fast path, when given): the
    generation, its texts and each prompt's sampling settings."""
    ids = tokenizer.encode_prompts([s.prompt for s in samples])
    settings = [cfg.settings[s.task] for s in samples]
    runner, step = decoding(policy, decoder)
    drafts = label_drafts(tokenizer, samples) if cfg.draft_a else None
    gen = generate_groups(runner, ids, cfg.group_size, settings, eos_id=tokenizer.eos_id, generator=generator,
                          decode_step=step, drafts=drafts)
    return gen, tokenizer.decode_batch(gen.completions()), settings


def score_chunk(samples: list[Sample], texts: list[str], cfg: RolloutConfig, pool) -> tuple[list[Score], float]:
    """The rewards of one chunk's completions (texts[i] answers samples[i // G]) and the seconds they took."""
    t0 = time.perf_counter()
    G = cfg.group_size
    truth = [s.analysis if cfg.stored_truth else None for s in samples]  # None: score_batch searches it
    items = [(samples[i // G].prompt, text, truth[i // G]) for i, text in enumerate(texts)]
    scores = score_batch(items, pool if cfg.engine_rewards else None, cfg.reward)
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


def rollout(policy, tokenizer, samples: list[Sample], cfg: RolloutConfig, step: int, first_chunk: int, pool,
            d: Dist, timings: dict[str, float], decoder: FastDecoder | None = None) -> list[Group | None]:
    """Groups of all prompts, in order; this rank fills the chunks c with c % world == rank, others None.

    A chunk is scored on a second thread while the next one is sampled (Stockfish works in its own
    processes meanwhile): `time/reward` is the wait for scores after the last chunk is sampled, the part
    on the step's critical path; `time/reward_total` the scoring's own time."""
    device = policy.wte.weight.device
    size = cfg.chunk
    warmup = weights_at(cfg.reward, step) if step < cfg.reward.reward_warmup_steps else None  # the step's weights
    groups: list[Group | None] = [None] * len(samples)
    pending = []
    with ThreadPoolExecutor(max_workers=1) as scorer:
        for c, start in enumerate(range(0, len(samples), size)):
            chunk = first_chunk + c
            if chunk % d.world != d.rank:
                continue
            part = samples[start:start + size]
            t0 = time.perf_counter()
            generator = chunk_generator(cfg.seed, step, chunk, device)
            gen, texts, settings = sample_chunk(policy, tokenizer, part, cfg, generator, decoder)
            _add_time(timings, "time/generate", time.perf_counter() - t0)
            pending.append((start, part, gen, texts, settings, scorer.submit(score_chunk, part, texts, cfg, pool)))
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


def collect(policy, tokenizer, sampler, samples: list[Sample], cfg: RolloutConfig, step: int, pool, d: Dist,
            timings: dict[str, float],
            decoder: FastDecoder | None = None) -> tuple[list[Group | None], list[GroupSummary]]:
    """One step's groups (this rank's; None where another rank holds one) and all their summaries. Groups whose
    G rewards are equal are replaced by groups of new prompts from `sampler`, up to cfg.resample_rounds rounds;
    a replacement lives on the rank that sampled it."""
    groups = rollout(policy, tokenizer, samples, cfg, step, 0, pool, d, timings, decoder)
    summaries = shared_summaries(groups, d)
    chunks = math.ceil(len(samples) / cfg.chunk)
    for _ in range(cfg.resample_rounds):
        flat = [i for i, s in enumerate(summaries) if s.zero_std]
        if not flat:
            break
        extra = sampler.next(len(flat))
        new_groups = rollout(policy, tokenizer, extra, cfg, step, chunks, pool, d, timings, decoder)
        chunks += math.ceil(len(extra) / cfg.chunk)
        for i, g, summary in zip(flat, new_groups, shared_summaries(new_groups, d)):
            if not summary.zero_std:
                groups[i], summaries[i] = g, summary
    return groups, summaries


def _pad_cat(tensors: list[torch.Tensor], value) -> torch.Tensor:
    """Rows of 2-D tensors of different widths, right-padded with `value` to the widest and stacked."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])


@dataclass
class Batch:
    """The sequences of this rank's groups: each group's prompt once, and N = groups * G completions.

    Sampling left-pads a chunk's prompts to one width, so a group's completions start in one column:
    the prompt is what comes before it, its real tokens moved to the front (right-padded), and the
    completions are right-padded from their first token. The update runs each prompt once and every
    completion over its group's prompt (`GPT.continuation_hidden`), instead of G copies of the prompt.
    """

    prompts: SharedPrompts
    completions: torch.Tensor      # (N, T) right-padded
    completion_mask: torch.Tensor  # (N, T) True at completion tokens: a prefix of each row
    logprobs: torch.Tensor         # (N, T) sampling log-probs: the old policy of the PPO ratio
    finished: torch.Tensor         # (N,)
    advantages: torch.Tensor       # (N,) per completion
    temperature: torch.Tensor      # (N,) each row's sampling temperature
    task_a: torch.Tensor           # (N,) bool: the row answers an A prompt

    @classmethod
    def of(cls, groups: list[Group], advantages: list[torch.Tensor]) -> Batch:
        device = groups[0].sequences.device
        starts = [int(g.completion_mask.any(0).int().argmax()) for g in groups]  # each group's first completion column
        prompts = [g.sequences[0, :start][g.attention_mask[0, :start]] for g, start in zip(groups, starts)]
        shared = SharedPrompts(_pad_cat([p[None] for p in prompts], 0),
                               torch.tensor([len(p) for p in prompts], device=device),
                               torch.cat([torch.full((len(g.completions),), i, device=device)
                                          for i, g in enumerate(groups)]))
        temperature = torch.tensor([g.temperature for g in groups for _ in g.completions], device=device)
        task_a = torch.tensor([g.sample.task == "A" for g in groups for _ in g.completions], device=device)
        return cls(shared, *(_pad_cat([getattr(g, name)[:, start:] for g, start in zip(groups, starts)], fill)
                             for name, fill in (("sequences", 0), ("completion_mask", False), ("logprobs", 0.0))),
                   torch.cat([g.finished for g in groups]), torch.cat(advantages), temperature, task_a)

    def select(self, rows: torch.Tensor) -> Batch:
        """The batch of rows `rows` (in that order) with only their prompts, both cut after their longest row."""
        used, inverse = torch.unique(self.prompts.rows[rows], return_inverse=True)
        lengths = self.prompts.lengths[used]
        width = int(self.completion_mask[rows].sum(1).max())
        prompts = SharedPrompts(self.prompts.ids[used, :int(lengths.max())], lengths, inverse)
        return Batch(prompts, self.completions[rows, :width], self.completion_mask[rows, :width],
                     self.logprobs[rows, :width], self.finished[rows], self.advantages[rows], self.temperature[rows],
                     self.task_a[rows])

    def micro_batches(self, size: int, by_length: bool = False):
        """Batches of `size` rows at a time, in batch order, or with by_length groups longest completion
        first (a group's rows stay together, so its prompt runs once): rows of a similar length share a
        micro-batch, so little padding is computed, and each micro-batch fits in the memory the larger
        one before it freed."""
        order = torch.arange(len(self.advantages), device=self.advantages.device)
        if by_length:
            lengths = self.completion_mask.sum(1)  # (N,)
            longest = torch.zeros(len(self.prompts.lengths), dtype=lengths.dtype, device=lengths.device)
            longest = longest.scatter_reduce(0, self.prompts.rows, lengths, "amax")[self.prompts.rows]  # (N,)
            order = longest.argsort(descending=True, stable=True)
        for start in range(0, len(order), size):
            yield self.select(order[start:start + size])
