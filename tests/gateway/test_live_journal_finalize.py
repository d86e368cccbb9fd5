"""A live session's `finalize` outlives a restart, a crash and the engine's loss (DESIGN 5.9,
docs/protocol.md `finalize` and "Resume"): the journal keeps where in the session's audio each
came, and a rebuild makes it again there as it feeds the audio. So a finalize the backend had
not applied when the server stopped still commits its audio at its cut (a trial: 22.44-25.0 s
stayed a partial after a restart), and no final of the rebuilt session crosses the cut of one
it had applied (it started the window at the last final's end, before the cut). Over the fake
backend (where the finalizes are made) and the scripted one (what a real `LiveSession` then
commits)."""

from __future__ import annotations

import asyncio
import collections
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from livemeet.backends.scripted import DEFAULT_SCRIPT
from livemeet.config import ModelConfig, ServerConfig
from livemeet.errors import EngineUnavailable
from livemeet.gateway import live_journal
from livemeet.gateway.app import close_live_sockets, create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.keys import SESSIONS_KEY
from livemeet.gateway.live_holder import split_at_cuts
from livemeet.transcript.segments import Segment
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_live_durable import journal_a_session, stream_acked
from tests.gateway.test_live_resume import read_to_close, read_until, resume_start
from tests.gateway.test_ws_live import START, wait_until

RATE = 16_000


def journal_finalizes(data_dir: Path) -> list[tuple[str, int]]:
    """(session_id, frames) of every finalize in the journal, read-only."""
    uri = f"file:{data_dir / 'live' / live_journal.DB_NAME}?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        return conn.execute("SELECT session_id, frames FROM finalizes ORDER BY frames").fetchall()


async def send_acked(ws: Any, pcm: bytes, frames: int) -> None:
    """Send `pcm`; read until the session's first `frames` frames are acknowledged."""
    await ws.send_bytes(pcm)
    events = await read_until(ws, "audio.ack")
    while events[-1]["type"] != "audio.ack" or events[-1]["offset"] < frames:
        events += await read_until(ws, "audio.ack")


@pytest.mark.parametrize(("rate", "channels"), [(16_000, 1), (48_000, 2)])
async def test_a_restart_makes_each_finalize_again_where_it_came(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    rate: int,
    channels: int,
) -> None:
    """Two finalizes (one repeated with no audio between: the same cut) are journalled in
    sample frames of the client's rate; after a SIGTERM restart the rebuilt backend session
    gets its finalizes at the same points of the replayed audio as the first one got them."""
    client = await aiohttp_client(create_app(server_config, fake))
    ws = await client.ws_connect("/v1/live")
    await ws.send_json({**START, "sample_rate": rate, "channels": channels})
    ready = await ws.receive_json()
    first = fake.sessions[0]
    await send_acked(ws, pcm16(2.5, rate, channels), round(2.5 * rate))
    await ws.send_json({"type": "finalize"})
    await ws.send_json({"type": "finalize"})
    await wait_until(lambda: first.log.num_finalize == 2)
    await send_acked(ws, pcm16(1.0, rate, channels), round(3.5 * rate))
    await ws.send_json({"type": "finalize"})
    await wait_until(lambda: first.log.num_finalize == 3)
    reading = asyncio.create_task(read_to_close(ws))
    await close_live_sockets(client.app)
    await asyncio.wait_for(reading, 5)
    await client.close()
    sid = ready["session_id"]
    assert journal_finalizes(server_config.data_dir) == [(sid, 2.5 * rate), (sid, 3.5 * rate)]

    again = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, again))
    [rebuilt] = again.sessions
    assert rebuilt.log.num_samples == first.log.num_samples
    # the 16-kHz sample each finalize came at; resampled, the decoder's output at its frame
    made = first.log.finalized_at
    assert made[0] == made[1] and len(made) == 3
    assert rebuilt.log.finalized_at == [made[0], made[2]]
    await client.close()


async def test_a_session_rebuilt_after_its_engine_died_gets_its_finalizes_again(
    client: TestClient, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """The engine worker dies after a finalize: the rebuilt backend session, fed the journalled
    audio again, gets it at the same point (and only there: the client's later one once)."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 2.0)
        await ws.send_json({"type": "finalize"})
        await wait_until(lambda: fake.sessions[0].log.num_finalize == 1)
        await send_acked(ws, pcm16(1.0), 3 * RATE)
        fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
        await wait_until(lambda: len(fake.sessions) == 2)
        rebuilt = fake.sessions[1]
        await wait_until(lambda: rebuilt.log.num_samples == 3 * RATE)
        assert rebuilt.log.finalized_at == [2 * RATE]
        await ws.send_json({"type": "finalize"})
        await wait_until(lambda: rebuilt.log.num_finalize == 2)
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert rebuilt.log.finalized_at == [2 * RATE, 3 * RATE]
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 3.0


# DEFAULT_SCRIPT's first two turns, as the run before the restart committed them
STORED = [
    Segment(0.5, 3.0, "S01", DEFAULT_SCRIPT.reference[0].text, id="seg-0001", is_final=True),
    Segment(3.0, 5.5, "S02", DEFAULT_SCRIPT.reference[1].text, id="seg-0002", is_final=True),
]


async def scripted_app(aiohttp_client: ClientFactory, config: ServerConfig) -> TestClient:
    engine = EngineClient(ModelConfig(backend="scripted"), in_process=True)
    return await aiohttp_client(create_app(config, engine))


def crossing(finals: list[dict[str, Any]], cut_s: float) -> list[dict[str, Any]]:
    return [s for s in finals if s["start"] < cut_s - 1e-6 and s["end"] > cut_s + 1e-6]


async def resume_to_the_end(client: TestClient, sid: str, token: str) -> dict[str, Any]:
    """Resume the rebuilt session, send the meeting's rest (to 12 s), end: the final."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start({"session_id": sid, "resume_token": token}))
        resumed = await ws.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == 7 * RATE
        for _ in range(10):
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    final: dict[str, Any] = next(e for e in events if e["type"] == "transcript.final")
    assert final["duration"] == 12.0
    return final


async def test_a_finalize_pending_at_the_restart_is_committed_at_its_cut(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """The client finalized at 6.5 s, mid-turn ("We are about ten percent over.", 5.5-8 s),
    and the server stopped before a decode reached it: its finals end at 5.5 s. The rebuilt
    session commits the turn's words up to 6.5 s at once, no resume needed (before, they
    stayed a partial), and none of its finals crosses 6.5 s."""
    token = "a-token-of-a-finalized-session"
    sid = await journal_a_session(
        server_config.data_dir / "live", token, 7.0, STORED, finalizes=(round(6.5 * RATE),)
    )
    client = await scripted_app(aiohttp_client, server_config)
    holder = client.app[SESSIONS_KEY].get(sid)
    assert holder is not None
    await wait_until(lambda: len(holder.replay.finals) > 2)
    cut = holder.replay.finals[2].segment
    assert (cut.start_s, cut.end_s, cut.speaker, cut.text) == (5.5, 6.5, "S01", "We are")
    final = await resume_to_the_end(client, sid, token)
    assert [s["id"] for s in final["segments"][:3]] == ["seg-0001", "seg-0002", cut.id]
    assert crossing(final["segments"], 6.5) == []
    assert final["segments"][3]["start"] >= 6.5


async def test_no_final_after_a_restart_starts_before_an_applied_cut(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """The client finalized at 5.6 s, within the turn's first word (5.5-8 s): the decode that
    reached the cut wrote nothing, so the finals end at 5.5 s, before it. The rebuilt session
    goes on from the cut as the first run would have, not from the finals' end: its next
    final starts at 5.6 s (before, "We are about ten percent over." started at 5.5 s, across
    the cut)."""
    token = "a-token-of-an-applied-cut"
    sid = await journal_a_session(
        server_config.data_dir / "live", token, 7.0, STORED, finalizes=(round(5.6 * RATE),)
    )
    client = await scripted_app(aiohttp_client, server_config)
    final = await resume_to_the_end(client, sid, token)
    segments = final["segments"]
    assert [s["id"] for s in segments[:2]] == ["seg-0001", "seg-0002"]
    assert crossing(segments, 5.6) == []
    assert segments[2]["start"] >= 5.6 and segments[2]["text"] == "are about ten percent over."


@pytest.mark.parametrize(
    ("first_frame", "cuts", "pieces", "left"),
    [
        (0, [], [(b"abcdef", False)], []),  # no cut: the chunk whole
        (10, [10], [(b"", True), (b"abcdef", False)], []),  # at its first frame
        (10, [11, 13], [(b"ab", True), (b"cdef", True), (b"", False)], []),  # two, one at its end
        (10, [12, 20], [(b"abcd", True), (b"ef", False)], [20]),  # a later one waits
    ],
)
def test_the_replayed_audio_is_split_at_each_finalize(
    first_frame: int, cuts: list[int], pieces: list[tuple[bytes, bool]], left: list[int]
) -> None:
    """Frames of 2 bytes: the chunk `abcdef` is frames first_frame .. first_frame + 2."""
    pending = collections.deque(cuts)
    assert list(split_at_cuts(b"abcdef", first_frame, 2, pending)) == pieces
    assert list(pending) == left
