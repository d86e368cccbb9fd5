"""The web pages' security headers (livemeet/gateway/pages.py): a Content-Security-Policy fit
for what each page loads, framing forbidden for the recorder and left open for the captions
overlay (an OBS browser source, an iframe), no referrer, no MIME sniffing. A headless Chromium
run (session notes) loaded both pages under these policies: the recorder recorded a meeting
(worklet, live socket, transcript) with no violation, OBS's way of adding custom CSS applied
on the overlay, and a page of another origin could frame the overlay but not the recorder."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

import livemeet.gateway.app as app_module
from livemeet.config import ServerConfig
from livemeet.gateway.app import create_app
from livemeet.gateway.pages import inline_style_hashes
from tests.gateway.fakes import FakeTranscriber

WEB = app_module.WEB_DIR  # the pages the gateway serves


def directives(policy: str) -> dict[str, list[str]]:
    parsed = (part.split() for part in policy.split(";") if part.strip())
    return {name: sources for name, *sources in parsed}


async def test_the_recorder_may_not_be_framed_and_loads_only_its_own(client: TestClient) -> None:
    """The pages had no policy: any site could frame the recorder (its microphone prompt and
    Start button under a lure: clickjacking), and nothing bounded what the page loads."""
    for path in ("/", "/index.html"):
        response = await client.get(path)
        assert response.status == 200
        policy = directives(response.headers["Content-Security-Policy"])
        assert policy["default-src"] == ["'none'"]
        assert policy["script-src"] == ["'self'"]  # recorder.js, pcm-worklet.js
        assert policy["connect-src"][0] == "'self'"  # readyz, transcripts, /v1/live
        assert policy["img-src"] == ["data:"]  # its icon
        assert policy["frame-ancestors"] == ["'none'"]
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["Referrer-Policy"] == "no-referrer"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        # its one inline style, by its hash: no 'unsafe-inline'
        (style,) = re.findall(r"<style>(.*?)</style>", (WEB / "index.html").read_text(), re.S)
        digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
        assert policy["style-src"] == [f"'sha256-{digest}'"]


async def test_the_captions_overlay_may_be_framed_and_restyled(client: TestClient) -> None:
    """The overlay is embedded (OBS, iframes on any site): its policy says nothing of framing,
    and it allows inline styles, as OBS adds a source's custom CSS as a <style> element.
    Its URL holds the captions token: no Referer carries it."""
    response = await client.get("/captions.html?session=s&token=t")
    assert response.status == 200
    policy = directives(response.headers["Content-Security-Policy"])
    assert "frame-ancestors" not in policy and "X-Frame-Options" not in response.headers
    assert policy["default-src"] == ["'none'"]
    assert policy["script-src"] == ["'self'"]
    assert policy["connect-src"][0] == "'self'"
    assert policy["style-src"] == ["'self'", "'unsafe-inline'", "https:"]
    # OBS custom CSS styling the captions with a web font (@import of a font service's CSS,
    # @font-face url()) or a background image: the overlay refused every one
    assert policy["font-src"] == ["https:", "data:"]
    assert policy["img-src"] == ["data:", "https:"]
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_the_pages_name_their_own_sockets_for_safari_before_16(client: TestClient) -> None:
    """`connect-src 'self'` alone blocked the live and captions sockets in Safari before 16
    (WebKit bug 201591; iOS 15 is the last of an iPhone 6s or 7) and Chromium before 70,
    which do not read it as ws: and wss: of the page's host: each page's policy names them,
    by the host the request reached (Host, a proxy's X-Forwarded-Host). A value a host-source
    cannot hold (an IPv6 literal, or a `;` that would add a directive) adds nothing."""
    for path in ("/", "/captions.html"):
        response = await client.get(path, headers={"Host": "Meet.example.com:8443"})
        assert directives(response.headers["Content-Security-Policy"])["connect-src"] == [
            "'self'",
            "ws://meet.example.com:8443",
            "wss://meet.example.com:8443",
        ]
        proxied = await client.get(
            path, headers={"Host": "10.0.0.5:8000", "X-Forwarded-Host": "meet.example.com"}
        )
        assert directives(proxied.headers["Content-Security-Policy"])["connect-src"] == [
            "'self'",
            "ws://10.0.0.5:8000",
            "wss://10.0.0.5:8000",
            "ws://meet.example.com",
            "wss://meet.example.com",
        ]
        for host in ("[::1]:8000", "a.example; script-src *", "a b"):
            response = await client.get(path, headers={"Host": host})
            policy = directives(response.headers["Content-Security-Policy"])
            assert policy["connect-src"] == ["'self'"] and policy["script-src"] == ["'self'"]


@pytest.mark.parametrize("name", ["recorder.js", "pcm-worklet.js", "captions.js"])
async def test_the_scripts_are_not_sniffed(client: TestClient, name: str) -> None:
    response = await client.get(f"/{name}")
    assert response.status == 200 and "javascript" in response.content_type
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "Content-Security-Policy" not in response.headers  # a document's header


def test_the_pages_hold_nothing_inline_their_policies_would_block() -> None:
    """What `script-src 'self'` and the recorder's hashed styles refuse: an inline script or
    event handler, a style attribute, eval; the scripts set styles through the CSSOM, which
    CSP leaves alone."""
    for page in ("index.html", "captions.html"):
        html = (WEB / page).read_text()
        scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
        assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
        assert not re.search(r"\son\w+\s*=", html), page
        assert not re.search(r"\sstyle\s*=", html), page
    for script in ("recorder.js", "captions.js", "pcm-worklet.js"):
        js = (WEB / script).read_text()
        assert not re.search(r"\beval\(|new Function\(|setAttribute\(\s*[\"']style", js), script
        assert not re.search(r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML", js), script


def test_a_style_hash_is_of_the_text_as_the_browser_reads_it() -> None:
    """The element's text, raw (no entity decoding in a style element), CRLF read as LF."""
    css = "a { content: '&amp;' }\n"
    digest = base64.b64encode(hashlib.sha256(css.encode()).digest()).decode()
    page = f"<head><style>{css}</style><style></style></head>"
    assert inline_style_hashes(page) == [
        f"'sha256-{digest}'",
        f"'sha256-{base64.b64encode(hashlib.sha256(b'').digest()).decode()}'",
    ]
    assert inline_style_hashes(page.replace("\n", "\r\n")) == inline_style_hashes(page)


async def test_a_server_without_its_pages_says_so_and_serves_the_api(
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    server_config: ServerConfig,
    fake: FakeTranscriber,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A wheel that shipped no page (the pages lay outside the package) answered 404 at `/`
    and its log said nothing of it: an operator saw a JSON 404 where the recorder should be.
    The start says which directory lacks them; the API is still served."""
    monkeypatch.setattr(app_module, "WEB_DIR", tmp_path / "no-web")
    with caplog.at_level("ERROR", logger="livemeet.gateway.app"):
        client = await aiohttp_client(create_app(server_config, fake))
    assert f"no web pages in {tmp_path / 'no-web'}" in caplog.text
    assert (await client.get("/")).status == 404
    assert (await client.get("/v1/models")).status == 200
