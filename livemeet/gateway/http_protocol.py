"""The gateway's HTTP connection protocol: aiohttp's, with refusals in the gateway's error shape.

A request that aiohttp's parser rejects (a duplicate Host, bad header folding, an invalid
Content-Length, an oversized header line, TLS sent to the plain port) never reaches the app's
middleware: aiohttp answers it from `RequestHandler.handle_error` with a text/plain 400 and logs
a traceback. aiohttp offers no hook for that answer (aio-libs/aiohttp#3287, open), so the app's
server builds `GatewayRequestHandler`, whose `handle_error` renders a LivemeetError and logs one
line. An `Expect` header other than `100-continue` is refused here too, for every request,
routed or not (`refuse_unknown_expectations`): aiohttp answers it from the route's expect
handler, ahead of the app's middleware, with a text/plain 417 (and a 500 where the value is
not UTF-8). Everything else about the connection is aiohttp's, but for the shutdown
(`GatewayServer.pre_shutdown`): aiohttp closes every connection before the app's drain, and a
closed connection drops whatever it receives from then on.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    ContentEncodingError,
    HttpProcessingError,
    LineTooLong,
)
from aiohttp.web_protocol import RequestHandler

from livemeet.errors import (
    ExpectationFailed,
    HeadersTooLarge,
    InternalError,
    InvalidRequest,
    LivemeetError,
)
from livemeet.gateway.errors_http import error_response

log = logging.getLogger(__name__)

SHUTDOWN_POLL_S = 0.05  # s between checks for requests still running at shutdown
# s aiohttp's shutdown gets, at least, to cancel the requests still running past its timeout:
# it reads a timeout of 0 as none, and waited for them however long they took
SHUTDOWN_CANCEL_S = 1.0
# what both of aiohttp's parsers (C and Python) say past their 128 header fields; no class
# of its own tells it from other malformed requests
TOO_MANY_HEADERS = "Too many headers received"
# every response's `Server` header: no versions (aiohttp's default names its own and Python's,
# telling a scanner which known flaws to try)
SERVER_NAME = "livemeet"
# the coding in aiohttp's "Can not decode content-encoding: brotli (br). Please install ..."
_CODING = re.compile(r"content-encoding: ([^.]+)")

ErrorListener = Callable[[LivemeetError], None]
RequestHandlerFunc = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def one_line(text: str) -> str:
    """aiohttp's parser message on one line: its multi-line form (reason, offending bytes as a
    repr, a caret under the fault) would split a log line; the caret means nothing flattened."""
    parts = (part.strip() for part in text.splitlines())
    return " ".join(part for part in parts if part and part != "^")


def refusal_error(status: int, exc: BaseException | None, message: str | None) -> LivemeetError:
    """The typed error for what aiohttp's protocol answers itself: a request its parser rejected
    (`status` 400, `exc` the HttpProcessingError), or an exception that escaped the app (500; a
    504 for a TimeoutError, which the error middleware catches first)."""
    if isinstance(exc, LineTooLong):
        limit = exc.args[1]
        return HeadersTooLarge(f"request line or header field over {limit} bytes")
    if isinstance(exc, BadHttpMessage) and exc.message == TOO_MANY_HEADERS:
        # RFC 6585's 431 is for the fields "individually or collectively" too large
        return HeadersTooLarge("more header fields than the server reads (128)")
    if isinstance(exc, ContentEncodingError) and (coding := _CODING.search(exc.message)):
        # a coding aiohttp has no decoder for here (br, zstd): its words ("Please install
        # `Brotli`") advise the server's operator, not the client
        return InvalidRequest(
            f"the body's Content-Encoding {coding.group(1)} is not one the server decodes: "
            "send the body as it is, or gzip or deflate it"
        )
    if status < 500:
        reason = message or (exc.message if isinstance(exc, HttpProcessingError) else "")
        return InvalidRequest(f"malformed HTTP request: {one_line(reason) or 'bad request'}")
    return InternalError("internal server error")


def malformed_body(exc: web.RequestPayloadError) -> InvalidRequest:
    """The typed error for a body the parser failed while a handler read it (one that does not
    inflate as its Content-Encoding says): a client's mistake, not a bug."""
    cause = exc.__cause__
    reason = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
    return InvalidRequest(f"malformed request body: {one_line(reason)}")


def refuse_unknown_expectations(
    handler: RequestHandlerFunc, on_error: ErrorListener
) -> RequestHandlerFunc:
    """`handler` (the app's), behind a check of the request's `Expect` header: a value other
    than `100-continue` (which the routes' expect handlers meet) is ExpectationFailed (417,
    the JSON error shape), and the connection closes after it (the client may be sending a
    body nobody asked for). Heard by `on_error`, as the parser's refusals are."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        expect = request.headers.get(hdrs.EXPECT)
        if not expect or expect.lower() == "100-continue":
            return await handler(request)
        # repr: bytes that are not UTF-8 come as surrogates, which a body cannot encode
        error = ExpectationFailed(f"unknown Expect: {expect!r}; the server meets 100-continue")
        log.info("refused a request from %s: %s: %s", request.remote, error.code, error.message)
        on_error(error)
        response = error_response(error)
        response.headers[hdrs.SERVER] = SERVER_NAME  # no route: `name_the_server` is not run
        response.force_close()
        return response

    return handle


class GatewayRequestHandler(RequestHandler):
    """aiohttp's protocol; refusals are the gateway's JSON errors (see the module docstring).
    `on_error` hears each refusal."""

    __slots__ = ("_on_error",)

    def __init__(self, manager: web.Server, *, on_error: ErrorListener, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._on_error = on_error

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's hook for what its protocol answers itself (a request its parser rejected, an
        exception that escaped the app): the `refusal_error` of it as the gateway's JSON error
        (`error_response`), with `Server` set and the connection closed after it. Logs one line, a
        traceback only for an InternalError; `on_error` hears the error. Raises ConnectionError
        when a response is already under way (nothing else can be sent)."""
        error = refusal_error(status, exc, message)
        if isinstance(error, InternalError):  # a bug: its traceback, as aiohttp logs it
            self.log_exception("error handling a request from %s", request.remote, exc_info=exc)
        else:
            # non-HTTP bytes (scanners, TLS to the plain port) are the internet's noise, as
            # aiohttp judges them too
            level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
            log.log(
                level,
                "refused a request from %s: %s: %s",
                request.remote,
                error.code,
                error.message,
            )
        self._on_error(error)
        if request.writer.output_size > 0:  # as aiohttp's: a response is already under way
            raise ConnectionError("response already started; cannot send the error")
        response = error_response(error)
        response.headers[hdrs.SERVER] = SERVER_NAME  # no app here: `name_the_server` is not run
        response.force_close()  # the parser's place in the byte stream is lost
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's, but a RequestPayloadError (the drain of a refused request's unread body) is
        logged at DEBUG: the error middleware answered and logged that request already."""
        # aiohttp drains a request's unread body after its response, and logs the drain's
        # failure as "Unhandled exception"; for a malformed body (bad content coding) the error
        # middleware has answered and logged it already
        if isinstance(kw.get("exc_info"), web.RequestPayloadError):
            log.debug("unread body of a refused request dropped: %s", one_line(str(kw["exc_info"])))
            return
        super().log_exception(*args, **kw)


class GatewayServer(web.Server):
    """aiohttp's server, building GatewayRequestHandler connections."""

    def __init__(self, server: web.Server, on_error: ErrorListener) -> None:
        # the arguments aiohttp's Application gave `server` (its handler args included)
        super().__init__(
            refuse_unknown_expectations(server.request_handler, on_error),
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **server._kwargs,
        )
        self._on_error = on_error

    def __call__(self) -> RequestHandler:
        return GatewayRequestHandler(self, loop=self._loop, on_error=self._on_error, **self._kwargs)

    def pre_shutdown(self) -> None:
        """The listener is closed; the app's drain (`on_shutdown`) comes next. aiohttp closes
        every connection here, and a closed connection drops the bytes it receives from then
        on: an upload's body in flight stalled until its idle timeout (a 408 blaming the
        client, after 60 s; a trial), and live and captions sockets read nothing from their
        clients during the drain (their close replies, their pings: a captions subscriber
        held the shutdown ~40 s). Here only idle connections close; busy ones stay open until
        their request is done or `shutdown` comes. An idle one is closed at once, as the
        listener is: aiohttp's close leaves its socket open and deaf, so a request sent on it
        during the drain (a browser's keep-alive: a transcript poll, a captions upgrade) was
        never answered, its connection closed only after the drain (a trial: 5 s of a 6-s
        `--upload-drain-s`). One with a request read but not yet started finishes it."""
        for conn in self._connections:
            if _busy(conn):
                continue
            if _idle(conn):
                conn.force_close()
            else:
                conn.close()  # a request read, queued or about to start: answered, then closed

    async def shutdown(self, timeout: float | None = None) -> None:
        """After the drain: wait, within `timeout` (s; aiohttp's shutdown timeout), for the
        requests still running to be done, still reading: an upload still sending its body
        or being transcribed, and the WebSockets the drain is closing (a close waits for the
        client's reply, up to 10 s, which a closed connection drops: a captions overlay held
        every restart 10 s); then aiohttp's shutdown, which closes every connection and
        cancels what is left within the rest of `timeout` (at least SHUTDOWN_CANCEL_S)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while any(_busy(c) for c in self._connections):
            if deadline is not None and loop.time() >= deadline:
                break
            await asyncio.sleep(SHUTDOWN_POLL_S)
        for conn in self._connections:
            conn.close()
        left = None if deadline is None else max(SHUTDOWN_CANCEL_S, deadline - loop.time())
        await super().shutdown(left)


def _idle(conn: RequestHandler) -> bool:
    """Whether `conn`, not busy, holds no request it read: waiting for its next one (aiohttp's
    own test, as its keep-alive close makes it), or none read yet (just accepted). Not a
    connection whose request is queued, nor one aiohttp took from its queue and whose handler's
    task has not started yet (a loop iteration, without eager tasks before Python 3.12): a
    test for a queued request alone dropped that one unanswered. A version without these
    attributes counts none idle (closed as aiohttp's own `pre_shutdown` closes them)."""
    waiter = getattr(conn, "_waiter", None)
    if waiter is not None and not waiter.done():
        return True
    return getattr(conn, "_request_count", None) == 0


def _busy(conn: RequestHandler) -> bool:
    """Whether a request is being handled on `conn` (aiohttp's own flag, read as its
    `shutdown` reads it; a version without it counts every connection as idle, as before)."""
    return bool(getattr(conn, "_request_in_progress", False))


async def name_the_server(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: the `Server` header is SERVER_NAME, without versions."""
    response.headers[hdrs.SERVER] = SERVER_NAME


def serve_json_refusals(app: web.Application, on_error: ErrorListener) -> None:
    """Make every server of `app` (`web.run_app`'s, a test client's) a GatewayServer;
    `on_error` hears each refusal (the metrics). Call before the app is frozen."""
    make_server = app._make_handler

    def make_handler(**kwargs: Any) -> web.Server:
        return GatewayServer(make_server(**kwargs), on_error)

    app._make_handler = make_handler  # type: ignore[method-assign]
