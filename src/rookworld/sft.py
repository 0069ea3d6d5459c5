"""`rookworld sft [--config FILE] [--preset tiny] [--data embedded] [--out runs/sft] [--resume OUT]`

Supervised training of a RookWorld GPT on P and A samples, from scratch (a size preset, a chess
tokenizer trained on the data) or from a checkpoint (`--init-from DIR|hub id`), optionally deepened
(`--n-layer`: new layers spread between the old ones, starting as identities; `model.grow_depth`).

Two ways to turn samples into training rows (`--mode`):
- `target` (default): one sample per row, `[eos] + prompt + target + [eos]`, right-padded (P and A rows each
  to their own longest, `by_task`); the loss covers the target and its final EOS only. Prompts are encoded
  exactly as evaluation encodes them (`Tokenizer.encode_prompts`), so training and generation see the same ids
  at the same positions.
- `packed`: documents `[eos] + prompt + target` concatenated and cut into rows of `seq_len + 1`
  tokens, loss on every token (RookWorld pretraining; the next document's EOS ends each target).

A samples cost only python-chess, so `--fresh-a F` replaces that share of the A samples drawn with
freshly made ones (see `data.fresh.FreshASamples`). AdamW, warm-up then a decaying learning rate (both from
training.py, shared with `rookworld train`), gradient accumulation, held-out target loss and the evaluation metrics of
`evaluate.evaluate_model` on a fixed eval subset, atomic checkpoints with exact resume (`--resume OUT`
continues OUT bit for bit on CPU), JSONL + TensorBoard logs and a progress bar.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rookworld import training
from rookworld.errors import UserError
from rookworld.training import shared

if TYPE_CHECKING:
    import torch

    from rookworld.data.record import Sample
    from rookworld.model import GPT
    from rookworld.tokenizer import Tokenizer

log = logging.getLogger(__name__)

MODES = ("target", "packed")
# Sizes of models trained from scratch; explicit --n-layer/--n-head/--n-embd/--n-positions override them.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 4, "n_head": 4, "n_embd": 128, "n_positions": 320},
    "small": {"n_layer": 6, "n_head": 8, "n_embd": 256, "n_positions": 320},
    "gpt2-124m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024},
}
TOKENIZER_TEXTS = 20_000  # training documents the chess tokenizer is trained on (more changes little)


@dataclass
class SFTConfig:
    # what made the model: a resumed run loads its checkpoint's model and tokenizer instead
    KEPT_ON_RESUME: ClassVar[tuple[str, ...]] = ("init_from", "preset", "n_layer", "n_head", "n_embd",
                                                 "n_positions", "tokenizer_vocab", "tokenizer_view")
    out: str = shared("out", "runs/sft")
    data: str = field(default="embedded", metadata={"help": "training data: embedded, a local file or "
                                                     "directory, or a hub dataset id"})
    data_limit: int | None = field(default=None, metadata={"help": "use at most this many training samples"})
    init_from: str | None = field(default=None, metadata={"help": "start from this checkpoint directory or "
                                                          "hub id instead of a new model"})
    preset: str = field(default="tiny", metadata={"help": f"size of a new model: {', '.join(PRESETS)}"})
    n_layer: int | None = field(default=None, metadata={"help": "layers of a new model (overrides the preset); "
                                                        "with --init-from, more layers than the model has "
                                                        "deepens it (new layers start as identities)"})
    n_head: int | None = field(default=None, metadata={"help": "attention heads of a new model"})
    n_embd: int | None = field(default=None, metadata={"help": "width of a new model"})
    n_positions: int | None = field(default=None, metadata={"help": "context length of a new model"})
    tokenizer_vocab: int = field(default=257, metadata={"help": "vocabulary of a new model's chess tokenizer; "
                                                        "257 = one token per character (byte) plus EOS"})
    tokenizer_view: str | None = field(default=None, metadata={
        "help": "how the tokenizer writes boards: fen; squares (square by square, '_' for an empty square); named "
                "(each rank opens with its number, an empty square is its file's letter s..z); in squares and "
                "named, padding as one space. A new model's default: fen; with --init-from, another view than the "
                "model's converts it (it relearns to read boards); default: its own"})
    mode: str = field(default="target", metadata={"help": "target: one sample per row, loss on the target; "
                                                  "packed: documents concatenated, loss on every token"})
    seq_len: int = field(default=256, metadata={"help": "packed mode: tokens per row"})
    p_fraction: float = field(default=0.5, metadata={"help": "share of P samples in the training mix"})
    fresh_a: float = field(default=0.0, metadata={"help": "share of A samples replaced by freshly generated "
                                                  "ones (python-chess only)"})
    batch_size: int = field(default=32, metadata={"help": "rows per micro-batch"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    steps: int = shared("steps", 1000)
    lr: float = shared("lr", 2e-3)
    lr_schedule: str = shared("lr_schedule", "cosine")
    min_lr_ratio: float = shared("min_lr_ratio", 0.1)
    warmup_steps: int = shared("warmup_steps", 50)
    weight_decay: float = shared("weight_decay", 0.1)
    beta1: float = shared("beta1", 0.9)
    beta2: float = shared("beta2", 0.99)
    grad_clip: float = shared("grad_clip", 1.0)
    eval_every: int = shared("eval_every", 250)
    eval_samples: int = field(default=128, metadata={"help": "eval-split samples (half P, half A) generated "
                                                     "greedily for the metrics"})
    eval_loss_samples: int = field(default=256, metadata={"help": "eval-split samples of the held-out loss"})
    eval_batch_size: int = field(default=64, metadata={"help": "prompts per generation batch in evaluation"})
    checkpoint_every: int = shared("checkpoint_every", 250)
    keep_last: int = shared("keep_last", 2)
    best_metric: str = field(default="eval/loss", metadata={"help": "eval metric that picks checkpoint-best: its "
                                                            "lowest value for losses, errors and bad-move shares "
                                                            "(metrics.LOWER_IS_BETTER), else its highest"})
    export: str | None = field(default=None, metadata={"help": "also write the final model to this directory "
                                                       "(with its training record in rookworld.json)"})
    export_dtype: str = field(default="float32", metadata={"help": "weights of the export: float32 or float16"})
    seed: int = shared("seed", 0)
    device: str | None = shared("device", None)
    threads: int | None = shared("threads", None)
    tensorboard: bool = shared("tensorboard", True)

    def __post_init__(self) -> None:
        training.check_shared(self)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        from rookworld.tokenizer import VIEWS

        if self.tokenizer_view not in (None, *VIEWS):
            raise ValueError(f"tokenizer_view must be one of {', '.join(VIEWS)}, got {self.tokenizer_view!r}")
        if self.init_from is None and self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        if not self.best_metric.startswith("eval/"):
            raise ValueError(f"best_metric must name a metric of the run's evaluation, such as eval/loss or "
                             f"eval/P/acpl, got {self.best_metric!r}")
        if self.export_dtype not in ("float32", "float16"):
            raise ValueError(f"export_dtype must be float32 or float16, got {self.export_dtype!r}")
        for name in ("batch_size", "grad_accum", "seq_len", "eval_samples", "eval_loss_samples", "eval_batch_size",
                     "data_limit", "n_layer", "n_head", "n_embd", "n_positions"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("p_fraction", "fresh_a"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    def model_shape(self) -> dict[str, int]:
        """The preset's sizes with the explicit ones put over them."""
        shape = dict(PRESETS[self.preset])
        for name in shape:
            if getattr(self, name) is not None:
                shape[name] = getattr(self, name)
        return shape


# ---------------------------------------------------------------- tokens and rows


def encode_samples(tokenizer: Tokenizer, samples: Sequence[Sample]) -> list[tuple[list[int], int]]:
    """(ids, prompt length) per sample: ids = [eos] + prompt + target + [eos], the prompt part encoded
    by `Tokenizer.encode_prompts` exactly as generation encodes it."""
    prompts = tokenizer.encode_prompts([s.prompt for s in samples])
    targets = tokenizer.encode_batch([s.target for s in samples])
    return [(prompt + target + [tokenizer.eos_id], len(prompt)) for prompt, target in zip(prompts, targets)]


def target_batch(encoded: Sequence[tuple[Sequence[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows (B, T) and the loss mask (B, T): True at the target tokens and the final EOS.

    Right padding leaves every real token at the position it has in generation (counted from the
    leading EOS), and causal attention never lets a real token see the pads after it.
    """
    import torch

    width = max(len(ids) for ids, _ in encoded)
    rows = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(encoded), width, dtype=torch.bool)
    for row, (ids, prompt_length) in enumerate(encoded):
        rows[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, prompt_length:len(ids)] = True
    return rows, mask


def by_task(samples: Sequence[Sample]) -> list[list[Sample]]:
    """`samples` grouped by task, in order, for `target_batch` to pad each group to its own longest row: every P
    row is about as long (its prompt is padded), the A rows are longer and vary, and one width for both would pad
    every P row to the longest A row (each step then takes 1.7 times as long; benchmarks/sft_step.py)."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.task, []).append(sample)
    return list(groups.values())


class Packer:
    """Documents `[eos] + prompt + target` concatenated into rows of `seq_len + 1` tokens.

    Row k's last token is row k+1's first, so every token of the stream is predicted exactly once;
    documents run across row boundaries, as in RookWorld pretraining.
    """

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len
        self.buffer: list[int] = []  # tokens not yet predicted, the first one already a row's last

    def rows(self, count: int, next_documents: Callable[[], list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` rows (count, seq_len + 1) and their loss mask (all but column 0)."""
        import torch

        needed = count * self.seq_len + 1
        while len(self.buffer) < needed:
            for ids in next_documents():
                self.buffer.extend(ids)
        block = torch.tensor(self.buffer[:needed], dtype=torch.long)
        self.buffer = self.buffer[needed - 1:]
        rows = block[:-1].view(count, self.seq_len)  # (count, seq_len): each row's first seq_len tokens
        nexts = block[self.seq_len::self.seq_len]  # (count,): the token after each row
        rows = torch.cat([rows, nexts[:, None]], dim=1)  # (count, seq_len + 1)
        mask = torch.ones_like(rows, dtype=torch.bool)
        mask[:, 0] = False
        return rows, mask

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": list(self.buffer)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.buffer = list(state["buffer"])


def packed_document(prompt_ids: Sequence[int], target_ids: Sequence[int]) -> list[int]:
    """A packed document: the prompt ids as evaluation encodes them (EOS first), then the target."""
    return [*prompt_ids, *target_ids]


# ---------------------------------------------------------------- data


class TrainStream:
    """Training samples: the data's P:A mix (`TaskSampler`), each A sample replaced by a fresh one with
    probability `fresh_a`. Seeded and resumable exactly."""

    def __init__(self, samples: Sequence[Sample], p_fraction: float, fresh_a: float, seed: int) -> None:
        import numpy as np

        from rookworld.data.batches import TaskSampler

        self.sampler = TaskSampler(samples, p_fraction=p_fraction, seed=seed)
        self.fresh_a = fresh_a
        from rookworld.data.fresh import FreshASamples

        self.fresh = FreshASamples(samples, seed) if fresh_a > 0 else None
        self._rng = np.random.default_rng([seed, 1])  # the swap decisions, apart from the sampler's stream

    def next(self, count: int) -> list[Sample]:
        drawn = self.sampler.next(count)
        if self.fresh is None:
            return drawn
        swap = self._rng.random(len(drawn)) < self.fresh_a  # (count,)
        return [self.fresh.next() if s.task == "A" and flip else s for s, flip in zip(drawn, swap)]

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict(),
                "fresh": self.fresh.state_dict() if self.fresh is not None else None,
                "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        if self.fresh is not None and state["fresh"] is not None:  # None: --fresh-a turned on at this resume
            self.fresh.load_state_dict(state["fresh"])
        self._rng.bit_generator.state = state["rng"]


def fitting(samples: Sequence[Sample], tokenizer: Tokenizer, context: int, what: str) -> list[Sample]:
    """The samples whose whole document fits the model's context; the rest are dropped and counted."""
    kept = [s for s, (ids, _) in zip(samples, encode_samples(tokenizer, samples)) if len(ids) <= context]
    if len(kept) < len(samples):
        log.warning("%s: dropped %d of %d samples longer than the context of %d tokens",
                    what, len(samples) - len(kept), len(samples), context)
    if not kept:
        raise UserError(f"{what}: no sample fits the model's context of {context} tokens; use --n-positions")
    return kept


# ---------------------------------------------------------------- optimization


def batch_nll(model: GPT, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood (B,) per row of the masked tokens of `rows` (B, T)."""
    from rookworld.model import token_logprobs

    return -token_logprobs(model, rows, mask).logp.sum(1)  # (B,)


def optimizer_step(model: GPT, optimizer: torch.optim.Optimizer, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   grad_clip: float | None) -> tuple[float, float, int]:
    """One optimizer step on `batches` [(rows, mask)], the loss a mean over all their target tokens, the gradient
    clipped to `grad_clip` (None or 0: not clipped); returns the loss, the gradient's norm and the target tokens."""
    import torch

    device = model.wte.weight.device
    loss_tokens = sum(int(mask.sum()) for _, mask in batches)
    total = 0.0
    for rows, mask in batches:
        loss = batch_nll(model, rows.to(device), mask.to(device)).sum() / loss_tokens
        loss.backward()
        total += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, float(grad_norm), loss_tokens


def heldout_loss(model: GPT, tokenizer: Tokenizer, samples: Sequence[Sample], batch_size: int) -> dict[str, float]:
    """Mean target-token loss on `samples` (target mode, whatever the training mode), overall and by task."""
    import torch

    device = model.wte.weight.device
    sums: dict[str, float] = {"P": 0.0, "A": 0.0}
    counts: dict[str, int] = {"P": 0, "A": 0}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(samples), batch_size):
                batch = samples[start:start + batch_size]
                rows, mask = target_batch(encode_samples(tokenizer, batch), tokenizer.eos_id)
                nll = batch_nll(model, rows.to(device), mask.to(device)).tolist()
                for sample, value, tokens in zip(batch, nll, mask.sum(1).tolist()):
                    sums[sample.task] += value
                    counts[sample.task] += tokens
    finally:
        model.train(was_training)
    result = {"eval/loss": sum(sums.values()) / max(1, sum(counts.values()))}
    result.update({f"eval/loss/{task}": sums[task] / counts[task] for task in sums if counts[task]})
    return result


# ---------------------------------------------------------------- the run


def new_model(cfg: SFTConfig, train_samples: Sequence[Sample]) -> tuple[GPT, Tokenizer]:
    """A freshly initialized model (seeded) and a chess tokenizer trained on the training documents."""
    import torch

    from rookworld.model import GPT, GPTConfig
    from rookworld.tokenizer import Tokenizer

    every = max(1, len(train_samples) // TOKENIZER_TEXTS)  # spread over the data: files may group tasks
    texts = [s.prompt + s.target for s in train_samples[::every]]
    tokenizer = Tokenizer.train_chess(texts, vocab_size=cfg.tokenizer_vocab, view=cfg.tokenizer_view or "fen")
    torch.manual_seed(cfg.seed)
    try:
        config = GPTConfig(vocab_size=tokenizer.vocab_size, **cfg.model_shape())
    except ValueError as exc:
        raise UserError(f"bad model size: {exc}") from None
    return GPT(config), tokenizer


def grown(cfg: SFTConfig, model: GPT, tokenizer: Tokenizer) -> tuple[GPT, Tokenizer]:
    """The --init-from model, deepened to --n-layer (model.grow_depth), its tokenizer in --tokenizer-view; its
    other sizes are its own."""
    from rookworld.model import grow_depth

    if cfg.tokenizer_view is not None:
        tokenizer = tokenizer.with_view(cfg.tokenizer_view)
    changed = [f"--{name.replace('_', '-')} {getattr(cfg, name)}" for name in ("n_head", "n_embd", "n_positions")
               if getattr(cfg, name) not in (None, getattr(model.config, name))]
    if changed:
        raise UserError(f"{', '.join(changed)}: {cfg.init_from} keeps its own width, heads and context; "
                        "with --init-from only --n-layer may change (it adds layers); drop the others")
    if cfg.n_layer is None or cfg.n_layer == model.config.n_layer:
        return model, tokenizer
    if cfg.n_layer < model.config.n_layer:
        raise UserError(f"--n-layer {cfg.n_layer}: {cfg.init_from} has {model.config.n_layer} layers and "
                        "layers are only added; use at least that many")
    return grow_depth(model, cfg.n_layer), tokenizer


def check_export(cfg: SFTConfig) -> None:
    """Refuse, before any training, an --export that overlaps --out (the model would replace the run's
    checkpoints and logs, or the run would write into the model's directory) or that holds other files."""
    from rookworld.hub import check_model_out

    export, out = Path(cfg.export).resolve(), Path(cfg.out).resolve()
    if export == out or export in out.parents or out in export.parents:
        raise UserError(f"--export {cfg.export}: overlaps the run directory --out {cfg.out}; export the model to a "
                        "directory outside it")
    check_model_out(cfg.export, "--export")


def command_line(cfg: SFTConfig) -> str:
    """The `rookworld sft` command that sets this config's non-default fields."""
    parts = ["rookworld", "sft"]
    for f in dataclasses.fields(SFTConfig):
        value = getattr(cfg, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if value != default and value is not None:
            parts += ["--" + f.name.replace("_", "-"), str(value).lower() if isinstance(value, bool) else str(value)]
    return " ".join(parts)


def hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"machine": platform.machine(), "processor": platform.processor() or None,
                            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                            "torch": torch.__version__}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main(cfg: SFTConfig, resume: bool = False) -> dict[str, float]:
    """Train as `cfg` says; with `resume`, continue the run in cfg.out from its latest checkpoint.
    Returns the final evaluation metrics."""
    import torch

    from rookworld import checkpoint
    from rookworld.data.batches import balanced_subset
    from rookworld.data.sources import load_source
    from rookworld.evaluate import EvalConfig, evaluate_model
    from rookworld.hub import load_model, read_metadata, save_model
    from rookworld.log import Progress, RunLogger
    from rookworld.metrics import lower_is_better
    from rookworld.runtime import pick_device

    started = time.perf_counter()
    device = pick_device(cfg.device, cfg.threads)
    if cfg.export:
        check_export(cfg)
    out = Path(cfg.out)
    if resume:
        found = training.resume_checkpoint(out, cfg)
    else:
        training.check_new_out(out)
    train_set = load_source(cfg.data, "train", limit=cfg.data_limit)
    eval_set = load_source(cfg.data, "eval")

    state: dict[str, Any] | None = None
    if resume:
        checkpoint.clear_debris(out)
        state = checkpoint.load_state(found)
        model, tokenizer = load_model(found)
    elif cfg.init_from:
        model, tokenizer = grown(cfg, *load_model(cfg.init_from))
    else:
        model, tokenizer = new_model(cfg, train_set.samples)
    model.to(device).train()
    # The training record of the checkpoint this run continues: a model's rookworld.json tells its whole lineage.
    parent = read_metadata(cfg.init_from) if cfg.init_from and Path(cfg.init_from).is_dir() else {}
    context = model.config.n_positions
    if cfg.mode == "packed" and cfg.seq_len + 1 > context:
        raise UserError(f"--seq-len {cfg.seq_len}: rows of seq_len + 1 tokens exceed the model's context "
                        f"of {context}; use a smaller --seq-len")
    train_samples = fitting(train_set.samples, tokenizer, context, f"{cfg.data} (train)")
    eval_pool = fitting(eval_set.samples, tokenizer, context, f"{cfg.data} (eval)")
    eval_samples = balanced_subset(eval_pool, cfg.eval_samples)
    loss_samples = balanced_subset(eval_pool, cfg.eval_loss_samples)

    stream = TrainStream(train_samples, cfg.p_fraction, cfg.fresh_a, cfg.seed)
    packer = Packer(cfg.seq_len)
    optimizer = training.make_optimizer(model, cfg)
    step, elapsed_before, trained_tokens = 0, 0.0, 0
    if state is not None:
        training.load_optimizer(optimizer, state["optimizer"], cfg)
        stream.load_state_dict(state["stream"])
        packer.load_state_dict(state["packer"])
        checkpoint.restore_rng_state(state["rng"])
        step, elapsed_before, trained_tokens = state["step"], state["elapsed_s"], state["trained_tokens"]
    log.info("model: %d parameters, vocabulary %d, context %d; %d training samples, %d eval samples",
             model.num_parameters(), tokenizer.vocab_size, context, len(train_samples), len(eval_samples))

    def next_documents() -> list[list[int]]:
        batch = stream.next(cfg.batch_size)
        prompts = tokenizer.encode_prompts([s.prompt for s in batch])
        targets = tokenizer.encode_batch([s.target for s in batch])
        return [packed_document(p, t) for p, t in zip(prompts, targets)]

    def micro_batch() -> list[tuple[torch.Tensor, torch.Tensor]]:
        if cfg.mode == "packed":
            return [packer.rows(cfg.batch_size, next_documents)]
        return [target_batch(encode_samples(tokenizer, group), tokenizer.eos_id)
                for group in by_task(stream.next(cfg.batch_size))]

    def evaluate() -> dict[str, float]:
        metrics = heldout_loss(model, tokenizer, loss_samples, cfg.eval_batch_size)
        generated = evaluate_model(model, tokenizer, eval_samples, EvalConfig(batch_size=cfg.eval_batch_size))
        metrics.update({f"eval/{name}": value for name, value in generated.items()})
        return metrics

    def record(final_metrics: Mapping[str, float]) -> dict[str, Any]:
        return {"command": command_line(cfg), "config": dataclasses.asdict(cfg), "step": step,
                "trained_tokens": trained_tokens, "wall_time_s": round(elapsed_before + time.perf_counter()
                                                                         - started, 1),
                "data": {"source": cfg.data, "train_samples": len(train_samples),
                         "eval_samples": len(eval_samples), "fresh_a": cfg.fresh_a},
                "parameters": model.num_parameters(), "hardware": hardware(), "metrics": dict(final_metrics),
                **({"init_from_record": parent} if parent else {})}

    def save_checkpoint(metrics: Mapping[str, float]) -> None:
        run_state = {"optimizer": optimizer.state_dict(), "stream": stream.state_dict(),
                     "packer": packer.state_dict(), "rng": checkpoint.capture_rng_state(),
                     "elapsed_s": elapsed_before + time.perf_counter() - started, "trained_tokens": trained_tokens}
        checkpoint.save(out, step, run_state, lambda d: save_model(model, tokenizer, d, record(metrics)),
                        metrics=metrics, keep_last=cfg.keep_last, best_metric=cfg.best_metric,
                        higher_is_better=not lower_is_better(cfg.best_metric))

    logger = RunLogger(out, {"sft": dataclasses.asdict(cfg)}, tensorboard=cfg.tensorboard,
                       resume_step=step if resume else None, start_over=not resume)
    progress = Progress(cfg.steps, start=step, description="sft",
                        fields={"loss": "loss", "eval/loss": "eval loss", "eval/A/exact": "A exact",
                                "eval/P/best_move_legal": "P legal"})
    metrics: dict[str, float] = {}
    with logger, progress:
        while step < cfg.steps:
            t0 = time.perf_counter()
            lr = cfg.lr * training.lr_factor(cfg, step)
            training.set_lr(optimizer, lr)
            batches = [rows for _ in range(cfg.grad_accum) for rows in micro_batch()]
            total, grad_norm, loss_tokens = optimizer_step(model, optimizer, batches, cfg.grad_clip)
            step += 1
            trained_tokens += sum(rows.numel() for rows, _ in batches)
            seconds = time.perf_counter() - t0
            step_metrics = {"loss": total, "lr": lr, "grad_norm": grad_norm, "time/step": seconds,
                            "tokens/loss": loss_tokens,
                            "tokens/per_s": sum(rows.numel() for rows, _ in batches) / seconds}
            logger.log(step, step_metrics)
            eval_now = training.eval_due(cfg, step)
            if eval_now:
                metrics = evaluate()
                logger.log_eval(step, metrics)
                log.info("step %d: %s", step, json.dumps({k: round(v, 4) for k, v in metrics.items()}))
            # An evaluated step is checkpointed too, so that every eval competes for checkpoint-best (as in train)
            if eval_now or training.checkpoint_due(cfg, step):
                save_checkpoint(metrics if eval_now else {})
            progress.update(step, {**step_metrics, **metrics})
    if cfg.export:
        export = model if cfg.export_dtype == "float32" else _copy_as(model, torch.float16)
        save_model(export, tokenizer, cfg.export, record(metrics))
    return metrics


def _copy_as(model: GPT, dtype: torch.dtype) -> GPT:
    import copy

    return copy.deepcopy(model).to(dtype)


# ---------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rookworld.config import add_config_arguments
    from rookworld.flag_groups import ADVANCED, SFT

    training.add_run_arguments(parser)
    add_config_arguments(parser, SFTConfig, SFT, ADVANCED)


def config_from_args(args: argparse.Namespace) -> tuple[SFTConfig, bool]:
    """The run's config (see training.run_configs) and whether it resumes."""
    return training.run_configs(args, {"sft": SFTConfig})["sft"], bool(args.resume)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg, resume = config_from_args(args)
    metrics = main(cfg, resume=resume)
    print(json.dumps({k: round(v, 4) for k, v in metrics.items()}, indent=2))
    return 0
