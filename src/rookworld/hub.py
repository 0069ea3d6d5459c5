"""Hugging Face GPT-2 checkpoints <-> our GPT; the only module that talks to the hub for models.

A checkpoint is a directory: `config.json` (GPT-2 keys), `model.safetensors` (or a legacy
`pytorch_model.bin`), the tokenizer files, and `rookworld.json` (run metadata) when we wrote it.
`transformers.GPT2LMHeadModel.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` load the
directories `save_model` writes; `load_model` reads those and the hub's GPT-2 checkpoints
(`jrahn/RookWorld-LM-124M`).

Dropout in a config is ignored: RookWorld-LM's hub config carries GPT-2's default 0.1 although it was
trained without dropout, and RL needs identical log-probs from the policy and the reference model.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from . import __version__
from .errors import UserError
from .fsutil import disk_full, foreign_entries, fsync_tree, jsonable, publish_dir, writable_dir
from .model import GPT, GPTConfig
from .tokenizer import TOKENIZER_FILES, Tokenizer

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
GENERATION_CONFIG_FILE = "generation_config.json"
METADATA_FILE = "rookworld.json"
# Everything but the weights; the weights are fetched in a second step so that a repository holding
# both formats downloads only one.
HUB_FILES = (CONFIG_FILE, GENERATION_CONFIG_FILE, METADATA_FILE, *TOKENIZER_FILES)
# What a model directory holds (save_model writes all but the legacy .bin): save_model replaces a directory that
# holds nothing else, and refuses any other, since replacing deletes the old directory whole.
MODEL_FILES = frozenset({*HUB_FILES, SAFETENSORS_FILE, PYTORCH_FILE})

# Hugging Face's GPT-2 stores these as Conv1D weights, (in, out); nn.Linear wants (out, in).
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# The causal-mask buffers that older transformers versions saved with the weights.
ATTENTION_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
HF_PREFIX = "transformer."
DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def load_model(name_or_path: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> tuple[GPT, Tokenizer]:
    """A GPT-2 checkpoint from a local directory or a hub id, as our GPT (eval mode) and its tokenizer."""
    directory = resolve_checkpoint(name_or_path)
    config = read_config(directory)
    tokenizer = Tokenizer.from_dir(directory)
    if tokenizer.vocab_size > config.vocab_size:
        raise UserError(f"{directory}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                        f"{config.vocab_size} embeddings; the tokenizer files belong to another model")
    weights_file, stored = read_weights(directory)
    with torch.device("meta"):  # no random init of weights that are overwritten right away
        model = GPT(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    state = {name: t.to(dtype).contiguous() for name, t in hf_to_ours(stored, expected, weights_file).items()}
    model.load_state_dict(state, strict=True, assign=True)
    unfilled = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unfilled:
        raise RuntimeError(f"hub.load_model does not fill {unfilled}: GPT gained state it must initialize")
    return model.to(device).eval(), tokenizer


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """The local directory of a checkpoint: the path itself, or the hub id's cached snapshot."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{path}: is a file; a checkpoint is a directory with {CONFIG_FILE}, "
                            f"{SAFETENSORS_FILE} and the tokenizer files")
        return path
    if isinstance(name_or_path, str) and is_hub_id(name_or_path):
        return download(name_or_path)
    raise UserError(f"{name_or_path}: no such checkpoint directory (nor a hub id like jrahn/RookWorld-LM-124M)")


def is_hub_id(name: str) -> bool:
    """Whether `name` is an owner/name that the hub accepts (no `--`, `..` or trailing `.`): a missing local
    path that is not one is no hub id either."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return HUB_ID.fullmatch(name) is not None


def download(repo_id: str) -> Path:
    """The hub model `repo_id` in the Hugging Face cache, fetched when missing (never under HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=[*HUB_FILES, SAFETENSORS_FILE]))
        if not (folder / SAFETENSORS_FILE).is_file():
            folder = Path(snapshot_download(repo_id, allow_patterns=[*HUB_FILES, PYTORCH_FILE]))
    except LocalEntryNotFoundError as e:  # offline or unreachable, and not (completely) cached
        reason = ("HF_HUB_OFFLINE=1 forbids downloading it" if constants.is_offline_mode()
                  else "the hub could not be reached")
        raise UserError(f"{repo_id}: not a local directory, and not in the Hugging Face cache "
                        f"({constants.HF_HUB_CACHE}); {reason}. Fetch it once with network access "
                        f"(`hf download {repo_id}`), or pass a checkpoint directory") from e
    except RepositoryNotFoundError as e:
        raise UserError(f"{repo_id}: not a local directory, and no hub model of that name "
                        "(a private or gated model needs `hf auth login`)") from e
    except HfHubHTTPError as e:
        raise UserError(f"{repo_id}: the hub refused the download: {e}") from e
    return folder


def read_config(directory: Path) -> GPTConfig:
    """The GPTConfig of a checkpoint's GPT-2 `config.json`, dropout forced to 0."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise UserError(f"{directory}: no {CONFIG_FILE}; not a GPT-2 checkpoint directory")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}); restore or re-save the checkpoint") from e
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a JSON object of GPT-2 settings")
    return config_from_hf(raw, str(path))


def config_from_hf(raw: Mapping[str, Any], source: str) -> GPTConfig:
    """Our GPTConfig from Hugging Face GPT-2 config keys; settings our GPT does not implement are errors."""
    if raw.get("model_type", "gpt2") != "gpt2":
        raise UserError(f"{source}: model_type {raw['model_type']!r}; only GPT-2 checkpoints are supported")
    n_positions = raw.get("n_positions", raw.get("n_ctx"))
    required = {"vocab_size": raw.get("vocab_size"), "n_positions": n_positions, "n_embd": raw.get("n_embd"),
                "n_layer": raw.get("n_layer"), "n_head": raw.get("n_head")}
    for key, value in required.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise UserError(f"{source}: {key} must be a positive integer, got {value!r}")
    epsilon = raw.get("layer_norm_epsilon", 1e-5)
    if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or not epsilon > 0:
        raise UserError(f"{source}: layer_norm_epsilon must be a positive number, got {epsilon!r}")
    unsupported = {
        "activation_function": raw.get("activation_function", "gelu_new") not in TANH_GELU,
        "n_inner": raw.get("n_inner") not in (None, 4 * required["n_embd"]),
        "scale_attn_weights": raw.get("scale_attn_weights", True) is not True,
        "scale_attn_by_inverse_layer_idx": raw.get("scale_attn_by_inverse_layer_idx", False) is not False,
        "add_cross_attention": raw.get("add_cross_attention", False) is not False,
        "tie_word_embeddings": raw.get("tie_word_embeddings", True) is not True,
    }
    for key, bad in unsupported.items():
        if bad:
            raise UserError(f"{source}: {key}={raw[key]!r} is not supported (rookworld's GPT is GPT-2 with "
                            f"tanh GELU, a 4x MLP, scaled attention and a tied LM head)")
    dropout = {key: raw[key] for key in DROPOUT_KEYS if raw.get(key)}
    if dropout:
        logger.warning("%s: ignoring dropout %s: rookworld always runs without dropout, so that policy and "
                       "reference models give the same log-probs", source, dropout)
    try:
        return GPTConfig(vocab_size=required["vocab_size"], n_positions=n_positions, n_embd=required["n_embd"],
                         n_layer=required["n_layer"], n_head=required["n_head"],
                         layer_norm_epsilon=float(epsilon), dropout=0.0)
    except ValueError as e:
        raise UserError(f"{source}: {e}") from e


def read_weights(directory: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """(file, tensors as stored) from model.safetensors, else pytorch_model.bin (tensors only, no pickled code)."""
    path = directory / SAFETENSORS_FILE
    if path.is_file():
        try:
            return path, safetensors.torch.load_file(path)
        except (safetensors.SafetensorError, OSError) as e:
            raise UserError(f"{path}: not a readable safetensors file ({e}); the download or save was probably "
                            "cut short: fetch or save the checkpoint again") from e
    path = directory / PYTORCH_FILE
    if path.is_file():
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True)
        except OSError as e:
            raise UserError(f"{path}: cannot read it ({e.strerror}); check the file and its permissions") from e
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:  # torch's text urges unsafe loading
            raise UserError(f"{path}: not a readable PyTorch state dict of plain tensors (damaged, or holding other "
                            "pickled objects, which are never loaded); fetch or save the checkpoint again "
                            "(model.safetensors is preferred)") from e
        if not isinstance(stored, Mapping) or not all(isinstance(t, torch.Tensor) for t in stored.values()):
            raise UserError(f"{path}: expected a state dict of tensors, got {type(stored).__name__}")
        return path, dict(stored)
    raise UserError(f"{directory}: no {SAFETENSORS_FILE} or {PYTORCH_FILE}; the checkpoint has no weights")


def hf_to_ours(stored: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]],
               source: Path) -> dict[str, torch.Tensor]:
    """Hugging Face GPT-2 tensors renamed and transposed to our parameters, checked against `expected`
    shapes; the tied lm_head must equal wte."""
    ours: dict[str, torch.Tensor] = {}
    lm_head = None
    for key, tensor in stored.items():
        name = key.removeprefix(HF_PREFIX)
        if ATTENTION_BUFFER.fullmatch(name):
            continue
        if name == "lm_head.weight":
            lm_head = tensor
            continue
        if name not in expected:
            raise UserError(f"{source}: unexpected tensor {key!r}; not a GPT-2 checkpoint of this shape")
        if name in ours:
            raise UserError(f"{source}: tensor {key!r} is stored twice (with and without {HF_PREFIX!r})")
        want = expected[name][::-1] if name.endswith(CONV1D_WEIGHTS) else expected[name]
        if tuple(tensor.shape) != want:
            raise UserError(f"{source}: tensor {key!r} has shape {tuple(tensor.shape)}, but {CONFIG_FILE} "
                            f"implies {want}")
        ours[name] = tensor.t() if name.endswith(CONV1D_WEIGHTS) else tensor
    missing = [name for name in expected if name not in ours]
    if missing:
        raise UserError(f"{source}: missing tensor(s) {', '.join(missing[:5])}"
                        f"{' ...' if len(missing) > 5 else ''}; the checkpoint is incomplete")
    if lm_head is not None and not torch.equal(lm_head, ours["wte.weight"]):
        raise UserError(f"{source}: lm_head.weight differs from wte.weight; only tied LM heads are supported")
    return ours


def ours_to_hf(model: GPT) -> dict[str, torch.Tensor]:
    """Our parameters in Hugging Face GPT-2 layout (transformer.* keys, Conv1D weights, no tied lm_head)."""
    return {HF_PREFIX + name: (t.t() if name.endswith(CONV1D_WEIGHTS) else t).detach().cpu().contiguous()
            for name, t in model.state_dict().items()}


def hf_config(model: GPT, tokenizer: Tokenizer) -> dict[str, Any]:
    c = model.config
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "vocab_size": c.vocab_size, "n_positions": c.n_positions, "n_ctx": c.n_positions,
        "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": c.layer_norm_epsilon,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "summary_first_dropout": 0.0,
        "initializer_range": 0.02, "scale_attn_weights": True, "tie_word_embeddings": True,
        "bos_token_id": tokenizer.eos_id, "eos_token_id": tokenizer.eos_id,
        "torch_dtype": str(model.wte.weight.dtype).removeprefix("torch."),
    }


def save_model(model: GPT, tokenizer: Tokenizer, out_dir: str | Path, metadata: dict | None = None) -> None:
    """Writes a Hugging Face GPT-2 checkpoint directory, atomically: a complete new directory replaces
    `out_dir` by rename, so readers see the old checkpoint or the new one, never a mix. `out_dir` must be new
    or a model directory (`check_model_out`)."""
    out_dir = check_model_out(out_dir)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, model {model.config.vocab_size} embeddings")
    info = json.dumps({"rookworld_version": __version__, "metadata": jsonable(metadata or {})}, indent=2)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_json(staging / CONFIG_FILE, hf_config(model, tokenizer))
        _write_json(staging / GENERATION_CONFIG_FILE,
                    {"bos_token_id": tokenizer.eos_id, "eos_token_id": tokenizer.eos_id})
        (staging / METADATA_FILE).write_text(info + "\n", encoding="utf-8")
        safetensors.torch.save_file(ours_to_hf(model), staging / SAFETENSORS_FILE, metadata={"format": "pt"})
        tokenizer.save(staging)
        fsync_tree(staging)
        publish_dir(staging, out_dir)
    except Exception as exc:
        if disk_full(exc):  # kept in the chain: a checkpoint save words it its own way (checkpoint.disk_full_error)
            raise UserError(f"{out_dir}: the disk is full (or over quota) while writing the model; {out_dir} is "
                            "as it was: free some space and run the command again") from exc
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone after a successful rename


def check_model_out(out_dir: str | Path, flag: str | None = None) -> Path:
    """`out_dir` as a place for save_model: new, or a model directory (only MODEL_FILES) that it replaces, in a
    directory it can write (made here: save_model stages the model beside `out_dir`, then renames it in).
    Anything else, a run directory or a folder of other files, is refused: replacing deletes it whole."""
    out_dir = Path(out_dir)
    named = f"{flag} {out_dir}" if flag else str(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{named}: exists and is not a directory; choose another checkpoint path")
    foreign = foreign_entries(out_dir, MODEL_FILES)
    if foreign:
        raise UserError(f"{named}: holds {foreign[0]}, which is not part of a model, and writing the model "
                        "replaces the whole directory; give a new directory (or a model directory to overwrite)")
    writable_dir(out_dir.parent, named)
    return out_dir


def read_metadata(directory: str | Path) -> dict:
    """The `metadata` that save_model stored with a checkpoint ({} for checkpoints made elsewhere)."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise UserError(f"{path}: not a valid {METADATA_FILE} ({e})") from e


def _write_json(path: Path, value: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "model"


def resolve_default_model() -> Path:
    """The model embedded in the package, used when no --model is given."""
    if not (DEFAULT_MODEL_DIR / CONFIG_FILE).is_file():
        raise UserError(f"no --model given and the embedded default model is missing ({DEFAULT_MODEL_DIR}); "
                        "pass --model with a checkpoint directory or a hub id such as jrahn/RookWorld-LM-124M")
    return DEFAULT_MODEL_DIR
