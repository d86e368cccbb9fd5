"""/healthz, /readyz, /metrics and the static page."""

from __future__ import annotations

from aiohttp.test_utils import TestClient

from livemeet.config import ServerConfig
from livemeet.gateway.app import create_app
from livemeet.gateway.keys import LIFECYCLE_KEY
from tests.gateway.conftest import ClientFactory, wav_bytes
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_openai_api import form


async def test_health_and_ready(client: TestClient) -> None:
    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    assert ready.status == 200
    body = await ready.json()
    assert body["status"] == "ready" and body["demo"] is True
    client.app[LIFECYCLE_KEY].draining = True
    assert (await client.get("/readyz")).status == 503


async def test_transcriber_started_and_closed(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    fake = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, fake))
    assert fake.num_started == 1 and fake.num_closed == 0
    await client.close()
    assert fake.num_closed == 1


async def test_metrics_count_requests_errors_audio_and_demo(client: TestClient) -> None:
    await client.post("/v1/audio/transcriptions", data=form(wav_bytes(2.0)))
    await client.post("/v1/audio/transcriptions", data=form(b"garbage" * 100))
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_str("{bad")
        async for _ in ws:
            pass
    text = await (await client.get("/metrics")).text()
    assert 'livemeet_requests_total{endpoint="transcriptions",status="200"} 1.0' in text
    assert 'livemeet_requests_total{endpoint="transcriptions",status="400"} 1.0' in text
    assert 'livemeet_errors_total{code="bad_audio"} 1.0' in text
    assert 'livemeet_errors_total{code="invalid_request"} 1.0' in text
    assert 'livemeet_audio_seconds_in_total{kind="upload"} 2.0' in text
    assert "livemeet_demo_backend 1.0" in text
    assert 'livemeet_sessions_ended_total{kind="live",outcome="invalid_request"} 1.0' in text


async def test_two_apps_have_separate_registries(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    a = await aiohttp_client(create_app(server_config, FakeTranscriber(demo=False)))
    b = await aiohttp_client(create_app(server_config, FakeTranscriber()))
    assert "livemeet_demo_backend 0.0" in await (await a.get("/metrics")).text()
    assert "livemeet_demo_backend 1.0" in await (await b.get("/metrics")).text()


async def test_web_page_is_served(client: TestClient) -> None:
    page = await client.get("/")
    assert page.status == 200 and page.content_type == "text/html"
    assert "recorder.js" in await page.text()
    for name in ("recorder.js", "pcm-worklet.js"):
        resp = await client.get(f"/{name}")
        assert resp.status == 200 and "javascript" in resp.content_type
