"""`/v1/live` over a real aiohttp server with a FakeTranscriber: events, errors, cleanup."""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient

from livemeet.audio.constants import MAX_FRAME_BYTES, MAX_NAMED_SPEAKERS, SAMPLE_RATE
from livemeet.config import GatewayConfig, ServerConfig
from livemeet.errors import (
    BadAudio,
    ClientTimeout,
    EngineUnavailable,
    InternalError,
    InvalidRequest,
    LivemeetError,
    ProtocolError,
    QueueFull,
)
from livemeet.gateway.app import close_live_sockets, create_app
from livemeet.gateway.keys import LIFECYCLE_KEY, REGISTRY_KEY, SESSIONS_KEY
from livemeet.gateway.live_protocol import SpeakerRenamed
from livemeet.gateway.ws_live import GOING_AWAY, LiveConnection
from livemeet.transcriber import SegmentFinal, SegmentPartial
from livemeet.transcript.segments import Segment
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FINAL_EVERY, FakeSession, FakeTranscriber

START = {"type": "start", "sample_rate": 16000, "channels": 1, "encoding": "pcm_s16le"}


async def start_session(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """Send START and return the server's `session.ready` (any other answer fails)."""
    await ws.send_json(START)
    ready = await ws.receive_json()
    assert ready["type"] == "session.ready", ready
    return ready


async def receive_all(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """Every JSON event until the server closes."""
    events = []
    async for msg in ws:
        assert msg.type is WSMsgType.TEXT, msg
        events.append(json.loads(msg.data))
    return events


async def expect_error(ws: aiohttp.ClientWebSocketResponse, error: type[LivemeetError]) -> dict:
    events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["type"] == "error", events
    assert events[-1]["code"] == error.code
    assert isinstance(events[-1]["message"], str) and events[-1]["message"]
    assert events[-1]["retryable"] is error.retryable
    assert ws.close_code == error.close_code
    return events[-1]


async def timeout_while_repeating(
    ws: aiohttp.ClientWebSocketResponse, send: Callable[[], Awaitable[object]]
) -> dict:
    """The `client_timeout` error frame the server sends while `send` runs every 50 ms."""

    async def repeat() -> None:
        while True:
            await send()
            await asyncio.sleep(0.05)

    sender = asyncio.create_task(repeat())
    try:
        return await asyncio.wait_for(expect_error(ws, ClientTimeout), 3)
    finally:
        sender.cancel()


async def gateway_client(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    data_dir: Path | None = None,
    **gateway: Any,
) -> TestClient:
    """A test client of an app over `fake` whose GatewayConfig has the `gateway` fields, on
    `server_config`'s data dir or `data_dir` (one running server per data dir: a second app
    in the same test needs its own, as the live journal is locked while a server runs)."""
    config = ServerConfig(
        data_dir=data_dir or server_config.data_dir, gateway=GatewayConfig(**gateway)
    )
    return await aiohttp_client(create_app(config, fake))


async def test_stream_partials_finals_and_transcript(
    client: TestClient, fake: FakeTranscriber
) -> None:
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json({**START, "language": "en", "hotwords": ["MOSS"]})
        ready = await ws.receive_json()
        token = ready.pop("resume_token")
        assert isinstance(token, str) and len(token) >= 40  # 32 random bytes, base64
        captions_token = ready.pop("captions_token")
        assert isinstance(captions_token, str) and captions_token != token
        assert ready == {
            "type": "session.ready",
            "session_id": "fake-0",
            "protocol": 0,
            "demo": True,
            "model": "fake-model",
            "resume_window_s": 60.0,
            "resumed": False,
            "offset": 0,
            "finalize_offset": None,  # a new session holds no finalize
            "revise": False,  # the fake backend cannot revise
            "speakers": {},  # a new session: no names nor merges yet
            "merged": {},
        }
        chunk = pcm16(0.5)
        for _ in range(13):  # 6.5 s
            await ws.send_bytes(chunk)
        await ws.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert ws.close_code == 1000
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "transcript.final"
    # a partial still unsent when the next comes is replaced by it (protocol.md): the wire
    # carries an increasing selection of the backend's partials, at least one
    emitted = [e.rev for e in fake.sessions[0].log.events if isinstance(e, SegmentPartial)]
    assert len(emitted) == 6 - 6 // FINAL_EVERY
    revs = [e["rev"] for e in events if e["type"] == "segment.partial"]
    assert revs and revs == sorted(set(revs)) and set(revs) <= set(emitted)
    finals = [e for e in events if e["type"] == "segment.final"]
    assert [f["id"] for f in finals] == ["seg-0000", "seg-0001", "seg-0002"]
    assert finals[-1]["end"] == 6.5
    final = events[-1]
    assert final["segments"] == [{k: f[k] for k in final["segments"][0]} for f in finals]
    assert final["finish_reason"] == "stop" and final["duration"] == 6.5
    log = fake.sessions[0].log
    assert log.num_samples == 6.5 * 16000 and log.ended
    assert log.options.live and log.options.language == "en" and log.options.hotwords == ("MOSS",)


async def test_sessions_decode_at_the_servers_hop(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """`serve --live-hop-s` reaches every live session: at 0.5 s the fake backend, which
    emits a partial per hop of audio, sends twice the default's partials for the same audio."""
    client = await gateway_client(aiohttp_client, server_config, fake, live_hop_s=0.5)
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        for _ in range(4):  # 2 s
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert fake.sessions[0].log.options.hop_s == 0.5
    emitted = [e for e in fake.sessions[0].log.events if isinstance(e, SegmentPartial)]
    assert len(emitted) == 4 - 4 // FINAL_EVERY
    assert any(e["type"] == "segment.partial" for e in events)


async def test_resamples_48k_stereo_to_16k_mono(client: TestClient, fake: FakeTranscriber) -> None:
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json({**START, "sample_rate": 48000, "channels": 2})
        await ws.receive_json()
        for _ in range(4):
            await ws.send_bytes(pcm16(0.5, 48000, 2))
        await ws.send_json({"type": "finalize"})
        await ws.send_json({"type": "keepalive"})
        await ws.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["type"] == "transcript.final"
    log = fake.sessions[0].log
    assert abs(log.num_samples - 2.0 * 16000) <= 16  # resampler edge effects only
    assert log.num_finalize == 1


async def test_a_start_in_a_language_the_backend_does_not_transcribe_is_refused(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """As an upload's: the English-only demo refuses `zh` (a trial's live Mandarin came
    back as English under its language) before opening a session."""
    fake._info = replace(fake._info, language_code="en")
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json({**START, "language": "zh"})
        error = await expect_error(ws, InvalidRequest)
    assert "'en' only" in error["message"] and not fake.sessions
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json({**START, "language": "en-GB"})
        assert (await ws.receive_json())["type"] == "session.ready"


@pytest.mark.parametrize(
    "field",
    [
        '"prompt": "\\ud800"',
        '"hotwords": ["ok", "\\udc00x"]',
        '"api_key": "\\ud800"',
        '"resume": {"session_id": "fake-0", "resume_token": "\\udfff"}',
    ],
)
async def test_a_lone_surrogate_in_start_is_refused_and_harms_no_other_session(
    client: TestClient, fake: FakeTranscriber, field: str
) -> None:
    """JSON's `\\ud800` escape decodes to a lone surrogate, which no UTF-8 writer takes: a
    `start` whose prompt held one was journalled in the group commit of every open session,
    failed it, and every live session on the server ended in storage_failed, its audio
    deleted (a security review). It is an `invalid_request` now, before anything is
    stored, and the other session streams on."""
    async with client.ws_connect("/v1/live") as other:
        await start_session(other)
        await other.send_bytes(pcm16(0.5))
        async with client.ws_connect("/v1/live") as ws:
            await ws.send_str('{"type": "start", "sample_rate": 16000, ' + field + "}")
            error = await expect_error(ws, InvalidRequest)
        assert "surrogate" in error["message"]
        await other.send_bytes(pcm16(0.5))
        await other.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(other), 5)
    assert [e["type"] for e in events if e["type"] == "error"] == [], events
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.0
    assert len(fake.sessions) == 1  # the refused start opened none


@pytest.mark.parametrize(
    ("frames", "error"),
    [
        (["{not json"], InvalidRequest),
        ([b"\x00\x00"], ProtocolError),  # audio before start
        ([START, START], ProtocolError),
        ([START, b"\x00\x00\x00"], ProtocolError),  # odd byte count
        ([START, {"type": "speaker.dance"}], ProtocolError),
        ([START, {"type": "end"}], ProtocolError),  # end before any audio
        ([{**START, "sample_rate": 12}], BadAudio),
        ([{**START, "encoding": "opus"}], InvalidRequest),
    ],
)
async def test_bad_input_gets_typed_error_and_close_code(
    client: TestClient, fake: FakeTranscriber, frames: list[Any], error: type[LivemeetError]
) -> None:
    """Sent back to back: a `start` taken is answered with `session.ready` before the error
    (a trial: the error went out first and the queued `session.ready` was dropped, so the
    client never learnt the id of the session the server logged). A session opened is kept
    for a resume (test_live_violations.py), none is opened otherwise."""
    async with client.ws_connect("/v1/live") as ws:
        for frame in frames:
            if isinstance(frame, bytes):
                await ws.send_bytes(frame)
            elif isinstance(frame, str):
                await ws.send_str(frame)
            else:
                await ws.send_json(frame)
        events = [*await asyncio.wait_for(receive_all(ws), 5)]
    started = frames[0] == START
    assert [e["type"] for e in events] == ["session.ready"] * started + ["error"], events
    assert events[-1]["code"] == error.code and ws.close_code == error.close_code
    await wait_until(lambda: len(client.app[REGISTRY_KEY]) == 0)
    assert client.app[SESSIONS_KEY].num_detached == len(fake.sessions) == started
    assert not any(s.log.aborted for s in fake.sessions)


async def test_a_second_end_and_late_audio_still_get_the_final(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A double-clicked stop (two `end`s) or an audio buffer racing the `end` closed the socket
    with protocol_error and no `transcript.final` (a trial): the meeting's transcript was lost.
    Both are ignored now, as is a message whose `type` is no string (it was an internal_error
    that dropped the session); the final covers the audio sent before `end`."""
    fake.end_gate = asyncio.Event()  # hold transcript.final so the server is still reading
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(0.2))
        await ws.send_json({"type": "end"})
        await ws.send_json({"type": "end"})
        await ws.send_bytes(pcm16(0.2))
        await ws.send_json({"type": "finalize"})
        await ws.send_json({"type": ["end"]})  # not a string: an internal_error, no final
        await asyncio.sleep(0.1)
        fake.end_gate.set()
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert ws.close_code == 1000
    assert [e["type"] for e in events][-1] == "transcript.final"
    assert not any(e["type"] == "error" for e in events)
    assert events[-1]["duration"] == 0.2
    assert fake.sessions[0].log.num_samples == round(0.2 * SAMPLE_RATE)
    assert fake.sessions[0].log.num_finalize == 0


async def test_refused_handshake_when_not_ready(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    client = await aiohttp_client(create_app(server_config, FakeTranscriber(start_ready=False)))
    async with client.ws_connect("/v1/live") as ws:
        await expect_error(ws, EngineUnavailable)


async def test_queue_full_on_start(client: TestClient, fake: FakeTranscriber) -> None:
    fake.open_error = QueueFull("at capacity")
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await expect_error(ws, QueueFull)


async def test_backend_error_event_is_forwarded(client: TestClient, fake: FakeTranscriber) -> None:
    """A session's own failure reaches its client (the engine's loss is survived instead:
    test_live_durable.py)."""
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(0.2))
        await asyncio.sleep(0.05)
        fake.sessions[0].fail(InternalError("a decode of this session failed"))
        await expect_error(ws, InternalError)


async def test_idle_timeout(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.2)
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await expect_error(ws, ClientTimeout)
    await wait_until(lambda: fake.sessions[0].log.aborted)


async def test_an_idle_session_with_audio_gets_its_final_before_the_timeout(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A client that streamed audio, then sent nothing for the idle timeout, got only 4408:
    the meeting's transcript was lost (a trial). The session is now ended as by `end`: the
    final first, then the client_timeout error and its close code."""
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.2)
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(1.5))
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert [e["type"] for e in events][-2:] == ["transcript.final", "error"], events
    assert events[-2]["duration"] == 1.5 and events[-2]["segments"]
    assert events[-1]["code"] == ClientTimeout.code
    assert ws.close_code == ClientTimeout.close_code
    assert fake.sessions[0].log.ended
    await wait_until(lambda: len(client.app[REGISTRY_KEY]) == 0)


async def test_a_drain_racing_the_idle_deadline_still_sends_the_final(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The idle deadline fired while a drain's `end` held the connection's lock: the idle path
    then found the session DRAINING, raised client_timeout and closed 4408 before the final (a
    review). Whoever ended the session first, the final comes."""
    slow_end = FakeSession.end

    async def end(self: FakeSession) -> None:
        await asyncio.sleep(0.4)  # the drain holds the lock across the idle deadline
        await slow_end(self)

    monkeypatch.setattr(FakeSession, "end", end)
    fake.end_gate = asyncio.Event()
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.5)
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(1.5))
        await asyncio.sleep(0.3)
        (connection,) = client.app[REGISTRY_KEY]._connections
        drain = asyncio.create_task(connection.drain())
        await asyncio.sleep(1.0)
        fake.end_gate.set()
        events = await asyncio.wait_for(receive_all(ws), 5)
        await drain
    assert events[-1]["type"] == "transcript.final", events
    assert ws.close_code == GOING_AWAY


async def test_an_idle_timeout_below_the_start_limit_is_named_as_such(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """With the idle timeout below LIVE_START_TIMEOUT_S, a socket that sends nothing is closed
    by the idle limit, and its error said "no 'start' within 10 s" (the state decided the
    message, not the limit that ran out)."""
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.2)
    async with client.ws_connect("/v1/live") as ws:
        error = await expect_error(ws, ClientTimeout)
    assert "idle timeout (0.2 s)" in error["message"]
    assert "start" not in error["message"]


async def test_keepalives_do_not_hold_a_socket_that_never_starts(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keepalives reset the idle timer, so 3,000 sockets that never sent `start` stayed open
    (a trial): `start` must come within LIVE_START_TIMEOUT_S of connecting."""
    from livemeet.gateway import ws_live

    monkeypatch.setattr(ws_live, "LIVE_START_TIMEOUT_S", 0.3)
    loop = asyncio.get_running_loop()
    async with client.ws_connect("/v1/live") as ws:
        opened = loop.time()

        error = await timeout_while_repeating(ws, lambda: ws.send_json({"type": "keepalive"}))
    assert "no 'start' within 0.3 s" in error["message"]
    assert loop.time() - opened < 2.0  # not the 60-s idle timeout


async def test_only_the_servers_own_pages_and_allowed_origins_open_sessions(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """Any web page could open a live socket to a server on the user's machine or intranet
    (no Origin check: a trial). A browser's handshake now needs the server's own origin or one
    `--allowed-origin` names; clients without an Origin header are unaffected."""
    client = await gateway_client(aiohttp_client, server_config, fake)
    own = f"http://{client.host}:{client.port}"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect("/v1/live", origin="https://evil.example")
    assert refused.value.status == 400
    body = await (await client.get("/v1/live", headers={"Origin": "https://evil.example",
        "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})).json()  # fmt: skip
    assert body["error"]["code"] == "request_rejected"
    for origin in (own, None):
        async with client.ws_connect("/v1/live", origin=origin) as ws:
            await start_session(ws)
    proxied = {"X-Forwarded-Host": "meet.example.com"}  # the page's host, behind a proxy
    async with client.ws_connect(
        "/v1/live", origin="https://meet.example.com", headers=proxied
    ) as ws:
        await start_session(ws)
    # that host without a port is its default one: a page on another port is another site
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect("/v1/live", origin="https://meet.example.com:8443", headers=proxied)
    assert refused.value.status == 400
    allowing = await gateway_client(
        aiohttp_client,
        server_config,
        fake,
        server_config.data_dir / "allowing",  # one server per data dir
        allowed_origins=("https://meet.example.com",),
    )
    async with allowing.ws_connect("/v1/live", origin="https://meet.example.com") as ws:
        await start_session(ws)


async def test_pings_do_not_keep_a_silent_session_open(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A client whose library pings (websockets pings every 20 s by default) but sends no
    message is idle: aiohttp's own receive timeout restarted at every ping, so such a
    session was never closed (found by an independent trial: still open after 100 s of a
    60-s timeout)."""
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.3)
    async with client.ws_connect("/v1/live") as ws:  # autoping: pongs are not events
        await start_session(ws)
        await ws.send_bytes(pcm16(0.2))
        error = await timeout_while_repeating(ws, ws.ping)
    assert "idle" in error["message"]
    await wait_until(lambda: fake.sessions[0].log.aborted)


async def test_no_idle_timeout_after_end(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """After `end` the client has nothing to send: a final that takes longer than the idle
    timeout (a loaded engine) still arrives, instead of the session failing with
    client_timeout and losing the meeting's last segments (as 100 sessions of 7.5 minutes did
    on an H200, docs/benchmarks.md session 15). Streaming silently still times out."""
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.2)
    fake.end_gate = asyncio.Event()
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(1.5))
        await ws.send_json({"type": "end"})
        await asyncio.sleep(1.0)  # five idle timeouts with the final held back
        assert len(client.app[REGISTRY_KEY]) == 1 and not fake.sessions[0].log.aborted
        fake.end_gate.set()
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert ws.close_code == 1000
    assert events[-1]["type"] == "transcript.final"
    assert events[-1]["segments"][-1]["end"] == 1.5


async def test_a_final_that_never_comes_ends_the_session_after_the_final_timeout(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """The wait after `end` is bounded (final_timeout_s): a client that vanished without a
    TCP close, or an engine that lost the session, cannot hold it open forever."""
    client = await gateway_client(
        aiohttp_client, server_config, fake, idle_timeout_s=0.1, final_timeout_s=0.5
    )
    fake.end_gate = asyncio.Event()  # never set
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        error = await expect_error(ws, EngineUnavailable)
    assert "final" in error["message"]
    await wait_until(lambda: fake.sessions[0].log.aborted)
    await wait_until(lambda: len(client.app[REGISTRY_KEY]) == 0)


async def test_plain_get_is_a_json_400(client: TestClient) -> None:
    resp = await client.get("/v1/live")
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == InvalidRequest.code


async def test_shutdown_closes_live_sockets(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    client = await gateway_client(aiohttp_client, server_config, fake, shutdown_live="end")
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        shutdown = asyncio.create_task(close_live_sockets(client.app))
        await expect_error(ws, EngineUnavailable)
        await shutdown
    await wait_until(lambda: fake.sessions[0].log.aborted)


async def test_shutdown_drains_a_streaming_session_to_its_final(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A server that shuts down with `--shutdown-live end` ends a live session as its client's
    `end` would: the client gets every segment of the audio it sent and `transcript.final`,
    then a 1001 close; audio it sends meanwhile is ignored, not an error (it lost the whole
    meeting's unsent finals to an immediate engine_unavailable before: found by an
    independent trial)."""
    client = await gateway_client(aiohttp_client, server_config, fake, shutdown_live="end")
    fake.end_gate = asyncio.Event()
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(2.5))
        await wait_until(lambda: fake.sessions[0].log.num_samples == 2.5 * 16000)
        shutdown = asyncio.create_task(close_live_sockets(client.app))
        await wait_until(lambda: client.app[LIFECYCLE_KEY].draining)
        await ws.send_bytes(pcm16(0.5))  # the client has not heard yet: ignored
        await ws.send_json({"type": "end"})
        fake.end_gate.set()
        events = await asyncio.wait_for(receive_all(ws), 5)
        await shutdown
    assert ws.close_code == GOING_AWAY
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 2.5
    assert events[-1]["segments"][-1]["end"] == 2.5
    assert not any(e["type"] == "error" for e in events)
    assert fake.sessions[0].log.num_samples == 2.5 * 16000


async def test_a_drain_outlives_the_idle_deadline_its_receive_was_waiting_on(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A quiet client (a muted microphone) whose idle deadline passes during the drain gets
    its final: the receive loop was waiting with the idle deadline, which then read as the
    final's and failed the session with "no final within 600 s" (a fresh-eyes review)."""
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.5)
    fake.end_gate = asyncio.Event()
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(1.0))
        await wait_until(lambda: fake.sessions[0].log.num_samples == 16000)
        await asyncio.sleep(0.2)
        drain = asyncio.create_task(client.app[REGISTRY_KEY].drain_all(timeout_s=5))
        asyncio.get_running_loop().call_later(0.6, fake.end_gate.set)  # past the idle deadline
        events = await asyncio.wait_for(receive_all(ws), 5)
        await drain
    assert events[-1]["type"] == "transcript.final" and ws.close_code == GOING_AWAY


async def test_a_drain_whose_final_is_late_ends_in_engine_unavailable(
    client: TestClient, fake: FakeTranscriber
) -> None:
    fake.end_gate = asyncio.Event()  # never set: the final does not come
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(1.0))
        await wait_until(lambda: fake.sessions[0].log.num_samples == 16000)
        drain = asyncio.create_task(client.app[REGISTRY_KEY].drain_all(timeout_s=0.3))
        error = await expect_error(ws, EngineUnavailable)
        await drain
    assert "shutting down" in error["message"]
    await wait_until(lambda: fake.sessions[0].log.aborted)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def wait_until(predicate: Any, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_vanishing_client_is_cleaned_up_while_another_streams(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """With resume off (`--live-resume-window 0`) a client that vanishes takes its session
    with it, as before resume was built: aborted, nothing leaked, the other session unharmed."""
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0)
    await asyncio.sleep(0.05)
    base_tasks, base_fds = len(asyncio.all_tasks()), open_fds()
    survivor = await client.ws_connect("/v1/live")
    await start_session(survivor)

    victim = await client.ws_connect("/v1/live")
    await start_session(victim)
    await victim.send_bytes(pcm16(1.5))
    await asyncio.sleep(0.05)
    victim._response.connection.transport.abort()  # type: ignore[union-attr]  # TCP reset
    await wait_until(lambda: fake.sessions[1].log.aborted)
    await wait_until(lambda: len(client.app[REGISTRY_KEY]) == 1)
    assert not fake.sessions[0].log.aborted

    for _ in range(8):
        await survivor.send_bytes(pcm16(0.5))
    await survivor.send_json({"type": "end"})
    events = await asyncio.wait_for(receive_all(survivor), 5)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 4.0
    assert survivor.close_code == 1000
    await survivor.close()
    await victim.close()
    await wait_until(lambda: len(client.app[REGISTRY_KEY]) == 0)
    await wait_until(lambda: len(asyncio.all_tasks()) <= base_tasks)
    await wait_until(lambda: open_fds() <= base_fds)


async def test_a_frame_of_exactly_the_limit_is_accepted(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """protocol.md: any length up to 1 MiB. aiohttp refused a message of its own max_msg_size
    (found by a trial: 1,048,576 bytes closed 1009, 1,048,574 passed)."""
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(b"\0" * MAX_FRAME_BYTES)
        await ws.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["type"] == "transcript.final"
    assert events[-1]["duration"] == MAX_FRAME_BYTES / 2 / 16000
    assert ws.close_code == 1000


@pytest.mark.parametrize("compress", [0, 15])
async def test_frame_over_the_limit_closes_1009(client: TestClient, compress: int) -> None:
    # docs/protocol.md: one of the two errors without an `error` frame (aiohttp refuses the
    # message); the session is kept (test_live_violations.py)
    async with client.ws_connect("/v1/live", compress=compress) as ws:
        await start_session(ws)
        await ws.send_bytes(b"\0" * (MAX_FRAME_BYTES + 2))
        msg = await ws.receive()
        assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
        assert ws.close_code == 1009


async def test_audio_sent_too_fast_is_read_later_and_none_is_lost(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One socket sent 1.8 h of audio in 0.8 s and held the engine (a trial). Past the burst
    the gateway reads no faster than `live_max_speed` x real time: here 0.5 s of burst, then
    3.5 s of audio at 2x take >= 1.75 s, and all 4 s reach the session."""
    from livemeet.gateway import pacing, ws_live

    class SmallBurst(pacing.AudioPacer):
        def __init__(self, start_s: float, max_speed: float) -> None:
            super().__init__(start_s, max_speed=max_speed, burst_s=0.5)

    monkeypatch.setattr(ws_live, "AudioPacer", SmallBurst)
    client = await gateway_client(aiohttp_client, server_config, fake, live_max_speed=2.0)
    loop = asyncio.get_running_loop()
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        started = loop.time()
        for _ in range(8):
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(ws), 10)
    assert loop.time() - started >= 1.7
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 4.0


def test_gateway_config_refuses_origins_that_never_match_and_unholdable_uploads() -> None:
    from livemeet.audio.constants import UPLOAD_SPILL_TOTAL_BYTES
    from livemeet.errors import ConfigError

    with pytest.raises(ConfigError, match="--allowed-origin 'meet.example.com'"):
        GatewayConfig(allowed_origins=("meet.example.com",)).validate()
    # one upload over what all spills may hold would get a retryable 429 for ever (a review)
    with pytest.raises(ConfigError, match="--max-upload-bytes"):
        GatewayConfig(max_upload_bytes=UPLOAD_SPILL_TOTAL_BYTES + 1).validate()
    GatewayConfig(allowed_origins=("https://meet.example.com", "*")).validate()


@pytest.mark.parametrize("speed", [0.5, math.nan, math.inf])
def test_live_max_speed_is_at_least_real_time(speed: float) -> None:
    from livemeet.errors import ConfigError

    with pytest.raises(ConfigError, match="--live-max-speed"):
        GatewayConfig(live_max_speed=speed).validate()


@pytest.mark.parametrize(
    "bad",
    [
        {"idle_timeout_s": 0.0},
        {"final_timeout_s": -1.0},
        # NaN passed `<= 0` and switched the upload length limit off (found by a trial)
        {"max_audio_s": math.nan},
        {"max_audio_s": math.inf},
        {"idle_timeout_s": math.nan},
        {"flush_interval_s": 0.0},
    ],
)
def test_gateway_limits_and_timeouts_must_be_positive_and_finite(bad: dict[str, float]) -> None:
    from livemeet.errors import ConfigError

    with pytest.raises(ConfigError, match="must be a positive number of seconds"):
        GatewayConfig(**bad).validate()
    GatewayConfig().validate()


async def test_unsent_partials_and_acks_are_replaced_wherever_they_wait(
    server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A client that reads slowly is sent acks and partials by turns: each was replaced only
    by one of its type right behind it, so alternating acks and partials queued without a
    bound (docs/protocol.md: its unsent partials and acks are replaced by newer ones)."""
    connection = LiveConnection(create_app(server_config, fake), web.WebSocketResponse())
    held = SimpleNamespace(num_frames_accepted=0, num_frames_durable=0)
    connection.holder = held  # type: ignore[assignment]
    final = SegmentFinal(Segment(0.0, 1.0, "S01", "f", id="seg-0000", is_final=True))
    for rev in range(1, 200):
        held.num_frames_accepted += 1600
        held.num_frames_durable = held.num_frames_accepted
        connection._send_ack()
        connection.deliver(SegmentPartial(rev, (Segment(0.0, 1.0, "S01", f"p{rev}"),)))
        if rev == 100:
            connection.deliver(final)
    frames = [frame for frame, _ in connection._outbox]
    assert [f["type"] for f in frames] == ["segment.final", "audio.ack", "segment.partial"]
    assert frames[1]["offset"] == 199 * 1600 and frames[2]["rev"] == 199
    connection._set_state(None)


async def test_unsent_renames_are_one_per_label_and_bounded(
    server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A client that sends renames and never reads (each rename is answered): its outbox
    grew by one speaker.renamed per message, without a bound (a review finding). An unsent
    one is now replaced by a newer one for its label, and past MAX_NAMED_SPEAKERS unsent
    labels a new one is dropped (the client is not reading; a resume replays the names)."""
    connection = LiveConnection(create_app(server_config, fake), web.WebSocketResponse())
    for i in range(3):
        connection.deliver(SpeakerRenamed("S01", f"name {i}"))
    for n in range(2 * MAX_NAMED_SPEAKERS):
        connection.deliver(SpeakerRenamed(f"S{100 + n}", None))
    frames = [frame for frame, _ in connection._outbox]
    assert [f["name"] for f in frames if f["speaker"] == "S01"] == ["name 2"]
    assert len(frames) == MAX_NAMED_SPEAKERS
    connection._set_state(None)
