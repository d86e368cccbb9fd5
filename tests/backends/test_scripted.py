"""The scripted backend's live sessions re-opened from their stored finals after a restart
(`SessionOptions.restore`, DESIGN 5.9): as a `BackendCore` (stepped as the worker does) and
through the Transcriber interface (the in-process `EngineClient`).

The property: a meeting interrupted once its storage holds k finals, then restored from those k
and sent all its audio again from 0, commits what the uninterrupted meeting commits: restored
plus new finals equal the uninterrupted finals (ids, texts, times, labels), and no restored
final comes out again. It holds here because the scripted decode of a window is the reference
cut to it, whatever the hop's edges, so both sessions commit whole reference turns at the same
times; a real model's decodes of other windows may differ.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends.scripted import ScriptedCore
from livemeet.config import ModelConfig
from livemeet.gateway.engine_client import EngineClient, EngineSession
from livemeet.transcriber import (
    Event,
    LiveRestore,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TranscriptFinal,
)
from livemeet.transcript.segments import Segment
from tests.backends.helpers import run_to_idle, stream

DURATION_S = 12.0  # DEFAULT_SCRIPT: S01, S02, S01 again, then S03, to 11 s


def audio(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


def finals_of(events: list[Event]) -> list[Segment]:
    return [e.segment for e in events if isinstance(e, SegmentFinal)]


def interrupted(k: int, chunk_s: float = 0.5) -> tuple[Segment, ...]:
    """A session's first `k` finals, as storage holds them when the server dies (it may have
    committed more meanwhile: storage is behind, and only what it holds is restored)."""
    core = ScriptedCore()
    core.open("s1", SessionOptions())
    out: list[tuple[str, Event]] = []
    chunk = round(chunk_s * SAMPLE_RATE)
    samples = audio(DURATION_S)
    for i in range(0, samples.size, chunk):
        core.append("s1", samples[i : i + chunk])
        run_to_idle(core, out)
        finals = finals_of([e for _, e in out])
        if len(finals) >= k:
            core.abort("s1")
            return tuple(finals[:k])
    raise AssertionError(f"fewer than {k} finals")


def restored_events(stored: tuple[Segment, ...], head_s: float) -> list[Event]:
    """A fresh core's session restored from `stored`: the first `head_s` of audio again at
    once (as the gateway re-sends stored audio), then the rest in 0.5 s chunks, stepped."""
    core = ScriptedCore()
    core.open("s1", SessionOptions(restore=LiveRestore(stored)))
    out: list[tuple[str, Event]] = []
    head = round(head_s * SAMPLE_RATE)
    samples = audio(DURATION_S)
    if head:
        core.append("s1", samples[:head])
    chunk = round(0.5 * SAMPLE_RATE)
    for i in range(head, samples.size, chunk):
        core.append("s1", samples[i : i + chunk])
        run_to_idle(core, out)
    core.end("s1")
    run_to_idle(core, out)
    assert core.num_sessions == 0
    return [e for _, e in out]


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("head_s", [0.0, 6.0])
def test_a_restored_meeting_commits_what_the_uninterrupted_one_does(k: int, head_s: float) -> None:
    whole = stream(ScriptedCore(), audio(DURATION_S))
    want = whole[-1]
    assert isinstance(want, TranscriptFinal) and len(want.segments) == 4
    stored = interrupted(k)
    assert stored == want.segments[:k]
    events = restored_events(stored, head_s)
    new = finals_of(events)
    assert not {s.id for s in new} & {s.id for s in stored}  # no restored final again
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert final.segments == (*stored, *new) == want.segments  # ids, texts, times, labels
    assert sum(isinstance(e, TranscriptFinal) for e in events) == 1
    # no partial shows a restored turn's words again
    shown = [s for e in events if isinstance(e, SegmentPartial) for s in e.segments]
    assert all(s.start_s >= stored[-1].end_s for s in shown)


def test_a_turn_cut_by_a_finalize_goes_on_with_its_remaining_words() -> None:
    """Stored finals that end mid-turn (a finalize at 4 s, inside S02's 3.0-5.5 s turn): the
    restored session writes only the words after the cut, as the uninterrupted one does (the
    scripted decode drops the word spoken across the cut in both: it is whole in neither
    window)."""
    whole = stream(ScriptedCore(), audio(DURATION_S), finalize_at_s=4.0)
    want = whole[-1]
    assert isinstance(want, TranscriptFinal)
    cut = [s for s in want.segments if s.end_s <= 4.0 + 1e-6]
    assert cut[-1].end_s == pytest.approx(4.0) and cut[-1].speaker == "S02"
    events = restored_events(tuple(cut), head_s=4.0)
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert [(s.id, s.speaker, s.text) for s in final.segments] == [
        (s.id, s.speaker, s.text) for s in want.segments
    ]
    new = finals_of(events)
    assert new[0].speaker == "S02" and not new[0].text.startswith(cut[-1].text)
    assert new[0].start_s == pytest.approx(4.0)


# -- through the Transcriber interface ------------------------------------------------------


async def collect(session: EngineSession, until_finals: int | None = None) -> list[Event]:
    """The session's events to its end, or until `until_finals` finals came."""
    events: list[Event] = []

    async def run() -> None:
        async for e in session.events():
            events.append(e)
            if until_finals is not None and len(finals_of(events)) >= until_finals:
                return

    await asyncio.wait_for(run(), 20.0)
    return events


async def test_a_restored_session_through_the_transcriber_interface() -> None:
    """The gateway's view: the stored finals travel in `SessionOptions.restore` to the engine
    worker, all the audio is sent again from 0 (at once), then the live audio; the session's
    finals and transcript are the uninterrupted session's."""
    client = EngineClient(ModelConfig(backend="scripted"), in_process=True)
    await client.start()
    try:
        whole = await client.open_session(SessionOptions())
        for _ in range(round(DURATION_S / 0.5)):
            await whole.append(audio(0.5))
            await asyncio.sleep(0.01)  # lets the worker hop between chunks
        await whole.end()
        want = (await collect(whole))[-1]
        assert isinstance(want, TranscriptFinal) and len(want.segments) == 4

        first = await client.open_session(SessionOptions())
        sent_s = 0.0
        pending = asyncio.create_task(collect(first, until_finals=2))
        while not pending.done() and sent_s < DURATION_S:
            await first.append(audio(0.5))
            sent_s += 0.5
            await asyncio.sleep(0.01)
        stored = tuple(finals_of(await pending)[:2])
        await first.abort()  # the server dies
        assert stored == want.segments[:2]

        restored = await client.open_session(SessionOptions(restore=LiveRestore(stored)))
        await restored.append(audio(sent_s))  # all that was heard, at once
        for _ in range(round((DURATION_S - sent_s) / 0.5)):
            await restored.append(audio(0.5))
            await asyncio.sleep(0.01)
        await restored.end()
        events = await collect(restored)
    finally:
        await client.close()
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    new = finals_of(events)
    assert not {s.id for s in new} & {s.id for s in stored}
    assert final.segments == (*stored, *new) == want.segments
