"""One GRPO step, top to bottom: sample, score, advantages, loss, update (`take_step`).

B prompts are sampled G times each and scored (rollout.py), their (B, G) rewards become advantages against
the baseline (grpo.advantages), and the policy takes cfg.num_iterations optimizer steps on the clipped
token-level loss (grpo.loss) over micro-batches. The run around the step (guards, evaluation, checkpoints,
resume) is train.py's.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from rookworld import grpo
from rookworld.data.record import Sample
from rookworld.generation import FastDecoder, SamplingSettings
from rookworld.rewards import RewardConfig, weights_at
from rookworld.rollout import Batch, Group, GroupSummary, RolloutConfig, collect
from rookworld.runtime import Dist, all_gather_objects, all_sum, fast_path
from rookworld.train_config import TrainConfig

# grpo.loss stats: loss terms add up over micro-batches; the others are token means (ratio/max: a max, apart)
SUMMED_STATS = ("loss", "pg_loss", "kl_loss", "entropy_loss")
TOKEN_MEAN_STATS = ("kl/mean", "entropy", "clip_frac", "clip_frac/low", "clip_frac/high", "ratio/mean")


def rollout_config(cfg: TrainConfig, rcfg: RewardConfig, limits: dict[str, int], d: Dist) -> RolloutConfig:
    """The rollout's settings from the run's: chunks of --rollout-chunk prompts (default: the batch split over the
    torchrun ranks, rounded up, so every rank samples), and resampling only under --zero-std resample without
    --overfit-single-batch (which trains on its one batch, zero-std groups dropped)."""
    resample = cfg.zero_std == "resample" and not cfg.overfit_single_batch
    return RolloutConfig(
        seed=cfg.seed, group_size=cfg.group_size, chunk=cfg.rollout_chunk or math.ceil(cfg.batch_size / d.world),
        settings={"P": SamplingSettings(cfg.temperature_p, top_p=cfg.top_p_p, max_new_tokens=limits["P"]),
                  "A": SamplingSettings(cfg.temperature_a, top_p=cfg.top_p_a, max_new_tokens=limits["A"])},
        draft_a=cfg.draft_a, stored_truth=cfg.p_truth == "stored", engine_rewards=cfg.engine_rewards,
        resample_rounds=cfg.resample_rounds if resample else 0, reward=rcfg)


def take_step(policy, reference, optimizer, tokenizer, sampler, samples: list[Sample], cfg: TrainConfig,
              gcfg: grpo.GRPOConfig, rollout_cfg: RolloutConfig, step: int, beta: float, ema: grpo.EMABaseline | None,
              pool, d: Dist, decoder: FastDecoder | None = None) -> tuple[list[Group | None], dict[str, float]]:
    """Step `step` (0-based) on the prompts `samples`: this rank's groups and the step's metrics (every rank's)."""
    timings: dict[str, float] = {}
    if decoder is not None:
        decoder.sync(policy)
    # sample and score: G completions per prompt, zero-std groups replaced by new prompts
    groups, summaries = collect(policy, tokenizer, sampler, samples, rollout_cfg, step, pool, d, timings, decoder)
    # advantages: each group's rewards against the baseline
    adv = step_advantages(summaries, gcfg, ema)
    learn = learning_groups(groups, adv, cfg)
    metrics = step_metrics(summaries, adv)
    if ema is not None:
        metrics.update({f"baseline/{task}": mean for task, mean in ema.means.items()})
    if rollout_cfg.reward.reward_warmup_steps:
        metrics.update({f"reward_weight/{task}/{name}": w for task, weights in
                        weights_at(rollout_cfg.reward, step).items() for name, w in weights.items()})
    # loss and update: the groups that enter the loss, packed once per prompt
    t0 = time.perf_counter()
    device = policy.wte.weight.device
    batch = Batch.of([groups[i] for i in learn], [adv.values[i].to(device) for i in learn]) if learn else None
    metrics.update(policy_update(policy, reference, optimizer, batch, gcfg, cfg, beta,
                                 max(s.max_new_tokens for s in rollout_cfg.settings.values()), d))
    return groups, {**metrics, **timings, "time/update": time.perf_counter() - t0}


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


def learning_groups(groups: list[Group | None], adv: grpo.Advantages, cfg: TrainConfig) -> list[int]:
    """Indices of this rank's groups that enter the loss (zero-std ones only with zero_std 'keep')."""
    return [i for i, g in enumerate(groups) if g is not None and not (cfg.zero_std != "keep" and bool(adv.zero_std[i]))]


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
