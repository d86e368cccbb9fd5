"""The recorder page (web/recorder.js) around a meeting's transcript downloads and across page
reloads, run under node in a stub browser (tests/web/session_harness.js)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node")
URL = "https://meet.example:8000/v1/sessions/s-1/transcript?token=c%2Ft%2Bk%3D&response_format="


@functools.cache
def run(scenario: str) -> dict[str, Any]:
    assert NODE is not None
    out = subprocess.run(
        [NODE, str(Path(__file__).with_name("session_harness.js")),
         str(ROOT / "web" / "recorder.js"), scenario],
        capture_output=True, text=True, timeout=30, check=True,
        env={**os.environ, "TZ": "UTC"},  # the file names carry the meeting's local time
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_page_links_the_transcript_downloads_during_and_after_the_meeting() -> None:
    """JSON, SRT, VTT and text from the server's transcript resource (one set of writers),
    read with the session's captions_token (encoded), named by the meeting's start; after
    transcript.final and the socket's close the links stay (the server keeps the final)."""
    result = run("export")
    assert result["before"]["hidden"] is True  # no session yet
    expected = {
        "json": (URL + "diarized_json", "meeting-2026-12-05-1430.json"),
        "srt": (URL + "srt", "meeting-2026-12-05-1430.srt"),
        "vtt": (URL + "vtt", "meeting-2026-12-05-1430.vtt"),
        "text": (URL + "text", "meeting-2026-12-05-1430.txt"),
    }
    for when in ("during", "after"):
        links = result[when]
        assert links["hidden"] is False
        assert {k: (links[k]["href"], links[k]["download"]) for k in expected} == expected
    assert "so far" in result["during"]["note"]
    assert result["after"]["note"] == "(final)"
    assert result["status"].startswith("done:")
