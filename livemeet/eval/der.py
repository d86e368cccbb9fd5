"""Speaker-timestamp diarization error rate (DER), as NIST md-eval and pyannote.metrics define it.

DER = (missed + false alarm + confusion) / total, all in seconds of speaker time over the scored
region (NIST RT-09 evaluation plan). Per elementary interval of duration d with N_ref reference
and N_hyp hypothesis speakers active, and N_correct mapped pairs active on both sides:
total += d * N_ref; missed += d * max(0, N_ref - N_hyp); false alarm += d * max(0, N_hyp - N_ref);
confusion += d * (min(N_ref, N_hyp) - N_correct).

Scored region, per session:
- the UEM regions of the session; without a UEM, [first start, last end] over both sides
  (pyannote.metrics' approximation when no UEM is given, and dscore's; md-eval alone takes the
  reference's extent, so it misses false alarms before the first or after the last reference
  turn: meeteval issue 97);
- minus a collar of `collar_s` on EACH side of every reference turn start and end (md-eval
  `-c 0.25` = dscore `--collar 0.25` = pyannote `collar=0.5`, which is the total width); the
  boundaries are those of the turns as written, before a speaker's touching turns are merged;
  zero-length turns get none (pyannote drops empty segments; md-eval collars them, dscore
  refuses them). A UEM edge is no boundary (dscore trims turns to the UEM first, so it also
  collars the UEM edges that cut a reference turn);
- minus, with `skip_overlap`, the time where two or more reference speakers talk (pyannote
  `skip_overlap=True`, md-eval `-1`, dscore `--ignore_overlaps`).
Every tool's own default is no collar with overlap scored; the CLI's default is the NIST RT
setting, 0.25 s per side with overlap scored (`DER_COLLAR_S`).

The speaker mapping is the one-to-one reference-to-hypothesis mapping that maximises the
overlap time inside the scored region (Hungarian algorithm), as pyannote.metrics computes it
(`mapping="pyannote"`, the default). md-eval (and dscore, which runs it) maps over the UEM
before removing the collars and the overlap (`mapping="md-eval"` does so: it gives md-eval's
figures on `../shared/data`'s AMI debug files, 0.213152 with `-1` and 0.259491 at `-c 0.25`;
without a UEM the region stays the extent of both sides), so its DER can be higher than
pyannote's, never lower, when the two mappings differ: a
reference speaker whose time all falls in collars still draws its hypothesis speaker there
(`test_der.py` has such a case), and on the AMI debug data with overlap skipped md-eval gives
0.213 where pyannote and we give 0.089 (`../shared/data/README.md`). Ties between mappings of
equal overlap do not change the DER.

A speaker's overlapping turns count once (its turns are merged, as dscore does; md-eval
refuses such files, pyannote counts each turn). With nothing scored, DER is 0.0 without
errors and `inf` with some (pyannote says 1.0; the CLI's JSON writes null).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from livemeet.audio.constants import DER_COLLAR_S, DER_MAPPINGS
from livemeet.errors import InvalidRequest
from livemeet.eval.io import SpeakerTurn, UemRegion
from livemeet.eval.wer import group_by_session, pair_sessions


@dataclass(frozen=True)
class DerComponents:
    """Seconds of speaker time: scored reference total and the three error kinds."""

    total_s: float = 0.0
    missed_s: float = 0.0
    false_alarm_s: float = 0.0
    confusion_s: float = 0.0

    @property
    def error_s(self) -> float:
        return self.missed_s + self.false_alarm_s + self.confusion_s

    @property
    def der(self) -> float:
        """error_s / total_s; 0.0 when nothing is scored and nothing is wrong, else inf."""
        if self.total_s == 0.0:
            return 0.0 if self.error_s == 0.0 else float("inf")
        return self.error_s / self.total_s

    def __add__(self, other: DerComponents) -> DerComponents:
        return DerComponents(
            self.total_s + other.total_s,
            self.missed_s + other.missed_s,
            self.false_alarm_s + other.false_alarm_s,
            self.confusion_s + other.confusion_s,
        )


@dataclass(frozen=True)
class DerSession:
    """DER components of one session and its speaker mapping (ref -> hyp, overlap > 0 only)."""

    session: str
    components: DerComponents
    mapping: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DerResult:
    """DER: components summed over sessions, and per session."""

    components: DerComponents
    sessions: tuple[DerSession, ...]

    @property
    def der(self) -> float:
        return self.components.der


Intervals = np.ndarray  # [n, 2] float64 seconds, sorted by start, disjoint after `_merge`


def _merge(pairs: Iterable[tuple[float, float]]) -> Intervals:
    """The union of intervals as sorted disjoint [start, end] rows (empty ones dropped)."""
    merged: list[list[float]] = []
    for start, end in sorted(pairs):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return np.asarray(merged, dtype=np.float64).reshape(-1, 2)


def _inside(intervals: Intervals, points: np.ndarray) -> np.ndarray:
    """[len(points)] bool: whether each point lies strictly inside one of the intervals."""
    index = np.searchsorted(intervals[:, 0], points, side="right") - 1
    safe = np.clip(index, 0, None)
    return (index >= 0) & (points < intervals[safe, 1]) if len(intervals) else points < -np.inf


def _activity(turns: list[SpeakerTurn]) -> dict[str, Intervals]:
    by_speaker: dict[str, list[tuple[float, float]]] = {}
    for turn in turns:
        by_speaker.setdefault(turn.speaker, []).append((turn.start_s, turn.end_s))
    return {spk: _merge(pairs) for spk, pairs in sorted(by_speaker.items())}


def _session_der(
    session: str,
    ref: list[SpeakerTurn],
    hyp: list[SpeakerTurn],
    region: Intervals,
    collar_s: float,
    skip_overlap: bool,
    mapping: str,
) -> DerSession:
    ref_act, hyp_act = _activity(ref), _activity(hyp)
    # a zero-length turn carries no speech and gets no collar (pyannote drops empty segments)
    spoken = [turn for turn in ref if turn.end_s > turn.start_s]
    ref_bounds = [t for turn in spoken for t in (turn.start_s, turn.end_s)]
    collars = _merge((t - collar_s, t + collar_s) for t in ref_bounds) if collar_s > 0 else None
    edges = [region.ravel()] + [a.ravel() for a in (*ref_act.values(), *hyp_act.values())]
    if collars is not None:
        edges.append(collars.ravel())
    cuts = np.unique(np.concatenate(edges))  # [K + 1] elementary interval boundaries
    mids = (cuts[:-1] + cuts[1:]) / 2  # [K]
    in_region = np.diff(cuts) * _inside(region, mids)  # [K] seconds
    weight = in_region.copy()  # [K] scored seconds
    if collars is not None:
        weight *= ~_inside(collars, mids)
    ref_on = np.array([_inside(a, mids) for a in ref_act.values()]).reshape(-1, len(mids))
    hyp_on = np.array([_inside(a, mids) for a in hyp_act.values()]).reshape(-1, len(mids))
    n_ref, n_hyp = ref_on.sum(axis=0), hyp_on.sum(axis=0)  # [K] each
    if skip_overlap:
        weight *= n_ref < 2
    map_weight = in_region if mapping == "md-eval" else weight
    overlap = (ref_on * map_weight) @ hyp_on.T.astype(np.float64)  # [n_ref_spk, n_hyp_spk] s
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    n_correct = np.zeros(len(mids))
    ref_names, hyp_names = list(ref_act), list(hyp_act)
    pairs = []
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        if overlap[i, j] > 0:
            pairs.append((ref_names[i], hyp_names[j]))
            n_correct += ref_on[i] & hyp_on[j]
    components = DerComponents(
        total_s=float(weight @ n_ref),
        missed_s=float(weight @ np.maximum(0, n_ref - n_hyp)),
        false_alarm_s=float(weight @ np.maximum(0, n_hyp - n_ref)),
        confusion_s=float(weight @ (np.minimum(n_ref, n_hyp) - n_correct)),
    )
    return DerSession(session, components, tuple(pairs))


def _regions(
    session: str,
    ref: list[SpeakerTurn],
    hyp: list[SpeakerTurn],
    uem: dict[str, list[UemRegion]] | None,
) -> Intervals:
    if uem is None:
        turns = ref + hyp
        return _merge([(min(t.start_s for t in turns), max(t.end_s for t in turns))])
    if session not in uem:
        if ref:
            raise InvalidRequest(f"session {session!r} of the reference has no UEM region")
        return _merge([])
    return _merge((r.start_s, r.end_s) for r in uem[session])


def diarization_error_rate(
    ref: Iterable[SpeakerTurn],
    hyp: Iterable[SpeakerTurn],
    uem: Iterable[UemRegion] | None = None,
    collar_s: float = DER_COLLAR_S,
    skip_overlap: bool = False,
    mapping: str = "pyannote",
) -> DerResult:
    """DER of hypothesis turns against reference turns (see the module docstring).

    `collar_s` is per side (seconds, finite, >= 0). With a UEM, time outside it is not scored
    and a hypothesis session it does not list is ignored. `mapping` (one of `DER_MAPPINGS`) says
    where the speaker mapping's overlap is counted. Raises ValueError for a collar that is
    negative, NaN or infinite (NaN scored as no collar, infinity failed in the mapping) or an
    unknown mapping, InvalidRequest for a reference session missing from the UEM.
    """
    if mapping not in DER_MAPPINGS:
        raise ValueError(f"mapping must be one of {', '.join(DER_MAPPINGS)}, got {mapping!r}")
    # `not x >= 0` also refuses nan, which no comparison is true of
    if not (collar_s >= 0 and math.isfinite(collar_s)):
        raise ValueError(f"collar_s must be a finite number >= 0 s, got {collar_s}")
    uem_by_session = None if uem is None else group_by_session(uem)
    sessions = []
    total = DerComponents()
    paired = pair_sessions(group_by_session(ref), group_by_session(hyp))
    for session, ref_turns, hyp_turns in paired:
        region = _regions(session, ref_turns, hyp_turns, uem_by_session)
        result = _session_der(
            session, ref_turns, hyp_turns, region, collar_s, skip_overlap, mapping
        )
        sessions.append(result)
        total = total + result.components
    return DerResult(total, tuple(sessions))
