"""A live hop's draft: what the previous hop decoded after the same forced transcript.

Consecutive hops of a session see the same audio but the last hop interval, so the new hop
mostly re-decodes the previous hop's open tail (segments not committed yet) before any new
text. The engine verifies a draft greedily in the hop's prefill (livemeet.engine.request:
draft verification), so a good draft turns those decode steps into prefill rows and a bad one
costs only its rows: the transcript is the same either way. Plain Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

# ids of the new forced prefix's end looked for in the previous hop's assistant ids: the end
# of the last committed segment, its time stamps included, which do not repeat in a transcript
DRAFT_ANCHOR_TOKENS = 16


def hop_draft(
    previous: Sequence[int], previous_prefix_len: int, prefix: Sequence[int]
) -> list[int]:
    """The ids that followed `prefix`'s end in `previous`, the previous hop's assistant ids
    (its forced prefix, `previous_prefix_len` ids, then what it decoded, less the stop token).

    The committed transcript only grows, so the new prefix ends where the previous one did or
    inside what the previous hop decoded; its last DRAFT_ANCHOR_TOKENS ids (all, if fewer) are
    looked for there, the latest match first. Without a prefix the draft is everything the
    previous hop decoded, if it forced nothing either. Returns [] when nothing matches (a
    commit rendered differently from the decode, a relabelled speaker)."""
    if not previous or not 0 <= previous_prefix_len <= len(previous):
        return []
    if not prefix:
        return list(previous) if previous_prefix_len == 0 else []
    anchor = list(prefix[-DRAFT_ANCHOR_TOKENS:])
    m = len(anchor)
    for end in range(len(previous), max(previous_prefix_len, m) - 1, -1):
        if list(previous[end - m : end]) == anchor:
            return list(previous[end:])
    return []
