"""Speaker merges in a live session (LiveSession.merge_speakers, DESIGN 5.6), through the
scripted backend as the engine worker drives it: from the merge on, no segment carries the
merged-away label; finals sent before keep theirs."""

from __future__ import annotations

import numpy as np

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends.scripted import Script, ScriptedCore
from livemeet.session.live import LiveSession
from livemeet.transcriber import (
    Event,
    LiveRestore,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TranscriptFinal,
    TranscriptRevised,
)
from livemeet.transcript.segments import Segment
from tests.backends.helpers import run_to_idle
from tests.session.test_live import DURATION_S, REFERENCE, audio

CHUNK_S = 0.5


def labels(event: Event) -> list[str]:
    """The labels of the segments `event` carries."""
    if isinstance(event, SegmentFinal):
        return [event.segment.speaker]
    if isinstance(event, SegmentPartial | TranscriptFinal | TranscriptRevised):
        return [s.speaker for s in event.segments]
    return []


def run_with_merge(
    core: ScriptedCore, merge_at_s: float, options: SessionOptions | None = None
) -> tuple[list[Event], list[Event]]:
    """Stream REFERENCE's audio into session "s1", merging S03 into S01 once `merge_at_s` s
    came; returns the events from before the merge and from after it."""
    core.open("s1", options or SessionOptions())
    before: list[tuple[str, Event]] = []
    after: list[tuple[str, Event]] = []
    chunk = round(CHUNK_S * SAMPLE_RATE)
    samples = audio(DURATION_S)
    for i in range(0, len(samples), chunk):
        if i == round(merge_at_s * SAMPLE_RATE):
            core.merge_speakers("s1", "S03", "S01")
        core.append("s1", samples[i : i + chunk])
        run_to_idle(core, after if i >= merge_at_s * SAMPLE_RATE else before)
    core.end("s1")
    run_to_idle(core, after)
    return [e for _, e in before], [e for _, e in after]


def test_no_segment_after_a_merge_carries_the_merged_label_and_finals_stay() -> None:
    """S03 speaks at 9.0-13.5 and 21.0-27.5; merged into S01 at 12 s, while its first turn is
    the open tail: that turn commits as S01 (it was never final), and so is the second."""
    before, after = run_with_merge(ScriptedCore(Script(REFERENCE)), 12.0)
    assert "S03" in [label for e in before for label in labels(e)]  # the client saw it
    assert all("S03" not in labels(e) for e in after)
    final = after[-1]
    assert isinstance(final, TranscriptFinal)
    sent = [e.segment for e in before + after if isinstance(e, SegmentFinal)]
    assert final.segments == tuple(sent)  # finals immutable: the final holds them as sent
    assert [s.speaker for s in final.segments] == [
        "S01" if r.speaker == "S03" else r.speaker for r in REFERENCE
    ]


def test_finals_sent_before_a_merge_keep_the_merged_label() -> None:
    before, after = run_with_merge(ScriptedCore(Script(REFERENCE)), 16.0)
    committed = [e.segment for e in before if isinstance(e, SegmentFinal)]
    assert [s.speaker for s in committed if s.start_s == 9.0] == ["S03"]  # ids, labels kept
    final = after[-1]
    assert isinstance(final, TranscriptFinal)
    assert [s.speaker for s in final.segments if s.start_s in (9.0, 21.0)] == ["S03", "S01"]


def test_a_revision_writes_no_merged_label() -> None:
    _, after = run_with_merge(ScriptedCore(Script(REFERENCE)), 16.0, SessionOptions(revise=True))
    revised = after[-1]
    assert isinstance(revised, TranscriptRevised)
    assert {s.speaker for s in revised.segments} == {"S01", "S02"}


def test_a_session_restored_with_its_merges_goes_on_without_the_merged_label() -> None:
    """A rebuilt session (a restart, the engine worker's loss) opens with the finals and the
    merges the gateway kept: S03's later turn is written as S01, its final before stays."""
    _, after = run_with_merge(ScriptedCore(Script(REFERENCE)), 16.0)
    final = after[-1]
    assert isinstance(final, TranscriptFinal)
    kept = tuple(s for s in final.segments if s.end_s <= 16.0)
    restore = LiveRestore(kept, merges=(("S03", "S01"),))
    core = ScriptedCore(Script(REFERENCE))
    core.open("s2", SessionOptions(restore=restore))
    out: list[tuple[str, Event]] = []
    samples = audio(DURATION_S)
    for i in range(0, len(samples), round(CHUNK_S * SAMPLE_RATE)):
        core.append("s2", samples[i : i + round(CHUNK_S * SAMPLE_RATE)])
        run_to_idle(core, out)
    core.end("s2")
    run_to_idle(core, out)
    assert all("S03" not in labels(e) for _, e in out if not isinstance(e, TranscriptFinal))
    restored_final = out[-1][1]
    assert isinstance(restored_final, TranscriptFinal)
    assert restored_final.segments[: len(kept)] == kept
    assert [s.speaker for s in restored_final.segments if s.start_s == 21.0] == ["S01"]


def test_a_preview_shows_a_merged_label_as_its_target() -> None:
    """A decode's segments closed so far go out while it runs (`preview`) in the forced
    prefix's labels, unmapped: a merged-away one among them shows as its target."""
    live = LiveSession(merges=[("S03", "S01")])
    live.receive_audio(np.zeros(3 * SAMPLE_RATE, np.float32))
    live.window()
    events = live.preview([Segment(0.0, 1.0, "S03", "hello")], session_labels={"S03"})
    assert [labels(e) for e in events] == [["S01"]]
