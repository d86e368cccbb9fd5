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
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import websockets
from aiohttp import web

from livemeet.config import ServerConfig
from livemeet.errors import ServerRestarting
from livemeet.gateway.app import create_app
from tests.gateway.conftest import pcm16, wav_bytes
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_expect_continue import multipart, read_response
from tests.gateway.test_ws_live import START

SHUTDOWN_TIMEOUT_S = 8.0  # aiohttp's wait for busy connections, as run_app's 60 s


@pytest.fixture
async def served(
    server_config: ServerConfig, fake: FakeTranscriber
) -> AsyncIterator[tuple[web.AppRunner, str, int]]:
    runner = web.AppRunner(
        create_app(server_config, fake),
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield runner, host, port
    finally:
        await runner.cleanup()  # idempotent: a test may have shut it down


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
