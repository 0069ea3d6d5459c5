"""Group sampling: seeding, greedy decoding, per-row settings, EOS, and the log-probs it returns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rookworld.generation import MIN_TEMPERATURE, SamplingSettings, fast_decode_step, generate_groups
from rookworld.model import GPT, token_logprobs

PROMPTS = [[5, 9, 2, 41, 7, 7, 30], [11, 3], [8, 8, 1, 60]]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")



def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def greedy_by_recompute(model: GPT, prompt: list[int], steps: int) -> list[int]:
    """Reference greedy decoding: the whole sequence through the model at every step, no cache."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def test_same_seed_same_samples_and_other_seed_other_samples(tiny_gpt):
    model = tiny_gpt()
    settings = SamplingSettings(max_new_tokens=12)
    a = generate_groups(model, PROMPTS, 4, settings, eos_id=None, generator=seeded(1))
    b = generate_groups(model, PROMPTS, 4, settings, eos_id=None, generator=seeded(1))
    c = generate_groups(model, PROMPTS, 4, settings, eos_id=None, generator=seeded(2))
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.sequences, c.sequences)
    assert a.sequences.shape == (12, 7 + 12)
    # Each prompt's G rows start from the same prompt and differ in their samples.
    assert torch.equal(a.sequences[0, :7], a.sequences[3, :7])
    assert not torch.equal(a.sequences[0], a.sequences[1])


def test_greedy_batch_equals_uncached_greedy_of_each_prompt(tiny_gpt):
    model = tiny_gpt()
    out = generate_groups(model, PROMPTS, 1, SamplingSettings(max_new_tokens=10), eos_id=None, greedy=True)
    completions = out.completions()
    for row, prompt in enumerate(PROMPTS):
        assert completions[row] == greedy_by_recompute(model, prompt, 10)
        assert out.sequences[row, out.prompt_width - len(prompt):out.prompt_width].tolist() == prompt
    again = generate_groups(model, PROMPTS, 1, SamplingSettings(max_new_tokens=10), eos_id=None, greedy=True)
    assert torch.equal(out.sequences, again.sequences)


def test_left_padded_batch_equals_prompts_one_at_a_time(tiny_gpt):
    model = tiny_gpt()
    settings = SamplingSettings(max_new_tokens=8)
    batch = generate_groups(model, PROMPTS, 1, settings, eos_id=None, greedy=True)
    for row, prompt in enumerate(PROMPTS):
        alone = generate_groups(model, [prompt], 1, settings, eos_id=None, greedy=True)
        assert batch.completions()[row] == alone.completions()[0]
        got = batch.logprobs[row][batch.completion_mask[row]]
        want = alone.logprobs[0][alone.completion_mask[0]]
        assert torch.allclose(got, want, atol=1e-5)


def test_returned_logprobs_are_the_models_logprobs_at_each_rows_temperature(tiny_gpt):
    model = tiny_gpt()
    hot = SamplingSettings(temperature=1.7, top_k=20, top_p=0.9, max_new_tokens=9)
    cold = SamplingSettings(temperature=0.6, top_p=0.8, max_new_tokens=9)
    out = generate_groups(model, PROMPTS[:2], 3, [hot, cold], eos_id=4, generator=seeded(5))
    temperature = torch.tensor([1.7] * 3 + [0.6] * 3)
    recomputed = token_logprobs(model, out.sequences, out.completion_mask, out.attention_mask,
                                temperature=temperature).logp
    assert out.logprobs.shape == out.sequences.shape
    assert (out.logprobs - recomputed).abs().max() <= 1e-5
    assert out.logprobs[~out.completion_mask].eq(0).all()
    at_one = token_logprobs(model, out.sequences, out.completion_mask, out.attention_mask).logp
    assert (out.logprobs - at_one).abs().max() > 0.01  # temperature 1 is another distribution


def test_per_prompt_settings_in_one_batch(tiny_gpt):
    model = tiny_gpt()
    greedy_like = SamplingSettings(top_k=1, max_new_tokens=10)  # top-k 1 is argmax
    hot = SamplingSettings(temperature=3.0, max_new_tokens=4)
    out = generate_groups(model, PROMPTS[:2], 3, [greedy_like, hot], eos_id=None, generator=seeded(0))
    completions = out.completions()
    expected = greedy_by_recompute(model, PROMPTS[0], 10)
    assert completions[:3] == [expected] * 3
    assert all(len(c) == 4 for c in completions[3:])  # the hot prompt's own max_new_tokens
    assert len({tuple(c) for c in completions[3:]}) > 1
    assert not out.finished.any()


def test_top_k_and_top_p_keep_sampled_tokens_inside_the_filter(tiny_gpt):
    model = tiny_gpt()
    settings = [SamplingSettings(temperature=2.0, top_k=3, max_new_tokens=6),
                SamplingSettings(temperature=2.0, top_p=0.2, max_new_tokens=6)]
    out = generate_groups(model, PROMPTS[:2], 16, settings, eos_id=None, generator=seeded(9))
    logits = model(out.sequences, attention_mask=out.attention_mask)[:, :-1] / 2.0  # (N, T-1, V)
    chosen = logits.gather(-1, out.sequences[:, 1:, None]).squeeze(-1)  # (N, T-1)
    m = out.completion_mask[:, 1:]
    rank = (logits > chosen[..., None]).sum(-1)  # tokens strictly more likely than the chosen one
    assert rank[:16][m[:16]].max() < 3
    probs = logits.softmax(-1)
    mass_before = (probs * (logits > chosen[..., None])).sum(-1)
    assert mass_before[16:][m[16:]].max() < 0.2
    assert rank[16:][m[16:]].max() >= 1  # the nucleus held more than the argmax somewhere


def filtered_distribution(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution sampling should follow: top-k first, then the nucleus of the renormalized rest
    (transformers' order), built token by token."""
    probs = F.softmax(logits.detach() / temperature, dim=-1)
    top = probs.argsort(descending=True)[:top_k or len(probs)]
    kept, mass = [], 0.0
    for token in top.tolist():
        if mass >= top_p:
            break
        kept.append(token)
        mass += float(probs[token] / probs[top].sum())
    expected = torch.zeros_like(probs)
    expected[kept] = probs[kept] / probs[kept].sum()
    return expected


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 1.0), (1.3, 4, 1.0), (1.0, 0, 0.6), (2.0, 5, 0.7)])
def test_samples_follow_the_filtered_temperature_scaled_distribution(tiny_gpt, temperature, top_k, top_p):
    model = tiny_gpt(vocab_size=12)
    prompt, rows = [3, 7, 1], 6000
    settings = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1)
    out = generate_groups(model, [prompt], rows, settings, eos_id=None, generator=seeded(3))
    frequencies = torch.bincount(out.sequences[:, -1], minlength=12).float() / rows
    expected = filtered_distribution(model(torch.tensor([prompt]))[0, -1], temperature, top_k, top_p)
    assert (frequencies - expected).abs().max() < 0.025
    assert frequencies[expected == 0].eq(0).all()


def test_eos_stops_each_row_and_pads_after_it(tiny_gpt):
    model = tiny_gpt()
    free = generate_groups(model, PROMPTS, 1, SamplingSettings(max_new_tokens=10), eos_id=None, greedy=True)
    runs = free.completions()
    eos = runs[0][2]  # make the first prompt's third greedy token the end of text
    assert eos not in runs[0][:2]
    out = generate_groups(model, PROMPTS, 1, SamplingSettings(max_new_tokens=10), eos_id=eos, greedy=True, pad_id=0)
    completion_lengths = out.completion_mask.sum(1).tolist()
    for row, run in enumerate(runs):
        expected = run[:run.index(eos) + 1] if eos in run else run
        assert completion_lengths[row] == len(expected)
        assert out.sequences[row, out.prompt_width:out.prompt_width + len(expected)].tolist() == expected
        assert out.sequences[row, out.prompt_width + len(expected):].eq(0).all()
        assert bool(out.finished[row]) == (eos in run)
        assert out.completions()[row] == (expected[:-1] if eos in run else expected)
    assert out.finished[0] and out.completions()[0] == runs[0][:2]
    assert torch.equal(out.attention_mask[:, out.prompt_width:], out.completion_mask[:, out.prompt_width:])


def test_loop_ends_when_every_row_is_done(tiny_gpt):
    model = tiny_gpt()
    run = greedy_by_recompute(model, PROMPTS[0], 10)
    eos = run[2]
    assert eos not in run[:2]
    out = generate_groups(model, [PROMPTS[0]] * 2, 2, SamplingSettings(max_new_tokens=10), eos_id=eos, greedy=True)
    assert out.sequences.shape[1] == out.prompt_width + 3 and out.finished.all()

    limited = generate_groups(model, PROMPTS, 1, [SamplingSettings(max_new_tokens=n) for n in (2, 3, 4)],
                              eos_id=None, greedy=True)
    assert limited.sequences.shape[1] == limited.prompt_width + 4
    assert limited.completion_mask.sum(1).tolist() == [2, 3, 4]
    assert not limited.finished.any()


def test_checking_for_done_rows_every_few_steps_changes_nothing(tiny_gpt):
    model = tiny_gpt()
    run = greedy_by_recompute(model, PROMPTS[0], 10)
    settings = [SamplingSettings(max_new_tokens=10), SamplingSettings(max_new_tokens=2),
                SamplingSettings(max_new_tokens=3)]
    every = generate_groups(model, PROMPTS, 2, settings, eos_id=run[2], greedy=True)
    sparse = generate_groups(model, PROMPTS, 2, settings, eos_id=run[2], greedy=True, done_check_every=8)
    assert every.sequences.shape[1] == every.prompt_width + 3
    for field in ("sequences", "attention_mask", "completion_mask", "logprobs", "finished"):
        assert torch.equal(getattr(every, field), getattr(sparse, field))


def test_growing_cache_that_sheds_done_rows_samples_what_the_whole_cache_does(tiny_gpt, monkeypatch):
    """The eager step keeps each prompt's slots once and a cache of the rows' own tokens that grows by
    CACHE_GROWTH slots and drops the rows that are done; a replaced step gets every row's copy of its
    prompt, the whole cache and every row. Same seed, same samples and log-probs either way."""
    from rookworld.generation import CACHE_GROWTH
    from rookworld.model import KVCache, PromptPrefix

    model = tiny_gpt(n_positions=128)
    calls, widths = [], []
    take_rows, kept = KVCache.take_rows, PromptPrefix.kept
    monkeypatch.setattr(KVCache, "take_rows", lambda self, rows, length:
                        calls.append((len(rows), length)) or take_rows(self, rows, length))

    def kept_widths(self, rows):
        prefix = kept(self, rows)
        widths.append(tuple(prefix.keys_t.shape[1:2]) + (prefix.keys_t.shape[-1],))  # (prompts, slots)
        return prefix

    monkeypatch.setattr(PromptPrefix, "kept", kept_widths)
    # the longest prompt (7 tokens) stops first, the shortest (2) runs longest
    settings = [SamplingSettings(max_new_tokens=n, temperature=1.5) for n in (20, 110, 70)]
    growing = generate_groups(model, PROMPTS, 4, settings, eos_id=3, generator=seeded(5))
    fixed = generate_groups(model, PROMPTS, 4, settings, eos_id=3, generator=seeded(5), decode_step=model.decode_step)
    assert torch.equal(growing.sequences, fixed.sequences) and torch.equal(growing.finished, fixed.finished)
    assert torch.allclose(growing.logprobs, fixed.logprobs, atol=1e-5)
    lengths = growing.completion_mask.sum(1)
    assert int(lengths.max()) > 3 * CACHE_GROWTH and int(lengths[:4].max()) <= 20
    *growth, whole = calls
    assert [length for _, length in growth] == [64, 96, 112]  # up to 110 - 1 own slots, aligned to 16
    rows = [n for n, _ in growth]
    assert rows == sorted(rows, reverse=True) and rows[0] <= 8  # the first prompt's rows are gone
    assert whole == (12, 128)  # every row, the whole cache: 7 + 110 - 1 slots, aligned to 16
    # the prefix: all three prompts, 7 slots wide; then, the first prompt's rows done, the other two, 4 wide
    assert widths[0] == (3, 7) and widths[-1] in ((2, 4), (1, 2)) and (2, 4) in widths


def test_a_finished_long_prompt_does_not_run_past_the_context(tiny_gpt):
    model = tiny_gpt()  # 48 positions
    long_prompt = list(range(1, 41))
    settings = [SamplingSettings(max_new_tokens=2), SamplingSettings(max_new_tokens=46)]
    out = generate_groups(model, [long_prompt, [5, 9]], 1, settings, eos_id=None, greedy=True)
    assert out.completion_mask.sum(1).tolist() == [2, 46]
    assert out.completions()[0] == greedy_by_recompute(model, long_prompt, 2)


def test_the_smallest_temperature_samples_the_greedy_completion(tiny_gpt):
    model = tiny_gpt()
    greedy = generate_groups(model, PROMPTS, 1, SamplingSettings(max_new_tokens=8), eos_id=None, greedy=True)
    for top_p in (1.0, 0.5):
        settings = SamplingSettings(temperature=MIN_TEMPERATURE, top_p=top_p, max_new_tokens=8)
        out = generate_groups(model, PROMPTS, 3, settings, eos_id=None, generator=seeded(0))
        assert out.completions() == [c for c in greedy.completions() for _ in range(3)]
        assert out.logprobs.isfinite().all()


def test_drafted_rows_of_a_prompt_near_the_context_sample_beside_longer_drafts(tiny_gpt):
    """The long prompt's rows are padded to the other prompt's longer draft, past the position table; their own
    tokens fit, so they sample (greedy: as without drafts) with the model's log-probs."""
    model = tiny_gpt()  # 48 positions: 44 + 4 and 2 + 20 fit, 44 + 20 does not
    prompts = [[5] * 44, [11, 3]]
    settings = [SamplingSettings(temperature=0.8, max_new_tokens=n) for n in (4, 20)]
    drafts = [[1, 2, 3, 4], [7] * 20]
    plain = generate_groups(model, prompts, 1, settings, eos_id=None, greedy=True)
    drafted = generate_groups(model, prompts, 1, settings, eos_id=None, greedy=True, drafts=drafts)
    assert drafted.completions() == plain.completions()
    out = generate_groups(model, prompts, 3, settings, eos_id=None, generator=seeded(0), drafts=drafts)
    assert out.completion_mask.sum(1).tolist() == [4] * 3 + [20] * 3
    recomputed = token_logprobs(model, out.sequences, out.completion_mask, out.attention_mask,
                                temperature=torch.full((6,), 0.8)).logp
    assert (out.logprobs - recomputed).abs().max() <= 1e-5


def test_bad_arguments_are_rejected(tiny_gpt):
    model = tiny_gpt()
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings(temperature=0.0)
    with pytest.raises(ValueError, match=r"temperature must be finite and > 0 \(at least 1e-06;.*got 1e-39"):
        SamplingSettings(temperature=1e-39)  # logits / temperature would overflow float32: junk tokens, NaN log-probs
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(top_p=0.0)
    with pytest.raises(ValueError, match="Generator"):
        generate_groups(model, PROMPTS, 2, SamplingSettings(), eos_id=None)
    with pytest.raises(ValueError, match="context"):
        generate_groups(model, PROMPTS, 1, SamplingSettings(max_new_tokens=45), eos_id=None, greedy=True)
    with pytest.raises(ValueError, match="at least one token"):
        generate_groups(model, [[1], []], 1, SamplingSettings(), eos_id=None, greedy=True)
    with pytest.raises(ValueError, match="settings"):
        generate_groups(model, PROMPTS, 1, [SamplingSettings()], eos_id=None, greedy=True)


@pytest.fixture
def saved_checkpoint(tmp_path, tiny_gpt, fixtures_dir):
    """A tiny random model with a chess BPE trained on real P lines, written by hub.save_model."""
    from rookworld.hub import save_model
    from rookworld.tokenizer import Tokenizer

    lines = (fixtures_dir / "rook_val_sample.txt").read_text().splitlines()[:100]
    tokenizer = Tokenizer.train_chess(lines, vocab_size=300)
    model = tiny_gpt(vocab_size=tokenizer.vocab_size, n_positions=128)
    save_model(model, tokenizer, tmp_path / "model")
    return tmp_path / "model"


CLI_PROMPTS = ["P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34",
               "A: rnbqkbnr/ppp2ppp/8/2Ppp3/4P3/8/PP1P1PPP/RNBQKBNR b KQkq - 0 3+a7a5+c2c4 d7d5 e2e4 e7e5 c4c5 a7a5+"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    from rookworld.cli import main

    code = main(["sample", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sample_command_prints_greedy_completions_as_json(saved_checkpoint, capsys):
    import json

    from rookworld.hub import load_model

    flags = ["--model", str(saved_checkpoint), "--greedy", "--max-new-tokens", "12", "--device", "cpu"]
    code, out, _ = run_cli(capsys, *flags, "--prompt", CLI_PROMPTS[0], "--prompt", CLI_PROMPTS[1], "--json")
    assert code == 0
    records = json.loads(out)
    model, tokenizer = load_model(saved_checkpoint)
    assert [r["prompt"] for r in records] == CLI_PROMPTS
    for record in records:
        assert record["prompt_ids"] == tokenizer.encode(record["prompt"])
        expected = greedy_by_recompute(model, record["prompt_ids"], 12)
        if tokenizer.eos_id in expected:
            expected = expected[:expected.index(tokenizer.eos_id)]
        assert record["completion_ids"] == expected
        assert record["completion"] == tokenizer.decode(expected)

    code, text, _ = run_cli(capsys, *flags, "--prompt", CLI_PROMPTS[0], "--prompt", CLI_PROMPTS[1])
    assert text.splitlines() == [r["prompt"] + r["completion"] for r in records]


def test_sample_command_is_seeded(saved_checkpoint, capsys):
    flags = ["--model", str(saved_checkpoint), "--prompt", CLI_PROMPTS[1], "--max-new-tokens", "20",
             "--temperature", "1.5", "--device", "cpu"]
    first = run_cli(capsys, *flags, "--seed", "1")
    assert first == run_cli(capsys, *flags, "--seed", "1")
    assert first[1] != run_cli(capsys, *flags, "--seed", "2")[1]


def test_sample_command_top_k_1_is_greedy(saved_checkpoint, capsys):
    flags = ["--model", str(saved_checkpoint), "--prompt", CLI_PROMPTS[1], "--max-new-tokens", "20", "--device", "cpu"]
    greedy = run_cli(capsys, *flags, "--greedy")
    assert run_cli(capsys, *flags, "--temperature", "1.5", "--top-k", "1") == greedy
    assert run_cli(capsys, *flags, "--temperature", "1.5", "--top-k", "0") != greedy  # 0 keeps every token


def test_sample_command_reports_bad_input(saved_checkpoint, capsys, monkeypatch, tmp_path):
    import rookworld.hub

    code, _, err = run_cli(capsys, "--model", str(saved_checkpoint), "--prompt", "P: x", "--top-p", "0")
    assert code == 2 and "top_p" in err
    code, _, err = run_cli(capsys, "--model", str(saved_checkpoint), "--prompt", "P: x", "--max-new-tokens", "500")
    assert code == 2 and "--max-new-tokens 500" in err and "use at most" in err
    monkeypatch.setattr(rookworld.hub, "DEFAULT_MODEL_DIR", tmp_path / "absent")
    code, _, err = run_cli(capsys, "--prompt", "P: x")
    assert code == 2 and "embedded default model is missing" in err and "--model" in err


@pytest.mark.parametrize("flags, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens 0: must be >= 1"),
    (["--max-new-tokens", "-3"], "--max-new-tokens -3: must be >= 1"),
    (["--device", "foo"], "--device foo: not a torch device"),
    (["--device", "cuda:99"], "--device cuda:99: "),  # no CUDA here, or not that many devices
    (["--temperature", "1e-40"], "temperature must be finite and > 0 (at least 1e-06"),
])
def test_sample_command_names_the_bad_flag_in_one_line(saved_checkpoint, capsys, flags, message):
    code, _, err = run_cli(capsys, "--model", str(saved_checkpoint), "--prompt", CLI_PROMPTS[0], *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_sample_command_on_cuda_without_cuda_says_so(saved_checkpoint, capsys):
    code, _, err = run_cli(capsys, "--model", str(saved_checkpoint), "--prompt", CLI_PROMPTS[0], "--device", "cuda")
    assert code == 2 and "--device cuda: no CUDA device here; leave --device out or pass cpu" in err


def test_greedy_ignores_the_sampling_flags(saved_checkpoint, capsys):
    flags = ["--model", str(saved_checkpoint), "--prompt", CLI_PROMPTS[1], "--max-new-tokens", "20", "--device", "cpu",
             "--greedy"]
    greedy = run_cli(capsys, *flags)
    assert greedy[0] == 0 and run_cli(capsys, *flags, "--temperature", "0", "--top-p", "0") == greedy


def test_sample_command_default_limit_fits_the_context(capsys):
    """The embedded model has 320 positions: a long A prompt leaves less than 256 for the completion."""
    import json

    from rookworld.hub import load_model, resolve_default_model

    _, tokenizer = load_model(resolve_default_model())
    prompt = ("<|endoftext|>A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+"
              + " ".join(["g1f3", "g8f6"] * 20) + "+")
    room = 320 - len(tokenizer.encode(prompt))
    assert 0 < room < 256
    code, out, _ = run_cli(capsys, "--prompt", prompt, "--greedy", "--json", "--device", "cpu")
    assert code == 0 and len(json.loads(out)[0]["completion_ids"]) <= room
    code, _, err = run_cli(capsys, "--prompt", "P: " + "k" * 400, "--device", "cpu")
    assert code == 2 and "shorten it" in err


@needs_cuda
def test_gpu_greedy_with_eos_equals_cpu(tiny_gpt):
    model = tiny_gpt()
    run = greedy_by_recompute(model, PROMPTS[0], 12)
    settings = SamplingSettings(max_new_tokens=12)
    cpu = generate_groups(model, PROMPTS, 2, settings, eos_id=run[3], greedy=True)
    gpu = generate_groups(model.cuda(), PROMPTS, 2, settings, eos_id=run[3], greedy=True)
    assert torch.equal(cpu.sequences, gpu.sequences.cpu())
    assert torch.equal(cpu.completion_mask, gpu.completion_mask.cpu())
    assert torch.allclose(cpu.logprobs, gpu.logprobs.cpu(), atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("compile", [False, True])
def test_fast_decode_step_equals_eager_decoding(tiny_gpt, compile):
    model = tiny_gpt().cuda()
    settings = [SamplingSettings(max_new_tokens=20), SamplingSettings(top_k=5, max_new_tokens=9),
                SamplingSettings(top_p=0.8, max_new_tokens=14)]
    step = fast_decode_step(model, compile=compile)
    for seed in (0, 1):  # the second call captures its graph anew, on new tensors
        eager = generate_groups(model, PROMPTS, 3, settings, eos_id=None,
                                generator=torch.Generator("cuda").manual_seed(seed))
        fast = generate_groups(model, PROMPTS, 3, settings, eos_id=None, decode_step=step,
                               generator=torch.Generator("cuda").manual_seed(seed))
        assert torch.equal(eager.sequences, fast.sequences)
        assert torch.allclose(eager.logprobs, fast.logprobs, atol=1e-4)


@needs_cuda
def test_bf16_sampling_logprobs_match_token_logprobs(tiny_gpt):
    model = tiny_gpt().to("cuda", torch.bfloat16)
    out = generate_groups(model, PROMPTS, 4, SamplingSettings(max_new_tokens=16), eos_id=None,
                          generator=torch.Generator("cuda").manual_seed(0), decode_step=fast_decode_step(model))
    recomputed = token_logprobs(model, out.sequences, out.completion_mask, out.attention_mask).logp
    assert (out.logprobs - recomputed).abs().max() < 0.1


@needs_cuda
def test_fast_decoder_samples_in_bf16_and_follows_the_fp32_weights(tiny_gpt):
    """The trainer's fast path: a bf16 copy replaying a CUDA graph; its sampling log-probs match the fp32
    model's recomputed under bf16 autocast (the update's precision), and `sync` carries updates over."""
    from rookworld.generation import FastDecoder, decoding

    model = tiny_gpt().cuda()
    decoder = FastDecoder(model)
    assert decoder.model.wte.weight.dtype == torch.bfloat16 and model.wte.weight.dtype == torch.float32
    runner, step = decoding(model, decoder)
    out = generate_groups(runner, PROMPTS, 4, SamplingSettings(max_new_tokens=16), eos_id=None,
                          generator=torch.Generator("cuda").manual_seed(0), decode_step=step)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        recomputed = token_logprobs(model, out.sequences, out.completion_mask, out.attention_mask).logp
    assert (out.logprobs - recomputed).abs().max() < 0.1
    assert (out.logprobs - recomputed)[out.completion_mask].abs().mean() < 0.02
    with torch.no_grad():
        model.wte.weight.add_(0.5)
    decoder.sync(model)
    assert torch.equal(decoder.model.wte.weight, model.wte.weight.to(torch.bfloat16))


def test_fast_decoder_needs_cuda(tiny_gpt):
    from rookworld.generation import FastDecoder

    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        FastDecoder(tiny_gpt())


def completion_distribution(model: GPT, prompt: list[int], settings: SamplingSettings, eos_id: int,
                            prefix: tuple[int, ...] = ()) -> dict[tuple[int, ...], float]:
    """The exact chance of every completion (EOS included), by walking the tree of prefixes."""
    if len(prefix) == settings.max_new_tokens or (prefix and prefix[-1] == eos_id):
        return {prefix: 1.0}
    logits = model(torch.tensor([prompt + list(prefix)]))[0, -1]
    probs = filtered_distribution(logits, settings.temperature, settings.top_k, settings.top_p)
    chances: dict[tuple[int, ...], float] = {}
    for token in probs.nonzero().squeeze(1).tolist():
        for completion, p in completion_distribution(model, prompt, settings, eos_id, prefix + (token,)).items():
            chances[completion] = chances.get(completion, 0.0) + float(probs[token]) * p
    return chances


@pytest.mark.parametrize("temperature, top_k, top_p, draft", [
    (1.0, 0, 1.0, "likely"), (0.8, 3, 1.0, "likely"), (1.5, 0, 0.7, "likely"), (1.0, 0, 1.0, [0, 3, 5]),
    (1.0, 0, 1.0, [2, 5])])
def test_drafted_rows_follow_the_models_own_sampling_distribution(tiny_gpt, temperature, top_k, top_p, draft):
    model, prompt, eos, rows = tiny_gpt(vocab_size=6), [3, 1, 2], 5, 8000
    settings = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=3)
    exact = completion_distribution(model, prompt, settings, eos)
    if draft == "likely":  # the likeliest completion: most rows take the whole draft
        draft = list(max(exact, key=exact.get))
    out = generate_groups(model, [prompt], rows, settings, eos_id=eos, generator=seeded(4), drafts=[draft])
    ids = out.sequences[:, out.prompt_width:].tolist()
    counts: dict[tuple[int, ...], int] = {}
    for row, n in zip(ids, out.completion_mask.sum(1).tolist()):
        counts[tuple(row[:n])] = counts.get(tuple(row[:n]), 0) + 1
    assert set(counts) <= set(exact)  # nothing the model (and its filter) cannot sample
    assert max(abs(counts.get(c, 0) / rows - p) for c, p in exact.items()) < 0.02
    assert counts.get(tuple(draft), 0) / rows == pytest.approx(exact.get(tuple(draft), 0.0), abs=0.02)


def test_drafted_rows_log_probs_are_the_models(tiny_gpt):
    model, temperature = tiny_gpt(), 0.7
    settings = SamplingSettings(temperature=temperature, max_new_tokens=9)
    likely = [greedy_by_recompute(model, p, 9)[:5] + [1] for p in PROMPTS]  # EOS 1 after five likely tokens
    drafts = [likely[0], None, [4, 4, 4, 4]]
    out = generate_groups(model, PROMPTS, 5, settings, eos_id=1, generator=seeded(2), drafts=drafts)
    recomputed = token_logprobs(model, out.sequences, out.completion_mask, out.attention_mask,
                                temperature=torch.full((len(out.sequences),), temperature)).logp
    assert (out.logprobs - recomputed).abs().max() <= 1e-5
    assert out.logprobs[~out.completion_mask].eq(0).all()
    assert out.finished.tolist() == [c[-1] == 1 for c in
                                     (row[:n] for row, n in zip(out.sequences[:, out.prompt_width:].tolist(),
                                                                out.completion_mask.sum(1).tolist()))]


def test_rows_that_take_their_whole_draft_are_not_decoded(tiny_gpt, monkeypatch):
    model = tiny_gpt()
    settings = SamplingSettings(temperature=0.02, max_new_tokens=6)  # nearly greedy: the likely draft is taken
    drafts = [greedy_by_recompute(model, p, 6) for p in PROMPTS]
    steps = []
    original = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda *args: steps.append(1) or original(*args))
    out = generate_groups(model, PROMPTS, 4, settings, eos_id=None, generator=seeded(0), drafts=drafts)
    assert out.completions() == [d for d in drafts for _ in range(4)]
    assert not steps  # every row took its whole draft, to its limit: nothing was decoded
    out = generate_groups(model, PROMPTS, 4, settings, eos_id=None, generator=seeded(0),
                          drafts=[drafts[0], [(d + 1) % 67 for d in drafts[1]], None])
    assert out.completions()[:4] == [drafts[0]] * 4
    assert out.completions()[4:] == [drafts[1]] * 4 + [drafts[2]] * 4  # refused drafts: the model's own picks
    assert 0 < len(steps) <= 5


def test_drafts_are_checked(tiny_gpt):
    with pytest.raises(ValueError, match="drafts: one per prompt, got 1 for 3 prompts"):
        generate_groups(tiny_gpt(), PROMPTS, 1, SamplingSettings(), eos_id=None, generator=seeded(0), drafts=[[1]])


def test_greedy_rows_take_a_draft_while_it_is_the_argmax(tiny_gpt, monkeypatch):
    model = tiny_gpt()
    settings = SamplingSettings(max_new_tokens=10)
    plain = generate_groups(model, PROMPTS, 1, settings, eos_id=None, greedy=True)
    expected = plain.completions()
    steps = []
    original = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda *args: steps.append(1) or original(*args))
    drafts = [expected[0], expected[1][:4] + [(expected[1][4] + 1) % 67] + expected[1][5:], None]
    out = generate_groups(model, PROMPTS, 1, settings, eos_id=None, greedy=True, drafts=drafts)
    assert out.completions() == expected  # a wrong draft token is refused: the argmax follows
    assert torch.equal(out.completion_mask, plain.completion_mask)
    assert (out.logprobs - plain.logprobs).abs().max() <= 1e-5
    assert len(steps) == 9  # the first prompt took its whole draft; the others decoded
