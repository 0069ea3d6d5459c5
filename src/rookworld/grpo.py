"""GRPO math: advantages, the clipped token-level policy-gradient loss, KL terms, the beta schedule.

Pure tensor code: no model, no I/O. The trainer samples G completions per prompt, scores them, and calls
`advantages` on the (B, G) rewards, then `loss` once per micro-batch on flat (N, T) completion tensors
(N = sequences, T = completion positions). `BetaController` gives the KL coefficient of each step.

Per loss token t of sequence i (the mask after optional truncation masking):

    r_it   = exp(logp_it - old_logp_it)                   ratio to the SAMPLING policy (not the reference)
    pg_it  = -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)
    kl_it  = k3: exp(ref - logp) - (ref - logp) - 1       sampled-token estimates of KL(pi || pi_ref)
             k1: logp - ref
             full: the exact full-vocabulary KL at that position, computed elsewhere (model.token_logprobs):
                   reverse KL(pi || pi_ref), forward KL(pi_ref || pi) or their mean (kl_direction)
             (k1/k3 times r_it when kl_importance_weight: then their gradient estimates the KL's gradient)
    l_it   = pg_it + beta * w_i * kl_it - entropy_coef * H_it
                                                          (w_i: kl_weight, 1 by default; beta_a_scale on A rows)

and the loss aggregates l over loss tokens (n_i = loss tokens of sequence i):

    grpo     sum_i (sum_t l_it / n_i) / N           per-sequence mean, then mean over sequences
    bnpo     sum_it l_it / sum_i n_i                token mean of this call's batch
    dapo     sum_it l_it / n_global                 token mean of the global batch (accumulation-safe)
    dr_grpo  sum_it l_it / (N * L_max)              constant denominator, L_max = max completion length

For gradient accumulation `normalizer` replaces the denominator of grpo (N), dapo (n_global) and
dr_grpo (N * L_max) by its value over the whole global batch (`global_normalizer`): the micro-batch
losses then sum to the global-batch loss even when micro-batches differ in size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

BASELINES = ("group", "rloo", "ema")
STD_SCALINGS = ("group", "batch", "none")
AGGREGATIONS = ("grpo", "bnpo", "dapo", "dr_grpo")
KL_ESTIMATORS = ("k3", "k1", "full")
KL_DIRECTIONS = ("reverse", "forward", "symmetric")
BETA_SCHEDULES = ("fixed", "warmup", "adaptive")
ADAPTIVE_ERROR_CLIP = 0.2  # the PPO adaptive KL controller's bound on the proportional error


@dataclass
class GRPOConfig:
    # the beta controller's saved state belongs to its schedule: a resumed run cannot switch to another
    KEPT_ON_RESUME: ClassVar[tuple[str, ...]] = ("beta_schedule",)
    baseline: str = field(default="group", metadata={
        "help": "what a reward is compared with: 'group' (the mean of the prompt's G rewards), 'rloo' (the mean "
                "of the other G-1: leave-one-out) or 'ema' (a per-task moving average of earlier steps' rewards)"})
    ema_momentum: float = field(default=0.9, metadata={
        "help": "ema baseline: after each step, ema = m * ema + (1 - m) * the step's mean reward of the task"})
    std_scaling: str = field(default="group", metadata={
        "help": "advantage scale: 'group' (std of the prompt's G rewards), 'batch' (std of all rewards of the "
                "step), 'none' (group-mean baseline only, as in Dr. GRPO)"})
    std_floor: float = field(default=1e-4, metadata={
        "help": "advantages are divided by max(std, std_floor); one constant for the whole run"})
    adv_clip: float | None = field(default=None, metadata={
        "help": "clip advantages to [-adv_clip, adv_clip] after scaling (unset: no clipping)"})
    aggregation: str = field(default="dapo", metadata={
        "help": "how token losses become one number: grpo, bnpo, dapo or dr_grpo (see grpo.py)"})
    eps_low: float = field(default=0.2, metadata={
        "help": "PPO clip range below 1: the ratio is clipped at 1 - eps_low"})
    eps_high: float = field(default=0.2, metadata={
        "help": "PPO clip range above 1: the ratio is clipped at 1 + eps_high (DAPO's clip-higher uses 0.28)"})
    beta: float = field(default=0.02, metadata={
        "help": "KL coefficient (the value after warm-up; the start value of the adaptive schedule)"})
    beta_a_scale: float = field(default=5.0, metadata={
        "help": "multiplies beta on the A prompts' completions (1: the same KL as P's); the schedules move beta, "
                "and A's follows it"})
    learn_a: bool = field(default=True, metadata={
        "help": "whether the A prompts' rewards teach: false sets their advantages to 0, so an A completion "
                "carries only its KL term (beta x beta_a_scale)"})
    kl_estimator: str = field(default="k3", metadata={
        "help": "KL to the reference: 'k3' or 'k1' (estimates on sampled tokens) or 'full' (exact "
                "full-vocabulary KL per position, computed by the model code)"})
    kl_direction: str = field(default="reverse", metadata={
        "help": "kl_estimator 'full' only: 'reverse' KL(pi || pi_ref) (mode-seeking; what k1/k3 estimate), "
                "'forward' KL(pi_ref || pi) (mass-covering) or 'symmetric' (the mean of the two)"})
    kl_importance_weight: bool | None = field(default=None, metadata={
        "help": "multiply k1/k3 by the ratio pi/pi_sampling so that their gradient estimates the gradient of "
                "KL(pi || pi_ref) (default: true for k1/k3, false for 'full', where it cannot be true)"})
    beta_schedule: str = field(default="fixed", metadata={
        "help": "'fixed', 'warmup' (beta 0 for beta_warmup_steps, then a linear ramp over beta_ramp_steps) or "
                "'adaptive' (multiplicative control toward kl_target)"})
    beta_warmup_steps: int = field(default=0, metadata={
        "help": "warmup schedule: optimizer steps with beta 0"})
    beta_ramp_steps: int = field(default=0, metadata={
        "help": "warmup schedule: steps of the linear ramp from 0 to beta after the warm-up (0: jump)"})
    kl_target: float = field(default=0.01, metadata={
        "help": "adaptive schedule: target mean per-token KL (the `kl/mean` metric)"})
    kl_horizon: float = field(default=10.0, metadata={
        "help": "adaptive schedule: beta *= 1 + clip(kl/kl_target - 1, -0.2, 0.2) / kl_horizon each step"})
    beta_min: float = field(default=0.0, metadata={"help": "adaptive schedule: lower bound of beta"})
    beta_max: float = field(default=1.0, metadata={"help": "adaptive schedule: upper bound of beta"})
    entropy_coef: float = field(default=0.0, metadata={
        "help": "entropy bonus: the loss subtracts entropy_coef times the aggregated token entropy"})
    mask_truncated: bool = field(default=False, metadata={
        "help": "exclude completions that hit max_new_tokens without EOS from the loss"})

    def __post_init__(self) -> None:
        if self.kl_importance_weight is None:  # follows the estimator: only sampled-token estimates take it
            self.kl_importance_weight = self.kl_estimator != "full"
        checks = [
            (self.baseline in BASELINES, f"baseline must be one of {BASELINES}, got {self.baseline!r}"),
            (self.beta_a_scale >= 0, f"beta_a_scale must be >= 0, got {self.beta_a_scale}"),
            (0 <= self.ema_momentum < 1, f"ema_momentum must be in [0, 1) (1 would never move), "
                                         f"got {self.ema_momentum}"),
            (self.std_scaling in STD_SCALINGS, f"std_scaling must be one of {STD_SCALINGS}, got {self.std_scaling!r}"),
            (self.std_floor > 0, f"std_floor must be > 0 so that equal rewards cannot divide by zero, "
                                 f"got {self.std_floor}"),
            (self.adv_clip is None or self.adv_clip > 0, f"adv_clip must be > 0 (or unset), got {self.adv_clip}"),
            (self.aggregation in AGGREGATIONS, f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}"),
            (0 <= self.eps_low < 1, f"eps_low must be in [0, 1) so that the lower clip bound 1 - eps_low stays "
                                    f"positive, got {self.eps_low}"),
            (self.eps_high >= 0, f"eps_high must be >= 0 (the upper clip bound is 1 + eps_high), got {self.eps_high}"),
            (self.beta >= 0, f"beta must be >= 0 (a negative KL coefficient rewards drifting away), got {self.beta}"),
            (self.kl_estimator in KL_ESTIMATORS,
             f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}"),
            (self.kl_direction in KL_DIRECTIONS,
             f"kl_direction must be one of {KL_DIRECTIONS}, got {self.kl_direction!r}"),
            (self.kl_direction == "reverse" or self.kl_estimator == "full",
             f"kl_direction {self.kl_direction!r} needs kl_estimator 'full': k1 and k3 estimate the reverse "
             f"KL(pi || pi_ref) from tokens sampled by pi"),
            (not (self.kl_estimator == "full" and self.kl_importance_weight),
             "kl_importance_weight must be false with kl_estimator 'full': the exact per-position KL is not a "
             "sampled-token estimate, so the sampled token's ratio does not belong on it"),
            (self.beta_schedule in BETA_SCHEDULES,
             f"beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}"),
            (self.beta_warmup_steps >= 0 and self.beta_ramp_steps >= 0,
             f"beta_warmup_steps and beta_ramp_steps must be >= 0, got {self.beta_warmup_steps}, "
             f"{self.beta_ramp_steps}"),
            (self.beta_schedule == "warmup" or (self.beta_warmup_steps == 0 and self.beta_ramp_steps == 0),
             f"beta_warmup_steps/beta_ramp_steps only act with beta_schedule 'warmup', "
             f"not {self.beta_schedule!r}"),
            (self.kl_target > 0, f"kl_target must be > 0 (the controller divides by it), got {self.kl_target}"),
            (self.kl_horizon >= 1, f"kl_horizon must be >= 1 step, got {self.kl_horizon}"),
            (0 <= self.beta_min <= self.beta_max,
             f"need 0 <= beta_min <= beta_max, got beta_min={self.beta_min}, beta_max={self.beta_max}"),
            (self.beta_schedule != "adaptive" or (self.beta > 0 and self.beta_min <= self.beta <= self.beta_max),
             f"the adaptive schedule multiplies beta, so it needs 0 < beta in [beta_min, beta_max], "
             f"got beta={self.beta} in [{self.beta_min}, {self.beta_max}]"),
            (self.entropy_coef >= 0, f"entropy_coef must be >= 0 (it is a bonus), got {self.entropy_coef}"),
        ]
        for ok, reason in checks:
            if not ok:
                raise ValueError(reason)


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor     # (B, G)
    zero_std: torch.Tensor   # (B,) bool: all G rewards equal, so the group carries no learning signal
    frac_zero_std: float


def advantages(rewards: torch.Tensor, cfg: GRPOConfig, baseline: torch.Tensor | None = None) -> Advantages:
    """A_ij = (R_ij - b_ij) / max(std, std_floor), then clipped to +-adv_clip.

    b_ij by cfg.baseline: 'group' the mean of the group's G rewards; 'rloo' the mean of the other G-1
    (= G/(G-1) times the group-centred reward); 'ema' `baseline` (B,), each group's value of an `EMABaseline`.
    std is the (unbiased) std of the group's rewards ('group'), of all B*G rewards ('batch'), or 1 ('none').
    Groups whose G rewards are all equal are returned in `zero_std` so the trainer can drop or resample them
    (dynamic sampling); they get exactly 0 (float rounding of their mean cannot leak in), except under the
    'ema' baseline without the group std, where R - b is a signal.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (B, G) with G >= 2 completions per prompt for a group baseline, "
                         f"got shape {tuple(rewards.shape)}")
    rewards = rewards.float()
    B, G = rewards.shape
    zero_std = (rewards == rewards[:, :1]).all(dim=1)  # (B,)
    outside = cfg.baseline == "ema"
    if outside:
        if baseline is None or tuple(baseline.shape) != (B,):
            raise ValueError(f"baseline 'ema' needs each group's baseline value, (B,) = ({B},), got "
                             f"{None if baseline is None else tuple(baseline.shape)}")
        centered = rewards - baseline.float()[:, None]  # (B, G)
    else:
        centered = rewards - rewards.mean(dim=1, keepdim=True)  # (B, G)
        if cfg.baseline == "rloo":
            centered = centered * (G / (G - 1))
    if cfg.std_scaling != "none":
        std = rewards.std(dim=1, keepdim=True) if cfg.std_scaling == "group" else rewards.std()
        centered = centered / std.clamp(min=cfg.std_floor)
    if cfg.adv_clip is not None:
        centered = centered.clamp(-cfg.adv_clip, cfg.adv_clip)
    if not outside or cfg.std_scaling == "group":
        centered = centered.masked_fill(zero_std[:, None], 0.0)  # (B, G)
    return Advantages(values=centered, zero_std=zero_std, frac_zero_std=zero_std.float().mean().item())


class EMABaseline:
    """The 'ema' baseline: a per-task exponential moving average of the rewards of earlier steps.

    `values(tasks, rewards)` gives each group the average of its task before this step (a task's first
    step: that step's mean reward of the task, so nothing is compared with an arbitrary start); `update`
    then folds in the step's mean: ema = momentum * ema + (1 - momentum) * mean.
    """

    def __init__(self, momentum: float) -> None:
        self.momentum = momentum
        self.means: dict[str, float] = {}

    @staticmethod
    def _task_means(tasks: list[str], rewards: torch.Tensor) -> dict[str, float]:
        rows: dict[str, list[int]] = {}
        for i, task in enumerate(tasks):
            rows.setdefault(task, []).append(i)
        return {task: float(rewards[idx].float().mean()) for task, idx in rows.items()}

    def values(self, tasks: list[str], rewards: torch.Tensor) -> torch.Tensor:
        """(B,) baseline of each group of the step's (B, G) rewards."""
        now = self._task_means(tasks, rewards)
        return torch.tensor([self.means.get(task, now[task]) for task in tasks])

    def update(self, tasks: list[str], rewards: torch.Tensor) -> None:
        for task, mean in self._task_means(tasks, rewards).items():
            old = self.means.get(task)
            self.means[task] = mean if old is None else self.momentum * old + (1 - self.momentum) * mean

    def state_dict(self) -> dict[str, Any]:
        return {"means": dict(self.means)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.means = {task: float(v) for task, v in state["means"].items()}


def _loss_mask(mask: torch.Tensor, cfg: GRPOConfig, truncated: torch.Tensor | None) -> torch.Tensor:
    """(N, T) bool: completion tokens, minus truncated completions when cfg.mask_truncated."""
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be bool or hold only 0 and 1 (token weights are not supported)")
        mask = mask.bool()
    if cfg.mask_truncated:
        if truncated is None:
            raise ValueError("cfg.mask_truncated is set: pass `truncated` (N,) bool, True where a completion "
                             "hit max_new_tokens without EOS")
        if truncated.shape != mask.shape[:1]:
            raise ValueError(f"truncated must be (N,) = {tuple(mask.shape[:1])}, got {tuple(truncated.shape)}")
        mask = mask & ~truncated.bool()[:, None]
    return mask


def _denominator(keep: torch.Tensor, cfg: GRPOConfig, max_completion_length: int | None) -> float:
    """cfg.aggregation's denominator for the loss mask `keep` (N, T)."""
    if cfg.aggregation == "grpo":
        return float(keep.shape[0])
    if cfg.aggregation in ("bnpo", "dapo"):
        return max(float(keep.sum()), 1.0)
    longest = int(keep.sum(dim=1).max()) if keep.numel() else 0  # loss tokens of the longest completion
    if max_completion_length is None or max_completion_length < longest:
        raise ValueError(f"aggregation 'dr_grpo' needs max_completion_length (its constant denominator) >= the "
                         f"longest completion's {longest} loss tokens, got {max_completion_length}")
    return float(keep.shape[0] * max_completion_length)


def global_normalizer(mask: torch.Tensor, cfg: GRPOConfig, *, truncated: torch.Tensor | None = None,
                      max_completion_length: int | None = None) -> float:
    """The denominator of cfg.aggregation over a whole batch (N, T), to pass to each micro-batch's `loss`.

    grpo: N sequences (truncated ones included: they add 0, as in TRL); dapo: loss tokens after truncation
    masking (at least 1); dr_grpo: N * max_completion_length. bnpo is by definition a per-call token mean
    and has none (average the micro-batch losses instead).
    """
    if cfg.aggregation == "bnpo":
        raise ValueError("aggregation 'bnpo' normalizes each call by its own token count and takes no global "
                         "normalizer; use 'dapo' for a global-batch token mean")
    return _denominator(_loss_mask(mask, cfg, truncated), cfg, max_completion_length)


def _sampled_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """(N, T) per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probs."""
    log_ref_ratio = ref_logp - logp  # (N, T)
    if estimator == "k3":
        return torch.exp(log_ref_ratio) - log_ref_ratio - 1
    return -log_ref_ratio  # k1


def loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None, adv: torch.Tensor,
         mask: torch.Tensor, cfg: GRPOConfig, *, beta: float | None = None,
         kl_per_token: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
         truncated: torch.Tensor | None = None, normalizer: float | None = None,
         max_completion_length: int | None = None,
         kl_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar GRPO loss of one (micro-)batch and its stats (see the module docstring for the formulas).

    logp (N, T): current policy's log-probs of the sampled ids, with grad. old_logp (N, T): the sampling
    policy's (detached here; pass logp.detach() when each batch is used once: ratio 1, gradient -A/denom).
    ref_logp (N, T) for k1/k3, or kl_per_token (N, T) for 'full' (with grad, from the model code); both may
    be None when beta == 0. adv (N,): each sequence's advantage. mask (N, T): completion tokens. beta: this
    step's coefficient (BetaController.beta; default cfg.beta). entropy (N, T): per-token entropy with grad,
    needed when cfg.entropy_coef > 0. truncated (N,) bool: used when cfg.mask_truncated.
    normalizer: see `global_normalizer`. max_completion_length: dr_grpo's L_max when no normalizer is given.
    kl_weight (N,): each sequence's multiplier of beta (the trainer's `beta_a_scale` on A rows); None: 1.

    Stats (floats). This call's terms -- with a global normalizer they sum over micro-batches to the step's:
      `loss` = `pg_loss` + `kl_loss` + `entropy_loss`, `kl_loss` = beta * aggregated w_i * KL,
      `entropy_loss` = -entropy_coef * aggregated entropy.
      `kl_share` = |kl_loss| / (|pg_loss| + |kl_loss| + |entropy_loss|), 0 when all three are 0. It compares
      term values, not gradients: near ratio 1 pg_loss is small because the advantages are centred.
    Means over this call's loss tokens (0 when it has none):
      `kl/mean` (only with a KL input), `entropy` (only with `entropy`), `ratio/mean`, `ratio/max` (the max),
      `clip_frac` = `clip_frac/low` + `clip_frac/high`: tokens whose gradient the clip removes
      (r < 1 - eps_low with A < 0; r > 1 + eps_high with A > 0).
    Over the N advantages: `adv/mean`, `adv/std` (population std), `adv/abs_max`.
    """
    beta = cfg.beta if beta is None else beta
    shape = tuple(logp.shape)
    named = {"old_logp": old_logp, "ref_logp": ref_logp, "kl_per_token": kl_per_token, "entropy": entropy,
             "mask": mask}
    for name, tensor in named.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have logp's shape {shape}, got {tuple(tensor.shape)}")
    if kl_weight is not None and tuple(kl_weight.shape) != shape[:1]:
        raise ValueError(f"kl_weight must be (N,) = {shape[:1]}, one per sequence, got {tuple(kl_weight.shape)}")
    if tuple(adv.shape) != shape[:1]:
        raise ValueError(f"adv must be (N,) = {shape[:1]}, one per sequence, got {tuple(adv.shape)}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    needed, unused = ("kl_per_token", ref_logp) if cfg.kl_estimator == "full" else ("ref_logp", kl_per_token)
    kl_input = named[needed]
    if unused is not None:
        raise ValueError(f"kl_estimator {cfg.kl_estimator!r} takes `{needed}`, not the other KL input")
    if beta > 0 and kl_input is None:
        raise ValueError(f"beta={beta} > 0 with kl_estimator {cfg.kl_estimator!r} needs `{needed}`")
    if cfg.entropy_coef > 0 and entropy is None:
        raise ValueError(f"entropy_coef={cfg.entropy_coef} > 0 needs the per-token `entropy`")
    if normalizer is not None and cfg.aggregation == "bnpo":
        raise ValueError("aggregation 'bnpo' takes no normalizer (see global_normalizer)")
    if normalizer is not None and normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")

    keep = _loss_mask(mask, cfg, truncated)  # (N, T) bool
    denom = normalizer if normalizer is not None else _denominator(keep, cfg, max_completion_length)

    def masked(x: torch.Tensor) -> torch.Tensor:
        # Zero outside the loss mask before any exp: padding may hold anything (even inf) without leaking.
        return x.float().masked_fill(~keep, 0.0)  # (N, T)

    def aggregate(x: torch.Tensor) -> torch.Tensor:  # x (N, T), zero outside the mask
        if cfg.aggregation == "grpo":
            return (x.sum(dim=1) / keep.sum(dim=1).clamp(min=1)).sum() / denom
        return x.sum() / denom

    logp = masked(logp)
    adv_col = adv.float().detach()[:, None]  # (N, 1)
    ratio = torch.exp(logp - masked(old_logp.detach()))  # (N, T); 1 outside the mask
    clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)  # (N, T)
    pg = masked(-torch.minimum(ratio * adv_col, clipped * adv_col))  # (N, T)
    pg_loss = aggregate(pg)
    total = pg_loss

    kl = None
    if kl_input is not None:
        if cfg.kl_estimator == "full":
            kl = masked(kl_per_token)
        else:
            kl = _sampled_kl(logp, masked(ref_logp.detach()), cfg.kl_estimator)
            if cfg.kl_importance_weight:
                kl = kl * ratio  # (N, T)
        weighted = kl if kl_weight is None else kl * kl_weight.float()[:, None]  # (N, T)
        kl_loss = beta * aggregate(weighted)
        total = total + kl_loss
    else:
        kl_loss = pg_loss.new_zeros(())

    entropy_loss = pg_loss.new_zeros(())
    if entropy is not None:
        entropy = masked(entropy)  # (N, T)
        if cfg.entropy_coef > 0:
            entropy_loss = -cfg.entropy_coef * aggregate(entropy)
            total = total + entropy_loss

    with torch.no_grad():
        n_tokens = keep.sum().clamp(min=1)

        def token_mean(x: torch.Tensor) -> torch.Tensor:
            return x.float().masked_fill(~keep, 0.0).sum() / n_tokens

        clip_low = (ratio < 1 - cfg.eps_low) & (adv_col < 0)  # (N, T)
        clip_high = (ratio > 1 + cfg.eps_high) & (adv_col > 0)  # (N, T)
        adv = adv.float()
        scalars = {
            "loss": total,
            "pg_loss": pg_loss,
            "kl_loss": kl_loss,
            "entropy_loss": entropy_loss,
            "clip_frac": token_mean(clip_low | clip_high),
            "clip_frac/low": token_mean(clip_low),
            "clip_frac/high": token_mean(clip_high),
            "ratio/mean": token_mean(ratio),
            "ratio/max": ratio.masked_fill(~keep, 0.0).max(),
            "adv/mean": adv.mean(),
            "adv/std": adv.std(correction=0),
            "adv/abs_max": adv.abs().max(),
        }
        if kl is not None:
            scalars["kl/mean"] = token_mean(kl)
        if entropy is not None:
            scalars["entropy"] = token_mean(entropy)
        # One device-to-host copy for all stats instead of one sync each.
        stats = dict(zip(scalars, torch.stack([v.float() for v in scalars.values()]).tolist()))
    terms = [abs(stats[name]) for name in ("pg_loss", "kl_loss", "entropy_loss")]
    stats["kl_share"] = terms[1] / sum(terms) if sum(terms) > 0 else 0.0
    return total, stats


class BetaController:
    """The KL coefficient of each optimizer step: read `beta`, take the step, then call `update(kl)`.

    With s = updates so far: fixed: cfg.beta. warmup: 0 while s < W = beta_warmup_steps, then
    cfg.beta * min(1, (s - W + 1) / R) with R = beta_ramp_steps (R = 0: cfg.beta at once).
    adaptive (PPO's adaptive KL controller), after each step:
    beta *= 1 + clip(kl / kl_target - 1, -0.2, 0.2) / kl_horizon, then clamped to [beta_min, beta_max].
    """

    def __init__(self, cfg: GRPOConfig) -> None:
        self.cfg = cfg
        self.num_updates = 0
        self._adaptive_beta = cfg.beta

    @property
    def beta(self) -> float:
        cfg = self.cfg
        if cfg.beta_schedule == "adaptive":
            return self._adaptive_beta
        if cfg.beta_schedule == "warmup":
            if self.num_updates < cfg.beta_warmup_steps:
                return 0.0
            if cfg.beta_ramp_steps > 0:
                return cfg.beta * min(1.0, (self.num_updates - cfg.beta_warmup_steps + 1) / cfg.beta_ramp_steps)
        return cfg.beta

    def update(self, kl: float | None = None) -> float:
        """Advance one optimizer step; `kl` (the step's mean per-token KL) is required by 'adaptive'.
        Returns the beta of the next step."""
        if self.cfg.beta_schedule == "adaptive":
            if kl is None or not math.isfinite(kl):
                raise ValueError(f"the adaptive beta schedule needs the step's finite mean KL, got {kl}")
            error = min(max(kl / self.cfg.kl_target - 1.0, -ADAPTIVE_ERROR_CLIP), ADAPTIVE_ERROR_CLIP)
            updated = self._adaptive_beta * (1.0 + error / self.cfg.kl_horizon)
            self._adaptive_beta = min(max(updated, self.cfg.beta_min), self.cfg.beta_max)
        self.num_updates += 1
        return self.beta

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": self.cfg.beta_schedule, "num_updates": self.num_updates,
                "adaptive_beta": self._adaptive_beta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("schedule") != self.cfg.beta_schedule:
            raise ValueError(f"beta controller state is for schedule {state.get('schedule')!r}, but the config "
                             f"says {self.cfg.beta_schedule!r}; resume with the run's own beta_schedule")
        self.num_updates = int(state["num_updates"])
        self._adaptive_beta = float(state["adaptive_beta"])

