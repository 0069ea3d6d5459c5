"""`rookworld train [--steps N] [--out DIR] [--resume DIR] [--config FILE.toml] ...`: the GRPO loop.

One step: draw B prompts (P/A mix), sample G completions of each (one prefill per prompt), score them
(stored Stockfish truth, the arbiter), turn the (B, G) rewards into group advantages, and update the
policy on the sampled ids with the clipped token-level loss (grpo.py) in micro-batches; then guards,
logging, periodic evaluation and atomic checkpoints.

Randomness is explicit: completions come from generators seeded by (seed, step, chunk) (rollout.py),
so a step is reproducible from the run state alone (exact resume) and from any number of ranks.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from rookworld import checkpoint, grpo, training
from rookworld.data.record import Sample
from rookworld.errors import UserError
from rookworld.evaluate import EvalConfig, Values, model_values, paired_change
from rookworld.generation import FastDecoder, check_sampling
from rookworld.model import SharedPrompts
from rookworld.rewards import RewardConfig, weights_at
from rookworld.rollout import Group, GroupSummary, collect, completion_limits
from rookworld.runtime import Dist, all_gather_objects, all_sum, fast_path, gather_indexed, init_distributed
from rookworld.training import shared

ZERO_STD_MODES = ("keep", "drop", "resample")
P_TRUTHS = ("stored", "engine")
# grpo.loss stats: loss terms add up over micro-batches; the others are token means (ratio/max: a max, apart)
SUMMED_STATS = ("loss", "pg_loss", "kl_loss", "entropy_loss")
TOKEN_MEAN_STATS = ("kl/mean", "entropy", "clip_frac", "clip_frac/low", "clip_frac/high", "ratio/mean")


@dataclass
class TrainConfig:
    # a resumed run continues its checkpoint's policy; --model is also its KL reference, which must not change
    KEPT_ON_RESUME: ClassVar[tuple[str, ...]] = ("model",)
    model: str | None = field(default=None, metadata={"help": "policy checkpoint: a directory or hub id "
                                                      "(default: the embedded model)"})
    data: str = field(default="embedded", metadata={"help": "training data: embedded, a local path or a hub id"})
    out: str = shared("out", "runs/grpo")
    steps: int = shared("steps", 100)
    seed: int = shared("seed", 0)
    batch_size: int = field(default=32, metadata={"help": "prompts per step (all ranks together)"})
    group_size: int = field(default=8, metadata={"help": "completions per prompt (G)"})
    p_fraction: float = field(default=0.5, metadata={"help": "share of P prompts in a batch"})
    rollout_chunk: int | None = field(default=None, metadata={
        "help": "prompts per generation call and random stream (default: batch_size / torchrun ranks, rounded up, "
                "so that every rank samples; equal chunks make any number of ranks sample what one process would)"})
    micro_batch_size: int = field(default=64, metadata={"help": "sequences per forward/backward pass "
                                                        "(bounds memory; gradients accumulate)"})
    num_iterations: int = field(default=1, metadata={"help": "policy updates per sampled batch (PPO epochs)"})
    temperature_p: float = field(default=1.0, metadata={"help": "sampling temperature of P prompts"})
    temperature_a: float = field(default=1.0, metadata={"help": "sampling temperature of A prompts"})
    top_p_p: float = field(default=1.0, metadata={"help": "nucleus mass of P prompts"})
    top_p_a: float = field(default=1.0, metadata={"help": "nucleus mass of A prompts"})
    max_new_tokens_p: int | None = field(default=None, metadata={"help": "P completion limit (default: the "
                                                                 "longest P target + margin)"})
    max_new_tokens_a: int | None = field(default=None, metadata={"help": "A completion limit (default: the "
                                                                 "longest A target + margin)"})
    lr: float = shared("lr", 3e-5)
    lr_schedule: str = shared("lr_schedule", "constant")
    min_lr_ratio: float = shared("min_lr_ratio", 0.0)
    warmup_steps: int = shared("warmup_steps", 0)
    weight_decay: float = shared("weight_decay", 0.0)
    beta1: float = shared("beta1", 0.9)
    beta2: float = shared("beta2", 0.99)
    grad_clip: float = shared("grad_clip", 1.0)
    zero_std: str = field(default="resample", metadata={"help": "groups whose G rewards are equal: keep, drop "
                                                    "(out of the loss) or resample (replace with new prompts)"})
    resample_rounds: int = field(default=2, metadata={"help": "zero_std=resample: extra rollout rounds at most"})
    draft_a: bool = field(default=True, metadata={
        "help": "sample (and evaluate) A completions speculatively with the label as the draft: the same "
                "distribution, and the rows that reproduce the label whole are never decoded (false: decode all)"})
    kl_max: float = field(default=1.0, metadata={"help": "roll back to the last good state when the step's "
                                                 "mean KL exceeds this (0: off; inactive while beta is 0, "
                                                 "when no KL is measured)"})
    reward_drop: float = field(default=0.5, metadata={"help": "roll back when the 5-step mean reward falls this "
                                                      "far below its best (0: off)"})
    lr_backoff: float = field(default=0.5, metadata={"help": "learning-rate factor applied at each rollback"})
    max_rollbacks: int = field(default=3, metadata={"help": "stop (with a valid checkpoint) after this many"})
    eval_every: int = shared("eval_every", 50)
    eval_limit: int = field(default=1200, metadata={
        "help": "held-out samples of the greedy eval: half P, half A, drawn at random (seeded) from the eval "
                "split; 600 P prompts show a 0.03 change of P/best_move_acc"})
    eval_draws: int = field(default=4, metadata={"help": "besides greedy, draw N completions per eval prompt at "
                                                 "eval_temperature (eval/sampled/...; 0: greedy only)"})
    eval_sampled_limit: int = field(default=200, metadata={
        "help": "held-out samples (half P, half A) of the sampled eval: eval_draws completions each cost more"})
    eval_temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the sampled eval"})
    eval_self_play: int = field(default=64, metadata={
        "help": "greedy games of the model against itself at each eval, from seeded random openings and stopped at "
                "the first illegal move (eval/selfplay/legal_half_moves; 0: none)"})
    checkpoint_every: int = shared("checkpoint_every", 25)
    keep_last: int = shared("keep_last", 2)
    overfit_single_batch: bool = field(default=False, metadata={"help": "reuse the first batch every step"})
    device: str | None = shared("device", None)
    threads: int | None = shared("threads", None)
    ref_device: str | None = field(default=None, metadata={"help": "reference model device (default: the "
                                                           "policy's)"})
    fast_decode: bool | None = field(default=None, metadata={
        "help": "the CUDA fast path: sampling and eval from a bf16 copy of the policy with CUDA-graph decoding, "
                "and a bf16 autocast update over fp32 master weights (default: on with CUDA; false: fp32 eager)"})
    processes: int | None = field(default=None, metadata={"help": "Stockfish processes for moves outside the "
                                                          "stored analysis (default: one per core)"})
    engine_rewards: bool = field(default=True, metadata={"help": "score P moves outside the stored analysis with "
                                                         "Stockfish (false: a flat small credit, no engine time)"})
    p_truth: str = field(default="stored", metadata={
        "help": "P reward truth: 'stored' (the data's analysis; the embedded set's is at depth 10, the label "
                "limit) or 'engine' (Stockfish at the label limit, depth 10, multipv 5, searched on demand and "
                "cached: the truth `rookworld eval` judges moves by, for data labelled at another limit)"})
    log_samples: int = field(default=4, metadata={"help": "completions written to samples.jsonl per step"})
    tensorboard: bool = shared("tensorboard", True)
    wandb_project: str | None = field(default=None, metadata={"help": "log to this Weights & Biases project"})

    def __post_init__(self) -> None:
        training.check_shared(self)
        checks = [
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.group_size >= 2, f"group_size must be >= 2: a group baseline needs two completions, "
                                   f"got {self.group_size}"),
            ((self.rollout_chunk is None or self.rollout_chunk >= 1) and self.micro_batch_size >= 1,
             "rollout_chunk and micro_batch_size must be >= 1"),
            (self.num_iterations >= 1, f"num_iterations must be >= 1, got {self.num_iterations}"),
            (self.zero_std in ZERO_STD_MODES, f"zero_std must be one of {ZERO_STD_MODES}"),
            (self.p_truth in P_TRUTHS, f"p_truth must be one of {P_TRUTHS}, got {self.p_truth!r}"),
            (self.p_truth == "stored" or self.engine_rewards,
             "p_truth 'engine' searches every P prompt with Stockfish: it needs engine_rewards true"),
            (0 < self.lr_backoff <= 1, f"lr_backoff must be in (0, 1], got {self.lr_backoff}"),
            (self.kl_max >= 0 and self.reward_drop >= 0, "kl_max and reward_drop must be >= 0 (0: off)"),
            (self.eval_limit >= 1 and self.eval_sampled_limit >= 1, "eval_limit and eval_sampled_limit must be >= 1"),
            (self.eval_self_play >= 0, f"eval_self_play must be >= 0 (0: none), got {self.eval_self_play}"),
            (self.eval_draws == 0 or self.eval_draws >= 2, f"eval_draws must be 0 (greedy only) or >= 2, "
                                                           f"got {self.eval_draws}"),
            (all(n is None or n >= 1 for n in (self.max_new_tokens_p, self.max_new_tokens_a)),
             f"max_new_tokens_p and max_new_tokens_a must be >= 1, got {self.max_new_tokens_p}, "
             f"{self.max_new_tokens_a}"),
            (self.processes is None or self.processes >= 1, f"processes must be >= 1, got {self.processes}"),
        ]
        checks += [(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
                   for name in ("resample_rounds", "max_rollbacks", "log_samples")]
        for ok, reason in checks:
            if not ok:
                raise ValueError(reason)
        check_sampling(self.temperature_p, self.top_p_p, "temperature_p, top_p_p")
        check_sampling(self.temperature_a, self.top_p_a, "temperature_a, top_p_a")
        check_sampling(self.eval_temperature, 1.0, "eval_temperature")


# ---------------------------------------------------------------- advantages


def step_advantages(summaries: list[GroupSummary], gcfg: grpo.GRPOConfig,
                    ema: grpo.EMABaseline | None) -> grpo.Advantages:
    """The step's advantages from every group's rewards; an 'ema' baseline then takes in the step's rewards.
    With learn_a false the A groups' advantages are 0."""
    rewards = torch.tensor([s.rewards for s in summaries])  # (B, G)
    tasks = [s.task for s in summaries]
    adv = grpo.advantages(rewards, gcfg, ema.values(tasks, rewards) if ema is not None else None)
    if ema is not None:
        ema.update(tasks, rewards)
    if not gcfg.learn_a:
        adv.values[[task == "A" for task in tasks]] = 0.0
    return adv


def make_baseline(gcfg: grpo.GRPOConfig) -> grpo.EMABaseline | None:
    return grpo.EMABaseline(gcfg.ema_momentum) if gcfg.baseline == "ema" else None


def learning_groups(groups: list[Group | None], adv: grpo.Advantages, cfg: TrainConfig) -> list[int]:
    """Indices of this rank's groups that enter the loss (zero-std ones only with zero_std 'keep')."""
    return [i for i, g in enumerate(groups) if g is not None and not (cfg.zero_std != "keep" and bool(adv.zero_std[i]))]


# ---------------------------------------------------------------- update


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


def set_lr(optimizer: torch.optim.Optimizer, cfg: TrainConfig, state: RunState) -> None:
    """The learning rate of the step about to be taken: schedule times the rollback back-off."""
    training.set_lr(optimizer, cfg.lr * state.lr_scale * training.lr_factor(cfg, state.step))


def load_reference(cfg: TrainConfig, gcfg: grpo.GRPOConfig, device: str):
    """The frozen starting model the KL terms measure against, on --ref-device (None with beta 0)."""
    from rookworld.hub import load_model, resolve_default_model

    if gcfg.beta <= 0:
        return None
    ref_device = cfg.ref_device or device
    if gcfg.kl_estimator == "full" and ref_device != device:
        raise UserError("--kl-estimator full needs the reference on the policy's device; drop --ref-device")
    reference, _ = load_model(cfg.model or str(resolve_default_model()), device=ref_device)
    return reference.requires_grad_(False)


def batch_sampler(cfg: TrainConfig, train_samples: list[Sample]):
    """The sampler of the GRPO prompts."""
    from rookworld.data.batches import TaskSampler

    return TaskSampler(train_samples, p_fraction=cfg.p_fraction, seed=cfg.seed)


def _summed_grads(policy, d: Dist) -> list[torch.Tensor]:
    """The trainable parameters' gradients, summed over ranks in place (zeros for those that got none)."""
    trainable = [p for p in policy.parameters() if p.requires_grad]
    for p in trainable:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in trainable]
    if d.world > 1:
        import torch.distributed as dist

        for g in grads:
            dist.all_reduce(g)
    return grads


def policy_update(policy, reference, optimizer, batch: Batch | None, gcfg: grpo.GRPOConfig, cfg: TrainConfig,
                  beta: float, max_completion: int, d: Dist) -> dict[str, float]:
    """cfg.num_iterations optimizer steps on one batch; returns summed loss parts and token means.

    `batch` None: this rank has no group to learn from this step; it still joins the all-reduces.
    Log-probs (policy, old, reference) are taken at each row's sampling temperature.
    `update/applied` is 1 when the optimizer stepped, 0 when no rank had a group or the gradient was not finite.
    """
    from rookworld.model import token_logprobs

    needs_ref = beta > 0 and reference is not None
    full_kl = gcfg.kl_estimator == "full"
    device = policy.wte.weight.device
    # the fast path's update: bf16 matmuls, fp32 master weights, log-softmax in fp32 (token_logprobs)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=fast_path(cfg.fast_decode, str(device)))
    local_norm = (0.0 if gcfg.aggregation == "bnpo" or batch is None else
                  grpo.global_normalizer(batch.completion_mask, gcfg, truncated=~batch.finished,
                                         max_completion_length=max_completion))
    total_norm, total_micro = all_sum([local_norm, 0.0 if batch is None else
                                       math.ceil(len(batch.advantages) / cfg.micro_batch_size)], d)
    if total_micro == 0:
        return {"grad_norm": 0.0, "guard/nonfinite": 0.0, "update/applied": 0.0}
    normalizer = None if gcfg.aggregation == "bnpo" else max(total_norm, 1.0)
    # bnpo normalises each micro-batch by its own tokens: its rows stay in batch order
    micro = [] if batch is None else list(batch.micro_batches(cfg.micro_batch_size,
                                                              by_length=gcfg.aggregation != "bnpo"))
    scale = 1.0 / total_micro if gcfg.aggregation == "bnpo" else 1.0

    # Reference log-probs, once per batch, without gradients. The old (sampling) policy's are the ones
    # generation returned: they equal a recomputation at the same temperature to float rounding (tested).
    ref = []
    with torch.no_grad(), autocast:
        for mb in micro:
            if needs_ref and not full_kl:
                ref_dev = reference.wte.weight.device
                ref.append(token_logprobs(reference, mb.completions.to(ref_dev), mb.completion_mask.to(ref_dev),
                                          prompts=mb.prompts.to(ref_dev),
                                          temperature=mb.temperature.to(ref_dev)).logp.to(device))
            else:
                ref.append(None)

    totals = dict.fromkeys(SUMMED_STATS + TOKEN_MEAN_STATS, 0.0)  # token means as token-weighted sums
    tokens_seen = 0.0
    ratio_max = 0.0  # over the micro-batches and iterations
    grad_norm = 0.0
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    for _ in range(cfg.num_iterations):
        policy.zero_grad(set_to_none=True)
        for mb, ref_logp in zip(micro, ref):
            mask = mb.completion_mask
            with autocast:
                tl = token_logprobs(policy, mb.completions, mask, prompts=mb.prompts, entropy=True,
                                    temperature=mb.temperature, reference=reference if needs_ref and full_kl else None,
                                    kl=needs_ref and full_kl, kl_direction=gcfg.kl_direction)
            old_logp = mb.logprobs if cfg.num_iterations > 1 else tl.logp.detach()  # one pass: ratio 1
            loss, stats = grpo.loss(tl.logp, old_logp,
                                    ref_logp if needs_ref else None, mb.advantages, mask, gcfg, beta=beta,
                                    kl_per_token=tl.kl if needs_ref and full_kl else None,
                                    entropy=tl.entropy, truncated=~mb.finished, normalizer=normalizer,
                                    max_completion_length=max_completion,
                                    kl_weight=torch.where(mb.task_a, gcfg.beta_a_scale, 1.0))
            (loss * scale).backward()
            tokens = float(mask.sum())
            tokens_seen += tokens
            for key in SUMMED_STATS:
                totals[key] += stats[key] * scale
            for key in TOKEN_MEAN_STATS:
                totals[key] += stats.get(key, 0.0) * tokens
            ratio_max = max(ratio_max, stats["ratio/max"])
        grads = _summed_grads(policy, d)
        grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        if not math.isfinite(grad_norm):  # summed over ranks: every rank skips together
            policy.zero_grad(set_to_none=True)
            return {"grad_norm": grad_norm, "guard/nonfinite": 1.0, "update/applied": 0.0}
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(stepped, cfg.grad_clip)
        optimizer.step()
    # Sums over ranks, so every rank sees the same numbers (the rollback decision must agree).
    keys = SUMMED_STATS + TOKEN_MEAN_STATS
    *summed, tokens_seen = all_sum([totals[k] for k in keys] + [tokens_seen], d)
    result = {k: v / cfg.num_iterations for k, v in zip(keys, summed)}
    for key in TOKEN_MEAN_STATS:
        result[key] /= max(tokens_seen / cfg.num_iterations, 1.0)
    result["ratio/max"] = max(all_gather_objects(ratio_max, d))
    if not needs_ref:
        del result["kl/mean"]
    terms = [abs(result.get(k, 0.0)) for k in ("pg_loss", "kl_loss", "entropy_loss")]
    result["kl_share"] = terms[1] / sum(terms) if sum(terms) > 0 else 0.0
    result["grad_norm"] = grad_norm
    result["guard/nonfinite"] = 0.0
    result["update/applied"] = 1.0
    return result


# ---------------------------------------------------------------- state


@dataclass
class RunState:
    """What a checkpoint holds besides the model (exact resume)."""

    step: int = 0
    lr_scale: float = 1.0
    rollbacks: int = 0
    skipped_steps: int = 0
    reward_history: list[float] = field(default_factory=list)


def snapshot(policy, optimizer, beta_ctl: grpo.BetaController, parts: dict[str, Any]) -> dict[str, Any]:
    """In-memory copy of the last good state, restored by a rollback; `parts`: the run's optional stateful
    pieces by name (the ema baseline), None where off."""
    return {"policy": copy.deepcopy(policy.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict()),
            "beta": beta_ctl.state_dict(),
            **{name: None if part is None else copy.deepcopy(part.state_dict()) for name, part in parts.items()}}


def restore(snap: dict[str, Any], policy, optimizer, beta_ctl: grpo.BetaController, parts: dict[str, Any]) -> None:
    policy.load_state_dict(snap["policy"])
    optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
    beta_ctl.load_state_dict(snap["beta"])
    for name, part in parts.items():
        if part is not None:
            part.load_state_dict(copy.deepcopy(snap[name]))  # a snapshot may be restored more than once


def check_resumable(saved: dict[str, Any], resume_dir: Path, gcfg: grpo.GRPOConfig) -> None:
    """Refuse, before any work, a checkpoint that this config cannot continue as one uninterrupted run of it
    would go: one saved without the ema baseline this config needs."""
    if gcfg.baseline == "ema" and saved.get("baseline") is None:
        raise UserError(f"{resume_dir} holds no ema baseline state: it was saved by a run without --baseline ema; "
                        "resume with that run's own config.json")


def load_run(saved: dict[str, Any], policy, optimizer, cfg: TrainConfig, parts: dict[str, Any]) -> RunState:
    """A checkpoint's saved state (checked by check_resumable) put into a run's pieces: `parts` by their names in
    the checkpoint (None: this config has none) and the optimizer's moments with this config's AdamW settings;
    returns the run's counters."""
    for name, part in parts.items():
        if part is not None:
            part.load_state_dict(saved[name])
    training.load_optimizer(optimizer, saved["optimizer"], cfg)
    return RunState(**saved["run"])


def inactive_kl_guard(cfg: TrainConfig, gcfg: grpo.GRPOConfig) -> str | None:
    """The note that --kl-max guards nothing for a while, or at all: the KL is measured only while beta > 0 (at
    beta 0 the reference pass is skipped, or the reference is not even loaded)."""
    if not cfg.kl_max:
        return None
    if gcfg.beta <= 0:
        return f"--kl-max {cfg.kl_max} is inactive: with --beta 0 no KL is measured"
    if gcfg.beta_schedule == "warmup" and gcfg.beta_warmup_steps:
        return (f"--kl-max {cfg.kl_max} is inactive for the first {gcfg.beta_warmup_steps} steps: beta is 0 "
                f"during --beta-schedule warmup's --beta-warmup-steps, and no KL is measured while it is")
    return None


def runaway_reason(cfg: TrainConfig, metrics: dict[str, float], state: RunState) -> str | None:
    kl = metrics.get("kl/mean")
    if cfg.kl_max and kl is not None and kl > cfg.kl_max:
        return f"KL {kl:.4f} above kl_max {cfg.kl_max}"
    history = state.reward_history
    if cfg.reward_drop and len(history) >= 10:
        recent = sum(history[-5:]) / 5
        best = max(sum(history[i - 5:i]) / 5 for i in range(5, len(history) + 1))
        if recent < best - cfg.reward_drop:
            return f"reward collapse: 5-step mean {recent:.3f} vs best {best:.3f}"
    return None


class TrainingStopped(UserError):
    """The run cannot continue (e.g. too many rollbacks); the last good checkpoint is on disk."""


# ---------------------------------------------------------------- main


def step_metrics(summaries: list[GroupSummary], adv: grpo.Advantages) -> dict[str, float]:
    """Reward and completion statistics of all the step's groups, every rank's (P/A split, components)."""
    out: dict[str, float] = {}
    flat = [r for s in summaries for r in s.rewards]
    out["reward/mean"] = sum(flat) / len(flat)
    out["reward/std"] = float(np.std(flat))
    out["frac_zero_std"] = adv.frac_zero_std
    out["adv/mean"] = float(adv.values.mean())
    out["adv/std"] = float(adv.values.std(correction=0))
    out["adv/abs_max"] = float(adv.values.abs().max())
    by_task: dict[str, list[float]] = {}
    components: dict[str, list[float]] = {}
    lengths, truncated = [], []
    for s in summaries:
        by_task.setdefault(s.task, []).extend(s.rewards)
        for comp in s.components:
            for name, value in comp.items():
                components.setdefault(f"reward/{s.task}/{name}", []).append(value)
        lengths.extend(s.lengths)
        truncated.extend(s.truncated)
    for task, values in by_task.items():
        out[f"reward/{task}"] = sum(values) / len(values)
    out.update({k: sum(v) / len(v) for k, v in components.items()})
    out["completion/len_mean"] = sum(lengths) / len(lengths)
    out["completion/len_max"] = float(max(lengths))
    out["completion/truncated_frac"] = sum(truncated) / len(truncated)
    return out


def sample_rows(groups: list[Group | None], count: int, d: Dist) -> list[dict[str, Any]]:
    """samples.jsonl's rows of a step: the first completion of each of the first `count` groups, gathered from
    the ranks that hold them, so that a torchrun run logs what one process would."""
    rows = gather_indexed({i: {"prompt": g.sample.prompt, "completion": g.completions[0], "reward": g.rewards[0]}
                           for i, g in enumerate(groups[:count]) if g is not None}, d)
    return [rows[i] for i in sorted(rows)]


def load_data(cfg: TrainConfig):
    from rookworld.data.batches import balanced_subset
    from rookworld.data.sources import load_source

    train = load_source(cfg.data, "train").samples
    evals = balanced_subset(load_source(cfg.data, "eval").samples, cfg.eval_limit) if cfg.eval_every else []
    return train, evals


def main(cfg: TrainConfig, gcfg: grpo.GRPOConfig, resume: str | None = None,
         rcfg: RewardConfig | None = None) -> Path:
    """Run GRPO with the reward `rcfg` (default: RewardConfig()); returns the run directory. Held-out
    evaluation scores with the default reward, so runs with different rewards compare on one scale."""
    from rookworld.data.batches import balanced_subset
    from rookworld.hub import load_model, resolve_default_model, save_model
    from rookworld.log import EVAL_FILE, Progress, RunLogger, eval_change, eval_line, read_records
    from rookworld.runtime import pick_device
    from rookworld.stockfish import StockfishPool

    d, device = init_distributed(pick_device(cfg.device, cfg.threads))
    torch.manual_seed(cfg.seed)
    rcfg = rcfg or RewardConfig()
    out, resume_dir, saved = Path(cfg.out), None, None
    if resume is None:
        training.check_new_out(out)
    else:
        out = Path(resume)
        resume_dir = training.resume_checkpoint(resume, cfg)
        saved = checkpoint.load_state(resume_dir)
        check_resumable(saved, resume_dir, gcfg)
    note = inactive_kl_guard(cfg, gcfg)
    if note and d.main:
        print(note, file=sys.stderr)
    model_source = str(resume_dir or cfg.model or resolve_default_model())
    policy, tokenizer = load_model(model_source, device=device)
    policy.train()
    decoder = FastDecoder(policy) if fast_path(cfg.fast_decode, device) else None
    reference = load_reference(cfg, gcfg, device)

    train_samples, eval_samples = load_data(cfg)
    limits = completion_limits(cfg, tokenizer, train_samples, policy.config.n_positions)
    max_completion = max(limits.values())
    sampler = batch_sampler(cfg, train_samples)
    optimizer = training.make_optimizer(policy, cfg)
    beta_ctl = grpo.BetaController(gcfg)
    ema = make_baseline(gcfg)
    parts = {"baseline": ema}
    state = RunState()
    if saved is not None:
        if d.main:
            checkpoint.clear_debris(out)
        state = load_run(saved, policy, optimizer, cfg, {"sampler": sampler, "beta": beta_ctl, "baseline": ema})
    set_lr(optimizer, cfg, state)
    good = snapshot(policy, optimizer, beta_ctl, parts)
    fixed_batch = sampler.next(cfg.batch_size) if cfg.overfit_single_batch else None
    # greedy, then (optionally) sampled at a fixed seed: every eval of every run draws the same random stream
    evals = {"eval/": (EvalConfig(batch_size=64, self_play=cfg.eval_self_play, draft_a=cfg.draft_a), eval_samples)}
    if cfg.eval_draws:
        sampled = EvalConfig(batch_size=64, samples=cfg.eval_draws, temperature=cfg.eval_temperature,
                             draft_a=cfg.draft_a)
        evals["eval/sampled/"] = (sampled, balanced_subset(eval_samples, cfg.eval_sampled_limit))

    first_values: dict[str, Values] = {}  # each eval set's values at step 0, when this process evaluated it

    def held_out(step: int, pool) -> dict[str, float]:
        if decoder is not None:
            decoder.sync(policy)
        found = {}
        for prefix, (eval_cfg, samples) in evals.items():
            result, values = model_values(policy, tokenizer, samples, eval_cfg, pool, decoder)
            if step == 0:
                first_values[prefix] = values
            elif prefix in first_values:  # the paired change since step 0 (a resumed run has no step-0 values)
                result |= paired_change(values, first_values[prefix], samples)
            found |= {f"{prefix}{k}": v for k, v in result.items()}
        logger.log_eval(step, found)
        progress.note(eval_line(step, found))
        return found

    run_config = {"train": asdict(cfg), "grpo": asdict(gcfg), "reward": asdict(rcfg)}

    def write_model(directory: Path) -> None:
        save_model(policy, tokenizer, directory,
                   metadata={"trained_with": "rookworld train", **run_config})

    def save_checkpoint(metrics: dict[str, float] | None = None) -> None:
        if d.main:
            checkpoint.save(out, state.step, {"optimizer": optimizer.state_dict(), "sampler": sampler.state_dict(),
                                              "beta": beta_ctl.state_dict(), "run": asdict(state),
                                              "baseline": None if ema is None else ema.state_dict()},
                            write_model, metrics=metrics, keep_last=cfg.keep_last, best_metric="eval/reward/mean")

    logger = RunLogger(out, run_config, tensorboard=cfg.tensorboard,
                       wandb_project=cfg.wandb_project, rank=d.rank,
                       resume_step=state.step if resume_dir is not None else None, start_over=resume_dir is None)
    progress = Progress(cfg.steps, start=state.step, rank=d.rank)
    with StockfishPool(processes=cfg.processes) as pool, logger, progress:
        if state.step == 0 and eval_samples:
            held_out(0, pool)
        while state.step < cfg.steps:
            t0 = time.perf_counter()
            samples = fixed_batch or sampler.next(cfg.batch_size)
            timings: dict[str, float] = {}
            if decoder is not None:
                decoder.sync(policy)
            groups, summaries = collect(policy, tokenizer, sampler, samples, cfg, limits, state.step, pool, d, timings,
                                        rcfg, decoder)
            adv = step_advantages(summaries, gcfg, ema)
            learn = learning_groups(groups, adv, cfg)
            metrics = step_metrics(summaries, adv)
            if ema is not None:
                metrics.update({f"baseline/{task}": mean for task, mean in ema.means.items()})
            if rcfg.reward_warmup_steps:
                metrics.update({f"reward_weight/{task}/{name}": w for task, weights in
                                weights_at(rcfg, state.step).items() for name, w in weights.items()})
            beta = beta_ctl.beta
            t1 = time.perf_counter()
            batch = Batch.of([groups[i] for i in learn], [adv.values[i].to(device) for i in learn]) if learn else None
            update = policy_update(policy, reference, optimizer, batch, gcfg, cfg, beta, max_completion, d)
            metrics.update(update)
            if update["guard/nonfinite"]:
                state.skipped_steps += 1
            state.reward_history.append(metrics["reward/mean"])
            reason = runaway_reason(cfg, metrics, state)
            stop = None
            if reason is not None:
                restore(good, policy, optimizer, beta_ctl, parts)
                state.rollbacks += 1
                state.lr_scale *= cfg.lr_backoff
                state.reward_history.clear()
                metrics["guard/rollback"] = 1.0
                print(f"step {state.step + 1}: {reason}; rolled back to the last good state, lr x{state.lr_scale:g}")
                if state.rollbacks > cfg.max_rollbacks:
                    stop = TrainingStopped(f"{state.rollbacks} rollbacks ({reason}); the last good state is "
                                           f"saved in {out}/checkpoint-last. Lower --lr or raise --beta")
            elif update["update/applied"]:  # a step that changed nothing says nothing about the KL
                beta_ctl.update(metrics.get("kl/mean", 0.0))
            metrics["lr"] = optimizer.param_groups[0]["lr"]
            state.step += 1
            set_lr(optimizer, cfg, state)
            metrics.update({"beta": beta,
                            "guard/skipped_steps": state.skipped_steps, "guard/rollbacks": state.rollbacks,
                            **timings, "time/update": time.perf_counter() - t1,
                            "time/step": time.perf_counter() - t0})
            logger.log(state.step, metrics)
            logger.log_samples(state.step, sample_rows(groups, cfg.log_samples, d))
            if stop is not None:  # saved after its logs, as every step: a resumed run's logs go on without a gap
                save_checkpoint()
                raise stop
            evaluation = held_out(state.step, pool) if eval_samples and training.eval_due(cfg, state.step) else {}
            # An evaluated step is checkpointed too, so checkpoint-best always holds the weights its
            # eval metrics describe; other checkpoints carry no eval metrics.
            if evaluation or training.checkpoint_due(cfg, state.step):
                save_checkpoint({**metrics, **evaluation})
                good = snapshot(policy, optimizer, beta_ctl, parts)
            progress.update(state.step, metrics)
        if eval_samples and d.main:
            change = eval_change(read_records(out / EVAL_FILE))
            if change:
                progress.note(change)
    return out


# ---------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rookworld.config import add_config_arguments
    from rookworld.flag_groups import ADVANCED, TRAIN

    training.add_run_arguments(parser, tables=", a [grpo] table the GRPO loss and KL fields, a [reward] table "
                               "the reward's")
    add_config_arguments(parser, TrainConfig, TRAIN, ADVANCED)
    add_config_arguments(parser, grpo.GRPOConfig, TRAIN, ADVANCED)
    add_config_arguments(parser, RewardConfig, TRAIN, ADVANCED)


def configs_from_args(args: argparse.Namespace) -> tuple[TrainConfig, grpo.GRPOConfig, RewardConfig]:
    configs = training.run_configs(args, {"train": TrainConfig, "grpo": grpo.GRPOConfig, "reward": RewardConfig})
    return configs["train"], configs["grpo"], configs["reward"]


def run(args: argparse.Namespace) -> int:
    cfg, gcfg, rcfg = configs_from_args(args)
    out = main(cfg, gcfg, resume=args.resume, rcfg=rcfg)
    print(f"run directory: {out}")
    return 0

