"""A deterministic in-memory Transcriber for gateway tests (livemeet/transcriber.py protocol).

The transcriber records the incoming-upload counts the gateway sets (`incoming_counts`), and
each session the count when its audio came and when it ended.

Live sessions: every `hop_s` of appended audio emits `SegmentPartial(rev, (open tail,))`; every
`FINAL_EVERY` hops the open tail is committed as a `SegmentFinal`. The n-th final (from 0) and
the partial before it are spoken by `FakeTranscriber.speakers[n % len(speakers)]` (S01 alone
by default), written as the label a speaker merge resolves it to (`merge_speakers`; not with
`FakeTranscriber.backend_merges` False: a backend that has not applied a merge yet). A session
opened with `SessionOptions.restore` starts from those finals and merges and is silent over
the audio the finals cover.
Uploads: at `end()`, one final segment per `SEGMENT_S` of audio, each preceded by its text as
`TextDelta`s split into two-character pieces. Segment texts include a non-ASCII word to
exercise UTF-8 paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.errors import EngineUnavailable, LivemeetError, ProtocolError
from livemeet.transcriber import (
    BackendInfo,
    Event,
    Samples,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TextDelta,
    TranscriptFinal,
)
from livemeet.transcript.segments import FinishReason, Segment, join_texts
from livemeet.transcript.speakers import SpeakerMerges

FINAL_EVERY = 3  # hops per committed segment (live)
SEGMENT_S = 2.0  # s of audio per segment (uploads)


def fake_text(index: int) -> str:
    return f"segment {index} café"


@dataclass
class FakeSessionLog:
    """What a test can assert about one session."""

    options: SessionOptions
    num_samples: int = 0
    num_finalize: int = 0
    finalized_at: list[int] = field(default_factory=list)  # num_samples at each finalize
    ended: bool = False
    aborted: bool = False
    events: list[Event] = field(default_factory=list)
    incoming_at_append: list[int] = field(default_factory=list)  # the count at each append
    incoming_at_end: int | None = None  # the count when end() came
    merges: list[tuple[str, str]] = field(default_factory=list)  # merge_speakers' calls


class FakeSession:
    def __init__(
        self,
        session_id: str,
        options: SessionOptions,
        log: FakeSessionLog,
        end_gate: asyncio.Event | None = None,
        incoming: Callable[[], int] = lambda: 0,
    ) -> None:
        self._incoming = incoming
        self._end_gate = end_gate
        self._gate_task: asyncio.Task[None] | None = None
        self._id = session_id
        self._options = options
        self.log = log
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._hops_done = 0
        self.finish_reason = FinishReason.STOP
        self._rev = 0
        self._committed_end_s = 0.0
        self._finals: list[Segment] = []
        self.speakers: tuple[str, ...] = ("S01",)
        self.applies_merges = True
        self._merges = SpeakerMerges()
        if options.restore is not None:  # rebuilt after a restart: its finals stay committed
            self._finals = list(options.restore.finals)
            self._committed_end_s = self._finals[-1].end_s if self._finals else 0.0
            self._merges = SpeakerMerges(options.restore.merges)
        self._closed = False
        self.segment_events = True

    @property
    def id(self) -> str:
        return self._id

    async def append(self, samples: Samples) -> None:
        if self._closed:
            raise ProtocolError("append after end/abort")
        assert samples.dtype == np.float32 and samples.ndim == 1
        self.log.incoming_at_append.append(self._incoming())
        self.log.num_samples += len(samples)
        if not self._options.live:
            return
        hop = int(self._options.hop_s * SAMPLE_RATE)
        while self.log.num_samples >= (self._hops_done + 1) * hop:
            self._hops_done += 1
            edge_s = self._hops_done * self._options.hop_s
            if edge_s <= self._committed_end_s:
                continue  # audio a restored session committed before its restart
            if self._hops_done % FINAL_EVERY == 0:
                self._commit(edge_s)
            else:
                self._partial(edge_s)

    async def finalize(self) -> None:
        self.log.num_finalize += 1
        self.log.finalized_at.append(self.log.num_samples)
        self._commit(self.log.num_samples / SAMPLE_RATE)

    async def merge_speakers(self, speaker: str, into: str) -> None:
        self.log.merges.append((speaker, into))
        if self.applies_merges:
            self._merges.add(speaker, into)

    def _speaker(self, index: int) -> str:
        """The label the `index`-th final's speaker is written as."""
        return self._merges.resolve(self.speakers[index % len(self.speakers)])

    async def end(self) -> None:
        if self._closed:
            raise ProtocolError("end after end/abort")
        self._closed = True
        self.log.ended = True
        self.log.incoming_at_end = self._incoming()
        if self._end_gate is not None:
            self._gate_task = asyncio.create_task(self._end_after_gate(self._end_gate))
            return
        self._emit_final()

    async def _end_after_gate(self, gate: asyncio.Event) -> None:
        await gate.wait()
        self._emit_final()

    def _emit_final(self) -> None:
        duration_s = self.log.num_samples / SAMPLE_RATE
        if self._options.live:
            self._commit(duration_s)
        else:
            start_s = 0.0
            while start_s < duration_s:
                end_s = min(duration_s, start_s + SEGMENT_S)
                text = fake_text(len(self._finals))
                sep = " " if self._finals else ""
                piece = sep + text
                for i in range(0, len(piece), 2):
                    self._emit(TextDelta(piece[i : i + 2]))
                self._commit(end_s, start_s=start_s)
                start_s = end_s
        self._emit(
            TranscriptFinal(
                tuple(self._finals), self.finish_reason, 1.0 if self._finals else 0.0, duration_s
            )
        )
        self._queue.put_nowait(None)

    async def abort(self) -> None:
        if self._gate_task is not None:
            self._gate_task.cancel()
        self._closed = True
        self.log.aborted = True
        self._queue.put_nowait(None)

    async def events(self) -> AsyncIterator[Event]:
        while True:
            event = await self._queue.get()
            if event is None:
                return
            yield event

    def fail(self, error: LivemeetError) -> None:
        """Test hook: end the stream with an `Error` event."""
        from livemeet.transcriber import Error

        self._closed = True
        self._emit(Error(error.code, error.message, error.retryable))
        self._queue.put_nowait(None)

    def _emit(self, event: Event) -> None:
        self.log.events.append(event)
        self._queue.put_nowait(event)

    def _partial(self, edge_s: float) -> None:
        self._rev += 1
        speaker = self._speaker(len(self._finals))
        tail = Segment(self._committed_end_s, edge_s, speaker, f"partial {self._rev}")
        self._emit(SegmentPartial(self._rev, (tail,)))

    def _commit(self, end_s: float, start_s: float | None = None) -> None:
        start = self._committed_end_s if start_s is None else start_s
        if end_s <= start:
            return
        index = len(self._finals)
        speaker = self._speaker(index)
        seg = Segment(start, end_s, speaker, fake_text(index), id=f"seg-{index:04d}", is_final=True)
        self._finals.append(seg)
        self._committed_end_s = end_s
        if self.segment_events:
            self._emit(SegmentFinal(seg))


class FakeTranscriber:
    """Implements livemeet.transcriber.Transcriber. `open_error` makes open_session raise."""

    def __init__(self, *, demo: bool = True, start_ready: bool = True) -> None:
        self._info = BackendInfo("fake", "fake-model", demo=demo, diarization=False)
        self._ready = False
        self._start_ready = start_ready
        self.open_error: LivemeetError | None = None
        self.end_gate: asyncio.Event | None = None  # when set, end() waits for it to emit
        self.upload_segment_events = True  # False: uploads emit no SegmentFinal (like the demo)
        self.finish_reason = FinishReason.STOP  # every session's TranscriptFinal's
        self.sessions: list[FakeSession] = []
        self.num_started = 0
        self.num_closed = 0
        self.incoming_counts: list[int] = []  # every set_incoming_uploads, in order
        self.gone_for_good = False  # `failed`
        self.speakers: tuple[str, ...] = ("S01",)  # who speaks each final, in turn
        self.backend_merges = True  # False: sessions record merges and write no target

    @property
    def info(self) -> BackendInfo:
        return self._info

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def failed(self) -> bool:
        return self.gone_for_good

    async def start(self) -> None:
        self.num_started += 1
        self._ready = self._start_ready

    async def close(self) -> None:
        self.num_closed += 1
        self._ready = False

    @property
    def incoming_uploads(self) -> int:
        return self.incoming_counts[-1] if self.incoming_counts else 0

    def set_incoming_uploads(self, count: int) -> None:
        self.incoming_counts.append(count)

    async def open_session(self, options: SessionOptions) -> FakeSession:
        if not self._ready:
            raise EngineUnavailable("fake transcriber not ready")
        if self.open_error is not None:
            raise self.open_error
        log = FakeSessionLog(options)
        session = FakeSession(
            f"fake-{len(self.sessions)}",
            options,
            log,
            self.end_gate,
            incoming=lambda: self.incoming_uploads,
        )
        session.segment_events = options.live or self.upload_segment_events
        session.finish_reason = self.finish_reason
        session.speakers = self.speakers
        session.applies_merges = self.backend_merges
        self.sessions.append(session)
        return session


def expected_upload_text(duration_s: float) -> str:
    n = int(np.ceil(duration_s / SEGMENT_S - 1e-9))
    return join_texts(fake_text(i) for i in range(n))


class SlottedFake(FakeTranscriber):
    """A FakeTranscriber with session slots (livemeet.transcriber.SlottedTranscriber), as the
    EngineClient has: `free_slots` is set by the test; `open_session` still opens (the gateway
    alone is under test)."""

    def __init__(self, free_slots: int) -> None:
        super().__init__()
        self.free_slots = free_slots
