"""The live holder's outbox (gateway/live_holder.py): a final goes out once the journal holds it,
without holding the pump up, so a burst of finals is queued to the journal at once and nothing
overtakes a final. A scripted backend session and a journal whose commits the test settles."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection

from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.gateway.live_protocol import AudioFormat
from livemeet.gateway.live_replay import SessionEvent
from livemeet.gateway.session_tokens import SessionTokens
from livemeet.transcriber import (
    Error,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TranscriptFinal,
)
from livemeet.transcript.segments import FinishReason, Segment
from loadtest.pump_load import ScriptedSession
from tests.gateway.test_speaker_rename import RecordingSink
from tests.gateway.test_ws_live import wait_until

FORMAT = AudioFormat(16000, 1, "pcm_s16le")


class HeldJournal:
    """The journal calls the holder makes for finals (and the labels shown); each final's
    commit waits for the test."""

    def __init__(self) -> None:
        self.finals: list[tuple[Segment, asyncio.Future[None]]] = []
        self.labels: set[str] = set()

    def add_final(self, session_id: str, segment: Segment) -> asyncio.Future[None]:
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.finals.append((segment, stored))
        return stored

    def set_labels(self, session_id: str, labels: Collection[str]) -> None:
        self.labels = set(labels)

    def commit(self, index: int) -> None:
        self.finals[index][1].set_result(None)


def final(n: int) -> SegmentFinal:
    return SegmentFinal(Segment(n, n + 1.0, "S01", f"final {n}", id=f"seg-{n:04d}", is_final=True))


def partial(n: int) -> SegmentPartial:
    return SegmentPartial(n, (Segment(n + 1.0, n + 1.5, "S02", f"partial {n}"),))


def held_holder(
    recover: Callable[[LiveSessionHolder], Awaitable[bool]] | None = None,
) -> tuple[LiveSessionHolder, ScriptedSession, HeldJournal, RecordingSink]:
    session, journal, sink = ScriptedSession("live-outbox"), HeldJournal(), RecordingSink()
    holder = LiveSessionHolder(
        session,
        PcmStreamDecoder(16000, 1, "pcm_s16le"),
        FORMAT,
        SessionTokens.new(),
        lambda _: None,
        journal=journal,  # type: ignore[arg-type]  # the calls for finals only
        options=SessionOptions(live=True),
        recover=recover,
    )
    holder.attach(sink, resumed=False)
    return holder, session, journal, sink


def texts(events: list[SessionEvent]) -> list[str]:
    out: list[str] = []
    for event in events:
        if isinstance(event, SegmentFinal):
            out.append(event.segment.text)
        elif isinstance(event, SegmentPartial):
            out.append(f"{event.segments[0].text} (rev {event.rev})")
        else:
            out.append(type(event).__name__)
    return out


async def test_a_burst_of_finals_is_queued_to_the_journal_at_once_and_sent_in_order() -> None:
    """The pump awaited each final's commit before reading on: a burst of finals (a backend
    catching up) took one group commit each, and the partial after them waited for all
    (p95 1.4 s at 50 demo sessions). Now every final is queued to the journal at once, and
    each goes out once its own commit is done, with what came after it behind it."""
    holder, session, journal, sink = held_holder()
    for event in (final(1), partial(1), final(2), partial(2), final(3), partial(3)):
        session.queue.put_nowait(event)
    await wait_until(lambda: len(journal.finals) == 3)
    await asyncio.sleep(0.05)
    assert sink.events == []  # nothing before its commit
    journal.commit(0)
    await wait_until(lambda: len(sink.events) == 2)
    journal.commit(2)  # a later final's commit cannot send it past the one before
    await asyncio.sleep(0.05)
    assert texts(sink.events) == ["final 1", "partial 1 (rev 1)"]
    journal.commit(1)
    await wait_until(lambda: len(sink.events) == 6)
    assert texts(sink.events) == [
        "final 1",
        "partial 1 (rev 1)",
        "final 2",
        "partial 2 (rev 2)",
        "final 3",
        "partial 3 (rev 3)",
    ]
    assert [f.segment.id for f in holder.replay.finals] == ["seg-0001", "seg-0002", "seg-0003"]
    assert journal.labels == {"S01", "S02"}  # shown as they went out: a rebuild may merge them
    await holder.release()


async def test_partials_behind_a_final_are_sent_as_the_latest_one() -> None:
    """Partials waiting behind a final replace each other (each is the whole tentative
    tail): the client gets the newest, numbered on from the last it had."""
    holder, session, journal, sink = held_holder()
    for event in (partial(1), final(1), partial(2), partial(3), partial(4)):
        session.queue.put_nowait(event)
    await wait_until(lambda: len(journal.finals) == 1)
    await asyncio.sleep(0.05)
    assert texts(sink.events) == ["partial 1 (rev 1)"]
    journal.commit(0)
    await wait_until(lambda: len(sink.events) == 3)
    await asyncio.sleep(0.05)
    assert texts(sink.events) == ["partial 1 (rev 1)", "final 1", "partial 4 (rev 2)"]
    assert holder.replay.partial is not None and holder.replay.partial.rev == 2
    await holder.release()


async def test_the_final_transcript_waits_for_the_finals_before_it() -> None:
    holder, session, journal, sink = held_holder()
    transcript = TranscriptFinal((final(1).segment,), FinishReason.STOP, 1.0, 2.0)
    for event in (final(1), transcript):
        session.queue.put_nowait(event)
    await wait_until(lambda: len(journal.finals) == 1)
    await asyncio.sleep(0.05)
    assert sink.events == [] and holder.replay.terminal is None
    journal.commit(0)
    await wait_until(lambda: holder.replay.terminal is not None)
    assert texts(sink.events) == ["final 1", "TranscriptFinal"]
    await holder.release()


async def test_finals_held_when_the_session_fails_are_not_sent() -> None:
    """The session's storage failed (its error is out): a final still waiting for its commit,
    and what waits behind it, never go out (the journal does not hold them)."""
    holder, session, journal, sink = held_holder()
    for event in (final(1), partial(1)):
        session.queue.put_nowait(event)
    await wait_until(lambda: len(journal.finals) == 1)
    holder.fail(Error("storage_failed", "the disk is full", retryable=True))
    journal.commit(0)  # the writer settles a failed session's futures too
    await asyncio.sleep(0.05)
    assert texts(sink.events) == ["Error"]
    assert holder.replay.finals == []
    await holder.release()


async def test_a_rebuild_after_the_engine_was_lost_starts_from_the_finals_held() -> None:
    """The rebuilt backend session is opened from the finals recorded (`LiveRestore`): one
    still waiting for its commit when the engine was lost must be in them, or the new session
    writes that stretch again under a new id."""
    finals_at_rebuild: list[str] = []

    async def recover(holder: LiveSessionHolder) -> bool:
        finals_at_rebuild.extend(f.segment.id for f in holder.replay.finals)
        return False

    holder, session, journal, sink = held_holder(recover)
    for event in (final(1), Error("engine_unavailable", "the engine died", retryable=True)):
        session.queue.put_nowait(event)
    await wait_until(lambda: len(journal.finals) == 1)
    await asyncio.sleep(0.05)
    assert finals_at_rebuild == []  # the rebuild waits for the commit
    journal.commit(0)
    await wait_until(lambda: holder.replay.terminal is not None)
    assert finals_at_rebuild == ["seg-0001"]
    assert texts(sink.events) == ["final 1", "Error"]
    await holder.release()


async def test_a_session_whose_storage_failed_while_finals_waited_is_not_rebuilt() -> None:
    """The engine was lost while a final waited for its commit, and the session's storage
    failed meanwhile (its error is out, its journal entry discarded): the pump rebuilt it all
    the same once the outbox was flushed (the journal's audio is gone: a new engine session
    for nothing), then sent the engine's error as a second terminal event."""
    rebuilds: list[str] = []

    async def recover(holder: LiveSessionHolder) -> bool:
        rebuilds.append(holder.id)
        return False

    holder, session, journal, sink = held_holder(recover)
    for event in (final(1), Error("engine_unavailable", "the engine died", retryable=True)):
        session.queue.put_nowait(event)
    await wait_until(lambda: len(journal.finals) == 1)
    holder.fail(Error("storage_failed", "the disk is full", retryable=True))
    journal.commit(0)  # the writer settles a failed session's futures too
    await wait_until(lambda: holder.pump.done())
    assert rebuilds == []
    assert texts(sink.events) == ["Error"]
    assert isinstance(holder.replay.terminal, Error)
    assert holder.replay.terminal.code == "storage_failed"
    await holder.release()


async def test_nothing_the_backend_sends_after_a_storage_failure_goes_out() -> None:
    """The session failed (its storage): a partial and a backend error after that went out
    behind the error, and the second error replaced the first as the session's outcome (a
    review). Nothing follows the session's terminal event now."""
    holder, session, journal, sink = held_holder()
    storage = Error("storage_failed", "the disk is full", retryable=True)
    holder.fail(storage)
    for event in (partial(1), Error("internal_error", "the backend stopped")):
        session.queue.put_nowait(event)
    await wait_until(lambda: holder.pump.done())
    assert sink.events == [storage] and holder.replay.terminal == storage
    await holder.release()
