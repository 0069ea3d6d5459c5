"""`rookworld train`'s configuration: every field is a flag (`--field-name`) and a `[train]` TOML key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rookworld import training
from rookworld.generation import check_sampling
from rookworld.training import shared

ZERO_STD_MODES = ("keep", "drop", "resample")
P_TRUTHS = ("stored", "engine")


@dataclass
class TrainConfig:
    # a resumed run continues its checkpoint's policy; --model is also its KL reference, which must not change
    KEPT_ON_RESUME: ClassVar[tuple[str, ...]] = ("model",)
    model: str | None = field(default=None, metadata={"help": "policy checkpoint: a directory or hub id "
                                                      "(default: the embedded model)"})
    data: str = field(default="embedded", metadata={"help": "training data: embedded, a local path or a hub id"})
    out: str = shared("out", "runs/grpo")
    steps: int = shared("steps", 200)
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
                "split"})
    eval_draws: int = field(default=4, metadata={"help": "besides greedy, draw N completions per eval prompt at "
                                                 "eval_temperature (eval/sampled/...; 0: greedy only)"})
    eval_sampled_limit: int = field(default=200, metadata={
        "help": "held-out samples (half P, half A) of the sampled eval"})
    eval_temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the sampled eval"})
    eval_self_play: int = field(default=64, metadata={
        "help": "greedy games of the model against itself at each eval, from seeded random openings and stopped at "
                "the first illegal move (eval/selfplay/legal_half_moves; 0: none)"})
    eval_world_games: int = field(default=0, metadata={
        "help": "greedy games of the model against itself in its own world at each eval (each next state from its A "
                "completion, checked by the arbiter): eval/world/plies_to_divergence, eval/world/a_exact (0: none)"})
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
                   for name in ("resample_rounds", "max_rollbacks", "log_samples", "eval_world_games")]
        for ok, reason in checks:
            if not ok:
                raise ValueError(reason)
        check_sampling(self.temperature_p, self.top_p_p, "temperature_p, top_p_p")
        check_sampling(self.temperature_a, self.top_p_a, "temperature_a, top_p_a")
        check_sampling(self.eval_temperature, 1.0, "eval_temperature")
