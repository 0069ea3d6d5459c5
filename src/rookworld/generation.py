"""Group sampling for GRPO: one prefill per prompt, then cached decoding of its G rows.

`generate_groups` takes token ids (no tokenizer here) and returns a `Generation`: the sampled ids are
the training ids. Each prompt carries its own settings (P and A prompts sample differently in one
batch); every random draw comes from the caller's seeded `torch.Generator`.

Log-probs: `Generation.logprobs` holds the log-probs of the sampled tokens under the row's
temperature-scaled distribution over the full vocabulary (before top-k/top-p filtering, as in TRL).
That is what `model.token_logprobs(..., temperature=...)` recomputes, so old and new log-probs of a
PPO/GRPO ratio, and the KL to the reference, refer to the distribution that drew the tokens (up to the
nucleus cut); they match to float rounding (cached vs full attention).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rookworld.errors import UserError
from rookworld.model import GPT, KVCache, PromptPrefix, SharedPrompts

TARGET_MARGIN_TOKENS = 8  # room beyond a known target's length, so a near-miss completion is not cut short

CACHE_SLOT_MULTIPLE = 16
CACHE_GROWTH = 32  # slots a growing decode cache adds when full
# Below it, logits / temperature can overflow float32 (inf, then NaN probabilities and junk tokens); at it,
# sampling is already the argmax but for logits within ~1e-5 of each other.
MIN_TEMPERATURE = 1e-6

DecodeStep = Callable[[torch.Tensor, torch.Tensor, KVCache, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0
    top_k: int = 0         # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0     # keep the smallest set of tokens with this much probability; 1.0 keeps all
    max_new_tokens: int = 128

    def __post_init__(self) -> None:
        if not MIN_TEMPERATURE <= self.temperature < math.inf:
            raise ValueError(f"temperature must be finite and > 0 (at least {MIN_TEMPERATURE:g}; use greedy decoding "
                             f"for argmax), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def check_sampling(temperature: float, top_p: float, names: str) -> None:
    """ValueError that names the config fields `names` when these settings cannot sample."""
    try:
        SamplingSettings(temperature=temperature, top_p=top_p)
    except ValueError as exc:
        raise ValueError(f"{names}: {exc}") from None


def check_room(flag: str, max_new_tokens: int, prompts: str, longest: int, context: int) -> None:
    """UserError naming `flag` when `max_new_tokens` after the longest of `prompts` (its length `longest`) would
    not fit the model's context."""
    if longest + max_new_tokens > context:
        raise UserError(f"{flag} {max_new_tokens}: the longest {prompts} has {longest} tokens and the model's "
                        f"context is {context}; use at most {context - longest}")


@dataclass
class Generation:
    """N = B * G rows, row r belonging to prompt r // G; columns: the left-padded prompt (width
    `prompt_width`), then the completion, then pad after EOS (or after a row's max_new_tokens)."""

    sequences: torch.Tensor        # (N, T) long
    attention_mask: torch.Tensor   # (N, T) bool: real prompt and completion tokens
    completion_mask: torch.Tensor  # (N, T) bool: completion tokens, the final EOS included
    logprobs: torch.Tensor         # (N, T) float32: log-probs of the sampled tokens at the row's temperature
    finished: torch.Tensor         # (N,) bool: the completion ended with EOS (else it hit max_new_tokens)
    prompt_width: int
    group_size: int

    def completions(self) -> list[list[int]]:
        """Each row's completion ids without the final EOS: what the text of the completion decodes from."""
        lengths = (self.completion_mask.sum(1) - self.finished.long()).tolist()
        rows = self.sequences[:, self.prompt_width:].tolist()
        return [row[:n] for row, n in zip(rows, lengths)]


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str = "cpu", left: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists -> (ids (B, T), attention mask (B, T) bool), padded on the left (`left=False`: the right)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        if seq:
            at = slice(width - len(seq), None) if left else slice(None, len(seq))
            ids[row, at] = torch.tensor(seq, dtype=torch.long)
            mask[row, at] = True
    return ids.to(device), mask.to(device)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row (N,) drawn from probabilities (N, K) by inverting the cumulative sum with one
    uniform number per row: far cheaper on CPU than torch.multinomial over a 50k vocabulary, and exact
    up to float32 rounding of the cumulative sum (about 1e-7 per token)."""
    cumulative = probs.cumsum(-1)  # (N, K)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device) * cumulative[:, -1:]  # (N, 1)
    return torch.searchsorted(cumulative, u).squeeze(-1).clamp(max=probs.shape[1] - 1)


class _RowFilters:
    """Per-row temperature / top-k / top-p as tensors. What the batch needs is decided once, from the
    settings, so the decode loop never waits on the device: rows without filters sample from the full
    softmax; filtered rows from the top candidates (the largest top-k asked for, or the whole sorted
    vocabulary when a row has top-p without top-k)."""

    def __init__(self, settings: Sequence[SamplingSettings], vocab_size: int, device: torch.device) -> None:
        filtered = [bool(s.top_k or s.top_p < 1) for s in settings]
        self.temperature = torch.tensor([s.temperature for s in settings], device=device)[:, None]  # (N, 1)
        self.top_k = torch.tensor([s.top_k or vocab_size for s in settings], device=device)[:, None]  # (N, 1)
        self.top_p = torch.tensor([s.top_p for s in settings], device=device)[:, None]  # (N, 1)
        self.filtered = torch.tensor(filtered, device=device)  # (N,)
        self.any_filtered, self.any_unfiltered = any(filtered), not all(filtered)
        needs_sort = any(s.top_k == 0 and s.top_p < 1 for s in settings)
        self.candidates = vocab_size if needs_sort else min(max(s.top_k for s in settings), vocab_size)

    def _candidates(self, scaled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The filtered rows' candidate probabilities (N, K) and token ids (N, K), best first."""
        values, indices = scaled.topk(self.candidates, dim=-1)  # (N, K), best first
        keep = torch.arange(values.shape[1], device=values.device) < self.top_k  # (N, K)
        probs = F.softmax(values.masked_fill(~keep, float("-inf")), dim=-1)
        keep &= (probs.cumsum(-1) - probs) < self.top_p  # nucleus: the mass before a token is below top_p
        return F.softmax(values.masked_fill(~keep, float("-inf")), dim=-1), indices

    def sample(self, scaled: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """One token id per row (N,) from temperature-scaled float logits (N, V)."""
        if not self.any_filtered:
            return sample_from(F.softmax(scaled, dim=-1), generator)
        probs, indices = self._candidates(scaled)
        tokens = indices.gather(-1, sample_from(probs, generator)[:, None]).squeeze(-1)  # (N,)
        if self.any_unfiltered:
            tokens = torch.where(self.filtered, tokens, sample_from(F.softmax(scaled, dim=-1), generator))
        return tokens

    def distribution(self, scaled: torch.Tensor) -> torch.Tensor:
        """The probabilities (N, V) that `sample` draws each row's token from."""
        probs = F.softmax(scaled, dim=-1)
        if not self.any_filtered:
            return probs
        kept, indices = self._candidates(scaled)
        return torch.where(self.filtered[:, None], torch.zeros_like(probs).scatter_(-1, indices, kept), probs)


@dataclass
class _Forced:
    """The tokens each row must start with, drawn from its prompt's draft (`_drafted`)."""

    tokens: torch.Tensor  # (N, F) long: the first `count` tokens of each row, pad after
    logp: torch.Tensor    # (N, F) float32: their log-probs at the row's temperature (full vocabulary)
    count: torch.Tensor   # (N,) long: forced tokens per row (0: none)
    whole: torch.Tensor   # (N,) bool: the forced tokens are the row's whole completion (EOS or its limit)


def _drafted(model: GPT, prompt_ids: Sequence[Sequence[int]], drafts: Sequence[Sequence[int] | None],
             group_size: int, per_prompt: Sequence[SamplingSettings], eos_id: int | None, pad: int,
             generator: torch.Generator | None, greedy: bool) -> _Forced:
    """Speculative sampling with a fixed draft per prompt (e.g. its label): each of a prompt's rows takes
    the draft's tokens one by one, each with the probability the model gives it there, and at its first
    refusal draws the next token from the model's distribution without the draft's token. That is the
    model's own sampling distribution, exactly (speculative decoding with a deterministic draft): the
    chance of a token is p if it is the draft's, (1 - p) * q / (1 - p) = q if not. `greedy`: a row takes
    the draft's tokens while each is the model's argmax, then the argmax. One forward pass over the drafts
    replaces decoding for the rows that take a whole draft."""
    device = model.wte.weight.device
    N, G = len(prompt_ids) * group_size, group_size
    cut = []  # each draft to its first EOS and its prompt's token limit
    for d, s in zip(drafts, per_prompt):
        d = list(d or [])[:s.max_new_tokens]
        cut.append(d[:d.index(eos_id) + 1] if eos_id in d else d)
    drafted = [b for b, d in enumerate(cut) if d]
    width = max((len(cut[b]) for b in drafted), default=1)
    forced = _Forced(torch.full((N, width), pad, dtype=torch.long, device=device),
                     torch.zeros(N, width, device=device), torch.zeros(N, dtype=torch.long, device=device),
                     torch.zeros(N, dtype=torch.bool, device=device))
    if not drafted:
        return forced
    D = len(drafted)
    lengths = torch.tensor([len(cut[b]) for b in drafted], device=device)  # (D,)
    tokens = left_pad([cut[b] for b in drafted], pad, device, left=False)[0]  # (D, W)
    shared = SharedPrompts(left_pad([prompt_ids[b] for b in drafted], pad, device, left=False)[0],
                           torch.tensor([len(prompt_ids[b]) for b in drafted], device=device),
                           torch.arange(D, device=device))
    logits = model.lm_head(model.continuation_hidden(shared, tokens)).float()  # (D, W, V): entry t predicts token t
    settings = [per_prompt[b] for b in drafted for _ in range(width)]
    filters = _RowFilters(settings, model.config.vocab_size, device)
    scaled = logits.view(D * width, -1) / filters.temperature
    probs = filters.distribution(scaled).view(D, width, -1)
    logp_all = F.log_softmax(scaled, dim=-1).view(D, width, -1)
    logp = logp_all.gather(-1, tokens[..., None]).squeeze(-1)  # (D, W)
    in_draft = torch.arange(width, device=device) < lengths[:, None]  # (D, W)
    if greedy:
        best = probs.argmax(-1)  # (D, W)
        refused = (best != tokens)[:, None].expand(D, G, width)
    else:
        accept = probs.gather(-1, tokens[..., None]).squeeze(-1)  # (D, W): the chance of taking each draft token
        refused = torch.rand(D, G, width, generator=generator, device=device) >= accept[:, None]
    refused = refused & in_draft[:, None]
    taken = torch.where(refused.any(-1), refused.int().argmax(-1), lengths[:, None])  # (D, G): draft tokens taken
    at = taken.clamp(max=width - 1)  # the refused position (rows that took the whole draft: unused)
    prompt = torch.arange(D, device=device)[:, None]
    if greedy:
        other = best.gather(1, at)
    else:
        rest = probs[prompt, at]  # (D, G, V)
        rest.scatter_(-1, tokens.gather(1, at)[..., None], 0.0)  # the draft's token refused: the others, renormalised
        other = sample_from(rest.view(D * G, -1), generator).view(D, G)
    other_logp = logp_all[prompt, at].gather(-1, other[..., None]).squeeze(-1)  # (D, G)
    limits = torch.tensor([per_prompt[b].max_new_tokens for b in drafted], device=device)[:, None]  # (D, 1)
    rows = (torch.tensor(drafted, device=device)[:, None] * G + torch.arange(G, device=device)).view(-1)
    took_all = taken == lengths[:, None]  # (D, G)
    count = torch.where(took_all, taken, taken + 1)  # (D, G)
    position = torch.arange(width, device=device)
    at_refusal = position == taken[..., None]  # (D, G, W)
    row_tokens = torch.where(at_refusal, other[..., None], tokens[:, None])
    row_logp = torch.where(at_refusal, other_logp[..., None], logp[:, None])
    beyond = position >= count[..., None]
    forced.tokens[rows] = row_tokens.masked_fill(beyond, pad).view(D * G, width)
    forced.logp[rows] = row_logp.masked_fill(beyond, 0.0).view(D * G, width)
    forced.count[rows] = count.view(-1)
    last = row_tokens.gather(-1, (count - 1)[..., None]).squeeze(-1)  # (D, G)
    ended = (last == eos_id) if eos_id is not None else torch.zeros_like(took_all)
    forced.whole[rows] = (ended | (count >= limits)).view(-1)
    return forced


@torch.no_grad()
def generate_groups(model: GPT, prompt_ids: Sequence[Sequence[int]], group_size: int,
                    settings: SamplingSettings | Sequence[SamplingSettings], eos_id: int | None,
                    generator: torch.Generator | None = None, greedy: bool = False, pad_id: int | None = None,
                    decode_step: DecodeStep | None = None, done_check_every: int | None = None,
                    drafts: Sequence[Sequence[int] | None] | None = None) -> Generation:
    """Sample `group_size` completions of each prompt (a list of token ids).

    settings: one for all prompts or one per prompt. eos_id: a row stops after sampling it (None: rows
    run to max_new_tokens). generator: the random stream, on the model's device (required unless greedy).
    greedy: argmax instead of sampling (evaluation; with group_size 1). pad_id: filler for padding
    (default eos_id, else 0; the masks tell it apart). decode_step: a replacement for
    `model.decode_step` with the same signature, e.g. `fast_decode_step(model)` on a GPU; it is called
    with fixed shapes (every row with a copy of its prompt's slots, the whole cache), where the eager
    step reads each prompt's slots once for its rows and its cache of their own tokens grows and sheds
    the rows that are done.
    done_check_every: steps between checks whether every row is done, each a host-device sync
    (default: every step on CPU, where it costs nothing, else every 8 steps; rows done meanwhile only
    add padding, which is trimmed).
    drafts: per prompt, token ids its rows are likely to sample (e.g. the prompt's label; None: no draft).
    Rows are then sampled speculatively from the draft (`_drafted`; greedy: while the draft is the argmax):
    the same distribution, and a row that takes its whole draft, to EOS or its limit, is never decoded.
    """
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("generate_groups needs at least one prompt, each with at least one token")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if not greedy and generator is None:
        raise ValueError("sampling needs an explicit seeded torch.Generator")
    if drafts is not None and len(drafts) != len(prompt_ids):
        raise ValueError(f"drafts: one per prompt, got {len(drafts)} for {len(prompt_ids)} prompts")
    per_prompt = [settings] * len(prompt_ids) if isinstance(settings, SamplingSettings) else list(settings)
    if len(per_prompt) != len(prompt_ids):
        raise ValueError(f"{len(per_prompt)} settings for {len(prompt_ids)} prompts")
    too_long = [i for i, (p, s) in enumerate(zip(prompt_ids, per_prompt))
                if len(p) + s.max_new_tokens > model.config.n_positions]
    if too_long:
        raise ValueError(f"prompts {too_long} plus their max_new_tokens exceed the model's context of "
                         f"{model.config.n_positions} tokens")
    device = model.wte.weight.device
    pad = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)

    prompts, prompt_mask = left_pad(prompt_ids, pad, device)  # (B, Tp)
    width = prompts.shape[1]
    logits, prompt_cache = model.prefill(prompts, prompt_mask)  # (B, V)
    rows = [s for s in per_prompt for _ in range(group_size)]
    N, max_new = len(rows), max(s.max_new_tokens for s in rows)
    prompt_of_row = torch.arange(N, device=device) // group_size  # (N,)
    # A replaced decode step (compiled, CUDA graph) needs fixed shapes: every row's copy of its prompt's
    # slots and a slot for each token fed back (the last sampled one never is), from the start, rounded
    # up (CUDA's memory-efficient attention wants the mask's last dimension aligned; unused slots stay
    # masked). The eager step keeps each prompt's slots once (a `PromptPrefix`: decoding reads every slot
    # at every step, so the slots it reads are what it costs) and a cache of the rows' own tokens that
    # grows by CACHE_GROWTH slots when full, keeping only the rows not yet done, read up to the slot
    # just written (its attention is matmuls: no alignment needed).
    growing = decode_step is None
    own_length = _round_up(max(max_new - 1, 1), CACHE_SLOT_MULTIPLE)
    forced = None if drafts is None else _drafted(model, prompt_ids, drafts, group_size, per_prompt, eos_id, pad,
                                                  generator, greedy)
    tokens = torch.full((N, max_new), pad, dtype=torch.long, device=device)
    token_logp = torch.zeros(N, max_new, dtype=torch.float32, device=device)
    in_completion = torch.zeros(N, max_new, dtype=torch.bool, device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    if forced is not None:  # rows that took their whole draft are complete before decoding starts
        done, n_forced = forced.whole.clone(), forced.tokens.shape[1]
        whole = forced.whole[:, None] & (torch.arange(n_forced, device=device) < forced.count[:, None])  # (N, F)
        tokens[:, :n_forced] = torch.where(whole, forced.tokens, pad)
        token_logp[:, :n_forced] = torch.where(whole, forced.logp, 0.0)
        in_completion[:, :n_forced] = whole
    # the rows in the cache: a growing cache holds only the rows still to decode
    live = (~done).nonzero().squeeze(1) if growing else torch.arange(N, device=device)  # (n,)
    if growing:
        first_slot = 0  # the cache slot of the first token fed back
        prompts_kv = PromptPrefix.of(prompt_cache, prompt_mask, group_size)
        prefix = prompts_kv.kept(live) if len(live) else None
        cache = KVCache.empty(model.config, len(live), min(CACHE_GROWTH, own_length), device,
                              prompt_cache.keys.dtype)
    else:
        first_slot = width
        cache = prompt_cache.take_rows(prompt_of_row, _round_up(width + max_new - 1, CACHE_SLOT_MULTIPLE))
    logits = logits[prompt_of_row]  # (N, V): every row's latest logits; the rows in the cache update theirs
    row_limit = torch.tensor([s.max_new_tokens for s in rows], device=device)  # (N,)
    filters = _RowFilters(rows, model.config.vocab_size, device)
    # The decode step's inputs, updated in place: a CUDA graph captured on them stays valid.
    fed = torch.zeros(len(live), 1, dtype=torch.long, device=device)
    key_mask = torch.zeros(len(live), cache.length, dtype=torch.bool, device=device)
    if not growing:
        key_mask[:, :width] = prompt_mask[prompt_of_row]
    positions = prompt_mask.sum(1, keepdim=True)[prompt_of_row][live]  # (n, 1): the next token's position
    cache_index = torch.zeros(1, dtype=torch.long, device=device)
    check_every = done_check_every or (1 if device.type == "cpu" else 8)

    for step in range(max_new if len(live) else 0):
        scaled = logits.float() / filters.temperature  # (N, V)
        logp_all = F.log_softmax(scaled, dim=-1)  # (N, V)
        sampled = logp_all.argmax(-1) if greedy else filters.sample(scaled, generator)  # (N,)
        if forced is not None and step < forced.tokens.shape[1]:  # a row's draft tokens come first
            sampled = torch.where(step < forced.count, forced.tokens[:, step], sampled)
        # rows done keep what they hold: padding, or the whole draft they took
        sampled = torch.where(done, tokens[:, step], sampled)
        tokens[:, step] = sampled
        token_logp[:, step] = torch.where(done, token_logp[:, step], logp_all.gather(-1, sampled[:, None]).squeeze(-1))
        in_completion[:, step] |= ~done
        if eos_id is not None:
            done |= sampled == eos_id
        done |= row_limit <= step + 1
        if step + 1 == max_new or ((step + 1) % check_every == 0 and bool(done.all())):
            break
        slot = first_slot + step  # the cache slot of this step's token
        if slot == cache.length:  # only a growing cache fills up: make a longer one of the rows not done
            keep = (~done[live]).nonzero().squeeze(1)
            if len(keep) == 0:
                break
            cache = cache.take_rows(keep, min(_round_up(slot + CACHE_GROWTH, CACHE_SLOT_MULTIPLE), own_length))
            key_mask = F.pad(key_mask[keep], (0, cache.length - key_mask.shape[1]))
            live, positions, fed = live[keep], positions[keep], fed[keep]
            prefix = prompts_kv.kept(live)
        key_mask[:, slot] = True
        fed.copy_(sampled[live, None])
        cache_index.fill_(slot)
        if growing:  # the slots written so far, the only ones the rows attend to
            step_logits = model.decode_step(fed, positions, cache.first(slot + 1), cache_index,
                                            key_mask[:, :slot + 1], prefix)
        else:
            step_logits = decode_step(fed, positions, cache, cache_index, key_mask)
        logits.index_copy_(0, live, step_logits)  # (n, V) rows
        # Rows that are done keep being fed padding; the clamp keeps their positions inside the table.
        positions.add_(1).clamp_(max=model.config.n_positions - 1)

    steps = int(in_completion.sum(1).max())
    tokens, token_logp, in_completion = tokens[:, :steps], token_logp[:, :steps], in_completion[:, :steps]
    last = in_completion.sum(1).clamp(min=1) - 1  # (N,) each row's final completion column
    finished = tokens.gather(1, last[:, None]).squeeze(1) == eos_id if eos_id is not None \
        else torch.zeros(N, dtype=torch.bool, device=device)
    prompt_rows = prompt_mask[prompt_of_row]  # (N, Tp)
    no_prompt = torch.zeros_like(prompt_rows)
    return Generation(
        sequences=torch.cat([prompts[prompt_of_row], tokens], dim=1),
        attention_mask=torch.cat([prompt_rows, in_completion], dim=1),
        completion_mask=torch.cat([no_prompt, in_completion], dim=1),
        logprobs=torch.cat([torch.zeros_like(prompt_rows, dtype=torch.float32), token_logp], dim=1),
        finished=finished,
        prompt_width=width,
        group_size=group_size,
    )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class CUDAGraphStep:
    """A decode step replayed from a CUDA graph: one launch per token instead of one per kernel.

    The graph is captured on the first call and again whenever the call's tensors differ (address,
    shape) from the captured ones; generate_groups makes them once per call and updates them in place.
    """

    def __init__(self, step: DecodeStep) -> None:
        self.step = step
        self.graph: torch.cuda.CUDAGraph | None = None
        self.signature: tuple = ()
        self.output: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: KVCache,
                 cache_index: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        args = (input_ids, position_ids, cache, cache_index, key_mask)
        tensors = (input_ids, position_ids, cache.keys, cache.values, cache_index, key_mask)
        signature = tuple((t.data_ptr(), t.shape, t.stride()) for t in tensors)
        if self.graph is None or signature != self.signature:
            self.graph = None  # release the old graph's memory pool before capturing anew
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the graph; it writes the same cache slot
                for _ in range(2):
                    self.step(*args)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.output = self.step(*args)
            self.graph, self.signature = graph, signature
        self.graph.replay()
        return self.output


def fast_decode_step(model: GPT, compile: bool = True, cuda_graph: bool = True) -> DecodeStep:
    """model.decode_step compiled (torch.compile: fused kernels) and/or replayed as a CUDA graph, for
    generate_groups(..., decode_step=...). Meant for GPUs; on CPU compiling costs more than it saves at
    these sizes and CUDA graphs do not exist."""
    step: DecodeStep = model.decode_step
    if compile:
        step = torch.compile(step, fullgraph=True)
    if cuda_graph:
        if model.wte.weight.device.type != "cuda":
            raise ValueError("cuda_graph=True needs the model on a CUDA device")
        step = CUDAGraphStep(step)
    return step


class FastDecoder:
    """The CUDA fast path of sampling: a bf16 copy of a (fp32) model whose decode step replays a CUDA
    graph. The copy is what `generate_groups` runs (`model`, `step`); `sync(source)` copies the source's
    current weights into it, once per optimizer step. The source keeps its fp32 master weights."""

    def __init__(self, source: GPT) -> None:
        if source.wte.weight.device.type != "cuda":
            raise ValueError("FastDecoder needs the model on a CUDA device (bf16 and CUDA graphs)")
        self.model = copy.deepcopy(source).to(torch.bfloat16).eval().requires_grad_(False)
        self.step = CUDAGraphStep(self.model.decode_step)

    @torch.no_grad()
    def sync(self, source: GPT) -> None:
        for mine, theirs in zip(self.model.parameters(), source.parameters()):
            mine.copy_(theirs)


def decoding(model: GPT, decoder: FastDecoder | None) -> tuple[GPT, DecodeStep | None]:
    """The model and decode step that `generate_groups` should run: the fast decoder's when given."""
    return (model, None) if decoder is None else (decoder.model, decoder.step)
