"""Field credit (`--credit field`): which tokens of a P completion answer for which reward components.

A P completion is padding and then its M:, E: and B: fields. Under sequence credit every token gets the
completion's advantage, so the tokens of the B: move are pushed up or down by the error of the evals beside
them as much as by the move's quality. Under field credit each field's tokens get the group-relative advantage
of their own component blended with format, which every field shares: M: (and the padding before it)
candidates, E: evals, B: best_move and the EOS token. A completion without the three fields in order, or with
text that is not ASCII, keeps its sequence advantage on every token; A completions always do.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from rookworld import text

FIELD_COMPONENTS = ("candidates", "evals", "best_move")  # the components of M:, E: and B:, in text.P_MARKERS order
SHARED_COMPONENT = "format"


def field_rewards(components: Mapping[str, float], weights: Mapping[str, float]) -> list[float]:
    """Each field's reward from a P completion's components: (w_c * c + w_format * format) / (w_c + w_format)."""
    shared = weights[SHARED_COMPONENT]
    return [(weights[c] * components[c] + shared * components[SHARED_COMPONENT]) / (weights[c] + shared)
            if weights[c] + shared > 0 else 0.0 for c in FIELD_COMPONENTS]


def token_fields(completion: str, token_starts: list[int]) -> list[int] | None:
    """The field (0 M:, 1 E:, 2 B:) of each token of a P completion from where each token starts in it, or None
    when the fields cannot be told apart (then the completion keeps its sequence advantage)."""
    starts = text.p_field_starts(completion) if completion.isascii() else None
    if starts is None:
        return None
    return [max(0, bisect.bisect_right(starts, at) - 1) for at in token_starts]
