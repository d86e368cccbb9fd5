"""The security headers of the web pages the gateway serves (livemeet/web/): a
Content-Security-Policy fit for each page, and what every file of them carries.

What each page loads, and so what its policy allows (`default-src 'none'` forbids the rest):
- The recorder (`/`, index.html): its module script and the AudioWorklet's (recorder.js,
  pcm-worklet.js: `script-src 'self'`), its one inline `<style>` (by its SHA-256, computed
  from the file when the routes are made: no inline style besides; the script sets styles
  through the CSSOM, which CSP leaves alone), its icon (a `data:` image), and its own server
  for `fetch` (readyz, transcripts) and the live WebSocket (`connect_sources`). It may not be
  framed (`frame-ancestors 'none'`,
  and `X-Frame-Options: DENY` for older browsers): a page that framed it could lure a click
  onto its microphone prompt or its Start button (clickjacking).
- The captions overlay (captions.html): its script, its icon, the captions WebSocket; it is
  meant to be embedded (an OBS browser source, an iframe on any site), so it says nothing of
  framing. Its styles may be inline (`'unsafe-inline'`): OBS adds a browser source's "custom
  CSS" as a `<style>` element of the page, which a hash cannot name; the overlay draws
  captions as text (`textContent`), so no markup of a caption could add a style. That CSS
  may bring a web font, a stylesheet (`@import` of a font service's CSS) or a background
  image from any HTTPS host (`font-src https: data:`, `style-src ... https:`, `img-src data:
  https:`): a streamer styles the captions with the channel's font. Scripts stay the page's
  own, which is what the policy is for.
`connect-src 'self'` matches ws: and wss: of the page's host in CSP Level 3, but not in Safari
before 16 (WebKit bug 201591: iOS 15 is the last Safari of an iPhone 6s or 7) nor Chromium
before 70: there the recorder could not open its live socket, nor the overlay its captions
socket. So each page's policy names the sockets of its own host too (`ws://HOST`,
`wss://HOST`: the request's Host, and a proxy's X-Forwarded-Host), as the browser sends it.
Both send no referrer (`Referrer-Policy: no-referrer`): the overlay's URL holds the session's
captions token, which a `Referer` of its requests carried to whatever logs them (a proxy);
the pages ask nothing of another site. Every file is `X-Content-Type-Options: nosniff`.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Iterable
from html.parser import HTMLParser
from pathlib import Path

RECORDER_PAGE = "index.html"
CAPTIONS_PAGE = "captions.html"
NOSNIFF = {"X-Content-Type-Options": "nosniff"}
# a Host value a CSP host-source can name: a domain name or IPv4 address, maybe with a port
# (CSP's grammar has no IPv6 literal, and nothing else may reach the policy: a `;` would
# start a directive of the client's choosing)
_CSP_HOST = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]{1,5})?")


class _InlineStyles(HTMLParser):
    """The text of each `<style>` element, as the browser hashes it (HTMLParser reads a
    style element's content raw, as a browser does, possibly in several pieces)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.styles: list[str] = []
        self._open: list[str] | None = None  # the pieces of the style element open now

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "style":
            self._open = []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "style" and self._open is not None:
            self.styles.append("".join(self._open))
            self._open = None


def inline_style_hashes(html: str) -> list[str]:
    """The CSP hash sources (`'sha256-...'`) of the `<style>` elements of `html`."""
    parser = _InlineStyles()
    parser.feed(html.replace("\r\n", "\n").replace("\r", "\n"))  # as a browser reads it
    parser.close()
    return [
        f"'sha256-{base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()}'"
        for style in parser.styles
    ]


def connect_sources(hosts: Iterable[str | None]) -> str:
    """connect-src's sources for a page served to a request that names `hosts` (its Host,
    and a proxy's first X-Forwarded-Host; None: absent): `'self'`, then `ws://HOST` and
    `wss://HOST` of each that a CSP host-source can name (module docstring: Safari before 16
    does not read `'self'` as the page's sockets)."""
    sources = ["'self'"]
    for host in hosts:
        if host is not None and _CSP_HOST.fullmatch(host):
            for scheme in ("ws", "wss"):
                if (source := f"{scheme}://{host.lower()}") not in sources:
                    sources.append(source)
    return " ".join(sources)


def recorder_policy(html: str, connect: str = "'self'") -> str:
    """The recorder page's Content-Security-Policy, `html` the page (for its styles' hashes),
    `connect` its connect-src sources (`connect_sources`)."""
    styles = " ".join(inline_style_hashes(html)) or "'none'"
    return (
        "default-src 'none'; script-src 'self'; "
        f"style-src {styles}; img-src data:; connect-src {connect}; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def captions_policy(connect: str = "'self'") -> str:
    """The captions overlay's Content-Security-Policy, `connect` its connect-src sources."""
    return (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline' https:; "
        f"font-src https: data:; img-src data: https:; connect-src {connect}; "
        "base-uri 'none'; form-action 'none'"
    )


PageHeaders = Callable[[Iterable[str | None]], dict[str, str]]


def page_headers(path: Path) -> PageHeaders:
    """The headers a web file is served with, by the hosts its request names
    (`connect_sources`). The page is read now: a page edited under a running server keeps the
    hashes of its styles at start until the server restarts. Raises OSError where the
    recorder page cannot be read."""
    if path.name == RECORDER_PAGE:
        html = path.read_text(encoding="utf-8")
        return lambda hosts: {
            "Content-Security-Policy": recorder_policy(html, connect_sources(hosts)),
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
            **NOSNIFF,
        }
    if path.name == CAPTIONS_PAGE:
        return lambda hosts: {
            "Content-Security-Policy": captions_policy(connect_sources(hosts)),
            "Referrer-Policy": "no-referrer",
            **NOSNIFF,
        }
    return lambda hosts: dict(NOSNIFF)
