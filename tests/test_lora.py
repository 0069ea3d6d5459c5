"""LoRA beside the model (lora.py): it starts as the model, and its gradients are LoRA's. The trainer's use of it
(`--lora-rank`) is tested in test_train.py."""

from __future__ import annotations

import pytest
import torch

from rookworld.lora import TARGETS, LoRA
from rookworld.model import GPT, GPTConfig


def small_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, n_positions=16, n_embd=24, n_layer=2, n_head=2))


def test_adapters_start_as_the_model_and_only_the_block_matrices_take_gradients():
    model = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lora = LoRA(model, rank=3, alpha=6.0, seed=0)
    lora.write()  # B starts at zero: W0 + s * B @ A is W0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"h.{i}.{t}" for i in range(2) for t in TARGETS}
    assert [tuple(p.shape) for p in lora.parameters()][:2] == [(3, 24), (3, 24)]  # A of c_attn, A of attn.c_proj
    with pytest.raises(ValueError, match="rank must be >= 1"):
        LoRA(small_model(), rank=0, alpha=1.0, seed=0)


def test_the_gradients_from_the_weight_gradients_are_loras():
    """Against autograd through W0 + s * B @ A itself, with B moved off zero so that A's gradient is not."""
    model = small_model()
    lora = LoRA(model, rank=2, alpha=5.0, seed=1)
    with torch.no_grad():
        for b in lora.b:
            b.normal_()
    lora.write()
    ids = torch.randint(0, 40, (3, 10), generator=torch.Generator().manual_seed(2))

    def loss_of(m: GPT) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())

    loss_of(model).backward()
    ours = [g.clone() for g in lora.take_grads()]
    assert all(w.grad is None for w in lora.targets.values())  # taken, not left to accumulate

    a = [p.detach().clone().requires_grad_() for p in lora.a]
    b = [p.detach().clone().requires_grad_() for p in lora.b]
    merged = {name: getattr(lora, f"base{i}") + lora.scale * b[i] @ a[i] for i, name in enumerate(lora.targets)}
    loss = torch.func.functional_call(model, merged, (ids[:, :-1],))
    torch.nn.functional.cross_entropy(loss.flatten(0, 1), ids[:, 1:].flatten()).backward()
    expected = [p.grad for p in a] + [p.grad for p in b]  # parameters(): the A list, then the B list
    assert len(ours) == len(expected) == 2 * 2 * len(TARGETS)
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
