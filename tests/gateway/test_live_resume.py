"""Live session resume (docs/protocol.md, "Resume") over a real aiohttp server and the fake
backend: detach on an abrupt disconnect, replay, acks, tokens, expiry, takeover, drain."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import ClientConnectionResetError, WSMsgType, web
from aiohttp.test_utils import TestClient

from livemeet.audio.constants import ACK_INTERVAL_S, LIVE_RESUME_WINDOW_S
from livemeet.config import ServerConfig
from livemeet.errors import (
    ConfigError,
    InvalidRequest,
    NotFound,
    SessionTakenOver,
    Unauthorized,
)
from livemeet.gateway.app import close_live_sockets, create_app
from livemeet.gateway.keys import METRICS_KEY, REGISTRY_KEY, SESSIONS_KEY
from livemeet.gateway.live_replay import ReplayState
from livemeet.transcriber import SegmentFinal, SegmentPartial, TranscriptFinal
from livemeet.transcript.segments import FinishReason, Segment
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_ws_live import (
    START,
    expect_error,
    gateway_client,
    receive_all,
    wait_until,
)

Frames = list[dict[str, Any]]


def resume_start(ready: dict[str, Any], **fields: Any) -> dict[str, Any]:
    resume = {"session_id": ready["session_id"], "resume_token": ready["resume_token"]}
    return {**START, "resume": resume, **fields}


def vanish(ws: aiohttp.ClientWebSocketResponse) -> None:
    """A network blip: the TCP connection is reset, no close handshake."""
    ws._response.connection.transport.abort()  # type: ignore[union-attr]


async def detach(client: TestClient, ws: aiohttp.ClientWebSocketResponse) -> None:
    """The client's connection dies (`vanish`); once the server holds its session detached
    (the only one), the client's side is closed too."""
    vanish(ws)
    await wait_until(lambda: client.app[SESSIONS_KEY].num_detached == 1)
    await ws.close()


async def read_until(ws: aiohttp.ClientWebSocketResponse, kind: str) -> Frames:
    """Events up to and including the first of type `kind`."""
    events: Frames = []
    while not events or events[-1]["type"] != kind:
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert msg.type is WSMsgType.TEXT, msg
        events.append(json.loads(msg.data))
    return events


async def read_to_close(ws: aiohttp.ClientWebSocketResponse) -> Frames:
    # one wait around the whole read: a receive() of the close inside wait_for's own task
    # leaves aiohttp's client close_code at 1006
    return await asyncio.wait_for(receive_all(ws), 5)


def of_type(events: Frames, kind: str) -> Frames:
    return [e for e in events if e["type"] == kind]


def metric(client: TestClient, name: str, **labels: str) -> float:
    value = client.app[METRICS_KEY].registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def on_disk(client: TestClient, ready: dict[str, Any], frames: int) -> None:
    """Until the journal holds `frames` sample frames of the session `ready` names: a resume's
    `offset` counts only those (a client resending from it would send the rest again)."""
    holder = client.app[SESSIONS_KEY].get(ready["session_id"])
    assert holder is not None
    await wait_until(lambda: holder.num_frames_durable == frames)


async def detached_session(
    client: TestClient, fake: FakeTranscriber, seconds: float
) -> tuple[dict[str, Any], Frames]:
    """A session that streamed `seconds` of 16-kHz audio in 0.5-s frames, then lost its
    socket: its `session.ready` and what the client had received by then."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    for _ in range(round(seconds / 0.5)):
        await ws.send_bytes(pcm16(0.5))
    frames = round(seconds * 16000)
    await wait_until(lambda: fake.sessions[-1].log.num_samples == frames)
    seen = await read_until(ws, "audio.ack")  # the whole second's events precede its ack
    while seen[-1]["offset"] < frames:
        seen += await read_until(ws, "audio.ack")
    await detach(client, ws)
    return ready, seen


async def test_a_resume_after_an_abrupt_disconnect_loses_nothing(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """The socket dies mid-meeting; the backend keeps the session (and commits while no
    socket is attached); the client resumes, is told what the session holds, gets every
    final once, sends the rest from that offset, and the final covers all audio."""
    ready, seen = await detached_session(client, fake, 3.5)  # committed up to 3 s
    assert not fake.sessions[0].log.aborted and not fake.sessions[0].log.ended
    await fake.sessions[0].finalize()  # the backend commits 3-3.5 s while detached
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        resumed = await ws.receive_json()
        assert resumed["type"] == "session.ready" and resumed["resumed"] is True
        assert resumed["session_id"] == ready["session_id"]
        assert resumed["offset"] == 3.5 * 16000  # every frame sent before the blip
        for _ in range(4):  # 2 s more, from the offset
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert ws.close_code == 1000
    final = events[-1]
    assert final["type"] == "transcript.final" and final["duration"] == 5.5
    assert fake.sessions[0].log.num_samples == 5.5 * 16000  # none lost, none twice
    ids = [e["id"] for e in of_type(events, "segment.final")]
    assert ids == [s["id"] for s in final["segments"]]  # replay + live: each final once
    assert len(ids) >= 3  # before the blip, while detached, after the resume
    before = {e["id"] for e in of_type(seen, "segment.final")}
    assert before and before < set(ids)  # the client dedupes these by id
    assert metric(client, "livemeet_live_resumes_total", result="resumed") == 1
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    assert fake.sessions[0].log.aborted  # freed once its final went out


async def test_the_replay_ends_with_the_current_partial(
    client: TestClient, fake: FakeTranscriber
) -> None:
    ready, _ = await detached_session(client, fake, 4.0)  # hop 3 commits, hop 4: a partial
    partials = [e for e in fake.sessions[0].log.events if type(e).__name__ == "SegmentPartial"]
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        replay = await read_until(ws, "segment.partial")
        assert [e["type"] for e in replay] == ["session.ready", "segment.final", "segment.partial"]
        assert replay[-1]["rev"] == partials[-1].rev


async def test_acks_are_coalesced_monotone_within_what_was_sent_and_last_before_the_final(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """`audio.ack` counts sample frames at the client's rate (48 kHz stereo here): at most
    one per ACK_INTERVAL_S, never above what was sent, never down, and one with everything
    right before `transcript.final`."""
    sent = 0
    acks: list[tuple[int, int]] = []  # (offset, frames sent when it came)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json({**START, "sample_rate": 48000, "channels": 2})
        assert (await ws.receive_json())["offset"] == 0
        events: Frames = []

        async def reader() -> None:
            async for msg in ws:
                events.append(json.loads(msg.data))
                if events[-1]["type"] == "audio.ack":
                    acks.append((events[-1]["offset"], sent))

        reading = asyncio.create_task(reader())
        loop = asyncio.get_running_loop()
        began = loop.time()
        for _ in range(12):  # 0.6 s of audio over ~0.5 s
            await ws.send_bytes(pcm16(0.05, 48000, 2))
            sent += 2400
            await asyncio.sleep(0.04)
        sending_s = loop.time() - began
        await ws.send_json({"type": "end"})
        await asyncio.wait_for(reading, 5)
    offsets = [offset for offset, _ in acks]
    assert offsets == sorted(set(offsets))  # increasing
    assert all(offset <= sent_then for offset, sent_then in acks)
    # one ack per ACK_INTERVAL_S while audio comes, plus the last: not one per frame
    assert 1 <= len(acks) <= sending_s / ACK_INTERVAL_S + 2 < 12
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "transcript.final" and "audio.ack" in kinds
    last_ack = max(i for i, kind in enumerate(kinds) if kind == "audio.ack")
    assert events[last_ack]["offset"] == sent == 12 * 2400  # all of it, before the final


async def test_a_wrong_token_is_unauthorized_and_leaves_the_session_resumable(
    client: TestClient, fake: FakeTranscriber
) -> None:
    ready, _ = await detached_session(client, fake, 1.0)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start({**ready, "resume_token": ready["resume_token"][:-1]}))
        await expect_error(ws, Unauthorized)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        assert (await ws.receive_json())["resumed"] is True
    assert metric(client, "livemeet_live_resumes_total", result="unauthorized") == 1


async def test_an_unknown_session_is_not_found(client: TestClient) -> None:
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start({"session_id": "nope", "resume_token": "x" * 43}))
        error = await expect_error(ws, NotFound)
    assert "nope" in error["message"]


async def test_a_resume_must_declare_the_same_audio_format(
    client: TestClient, fake: FakeTranscriber
) -> None:
    ready, _ = await detached_session(client, fake, 1.0)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready, sample_rate=48000))
        error = await expect_error(ws, InvalidRequest)
    assert "sample_rate 48000" in error["message"]
    assert client.app[SESSIONS_KEY].num_detached == 1  # still there for a right resume


async def test_a_session_not_resumed_in_time_is_ended_freed_and_then_not_found(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="livemeet.gateway.live_sessions")
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0.2)
    base_tasks = len(asyncio.all_tasks())
    ready, _ = await detached_session(client, fake, 1.0)
    await wait_until(lambda: fake.sessions[0].log.ended)  # ended as by `end`: a final
    final = fake.sessions[0].log.events[-1]
    assert type(final).__name__ == "TranscriptFinal"
    await wait_until(lambda: fake.sessions[0].log.aborted)  # dropped a window after the final
    assert len(client.app[SESSIONS_KEY]) == 0
    assert metric(client, "livemeet_live_resume_expiries_total") == 1
    assert "fake-0 not resumed within 0.2 s: ended as by its client's end" in caplog.text
    assert "fake-0 dropped while detached: its final was kept" in caplog.text
    await wait_until(lambda: len(asyncio.all_tasks()) <= base_tasks)  # no timer task left
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        await expect_error(ws, NotFound)


async def test_a_session_that_expired_while_detached_resumes_to_its_final(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """The window ran out, the session was ended; a resume within the window after its final
    gets the finals and `transcript.final`, then the normal close. The window is 1 s: at 0.3 s
    a loaded CI machine's resume came after the final's window and got 4404."""
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=1.0)
    ready, _ = await detached_session(client, fake, 1.5)
    await wait_until(lambda: fake.sessions[0].log.ended)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        events = await read_to_close(ws)
    assert ws.close_code == 1000
    assert events[0]["resumed"] is True and events[0]["offset"] == 1.5 * 16000
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.5
    assert [e["id"] for e in of_type(events, "segment.final")] == [
        s["id"] for s in events[-1]["segments"]
    ]
    await wait_until(lambda: fake.sessions[0].log.aborted)


async def test_a_socket_lost_after_end_resumes_to_its_final(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """`end` was sent, the final was still being decoded when the socket died: the session
    is kept, and a resume gets the final (it was lost with the socket before)."""
    fake.end_gate = asyncio.Event()
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await ws.send_bytes(pcm16(1.0))
    await ws.send_json({"type": "end"})
    await wait_until(lambda: fake.sessions[0].log.ended)
    await detach(client, ws)
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        assert (await again.receive_json())["resumed"] is True
        await again.send_bytes(pcm16(0.5))  # ENDING: ignored, as after `end`
        fake.end_gate.set()
        events = await read_to_close(again)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.0
    assert again.close_code == 1000


async def test_a_resume_takes_over_a_socket_that_still_looks_alive(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A reconnecting client's old socket may not have noticed the blip: the resume wins,
    the old socket gets `session_taken_over` (4409) and carries nothing more."""
    old = await client.ws_connect("/v1/live")
    await old.send_json(START)
    ready = await old.receive_json()
    await old.send_bytes(pcm16(1.0))
    await on_disk(client, ready, 16000)
    async with client.ws_connect("/v1/live") as new:
        await new.send_json(resume_start(ready))
        error = await expect_error(old, SessionTakenOver)
        assert "another connection" in error["message"]
        resumed = await new.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == 16000
        await new.send_bytes(pcm16(0.5))
        await new.send_json({"type": "end"})
        events = await read_to_close(new)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.5
    assert metric(client, "livemeet_live_resumes_total", result="taken_over") == 1
    await wait_until(lambda: len(client.app[REGISTRY_KEY]) == 0)
    assert fake.sessions[0].log.aborted and len(fake.sessions) == 1


async def test_a_drain_ends_and_frees_detached_sessions(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    client = await gateway_client(aiohttp_client, server_config, fake, shutdown_live="end")
    ready, _ = await detached_session(client, fake, 1.0)
    await close_live_sockets(client.app)
    assert fake.sessions[0].log.ended and fake.sessions[0].log.aborted
    assert len(client.app[SESSIONS_KEY]) == 0


async def test_a_drain_stores_the_final_of_a_detached_session(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """SIGTERM while a session waited for its client's resume (a trial): the session was
    ended and dropped at once, so its final never came and the whole meeting's transcript
    was lost (GET /v1/sessions/{id}/transcript: 404, before and after the restart). The drain
    now waits for the final, as it does for attached sessions, and the store keeps it
    (`--shutdown-live end`: a restart keeps the session instead)."""
    client = await gateway_client(aiohttp_client, server_config, fake, shutdown_live="end")
    ready, _ = await detached_session(client, fake, 3.5)
    await close_live_sockets(client.app)
    assert len(client.app[SESSIONS_KEY]) == 0 and fake.sessions[0].log.aborted
    url = (
        f"/v1/sessions/{ready['session_id']}/transcript"
        f"?token={ready['captions_token']}&response_format=verbose_json"
    )
    response = await client.get(url)
    assert response.status == 200
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    body = await response.json()
    assert body["duration"] == 3.5 and len(body["segments"]) == 2  # 0-3 s, then the end's


@pytest.mark.parametrize("code", [1000, 1001])
async def test_a_client_that_closes_before_any_audio_frees_its_session_at_once(
    client: TestClient, fake: FakeTranscriber, code: int
) -> None:
    """A close frame of the client's own, normal (1000: `livemeet stream` stopped before its
    first frame) or going away (1001: a browser tab closed or navigated away before the
    microphone gave audio), from a client that sent no audio: nothing to resume, so the
    session goes with the socket instead of holding a --max-sessions slot for the resume
    window (session 37's trials)."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await ws.close(code=code)
    await wait_until(lambda: fake.sessions[0].log.aborted)
    assert len(client.app[SESSIONS_KEY]) == 0 and client.app[SESSIONS_KEY].num_detached == 0
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        await expect_error(again, NotFound)


async def test_a_pong_to_a_closing_socket_is_a_dropped_socket_not_a_bug(
    client: TestClient, fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client pings and its connection goes: aiohttp answers the ping inside `receive`,
    and the pong's write to the closing transport raises ClientConnectionResetError out of
    `receive` (aiohttp 3.14's writer; here its pong raises as it does). That is a dropped
    socket: the session is kept for a resume. It was an internal_error that dropped a 45-s
    meeting, transcript and all (a soak test whose gateway loop stalled for seconds, so the
    ping and the connection's end were read together)."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await ws.send_bytes(pcm16(1.0))
    await on_disk(client, ready, 16000)

    async def pong_to_a_closing_transport(self: web.WebSocketResponse, message: bytes) -> None:
        raise ClientConnectionResetError("Cannot write to closing transport")

    monkeypatch.setattr(web.WebSocketResponse, "pong", pong_to_a_closing_transport)
    await ws.ping()
    await wait_until(lambda: client.app[SESSIONS_KEY].num_detached == 1)
    vanish(ws)
    await ws.close()
    assert not fake.sessions[0].log.aborted
    assert metric(client, "livemeet_errors_total", code="internal_error") == 0
    monkeypatch.undo()
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        resumed = await again.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == 16000


@pytest.mark.parametrize("how", ["close 1000 after audio", "vanish before audio"])
async def test_a_session_with_audio_or_a_dropped_socket_still_detaches(
    client: TestClient, fake: FakeTranscriber, how: str
) -> None:
    """Only the two together (no audio, the client's own normal close) free a session: one
    with audio closed normally mid-stream, or a blip before the first frame, is resumable."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    if how == "vanish before audio":
        vanish(ws)
    else:
        await ws.send_bytes(pcm16(1.0))
        await wait_until(lambda: fake.sessions[0].log.num_samples == 16000)
    await ws.close()
    await wait_until(lambda: client.app[SESSIONS_KEY].num_detached == 1)
    assert not fake.sessions[0].log.aborted
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        assert (await again.receive_json())["resumed"] is True


async def test_with_resume_off_a_vanished_session_is_aborted_and_not_resumable(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """`--live-resume-window 0`: today's behaviour before resume (the session goes with its
    socket), no token to resume with."""
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0)
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    assert ready["resume_token"] is None and ready["resume_window_s"] == 0
    await ws.send_bytes(pcm16(1.0))
    await wait_until(lambda: fake.sessions[0].log.num_samples == 16000)
    vanish(ws)
    await wait_until(lambda: fake.sessions[0].log.aborted)
    await ws.close()
    assert not fake.sessions[0].log.ended and len(client.app[SESSIONS_KEY]) == 0
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start({**ready, "resume_token": "x"}))
        await expect_error(again, NotFound)


def test_the_resume_window_is_a_serve_flag_of_finite_non_negative_seconds(
    tmp_path: Path,
) -> None:
    from livemeet.__main__ import build_parser
    from livemeet.cli import serve

    def window(*flags: str) -> float:
        args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *flags])
        return serve.config_from_args(args).gateway.live_resume_window_s

    assert window() == LIVE_RESUME_WINDOW_S == 60.0
    assert window("--live-resume-window", "0") == 0.0
    assert window("--live-resume-window", "2.5") == 2.5
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(ConfigError, match="--live-resume-window"):
            window("--live-resume-window", bad)


def test_the_replay_is_every_final_then_the_latest_partial_or_the_terminal() -> None:
    def seg(i: int) -> Segment:
        return Segment(i, i + 1.0, "S01", f"s{i}", id=f"seg-{i:04d}", is_final=True)

    replay = ReplayState()
    assert replay.snapshot() == []
    finals = [SegmentFinal(seg(0)), SegmentFinal(seg(1))]
    partials = [SegmentPartial(1, (seg(2),)), SegmentPartial(2, (seg(3),))]
    for event in (partials[0], finals[0], finals[1], partials[1]):
        replay.record(event)
    assert replay.snapshot() == [*finals, partials[1]]
    final = TranscriptFinal((seg(0), seg(1), seg(2)), FinishReason.STOP, 1.0, 3.0)
    replay.record(final)
    assert replay.snapshot() == [*finals, final]  # the final holds the partial's segments


async def test_a_resume_through_the_engine_client_and_scripted_backend(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """The same blip with the real engine boundary (EngineClient, scripted backend in a
    thread): the session decodes on while detached, the resumed socket gets every final
    once, and the final transcript is the script's, covering all 12 s."""
    from livemeet.backends.scripted import DEFAULT_SCRIPT
    from livemeet.config import ModelConfig
    from livemeet.gateway.engine_client import EngineClient

    engine = EngineClient(ModelConfig(backend="scripted"), in_process=True)
    client = await aiohttp_client(create_app(server_config, engine))
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    for _ in range(12):  # 6 s
        await ws.send_bytes(pcm16(0.5))
    while (await read_until(ws, "audio.ack"))[-1]["offset"] < 6 * 16000:
        pass
    await detach(client, ws)
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        resumed = await again.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == 6 * 16000
        for _ in range(12):  # 6 s more
            await again.send_bytes(pcm16(0.5))
        await again.send_json({"type": "end"})
        events = await read_to_close(again)
    assert events[-1]["type"] == "transcript.revised"  # the scripted backend revises
    final = next(e for e in events if e["type"] == "transcript.final")
    assert final["duration"] == 12.0
    assert [s["text"] for s in final["segments"]] == [s.text for s in DEFAULT_SCRIPT.reference]
    ids = [e["id"] for e in of_type(events, "segment.final")]
    assert ids == [s["id"] for s in final["segments"]]
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0 and engine.num_sessions == 0)


async def test_a_socket_lost_during_the_drain_still_stores_its_final(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """SIGTERM ended an attached session (DRAINING) and waits for its final; the client's
    socket dies meanwhile: the session was aborted at once, so its final never came and the
    meeting's transcript was lost (404), as a detached session's was before the drain
    waited for it. It is now waited for as a detached session's, and stored."""
    client = await gateway_client(aiohttp_client, server_config, fake, shutdown_live="end")
    fake.end_gate = asyncio.Event()
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await ws.send_bytes(pcm16(1.0))
    await wait_until(lambda: fake.sessions[0].log.num_samples == 16000)
    drain = asyncio.create_task(close_live_sockets(client.app))
    await wait_until(lambda: fake.sessions[0].log.ended)
    vanish(ws)
    await asyncio.sleep(0.1)  # the handler's cleanup runs
    fake.end_gate.set()
    await asyncio.wait_for(drain, 5)
    await ws.close()
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    url = f"/v1/sessions/{ready['session_id']}/transcript?token={ready['captions_token']}"
    response = await client.get(url)
    assert response.status == 200
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"


async def test_a_socket_lost_after_an_idle_end_keeps_the_final_for_a_resume(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A client goes quiet (a laptop lid closed): the idle timeout ends its session as `end`
    would, and the socket dies before the final is out. The session was dropped there, its
    final never came, and the transcript was lost (404) while the client, awake again, got
    `not_found` for its resume. It is now kept as after the client's own `end`: the resume
    gets the final, and the transcript is stored."""
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.2)
    fake.end_gate = asyncio.Event()
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await ws.send_bytes(pcm16(1.0))
    await wait_until(lambda: fake.sessions[0].log.ended)  # by the idle timeout
    await detach(client, ws)
    assert not fake.sessions[0].log.aborted
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        assert (await again.receive_json())["resumed"] is True
        fake.end_gate.set()
        events = await read_to_close(again)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.0
    url = f"/v1/sessions/{ready['session_id']}/transcript?token={ready['captions_token']}"
    response = await client.get(url)
    assert response.status == 200
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
