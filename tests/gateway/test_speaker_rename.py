"""`speaker.rename` (docs/protocol.md) over a real aiohttp server and the fake backend: the
client and captions subscribers hear `speaker.renamed`, a resume and a captions snapshot get
the names again, and the live and stored transcripts show them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.config import ServerConfig
from livemeet.errors import InvalidRequest, ProtocolError, StorageFailed
from livemeet.gateway import live_holder
from livemeet.gateway.keys import SESSIONS_KEY
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.gateway.live_protocol import AudioFormat, SpeakerRenamed
from livemeet.gateway.live_replay import SessionEvent
from livemeet.gateway.live_sessions import LiveSessions
from livemeet.gateway.metrics import GatewayMetrics
from livemeet.transcriber import SessionOptions
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber, fake_text
from tests.gateway.test_live_resume import (
    detach,
    of_type,
    read_to_close,
    read_until,
    resume_start,
)
from tests.gateway.test_ws_captions import stream, subscribe, transcript_url
from tests.gateway.test_ws_live import expect_error, gateway_client, start_session, wait_until

FORMAT = AudioFormat(16000, 1, "pcm_s16le")


def rename(speaker: str, name: str | None) -> dict[str, Any]:
    return {"type": "speaker.rename", "speaker": speaker, "name": name}


def renamed(speaker: str, name: str | None) -> dict[str, Any]:
    return {"type": "speaker.renamed", "speaker": speaker, "name": name}


async def test_a_rename_reaches_the_client_and_subscribers_and_joins_the_snapshot(
    client: TestClient, fake: FakeTranscriber
) -> None:
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, 1.0)
        early = await subscribe(client, ready)
        await live.send_json(rename("S01", " Alice "))  # stripped
        assert (await read_until(live, "speaker.renamed"))[-1] == renamed("S01", "Alice")
        assert (await read_until(early, "speaker.renamed"))[-1] == renamed("S01", "Alice")
        await live.send_json(rename("S07", "Bob"))  # not heard yet: a client may pre-name
        assert (await read_until(live, "speaker.renamed"))[-1] == renamed("S07", "Bob")
        await stream(live, fake, 2.5)  # seg-0000 committed
        late = await subscribe(client, ready)
        await live.send_json({"type": "end"})
        events = await read_to_close(live)
        assert events[-1]["type"] == "transcript.final"
        snapshot = await read_to_close(late)
    # the snapshot: the finals, then the names, then the live events
    kinds = [e["type"] for e in snapshot]
    assert kinds[: kinds.index("speaker.renamed")] == ["segment.final"]
    assert of_type(snapshot, "speaker.renamed") == [renamed("S01", "Alice"), renamed("S07", "Bob")]
    # the first was read above
    assert of_type(await read_to_close(early), "speaker.renamed") == [renamed("S07", "Bob")]


async def test_names_survive_a_resume_and_are_replayed_after_the_finals(
    client: TestClient, fake: FakeTranscriber
) -> None:
    ws = await client.ws_connect("/v1/live")
    ready = await start_session(ws)
    await stream(ws, fake, 3.5)  # seg-0000 committed (0-3 s), then a partial
    await ws.send_json(rename("S01", "Alice"))
    await ws.send_json(rename("S02", "Bob"))
    await ws.send_json(rename("S02", None))  # removed again: not replayed
    seen = await read_until(ws, "speaker.renamed")
    while seen[-1] != renamed("S02", None):
        seen += await read_until(ws, "speaker.renamed")
    await detach(client, ws)
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        replay = await read_until(again, "segment.partial")
        kinds = [e["type"] for e in replay]
        assert kinds == ["session.ready", "segment.final", "speaker.renamed", "segment.partial"]
        assert replay[0]["resumed"] is True and replay[2] == renamed("S01", "Alice")
        await again.send_json({"type": "end"})
        events = await read_to_close(again)
    assert events[-1]["type"] == "transcript.final"


async def test_the_live_and_stored_transcripts_show_the_names(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    client = await gateway_client(aiohttp_client, server_config, fake)
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, 3.5)  # seg-0000 committed (0-3 s)
        await live.send_json(rename("S01", "Alice <A&B>"))
        await read_until(live, "speaker.renamed")
        response = await client.get(transcript_url(ready, "srt"))
        assert await response.text() == (
            f"1\n00:00:00,000 --> 00:00:03,000\nAlice ＜A&B＞: {fake_text(0)}\n"  # no SRT markup
        )
        response = await client.get(transcript_url(ready, "vtt"))
        assert f"<v Alice &lt;A&amp;B&gt;>{fake_text(0)}</v>" in await response.text()
        response = await client.get(transcript_url(ready, "json"))
        assert (await response.json())["speakers"] == {"S01": "Alice <A&B>"}
        await live.send_json({"type": "end"})
        await live.send_json(rename("S01", "Alice"))  # after end, before the final: applies
        await live.send_json({"type": "speaker.rename", "speaker": "x"})  # ignored, no close
        events = await read_to_close(live)
    assert events[-1]["type"] == "transcript.final" and live.close_code == 1000
    assert of_type(events, "speaker.renamed")[-1] == renamed("S01", "Alice")
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)  # the session is gone
    await client.close()  # the server stops; a new one serves the same data dir

    again = await gateway_client(aiohttp_client, server_config, FakeTranscriber())
    response = await again.get(transcript_url(ready, "diarized_json"))
    body = await response.json()
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    assert body["speakers"] == {"S01": "Alice"}
    assert {s["speaker"] for s in body["segments"]} == {"S01"}  # labels stay
    response = await again.get(transcript_url(ready, "srt"))
    assert f"Alice: {fake_text(1)}" in await response.text()
    response = await again.get(transcript_url(ready, "verbose_json"))
    assert (await response.json())["speakers"] == {"S01": "Alice"}


async def test_bad_renames_are_typed_errors_with_their_close_codes(client: TestClient) -> None:
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_json(rename("Alice", "Bob"))
        error = await expect_error(ws, InvalidRequest)  # 4400
        assert "speaker" in error["message"]
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_json(rename("S01", "Al\nice"))
        await expect_error(ws, InvalidRequest)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(rename("S01", "Alice"))  # before `start`
        await expect_error(ws, ProtocolError)  # 4402


class RecordingSink:
    """A stand-in for the client's socket (live_holder.EventSink): records what it gets."""

    def __init__(self) -> None:
        self.events: list[SessionEvent] = []

    def attached(
        self, holder: LiveSessionHolder, replay: list[SessionEvent], resumed: bool
    ) -> None:
        self.events += replay

    def deliver(self, event: SessionEvent) -> None:
        self.events.append(event)

    def take_over(self) -> asyncio.Task[None]:
        raise AssertionError("not taken over here")

    def audio_durable(self) -> None:
        pass

    def storage_failed(self, error: StorageFailed) -> bool:
        return True  # ended early: its client's `end` had not come


async def test_a_rename_after_the_final_came_is_ignored(fake: FakeTranscriber) -> None:
    """The final transcript (and its stored copy) are out: a rename that raced them changes
    nothing and gets no `speaker.renamed`."""
    await fake.start()
    session = await fake.open_session(SessionOptions(live=True))
    sessions = LiveSessions(60.0, 60.0, GatewayMetrics.create())
    sink = RecordingSink()
    holder = sessions.open(session, PcmStreamDecoder(16000, 1, "pcm_s16le"), FORMAT, sink)
    await holder.append(sink, pcm16(0.5))
    assert holder.rename(sink, "S01", "Alice") is True
    await holder.end(sink)
    await wait_until(lambda: holder.replay.terminal is not None)
    assert holder.rename(sink, "S01", "Bob") is False
    assert [e for e in sink.events if isinstance(e, SpeakerRenamed)] == [
        SpeakerRenamed("S01", "Alice")
    ]
    assert holder.transcript_so_far().speaker_names == (("S01", "Alice"),)
    await sessions.close()


async def test_a_session_names_at_most_max_named_speakers_labels(
    fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_holder, "MAX_NAMED_SPEAKERS", 2)
    await fake.start()
    session = await fake.open_session(SessionOptions(live=True))
    sessions = LiveSessions(60.0, 60.0, GatewayMetrics.create())
    sink = RecordingSink()
    holder = sessions.open(session, PcmStreamDecoder(16000, 1, "pcm_s16le"), FORMAT, sink)
    holder.rename(sink, "S01", "Alice")
    holder.rename(sink, "S02", "Bob")
    with pytest.raises(InvalidRequest):
        holder.rename(sink, "S03", "Carol")
    assert holder.rename(sink, "S02", "Robert")  # a named label may be renamed
    assert holder.rename(sink, "S02", None)  # and its name removed, making room
    assert holder.rename(sink, "S03", "Carol")
    assert holder.replay.names == {"S01": "Alice", "S03": "Carol"}
    await sessions.close()
