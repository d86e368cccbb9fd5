"""The per-client cap on live sessions (`serve --max-live-sessions-per-client`,
gateway/clients.py): who a client is, the refusal past the cap, what counts against it, and
that a resume and other clients are never refused for it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from livemeet.__main__ import build_parser
from livemeet.audio.constants import MAX_LIVE_SESSIONS_PER_CLIENT
from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.cli import serve
from livemeet.config import GatewayConfig, ServerConfig
from livemeet.errors import ConfigError, QueueFull, TooManySessions
from livemeet.gateway.api_keys import ApiKeyStore, store_path
from livemeet.gateway.app import create_app
from livemeet.gateway.clients import Client, cap_refusal, client_of
from livemeet.gateway.keys import SESSIONS_KEY
from livemeet.gateway.live_sessions import LiveSessions
from livemeet.gateway.metrics import GatewayMetrics
from livemeet.transcriber import SessionOptions
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeSession, FakeTranscriber
from tests.gateway.test_live_resume import detach, resume_start
from tests.gateway.test_speaker_rename import FORMAT, RecordingSink
from tests.gateway.test_ws_live import START, expect_error, receive_all, start_session

CAP = 2
REMOTE_HEADER = "X-Test-Remote"  # the address a test client connects from (`remote_from`)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@web.middleware
async def remote_from(request: web.Request, handler: Any) -> web.StreamResponse:
    """The request as if it came from the address its REMOTE_HEADER names (the test client's
    own is loopback, which is not capped by address)."""
    remote = request.headers.get(REMOTE_HEADER)
    response: web.StreamResponse = await handler(
        request.clone(remote=remote) if remote else request
    )
    return response


async def capped_client(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    cap: int = CAP,
) -> TestClient:
    config = ServerConfig(
        data_dir=server_config.data_dir,
        gateway=GatewayConfig(max_live_sessions_per_client=cap),
    )
    app = create_app(config, fake)
    app.middlewares.append(remote_from)
    return await aiohttp_client(app)


def make_keys(server_config: ServerConfig, *names: str) -> list[str]:
    store = ApiKeyStore(store_path(server_config.data_dir))
    keys = [store.create(name)[1] for name in names]
    store.close()
    return keys


async def open_live(
    client: TestClient, headers: dict[str, str]
) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any]]:
    ws = await client.ws_connect("/v1/live", headers=headers)
    return ws, await start_session(ws)


async def refused_start(client: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    async with client.ws_connect("/v1/live", headers=headers) as ws:
        await ws.send_json(START)
        return await expect_error(ws, TooManySessions)


async def end_session(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Some audio, `end`, and the final transcript: the session is over."""
    await ws.send_bytes(pcm16(0.5))
    await ws.send_json({"type": "end"})
    events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["type"] == "transcript.final" and ws.close_code == 1000


async def test_a_client_past_its_cap_is_refused_until_one_of_its_sessions_ends(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """One key held every session slot it liked, starving the others. Its (cap+1)-th start
    is refused with too_many_sessions (4430, retryable), before any backend session opens;
    another key is not; once one of its sessions ended, it may open another."""
    mine, theirs = make_keys(server_config, "greedy", "other")
    client = await capped_client(aiohttp_client, server_config, fake)
    held = [await open_live(client, bearer(mine)) for _ in range(CAP)]
    opened = len(fake.sessions)
    error = await refused_start(client, bearer(mine))
    assert len(fake.sessions) == opened
    key_id = mine.split("_")[1]
    assert f"API key {key_id}" in error["message"]
    assert f"--max-live-sessions-per-client {CAP}" in error["message"]
    other, _ = await open_live(client, bearer(theirs))  # another client: its own count
    await end_session(held[0][0])
    again, _ = await open_live(client, bearer(mine))
    for ws in (held[1][0], other, again):
        await ws.close()


async def test_a_detached_session_counts_and_its_resume_is_never_refused(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A session waiting for a resume still holds the client's place (its socket's drop does
    not let the client open another), and resuming it, with the client at its cap, is not
    refused: the resume takes no new place."""
    [mine] = make_keys(server_config, "mine")
    client = await capped_client(aiohttp_client, server_config, fake)
    (first, ready), (second, _) = [await open_live(client, bearer(mine)) for _ in range(CAP)]
    await detach(client, first)
    await refused_start(client, bearer(mine))
    async with client.ws_connect("/v1/live", headers=bearer(mine)) as ws:
        await ws.send_json(resume_start(ready))
        resumed = await ws.receive_json()
        assert resumed["type"] == "session.ready" and resumed["resumed"] is True
        await refused_start(client, bearer(mine))  # still two: the resumed one and `second`
        await end_session(ws)
    await open_live(client, bearer(mine))  # its place is free once it ended
    await second.close()


async def test_starts_racing_each_other_cannot_pass_the_cap_together(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session counts from its check on, not from when its backend session opened: starts
    sent at once all passed a count made before any of them opened."""
    [mine] = make_keys(server_config, "mine")
    client = await capped_client(aiohttp_client, server_config, fake)
    opening = fake.open_session

    async def slow_open(options: SessionOptions) -> FakeSession:
        await asyncio.sleep(0.1)
        return await opening(options)

    monkeypatch.setattr(fake, "open_session", slow_open)
    sockets = [await client.ws_connect("/v1/live", headers=bearer(mine)) for _ in range(4)]
    await asyncio.gather(*(ws.send_json(START) for ws in sockets))
    first = await asyncio.gather(*(ws.receive_json() for ws in sockets))
    assert sorted(frame["type"] for frame in first) == ["error"] * 2 + ["session.ready"] * CAP
    assert {f["code"] for f in first if f["type"] == "error"} == {TooManySessions.code}
    assert len(client.app[SESSIONS_KEY]) == CAP
    for ws in sockets:
        await ws.close()


async def test_without_keys_a_client_is_its_address(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A server that asks for no key caps each address (an IPv6 one by its /64); a loopback
    address (a proxy on this machine, every client behind it) is not capped."""
    client = await capped_client(aiohttp_client, server_config, fake, cap=1)
    here = {REMOTE_HEADER: "203.0.113.7"}
    await open_live(client, here)
    error = await refused_start(client, here)
    assert "address 203.0.113.7" in error["message"]
    await refused_start(client, {REMOTE_HEADER: "::ffff:203.0.113.7"})  # the same, mapped
    await open_live(client, {REMOTE_HEADER: "203.0.113.8"})
    await open_live(client, {REMOTE_HEADER: "2001:db8:0:1::10"})
    await refused_start(client, {REMOTE_HEADER: "2001:db8:0:1::20"})  # the same /64
    await open_live(client, {REMOTE_HEADER: "2001:db8:0:2::10"})
    for _ in range(3):
        await open_live(client, {})  # 127.0.0.1


async def test_a_cap_of_zero_is_none(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    client = await capped_client(aiohttp_client, server_config, fake, cap=0)
    here = {REMOTE_HEADER: "203.0.113.7"}
    for _ in range(3):
        await open_live(client, here)


async def test_a_start_the_servers_capacity_refuses_takes_no_place_of_the_clients(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A client under its cap refused for the server's capacity gets queue_full, as before,
    and its place is free again for its next start."""
    client = await capped_client(aiohttp_client, server_config, fake, cap=1)
    here = {REMOTE_HEADER: "203.0.113.7"}
    fake.open_error = QueueFull("all 1 session slots are in use (--max-sessions)")
    async with client.ws_connect("/v1/live", headers=here) as ws:
        await ws.send_json(START)
        await expect_error(ws, QueueFull)
    assert client.app[SESSIONS_KEY].held_by(Client(address="203.0.113.7")) == 0
    fake.open_error = None
    await open_live(client, here)


def test_who_a_client_is() -> None:
    assert client_of("1a2b3c4d5e6f", "203.0.113.7") == Client(key_id="1a2b3c4d5e6f")
    assert client_of("1a2b3c4d5e6f", "127.0.0.1") == Client(key_id="1a2b3c4d5e6f")
    assert client_of(None, "203.0.113.7") == Client(address="203.0.113.7")
    assert client_of(None, "::ffff:203.0.113.7") == Client(address="203.0.113.7")
    assert client_of(None, "2001:db8::1:2:3:4") == Client(address="2001:db8::/64")
    assert client_of(None, "fe80::1%eth0") == Client(address="fe80::/64")
    for uncapped in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "", None, "a.sock"):
        assert client_of(None, uncapped) is None, uncapped
    assert str(Client(key_id="1a2b3c4d5e6f")) == "API key 1a2b3c4d5e6f"
    assert str(Client(address="2001:db8::/64")) == "address 2001:db8::/64"


def test_the_cap_refuses_at_the_cap_and_never_at_zero() -> None:
    client = Client(address="203.0.113.7")
    assert cap_refusal(client, 1, 2) is None
    assert cap_refusal(client, 500, 0) is None
    refusal = cap_refusal(client, 2, 2)
    assert isinstance(refusal, TooManySessions) and refusal.retryable
    assert (refusal.http_status, refusal.close_code) == (429, 4430)
    assert "(address 203.0.113.7) holds 2 live sessions" in refusal.message
    assert "holds 1 live session, the most" in str(cap_refusal(client, 1, 1))


def test_the_cap_setting(tmp_path: Any) -> None:
    assert GatewayConfig().max_live_sessions_per_client == MAX_LIVE_SESSIONS_PER_CLIENT
    with pytest.raises(ConfigError, match="--max-live-sessions-per-client must be >= 0"):
        GatewayConfig(max_live_sessions_per_client=-1).validate()
    args = build_parser().parse_args(
        ["serve", "--data-dir", str(tmp_path), "--max-live-sessions-per-client", "0"]
    )
    assert serve.config_from_args(args).gateway.max_live_sessions_per_client == 0


async def test_a_socket_in_its_cleanup_when_its_key_is_revoked_does_not_keep_its_session(
    fake: FakeTranscriber,
) -> None:
    """A socket already gone from the registry (its cleanup under way) when its key was
    revoked was never told, and its session was kept for a resume the key can no longer make
    (a review). The registry remembers the revoked keys: that session is ended, not kept."""
    await fake.start()
    sessions = LiveSessions(60.0, 60.0, GatewayMetrics.create())
    sink = RecordingSink()
    session = await fake.open_session(SessionOptions(live=True))
    decoder = PcmStreamDecoder(16000, 1, "pcm_s16le")
    holder = sessions.open(session, decoder, FORMAT, sink, client=Client(key_id="k-revoked"))
    await holder.append(sink, pcm16(0.5))
    sessions.withdraw({"k-revoked"})  # attached: its socket's to close; this one was not told
    assert await sessions.disconnect(holder, sink, keep=True) is False
    assert holder.ended
    await sessions.close()
