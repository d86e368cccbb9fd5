"""What the server log says about each session's end and about a shutdown: an operator saw
nothing when a live session ended in an error, an upload was refused, or SIGTERM drained the
server (a trial), since the access log is off."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest
from aiohttp.test_utils import TestClient

from livemeet.config import ServerConfig
from livemeet.errors import InternalError
from livemeet.gateway.app import close_live_sockets
from livemeet.gateway.keys import SESSIONS_KEY
from livemeet.transcript.segments import FinishReason
from tests.gateway.conftest import ClientFactory, pcm16, wav_bytes
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_live_resume import detached_session, resume_start
from tests.gateway.test_openai_api import form
from tests.gateway.test_ws_live import gateway_client, receive_all, start_session, wait_until


def messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


async def test_a_live_session_that_ends_in_an_error_is_logged(
    client: TestClient, fake: FakeTranscriber, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "livemeet.gateway.ws_live")
    async with client.ws_connect("/v1/live") as ws:
        ready = await start_session(ws)
        await ws.send_bytes(pcm16(0.5))
        await wait_until(lambda: fake.sessions[0].log.num_samples == 8000)
        fake.sessions[0].fail(InternalError("a decode of this session failed"))
        await asyncio.wait_for(receive_all(ws), 5)
    await wait_until(lambda: bool(messages(caplog, "livemeet.gateway.ws_live")))
    (line,) = messages(caplog, "livemeet.gateway.ws_live")
    assert f"live session {ready['session_id']} ended: internal_error" in line
    assert "0.5 s of audio" in line


async def test_a_client_violation_is_logged_with_its_error_and_the_session_kept(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "livemeet.gateway.ws_live")
    async with client.ws_connect("/v1/live") as ws:
        ready = await start_session(ws)
        await ws.send_bytes(pcm16(0.5))
        await ws.send_bytes(b"\x00")  # not whole samples
        await asyncio.wait_for(receive_all(ws), 5)
    await wait_until(lambda: bool(messages(caplog, "livemeet.gateway.ws_live")))
    (line,) = messages(caplog, "livemeet.gateway.ws_live")
    assert line.startswith(
        f"live session {ready['session_id']} closed its connection for protocol_error ("
    )
    assert "after 0.5 s of audio" in line and line.endswith("kept for a resume")


async def test_a_detach_is_not_logged_as_an_end_and_the_end_counts_the_sessions_audio(
    client: TestClient, fake: FakeTranscriber, caplog: pytest.LogCaptureFixture
) -> None:
    """A trial: "live session X ended: detached, 8.0 s of audio", then, after the resume,
    "ended: completed, 14.0 s of audio" for a 30-s meeting (this socket's share)."""
    caplog.set_level(logging.INFO, "livemeet.gateway.ws_live")
    ready, _ = await detached_session(client, fake, 1.0)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        assert (await ws.receive_json())["resumed"] is True
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        await asyncio.wait_for(receive_all(ws), 5)
    await wait_until(lambda: len(messages(caplog, "livemeet.gateway.ws_live")) == 2)
    lost, ended = messages(caplog, "livemeet.gateway.ws_live")
    assert lost.startswith(f"live session {ready['session_id']} lost its connection after 1.0 s")
    assert "ended" not in lost
    assert f"live session {ready['session_id']} ended: completed, 1.5 s of audio" in ended


async def test_an_upload_is_logged_when_it_ends_and_when_it_is_refused(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "livemeet.gateway")
    assert (await client.post("/v1/audio/transcriptions", data=form(wav_bytes(2.0)))).ok
    assert (await client.post("/v1/audio/transcriptions", data=form(b"not audio"))).status == 400
    ended = messages(caplog, "livemeet.gateway.openai_api")
    assert len(ended) == 1 and "ended: completed, 2.0 s of audio" in ended[0]
    refused = messages(caplog, "livemeet.gateway.app")
    assert len(refused) == 1 and "POST /v1/audio/transcriptions: bad_audio" in refused[0]


async def test_a_shutdown_logs_its_drain(
    client: TestClient, fake: FakeTranscriber, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "livemeet.gateway.app")
    async with client.ws_connect("/v1/live") as dropped:  # its socket goes: held detached
        await start_session(dropped)
        await dropped.send_bytes(pcm16(0.5))
    await wait_until(lambda: client.app[SESSIONS_KEY].num_detached == 1)
    async with client.ws_connect("/v1/live") as ws, client.ws_connect("/v1/live") as empty:
        await start_session(ws)
        await ws.send_bytes(pcm16(0.5))
        await start_session(empty)  # no audio: the next start discards it
        await asyncio.sleep(0.05)
        shutdown = asyncio.create_task(close_live_sockets(client.app))
        await asyncio.wait_for(asyncio.gather(receive_all(ws), receive_all(empty)), 5)
        await shutdown
    lines = messages(caplog, "livemeet.gateway.app")
    # sessions, not sockets (a trial: "keeping 1 live sessions (1 detached)" with 2 kept),
    # and not one with no audio (a trial: counted, then discarded at the next start)
    assert lines[0] == (
        "shutting down: keeping 2 live sessions (1 detached) for the next start: their "
        "clients resume there; 0 ending first; 1 with no audio not kept"
    )
    assert lines[1].startswith("live sessions kept for the next start in ")


async def test_a_shutdown_with_shutdown_live_end_logs_its_drain(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = await gateway_client(aiohttp_client, server_config, fake, shutdown_live="end")
    caplog.set_level(logging.INFO, "livemeet.gateway.app")
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(0.5))
        await asyncio.sleep(0.05)
        shutdown = asyncio.create_task(close_live_sockets(client.app))
        await asyncio.wait_for(receive_all(ws), 5)
        await shutdown
    lines = messages(caplog, "livemeet.gateway.app")[-2:]  # after the start's
    assert lines[0] == "shutting down: draining 1 live sessions"
    assert lines[1].startswith("live sessions drained in ")


async def test_every_request_has_an_access_line_at_debug_only(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A request that succeeded left no line at all (the access log is off: probes would
    flood it), so `--log-level debug` could not show whether a client's GET reached the
    server; at debug each request has one line, at info none."""
    caplog.set_level(logging.INFO, "livemeet.gateway.app")
    assert (await client.get("/v1/models")).status == 200
    assert not [m for m in messages(caplog, "livemeet.gateway.app") if "/v1/models" in m]
    caplog.set_level(logging.DEBUG, "livemeet.gateway.app")
    assert (await client.get("/v1/models")).status == 200
    assert (await client.get("/v1/transcriptions/tr_nope")).status == 404
    lines = [m for m in messages(caplog, "livemeet.gateway.app") if " in " in m]
    assert lines[0].startswith("GET /v1/models: 200 in ") and "(client 127.0.0.1)" in lines[0]
    assert lines[-1].startswith("GET /v1/transcriptions/tr_nope: 404 in ")


async def test_a_request_path_cannot_forge_a_log_line(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The refused-request line logged the decoded path, so `%0A` in a URL wrote a second,
    forged line into the log (a review)."""
    caplog.set_level(logging.INFO, "livemeet.gateway")
    forged = "/v1/transcriptions/x%0A2026-12-05%2014:00:00%20INFO%20forged"
    assert (await client.get(forged)).status == 404
    lines = messages(caplog, "livemeet.gateway.app")
    assert lines and all("\n" not in line for line in lines)
    assert any("x%0A2026" in line for line in lines)


@pytest.mark.parametrize("stream", ["false", "true"])
async def test_an_upload_cut_short_is_a_warning(
    client: TestClient, fake: FakeTranscriber, caplog: pytest.LogCaptureFixture, stream: str
) -> None:
    """A decode that ran out of budget (a mis-set checkpoint writing no grammar) or was cut by
    the repetition guard answered 200 with a short or empty transcript and logged "completed"
    (a trial): the OpenAI response has no field for it, so the log says so."""
    caplog.set_level(logging.INFO, "livemeet.gateway")
    assert (await client.post("/v1/audio/transcriptions", data=form(wav_bytes(2.0)))).ok
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    fake.finish_reason = FinishReason.LENGTH
    data = form(wav_bytes(2.0), stream=stream)
    assert await (await client.post("/v1/audio/transcriptions", data=data)).read()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "cut short: finish_reason length" in warning and "of 2.0 s" in warning


async def test_the_start_says_what_it_serves_and_with_which_settings(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The start's log named the address, the data dir and the backend, not the settings a
    stop, a full disk or a refusal depend on: an operator read them off the unit file."""
    caplog.set_level(logging.INFO, "livemeet.gateway.app")
    await gateway_client(
        aiohttp_client,
        server_config,
        fake,
        shutdown_live="end",
        upload_drain_s=25.0,
        min_free_disk_mb=100.0,
        max_sessions=8,
    )
    [line] = [m for m in messages(caplog, "livemeet.gateway.app") if m.startswith("ready: ")]
    assert line.startswith("ready: serving fake backend, model fake-model, on http://")
    for setting in (
        f"--data-dir {server_config.data_dir} (",
        "--max-sessions 8,",
        "--shutdown-live end,",
        "--upload-drain-s 25,",
        "--min-free-disk-mb 100,",
        "--retention-days 0,",
        "--auth auto,",
    ):
        assert setting in line, (setting, line)


@pytest.mark.parametrize(
    ("language", "diarization", "says"),
    [
        ("english", False, "not MOSS-TD: English only, no diarization."),
        (None, True, "not MOSS-TD. Pass --model"),  # the scripted backend diarizes (a trial)
    ],
)
async def test_the_demo_banner_says_what_the_backend_lacks(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    caplog: pytest.LogCaptureFixture,
    language: str | None,
    diarization: bool,
    says: str,
) -> None:
    fake = FakeTranscriber()
    fake._info = replace(fake._info, language=language, diarization=diarization)
    caplog.set_level(logging.WARNING, "livemeet.gateway.app")
    await gateway_client(aiohttp_client, server_config, fake)
    [banner] = [m for m in messages(caplog, "livemeet.gateway.app") if "DEMO BACKEND" in m]
    assert says in banner
