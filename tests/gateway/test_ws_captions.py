"""Captions subscriptions (`GET /v1/sessions/{id}/captions`) and the live transcript resource
(`GET /v1/sessions/{id}/transcript`) over a real aiohttp server and the fake backend."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient

from livemeet.audio.constants import CAPTIONS_MAX_QUEUED_FINALS, CAPTIONS_SNAPSHOT_FINALS
from livemeet.config import ServerConfig
from livemeet.errors import NotFound, ProtocolError, QueueFull, Unauthorized
from livemeet.gateway.keys import METRICS_KEY, SESSIONS_KEY
from livemeet.transcript.segments import FinishReason
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber, fake_text
from tests.gateway.test_live_resume import (
    detach,
    on_disk,
    read_to_close,
    read_until,
    resume_start,
    vanish,
)
from tests.gateway.test_ws_live import (
    START,
    expect_error,
    gateway_client,
    receive_all,
    start_session,
    wait_until,
)

Frames = list[dict[str, Any]]
CAPTION_TYPES = ("segment.partial", "segment.final", "transcript.final")


def captions_url(ready: dict[str, Any], token: str | None = None) -> str:
    token = ready["captions_token"] if token is None else token
    return f"/v1/sessions/{ready['session_id']}/captions?token={token}"


# a 401's WWW-Authenticate for a captions token: its scheme, and where the token goes
CAPTIONS_CHALLENGE = 'CaptionsToken realm="captions", query="token"'


def transcript_url(ready: dict[str, Any], fmt: str, token: str | None = None) -> str:
    token = ready["captions_token"] if token is None else token
    return f"/v1/sessions/{ready['session_id']}/transcript?token={token}&response_format={fmt}"


async def stream(
    ws: aiohttp.ClientWebSocketResponse, fake: FakeTranscriber, seconds: float
) -> None:
    """Send `seconds` of audio in 0.5-s frames, each once the backend has the one before."""
    session = fake.sessions[-1]
    # one frame at a time, as a real-time client: a burst's events would all come at once
    for _ in range(round(seconds / 0.5)):
        expected = session.log.num_samples + 8000
        await ws.send_bytes(pcm16(0.5))
        await wait_until(lambda: session.log.num_samples == expected)  # noqa: B023


async def subscribe(client: TestClient, ready: dict[str, Any]) -> aiohttp.ClientWebSocketResponse:
    ws = await client.ws_connect(captions_url(ready))
    head = await ws.receive_json()
    assert head["type"] == "captions.ready" and head["session_id"] == ready["session_id"]
    return ws


def captions_of(events: Frames) -> Frames:
    return [e for e in events if e["type"] in CAPTION_TYPES]


def settled(events: Frames) -> Frames:
    """The finals and the final transcript: what every reader gets, however slow."""
    return [e for e in events if e["type"] in ("segment.final", "transcript.final")]


async def test_a_subscriber_offering_compression_gets_none(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A browser offers permessage-deflate; a caption frame is a few hundred bytes of JSON,
    and each subscriber's zlib state held ~0.3 MB (kept past its close until a full GC: the
    soak trial). The captions socket declines it; the live socket still takes it."""
    async with client.ws_connect("/v1/live", compress=15) as live:
        assert live.compress == 15  # negotiated: the live socket is unchanged
        ready = await start_session(live)
        ws = await client.ws_connect(captions_url(ready), compress=15)
        assert ws.compress == 0  # no extension in the upgrade's answer
        head = await ws.receive_json()
        assert head["type"] == "captions.ready"
        await ws.close()


async def test_two_subscribers_get_the_snapshot_then_the_sessions_own_events(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """Each subscriber joins mid-session: the finals so far and the current partial, then what
    the session's client gets (same frames), then a normal close after transcript.final."""
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        assert len(ready["captions_token"]) >= 40  # 32 random bytes, base64
        assert ready["captions_token"] != ready["resume_token"]
        await stream(live, fake, 4.0)  # hop 3 commits seg-0000, hop 4 is a partial
        before = await read_until(live, "segment.partial")
        while before[-1]["rev"] < 3:
            before += await read_until(live, "segment.partial")
        subscribers = [await subscribe(client, ready) for _ in range(2)]
        assert client.app[METRICS_KEY].captions_subscribers._value.get() == 2
        snapshots = []
        for ws in subscribers:
            snapshots.append([await ws.receive_json(), await ws.receive_json()])
        assert snapshots[0] == snapshots[1]
        assert [e["type"] for e in snapshots[0]] == ["segment.final", "segment.partial"]
        assert snapshots[0][0] == captions_of(before)[-2]  # seg-0000, as the client got it
        assert snapshots[0][1] == before[-1]  # the current partial
        await stream(live, fake, 2.0)  # a partial, then seg-0001
        await live.send_json({"type": "end"})
        after = await read_to_close(live)
    assert live.close_code == 1000
    for ws in subscribers:
        events = await asyncio.wait_for(receive_all(ws), 5)
        # the session's own frames, in order (a partial a reader had not read yet is replaced
        # by the next, the client's and each subscriber's by its own reading)
        assert settled(events) == settled(after)
        assert events[-1]["type"] == "transcript.final"
        revs = [e["rev"] for e in events if e["type"] == "segment.partial"]
        assert revs == sorted(set(revs)) and revs
        assert ws.close_code == 1000
    await wait_until(lambda: client.app[METRICS_KEY].captions_subscribers._value.get() == 0)


async def test_the_snapshot_holds_the_last_finals_only(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    client = await gateway_client(aiohttp_client, server_config, fake, live_hop_s=0.1)
    num_finals = CAPTIONS_SNAPSHOT_FINALS + 5  # one per 0.3 s at hops of 0.1 s
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, num_finals * 0.3)
        ws = await subscribe(client, ready)
        snapshot = [await ws.receive_json() for _ in range(CAPTIONS_SNAPSHOT_FINALS)]
        assert [e["id"] for e in snapshot] == [
            f"seg-{i:04d}" for i in range(num_finals - CAPTIONS_SNAPSHOT_FINALS, num_finals)
        ]
        await ws.close()


async def test_a_stalled_subscriber_delays_no_one_and_is_closed_once_too_far_behind(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """One subscriber's socket stops taking frames: the session's client and the other
    subscriber get every event meanwhile; the stalled one, past CAPTIONS_MAX_QUEUED_FINALS
    unsent finals, is dropped from the fan-out and closed with queue_full."""
    client = await gateway_client(aiohttp_client, server_config, fake, live_hop_s=0.1)
    num_finals = CAPTIONS_MAX_QUEUED_FINALS + 16
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        stalled = await subscribe(client, ready)
        holder = client.app[SESSIONS_KEY].get(ready["session_id"])
        assert holder is not None and len(holder.subscribers) == 1
        (server_side,) = holder.subscribers
        unstall = asyncio.Event()
        real_send = server_side.ws.send_str  # type: ignore[attr-defined]

        async def stuck_send(data: str, *args: Any, **kwargs: Any) -> None:
            await unstall.wait()  # a reader that stopped reading: TCP's buffers are full
            await real_send(data, *args, **kwargs)

        server_side.ws.send_str = stuck_send  # type: ignore[attr-defined,method-assign]
        healthy = await subscribe(client, ready)
        await stream(live, fake, num_finals * 0.3)
        await live.send_json({"type": "end"})
        events = await read_to_close(live)  # within read_to_close's 5 s, while one is stalled
    assert live.close_code == 1000
    assert len([e for e in events if e["type"] == "segment.final"]) == num_finals
    got = await asyncio.wait_for(receive_all(healthy), 5)
    assert settled(got) == settled(events) and healthy.close_code == 1000
    assert server_side.outbox.closed and len(server_side.outbox) == 1  # the error, no backlog
    unstall.set()
    error = await expect_error(stalled, QueueFull)  # one partial was in flight before it
    assert "reconnect" in error["message"]


async def test_an_unknown_session_is_not_found(client: TestClient) -> None:
    async with client.ws_connect("/v1/sessions/nope/captions?token=x") as ws:
        await expect_error(ws, NotFound)
    response = await client.get("/v1/sessions/nope/transcript?token=x")
    assert response.status == 404
    assert (await response.json())["error"]["code"] == "not_found"


async def test_a_wrong_or_missing_token_is_unauthorized(client: TestClient) -> None:
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        for url in (captions_url(ready, "wrong"), f"/v1/sessions/{ready['session_id']}/captions"):
            async with client.ws_connect(url) as ws:
                await expect_error(ws, Unauthorized)
        response = await client.get(transcript_url(ready, "json", "wrong"))
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "unauthorized"
        # RFC 9110 asks a challenge of every 401 (it had none): one for the query's token
        assert response.headers.get("WWW-Authenticate") == CAPTIONS_CHALLENGE
        # the session's resume token is not its captions token
        async with client.ws_connect(captions_url(ready, ready["resume_token"])) as ws:
            await expect_error(ws, Unauthorized)


async def test_a_subscriber_that_sends_anything_gets_a_protocol_error(client: TestClient) -> None:
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        ws = await subscribe(client, ready)
        await ws.send_json({"type": "keepalive"})
        await expect_error(ws, ProtocolError)
        await wait_until(lambda: not client.app[SESSIONS_KEY].get(ready["session_id"]).subscribers)  # type: ignore[union-attr]


async def test_captions_need_a_websocket_and_an_allowed_origin(client: TestClient) -> None:
    response = await client.get("/v1/sessions/x/captions")
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "invalid_request"
    try:
        await client.ws_connect(
            "/v1/sessions/x/captions", headers={"Origin": "https://evil.example"}
        )
    except aiohttp.WSServerHandshakeError as exc:
        assert exc.status == 400
    else:
        raise AssertionError("a foreign page's handshake was taken")


async def test_subscribers_stay_through_the_sessions_detach_and_resume(
    client: TestClient, fake: FakeTranscriber
) -> None:
    live = await client.ws_connect("/v1/live")
    ready = await start_session(live)
    await stream(live, fake, 1.0)
    await on_disk(client, ready, 16000)  # the resume sends on from there
    ws = await subscribe(client, ready)
    await detach(client, live)
    await fake.sessions[0].finalize()  # the backend commits while no socket is attached
    snapshot_and_more = await read_until(ws, "segment.final")
    assert [e["type"] for e in snapshot_and_more] == ["segment.partial", "segment.final"]
    assert snapshot_and_more[-1]["id"] == "seg-0000"
    async with client.ws_connect("/v1/live") as resumed:
        await resumed.send_json(resume_start(ready))
        again = await resumed.receive_json()
        assert again["resumed"] is True and again["captions_token"] == ready["captions_token"]
        await stream(resumed, fake, 3.0)
        await resumed.send_json({"type": "end"})
        await read_to_close(resumed)
    events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["type"] == "transcript.final" and ws.close_code == 1000
    assert events[-1]["duration"] == 4.0


async def test_a_session_dropped_without_a_final_closes_its_subscribers(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0)
    live = await client.ws_connect("/v1/live")
    ready = await start_session(live)
    await stream(live, fake, 1.0)
    ws = await subscribe(client, ready)
    vanish(live)  # resume off: the session goes with its socket
    error = await expect_error(ws, NotFound)
    assert "without a final transcript" in error["message"]
    await live.close()


async def test_a_live_transcript_echoes_the_sessions_language_as_an_upload_does(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A trial: a session started with `en-GB` said "english" (the backend's) in its
    verbose_json, where an upload with `en-GB` echoes "en-GB"."""
    fake._info = replace(fake._info, language="english")
    client = await gateway_client(aiohttp_client, server_config, fake)
    async with client.ws_connect("/v1/live") as live:
        await live.send_json({**START, "language": "en-GB"})
        ready = await live.receive_json()
        await stream(live, fake, 1.0)
        response = await client.get(transcript_url(ready, "verbose_json"))
        assert (await response.json())["language"] == "en-GB"


async def test_the_transcript_while_the_session_runs_and_after_it(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """Finals so far while it runs; the final transcript once it ended, from the session and,
    once the session is gone, from the store, also in a new app over the same data dir."""
    client = await gateway_client(aiohttp_client, server_config, fake)
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, 3.5)  # seg-0000 committed (0-3 s)
        response = await client.get(transcript_url(ready, "json"))
        assert response.status == 200
        assert response.headers["X-Livemeet-Transcript-Status"] == "running"
        assert await response.json() == {
            "text": fake_text(0),
            "usage": {"type": "duration", "seconds": 4},  # 3.5 s received, rounded up
        }
        response = await client.get(transcript_url(ready, "srt"))
        assert await response.text() == f"1\n00:00:00,000 --> 00:00:03,000\nS01: {fake_text(0)}\n"
        await live.send_json({"type": "end"})
        await read_to_close(live)
    expected_text = f"{fake_text(0)} {fake_text(1)}"  # the end committed 3-3.5 s
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)  # the session is gone
    response = await client.get(transcript_url(ready, "vtt"))
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    vtt = await response.text()
    assert vtt.startswith("WEBVTT") and f"<v S01>{fake_text(1)}" in vtt
    await client.close()  # the server stops; a new one serves the same data dir

    english = FakeTranscriber()
    english._info = replace(english._info, language="english")  # as the demo's
    again = await gateway_client(aiohttp_client, server_config, english)
    response = await again.get(transcript_url(ready, "verbose_json"))
    assert response.status == 200
    body = await response.json()
    assert body["text"] == expected_text and body["duration"] == 3.5
    assert body["language"] == "english"  # as an upload says (a trial: "unknown" live)
    assert [s["speaker"] for s in body["segments"]] == ["S01", "S01"]
    response = await again.get(transcript_url(ready, "text", "wrong"))
    assert response.status == 401
    assert response.headers.get("WWW-Authenticate") == CAPTIONS_CHALLENGE  # stored, as held
    # an upload's route does not serve a live session's stored transcript
    stored = [p.stem for p in (server_config.data_dir / "transcriptions").iterdir()]
    assert len(stored) == 1 and stored[0].startswith("ls_")
    response = await again.get(f"/v1/transcriptions/{stored[0]}")
    assert response.status == 404
    assert (
        ready["captions_token"]
        not in (server_config.data_dir / "transcriptions" / f"{stored[0]}.json").read_text()
    )


async def test_a_final_transcript_says_why_its_decode_stopped(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """X-Livemeet-Finish-Reason: the final's finish_reason, held and stored (no rendered
    format carries it; a page that lost the socket reads it here), none while running."""
    fake.finish_reason = FinishReason.LENGTH
    client = await gateway_client(aiohttp_client, server_config, fake)
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, 3.5)
        response = await client.get(transcript_url(ready, "json"))
        assert response.headers["X-Livemeet-Transcript-Status"] == "running"
        assert "X-Livemeet-Finish-Reason" not in response.headers
        await live.send_json({"type": "end"})
        final = [e for e in await read_to_close(live) if e["type"] == "transcript.final"]
    assert final[0]["finish_reason"] == "length"
    response = await client.get(transcript_url(ready, "text"))
    assert response.headers["X-Livemeet-Finish-Reason"] == "length"
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)  # now from the store
    response = await client.get(transcript_url(ready, "srt"))
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    assert response.headers["X-Livemeet-Finish-Reason"] == "length"


async def test_a_subscriber_joining_after_the_final_gets_it_then_the_close(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """The session's socket went (detached) after its end; its final is kept a window, and a
    subscriber that joins then gets the last finals, the final transcript and a normal close."""
    live = await client.ws_connect("/v1/live")
    ready = await start_session(live)
    await stream(live, fake, 3.0)
    await detach(client, live)
    await client.app[SESSIONS_KEY].get(ready["session_id"]).end(None)  # type: ignore[union-attr]
    await wait_until(lambda: client.app[SESSIONS_KEY].get(ready["session_id"]).replay.terminal)  # type: ignore[union-attr]
    async with client.ws_connect(captions_url(ready)) as ws:
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert [e["type"] for e in events] == ["captions.ready", "segment.final", "transcript.final"]
    assert ws.close_code == 1000


async def test_binary_frames_from_a_subscriber_are_refused_too(client: TestClient) -> None:
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        ws = await subscribe(client, ready)
        await ws.send_bytes(b"\x00\x01")
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert msg.type is WSMsgType.TEXT and json.loads(msg.data)["code"] == "protocol_error"
        await ws.close()


async def test_the_overlay_page_is_served_like_the_recorder(client: TestClient) -> None:
    for path, kind in (("/captions.html", "text/html"), ("/captions.js", "javascript")):
        response = await client.get(path)
        assert response.status == 200 and kind in response.headers["Content-Type"]


async def test_a_refused_session_id_cannot_forge_a_log_line(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The id comes from the URL, percent-decoded: `%0A` put a newline, and a forged line,
    into the refusal's log line (the app's request lines log the raw path for this reason)."""
    caplog.set_level(logging.INFO, logger="livemeet.gateway.ws_captions")
    async with client.ws_connect("/v1/sessions/x%0Aforged%20line/captions?token=t") as ws:
        await expect_error(ws, NotFound)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused and all("\n" not in line for line in refused)
