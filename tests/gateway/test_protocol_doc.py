"""docs/protocol.md's error table matches livemeet/errors.py; its `session.ready` and
`captions.ready` examples hold the fields the server sends; its Speaker merges example is a
real exchange."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from aiohttp import ClientWebSocketResponse, WSMsgType
from aiohttp.test_utils import TestClient

from livemeet.audio.constants import FILE_RESAMPLE_QUALITY, LIVE_RESAMPLE_QUALITY
from livemeet.errors import ERROR_CLASSES
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_ws_captions import stream
from tests.gateway.test_ws_live import START, start_session

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


async def test_the_captions_ready_example_has_the_fields_the_server_sends(
    client: TestClient,
) -> None:
    """The Captions example's `captions.ready` is the server's frame, field for field (it
    gained `speakers` and `merged` in session 39)."""
    async with client.ws_connect("/v1/live") as ws:
        ready = await start_session(ws)
        url = f"/v1/sessions/{ready['session_id']}/captions?token={ready['captions_token']}"
        async with client.ws_connect(url) as captions:
            head = await captions.receive_json()
    lines = re.findall(r'^< (\{"type": "captions\.ready".*\})$', DOC.read_text(), re.M)
    assert len(lines) == 1
    assert list(json.loads(lines[0])) == list(head)


def example(section: str) -> list[str]:
    """The lines of the first code block under the heading `### {section}`."""
    text = DOC.read_text()
    start = text.index(f"\n### {section}\n")
    block = text[text.index("```\n", start) + 4 :]
    return block[: block.index("```")].splitlines()


async def test_the_speaker_merges_example_is_what_the_server_answers(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """Each `>` line of the example is sent to a session that has shown S01-S04 (the fake's
    speakers, a final each) once the server answered the one before; its answers, less its
    segments and acks, are the `<` lines, frame for frame, then the close."""
    lines = example("Speaker merges")
    fake.speakers = ("S01", "S02", "S03", "S04")
    answers: list[dict[str, object]] = []
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await stream(ws, fake, 12.5)  # finals at 3, 6, 9 and 12 s, one per speaker
        for line in lines:
            if line.startswith("> "):
                await ws.send_json(json.loads(line[2:]))
            elif line.startswith("< "):
                answers.append(await next_answer(ws))
        closing = await asyncio.wait_for(ws.receive(), 5)
    expected = [json.loads(line[2:]) for line in lines if line.startswith("< ")]
    assert answers == expected
    assert closing.type is WSMsgType.CLOSE and lines[-1] == f"(close {closing.data})"


async def next_answer(ws: ClientWebSocketResponse) -> dict[str, object]:
    """The server's next frame that is not a segment or an ack."""
    while True:
        frame: dict[str, object] = await asyncio.wait_for(ws.receive_json(), 5)
        if frame["type"] not in ("audio.ack", "segment.partial", "segment.final"):
            return frame


def test_the_revision_section_names_the_resampler_presets_it_depends_on() -> None:
    """A revision reads the live stream's resampled audio, an upload its own (a trial: the
    revision of a 48 kHz meeting differed from the upload of its file): the presets the
    Revision section names are the ones the code uses."""
    text = DOC.read_text()
    section = text[text.index("### Revision") : text.index("### Speaker names")]
    assert f"soxr `{LIVE_RESAMPLE_QUALITY}`" in section
    assert f"the `{FILE_RESAMPLE_QUALITY}` resampling an upload" in section
