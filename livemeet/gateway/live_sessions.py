"""The registry of a server's resumable live sessions (docs/protocol.md, "Resume"): each one
a `LiveSessionHolder` (gateway/live_holder.py, which says what a session keeps and replays).

`LiveSessions` maps session ids to holders. A socket that goes away while its session streams
(or waits for its final) detaches it: the session waits `window_s` for a resume, then is ended
as by the client's `end` (its transcript completes and its engine slot is freed), and the
holder is dropped `window_s` after its terminal event (the final stays replayable until then).
A session whose final promised a revision (`TranscriptFinal.revision`, DESIGN 5.7) goes on to
its `transcript.revised`, or to an error: any error then fails the revision only, and is sent
as `revision_failed` (the final stands). A socket that goes after the final does not take the
revision with it: the holder stays, detached, until the revision comes (at most
LIVE_REVISE_TIMEOUT_S), and the revised transcript is stored beside the final one.
Every holder is dropped exactly once (`_drop`: its backend session aborted, its pump and timer
cancelled).

Clients (gateway/clients.py): each holder belongs to the client of the socket that opened it or
last resumed it. A client may hold `max_per_client` running sessions (`admitting`; detached ones
count until they end, a resume is never refused for it). A session whose API key is revoked (or
removed) while it runs is ended as by its client's `end`, not kept for a resume (`withdraw` for a
detached one, `disconnect` for one whose socket ws_live.py closed for it): its final is stored,
so nothing it acknowledged is lost; one that never had audio is dropped.

Durability (DESIGN 5.9, gateway/live_journal.py): a session is finished in the journal once
its final transcript is stored (a revision is best-effort after that: a crash during it loses
only the revision), discarded when it fails or is dropped without one, and kept when the
server stops first: `restore` rebuilds those at the next start (a new backend session from the
stored finals, fed the stored audio and finalizes), detached, for their clients to resume. A
session's `transcript.final` is stored (TranscriptStore.put_live) so its transcript outlives
the session, readable with the session's `captions_token`. A session whose journal fails (a
full disk) is discarded from it at once and ended as by its client's `end`, not failed: its
final is sent and stored all the same, then its socket gets storage_failed
(`_storage_failed`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import NamedTuple

from livemeet.audio.constants import (
    LIVE_DRAIN_TIMEOUT_S,
    LIVE_ENGINE_POLL_S,
    LIVE_ENGINE_RECOVERY_S,
    LIVE_REBUILD_DURABLE_WAIT_S,
    LIVE_REVISE_TIMEOUT_S,
    LIVE_TAKEOVER_CLOSE_S,
)
from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.errors import (
    EngineUnavailable,
    LivemeetError,
    NotFound,
    StorageFailed,
    Unauthorized,
)
from livemeet.gateway.clients import Client, cap_refusal
from livemeet.gateway.live_holder import (
    EventSink,
    LiveSessionHolder,
    restarting_error,
    storage_failure,
)
from livemeet.gateway.live_journal import JournalSession, LiveJournal, RestoredSession, read_pcm
from livemeet.gateway.live_protocol import (
    PCM_ENCODING,
    AudioFormat,
    ResumeRequest,
    require_same_format,
)
from livemeet.gateway.metrics import LIVE_FINAL_PHASES, GatewayMetrics
from livemeet.gateway.session_tokens import SessionTokens
from livemeet.gateway.transcript_store import TranscriptStore
from livemeet.transcriber import (
    Error,
    LiveRestore,
    SegmentFinal,
    SessionOptions,
    Transcriber,
    TranscriberSession,
    TranscriptFinal,
)

log = logging.getLogger(__name__)


class StreamingCount(NamedTuple):
    """Sessions streaming still (`LiveSessions.streaming`): with audio (what a restart keeps
    for the next start), of them detached, and with no audio yet (the next start discards
    those: nothing to rebuild)."""

    with_audio: int
    detached: int
    no_audio: int


class LiveSessions:
    """The live sessions of one app, by id, with their detach timers (module docstring).

    `window_s` 0 turns resume off: a socket that goes away takes its session with it.
    `final_timeout_s` bounds how long a detached, ended session waits for its final.
    `keep_on_shutdown`: the server's shutdown is a restart that keeps streaming sessions in
    the journal for the next start (`keeps_on_shutdown`) rather than ending them.
    `max_per_client`: running sessions one client may hold (`admitting`; 0: no cap)."""

    def __init__(
        self,
        window_s: float,
        final_timeout_s: float,
        metrics: GatewayMetrics,
        store: TranscriptStore | None = None,
        journal: LiveJournal | None = None,
        transcriber: Transcriber | None = None,
        *,
        keep_on_shutdown: bool = False,
        max_per_client: int = 0,
    ) -> None:
        self.window_s = window_s
        self.max_per_client = max_per_client
        # sessions each client is opening (`admitting`): a start counts from its check on
        self._opening: collections.Counter[Client] = collections.Counter()
        # ids of API keys revoked or removed while the server ran (`withdraw`): for good (a
        # revoked key is never active again, and a new key gets a new id)
        self._withdrawn_keys: set[str] = set()
        self.final_timeout_s = final_timeout_s
        self.draining = False
        self._drain_deadline_s = 0.0  # loop time the shutdown's drain waits for finals until
        self._holders: dict[str, LiveSessionHolder] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._metrics = metrics
        self._store = store  # where finished sessions' transcripts go (None: nowhere)
        self._journal = journal  # where sessions' audio and finals go (None: memory only)
        # rebuilds sessions whose engine worker died (`_recover`; None: they fail with it)
        self._transcriber = transcriber
        self._keep_on_shutdown = keep_on_shutdown

    def __len__(self) -> int:
        return len(self._holders)

    def get(self, session_id: str) -> LiveSessionHolder | None:
        """The session `session_id`, while the registry holds it."""
        return self._holders.get(session_id)

    @property
    def keeps_on_shutdown(self) -> bool:
        """Whether the shutdown keeps streaming sessions for the next start (a restart: the
        journal holds them and the next start rebuilds them, as after a crash), rather than
        ending them: asked for, with a journal and resume on."""
        return self._keep_on_shutdown and self._journal is not None and self.window_s > 0

    @property
    def num_detached(self) -> int:
        """Sessions no socket carries now (`sink` None)."""
        return sum(1 for h in self._holders.values() if h.sink is None)

    def streaming(self) -> StreamingCount:
        """The sessions streaming still (not ended, not failed): what a restart keeps."""
        held = [
            h
            for h in self._holders.values()
            if not h.ended and h.replay.terminal is None and h.storage_error is None
        ]
        kept = [h for h in held if h.num_frames_accepted]
        return StreamingCount(
            len(kept), sum(1 for h in kept if h.sink is None), len(held) - len(kept)
        )

    def held_by(self, client: Client) -> int:
        """The running sessions `client` holds (attached or detached) and is opening."""
        held = sum(1 for h in self._holders.values() if h.client == client and h.running)
        return held + self._opening[client]

    @contextlib.contextmanager
    def admitting(self, client: Client | None) -> Iterator[None]:
        """A place for a new session of `client` (None: not capped) while it is opened (the
        body opens it and registers it with `open`). Raises TooManySessions where `client`
        holds `max_per_client` running sessions already (`held_by`; a cap of 0 caps no one):
        the place is taken at the check, so starts racing each other cannot all pass it before
        any opened."""
        if client is None:
            yield
            return
        refusal = cap_refusal(client, self.held_by(client), self.max_per_client)
        if refusal is not None:
            raise refusal
        self._opening[client] += 1
        try:
            yield
        finally:
            self._opening[client] -= 1
            if not self._opening[client]:
                del self._opening[client]

    def key_ids(self) -> set[str]:
        """The API keys the sessions held run on (`LiveSessionHolder.client`)."""
        return {
            h.client.key_id
            for h in self._holders.values()
            if h.client is not None and h.client.key_id is not None
        }

    def withdraw(self, key_ids: Collection[str]) -> None:
        """The keys `key_ids` no longer let anyone in (revoked, or removed): each detached
        session running on one that has not ended is ended now (`_end_withdrawn`); its client
        cannot resume it with that key anyway. An attached one is its socket's to close
        (ws_live.py), and `disconnect` ends it then, whether or not that socket heard of it:
        one already in its cleanup when the keys changed was not told (a review)."""
        self._withdrawn_keys.update(key_ids)
        for holder in list(self._holders.values()):
            client = holder.client
            if client is None or client.key_id not in key_ids:
                continue
            if holder.sink is None and not holder.ended and holder.replay.terminal is None:
                holder.cancel_timer()
                self._spawn(self._end_withdrawn, holder)

    def open(
        self,
        session: TranscriberSession,
        decoder: PcmStreamDecoder,
        audio_format: AudioFormat,
        sink: EventSink,
        options: SessionOptions | None = None,
        client: Client | None = None,
    ) -> LiveSessionHolder:
        """Register a new session of `client`, attached to `sink`, with fresh tokens; with a
        journal, its audio and finals are written to disk from now on, with its `options` (the
        prompt, hotwords and language a rebuild after a restart opens it with again)."""
        assert session.id not in self._holders, f"session id {session.id} is in use"
        tokens = SessionTokens.new()
        holder = LiveSessionHolder(
            session, decoder, audio_format, tokens, self._on_terminal,
            journal=self._journal, options=options, recover=self._recover_hook(),
        )  # fmt: skip
        if self._journal is not None:
            meta = JournalSession(
                holder.id,
                tokens.resume_sha256,
                tokens.captions_sha256,
                audio_format.sample_rate,
                audio_format.channels,
                time.time(),
                prompt=options.prompt if options else None,
                hotwords=options.hotwords if options else (),
                language=options.language if options else None,
                key_id=client.key_id if client else None,
            )
            self._journal.open_session(
                meta, holder.durable, functools.partial(self._storage_failed, holder)
            )
        self._holders[holder.id] = holder
        holder.client = client
        holder.attach(sink, resumed=False)
        return holder

    async def restore(
        self,
        restored: Sequence[RestoredSession],
        open_session: Callable[[SessionOptions], Awaitable[TranscriberSession]],
        hop_s: float,
        revise: bool = False,
    ) -> int:
        """After a restart: rebuild each unfinished session of the journal (DESIGN 5.9). Its
        backend session is opened anew with its finals (`LiveRestore`: they stay committed,
        with their ids and labels) and fed the session's stored audio from the start; it then
        waits detached, as after a dropped socket, for a resume within `window_s` (its client
        resends from the durable offset), else it is ended and its transcript stored. Returns
        how many were rebuilt; one that cannot be (its backend refuses it) is logged and
        discarded, one the engine could not take now (EngineUnavailable) is left for the
        next start, one whose transcript is stored already is finished
        (`_finished_before`), and one that never had audio is discarded (`_empty_before`).
        `revise`: rebuilt sessions ask for a revision (`SessionOptions.revise`)."""
        assert self._journal is not None, "restore needs the journal"
        rebuilt = 0
        for stored in restored:
            if await self._finished_before(stored) or self._empty_before(stored):
                continue
            try:
                await self._rebuild(stored, open_session, hop_s, revise)
            except EngineUnavailable as exc:
                log.error("live session %s not rebuilt now: %s", stored.meta.session_id, exc)
                continue
            except LivemeetError as exc:  # discarded by `_rebuild`
                log.error(
                    "live session %s cannot be rebuilt (%s: %s): discarded",
                    stored.meta.session_id, exc.code, exc,
                )  # fmt: skip
                continue
            rebuilt += 1
        return rebuilt

    async def _finished_before(self, stored: RestoredSession) -> bool:
        """Whether the store holds `stored`'s final transcript already: the last run finished
        the session, and only dropping it from the journal failed (the transaction failed, or
        the process died between the two). It is then finished in the journal (its rows and
        audio go) rather than rebuilt, its transcript stored a second time. The same session,
        not merely the same id (a backend may reuse ids across runs): the stored transcript's
        token digest is the journal's."""
        assert self._journal is not None
        meta = stored.meta
        if self._store is None:
            return False
        try:
            kept = await self._store.get_live(meta.session_id)
        except NotFound:
            return False
        except (OSError, ValueError, KeyError) as exc:  # unreadable: rebuilt, stored anew
            log.warning(
                "live session %s: its stored transcript is unreadable: %s", meta.session_id, exc
            )
            return False
        if kept.access_sha256 != meta.captions_token_sha256:
            return False
        self._journal.adopt(stored, lambda _: None, lambda _: None)
        self._journal.finish(meta.session_id)
        log.warning(
            "live session %s: its transcript was stored before the restart, its end in the "
            "journal was not: finished now, not rebuilt",
            meta.session_id,
        )
        return True

    def _empty_before(self, stored: RestoredSession) -> bool:
        """Whether `stored` never had any audio: its client sent `start` and nothing more (a
        scanner, a page closed at once). Such a session is discarded rather than rebuilt:
        there is nothing of it to lose, its client starts anew (a resume gets not_found),
        and rebuilt it held a --max-sessions slot for two resume windows (a trial)."""
        assert self._journal is not None
        if stored.durable_frames or stored.finals or stored.ended:
            return False
        self._discard_stored(stored)
        log.info("live session %s had no audio: discarded, not rebuilt", stored.meta.session_id)
        return True

    def _discard_stored(self, stored: RestoredSession) -> None:
        """Take a session of the journal that will not be rebuilt, and discard it (its rows
        and its audio go)."""
        assert self._journal is not None
        self._journal.adopt(stored, lambda _: None, lambda _: None)
        self._journal.discard(stored.meta.session_id)

    async def _rebuild(
        self,
        stored: RestoredSession,
        open_session: Callable[[SessionOptions], Awaitable[TranscriberSession]],
        hop_s: float,
        revise: bool,
    ) -> None:
        meta = stored.meta
        assert self._journal is not None
        options = SessionOptions(
            live=True,
            prompt=meta.prompt,
            hotwords=meta.hotwords,
            language=meta.language,
            hop_s=hop_s,
            restore=LiveRestore(stored.finals, stored.merges),
            revise=revise,
        )
        try:
            session = await open_session(options)
        except EngineUnavailable:
            raise
        except LivemeetError:  # refused: it would be at every start
            self._discard_stored(stored)
            raise
        audio_format = AudioFormat(meta.sample_rate, meta.channels, PCM_ENCODING)
        decoder = PcmStreamDecoder(meta.sample_rate, meta.channels, PCM_ENCODING)
        tokens = SessionTokens(meta.resume_token_sha256, meta.captions_token_sha256)
        holder = LiveSessionHolder(
            session, decoder, audio_format, tokens, self._on_terminal,
            session_id=meta.session_id, journal=self._journal,
            options=replace(options, restore=None), recover=self._recover_hook(),
        )  # fmt: skip
        holder.replay.finals = [SegmentFinal(seg) for seg in stored.finals]
        # revs went up by one a partial, at most one a decode of new audio, so fewer than the
        # stored audio's sample frames: the rebuilt session's partials stay above them
        holder.partial_rev = stored.durable_frames
        holder.replay.restore_speakers(stored.names, stored.merges)
        # what a partial showed before the restart too: a merge may name it at once
        holder.replay.labels_shown = {*stored.labels, *(seg.speaker for seg in stored.finals)}
        holder.finalizes = list(stored.finalizes)
        holder.finalize_durable = stored.finalizes[-1] if stored.finalizes else None
        # the key it ran on: a start ends it if that key was revoked meanwhile (app.py)
        holder.client = Client(key_id=meta.key_id) if meta.key_id is not None else None
        self._holders[holder.id] = holder
        self._journal.adopt(stored, holder.durable, functools.partial(self._storage_failed, holder))
        try:
            await holder.replay_audio(read_pcm(stored.audio_path, meta.frame_bytes))
            if stored.ended:  # its `end` had come: it gets its final without another
                await holder.end(None)
        except BaseException as exc:
            # kept for the next start, unless the backend refused it (it would again; adopted
            # already, it is discarded here, not by `restore`)
            refused = isinstance(exc, LivemeetError) and not isinstance(exc, EngineUnavailable)
            await self._drop(holder, keep_journal=not refused)
            raise
        self._arm(holder)
        self._update_detached()
        log.info(
            "live session %s rebuilt from the journal: %d finals, %.1f s of audio; kept %g s "
            "for a resume",
            holder.id,
            len(stored.finals),
            stored.durable_frames / meta.sample_rate,
            self.window_s,
        )

    async def resume(
        self,
        request: ResumeRequest,
        audio_format: AudioFormat,
        sink: EventSink,
        client: Client | None = None,
    ) -> LiveSessionHolder:
        """Attach `sink` to the session `request` names, taking it over from the socket that
        carries it, if any (that socket is sent `session_taken_over` and closed first, for at
        most LIVE_TAKEOVER_CLOSE_S); it belongs to `sink`'s `client` from now on (module
        docstring), whose cap never refuses a resume. Its `session.ready`
        offset is the session's durable audio, not what the backend took (`attach`): nothing
        waits for the disk, and the frames the client sends again past that offset are
        skipped (`append`). Raises NotFound (unknown, dropped, or resume off), Unauthorized
        (wrong token), InvalidRequest (another audio format)."""
        try:
            holder = self._find(request)
            require_same_format(holder.audio_format, audio_format)
        except LivemeetError as exc:
            self._metrics.live_resumes.labels(exc.code).inc()
            raise
        async with holder.lock:
            if holder.dropped:  # dropped while this resume waited for the lock
                self._metrics.live_resumes.labels(NotFound.code).inc()
                raise NotFound(f"no live session {request.session_id!r} to resume")
            previous, holder.sink = holder.sink, None
            if previous is not None:
                closing = previous.take_over()
                await asyncio.wait({closing}, timeout=LIVE_TAKEOVER_CLOSE_S)
            if holder.token is None:  # rebuilt after a restart: the client proved it has it
                holder.tokens = holder.tokens.learned(request.resume_token)
            self._run_on(holder, client)
            holder.attach(sink, resumed=True)
        outcome = "resumed" if previous is None else "taken_over"
        self._metrics.live_resumes.labels(outcome).inc()
        self._update_detached()
        log.info(
            "live session %s %s at %d frames (%d taken in, not yet on disk)",
            holder.id,
            outcome,
            holder.client_offset,
            holder.num_frames_accepted - holder.client_offset,
        )
        return holder

    @staticmethod
    def _run_on(holder: LiveSessionHolder, client: Client | None) -> None:
        """`holder` belongs to `client` from now on (a resume); where that changes the API key
        it runs on, its journal keeps the new key's id for a start after a restart."""
        key_id = client.key_id if client else None
        before = holder.client.key_id if holder.client else None
        holder.client = client
        if key_id != before and holder.journal is not None and not holder.journal_closed:
            holder.journal.set_key_id(holder.id, key_id)

    async def disconnect(self, holder: LiveSessionHolder, sink: EventSink, *, keep: bool) -> bool:
        """`sink`'s socket is gone. `keep`: the session may wait for a resume (the socket went
        while it streamed, no error sent, its final not sent); otherwise, and where resume is
        off, the session is dropped. While the server drains, one kept or ended has its final
        waited for and stored first (`_finish_for_drain`), except that a restart
        (`keeps_on_shutdown`) keeps a streaming one, detached and untimed, in the journal for
        the next start (`close` then frees it). A session whose API key was revoked while it
        ran (`withdraw`), its socket told or not, is not kept for a resume, `keep` or not, but
        ended, its final stored (`_end_withdrawn`; its final waited for, if it was ending
        already). Returns whether it was kept. A socket that was taken over leaves the
        session alone."""
        if holder.sink is not sink:
            return False
        holder.sink = None
        client = holder.client
        withdrawn = client is not None and client.key_id in self._withdrawn_keys
        # `keep` aside: a restart's drain that did not see a socket through (an append
        # waiting for a lost engine) fails it with server_restarting, which resumes it
        if self._restart_keeps(holder):
            holder.cancel_timer()
            self._update_detached()
            log.info("live session %s kept in the journal for the next start", holder.id)
            return True
        if self.draining and (keep or holder.ended):
            await self._finish_for_drain(holder)
            return False
        if withdrawn:
            if holder.replay.terminal is None:
                self._update_detached()
                if holder.ended:  # its final is on its way: stored once it comes
                    self._arm(holder)
                else:
                    await self._end_withdrawn(holder)
                return False
            keep = False  # its final came: stored, as after any final (a revision goes on)
        if holder.replay.revision_pending:  # its client may go after the final: not the revision
            self._arm(holder)
            self._update_detached()
            log.info("live session %s: its client left before the revision", holder.id)
            return False
        if not keep or self.window_s <= 0 or self.draining:
            await self._drop(holder)
            return False
        self._arm(holder)
        self._update_detached()
        log.info(
            "live session %s detached at %d frames: kept %g s for a resume",
            holder.id,
            holder.num_frames_accepted,
            self.window_s,
        )
        return True

    def _restart_keeps(self, holder: LiveSessionHolder) -> bool:
        """Whether the server is stopping for a restart (`keeps_on_shutdown`) and keeps
        `holder`'s session in the journal for the next start: one streaming still, not
        failed (a failed one's client was told so; its journal entry went with it)."""
        return (
            self.draining
            and self.keeps_on_shutdown
            and not holder.ended
            and holder.replay.terminal is None
            and holder.storage_error is None  # ending: its journal entry is gone
        )

    async def drain(self, timeout_s: float = LIVE_DRAIN_TIMEOUT_S) -> None:
        """Server shutdown: end every detached session and wait, at most `timeout_s` (as an
        attached session's drain does), for its final before dropping it: no socket will
        send that final, but the store keeps it (`_on_terminal`), so the meeting's transcript
        is readable with its captions token after the restart rather than lost. From now on
        no session is kept for a resume. A restart (`keeps_on_shutdown`) ends none: a
        streaming one stays, untimed, in the journal for the next start, which rebuilds it
        and keeps it a window for its client (`close` frees it here); ended ones finish."""
        self.draining = True
        self._drain_deadline_s = asyncio.get_running_loop().time() + timeout_s
        detached = [h for h in self._holders.values() if h.sink is None]
        if self.keeps_on_shutdown:
            kept = [h for h in detached if self._restart_keeps(h)]
            for holder in kept:
                holder.cancel_timer()
                holder.end_subscriptions(restarting_error(holder.id))  # as it is kept
                log.info("live session %s kept in the journal for the next start", holder.id)
            detached = [h for h in detached if h not in kept]
        for holder in detached:
            holder.cancel_timer()
            log.info("live session %s ended by the shutdown while detached", holder.id)
            with contextlib.suppress(LivemeetError):  # it is freed below either way
                await holder.end(None)
        pumps = {h.pump for h in detached}
        if pumps:
            _, late = await asyncio.wait(pumps, timeout=timeout_s)
            if late:
                log.warning(
                    "%d detached live sessions had no final in time: %s",
                    len(late),
                    "kept in the journal for the next start" if self._journal else "lost",
                )
        for holder in detached:
            await self._drop(holder, keep_journal=True)

    def end_subscriptions_for_restart(self) -> None:
        """A restart's drain is done: the captions subscribers of every session it kept for the
        next start and has not told yet (one kept after the engine's loss) are told
        `server_restarting` (reconnect after the restart). Each session's are told as it is
        kept (`drain`, ws_live's `_keep_for_restart`), not once the drain is over, after the
        other sessions' finals (a trial: seconds late; a review: telling them before the keep
        was decided told an ending session's too)."""
        for holder in self._holders.values():
            if holder.subscribers and (self._restart_keeps(holder) or holder.kept_for_restart):
                holder.end_subscriptions(restarting_error(holder.id))

    async def close(self) -> None:
        """App cleanup: drop every session left and stop every timer's task."""
        if self._tasks:  # expiries and drops under way: short (an `end`, an abort)
            _, late = await asyncio.wait(set(self._tasks), timeout=LIVE_TAKEOVER_CLOSE_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        restarting = self.draining and self.keeps_on_shutdown
        for holder in list(self._holders.values()):
            await self._drop(holder, keep_journal=True, restarting=restarting)

    async def _finish_for_drain(self, holder: LiveSessionHolder) -> None:
        """A socket went during the shutdown's drain (its session ended by the drain, or
        streaming still): the session is ended and its final waited for as a detached one's
        (`drain`, until its deadline), so the store keeps it, then dropped."""
        with contextlib.suppress(LivemeetError):  # it is freed below either way
            await holder.end(None)
        remaining_s = self._drain_deadline_s - asyncio.get_running_loop().time()
        if remaining_s > 0:
            await asyncio.wait({holder.pump}, timeout=remaining_s)
        await self._drop(holder, keep_journal=True)

    def _find(self, request: ResumeRequest) -> LiveSessionHolder:
        holder = self._holders.get(request.session_id)
        if holder is None or self.window_s <= 0:
            raise NotFound(
                f"no live session {request.session_id!r} to resume (ended, expired, or never here)"
            )
        if not holder.tokens.authorizes_resume(request.resume_token):
            raise Unauthorized(f"wrong resume token for live session {request.session_id!r}")
        return holder

    def _arm(self, holder: LiveSessionHolder) -> None:
        """Set a detached session's timer: a streaming one is ended when the window runs out;
        one with its terminal event is dropped a window after that came; an ended one waits
        at most `final_timeout_s` for its final, then at most LIVE_REVISE_TIMEOUT_S for its
        revision (the drop cancels it)."""
        holder.cancel_timer()
        loop = asyncio.get_running_loop()
        if holder.replay.revision_pending:
            delay_s, action = LIVE_REVISE_TIMEOUT_S, self._forget
        elif holder.replay.terminal is not None:
            delay_s, action = self.window_s, self._forget
        elif not holder.ended:
            delay_s, action = self.window_s, self._expire
        else:
            delay_s, action = self.final_timeout_s, self._forget
        holder.timer = loop.call_later(delay_s, self._spawn, action, holder)

    def _spawn(
        self, action: Callable[[LiveSessionHolder], Awaitable[None]], holder: LiveSessionHolder
    ) -> None:
        """A timer fired: run its action as a task the registry tracks (close cancels it)."""
        holder.timer = None

        async def run() -> None:
            await action(holder)

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_terminal(self, holder: LiveSessionHolder) -> None:
        """The pump saw the terminal event, or a final that promised a revision: a final
        transcript is stored (it outlives the session), then a revised one beside it; a failed
        session (an error, which its client is sent) is discarded from the journal at once, as
        a storage failure's is: kept until its drop, a shutdown within the detach window kept
        it, and the next start rebuilt a session its client was told had failed. A detached
        session keeps the event for one window (for a revision, until it came)."""
        if holder.replay.revision is not None:
            self._revision_came(holder)
        elif isinstance(holder.replay.terminal, TranscriptFinal):
            if holder.storage_error is not None:
                self._count_storage_failure(holder, "ended")
            if holder.final_phases_s is not None:
                for phase, seconds in zip(LIVE_FINAL_PHASES, holder.final_phases_s, strict=True):
                    self._metrics.live_final_s.labels(phase).observe(seconds)
            if self._store is None:
                holder.close_journal(finished=True)
            else:
                transcript = holder.transcript_so_far()
                sha = holder.tokens.captions_sha256
                written = self._store.put_live_digest(
                    holder.id, transcript, sha, revision_promised=holder.replay.revision_pending
                )
                # the journal lets go of the session (its audio file included) only once its
                # transcript is on disk: a crash in between rebuilds it at the next start
                written.add_done_callback(functools.partial(self._transcript_written, holder))
                holder.final_written = written
        else:
            if holder.storage_error is not None:
                self._count_storage_failure(holder, "failed")
            holder.close_journal(finished=False)
        if holder.sink is None and not holder.dropped:
            self._arm(holder)

    def _revision_came(self, holder: LiveSessionHolder) -> None:
        """Count the revision (`revised` with its delay from `end`, or `failed`) and store a
        revised transcript beside the final one, or that it failed (best-effort: the journal
        is done with it)."""
        revised = holder.revised_transcript()
        if revised is None:
            self._metrics.live_revisions.labels("failed").inc()
            failure = holder.replay.revision
            log.warning("live session %s: no revision: %s", holder.id, failure)
            if self._store is not None:
                reason = failure.message if isinstance(failure, Error) else str(failure)
                self._store.put_live_revision_failed(
                    holder.id, holder.transcript_so_far(), holder.tokens.captions_sha256, reason
                )
            return
        self._metrics.live_revisions.labels("revised").inc()
        if holder.ended_at is not None:
            delay_s = asyncio.get_running_loop().time() - holder.ended_at
            self._metrics.live_revision_s.observe(delay_s)
            log.info("live session %s revised %.2f s after its end", holder.id, delay_s)
        if self._store is not None:
            sha = holder.tokens.captions_sha256
            self._store.put_live_digest(holder.id, revised, sha, revised=True)

    def _recover_hook(self) -> Callable[[LiveSessionHolder], Awaitable[bool]] | None:
        return self._recover if self._transcriber is not None and self._journal else None

    async def _recover(self, holder: LiveSessionHolder) -> bool:
        """The engine worker died under `holder`'s session (engine_unavailable, retryable):
        wait (at most LIVE_ENGINE_RECOVERY_S) for the engine to be started again, then open a
        new backend session from the session's finals (`LiveRestore`) and feed it the
        session's audio from the journal, as a restart does; its socket and subscribers stay,
        and hear nothing of it but a pause. Returns False (the session then fails with the
        engine's error, as before) when the engine is gone for good or not back in time, the
        server is draining, or the audio is not all on disk. A server stopping for a restart
        (`keeps_on_shutdown`) rebuilds nothing: the session is kept for the next start
        (`kept_for_restart`), which rebuilds it as after a crash."""
        transcriber, journal = self._transcriber, self._journal
        assert transcriber is not None and journal is not None and holder.options is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LIVE_ENGINE_RECOVERY_S
        log.warning("live session %s: the engine was lost; rebuilding the session", holder.id)
        # the lock from the start: the client's appends wait for the new session (an append
        # the dead one refused is made again: `append`)
        async with holder.lock:
            while not transcriber.ready:
                if self._restart_keeps(holder) and not holder.dropped:
                    return self._keep_for_restart(holder)
                if transcriber.failed or self.draining or holder.dropped or loop.time() > deadline:
                    return self._recovered(holder, False, "the engine did not come back")
                await asyncio.sleep(LIVE_ENGINE_POLL_S)
            if self._restart_keeps(holder) and not holder.dropped:
                return self._keep_for_restart(holder)
            if holder.dropped or self.draining:
                return self._recovered(holder, False, "the session was dropped meanwhile")
            if not await holder.wait_durable(LIVE_REBUILD_DURABLE_WAIT_S):
                return self._recovered(holder, False, "its audio is not all on disk")
            if holder.storage_error is not None:  # its audio file is gone with its journal
                return self._recovered(holder, False, "its journal failed")
            finals = tuple(f.segment for f in holder.replay.finals)
            restore = LiveRestore(finals, holder.replay.merges.items())
            options = replace(holder.options, restore=restore)
            try:
                session = await transcriber.open_session(options)
            except LivemeetError as exc:
                return self._recovered(holder, False, f"the engine refused it ({exc.code})")
            frame_bytes = holder.audio_format.frame_bytes
            path = journal.audio_path(holder.id)
            size = holder.num_frames_accepted * frame_bytes
            try:
                await holder.reopen(session, read_pcm(path, frame_bytes, limit_bytes=size))
            except EngineUnavailable as exc:
                # lost again while fed: the new session's own engine_unavailable, next in its
                # events, rebuilds it again (from all of its audio: `reopen`)
                log.warning("live session %s: the engine was lost again: %s", holder.id, exc)
                return True
        return self._recovered(holder, True, f"{len(finals)} finals kept")

    def _keep_for_restart(self, holder: LiveSessionHolder) -> bool:
        """`_recover`'s answer while the server stops for a restart: no rebuild now and no
        engine error for the session, whose journal entry the next start rebuilds (a review
        found the error discarding it: a SIGTERM sent while the engine reloaded after a crash
        lost every live meeting)."""
        holder.kept_for_restart = True
        log.info(
            "live session %s: engine lost during a restart: kept for the next start", holder.id
        )
        return False

    def _recovered(self, holder: LiveSessionHolder, ok: bool, why: str) -> bool:
        self._metrics.live_recoveries.labels("rebuilt" if ok else "failed").inc()
        if ok:
            log.warning("live session %s rebuilt after the engine's loss: %s", holder.id, why)
        else:
            log.error("live session %s not rebuilt after the engine's loss: %s", holder.id, why)
        return ok

    def _transcript_written(self, holder: LiveSessionHolder, written: asyncio.Task[bool]) -> None:
        stored = not written.cancelled() and written.result()
        if holder.storage_error is not None:  # its journal entry went with the failure
            log.log(
                logging.WARNING if stored else logging.ERROR,
                "live session %s ended early for its storage: its final transcript was sent and %s",
                holder.id,
                "stored" if stored else "could NOT be stored (its client has the only copy)",
            )
        elif stored:
            holder.close_journal(finished=True)
        else:  # kept: the next start rebuilds the session and stores its transcript again
            holder.journal_closed = True  # so that no drop discards it
            log.error("live session %s: transcript not stored; kept in the journal", holder.id)

    def _storage_failed(self, holder: LiveSessionHolder, error: StorageFailed) -> None:
        """The journal cannot keep the session (the disk is full, read-only or failing): acks
        would stop for good, and a crash would lose it. The backend still holds the meeting,
        so the session is ended as by its client's `end` rather than failed (it failed, and
        lost everything after its last final, until a review): its journal entry is
        discarded first (its audio file goes: on a full disk that is the space back for its
        final transcript and for the other sessions; kept, a restart rebuilt a session its
        client was told had ended), its client takes no more audio (`EventSink.
        storage_failed`), and its `transcript.final` goes to its socket and captions and to
        the store (`_on_terminal`); its socket then closes with storage_failed, 4507. A
        session with no audio, or whose backend fails while ending, fails as before
        (`storage_failure`: no final). A detached one is ended alike, its final kept for a
        resume as any ended session's; a socket that resumes it gets storage_failed after
        the final too (`storage_early` says which message)."""
        if holder.dropped or holder.replay.terminal is not None or holder.storage_error:
            return  # a revision pending after the final: best-effort, the journal is done
        holder.storage_error = error
        holder.close_journal(finished=False)  # its audio file first
        if not holder.num_frames_accepted:
            self._fail_storage(holder, "it had no audio to transcribe")
            return
        log.error(
            "live session %s: its journal failed (%s): its audio is deleted, and the session "
            "is ended as by its client's end (its final transcript is sent and stored where "
            "the store can write it; not resumable)",
            holder.id,
            error,
        )
        # early: its client's `end` had not come (its socket knows; detached, the holder)
        early = not holder.ended
        if holder.sink is not None:
            early = holder.sink.storage_failed(error)
        holder.storage_early = early
        holder.cancel_timer()  # detached: its expiry, which would end it too
        self._spawn(self._end_for_storage, holder)

    async def _end_for_storage(self, holder: LiveSessionHolder) -> None:
        """End a session whose storage failed (`_storage_failed`), whichever socket carries it;
        where its backend refuses, it fails as before."""
        if holder.dropped or holder.replay.terminal is not None:
            return
        try:
            await holder.end(None, early=True)
        except LivemeetError as exc:
            if not holder.dropped and holder.replay.terminal is None:
                self._fail_storage(holder, f"ending it failed ({exc.code}: {exc})")
            return
        if holder.sink is None and not holder.dropped:
            self._arm(holder)  # its final waited for, then kept a window for a resume

    def _fail_storage(self, holder: LiveSessionHolder, why: str) -> None:
        """A session whose storage failed and that cannot be ended (`why`): it fails with
        storage_failed now (its socket and captions get it; close 4507) and is dropped."""
        assert holder.storage_error is not None
        log.error(
            "live session %s: its journal failed (%s), and %s: the session fails",
            holder.id,
            holder.storage_error,
            why,
        )
        holder.fail(storage_failure(holder.storage_error, why))
        self._count_storage_failure(holder, "failed")
        if holder.sink is None:  # else its socket's cleanup drops it
            self._spawn(self._drop, holder)

    def _count_storage_failure(self, holder: LiveSessionHolder, result: str) -> None:
        """livemeet_live_journal_failures_total, once a session: `ended` (its final came) or
        `failed` (it failed, or was dropped before its final: no final)."""
        if not holder.storage_counted:
            holder.storage_counted = True
            self._metrics.journal_failures.labels(result).inc()

    async def _expire(self, holder: LiveSessionHolder) -> None:
        if await self._end_detached(holder):
            self._metrics.live_resume_expiries.inc()
            log.info(
                "live session %s not resumed within %g s: ended as by its client's end",
                holder.id,
                self.window_s,
            )
            self._arm_ended(holder)

    async def _end_withdrawn(self, holder: LiveSessionHolder) -> None:
        """A detached session whose API key no longer lets it in: ended as by its client's
        `end` (its final is stored), or, without any audio, dropped (nothing to keep)."""
        if holder.sink is not None or holder.dropped:
            return  # resumed (with a valid key) or dropped meanwhile
        if not holder.num_frames_accepted:
            log.info("live session %s: its API key was revoked; no audio: dropped", holder.id)
            await self._drop(holder)
            return
        if await self._end_detached(holder):
            log.info(
                "live session %s: its API key was revoked: ended as by its client's end, "
                "not kept for a resume",
                holder.id,
            )
            self._arm_ended(holder)

    async def _end_detached(self, holder: LiveSessionHolder) -> bool:
        """End a detached session as by its client's `end`; whether this call did (not once
        resumed, ended or dropped meanwhile; one that cannot be ended is dropped)."""
        if holder.sink is not None or holder.dropped:
            return False  # resumed or dropped after the timer fired
        try:
            return await holder.end(None)  # False: resumed while the end waited for the lock
        except LivemeetError as exc:
            log.info("live session %s could not be ended (%s): dropped", holder.id, exc.code)
            await self._drop(holder)
            return False

    def _arm_ended(self, holder: LiveSessionHolder) -> None:
        """A detached session was just ended: wait for its final (or drop it, if the final
        came meanwhile), unless it was resumed or dropped since."""
        if holder.sink is None and not holder.dropped:
            self._arm(holder)

    async def _forget(self, holder: LiveSessionHolder) -> None:
        """A detached session's last timer: its final was kept a window, or never came."""
        if holder.sink is not None or holder.dropped:
            return  # resumed or dropped after the timer fired
        why = "its final was kept" if holder.replay.terminal else "no final came"
        log.info("live session %s dropped while detached: %s", holder.id, why)
        await self._drop(holder)

    async def _drop(
        self, holder: LiveSessionHolder, *, keep_journal: bool = False, restarting: bool = False
    ) -> None:
        """Free `holder`, once. Its journal entry is discarded unless `keep_journal` (the
        server stops: an unfinished session is rebuilt at the next start; `restarting`: the
        server keeps it for that on purpose, and its subscribers hear so)."""
        if holder.dropped:
            return
        holder.dropped = True
        # a session with its final is finished in the journal once the transcript is written
        # (`_transcript_written`), which may come after the drop
        if not keep_journal and not isinstance(holder.replay.terminal, TranscriptFinal):
            holder.close_journal(finished=False)
        if holder.storage_error is not None and holder.replay.terminal is None:
            # ended for its storage, dropped before its final came (a shutdown's drain ran
            # out, its client went with resume off): no final, counted nowhere else
            self._count_storage_failure(holder, "failed")
        if holder.replay.revision_pending:  # cancelled (a shutdown, LIVE_REVISE_TIMEOUT_S)
            self._metrics.live_revisions.labels("failed").inc()
            log.warning("live session %s: its revision was cancelled", holder.id)
        self._holders.pop(holder.id, None)
        self._update_detached()
        await holder.release(restarting=restarting)

    def _update_detached(self) -> None:
        self._metrics.live_sessions_detached.set(self.num_detached)
