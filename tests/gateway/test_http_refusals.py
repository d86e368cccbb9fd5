"""Requests aiohttp's HTTP parser refuses (malformed request lines and headers) get the gateway's
JSON error and one log line: they got a text/plain 400 and an aiohttp traceback in the log
(a trial), since they never reach the app's error middleware. Raw bytes on a socket, as a
client that sends them would."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, NamedTuple

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from livemeet.config import ServerConfig
from livemeet.errors import (
    ClientTimeout,
    HeadersTooLarge,
    InternalError,
    InvalidRequest,
    LivemeetError,
    NotFound,
    PayloadTooLarge,
)
from livemeet.gateway.app import create_app
from livemeet.gateway.keys import METRICS_KEY
from tests.gateway.conftest import ClientFactory
from tests.gateway.fakes import FakeTranscriber

MODELS = b"GET /v1/models HTTP/1.1\r\nHost: livemeet\r\n"
UPLOAD = b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: livemeet\r\n"
READ_TIMEOUT_S = 5.0  # s a refused request's answer (and the connection's close) may take


class RawResponse(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"].startswith("application/json"), self
        body: dict[str, Any] = json.loads(self.body)["error"]
        return body


async def exchange(client: TestClient, request: bytes) -> RawResponse:
    """Send `request` as raw bytes; read the answer until the server closes the connection."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), READ_TIMEOUT_S)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return RawResponse(
        int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body
    )


def assert_refused(response: RawResponse, error: type[LivemeetError]) -> dict[str, Any]:
    assert response.status == error.http_status, response
    body = response.error()
    assert set(body) == {"message", "type", "param", "code"}
    assert body["code"] == error.code and body["type"] == "invalid_request_error"
    return body


MALFORMED = {
    "duplicate Host": MODELS + b"Host: other\r\n\r\n",
    "obsolete header folding": MODELS + b"X-A: 1\r\n  folded\r\n\r\n",
    "invalid Content-Length": UPLOAD + b"Content-Length: abc\r\n\r\n",
    "two Content-Lengths": UPLOAD + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "Content-Length with chunked": UPLOAD
    + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "space before the colon": b"GET /v1/models HTTP/1.1\r\nHost : livemeet\r\n\r\n",
    "NUL in a header": MODELS + b"X-A: a\x00b\r\n\r\n",
    "unknown HTTP version": b"GET /v1/models HTTP/9.9\r\nHost: livemeet\r\n\r\n",
    "TLS to the plain port": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_request_gets_a_json_400_and_one_log_line(
    client: TestClient, caplog: pytest.LogCaptureFixture, request_bytes: bytes
) -> None:
    caplog.set_level(logging.DEBUG)
    response = await exchange(client, request_bytes)
    body = assert_refused(response, InvalidRequest)
    assert body["message"].startswith("malformed HTTP request: ") and "\n" not in body["message"]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    (line,) = [r.getMessage() for r in caplog.records if "refused a request" in r.getMessage()]
    assert "invalid_request" in line and "\n" not in line


AIOHTTP_CLIENT_MAX_SIZE = 1 << 20  # bytes; web.Application's default client_max_size
HUGE = b"a" * 9000  # bytes; past aiohttp's 8190-byte line and field limits


@pytest.mark.parametrize(
    "request_bytes",
    [MODELS + b"X-Big: " + HUGE + b"\r\n\r\n", MODELS + HUGE + b": 1\r\n\r\n"],
    ids=["header value", "header name"],
)
async def test_an_oversized_header_is_431(
    client: TestClient, caplog: pytest.LogCaptureFixture, request_bytes: bytes
) -> None:
    caplog.set_level(logging.INFO)
    response = await exchange(client, request_bytes)
    assert "8190 bytes" in assert_refused(response, HeadersTooLarge)["message"]
    assert not [r for r in caplog.records if r.exc_info]
    errors = client.app[METRICS_KEY].registry.get_sample_value(
        "livemeet_errors_total", {"code": HeadersTooLarge.code}
    )
    assert errors == 1  # counted as the middleware counts the errors it renders


async def test_too_many_header_fields_are_431(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Past aiohttp's 128 header fields the head is too large as a whole: it was a 400
    invalid_request, where RFC 6585's 431 (and headers_too_large) covers fields "individually
    or collectively" too large (a security review)."""
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(200))
    response = await exchange(client, MODELS + fields + b"\r\n")
    assert "header fields" in assert_refused(response, HeadersTooLarge)["message"]
    assert not [r for r in caplog.records if r.exc_info]


async def test_the_server_header_names_no_versions(client: TestClient) -> None:
    """aiohttp's default `Server: Python/3.11 aiohttp/3.14.5` told anyone, no key needed,
    which versions to look up flaws of (a security review): every answer, the parser's
    refusals, the app's errors, a WebSocket's handshake, says `livemeet` alone."""
    refused = await exchange(client, MODELS + b"Host: other\r\n\r\n")
    answered = await exchange(client, MODELS + b"Connection: close\r\n\r\n")
    unknown = await exchange(client, b"GET /nope HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    for response in (refused, answered, unknown):
        assert response.headers["server"] == "livemeet", response
    async with client.ws_connect("/v1/live") as ws:
        assert ws._response.headers["Server"] == "livemeet"


async def test_well_formed_requests_are_answered_as_before(client: TestClient) -> None:
    response = await exchange(client, MODELS + b"Connection: close\r\n\r\n")
    assert response.status == 200 and json.loads(response.body)["object"] == "list"
    unknown = b"GET /nope HTTP/1.1\r\nHost: livemeet\r\nConnection: close\r\n\r\n"
    assert_refused(await exchange(client, unknown), NotFound)


async def test_a_bug_outside_the_middleware_is_a_json_500_with_its_traceback(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiohttp answers an exception raised before the middleware (here an `Expect` handler's)
    itself, as text/plain 500."""

    async def broken_expect(request: web.Request) -> None:
        raise RuntimeError("boom")

    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    app = create_app(server_config, fake)
    app.router.add_post("/broken", handler, expect_handler=broken_expect)
    client = await aiohttp_client(app)
    request = (
        b"POST /broken HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n"
    )
    response = await exchange(client, request)
    assert response.status == 500 and response.error()["code"] == InternalError.code
    assert [r for r in caplog.records if r.exc_info and "boom" in str(r.exc_info[1])]


async def test_a_body_that_does_not_inflate_is_a_json_400_not_a_bug(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A gzip Content-Encoding over bytes that are not gzip failed the upload's read with
    aiohttp's RequestPayloadError: a 500 `internal_error` and two tracebacks (the middleware's,
    then aiohttp's as it drained the rest of the body)."""
    caplog.set_level(logging.INFO)
    request = (
        UPLOAD + b"Content-Type: multipart/form-data; boundary=x\r\n"
        b"Content-Encoding: gzip\r\nContent-Length: 10\r\n\r\n0123456789"
    )
    body = assert_refused(await exchange(client, request), InvalidRequest)
    assert body["message"] == "malformed request body: Can not decode content-encoding: gzip"
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("coding", "named"),
    [
        ("x-gzip", "'x-gzip'"),
        ("compress", "'compress'"),
        ("gzip, gzip", "'gzip, gzip'"),
        ("gzip, identity", "'gzip, identity'"),
        ("bogus", "'bogus'"),
    ],
)
async def test_a_content_encoding_aiohttp_does_not_know_is_refused_not_read_as_the_body(
    client: TestClient, coding: str, named: str
) -> None:
    """aiohttp inflates gzip and deflate (br and zstd where their packages are installed) and
    passes a body of any other coding on as it came: an `x-gzip` or `compress` body, or a
    stacked `gzip, gzip` one, was read as multipart ("malformed multipart body: no opening
    boundary", a probe of the protocol), and a plain body labelled `bogus` was transcribed. It
    is refused as br's is, naming the coding, before any of the body is read."""
    request = (
        UPLOAD + b"Connection: close\r\nContent-Type: multipart/form-data; boundary=x\r\n"
        b"Content-Encoding: " + coding.encode() + b"\r\nContent-Length: 10\r\n\r\n0123456789"
    )
    body = assert_refused(await exchange(client, request), InvalidRequest)
    assert body["message"] == (
        f"the body's Content-Encoding {named} is not one the server decodes: "
        "send the body as it is, or gzip or deflate it"
    )


@pytest.mark.parametrize("coding", ["br", "zstd"])
async def test_a_content_encoding_the_server_cannot_decode_is_named_for_the_client(
    client: TestClient, coding: str
) -> None:
    """`Content-Encoding: br` got "malformed HTTP request: Can not decode content-encoding:
    brotli (br). Please install `Brotli`" (a new user's trial): advice for the server's
    operator, not the client, who is told instead what to send."""
    request = (
        UPLOAD + b"Content-Type: multipart/form-data; boundary=x\r\n"
        b"Content-Encoding: " + coding.encode() + b"\r\nContent-Length: 10\r\n\r\n0123456789"
    )
    body = assert_refused(await exchange(client, request), InvalidRequest)
    assert body["message"].startswith("the body's Content-Encoding ")
    assert f"({coding})" in body["message"] and "install" not in body["message"].lower()
    assert body["message"].endswith("send the body as it is, or gzip or deflate it")


@pytest.mark.parametrize(
    ("raised", "error"),
    [
        (None, PayloadTooLarge),  # the body read whole, over aiohttp's client_max_size
        (web.HTTPBadRequest(text="no such thing"), InvalidRequest),
        (web.HTTPRequestTimeout(), ClientTimeout),
        (web.HTTPGatewayTimeout(), InternalError),
    ],
    ids=["client_max_size", "400", "408", "504"],
)
async def test_aiohttp_http_errors_are_the_class_of_their_status(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    raised: web.HTTPException | None,
    error: type[LivemeetError],
) -> None:
    """An HTTP error aiohttp raises in a handler was rendered as `internal_error` (the 500 class,
    type server_error) under the exception's own 4xx status."""

    async def handler(request: web.Request) -> web.Response:
        if raised is not None:
            raise raised
        await request.read()  # past client_max_size: HTTPRequestEntityTooLarge
        return web.Response()

    app = create_app(server_config, fake)
    app.router.add_post("/whole", handler)
    client = await aiohttp_client(app)
    answer = await client.post("/whole", data=b"x" * (AIOHTTP_CLIENT_MAX_SIZE + 1))
    body = await answer.json()
    assert answer.status == error.http_status and body["error"]["code"] == error.code, body
