"""The pages' HTML (web/index.html, web/captions.html): what a browser takes from the markup
alone, read with html.parser."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    parser.feed((ROOT / "web" / page).read_text())
    return parser


def test_the_recorders_status_and_captions_are_read_out_as_they_change() -> None:
    """A screen reader heard nothing of the status line (recording, reconnecting, ...) nor of
    the captions: both are now polite live regions (the finals: the partials churn), and so
    is what Copy says it did."""
    page = elements("index.html").by_id
    assert page["status"][1].get("aria-live") == "polite"
    assert page["finals"][1].get("aria-live") == "polite"
    assert page["finals"][1].get("role") == "log"
    assert page["partial"][1].get("aria-live") is None
    assert page["overlay-copied"][1].get("role") == "status"
