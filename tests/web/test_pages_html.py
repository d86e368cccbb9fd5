"""The pages' HTML (livemeet/web/index.html, livemeet/web/captions.html): what a browser
takes from the markup alone, read with html.parser."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from livemeet.gateway.app import WEB_DIR as WEB  # the pages the gateway serves


class _Elements(HTMLParser):
    """Each element with an id, by id: its tag and attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, tuple[str, dict[str, str | None]]] = {}
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if attributes.get("id"):
            self.by_id[str(attributes["id"])] = (tag, attributes)


def elements(page: str) -> _Elements:
    parser = _Elements()
    parser.feed((WEB / page).read_text())
    return parser


def test_the_recorders_status_and_captions_are_read_out_as_they_change() -> None:
    """A screen reader heard nothing of the status line (recording, reconnecting, ...) nor of
    the captions: both are now polite live regions (the finals: the partials churn), and so
    is what Copy says it did."""
    page = elements("index.html").by_id
    assert page["status"][1].get("aria-live") == "polite"
    assert page["finals"][1].get("aria-live") == "polite"
    assert page["finals"][1].get("role") == "log"
    # a speaker's new name on the lines shown (changed in place), or a line a revision
    # removes, is not news: only the lines put in are read out
    assert page["finals"][1].get("aria-relevant") == "additions"
    assert page["partial"][1].get("aria-live") is None
    assert page["overlay-copied"][1].get("role") == "status"
    # focusable by script (the focus of a button the page disables goes there), not by Tab
    assert page["status"][1].get("tabindex") == "-1"
    # the wait before each reconnect beside the status, not read out at every retry
    assert page["status-detail"][1].get("aria-live") is None


def test_the_recorder_is_drawn_inert_until_its_script_runs() -> None:
    """A browser may draw the markup before recorder.js runs: "idle" with Start enabled was
    drawn for a frame before a stored meeting's "finishing…" (session 39's trial). Start
    ships disabled (the script enables it, unless a stored meeting is finishing) and the
    status says the page is loading."""
    page = elements("index.html").by_id
    assert "disabled" in page["start"][1]
    assert page["status"][1].get("tabindex") == "-1"  # the element found, with its attributes
    text = (WEB / "index.html").read_text()
    assert 'tabindex="-1">loading…</span>' in text and ">idle<" not in text


def test_both_pages_bring_their_icon_along() -> None:
    """The browser asked for /favicon.ico, a 404 in the console of both pages (a trial)."""
    for page in ("index.html", "captions.html"):
        icons = [a for tag, a in elements(page).tags if tag == "link" and a.get("rel") == "icon"]
        assert len(icons) == 1 and str(icons[0].get("href")).startswith("data:"), page


def test_only_the_overlay_url_breaks_mid_word() -> None:
    """`word-break: break-all` on the overlay's line broke its description mid-word ("Captio
    ns overlay") on a narrow screen (a trial): only the URL, which has no spaces, needs it."""
    css = (WEB / "index.html").read_text()
    rules = dict(re.findall(r"^\s*(#[\w-]+) \{([^}]*)\}", css, re.M))
    assert "word-break" not in rules["#overlay"]
    assert "word-break: break-all" in rules["#overlay-url"]


class _Nesting(HTMLParser):
    """The ids of each element with an id's ancestors, by id."""

    VOID = {"meta", "link", "input", "br", "img", "hr", "source", "area", "base", "col", "wbr"}

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []  # the ids (or "") of the elements open now
        self.ancestors: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element_id = str(dict(attrs).get("id") or "")
        if element_id:
            self.ancestors[element_id] = [a for a in self.open if a]
        if tag not in self.VOID:
            self.open.append(element_id)

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.VOID:
            self.open.pop()


def test_the_recorders_controls_stay_in_view_and_fit_a_phone() -> None:
    """On a long meeting Start, Stop and the status line scrolled out of view with the top of
    the page, and at 375 px the API key field overran the page's column (its padding and
    border on top of max-width: 100%) (a trial). The buttons and the status now sit in one
    bar that sticks to the window's top (wrapping on a narrow screen), and the field's width
    holds its padding and border."""
    nesting = _Nesting()
    nesting.feed((WEB / "index.html").read_text())
    for control in ("start", "resume", "stop", "status"):
        assert "controls" in nesting.ancestors[control], control
    css = (WEB / "index.html").read_text()
    rules = {
        selector: dict(re.findall(r"([\w-]+):\s*([^;]+);", body))
        for selector, body in re.findall(r"^\s*(#[\w-]+) \{([^}]*)\}", css, re.M)
    }
    assert rules["#controls"]["position"] == "sticky" and rules["#controls"]["top"] == "0"
    assert rules["#controls"]["flex-wrap"] == "wrap"
    assert "background" in rules["#controls"]  # the captions scroll under it, unseen
    # two lines (line-height 1.5) held for the status: a change between a one-line and a
    # two-line status moved the captions under the bar by a line (a Chromium trial)
    assert rules["#status-line"]["min-height"] == "3em"
    assert rules["#api-key"]["box-sizing"] == "border-box"
    assert rules["#api-key"]["max-width"] == "100%"


def test_only_what_is_under_the_sticky_controls_keeps_clear_of_them() -> None:
    """The document's scroll-padding-top (the bar's height) kept the focused caption below the
    sticky bar, but also scrolled the page up when the focus moved into the bar itself
    (Shift+Tab onto Stop: scrollTop 775 -> 367 at 375 px, a trial). The margin is now the
    scroll-margin-top of the elements after the bar, the bar's height (recorder.js sets it)."""
    css = (WEB / "index.html").read_text()
    margins = re.findall(r"^\s*([^{}\n]+?)\s*\{[^}]*scroll-margin-top:\s*([^;]+);", css, re.M)
    assert margins == [("#controls ~ *, #controls ~ * *", "var(--controls-height, 0px)")]
    assert not re.search(r"scroll-padding[\w-]*\s*:", css)
    js = (WEB / "recorder.js").read_text()
    assert "scrollPadding" not in js


def test_a_speaker_that_cannot_be_named_now_looks_so() -> None:
    """A disabled speaker button (offline, a meeting offered for a resume, after the final)
    looked as clickable as a live one: its colour is set inline, and nothing styled it (a
    Chromium trial). It now fades, and shows no hand, in the list and on the lines."""
    css = (WEB / "index.html").read_text()
    rules = {
        selector.strip(): dict(re.findall(r"([\w-]+):\s*([^;]+);", body))
        for selector, body in re.findall(r"^\s*([^{}\n/]+?)\s*\{([^}]*)\}", css, re.M)
    }
    listed = rules["#speakers button.speaker-name:disabled"]
    assert float(listed["opacity"]) < 1 and listed["cursor"] == "default"
    assert rules[".segment button.speaker:disabled"]["cursor"] == "default"
    assert elements("index.html").by_id["speakers-hint"][0] == "span"  # recorder.js sets it


def test_an_empty_partial_keeps_its_line() -> None:
    """When a final took over the partial line, the page lost the line until the next
    partial, and one following the newest captions bobbed ~28 px up and back (a Chromium
    trial at 375 px): the partial holds one caption line (1.5em of text and a segment's
    .25rem margins, kept inside it)."""
    css = (WEB / "index.html").read_text()
    rules = {
        selector: dict(re.findall(r"([\w-]+):\s*([^;]+);", body))
        for selector, body in re.findall(r"^\s*(#[\w-]+) \{([^}]*)\}", css, re.M)
    }
    assert rules["#partial"]["display"] == "flow-root"  # the segment's margins inside
    assert rules["#partial"]["min-height"] == "calc(1.5em + .5rem)"
    segment = dict(re.findall(r"([\w-]+):\s*([^;]+);", css.split(".segment {")[1].split("}")[0]))
    assert segment["margin"] == ".25rem 0"  # what the .5rem above holds
    assert "line-height" not in segment  # the body's 1.5


def test_the_revision_line_is_read_out() -> None:
    """ "revising…", "revised…", "not revised…" were never read out: the line was no live
    region (a trial). It now sits in one that is always in the page (a region shown only
    along with its news is not reliably read)."""
    page = elements("index.html").by_id
    nesting = _Nesting()
    nesting.feed((WEB / "index.html").read_text())
    assert nesting.ancestors["revision"][-1] == "revision-live"
    region = page["revision-live"][1]
    assert region.get("aria-live") == "polite" and region.get("role") == "status"
    assert "hidden" not in region and "hidden" in page["revision"][1]
