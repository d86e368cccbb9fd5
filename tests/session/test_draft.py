"""A live hop's draft (livemeet/session/draft.py): what followed the new forced prefix's end
in the previous hop's assistant ids."""

from __future__ import annotations

from livemeet.session.draft import DRAFT_ANCHOR_TOKENS, hop_draft

PREFIX = list(range(100, 140))  # the previous hop's forced transcript
DECODED = [1, 2, 3, 4, 5, 6, 7, 8]  # then what it decoded


def test_without_new_commits_the_draft_is_the_whole_decode() -> None:
    assert hop_draft(PREFIX + DECODED, len(PREFIX), PREFIX) == DECODED
    # a budget cut drops old segments from the front: the end still anchors
    assert hop_draft(PREFIX + DECODED, len(PREFIX), PREFIX[-20:]) == DECODED


def test_after_a_commit_the_draft_is_what_followed_it() -> None:
    committed = PREFIX + DECODED[:5]
    assert hop_draft(PREFIX + DECODED, len(PREFIX), committed) == DECODED[5:]
    assert hop_draft(PREFIX + DECODED, len(PREFIX), PREFIX + DECODED) == []  # all committed


def test_no_prefix_drafts_the_decode_only_if_the_previous_forced_nothing() -> None:
    assert hop_draft(DECODED, 0, []) == DECODED
    assert hop_draft(PREFIX + DECODED, len(PREFIX), []) == []
    assert hop_draft(DECODED, 0, DECODED[:3]) == DECODED[3:]


def test_a_prefix_that_ends_nowhere_in_the_previous_hop_gets_no_draft() -> None:
    assert hop_draft(PREFIX + DECODED, len(PREFIX), PREFIX + [99]) == []
    assert hop_draft([], 0, PREFIX) == []
    assert hop_draft(PREFIX, 50, PREFIX) == []  # a prefix length past the ids
    # only the prefix's last ids anchor; an end inside the old prefix is not looked at
    early = PREFIX[: DRAFT_ANCHOR_TOKENS + 2]
    assert hop_draft(PREFIX + DECODED, len(PREFIX), early) == []


def test_the_latest_match_wins() -> None:
    anchor = list(range(500, 500 + DRAFT_ANCHOR_TOKENS))
    previous = anchor + [1] + anchor + [2, 3]
    assert hop_draft(previous, 0, anchor) == [2, 3]
