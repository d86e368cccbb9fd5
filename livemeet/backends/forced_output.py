"""Benchmark mode `--forced-output` (DESIGN section 4): a reference transcript whose tokens
replace the sampled ones, so random weights write a realistic transcript. `read_forced_output`
loads it; for a live hop, `forced_hop_parts` gives what a perfect model writes for the audio up
to the hop's edge: the words spoken by then, a turn in progress left open."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from livemeet.errors import ConfigError
from livemeet.transcript.parser import parse_transcript, render_segment, takes_leading_space
from livemeet.transcript.segments import Segment, word_end_times

# s; float noise in comparing word ends with edges and cuts: one tolerance on both sides, so a
# word ending just past a hop's edge is written by the next hop, whose cut is that edge (with
# forced output the time scale is 1, and edges and 2-decimal stamps lie on the sample grid)
FORCED_TIME_TOLERANCE_S = 1e-6


@dataclass(frozen=True)
class ForcedPart:
    """One segment of a forced hop's output: the reference segment `index` whole (its ids were
    tokenized at load), or (index None) `rendered`, a part of one in the output grammar:
    from the cut and/or up to the words spoken, with its end stamp only when `closed`."""

    index: int | None
    rendered: str
    closed: bool


def forced_skip_keys(reference: Sequence[Segment]) -> list[float]:
    """For `forced_hop_parts(..., skip_keys=)`: the running maximum over the reference of each
    segment's latest time, max(start, end) (every word end lies between start and end), or its
    start for a segment with no word. Non-decreasing, so a bisection finds the segments that no
    hop after a given cut can write any more."""
    keys: list[float] = []
    top = -math.inf
    for seg in reference:
        top = max(top, max(seg.start_s, seg.end_s) if seg.text.split() else seg.start_s)
        keys.append(top)
    return keys


def forced_hop_parts(
    reference: Sequence[Segment],
    edge_s: float,
    after_s: float,
    skip_keys: Sequence[float] | None = None,
) -> list[ForcedPart]:
    """What a perfect model writes for audio up to `edge_s` after a cut at `after_s` (-1: none),
    the reference's words timed by `word_end_times`: each segment's words that end after the
    cut and by the edge, in order. A segment cut by `after_s` (a committed segment that was
    still being spoken, by `finalize` or a full window) goes on from the cut, as a new
    segment starting there; one whose spoken words stop before its end is left open, and
    nothing follows it (the model writes in order; references are taken not to overlap, as a
    benchmark's turns do not). A remainder starts at the cut's stamp rounded up, so that the
    hop keeps it (`moss_state.past_cut`); that may be the edge's, which the session keeps
    (`session.live.clean_hypothesis`: a start within one stamp step of the edge). Its leading
    space is the whole text's (`takes_leading_space`), so each hop's ids are a prefix of the
    next one's.
    Every word is written by exactly one of two hops where the second's cut is the first's
    edge (the `finalize` / full-window case). `skip_keys` (`forced_skip_keys(reference)`)
    passes over the segments that start by the edge and whose words all end by the cut
    without looking at them: the same parts, in time independent of how far the meeting is
    (a 30-minute reference has ~2,300 segments, and each hop looked at all it had passed)."""
    parts: list[ForcedPart] = []
    first = 0
    if skip_keys is not None:
        first = bisect.bisect_right(skip_keys, min(after_s + FORCED_TIME_TOLERANCE_S, edge_s))
    for index in range(first, len(reference)):
        seg = reference[index]
        if seg.start_s > edge_s:
            break
        ends = word_end_times(seg)
        left = [k for k, t in enumerate(ends) if t > after_s + FORCED_TIME_TOLERANCE_S]
        if not left:
            continue  # before the cut: committed already
        spoken = [k for k in left if ends[k] <= edge_s + FORCED_TIME_TOLERANCE_S]
        if not spoken:
            break  # being spoken, not one of its words yet
        closed = len(spoken) == len(left)  # its last word, and so its end, by the edge
        if closed and len(left) == len(ends):
            parts.append(ForcedPart(index, render_segment(seg), True))
            continue
        words = seg.text.split()
        part = replace(
            seg,
            # from the cut, rounded up to its 2-decimal stamp: not before it (`moss_state.past_cut`)
            start_s=seg.start_s
            if len(left) == len(ends)
            else math.ceil(after_s * 100 - 1e-6) / 100,
            text=" ".join(words[k] for k in spoken),
        )
        space = takes_leading_space(seg.text)
        parts.append(ForcedPart(None, render_segment(part, space=space, closed=closed), closed))
        if not closed:
            break
    return parts


def read_forced_output(path: Path) -> tuple[str, list[Segment]]:
    """A `--forced-output` reference transcript (`[0.00][S01]text[1.20]...`, MODEL.md section
    6's grammar): its stripped text and segments. Raises ConfigError for a file that cannot be
    read as UTF-8 or holds no segment."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --forced-output {path}: {exc}") from exc
    segments = parse_transcript(text)
    if not segments:
        raise ConfigError(f"--forced-output {path} holds no [start][Sxx]text[end] segment")
    return text, segments
