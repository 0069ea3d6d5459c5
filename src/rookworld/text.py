"""The RookWorld text protocol: render P/A prompts and targets, parse model completions.

Pure string functions, no I/O and no chess rules. Parsers of model output never raise and run in
linear time (str.find/str.split only, no backtracking regexes): they return what they found plus a
list of what was malformed, and the reward decides what that costs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rookworld.errors import InvalidPromptError

P_PREFIX = "P: "
A_PREFIX = "A: "
FEN_WIDTH = 90  # RookWorld training data and RookWorld-LM output; rook_val_500 uses 89
MOVES_WIDTH = 30
EVALS_WIDTH = 40
MAX_CANDIDATES = 5  # Stockfish multipv 5
MAX_HISTORY = 10  # A prompts carry at most 10 moves, the current one included
A_REWARDS = ("0.001", "1.0", "0.5", "-1.0")
A_FLAGS = ("0", "1")
P_MARKERS = ("M:", "E:", "B:")
_ERROR_SNIPPET = 20  # characters of a bad token quoted in an error; completions can be 100 kB


def format_eval(pawns: float) -> str:
    """Python float string of `pawns` rounded to centipawns: -2.3, 0.0, 999.97 (never -0.0)."""
    return str(round(float(pawns), 2) + 0.0)


def p_prompt(fen: str) -> str:
    return P_PREFIX + fen


def p_target(fen: str, moves: Sequence[str], evals: Sequence[float], best: str, fen_width: int = FEN_WIDTH) -> str:
    """The completion of `p_prompt(fen)`: padding to `fen_width`, then the M:, E: and B: fields."""
    return (" " * (fen_width - len(fen)) + "M: " + " ".join(moves).ljust(MOVES_WIDTH)
            + "E: " + " ".join(format_eval(e) for e in evals).ljust(EVALS_WIDTH) + "B: " + best)


def a_prompt(fen: str, move: str, history: Sequence[str]) -> str:
    """`A: fen+move+history+`; `history` is the game's moves up to `move` (appended when missing).

    The same UCI string can never be played twice in a row (the first move empties its from-square),
    so a history ending in `move` already includes it. Only the last 10 moves are kept.
    """
    moves = list(history)
    if not moves or moves[-1] != move:
        moves.append(move)
    return f"{A_PREFIX}{fen}+{move}+{' '.join(moves[-MAX_HISTORY:])}+"


def task_of(prompt: str) -> Literal["P", "A"] | None:
    if prompt.startswith(P_PREFIX):
        return "P"
    if prompt.startswith(A_PREFIX):
        return "A"
    return None


def _looks_like_fen(text: str) -> bool:
    fields = text.split(" ", 6)
    return len(fields) == 6 and fields[0].count("/") == 7


def split_line(line: str) -> tuple[str, str, str]:
    """A full RookWorld data line -> (task, prompt, target); A rows may lack the "A: " prefix."""
    line = line.rstrip("\r\n")
    if line.startswith(P_PREFIX):
        marker = line.find("M:")
        if marker < 0:
            raise ValueError(f"P line without an M: field: {line[:100]!r}")
        prompt = line[:marker].rstrip()
        return "P", prompt, line[len(prompt):]
    body = line[len(A_PREFIX):] if line.startswith(A_PREFIX) else line
    parts = body.split("+")
    if len(parts) == 7 and _looks_like_fen(parts[0]):
        return "A", A_PREFIX + "+".join(parts[:3]) + "+", "+".join(parts[3:])
    raise ValueError(f"not a RookWorld P or A line: {line[:100]!r}")


@dataclass
class ParsedP:
    fen: str | None = None
    moves: list[str] = field(default_factory=list)
    evals: list[float] = field(default_factory=list)
    best: str | None = None
    fen_width: int | None = None
    errors: list[str] = field(default_factory=list)


def is_uci_shaped(token: str) -> bool:
    """e2e4 / e7e8q shape (not legality); a plain character check keeps huge tokens cheap."""
    return (len(token) in (4, 5) and token[0] in "abcdefgh" and token[1] in "12345678"
            and token[2] in "abcdefgh" and token[3] in "12345678" and (len(token) == 4 or token[4] in "qrbn"))


def _parse_eval(token: str) -> float | None:
    # float() also reads "1_0", "nan" and non-ASCII digits; none of them is an eval the protocol writes
    if not token.isascii() or "_" in token:
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _quote(tokens: list[str]) -> str:
    shown = ", ".join(repr(t[:_ERROR_SNIPPET]) for t in tokens[:3])
    return shown + (f" and {len(tokens) - 3} more" if len(tokens) > 3 else "")


def _find_markers(text: str) -> dict[str, int]:
    """Start of each of M:, E:, B: in order; a missing marker is searched after the last one found."""
    found: dict[str, int] = {}
    start = 0
    for marker in P_MARKERS:
        at = text.find(marker, start)
        if at >= 0:
            found[marker] = at
            start = at + len(marker)
    return found


def p_field_starts(completion: str) -> tuple[int, ...] | None:
    """Where the M:, E: and B: fields of a P completion start (character offsets), or None unless all three
    are there, in that order."""
    found = _find_markers(completion)
    return tuple(found.values()) if len(found) == len(P_MARKERS) else None


def _field_tokens(text: str, limit: int) -> tuple[list[str], bool]:
    """At most `limit` whitespace-separated tokens, and whether more text follows (bounded work)."""
    tokens = text.split(None, limit)
    return tokens[:limit], len(tokens) > limit


def parse_p_completion(completion: str) -> ParsedP:
    """Moves, evals and best move of a P completion (padding + M: E: B:); never raises.

    `moves` keeps the M: tokens as written, UCI-shaped or not (a malformed one stays in its slot, so
    that moves[i] still pairs with evals[i]); `evals` keeps the finite numbers up to the first token that
    is not one: a list of floats has no gap for it, so the moves from there on have no eval.
    """
    parsed = ParsedP()
    ordered = list(_find_markers(completion).items())
    first = ordered[0][1] if ordered else len(completion)
    if completion[:first].strip():
        parsed.errors.append(f"unexpected text before the fields: {completion[:first].strip()[:_ERROR_SNIPPET]!r}")
    segments: dict[str, str] = {}
    for i, (marker, at) in enumerate(ordered):
        end = ordered[i + 1][1] if i + 1 < len(ordered) else len(completion)
        segments[marker] = completion[at + len(marker):end]
    for marker in P_MARKERS:
        if marker not in segments:
            parsed.errors.append(f"missing {marker} field")

    if "M:" in segments:
        parsed.moves, extra = _field_tokens(segments["M:"], MAX_CANDIDATES)
        if extra:
            parsed.errors.append(f"more than {MAX_CANDIDATES} moves")
        if not parsed.moves:
            parsed.errors.append("empty M: field")
        bad = [t for t in parsed.moves if not is_uci_shaped(t)]
        if bad:
            parsed.errors.append(f"M: tokens that are not UCI moves: {_quote(bad)}")

    if "E:" in segments:
        tokens, extra = _field_tokens(segments["E:"], MAX_CANDIDATES)
        if extra:
            parsed.errors.append(f"more than {MAX_CANDIDATES} evals")
        values = [_parse_eval(t) for t in tokens]
        parsed.evals = list(itertools.takewhile(lambda v: v is not None, values))
        bad = [t for t, v in zip(tokens, values) if v is None]
        if bad:
            parsed.errors.append(f"E: tokens that are not finite numbers: {_quote(bad)}")
        if "M:" in segments and len(tokens) != len(parsed.moves):
            parsed.errors.append(f"{len(parsed.moves)} moves but {len(tokens)} evals")

    if "B:" in segments:
        tokens, extra = _field_tokens(segments["B:"], 1)
        if not tokens:
            parsed.errors.append("empty B: field")
        else:
            parsed.best = tokens[0]
            if not is_uci_shaped(parsed.best):
                parsed.errors.append(f"B: is not a UCI move: {parsed.best[:_ERROR_SNIPPET]!r}")
        if extra:
            parsed.errors.append("extra text after the best move")
    return parsed


def parse_p_line(line: str) -> ParsedP:
    """A full P line (prompt + target); the FEN's padded width is kept so the line renders back exactly."""
    errors: list[str] = []
    body = line
    if line.startswith(P_PREFIX):
        body = line[len(P_PREFIX):]
    else:
        errors.append("missing 'P: ' prefix")
    found = _find_markers(body)
    head = body[:min(found.values())] if found else body
    parsed = parse_p_completion(body[len(head.rstrip()):])
    parsed.fen = " ".join(head.split()) or None
    parsed.fen_width = len(head) if found else None
    if parsed.fen is None:
        errors.append("missing FEN")
    parsed.errors = errors + parsed.errors
    return parsed


@dataclass
class ParsedAPrompt:
    fen: str
    move: str
    history: list[str]


def parse_a_prompt(prompt: str) -> ParsedAPrompt:
    """`A: fen+move+history+` -> its parts; raises InvalidPromptError naming what is wrong."""
    if not prompt.startswith(A_PREFIX):
        raise InvalidPromptError(f"A prompt must start with {A_PREFIX!r}: {prompt[:100]!r}")
    parts = prompt[len(A_PREFIX):].split("+")
    if len(parts) != 4 or parts[3] != "":
        raise InvalidPromptError(f"A prompt must be 'A: FEN+move+history+': {prompt[:200]!r}")
    fen, move, history_text = parts[0].strip(), parts[1].strip(), parts[2]
    history = history_text.split()
    if not fen or not move:
        raise InvalidPromptError(f"A prompt without a FEN or a move: {prompt[:200]!r}")
    if not history or history[-1] != move or len(history) > MAX_HISTORY:
        raise InvalidPromptError(f"A prompt history must be 1-{MAX_HISTORY} moves ending with the move "
                                 f"{move!r}: {prompt[:200]!r}")
    return ParsedAPrompt(fen=fen, move=move, history=history)


@dataclass
class ParsedA:
    fen: str | None = None
    reward: str | None = None
    terminated: str | None = None
    truncated: str | None = None
    errors: list[str] = field(default_factory=list)


def parse_a_completion(completion: str) -> ParsedA:
    """`fen+reward+terminated+truncated` -> its parts (whitespace-stripped); never raises."""
    parsed = ParsedA()
    parts = [p.strip() for p in completion.split("+", 4)]
    names = ("fen", "reward", "terminated", "truncated")
    for name, value in zip(names, parts):
        if value:
            setattr(parsed, name, value)
        else:
            parsed.errors.append(f"empty {name}")
    if len(parts) < len(names):
        parsed.errors.append(f"{len(parts)} of 4 '+'-separated fields")
    elif len(parts) > len(names):
        parsed.errors.append(f"extra text after the truncated flag: {parts[4][:_ERROR_SNIPPET]!r}")
    if parsed.fen is not None and not _looks_like_fen(parsed.fen):
        parsed.errors.append(f"not a FEN of 6 fields and 8 ranks: {parsed.fen[:_ERROR_SNIPPET]!r}")
    if parsed.reward is not None and parsed.reward not in A_REWARDS:
        parsed.errors.append(f"reward {parsed.reward[:_ERROR_SNIPPET]!r} is not one of {', '.join(A_REWARDS)}")
    for name in ("terminated", "truncated"):
        value = getattr(parsed, name)
        if value is not None and value not in A_FLAGS:
            parsed.errors.append(f"{name} {value[:_ERROR_SNIPPET]!r} is not 0 or 1")
    return parsed
