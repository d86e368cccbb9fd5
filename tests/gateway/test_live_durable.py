"""Durable live sessions (DESIGN 5.9, docs/protocol.md "Resume"): acks only for audio on disk,
the journal's record of a session, and a session rebuilt from the journal at start, over a
real aiohttp server and the fake backend. The crash itself (SIGKILL) is tested over the real
`serve` in tests/gateway/test_live_crash.py."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient

from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.config import ServerConfig
from livemeet.errors import ConfigError, EngineUnavailable, InvalidRequest, StorageFailed
from livemeet.gateway import live_journal, live_journal_writer
from livemeet.gateway.app import create_app
from livemeet.gateway.keys import CONFIG_KEY, SESSIONS_KEY, STORE_KEY
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.gateway.live_journal import JournalSession, LiveJournal
from livemeet.gateway.live_protocol import PCM_ENCODING, AudioFormat
from livemeet.gateway.live_sessions import LiveSessions
from livemeet.gateway.metrics import GatewayMetrics
from livemeet.gateway.session_tokens import captions_token_for, token_digest
from livemeet.transcriber import Error, SegmentFinal, SessionOptions, TranscriptFinal
from livemeet.transcript.segments import Segment
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeSession, FakeTranscriber, fake_text
from tests.gateway.test_live_resume import (
    detach,
    detached_session,
    metric,
    read_to_close,
    read_until,
    resume_start,
)
from tests.gateway.test_speaker_rename import RecordingSink
from tests.gateway.test_ws_live import START, gateway_client, wait_until

RATE = 16_000


def journal_rows(data_dir: Path) -> list[tuple[str, int, int]]:
    """(session_id, ended, durable_frames) of every session in the journal, read-only."""
    uri = f"file:{data_dir / 'live' / live_journal.DB_NAME}?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        return conn.execute("SELECT session_id, ended, durable_frames FROM sessions").fetchall()


async def test_an_ack_waits_for_the_audio_to_be_on_disk(
    client: TestClient, fake: FakeTranscriber, stalled_disk: threading.Event
) -> None:
    """While the journal cannot sync, the server takes the audio in but acknowledges none of
    it; once the sync goes through, the ack covers it."""
    disk = stalled_disk
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        assert (await ws.receive_json())["type"] == "session.ready"
        await ws.send_bytes(pcm16(0.5))
        await wait_until(lambda: fake.sessions[0].log.num_samples == RATE // 2)
        with pytest.raises(TimeoutError):  # several ack intervals: no ack
            await asyncio.wait_for(read_until(ws, "audio.ack"), 0.8)
        disk.set()
        ack = (await read_until(ws, "audio.ack"))[-1]
        assert ack["offset"] == RATE // 2
        await ws.send_json({"type": "end"})
        await read_to_close(ws)


async def test_the_final_transcripts_wait_for_the_journal_is_measured_apart(
    client: TestClient, fake: FakeTranscriber, stalled_disk: threading.Event
) -> None:
    """livemeet_live_final_seconds cuts `end` -> transcript.final into the backend's part
    (engine) and the final's wait for the journal (hold), which a stalled disk lengthens:
    so a slow end-to-final tells which of the two it was (session 45's H200 run could not)."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        assert (await ws.receive_json())["type"] == "session.ready"
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        await wait_until(lambda: bool(fake.sessions))
        log = fake.sessions[0].log
        await wait_until(lambda: any(isinstance(e, TranscriptFinal) for e in log.events))
        await asyncio.sleep(0.5)  # the backend's final is out; the journal cannot sync
        assert metric(client, "livemeet_live_final_seconds_count", phase="hold") == 0
        stalled_disk.set()
        events = await read_to_close(ws)
    assert events[-1]["type"] == "transcript.final"
    for phase in ("engine", "hold"):
        assert metric(client, "livemeet_live_final_seconds_count", phase=phase) == 1
    assert metric(client, "livemeet_live_final_seconds_sum", phase="hold") >= 0.3
    assert metric(client, "livemeet_live_final_seconds_sum", phase="engine") >= 0


def journal_final_ids(data_dir: Path) -> list[str]:
    """The ids of the finals the journal holds, in commit order, read-only."""
    uri = f"file:{data_dir / 'live' / live_journal.DB_NAME}?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        rows = conn.execute("SELECT segment FROM finals ORDER BY session_id, seq").fetchall()
    return [json.loads(segment)["id"] for (segment,) in rows]


@pytest.fixture
def stalled_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The journal's audio syncs wait until the event returned is set (at the latest at the
    test's end), so its group commits wait too."""
    disk = threading.Event()
    real_sync = live_journal_writer.os.fdatasync

    def slow_sync(fd: int) -> None:
        disk.wait(10)
        real_sync(fd)

    monkeypatch.setattr(live_journal_writer.os, "fdatasync", slow_sync)
    yield disk
    disk.set()


async def test_a_final_goes_out_only_once_the_journal_holds_it(
    client: TestClient,
    fake: FakeTranscriber,
    server_config: ServerConfig,
    stalled_disk: threading.Event,
) -> None:
    """A final sent before its journal record was committed, then lost to a crash, came back
    from the rebuilt session under the same id with other words and times (a crash trial: the
    demo backend's seg-0002 re-decoded as another sentence; a label could flip the same way).
    A `segment.final` now goes to the client (and captions) only once the journal holds it."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        assert (await ws.receive_json())["type"] == "session.ready"
        for _ in range(7):  # 3.5 s: the fake commits its first final at 3 s
            await ws.send_bytes(pcm16(0.5))
        await wait_until(
            lambda: any(isinstance(e, SegmentFinal) for e in fake.sessions[0].log.events)
        )
        with pytest.raises(TimeoutError):  # the disk is stalled: the final waits for it
            await asyncio.wait_for(read_until(ws, "segment.final"), 0.5)
        stalled_disk.set()
        final = (await read_until(ws, "segment.final"))[-1]
        assert final["id"] in journal_final_ids(server_config.data_dir)
        await ws.send_json({"type": "end"})
        await read_to_close(ws)


async def test_the_ack_before_the_final_covers_only_audio_on_disk(
    client: TestClient, fake: FakeTranscriber, stalled_disk: threading.Event
) -> None:
    """The ack right before `transcript.final` covered all audio taken in, on disk or not (a
    crash trial): a client that got it and lost the final with the connection dropped that
    audio, and a server that died then rebuilt the session without it, short of what it had
    acknowledged. The final now waits for the session's audio to reach the disk, so that ack
    covers only audio on disk, as every other does."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        assert (await ws.receive_json())["type"] == "session.ready"
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        await wait_until(lambda: fake.sessions[0].log.ended)
        with pytest.raises(TimeoutError):  # nothing is on disk yet: no ack, no final
            await asyncio.wait_for(read_until(ws, "audio.ack"), 0.5)
        stalled_disk.set()
        events = await read_to_close(ws)
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["audio.ack", "transcript.final"]
    assert events[-2]["offset"] == RATE // 2 and events[-1]["duration"] == 0.5


async def test_a_finished_session_leaves_the_journal(
    client: TestClient, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """While a session streams, the journal holds its audio (as acknowledged) and finals; once
    its transcript is stored, its rows and its audio file are deleted."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        for _ in range(7):
            await ws.send_bytes(pcm16(0.5))
        events = await read_until(ws, "segment.final")  # 3 s: the fake's first final
        while events[-1]["type"] != "audio.ack" or events[-1]["offset"] < 3.5 * RATE:
            events += await read_until(ws, "audio.ack")
        [(sid, ended, frames)] = journal_rows(server_config.data_dir)
        assert (sid, ended, frames) == (ready["session_id"], 0, 3.5 * RATE)
        audio = list((server_config.data_dir / "live" / "audio").iterdir())
        assert [p.stat().st_size for p in audio] == [3.5 * RATE * 2]
        await ws.send_json({"type": "end"})
        final = (await read_to_close(ws))[-1]
    assert final["type"] == "transcript.final"
    await client.app[STORE_KEY].flush()
    await wait_until(lambda: journal_rows(server_config.data_dir) == [])  # nothing of it left
    # the audio file goes after the commit that deletes the rows (the writer's order: a crash
    # in between rebuilds the session with its audio), so a loaded run may see it a moment
    await wait_until(lambda: not list((server_config.data_dir / "live" / "audio").iterdir()))
    text = await (await client.get("/metrics")).text()
    commits = metric_value(text, "livemeet_live_journal_commit_seconds_count")
    assert commits >= 2  # at least the audio's group and the end's
    assert metric_value(text, "livemeet_live_journal_files_synced_sum") >= 1


def metric_value(text: str, name: str) -> float:
    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
    return float(line.split()[-1])


async def journal_a_session(
    root: Path,
    token: str,
    seconds: float,
    finals: list[Segment],
    *,
    ended: bool = False,
    finalizes: tuple[int, ...] = (),
) -> str:
    """What a server that crashed mid-meeting leaves: a live session of `seconds` of 16-kHz
    mono audio (a ramp, so order matters), its `finals`, a name, and `finalizes` (sample
    frames of audio before each). Returns its id."""
    session_id = "before-the-crash"
    meta = JournalSession(
        session_id,
        token_digest(token),
        token_digest(captions_token_for(token)),
        RATE,
        1,
        created_at=1.0,
        prompt="a weekly sync",
    )

    journal = LiveJournal(root, commit_interval_s=0.01)
    journal.start(asyncio.get_running_loop())
    journal.open_session(meta, lambda _: None, lambda _: None)
    journal.append_audio(session_id, ramp_pcm(seconds))
    for seg in finals:
        journal.add_final(session_id, seg)
    for frames in finalizes:
        journal.add_finalize(session_id, frames)
    journal.set_names(session_id, [("S01", "Alice")])
    if ended:
        journal.mark_ended(session_id)
    await journal.close()
    return session_id


async def open_live(
    sessions: LiveSessions, fake: FakeTranscriber, sink: RecordingSink
) -> LiveSessionHolder:
    """A live session of 16-bit mono PCM at RATE opened on `fake`, held by `sessions` with
    `sink` as its socket (no WebSocket: the holder's own calls)."""
    options = SessionOptions(live=True)
    return sessions.open(
        await fake.open_session(options),
        PcmStreamDecoder(RATE),
        AudioFormat(RATE, 1, PCM_ENCODING),
        sink,
        options,
    )


def ramp_pcm(seconds: float, start: int = 0) -> bytes:
    n = round(seconds * RATE)
    return bytes(
        b for i in range(start, start + n) for b in (i % 32768).to_bytes(2, "little", signed=True)
    )


def stored_finals(n: int, every_s: float = 3.0) -> list[Segment]:
    # the fake's own finals: one per 3 s, texts "segment i café", ids seg-000i
    return [
        Segment(
            i * every_s, (i + 1) * every_s, "S01", fake_text(i), id=f"seg-{i:04d}", is_final=True
        )
        for i in range(n)
    ]


async def test_a_session_left_unfinished_is_rebuilt_and_resumed(
    aiohttp_client: ClientFactory, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """The journal of a crashed run holds a session (7 s of audio, two finals, a name). The
    new server rebuilds it at start: a backend session from those finals and options, fed the
    stored audio. The client resumes with its old id and token: `offset` is the stored audio,
    the finals and the name are replayed, the captions token is the old one; it sends on from
    there, and the final holds the old finals (same ids) and the new ones after them."""
    token = "the-resume-token-the-client-kept"
    sid = await journal_a_session(server_config.data_dir / "live", token, 7.0, stored_finals(2))
    client = await aiohttp_client(create_app(server_config, fake))
    assert len(client.app[SESSIONS_KEY]) == 1 and client.app[SESSIONS_KEY].num_detached == 1
    [rebuilt] = fake.sessions
    assert rebuilt.log.options.restore is not None
    assert [s.id for s in rebuilt.log.options.restore.finals] == ["seg-0000", "seg-0001"]
    assert rebuilt.log.options.prompt == "a weekly sync"
    assert rebuilt.log.num_samples == 7 * RATE  # the stored audio, fed again

    ready: dict[str, Any] = {"session_id": sid, "resume_token": token}
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        resumed = await ws.receive_json()
        assert resumed["type"] == "session.ready" and resumed["resumed"] is True
        assert resumed["offset"] == 7 * RATE
        assert resumed["captions_token"] == captions_token_for(token)
        replay = [await ws.receive_json() for _ in range(3)]
        assert [e.get("id") for e in replay[:2]] == ["seg-0000", "seg-0001"]
        assert replay[2] == {"type": "speaker.renamed", "speaker": "S01", "name": "Alice"}
        for _ in range(4):  # 2 s more, from the offset
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    final = events[-1]
    assert final["type"] == "transcript.final"
    revs = [e["rev"] for e in events if e["type"] == "segment.partial"]
    assert revs and min(revs) > 7 * RATE  # above any rev the crashed run can have sent
    ids = [s["id"] for s in final["segments"]]
    assert ids[:2] == ["seg-0000", "seg-0001"] and len(ids) == len(set(ids)) >= 3
    assert final["segments"][2]["start"] == 6.0  # the new speech starts at the old finals' end
    assert final["duration"] == 9.0
    assert rebuilt.log.num_samples == 9 * RATE  # nothing twice, nothing missing
    await client.app[STORE_KEY].flush()
    await wait_until(lambda: journal_rows(server_config.data_dir) == [])  # nothing of it left


async def test_a_journal_that_cannot_be_read_stops_the_start_with_a_config_error(
    aiohttp_client: ClientFactory, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """A journal whose files cannot be read or made (a failing disk; here its audio folder is
    a file) stopped the start with a StorageFailed traceback (a crash trial): it is a
    ConfigError naming the data dir, one line and exit 2 from `serve`, as for any data dir
    that cannot be used. (A damaged journal is set aside and the start goes on:
    test_live_journal.py.)"""
    live = server_config.data_dir / "live"
    live.mkdir(parents=True)
    (live / "audio").write_text("not a folder")
    with pytest.raises(ConfigError, match=f"cannot use --data-dir {server_config.data_dir}: "):
        await aiohttp_client(create_app(server_config, fake))


async def test_a_rebuilt_session_not_resumed_is_ended_and_stored(
    aiohttp_client: ClientFactory, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """Resume off (or its window passed): the rebuilt session is ended as by its client's end
    and its transcript stored, readable with the old captions token."""
    token = "another-kept-token"
    sid = await journal_a_session(server_config.data_dir / "live", token, 4.0, stored_finals(1))
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0.0)
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    await client.app[STORE_KEY].flush()
    path = f"/v1/sessions/{sid}/transcript"
    params = {"token": captions_token_for(token), "response_format": "diarized_json"}
    response = await client.get(path, params=params)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert [s["id"] for s in body["segments"]][0] == "seg-0000"
    assert body["duration"] == 4.0
    await wait_until(lambda: journal_rows(server_config.data_dir) == [])  # nothing of it left


async def test_a_session_whose_end_came_before_the_crash_gets_its_final(
    aiohttp_client: ClientFactory, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """The client sent `end`, the server died before the final: the rebuilt session is ended
    at once (the client will not send `end` again: it waits for its final, as protocol.md
    says), and the resuming client gets the final without sending anything."""
    token = "a-token-of-an-ended-session"
    sid = await journal_a_session(
        server_config.data_dir / "live", token, 5.0, stored_finals(1), ended=True
    )
    client = await aiohttp_client(create_app(server_config, fake))
    [rebuilt] = fake.sessions
    assert rebuilt.log.ended
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start({"session_id": sid, "resume_token": token}))
        events = await read_to_close(ws)
    assert events[0]["type"] == "session.ready" and events[0]["offset"] == 5 * RATE
    final = events[-1]
    assert final["type"] == "transcript.final" and final["duration"] == 5.0
    assert [s["id"] for s in final["segments"]][0] == "seg-0000"
    assert ws.close_code == 1000


async def test_a_full_disk_ends_one_session_and_frees_its_space(
    client: TestClient,
    fake: FakeTranscriber,
    server_config: ServerConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk fills mid-session: that session is ended (its final, then storage_failed:
    tests/gateway/test_live_storage.py) and its audio file goes at once, with its rows: the
    next session streams and is acknowledged (before, the session's file kept the disk full,
    every later session failed, and a restart rebuilt the session its client had been told
    had failed). The error is retryable, as protocol.md's table and StorageFailed say (its
    frame said false: a disk-full trial)."""
    real_sync = live_journal_writer.os.fdatasync
    full = {"now": True}

    def sync(fd: int) -> None:
        if full["now"]:
            raise OSError(28, "No space left on device")
        real_sync(fd)

    monkeypatch.setattr(live_journal_writer.os, "fdatasync", sync)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await ws.send_bytes(pcm16(0.5))
        events = await read_to_close(ws)
    assert events[-2]["type"] == "transcript.final" and events[-2]["duration"] == 0.5
    assert events[-1]["code"] == "storage_failed" and events[-1]["retryable"] is True
    assert ws.close_code == StorageFailed.close_code
    audio = server_config.data_dir / "live" / "audio"
    # the error may reach the client before the failed group commits the session's row: wait
    # for the discard (file, then row), not for an empty table
    await wait_until(lambda: not list(audio.iterdir()))
    await wait_until(lambda: journal_rows(server_config.data_dir) == [])
    full["now"] = False  # the space is back
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await ws.send_bytes(pcm16(0.5))
        ack = (await read_until(ws, "audio.ack"))[-1]
        assert ack["offset"] == RATE // 2
        await ws.send_json({"type": "end"})
        assert (await read_to_close(ws))[-1]["type"] == "transcript.final"


async def test_a_failing_disk_ends_the_session_with_storage_failed(
    client: TestClient, fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal cannot sync (ENOSPC): acks could never come, so the session is ended (its
    final, none of its audio acknowledged), storage_failed follows (close 4507), and its
    backend session is freed."""

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(live_journal_writer.os, "fdatasync", full_disk)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        assert (await ws.receive_json())["type"] == "session.ready"
        await ws.send_bytes(pcm16(0.5))
        events = await read_to_close(ws)
    assert events[-2]["type"] == "transcript.final" and events[-2]["duration"] == 0.5
    assert events[-1]["type"] == "error" and events[-1]["code"] == "storage_failed"
    assert ws.close_code == 4507
    assert not any(e["type"] == "audio.ack" for e in events)
    await wait_until(lambda: fake.sessions[0].log.aborted)
    assert metric(client, "livemeet_live_journal_failures_total", result="ended") == 1


async def test_a_session_outlives_its_engine_worker(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """The engine worker dies mid-meeting (engine_unavailable, retryable, to every session:
    an OOM kill in a trial lost the session and its transcript). The session is rebuilt in
    the engine started again, from its finals and its journalled audio; its socket stays
    and sees no error; the final covers the whole meeting, the first final's id kept."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        seen = await stream_acked(ws, fake, 3.5)
        assert [e["id"] for e in seen if e["type"] == "segment.final"] == ["seg-0000"]
        fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
        await wait_until(lambda: len(fake.sessions) == 2)
        rebuilt = fake.sessions[1]
        assert rebuilt.log.options.restore is not None
        assert [s.id for s in rebuilt.log.options.restore.finals] == ["seg-0000"]
        await wait_until(lambda: rebuilt.log.num_samples == 3.5 * RATE)  # all of it again
        for _ in range(4):
            await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert not [e for e in events if e["type"] == "error"] and ws.close_code == 1000
    # the rebuilt backend session numbers its partials from 1 again (a trial saw rev 11,
    # then 1): the session's own numbering goes on increasing
    before = [e["rev"] for e in seen if e["type"] == "segment.partial"]
    after = [e["rev"] for e in events if e["type"] == "segment.partial"]
    assert before and after and min(after) > max(before)
    final = events[-1]
    assert final["type"] == "transcript.final" and final["duration"] == 5.5
    ids = [s["id"] for s in final["segments"]]
    assert ids[0] == "seg-0000" and len(ids) == len(set(ids)) >= 2
    assert rebuilt.log.num_samples == 5.5 * RATE
    text = await (await client.get("/metrics")).text()
    assert 'livemeet_live_recoveries_total{result="rebuilt"} 1.0' in text


async def test_a_session_whose_engine_does_not_come_back_fails_as_before(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """An engine gone for good (the gateway gave up restarting it): the session gets the
    engine's error (retryable), as without a journal, and nothing is rebuilt."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 1.0)
        fake.gone_for_good = True
        fake._ready = False
        fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
        events = await read_to_close(ws)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "engine_unavailable"
    assert ws.close_code == 4503 and len(fake.sessions) == 1
    text = await (await client.get("/metrics")).text()
    assert 'livemeet_live_recoveries_total{result="failed"} 1.0' in text


async def test_an_end_the_lost_engine_refused_ends_the_rebuilt_session(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """The client's `end` reaches a backend session whose worker just died (its end raises
    engine_unavailable): the end is not lost, the rebuilt session is ended, and the client
    gets its final, no error."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 2.0)
        dead = fake.sessions[0]

        async def lost_end() -> None:
            raise EngineUnavailable("the engine failed: exited with code -9")

        dead.end = lost_end  # type: ignore[method-assign]
        await ws.send_json({"type": "end"})
        await wait_until(lambda: client.app[SESSIONS_KEY].get(dead.id).ended)
        dead.fail(EngineUnavailable("the engine failed: exited with code -9"))
        events = await read_to_close(ws)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 2.0
    assert not [e for e in events if e["type"] == "error"] and ws.close_code == 1000
    assert fake.sessions[1].log.ended and fake.sessions[1].log.num_samples == 2 * RATE


async def stream_acked(ws: Any, fake: FakeTranscriber, seconds: float) -> list[Any]:
    """Send `seconds` of audio in 0.5-s frames; read until all of it is acknowledged."""
    for _ in range(round(seconds / 0.5)):
        await ws.send_bytes(pcm16(0.5))
    await wait_until(lambda: fake.sessions[-1].log.num_samples == round(seconds * RATE))
    events = await read_until(ws, "audio.ack")
    while events[-1]["type"] != "audio.ack" or events[-1]["offset"] < seconds * RATE:
        events += await read_until(ws, "audio.ack")
    return events


async def test_a_session_the_backend_refuses_while_fed_is_discarded_and_the_server_starts(
    aiohttp_client: ClientFactory,
    fake: FakeTranscriber,
    server_config: ServerConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rebuilt session's backend refuses its stored audio (bad restored finals end the
    engine's session with invalid_request, which its next append raises): the session is
    discarded and the server starts (before, the failure adopted the session in the journal a
    second time: InternalError out of the start, at every start, as the session was kept)."""
    await journal_a_session(server_config.data_dir / "live", "a-token", 4.0, stored_finals(1))

    async def refused(self: FakeSession, samples: Any) -> None:
        raise InvalidRequest("restored finals overlap")

    monkeypatch.setattr(FakeSession, "append", refused)
    client = await aiohttp_client(create_app(server_config, fake))
    assert len(client.app[SESSIONS_KEY]) == 0
    assert fake.sessions[0].log.aborted
    await wait_until(lambda: journal_rows(server_config.data_dir) == [])
    assert not list((server_config.data_dir / "live" / "audio").iterdir())


async def test_a_session_the_backend_refuses_to_open_is_discarded(
    aiohttp_client: ClientFactory, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    await journal_a_session(server_config.data_dir / "live", "a-token", 4.0, stored_finals(1))
    fake.open_error = InvalidRequest("restored finals overlap")
    client = await aiohttp_client(create_app(server_config, fake))
    assert len(client.app[SESSIONS_KEY]) == 0 and not fake.sessions
    await wait_until(lambda: journal_rows(server_config.data_dir) == [])
    assert not list((server_config.data_dir / "live" / "audio").iterdir())


async def test_a_finalize_the_lost_engine_refused_is_made_on_the_rebuilt_session(
    client: TestClient, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """The client's `finalize` reaches a backend session whose worker just died (it raises
    engine_unavailable, as EngineClient's does): it is made again on the rebuilt session, as
    an append is (before, the error failed the socket, and the session and its journalled
    audio were dropped)."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 2.0)
        dead = fake.sessions[0]
        refused = asyncio.Event()

        async def lost_finalize() -> None:
            refused.set()
            raise EngineUnavailable("the engine failed: exited with code -9")

        dead.finalize = lost_finalize  # type: ignore[method-assign]
        await ws.send_json({"type": "finalize"})
        await asyncio.wait_for(refused.wait(), 2)
        dead.fail(EngineUnavailable("the engine failed: exited with code -9"))
        await wait_until(lambda: len(fake.sessions) == 2)
        await wait_until(lambda: fake.sessions[1].log.num_finalize == 1)
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 2.0
    assert not [e for e in events if e["type"] == "error"] and ws.close_code == 1000


async def test_audio_after_the_journal_failed_the_session_is_no_internal_error(
    tmp_path: Path, fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fails: the session leaves the journal and is ended (its final comes), while
    its socket is still open; a frame the client sent meanwhile is dropped without a word
    (before, it raised InternalError, "not open in the journal": the client got
    internal_error, not the storage_failed it was sent; then, ended, the backend would
    refuse it)."""

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(live_journal_writer.os, "fdatasync", full_disk)
    journal = LiveJournal(tmp_path, commit_interval_s=0.01)
    journal.start(asyncio.get_running_loop())
    await fake.start()
    sessions = LiveSessions(60.0, 60.0, GatewayMetrics.create(), None, journal, fake)
    sink = RecordingSink()
    holder = await open_live(sessions, fake, sink)
    await holder.append(sink, pcm16(0.5))
    await wait_until(lambda: holder.journal_closed)
    assert holder.storage_error is not None and holder.storage_error.code == "storage_failed"
    await wait_until(lambda: isinstance(holder.replay.terminal, TranscriptFinal))
    assert await holder.append(sink, pcm16(0.5)) == 0
    assert holder.num_frames_accepted == RATE // 2 and holder.num_frames_durable == 0
    await sessions.close()
    await journal.close()


async def test_an_engine_lost_again_while_the_session_is_rebuilt_rebuilds_it_again(
    client: TestClient, fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine worker dies again while the rebuilt session is fed its journalled audio
    (an OOM kill in a crash loop): the session is rebuilt once more, from all of its audio,
    and the client sees no error (before, the append's engine_unavailable escaped the pump:
    internal_error to the client, and the audio fed so far was all the session counted)."""
    real_append = FakeSession.append

    async def append(self: FakeSession, samples: Any) -> None:
        if self.id == "fake-1" and self.log.num_samples >= RATE:
            self.fail(EngineUnavailable("the engine failed: exited with code -9"))
            raise EngineUnavailable("the engine is not available")
        await real_append(self, samples)

    monkeypatch.setattr(live_journal, "JOURNAL_READ_CHUNK_BYTES", RATE)  # 0.5-s reads
    monkeypatch.setattr(FakeSession, "append", append)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 2.0)
        fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
        await wait_until(lambda: len(fake.sessions) == 3)
        await wait_until(lambda: fake.sessions[2].log.num_samples == 2 * RATE)
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert not [e for e in events if e["type"] == "error"] and ws.close_code == 1000
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 2.5
    assert fake.sessions[2].log.num_samples == 2.5 * RATE


async def test_a_session_detached_while_its_engine_restarts_can_be_resumed(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """The socket drops while the engine worker restarts (the session waits to be rebuilt):
    the client's resume is let in, and gets its session once the engine is back (before,
    every connection was refused with engine_unavailable while the engine was not ready, a
    close the clients take as final: the session the server kept was lost to its client)."""
    ready, _ = await detached_session(client, fake, 2.0)
    fake._ready = False  # the worker died: restarting
    fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        await asyncio.sleep(0.3)
        fake._ready = True
        resumed = await asyncio.wait_for(ws.receive_json(), 5)
        assert resumed["type"] == "session.ready" and resumed["offset"] == 2 * RATE
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 2.0
    assert len(fake.sessions) == 2 and fake.sessions[1].log.num_samples == 2 * RATE


async def test_a_resume_is_told_the_durable_offset_and_held_frames_sent_again_are_skipped(
    client: TestClient, fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk stalls with half a second taken in and not yet synced when the socket drops:
    `session.ready`'s offset is the durable audio only (before, the resume waited 1 s, then
    counted the unsynced frames too: a crash then lost audio the client had dropped). The
    client sends on from that offset; the frames the session held already are recognised by
    their position and skipped, so the backend, the journal and the audio metric get each
    frame once."""
    disk = threading.Event()
    disk.set()
    real_sync = live_journal_writer.os.fdatasync

    def stalling_sync(fd: int) -> None:
        disk.wait(10)
        real_sync(fd)

    monkeypatch.setattr(live_journal_writer.os, "fdatasync", stalling_sync)
    try:
        ws = await client.ws_connect("/v1/live")
        await ws.send_json(START)
        ready = await ws.receive_json()
        await stream_acked(ws, fake, 1.0)
        disk.clear()
        await ws.send_bytes(pcm16(0.5))
        await wait_until(lambda: fake.sessions[0].log.num_samples == 1.5 * RATE)
        await detach(client, ws)
        async with client.ws_connect("/v1/live") as ws:
            await ws.send_json(resume_start(ready))
            resumed = await read_until(ws, "session.ready")
            assert resumed[-1]["offset"] == RATE  # what is on disk, not the 1.5 s taken in
            await ws.send_bytes(ramp_pcm(1.0, start=RATE))  # 1-2 s: its first half is held
            await wait_until(lambda: fake.sessions[0].log.num_samples == 2 * RATE)
            disk.set()
            events = await read_until(ws, "audio.ack")
            while events[-1]["type"] != "audio.ack" or events[-1]["offset"] < 2 * RATE:
                events += await read_until(ws, "audio.ack")
            [(_, _, frames)] = journal_rows(client.app[CONFIG_KEY].data_dir)
            assert frames == 2 * RATE  # nothing twice in the journal either
            await ws.send_json({"type": "end"})
            final = (await read_to_close(ws))[-1]
    finally:
        disk.set()
    assert final["type"] == "transcript.final" and final["duration"] == 2.0
    assert fake.sessions[0].log.num_samples == 2 * RATE
    # the half second sent twice is counted once (before, 2.5 s)
    metrics = await (await client.get("/metrics")).text()
    assert 'livemeet_audio_received_seconds_total{kind="live"} 2.0' in metrics


async def test_an_append_cut_off_by_its_dropped_socket_loses_none_of_the_audio_sent_again(
    fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial over the real engine: a client's 10-s frame was on its way to the engine (the
    engine client awaits a shared-memory write for a frame that large) when its socket
    dropped, and `serve` cancels a handler whose client hung up. The decoder had counted
    the frame, the backend never got it, so after the resume the first 10 s the client sent
    again were skipped as held: the final said 100 s of the 110 sent. Now the append runs
    to its end (a resume waits for it), and the audio sent again is taken once."""
    await fake.start()
    sessions = LiveSessions(60.0, 60.0, GatewayMetrics.create())
    sink = RecordingSink()
    holder = await open_live(sessions, fake, sink)
    audio = ramp_pcm(3.0)
    second = 2 * RATE  # bytes of one second of mono PCM16
    await holder.append(sink, audio[:second])
    session = fake.sessions[0]
    gate = asyncio.Event()
    passed = session.append

    async def stalled(samples: Any) -> None:
        await gate.wait()
        await passed(samples)

    monkeypatch.setattr(session, "append", stalled)
    cut = asyncio.create_task(holder.append(sink, audio[second : 2 * second]))
    await asyncio.sleep(0.05)  # inside the backend's append
    cut.cancel()  # the socket dropped: its handler is cancelled
    with pytest.raises(asyncio.CancelledError):
        await cut
    gate.set()
    await sessions.disconnect(holder, sink, keep=True)
    again = RecordingSink()
    async with holder.lock:  # as a resume attaches its socket
        holder.attach(again, resumed=True)
    # the client sends on from the offset, in half-second frames
    for start in range(holder.client_offset * 2, len(audio), second // 2):
        await holder.append(again, audio[start : start + second // 2])
    assert session.log.num_samples == holder.num_frames_accepted == 3 * RATE
    await holder.end(again)
    await wait_until(lambda: isinstance(holder.replay.terminal, TranscriptFinal))
    assert isinstance(holder.replay.terminal, TranscriptFinal)
    assert holder.replay.terminal.duration_s == 3.0
    await holder.release()


async def test_a_resume_waiting_for_its_rebuilt_session_answers_pings(
    aiohttp_client: ClientFactory, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """A resume that comes while the engine worker restarts waits for its session to be
    rebuilt (a model loads in seconds to a minute); meanwhile its socket is read, so the
    client's pings are answered (before, nothing read it: `livemeet stream`'s websockets
    library, pinging every 20 s, dropped the connection after ~40 s, 1006), and the idle
    timeout, which the wait outlasts here, starts again once the session is back (before, it
    had run out, and the session was ended the moment it was resumed)."""
    client = await gateway_client(aiohttp_client, server_config, fake, idle_timeout_s=0.5)
    ready, _ = await detached_session(client, fake, 2.0)
    fake._ready = False  # the worker died: restarting
    fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
    async with client.ws_connect("/v1/live", autoping=False) as ws:
        await ws.send_json(resume_start(ready))
        for _ in range(3):  # 0.9 s: past the idle timeout
            await asyncio.sleep(0.3)
            await ws.ping(b"still there?")
            pong = await asyncio.wait_for(ws.receive(), 1)
            assert pong.type is WSMsgType.PONG and pong.data == b"still there?"
        fake._ready = True
        resumed = await asyncio.wait_for(ws.receive_json(), 5)
        assert resumed["type"] == "session.ready" and resumed["offset"] == 2 * RATE
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert not [e for e in events if e["type"] == "error"] and ws.close_code == 1000
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 2.5


async def test_a_failed_session_is_not_rebuilt_after_a_shutdown_within_its_window(
    aiohttp_client: ClientFactory, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    """A detached session fails with the engine's error (gone for good); the server shuts
    down within its detach window. Nothing of it is left in the journal, and the next start
    rebuilds nothing (before, the shutdown kept it, as it keeps unfinished sessions, and the
    next start rebuilt a session its client had been told had failed)."""
    client = await aiohttp_client(create_app(server_config, fake))
    ready, _ = await detached_session(client, fake, 2.0)
    holder = client.app[SESSIONS_KEY].get(ready["session_id"])
    fake.gone_for_good = True
    fake._ready = False
    fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
    await wait_until(lambda: holder.replay.terminal is not None)
    assert isinstance(holder.replay.terminal, Error)
    await client.close()  # the shutdown: well within the 60-s window
    assert journal_rows(server_config.data_dir) == []
    assert not list((server_config.data_dir / "live" / "audio").iterdir())
    again = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, again))
    assert len(client.app[SESSIONS_KEY]) == 0 and not again.sessions


async def test_a_finished_session_whose_journal_delete_failed_is_not_rebuilt(
    aiohttp_client: ClientFactory,
    fake: FakeTranscriber,
    server_config: ServerConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The transaction that drops a finished session's rows fails (a full disk; here a
    trigger): its transcript is stored already, so the next start finishes it in the journal,
    rows and audio, instead of rebuilding it and storing its transcript a second time."""
    client = await aiohttp_client(create_app(server_config, fake))
    db = server_config.data_dir / "live" / live_journal.DB_NAME
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER full_disk BEFORE DELETE ON sessions "
            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
        )
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        await stream_acked(ws, fake, 2.0)
        await ws.send_json({"type": "end"})
        assert (await read_to_close(ws))[-1]["type"] == "transcript.final"
    await client.app[STORE_KEY].flush()
    await wait_until(lambda: "could not be stored" in caplog.text)  # its record's statements
    path = f"/v1/sessions/{ready['session_id']}/transcript"
    params = {"token": ready["captions_token"]}
    stored = await (await client.get(path, params=params)).json()
    await client.close()
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER full_disk")  # the space is back
    assert journal_rows(server_config.data_dir) == [(ready["session_id"], 1, 2 * RATE)]

    again = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, again))
    assert len(client.app[SESSIONS_KEY]) == 0 and not again.sessions
    await wait_until(lambda: journal_rows(server_config.data_dir) == [])
    await wait_until(lambda: not list((server_config.data_dir / "live" / "audio").iterdir()))
    assert await (await client.get(path, params=params)).json() == stored
