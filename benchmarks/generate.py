"""`python benchmarks/generate.py [--config small gpt2] [--prompts 8] [--samples 4] [--new-tokens 64] [--threads N]`

Group sampling speed and memory: rookworld's `generate_groups` against transformers'
`GPT2LMHeadModel.generate` on the same random weights (our 50257-token vocabulary) and the same work:
P prompts x G samples, pure sampling (temperature 1, no top-k/top-p), exactly --new-tokens each (ours
without an EOS stop, transformers with min_new_tokens). Each measurement runs in a fresh process, so
allocator caches and peak memory do not leak between them.

Reported per implementation: prefill time (a run of one new token), decode time (the rest), generated
tokens/s, decode tokens/s, and peak memory during generation above the loaded model (CPU: resident set
sampled every 2 ms; CUDA: torch's peak allocation). On CUDA the models run in bfloat16; --compile
compiles our decode step (torch.compile) and --cuda-graph replays it as a CUDA graph (captured once per
generate call, inside the timing); transformers runs with its defaults.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch

from rookworld.model import GPT, GPTConfig

CONFIGS = {
    "small": GPTConfig(n_layer=4, n_head=4, n_embd=256),
    "gpt2": GPTConfig(),  # GPT-2 124M
}


@dataclass(frozen=True)
class Spec:
    impl: str  # "rookworld" or "transformers"
    config: str
    prompts: int
    samples: int
    new_tokens: int
    prompt_tokens: tuple[int, int]  # prompt lengths drawn from [lo, hi]
    device: str
    compile: bool
    cuda_graph: bool
    repeats: int
    threads: int
    seed: int = 0


@dataclass
class Result:
    spec: Spec
    prefill_s: float
    total_s: float
    peak_mb: float
    shape: tuple[int, int]

    @property
    def tokens(self) -> int:
        return self.spec.prompts * self.spec.samples * self.spec.new_tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_s

    @property
    def decode_tokens_per_s(self) -> float:
        decoded = self.spec.prompts * self.spec.samples * (self.spec.new_tokens - 1)
        return decoded / max(self.total_s - self.prefill_s, 1e-9)


class PeakRSS:
    """Resident set size (bytes) of this process at the start of the block and its highest value
    during it, sampled by a thread (torch's allocations are invisible to tracemalloc)."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval, self.start, self.peak, self._stop = interval, 0, 0, threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")

    def rss(self) -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * self._page

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = self.rss()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


def random_model(spec: Spec) -> GPT:
    torch.manual_seed(spec.seed)
    return GPT(CONFIGS[spec.config]).eval()


def to_transformers(model: GPT):
    """transformers' GPT2LMHeadModel holding our model's weights (through hub.py's layout mapping)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rookworld.hub import ours_to_hf

    c = model.config
    hf_config = GPT2Config(vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd, n_layer=c.n_layer,
                           n_head=c.n_head, layer_norm_epsilon=c.layer_norm_epsilon, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
    hf = GPT2LMHeadModel(hf_config).eval()
    missing, unexpected = hf.load_state_dict(ours_to_hf(model), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"weight mapping failed: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    return hf


def random_prompts(spec: Spec) -> list[list[int]]:
    generator = torch.Generator().manual_seed(spec.seed + 1)
    lo, hi = spec.prompt_tokens
    lengths = torch.randint(lo, hi + 1, (spec.prompts,), generator=generator).tolist()
    vocab = CONFIGS[spec.config].vocab_size - 1  # no EOS (the last id) inside prompts
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def make_generate(spec: Spec):
    """generate(new_tokens) -> sequences, for the implementation under test on its device."""
    device = torch.device(spec.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model(spec)
    prompts = random_prompts(spec)
    eos = model.config.vocab_size - 1
    if spec.impl == "rookworld":
        from rookworld.generation import SamplingSettings, fast_decode_step, generate_groups

        model = model.to(device, dtype)
        fast = spec.compile or spec.cuda_graph
        step = fast_decode_step(model, compile=spec.compile, cuda_graph=spec.cuda_graph) if fast else None
        generator = torch.Generator(device=device)

        def generate(new_tokens: int) -> torch.Tensor:
            generator.manual_seed(spec.seed)
            return generate_groups(model, prompts, spec.samples, SamplingSettings(max_new_tokens=new_tokens),
                                   eos_id=None, generator=generator, decode_step=step).sequences
        return generate

    from rookworld.generation import left_pad

    hf = to_transformers(model).to(device, dtype)
    ids, mask = left_pad(prompts, eos, device)

    def generate(new_tokens: int) -> torch.Tensor:
        torch.manual_seed(spec.seed)
        return hf.generate(input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=1.0, top_k=0,
                           top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           num_return_sequences=spec.samples, pad_token_id=eos, eos_token_id=eos)
    return generate


def timed(generate, new_tokens: int, cuda: bool) -> tuple[float, torch.Tensor]:
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = generate(new_tokens)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def measure(spec: Spec) -> Result:
    """One implementation on one configuration; runs in its own process. Peak memory is taken over all
    the generation runs, warm-up included, above the memory of the loaded model."""
    cuda = spec.device.startswith("cuda")
    torch.set_num_threads(spec.threads)
    with torch.inference_mode():
        generate = make_generate(spec)
        gc.collect()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with PeakRSS() as rss:
            generate(spec.new_tokens if spec.compile else 4)  # warm-up (compiles the decode step for its shapes)
            prefill = statistics.median(timed(generate, 1, cuda)[0] for _ in range(spec.repeats))
            totals = []
            for _ in range(spec.repeats):
                seconds, out = timed(generate, spec.new_tokens, cuda)
                totals.append(seconds)
        peak = (torch.cuda.max_memory_allocated() - base) if cuda else (rss.peak - rss.start)
    return Result(spec, prefill, statistics.median(totals), peak / 2**20, tuple(out.shape))


def run_isolated(spec: Spec) -> Result:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, spec).result()


def check_same_weights(config: str, seed: int) -> float:
    """Max |logit difference| of ours and transformers' copy on one random batch (should be ~1e-5)."""
    spec = Spec("rookworld", config, 2, 1, 1, (8, 8), "cpu", False, False, 1, torch.get_num_threads(), seed)
    model = random_model(spec)
    ids = torch.tensor(random_prompts(spec))
    with torch.inference_mode():
        return (model(ids) - to_transformers(model)(ids).logits).abs().max().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", choices=sorted(CONFIGS), default=["small", "gpt2"])
    impls = ["rookworld", "transformers"]
    parser.add_argument("--impl", nargs="+", choices=impls, default=impls)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=(30, 45), metavar=("MIN", "MAX"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile our decode step (CUDA)")
    parser.add_argument("--cuda-graph", action="store_true", help="replay our decode step as a CUDA graph")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per measurement (median)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU threads (default: torch's); 1 gives steadier numbers on a busy machine")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device visible")

    print(f"torch {torch.__version__}, {args.device}, {args.threads} threads; "
          f"{args.prompts} prompts x {args.samples} samples, {args.new_tokens} new tokens, "
          f"prompt length {args.prompt_tokens[0]}-{args.prompt_tokens[1]}", file=sys.stderr)
    rows = []
    for config in args.config:
        print(f"{config}: weights check, max |logit diff| = {check_same_weights(config, 0):.2e}", file=sys.stderr)
        results = {}
        for impl in args.impl:
            spec = Spec(impl, config, args.prompts, args.samples, args.new_tokens, tuple(args.prompt_tokens),
                        args.device, args.compile and impl == "rookworld", args.cuda_graph and impl == "rookworld",
                        args.repeats, args.threads)
            results[impl] = run_isolated(spec)
            r = results[impl]
            print(f"  {impl}: {r.total_s:.2f} s, output {r.shape}", file=sys.stderr)
        if len({r.shape for r in results.values()}) > 1:
            raise RuntimeError(f"implementations generated different shapes: {[r.shape for r in results.values()]}")
        rows.extend(results.values())
        if len(results) == 2:
            ratio = results["transformers"].total_s / results["rookworld"].total_s
            rows.append(f"{config}: rookworld is {ratio:.2f}x transformers' speed")

    print("| config | implementation | prefill s | decode s | total s | tokens/s | decode tokens/s | peak MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    notes = []
    for row in rows:
        if isinstance(row, str):
            notes.append(row)
            continue
        extras = [name for name, on in (("compiled", row.spec.compile), ("CUDA graph", row.spec.cuda_graph)) if on]
        name = row.spec.impl + (f" ({', '.join(extras)})" if extras else "")
        print(f"| {row.spec.config} | {name} | {row.prefill_s:.3f} | {row.total_s - row.prefill_s:.3f} | "
              f"{row.total_s:.3f} | {row.tokens_per_s:.0f} | {row.decode_tokens_per_s:.0f} | {row.peak_mb:.0f} |")
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
