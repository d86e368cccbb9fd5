"""A live session whose journal fails mid-meeting (a full, read-only or failing disk) is ended
as by its client's `end`, not failed (docs/protocol.md: `storage_failed`, and "A restart loses
nothing acknowledged"): its `transcript.final` covers all the audio the backend took in and goes
to its socket, its captions and the transcript store (where that can write), then its socket
closes with storage_failed (4507). Over a real aiohttp server and the fake backend, the disk
made to fail as tests/gateway/test_live_durable.py does (the journal's fdatasync raising)."""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from livemeet.backends.scripted import DEFAULT_SCRIPT
from livemeet.config import ServerConfig
from livemeet.errors import EngineUnavailable, NotFound, SessionTakenOver, StorageFailed
from livemeet.gateway import live_journal_writer
from livemeet.gateway.app import create_app
from livemeet.gateway.keys import REGISTRY_KEY, SESSIONS_KEY, STORE_KEY
from livemeet.gateway.transcript_store import TranscriptStore, live_transcript_id
from livemeet.transcriber import TranscriptFinal
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeSession, FakeTranscriber
from tests.gateway.test_live_durable import journal_rows, stream_acked
from tests.gateway.test_live_resume import (
    detach,
    detached_session,
    metric,
    of_type,
    read_to_close,
    read_until,
    resume_start,
)
from tests.gateway.test_live_revise import REVISED, scripted_client
from tests.gateway.test_ws_captions import subscribe
from tests.gateway.test_ws_live import START, expect_error, wait_until

RATE = 16_000


def enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


class Disk:
    """The data dir's disk as the journal's writer sees it: while `full`, its audio syncs
    fail with ENOSPC (the transcript store writes with fsync, not fdatasync: it still can)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        real_sync = live_journal_writer.os.fdatasync

        def sync(fd: int) -> None:
            if self.full:
                raise enospc()
            real_sync(fd)

        monkeypatch.setattr(live_journal_writer.os, "fdatasync", sync)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    return Disk(monkeypatch)


async def fill_the_disk(ws: Any, fake: FakeTranscriber, disk: Disk, seconds: float) -> None:
    """The disk fills as the session's next `seconds` of audio comes: the backend takes it,
    the journal cannot sync it, and the server ends the session (its backend's `end`)."""
    session = fake.sessions[-1]
    before = session.log.num_samples
    disk.full = True
    await ws.send_bytes(pcm16(seconds))
    await wait_until(lambda: session.log.num_samples == before + round(seconds * RATE))
    await wait_until(lambda: session.log.ended)


async def read_final_to_close(ws: Any, fake: FakeTranscriber) -> list[dict[str, Any]]:
    """Let the backend's final out (`fake.end_gate`) while the client reads, and read to the
    close: an aiohttp test client that reads the server's close only later answers it on a
    connection the server has closed meanwhile, and reports 1006 instead of its code."""
    assert fake.end_gate is not None
    reading = asyncio.create_task(read_to_close(ws))
    fake.end_gate.set()
    return await reading


async def reference_final(client: TestClient, fake: FakeTranscriber, seconds: float) -> Any:
    """The `transcript.final` of the same audio streamed (in 0.5-s frames) and ended by its
    client, on a disk that works."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, seconds)
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert ws.close_code == 1000
    return events[-1]


def stored_file(client: TestClient, session_id: str) -> Any:
    return client.app[STORE_KEY].directory / f"{live_transcript_id(session_id)}.json"


async def test_a_session_whose_disk_fills_mid_meeting_gets_its_final_then_4507(
    client: TestClient, fake: FakeTranscriber, disk: Disk, server_config: ServerConfig
) -> None:
    """The disk fills 3.5 s into a meeting: the session failed (storage_failed, no final,
    its audio deleted), and everything after its last final was lost, though the backend
    held the meeting. Now it is ended as by its client's `end`: what the client sends after
    (audio, `finalize`, `end`) is ignored and nothing more is acknowledged, a rename still
    applies, and its transcript.final covers all the audio the backend took in (the same
    final as the same audio ended by its client), then storage_failed and 4507, saying the
    final is stored; its captions get the final and 1000, as at any session's end; the
    transcript resource serves it as a finished session's."""
    fake.end_gate = asyncio.Event()  # the final waits: what the client sends meanwhile
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        captions = await subscribe(client, ready)
        seen = await stream_acked(ws, fake, 3.5)  # a final (at 3 s), all of it acknowledged
        await fill_the_disk(ws, fake, disk, 0.5)
        await ws.send_bytes(pcm16(0.5))  # after the end: not taken, not acknowledged
        await ws.send_json({"type": "finalize"})
        await ws.send_json({"type": "end"})
        await ws.send_json({"type": "speaker.rename", "speaker": "S01", "name": "Alice"})
        seen += await read_until(ws, "speaker.renamed")
        events = seen + await read_final_to_close(ws, fake)
        overlay = await read_to_close(captions)
    assert overlay[-1] == of_type(events, "transcript.final")[0] and captions.close_code == 1000
    assert not of_type(overlay, "error")
    session = fake.sessions[0]
    assert session.log.num_samples == 4 * RATE and session.log.num_finalize == 0
    assert max(e["offset"] for e in of_type(events, "audio.ack")) == 3.5 * RATE
    [final] = of_type(events, "transcript.final")
    assert final["duration"] == 4.0
    error = events[-1]
    assert error["type"] == "error" and error["code"] == "storage_failed" and error["retryable"]
    assert "No space left on device" in error["message"]
    assert "ended early" in error["message"] and "was sent and is stored" in error["message"]
    assert "cannot be resumed" in error["message"]
    assert ws.close_code == StorageFailed.close_code == 4507
    assert events.index(final) == len(events) - 2  # the final, then the error
    # its journal entry and audio went (the space back, and nothing for a restart to rebuild)
    assert journal_rows(server_config.data_dir) == []
    assert not list((server_config.data_dir / "live" / "audio").iterdir())

    await client.app[STORE_KEY].flush()
    assert stored_file(client, ready["session_id"]).exists()
    path = f"/v1/sessions/{ready['session_id']}/transcript"
    response = await client.get(
        path, params={"token": ready["captions_token"], "response_format": "diarized_json"}
    )
    assert response.status == 200 and response.headers["X-Livemeet-Transcript-Status"] == "final"
    body = await response.json()
    assert [s["id"] for s in body["segments"]] == [s["id"] for s in final["segments"]]
    assert body["duration"] == 4.0 and body["speakers"] == {"S01": "Alice"}

    fake.end_gate = None
    disk.full = False
    reference = await reference_final(client, fake, 4.0)
    assert final["segments"] == reference["segments"] and len(final["segments"]) == 2
    assert final["duration"] == reference["duration"]
    assert metric(client, "livemeet_live_journal_failures_total", result="ended") == 1
    assert metric(client, "livemeet_live_journal_failures_total", result="failed") == 0
    assert metric(client, "livemeet_errors_total", code="storage_failed") == 1


async def test_over_the_scripted_backend_the_final_is_the_normal_ends_and_its_revision_follows(
    aiohttp_client: ClientFactory, server_config: ServerConfig, tmp_path: Path, disk: Disk
) -> None:
    """Over the real engine boundary (the scripted backend, with a revision): the disk fills
    6 s into the meeting; the final is the one the same 6 s ended by the client get, its
    promised revision still follows (the whole meeting it took in), then storage_failed and
    4507 (the revision's wait included, the session counts as ended)."""
    script = replace(DEFAULT_SCRIPT, revised=REVISED)
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)

    async def stream(ws: Any, seconds: float) -> None:
        """Send `seconds` of audio in 0.5-s frames; read until all of it is acknowledged."""
        for _ in range(round(seconds / 0.5)):
            await ws.send_bytes(pcm16(0.5))
        acked = 0
        while acked < seconds * RATE:
            acked = (await read_until(ws, "audio.ack"))[-1]["offset"]

    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        assert ready["revise"] is True
        await stream(ws, 5.5)
        disk.full = True
        await ws.send_bytes(pcm16(0.5))
        events = await read_to_close(ws)
    assert [e["type"] for e in events[-3:]] == ["transcript.final", "transcript.revised", "error"]
    final = events[-3]
    assert final["duration"] == 6.0
    assert events[-1]["code"] == "storage_failed" and ws.close_code == 4507
    assert "ended early" in events[-1]["message"]
    disk.full = False
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream(ws, 6.0)
        await ws.send_json({"type": "end"})
        reference = of_type(await read_to_close(ws), "transcript.final")[0]
    assert ws.close_code == 1000
    assert final["segments"] == reference["segments"] and final["segments"]


async def test_a_final_the_store_cannot_write_is_sent_all_the_same(
    client: TestClient, fake: FakeTranscriber, disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transcript store cannot write either (the disk stays full): the final still goes
    to the client, and the error says it could not be stored, so the client keeps its copy."""

    def refused(store: TranscriptStore, transcription_id: str, body: str) -> None:
        raise enospc()

    monkeypatch.setattr(TranscriptStore, "_write_file", refused)
    fake.end_gate = asyncio.Event()
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        await stream_acked(ws, fake, 1.0)
        await fill_the_disk(ws, fake, disk, 0.5)
        events = await read_final_to_close(ws, fake)
    [final] = of_type(events, "transcript.final")
    assert final["duration"] == 1.5
    assert events[-1]["code"] == "storage_failed" and ws.close_code == 4507
    assert "was sent but could not be stored" in events[-1]["message"]
    await client.app[STORE_KEY].flush()
    assert not stored_file(client, ready["session_id"]).exists()


@pytest.fixture
def failing_commits(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """While the event returned is set, a journal group commit's transaction fails as on a
    full disk (SQLITE_FULL at COMMIT): every open session's storage fails at once, a
    detached one's too (Writer._commit_each's path)."""
    full = threading.Event()
    real_commit = live_journal_writer.Writer._commit

    def commit(writer: live_journal_writer.Writer, group: Any) -> bool:
        if not full.is_set() or not group.statements:
            return real_commit(writer, group)
        writer._fail_all(StorageFailed("the server could not store this session (database "
                                       "or disk is full)"))  # fmt: skip
        return False

    monkeypatch.setattr(live_journal_writer.Writer, "_commit", commit)
    yield full


async def test_a_detached_session_whose_storage_fails_is_ended_and_its_final_kept(
    client: TestClient, fake: FakeTranscriber, failing_commits: threading.Event
) -> None:
    """The disk fills while a session waits for its client's resume: a group commit fails,
    and every open session with it. The detached one is ended too (it was failed and
    dropped at once): its final is stored, and a resume gets what a resume of a finished
    session gets, `session.ready` (all its audio), the replay and its transcript.final,
    then what its socket would have got: storage_failed and 4507, saying it was ended early
    and its final stored. The attached one gets its final, then 4507."""
    ready, _ = await detached_session(client, fake, 2.0)
    detached = client.app[SESSIONS_KEY].get(ready["session_id"])
    assert detached is not None
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 1.0)
        failing_commits.set()
        await ws.send_bytes(pcm16(0.5))  # its group's commit fails
        events = await read_to_close(ws)
    assert of_type(events, "transcript.final")[0]["duration"] == 1.5
    assert events[-1]["code"] == "storage_failed" and ws.close_code == 4507
    await wait_until(lambda: isinstance(detached.replay.terminal, TranscriptFinal))
    assert fake.sessions[0].log.ended and not detached.dropped
    await client.app[STORE_KEY].flush()
    assert stored_file(client, ready["session_id"]).exists()

    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        resumed = await read_to_close(ws)
    assert resumed[0]["type"] == "session.ready" and resumed[0]["resumed"] is True
    assert resumed[0]["offset"] == 2 * RATE
    assert [e["type"] for e in resumed[-2:]] == ["transcript.final", "error"]
    assert resumed[-2]["duration"] == 2.0
    assert resumed[-1]["code"] == "storage_failed" and ws.close_code == 4507
    assert "ended early" in resumed[-1]["message"]
    assert "was sent and is stored" in resumed[-1]["message"]
    assert metric(client, "livemeet_live_journal_failures_total", result="ended") == 2


async def ended_for_its_storage(
    client: TestClient, fake: FakeTranscriber, disk: Disk
) -> tuple[Any, dict[str, Any]]:
    """A socket (left open) and its `session.ready` whose session took 1 s of audio, all
    acknowledged, then 0.5 s more as the disk filled: the server is ending it, its final
    held back until `fake.end_gate` is set."""
    fake.end_gate = asyncio.Event()
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await stream_acked(ws, fake, 1.0)
    await fill_the_disk(ws, fake, disk, 0.5)
    return ws, ready


@pytest.mark.parametrize("how", ["dropped", "taken_over"])
async def test_a_resume_while_a_session_is_ended_for_its_storage_gets_its_final_then_4507(
    client: TestClient, fake: FakeTranscriber, disk: Disk, how: str
) -> None:
    """The disk fills, and while the final is decoded the client's socket drops (or a
    resume takes it over, the old socket still open): the resumed socket gets
    `session.ready` (ENDING: its audio ignored, none acknowledged), the final, then what
    the first socket gets, storage_failed and 4507 saying the session was ended early and
    its final stored. It got the final and 1000: never told why the session ended, nor
    whether its final was stored."""
    old, ready = await ended_for_its_storage(client, fake, disk)
    if how == "dropped":
        await detach(client, old)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        if how == "taken_over":
            await expect_error(old, SessionTakenOver)
            await old.close()
        resumed = await ws.receive_json()
        assert resumed["type"] == "session.ready" and resumed["resumed"] is True
        await ws.send_bytes(pcm16(0.5))  # ENDING: ignored
        events = await read_final_to_close(ws, fake)
    assert [e["type"] for e in events[-2:]] == ["transcript.final", "error"]
    assert not of_type(events, "audio.ack")
    assert events[-2]["duration"] == 1.5 and fake.sessions[0].log.num_samples == 1.5 * RATE
    error = events[-1]
    assert error["code"] == "storage_failed" and ws.close_code == 4507
    assert "No space left on device" in error["message"] and "ended early" in error["message"]
    assert "was sent and is stored" in error["message"]
    assert metric(client, "livemeet_live_journal_failures_total", result="ended") == 1


async def test_a_resume_after_the_final_of_a_session_ended_for_its_storage_gets_4507(
    client: TestClient, fake: FakeTranscriber, disk: Disk
) -> None:
    """The disk fills, the socket drops before the final, and the final comes while the
    session waits for its resume: the resume gets `session.ready` (all its audio), the
    final, then storage_failed and 4507 saying the session was ended early and its final
    stored (it got 1000)."""
    old, ready = await ended_for_its_storage(client, fake, disk)
    await detach(client, old)
    holder = client.app[SESSIONS_KEY].get(ready["session_id"])
    assert holder is not None
    fake.end_gate.set()
    await wait_until(lambda: isinstance(holder.replay.terminal, TranscriptFinal))
    await client.app[STORE_KEY].flush()
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        events = await read_to_close(ws)
    assert events[0]["type"] == "session.ready" and events[0]["offset"] == 1.5 * RATE
    assert [e["type"] for e in events[-2:]] == ["transcript.final", "error"]
    assert events[-2]["duration"] == 1.5
    assert events[-1]["code"] == "storage_failed" and ws.close_code == 4507
    assert "ended early" in events[-1]["message"]
    assert "was sent and is stored" in events[-1]["message"]


async def test_a_session_whose_storage_fails_after_its_end_gets_its_final(
    client: TestClient, fake: FakeTranscriber, failing_commits: threading.Event
) -> None:
    """The client sent `end`, and the disk fails while the final is decoded (here a rename's
    commit meets it): the session failed, no final for a meeting its client had finished.
    The final now comes as asked, the rename answered before it, then storage_failed and
    4507, whose message says the session's audio is no longer stored (not that it ended
    early)."""
    fake.end_gate = asyncio.Event()
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 1.0)
        await ws.send_json({"type": "end"})
        await wait_until(lambda: fake.sessions[0].log.ended)
        failing_commits.set()
        await ws.send_json({"type": "speaker.rename", "speaker": "S01", "name": "Alice"})
        await read_until(ws, "speaker.renamed")
        events = await read_final_to_close(ws, fake)
    assert [e["type"] for e in events[-2:]] == ["transcript.final", "error"]
    assert events[-2]["duration"] == 1.0
    message = events[-1]["message"]
    assert events[-1]["code"] == "storage_failed" and ws.close_code == 4507
    assert "the session's audio is no longer stored" in message and "early" not in message
    assert "was sent and is stored" in message


@pytest.mark.parametrize("keep", [True, False])
async def test_a_shutdown_before_the_final_of_a_session_ended_for_its_storage_says_it_is_lost(
    client: TestClient, fake: FakeTranscriber, disk: Disk, keep: bool
) -> None:
    """The server stops while a session it ended for its storage waits for its final: the
    drain does not keep it for the next start (its journal entry is gone), and a final not
    out in time leaves the client storage_failed saying no final comes, not
    server_restarting (a resume after the restart would find no session) nor
    engine_unavailable. It counts as a storage failure with no final (`failed`): it was
    counted nowhere, neither ended nor failed."""
    fake.end_gate = asyncio.Event()  # the final never comes
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 1.0)
        await fill_the_disk(ws, fake, disk, 0.5)
        reading = asyncio.create_task(read_to_close(ws))
        assert client.app[SESSIONS_KEY].streaming().with_audio == 0  # none for the next start
        await client.app[REGISTRY_KEY].drain_all(0.3, keep=keep)
        events = await reading
    assert events[-1]["code"] == StorageFailed.code and ws.close_code == 4507
    assert "shut down before the session's final transcript came" in events[-1]["message"]
    assert "no final transcript comes" in events[-1]["message"]
    assert not of_type(events, "transcript.final")
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)  # dropped
    assert metric(client, "livemeet_live_journal_failures_total", result="failed") == 1
    assert metric(client, "livemeet_live_journal_failures_total", result="ended") == 0


async def test_a_shutdown_while_the_final_is_being_stored_does_not_say_no_final_comes(
    client: TestClient, fake: FakeTranscriber, disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final went out, and its socket waits (at most 2 s) to say whether the store wrote
    it (a failing disk: the write hangs) when a shutdown's drain runs out: its error says the
    final was sent and whether it is stored is not known yet. It said the server shut down
    before the final came, and that no final comes, after the final."""
    writing = threading.Event()
    release = threading.Event()

    def hanging(store: TranscriptStore, transcription_id: str, body: str) -> None:
        writing.set()
        release.wait(10)
        raise enospc()

    monkeypatch.setattr(TranscriptStore, "_write_file", hanging)
    try:
        async with client.ws_connect("/v1/live") as ws:
            await ws.send_json(START)
            await ws.receive_json()
            await stream_acked(ws, fake, 1.0)
            await fill_the_disk(ws, fake, disk, 0.5)
            seen = await read_until(ws, "transcript.final")
            await wait_until(writing.is_set)
            reading = asyncio.create_task(read_to_close(ws))
            await client.app[REGISTRY_KEY].drain_all(0.3, keep=False)
            events = seen + await reading
    finally:
        release.set()
    assert events[-2]["type"] == "transcript.final" and events[-2]["duration"] == 1.5
    error = events[-1]
    assert error["code"] == StorageFailed.code and ws.close_code == 4507
    assert "no final transcript comes" not in error["message"]
    assert "shut down before" not in error["message"]
    assert "whether it is stored is not known yet" in error["message"]


async def test_a_session_ended_for_its_storage_is_not_rebuilt_after_a_restart(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    disk: Disk,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The final waits until the journal's deletion of the session is committed: a crash
    before that rebuilds it at the next start (its client not told anything yet), a crash
    after finds nothing to rebuild, so no client told its session ended finds it rebuilt.
    After a restart it is not rebuilt, a resume gets not_found, and the stored final is
    served."""
    deletion = threading.Event()
    real_commit = live_journal_writer.Writer._commit

    def commit(writer: live_journal_writer.Writer, group: Any) -> bool:
        if any(sql.startswith("DELETE FROM sessions") for _, sql, _ in group.statements):
            deletion.wait(10)  # the discard's commit, held
        return real_commit(writer, group)

    monkeypatch.setattr(live_journal_writer.Writer, "_commit", commit)
    client = await aiohttp_client(create_app(server_config, fake))
    try:
        async with client.ws_connect("/v1/live") as ws:
            await ws.send_json(START)
            ready = await ws.receive_json()
            await stream_acked(ws, fake, 2.0)
            await fill_the_disk(ws, fake, disk, 0.5)
            with pytest.raises(TimeoutError):  # the backend's final is out, the deletion not
                await asyncio.wait_for(read_until(ws, "transcript.final"), 0.5)
            assert [sid for sid, _, _ in journal_rows(server_config.data_dir)] == [
                ready["session_id"]
            ]
            deletion.set()
            events = await read_to_close(ws)
    finally:
        deletion.set()
    assert events[-2]["type"] == "transcript.final" and events[-2]["duration"] == 2.5
    assert ws.close_code == 4507
    assert journal_rows(server_config.data_dir) == []
    await client.close()

    again = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, again))
    assert len(client.app[SESSIONS_KEY]) == 0 and not again.sessions
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        refused = await read_to_close(ws)
    assert refused[-1]["code"] == NotFound.code and ws.close_code == 4404
    path = f"/v1/sessions/{ready['session_id']}/transcript"
    params = {"token": ready["captions_token"], "response_format": "diarized_json"}
    body = await (await client.get(path, params=params)).json()
    assert body["duration"] == 2.5
    assert [s["id"] for s in body["segments"]] == [s["id"] for s in events[-2]["segments"]]


@pytest.mark.parametrize("how", ["refused", "lost"])
async def test_a_session_whose_backend_fails_while_ending_fails_as_before(
    client: TestClient,
    fake: FakeTranscriber,
    disk: Disk,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """The backend cannot end the session (its `end` raises: refused) or dies before its
    final (lost): the session fails as a storage failure did before, storage_failed and
    4507 with no final (its message says so), counted `failed`."""
    if how == "refused":

        async def refused_end(self: FakeSession) -> None:
            raise EngineUnavailable("the engine is not available")

        monkeypatch.setattr(FakeSession, "end", refused_end)
    else:
        fake.end_gate = asyncio.Event()  # its final never comes: the engine dies first
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_acked(ws, fake, 1.0)
        disk.full = True
        await ws.send_bytes(pcm16(0.5))
        if how == "lost":
            await wait_until(lambda: fake.sessions[0].log.ended)
            fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
        events = await read_to_close(ws)
    assert not of_type(events, "transcript.final")
    assert events[-1]["code"] == "storage_failed" and ws.close_code == 4507
    assert "ending it failed (engine_unavailable" in events[-1]["message"]
    assert "no final transcript comes" in events[-1]["message"]
    assert metric(client, "livemeet_live_journal_failures_total", result="failed") == 1
    assert metric(client, "livemeet_live_journal_failures_total", result="ended") == 0


async def test_a_session_with_no_audio_whose_storage_fails_fails_as_before(
    client: TestClient, fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to transcribe (the audio file cannot be made: its folder's sync fails): the
    session fails at once, storage_failed and 4507, no final."""

    def failing_sync(directory: Any) -> None:
        raise enospc()

    monkeypatch.setattr(live_journal_writer, "sync_directory", failing_sync)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        assert (await ws.receive_json())["type"] == "session.ready"
        events = await read_to_close(ws)
    assert events[-1]["code"] == "storage_failed" and ws.close_code == 4507
    assert "it had no audio to transcribe" in events[-1]["message"]
    assert not of_type(events, "transcript.final") and not fake.sessions[0].log.ended
