"""docs/protocol.md's error table matches livemeet/errors.py."""

from __future__ import annotations

import re
from pathlib import Path

from livemeet.errors import ERROR_CLASSES

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_error_table_matches_error_classes() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| (\d+) \| (yes|no) \|", DOC.read_text(), re.M)
    documented = {code: (int(http), int(close), flag == "yes") for code, http, close, flag in rows}
    actual = {c.code: (c.http_status, c.close_code, c.retryable) for c in ERROR_CLASSES}
    assert documented == actual
