"""GPT module: padded batches, the static KV cache and the masked log-prob path, on small random models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rookworld.generation import left_pad
from rookworld.model import GPT, GPTConfig, KVCache, PromptPrefix, SharedPrompts, grow_depth, token_logprobs

PROMPTS = [[5, 9, 2, 41, 7, 7, 30], [11, 3], [8, 8, 1, 60]]



def test_all_real_attention_mask_equals_the_plain_causal_forward(tiny_gpt):
    model = tiny_gpt()
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]])
    plain = model(ids)
    masked = model(ids, attention_mask=torch.ones_like(ids, dtype=torch.bool))
    assert torch.allclose(plain, masked, atol=1e-5)


def test_left_padded_rows_equal_each_sequence_alone(tiny_gpt):
    model = tiny_gpt()
    ids, mask = left_pad(PROMPTS, pad_id=0)
    batch = model(ids, attention_mask=mask)  # (B, T, V)
    for row, prompt in enumerate(PROMPTS):
        alone = model(torch.tensor([prompt]))[0]  # (t, V)
        assert torch.allclose(batch[row, -len(prompt):], alone, atol=1e-5)


def test_cached_decoding_equals_full_recompute(tiny_gpt):
    model = tiny_gpt()
    ids, mask = left_pad(PROMPTS, pad_id=0)
    B, width = ids.shape
    steps = 6
    next_ids = torch.randint(0, model.config.vocab_size, (B, steps), generator=torch.Generator().manual_seed(3))
    logits, prompt_cache = model.prefill(ids, mask)
    cache = prompt_cache.take_rows(torch.arange(B), width + steps)
    key_mask = torch.cat([mask, torch.zeros(B, steps, dtype=torch.bool)], dim=1)
    positions = mask.sum(1, keepdim=True)
    cached = [logits]
    for step in range(steps):
        key_mask[:, width + step] = True
        cached.append(model.decode_step(next_ids[:, step:step + 1], positions + step, cache,
                                        torch.tensor([width + step]), key_mask))
    full_ids = torch.cat([ids, next_ids], dim=1)
    full_mask = torch.cat([mask, torch.ones(B, steps, dtype=torch.bool)], dim=1)
    full = model(full_ids, attention_mask=full_mask)[:, width - 1:]  # (B, steps + 1, V)
    assert (torch.stack(cached, dim=1) - full).abs().max() <= 1e-5


def test_decoding_over_a_prompt_prefix_equals_each_rows_copy_of_its_prompt(tiny_gpt):
    """G rows per prompt attending to their prompt's slots kept once (a PromptPrefix) and to a cache of
    their own tokens give the logits of rows that each hold a copy of the prompt's slots, also after
    rows leave the batch (the prefix's `rows`)."""
    model = tiny_gpt()
    G, steps = 2, 5
    ids, mask = left_pad(PROMPTS, pad_id=0)
    width, N = ids.shape[1], len(PROMPTS) * G
    _, prompt_cache = model.prefill(ids, mask)
    of_row = torch.arange(N) // G
    fed = torch.randint(0, model.config.vocab_size, (N, steps), generator=torch.Generator().manual_seed(4))
    positions = mask.sum(1, keepdim=True)[of_row]
    copies = prompt_cache.take_rows(of_row, width + steps)
    copies_mask = torch.cat([mask[of_row], torch.zeros(N, steps, dtype=torch.bool)], 1)
    prefix = PromptPrefix.of(prompt_cache, mask, G)
    own = KVCache.empty(model.config, N, steps, "cpu", torch.float32)
    own_mask = torch.zeros(N, steps, dtype=torch.bool)
    for step in range(steps):
        if step == 3:  # rows 0 and 3 leave: the prefix path keeps the others' own slots only
            prefix.rows = torch.tensor([1, 2, 4, 5])
            own, own_mask = own.take_rows(prefix.rows, steps), own_mask[prefix.rows]
        rows = prefix.rows
        copies_mask[:, width + step] = own_mask[:, step] = True
        whole = model.decode_step(fed[:, step:step + 1], positions + step, copies, torch.tensor([width + step]),
                                  copies_mask)
        shared = model.decode_step(fed[rows, step:step + 1], positions[rows] + step, own.first(step + 1),
                                   torch.tensor([step]), own_mask[:, :step + 1], prefix)
        assert (shared - whole[rows]).abs().max() <= 1e-5


def test_prefill_rejects_right_padding(tiny_gpt):
    model = tiny_gpt()
    with pytest.raises(ValueError, match="left-padded"):
        model.prefill(torch.tensor([[1, 2, 0]]), torch.tensor([[True, True, False]]))


def test_take_rows_copies_the_rows_asked_for_in_order_and_extends_with_empty_slots():
    config = GPTConfig(vocab_size=10, n_positions=8, n_embd=8, n_layer=2, n_head=2)
    cache = KVCache.empty(config, batch_size=2, length=3, device="cpu", dtype=torch.float32)
    cache.keys[:, 0] = 1.0
    cache.keys[:, 1] = 2.0
    cache.values[:, 1] = 3.0
    out = cache.take_rows(torch.tensor([1, 0, 0, 1]), length=5)
    assert out.keys.shape == (2, 4, 2, 5, 4)
    assert out.keys[:, [1, 2], :, :3].eq(1.0).all() and out.keys[:, [0, 3], :, :3].eq(2.0).all()
    assert out.values[:, [0, 3], :, :3].eq(3.0).all() and out.values[:, [1, 2]].eq(0).all()
    assert out.keys[:, :, :, 3:].eq(0).all()
    with pytest.raises(ValueError, match="shrink"):
        cache.take_rows(torch.tensor([0]), length=2)
    head = cache.first(2)  # a view: writes land in the cache
    head.keys[:, 0, :, 1] = 7.0
    assert head.keys.shape == (2, 2, 2, 2, 4) and cache.keys[:, 0, :, 1].eq(7.0).all()


def completion_batch(model: GPT) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts followed by 5 completion tokens, the last 2 of row 1 being padding."""
    ids, prompt_mask = left_pad(PROMPTS, pad_id=0)
    generator = torch.Generator().manual_seed(7)
    completion = torch.randint(1, model.config.vocab_size, (len(PROMPTS), 5), generator=generator)
    completion[1, 3:] = 0
    completion_mask = torch.ones_like(completion, dtype=torch.bool)
    completion_mask[1, 3:] = False
    ids = torch.cat([ids, completion], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    mask = torch.cat([torch.zeros_like(prompt_mask), completion_mask], dim=1)
    return ids, attention_mask, mask


def test_token_logprobs_equal_log_softmax_of_forward_with_entropy_and_kl(tiny_gpt):
    model, reference = tiny_gpt(0), tiny_gpt(1)
    ids, attention_mask, mask = completion_batch(model)
    out = token_logprobs(model, ids, mask, attention_mask, entropy=True, reference=reference, kl=True, chunk_size=4)

    logprobs = F.log_softmax(model(ids, attention_mask=attention_mask)[:, :-1], dim=-1)  # (B, T-1, V)
    ref_logprobs = F.log_softmax(reference(ids, attention_mask=attention_mask)[:, :-1], dim=-1)
    target = ids[:, 1:, None]
    m = mask[:, 1:]
    assert torch.allclose(out.logp[:, 1:][m], logprobs.gather(-1, target).squeeze(-1)[m], atol=1e-5)
    assert torch.allclose(out.ref_logp[:, 1:][m], ref_logprobs.gather(-1, target).squeeze(-1)[m], atol=1e-5)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    assert torch.allclose(out.entropy[:, 1:][m], entropy[m], atol=1e-5)
    kl = (logprobs.exp() * (logprobs - ref_logprobs)).sum(-1)
    assert torch.allclose(out.kl[:, 1:][m], kl[m], atol=1e-5)
    assert (out.kl[mask] > 0).all()  # two different random models
    for stats in (out.logp, out.entropy, out.ref_logp, out.kl):
        assert stats.shape == ids.shape and stats[~mask].eq(0).all()


@pytest.mark.parametrize("direction", ["reverse", "forward", "symmetric"])
def test_kl_directions_equal_a_direct_computation_and_its_gradient(tiny_gpt, direction):
    """Each direction against sums over the full softmax, value and gradient (forward KL's gradient comes
    only from the model's log-probs: the reference is a constant)."""
    model, reference = tiny_gpt(0), tiny_gpt(1)
    ids, attention_mask, mask = completion_batch(model)
    out = token_logprobs(model, ids, mask, attention_mask, reference=reference, kl=True, kl_direction=direction,
                         chunk_size=3)
    p = F.softmax(model(ids, attention_mask=attention_mask)[:, :-1].float(), dim=-1)  # (B, T-1, V)
    with torch.no_grad():
        q = F.softmax(reference(ids, attention_mask=attention_mask)[:, :-1].float(), dim=-1)
    reverse = (p * (p.log() - q.log())).sum(-1)  # KL(model || reference)
    forward = (q * (q.log() - p.log())).sum(-1)  # KL(reference || model)
    direct = {"reverse": reverse, "forward": forward, "symmetric": (reverse + forward) / 2}[direction]
    m = mask[:, 1:]
    assert torch.allclose(out.kl[:, 1:][m], direct[m], atol=1e-5)
    assert (out.kl[mask] > 0).all()
    ours = torch.autograd.grad(out.kl[mask].sum(), model.wte.weight)[0]
    theirs = torch.autograd.grad(direct[m].sum(), model.wte.weight)[0]
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_forward_and_reverse_kl_differ_and_unknown_direction_is_refused(tiny_gpt):
    model, reference = tiny_gpt(0), tiny_gpt(1)
    ids, attention_mask, mask = completion_batch(model)
    kls = {d: token_logprobs(model, ids, mask, attention_mask, reference=reference, kl=True, kl_direction=d).kl
           for d in ("reverse", "forward")}
    assert not torch.allclose(kls["reverse"][mask], kls["forward"][mask])  # KL is not symmetric
    with pytest.raises(ValueError, match="unknown KL direction 'sideways'"):
        token_logprobs(model, ids, mask, attention_mask, reference=reference, kl=True, kl_direction="sideways")


def test_token_logprobs_ignore_the_content_of_padding(tiny_gpt):
    model = tiny_gpt()
    ids, attention_mask, mask = completion_batch(model)
    noisy = ids.masked_scatter(~attention_mask, torch.randint(1, model.config.vocab_size, ids.shape))
    assert not torch.equal(noisy, ids)
    a = token_logprobs(model, ids, mask, attention_mask).logp
    b = token_logprobs(model, noisy, mask, attention_mask).logp
    assert torch.allclose(a, b, atol=1e-6)


def test_token_logprobs_gradients_equal_direct_computation(tiny_gpt):
    model = tiny_gpt()
    ids, attention_mask, mask = completion_batch(model)
    out = token_logprobs(model, ids, mask, attention_mask, entropy=True, chunk_size=3)
    (out.logp.sum() + 0.1 * out.entropy.sum()).backward()
    chunked = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logprobs = F.log_softmax(model(ids, attention_mask=attention_mask)[:, :-1], dim=-1)
    m = mask[:, 1:]
    direct = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)[m].sum() \
        + 0.1 * (-(logprobs.exp() * logprobs).sum(-1))[m].sum()
    direct.backward()
    for got, want in zip(chunked, (p.grad for p in model.parameters())):
        assert torch.allclose(got, want, atol=1e-5)


def test_shared_prompts_score_and_train_as_the_whole_sequences(tiny_gpt):
    """Rows that continue shared prompts (each prompt run once, continuations right-padded) give the
    log-probs, entropy, reference log-probs, KL and parameter gradients of the same rows run whole."""
    model, reference = tiny_gpt(0), tiny_gpt(1)
    ids, attention_mask, mask = completion_batch(model)  # three prompts, five completion tokens each
    rows = torch.tensor([0, 2, 1, 2, 0])  # several rows per prompt, in any order
    full_ids, full_attention, full_mask = ids[rows], attention_mask[rows], mask[rows]
    full_mask[3, -1] = False  # one more row with a shorter completion
    full_attention[3, -1] = False
    prompts = SharedPrompts(torch.zeros(3, 7, dtype=torch.long), torch.tensor([len(p) for p in PROMPTS]), rows)
    for i, prompt in enumerate(PROMPTS):
        prompts.ids[i, :len(prompt)] = torch.tensor(prompt)
    continuation, continuation_mask = full_ids[:, -5:], full_mask[:, -5:]

    def run(*args, **kwargs):
        out = token_logprobs(*args, entropy=True, reference=reference, kl=True, chunk_size=4, **kwargs)
        (out.logp.sum() + 0.1 * out.entropy.sum() + out.kl.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        return out, grads

    shared, shared_grads = run(model, continuation, continuation_mask, prompts=prompts)
    whole, whole_grads = run(model, full_ids, full_mask, full_attention)
    for name in ("logp", "entropy", "ref_logp", "kl"):
        got, want = getattr(shared, name), getattr(whole, name)
        assert got.shape == continuation.shape and got[~continuation_mask].eq(0).all()
        assert torch.allclose(got[continuation_mask], want[full_mask], atol=1e-5)
    for got, want in zip(shared_grads, whole_grads):
        assert torch.allclose(got, want, atol=1e-5)


def test_a_continuation_padded_past_the_context_scores_its_tokens_as_alone(tiny_gpt):
    """A long prompt's short continuation, right-padded to another row's long one: its padding runs past the
    position table (the update's batches), its own tokens, inside the context, score as the row alone."""
    model = tiny_gpt()  # 48 positions: 44 + 3 and 2 + 20 fit, 44 + 20 does not
    prompts, continuations = [[5] * 44, [11, 3]], [[7, 2, 9], list(range(1, 21))]

    def scored(rows: list[int]) -> torch.Tensor:
        shared = SharedPrompts(left_pad([prompts[r] for r in rows], 0, left=False)[0],
                               torch.tensor([len(prompts[r]) for r in rows]), torch.arange(len(rows)))
        ids, mask = left_pad([continuations[r] for r in rows], 0, left=False)
        return token_logprobs(model, ids, mask, prompts=shared).logp[mask]  # row by row

    assert torch.allclose(scored([0, 1]), torch.cat([scored([0]), scored([1])]), atol=1e-5)


def test_attention_keeps_cudnn_for_decode_steps_only(tiny_gpt, monkeypatch):
    """cuDNN attention plans each new shape anew (a GRPO step was 3x slower with it on an H200): the
    whole-sequence, shared-prompt and prefill passes run with it disabled, decode steps as configured."""
    seen = []  # (queries per row, cuDNN attention allowed) of every SDPA call
    sdpa = F.scaled_dot_product_attention

    def recording(q, *args, **kwargs):
        seen.append((q.shape[2], torch.backends.cuda.cudnn_sdp_enabled()))
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model = tiny_gpt()
    ids, attention_mask, mask = completion_batch(model)
    token_logprobs(model, ids, mask, attention_mask)
    prompts = SharedPrompts(ids[:, :7], attention_mask[:, :7].sum(1), torch.tensor([0, 1, 2]))
    token_logprobs(model, ids[:, 7:], mask[:, 7:], prompts=prompts)
    model.prefill(*left_pad(PROMPTS, pad_id=0))
    c = model.config  # a decode step's attention: one query per row over 5 cached keys
    q, kv = torch.randn(3, c.n_head, 1, c.n_embd // c.n_head), torch.randn(3, c.n_head, 5, c.n_embd // c.n_head)
    model.h[0].attn._attend(q, kv, kv, None)  # CPU takes SDPA here (the matmul path needs a mask, no grad)
    assert {n > 1 for n, _ in seen} == {True, False}
    assert all(allowed == (n == 1) for n, allowed in seen), seen


def test_token_logprobs_reject_bad_masks(tiny_gpt):
    model = tiny_gpt()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="first token"):
        token_logprobs(model, ids, torch.tensor([[True, True, False]]))
    with pytest.raises(ValueError, match="shape"):
        token_logprobs(model, ids, torch.tensor([[False, True]]))
    with pytest.raises(ValueError, match="reference"):
        token_logprobs(model, ids, torch.tensor([[False, True, True]]), kl=True)


def test_a_deepened_model_computes_the_same_function_and_its_new_layers_learn(tiny_gpt):
    model = tiny_gpt()
    old_blocks = list(model.h)
    ids, mask = left_pad(PROMPTS, pad_id=0)
    before = model(ids, attention_mask=mask)
    grown = grow_depth(model, 5).eval()
    assert grown.config.n_layer == 5 and len(grown.h) == 5
    # 2 -> 5: old, new, old, new, new (the new ones spread in step with the old)
    assert [any(b is old for old in old_blocks) for b in grown.h] == [True, False, True, False, False]
    torch.testing.assert_close(grown(ids, attention_mask=mask), before, rtol=0, atol=0)
    # The new blocks are no copies frozen at zero: one optimizer step moves the function.
    optimizer = torch.optim.SGD(grown.parameters(), lr=0.1)
    F.cross_entropy(grown(ids)[0, :-1], ids[0, 1:]).backward()
    assert grown.h[1].attn.c_proj.weight.grad.abs().sum() > 0
    optimizer.step()
    assert not torch.equal(grown(ids, attention_mask=mask), before)
    with pytest.raises(ValueError, match="cannot grow to 1"):
        grow_depth(grown, 1)
