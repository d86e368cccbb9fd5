"""`GET /v1/sessions/{id}/captions`: a read-only WebSocket subscription to one live session
(docs/protocol.md, "Captions").

A thin asyncio shell around `CaptionsOutbox` (the fan-out policy, gateway/captions.py): the
handshake (origin as for /v1/live, then the session and its `captions_token`), registration
with the session's holder in `try` and removal in `finally`, one task sending the outbox, and
one watching the socket for the client's close (a subscriber sends nothing: any message is a
`protocol_error`). The handler closes the socket itself once the sender is done and the
watcher stopped: an aiohttp close that interrupts a pending receive drops the TCP connection
without waiting for the client's close frame, which a client reading late sees as 1006. The
subscriber is attached to the session, not to the session's socket, so it stays through the
client's detach and resume. A refusal (unknown session, wrong token, a server draining) is
accepted, sent an `error`, then closed with the error's 4xxx code, as a refused /v1/live is
(browsers see only 1006 otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, NamedTuple

from aiohttp import WSMsgType, web

from livemeet.audio.constants import (
    CAPTIONS_HEARTBEAT_S,
    CAPTIONS_MAX_QUEUED_FINALS,
    CAPTIONS_SNAPSHOT_FINALS,
)
from livemeet.errors import (
    EngineUnavailable,
    InvalidRequest,
    LivemeetError,
    NotFound,
    ProtocolError,
    Unauthorized,
    error_for_code,
)
from livemeet.gateway.auth_http import refused_client
from livemeet.gateway.captions import CaptionsOutbox
from livemeet.gateway.errors_http import ws_error_frame
from livemeet.gateway.keys import (
    CAPTIONS_KEY,
    LIFECYCLE_KEY,
    METRICS_KEY,
    SESSIONS_KEY,
    TRANSCRIBER_KEY,
)
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.gateway.live_protocol import NORMAL_CLOSE, PROTOCOL_VERSION
from livemeet.gateway.live_replay import SessionEvent, speaker_maps
from livemeet.gateway.origin_http import check_browser_origin
from livemeet.gateway.ws_live import event_to_wire
from livemeet.transcriber import (
    BackendInfo,
    Error,
    TranscriptFinal,
    TranscriptRevised,
    is_terminal,
)

log = logging.getLogger(__name__)

CAPTIONS_PATH = "/v1/sessions/{id}/captions"
# bytes; a subscriber sends nothing, so aiohttp need not buffer a large message to refuse it
_WS_MAX_MSG_SIZE = 4096


class _Close(NamedTuple):
    """How the subscription ends: the close code and reason to send."""

    code: int
    reason: bytes = b""


class CaptionsSubscriber:
    """One subscription's socket and outbox. Implements live_holder.CaptionsSink."""

    def __init__(
        self, ws: web.WebSocketResponse, transport: asyncio.Transport | None = None
    ) -> None:
        self.ws = ws
        self.outbox = CaptionsOutbox(CAPTIONS_MAX_QUEUED_FINALS)
        self.outcome = "disconnected"
        self.ready: dict[str, Any] = {}  # `captions.ready`, sent first by the forwarder
        self.done = asyncio.Event()  # the handler is through: the socket is closed
        self._wakeup = asyncio.Event()
        self._transport = transport

    def drop(self) -> None:
        """Drop the connection (no close handshake): the sender's wait on a full socket and
        the close's wait for a reply end at once."""
        if self._transport is not None:
            self._transport.abort()

    # -- live_holder.CaptionsSink: called by the session's pump, synchronously ------------

    def deliver(self, event: SessionEvent) -> None:
        self.outbox.push(event)
        self._wakeup.set()

    def session_gone(self, error: LivemeetError) -> None:
        self.fail(error)

    def fail(self, error: LivemeetError) -> None:
        """Close the subscription with `error` (after the frame being sent, if any)."""
        self.outbox.fail(error)
        self._wakeup.set()

    async def forward(self) -> _Close | None:
        """Send `captions.ready`, then the outbox in order, up to a terminal item; returns the
        close that follows it (None: the subscriber vanished)."""
        try:
            await self.ws.send_str(json.dumps(self.ready, ensure_ascii=False))
            while True:
                item = self.outbox.pop()
                if item is None:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if isinstance(item, LivemeetError):
                    self.outcome = item.code
                    await self.ws.send_str(ws_error_frame(item))
                    return _Close(item.close_code, item.code.encode())
                frame = event_to_wire(item)
                if frame is not None:
                    await self.ws.send_str(json.dumps(frame, ensure_ascii=False))
                if isinstance(item, TranscriptFinal | TranscriptRevised) and is_terminal(item):
                    self.outcome = "completed"
                    return _Close(NORMAL_CLOSE)
                if isinstance(item, Error):  # the session's own error: its frame went out
                    error = error_for_code(item.code, item.message)
                    self.outcome = error.code
                    return _Close(error.close_code, error.code.encode())
        except ConnectionError:
            return None  # the subscriber vanished; the handler's finally removes it


class CaptionsRegistry:
    """The open captions subscriptions of one app (for the shutdown)."""

    def __init__(self) -> None:
        self._subscribers: set[CaptionsSubscriber] = set()

    def __len__(self) -> int:
        return len(self._subscribers)

    def add(self, subscriber: CaptionsSubscriber) -> None:
        self._subscribers.add(subscriber)

    def discard(self, subscriber: CaptionsSubscriber) -> None:
        self._subscribers.discard(subscriber)

    async def close_all(self, timeout_s: float) -> None:
        """Server shutdown, once every subscription has its end queued (`server_restarting`
        for a session kept for the next start, else its final): wait up to `timeout_s` for
        each to be sent and closed, then drop the connections still open. A subscriber that
        stopped reading (an overlay whose machine froze or lost its network) would hold the
        stop: its sender waits on a full socket, its close on a reply, until the heartbeat
        drops it (a probe: 42 s, where a restart takes 0.1 s)."""
        subscribers = list(self._subscribers)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(s.done.wait() for s in subscribers))
        late = [s for s in subscribers if not s.done.is_set()]
        if late:
            log.info("shutting down: %d captions subscribers not reading were dropped", len(late))
        for subscriber in late:
            subscriber.drop()


async def _sends_a_message(ws: web.WebSocketResponse) -> bool:
    """Read the socket until the client sends a message (True) or the socket closes (False).
    Pings and pongs are answered by aiohttp and are not messages."""
    async for msg in ws:
        if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            return True
    return False


def _subscribed_holder(request: web.Request) -> LiveSessionHolder:
    """The live session the request names, once its token checks out. Raises
    EngineUnavailable (draining), NotFound, Unauthorized."""
    if request.app[LIFECYCLE_KEY].draining:
        raise EngineUnavailable("the server is shutting down")
    session_id = request.match_info["id"]
    holder = request.app[SESSIONS_KEY].get(session_id)
    if holder is None:
        raise NotFound(f"no live session {session_id!r} (ended, or never here)")
    if not holder.authorizes_captions(request.query.get("token", "")):
        raise Unauthorized(
            f"captions of live session {session_id!r} need its captions_token "
            "(session.ready's) as ?token="
        )
    return holder


def captions_ready(
    session_id: str, info: BackendInfo, snapshot: list[SessionEvent]
) -> dict[str, Any]:
    """The `captions.ready` frame of a subscription whose snapshot is `snapshot`: with the
    names (`speakers`, {label: name}) and merges (`merged`, {label: into}) its
    `speaker.renamed` and `speaker.merged` frames give, so a viewer that reconnects replaces
    its own at once (an overlay cleared them at `captions.ready` and showed bare labels until
    the snapshot's frames came: a flicker at every reconnect)."""
    return {
        "type": "captions.ready",
        "session_id": session_id,
        "protocol": PROTOCOL_VERSION,
        "demo": info.demo,
        "model": info.model_id,
        **speaker_maps(snapshot),
    }


async def captions_handler(request: web.Request) -> web.WebSocketResponse:
    """`GET /v1/sessions/{id}/captions`. Raises InvalidRequest (400) when the request is not a
    WS upgrade, and RequestRejected (400) for a browser page of an origin not allowed."""
    # compress=False: no permessage-deflate, whatever the browser offers. A caption frame is
    # ~100-300 B of JSON, which deflate barely shrinks, while each socket's zlib streams held
    # ~300 KB, kept past its close until a full GC (a soak trial: aiohttp's heartbeat makes a
    # reference cycle), so an overlay watched by many cost the gateway ~0.3 MB a viewer
    ws = web.WebSocketResponse(
        heartbeat=CAPTIONS_HEARTBEAT_S, max_msg_size=_WS_MAX_MSG_SIZE, compress=False
    )
    if not ws.can_prepare(request).ok:
        raise InvalidRequest(f"GET {request.path} needs a WebSocket upgrade")
    check_browser_origin(request, "subscribe to captions")
    await ws.prepare(request)
    metrics = request.app[METRICS_KEY]
    try:
        holder = _subscribed_holder(request)
    except LivemeetError as exc:
        metrics.errors.labels(exc.code).inc()
        # the id is the URL's, decoded: repr, so a `%0A` forges no log line
        log.info(
            "captions of %r refused: %s%s",
            request.match_info["id"],
            exc.code,
            refused_client(exc, request.remote),
        )
        with contextlib.suppress(ConnectionError):
            await ws.send_str(ws_error_frame(exc))
            await ws.close(code=exc.close_code, message=exc.code.encode())
        return ws
    subscriber = CaptionsSubscriber(ws, request.transport)
    registry = request.app[CAPTIONS_KEY]
    # register, snapshot and queue it in one synchronous step: no event falls in between
    snapshot = holder.subscribe(subscriber, CAPTIONS_SNAPSHOT_FINALS)
    registry.add(subscriber)
    subscriber.ready = captions_ready(holder.id, request.app[TRANSCRIBER_KEY].info, snapshot)
    for event in snapshot:
        subscriber.deliver(event)
    metrics.captions_subscribers.inc()
    forwarder = asyncio.create_task(subscriber.forward(), name=f"captions-{holder.id}")
    watcher = asyncio.create_task(_sends_a_message(ws))
    try:
        await asyncio.wait({forwarder, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done() and watcher.result():
            subscriber.fail(ProtocolError("a captions subscription is read-only: send nothing"))
            # bounded: a subscriber that stopped reading is closed by the heartbeat
            await asyncio.wait({forwarder}, timeout=CAPTIONS_HEARTBEAT_S)
        if forwarder.done() and (close := forwarder.result()) is not None:
            watcher.cancel()  # no receive may be pending while close() reads the reply
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            with contextlib.suppress(ConnectionError):
                await ws.close(code=close.code, message=close.reason)
    finally:
        holder.unsubscribe(subscriber)
        metrics.captions_subscribers.dec()
        try:
            for task in (forwarder, watcher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if not ws.closed:
                with contextlib.suppress(ConnectionError):
                    await ws.close()
        finally:  # a handler cancelled here (its client gone) leaves no entry behind
            registry.discard(subscriber)
            subscriber.done.set()
        if subscriber.outcome not in ("completed", "disconnected"):
            metrics.errors.labels(subscriber.outcome).inc()
        log.info("captions of %s ended: %s", holder.id, subscriber.outcome)
    return ws
