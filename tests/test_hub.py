"""Checkpoints: logits parity with transformers' GPT2LMHeadModel both ways, the stored formats (safetensors,
bf16, legacy .bin), dropout ignored, clear errors for bad checkpoints, offline hub behaviour."""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import FIXTURES

from rookworld.errors import UserError
from rookworld.hub import check_model_out, load_model, read_metadata, save_model
from rookworld.model import GPT, GPTConfig
from rookworld.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

P_LINE = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()[0]
A_LINE = json.loads((FIXTURES / "rookworld_lm_a_generations.json").read_text())[0]
A_TEXT = A_LINE["prompt"] + A_LINE["generated"]
TINY = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
GPT2_124M = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)


def _token_batch(tokenizer: Tokenizer, length: int) -> torch.Tensor:
    ids = [tokenizer.encode(text)[:length] for text in (P_LINE, A_TEXT)]
    return torch.tensor(ids)  # (2, length): both lines are longer than `length` tokens


def _hf_checkpoint(directory: Path, tokenizer: Tokenizer, seed: int = 0, **config):
    """A random GPT-2 written by transformers' own save_pretrained (config dropout 0.1, GPT-2's default)."""
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    model.save_pretrained(directory)
    tokenizer.save(directory)
    return model


def _hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def _our_logits(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).float()


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, gpt2_tokenizer):
    directory = tmp_path_factory.mktemp("tiny")
    return directory, _hf_checkpoint(directory, gpt2_tokenizer, **TINY)


@pytest.fixture(scope="module")
def gpt2_124m_checkpoint(tmp_path_factory, gpt2_tokenizer):
    directory = tmp_path_factory.mktemp("gpt2-124m")
    return directory, _hf_checkpoint(directory, gpt2_tokenizer, **GPT2_124M)


def test_tiny_checkpoint_logits_match_transformers(tiny_checkpoint, gpt2_tokenizer):
    directory, hf = tiny_checkpoint
    model, tokenizer = load_model(str(directory))
    assert tokenizer.eos_id == 50256 and not model.training
    ids = _token_batch(tokenizer, 64)
    assert (_our_logits(model, ids) - _hf_logits(hf, ids)).abs().max() <= 1e-4


@pytest.mark.slow  # ~35 s on the shared 2-core machine: transformers' random init of 124M parameters
def test_gpt2_124m_shape_logits_match_transformers(gpt2_124m_checkpoint, gpt2_tokenizer):
    directory, hf = gpt2_124m_checkpoint
    model, _ = load_model(directory)
    assert model.num_parameters() == 124_439_808  # GPT-2 small
    ids = _token_batch(gpt2_tokenizer, 96)
    assert (_our_logits(model, ids) - _hf_logits(hf, ids)).abs().max() <= 1e-4


def test_conv1d_weights_are_transposed(tiny_checkpoint):
    directory, hf = tiny_checkpoint
    model, _ = load_model(directory)
    theirs = hf.transformer.h[1]
    ours = model.h[1]
    for mine, conv in [(ours.attn.c_attn, theirs.attn.c_attn), (ours.attn.c_proj, theirs.attn.c_proj),
                       (ours.mlp.c_fc, theirs.mlp.c_fc), (ours.mlp.c_proj, theirs.mlp.c_proj)]:
        assert torch.equal(mine.weight, conv.weight.t())
        assert torch.equal(mine.bias, conv.bias)
    assert all(p.requires_grad and p.is_contiguous() for p in model.parameters())


def test_bf16_checkpoint_loads_in_the_requested_dtype(tmp_path, tiny_checkpoint, gpt2_tokenizer):
    _, hf = tiny_checkpoint
    hf.to(torch.bfloat16).save_pretrained(tmp_path)
    hf.float()
    gpt2_tokenizer.save(tmp_path)
    rounded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    model, tokenizer = load_model(tmp_path, dtype=torch.float32)
    assert model.wte.weight.dtype == torch.float32
    ids = _token_batch(tokenizer, 64)
    assert (_our_logits(model, ids) - _hf_logits(rounded, ids)).abs().max() <= 1e-4
    model16, _ = load_model(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model16.parameters())
    assert torch.equal(model16.wte.weight, hf.transformer.wte.weight.to(torch.bfloat16))


def _legacy_state_dict(hf, n_positions: int, prefix: str = "transformer.") -> dict[str, torch.Tensor]:
    """What transformers 4.x wrote to pytorch_model.bin: the tied lm_head and the attention mask buffers."""
    state = {key.replace("transformer.", prefix, 1): t for key, t in hf.state_dict().items()}
    causal_mask = torch.tril(torch.ones(n_positions, n_positions, dtype=torch.bool))[None, None]
    for i in range(hf.config.n_layer):
        state[f"{prefix}h.{i}.attn.bias"] = causal_mask
        state[f"{prefix}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    assert "lm_head.weight" in state
    return state


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_legacy_pytorch_bin_loads(tmp_path, tiny_checkpoint, gpt2_tokenizer, prefix):
    directory, hf = tiny_checkpoint
    torch.save(_legacy_state_dict(hf, TINY["n_positions"], prefix), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    gpt2_tokenizer.save(tmp_path)
    model, tokenizer = load_model(tmp_path)
    ids = _token_batch(tokenizer, 64)
    assert (_our_logits(model, ids) - _hf_logits(hf, ids)).abs().max() <= 1e-4


def test_dropout_in_config_is_ignored_with_one_warning(tiny_checkpoint, caplog):
    directory, _ = tiny_checkpoint
    assert json.loads((directory / "config.json").read_text())["resid_pdrop"] == 0.1
    with caplog.at_level(logging.WARNING, logger="rookworld.hub"):
        model, tokenizer = load_model(directory)
    warnings = [r.getMessage() for r in caplog.records if r.name == "rookworld.hub"]
    assert len(warnings) == 1 and "resid_pdrop" in warnings[0] and "ignoring dropout" in warnings[0]
    assert model.config.dropout == 0.0
    model.train()  # dropout would make two training-mode passes differ
    ids = _token_batch(tokenizer, 64)
    assert torch.equal(_our_logits(model, ids), _our_logits(model, ids))


def test_saved_checkpoint_loads_in_transformers_with_the_same_logits(tmp_path, gpt2_tokenizer):
    torch.manual_seed(1)
    ours = GPT(GPTConfig(**TINY)).eval()
    save_model(ours, gpt2_tokenizer, tmp_path / "ckpt", metadata={"step": 7, "loss": float("nan")})
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ckpt").eval()
    assert hf.config.resid_pdrop == 0.0 and hf.config.n_positions == TINY["n_positions"]
    ids = _token_batch(gpt2_tokenizer, 64)
    assert (_our_logits(ours, ids) - _hf_logits(hf, ids)).abs().max() <= 1e-4
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    assert theirs(P_LINE)["input_ids"] == gpt2_tokenizer.encode(P_LINE)
    assert read_metadata(tmp_path / "ckpt") == {"step": 7, "loss": None}


def test_saved_layout_is_the_one_transformers_writes(tmp_path, tiny_checkpoint, gpt2_tokenizer):
    directory, _ = tiny_checkpoint
    model, tokenizer = load_model(directory)
    save_model(model, tokenizer, tmp_path / "ckpt")
    theirs = safetensors.torch.load_file(directory / "model.safetensors")
    mine = safetensors.torch.load_file(tmp_path / "ckpt" / "model.safetensors")
    assert mine.keys() == theirs.keys()  # transformer.* names, no tied lm_head
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)  # Conv1D orientation restored
    reloaded, _ = load_model(tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reloaded.parameters()))


def test_save_replaces_an_existing_checkpoint_and_leaves_nothing_behind(tmp_path, gpt2_tokenizer):
    torch.manual_seed(2)
    first, second = GPT(GPTConfig(**TINY)), GPT(GPTConfig(**TINY))
    save_model(first, gpt2_tokenizer, tmp_path / "ckpt", metadata={"step": 1})
    save_model(second, gpt2_tokenizer, tmp_path / "ckpt", metadata={"step": 2})
    assert os.listdir(tmp_path) == ["ckpt"]
    loaded, _ = load_model(tmp_path / "ckpt")
    assert torch.equal(loaded.wte.weight, second.wte.weight)
    assert read_metadata(tmp_path / "ckpt") == {"step": 2}
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        save_model(first, gpt2_tokenizer, tmp_path / "file")


@pytest.mark.parametrize("other", ["notes.txt", "checkpoint-last/config.json", "metrics.jsonl"])
def test_save_refuses_a_directory_holding_more_than_a_model(tmp_path, gpt2_tokenizer, other):
    """Replacing deletes the old directory whole: a folder of the user's files or a run directory is never one."""
    model = GPT(GPTConfig(**TINY))
    save_model(model, gpt2_tokenizer, tmp_path / "mine")
    (tmp_path / "mine" / other).parent.mkdir(exist_ok=True)
    (tmp_path / "mine" / other).write_text("important")
    with pytest.raises(UserError, match=re.escape(f"--out {tmp_path / 'mine'}: holds {tmp_path / 'mine'}/")):
        check_model_out(tmp_path / "mine", "--out")
    with pytest.raises(UserError, match="not part of a model"):
        save_model(model, gpt2_tokenizer, tmp_path / "mine")
    assert (tmp_path / "mine" / other).read_text() == "important"
    # nor the `.old` copy beside it, which replacing deletes as left by a crash
    (tmp_path / "mine").rename(tmp_path / "new.old")
    with pytest.raises(UserError, match="not part of a model"):
        save_model(model, gpt2_tokenizer, tmp_path / "new")
    assert (tmp_path / "new.old" / other).is_file() and not (tmp_path / "new").exists()


def test_chess_tokenizer_checkpoint_round_trips(tmp_path):
    lines = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()
    tokenizer = Tokenizer.train_chess(lines, vocab_size=300)
    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4)).eval()
    save_model(model, tokenizer, tmp_path / "small")
    loaded, loaded_tokenizer = load_model(tmp_path / "small")
    assert loaded_tokenizer.encode(P_LINE) == tokenizer.encode(P_LINE)
    ids = torch.tensor([tokenizer.encode(P_LINE)[:64]])
    assert torch.equal(_our_logits(loaded, ids), _our_logits(model, ids))
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "small").eval()
    assert (_hf_logits(hf, ids) - _our_logits(model, ids)).abs().max() <= 1e-4


# Bad checkpoints: each gives a UserError naming the file or directory at fault.

def _copy_checkpoint(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def _edit_weights(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = safetensors.torch.load_file(path)
    edit(tensors)
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


BAD_CHECKPOINTS = {
    "no config": (lambda d: (d / "config.json").unlink(), "", "no config.json"),
    "config not json": (lambda d: (d / "config.json").write_text("{oops"), "config.json", "not valid JSON"),
    "config without n_embd": (lambda d: _edit_config(d, n_embd=None), "config.json", "n_embd must be"),
    "null epsilon": (lambda d: _edit_config(d, layer_norm_epsilon=None), "config.json",
                     "layer_norm_epsilon must be a positive number, got None"),
    "relu model": (lambda d: _edit_config(d, activation_function="relu"), "config.json", "activation_function"),
    "untied head": (lambda d: _edit_config(d, tie_word_embeddings=False), "config.json", "tie_word_embeddings"),
    "truncated safetensors": (lambda d: _truncate(d / "model.safetensors"), "model.safetensors",
                              "not a readable safetensors"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), "", "no model.safetensors or pytorch_model.bin"),
    "missing tensor": (lambda d: _edit_weights(d, lambda t: t.pop("transformer.h.1.mlp.c_fc.bias")),
                       "model.safetensors", "missing tensor.*h.1.mlp.c_fc.bias"),
    "extra tensor": (lambda d: _edit_weights(d, lambda t: t.update({"transformer.h.2.ln_1.weight": torch.ones(32)})),
                     "model.safetensors", "unexpected tensor 'transformer.h.2.ln_1.weight'"),
    "wrong shape": (lambda d: _edit_config(d, n_embd=64, n_head=4), "model.safetensors",
                    r"'transformer.h.0.attn.c_attn.bias' has shape \(96,\), but config.json implies \(192,\)"),
    "different lm_head": (lambda d: _edit_weights(d, lambda t: t.update({"lm_head.weight": torch.zeros(50257, 32)})),
                          "model.safetensors", "lm_head.weight differs"),
    "small embedding": (lambda d: _edit_config(d, vocab_size=1000), "", "tokenizer has 50257 tokens"),
    "no tokenizer": (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "vocab.json", "merges.txt")], "",
                     "no tokenizer.json"),
}


@pytest.mark.parametrize("case", BAD_CHECKPOINTS)
def test_bad_checkpoint_is_a_user_error_naming_the_path(tmp_path, tiny_checkpoint, case):
    damage, file, message = BAD_CHECKPOINTS[case]
    directory = _copy_checkpoint(tiny_checkpoint[0], tmp_path / "ckpt")
    damage(directory)
    with pytest.raises(UserError, match=re.escape(str(directory / file).rstrip("/")) + ".*" + message):
        load_model(directory)


@pytest.mark.parametrize("content", [b"not a pickle at all", b"PK\x03\x04truncated zip"])
def test_garbage_pytorch_bin_is_a_user_error(tmp_path, tiny_checkpoint, content):
    directory = _copy_checkpoint(tiny_checkpoint[0], tmp_path / "ckpt")
    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_bytes(content)
    with pytest.raises(UserError, match=re.escape(str(directory / "pytorch_model.bin"))) as error:
        load_model(directory)
    _assert_one_safe_line(str(error.value))


def _assert_one_safe_line(message: str) -> None:
    """One line, and not torch's advice to load with weights_only=False (arbitrary code execution)."""
    assert "\n" not in message and "weights_only" not in message, message


def test_pytorch_bin_with_pickled_objects_is_refused(tmp_path, tiny_checkpoint):
    directory = _copy_checkpoint(tiny_checkpoint[0], tmp_path / "ckpt")
    (directory / "model.safetensors").unlink()
    torch.save({"weights": Path("/etc/passwd")}, directory / "pytorch_model.bin")  # not a plain tensor dict
    with pytest.raises(UserError, match="pytorch_model.bin.*other pickled objects, which are never loaded") as error:
        load_model(directory)
    _assert_one_safe_line(str(error.value))


@pytest.mark.parametrize("name", ["./no/such/checkpoint", "no-such-dir", "/a/b/c",
                                  "runs/sft--old", "a/b..c", "runs/ckpt."])  # owner/name shapes the hub refuses
def test_missing_local_path_is_a_user_error(name):
    with pytest.raises(UserError, match=re.escape(name) + ": no such checkpoint directory"):
        load_model(name)


def test_a_file_is_not_a_checkpoint(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="is a file"):
        load_model(tmp_path / "model.safetensors")


# The hub, offline: HF_HUB_OFFLINE is read when huggingface_hub is imported, hence a fresh interpreter
# (one for both cases: importing torch is most of its time).

OFFLINE_LOADS = """
import json, sys, time
from rookworld.errors import UserError
from rookworld.hub import load_model
results = {}
for name in sys.argv[1:]:
    start = time.monotonic()
    try:
        model, tokenizer = load_model(name)
        outcome = f"loaded {model.num_parameters()} parameters, eos {tokenizer.eos_id}"
    except UserError as e:
        outcome = f"UserError {e}"
    results[name] = (outcome, time.monotonic() - start)
print(json.dumps(results))
"""
CACHED_ID = "jrahn/RookWorld-LM-124M"
UNCACHED_ID = "jrahn/not-in-the-cache"


@pytest.fixture(scope="module")
def offline_loads(tmp_path_factory, tiny_checkpoint) -> dict[str, tuple[str, float]]:
    """Outcome and seconds of load_model(hub id) with HF_HUB_OFFLINE=1, for an id in the cache and one not."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    # The layout huggingface_hub writes: models--OWNER--NAME/{refs/main, snapshots/COMMIT/<files>}.
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--jrahn--RookWorld-LM-124M"
    _copy_checkpoint(tiny_checkpoint[0], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent)}
    out = subprocess.run([sys.executable, "-c", OFFLINE_LOADS, CACHED_ID, UNCACHED_ID], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return {name: tuple(result) for name, result in json.loads(out).items()}


def test_offline_hub_id_not_in_cache_fails_fast(offline_loads):
    message, seconds = offline_loads[UNCACHED_ID]
    assert message.startswith(f"UserError {UNCACHED_ID}: not a local directory, and not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE=1" in message and f"hf download {UNCACHED_ID}" in message
    assert seconds < 5  # no network attempt (which stalls 25-50 s before failing)


def test_offline_hub_id_loads_from_the_cache(offline_loads):
    message, _ = offline_loads[CACHED_ID]
    tiny = GPT(GPTConfig(**TINY)).num_parameters()
    assert message == f"loaded {tiny} parameters, eos 50256"
