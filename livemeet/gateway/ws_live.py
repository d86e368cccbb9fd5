"""`GET /v1/live`: the live WebSocket transport (protocol v0, docs/protocol.md).

A thin asyncio shell around `LiveProtocol` (the rules) and a `LiveSessionHolder` (the
session, which may outlive this socket: gateway/live_holder.py): handshake, `async for msg
in ws`, one task sending this socket's outbox (the session's events, `session.ready` and
`audio.ack`s, in order; a partial or an ack not yet sent is replaced by the next). Each
connection is registered in `try` and deregistered in `finally`, where its session is either
kept for a resume (the socket went while the client streamed, or was closed for the client's
violation of the protocol) or dropped. Every failure reaches the client as an `error` frame,
then a close with the error class's 4xxx close code, except a frame aiohttp refuses itself
(over MAX_FRAME_BYTES: 1009; a text frame not UTF-8: 1007), which it closes at once.
A connection whose API key is revoked (or removed) while it runs is closed with `unauthorized`
(4401), and its session ended, not kept for a resume (`end_withdrawn_keys`, KeyGuard's
listener; gateway/live_sessions.py).
A session whose journal fails (a full disk) is ended by the server (`storage_failed`): the
client's audio is ignored from then on, and after the final the socket closes with
storage_failed (4507), saying whether the final was stored; a socket that resumes it (or
takes it over) meanwhile, or after its final, closes alike (`attached`).
A session whose final promises a revision (`session.ready`'s `revise`, DESIGN 5.7) keeps its
socket open after `transcript.final` until `transcript.revised`, then closes normally; a
revision that fails (or does not come within LIVE_REVISE_TIMEOUT_S of the final) is a
`revision_failed` error frame, then a normal close too: the final stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from livemeet.audio.constants import (
    ACK_INTERVAL_S,
    LIVE_DRAIN_CLOSE_S,
    LIVE_DRAIN_TIMEOUT_S,
    LIVE_FLUSH_BEFORE_ERROR_S,
    LIVE_RESTART_DURABLE_WAIT_S,
    LIVE_REVISE_TIMEOUT_S,
    LIVE_START_TIMEOUT_S,
    MAX_FRAME_BYTES,
    MAX_NAMED_SPEAKERS,
)
from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.errors import (
    BadAudio,
    ClientTimeout,
    EngineUnavailable,
    InternalError,
    InvalidRequest,
    LivemeetError,
    ProtocolError,
    RevisionFailed,
    ServerRestarting,
    SessionTakenOver,
    StorageFailed,
    Unauthorized,
    error_for_code,
)
from livemeet.gateway.auth import KeyRing, withdrawal, withdrawn
from livemeet.gateway.auth_http import refused_client, request_key
from livemeet.gateway.clients import client_of
from livemeet.gateway.errors_http import ws_error_frame
from livemeet.gateway.keys import (
    AUTH_KEY,
    CONFIG_KEY,
    DISK_KEY,
    LIFECYCLE_KEY,
    METRICS_KEY,
    REGISTRY_KEY,
    SESSIONS_KEY,
    TRANSCRIBER_KEY,
)
from livemeet.gateway.live_holder import (
    LiveSessionHolder,
    ended_early_error,
    restarting_error,
    storage_failure,
)
from livemeet.gateway.live_protocol import (
    CLIENT_LEFT_CLOSES,
    GOING_AWAY,
    NORMAL_CLOSE,
    PROTOCOL_VERSION,
    AckPolicy,
    AppendAudio,
    EndStream,
    Finalize,
    Ignored,
    KeepAlive,
    LiveProtocol,
    SpeakerMerge,
    SpeakerMerged,
    SpeakerRename,
    SpeakerRenamed,
    StartSession,
    State,
)
from livemeet.gateway.live_replay import SessionEvent, speaker_maps
from livemeet.gateway.metrics import GatewayMetrics
from livemeet.gateway.origin_http import check_browser_origin
from livemeet.gateway.pacing import AudioPacer
from livemeet.transcriber import (
    Error,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TranscriptFinal,
    TranscriptRevised,
    is_terminal,
)
from livemeet.transcript.language import check_language

log = logging.getLogger(__name__)

# a frame of MAX_FRAME_BYTES + 1: aiohttp refuses a message of max_msg_size itself (its
# uncompressed check is `>=`; 3.14), while its inflated-message check lets that size through
# (the handler refuses it); every larger frame aiohttp refuses
_WS_MAX_MSG_SIZE = MAX_FRAME_BYTES + 1
# what ends the receive loop (aiohttp's own `async for` over a WebSocketResponse stops there)
_CLOSED_TYPES = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)
# what `_read` returns for a connection lost under `receive`: a dropped socket's
_LOST = WSMessage(WSMsgType.CLOSED, None, None)
# the limit a client message is waited for under: the revision after the final, the final
# after `end`, `start`, idle
_Limit = Literal["revision", "final", "start", "idle"]
# frames a newer one of the same type replaces while still unsent (each is a whole state)
_COALESCED = ("segment.partial", "audio.ack")
_RENAMED = "speaker.renamed"  # coalesced per label (`_enqueue`)
# `speaker.merged` is neither coalesced nor dropped: each merges another label for good, and a
# session makes at most MAX_MERGED_SPEAKERS of them, which bounds its unsent ones
# a frame to send, with the session event it renders (None: session.ready, audio.ack)
_Outgoing = tuple[dict[str, Any], SessionEvent | None]
# the errors that are a client's violation of the protocol, not the session's failure: its
# session is kept as after a dropped socket (`run`)
_CLIENT_VIOLATIONS = (InvalidRequest, ProtocolError, BadAudio)


def event_to_wire(event: SessionEvent) -> dict[str, Any] | None:
    """The server frame for a session event (None for events the live protocol does not
    carry)."""
    if isinstance(event, SpeakerRenamed | SpeakerMerged):
        return event.to_wire()
    if isinstance(event, SegmentPartial):
        return {
            "type": "segment.partial",
            "rev": event.rev,
            "segments": [s.to_wire() for s in event.segments],
        }
    if isinstance(event, SegmentFinal):
        return {"type": "segment.final", **event.segment.to_wire()}
    if isinstance(event, TranscriptFinal):
        return {
            "type": "transcript.final",
            "segments": [s.to_wire() for s in event.segments],
            "finish_reason": event.finish_reason.value,
            "coverage": round(event.coverage, 4),
            "duration": round(event.duration_s, 3),
            **_merged(event.merged),
        }
    if isinstance(event, TranscriptRevised):
        return {
            "type": "transcript.revised",
            "segments": [s.to_wire() for s in event.segments],
            "supersedes": list(event.supersedes),
            "finish_reason": event.finish_reason.value,
            **_merged(event.merged),
        }
    if isinstance(event, Error):
        return {
            "type": "error",
            "code": event.code,
            "message": event.message,
            "retryable": event.retryable,
        }
    return None  # TextDelta: uploads only


def _merged(merged: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """A transcript frame's `merged` ({label: target}), only where the session merged any."""
    return {"merged": dict(merged)} if merged else {}


class LiveRegistry:
    """The open live connections of one app (for shutdown and metrics)."""

    def __init__(self) -> None:
        self._connections: set[LiveConnection] = set()

    def __len__(self) -> int:
        return len(self._connections)

    def add(self, connection: LiveConnection) -> None:
        self._connections.add(connection)

    def discard(self, connection: LiveConnection) -> None:
        self._connections.discard(connection)

    def key_ids(self) -> set[str]:
        """The API keys the open connections were let in with."""
        return {c.key_id for c in self._connections if c.key_id is not None}

    def withdraw(self, key_ids: frozenset[str], ring: KeyRing) -> None:
        """Close every connection let in with one of the keys `key_ids`, which `ring` no longer
        lets in, with `unauthorized` (`LiveConnection.withdraw`)."""
        for connection in self._connections:
            if connection.key_id is not None and connection.key_id in key_ids:
                connection.withdraw(withdrawal(ring, connection.key_id))

    async def drain_all(
        self, timeout_s: float = LIVE_DRAIN_TIMEOUT_S, *, keep: bool = False
    ) -> None:
        """Server shutdown: end every streaming session as its client's `end` would, so each
        gets its last segments and `transcript.final` (then close 1001), within `timeout_s`;
        a session with nothing to transcribe, and one whose final is not out by then, gets
        an `engine_unavailable` error and its close. `keep` (a restart: the sessions keep on
        shutdown): a streaming session is kept for the next start instead, its client sent
        `server_restarting` and a 1012 close (`LiveConnection.drain`); one already ending
        still gets its final, or else `server_restarting` too (the journal keeps it ended,
        and the next start sends the final to its resume)."""
        connections = list(self._connections)
        with contextlib.suppress(TimeoutError):  # bounded whole: shutdown must go on
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(
                    *(c.drain(keep=keep) for c in connections), return_exceptions=True
                )
                forwarders = [c.forwarder for c in connections if c.forwarder is not None]
                if forwarders:
                    await asyncio.wait(forwarders)
        late = [c for c in connections if not c.ws.closed]
        with contextlib.suppress(TimeoutError):  # a client that stopped reading
            async with asyncio.timeout(LIVE_DRAIN_CLOSE_S):
                await asyncio.gather(
                    *(c.fail(_shutdown_error(c, keep)) for c in late),
                    return_exceptions=True,
                )


def end_withdrawn_keys(app: web.Application, ring: KeyRing) -> None:
    """KeyGuard's listener (gateway/auth_http.py): the API keys changed to `ring`. The live
    sessions running on a key it no longer lets in (revoked, or removed: auth.withdrawn) are
    ended: each socket let in with one is closed with `unauthorized` (4401), and its session,
    like a detached one, ended as by its client's `end` and not kept for a resume
    (gateway/live_sessions.py). A session opened with no key (none was asked for) runs on.
    Nothing is done once the shutdown began: it ends every session, or keeps it for the next
    start, which rebuilds it on the key it ran on and calls this with the keys read then
    (app.py: a key revoked while the server was down ends its sessions there)."""
    if app[LIFECYCLE_KEY].draining:
        return
    registry, sessions = app[REGISTRY_KEY], app[SESSIONS_KEY]
    gone = withdrawn(app[AUTH_KEY].mode, ring, registry.key_ids() | sessions.key_ids())
    if not gone:
        return
    log.warning(
        "%s %s no longer valid: the live sessions running on %s are ended",
        "API key" if len(gone) == 1 else "API keys",
        ", ".join(sorted(gone)),
        "it" if len(gone) == 1 else "them",
    )
    registry.withdraw(gone, ring)
    sessions.withdraw(gone)


def _shutdown_error(connection: LiveConnection, keep: bool) -> LivemeetError:
    """What a connection the shutdown's drain did not see through is closed with: a revision
    it waits for fails (its final stands); a session ended for its storage is lost (no
    restart has it: told to resume, its client found none), or, its final out, the wait to
    say whether it was stored ran out; anything else, the engine is
    going, for good or (`keep`) until the restart, which has the session."""
    if connection.awaiting_revision:
        return RevisionFailed("the server is shutting down: no revision")
    if (storage_error := connection.storage_error) is not None:
        if connection.final_sent:  # the wait to say whether the store wrote it ran out
            return connection.ended_early(stored=None)
        why = "the server shut down before the session's final transcript came"
        return StorageFailed(storage_failure(storage_error, why).message)
    if keep:
        return _restarting(kept=connection.holder is not None)
    return EngineUnavailable("the server is shutting down")


def _restarting(*, kept: bool = True) -> ServerRestarting:
    """`kept`: the connection's session is kept for the next start; else it has none here
    (no `start` yet, or it arrived while the server stops): it was told to resume a session
    it may not have (a docs audit)."""
    if not kept:
        return ServerRestarting(
            "the server is restarting: connect again once it answers (a session it holds is "
            "resumed from session.ready's offset with its session_id and resume_token)"
        )
    return ServerRestarting(
        "the server is restarting: resume the session (session_id, resume_token) from "
        "session.ready's offset once it answers again"
    )


class LiveConnection:
    """One `/v1/live` WebSocket and, once `start` arrives, the session it carries (a new one,
    or a resumed one: gateway/live_sessions.py). Implements live_holder.EventSink.

    Its API key (gateway/auth.py): the upgrade request's (`header_key`), checked as the
    connection opens, else the `start` message's `api_key`, checked before the session opens
    or resumes; a refusal is `unauthorized` (4401) either way."""

    def __init__(
        self,
        app: web.Application,
        ws: web.WebSocketResponse,
        header_key: str | None = None,
        remote: str | None = None,
    ) -> None:
        self.app = app
        self.ws = ws
        self._header_key = header_key
        self._remote = remote  # the client's address (request.remote), for a refusal's log
        self._authenticated = False  # a key was accepted, or none is needed
        self._key_id: str | None = None  # the accepted key's (None: no key needed)
        self.protocol = LiveProtocol()
        self.holder: LiveSessionHolder | None = None
        self._forwarder: asyncio.Task[None] | None = None
        # frames for the socket, in order, sent by the forwarder; `_wakeup` says there are some
        self._outbox: deque[_Outgoing] = deque()
        self._wakeup = asyncio.Event()
        self._acks = AckPolicy(ACK_INTERVAL_S)
        self._ack_timer: asyncio.TimerHandle | None = None
        # one frame's action at a time, and a drain's end between two of them, never inside
        self._actions = asyncio.Lock()
        self._drained = False  # ended by the server's shutdown: close 1001 after the final
        # ended by the server for this error (an idle client): sent, with its close code,
        # after the final
        self._end_error: LivemeetError | None = None
        # the session's journal failed, and the server ends it (`storage_failed`): after the
        # final, storage_failed and 4507 (before `_end_error`); `_storage_early`: the server
        # ended it then (its client's `end` had not come)
        self._storage_error: StorageFailed | None = None
        self._storage_early = False
        self._failed = False  # an error was sent (or is being sent): once per connection
        self._terminal_sent = False  # the session's final (or error) went out on this socket
        self._final_out = False  # its `transcript.final` went out on this socket
        self._taken_over: asyncio.Task[None] | None = None  # closing: a resume took the session
        self._metrics: GatewayMetrics = app[METRICS_KEY]
        self._state_label = "connecting"
        self._ended_at: float | None = None  # loop time of the client's `end`
        # loop time `transcript.final` went out where a revision follows it
        self._final_sent_at: float | None = None
        self._resume_id: str | None = None  # the session a `start` asked to resume
        self._error: LivemeetError | None = None  # what `fail` sent
        # `fail` closes the socket but keeps the session, as a dropped socket does: a client's
        # violation (`run`), a restart (`_keep_for_restart`)
        self._keep_session = False
        # its API key no longer lets it in (`withdraw`): the error the handler fails with at its
        # next read, and the cleanup ends the session rather than keep it for a resume
        self._withdrawal: Unauthorized | None = None
        self._reading: asyncio.Timeout | None = None  # the deadline of a read under way
        self._client_left = False  # closed by the client with 1000 or 1001 (`run`)
        # loop time of the client's last data message (pings and pongs are not messages)
        self._last_message_at = asyncio.get_running_loop().time()
        # a message read while a resume waited (`_while_reading`): `_receive` returns it next
        self._held_message: WSMessage | None = None
        self._opened_at = self._last_message_at
        self._pacer = AudioPacer(
            self._last_message_at, max_speed=app[CONFIG_KEY].gateway.live_max_speed
        )
        self._metrics.sessions.labels("live", self._state_label).inc()
        self.outcome = "disconnected"

    async def run(self) -> None:
        """Serve the connection until it closes. Never raises a LivemeetError."""
        if self._header_key is not None:  # a wrong key is refused at once; none waits for start
            try:
                await self._authenticate(self._header_key)
            except Unauthorized as exc:
                await self.fail(exc)
                return
        # while the engine worker restarts, sessions held wait to be rebuilt: a resume is let
        # in (a new session's `start` is refused then by `open_session`)
        not_ready = not self.app[TRANSCRIBER_KEY].ready and not len(self.app[SESSIONS_KEY])
        restarting = self.app[LIFECYCLE_KEY].draining and self.app[SESSIONS_KEY].keeps_on_shutdown
        if restarting:  # a resume, too, is for the next start
            await self.fail(_restarting(kept=False))
            return
        if not_ready or self.app[LIFECYCLE_KEY].draining:
            await self.fail(EngineUnavailable("the model is not ready; retry shortly"))
            return
        try:
            while (msg := await self._receive()).type not in _CLOSED_TYPES:
                audio_s = 0.0
                if msg.type is WSMsgType.TEXT:
                    async with self._actions:
                        await self._on_action(self.protocol.receive_text(msg.data))
                elif msg.type is WSMsgType.BINARY:
                    if len(msg.data) > MAX_FRAME_BYTES:  # as aiohttp closes on larger ones
                        # and as it does, no error frame; the session is kept (below)
                        log.info("live connection: a frame of %d bytes, closed 1009", len(msg.data))
                        await self.ws.close(code=WSCloseCode.MESSAGE_TOO_BIG)
                        break
                    async with self._actions:
                        await self._on_action(self.protocol.receive_binary(msg.data))
                    audio_s = self.protocol.audio_seconds(len(msg.data))
                elif msg.type is WSMsgType.ERROR:
                    # a network error, or a frame aiohttp refused (WebSocketError: over
                    # max_msg_size, 1009; a text frame not UTF-8, 1007), which it closed the
                    # socket for before `receive` returned, so no error frame can precede that
                    # close: either way the session is kept as after a dropped socket (cleanup)
                    log.info("live connection error: %s", self.ws.exception())
                    break
                # past the burst, read no faster than max speed (outside the action lock,
                # so a drain is not held up)
                wait_s = self._pacer.charge(audio_s, asyncio.get_running_loop().time())
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
            # the client's own close frame, normal or going away (a tab closed): it left (a
            # session with no audio goes at once); a dropped socket sends no frame
            self._client_left = msg.type is WSMsgType.CLOSE and msg.data in CLIENT_LEFT_CLOSES
        except LivemeetError as exc:
            # a client's violation once its session exists (an unknown message type from a
            # newer client, a malformed message, a misaligned frame, a speaker request
            # refused) closes the socket with its code, but the meeting stays, kept as after
            # a dropped socket (a resume, or its transcript stored once the window passes):
            # one bad message cost the whole meeting, acknowledged audio included (trials).
            # The frame is refused whole (LiveProtocol checks it before it takes anything).
            # Other errors still drop the session: they end it (storage, the engine, a bug),
            # or, an idle client's `client_timeout`, come only where it holds no audio (one
            # with audio is ended and its final sent first: `_end_for`), so nothing is lost.
            self._keep_session = self.holder is not None and isinstance(exc, _CLIENT_VIOLATIONS)
            await self.fail(exc)
        except Exception as exc:
            log.exception("live connection failed")
            await self.fail(InternalError(f"internal error: {type(exc).__name__}"))

    async def _receive(self) -> WSMessage:
        """The next client message. The idle timeout runs from the client's last message
        while it streams; after `end` it has nothing left to send and waits, silently, for
        `transcript.final`, which a loaded engine may take longer than the idle timeout to
        produce (the forwarder closes the socket then, and an engine failure reaches it as
        an error event), up to `final_timeout_s` after `end`. The deadlines are ours, not
        aiohttp's `receive_timeout`: aiohttp answers a ping inside `receive` and starts its
        timeout again, so a stalled client whose library pings (websockets does, every 20 s)
        would hold its session forever. Raises ClientTimeout (idle, or no `start` in time),
        EngineUnavailable (no final in time) and Unauthorized (its API key no longer valid:
        `withdraw`); an idle session with audio is ended instead, its error held for after the
        final (`_end_for`)."""
        while True:
            if self._withdrawal is not None:
                raise self._withdrawal
            if self._held_message is not None:
                msg, self._held_message = self._held_message, None
                return msg
            ended_at = self._ended_at
            deadline, limit = self._next_deadline()
            try:
                async with asyncio.timeout_at(deadline) as self._reading:
                    msg = await _read(self.ws)
            except TimeoutError:
                if self._withdrawal is not None:  # `withdraw` cut the wait short
                    raise self._withdrawal from None
                if ended_at is None and self._ended_at is not None:
                    continue  # a drain ended the session during the wait: the final's limit
                error = self._timeout_error(limit)
                if limit == "idle" and await self._end_for(error):
                    continue  # now waiting for the final
                raise error from None
            finally:
                self._reading = None
            self._last_message_at = asyncio.get_running_loop().time()
            return msg

    def _next_deadline(self) -> tuple[float, _Limit]:
        """The loop time by which the next client message must come, and which limit that is
        ("final", "start" or "idle"): the earliest in force, so the error names the one that
        ran out (the idle timeout may be set below the start limit)."""
        gateway = self.app[CONFIG_KEY].gateway
        if self._final_sent_at is not None:
            return self._final_sent_at + LIVE_REVISE_TIMEOUT_S, "revision"
        if self._ended_at is not None:
            return self._ended_at + gateway.final_timeout_s, "final"
        idle = self._last_message_at + gateway.idle_timeout_s
        start = self._opened_at + LIVE_START_TIMEOUT_S
        if self.protocol.state is State.AWAITING_START and start < idle:
            return start, "start"
        return idle, "idle"

    async def _end_for(self, error: LivemeetError) -> bool:
        """An idle client whose session has audio: end the session as its `end` would, so the
        meeting's transcript is not lost (the client may still be reading: a paused recorder,
        a stalled upstream); `error` follows the final. False where there is nothing to
        transcribe (no audio). True, with no error held, for a session that another path (a
        drain) ended while the deadline fired."""
        async with self._actions:
            if self.protocol.state in (State.ENDING, State.DRAINING):
                return True  # ended meanwhile (a drain held the lock): its final is coming
            if not self.protocol.server_end():
                return False
            self._end_error = error
            await self._end()
        return True

    def _timeout_error(self, limit: _Limit) -> LivemeetError:
        gateway = self.app[CONFIG_KEY].gateway
        if limit == "revision":
            return RevisionFailed(
                f"no transcript.revised within {LIVE_REVISE_TIMEOUT_S:g} s of transcript.final"
            )
        if limit == "final":
            return EngineUnavailable(
                f"no final transcript within {gateway.final_timeout_s:g} s of the session's end"
            )
        if limit == "start":
            return ClientTimeout(f"no 'start' within {LIVE_START_TIMEOUT_S:g} s of connecting")
        return ClientTimeout(
            f"no message from the client within the idle timeout ({gateway.idle_timeout_s:g} s)"
        )

    @property
    def storage_error(self) -> StorageFailed | None:
        """Why the server ends this connection's session for its storage (`storage_failed`),
        if it does."""
        return self._storage_error

    @property
    def final_sent(self) -> bool:
        """The session's `transcript.final` went out on this socket."""
        return self._final_out

    def ended_early(self, *, stored: bool | None) -> StorageFailed:
        """What the client of a session ended for its storage (`storage_error`, set) is told
        after its final: `stored`, whether the store wrote the final (None: not known)."""
        assert self._storage_error is not None and self.holder is not None
        return ended_early_error(
            self._storage_error, self.holder.id, early=self._storage_early, stored=stored
        )

    @property
    def awaiting_revision(self) -> bool:
        """`transcript.final` went out and its revision is still to come on this socket."""
        return self._final_sent_at is not None and not self._terminal_sent

    @property
    def forwarder(self) -> asyncio.Task[None] | None:
        """The task sending the session's events; done once the socket is closed after the
        terminal one (None before `start`)."""
        return self._forwarder

    async def drain(self, *, keep: bool = False) -> None:
        """Server shutdown: a streaming session with audio is ended as by the client's `end`
        (`LiveProtocol.server_end`); its final transcript then closes the socket with
        GOING_AWAY. A session already ending is left to finish; any other connection (no
        `start`, or no audio yet: nothing to transcribe) fails with engine_unavailable.
        `keep` (a restart): a streaming session, audio or not, is kept for the next start
        instead (`_keep_for_restart`), and a connection with no session fails with
        server_restarting. A session that failed is left to send its own error (its journal
        entry went with it: told to resume, its client would find no session)."""
        if self.ws.closed:
            return
        async with self._actions:
            holder = self.holder
            if holder is not None and isinstance(holder.replay.terminal, Error):
                return  # failed: its error is queued, and the forwarder sends it and closes
            if keep and holder is not None and self.protocol.state is State.STREAMING:
                await self._keep_for_restart(holder)
                return
            if not keep and self.protocol.server_end():
                self._drained = True
                await self._end()
                return
        if self.protocol.state not in (State.ENDING, State.DRAINING, State.CLOSED):
            await self.fail(_shutdown_error(self, keep))

    async def _keep_for_restart(self, holder: LiveSessionHolder) -> None:
        """A restart's drain (under the action lock: no audio is taken in meanwhile): the
        session's audio taken in goes to disk, waited for at most LIVE_RESTART_DURABLE_WAIT_S
        (the client holds what was not acknowledged and sends it again from the resume's
        offset), then the client is sent `server_restarting` and a 1012 close. The session is
        kept (`_keep_session`), so the cleanup keeps it (LiveSessions.disconnect), unfinished
        in the journal: the next start rebuilds it, as after a crash, and its client resumes
        it."""
        if not await holder.wait_durable(LIVE_RESTART_DURABLE_WAIT_S):
            log.warning(
                "live session %s: %d frames not on disk before the restart; its client "
                "sends them again",
                holder.id,
                holder.num_frames_accepted - holder.num_frames_durable,
            )
        self._keep_session = True
        # its overlays hear it now, not once every session has drained (a trial)
        holder.end_subscriptions(restarting_error(holder.id))
        await self.fail(_restarting())

    async def cleanup(self) -> None:
        """Release everything; safe after any failure (the `finally` of the handler). The
        session is kept for a resume where the socket went while the client streamed or
        waited for its final, with no error sent that ends the session (a client's violation
        does not: `run`) and the final not sent (LiveProtocol.close); else it is dropped (its
        backend session aborted)."""
        keep = self.protocol.close(client_left=self._client_left) and not self._terminal_sent
        self._cancel_ack()
        if self._forwarder is not None:
            self._forwarder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._forwarder
        if self._taken_over is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._taken_over
        if self.holder is not None:
            kept = await self.app[SESSIONS_KEY].disconnect(self.holder, self, keep=keep)
            if kept:
                self.outcome = "detached"
        if not self.ws.closed:
            with contextlib.suppress(ConnectionError):
                await self.ws.close()
        self._set_state(None)
        self._metrics.sessions_ended.labels("live", self.outcome).inc()
        self._log_close()

    def _log_close(self) -> None:
        """One line per connection. A detach does not end the session (it said "ended:
        detached", and a resumed session's end counted only its last socket's audio: "14.0 s"
        of a 30-s meeting, a trial), so a detach says so, and an end counts the session's."""
        held = self.holder
        elapsed_s = asyncio.get_running_loop().time() - self._opened_at
        if held is not None and self.outcome == "detached":
            how = "lost its connection"
            if self._error is not None:  # a client's violation, a restart: kept all the same
                how = f"closed its connection for {self._error.code} ({self._error.message})"
            log.info(
                "live session %s %s after %.1f s of audio on it in %.1f s; kept for a resume",
                held.id,
                how,
                self.protocol.audio_seconds(self.protocol.num_audio_bytes),
                elapsed_s,
            )
            return
        audio_s = self.protocol.audio_seconds(self.protocol.num_audio_bytes)
        if held is not None:
            audio_s = held.num_frames_accepted / held.audio_format.sample_rate
        if held is not None:
            who = held.id
        elif self._resume_id is not None:  # a resume refused (or the socket went before it)
            who = f"{self._resume_id!r} (not resumed)"  # the client's string: repr, one line
        else:
            who = "(not started)"
        outcome = self.outcome
        if self._error is not None:  # the reason, as the client was told it
            outcome = f"{outcome} ({self._error.message})"
            outcome += refused_client(self._error, self._remote)
        log.info(
            "live session %s ended: %s, %.1f s of audio (this connection open %.1f s)",
            who,
            outcome,
            audio_s,
            elapsed_s,
        )

    async def fail(self, error: LivemeetError) -> None:
        """Send the frames owed (`_flush_owed`), then `error`, then close with its close code
        (no-op on a closed socket). Once: a connection that failed (or was taken over) sends
        no second error."""
        if self._failed:
            return
        self._failed = True
        self._error = error
        if not self._keep_session:
            self.protocol.fail()  # the session is not kept for a resume (LiveProtocol.close)
        self.outcome = error.code
        self._metrics.errors.labels(error.code).inc()
        self._cancel_ack()
        await self._flush_owed()
        await self._send_error(error)

    async def _flush_owed(self) -> None:
        """Stop the forwarder and send what it had queued, in order, within
        LIVE_FLUSH_BEFORE_ERROR_S: `session.ready` above all (a `start` followed at once by a
        bad message got the error alone, and the client never learnt the session's id; a
        trial). Nothing to do once the terminal event went (its close is under way)."""
        forwarder = self._forwarder
        if forwarder is None or self._terminal_sent or forwarder is asyncio.current_task():
            return
        forwarder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await forwarder
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(LIVE_FLUSH_BEFORE_ERROR_S):
                while self._outbox and not self.ws.closed:
                    frame, _ = self._outbox.popleft()
                    await self.ws.send_str(json.dumps(frame, ensure_ascii=False))

    async def _send_error(self, error: LivemeetError) -> None:
        if self.ws.closed:
            return
        with contextlib.suppress(ConnectionError):
            await self.ws.send_str(ws_error_frame(error))
            await self.ws.close(code=error.close_code, message=error.code.encode())

    # -- live_holder.EventSink: called by the session holder, synchronously ------------------

    def attached(
        self, holder: LiveSessionHolder, replay: list[SessionEvent], resumed: bool
    ) -> None:
        """This socket carries `holder` now: `session.ready`, then the replay, go first."""
        self.holder = holder
        # session.ready's offset (the durable audio, `LiveSessionHolder.attach`) acknowledges
        # those frames
        self._acks.acked = holder.client_offset
        if resumed:
            # a session whose storage failed is being ended (`storage_failed`): as one ended,
            # and this socket closes as the one it failed on, with storage_failed after the
            # final (a resume got the final and 1000: never told it ended early, nor whether
            # the final was stored)
            ended = holder.ended or holder.storage_error is not None
            if holder.storage_error is not None:
                self._storage_error = holder.storage_error
                self._storage_early = holder.storage_early
            self.protocol.resumed(holder.num_frames_accepted, ended=ended)
            if ended:
                self._ended_at = asyncio.get_running_loop().time()
        self._enqueue(self._ready_frame(holder, resumed, replay), None)
        for event in replay:
            self.deliver(event)

    def deliver(self, event: SessionEvent) -> None:
        frame = event_to_wire(event)
        if frame is None:
            return
        if isinstance(event, TranscriptFinal):
            # the last ack comes before the final; the final waited for the audio to be on
            # disk (`LiveSessionHolder._take`), so it covers all of it. Not beyond the disk:
            # a client that got this ack and lost the final with its connection resumes from
            # it, and a server that died meanwhile rebuilds the session from the disk
            self._send_ack()
        self._enqueue(frame, event)

    def audio_durable(self) -> None:
        """More of the session's audio is on disk: an ack goes out within the ack interval
        (audio that arrived last, with none after it, is acknowledged too)."""
        if self.holder is None or self._failed or self._storage_error is not None:
            return
        if self.holder.num_frames_durable <= self._acks.acked:
            return
        loop = asyncio.get_running_loop()
        due_at = self._acks.audio_accepted(loop.time())
        if due_at is not None:
            self._ack_timer = loop.call_at(due_at, self._send_ack)

    def storage_failed(self, error: StorageFailed) -> bool:
        """The session's journal failed (`error`), and the server ends it as by its client's
        `end` (LiveSessions._storage_failed): the client's frames are ignored from now on
        (DRAINING, as after a drain's end: its in-flight audio the backend took before the
        end is in the final), no ack goes out (its audio is no longer on disk), the idle limit
        gives way to the final's, and once the final transcript (and the revision it
        promised) is out, the socket closes with storage_failed (4507), saying whether the
        final was stored (`_close_after`). Returns whether this ended it early (STREAMING
        still: its client's `end` had not come)."""
        if self._storage_error is not None:
            return self._storage_early
        if self._failed:  # closing (a client's violation): no more actions, `ended` is exact
            return self.holder is None or not self.holder.ended
        self._storage_error = error
        # STREAMING: the server ends it now; else its `end` (or a drain's, an idle end's) came
        self._storage_early = self.protocol.server_end()
        self._cancel_ack()
        if self._ended_at is None:
            self._ended_at = asyncio.get_running_loop().time()
            self._set_state("ending")
        return self._storage_early

    def take_over(self) -> asyncio.Task[None]:
        """A resume on another socket took the session: stop carrying it (nothing more is
        sent from the outbox, later frames are refused), then say why and close."""
        error = SessionTakenOver("this live session was resumed on another connection")
        self._failed = True
        self.protocol.fail()
        self.outcome = error.code
        self._metrics.errors.labels(error.code).inc()
        self._cancel_ack()
        if self._forwarder is not None:
            self._forwarder.cancel()
        self._taken_over = asyncio.create_task(self._send_error(error))
        return self._taken_over

    # -- the client's actions --------------------------------------------------------------

    async def _on_speaker_action(self, action: SpeakerRename | SpeakerMerge) -> None:
        """A rename or merge. After `end` one the session refuses (a label merged away, a
        cycle, ...) is ignored, as a malformed one is (docs/protocol.md): its error would
        close the socket before the final, and the meeting's transcript with it (a trial);
        one that comes after the final transcript is late and ignored too."""
        holder = self._require_holder()
        what = "rename" if isinstance(action, SpeakerRename) else "merge"
        try:
            if isinstance(action, SpeakerRename):
                done = holder.rename(self, action.speaker, action.name)
            else:
                done = await holder.merge(self, action.speaker, action.into)
        except InvalidRequest as exc:
            if self.protocol.state not in (State.ENDING, State.DRAINING):
                raise  # the 4400 closes the socket; the meeting is kept (`run`)
            log.info("live session %s: %s after end refused, ignored: %s", holder.id, what, exc)
            return
        if not done:
            log.info(
                "live session %s: %s of %s after its final transcript, ignored",
                holder.id,
                what,
                action.speaker,
            )

    async def _on_action(self, action: object) -> None:
        if isinstance(action, AppendAudio):
            await self._append(action.pcm)
        elif isinstance(action, StartSession):
            await self._start(action)
        elif isinstance(action, Finalize):
            await self._require_holder().finalize(self)
        elif isinstance(action, EndStream):
            await self._end()
        elif isinstance(action, SpeakerRename | SpeakerMerge):
            await self._on_speaker_action(action)
        elif isinstance(action, Ignored):
            if action.reason:
                log.info("live message after the session ended, ignored: %s", action.reason)
            if action.audio_bytes:
                log.debug(
                    "live audio after the session ended, not transcribed: %d bytes",
                    action.audio_bytes,
                )
        elif not isinstance(action, KeepAlive):
            raise InternalError(f"unhandled live action {action!r}")

    @property
    def key_id(self) -> str | None:
        """The id of the API key the connection was let in with (None: none yet, or none
        needed)."""
        return self._key_id

    def withdraw(self, error: Unauthorized) -> None:
        """The connection's API key no longer lets it in (revoked, or removed): its handler
        fails with `error` (what is owed, then the error, then close 4401) at once if it is
        waiting for the client's next message, else once the action under way (a `start`, a
        resume waiting for the engine, an append) is done: the handler's own close waits for
        the client's close frame, which a close from another task while it reads does not
        (aiohttp drops the connection: the client saw 1006). Its session is ended, not kept
        for a resume, by the cleanup (LiveSessions.disconnect: the registry knows the key is
        withdrawn): one it opens or resumes meanwhile too."""
        if self._withdrawal is not None:
            return
        self._withdrawal = error
        reading = self._reading
        if reading is not None and not reading.expired():
            reading.reschedule(asyncio.get_running_loop().time())  # `_receive` raises it

    async def _authenticate(self, presented: str | None) -> None:
        """Let the connection open or resume a session with the key `presented` (None:
        none), or raise Unauthorized."""
        key = await self.app[AUTH_KEY].authenticate(presented, live=True)
        self._authenticated = True
        self._key_id = key.key_id if key is not None else None

    async def _start(self, start: StartSession) -> None:
        if not self._authenticated:  # a resume too: the resume token alone is not enough
            await self._authenticate(start.api_key)
        sessions = self.app[SESSIONS_KEY]
        client = client_of(self._key_id, self._remote)  # gateway/clients.py
        if start.resume is not None:  # never refused for the client's cap: its slot is held
            self._resume_id = start.resume.session_id
            resumed = sessions.resume(start.resume, start.audio_format, self, client)
            await self._while_reading(resumed)
        else:
            self.app[DISK_KEY].check("live sessions")  # not one that fails on a full disk
            info = self.app[TRANSCRIBER_KEY].info
            check_language(start.language, info.language_code, info.name)
            options = SessionOptions(
                live=True,
                prompt=start.prompt,
                hotwords=start.hotwords,
                language=start.language,
                hop_s=self.app[CONFIG_KEY].gateway.live_hop_s,
                revise=self.app[CONFIG_KEY].gateway.revise
                and self.app[TRANSCRIBER_KEY].info.revise,
            )
            decoder = PcmStreamDecoder(start.sample_rate, start.channels, start.encoding)
            with sessions.admitting(client):  # TooManySessions past the client's cap
                session = await self.app[TRANSCRIBER_KEY].open_session(options)
                sessions.open(session, decoder, start.audio_format, self, options, client)
        if self._key_id is not None and self.holder is not None:
            log.info("live session %s: API key %s", self.holder.id, self._key_id)
        self._forwarder = asyncio.create_task(self._forward())
        self._set_state("ending" if self.protocol.state is State.ENDING else "streaming")

    async def _while_reading(self, waiting: Awaitable[object]) -> None:
        """Await `waiting` (a resume: while the engine worker is started again, its session
        waits to be rebuilt, up to LIVE_ENGINE_RECOVERY_S) while reading the socket, since
        aiohttp answers the client's pings only inside `receive`: unanswered, a client's
        WebSocket library drops the connection (websockets, `livemeet stream`'s: 20 s after
        a ping, every 20 s), and the client loses the session it was resuming. A resuming
        client sends nothing before `session.ready` (it needs its offset), so the first
        message read meanwhile (a keepalive, a close) is held for the receive loop, and
        reading stops there. The idle timeout starts again once `waiting` is done: the wait
        was the server's, not the client's."""
        waited = asyncio.ensure_future(waiting)
        reading = asyncio.ensure_future(_read(self.ws))
        try:
            await asyncio.wait({waited, reading}, return_when=asyncio.FIRST_COMPLETED)
            await waited
        except asyncio.CancelledError:
            waited.cancel()
            raise
        finally:
            self._held_message = await _stop_reading(reading)
        self._last_message_at = asyncio.get_running_loop().time()

    def _ready_frame(
        self, holder: LiveSessionHolder, resumed: bool, replay: list[SessionEvent]
    ) -> dict[str, Any]:
        info = self.app[TRANSCRIBER_KEY].info
        window_s = self.app[SESSIONS_KEY].window_s
        return {
            "type": "session.ready",
            "session_id": holder.id,
            "protocol": PROTOCOL_VERSION,
            "demo": info.demo,
            "model": info.model_id,
            "resume_token": holder.token if window_s > 0 else None,
            "resume_window_s": window_s,
            "resumed": resumed,
            "offset": holder.client_offset,
            # where the last finalize on disk came: the client sends each later one again
            # (docs/protocol.md, Resume: a crash took them, acknowledged audio or not)
            "finalize_offset": holder.finalize_offset,
            # read-only: the session's captions and transcript (docs/protocol.md, "Captions")
            "captions_token": holder.captions_token,
            # transcript.revised follows transcript.final (DESIGN 5.7)
            "revise": holder.options is not None and holder.options.revise,
            # the names and merges the replay gives, at once: a client that waited for the
            # replay's frames had to guess when it was over (a stall mid-replay dropped the
            # recorder's names for ~0.5 s: session 40's trial)
            **speaker_maps(replay),
        }

    async def _append(self, pcm: bytes) -> None:
        new_bytes = await self._require_holder().append(self, pcm)
        # audio a resumed client sends again (held already) is not counted twice
        self._metrics.audio_received_seconds.labels("live").inc(
            self.protocol.audio_seconds(new_bytes)
        )
        loop = asyncio.get_running_loop()
        due_at = self._acks.audio_accepted(loop.time())
        if due_at is not None:
            self._ack_timer = loop.call_at(due_at, self._send_ack)

    async def _end(self) -> None:
        await self._require_holder().end(self)
        self._ended_at = asyncio.get_running_loop().time()
        self._set_state("ending")

    # -- the outbox ------------------------------------------------------------------------

    def _send_ack(self) -> None:
        """Queue `audio.ack` for the session's durable audio (DESIGN 5.9: only audio on disk
        is acknowledged), unless the client knows already."""
        self._cancel_ack()
        held = self.holder
        # its storage failed: its audio is deleted, none of it is on disk any more
        if held is None or self._failed or self._storage_error is not None:
            return
        offset = self._acks.take(held.num_frames_durable)
        if offset is not None:
            self._enqueue({"type": "audio.ack", "offset": offset}, None)

    def _cancel_ack(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    def _enqueue(self, frame: dict[str, Any], event: SessionEvent | None) -> None:
        kind = frame["type"]
        if kind in _COALESCED:
            # at most one of each is ever queued, wherever it waits (acks and partials come
            # by turns: replacing only the last frame let them pile up); the newer one goes
            # last, after the finals queued meanwhile
            self._unqueue(lambda queued: queued["type"] == kind)
        elif kind == _RENAMED:
            # one per label; every rename is answered, so a client that sends them and never
            # reads would grow the outbox without a bound: past MAX_NAMED_SPEAKERS unsent
            # labels a new one is dropped (a resume replays every name)
            label = frame["speaker"]
            self._unqueue(lambda queued: queued["type"] == kind and queued["speaker"] == label)
            unsent = sum(1 for queued, _ in self._outbox if queued["type"] == kind)
            if unsent >= MAX_NAMED_SPEAKERS:
                log.debug("live session: %d renames unread by the client, one dropped", unsent)
                return
        self._outbox.append((frame, event))
        self._wakeup.set()

    def _unqueue(self, match: Callable[[dict[str, Any]], bool]) -> None:
        """Remove the first unsent frame that `match`es (there is at most one)."""
        for i, (queued, _) in enumerate(self._outbox):
            if match(queued):
                del self._outbox[i]
                return

    async def _forward(self) -> None:
        """Send the outbox in order; close after the session's terminal event."""
        try:
            while True:
                while not self._outbox:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                frame, event = self._outbox.popleft()
                await self.ws.send_str(json.dumps(frame, ensure_ascii=False))
                self._final_out = self._final_out or isinstance(event, TranscriptFinal)
                if isinstance(event, TranscriptFinal) and event.revision:
                    self.outcome = "completed"
                    self._final_sent_at = asyncio.get_running_loop().time()
                if is_terminal(event):
                    assert isinstance(event, TranscriptFinal | TranscriptRevised | Error)
                    self._terminal_sent = True
                    await self._close_after(event)
                    return
        except ConnectionError:
            pass  # the client vanished; the handler's finally detaches or drops the session

    async def _close_after(self, event: TranscriptFinal | TranscriptRevised | Error) -> None:
        """Close after the session's last event: normally after its transcript (its revision,
        or a revision's failure: the final stands), else with its error's close code."""
        revision_failed = isinstance(event, Error) and event.code == RevisionFailed.code
        if revision_failed:
            self._metrics.errors.labels(RevisionFailed.code).inc()
        if isinstance(event, TranscriptFinal | TranscriptRevised) or revision_failed:
            self.outcome = "completed"
            if self._storage_error is not None and self.holder is not None:
                stored = await self.holder.final_stored()
                await self.fail(self.ended_early(stored=stored))
            elif self._end_error is not None:
                await self.fail(self._end_error)
            elif self._drained and not revision_failed:  # an error closes with its own code
                await self.ws.close(code=GOING_AWAY, message=b"server shutting down")
            else:
                await self.ws.close(code=NORMAL_CLOSE)
            return
        error = error_for_code(event.code, event.message)
        self.outcome = error.code
        self._metrics.errors.labels(error.code).inc()
        await self.ws.close(code=error.close_code, message=error.code.encode())

    def _require_holder(self) -> LiveSessionHolder:
        if self.holder is None:
            raise InvalidRequest("no session: send 'start' first")
        return self.holder

    def _set_state(self, state: str | None) -> None:
        self._metrics.sessions.labels("live", self._state_label).dec()
        if state is not None:
            self._metrics.sessions.labels("live", state).inc()
            self._state_label = state


async def _read(ws: web.WebSocketResponse) -> WSMessage:
    """`ws.receive()`, where a connection lost under it reads as a closed socket (a drop: the
    session is kept for a resume). aiohttp answers a ping inside `receive`, and the pong's
    write to a transport already closing raises ConnectionResetError out of it (aiohttp 3.14):
    a ping read together with the connection's end (a gateway loop busy for a while, a
    handler busy with a frame) was an internal_error that dropped the meeting (a soak test)."""
    try:
        return await ws.receive()
    except ConnectionError:
        return _LOST


async def _stop_reading(reading: asyncio.Future[WSMessage]) -> WSMessage | None:
    """Cancel a socket's `receive` and wait until it has stopped (aiohttp refuses a second
    `receive` while one runs); the message it had read, if it was done first. A cancelled
    `receive` leaves an unread message queued for the next one."""
    reading.cancel()
    await asyncio.wait({reading})
    return None if reading.cancelled() else reading.result()


async def live_handler(request: web.Request) -> web.WebSocketResponse:
    """`GET /v1/live`. Raises InvalidRequest (400) when the request is not a WS upgrade, and
    RequestRejected (400) for a browser page of an origin not allowed (the policy in
    gateway/origin.py, checked by gateway/origin_http.py)."""
    ws = web.WebSocketResponse(max_msg_size=_WS_MAX_MSG_SIZE)  # timeouts: LiveConnection
    if not ws.can_prepare(request).ok:
        raise InvalidRequest("GET /v1/live needs a WebSocket upgrade")
    check_browser_origin(request, "open live sessions")
    await ws.prepare(request)
    connection = LiveConnection(request.app, ws, request_key(request), request.remote)
    registry = request.app[REGISTRY_KEY]
    registry.add(connection)
    try:
        await connection.run()
    finally:
        registry.discard(connection)
        await _uncancelled(connection.cleanup())
    return ws


async def _uncancelled(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run `cleanup` to its end though this handler is cancelled meanwhile: a client that
    hangs up after its close (aiohttp's handler_cancellation) cut a drained session's cleanup
    where it waited, and its log line, counters and gauges with it (a trial). That hang-up
    is the socket's end, not a request cut short: once the cleanup is done the handler
    returns (a cancellation that came before the cleanup still propagates)."""
    task = asyncio.create_task(cleanup)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})  # each step is bounded (the drain's deadline)
        current = asyncio.current_task()
        assert current is not None
        current.uncancel()
        task.result()  # a bug in the cleanup is raised, not dropped
