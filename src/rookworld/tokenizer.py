"""Tokenizers for RookWorld models: GPT-2 BPE read from a checkpoint, or a small BPE trained on chess text.

Both are byte-level BPE over `tokenizers`, with GPT-2's pre-tokenization regex, so any text encodes and
`decode(encode(text)) == text` exactly (runs of padding spaces included). GPT-2's regex splits text
before a run of spaces and after `+` (unless punctuation follows), so a P prompt (`P: <FEN>`) and its completion
(padding + `M: ...`), or an A prompt (ending in `+`) and its completion, tokenize to the same ids apart as together.
One exception: a chess BPE (vocab > 257) in the `squares` view, where an A target can begin with `_` and a merge
across `+_` joins it to the prompt. The trainer and generation both tokenize prompts and completions apart, so they
agree in every case.

GPT-2's vocabulary has no multi-space token: a run of n padding spaces becomes n - 1 tokens " " (220)
and one " M" / " E" / " B" token carrying the last space. A trained chess BPE learns space-run tokens
instead, which is most of its gain on P lines.

A board view (`view=`, for small models trained from scratch or converted by `rookworld sft`) encodes a
normalised text: every FEN board written square by square, so that what stands on a square sits at a fixed offset
from the board's start with no run-length digits to add up, and every run of spaces as one space (RookWorld's column
padding, which a model could only reproduce by counting). Two views of the board:
- `squares`: `_` for an empty square, `/` between ranks (71 characters);
- `named`: each rank opens with its number, an empty square is its file's letter (`s`..`z` for a..h), so that no two
  squares of a board look alike and a board can be copied square by square (72 characters).
`decode` writes the boards back in FEN; the padding stays one space, which the protocol's parsers accept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from .errors import UserError

EOS_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_FILES = (TOKENIZER_FILE, VOCAB_FILE, MERGES_FILE, TOKENIZER_CONFIG_FILE, "special_tokens_map.json")
BYTE_ALPHABET_SIZE = 256  # byte-level BPE starts from one token per byte
VIEWS = ("fen", "squares", "named")  # how a tokenizer writes boards (module docstring)
VIEW_KEY = "rookworld_view"  # tokenizer_config.json: the tokenizer's view, when not fen
EMPTY_SQUARE = "_"
FILES = "stuvwxyz"  # the named view's empty squares of files a..h
_RANK = r"[pnbrqkPNBRQK1-8]{1,8}"
_BOARD = re.compile(rf"(?<![\w/]){_RANK}(?:/{_RANK}){{7}}(?= )")
_DIGIT = re.compile("[1-8]")
_SPACE_RUN = re.compile(" {2,}")
_EMPTY_RUN = re.compile(f"{EMPTY_SQUARE}+")
_FILE_RUN = re.compile(f"[{FILES}]+")
# a named board as a model may write it (whole or not): after a space or '+', rank 8's number, then squares
_NAMED_BOARD = re.compile(f"(?<![^ +])8[pnbrqkPNBRQK{FILES}][1-8pnbrqkPNBRQK{FILES}]*")


def _count(run: re.Match) -> str:
    return str(len(run.group()))


def _squares(board: str) -> str:
    return _DIGIT.sub(lambda digit: EMPTY_SQUARE * int(digit.group()), board)


def _named(board: str) -> str:
    ranks = _squares(board).split("/")  # a miscounted rank's ninth square onwards is named as file h
    return "".join(str(8 - r) + "".join(FILES[min(f, 7)] if square == EMPTY_SQUARE else square
                                        for f, square in enumerate(rank)) for r, rank in enumerate(ranks))


def _named_fen(board: re.Match) -> str:
    return "/".join(_FILE_RUN.sub(_count, rank) for rank in _DIGIT.split(board.group())[1:])


_EXPAND = {"squares": _squares, "named": _named}
_COLLAPSE = {"squares": (_EMPTY_RUN, _count), "named": (_NAMED_BOARD, _named_fen)}


def board_view(text: str, view: str) -> str:
    """`text` with each FEN board written in `view` and each run of spaces as one space (`fen`: `text`)."""
    if view == "fen":
        return text
    return _SPACE_RUN.sub(" ", _BOARD.sub(lambda board: _EXPAND[view](board.group()), text))


def fen_text(text: str, view: str) -> str:
    """The inverse of `board_view` on boards: `text`'s boards written in `view` back in FEN."""
    if view == "fen":
        return text
    pattern, collapse = _COLLAPSE[view]
    return pattern.sub(collapse, text)


class Tokenizer:
    """A byte-level BPE tokenizer with an `<|endoftext|>` token (GPT-2: id 50256).

    `encode` adds no special tokens (callers place EOS themselves); `decode` keeps special tokens, so it is
    the exact inverse of `encode` (in a board view: `decode(encode(text)) == fen_text(board_view(text, view), view)`,
    the text with its padding as single spaces).
    """

    def __init__(self, backend: tokenizers.Tokenizer, source: str = "<in memory>", view: str = "fen") -> None:
        eos_id = backend.token_to_id(EOS_TOKEN)
        if eos_id is None:
            raise UserError(f"{source}: the tokenizer has no {EOS_TOKEN} token; RookWorld documents end with it, "
                            "use a GPT-2 tokenizer or one made by Tokenizer.train_chess")
        self.backend = backend
        self.source = source
        self.eos_id: int = eos_id
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.view = _checked(view, source)

    def __repr__(self) -> str:
        view = f", view={self.view!r}" if self.view != "fen" else ""
        return f"Tokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id}{view}, source={self.source!r})"

    def with_view(self, view: str) -> Tokenizer:
        """The same tokens reading and writing boards in `view` (converting a model: `rookworld sft`)."""
        return Tokenizer(self.backend, self.source, view)

    def _view(self, text: str) -> str:
        return board_view(text, self.view)

    def _text(self, view: str) -> str:
        return fen_text(view, self.view)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(self._view(text), add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        views = [self._view(t) for t in texts]
        return [e.ids for e in self.backend.encode_batch(views, add_special_tokens=False)]

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        """Prompt ids as in RookWorld pretraining, where every document followed an EOS token: the ids
        that training, evaluation and generation all feed the model."""
        return [[self.eos_id, *ids] for ids in self.encode_batch(prompts)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._text(self.backend.decode(list(ids), skip_special_tokens=False))

    def decode_batch(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        views = self.backend.decode_batch([list(s) for s in sequences], skip_special_tokens=False)
        return [self._text(v) for v in views]

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """The tokenizer of a checkpoint directory: `tokenizer.json`, else `vocab.json` + `merges.txt`."""
        path = Path(path)
        tokenizer_file = path / TOKENIZER_FILE
        if tokenizer_file.is_file():
            try:
                backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
            except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
                raise UserError(f"{tokenizer_file}: not a readable tokenizer file ({e}); "
                                "re-save the checkpoint or restore the file") from e
            return cls(backend, str(tokenizer_file), _saved_view(path))
        if (path / VOCAB_FILE).is_file() and (path / MERGES_FILE).is_file():
            return cls.from_gpt2_files(path / VOCAB_FILE, path / MERGES_FILE)
        raise UserError(f"{path}: no {TOKENIZER_FILE} (or {VOCAB_FILE} + {MERGES_FILE}) in this directory; "
                        "a checkpoint needs its tokenizer files")

    @classmethod
    def from_gpt2_files(cls, vocab_file: str | Path, merges_file: str | Path) -> Tokenizer:
        """GPT-2 byte-level BPE from `vocab.json` + `merges.txt` (OpenAI's `encoder.json` + `vocab.bpe`)."""
        try:
            bpe = models.BPE.from_file(str(vocab_file), str(merges_file))
        except Exception as e:  # tokenizers raises a bare Exception on unreadable files
            raise UserError(f"{vocab_file} + {merges_file}: not a readable GPT-2 vocabulary ({e})") from e
        backend = _byte_level(tokenizers.Tokenizer(bpe))
        if bpe.token_to_id(EOS_TOKEN) is not None:
            # Registering the vocabulary entry as special makes "<|endoftext|>" in text one token.
            backend.add_special_tokens([tokenizers.AddedToken(EOS_TOKEN, special=True, normalized=False)])
        return cls(backend, f"{vocab_file} + {merges_file}")

    @classmethod
    def train_chess(cls, texts: Iterable[str], vocab_size: int = 512, view: str = "fen") -> Tokenizer:
        """A byte-level BPE of at most `vocab_size` tokens trained on `texts` (RookWorld lines) in board `view`.

        `vocab_size=257` gives a character (byte) level tokenizer: the 256 bytes and EOS, no merges.
        The trainer stops early when the texts have no more pairs to merge.
        """
        if vocab_size < BYTE_ALPHABET_SIZE + 1:
            raise UserError(f"vocab_size={vocab_size} is too small: a byte-level tokenizer needs "
                            f"{BYTE_ALPHABET_SIZE + 1} tokens (every byte and {EOS_TOKEN})")
        backend = _byte_level(tokenizers.Tokenizer(models.BPE()))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        source = f"chess BPE (vocab_size<={vocab_size})"
        view = _checked(view, source)  # before training, once
        backend.train_from_iterator((board_view(t, view) for t in texts), trainer)
        return cls(backend, source, view)

    def save(self, directory: str | Path) -> None:
        """Writes tokenizer.json, vocab.json + merges.txt and a tokenizer_config.json that lets
        `transformers.AutoTokenizer.from_pretrained(directory)` load it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / TOKENIZER_FILE))
        if isinstance(self.backend.model, models.BPE):
            self.backend.model.save(str(directory))  # vocab.json + merges.txt, for tools that want them
        config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
                  "bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": EOS_TOKEN}
        if self.view != "fen":  # transformers ignores the key: such a model needs this tokenizer
            config[VIEW_KEY] = self.view
        (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def _saved_view(directory: Path) -> str:
    config = directory / TOKENIZER_CONFIG_FILE
    if not config.is_file():
        return "fen"
    try:
        return _checked(json.loads(config.read_text(encoding="utf-8")).get(VIEW_KEY, "fen"), str(config))
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise UserError(f"{config}: not a JSON object ({e}); re-save the checkpoint or restore the file") from e


def _checked(view: str, source: str) -> str:
    if view not in VIEWS:
        raise UserError(f"{source}: unknown board view {view!r}; use one of {', '.join(VIEWS)}")
    return view


def _byte_level(backend: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    return backend
