"""Which web pages may open a live WebSocket or upload (no I/O; gateway/origin_http.py
applies it to a request); the same `--allowed-origin` list, written as browsers send it
(`canonical_origin`), is the HTTP API's CORS list (gateway/app.py).

A browser lets any page open a WebSocket to any server and sends the page's origin in the
`Origin` header; the server must check it (cross-site WebSocket hijacking). Without a check,
any site a user visits could stream to a livemeet server on their machine or intranet. So a
browser's socket is taken when its origin is the server's own (the recorder page, `GET /`) or
one `serve --allowed-origin` names ("*": any). Clients that are not browsers send no
`Origin` and are taken as before. Hosts compare as (lower-case host, port), the scheme's
default port filled in (a `Host` without a port is the page's scheme's default: a page on
another port of the same host is another origin). Not covered: DNS rebinding (a page whose
own name resolves to the server has a matching Host); a server on a public name should sit
behind a proxy that checks the Host.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

ANY_ORIGIN = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def parse_origin(origin: str) -> tuple[str, int] | None:
    """(host, port) of an origin such as `https://meet.example.com` (port 443 filled in), or
    None when it has no http(s) scheme or host."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return None
    return _host_port(parts.netloc, _DEFAULT_PORTS[scheme])


def _host_port(host_header: str, default_port: int) -> tuple[str, int] | None:
    """(host, port) of a Host-style header value (`meet.example.com:8443`, `[::1]:8000`)."""
    try:
        parts = urlsplit(f"//{host_header.strip()}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    return host.lower(), port if port is not None else default_port


def origin_allowed(
    origin: str | None, hosts: Collection[str | None], allowed: Collection[str] = ()
) -> bool:
    """True when a WebSocket handshake with `Origin: origin` (None: no header) to a server
    reached as any of `hosts` (its `Host` header, and behind a proxy the first
    `X-Forwarded-Host`: a page cannot set either on a WebSocket) may proceed. `allowed`:
    origins as browsers send them (`https://meet.example.com`, `http://localhost:3000`;
    `check_allowed_origin` vets them), or ANY_ORIGIN."""
    if origin is None or ANY_ORIGIN in allowed:
        return True
    if origin.strip() == "null":  # a file:// or sandboxed page, unless named
        return "null" in allowed
    page = parse_origin(origin)
    if page is None:
        return False
    if page in {parse_origin(a) for a in allowed}:
        return True
    # a Host without a port names the default port of the scheme it was reached by (RFC
    # 9110 section 7.2), so it is the page's own where the page's scheme has that port. Not
    # the page's own port: a page of any other port of the host (a dev server, another app)
    # passed as the server's own (a security review)
    default_port = _DEFAULT_PORTS[urlsplit(origin.strip()).scheme.lower()]
    return any(h is not None and _host_port(h, default_port) == page for h in hosts)


def canonical_origin(value: str) -> str:
    """`value` (an allowed origin `check_allowed_origin` passed) as a browser writes it in an
    `Origin` header: lower case, no trailing slash, the scheme's default port left out
    (`HTTPS://Meet.Example.com:443/` -> `https://meet.example.com`). ANY_ORIGIN and "null"
    are returned as they are."""
    page = parse_origin(value)
    if value in (ANY_ORIGIN, "null") or page is None:
        return value
    scheme = urlsplit(value.strip()).scheme.lower()
    host, port = page
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return f"{scheme}://{host}" if port == _DEFAULT_PORTS[scheme] else f"{scheme}://{host}:{port}"


def check_allowed_origin(value: str) -> str | None:
    """None when `value` can match a browser's Origin (ANY_ORIGIN, "null", or an http(s) URL
    with a host and nothing after it), else why not."""
    if value in (ANY_ORIGIN, "null"):
        return None
    if parse_origin(value) is None:
        return f"{value!r} is not an origin such as https://meet.example.com"
    if urlsplit(value.strip()).path.strip("/"):
        return f"{value!r} has a path; an origin is scheme://host[:port] only"
    return None
