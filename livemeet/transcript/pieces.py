"""Token ids of a run of rendered segments, assembled from ids tokenized once per segment.

A live hop prefills the committed transcript as forced tokens (DESIGN 5.3): up to 2,048 ids,
rebuilt whenever a segment commits. Tokenizing the joined text each time took ~3.5 ms per
2,048 ids on a CPU; assembling cached pieces takes microseconds and gives the same ids.

Why the ids are the same: `render_segment` writes `[start][Sxx] text[end]` with stamps as
`%.2f`, so every rendering ends with a digit and then `]`. The Qwen pre-tokenizer (MODEL.md
5.4) makes every digit a piece of its own and BPE never merges across pieces, so the text
splits, without changing its ids, right after each end stamp's last digit. A run of segments
s_1..s_n, rendered r_i, joined and less its final `]`, is then `lead(s_1)` followed by
`cont(s_2)` .. `cont(s_n)`, where lead(s) = ids of r[:-1] and cont(s) = ids of "]" + r[:-1];
`]` closes it when wanted. `splits_after_digits` checks that the tokenizer has this property
(a checkpoint may bring another pre-tokenizer): without it, callers tokenize the joined text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

Encode = Callable[[str], list[int]]

# Probe text: two rendered segments with punctuation, letters and digits next to the end
# stamps, split after the first one's end-stamp digit
_PROBE_LEFT = "[0.00][S01] Okay, 12 items.[1.50"
_PROBE_RIGHT = "][1.50][S02] Right:3[2.25"


class Pieces(NamedTuple):
    """One rendered segment's ids: `lead` (first of a run: its rendering less the final `]`)
    and `cont` (after another segment: `]` + the same text)."""

    lead: list[int]
    cont: list[int]


def segment_pieces(encode: Encode, rendered: str) -> Pieces:
    """The two tokenizations of `rendered` (a `render_segment` string, ending in a digit and
    `]`). Raises ValueError for a string that does not end that way."""
    if len(rendered) < 2 or rendered[-1] != "]" or not rendered[-2].isdigit():
        raise ValueError(f"not a rendered segment (it must end with a digit and ']'): {rendered!r}")
    body = rendered[:-1]
    return Pieces(encode(body), encode("]" + body))


def join_pieces(pieces: Sequence[Pieces], *, after_close: bool = False) -> list[int]:
    """The ids of the run's joined renderings less the final `]` (module docstring);
    `after_close`: the run follows a `]` already, so its first segment takes `cont` too."""
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        ids += piece.cont if i > 0 or after_close else piece.lead
    return ids


def splits_after_digits(encode: Encode) -> bool:
    """Whether `encode` tokenizes text split right after a digit as the concatenation of its
    parts, on a probe made of two rendered segments (the module's premise)."""
    return encode(_PROBE_LEFT + _PROBE_RIGHT) == encode(_PROBE_LEFT) + encode(_PROBE_RIGHT)
