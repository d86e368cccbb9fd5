"""`Expect: 100-continue` on uploads (app._expect_upload): a refusal known from the headers
(API key, declared size) is answered before the client sends the body; a request that passes
them gets `100 Continue`, then sends its body. Spoken over a raw socket, because what matters
is what the server says before the body is sent."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from aiohttp.test_utils import TestClient

from livemeet.config import ServerConfig
from livemeet.errors import ExpectationFailed
from livemeet.gateway.api_keys import ApiKeyStore, store_path
from livemeet.gateway.app import create_app
from tests.gateway.conftest import ClientFactory, wav_bytes
from tests.gateway.fakes import FakeTranscriber

BOUNDARY = "lm-test-boundary"


def multipart(audio: bytes) -> bytes:
    head = (
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
        f"--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    return head + audio + f"\r\n--{BOUNDARY}--\r\n".encode()


def request_head(length: int, headers: dict[str, str]) -> bytes:
    lines = [
        "POST /v1/audio/transcriptions HTTP/1.1",
        "Host: test",
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}",
        f"Content-Length: {length}",
        "Expect: 100-continue",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: (status, headers with lower-case names, body by Content-Length)."""
    status_line = await asyncio.wait_for(reader.readline(), 5)
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


@pytest.fixture
def key(server_config: ServerConfig) -> str:
    """The one key of the server's store (--auth auto: keys are required)."""
    _, secret = ApiKeyStore(store_path(server_config.data_dir)).create("ci")
    return secret


@pytest.fixture
async def keyed(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber, key: str
) -> TestClient:
    return await aiohttp_client(create_app(server_config, fake))


async def open_socket(client: TestClient) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(client.server.host, client.server.port)


async def answer_before_body(
    client: TestClient, length: int, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """The server's answer to an upload's head with `Expect: 100-continue` whose body of
    `length` bytes is never sent: status, headers (lower-cased names) and body."""
    reader, writer = await open_socket(client)
    writer.write(request_head(length, headers))
    await writer.drain()
    answer = await read_response(reader)
    writer.close()
    return answer


async def test_a_refused_key_is_answered_before_the_body(keyed: TestClient) -> None:
    """Before, aiohttp said 100 ahead of the auth middleware: the client sent the whole
    file, then got the 401."""
    body = multipart(wav_bytes(1.0))
    auth = {"Authorization": "Bearer lm_000000000000_x"}
    status, headers, answer = await answer_before_body(keyed, len(body), auth)
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert json.loads(answer)["error"]["code"] == "unauthorized"


async def test_a_good_key_gets_100_continue_then_its_transcript(
    keyed: TestClient, key: str
) -> None:
    reader, writer = await open_socket(keyed)
    body = multipart(wav_bytes(1.0))
    writer.write(request_head(len(body), {"Authorization": f"Bearer {key}"}))
    await writer.drain()
    interim = await asyncio.wait_for(reader.readline(), 5)
    assert interim.startswith(b"HTTP/1.1 100")
    assert await reader.readline() == b"\r\n"
    writer.write(body)
    await writer.drain()
    status, _, answer = await read_response(reader)
    writer.close()
    assert status == 200, answer
    assert json.loads(answer)["text"]


async def test_a_declared_body_over_the_limit_is_413_before_the_body(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    gateway = replace(server_config.gateway, max_upload_bytes=1000)
    client = await aiohttp_client(create_app(replace(server_config, gateway=gateway), fake))
    status, _, answer = await answer_before_body(client, 5000, {})
    assert status == 413
    assert json.loads(answer)["error"]["code"] == "payload_too_large"
    assert not fake.sessions  # no upload began


async def test_a_content_encoding_the_server_does_not_decode_is_refused_before_its_body(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """An `x-gzip` body would be refused once sent (aiohttp does not inflate it): the
    headers tell already, so the client is told before it sends the body."""
    client = await aiohttp_client(create_app(server_config, fake))
    status, _, body = await answer_before_body(client, 10_000, {"Content-Encoding": "x-gzip"})
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "invalid_request"
    assert "Content-Encoding 'x-gzip'" in error["message"]
    assert not fake.sessions


async def test_a_page_of_another_origin_is_refused_before_its_body(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A server that asks for no key: a form posted from another site is refused (400
    request_rejected) before it sends its body, as a wrong key is."""
    client = await aiohttp_client(create_app(server_config, fake))
    status, _, body = await answer_before_body(client, 10_000, {"Origin": "https://evil.example"})
    assert status == 400 and json.loads(body)["error"]["code"] == "request_rejected"
    assert not fake.sessions


async def test_an_unknown_expectation_is_417_in_the_error_shape_on_every_route(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """The 417 was aiohttp's text/plain answer, the one error not in the JSON shape of every
    other (its route's expect handler runs ahead of the middleware), on a path no route
    serves too; it is the typed expectation_failed, counted, and the connection closes."""
    client = await aiohttp_client(create_app(server_config, fake))
    upload = request_head(10, {}).replace(b"100-continue", b"something-else")
    get = b"GET %s HTTP/1.1\r\nHost: test\r\nExpect: something-else\r\n\r\n"
    for head in (upload, get % b"/v1/models", get % b"/nowhere"):
        reader, writer = await open_socket(client)
        writer.write(head)
        await writer.drain()
        status, headers, body = await read_response(reader)
        writer.close()
        assert status == 417 and headers["content-type"].startswith("application/json")
        error = json.loads(body)["error"]
        assert error["code"] == ExpectationFailed.code, head
        assert error["message"] == (
            "unknown Expect: 'something-else'; the server meets 100-continue"
        )
        assert headers["connection"] == "close" and headers["server"] == "livemeet"
    metrics = await (await client.get("/metrics")).text()
    assert 'livemeet_errors_total{code="expectation_failed"} 3.0' in metrics


async def test_an_expectation_of_bytes_that_are_not_utf8_is_417_not_a_500(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The 417's text named the value, whose surrogates (bytes that are not UTF-8) its
    encoding raised on: a 500 and a traceback, before any key was asked for (a security
    review); fixed on uploads, it was still so on every other route."""
    client = await aiohttp_client(create_app(server_config, fake))
    upload = request_head(10, {}).replace(b"100-continue", b"\xff\xfe")
    get = b"GET /v1/models HTTP/1.1\r\nHost: test\r\nExpect: \xff\xfe\r\n\r\n"
    for head in (upload, get):
        reader, writer = await open_socket(client)
        writer.write(head)
        await writer.drain()
        status, _, body = await read_response(reader)
        writer.close()
        assert status == 417 and b"\\udcff" in body
    assert not [r for r in caplog.records if r.exc_info]
