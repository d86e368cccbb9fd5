"""A graceful shutdown through aiohttp's own runner (what `serve` runs on SIGTERM): the
connections busy when it begins keep reading their clients (http_protocol.GatewayServer),
and the captions subscribers of sessions kept for the next start are told so at once.

aiohttp closes every connection before the app's drain, and a closed connection drops what
it receives: a trial saw an upload that was still sending its body fail after 60 s with a 408
blaming the client, and a captions subscriber hold the shutdown ~40 s with no word."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import pytest
import websockets
from aiohttp import web

from livemeet.config import ServerConfig
from livemeet.errors import EngineUnavailable, ServerRestarting
from livemeet.gateway.app import create_app
from livemeet.gateway.keys import LIFECYCLE_KEY, METRICS_KEY
from livemeet.transcriber import Event, SegmentPartial
from livemeet.transcript.segments import Segment
from tests.gateway.conftest import pcm16, wav_bytes
from tests.gateway.fakes import FakeSession, FakeTranscriber
from tests.gateway.test_expect_continue import multipart, read_response
from tests.gateway.test_ws_live import START

SHUTDOWN_TIMEOUT_S = 8.0  # aiohttp's wait for busy connections, as run_app's 60 s


@contextlib.asynccontextmanager
async def serving(
    config: ServerConfig, fake: FakeTranscriber, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S
) -> AsyncIterator[tuple[web.AppRunner, str, int]]:
    """The app on a TCP port through aiohttp's runner, as `serve` runs it."""
    runner = web.AppRunner(
        create_app(config, fake),
        handler_cancellation=True,
        shutdown_timeout=shutdown_timeout_s,
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield runner, host, port
    finally:
        await runner.cleanup()  # idempotent: a test may have shut it down


@pytest.fixture
async def served(
    server_config: ServerConfig, fake: FakeTranscriber
) -> AsyncIterator[tuple[web.AppRunner, str, int]]:
    async with serving(server_config, fake) as served:
        yield served


def _with_upload_drain(config: ServerConfig, upload_drain_s: float) -> ServerConfig:
    return replace(config, gateway=replace(config.gateway, upload_drain_s=upload_drain_s))


def _upload_form(**fields: str) -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("file", wav_bytes(1.0), filename="a.wav")
    form.add_field("model", "whisper-1")
    for name, value in fields.items():
        form.add_field(name, value)
    return form


async def _upload_in_flight(
    http: aiohttp.ClientSession, host: str, port: int, fake: FakeTranscriber
) -> asyncio.Task[aiohttp.ClientResponse]:
    """An upload posted as a task, returned once its engine session is open (in flight)."""
    upload = asyncio.create_task(
        http.post(f"http://{host}:{port}/v1/audio/transcriptions", data=_upload_form())
    )
    while not fake.sessions:
        await asyncio.sleep(0.01)
    return upload


async def test_an_upload_past_the_shutdown_timeout_does_not_hold_the_exit(
    server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """An upload whose transcript does not come within aiohttp's shutdown timeout is cut then:
    the shutdown ended only with the upload (a trial's 49-minute upload held a SIGTERM 220 s,
    its documented drain 60 s), since aiohttp reads a timeout of 0 s as none."""
    fake.end_gate = asyncio.Event()  # the transcript never comes
    # the upload drain (60 s) outlasts aiohttp's timeout: aiohttp's own cut
    async with serving(server_config, fake, shutdown_timeout_s=0.5) as (runner, host, port):
        async with aiohttp.ClientSession() as http:
            upload = await _upload_in_flight(http, host, port, fake)
            await asyncio.wait_for(runner.cleanup(), SHUTDOWN_TIMEOUT_S)
            with contextlib.suppress(aiohttp.ClientError):
                (await upload).release()
    assert fake.sessions[0].log.aborted  # its engine session freed


async def test_an_upload_past_the_upload_drain_is_answered_engine_unavailable(
    server_config: ServerConfig, fake: FakeTranscriber, caplog: pytest.LogCaptureFixture
) -> None:
    """`--upload-drain-s` bounds the uploads a shutdown waits for, and those still running
    then hear why (503 engine_unavailable, retryable, after a restart's time: Retry-After said
    1 s, and a client that obeyed it met a closed listener and spent its retries on it), not a
    dropped connection; the log says what the drain waits for and what it cut."""
    caplog.set_level(logging.INFO, "livemeet.gateway")
    fake.end_gate = asyncio.Event()
    async with serving(_with_upload_drain(server_config, 0.3), fake) as (runner, host, port):
        async with aiohttp.ClientSession() as http:
            upload = await _upload_in_flight(http, host, port, fake)
            shutdown = asyncio.create_task(runner.cleanup())
            response = await asyncio.wait_for(upload, SHUTDOWN_TIMEOUT_S)
            body = await response.json()
            await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)
    assert response.status == 503, body
    assert body["error"]["code"] == EngineUnavailable.code
    assert response.headers["Retry-After"] == "30"  # SHUTDOWN_RETRY_AFTER_S
    assert fake.sessions[0].log.aborted
    lines = [r.getMessage() for r in caplog.records]
    assert (
        "shutting down: 1 uploads in flight get up to 0.3 s to finish (--upload-drain-s)" in lines
    )
    assert any(line.startswith("shutting down: 1 uploads still running after") for line in lines)
    assert any(" ended: engine_unavailable, 1.0 s of audio" in line for line in lines)


async def test_a_streamed_upload_past_the_upload_drain_ends_with_an_error_event(
    server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """An SSE upload cut by the drain says so in its stream (its status is out already): a
    stream that just stopped read as complete to a client."""
    fake.end_gate = asyncio.Event()
    async with serving(_with_upload_drain(server_config, 0.3), fake) as (runner, host, port):
        async with aiohttp.ClientSession() as http:
            url = f"http://{host}:{port}/v1/audio/transcriptions"
            async with http.post(url, data=_upload_form(stream="true")) as response:
                shutdown = asyncio.create_task(runner.cleanup())
                raw = await asyncio.wait_for(response.read(), SHUTDOWN_TIMEOUT_S)
            await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line]
    assert response.status == 200
    assert events[-1]["error"]["code"] == EngineUnavailable.code


async def test_a_streamed_upload_whose_transcript_came_is_not_cut_after_its_done_event(
    server_config: ServerConfig, fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain cuts the wait for a transcript, not a stream whose transcript came: an
    error event after `transcript.text.done` told the client to send again an upload it had
    whole (and stored). Here the session's event stream takes a while to close after the
    final (an engine's), and the cutoff comes meanwhile."""
    events = FakeSession.events

    async def slow_to_close(session: FakeSession) -> AsyncIterator[Event]:
        try:
            async for event in events(session):
                yield event
            await asyncio.Event().wait()  # open until closed, as a backend's stream is
        finally:
            await asyncio.sleep(1.5)  # past the cutoff

    monkeypatch.setattr(FakeSession, "events", slow_to_close)
    fake.end_gate = asyncio.Event()
    async with serving(_with_upload_drain(server_config, 0.5), fake) as (runner, host, port):
        async with aiohttp.ClientSession() as http:
            url = f"http://{host}:{port}/v1/audio/transcriptions"
            async with http.post(url, data=_upload_form(stream="true")) as response:
                shutdown = asyncio.create_task(runner.cleanup())
                while not runner.app[LIFECYCLE_KEY].draining:
                    await asyncio.sleep(0.01)
                fake.end_gate.set()  # the transcript comes within the drain
                raw = await asyncio.wait_for(response.read(), SHUTDOWN_TIMEOUT_S)
            await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)
    events_sent = [json.loads(line[6:]) for line in raw.decode().splitlines() if line]
    assert events_sent[-1]["type"] == "transcript.text.done", events_sent[-1]
    assert not any("error" in event for event in events_sent)


async def test_an_upload_still_sending_its_body_is_answered(
    served: tuple[web.AppRunner, str, int],
) -> None:
    runner, host, port = served
    body = multipart(wav_bytes(1.0))
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: test\r\n"
        "Content-Type: multipart/form-data; boundary=lm-test-boundary\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body[:1000])
    await writer.drain()
    await asyncio.sleep(0.2)  # the handler is reading the body
    shutdown = asyncio.create_task(runner.cleanup())
    await asyncio.sleep(0.3)  # the listener is closed, the drain under way
    writer.write(body[1000:])
    await writer.drain()
    status, _, answer = await asyncio.wait_for(read_response(reader), 5)
    writer.close()
    assert status == 200, answer
    assert json.loads(answer)["text"]
    started = time.monotonic()
    await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)
    assert time.monotonic() - started < 2.0  # nothing left to wait for


async def test_a_keep_alive_connection_idle_at_the_stop_is_closed_not_left_deaf(
    server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A connection idle between requests when a stop begins (a browser's keep-alive, an
    overlay's transcript poll) is closed then: aiohttp's close left it open and deaf, so a
    request sent on it during the drain (a transcript, a captions upgrade) was never answered
    and its connection closed only once the drain was over (up to --upload-drain-s; a trial
    waited 5 s of a 6-s drain). Here an upload holds the drain open."""
    fake.end_gate = asyncio.Event()  # the upload's transcript never comes: it holds the drain
    async with serving(_with_upload_drain(server_config, 3.0), fake) as (runner, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers.get("connection") != "close"  # kept alive, now idle
        async with aiohttp.ClientSession() as http:
            upload = await _upload_in_flight(http, host, port, fake)
            shutdown = asyncio.create_task(runner.cleanup())
            while not runner.app[LIFECYCLE_KEY].draining:
                await asyncio.sleep(0.01)
            with contextlib.suppress(ConnectionError):
                writer.write(
                    b"GET /v1/sessions/s-1/transcript?token=t HTTP/1.1\r\nHost: test\r\n\r\n"
                )
                await writer.drain()
            with contextlib.suppress(ConnectionError):
                answer = await asyncio.wait_for(reader.read(), SHUTDOWN_TIMEOUT_S)
                assert answer == b""  # closed, with no response
            # closed while the drain still waits for the upload, not after it
            assert not upload.done() and not shutdown.done()
            writer.close()
            (await asyncio.wait_for(upload, SHUTDOWN_TIMEOUT_S)).release()
            await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)


async def test_a_request_taken_from_aiohttps_queue_as_the_stop_begins_is_answered(
    server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A request aiohttp has taken from its queue, its handler's task not started yet (one loop
    iteration: no eager tasks before Python 3.12), is no idle connection's: the stop's close of
    idle connections (`pre_shutdown`) dropped it unanswered, where one still queued, or busy,
    was answered. The stop's close now tells a connection waiting for a request from one with
    a request read."""
    async with serving(server_config, fake) as (runner, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        await writer.drain()
        if not await _taken_not_started(runner.server):
            pytest.skip("this Python starts a request's task at once: no such iteration")
        runner.server.pre_shutdown()
        status, _, _ = await read_response(reader)  # before, the connection closed bare
        assert status == 200
        assert await asyncio.wait_for(reader.read(), SHUTDOWN_TIMEOUT_S) == b""  # then closed
        writer.close()


async def _taken_not_started(server: web.Server) -> bool:
    """Wait, a loop iteration at a time, until the one connection of `server` has taken its
    first request from aiohttp's queue and not yet started its handler (aiohttp's own state);
    False if that is never seen."""
    for _ in range(1000):
        await asyncio.sleep(0)
        for conn in server._connections:
            read = conn._request_count == 1 and not conn._messages
            if read and conn._waiter is None and not conn._request_in_progress:
                return True
    return False


async def test_a_drained_live_session_is_logged_and_counted_though_its_client_hangs_up(
    server_config: ServerConfig,
    fake: FakeTranscriber,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--shutdown-live end`: a drained session's client read its final and the 1001 close
    and hung up, which cancels the handler (aiohttp's handler_cancellation) where its
    cleanup still waited (a trial: the drain's wait for the session's pump), so its "ended"
    line was lost ("request cancelled: GET /v1/live" instead) and its counters and gauges
    left as they were. Here the engine's abort takes a moment."""
    caplog.set_level(logging.INFO, "livemeet.gateway")
    abort = FakeSession.abort

    async def slow_abort(session: FakeSession) -> None:
        await asyncio.sleep(0.3)
        await abort(session)

    monkeypatch.setattr(FakeSession, "abort", slow_abort)
    config = replace(server_config, gateway=replace(server_config.gateway, shutdown_live="end"))
    async with serving(config, fake) as (runner, host, port):
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"ws://{host}:{port}/v1/live") as ws:
                await ws.send_json(START)
                ready = await ws.receive_json()
                await ws.send_bytes(pcm16(1.0))
                while not fake.sessions or fake.sessions[0].log.num_samples < 16_000:
                    await asyncio.sleep(0.01)
                shutdown = asyncio.create_task(runner.cleanup())
                events = [json.loads(m.data) async for m in ws]  # aiohttp hangs up on the close
            await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)
        registry = runner.app[METRICS_KEY].registry
    assert events[-1]["type"] == "transcript.final" and ws.close_code == 1001
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"live session {ready['session_id']} ended: completed" in m for m in lines), lines
    ended = {"kind": "live", "outcome": "completed"}
    assert registry.get_sample_value("livemeet_sessions_ended_total", ended) == 1
    for state in ("connecting", "streaming", "ending"):
        assert registry.get_sample_value("livemeet_sessions", {"kind": "live", "state": state}) == 0
    assert fake.sessions[0].log.aborted


async def test_a_captions_subscriber_hears_of_the_restart_at_once(
    served: tuple[web.AppRunner, str, int],
) -> None:
    runner, host, port = served
    base = f"http://{host}:{port}"
    async with aiohttp.ClientSession() as http:
        live = await http.ws_connect(f"{base}/v1/live")
        await live.send_json(START)
        ready = await live.receive_json()
        await live.send_bytes(pcm16(1.0))
        # the websockets library, as an overlay's browser does, answers the close and waits
        # for the server to drop the connection (aiohttp's client drops it itself)
        url = f"ws://{host}:{port}/v1/sessions/{ready['session_id']}/captions"
        url += f"?token={ready['captions_token']}"
        async with websockets.connect(url) as captions:
            assert json.loads(await captions.recv())["type"] == "captions.ready"
            started = time.monotonic()
            shutdown = asyncio.create_task(runner.cleanup())
            events = []
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    events.append(json.loads(await captions.recv()))
            await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)
            took_s = time.monotonic() - started
        await live.close()
    assert events[-1]["type"] == "error" and events[-1]["code"] == ServerRestarting.code
    assert captions.close_code == ServerRestarting.close_code
    # not held by the subscriber's socket: its close reply is read (aiohttp's close waited
    # 10 s for a reply the closed connection dropped; a trial)
    assert took_s < 3.0, took_s


async def _stalled_subscriber(host: str, port: int, path: str) -> asyncio.StreamWriter:
    """A captions subscriber that never reads (an overlay whose machine froze or lost its
    network): a small receive buffer, and a reader that stops taking bytes at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    await writer.drain()
    assert b" 101 " in await reader.readuntil(b"\r\n\r\n")
    return writer


@pytest.mark.parametrize("shutdown_live", ["keep", "end"])
async def test_a_captions_subscriber_that_stopped_reading_does_not_hold_the_stop(
    server_config: ServerConfig, fake: FakeTranscriber, shutdown_live: str
) -> None:
    """An overlay that stopped reading, its socket full, held a restart until aiohttp's
    heartbeat dropped it (a probe: 42 s, where a stop keeping the sessions takes 0.1 s): its
    sender waited on the full socket, then its close on a reply that never came (10 s). Live
    sockets that stopped reading get LIVE_DRAIN_CLOSE_S (2 s); a subscriber now does too."""
    config = replace(
        server_config, gateway=replace(server_config.gateway, shutdown_live=shutdown_live)
    )
    async with serving(config, fake, shutdown_timeout_s=60.0) as (runner, host, port):
        async with aiohttp.ClientSession() as http:
            live = await http.ws_connect(f"http://{host}:{port}/v1/live")
            await live.send_json(START)
            ready = await live.receive_json()
            await live.send_bytes(pcm16(1.0))
            path = f"/v1/sessions/{ready['session_id']}/captions?token={ready['captions_token']}"
            stalled = await _stalled_subscriber(host, port, path)
            while not fake.sessions or fake.sessions[0].log.num_samples < 16_000:
                await asyncio.sleep(0.01)
            session = fake.sessions[0]
            for rev in range(1, 41):  # 40 partials of 60 KB: more than the sockets hold
                tail = Segment(0.0, 1.0, "S01", f"{rev} " + "x" * 60_000)
                session._emit(SegmentPartial(rev, (tail,)))
                await asyncio.sleep(0.005)
            async for msg in live:  # the client reads on: only the subscriber is stalled
                segments = json.loads(msg.data).get("segments") or [{"text": ""}]
                if segments[0]["text"].startswith("40 "):
                    break
            shutdown = asyncio.create_task(runner.cleanup())
            events = [json.loads(m.data) async for m in live]
            # bounded by the drain's close (2 s), not by the heartbeat (30 s and more)
            await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)
            stalled.close()
    last = ServerRestarting.code if shutdown_live == "keep" else "transcript.final"
    assert last in (events[-1].get("code"), events[-1]["type"]), events[-1]


async def test_a_kept_sessions_subscriber_is_not_held_by_an_ending_session(
    served: tuple[web.AppRunner, str, int], fake: FakeTranscriber
) -> None:
    """One session streaming (kept for the next start) and one that ended and waits for its
    final: the first's overlay hears `server_restarting` at once, not after the other's final
    (a trial: 2 s late, up to the drain's 20 s with a slow final)."""
    runner, host, port = served
    base = f"http://{host}:{port}"
    fake.end_gate = asyncio.Event()  # the ended session's final waits for the test
    async with aiohttp.ClientSession() as http:
        kept = await http.ws_connect(f"{base}/v1/live")
        await kept.send_json(START)
        ready = await kept.receive_json()
        await kept.send_bytes(pcm16(1.0))
        ending = await http.ws_connect(f"{base}/v1/live")
        await ending.send_json(START)
        await ending.receive_json()
        await ending.send_bytes(pcm16(1.0))
        await ending.send_json({"type": "end"})
        url = f"ws://{host}:{port}/v1/sessions/{ready['session_id']}/captions"
        url += f"?token={ready['captions_token']}"
        async with websockets.connect(url) as captions:
            assert json.loads(await captions.recv())["type"] == "captions.ready"
            shutdown = asyncio.create_task(runner.cleanup())
            events = []
            # within 2 s, while the ending session's final is still held
            with contextlib.suppress(websockets.ConnectionClosed, TimeoutError):
                while True:
                    events.append(json.loads(await asyncio.wait_for(captions.recv(), 2.0)))
            fake.end_gate.set()
            await asyncio.wait_for(shutdown, SHUTDOWN_TIMEOUT_S)
        await kept.close()
        await ending.close()
    assert events and events[-1]["code"] == ServerRestarting.code
