"""CORS on the HTTP API for the `--allowed-origin` pages: a web app served elsewhere could
open live sessions but not upload (OPTIONS answered 405, no Access-Control-Allow-Origin: a
trial)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from livemeet.config import ServerConfig
from livemeet.errors import MethodNotAllowed, RequestRejected
from livemeet.gateway.openai_api import ID_HEADER
from livemeet.gateway.session_transcript import FINISH_HEADER, REVISION_HEADER, STATUS_HEADER
from tests.gateway.conftest import ClientFactory, wav_bytes
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_openai_api import assert_error, form
from tests.gateway.test_ws_captions import transcript_url
from tests.gateway.test_ws_live import gateway_client, start_session

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


async def test_a_page_of_another_origin_may_not_post_an_upload(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A plain multipart POST needs no CORS preflight: a form on any site a user visited
    could post files to a server that asks for no key (the default on a fresh data dir), and
    the server transcribed them for nobody to read (a security review). Refused now as a
    live socket from that page is; the server's own page, an allowed one, and clients
    without an Origin (not browsers) upload as before."""
    for allowed in ((), (APP,)):
        data_dir = server_config.data_dir / f"allowed-{len(allowed)}"  # one server per data dir
        client = await gateway_client(
            aiohttp_client, server_config, fake, data_dir, allowed_origins=allowed
        )
        opened = len(fake.sessions)
        refused = await client.post(
            UPLOAD, data=form(wav_bytes(1.0)), headers={"Origin": "https://evil.example"}
        )
        body = await assert_error(refused, RequestRejected)
        assert (
            "https://evil.example" in body["error"]["message"]
            and ALLOW_ORIGIN not in refused.headers
        )
        assert len(fake.sessions) == opened  # no session, nothing transcribed
        own = f"http://{client.host}:{client.port}"
        for headers in ({"Origin": own}, {}, {"Origin": APP} if allowed else {}):
            done = await client.post(UPLOAD, data=form(wav_bytes(1.0)), headers=headers)
            assert done.status == 200, (headers, await done.text())


async def test_an_allowed_page_reads_a_live_transcripts_headers(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """The live transcript resource's headers are what a page that lost its socket reads
    (status, finish reason, where the revision is): exposed to an allowed origin's script."""
    client = await gateway_client(aiohttp_client, server_config, fake, allowed_origins=(APP,))
    async with client.ws_connect("/v1/live") as ws:
        ready = await start_session(ws)
        url = f"{transcript_url(ready, 'json')}"
        response = await client.get(url, headers={"Origin": APP})
    assert response.status == 200 and response.headers[ALLOW_ORIGIN] == APP
    exposed = {
        h.strip().lower() for h in response.headers["Access-Control-Expose-Headers"].split(",")
    }
    for header in (STATUS_HEADER, FINISH_HEADER, REVISION_HEADER):
        assert header.lower() in exposed, header
    assert response.headers[REVISION_HEADER] == "none"  # the fake backend does not revise


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


async def test_every_answer_of_the_api_varies_by_origin(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """Whether an answer carries Access-Control-Allow-Origin depends on the request's Origin,
    and nothing said so: a cache between pages and the server could hand one origin's
    answer to another (a security review). Every answer of a CORS route says `Vary:
    Origin`, an error's and one to a request without Origin included; health does not."""
    client = await gateway_client(aiohttp_client, server_config, fake, allowed_origins=(APP,))
    for origin in (APP, "https://evil.example", None):
        headers = {"Origin": origin} if origin else {}
        for path in ("/v1/models", "/v1/transcriptions/tr-0", "/v1/sessions/s-0/transcript"):
            answer = await client.get(path, headers=headers)
            assert "Origin" in answer.headers.getall("Vary", []), (path, origin, answer.headers)
    assert "Vary" not in (await client.get("/healthz", headers={"Origin": APP})).headers
    answer = await preflight(client, APP)
    assert answer.status == 200 and answer.headers["Vary"] == "Origin"


async def test_any_origin_and_none(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    anyone = await gateway_client(aiohttp_client, server_config, fake, allowed_origins=("*",))
    answer = await preflight(anyone, "https://elsewhere.example")
    assert answer.status == 200 and answer.headers[ALLOW_ORIGIN] in (
        "*",
        "https://elsewhere.example",
    )
    closed = await gateway_client(
        aiohttp_client, server_config, fake, server_config.data_dir / "second"
    )
    answer = await preflight(closed, APP)
    assert answer.status == 405 and ALLOW_ORIGIN not in answer.headers


@pytest.mark.parametrize(
    "headers",
    [{}, {"Origin": APP}, {"Access-Control-Request-Method": "POST"}],
    ids=["no Origin", "no Access-Control-Request-Method", "no Origin with a method"],
)
async def test_an_options_that_is_no_preflight_is_answered_as_without_cors(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    headers: dict[str, str],
) -> None:
    """With --allowed-origin, an OPTIONS without Origin (curl, an HTTP library asking what a
    path serves) was refused by aiohttp-cors as a failed preflight: 400 request_rejected,
    'origin header is not specified', where the same server without the flag says 405 and
    lists the methods in Allow (a review). Allow names the methods the API serves: OPTIONS is
    there for browsers' preflights only."""
    answers = []
    for allowed in ((APP,), ()):
        data_dir = server_config.data_dir / str(len(allowed))  # one server per data dir
        client = await gateway_client(
            aiohttp_client, server_config, fake, data_dir, allowed_origins=allowed
        )
        for path, methods in ((UPLOAD, "POST"), ("/v1/models", "GET, HEAD")):
            answer = await client.options(path, headers=headers)
            await assert_error(answer, MethodNotAllowed)
            assert answer.headers["Allow"] == methods and ALLOW_ORIGIN not in answer.headers
            answers.append(await answer.json())
        wrong = await client.delete("/v1/models")
        assert wrong.headers["Allow"] == "GET, HEAD"
    assert answers[:2] == answers[2:]  # the flag changes nothing for non-browser clients
