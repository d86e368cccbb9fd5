"""The recorder page's script (web/recorder.js), run under node in a stub browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")


def click_start(context: str) -> dict[str, object]:
    """The status line and the Start button's state after a click on Start."""
    assert NODE is not None
    out = subprocess.run(
        [NODE, str(Path(__file__).with_name("recorder_harness.js")),
         str(ROOT / "web" / "recorder.js"), context],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(NODE is None, reason="needs node")
def test_an_insecure_page_says_the_microphone_needs_https() -> None:
    """Opened over http from another machine, the page said "cannot start: Cannot read
    properties of undefined (reading 'getUserMedia')" (a trial): browsers give no
    navigator.mediaDevices to insecure pages. It now says what to do."""
    result = click_start("insecure")
    assert "needs https or localhost" in str(result["status"])
    assert "https://10.0.0.5:8000/" in str(result["status"])
    assert result["start_disabled"] is False  # the user can try again


@pytest.mark.skipif(NODE is None, reason="needs node")
def test_a_secure_page_asks_for_the_microphone() -> None:
    result = click_start("secure")
    assert result["status"] == "cannot start: denied"  # getUserMedia was reached
