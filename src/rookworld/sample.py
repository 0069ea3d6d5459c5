"""`rookworld sample --model M --prompt TEXT [--prompt TEXT ...]`: print a model's completions.

Each prompt is encoded exactly as given (write `<|endoftext|>` into the text to start with that
token); a completion ends at the model's EOS token or after --max-new-tokens. Prints prompt +
completion, one per line, or with --json a list of {prompt, prompt_ids, completion, completion_ids}
(completion_ids without the final EOS; `completion` is their text).
"""

from __future__ import annotations

import argparse
import json

from rookworld.config import finite_float
from rookworld.errors import UserError

DEFAULT_MAX_NEW_TOKENS = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint directory or hub id (default: the embedded model)")
    parser.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for several")
    parser.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    parser.add_argument("--temperature", type=finite_float, default=1.0, help="sampling temperature (default: 1.0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 keeps all (default: 0)")
    parser.add_argument("--top-p", type=finite_float, default=1.0,
                        help="keep the smallest token set with this probability; 1 keeps all (default: 1.0)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="completion length limit (default: 256, or what the model's context leaves after "
                        "the longest prompt)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling random stream (default: 0)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of text lines")


def run(args: argparse.Namespace) -> int:
    import torch

    from rookworld.generation import SamplingSettings, check_room, generate_groups
    from rookworld.hub import load_model, resolve_default_model
    from rookworld.runtime import pick_device

    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {args.max_new_tokens}: must be >= 1")
    device = pick_device(args.device)
    model, tokenizer = load_model(args.model or resolve_default_model(), device=device)
    prompt_ids = tokenizer.encode_batch(args.prompt)
    context = model.config.n_positions
    if not all(prompt_ids):
        raise UserError("--prompt '': a prompt needs at least one token")
    longest = max(len(ids) for ids in prompt_ids)
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = min(DEFAULT_MAX_NEW_TOKENS, context - longest)
    else:
        check_room("--max-new-tokens", max_new_tokens, "prompt", longest, context)
    if max_new_tokens < 1:
        raise UserError(f"--prompt: the longest prompt has {longest} tokens, the model's whole context "
                        f"({context}); shorten it")
    # greedy decoding takes the argmax, which temperature, top-k and top-p leave where it is: they are unused
    sampling = {} if args.greedy else {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    try:
        settings = SamplingSettings(max_new_tokens=max_new_tokens, **sampling)
    except ValueError as e:
        raise UserError(f"bad sampling flag: {e}") from None
    generator = torch.Generator(device=device).manual_seed(args.seed)
    generation = generate_groups(model, prompt_ids, 1, settings, eos_id=tokenizer.eos_id, generator=generator,
                                 greedy=args.greedy)
    completion_ids = generation.completions()
    completions = tokenizer.decode_batch(completion_ids)
    if args.json:
        records = [{"prompt": p, "prompt_ids": i, "completion": c, "completion_ids": ci}
                   for p, i, c, ci in zip(args.prompt, prompt_ids, completions, completion_ids)]
        print(json.dumps(records, ensure_ascii=False, indent=2))
    else:
        for prompt, completion in zip(args.prompt, completions):
            print(prompt + completion)
    return 0
