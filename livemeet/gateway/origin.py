"""Which web pages may open a live WebSocket (no I/O).

A browser lets any page open a WebSocket to any server and sends the page's origin in the
`Origin` header; the server must check it (cross-site WebSocket hijacking). Without a check,
any site a user visits could stream to a livemeet server on their machine or intranet. So a
browser's socket is taken when its origin is the server's own (the recorder page, `GET /`) or
one `serve --allowed-origin` names ("*": any). Clients that are not browsers send no
`Origin` and are taken as before.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

ANY_ORIGIN = "*"


def origin_allowed(
    origin: str | None, hosts: Collection[str | None], allowed: Collection[str] = ()
) -> bool:
    """True when a WebSocket handshake with `Origin: origin` (None: no header) to a server
    reached as any of `hosts` (its `Host` header, and behind a proxy the first
    `X-Forwarded-Host`: a page cannot set either on a WebSocket) may proceed. `allowed`:
    origins as browsers send them (`https://meet.example.com`, `http://localhost:3000`), or
    ANY_ORIGIN."""
    if origin is None:
        return True
    if ANY_ORIGIN in allowed or origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return True
    if origin == "null":  # a file:// or sandboxed page: never same-origin
        return False
    try:
        netloc = urlsplit(origin).netloc.lower()
    except ValueError:
        return False
    return bool(netloc) and any(h is not None and h.strip().lower() == netloc for h in hosts)
