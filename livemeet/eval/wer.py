"""Levenshtein alignment with substitution/deletion/insertion counts, and the
speaker-agnostic error rate (WER/CER) of whole sessions.

The edit distance comes from `rapidfuzz.distance.Levenshtein` rather than our own dynamic
programme: it is a bit-parallel C++ implementation (Hyyrö 2003) that takes token lists, which
cpWER needs for every (reference speaker, hypothesis speaker) pair of hour-long streams, where a
Python O(N*M) table would take minutes; it is also what jiwer 3 aligns with, so our counts and
jiwer's agree on the same token lists. Tests check it against an independent small DP.

Sessions: both sides are grouped by session id and every session in either side is scored (a
session missing on one side is all deletions or all insertions). Segments are concatenated in
start-time order (stable for ties). A side read from a format that names no session (livemeet's
transcript JSON: `DEFAULT_SESSION`) is paired with the other side's only session.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

from rapidfuzz.distance import Levenshtein

from livemeet.errors import InvalidRequest
from livemeet.eval.io import DEFAULT_SESSION, TextSegment
from livemeet.eval.text import DEFAULT_NORMALIZATION, Normalization, TokenUnit, tokenize


@dataclass(frozen=True)
class ErrorCounts:
    """Edit operations between a reference of `ref_length` tokens and a hypothesis.

    `rate` = (S + D + I) / ref_length: 0.0 for an empty reference with no errors and
    `math.inf` for an empty reference with insertions.
    """

    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    ref_length: int = 0

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def hits(self) -> int:
        return self.ref_length - self.substitutions - self.deletions

    @property
    def hyp_length(self) -> int:
        return self.hits + self.substitutions + self.insertions

    @property
    def rate(self) -> float:
        if self.ref_length == 0:
            return 0.0 if self.errors == 0 else math.inf
        return self.errors / self.ref_length

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.ref_length + other.ref_length,
        )


class EditOp(StrEnum):
    """One step of an alignment."""

    MATCH = "match"
    SUBSTITUTE = "substitute"
    DELETE = "delete"  # a reference token with no hypothesis token
    INSERT = "insert"  # a hypothesis token with no reference token


@dataclass(frozen=True)
class AlignedPair:
    """One aligned position: `ref` is None for an insertion, `hyp` None for a deletion."""

    op: EditOp
    ref: str | None
    hyp: str | None


def edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    """Minimum number of substitutions + deletions + insertions turning `ref` into `hyp`."""
    return int(Levenshtein.distance(ref, hyp))


def count_errors(ref: Sequence[str], hyp: Sequence[str]) -> ErrorCounts:
    """Counts of one minimum-cost alignment of token lists (ties broken as rapidfuzz does, as
    in jiwer; meeteval's kaldialign breaks them towards deletions and insertions, "a b" vs
    "b c" being 1 D + 1 I there and 2 S here: S/D/I may differ, their sum never does)."""
    subs = dels = ins = 0
    for tag, _, _ in Levenshtein.editops(ref, hyp):
        if tag == "replace":
            subs += 1
        elif tag == "delete":
            dels += 1
        else:
            ins += 1
    return ErrorCounts(subs, dels, ins, len(ref))


def align(ref: Sequence[str], hyp: Sequence[str]) -> tuple[AlignedPair, ...]:
    """A minimum-cost alignment of token lists, position by position, in order."""
    out: list[AlignedPair] = []
    for op in Levenshtein.opcodes(ref, hyp):
        ref_span = ref[op.src_start : op.src_end]
        hyp_span = hyp[op.dest_start : op.dest_end]
        if op.tag == "equal":
            out.extend(AlignedPair(EditOp.MATCH, r, r) for r in ref_span)
        elif op.tag == "replace":
            pairs = zip(ref_span, hyp_span, strict=True)
            out.extend(AlignedPair(EditOp.SUBSTITUTE, r, h) for r, h in pairs)
        elif op.tag == "delete":
            out.extend(AlignedPair(EditOp.DELETE, r, None) for r in ref_span)
        else:
            out.extend(AlignedPair(EditOp.INSERT, None, h) for h in hyp_span)
    return tuple(out)


class _Timed(Protocol):
    @property
    def session(self) -> str: ...

    @property
    def start_s(self) -> float: ...


T = TypeVar("T", bound=_Timed)


def group_by_session(records: Iterable[T]) -> dict[str, list[T]]:
    """Records (segments or turns) per session id, each list in start-time order (stable)."""
    groups: dict[str, list[T]] = {}
    for record in records:
        groups.setdefault(record.session, []).append(record)
    return {k: sorted(v, key=lambda s: s.start_s) for k, v in groups.items()}


def pair_sessions(
    ref: dict[str, list[T]], hyp: dict[str, list[T]]
) -> list[tuple[str, list[T], list[T]]]:
    """(session, ref segments, hyp segments) for every session on either side, sorted by id.

    A side whose only session is `DEFAULT_SESSION` is paired with the other side's only
    session. Raises InvalidRequest if such a side meets several sessions on the other side.
    """
    ref, hyp = _rename_default(ref, hyp), _rename_default(hyp, ref)
    return [(s, ref.get(s, []), hyp.get(s, [])) for s in sorted(set(ref) | set(hyp))]


@dataclass(frozen=True)
class SessionMatch:
    """How two sides' session ids pair (`pair_sessions`): the ids on both sides, and those of
    one side only (scored against nothing: all deletions or all insertions; for DER, missed
    or false-alarm speech), each sorted."""

    matched: tuple[str, ...]
    ref_only: tuple[str, ...]
    hyp_only: tuple[str, ...]

    @property
    def disjoint(self) -> bool:
        """Both sides have sessions and none pairs: nothing of the hypothesis is compared
        with the reference (the wrong file, or ids written differently)."""
        return not self.matched and bool(self.ref_only) and bool(self.hyp_only)


def match_sessions(ref: Iterable[T], hyp: Iterable[T]) -> SessionMatch:
    """The session pairing the metrics score (segments or turns). Raises InvalidRequest as
    `pair_sessions` does."""
    paired = pair_sessions(group_by_session(ref), group_by_session(hyp))
    return SessionMatch(
        matched=tuple(s for s, r, h in paired if r and h),
        ref_only=tuple(s for s, _, h in paired if not h),
        hyp_only=tuple(s for s, r, _ in paired if not r),
    )


def _rename_default(this: dict[str, list[T]], other: dict[str, list[T]]) -> dict[str, list[T]]:
    if set(this) != {DEFAULT_SESSION} or not other or set(other) == {DEFAULT_SESSION}:
        return this
    if len(other) != 1:
        raise InvalidRequest(
            f"a file without session ids cannot be matched to {len(other)} sessions"
        )
    (only,) = other
    return {only: this[DEFAULT_SESSION]}


def stream_tokens(
    segments: Iterable[TextSegment], unit: TokenUnit, options: Normalization
) -> list[str]:
    """Tokens of segments concatenated in the given order."""
    tokens: list[str] = []
    for segment in segments:
        tokens.extend(tokenize(segment.text, unit, options))
    return tokens


@dataclass(frozen=True)
class SessionErrors:
    """Error counts of one session."""

    session: str
    counts: ErrorCounts


@dataclass(frozen=True)
class ErrorRateResult:
    """Speaker-agnostic error rate: counts summed over sessions, and per session."""

    counts: ErrorCounts
    sessions: tuple[SessionErrors, ...]

    @property
    def rate(self) -> float:
        return self.counts.rate


def error_rate(
    ref: Iterable[TextSegment],
    hyp: Iterable[TextSegment],
    unit: TokenUnit = TokenUnit.MIXED,
    options: Normalization = DEFAULT_NORMALIZATION,
) -> ErrorRateResult:
    """Speaker-agnostic WER (unit WORD) or CER (unit MIXED): per session, all segments of each
    side concatenated by start time, speakers ignored; counts summed over sessions.

    Raises InvalidRequest if the sessions cannot be paired (see `pair_sessions`).
    """
    sessions = []
    total = ErrorCounts()
    for session, ref_segs, hyp_segs in pair_sessions(group_by_session(ref), group_by_session(hyp)):
        counts = count_errors(
            stream_tokens(ref_segs, unit, options), stream_tokens(hyp_segs, unit, options)
        )
        sessions.append(SessionErrors(session, counts))
        total = total + counts
    return ErrorRateResult(total, tuple(sessions))
