"""The forced transcript's ids (DESIGN 5.3): committed segments prefilled as assistant tokens
after a live hop's prompt, or before an upload's continuation, so the decode writes only what
follows them. `forced_piece` tokenizes one segment (livemeet/transcript/pieces.py);
`forced_prefix` takes the most recent whole segments that fit a token budget."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from livemeet.transcript.parser import render_segment
from livemeet.transcript.pieces import Pieces, join_pieces, segment_pieces
from livemeet.transcript.segments import Segment

SPECIAL_TOKEN_MARK = "<|"  # how Qwen's control tokens start (<|im_end|>); other added ones: by id


def forced_piece(
    seg: Segment, encode: Callable[[str], list[int]], added_ids: Collection[int]
) -> Pieces | None:
    """A committed segment's ids for a forced prefix (livemeet/transcript/pieces.py), or None
    when its text holds special-token text, which would encode as that token (`<|...|>`, or
    any of `added_ids`, the tokenizer's added tokens such as `</think>`)."""
    if SPECIAL_TOKEN_MARK in seg.text:
        return None
    piece = segment_pieces(encode, render_segment(seg))
    return None if any(i in added_ids for i in piece.lead) else piece


def forced_prefix(
    segments: Sequence[Segment],
    pieces: Sequence[Pieces | None],
    encode: Callable[[str], list[int]],
    max_tokens: int,
    cap: int,
    exact: bool = True,
) -> tuple[int, list[int]]:
    """(first, ids): the most recent whole `segments` (their `forced_piece`s, one each) whose
    ids fit `max_tokens`, the newest alone up to `cap`, as forced ids less the last `]`
    (token healing, `moss_state.LiveState.forced_transcript_ids`); segments[first:] are the
    ones taken, none of them a None piece. `exact=False`: the joined text is tokenized
    whole."""
    first, conts = len(segments), 0  # conts: the `cont` ids of the segments taken
    while first > 0:
        piece = pieces[first - 1]
        limit = cap if first == len(segments) else max_tokens  # the newest: up to cap
        if piece is None or len(piece.lead) + conts > limit:
            break
        first -= 1
        conts += len(piece.cont)
    ids = join_pieces([p for p in pieces[first:] if p is not None])
    while not exact and first < len(segments):
        ids = encode("".join(render_segment(s) for s in segments[first:])[:-1])
        limit = cap if first == len(segments) - 1 else max_tokens
        if len(ids) <= limit:  # joined text can tokenize longer than its parts
            break
        first, ids = first + 1, []
    return (first, ids) if ids else (len(segments), [])
