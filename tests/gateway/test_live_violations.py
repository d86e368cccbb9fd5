"""A client's protocol violation once its session exists (docs/protocol.md, "Errors" under the
live WebSocket): the socket closes with the violation's code (an `error` frame first, where
the WebSocket layer lets one go), and the session is kept as after a dropped socket:
resumable with everything acknowledged, else ended and its transcript stored. One bad message
deleted the whole meeting, acknowledged audio included (a trial: a `caption.style` from a
newer client, a 3199-byte frame, a text frame not UTF-8)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient

from livemeet.audio.constants import MAX_FRAME_BYTES
from livemeet.config import ServerConfig
from livemeet.errors import InvalidRequest, LivemeetError, NotFound, ProtocolError
from livemeet.gateway.keys import SESSIONS_KEY
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_live_resume import (
    Frames,
    of_type,
    read_to_close,
    read_until,
    resume_start,
)
from tests.gateway.test_ws_captions import transcript_url
from tests.gateway.test_ws_live import START, expect_error, gateway_client, wait_until

STREAMED_S = 6.5  # the fake commits a final every 3 s (3 hops of 1 s): two before the violation
STREAMED_FRAMES = round(STREAMED_S * 16000)
Socket = aiohttp.ClientWebSocketResponse


@dataclass(frozen=True)
class Violation:
    send: Callable[[Socket], Awaitable[None]]
    error: type[LivemeetError] | None  # None: closed by the WebSocket layer, no error frame
    close_code: int = 0  # where `error` is None
    compress: int = 0  # the client's permessage-deflate window bits (0: off)


async def _json(ws: Socket, message: dict[str, Any]) -> None:
    await ws.send_json(message)


VIOLATIONS = {
    # a message type from a newer client
    "unknown_type": Violation(lambda ws: _json(ws, {"type": "caption.style"}), ProtocolError),
    "not_json": Violation(lambda ws: ws.send_str("{not json"), InvalidRequest),
    "no_type": Violation(lambda ws: _json(ws, {"kind": "keepalive"}), InvalidRequest),
    "second_start": Violation(lambda ws: _json(ws, START), ProtocolError),
    # not a whole number of sample frames; its 3198 whole bytes are not taken either
    "misaligned": Violation(lambda ws: ws.send_bytes(b"\1" * 3199), ProtocolError),
    "not_utf8": Violation(
        lambda ws: ws.send_frame(b'{"type":"keepalive","x":"\xc3"}', WSMsgType.TEXT),
        None,
        close_code=1007,
    ),
    "over_1_mib": Violation(
        lambda ws: ws.send_bytes(b"\0" * (MAX_FRAME_BYTES + 2)), None, close_code=1009
    ),
    # aiohttp lets an inflated message of its max_msg_size through: the handler refuses it
    "over_1_mib_deflated": Violation(
        lambda ws: ws.send_bytes(b"\0" * (MAX_FRAME_BYTES + 2)),
        None,
        close_code=1009,
        compress=15,
    ),
}


async def stream_then_violate(
    client: TestClient, fake: FakeTranscriber, violation: Violation
) -> tuple[dict[str, Any], Frames]:
    """A session that streamed STREAMED_S s, acknowledged whole, then broke the protocol: its
    `session.ready` and what its client received (the finals so far), once the server holds
    it detached."""
    async with client.ws_connect("/v1/live", compress=violation.compress) as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        assert ready["type"] == "session.ready", ready
        for _ in range(round(STREAMED_S / 0.5)):
            await ws.send_bytes(pcm16(0.5))
        seen = await read_until(ws, "audio.ack")
        while seen[-1]["offset"] < STREAMED_FRAMES:
            seen += await read_until(ws, "audio.ack")
        await violation.send(ws)
        if violation.error is not None:
            await expect_error(ws, violation.error)
        else:
            seen += await read_to_close(ws)
            assert ws.close_code == violation.close_code
    await wait_until(lambda: client.app[SESSIONS_KEY].num_detached == 1)
    session = fake.sessions[0]
    assert not session.log.aborted and not session.log.ended
    assert session.log.num_samples == STREAMED_FRAMES  # none of the refused frame
    return ready, seen


@pytest.mark.parametrize("name", VIOLATIONS)
async def test_a_violation_keeps_the_session_for_a_resume(
    client: TestClient, fake: FakeTranscriber, name: str
) -> None:
    """The resume gets every acknowledged frame (`offset`), the finals, and goes on to a final
    covering all the audio, each frame once."""
    ready, seen = await stream_then_violate(client, fake, VIOLATIONS[name])
    finals_before = [e["id"] for e in of_type(seen, "segment.final")]
    assert len(finals_before) == 2
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        resumed = await ws.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == STREAMED_FRAMES
        for _ in range(2):  # 1 s more, from the offset
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert ws.close_code == 1000
    final = events[-1]
    assert final["type"] == "transcript.final" and final["duration"] == STREAMED_S + 1
    assert fake.sessions[0].log.num_samples == (STREAMED_S + 1) * 16000
    ids = [e["id"] for e in of_type(events, "segment.final")]
    assert ids[: len(finals_before)] == finals_before  # replayed
    assert ids == [s["id"] for s in final["segments"]]
    assert len(fake.sessions) == 1


@pytest.mark.parametrize("name", ["unknown_type", "misaligned", "not_utf8", "over_1_mib"])
async def test_a_violated_session_not_resumed_is_ended_and_its_transcript_stored(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    name: str,
) -> None:
    """Right after the violation the transcript is readable (`running`: it was 404); once the
    resume window passes, the session is ended as by `end` and its transcript stored
    (`final`, every acknowledged frame); a late resume then gets `not_found`."""
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0.5)
    ready, _ = await stream_then_violate(client, fake, VIOLATIONS[name])
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.status == 200, await response.text()
    assert response.headers["X-Livemeet-Transcript-Status"] == "running"
    await wait_until(lambda: client.app[SESSIONS_KEY].get(ready["session_id"]) is None, 10)
    assert fake.sessions[0].log.ended
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.status == 200, await response.text()
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    body = await response.json()
    assert body["duration"] == STREAMED_S and len(body["segments"]) == 3  # 2 finals + the end's
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        await expect_error(ws, NotFound)


async def test_a_violation_before_start_has_no_session_to_keep(
    client: TestClient, fake: FakeTranscriber
) -> None:
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_bytes(pcm16(0.5))
        await expect_error(ws, ProtocolError)
    assert len(client.app[SESSIONS_KEY]) == 0 and not fake.sessions


async def test_a_violation_right_after_start_is_kept_too(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """No audio yet: kept all the same, as a socket dropped then would be (its client may
    resume and stream)."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.send_json({"type": "caption.style"})
        events = await asyncio.wait_for(read_to_close(ws), 5)
    assert [e["type"] for e in events] == ["session.ready", "error"]
    await wait_until(lambda: client.app[SESSIONS_KEY].num_detached == 1)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(events[0]))
        resumed = await ws.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == 0
        await ws.send_bytes(pcm16(1.0))
        await ws.send_json({"type": "end"})
        final = (await read_to_close(ws))[-1]
    assert final["type"] == "transcript.final" and final["duration"] == 1.0
