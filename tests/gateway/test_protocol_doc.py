"""docs/protocol.md's error table matches livemeet/errors.py; its `session.ready` examples
hold the fields the server sends."""

from __future__ import annotations

import json
import re
from pathlib import Path

from aiohttp.test_utils import TestClient

from livemeet.errors import ERROR_CLASSES
from tests.gateway.test_ws_live import START

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_error_table_matches_error_classes() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| (\d+) \| (yes|no) \|", DOC.read_text(), re.M)
    documented = {code: (int(http), int(close), flag == "yes") for code, http, close, flag in rows}
    actual = {c.code: (c.http_status, c.close_code, c.retryable) for c in ERROR_CLASSES}
    assert documented == actual


async def test_every_session_ready_example_has_the_fields_the_server_sends(
    client: TestClient,
) -> None:
    """The Example exchange and the Resume example lacked `revise`, and the Resume one
    `captions_token` (a trial): each example is the server's frame, field for field."""
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
    lines = re.findall(r'^< (\{"type": "session\.ready".*\})$', DOC.read_text(), re.M)
    assert len(lines) == 2  # the Resume example and the Example exchange
    for line in lines:
        example = json.loads(line)
        assert list(example) == list(ready), line
        assert example["revise"] is False  # the demo's: it cannot revise
