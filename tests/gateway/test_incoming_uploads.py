"""Uploads in flight before the engine (livemeet/gateway/incoming.py): the count the engine's
upload hold waits for. It must never leak (every path out of the handler releases it), must
drop before the upload's `end()` (so the engine does not wait for an upload it already has),
and must reach the engine worker in order with the session commands."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from livemeet.backends import BACKENDS
from livemeet.config import ModelConfig, ServerConfig
from livemeet.engine.messages import EndSession, IncomingUploads, OpenSession
from livemeet.errors import (
    BadAudio,
    EngineUnavailable,
    LivemeetError,
    PayloadTooLarge,
    QueueFull,
    TooLong,
)
from livemeet.gateway.app import create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.incoming import IncomingUploadCounter
from livemeet.gateway.keys import LIFECYCLE_KEY, METRICS_KEY
from livemeet.transcriber import SessionOptions, TranscriptFinal
from tests.engine.fakes import RecordingCore
from tests.gateway.conftest import MAX_AUDIO_S, MAX_UPLOAD_BYTES, ClientFactory, wav_bytes
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_openai_api import form

URL = "/v1/audio/transcriptions"


def incoming(client: TestClient) -> IncomingUploadCounter:
    return client.app[LIFECYCLE_KEY].incoming_uploads


async def gauge(client: TestClient) -> float:
    text = await (await client.get("/metrics")).text()
    (line,) = [x for x in text.splitlines() if x.startswith("livemeet_uploads_incoming ")]
    return float(line.split()[1])


async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def assert_released(client: TestClient, fake: FakeTranscriber) -> None:
    """Back to zero everywhere: the counter, the /metrics gauge and the transcriber."""
    assert incoming(client).count == 0
    assert await gauge(client) == 0.0
    assert fake.incoming_uploads == 0


def test_counter_acquire_release_pairs() -> None:
    seen: list[int] = []
    counter = IncomingUploadCounter(seen.append)
    with counter.track() as a, counter.track() as b:
        assert counter.count == 2
        a.release()
        a.release()  # idempotent: counted once, released once
        assert counter.count == 1
    assert counter.count == 0 and seen == [1, 2, 1, 0]
    with pytest.raises(RuntimeError), counter.track():
        raise RuntimeError("the handler failed")
    assert counter.count == 0 and b is not a


def test_a_failing_listener_does_not_leak_the_count() -> None:
    def broken(count: int) -> None:
        raise RuntimeError("listener")

    counter = IncomingUploadCounter(broken)
    with pytest.raises(RuntimeError), counter.track():
        pass
    assert counter.count == 0


async def test_an_upload_counts_until_its_engine_session_is_open(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """From its session's open on, the backend counts the upload itself (MossCore's unqueued
    uploads): the gateway's count drops then, so it is never counted on both sides."""
    assert await gauge(client) == 0.0  # exported before the first upload
    resp = await client.post(URL, data=form(wav_bytes(3.0)))
    assert resp.status == 200, await resp.text()
    log = fake.sessions[0].log
    assert log.incoming_at_append == [0]  # released once its session was open
    assert log.incoming_at_end == 0
    assert fake.incoming_counts == [1, 0]
    await assert_released(client, fake)


@pytest.mark.parametrize(
    ("audio", "error"),
    [
        (b"this is not audio at all" * 100, BadAudio),
        (wav_bytes(0.0), BadAudio),  # decodes to no samples
        (bytes(MAX_UPLOAD_BYTES + 1), PayloadTooLarge),  # from Content-Length, before reading
        (wav_bytes(MAX_AUDIO_S + 1, rate=8000), TooLong),  # from the probe, before decoding
    ],
)
async def test_failed_uploads_release_the_count(
    client: TestClient, fake: FakeTranscriber, audio: bytes, error: type[LivemeetError]
) -> None:
    resp = await client.post(URL, data=form(audio))
    assert resp.status == error.http_status
    assert (await resp.json())["error"]["code"] == error.code
    assert fake.sessions == []
    assert fake.incoming_counts == [1, 0]
    await assert_released(client, fake)


async def test_engine_failures_release_the_count(client: TestClient, fake: FakeTranscriber) -> None:
    fake.open_error = QueueFull("full")
    resp = await client.post(URL, data=form(wav_bytes(1.0)))
    assert resp.status == QueueFull.http_status
    await assert_released(client, fake)
    fake.open_error = None
    fake.end_gate = asyncio.Event()  # the transcript never comes: fail the session instead
    task = asyncio.create_task(client.post(URL, data=form(wav_bytes(1.0))))
    assert fake.sessions == []  # the failed open made none
    await until(lambda: len(fake.sessions) == 1 and fake.sessions[0].log.ended)
    assert incoming(client).count == 0  # released once the engine had the audio
    fake.sessions[0].fail(EngineUnavailable("the engine died"))
    resp = await task
    assert resp.status == EngineUnavailable.http_status
    await assert_released(client, fake)


async def test_oversized_streaming_upload_releases_the_count(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """No Content-Length: the limit cuts the body while it streams in."""

    async def body():  # type: ignore[no-untyped-def]
        yield b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        for _ in range(4 * MAX_UPLOAD_BYTES // (1 << 16)):
            yield bytes(1 << 16)
        yield b"\r\n--xyz--\r\n"

    headers = {"Content-Type": "multipart/form-data; boundary=xyz"}
    try:
        resp = await client.post(URL, data=body(), headers=headers)
        assert resp.status == 413
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
        pass  # the server may cut the connection before the client reads the 413
    await until(lambda: incoming(client).count == 0)
    await assert_released(client, fake)


async def raw_upload_start(client: TestClient, audio: bytes, sent: int) -> asyncio.StreamWriter:
    """Open a connection and send the head of a multipart upload of `audio` and `sent` bytes
    of it; the caller disconnects by closing the returned writer."""
    head = b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    tail = b"\r\n--xyz--\r\n"
    _, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(
        b"POST " + URL.encode() + b" HTTP/1.1\r\nHost: test\r\n"
        b"Content-Type: multipart/form-data; boundary=xyz\r\n"
        b"Content-Length: " + str(len(head) + len(audio) + len(tail)).encode() + b"\r\n\r\n"
    )
    writer.write(head + audio[:sent])
    if sent >= len(audio):
        writer.write(tail)
    await writer.drain()
    return writer


def requests_with(client: TestClient, status: str) -> float:
    registry = client.app[METRICS_KEY].registry
    value = registry.get_sample_value(
        "livemeet_requests_total", {"endpoint": "transcriptions", "status": status}
    )
    return value or 0.0


async def test_a_client_that_disconnects_mid_upload_releases_the_count(
    client: TestClient, fake: FakeTranscriber, caplog: pytest.LogCaptureFixture
) -> None:
    """...and is no server error: counted as 499 (client closed request), no internal_error,
    no traceback in the log."""
    audio = wav_bytes(5.0)
    writer = await raw_upload_start(client, audio, sent=len(audio) // 2)
    await until(lambda: incoming(client).count == 1)  # receiving counts
    writer.close()
    await until(lambda: incoming(client).count == 0)
    assert fake.sessions == []
    await assert_released(client, fake)
    await until(lambda: requests_with(client, "499") == 1.0)
    assert requests_with(client, "500") == 0.0
    errors = client.app[METRICS_KEY].registry.get_sample_value(
        "livemeet_errors_total", {"code": "internal_error"}
    )
    assert not errors
    assert "unhandled error" not in caplog.text


async def test_a_stalled_upload_times_out_and_releases_the_count(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A client that stops sending its body mid-way gets 408 client_timeout after the idle
    timeout: it must not count as incoming (which holds every other upload) for ever."""
    config = replace(server_config, gateway=replace(server_config.gateway, idle_timeout_s=0.3))
    client = await aiohttp_client(create_app(config, fake))
    audio = wav_bytes(5.0)
    writer = await raw_upload_start(client, audio, sent=len(audio) // 2)
    await until(lambda: incoming(client).count == 1)
    await until(lambda: incoming(client).count == 0, timeout_s=5.0)
    writer.close()
    await assert_released(client, fake)
    await until(lambda: requests_with(client, "408") == 1.0)
    assert list((config.data_dir / "tmp").iterdir()) == []


async def test_uploads_waiting_for_a_decode_slot_count(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """Uploads queued behind busy decode slots are on their way to the engine too, and one
    whose client gives up while it waits is released as well."""
    slots = client.app[LIFECYCLE_KEY].decode_slots
    held = 0
    while not slots.locked():
        await slots.acquire()
        held += 1
    audio = wav_bytes(1.0)
    posts = [asyncio.create_task(client.post(URL, data=form(audio))) for _ in range(3)]
    writer = await raw_upload_start(client, audio, sent=len(audio))  # whole body, then gone
    await until(lambda: incoming(client).count == 4)
    assert await gauge(client) == 4.0
    writer.close()
    for _ in range(held):
        slots.release()
    assert [r.status for r in await asyncio.gather(*posts)] == [200] * 3
    await until(lambda: incoming(client).count == 0)
    await assert_released(client, fake)


# -- through the engine client to a worker -----------------------------------------------------


async def test_the_count_reaches_the_worker_before_each_upload_command(
    aiohttp_client: ClientFactory, server_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = RecordingCore()
    monkeypatch.setitem(BACKENDS, "recording", lambda config: core)
    engine = EngineClient(ModelConfig(backend="recording"), in_process=True)
    client = await aiohttp_client(create_app(server_config, engine))
    resp = await client.post(URL, data=form(wav_bytes(2.0)))
    assert resp.status == 200, await resp.text()
    names = [(name, value if name == "incoming" else "") for name, value in core.calls]
    # open, then the lower count ahead of the append: the core counts its open session itself
    assert names == [("incoming", 1), ("open", ""), ("incoming", 0), ("append", ""), ("end", "")]


async def test_engine_client_coalesces_counts_and_sends_them_ahead_of_commands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = RecordingCore()
    monkeypatch.setitem(BACKENDS, "recording", lambda config: core)
    engine = EngineClient(ModelConfig(backend="recording"), in_process=True)
    engine.set_incoming_uploads(9)  # before start: nothing to send it to, and no error
    await engine.start()
    sent: list[object] = []
    put = engine._inbox.put_nowait
    monkeypatch.setattr(engine._inbox, "put_nowait", lambda m: (sent.append(m), put(m)))
    try:
        for count in (1, 2, 3):
            engine.set_incoming_uploads(count)
        await asyncio.sleep(0)  # the loop iteration that flushes
        await asyncio.sleep(0)
        assert sent == [IncomingUploads(3)]  # one message for three changes
        engine.set_incoming_uploads(2)
        session = await engine.open_session(SessionOptions(live=False))  # flushes first
        assert sent[1] == IncomingUploads(2) and isinstance(sent[2], OpenSession)
        engine.set_incoming_uploads(3)
        engine.set_incoming_uploads(2)  # back where the worker is: nothing to send
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(sent) == 3
        engine.set_incoming_uploads(0)
        await session.end()
        assert sent[3] == IncomingUploads(0) and isinstance(sent[4], EndSession)
        await until(lambda: any(isinstance(e, TranscriptFinal) for e in session._buffer))
    finally:
        await engine.close()
    engine.set_incoming_uploads(5)  # after close: ignored
    await asyncio.sleep(0)
    assert core.calls[0] == ("incoming", 3)


def test_a_count_change_after_the_loop_closed_does_not_raise() -> None:
    """A handler's release can run during late shutdown, after the event loop closed; the
    count is a hint, so it is dropped rather than raising from the release (regression)."""
    engine = EngineClient(ModelConfig(backend="scripted"), in_process=True)
    loop = asyncio.new_event_loop()
    loop.close()
    engine._loop = loop
    engine.set_incoming_uploads(1)  # call_soon on a closed loop raised RuntimeError
    assert engine._incoming_uploads == 1
