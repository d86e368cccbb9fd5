"""Where a re-decoded text goes on past the committed transcript (policy: no I/O, no torch).

A live hop without the newest committed turn forced as its prefix writes that turn again
whole (livemeet/backends/moss.py `keep_after_cut`): its first words are ones already sent as
finals. `text_after_overlap` finds the end of the committed text inside the re-decoded text
and returns what follows. The two sides are compared token by token by a mixed-script rule
like the error rates' (livemeet/eval/text.py): a character written without spaces (`is_cjk`,
as `join_texts` decides where texts need a space) is a token, a run of other non-space
characters a word; case and punctuation aside, so "Charlie, November" and "charlie november"
agree and Chinese without spaces aligns per character.

A real re-decode seldom repeats the committed words exactly, so the alignment is
`difflib.SequenceMatcher`'s: the committed text's end must be matched by a run of at least
OVERLAP_MIN_TOKENS tokens (or by all of it, when it is shorter), ending at most
OVERLAP_SLACK_TOKENS short of the committed end (a last word the cut split, a backchannel
committed after the turn's start), or by OVERLAP_MIN_START_TOKENS that end it exactly and
begin the re-decode. Shorter matches are taken for chance ("I", "and").
"""

from __future__ import annotations

import difflib

from livemeet.transcript.commit import normalise_text
from livemeet.transcript.segments import is_cjk

OVERLAP_MIN_TOKENS = 3  # tokens; a shorter run matching the committed end is chance
OVERLAP_SLACK_TOKENS = 2  # committed tokens at the very end that may go unmatched
# tokens; a shorter run suffices where it both ends the committed text and begins the re-decode
OVERLAP_MIN_START_TOKENS = 2


def text_tokens(text: str) -> list[tuple[str, int]]:
    """(normalised token, its start offset in `text`) for each mixed-script token whose
    normalised form is not empty (punctuation alone, such as "—", is none)."""
    out: list[tuple[str, int]] = []
    start = None
    for i, ch in enumerate(text + " "):
        if ch.isspace() or is_cjk(ch):
            if start is not None:
                _add(out, text[start:i], start)
                start = None
            if is_cjk(ch):
                _add(out, ch, i)
        elif start is None:
            start = i
    return out


def _add(out: list[tuple[str, int]], token: str, offset: int) -> None:
    norm = normalise_text(token)
    if norm:
        out.append((norm, offset))


def text_after_overlap(committed: str, text: str) -> str | None:
    """What `text` adds after the end of `committed` (module docstring): "" when all of it is
    committed already, None when the committed end cannot be found in it."""
    heard = text_tokens(text)
    said = [token for token, _ in text_tokens(committed)]
    said = said[-(len(heard) + OVERLAP_SLACK_TOKENS) :]  # nothing earlier can align
    if not said or not heard:
        return None
    matcher = difflib.SequenceMatcher(None, said, [t for t, _ in heard], autojunk=False)
    need = min(OVERLAP_MIN_TOKENS, len(said))
    blocks = [
        b
        for b in matcher.get_matching_blocks()
        if b.size >= need
        and b.a + b.size >= len(said) - OVERLAP_SLACK_TOKENS
        # or: the re-decode begins with the committed text's last words
        or b.size >= OVERLAP_MIN_START_TOKENS
        and b.b == 0
        and b.a + b.size == len(said)
    ]
    if not blocks:
        return None
    end = max(blocks, key=lambda b: b.a + b.size)
    follows = end.b + end.size  # the first re-decoded token past the committed text
    return "" if follows >= len(heard) else text[heard[follows][1] :].strip()
