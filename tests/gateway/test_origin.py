"""The live WebSocket's Origin check (livemeet/gateway/origin.py)."""

from __future__ import annotations

import pytest

from livemeet.gateway.origin import (
    ANY_ORIGIN,
    canonical_origin,
    check_allowed_origin,
    origin_allowed,
)


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "expected"),
    [
        (None, "meet.example.com", (), True),  # not a browser
        ("https://meet.example.com", "meet.example.com", (), True),  # the recorder page
        ("http://localhost:8000", "LOCALHOST:8000", (), True),
        ("https://evil.example", "meet.example.com", (), False),
        ("http://localhost:8001", "localhost:8000", (), False),  # another port, another origin
        ("null", "meet.example.com", (), False),
        ("null", "meet.example.com", ("null",), True),
        ("https://app.example.com", "meet.example.com", ("https://app.example.com/",), True),
        ("https://evil.example", "meet.example.com", (ANY_ORIGIN,), True),
        ("https://meet.example.com", None, (), False),
        ("http://[::1", "localhost", (), False),  # unparseable
        # default ports compare equal to none (a review: nginx's `Host $host:$server_port`)
        ("https://meet.example.com", "meet.example.com:443", (), True),
        ("http://meet.example.com", "meet.example.com:80", (), True),
        ("https://meet.example.com", "meet.example.com:80", (), False),
        ("https://Meet.Example.com", "x", ("https://meet.example.com:443",), True),
        ("ftp://meet.example.com", "meet.example.com", (), False),
        # a Host without a port is the default one: a page on another port of the same host
        # is another origin (it passed: a security review)
        ("http://meet.example.com:3000", "meet.example.com", (), False),
        ("https://meet.example.com:8443", "meet.example.com", (), False),
        ("http://meet.example.com:443", "meet.example.com", (), False),
        ("http://meet.example.com:80", "meet.example.com", (), True),
        ("https://meet.example.com:8443", "meet.example.com:8443", (), True),
    ],
)
def test_origin_allowed(
    origin: str | None, host: str | None, allowed: tuple[str, ...], expected: bool
) -> None:
    assert origin_allowed(origin, (host,), allowed) is expected


def test_behind_a_proxy_the_forwarded_host_is_the_servers_own() -> None:
    page = "https://meet.example.com"
    assert origin_allowed(page, ("127.0.0.1:8000", "meet.example.com"))
    assert not origin_allowed(page, ("127.0.0.1:8000", None))
    assert origin_allowed("http://[::1]:8000", ("[::1]:8000",))


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("*", True),
        ("null", True),
        ("https://meet.example.com", True),
        ("http://localhost:3000/", True),
        ("meet.example.com", False),  # no scheme: would never match (a review)
        ("https://meet.example.com/app", False),
        ("ws://meet.example.com", False),
    ],
)
def test_allowed_origins_are_checked(value: str, ok: bool) -> None:
    assert (check_allowed_origin(value) is None) is ok


def test_canonical_origin_is_what_a_browser_sends() -> None:
    assert canonical_origin("HTTPS://Meet.Example.com:443/") == "https://meet.example.com"
    assert canonical_origin("http://localhost:3000") == "http://localhost:3000"
    assert canonical_origin("http://[::1]:80") == "http://[::1]"
    assert canonical_origin("http://[::1]:8000") == "http://[::1]:8000"
    assert canonical_origin("*") == "*" and canonical_origin("null") == "null"
