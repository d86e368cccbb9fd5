"""One live session that outlives its socket (docs/protocol.md, "Resume"); the registry of
them is gateway/live_sessions.py.

A `LiveSessionHolder` owns one live session's backend `TranscriberSession`, its PCM decoder (the
resampler's state goes on across sockets) and a `ReplayState`. One task (the pump) reads the
session's events for its whole life, records them and hands each to the socket attached
(`EventSink`), if any: the backend keeps transcribing while no socket is attached, and a resume
gets what it missed. Every holder's `end` runs at most once.

Durability (DESIGN 5.9, gateway/live_journal.py): with a journal, a holder writes the client's
audio (after the backend took it), its finals, finalizes, names, merges and the labels its
segments showed (`_record`) to disk; `num_frames_durable` is what the journal reported
written, and only that is acknowledged (`audio.ack`, and a resume's `session.ready` offset: the
client sends on from there, and frames the backend took already are skipped). A rebuilt
session is fed the stored audio with the client's finalizes made again where they came in it,
so one the backend had not applied when the server stopped is not lost (its audio would stay a
partial), and one it had applied still cuts there (no final of the rebuilt session crosses
it); a rebuild after the engine's loss does the same (`finalizes`). A finalize is on disk only
with the journal's next commit: a resume's `session.ready` says where the last one on disk
came (`finalize_offset`), its client sends each later one again, and one at or before the
last place the session holds is a repeat that does nothing (`finalize`). A session whose journal
fails (`storage_error`) is ended by the server: audio after that end is dropped, its final
waits for the journal's deletion of it (`journal_discarded`), and a backend error then fails it
as a storage failure (`storage_failure`).

Captions (docs/protocol.md, "Captions"): a holder also has read-only subscribers
(`CaptionsSink`, gateway/ws_captions.py), attached to the session rather than to its socket,
so they stay through a detach and a resume. The pump hands them every event as it hands the
client's socket; a subscriber's own bounded outbox (gateway/captions.py) keeps a slow one from
holding anyone up.

Speaker names (docs/protocol.md, `speaker.rename`): the holder keeps the session's names
{label: name} in its `ReplayState`, so they survive a detach and are sent again on a resume
and in a captions snapshot (as `speaker.renamed`, after the finals); its transcript, live and
stored, carries them.

Speaker merges (docs/protocol.md, `speaker.merge`; DESIGN 5.6): the holder checks a client's
merge against the labels the session has shown and its merges so far, hands it to the backend
session (which writes the target from then on), keeps it in its `ReplayState` and journal
like the names (replayed as `speaker.merged`, right after the renames), and carries it into a
rebuilt backend session (`LiveRestore.merges`). The backend's events that were decoded before
the merge reached it are relabelled on their way through (`ReplayState.as_shown`), so nothing
sent after `speaker.merged` carries the merged-away label; finals sent before keep theirs, and
the final transcript holds every final as it was sent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Protocol

from livemeet.audio.constants import (
    LIVE_ENGINE_POLL_S,
    LIVE_ENGINE_RECOVERY_S,
    LIVE_FINAL_DURABLE_WAIT_S,
    LIVE_REBUILD_DURABLE_WAIT_S,
    MAX_MERGED_SPEAKERS,
    MAX_NAMED_SPEAKERS,
)
from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.errors import (
    EngineUnavailable,
    InternalError,
    InvalidRequest,
    LivemeetError,
    NotFound,
    RevisionFailed,
    ServerRestarting,
    SessionTakenOver,
    StorageFailed,
)
from livemeet.gateway.clients import Client
from livemeet.gateway.live_journal import LiveJournal
from livemeet.gateway.live_protocol import (
    AudioFormat,
    SpeakerMerged,
    SpeakerRenamed,
)
from livemeet.gateway.live_replay import ReplayState, SessionEvent
from livemeet.gateway.session_tokens import SessionTokens
from livemeet.transcriber import (
    Error,
    Event,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TextDelta,
    TranscriberSession,
    TranscriptFinal,
    TranscriptRevised,
    is_terminal,
)
from livemeet.transcript.segments import FinishReason, Transcript

log = logging.getLogger(__name__)

# s the close of a session ended for its storage (`storage_error`) waits for its final
# transcript's write to the transcript store, so that its storage_failed can say whether the
# final was stored (a file and a directory fsync; a failing disk may hang them)
FINAL_STORE_WAIT_S = 2.0


class EventSink(Protocol):
    """The socket a session is attached to (ws_live.LiveConnection). Both calls are
    synchronous and must not block: the pump calls `deliver` for every event."""

    def attached(
        self, holder: LiveSessionHolder, replay: list[SessionEvent], resumed: bool
    ) -> None:
        """This socket now carries `holder`; `replay` is what it must send first."""

    def deliver(self, event: SessionEvent) -> None:
        """A new event of the session, in order."""

    def take_over(self) -> asyncio.Task[None]:
        """Another socket resumed the session: stop carrying it, and close with
        `session_taken_over` (the task returned does the closing)."""
        ...

    def audio_durable(self) -> None:
        """More of the session's audio is on disk: an `audio.ack` may go out."""

    def storage_failed(self, error: StorageFailed) -> bool:
        """The journal cannot keep the session (`error`), and the server ends it as by its
        client's `end` (LiveSessions): take no more audio, acknowledge none, and close with
        storage_failed once the final transcript (and the revision it promised) is out.
        Returns whether this ends it early (its client's `end` had not come)."""
        ...


class CaptionsSink(Protocol):
    """A read-only captions subscriber (ws_captions.CaptionsSubscriber). Synchronous and
    non-blocking, as EventSink's `deliver`."""

    def deliver(self, event: SessionEvent) -> None:
        """A new event of the session, in order."""

    def session_gone(self, error: LivemeetError) -> None:
        """The session was dropped without a terminal event: close with `error`."""


class LiveSessionHolder:
    """One live session, whichever socket carries it. `lock` orders every use of the backend
    session (append, finalize, end) with attaching a socket: a resume waits for an append in
    flight, and an append of a socket that was taken over is refused."""

    def __init__(
        self,
        session: TranscriberSession,
        decoder: PcmStreamDecoder,
        audio_format: AudioFormat,
        tokens: SessionTokens,
        on_terminal: Callable[[LiveSessionHolder], None],
        *,
        session_id: str | None = None,
        journal: LiveJournal | None = None,
        options: SessionOptions | None = None,
        recover: Callable[[LiveSessionHolder], Awaitable[bool]] | None = None,
    ) -> None:
        self.session = session
        self.options = options  # what its backend session was opened with (a rebuild's too)
        # rebuilds the backend session after the engine worker died under it (LiveSessions)
        self._recover = recover
        # the id clients know: the backend session's, or, for a session rebuilt after a
        # restart, the id it had before (its backend session is a new one)
        self.id = session_id if session_id is not None else session.id
        self.decoder = decoder
        self.audio_format = audio_format
        self.tokens = tokens
        self.replay = ReplayState()
        self.sink: EventSink | None = None
        self.subscribers: set[CaptionsSink] = set()
        self.lock = asyncio.Lock()
        self.num_frames_accepted = 0  # sample frames at the client's rate the backend has
        # where the client's finalizes came: `num_frames_accepted` at each, increasing (one
        # per place); a rebuild feeding the audio again makes them again there (`_feed_stored`)
        self.finalizes: list[int] = []
        # the last of them the journal reported holding (None: none yet): with the audio on
        # disk, what a resume's `session.ready` may say is held (`finalize_offset`)
        self.finalize_durable: int | None = None
        # of those, the frames the journal holds on disk (all of them without a journal):
        # what `audio.ack` and a resume's `session.ready` may acknowledge (DESIGN 5.9)
        self.num_frames_durable = 0
        # the sample frame the attached client's next frame starts at, as it counts: from
        # `session.ready`'s offset (`attach`) on; at most `num_frames_accepted` (`append`)
        self.client_offset = 0
        self._durable_changed = asyncio.Event()
        # renames' and merges' journal commits not yet done: their answers wait for them
        # (`_record`), and the final transcript waits for the answers (`_take`)
        self._unanswered: set[asyncio.Future[None]] = set()
        # what the pump holds back behind a final whose journal commit is not done, in order:
        # (that commit's future, the final as shown), or (None, an event that came after
        # one); released from the head as commits settle (`_release`).
        # The pump reads on meanwhile, so a burst of finals is one group commit, not one each
        # with the partial after them waiting for all (1.4 s p95 at 50 demo sessions)
        self._outbox: collections.deque[tuple[asyncio.Future[None] | None, Event]] = (
            collections.deque()
        )
        # the last `segment.partial` rev sent (`_record`); a session rebuilt after a restart
        # starts past any rev its previous run can have sent (`LiveSessions._rebuild`)
        self.partial_rev = 0
        self.journal = journal
        # the journal was told the session's fate (finished, discarded): nothing more goes
        # to it. Set at once for a session without a journal.
        self.journal_closed = journal is None
        # the discard's commit (`close_journal`): the final of a session ended for its
        # storage waits for it (`_take`), so that no restart rebuilds a session its client
        # was told had ended
        self.journal_discarded: asyncio.Future[None] | None = None
        # why the journal could not keep the session (its storage failed): the server ends it
        # as by its client's `end`, its final sent and stored where the store can, and it is
        # not rebuilt after a restart (LiveSessions._storage_failed); None: it is kept
        self.storage_error: StorageFailed | None = None
        # ended for its storage before its client's `end` came: a socket that resumes it
        # is told so after the final, as the socket it failed on (`storage_error` set)
        self.storage_early = False
        self.storage_counted = False  # in livemeet_live_journal_failures_total (LiveSessions)
        # the write of its final transcript to the transcript store (LiveSessions); None: none
        # made (no store, or no final yet)
        self.final_written: asyncio.Task[bool] | None = None
        self.ended = False  # `end` went to the backend (the client's, a drain's, an expiry's)
        self.ended_at: float | None = None  # loop time of that `end` (a revision's delay)
        # (engine, hold) s of the final transcript after `end`: to the backend's final, then
        # its wait for the journal (livemeet_live_final_seconds); None until it went out
        self.final_phases_s: tuple[float, float] | None = None
        self.dropped = False
        # the engine was lost while the server stopped for a restart: the session is left
        # unfinished in the journal for the next start, with no terminal event (`_recover`)
        self.kept_for_restart = False
        self.timer: asyncio.TimerHandle | None = None  # expiry or drop, while detached
        # who it belongs to (gateway/clients.py): the client of the socket that opened it or
        # last resumed it; None: not capped, or not known (rebuilt after a restart: the next
        # resume tells)
        self.client: Client | None = None
        self._on_terminal = on_terminal
        self.pump = asyncio.create_task(self._pump(), name=f"live-pump-{self.id}")

    @property
    def running(self) -> bool:
        """Still at work: its final transcript (and the revision it promised) or its error has
        not come. What the per-client cap counts (LiveSessions.admitting)."""
        return self.replay.terminal is None or self.replay.revision_pending

    @property
    def token(self) -> str | None:
        """The resume token, where this process knows it (module docstring)."""
        return self.tokens.resume_token

    @property
    def captions_token(self) -> str | None:
        """The captions token, where this process knows the resume token (`SessionTokens`)."""
        return self.tokens.captions_token

    def subscribe(self, subscriber: CaptionsSink, max_finals: int) -> list[SessionEvent]:
        """Add a captions subscriber; returns its snapshot (the last `max_finals` finals, then
        the terminal event or the current partial). Synchronous: no event falls between the
        snapshot and the first `deliver`."""
        assert not self.dropped, "subscribe to a dropped session"
        self.subscribers.add(subscriber)
        return self.replay.snapshot(max_finals)

    def unsubscribe(self, subscriber: CaptionsSink) -> None:
        self.subscribers.discard(subscriber)

    def end_subscriptions(self, gone: LivemeetError) -> None:
        """Close every captions subscription with `gone` (each after what it has queued)."""
        for subscriber in list(self.subscribers):
            subscriber.session_gone(gone)
        self.subscribers.clear()

    def authorizes_captions(self, token: str) -> bool:
        """Whether `token` is the session's captions token (constant time)."""
        return self.tokens.authorizes_captions(token)

    def transcript_so_far(self) -> Transcript:
        """The session's transcript now: its final one once that came, else the finals so
        far over the audio received so far."""
        terminal = self.replay.terminal
        if isinstance(terminal, TranscriptFinal):
            transcript = Transcript(terminal.segments, terminal.duration_s, terminal.finish_reason)
        else:
            duration_s = self.num_frames_accepted / self.audio_format.sample_rate
            segments = tuple(f.segment for f in self.replay.finals)
            transcript = Transcript(segments, duration_s, FinishReason.STOP)
        return replace(
            transcript,
            speaker_names=tuple(self.replay.names.items()),
            speaker_merges=self.replay.merges.resolved(),
            language=self._language(),
        )

    def _language(self) -> str | None:
        """The `language` the session was started with (None: none given), which its
        transcript's verbose_json echoes as an upload's does (a trial: `en-GB` said "english")."""
        return self.options.language if self.options is not None else None

    def revised_transcript(self) -> Transcript | None:
        """The session's revised transcript (DESIGN 5.7) once it came, with the names of its
        final one; else None."""
        revision, final = self.replay.revision, self.replay.terminal
        if not isinstance(revision, TranscriptRevised) or not isinstance(final, TranscriptFinal):
            return None
        return Transcript(
            revision.segments,
            final.duration_s,
            revision.finish_reason,
            speaker_names=tuple(self.replay.names.items()),
            speaker_merges=self.replay.merges.resolved(),
            language=self._language(),
        )

    def attach(self, sink: EventSink, *, resumed: bool) -> None:
        """`sink` carries the session from now on (under `lock` for a resume). Its client
        sends on from the durable audio (`client_offset`, `session.ready`'s offset): a crash
        after this loses nothing the client has dropped. Once the final transcript came, from
        all of it: the final holds it (the ack before it covered it, on disk), and the
        journal, done with the session, reports no more (a resume for the revision got an
        offset below that ack)."""
        assert self.sink is None, "detach or take over first"
        self.cancel_timer()
        self.sink = sink
        final = isinstance(self.replay.terminal, TranscriptFinal)
        self.client_offset = self.num_frames_accepted if final else self.num_frames_durable
        sink.attached(self, self.replay.snapshot() if resumed else [], resumed)

    async def append(self, owner: EventSink, pcm: bytes) -> int:
        """Decode `pcm` (the client's PCM16 LE frames, from `client_offset` on) and hand it
        to the backend session; `num_frames_accepted` counts it then (in sample frames at the
        client's rate). Frames the session holds already (a resumed client sends on from the
        durable offset, which may be short of what the backend took) are skipped, so the
        backend and the journal get each frame once. An append the engine's loss refused is
        made again once the session is rebuilt (`_pump`). Returns the bytes of `pcm` that
        were new to the session. Raises SessionTakenOver when `owner` no longer carries the
        session, and as the backend's `append`."""
        taken = 0

        async def feed() -> None:
            nonlocal taken
            if self.ended:  # the server ended it meanwhile (its storage): ignored, as after `end`
                return
            new = self._unheld(pcm)
            taken = len(new)
            if new:
                await self._feed(new)
                if self.journal is None:
                    self.num_frames_durable = self.num_frames_accepted
                elif not self.journal_closed:  # closed: it failed, its socket is told
                    self.journal.append_audio(self.id, new)  # after the backend took it
            self.client_offset += len(pcm) // self.audio_format.frame_bytes

        # to its end though the caller is cancelled meanwhile (a resume waits for it under
        # `lock`): `serve` cancels the handler of a socket whose client hung up, and an append
        # cut inside the backend's `append` (the engine client awaits a shared-memory write
        # for a large frame) left the decoder counting frames the backend never got, so that
        # many frames of the audio the client sent again were skipped as held (a trial lost
        # 10 s of a 110-s meeting)
        work = asyncio.ensure_future(self._with_session(owner, feed))
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(_log_cut_append)
            raise
        return taken

    def _unheld(self, pcm: bytes) -> bytes:
        """The part of `pcm` (the client's frames from `client_offset` on) past the frames the
        session holds. Under `lock`."""
        held_frames = self.num_frames_accepted - self.client_offset
        # the client's offset starts at most at the accepted audio and follows it
        assert held_frames >= 0, (self.num_frames_accepted, self.client_offset)
        return pcm[held_frames * self.audio_format.frame_bytes :]

    async def _with_session(self, owner: EventSink, action: Callable[[], Awaitable[None]]) -> None:
        """Run `action` (it uses `self.session`) under `lock` for `owner`; where the engine's
        loss refused it, once more on the session rebuilt in its place (`_pump`). Raises
        SessionTakenOver when `owner` no longer carries the session, EngineUnavailable when
        no rebuild came, and what `action` raises."""
        for attempt in range(2):
            async with self.lock:
                self._check_owner(owner)
                session = self.session
                try:
                    await action()
                    return
                except EngineUnavailable:
                    if attempt or not self._rebuildable():
                        raise
            # outside the lock, which the rebuild takes: wait for another backend session
            if not await self._replaced(session):
                raise EngineUnavailable(f"live session {self.id}: the engine was lost")

    async def _replaced(self, session: TranscriberSession) -> bool:
        """Wait until the pump has put another backend session in `session`'s place (True), or
        the session ended without one (False), at most LIVE_ENGINE_RECOVERY_S and a little."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LIVE_ENGINE_RECOVERY_S + LIVE_REBUILD_DURABLE_WAIT_S
        while self.session is session:
            if self.dropped or self.replay.terminal is not None or loop.time() > deadline:
                return False
            await asyncio.sleep(LIVE_ENGINE_POLL_S)
        return True

    def _rebuildable(self) -> bool:
        return (
            self._recover is not None
            and self.options is not None
            and self.journal is not None
            and not self.journal_closed
        )

    async def _feed(self, pcm: bytes) -> None:
        """Decode and append (under `lock`)."""
        samples = self.decoder.feed(pcm)
        if len(samples):
            await self.session.append(samples)
        self.num_frames_accepted = self.decoder.num_input_frames

    async def replay_audio(self, chunks: AsyncIterator[bytes]) -> None:
        """A session rebuilt after a restart: append its stored audio (the client's PCM16 LE
        frames from the session's start, in order) before any socket attaches; all of it is
        durable already. Raises as the backend's `append`."""
        async with self.lock:
            await self._feed_stored(chunks)
            self.num_frames_durable = self.num_frames_accepted

    async def _feed_stored(self, audio: AsyncIterator[bytes]) -> None:
        """Feed the backend session the session's stored audio (`audio`: the client's PCM16 LE
        frames from the session's start, in order, read back from the journal) through a
        fresh PCM decoder (`_feed`), with the backend's `finalize` made again after the frame
        each of the client's came at (`finalizes`), so the backend cuts where it did, or
        would have (at the decoder's output at that frame: the same 16-kHz sample, unless a
        resampler's output moved with the chunking). `num_frames_accepted` counts the audio
        as it goes, and is left as it was where this fails (the audio a next rebuild feeds
        again). Under `lock`. Raises as the backend's `append` and `finalize`, and as reading
        `audio`."""
        fmt = self.audio_format
        self.decoder = PcmStreamDecoder(fmt.sample_rate, fmt.channels, fmt.encoding)
        accepted = self.num_frames_accepted
        cuts = collections.deque(self.finalizes)
        try:
            async for chunk in audio:
                first = self.decoder.num_input_frames
                for pcm, finalize in split_at_cuts(chunk, first, fmt.frame_bytes, cuts):
                    if pcm:
                        await self._feed(pcm)
                    if finalize:
                        await self.session.finalize()
        except BaseException:
            self.num_frames_accepted = accepted
            raise

    def durable(self, frames: int) -> None:
        """The journal holds `frames` sample frames of the session on disk (its writer's
        report, on the loop): the socket attached may acknowledge them."""
        self.num_frames_durable = max(self.num_frames_durable, frames)
        self._durable_changed.set()
        if self.sink is not None:
            self.sink.audio_durable()

    async def wait_durable(self, timeout_s: float) -> bool:
        """Wait, at most `timeout_s`, until every accepted frame is durable (a rebuild after
        the engine's loss feeds the new backend session all of them from the journal);
        returns whether it is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.num_frames_durable < self.num_frames_accepted and not self.journal_closed:
            self._durable_changed.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._durable_changed.wait()
            except TimeoutError:
                return False
        return True

    def rename(self, owner: EventSink, speaker: str, name: str | None) -> bool:
        """The client names `speaker` (None: removes its name): recorded for a resume, the
        captions and the transcript, and sent to the client and every subscriber as
        `speaker.renamed`. Returns False, doing nothing, once the terminal event came (the
        final transcript, and the stored copy, are out: a rename that raced them is late).
        Raises InvalidRequest past MAX_NAMED_SPEAKERS labels and for a label merged away (it
        shows as its target, whose name is the one to give), SessionTakenOver."""
        self._check_owner(owner)
        if self.replay.terminal is not None:
            return False
        if speaker in self.replay.merges:
            target = self.replay.merges.resolve(speaker)
            raise InvalidRequest(
                f"{speaker} is merged into {target}, and shows as {target}: rename {target}"
            )
        names = self.replay.names
        if name is not None and speaker not in names and len(names) >= MAX_NAMED_SPEAKERS:
            raise InvalidRequest(
                f"a session names at most {MAX_NAMED_SPEAKERS} speakers: remove a name "
                "(name null) before naming another label"
            )
        self._record(SpeakerRenamed(speaker, name))
        return True

    async def merge(self, owner: EventSink, speaker: str, into: str) -> bool:
        """The client merges the label `speaker` into `into` (module docstring): checked, told
        to the backend session (under `lock`; one the engine's loss refused is made again on
        the rebuilt session, as a `finalize` is), recorded, and sent to the client and every
        subscriber as `speaker.merged`, `into` resolved to its target. Returns False, doing
        nothing, once the terminal event came (as a late rename). Raises InvalidRequest for a
        merge the session cannot make (saying why: `SpeakerMerges.check`), SessionTakenOver,
        and as the backend's `merge_speakers`."""
        merged = False

        async def act() -> None:
            nonlocal merged
            if self.replay.terminal is not None:
                return
            merges = self.replay.merges
            repeat = speaker != into and speaker in merges  # a label into itself: refused
            if repeat and merges.resolve(speaker) == merges.resolve(into):
                # a repeat (a client retrying after a dropped socket): answered again, as a
                # repeated rename is (it closed the session with 4400; a trial)
                self._record(SpeakerMerged(speaker, merges.resolve(into)))
                merged = True
                return
            target = self._merge_target(speaker, into)
            await self.session.merge_speakers(speaker, target)
            if self.replay.terminal is None:  # the final may have come meanwhile: late
                self._record(SpeakerMerged(speaker, target))
                merged = True

        await self._with_session(owner, act)
        return merged

    def _merge_target(self, speaker: str, into: str) -> str:
        """The label `speaker` would show as. Raises InvalidRequest saying why not."""
        replay = self.replay
        try:
            return replay.merges.check(speaker, into, replay.labels_shown, MAX_MERGED_SPEAKERS)
        except ValueError as exc:
            raise InvalidRequest(f"cannot merge {speaker} into {into}: {exc}") from exc

    @property
    def finalize_offset(self) -> int | None:
        """Where the last finalize the session holds on disk came (sample frames at the
        client's rate, as `num_frames_durable`; None: none): what a resume's `session.ready`
        says, so that its client sends again each later one it sent (docs/protocol.md,
        Resume). One before the durable audio is held though its commit's report has not
        come yet: the audio after it was queued after it, so no commit holds that audio
        without it (a resume between the two reports had the client send it again at
        `offset`, past its place: a second cut)."""
        if self.journal is None:
            return self.finalizes[-1] if self.finalizes else None
        held = [f for f in self.finalizes if f < self.num_frames_durable]
        if self.finalize_durable is not None:
            held.append(self.finalize_durable)
        return max(held, default=None)

    async def finalize(self, owner: EventSink) -> None:
        """The client's `finalize`; one the engine's loss refused is made again once the
        session is rebuilt, as an `append` is. Its place is where the client's audio has
        come (`client_offset`): one at or before the last place the session holds is a
        repeat (a client sending again after a resume a finalize the server had kept:
        docs/protocol.md, `finalize_offset`), and does nothing; a cut made again further on
        would split the audio held past it (a resumed client resends from the durable
        offset). Otherwise, once the backend took it, its place in the audio is kept
        (`finalizes`, and the journal). Raises SessionTakenOver when `owner` no longer
        carries the session, and as the backend's `finalize`."""

        async def act() -> None:
            if self.ended:  # the server ended it meanwhile (its storage): the end commits all
                return
            if self.finalizes and self.client_offset <= self.finalizes[-1]:
                return  # a repeat, or nothing received since the last one: the same cut
            await self.session.finalize()
            frames = self.num_frames_accepted
            self.finalizes.append(frames)
            if self.journal is not None and not self.journal_closed:
                # after the audio before it
                stored = self.journal.add_finalize(self.id, frames)
                stored.add_done_callback(lambda _: self._finalize_stored(frames))

        await self._with_session(owner, act)

    def _finalize_stored(self, frames: int) -> None:
        """The journal's commit of the finalize at `frames` settled: held, unless the
        session's storage failed (it is ended then, and not resumed to stream again)."""
        if self.storage_error is None:
            self.finalize_durable = max(self.finalize_durable or 0, frames)

    async def end(self, owner: EventSink | None, *, early: bool = False) -> bool:
        """No more audio, at most once; returns whether this call ended the session. `owner`
        None: the server ends a detached session (an expiry, a drain), which does nothing
        once a resume has attached a socket again (it may have waited for the lock);
        `early`: the server ends it whichever socket carries it (its storage failed:
        `storage_error`). Raises SessionTakenOver (`owner` no longer carries it), and as the
        backend's `append` and `end`."""
        async with self.lock:
            if not early:
                if owner is not None:
                    self._check_owner(owner)
                elif self.sink is not None:
                    return False
            if self.ended:
                return False
            self.ended = True
            self.ended_at = asyncio.get_running_loop().time()
            if self.journal is not None and not self.journal_closed:
                # a rebuild after a crash ends the session too: its client sent `end` once
                self.journal.mark_ended(self.id)
            try:
                tail = self.decoder.flush()
                if len(tail):
                    await self.session.append(tail)
                await self.session.end()
            except EngineUnavailable:
                if not self._rebuildable():
                    raise
                # the engine was lost under it: the rebuild ends the new session (`reopen`)
            return True

    async def release(self, *, restarting: bool = False) -> None:
        """Free everything (the registry's `_drop`, once). `restarting`: the server stops and
        its next start rebuilds the session (subscribers are told so, to come back)."""
        self.cancel_timer()
        self.pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.pump
        self._outbox.clear()  # nobody is left to hand it to; the journal has the finals
        gone: LivemeetError | None = None  # None: each subscriber has the last event queued
        if self.replay.terminal is None and restarting:
            gone = restarting_error(self.id)
        elif self.replay.terminal is None:
            gone = NotFound(
                f"live session {self.id} ended without a final transcript "
                "(its client left, or the server stopped it)"
            )
        elif self.replay.revision_pending:
            gone = RevisionFailed(f"live session {self.id}: its revision was cancelled")
        if gone is not None:
            self.end_subscriptions(gone)
        self.subscribers.clear()
        await self.session.abort()  # idempotent; frees the engine's slot

    def close_journal(self, *, finished: bool) -> None:
        """Tell the journal the session's fate, once: `finished` (its final transcript is
        stored) or discarded (dropped without one, or its storage failed); its audio file
        goes either way (`journal_discarded`: a discard's commit)."""
        if self.journal is None or self.journal_closed:
            return
        self.journal_closed = True
        try:
            if finished:
                self.journal.finish(self.id)
            else:
                self.journal_discarded = self.journal.discard(self.id)
        except InternalError as exc:  # the journal closed first (shutdown): kept for a restart
            log.warning(
                "live session %s: journal closed before its end was noted: %s", self.id, exc
            )

    def cancel_timer(self) -> None:
        """Cancel the detached session's pending timer (its resume window's expiry, or its drop), if
        any; idempotent."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def fail(self, error: Error) -> None:
        """End the session with `error` as its terminal event (sent to its socket and
        subscribers); the caller drops it. Nothing once it has one."""
        if self.replay.terminal is None:
            self._record(error)

    async def final_stored(self) -> bool | None:
        """Whether the session's final transcript was written to the transcript store
        (`final_written`), waited for at most FINAL_STORE_WAIT_S; None where that is not
        known by then; False where no write was made."""
        written = self.final_written
        if written is None:
            return False
        done, _ = await asyncio.wait({written}, timeout=FINAL_STORE_WAIT_S)
        if not done:
            return None
        return not written.cancelled() and written.result()

    def _check_owner(self, owner: EventSink) -> None:
        if self.sink is not owner:
            raise SessionTakenOver(f"live session {self.id} was resumed on another connection")

    async def _pump(self) -> None:
        """Read the session's events to its terminal one (or its abort). The engine worker's
        death (engine_unavailable, retryable) is not terminal where the session can be rebuilt
        from its journal (`recover`): the pump goes on with the new backend session's events.
        A final that promises a revision is handed to `on_terminal` at once (it is stored), and
        the pump reads on to the revision, handed to `on_terminal` again."""
        notified = False  # on_terminal had the final already
        try:
            while True:
                lost: Error | None = None
                async for event in self.session.events():
                    if self._engine_lost(event):
                        assert isinstance(event, Error)
                        lost = event
                        break
                    if self.replay.revision_pending and isinstance(event, Error):
                        event = Error(
                            RevisionFailed.code,
                            f"the revision failed ({event.code}): {event.message}; "
                            "transcript.final stands",
                        )
                    elif self.storage_error is not None and isinstance(event, Error):
                        # the backend failed while the server ended it for its storage: the
                        # session fails as a storage failure did before (no final)
                        why = f"ending it failed ({event.code}: {event.message})"
                        event = storage_failure(self.storage_error, why)
                    await self._take(event)
                    if self.replay.revision_pending and not notified:
                        notified = True
                        self._on_terminal(self)
                    if is_terminal(event):
                        break
                if lost is None:
                    break
                assert self._recover is not None
                await self._flush_outbox()  # the rebuild starts from the finals recorded
                if self.replay.terminal is not None:
                    break  # it failed meanwhile (its storage, with no audio): its error is out
                if not await self._recover(self):
                    if self.storage_error is not None:  # its journal failed during the rebuild
                        lost = storage_failure(self.storage_error, "its engine was lost")
                    if not self.kept_for_restart:
                        self.fail(lost)  # as before: the sockets get the engine's error
                    break
        except Exception as exc:  # a bug: the sockets must still hear of it
            log.exception("live session %s: reading its events failed", self.id)
            self._record(Error(InternalError.code, f"internal error: {type(exc).__name__}"))
        if self.replay.terminal is not None and (not notified or self.replay.revision):
            self._on_terminal(self)

    def _engine_lost(self, event: Event) -> bool:
        """Whether `event` is the engine worker's death under a session that can be rebuilt:
        its audio in the journal, its options known, a registry to rebuild it."""
        return (
            isinstance(event, Error)
            and event.code == EngineUnavailable.code
            and event.retryable
            and self.replay.terminal is None  # after the final: the revision's failure
            and self._rebuildable()
        )

    async def reopen(self, session: TranscriberSession, audio: AsyncIterator[bytes]) -> None:
        """Carry on with `session` (opened from this session's finals) in place of the one the
        engine lost: a fresh PCM decoder is fed `audio` (the client's frames from the start,
        every accepted one); an ended session is ended again. Under `lock` (the caller's)."""
        old, self.session = self.session, session
        with contextlib.suppress(LivemeetError):
            await old.abort()
        accepted = self.num_frames_accepted
        await self._feed_stored(audio)
        if self.num_frames_accepted != accepted:
            raise InternalError(
                f"live session {self.id}: {self.num_frames_accepted} frames fed again, "
                f"{accepted} accepted"
            )
        if self.ended:
            tail = self.decoder.flush()
            if len(tail):
                await self.session.append(tail)
            await self.session.end()

    async def _take(self, event: Event) -> None:
        """Record a backend event and hand it on (`_record`), a final only once the journal
        holds it: shown before, it could be lost to a crash, and the rebuilt session write
        another final under its id (a crash trial saw a final's words and times change so;
        its label could flip too). Finals and partials wait in the outbox (`_hold`) without
        holding the pump up (a text delta too, uploads' only); anything else waits for the
        outbox to empty. The final transcript waits (at most LIVE_FINAL_DURABLE_WAIT_S) for
        the session's audio to be on disk, so the ack before it acknowledges all of it, and
        for the answers to renames and merges the journal holds back, which go out before
        it. Neither is handed on once the session failed meanwhile."""
        if self.replay.terminal is not None and not self.replay.revision_pending:
            return  # it failed meanwhile (its storage, say): its error went out, nothing follows it
        if isinstance(event, SegmentFinal | SegmentPartial | TextDelta) and self._hold(event):
            return
        loop = asyncio.get_running_loop()
        came = loop.time()  # the final transcript's wait (its "hold" phase) starts here
        await self._flush_outbox()
        if isinstance(event, TranscriptFinal):
            deadline = loop.time() + LIVE_FINAL_DURABLE_WAIT_S
            await self.wait_durable(LIVE_FINAL_DURABLE_WAIT_S)
            # a rename or merge whose answer the journal holds back goes out before the final
            # (the socket and the captions close after it: the answer was lost); one made
            # meanwhile is waited for too
            while self._unanswered and (remaining_s := deadline - loop.time()) > 0:
                # asyncio.wait: a cancelled pump leaves the futures alone
                await asyncio.wait(set(self._unanswered), timeout=remaining_s)
            # ended for its storage: told so only once the journal no longer holds it, so
            # that a crash from then on does not bring it back as a rebuilt session
            discarded = self.journal_discarded
            if self.storage_error is not None and discarded is not None:
                if (remaining_s := deadline - loop.time()) > 0:
                    await asyncio.wait({discarded}, timeout=remaining_s)
            if self.replay.terminal is not None:  # the session failed meanwhile: its error is out
                return
            if self.ended_at is not None:
                self.final_phases_s = (came - self.ended_at, loop.time() - came)
        self._record(event)

    def _hold(self, event: SegmentFinal | SegmentPartial | TextDelta) -> bool:
        """Put `event` in the outbox where it must wait: a final the journal is to hold first
        (queued to it now, as shown), or anything behind one. A partial behind a partial that
        waits replaces it (each carries the whole tentative tail). Returns whether it waits;
        False: `_record` it now."""
        outbox = self._outbox
        if isinstance(event, SegmentFinal) and self.journal is not None and not self.journal_closed:
            shown = self.replay.as_shown(event)
            assert isinstance(shown, SegmentFinal)
            stored = self.journal.add_final(self.id, shown.segment)
            outbox.append((stored, shown))
            stored.add_done_callback(self._release)
            return True
        if not outbox:
            return False
        last_stored, last = outbox[-1]
        if (
            isinstance(event, SegmentPartial)
            and last_stored is None
            and isinstance(last, SegmentPartial)
        ):
            outbox[-1] = (None, event)
        else:
            outbox.append((None, event))
        return True

    def _release(self, _: object = None) -> None:
        """Hand on the outbox's head while its final's commit is done (`_hold`): in order,
        each final once its own commit settled. Once the session failed (its storage, most
        likely: the error is out, and that final is not in the journal) or was dropped,
        drop the rest."""
        outbox = self._outbox
        while outbox and (outbox[0][0] is None or outbox[0][0].done()):
            stored, event = outbox.popleft()
            if self.replay.terminal is not None or self.dropped:
                outbox.clear()
            elif stored is None:
                self._record(event)
            else:
                self._record(event, journaled=True)

    async def _flush_outbox(self) -> None:
        """Wait until the outbox is empty: every final in it committed and handed on (or
        dropped with the session's failure)."""
        while self._outbox:
            pending = {s for s, _ in self._outbox if s is not None and not s.done()}
            if pending:
                await asyncio.wait(pending)  # a cancelled pump leaves the futures alone
            self._release()

    def _record(self, event: SessionEvent, *, journaled: bool = False) -> None:
        """Keep `event` for a resume, journal what the journal keeps, and hand it to the
        socket and the subscribers (a rename or merge once the journal holds it).
        `journaled`: a final as shown (`as_shown`), in the journal already (`_hold`)."""
        if not journaled:
            event = self.replay.as_shown(event)
        if isinstance(event, SegmentPartial):
            # the session's own numbering: a rebuilt backend session counts from 1 again, and
            # a client may drop a partial whose rev is not above the last one's
            self.partial_rev += 1
            event = replace(event, rev=self.partial_rev)
        num_labels = len(self.replay.labels_shown)
        self.replay.record(event)
        stored: asyncio.Future[None] | None = None
        if (
            len(self.replay.labels_shown) > num_labels
            and self.journal is not None
            and not self.journal_closed
        ):
            # a few times a meeting; not waited for, unlike a final or a name: a label is no
            # promise to the client, it only lets a merge after a rebuild name a label that
            # only a partial showed (refused as never shown: a stress trial). One a crash
            # takes before its commit is refused there until a partial shows it again.
            self.journal.set_labels(self.id, self.replay.labels_shown)
        # a final comes here `journaled` where there is a journal (`_hold` queued it)
        if self.journal is not None and not self.journal_closed and not journaled:
            if isinstance(event, SpeakerRenamed):
                stored = self.journal.set_names(self.id, tuple(self.replay.names.items()))
            elif isinstance(event, SpeakerMerged):
                stored = self.journal.set_merges(self.id, self.replay.merges.items())
        if stored is None or stored.done():
            self._hand_on(event)
        else:
            # a name or merge is answered once the journal holds it: answered before, a crash
            # took it back from a client that had been told (the rebuilt session's
            # session.ready lacks it, and the client drops it: labels flipped back)
            # the answer first: the final transcript, waiting for it (`_take`), goes after it
            stored.add_done_callback(lambda _: self._hand_on_stored(event))
            self._unanswered.add(stored)
            stored.add_done_callback(self._unanswered.discard)

    def _hand_on_stored(self, event: SessionEvent) -> None:
        """`_hand_on` for an answer the journal held back: not once the session was dropped
        or failed meanwhile (its storage, maybe: the error is out)."""
        if not self.dropped and not isinstance(self.replay.terminal, Error):
            self._hand_on(event)

    def _hand_on(self, event: SessionEvent) -> None:
        """Hand `event` to the socket attached and to every subscriber."""
        if isinstance(event, SpeakerRenamed | SpeakerMerged):
            self.replay.told(event)  # answered: a resume's or subscriber's snapshot tells it
        if self.sink is not None:
            self.sink.deliver(event)
        for subscriber in list(self.subscribers):  # one may unsubscribe in its deliver
            subscriber.deliver(event)


def split_at_cuts(
    pcm: bytes, first_frame: int, frame_bytes: int, cuts: collections.deque[int]
) -> Iterator[tuple[bytes, bool]]:
    """`pcm` (whole sample frames of `frame_bytes` bytes, the first being frame `first_frame`
    of the session) in pieces, each with whether a finalize follows it: cut after each frame
    position of `cuts` (increasing, none below `first_frame`) that falls within `pcm` or at
    its end, which are taken from `cuts`; the last piece is the rest (maybe empty), with no
    finalize. A piece before a cut is empty where the cut comes first."""
    while cuts and cuts[0] - first_frame <= len(pcm) // frame_bytes:
        frames = cuts.popleft() - first_frame
        yield pcm[: frames * frame_bytes], True
        pcm, first_frame = pcm[frames * frame_bytes :], first_frame + frames
    yield pcm, False


def storage_failure(error: StorageFailed, why: str | None = None) -> Error:
    """The error a session fails with where its journal failed (`error`) and the server could
    not end it instead (`why`: no audio to transcribe, or the backend failed while ending it):
    no final comes, and it cannot be resumed."""
    cause = f"; {why}" if why else ""
    return Error(
        StorageFailed.code,
        f"{error.message}{cause}: the session failed, and no final transcript comes (the finals "
        "sent stand); it cannot be resumed: start a new session",
        StorageFailed.retryable,
    )


def ended_early_error(
    error: StorageFailed, session_id: str, *, early: bool, stored: bool | None
) -> StorageFailed:
    """What the client of a session the server ended for its storage (`error`) is told after
    its final transcript: `early`, the server ended it (else its `end` had come); `stored`,
    whether the final is in the transcript store (None: not known yet)."""
    how = (
        "the session was ended early, as if its client had sent `end`"
        if early
        else "the session's audio is no longer stored"
    )
    where = f"GET /v1/sessions/{session_id}/transcript with its captions_token"
    if stored:
        kept = f"was sent and is stored ({where})"
    elif stored is None:
        kept = f"was sent; whether it is stored is not known yet ({where} tells)"
    else:
        kept = "was sent but could not be stored: keep the copy received"
    go_on = ": start a new session to go on" if early else ""
    return StorageFailed(
        f"{error.message}: {how}; its transcript.final (all the audio the server took in) "
        f"{kept}; the session cannot be resumed{go_on}"
    )


def restarting_error(session_id: str) -> ServerRestarting:
    """What a captions subscriber of a session kept for the next start is told."""
    return ServerRestarting(
        f"the server is restarting: live session {session_id} goes on after its restart"
    )


def _log_cut_append(work: asyncio.Future[None]) -> None:
    """Done callback of an append whose caller was cancelled (`LiveSessionHolder.append`): its
    error has nobody left to raise to (the socket is gone; the session's events tell the rest)."""
    if not work.cancelled() and (exc := work.exception()) is not None:
        log.info("live append finished after its socket went: %r", exc)
