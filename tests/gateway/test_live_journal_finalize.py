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
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from livemeet.backends.scripted import DEFAULT_SCRIPT
from livemeet.config import ModelConfig, ServerConfig
from livemeet.errors import EngineUnavailable
from livemeet.gateway import live_journal, live_journal_writer
from livemeet.gateway.app import close_live_sockets, create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.keys import CONFIG_KEY, SESSIONS_KEY
from livemeet.gateway.live_holder import split_at_cuts
from livemeet.transcript.segments import Segment
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_live_durable import journal_a_session, ramp_pcm, stream_acked
from tests.gateway.test_live_resume import detach, read_to_close, read_until, resume_start
from tests.gateway.test_ws_live import START, wait_until

RATE = 16_000


def journal_finalizes(data_dir: Path) -> list[tuple[str, int]]:
    """(session_id, frames) of every finalize in the journal, read-only."""
    uri = f"file:{data_dir / 'live' / live_journal.DB_NAME}?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        return conn.execute("SELECT session_id, frames FROM finalizes ORDER BY frames").fetchall()


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The journal's group commits, held while the event is clear (set: they go on): what
    the disk holds meanwhile is what a server killed then leaves (`crashed_copy`)."""
    go = threading.Event()
    go.set()
    commit = live_journal_writer.Writer._commit

    def held(self: live_journal_writer.Writer, group: Any) -> bool:
        go.wait(30)
        return commit(self, group)

    monkeypatch.setattr(live_journal_writer.Writer, "_commit", held)
    yield go
    go.set()


def crashed_copy(data_dir: Path, into: Path) -> None:
    """What a server killed now leaves of its live journal, copied into the data dir `into`:
    the database as committed (its writer held before its next commit: `commits`) and the
    audio files (a file's bytes past its record, written by a group not committed, are cut
    off as the journal loads)."""
    live, copy = data_dir / "live", into / "live"
    shutil.copytree(live / live_journal.AUDIO_DIR, copy / live_journal.AUDIO_DIR)
    source = sqlite3.connect(f"file:{live / live_journal.DB_NAME}?mode=ro", uri=True)
    target = sqlite3.connect(copy / live_journal.DB_NAME)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


async def send_acked(ws: Any, pcm: bytes, frames: int) -> None:
    """Send `pcm`; read until the session's first `frames` frames are acknowledged."""
    await ws.send_bytes(pcm)
    await read_acked(ws, frames)


async def read_acked(ws: Any, frames: int) -> None:
    """Read until the session's first `frames` frames are acknowledged."""
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
    """Two finalizes (one repeated with no audio between: the same cut, made once) are
    journalled in sample frames of the client's rate; after a SIGTERM restart the rebuilt
    backend session gets its finalizes at the same points of the replayed audio as the first
    one got them."""
    client = await aiohttp_client(create_app(server_config, fake))
    ws = await client.ws_connect("/v1/live")
    await ws.send_json({**START, "sample_rate": rate, "channels": channels})
    ready = await ws.receive_json()
    first = fake.sessions[0]
    await send_acked(ws, pcm16(2.5, rate, channels), round(2.5 * rate))
    await ws.send_json({"type": "finalize"})
    await ws.send_json({"type": "finalize"})  # a repeat: the backend does not see it
    await send_acked(ws, pcm16(1.0, rate, channels), round(3.5 * rate))
    await ws.send_json({"type": "finalize"})
    await wait_until(lambda: first.log.num_finalize == 2)
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
    assert len(made) == 2
    assert rebuilt.log.finalized_at == made
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


@pytest.mark.parametrize("sends_again", [True, False])
async def test_a_finalize_a_crash_took_is_sent_again_and_cuts_where_it_came(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    commits: threading.Event,
    tmp_path: Path,
    sends_again: bool,
) -> None:
    """The audio to 6.5 s is acknowledged, then the client finalizes there, mid-turn ("We
    are about ten percent over.", 5.5-8 s), and the server is killed before its journal's
    next commit: the finalize is lost though the audio before it was acknowledged (before,
    nothing told the client so: a final crossed the cut). The resume's `session.ready` says
    the last finalize the journal holds came at 2 s; the client sends the one at 6.5 s again
    at once (its place is the offset), and the rebuilt session cuts there: no final crosses
    2 s or 6.5 s. A client that does not send it again (`sends_again` False: one older than
    `finalize_offset`) goes on as before: its meeting is whole, the lost cut stays lost."""
    first = await scripted_app(aiohttp_client, server_config)
    ws = await first.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    holder = first.app[SESSIONS_KEY].get(ready["session_id"])
    assert holder is not None
    await send_acked(ws, pcm16(2.0), 2 * RATE)
    await ws.send_json({"type": "finalize"})
    # on disk with the audio after it, which was queued after it
    await send_acked(ws, pcm16(4.5), round(6.5 * RATE))
    after = replace(server_config, data_dir=tmp_path / "after-the-crash")
    commits.clear()
    try:
        await ws.send_json({"type": "finalize"})
        await wait_until(lambda: holder.finalizes == [2 * RATE, round(6.5 * RATE)])
        crashed_copy(server_config.data_dir, after.data_dir)
    finally:
        commits.set()

    second = await scripted_app(aiohttp_client, after)
    async with second.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        resumed = await ws.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == round(6.5 * RATE)
        if sends_again:
            assert resumed["finalize_offset"] == 2 * RATE  # the one at 6.5 s was lost
            await ws.send_json({"type": "finalize"})
        for _ in range(11):  # 6.5-12 s
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    final = next(e for e in events if e["type"] == "transcript.final")  # a revision follows
    assert final["duration"] == 12.0
    segments = final["segments"]
    assert crossing(segments, 2.0) == []
    if sends_again:
        assert crossing(segments, 6.5) == []
        assert [s["text"] for s in segments if s["end"] == 6.5] == ["We are"]
    else:
        [across] = crossing(segments, 6.5)
        assert across["text"] == "We are about ten percent over."


async def test_a_finalize_sent_again_where_the_session_holds_one_is_no_second_cut(
    client: TestClient, fake: FakeTranscriber, commits: threading.Event
) -> None:
    """A dropped socket, no crash: the session took a finalize at 1.5 s and the audio to 2 s,
    but none of it is on disk yet, so the resume's offset is 1 s and its `finalize_offset`
    null. The client sends on from 1 s and, by the rule, the finalize again at 1.5 s: the
    session holds one there, so it is a repeat (before, the backend cut again at 2 s, the
    audio it held already: a cut nobody asked for), and the journal keeps the one."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await stream_acked(ws, fake, 1.0)
    session = fake.sessions[0]
    commits.clear()
    try:
        await ws.send_bytes(ramp_pcm(0.5, RATE))
        await ws.send_json({"type": "finalize"})
        await ws.send_bytes(ramp_pcm(0.5, round(1.5 * RATE)))
        await wait_until(lambda: session.log.num_samples == 2 * RATE)
        await detach(client, ws)
        async with client.ws_connect("/v1/live") as ws:
            await ws.send_json(resume_start(ready))
            resumed = (await read_until(ws, "session.ready"))[-1]
            assert (resumed["offset"], resumed["finalize_offset"]) == (RATE, None)
            await ws.send_bytes(ramp_pcm(0.5, RATE))  # held: skipped
            await ws.send_json({"type": "finalize"})  # its place: 1.5 s, as it came
            await ws.send_bytes(ramp_pcm(1.0, round(1.5 * RATE)))  # half held, half new
            await wait_until(lambda: session.log.num_samples == 2.5 * RATE)
            commits.set()
            await read_acked(ws, round(2.5 * RATE))
            sid = ready["session_id"]
            data_dir = client.app[CONFIG_KEY].data_dir
            assert journal_finalizes(data_dir) == [(sid, round(1.5 * RATE))]
            await ws.send_json({"type": "end"})
            final = (await read_to_close(ws))[-1]
    finally:
        commits.set()
    assert session.log.finalized_at == [round(1.5 * RATE)]  # before: a second at 2 s
    assert final["type"] == "transcript.final" and final["duration"] == 2.5


async def test_a_finalize_at_the_durable_offset_is_not_named_held_before_its_commit(
    client: TestClient, fake: FakeTranscriber, commits: threading.Event
) -> None:
    """The audio to 1 s is on disk, then the client finalizes there and the journal's next
    commit has not come: the finalize is not on disk, though no audio past it is either. A
    resume meanwhile must not name it held (`finalize_offset` 1 s, by reading "before the
    durable audio" as "at or before"): its client would forget it, and a crash before that
    commit lose the cut. Sent again at once (its place is the offset), it is a repeat."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await stream_acked(ws, fake, 1.0)
    holder = client.app[SESSIONS_KEY].get(ready["session_id"])
    assert holder is not None and holder.num_frames_durable == RATE
    commits.clear()
    try:
        await ws.send_json({"type": "finalize"})
        await wait_until(lambda: holder.finalizes == [RATE])
        await detach(client, ws)
        async with client.ws_connect("/v1/live") as ws:
            await ws.send_json(resume_start(ready))
            resumed = (await read_until(ws, "session.ready"))[-1]
            assert journal_finalizes(client.app[CONFIG_KEY].data_dir) == []  # a crash loses it
            assert (resumed["offset"], resumed["finalize_offset"]) == (RATE, None)
            commits.set()
            await wait_until(lambda: holder.finalize_durable == RATE)
            await ws.send_json({"type": "finalize"})  # a repeat
            await ws.send_bytes(pcm16(0.5))
            await ws.send_json({"type": "end"})
            final = (await read_to_close(ws))[-1]
    finally:
        commits.set()
    assert fake.sessions[0].log.finalized_at == [RATE]
    assert final["type"] == "transcript.final" and final["duration"] == 1.5


async def test_a_resume_is_told_where_the_last_finalize_on_disk_came(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """`finalize_offset` is null for a new session, and the place of the last finalize once
    the journal holds it, though no audio came after it (its own commit says so, not the
    audio's). A client that sends it again anyway (its place is the offset: at once) makes
    no second cut."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    assert ready["finalize_offset"] is None
    await stream_acked(ws, fake, 1.0)
    await ws.send_json({"type": "finalize"})
    holder = client.app[SESSIONS_KEY].get(ready["session_id"])
    assert holder is not None
    await wait_until(lambda: holder.finalize_durable == RATE)
    await detach(client, ws)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        resumed = (await read_until(ws, "session.ready"))[-1]
        assert (resumed["offset"], resumed["finalize_offset"]) == (RATE, RATE)
        await ws.send_json({"type": "finalize"})  # a repeat
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        final = (await read_to_close(ws))[-1]
    assert fake.sessions[0].log.finalized_at == [RATE]
    assert final["type"] == "transcript.final" and final["duration"] == 1.5


async def test_a_finalize_sent_again_behind_the_last_final_moves_nothing_back(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """The journal holds finals to 5.5 s over 5 s of audio (a model's times run up to 0.8 %
    fast; here, more) and no finalize: a resumed client sends its finalize again at the
    offset, 5 s, behind the last final. It commits nothing: the finals stand as they were,
    and the next one starts at the last one's end, not at the finalize's place."""
    token = "a-token-of-a-finalize-behind-the-finals"
    sid = await journal_a_session(server_config.data_dir / "live", token, 5.0, STORED)
    client = await scripted_app(aiohttp_client, server_config)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start({"session_id": sid, "resume_token": token}))
        resumed = await ws.receive_json()
        assert (resumed["offset"], resumed["finalize_offset"]) == (5 * RATE, None)
        await ws.send_json({"type": "finalize"})
        for _ in range(14):  # 5-12 s
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    final = next(e for e in events if e["type"] == "transcript.final")
    segments = final["segments"]
    kept = [(s["id"], s["start"], s["end"], s["text"]) for s in segments[:2]]
    assert kept == [(s.id, s.start_s, s.end_s, s.text) for s in STORED]
    assert segments[2]["start"] >= 5.5 and final["duration"] == 12.0


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
