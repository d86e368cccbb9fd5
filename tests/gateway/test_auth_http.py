"""API keys on the gateway (gateway/auth_http.py, ws_live.py): which endpoints ask for a key,
the 401s and the live refusal, keys made and revoked while the server runs, the metric."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestClient

from livemeet.config import AuthMode, GatewayConfig, ServerConfig
from livemeet.errors import Unauthorized
from livemeet.gateway.api_keys import ApiKeyStore, store_path
from livemeet.gateway.app import create_app
from livemeet.gateway.auth_http import PUBLIC_ROUTES, SELF_CHECKED_ROUTES
from livemeet.gateway.session_transcript import STATUS_HEADER
from tests.gateway.conftest import ClientFactory, pcm16, wav_bytes
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_http_refusals import exchange
from tests.gateway.test_live_resume import detached_session, read_until, resume_start
from tests.gateway.test_openai_api import form
from tests.gateway.test_ws_captions import stream, subscribe, transcript_url
from tests.gateway.test_ws_live import START, expect_error, receive_all, wait_until

WWW_AUTHENTICATE = "WWW-Authenticate"
# the protected HTTP endpoints: (method, path); every named /v1 route but the live socket and
# the two a session's captions token opens
PROTECTED = [
    ("POST", "/v1/audio/transcriptions"),
    ("GET", "/v1/transcriptions/tr-0"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/fake-model"),
]
EXEMPT = ["/healthz", "/readyz", "/metrics", "/", "/recorder.js", "/captions.html"]


@dataclass(frozen=True)
class Keys:
    """A store with an active key and a revoked one, and a key of no store."""

    store: ApiKeyStore
    active: str
    active_id: str
    revoked: str
    revoked_id: str
    wrong: str = "lm_000000000000_" + "A" * 43


@pytest.fixture
def keys(server_config: ServerConfig) -> Keys:
    store = ApiKeyStore(store_path(server_config.data_dir))
    active, active_key = store.create("ci")
    revoked, revoked_key = store.create("old laptop")
    store.revoke(revoked.key_id)
    return Keys(store, active_key, active.key_id, revoked_key, revoked.key_id)


@pytest.fixture
async def keyed(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber, keys: Keys
) -> TestClient:
    """A server on the default --auth auto over a store that holds keys: they are required."""
    return await aiohttp_client(create_app(server_config, fake))


async def call(
    client: TestClient, method: str, path: str, headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    data = form(wav_bytes(1.0)) if method == "POST" else None
    return await client.request(method, path, data=data, headers=headers or {})


async def refused(resp: aiohttp.ClientResponse) -> str:
    """The 401's message, after checking its shape."""
    body = await resp.json()
    assert resp.status == 401, body
    assert body["error"]["code"] == Unauthorized.code
    assert body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def wait_for_status(
    client: TestClient, status: int, headers: dict[str, str] | None = None, within_s: float = 3.0
) -> float:
    """Poll GET /v1/models until it answers `status`; the seconds that took."""
    started = time.monotonic()
    while True:
        resp = await client.get("/v1/models", headers=headers or {})
        if resp.status == status:
            return time.monotonic() - started
        assert time.monotonic() - started < within_s, f"still {resp.status} after {within_s} s"
        await asyncio.sleep(0.05)


def auth_failures(client: TestClient, reason: str) -> float:
    from livemeet.gateway.keys import METRICS_KEY

    value = client.app[METRICS_KEY].registry.get_sample_value(
        "livemeet_auth_failures_total", {"reason": reason}
    )
    return 0.0 if value is None else value


# -- HTTP -------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), PROTECTED)
async def test_each_api_endpoint_refuses_a_missing_wrong_or_revoked_key(
    keyed: TestClient, keys: Keys, method: str, path: str
) -> None:
    missing = await call(keyed, method, path)
    assert "Authorization: Bearer" in await refused(missing)
    assert missing.headers[WWW_AUTHENTICATE] == "Bearer"
    wrong = await call(keyed, method, path, bearer(keys.wrong))
    assert "not one of this server's" in await refused(wrong)
    assert wrong.headers[WWW_AUTHENTICATE] == 'Bearer error="invalid_token"'
    revoked = await call(keyed, method, path, {"x-api-key": keys.revoked})
    message = await refused(revoked)
    assert f"{keys.revoked_id} was revoked" in message and keys.revoked not in message
    assert revoked.headers[WWW_AUTHENTICATE].startswith("Bearer")
    # never from the URL: it ends up in access logs
    in_query = await call(keyed, method, f"{path}?api_key={keys.active}")
    assert "Authorization: Bearer" in await refused(in_query)


@pytest.mark.parametrize(
    "header", [b"Authorization: Bearer \xff\xfe", b"x-api-key: lm_\xed\xa0\x80"]
)
async def test_a_key_of_bytes_that_are_not_utf8_is_a_wrong_key_not_a_500(
    keyed: TestClient, caplog: pytest.LogCaptureFixture, header: bytes
) -> None:
    """aiohttp keeps header bytes that are not UTF-8 as surrogates; the key's digest raised
    UnicodeEncodeError: any client without a key got a 500 and wrote a traceback in the log
    (a security review)."""
    request = b"GET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n" + header
    response = await exchange(keyed, request + b"\r\n\r\n")
    assert response.status == 401, response
    assert response.error()["code"] == Unauthorized.code
    assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert auth_failures(keyed, "wrong") == 1
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
async def test_each_api_endpoint_takes_a_bearer_or_x_api_key(
    keyed: TestClient, keys: Keys, method: str, path: str
) -> None:
    for headers in (bearer(keys.active), {"X-Api-Key": keys.active}, {"x-api-key": keys.active}):
        resp = await call(keyed, method, path, headers)
        expected = 404 if path.startswith("/v1/transcriptions/") else 200  # an unknown id
        assert resp.status == expected, await resp.text()
        assert WWW_AUTHENTICATE not in resp.headers


async def test_a_key_reads_the_transcript_it_made(keyed: TestClient, keys: Keys) -> None:
    done = await call(keyed, "POST", "/v1/audio/transcriptions", bearer(keys.active))
    assert done.status == 200
    path = f"/v1/transcriptions/{done.headers['X-Livemeet-Transcription-Id']}"
    assert (await keyed.get(path)).status == 401
    assert (await keyed.get(path, headers=bearer(keys.active))).status == 200


@pytest.mark.parametrize("path", EXEMPT)
async def test_health_metrics_and_the_page_need_no_key(keyed: TestClient, path: str) -> None:
    resp = await keyed.get(path)
    assert resp.status == 200, await resp.text()


async def test_an_unknown_path_is_a_404_without_a_key(keyed: TestClient) -> None:
    assert (await keyed.get("/v1/nothing-here")).status == 404


def test_every_api_route_is_protected_but_the_captions_tokens_ones(
    server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A route added later needs a key unless it is listed as public: the classification
    covers every route of the app."""
    app = create_app(server_config, fake)
    named = {r.name for r in app.router.routes() if r.name is not None}
    assert named - PUBLIC_ROUTES - SELF_CHECKED_ROUTES == {
        "transcriptions",
        "models",
        "model",
        "transcript",
    }
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.name is None:  # the page's files
            assert not path.startswith("/v1"), path
        elif route.name in PUBLIC_ROUTES and path.startswith("/v1"):
            assert route.name in ("captions", "session_transcript"), route.name


async def test_the_openai_sdk_sends_its_key_as_bearer(keyed: TestClient, keys: Keys) -> None:
    def transcribe(api_key: str) -> str:
        client = openai.OpenAI(base_url=str(keyed.make_url("/v1")), api_key=api_key, max_retries=0)
        return client.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", wav_bytes(1.0))
        ).text

    assert await asyncio.to_thread(transcribe, keys.active)
    with pytest.raises(openai.AuthenticationError) as refusal:
        await asyncio.to_thread(transcribe, keys.wrong)
    assert refusal.value.status_code == 401


async def test_a_browser_page_may_send_a_key_across_origins(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber, keys: Keys
) -> None:
    app = "https://app.example"
    config = ServerConfig(
        data_dir=server_config.data_dir, gateway=GatewayConfig(allowed_origins=(app,))
    )
    client = await aiohttp_client(create_app(config, fake))
    preflight = await client.options(
        "/v1/models",
        headers={
            "Origin": app,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization,x-api-key",
        },
    )
    assert preflight.status == 200  # a preflight carries no key, and needs none
    allowed = preflight.headers["Access-Control-Allow-Headers"].upper()
    assert "AUTHORIZATION" in allowed and "X-API-KEY" in allowed  # by name: `*` would not do
    refusal = await client.get("/v1/models", headers={"Origin": app})
    assert refusal.status == 401 and refusal.headers["Access-Control-Allow-Origin"] == app
    assert WWW_AUTHENTICATE in refusal.headers["Access-Control-Expose-Headers"]
    ok = await client.get("/v1/models", headers={"Origin": app, **bearer(keys.active)})
    assert ok.status == 200


# -- modes --------------------------------------------------------------------------------


async def test_auth_off_ignores_keys_and_auth_keys_with_none_admits_nobody(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    keys: Keys,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    off = ServerConfig(data_dir=server_config.data_dir, gateway=GatewayConfig(auth=AuthMode.OFF))
    open_client = await aiohttp_client(create_app(off, fake))
    assert (await open_client.get("/v1/models")).status == 200
    assert (await open_client.get("/v1/models", headers=bearer(keys.wrong))).status == 200
    await open_client.close()
    empty = ServerConfig(data_dir=tmp_path / "empty", gateway=GatewayConfig(auth=AuthMode.KEYS))
    with caplog.at_level(logging.WARNING):
        closed = await aiohttp_client(create_app(empty, FakeTranscriber()))
    assert "nobody can use the API" in caplog.text
    assert (await closed.get("/v1/models")).status == 401
    assert (await closed.get("/v1/models", headers=bearer(keys.active))).status == 401


async def test_auth_off_serves_over_a_key_store_it_cannot_read(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A corrupt store failed the start of an `--auth off` server, which never uses a key."""
    path = store_path(server_config.data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a database, but long enough to be read as one" * 100)
    off = ServerConfig(data_dir=server_config.data_dir, gateway=GatewayConfig(auth=AuthMode.OFF))
    with caplog.at_level(logging.WARNING):
        client = await aiohttp_client(create_app(off, fake))
    assert "cannot read the API key store" in caplog.text
    assert (await client.get("/v1/models")).status == 200


async def test_auto_without_keys_is_open_and_keys_made_meanwhile_close_it(
    client: TestClient, server_config: ServerConfig
) -> None:
    """No restart: a key made with `livemeet keys create` (another connection to the store)
    is required within about a second, and accepted at once."""
    assert (await client.get("/v1/models")).status == 200
    store = ApiKeyStore(store_path(server_config.data_dir))
    _, key = store.create("new")
    assert (await client.get("/v1/models", headers=bearer(key))).status == 200  # at once
    assert await wait_for_status(client, 401) < 2.0


async def test_a_key_made_while_the_server_runs_is_accepted_at_once(
    keyed: TestClient, keys: Keys
) -> None:
    _, key = keys.store.create("just made")
    assert (await keyed.get("/v1/models", headers=bearer(key))).status == 200


async def test_revoking_every_key_keeps_auto_closed(keyed: TestClient, keys: Keys) -> None:
    assert (await keyed.get("/v1/models", headers=bearer(keys.active))).status == 200
    keys.store.revoke(keys.active_id)
    assert await wait_for_status(keyed, 401, bearer(keys.active)) < 2.0
    message = await refused(await keyed.get("/v1/models", headers=bearer(keys.active)))
    assert "was revoked" in message
    assert "Authorization: Bearer" in await refused(await keyed.get("/v1/models"))
    async with keyed.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await expect_error(ws, Unauthorized)


async def test_a_store_removed_while_the_server_runs_keeps_its_keys_in_force(
    keyed: TestClient, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """A deleted key file does not open an `auto` server (a cleanup job, a wrong rm)."""
    keys.store.close()
    with caplog.at_level(logging.WARNING):
        for path in keys.store.path.parent.glob(f"{keys.store.path.name}*"):
            path.unlink()
        await asyncio.sleep(1.5)  # past a reload interval
    assert "was removed" in caplog.text
    assert (await keyed.get("/v1/models")).status == 401
    assert (await keyed.get("/v1/models", headers=bearer(keys.active))).status == 200


# -- live ---------------------------------------------------------------------------------


async def test_a_live_start_without_a_key_is_refused_with_4401(
    keyed: TestClient, fake: FakeTranscriber
) -> None:
    async with keyed.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        error = await expect_error(ws, Unauthorized)
    assert "api_key" in error["message"]
    assert fake.sessions == []  # refused before any session opened


async def test_a_wrong_key_on_the_upgrade_is_refused_before_start(
    keyed: TestClient, keys: Keys
) -> None:
    async with keyed.ws_connect("/v1/live", headers=bearer(keys.wrong)) as ws:
        error = await expect_error(ws, Unauthorized)  # nothing sent: refused as it opened
    assert keys.wrong not in error["message"]
    async with keyed.ws_connect("/v1/live", headers={"x-api-key": keys.revoked}) as ws:
        assert "was revoked" in (await expect_error(ws, Unauthorized))["message"]


@pytest.mark.parametrize("where", ["header", "x-api-key", "start"])
async def test_a_live_session_with_a_key_is_ready(
    keyed: TestClient, keys: Keys, where: str
) -> None:
    headers = {"header": bearer(keys.active), "x-api-key": {"x-api-key": keys.active}}
    start: dict[str, Any] = {**START, "api_key": keys.active} if where == "start" else START
    async with keyed.ws_connect("/v1/live", headers=headers.get(where, {})) as ws:
        await ws.send_json(start)
        ready = await ws.receive_json()
        assert ready["type"] == "session.ready", ready
        await ws.send_bytes(pcm16(1.0))
        await ws.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["type"] == "transcript.final"


async def test_a_wrong_key_in_start_is_refused(keyed: TestClient, keys: Keys) -> None:
    for key, why in ((keys.wrong, "not one of"), (keys.revoked, "was revoked")):
        async with keyed.ws_connect("/v1/live") as ws:
            await ws.send_json({**START, "api_key": key})
            assert why in (await expect_error(ws, Unauthorized))["message"]


async def detached_with_key(client: TestClient, key: str, fake: FakeTranscriber) -> dict[str, Any]:
    """The `session.ready` of a session opened by a socket let in with `key` (its upgrade's
    header), detached after 1 s of audio (test_live_resume.detached_session). Only its own
    socket gets the header: a `monkeypatch.undo()` here undid the tests' `fast_reload` too."""
    original = client.ws_connect

    def with_key(path: str, **kwargs: Any) -> Any:
        return original(path, headers=bearer(key), **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(client, "ws_connect", with_key)
        ready, _ = await detached_session(client, fake, 1.0)
    return ready


async def test_a_resume_needs_a_key_too(
    keyed: TestClient, keys: Keys, fake: FakeTranscriber
) -> None:
    """The resume token proves the session, not the right to use the server: a key revoked
    since cannot carry a session on."""
    ready = await detached_with_key(keyed, keys.active, fake)
    async with keyed.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        await expect_error(ws, Unauthorized)
    async with keyed.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready, api_key=keys.active))
        resumed = await ws.receive_json()
        assert resumed["type"] == "session.ready" and resumed["resumed"] is True


@pytest.fixture
def fast_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server looks at the key store every 50 ms, not every second."""
    monkeypatch.setattr("livemeet.gateway.auth_http.API_KEYS_RELOAD_INTERVAL_S", 0.05)


async def keyed_session(
    client: TestClient, key: str, fake: FakeTranscriber, seconds: float = 0.0
) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any]]:
    """A live socket let in with `key` (its upgrade's header) and its `session.ready`, after
    `seconds` of audio all acknowledged (on disk)."""
    ws = await client.ws_connect("/v1/live", headers=bearer(key))
    await ws.send_json(START)
    ready = await ws.receive_json()
    assert ready["type"] == "session.ready", ready
    if seconds:
        await stream(ws, fake, seconds)
        acked = 0
        while acked < seconds * 16000:
            acked = (await read_until(ws, "audio.ack"))[-1]["offset"]
    return ws, ready


async def stored_transcript(client: TestClient, ready: dict[str, Any]) -> dict[str, Any]:
    """The session's transcript once its final one is in (polled)."""
    for _ in range(100):
        resp = await client.get(transcript_url(ready, "verbose_json"))
        if resp.headers.get(STATUS_HEADER) == "final":
            body: dict[str, Any] = await resp.json()
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"no final transcript: {resp.status} {resp.headers.get(STATUS_HEADER)}")


async def test_a_key_revoked_while_its_live_sessions_run_ends_them(
    keyed: TestClient, keys: Keys, fake: FakeTranscriber, fast_reload: None
) -> None:
    """Checked at `start` only, a revoked key's live session ran on for as long as its
    client streamed. Now every socket let in with it gets `unauthorized` and 4401 (one that
    has not sent `start` yet too); a session with audio is ended as by `end`, its final
    transcript (all the acknowledged audio) stored and sent to its captions, not kept for a
    resume with that key; one without audio is dropped; another key's session runs on."""
    _, other = keys.store.create("other")
    ws, ready = await keyed_session(keyed, keys.active, fake, 1.0)
    captions = await subscribe(keyed, ready)
    silent, _ = await keyed_session(keyed, keys.active, fake)
    unstarted = await keyed.ws_connect("/v1/live", headers=bearer(keys.active))
    others, _ = await keyed_session(keyed, other, fake, 0.5)
    keys.store.revoke(keys.active_id)
    error = await expect_error(ws, Unauthorized)
    assert keys.active_id in error["message"] and "was revoked" in error["message"]
    await expect_error(silent, Unauthorized)
    await expect_error(unstarted, Unauthorized)
    heard = await asyncio.wait_for(receive_all(captions), 5)
    assert heard[-1]["type"] == "transcript.final" and heard[-1]["duration"] == 1.0
    assert captions.close_code == 1000
    assert (await stored_transcript(keyed, ready))["duration"] == 1.0
    assert fake.sessions[0].log.ended and fake.sessions[1].log.aborted
    async with keyed.ws_connect("/v1/live") as resume:
        await resume.send_json(resume_start(ready, api_key=keys.active))
        assert "was revoked" in (await expect_error(resume, Unauthorized))["message"]
    # the other key's session: untouched
    await others.send_bytes(pcm16(0.5))
    await others.send_json({"type": "end"})
    events = await asyncio.wait_for(receive_all(others), 5)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.0
    assert others.close_code == 1000


async def test_a_detached_session_of_a_revoked_key_is_ended_not_kept_for_a_resume(
    keyed: TestClient, keys: Keys, fake: FakeTranscriber, fast_reload: None
) -> None:
    """A session waiting for a resume is ended at once, not when its window runs out; a
    resume with another valid key (its client got a new one) gets only its final."""
    _, other = keys.store.create("new laptop")
    ready = await detached_with_key(keyed, keys.active, fake)
    keys.store.revoke(keys.active_id)
    await wait_until(lambda: fake.sessions[0].log.ended, timeout_s=3.0)
    assert (await stored_transcript(keyed, ready))["duration"] == 1.0
    async with keyed.ws_connect("/v1/live", headers=bearer(other)) as ws:
        await ws.send_json(resume_start(ready))
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[0]["type"] == "session.ready" and events[0]["resumed"] is True
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.0


async def test_a_session_resumed_with_another_key_runs_on_that_key(
    keyed: TestClient, keys: Keys, fake: FakeTranscriber, fast_reload: None
) -> None:
    """A client given a new key resumes with it: revoking the old key then leaves the session
    alone (it runs on the key of the socket that last carried it)."""
    _, new = keys.store.create("rotated")
    ready = await detached_with_key(keyed, keys.active, fake)
    async with keyed.ws_connect("/v1/live", headers=bearer(new)) as ws:
        await ws.send_json(resume_start(ready))
        assert (await ws.receive_json())["resumed"] is True
        keys.store.revoke(keys.active_id)
        await wait_for_status(keyed, 401, bearer(keys.active))
        await asyncio.sleep(0.2)  # past a few reloads
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.5
    assert ws.close_code == 1000


async def test_a_session_opened_without_a_key_runs_on_once_keys_are_made(
    client: TestClient, server_config: ServerConfig, fake: FakeTranscriber, fast_reload: None
) -> None:
    """`auto` with no key: a session opened then was let in by no key, and none is revoked
    by the first key made (which closes the server to new requests without one)."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        assert (await ws.receive_json())["type"] == "session.ready"
        await stream(ws, fake, 0.5)
        ApiKeyStore(store_path(server_config.data_dir)).create("first")
        await wait_for_status(client, 401)
        await asyncio.sleep(0.2)  # past a few reloads
        await ws.send_bytes(pcm16(0.5))
        await ws.send_json({"type": "end"})
        events = await asyncio.wait_for(receive_all(ws), 5)
    assert events[-1]["type"] == "transcript.final" and events[-1]["duration"] == 1.0


async def test_the_captions_token_alone_opens_the_captions_and_transcript(
    keyed: TestClient, keys: Keys
) -> None:
    async with keyed.ws_connect("/v1/live", headers=bearer(keys.active)) as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        session, token = ready["session_id"], ready["captions_token"]
        transcript = await keyed.get(f"/v1/sessions/{session}/transcript", params={"token": token})
        assert transcript.status == 200, await transcript.text()
        async with keyed.ws_connect(
            f"/v1/sessions/{session}/captions", params={"token": token}
        ) as captions:
            assert (await captions.receive_json())["type"] == "captions.ready"
        # the captions token is no API key
        assert (await keyed.get("/v1/models", headers=bearer(token))).status == 401


async def test_auth_failures_are_counted_by_reason(keyed: TestClient, keys: Keys) -> None:
    assert auth_failures(keyed, "missing") == 0
    await keyed.get("/v1/models")
    await keyed.get("/v1/models", headers=bearer(keys.wrong))
    await keyed.get("/v1/models", headers=bearer(keys.revoked))
    await keyed.get("/v1/models", headers=bearer(keys.active))
    await keyed.get("/healthz")
    async with keyed.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await expect_error(ws, Unauthorized)
    assert auth_failures(keyed, "missing") == 2
    assert auth_failures(keyed, "wrong") == 1
    assert auth_failures(keyed, "revoked") == 1
    text = await (await keyed.get("/metrics")).text()
    assert 'livemeet_auth_failures_total{reason="missing"} 2.0' in text


async def test_the_logs_name_key_ids_never_keys(
    keyed: TestClient, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        await keyed.get("/v1/models", headers=bearer(keys.active))
        await keyed.get("/v1/models", headers=bearer(keys.wrong))
        await keyed.get("/v1/models", headers=bearer(keys.revoked))
        async with keyed.ws_connect("/v1/live", headers=bearer(keys.active)) as ws:
            await ws.send_json(START)
            await ws.receive_json()
    assert keys.active_id in caplog.text and keys.revoked_id in caplog.text
    for key in (keys.active, keys.wrong, keys.revoked):
        assert key not in caplog.text
        assert key.split("_", 2)[2] not in caplog.text


async def test_an_uploads_log_line_names_its_key_and_refusals_their_client(
    keyed: TestClient, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """A live session's log named the key that opened it, an upload's did not; a refusal's
    line did not say who was refused (a trial). The key's id, never the key; the client's
    address on every `unauthorized` line: HTTP, live, captions and transcript."""
    with caplog.at_level(logging.INFO):
        upload = await call(keyed, "POST", "/v1/audio/transcriptions", bearer(keys.active))
        assert upload.status == 200, await upload.text()
        ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("upload ")]
        assert len(ended) == 1 and ended[0].endswith(f", API key {keys.active_id})"), ended
        caplog.clear()
        await keyed.get("/v1/models", headers=bearer(keys.wrong))
        async with keyed.ws_connect("/v1/live") as ws:
            await ws.send_json(START)
            await expect_error(ws, Unauthorized)
        async with keyed.ws_connect("/v1/live", headers=bearer(keys.active)) as ws:
            await ws.send_json(START)
            ready = await ws.receive_json()
            session = ready["session_id"]
            async with keyed.ws_connect(f"/v1/sessions/{session}/captions?token=x") as captions:
                await expect_error(captions, Unauthorized)
            await keyed.get(f"/v1/sessions/{session}/transcript?token=x")
    refusals = [r.getMessage() for r in caplog.records if "unauthori" in r.getMessage()]
    assert len(refusals) == 4, refusals
    for line in refusals:
        assert " (client 127.0.0.1)" in line, line
    assert keys.wrong not in caplog.text and keys.active not in caplog.text
