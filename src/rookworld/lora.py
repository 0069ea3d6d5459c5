"""Low-rank adapters (LoRA, Hu et al. 2021) for `rookworld train --lora-rank R`, kept beside the model.

Each block matrix W (attention in and out, MLP in and out) trains as W0 + s * B @ A with W0 frozen, A (R, in)
random, B (out, R) zero and s = alpha / R; embeddings, biases and norms stay frozen. The policy itself stays a
plain GPT whose matrices are rewritten after every optimizer step, so sampling, the fast decoder, torchrun and
checkpoints see an ordinary model. The adapters' gradients follow from the model's own dL/dW by the chain rule,
dL/dA = s * B^T dL/dW and dL/dB = s * dL/dW A^T: LoRA's gradients exactly. They cost the full-size weight
gradients: the option is for a low-rank step, not a cheaper one.
"""

from __future__ import annotations

import torch
from torch import nn

TARGETS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class LoRA(nn.Module):
    def __init__(self, model: nn.Module, rank: int, alpha: float, seed: int) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.scale = alpha / rank
        self.targets = {name: p for name, p in model.named_parameters() if name.endswith(TARGETS)}
        generator = torch.Generator().manual_seed(seed)  # its own stream: the run's others stay as without LoRA
        self.a, self.b = nn.ParameterList(), nn.ParameterList()
        for i, weight in enumerate(self.targets.values()):
            out_features, in_features = weight.shape
            a = torch.randn(rank, in_features, generator=generator) / in_features ** 0.5
            self.a.append(nn.Parameter(a.to(weight.device)))
            self.b.append(nn.Parameter(weight.new_zeros(out_features, rank)))
            self.register_buffer(f"base{i}", weight.detach().clone())
        for p in model.parameters():
            p.requires_grad_(False)
        for weight in self.targets.values():
            weight.requires_grad_(True)  # for dL/dW, which becomes the adapters' gradients; never stepped itself

    def take_grads(self) -> list[torch.Tensor]:
        """The adapters' gradients (assigned, never accumulated) from the model's weight gradients (summed
        over ranks already), which are cleared; returns them."""
        for weight, a, b in zip(self.targets.values(), self.a, self.b):
            g = weight.grad  # set for every target: the trainer zero-fills and sums before this
            a.grad = self.scale * (b.detach().T @ g)
            b.grad = self.scale * (g @ a.detach().T)
            weight.grad = None
        return [p.grad for p in self.parameters()]

    @torch.no_grad()
    def write(self) -> None:
        """Set the model's matrices to W0 + s * B @ A."""
        for i, (weight, a, b) in enumerate(zip(self.targets.values(), self.a, self.b)):
            weight.copy_(torch.addmm(getattr(self, f"base{i}"), b, a, alpha=self.scale))
