"""Which `--help` section each config flag of `rookworld train` and `rookworld sft` belongs to.

A flag missing from its command's table is a programming error (the parser refuses to build), so a new
config field cannot land without a place in the help. Advanced flags keep their defaults in normal use;
their help text says so.
"""

from __future__ import annotations

# `rookworld train`'s sections say what kind of option each holds: the default run's knobs (its measured
# settings), the seed controls (the options of the GRPO systems this trainer reimplements: DeepSeekMath's GRPO,
# DAPO, Dr. GRPO, TRL's GRPOTrainer), the guards, evaluation, checkpoints and logging, and hardware.
TRAIN: dict[str, list[str]] = {
    "the default run's knobs: model and data": ["model", "data", "seed", "steps", "batch_size", "group_size",
                                                "p_fraction"],
    "the default run's knobs: sampling": ["temperature_p", "temperature_a", "top_p_p", "top_p_a", "max_new_tokens_p",
                                          "max_new_tokens_a", "zero_std", "resample_rounds", "draft_a"],
    "the default run's knobs: optimisation": ["lr", "warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip"],
    "the default run's knobs: reward": ["p_best_move_weight", "p_candidates_weight", "p_evals_weight",
                                        "p_format_weight", "best_move_shape", "best_move_scale", "best_move_illegal",
                                        "p_truth"],
    "the default run's knobs: KL and the A task": ["beta", "beta_a_scale", "learn_a"],
    "seed controls: advantages and loss (GRPO, DAPO, Dr. GRPO, TRL)": [
        "baseline", "ema_momentum", "std_scaling", "std_floor", "adv_clip", "aggregation", "eps_low", "eps_high",
        "entropy_coef", "mask_truncated", "num_iterations"],
    "seed controls: KL and schedules (GRPO, PPO, TRL)": [
        "kl_estimator", "kl_direction", "kl_importance_weight", "beta_schedule", "beta_warmup_steps",
        "beta_ramp_steps", "kl_target", "kl_horizon", "beta_min", "beta_max", "lr_schedule", "min_lr_ratio",
        "reward_warmup_steps"],
    "guards (0 turns one off)": ["kl_max", "reward_drop", "lr_backoff", "max_rollbacks"],
    "eval": ["eval_every", "eval_limit", "eval_draws", "eval_sampled_limit", "eval_temperature", "eval_self_play",
             "eval_world_games"],
    "checkpoints, logging and debugging": ["out", "checkpoint_every", "keep_last", "tensorboard", "wandb_project",
                                           "log_samples", "overfit_single_batch"],
    "hardware": ["device", "threads", "ref_device", "processes", "engine_rewards", "fast_decode", "micro_batch_size",
                 "rollout_chunk"],
}

SFT: dict[str, list[str]] = {
    "model and data": ["data", "data_limit", "init_from", "preset", "n_layer", "n_head", "n_embd", "n_positions",
                       "tokenizer_vocab", "tokenizer_view", "mode", "seq_len", "p_fraction", "fresh_a", "seed"],
    "optimisation": ["steps", "batch_size", "grad_accum", "lr", "lr_schedule", "min_lr_ratio", "warmup_steps",
                     "weight_decay", "beta1", "beta2", "grad_clip"],
    "eval": ["eval_every", "eval_samples", "eval_loss_samples", "eval_batch_size", "best_metric"],
    "checkpoints and logging": ["out", "checkpoint_every", "keep_last", "export", "export_dtype", "tensorboard"],
    "hardware": ["device", "threads"],
}

ADVANCED = frozenset({
    "resample_rounds", "rollout_chunk", "micro_batch_size", "overfit_single_batch", "std_floor", "adv_clip",
    "entropy_coef", "kl_importance_weight", "beta_warmup_steps", "beta_ramp_steps", "kl_target", "kl_horizon",
    "beta_min", "beta_max", "lr_backoff", "max_rollbacks", "log_samples", "ref_device", "processes",
    "engine_rewards", "beta1", "beta2", "eval_loss_samples", "eval_batch_size", "seq_len", "tokenizer_vocab",
})
