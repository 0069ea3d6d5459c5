"""GPT-2 as a plain PyTorch module (pre-LN blocks, tanh GELU, tied LM head, SDPA attention).

Parameter names follow Hugging Face's GPT-2 without the `transformer.` prefix, with `nn.Linear`
weights (out, in) where Hugging Face stores `Conv1D` weights (in, out); `hub.py` converts.
Dropout is off by default: RL needs identical log-probs from the policy and the reference.

Four ways through the model:
- `GPT.forward(input_ids, position_ids=None, attention_mask=None)`: logits of whole sequences; with an
  `attention_mask` rows may be left-padded (and padded after EOS), and positions count from each row's
  first real token, exactly as in cached decoding.
- `GPT.prefill` + `GPT.decode_step`: cached decoding with a static `KVCache` written in place; every
  decode step has the same shapes, so `torch.compile` makes one graph of it. With a `PromptPrefix` the
  cache holds the rows' own tokens and each prompt's keys and values are kept once for its G rows.
- `GPT.continuation_hidden(prompts, input_ids)`: rows that continue shared prompts (a GRPO group's
  completions), each prompt run once: the update's way.
- `token_logprobs`: log-probs of given tokens (optionally entropy, the reference's log-probs and the
  full-vocabulary KL), running the 50k-wide LM head only at the scored positions, chunk by chunk.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

# cuDNN attention (a CUDA kernel) builds an execution plan for every new shape, and the shapes of the
# update and of prefill change with every batch: there it made a GRPO step 3x slower on an H200. Those
# calls use the other kernels; a decode step (one query per row) keeps one shape and may use any.
VARIABLE_SHAPE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class KVCache:
    """Keys and values of all layers in two preallocated tensors, written in place slot by slot.

    Rows share slot indices (prompts are left-padded to one width), so a decode step writes one slot
    for the whole batch; the caller's key mask (B, T_max) says which slots hold real tokens.
    """

    keys: torch.Tensor    # (L, B, H, T_max, D)
    values: torch.Tensor  # (L, B, H, T_max, D)

    @classmethod
    def empty(cls, config: GPTConfig, batch_size: int, length: int,
              device: torch.device | str, dtype: torch.dtype) -> KVCache:
        shape = (config.n_layer, batch_size, config.n_head, length, config.n_embd // config.n_head)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    @property
    def length(self) -> int:
        return self.keys.shape[3]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index], self.values[index]  # views: writes to them land in the cache

    def first(self, length: int) -> KVCache:
        """A view of the first `length` slots: writes to it land in this cache."""
        return KVCache(self.keys[:, :, :, :length], self.values[:, :, :, :length])

    def take_rows(self, rows: torch.Tensor, length: int) -> KVCache:
        """A new cache of `length` slots holding this cache's rows `rows` (in that order, repeats
        allowed): copies of their slots, then empty ones."""
        L, _, H, T, D = self.keys.shape
        if length < T:
            raise ValueError(f"cannot shrink a cache of {T} slots to {length}")
        shape = (L, len(rows), H, length, D)
        out = KVCache(self.keys.new_empty(shape), self.values.new_empty(shape))
        for mine, theirs in ((out.keys, self.keys), (out.values, self.values)):
            torch.index_select(theirs, 1, rows, out=mine[:, :, :, :T])
            mine[:, :, :, T:].zero_()  # masked slots still enter the attention sums: no garbage
        return out


@dataclass
class PromptPrefix:
    """Prompts that G decode rows each continue (row r of P * G continues prompt r // G), kept once per
    prompt: a decode step reads a prompt's keys and values once for its G rows, not once per row."""

    keys_t: torch.Tensor   # (L, P, H, D, Tp): the prompts' keys, transposed for the score matmul
    values: torch.Tensor   # (L, P, H, Tp, D)
    padding: torch.Tensor  # (P, 1, 1, Tp): True at the prompts' padding slots
    group_size: int
    rows: torch.Tensor     # (n,): the rows (of P * G) in the decode batch, in its order

    @classmethod
    def of(cls, cache: KVCache, mask: torch.Tensor, group_size: int) -> PromptPrefix:
        """The prefix of the prompts in `cache` (as `GPT.prefill` returns it, `mask` (P, Tp) its real
        slots), every row in the batch. Transposed keys and the padding are made once, not per step."""
        rows = torch.arange(mask.shape[0] * group_size, device=mask.device)
        return cls(cache.keys.transpose(-1, -2).contiguous(), cache.values, ~mask[:, None, None, :], group_size, rows)

    def kept(self, rows: torch.Tensor) -> PromptPrefix:
        """This prefix for the decode rows `rows` (numbered as in `of`'s P * G) alone: without the prompts
        none of them continues, nor the padding columns all the others share. A decode step reads every slot
        of the prefix; a long prompt whose rows are done no longer widens the short ones."""
        G, P = self.group_size, self.padding.shape[0]
        prompts = torch.unique(rows // G)  # (P',), sorted
        first = int((~self.padding[prompts, 0, 0]).int().argmax(-1).min())  # left padding: the first column in use
        number = torch.full((P,), -1, dtype=torch.long, device=rows.device)
        number[prompts] = torch.arange(len(prompts), device=rows.device)
        return PromptPrefix(self.keys_t[:, prompts, ..., first:].contiguous(),
                            self.values[:, prompts, :, first:].contiguous(), self.padding[prompts, ..., first:],
                            G, number[rows // G] * G + rows % G)

    def layer(self, index: int) -> LayerPrefix:
        return LayerPrefix(self.keys_t[index], self.values[index], self.padding, self.group_size, self.rows)


@dataclass
class LayerPrefix:
    """One layer's `PromptPrefix`."""

    keys_t: torch.Tensor   # (P, H, D, Tp)
    values: torch.Tensor   # (P, H, Tp, D)
    padding: torch.Tensor  # (P, 1, 1, Tp)
    group_size: int
    rows: torch.Tensor     # (n,)

    def attend(self, q: torch.Tensor, own_scores: torch.Tensor, own_values: torch.Tensor,
               dropout: float) -> torch.Tensor:
        """One query per row q (n, H, 1, D) over its prompt's slots and its own: `own_scores` (n, H, 1, T)
        are the scaled, masked scores of its own slots, `own_values` (n, H, T, D) their values.
        Returns (n, H, 1, D)."""
        n, H, _, D = q.shape
        P, Tp, G = self.keys_t.shape[0], self.keys_t.shape[-1], self.group_size

        every_row = n == P * G  # rows leave in order, so then `rows` is every row in order

        def grouped(t: torch.Tensor) -> torch.Tensor:  # (n, H, K) -> (P, H, G, K); rows not in the batch: zero
            every = t if every_row else t.new_zeros(P * G, H, t.shape[-1]).index_copy_(0, self.rows, t)
            return every.view(P, G, H, -1).transpose(1, 2)

        def by_row(t: torch.Tensor) -> torch.Tensor:  # (P, H, G, K) -> (n, H, K)
            every = t.transpose(1, 2).reshape(P * G, H, -1)
            return every if every_row else every[self.rows]

        shared = (grouped(q[:, :, 0]) @ self.keys_t).mul_(D ** -0.5)  # (P, H, G, Tp)
        shared = by_row(shared.masked_fill_(self.padding, float("-inf")))  # (n, H, Tp)
        probs = F.dropout(torch.cat([shared, own_scores[:, :, 0]], -1).softmax(-1), dropout)  # (n, H, Tp + T)
        from_prompt = by_row(grouped(probs[:, :, :Tp]) @ self.values)  # (n, H, D)
        return from_prompt[:, :, None] + probs[:, :, None, Tp:] @ own_values


@dataclass
class SharedPrompts:
    """Prompts that several rows continue (a GRPO group's G completions share one): each prompt is run
    once, and every row attends to its prompt's keys and values."""

    ids: torch.Tensor      # (P, Tp) right-padded: real tokens first
    lengths: torch.Tensor  # (P,) real tokens of each prompt, >= 1
    rows: torch.Tensor     # (N,) the prompt each row continues

    def to(self, device: torch.device | str) -> SharedPrompts:
        return SharedPrompts(self.ids.to(device), self.lengths.to(device), self.rows.to(device))


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, T) counting from each row's first real token (left pads get 0, unused)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def causal_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Boolean SDPA mask (B, 1, T, T): causal over real keys. Every query also sees itself, so a pad
    query never has all keys masked (SDPA would return NaN there); pad outputs are never used."""
    T = attention_mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=attention_mask.device).tril()
    diagonal = torch.eye(T, dtype=torch.bool, device=attention_mask.device)
    return (causal & attention_mask.bool()[:, None, None, :]) | diagonal  # (B, 1, T, T)


class Attention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = config.dropout

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        return tuple(t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None, prefix: LayerPrefix | None = None) -> torch.Tensor:
        dropout = self.dropout if self.training else 0.0
        if prefix is not None or (q.shape[2] == 1 and q.device.type == "cpu" and attn_mask is not None
                                  and not torch.is_grad_enabled()):
            # one query per row (a decode step): two matmuls read the cache faster than the CPU flash kernel;
            # with a prefix, these are the row's own slots and its prompt's are in the prefix
            scores = (q @ k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5).masked_fill_(~attn_mask, float("-inf"))
            if prefix is not None:
                y = prefix.attend(q, scores, v, dropout)
            else:
                y = F.dropout(scores.softmax(-1), dropout) @ v
        else:
            with nullcontext() if q.shape[2] == 1 else sdpa_kernel(VARIABLE_SHAPE_BACKENDS):
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                                   dropout_p=dropout)  # (B, H, T, D)
        B, _, T, _ = y.shape
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                cache_index: torch.Tensor | None = None, prefix: LayerPrefix | None = None) -> torch.Tensor:
        """attn_mask: boolean (B, 1, T, T_keys), None for plain causal attention. With a cache, this
        call's keys/values go to slots `cache_index` (T,) and the queries attend over all its slots (and,
        with a prefix, a decode step's, over their prompts' slots before them)."""
        q, k, v = self._heads(x)
        if cache is not None:
            cache_k, cache_v = cache
            cache_k.index_copy_(2, cache_index, k)
            cache_v.index_copy_(2, cache_index, v)
            k, v = cache_k, cache_v  # (B, H, T_max, D)
        return self._attend(q, k, v, attn_mask, prefix)

    def shared(self, prompts: torch.Tensor, rows: torch.Tensor, x: torch.Tensor,
               key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts (P, Tp, C), right-padded, attend causally among themselves; continuations x (N, T, C)
        attend over their prompt `rows` (N,) and causally over themselves, as `key_mask` (N, 1, T, Tp + T) says."""
        qp, kp, vp = self._heads(prompts)
        q, k, v = self._heads(x)
        return (self._attend(qp, kp, vp, None),
                self._attend(q, torch.cat([kp[rows], k], 2), torch.cat([vp[rows], v], 2), key_mask))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                cache_index: torch.Tensor | None = None, prefix: LayerPrefix | None = None) -> torch.Tensor:
        return self._after_attention(x, self.attn(self.ln_1(x), attn_mask, cache, cache_index, prefix))

    def shared(self, prompts: torch.Tensor, rows: torch.Tensor, x: torch.Tensor,
               key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """forward for prompts and their continuations (Attention.shared)."""
        a_prompts, a_x = self.attn.shared(self.ln_1(prompts), rows, self.ln_1(x), key_mask)
        return self._after_attention(prompts, a_prompts), self._after_attention(x, a_x)

    def _after_attention(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(attended)
        return x + self.dropout(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2's scheme: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer).
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(param)
            elif ".ln_" in name or name.startswith("ln_f"):
                nn.init.ones_(param)
            else:
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(param, mean=0.0, std=std)

    def _trunk(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attn_mask: torch.Tensor | None,
               cache: KVCache | None = None, cache_index: torch.Tensor | None = None,
               prefix: PromptPrefix | None = None) -> torch.Tensor:
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))  # (B, T, C)
        for i, block in enumerate(self.h):
            x = block(x, attn_mask, cache.layer(i) if cache is not None else None, cache_index,
                      prefix.layer(i) if prefix is not None else None)
        return self.ln_f(x)

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states (B, T, C), before the LM head. attention_mask (B, T): True at real tokens."""
        B, T = input_ids.shape
        if attention_mask is None:
            attn_mask = None
            if position_ids is None:
                position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        else:
            attn_mask = causal_padding_mask(attention_mask)
            if position_ids is None:
                position_ids = positions_from_mask(attention_mask)
        return self._trunk(input_ids, position_ids, attn_mask)

    def continuation_hidden(self, prompts: SharedPrompts, input_ids: torch.Tensor) -> torch.Tensor:
        """The final hidden states (N, T, C) that predict each token of the continuations `input_ids` (N, T)
        of `prompts`: entry (n, t) is the state after row n's prompt and its tokens before t. Rows are
        right-padded; each prompt runs once however many rows continue it."""
        Tp, (N, T) = prompts.ids.shape[1], input_ids.shape
        device = input_ids.device
        rows, lengths = prompts.rows, prompts.lengths[prompts.rows]  # (N,)
        steps = torch.arange(T, device=device)
        before = self.drop(self.wte(prompts.ids) + self.wpe(torch.arange(Tp, device=device)))  # (P, Tp, C)
        # A row's padding may run past the position table (a long prompt padded to a long continuation):
        # it comes after the row's real tokens, which the causal mask keeps from seeing it, so any id serves.
        positions = (lengths[:, None] + steps).clamp(max=self.config.n_positions - 1)  # (N, T)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))  # (N, T, C)
        own_prompt = torch.arange(Tp, device=device) < lengths[:, None]  # (N, Tp)
        key_mask = torch.cat([own_prompt[:, None, :].expand(N, T, Tp),
                              (steps[None, :] <= steps[:, None]).expand(N, T, T)], 2)[:, None]  # (N, 1, T, Tp + T)
        for block in self.h:
            before, x = block.shared(before, rows, x, key_mask)
        before, x = self.ln_f(before), self.ln_f(x)
        return torch.cat([before[rows, lengths - 1][:, None], x[:, :-1]], 1)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.wte.weight)  # tied weights: (..., C) -> (..., V)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V); without attention_mask the batch is taken as unpadded."""
        return self.lm_head(self.hidden(input_ids, position_ids, attention_mask))

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
        """Run left-padded prompts (B, T) once: logits (B, V) of each row's next token, and a cache of
        T slots holding the prompts' keys/values."""
        B, T = input_ids.shape
        if not bool(attention_mask[:, -1].all()):
            raise ValueError("prefill needs left-padded prompts: the last column must be real tokens")
        dtype = self.wte.weight.dtype
        cache = KVCache.empty(self.config, B, T, input_ids.device, dtype)
        slots = torch.arange(T, device=input_ids.device)
        x = self._trunk(input_ids, positions_from_mask(attention_mask), causal_padding_mask(attention_mask),
                        cache, slots)  # (B, T, C)
        return self.lm_head(x[:, -1]), cache

    @torch.no_grad()
    def decode_step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: KVCache,
                    cache_index: torch.Tensor, key_mask: torch.Tensor,
                    prefix: PromptPrefix | None = None) -> torch.Tensor:
        """One token per row: input_ids and position_ids (B, 1), written to cache slot cache_index (1,);
        key_mask (B, T_max) marks the slots to attend to (it must include slot cache_index). With a
        prefix, the rows also attend to their prompts' slots, before the cache's (which then holds
        the rows' own tokens only). Returns logits (B, V). Without a prefix, static shapes throughout,
        for torch.compile."""
        attn_mask = key_mask[:, None, None, :]  # (B, 1, 1, T_max)
        x = self._trunk(input_ids, position_ids, attn_mask, cache, cache_index, prefix)  # (B, 1, C)
        return self.lm_head(x[:, -1])

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def grow_depth(model: GPT, n_layer: int) -> GPT:
    """`model` with `n_layer` blocks, computing the same function: the new blocks are spread evenly between
    the old ones (LLaMA Pro's block expansion) and start as identities, their output projections zero, so
    a grown model continues its training from where the smaller one stopped instead of from scratch. The old
    blocks are moved, not copied: `model` is not to be used beside the result."""
    old = len(model.h)
    if n_layer < old:
        raise ValueError(f"a model of {old} layers cannot grow to {n_layer}")
    grown = GPT(GPTConfig(**{**model.config.to_dict(), "n_layer": n_layer}))
    grown.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("h.")}, strict=False)
    blocks: list[nn.Module] = []
    for i, block in enumerate(model.h, start=1):
        blocks.append(block)
        while len(blocks) - i < (n_layer - old) * i // old:  # new blocks so far: in step with the old ones
            new = grown.h[len(blocks)]
            for proj in (new.attn.c_proj, new.mlp.c_proj):
                nn.init.zeros_(proj.weight)
                nn.init.zeros_(proj.bias)
            blocks.append(new)
    grown.h = nn.ModuleList(blocks)
    first = next(model.parameters())
    return grown.to(device=first.device, dtype=first.dtype)


@dataclass
class TokenLogProbs:
    """Per-token statistics aligned with the input ids: entry (b, t) is about token t given tokens < t.
    Every tensor is (B, T) and zero where the mask is False."""

    logp: torch.Tensor                    # log p(token_t | tokens_<t) under the model
    entropy: torch.Tensor | None = None   # full-vocabulary entropy of that next-token distribution
    ref_logp: torch.Tensor | None = None  # the same token's log-prob under the reference model
    kl: torch.Tensor | None = None        # full-vocabulary KL between model and reference (a direction)


def entropy_from_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy (...) of distributions given as full-vocabulary log-probs (..., V)."""
    return -(logprobs.exp() * logprobs).sum(-1)


def kl_from_logprobs(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(p || q) (...) from full-vocabulary log-probs (..., V) of p and q."""
    return (logprobs.exp() * (logprobs - ref_logprobs)).sum(-1)


def directed_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, direction: str) -> torch.Tensor:
    """KL (...) between the model's and the reference's full-vocabulary log-probs (..., V): 'reverse'
    KL(model || reference), 'forward' KL(reference || model), 'symmetric' the mean of the two."""
    if direction == "reverse":
        return kl_from_logprobs(logprobs, ref_logprobs)
    if direction == "forward":
        return kl_from_logprobs(ref_logprobs, logprobs)
    if direction == "symmetric":
        return 0.5 * (kl_from_logprobs(logprobs, ref_logprobs) + kl_from_logprobs(ref_logprobs, logprobs))
    raise ValueError(f"unknown KL direction {direction!r}; choose reverse, forward or symmetric")


def token_logprobs(model: GPT, input_ids: torch.Tensor, mask: torch.Tensor,
                   attention_mask: torch.Tensor | None = None, *, prompts: SharedPrompts | None = None,
                   entropy: bool = False, reference: GPT | None = None, kl: bool = False,
                   kl_direction: str = "reverse", temperature: torch.Tensor | None = None,
                   chunk_size: int = 1024) -> TokenLogProbs:
    """Log-probs of the tokens of `input_ids` (B, T) where `mask` (B, T) is True.

    `attention_mask` (B, T) marks real tokens (None: no padding). With `prompts`, the rows are
    continuations of those shared prompts (`GPT.continuation_hidden`: each prompt runs once), and any
    token may be scored, the first included. The LM head runs only at the
    positions that predict masked tokens, in chunks of `chunk_size`; with gradients on, each chunk is
    recomputed in the backward pass instead of keeping its (chunk, V) logits. Log-softmax is in float32.
    `reference` (a model without gradients) adds its log-probs of the same tokens; `kl=True` also the
    full-vocabulary KL in `kl_direction` (`directed_kl`; 'reverse' is KL(model || reference)), which
    needs both heads at once and so is computed here
    rather than from stored reference log-probs (N x V floats). `temperature` (B,) divides each row's
    logits (of both models) first: the distribution that sampled the row (generation.py).
    """
    if mask.shape != input_ids.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} differs from input_ids shape {tuple(input_ids.shape)}")
    mask = mask.bool()
    if prompts is None and bool(mask[:, 0].any()):
        raise ValueError("mask[:, 0] must be False: no token predicts a sequence's first token")
    if kl and reference is None:
        raise ValueError("kl=True needs a reference model")

    def scored_hidden(m: GPT) -> torch.Tensor:  # (N, C): the states that predict the masked tokens, in order
        if prompts is not None:
            return m.continuation_hidden(prompts, input_ids)[mask]
        return m.hidden(input_ids, attention_mask=attention_mask)[:, :-1][mask[:, 1:]]

    hidden = scored_hidden(model)
    targets = input_ids[mask]  # (N,)
    temps = None if temperature is None else temperature.float()[:, None].expand_as(mask)[mask]  # (N,)
    ref_hidden = None
    if reference is not None:
        with torch.no_grad():
            ref_hidden = scored_hidden(reference)

    def scaled(logits: torch.Tensor, t: torch.Tensor | None) -> torch.Tensor:
        return logits.float() if t is None else logits.float() / t[:, None]

    def head_stats(h: torch.Tensor, y: torch.Tensor, ref_h: torch.Tensor | None,
                   t: torch.Tensor | None) -> dict[str, torch.Tensor]:
        logprobs = F.log_softmax(scaled(model.lm_head(h), t), dim=-1)  # (n, V)
        stats = {"logp": logprobs.gather(-1, y[:, None]).squeeze(-1)}  # (n,)
        if entropy:
            stats["entropy"] = entropy_from_logprobs(logprobs)
        if ref_h is not None:
            with torch.no_grad():
                ref_logprobs = F.log_softmax(scaled(reference.lm_head(ref_h), t), dim=-1)  # (n, V)
            stats["ref_logp"] = ref_logprobs.gather(-1, y[:, None]).squeeze(-1)
            if kl:
                stats["kl"] = directed_kl(logprobs, ref_logprobs, kl_direction)
        return stats

    recompute = torch.is_grad_enabled() and hidden.requires_grad
    chunks = []
    for start in range(0, max(len(targets), 1), chunk_size):  # one (maybe empty) chunk at least
        part = slice(start, start + chunk_size)
        args = (hidden[part], targets[part], None if ref_hidden is None else ref_hidden[part],
                None if temps is None else temps[part])
        chunks.append(checkpoint(head_stats, *args, use_reentrant=False) if recompute else head_stats(*args))

    def scatter(name: str) -> torch.Tensor:
        values = torch.cat([chunk[name] for chunk in chunks])  # (N,)
        return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)  # (B, T)

    return TokenLogProbs(logp=scatter("logp"), entropy=scatter("entropy") if entropy else None,
                         ref_logp=scatter("ref_logp") if reference is not None else None,
                         kl=scatter("kl") if kl else None)
