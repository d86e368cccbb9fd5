"""The browser-origin check on the gateway's requests (gateway/origin.py is the policy, with
no I/O): one refusal shared by the live socket, the captions socket and the upload endpoint,
so each refuses a page of a foreign origin the same way."""

from __future__ import annotations

from aiohttp import hdrs, web

from livemeet.errors import RequestRejected
from livemeet.gateway.keys import CONFIG_KEY
from livemeet.gateway.origin import origin_allowed


def request_hosts(request: web.BaseRequest) -> tuple[str | None, str | None]:
    """The hosts a request reached the server as: its `Host`, and behind a proxy the first
    `X-Forwarded-Host` (None: absent)."""
    forwarded = request.headers.get(hdrs.X_FORWARDED_HOST, "").split(",")[0].strip() or None
    return request.headers.get(hdrs.HOST), forwarded


def check_browser_origin(request: web.Request, what: str) -> None:
    """Refuse a request from a browser page of an origin not allowed (gateway/origin.py):
    RequestRejected (HTTP 400; for a WebSocket, before the upgrade). `what`: what the page
    may not do, for the message ("open live sessions", "upload"). Requests without an
    `Origin` (clients that are not browsers) pass."""
    origin = request.headers.get(hdrs.ORIGIN)
    allowed = request.app[CONFIG_KEY].gateway.allowed_origins
    if not origin_allowed(origin, request_hosts(request), allowed):
        raise RequestRejected(
            f"a page from {origin!r} may not {what} here (serve --allowed-origin)"
        )
