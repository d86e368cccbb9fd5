"""A graceful shutdown is a restart for live sessions (docs/protocol.md, "Closing" and
"Resume"): with the journal and resume on (`serve --shutdown-live keep`, the default), a
streaming session's audio is put on disk, its client is sent `server_restarting` and a 1012
close, and the session stays unfinished in the journal for the next start, as after a crash.
With resume off, or `--shutdown-live end`, the shutdown drains as before (final, then 1001)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import ClientWebSocketResponse
from aiohttp.test_utils import TestClient

from livemeet.audio.constants import LIVE_ENGINE_POLL_S
from livemeet.config import ServerConfig
from livemeet.errors import EngineUnavailable, ServerRestarting, StorageFailed
from livemeet.gateway.api_keys import ApiKeyStore, store_path
from livemeet.gateway.app import close_live_sockets, create_app
from livemeet.gateway.keys import REGISTRY_KEY, SESSIONS_KEY
from livemeet.gateway.live_protocol import GOING_AWAY, SERVICE_RESTART
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_live_clients import bearer
from tests.gateway.test_live_durable import journal_rows
from tests.gateway.test_live_resume import (
    detach,
    detached_session,
    read_to_close,
    resume_start,
)
from tests.gateway.test_ws_live import START, gateway_client, receive_all, wait_until


async def streaming(
    client: TestClient, fake: FakeTranscriber, seconds: float
) -> tuple[ClientWebSocketResponse, dict[str, Any]]:
    """A session that started and sent `seconds` of 16-kHz audio, all of it taken in: its
    socket and `session.ready`."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready: dict[str, Any] = await ws.receive_json()
    await ws.send_bytes(pcm16(seconds))
    frames = round(seconds * 16000)
    await wait_until(lambda: fake.sessions[-1].log.num_samples == frames)
    return ws, ready


async def test_a_restart_keeps_a_streaming_session_for_the_next_start(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """SIGTERM mid-meeting ended the session (its final, then 1001), and `livemeet stream`
    exited 1 "resend from 30.00 s" (a user trial), while a kill -9 lost nothing. The
    session is now kept: its client gets `server_restarting` and 1012, no final, the backend
    session is not ended, its audio is on disk, and the next start rebuilds it for a resume
    that goes on from all of it."""
    client = await aiohttp_client(create_app(server_config, fake))
    ws, ready = await streaming(client, fake, 2.0)
    reading = asyncio.create_task(receive_all(ws))
    await close_live_sockets(client.app)
    events = await asyncio.wait_for(reading, 5)
    assert events[-1]["type"] == "error" and events[-1]["code"] == ServerRestarting.code
    assert events[-1]["retryable"] is True
    assert ws.close_code == SERVICE_RESTART == ServerRestarting.close_code
    assert not [e for e in events if e["type"] == "transcript.final"]
    assert not fake.sessions[0].log.ended
    await client.close()
    assert journal_rows(server_config.data_dir) == [(ready["session_id"], 0, 2 * 16000)]

    again = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, again))
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        resumed = await ws.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == 2 * 16000, resumed
        await ws.send_bytes(pcm16(1.0))
        await ws.send_json({"type": "end"})
        after = await read_to_close(ws)
    assert after[-1]["type"] == "transcript.final" and after[-1]["duration"] == 3.0
    assert ws.close_code == 1000


async def test_a_kept_session_waits_a_window_from_the_next_start_not_from_the_stop(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """The README said a restart had to come within --live-resume-window of the stop, or the
    session ended (a trial; docs/protocol.md, "Resume", had it right): the session waits in
    the journal however long the server is down, and the next start keeps it a window from
    that start. Down for twice the window here, it is rebuilt and resumed all the same."""
    window_s = 0.5
    client = await gateway_client(
        aiohttp_client, server_config, fake, live_resume_window_s=window_s
    )
    ws, ready = await streaming(client, fake, 1.0)
    reading = asyncio.create_task(receive_all(ws))
    await close_live_sockets(client.app)
    await asyncio.wait_for(reading, 5)
    await client.close()
    await asyncio.sleep(2 * window_s)  # the server is down past the window
    assert journal_rows(server_config.data_dir) == [(ready["session_id"], 0, 16000)]

    again = FakeTranscriber()
    client = await gateway_client(
        aiohttp_client, server_config, again, live_resume_window_s=window_s
    )
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        resumed = await ws.receive_json()
        assert resumed["resumed"] is True and resumed["offset"] == 16000, resumed
        await ws.send_json({"type": "end"})
        after = await read_to_close(ws)
    assert after[-1]["type"] == "transcript.final" and after[-1]["duration"] == 1.0


async def test_a_session_failed_before_the_restart_is_told_its_own_error(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """The session's journal fails (storage_failed: the session is discarded and ended)
    just as the restart's drain comes: the drain keeps nothing for the next start (its
    journal entry is gone), and the client gets its final, then storage_failed and 4507
    (before, `server_restarting` and 1012, and its resume then found no session: 4404)."""
    client = await aiohttp_client(create_app(server_config, fake))
    ws, ready = await streaming(client, fake, 1.0)
    reading = asyncio.create_task(receive_all(ws))
    sessions = client.app[SESSIONS_KEY]
    holder = sessions.get(ready["session_id"])
    assert holder is not None
    [connection] = client.app[REGISTRY_KEY]._connections
    sessions.draining = True  # the restart's shutdown, as close_live_sockets begins it
    sessions._storage_failed(holder, StorageFailed("the disk is full"))
    await connection.drain(keep=True)  # before the forwarder ran: the error is still queued
    await close_live_sockets(client.app)
    events = await asyncio.wait_for(reading, 5)
    assert [e.get("code") for e in events if e["type"] == "error"] == [StorageFailed.code]
    assert events[-2]["type"] == "transcript.final" and events[-2]["duration"] == 1.0
    assert ws.close_code == StorageFailed.close_code
    await client.close()
    assert journal_rows(server_config.data_dir) == []  # discarded: nothing to resume


async def test_a_restart_keeps_a_detached_session_unended(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A session waiting for its client's resume when the restart comes is not ended (the
    drain ended it and stored a final of part of the meeting): it stays in the journal."""
    client = await aiohttp_client(create_app(server_config, fake))
    ready, _ = await detached_session(client, fake, 1.0)
    await close_live_sockets(client.app)
    assert not fake.sessions[0].log.ended
    assert client.app[SESSIONS_KEY].get(ready["session_id"]) is not None
    await client.close()
    assert fake.sessions[0].log.aborted  # its engine slot is freed all the same
    assert journal_rows(server_config.data_dir) == [(ready["session_id"], 0, 16000)]


async def test_a_session_that_never_sent_audio_is_not_rebuilt_by_the_next_start(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """Clients that sent `start` and left (a scanner, a page closed at once) were journaled,
    rebuilt by every start and held a --max-sessions slot for two resume windows (a trial).
    Nothing to lose: the next start discards such a session; its client starts anew."""
    client = await aiohttp_client(create_app(server_config, fake))
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    ready = await ws.receive_json()
    await detach(client, ws)
    await close_live_sockets(client.app)
    await client.close()
    assert journal_rows(server_config.data_dir) == [(ready["session_id"], 0, 0)]

    again = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, again))
    assert client.app[SESSIONS_KEY].get(ready["session_id"]) is None
    assert not again.sessions  # no backend session opened for it
    await wait_until(lambda: journal_rows(server_config.data_dir) == [])  # the writer's
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        events = await receive_all(ws)
    assert events[-1]["code"] == "not_found" and ws.close_code == 4404


async def test_a_connection_during_the_restart_is_told_to_come_back(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A resume that reaches the server while it stops (its listener not yet closed) gets
    `server_restarting` (1012, which its client retries), not engine_unavailable (4503,
    which ends a resume for good)."""
    client = await aiohttp_client(create_app(server_config, fake))
    await close_live_sockets(client.app)
    async with client.ws_connect("/v1/live") as ws:
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["code"] == ServerRestarting.code and ws.close_code == SERVICE_RESTART
    # it may be a new session's: not told to resume one (a docs audit)
    assert "connect again" in events[-1]["message"]
    assert "resume the session" not in events[-1]["message"]


async def test_a_connection_without_a_session_is_not_told_to_resume_one(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A socket open without `start` when the server stops to restart has no session kept:
    told to connect again, not to resume "the session" (a docs audit); a streaming one is
    told to resume it."""
    client = await aiohttp_client(create_app(server_config, fake))
    idle = await client.ws_connect("/v1/live")
    streaming = await client.ws_connect("/v1/live")
    await streaming.send_json(START)
    await streaming.receive_json()
    await streaming.send_bytes(pcm16(1.0))
    await wait_until(lambda: fake.sessions[0].log.num_samples == 16000)
    reading = [asyncio.create_task(receive_all(ws)) for ws in (idle, streaming)]
    await close_live_sockets(client.app)
    idle_events, streaming_events = await asyncio.wait_for(asyncio.gather(*reading), 5)
    assert idle_events[-1]["code"] == ServerRestarting.code
    assert idle.close_code == SERVICE_RESTART
    assert "connect again" in idle_events[-1]["message"]
    assert "resume the session" not in idle_events[-1]["message"]
    assert streaming_events[-1]["code"] == ServerRestarting.code
    assert "resume the session" in streaming_events[-1]["message"]


async def test_with_resume_off_a_shutdown_still_drains_to_the_final(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """Resume off (`--live-resume-window 0`): nothing could resume a kept session, so the
    shutdown ends it as before: its final, then 1001, and nothing left in the journal."""
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await ws.send_bytes(pcm16(1.5))
        await wait_until(lambda: fake.sessions[0].log.num_samples == 1.5 * 16000)
        reading = asyncio.create_task(receive_all(ws))
        await close_live_sockets(client.app)
        events = await asyncio.wait_for(reading, 5)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.5
    assert ws.close_code == GOING_AWAY
    assert fake.sessions[0].log.ended
    await client.close()
    assert journal_rows(server_config.data_dir) == []


async def streaming_then_engine_lost(
    client: TestClient, server_config: ServerConfig, fake: FakeTranscriber
) -> tuple[ClientWebSocketResponse, str]:
    """A session with 2 s of audio on disk whose engine worker then dies and is not back yet
    (the session waits, under its lock, for the rebuild): its socket and id."""
    ws = await client.ws_connect("/v1/live")
    await ws.send_json(START)
    session_id = (await ws.receive_json())["session_id"]
    await ws.send_bytes(pcm16(2.0))
    await wait_until(lambda: journal_rows(server_config.data_dir) == [(session_id, 0, 32000)])
    fake._ready = False  # the gateway restarts the worker; the model loads meanwhile
    fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
    await asyncio.sleep(0.1)  # the pump is in _recover now
    return ws, session_id


async def test_a_restart_while_the_engine_reloads_keeps_the_session(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """SIGTERM while the engine worker reloads after a crash (a review): the session waiting
    for its rebuild gave up with the engine's error, which discarded it from the journal, so
    the next start had nothing to rebuild. It is kept as a streaming one is: its client is
    told to resume (1012) and the journal keeps its audio."""
    client = await aiohttp_client(create_app(server_config, fake))
    ws, session_id = await streaming_then_engine_lost(client, server_config, fake)
    reading = asyncio.create_task(receive_all(ws))
    await close_live_sockets(client.app)
    events = await asyncio.wait_for(reading, 5)
    assert events[-1]["code"] == ServerRestarting.code and ws.close_code == SERVICE_RESTART
    assert not [e for e in events if e.get("code") == EngineUnavailable.code]
    await asyncio.sleep(
        3 * LIVE_ENGINE_POLL_S
    )  # the uploads' drain, say, before the journal closes
    await client.close()
    assert journal_rows(server_config.data_dir) == [(session_id, 0, 32000)]


async def test_a_socket_the_restart_could_not_drain_in_time_keeps_its_session(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """An append waiting for the lost engine holds the connection past the drain's time; the
    drain then fails the socket with server_restarting, and that failure dropped the session
    from the journal (the client was told to resume a session the next start did not have)."""
    client = await aiohttp_client(create_app(server_config, fake))
    ws, session_id = await streaming_then_engine_lost(client, server_config, fake)

    async def lost_append(samples: object) -> None:  # what the dead worker's session says
        raise EngineUnavailable("the engine failed: exited with code -9")

    fake.sessions[0].append = lost_append  # type: ignore[method-assign,assignment]
    await ws.send_bytes(pcm16(0.5))  # waits for the session's lock, then for a rebuild
    await asyncio.sleep(0.1)
    reading = asyncio.create_task(receive_all(ws))
    sessions = client.app[SESSIONS_KEY]
    await asyncio.gather(
        client.app[REGISTRY_KEY].drain_all(0.5, keep=True), sessions.drain(timeout_s=0.5)
    )
    events = await asyncio.wait_for(reading, 5)
    assert events[-1]["code"] == ServerRestarting.code and ws.close_code == SERVICE_RESTART
    await client.close()
    assert journal_rows(server_config.data_dir) == [(session_id, 0, 32000)]


async def _restart_on_key(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    *,
    resume_on_b: bool,
) -> tuple[TestClient, dict[str, Any]]:
    """A session opened with key A (and, with `resume_on_b`, resumed with key B) is kept by
    a restart; key A is revoked while the server is down; the next start (returned, with the
    session's `session.ready`) has rebuilt it."""
    store = ApiKeyStore(store_path(server_config.data_dir))
    (key_a, secret_a), (_, secret_b) = store.create("a"), store.create("b")
    client = await aiohttp_client(create_app(server_config, fake))
    ws = await client.ws_connect("/v1/live", headers=bearer(secret_a))
    await ws.send_json(START)
    ready: dict[str, Any] = await ws.receive_json()
    await ws.send_bytes(pcm16(1.0))
    await wait_until(lambda: fake.sessions[-1].log.num_samples == 16000)
    if resume_on_b:
        await detach(client, ws)
        ws = await client.ws_connect("/v1/live", headers=bearer(secret_b))
        await ws.send_json(resume_start(ready))
        assert (await ws.receive_json())["resumed"] is True
    reading = asyncio.create_task(receive_all(ws))
    await close_live_sockets(client.app)
    await asyncio.wait_for(reading, 5)
    await client.close()
    store.revoke(key_a.key_id)  # while the server is down
    store.close()
    again = await aiohttp_client(create_app(server_config, FakeTranscriber()))
    return again, ready


async def test_a_key_revoked_while_the_server_was_down_ends_its_rebuilt_sessions(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """The journal kept no key, so a session rebuilt after a restart ran on none: one whose key
    was revoked meanwhile waited a resume window (and took a resume with another key) as if
    nothing had happened. It is now ended at the start, as a revocation while it runs ends it:
    its transcript stored (readable with its captions token), nothing kept for a resume."""
    client, ready = await _restart_on_key(aiohttp_client, server_config, fake, resume_on_b=False)
    holder = client.app[SESSIONS_KEY].get(ready["session_id"])
    assert holder is not None and holder.client is not None
    await wait_until(lambda: holder.ended)
    path = f"/v1/sessions/{ready['session_id']}/transcript?token={ready['captions_token']}"

    async def stored() -> bool:
        async with client.get(path) as response:
            return response.status == 200

    deadline = asyncio.get_running_loop().time() + 5
    while not await stored():
        assert asyncio.get_running_loop().time() < deadline, "the transcript was not stored"
        await asyncio.sleep(0.05)


async def test_a_session_resumed_with_another_key_is_kept_when_its_first_is_revoked(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A resume moves a session to the resuming key, and the journal follows it: revoking the
    key it was opened with, while the server is down, leaves it waiting for its resume."""
    client, ready = await _restart_on_key(aiohttp_client, server_config, fake, resume_on_b=True)
    holder = client.app[SESSIONS_KEY].get(ready["session_id"])
    assert holder is not None and holder.client is not None and not holder.ended
    assert client.app[SESSIONS_KEY].num_detached == 1
