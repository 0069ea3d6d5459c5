"""A move readout that needs no generation: every legal move scored as the model's first `M:` candidate.

For a position the model is asked `P: <FEN>`; its completion starts with the padding and `M: `, then its first
candidate move. The score of a legal move is the model's log-probability of writing that move there and
ending it (the next token starts a new word, as the space between candidates does): log p(move, end | prompt,
padding, `M: `). The highest-scored move is played; it is legal by construction. A model trained on
best-first targets writes its best move first, so this reads its choice directly; on shuffled targets it reads
which moves it would list at all.

Each position's prompt runs once (`GPT.continuation_hidden`); its legal moves are the rows that continue it.
"""

from __future__ import annotations

from collections.abc import Sequence

import chess
import torch

from rookworld.text import FEN_WIDTH, P_MARKERS, p_prompt

MAX_ROWS = 512  # candidate rows scored in one forward pass (bounds the logits' memory for a large vocabulary)


def first_candidate_prefix(fen: str) -> str:
    """The text before a P completion's first candidate move: prompt, padding and `M: `."""
    return p_prompt(fen) + " " * max(0, FEN_WIDTH - len(fen)) + P_MARKERS[0] + " "


def word_start_ids(tokenizer) -> torch.Tensor:
    """The ids of the tokens whose text starts with whitespace: those that may follow a finished move."""
    return torch.tensor([i for i in range(tokenizer.vocab_size) if tokenizer.decode([i])[:1].isspace()])


def _common_length(sequences: Sequence[Sequence[int]]) -> int:
    """The length of the longest common prefix of `sequences`, less one where it would be all of one of them
    (every row must keep a token of its own to score)."""
    shortest = min(len(s) for s in sequences)
    length = next((i for i in range(shortest) if len({s[i] for s in sequences}) > 1), shortest)
    return min(length, shortest - 1)


@torch.no_grad()
def first_candidate_scores(model, tokenizer, boards: Sequence[chess.Board],
                           ends: torch.Tensor | None = None) -> list[dict[chess.Move, float]]:
    """For each board (with a legal move), every legal move's log-probability as the model's first `M:`
    candidate (see the module's docstring). `ends`: `word_start_ids(tokenizer)`, computed when not given."""
    from rookworld.model import SharedPrompts

    ends = word_start_ids(tokenizer) if ends is None else ends
    device = model.wte.weight.device
    ends = ends.to(device)
    pad = tokenizer.eos_id
    out: list[dict[chess.Move, float]] = []
    for board in boards:
        moves = list(board.legal_moves)
        if not moves:
            raise ValueError(f"no legal move in {board.fen()!r}")
        prefix = first_candidate_prefix(board.fen())
        ids = tokenizer.encode_prompts([prefix + move.uci() for move in moves])
        shared = _common_length(ids)
        scores: list[float] = []
        for start in range(0, len(moves), MAX_ROWS):
            rows = ids[start:start + MAX_ROWS]
            tails = [row[shared:] + [pad] for row in rows]  # + one slot: the state after the move's last token
            width = max(len(t) for t in tails)
            tail_ids = torch.tensor([t + [pad] * (width - len(t)) for t in tails], device=device)
            prompts = SharedPrompts(torch.tensor([rows[0][:shared]], device=device),
                                    torch.tensor([shared], device=device),
                                    torch.zeros(len(rows), dtype=torch.long, device=device))
            logprobs = torch.log_softmax(model.lm_head(model.continuation_hidden(prompts, tail_ids)).float(), -1)
            for n, tail in enumerate(tails):
                k = len(tail) - 1
                written = logprobs[n, torch.arange(k, device=device), torch.tensor(tail[:k], device=device)].sum()
                scores.append(float(written + torch.logsumexp(logprobs[n, k, ends], 0)))
        out.append(dict(zip(moves, scores)))
    return out


def best_first_candidate(scores: dict[chess.Move, float], keep=lambda move: True) -> chess.Move | None:
    """The highest-scored move that `keep` accepts (the first listed on a tie); None when it accepts none."""
    kept = [(score, -i, move) for i, (move, score) in enumerate(scores.items()) if keep(move)]
    return max(kept, key=lambda item: item[:2])[2] if kept else None
