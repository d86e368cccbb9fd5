"""A live session's revision through the gateway (DESIGN 5.7, docs/protocol.md
`transcript.revised`): the real engine boundary (EngineClient) over the scripted backend."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient

from livemeet.backends.scripted import DEFAULT_SCRIPT, Script
from livemeet.config import ModelConfig, ServerConfig
from livemeet.gateway.app import create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.keys import SESSIONS_KEY, STORE_KEY
from livemeet.transcript.segments import Segment
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.test_live_resume import metric, of_type, read_to_close, read_until
from tests.gateway.test_ws_captions import captions_url, transcript_url
from tests.gateway.test_ws_live import START, wait_until

MEETING_S = 12.0
# the re-decode in its own labels: the script's speakers renumbered, and one the live session
# never had (S09, after everyone else) which must get a label no final has
REVISED = (
    Segment(0.5, 3.0, "S05", "Good morning everyone, let us get started."),
    Segment(3.0, 5.5, "S06", "Thanks. First item is the budget."),
    Segment(5.5, 8.0, "S05", "We are about ten percent over."),
    Segment(8.0, 11.0, "S07", "Then we should cut travel costs."),
    Segment(11.0, 11.8, "S09", "Agreed."),
)


async def scripted_client(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    tmp_path: Path,
    script: Script,
    *,
    revise: bool = True,
) -> TestClient:
    path = tmp_path / "script.json"
    path.write_text(script.to_json(), encoding="utf-8")
    engine = EngineClient(ModelConfig(backend="scripted", model=str(path)), in_process=True)
    config = replace(server_config, gateway=replace(server_config.gateway, revise=revise))
    return await aiohttp_client(create_app(config, engine))


async def meeting(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """Start, stream MEETING_S s and end; returns session.ready."""
    await ws.send_json(START)
    ready: dict[str, Any] = await ws.receive_json()
    for _ in range(round(MEETING_S / 0.5)):
        await ws.send_bytes(pcm16(0.5))
    await ws.send_json({"type": "end"})
    return ready


async def test_the_final_is_followed_by_the_revision_then_a_normal_close(
    aiohttp_client: ClientFactory, server_config: ServerConfig, tmp_path: Path
) -> None:
    script = replace(DEFAULT_SCRIPT, revised=REVISED)
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)
    async with client.ws_connect("/v1/live") as ws:
        ready = await meeting(ws)
        events = await read_to_close(ws)
        assert ws.close_code == 1000
    assert ready["revise"] is True
    assert [e["type"] for e in events[-2:]] == ["transcript.final", "transcript.revised"]
    final, revised = events[-2:]
    final_ids = [s["id"] for s in final["segments"]]
    assert final_ids == [e["id"] for e in of_type(events, "segment.final")]
    assert revised["supersedes"] == final_ids
    ids = [s["id"] for s in revised["segments"]]
    assert len(set(ids)) == len(ids) and not set(ids) & set(final_ids)
    # mapped by overlap onto the session's labels; the new speaker gets one no final has
    assert [s["speaker"] for s in revised["segments"]] == ["S01", "S02", "S01", "S03", "S04"]
    assert [s["text"] for s in revised["segments"]] == [s.text for s in REVISED]
    assert metric(client, "livemeet_live_revisions_total", result="revised") == 1
    assert metric(client, "livemeet_live_revision_seconds_count") == 1
    # the transcript resource serves the newest (the revision), or the final when asked
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    await client.app[STORE_KEY].flush()
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.headers["X-Livemeet-Transcript-Status"] == "revised"
    assert [s["text"] for s in (await response.json())["segments"]] == [s.text for s in REVISED]
    response = await client.get(transcript_url(ready, "verbose_json") + "&version=final")
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    want = [s["text"] for s in final["segments"]]
    assert [s["text"] for s in (await response.json())["segments"]] == want
    response = await client.get(transcript_url(ready, "verbose_json") + "&version=newest")
    assert response.status == 400


async def test_a_captions_subscriber_gets_the_revision_too(
    aiohttp_client: ClientFactory, server_config: ServerConfig, tmp_path: Path
) -> None:
    client = await scripted_client(aiohttp_client, server_config, tmp_path, DEFAULT_SCRIPT)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        async with client.ws_connect(captions_url(ready)) as captions:
            assert (await captions.receive_json())["type"] == "captions.ready"
            for _ in range(round(MEETING_S / 0.5)):
                await ws.send_bytes(pcm16(0.5))
            await ws.send_json({"type": "end"})
            client_events = await read_to_close(ws)
            seen = await read_to_close(captions)
            assert captions.close_code == 1000
    assert [e["type"] for e in seen[-2:]] == ["transcript.final", "transcript.revised"]
    assert seen[-1] == client_events[-1]
    # with no revised script, the re-decode is the reference: its labels map onto themselves
    assert [s["speaker"] for s in seen[-1]["segments"]] == [
        s.speaker for s in DEFAULT_SCRIPT.reference
    ]


async def test_no_revise_closes_after_the_final_as_before(
    aiohttp_client: ClientFactory, server_config: ServerConfig, tmp_path: Path
) -> None:
    client = await scripted_client(
        aiohttp_client, server_config, tmp_path, DEFAULT_SCRIPT, revise=False
    )
    async with client.ws_connect("/v1/live") as ws:
        ready = await meeting(ws)
        events = await read_to_close(ws)
        assert ws.close_code == 1000
    assert ready["revise"] is False
    assert events[-1]["type"] == "transcript.final"
    assert not of_type(events, "transcript.revised")


async def test_a_client_that_leaves_after_the_final_still_gets_the_revision_stored(
    aiohttp_client: ClientFactory, server_config: ServerConfig, tmp_path: Path
) -> None:
    script = replace(DEFAULT_SCRIPT, revised=REVISED)
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)
    async with client.ws_connect("/v1/live") as ws:
        ready = await meeting(ws)
        await read_until(ws, "transcript.final")
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0 or _revised(client, ready))
    await client.app[STORE_KEY].flush()
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.status == 200
    assert response.headers["X-Livemeet-Transcript-Status"] == "revised"
    assert [s["text"] for s in (await response.json())["segments"]] == [s.text for s in REVISED]


def _revised(client: TestClient, ready: dict[str, Any]) -> bool:
    holder = client.app[SESSIONS_KEY].get(ready["session_id"])
    return holder is not None and holder.revised_transcript() is not None


async def test_a_failed_revision_is_an_error_frame_then_a_normal_close_and_the_final_stands(
    aiohttp_client: ClientFactory, server_config: ServerConfig, tmp_path: Path
) -> None:
    script = replace(DEFAULT_SCRIPT, fail_revise=True)
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)
    async with client.ws_connect("/v1/live") as ws:
        ready = await meeting(ws)
        events = await read_to_close(ws)
        assert ws.close_code == 1000
    final, error = events[-2:]
    assert final["type"] == "transcript.final"
    assert error["type"] == "error" and error["code"] == "revision_failed"
    assert error["retryable"] is False and "scripted revision failure" in error["message"]
    assert metric(client, "livemeet_live_revisions_total", result="failed") == 1
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    await client.app[STORE_KEY].flush()
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    body = json.loads(await response.text())
    assert [s["text"] for s in body["segments"]] == [s["text"] for s in final["segments"]]
    response = await client.get(transcript_url(ready, "verbose_json") + "&version=revised")
    assert response.status == 404
