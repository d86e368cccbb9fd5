"""Concatenated minimum-permutation error rates (cpWER/cpCER) and delta CER.

cpWER (Watanabe et al., CHiME-6, 2020; as meeteval computes it): per session, the segments of
each speaker are concatenated in start-time order into one stream per speaker on each side;
the reference and hypothesis streams are then paired one-to-one so that the total edit
distance is smallest. A stream left without a partner counts as all deletions (reference) or
all insertions (hypothesis). Errors and reference lengths are summed over sessions.

Pairing is a linear assignment (Hungarian algorithm, `scipy.optimize.linear_sum_assignment`)
on a square cost matrix padded with empty streams. Pairing every stream of the smaller side is
never worse than leaving it out, since d(r, h) <= |r| + |h|.

delta CER = cpCER - speaker-agnostic CER: the part of cpCER caused by speaker labels.

orcWER (Raj et al., 2022; meeteval): each reference segment may go to any hypothesis stream; a
small exact DP over stream positions, only for short inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from livemeet.errors import InvalidRequest
from livemeet.eval.io import TextSegment
from livemeet.eval.text import DEFAULT_NORMALIZATION, Normalization, TokenUnit
from livemeet.eval.wer import (
    ErrorCounts,
    ErrorRateResult,
    count_errors,
    edit_distance,
    error_rate,
    group_by_session,
    pair_sessions,
    stream_tokens,
)


@dataclass(frozen=True)
class SpeakerPair:
    """One pairing of a reference and a hypothesis speaker stream (None: no partner)."""

    ref_speaker: str | None
    hyp_speaker: str | None
    counts: ErrorCounts


@dataclass(frozen=True)
class CpSession:
    """cp counts of one session and its speaker pairing."""

    session: str
    counts: ErrorCounts
    pairs: tuple[SpeakerPair, ...]

    @property
    def assignment(self) -> dict[str, str]:
        """Reference speaker -> hypothesis speaker, for paired speakers only."""
        return {
            p.ref_speaker: p.hyp_speaker
            for p in self.pairs
            if p.ref_speaker is not None and p.hyp_speaker is not None
        }

    @property
    def missed_speakers(self) -> int:
        """Reference speakers left without a hypothesis stream."""
        return sum(p.hyp_speaker is None for p in self.pairs)

    @property
    def falarm_speakers(self) -> int:
        """Hypothesis speakers left without a reference stream."""
        return sum(p.ref_speaker is None for p in self.pairs)


@dataclass(frozen=True)
class CpResult:
    """cpWER/cpCER: counts summed over sessions, and per session."""

    counts: ErrorCounts
    sessions: tuple[CpSession, ...]

    @property
    def rate(self) -> float:
        return self.counts.rate


@dataclass(frozen=True)
class DeltaResult:
    """cp error rate, speaker-agnostic error rate, and their difference."""

    cp: CpResult
    agnostic: ErrorRateResult

    @property
    def delta(self) -> float:
        return self.cp.rate - self.agnostic.rate


def _speaker_streams(
    segments: list[TextSegment], unit: TokenUnit, options: Normalization
) -> dict[str, list[str]]:
    """Tokens per speaker, segments in start-time order (input is already sorted)."""
    by_speaker: dict[str, list[TextSegment]] = {}
    for segment in segments:
        by_speaker.setdefault(segment.speaker, []).append(segment)
    return {spk: stream_tokens(segs, unit, options) for spk, segs in sorted(by_speaker.items())}


def assign_streams(ref: dict[str, list[str]], hyp: dict[str, list[str]]) -> tuple[SpeakerPair, ...]:
    """The pairing of speaker token streams with the smallest total edit distance.

    Returns one SpeakerPair per stream of either side, paired ones first (in reference order).
    """
    ref_names, hyp_names = list(ref), list(hyp)
    size = max(len(ref_names), len(hyp_names))
    cost = np.zeros((size, size), dtype=np.int64)  # [ref stream (padded), hyp stream (padded)]
    for i, r in enumerate(ref_names):
        cost[i, len(hyp_names) :] = len(ref[r])
        for j, h in enumerate(hyp_names):
            cost[i, j] = edit_distance(ref[r], hyp[h])
    for j, h in enumerate(hyp_names):
        cost[len(ref_names) :, j] = len(hyp[h])
    rows, cols = linear_sum_assignment(cost)
    pairs = []
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        ref_name = ref_names[i] if i < len(ref_names) else None
        hyp_name = hyp_names[j] if j < len(hyp_names) else None
        if ref_name is None and hyp_name is None:
            continue
        counts = count_errors(
            ref[ref_name] if ref_name is not None else [],
            hyp[hyp_name] if hyp_name is not None else [],  # "" is a real (unlabelled) speaker
        )
        pairs.append(SpeakerPair(ref_name, hyp_name, counts))
    pairs.sort(key=lambda p: (p.ref_speaker is None, p.hyp_speaker is None))
    return tuple(pairs)


def cp_error_rate(
    ref: Iterable[TextSegment],
    hyp: Iterable[TextSegment],
    unit: TokenUnit = TokenUnit.MIXED,
    options: Normalization = DEFAULT_NORMALIZATION,
) -> CpResult:
    """cpCER (unit MIXED) or cpWER (unit WORD) over all sessions of either side.

    Raises InvalidRequest if the sessions cannot be paired (see `wer.pair_sessions`).
    """
    sessions = []
    total = ErrorCounts()
    for session, ref_segs, hyp_segs in pair_sessions(group_by_session(ref), group_by_session(hyp)):
        pairs = assign_streams(
            _speaker_streams(ref_segs, unit, options), _speaker_streams(hyp_segs, unit, options)
        )
        counts = sum((p.counts for p in pairs), ErrorCounts())
        sessions.append(CpSession(session, counts, pairs))
        total = total + counts
    return CpResult(total, tuple(sessions))


def delta_error_rate(
    ref: Iterable[TextSegment],
    hyp: Iterable[TextSegment],
    unit: TokenUnit = TokenUnit.MIXED,
    options: Normalization = DEFAULT_NORMALIZATION,
) -> DeltaResult:
    """cp error rate and speaker-agnostic error rate of the same inputs (delta = difference)."""
    ref, hyp = tuple(ref), tuple(hyp)
    return DeltaResult(cp_error_rate(ref, hyp, unit, options), error_rate(ref, hyp, unit, options))


ORC_MAX_CELLS = 20_000_000  # DP cells (states x slice ends) above which orcWER is refused


@dataclass(frozen=True)
class OrcResult:
    """orcWER/orcCER: errors and reference tokens summed over sessions."""

    errors: int
    ref_length: int

    @property
    def rate(self) -> float:
        """errors / ref_length; for an empty reference 0.0 without errors, else `math.inf`."""
        if self.ref_length == 0:
            return 0.0 if self.errors == 0 else math.inf
        return self.errors / self.ref_length


def _slice_costs(segment: list[str], stream: list[str]) -> np.ndarray:
    """[P+1, P+1] costs: [p, q] = d(segment, stream[p:q]) for p <= q, inf below the diagonal."""
    size = len(stream) + 1
    costs = np.full((size, size), np.inf)
    for p in range(size):
        for q in range(p, size):
            costs[p, q] = edit_distance(segment, stream[p:q])
    return costs


def _orc_session(segments: list[list[str]], streams: list[list[str]]) -> int:
    """Fewest errors over every assignment of whole reference segments to hypothesis streams.

    D[p_1, ..., p_K] is the cost after the segments so far with stream k consumed up to p_k; a
    segment given to stream k consumes the slice p_k..q at cost d(segment, slice). Hypothesis
    tokens no segment consumes are insertions.
    """
    if not streams:
        return sum(len(s) for s in segments)
    shape = tuple(len(s) + 1 for s in streams)
    cells = int(np.prod(shape)) * max(shape) * len(segments)
    if cells > ORC_MAX_CELLS:
        raise InvalidRequest(f"orcWER needs {cells} DP cells (limit {ORC_MAX_CELLS})")
    cost = np.full(shape, np.inf)  # [len_1 + 1, ..., len_K + 1]
    cost[(0,) * len(streams)] = 0.0
    for segment in segments:
        best = np.full(shape, np.inf)
        for k, stream in enumerate(streams):
            moved = np.moveaxis(cost, k, -1)  # [..., P]
            step = (moved[..., :, None] + _slice_costs(segment, stream)).min(axis=-2)  # [..., Q]
            best = np.minimum(best, np.moveaxis(step, -1, k))
        cost = best
    grids = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    remaining = sum(n - 1 - g for n, g in zip(shape, grids, strict=True))
    return int((cost + remaining).min())


def orc_error_rate(
    ref: Iterable[TextSegment],
    hyp: Iterable[TextSegment],
    unit: TokenUnit = TokenUnit.MIXED,
    options: Normalization = DEFAULT_NORMALIZATION,
) -> OrcResult:
    """orcCER (unit MIXED) / orcWER (unit WORD): each reference segment may go to any one
    hypothesis speaker stream (optimal reference combination, meeteval's orcWER).

    Exponential in the number of hypothesis speakers; raises InvalidRequest above
    `ORC_MAX_CELLS` DP cells (meant for short test vectors, not hour-long meetings).
    """
    errors = length = 0
    for _, ref_segs, hyp_segs in pair_sessions(group_by_session(ref), group_by_session(hyp)):
        segments = [stream_tokens([s], unit, options) for s in ref_segs]
        streams = list(_speaker_streams(hyp_segs, unit, options).values())
        errors += _orc_session(segments, streams)
        length += sum(len(s) for s in segments)
    return OrcResult(errors, length)
