"""CORS on the HTTP API for the `--allowed-origin` pages: a web app served elsewhere could
open live sessions but not upload (OPTIONS answered 405, no Access-Control-Allow-Origin: a
trial)."""

from __future__ import annotations

import aiohttp
from aiohttp.test_utils import TestClient

from livemeet.config import ServerConfig
from livemeet.errors import RequestRejected
from livemeet.gateway.openai_api import ID_HEADER
from tests.gateway.conftest import ClientFactory, wav_bytes
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_openai_api import form
from tests.gateway.test_ws_live import gateway_client

APP = "https://app.example"
UPLOAD = "/v1/audio/transcriptions"
ALLOW_ORIGIN = "Access-Control-Allow-Origin"


async def preflight(client: TestClient, origin: str, path: str = UPLOAD) -> aiohttp.ClientResponse:
    """A browser's preflight for an OpenAI JS client's upload (its x-stainless headers too)."""
    return await client.options(
        path,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os",
        },
    )


async def test_an_allowed_page_may_upload_and_read_the_answer(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    # written as a user might: upper case, the default port, a trailing slash
    client = await gateway_client(
        aiohttp_client, server_config, fake, allowed_origins=("HTTPS://App.Example:443/",)
    )
    answer = await preflight(client, APP)
    assert answer.status == 200
    assert answer.headers[ALLOW_ORIGIN] == APP
    assert "POST" in answer.headers["Access-Control-Allow-Methods"]
    assert "X-STAINLESS-OS" in answer.headers["Access-Control-Allow-Headers"].upper()
    done = await client.post(UPLOAD, data=form(wav_bytes(1.0)), headers={"Origin": APP})
    assert done.status == 200 and done.headers[ALLOW_ORIGIN] == APP
    assert ID_HEADER in done.headers["Access-Control-Expose-Headers"]
    transcript = await client.get(
        f"/v1/transcriptions/{done.headers[ID_HEADER]}", headers={"Origin": APP}
    )
    assert transcript.status == 200 and transcript.headers[ALLOW_ORIGIN] == APP
    refused = await client.post(UPLOAD, data=form(b"not audio"), headers={"Origin": APP})
    assert refused.status == 400 and refused.headers[ALLOW_ORIGIN] == APP  # errors readable


async def test_another_page_gets_no_cors_answer(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    client = await gateway_client(aiohttp_client, server_config, fake, allowed_origins=(APP,))
    answer = await preflight(client, "https://evil.example")
    assert answer.status == RequestRejected.http_status
    assert (await answer.json())["error"]["code"] == RequestRejected.code
    assert ALLOW_ORIGIN not in answer.headers
    models = await client.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert models.status == 200 and ALLOW_ORIGIN not in models.headers
    health = await client.get("/healthz", headers={"Origin": APP})
    assert ALLOW_ORIGIN not in health.headers  # for operators, not pages


async def test_any_origin_and_none(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    anyone = await gateway_client(aiohttp_client, server_config, fake, allowed_origins=("*",))
    answer = await preflight(anyone, "https://elsewhere.example")
    assert answer.status == 200 and answer.headers[ALLOW_ORIGIN] in (
        "*",
        "https://elsewhere.example",
    )
    closed = await gateway_client(aiohttp_client, server_config, fake)
    answer = await preflight(closed, APP)
    assert answer.status == 405 and ALLOW_ORIGIN not in answer.headers
