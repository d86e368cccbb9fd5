"""`speaker.merge` (docs/protocol.md, "Speaker merges"; DESIGN 5.6) over a real aiohttp server
and the fake backend: the client and captions subscribers hear `speaker.merged`, nothing sent
after it carries the merged-away label, finals sent before keep theirs, a resume and a
captions snapshot get the merges again, the live and stored transcripts show them, and a
restart keeps them."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.config import ModelConfig, ServerConfig
from livemeet.errors import EngineUnavailable, InvalidRequest, ProtocolError
from livemeet.gateway import live_holder, live_journal_writer
from livemeet.gateway.app import close_live_sockets, create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.keys import SESSIONS_KEY
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.gateway.live_protocol import SpeakerMerged
from livemeet.gateway.live_sessions import LiveSessions
from livemeet.gateway.metrics import GatewayMetrics
from livemeet.transcriber import SessionOptions, TranscriptFinal
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber, fake_text
from tests.gateway.test_live_durable import journal_rows, stream_acked
from tests.gateway.test_live_resume import (
    detach,
    of_type,
    on_disk,
    read_to_close,
    read_until,
    resume_start,
)
from tests.gateway.test_speaker_rename import FORMAT, RecordingSink, rename
from tests.gateway.test_ws_captions import captions_url, stream, subscribe, transcript_url
from tests.gateway.test_ws_live import (
    START,
    expect_error,
    gateway_client,
    receive_all,
    start_session,
    wait_until,
)

Frames = list[dict[str, Any]]
# the fake's finals, one per 3 s, are spoken in turn by these: seg-0002 (6-9 s) is S03's
SPEAKERS = ("S01", "S02", "S03")
SHOWN_S = 10.5  # s streamed before a merge: finals of S01, S02, S03, then a partial


def merge(speaker: str, into: str) -> dict[str, Any]:
    return {"type": "speaker.merge", "speaker": speaker, "into": into}


def replayed_maps(events: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """({label: name}, {label: into}) as `events`' speaker.renamed and speaker.merged frames
    give them."""
    names = {e["speaker"]: e["name"] for e in of_type(events, "speaker.renamed")}
    merges = {e["speaker"]: e["into"] for e in of_type(events, "speaker.merged")}
    return names, merges


def merged(speaker: str, into: str) -> dict[str, Any]:
    return {"type": "speaker.merged", "speaker": speaker, "into": into}


def labels_in(frame: dict[str, Any]) -> list[str]:
    """The labels of the segments a frame carries."""
    if frame["type"] == "segment.final":
        return [frame["speaker"]]
    return [s["speaker"] for s in frame.get("segments", ())]


def after(events: Frames, frame: dict[str, Any]) -> Frames:
    return events[events.index(frame) + 1 :]


def final_labels(events: Frames) -> dict[str, str]:
    return {e["id"]: e["speaker"] for e in of_type(events, "segment.final")}


async def test_a_merge_reaches_the_client_and_subscribers_and_joins_the_snapshot(
    client: TestClient, fake: FakeTranscriber
) -> None:
    fake.speakers = SPEAKERS
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, SHOWN_S)
        early = await subscribe(client, ready)
        await live.send_json(rename("S01", "Alice"))
        await live.send_json(merge("S03", "S01"))
        events = await read_until(live, "speaker.merged")
        assert events[-1] == merged("S03", "S01")
        assert (await read_until(early, "speaker.merged"))[-1] == merged("S03", "S01")
        assert fake.sessions[0].log.merges == [("S03", "S01")]  # the backend was told
        await stream(live, fake, 9.0)  # seg-0005 (15-18 s) is S03's turn again
        late = await subscribe(client, ready)
        await live.send_json({"type": "end"})
        events += await read_to_close(live)
        snapshot = await read_to_close(late)
        rest = await read_to_close(early)
    assert live.close_code == 1000
    labels = final_labels(events)
    assert labels["seg-0002"] == "S03"  # sent before the merge: kept
    assert labels["seg-0005"] == "S01"
    for frame in after(events, merged("S03", "S01")):
        assert "S03" not in labels_in(frame) or frame["type"] == "transcript.final", frame
    final = events[-1]
    assert final["type"] == "transcript.final" and final["merged"] == {"S03": "S01"}
    assert {s["id"]: s["speaker"] for s in final["segments"]} == labels  # as sent
    # the snapshot: the finals, the names, the merges, the partial, then live events
    kinds = [e["type"] for e in snapshot]
    first = kinds.index("speaker.renamed")
    assert kinds[:first] == ["segment.final"] * first
    assert kinds[first : first + 3] == ["speaker.renamed", "speaker.merged", "segment.partial"]
    assert snapshot[first + 1] == merged("S03", "S01")
    assert snapshot[-1]["merged"] == {"S03": "S01"}
    assert rest[-1] == final and not of_type(rest, "speaker.merged")  # read above


async def test_captions_ready_carries_the_names_and_merges_of_its_snapshot(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A subscriber's `captions.ready` says the names and merges its snapshot replays, so a
    reconnecting overlay replaces its own at once instead of clearing them until the
    snapshot's frames come (a flicker of bare labels at every reconnect); one joining before
    any gets empty maps."""
    fake.speakers = SPEAKERS
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, SHOWN_S)
        async with client.ws_connect(captions_url(ready)) as first:
            head = await first.receive_json()
        await live.send_json(rename("S01", "Ällice 🎙"))
        await live.send_json(rename("S02", "Bob"))
        await live.send_json(rename("S02", None))  # removed: not in the snapshot
        await live.send_json(merge("S03", "S01"))
        await read_until(live, "speaker.merged")
        async with client.ws_connect(captions_url(ready)) as late:
            head_late = await late.receive_json()
            snapshot = await read_until(late, "segment.partial")
        await live.send_json({"type": "end"})
        await read_to_close(live)
    assert head["speakers"] == {} and head["merged"] == {}
    assert head_late["type"] == "captions.ready"
    assert head_late["speakers"] == {"S01": "Ällice 🎙"}
    assert head_late["merged"] == {"S03": "S01"}
    # the same as the snapshot's own frames, which still come
    assert replayed_maps(snapshot) == (head_late["speakers"], head_late["merged"])


async def test_a_resumes_session_ready_carries_the_names_and_merges_of_its_replay(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A resume's `session.ready` says the names and merges its replay gives, so a client
    replaces its own at once: the recorder waited for the replay's frames and guessed its end
    from a quiet spell, and a stall mid-replay dropped its names (session 40's trial). A
    name removed before the drop is in neither; a new session's maps are empty."""
    fake.speakers = SPEAKERS
    ws = await client.ws_connect("/v1/live")
    ready = await start_session(ws)
    await stream(ws, fake, SHOWN_S)
    await ws.send_json(rename("S01", "Ällice 🎙"))
    await ws.send_json(rename("S02", "Bob"))
    await ws.send_json(rename("S02", None))
    await ws.send_json(merge("S03", "S01"))
    await read_until(ws, "speaker.merged")
    await on_disk(client, ready, round(SHOWN_S * 16000))
    await detach(client, ws)
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        replay = await read_until(again, "segment.partial")
        await again.send_json({"type": "end"})
        await read_to_close(again)
    assert (ready["speakers"], ready["merged"]) == ({}, {})
    head = replay[0]
    assert head["type"] == "session.ready" and head["resumed"] is True
    assert head["speakers"] == {"S01": "Ällice 🎙"}
    assert head["merged"] == {"S03": "S01"}
    assert replayed_maps(replay) == (head["speakers"], head["merged"])  # the frames still come


async def test_merges_survive_a_resume_and_are_replayed_after_the_names(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A merge into a label merged away already goes to its target: S02 into S03 after S03
    into S01 is answered, and replayed, as S02 into S01."""
    fake.speakers = SPEAKERS
    ws = await client.ws_connect("/v1/live")
    ready = await start_session(ws)
    await stream(ws, fake, SHOWN_S)
    await ws.send_json(rename("S02", "Bob"))
    await ws.send_json(merge("S03", "S01"))
    await ws.send_json(merge("S02", "S03"))
    seen = await read_until(ws, "speaker.merged")
    seen += await read_until(ws, "speaker.merged")
    assert of_type(seen, "speaker.merged") == [merged("S03", "S01"), merged("S02", "S01")]
    await on_disk(client, ready, round(SHOWN_S * 16000))  # the resume goes on from there
    await detach(client, ws)
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        replay = await read_until(again, "segment.partial")
        kinds = [e["type"] for e in replay]
        assert kinds == ["session.ready"] + ["segment.final"] * 3 + [
            "speaker.renamed",
            "speaker.merged",
            "speaker.merged",
            "segment.partial",
        ]
        assert replay[5:7] == [merged("S03", "S01"), merged("S02", "S01")]
        assert labels_in(replay[-1]) == ["S01"]
        await stream(again, fake, 6.0)  # seg-0004: S02's turn, seg-0005: S03's
        await again.send_json({"type": "end"})
        events = await read_to_close(again)
    assert {final_labels(events)[i] for i in ("seg-0004", "seg-0005")} == {"S01"}
    assert events[-1]["merged"] == {"S03": "S01", "S02": "S01"}


async def test_the_live_and_stored_transcripts_show_the_merges(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    fake.speakers = SPEAKERS
    client = await gateway_client(aiohttp_client, server_config, fake)
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, SHOWN_S)
        await live.send_json(rename("S01", "Alice"))
        await live.send_json(merge("S03", "S01"))
        await read_until(live, "speaker.merged")
        response = await client.get(transcript_url(ready, "srt"))
        assert f"Alice: {fake_text(2)}" in await response.text()  # S03's final, as Alice
        response = await client.get(transcript_url(ready, "json"))
        body = await response.json()
        assert (body["speakers"], body["merged"]) == ({"S01": "Alice"}, {"S03": "S01"})
        await live.send_json({"type": "end"})
        assert (await read_to_close(live))[-1]["type"] == "transcript.final"
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    await client.close()  # the server stops; a new one serves the same data dir

    again = await gateway_client(aiohttp_client, server_config, FakeTranscriber())
    response = await again.get(transcript_url(ready, "diarized_json"))
    body = await response.json()
    assert body["merged"] == {"S03": "S01"} and body["speakers"] == {"S01": "Alice"}
    assert [s["speaker"] for s in body["segments"]] == ["S01", "S02", "S03", "S01"]  # kept
    vtt = await (await again.get(transcript_url(ready, "vtt"))).text()
    assert f"<v Alice>{fake_text(2)}</v>" in vtt and "<v S03>" not in vtt


async def test_a_merge_after_end_applies_until_the_final(
    client: TestClient, fake: FakeTranscriber
) -> None:
    fake.speakers = SPEAKERS
    fake.end_gate = asyncio.Event()  # the final waits for it
    async with client.ws_connect("/v1/live") as live:
        await start_session(live)
        await stream(live, fake, SHOWN_S)
        await live.send_json({"type": "end"})
        await live.send_json(merge("S03", "S01"))  # after end, before the final: applies
        await live.send_json(merge("S03", "nope"))  # malformed: ignored, no close
        await read_until(live, "speaker.merged")
        fake.end_gate.set()
        events = await read_to_close(live)
    assert live.close_code == 1000
    assert events[-1]["type"] == "transcript.final" and events[-1]["merged"] == {"S03": "S01"}
    assert labels_in(events[-1])[-1] == "S01"  # the end's final (seg-0003) is S01's anyway


@pytest.mark.parametrize(
    "refused",
    [
        merge("S04", "S04"),
        merge("S09", "S01"),
        merge("S03", "S02"),  # merged into S01 already
        merge("S01", "S03"),  # a cycle
        rename("S03", "Carol"),  # merged away: its target is the one to name
    ],
)
async def test_a_merge_or_rename_refused_after_end_is_ignored_and_the_final_comes(
    client: TestClient, fake: FakeTranscriber, refused: dict[str, Any]
) -> None:
    """After `end` the session refuses it and it is ignored, as a malformed one is
    (docs/protocol.md). Before, it was an invalid_request: close 4400 before the final, and
    the meeting's transcript was lost (a trial)."""
    fake.speakers = SPEAKERS
    fake.end_gate = asyncio.Event()  # the final waits for it
    async with client.ws_connect("/v1/live") as live:
        await start_session(live)
        await stream(live, fake, SHOWN_S)
        await live.send_json(merge("S03", "S01"))
        await read_until(live, "speaker.merged")
        await live.send_json({"type": "end"})
        await live.send_json(refused)
        await live.send_json(rename("S01", "Alice"))  # read after it: it was ignored
        await read_until(live, "speaker.renamed")
        fake.end_gate.set()
        events = await read_to_close(live)
    assert live.close_code == 1000 and not of_type(events, "error")
    assert events[-1]["type"] == "transcript.final"
    assert fake.sessions[0].log.merges == [("S03", "S01")]


async def test_a_repeated_merge_is_answered_again_not_refused(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """The same merge again (a client retrying after a dropped socket) is answered with
    `speaker.merged` again, as a repeated rename is (it closed the session with 4400: the
    meeting was lost; a trial)."""
    fake.speakers = SPEAKERS
    async with client.ws_connect("/v1/live") as live:
        await start_session(live)
        await stream(live, fake, SHOWN_S)
        await live.send_json(merge("S03", "S01"))
        await live.send_json(merge("S03", "S01"))
        events = await read_until(live, "speaker.merged")
        events += await read_until(live, "speaker.merged")
        await live.send_json({"type": "end"})
        events += await read_to_close(live)
    assert of_type(events, "speaker.merged") == [merged("S03", "S01")] * 2
    assert live.close_code == 1000 and events[-1]["type"] == "transcript.final"
    assert fake.sessions[0].log.merges == [("S03", "S01")]  # the backend was told once


async def test_a_snapshot_after_a_merge_shows_the_partial_with_the_target(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """The partial a snapshot (or a resume) replays was decoded before the merge: it is sent
    as shown now (it carried the merged-away label after `speaker.merged`; a trial)."""
    fake.speakers = SPEAKERS
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        await stream(live, fake, 7.5)  # finals of S01 and S02, then S03's partial (6-7.5 s)
        await live.send_json(merge("S03", "S02"))
        await read_until(live, "speaker.merged")
        late = await subscribe(client, ready)
        snapshot = await read_until(late, "segment.partial")
        await live.send_json({"type": "end"})
        await read_to_close(live)
        await read_to_close(late)
    assert labels_in(snapshot[-1]) == ["S02"]


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        ([merge("Alice", "S01")], "'speaker.merge' needs 'speaker'"),
        ([merge("S03", "S09")], "S09 is not a label this session has shown"),
        ([merge("S09", "S01")], "S09 is not a label this session has shown"),
        ([merge("S01", "S01")], "into itself"),
        # a label merged away, into itself: both show as S01, and it was answered as a repeat
        # of S03's merge (`speaker.merged`), not refused (a stress trial)
        ([merge("S03", "S01"), merge("S03", "S03")], "into itself"),
        ([merge("S03", "S01"), merge("S03", "S02")], "S03 is merged into S01 already"),
        ([merge("S03", "S01"), merge("S01", "S03")], "cycle"),
        ([merge("S03", "S01"), rename("S03", "Carol")], "rename S01"),
    ],
)
async def test_a_merge_the_session_cannot_make_is_an_invalid_request(
    client: TestClient, fake: FakeTranscriber, messages: Frames, why: str
) -> None:
    """Each closes with 4400 and says why; a merge made before it stands (the backend was
    told only of that one)."""
    fake.speakers = SPEAKERS
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await stream(ws, fake, SHOWN_S)
        for message in messages:
            await ws.send_json(message)
        error = await expect_error(ws, InvalidRequest)
    assert why in error["message"]
    assert fake.sessions[0].log.merges == [("S03", "S01")] * (len(messages) - 1)


@pytest.mark.parametrize("refused", [merge("S09", "S01"), rename("S03", "")])
async def test_a_refused_speaker_request_closes_the_socket_but_keeps_the_meeting(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    refused: dict[str, Any],
) -> None:
    """The 4400 closes the socket, and the session is kept as after a dropped one: resumable
    within its window, then ended and its transcript stored (before, a refused display
    request dropped the session and its finals at once: the meeting so far was lost; a
    trial). A client's other violations keep it too (test_live_violations.py)."""
    fake.speakers = SPEAKERS
    client = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0.5)
    async with client.ws_connect("/v1/live") as ws:
        ready = await start_session(ws)
        await stream(ws, fake, SHOWN_S)
        await ws.send_json(refused)
        await expect_error(ws, InvalidRequest)
    await wait_until(lambda: client.app[SESSIONS_KEY].get(ready["session_id"]) is None, 10)
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.status == 200, await response.text()
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    assert len((await response.json())["segments"]) >= 3  # every final streamed


async def test_a_merge_before_start_is_a_protocol_error(client: TestClient) -> None:
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(merge("S03", "S01"))
        await expect_error(ws, ProtocolError)  # 4402


async def open_holder(fake: FakeTranscriber) -> tuple[LiveSessions, LiveSessionHolder, Any]:
    """A session of `fake` (SPEAKERS) that showed S01, S02 and S03, on a registry without a
    journal, attached to a RecordingSink."""
    fake.speakers = SPEAKERS
    await fake.start()
    session = await fake.open_session(SessionOptions(live=True))
    sessions = LiveSessions(60.0, 60.0, GatewayMetrics.create())
    sink = RecordingSink()
    holder = sessions.open(session, PcmStreamDecoder(16000, 1, "pcm_s16le"), FORMAT, sink)
    await holder.append(sink, pcm16(SHOWN_S))
    await wait_until(lambda: holder.replay.labels_shown == set(SPEAKERS))
    return sessions, holder, sink


async def test_a_merge_after_the_final_came_is_ignored(fake: FakeTranscriber) -> None:
    sessions, holder, sink = await open_holder(fake)
    assert await holder.merge(sink, "S03", "S01") is True
    await holder.end(sink)
    await wait_until(lambda: holder.replay.terminal is not None)
    assert await holder.merge(sink, "S02", "S01") is False
    assert [e for e in sink.events if isinstance(e, SpeakerMerged)] == [SpeakerMerged("S03", "S01")]
    assert holder.transcript_so_far().speaker_merges == (("S03", "S01"),)
    assert fake.sessions[0].log.merges == [("S03", "S01")]
    await sessions.close()


async def test_a_session_merges_at_most_max_merged_speakers_labels(
    fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_holder, "MAX_MERGED_SPEAKERS", 1)
    sessions, holder, sink = await open_holder(fake)
    await holder.merge(sink, "S03", "S01")
    with pytest.raises(InvalidRequest, match="at most 1 labels"):
        await holder.merge(sink, "S02", "S01")
    assert holder.replay.merges.items() == (("S03", "S01"),)
    await sessions.close()


def stalled_commits(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The journal's group commits wait while the event returned is clear (it starts set)."""
    disk = threading.Event()
    disk.set()
    real_commit = live_journal_writer.Writer._commit

    def slow_commit(self: live_journal_writer.Writer, group: Any) -> bool:
        disk.wait(10)
        return real_commit(self, group)

    monkeypatch.setattr(live_journal_writer.Writer, "_commit", slow_commit)
    return disk


async def test_what_the_backend_decoded_before_the_merge_is_sent_without_the_merged_label(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A backend that has not applied the merge yet (the command still in the engine's
    queue, a hop under way) goes on writing S03: the gateway relabels what it sends after
    `speaker.merged`, and the final transcript holds the finals as they were sent."""
    fake.speakers = SPEAKERS
    fake.backend_merges = False
    async with client.ws_connect("/v1/live") as live:
        await start_session(live)
        await stream(live, fake, SHOWN_S)
        await live.send_json(merge("S03", "S01"))
        events = await read_until(live, "speaker.merged")
        await stream(live, fake, 9.0)
        await live.send_json({"type": "end"})
        events += await read_to_close(live)
    backend_final = fake.sessions[0].log.events[-1]
    assert isinstance(backend_final, TranscriptFinal)
    assert backend_final.segments[5].speaker == "S03"  # the backend wrote S03 all along
    for frame in after(events, merged("S03", "S01")):
        if frame["type"] != "transcript.final":
            assert "S03" not in labels_in(frame), frame
    labels = final_labels(events)
    assert (labels["seg-0002"], labels["seg-0005"]) == ("S03", "S01")
    assert {s["id"]: s["speaker"] for s in events[-1]["segments"]} == labels


async def test_a_merge_and_a_rename_are_answered_once_the_journal_holds_them(
    client: TestClient,
    fake: FakeTranscriber,
    server_config: ServerConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`speaker.merged` and `speaker.renamed` went out before the journal had them: a crash
    then took back a merge or a name the client had been told (the restarted session's
    `session.ready` has none, so the recorder drops it: S03's segments flip back from S01;
    found beside the finals' case in a crash trial). Each answer now goes out once the
    journal holds it."""
    fake.speakers = SPEAKERS
    disk = stalled_commits(monkeypatch)
    async with client.ws_connect("/v1/live") as live:
        await start_session(live)
        await stream(live, fake, SHOWN_S)
        disk.clear()  # the journal's commits stall from now on
        await live.send_json(merge("S03", "S01"))
        await live.send_json(rename("S01", "Alice"))
        await wait_until(lambda: fake.sessions[0].log.merges == [("S03", "S01")])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(read_until(live, "speaker.merged"), 0.5)
        disk.set()
        events = await read_until(live, "speaker.merged")
        if not of_type(events, "speaker.renamed"):
            events += await read_until(live, "speaker.renamed")
        names, merges = journal_speakers(server_config)
        assert (names, merges) == ([["S01", "Alice"]], [["S03", "S01"]])
        await live.send_json({"type": "end"})
        await read_to_close(live)


async def test_a_resume_is_not_told_a_name_or_merge_the_journal_does_not_hold_yet(
    client: TestClient,
    fake: FakeTranscriber,
    server_config: ServerConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rename and a merge are made, the journal's commit stalls, and the socket drops
    before their answers went out. The resume's `session.ready` (and its replay, and a new
    captions subscriber's snapshot) told them anyway: a crash then took them back from a
    client that had been told (the restarted session's `session.ready` lacks them; a stress
    trial, tests/gateway/test_live_stress.py). A snapshot now tells only the names and merges
    the journal holds; the answers come on the resumed socket once it holds them."""
    fake.speakers = SPEAKERS
    disk = stalled_commits(monkeypatch)
    ws = await client.ws_connect("/v1/live")
    ready = await start_session(ws)
    await stream(ws, fake, SHOWN_S)
    disk.clear()  # the journal's commits stall from now on
    await ws.send_json(rename("S01", "Alice"))
    await ws.send_json(merge("S03", "S01"))
    await wait_until(lambda: fake.sessions[0].log.merges == [("S03", "S01")])
    await detach(client, ws)
    async with client.ws_connect("/v1/live") as live:
        await live.send_json(resume_start(ready))
        resumed = await live.receive_json()
        assert resumed["resumed"] is True
        assert (resumed["speakers"], resumed["merged"]) == ({}, {})  # not on disk yet
        captions = await client.ws_connect(captions_url(ready))
        head = await captions.receive_json()
        assert (head["speakers"], head["merged"]) == ({}, {})
        assert journal_speakers(server_config) == ([], [])
        disk.set()
        events = await read_until(live, "speaker.merged")
        shown = await read_until(captions, "speaker.merged")
        for frames in (events, shown):
            assert replayed_maps(frames) == ({"S01": "Alice"}, {"S03": "S01"})
        assert journal_speakers(server_config) == ([["S01", "Alice"]], [["S03", "S01"]])
        await live.send_json({"type": "end"})
        final = (await read_to_close(live))[-1]
        await captions.close()
    assert final["type"] == "transcript.final" and final["merged"] == {"S03": "S01"}


async def test_an_answer_the_journal_holds_back_goes_out_before_the_final_transcript(
    client: TestClient, fake: FakeTranscriber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename (or merge) answered once the journal holds it, made right before `end`: the
    final transcript, its audio all on disk, went out before the answer, and the socket and
    the captions closed after it, so the client and its subscribers never heard the name
    (a review). The final transcript now waits for the answers the journal holds back."""
    fake.speakers = SPEAKERS
    disk = stalled_commits(monkeypatch)
    async with client.ws_connect("/v1/live") as live:
        ready = await start_session(live)
        captions = await subscribe(client, ready)
        # 3 s: the fake's first final ends there, so `end` adds none; all of it on disk, so
        # the final transcript need not wait for the audio
        if not of_type(await stream_acked(live, fake, 3.0), "segment.final"):
            await read_until(live, "segment.final")
        disk.clear()  # the journal's commits stall from now on
        await live.send_json(rename("S01", "Alice"))
        await live.send_json({"type": "end"})
        await wait_until(lambda: fake.sessions[0].log.ended)
        await asyncio.sleep(0.3)  # the final transcript came from the backend meanwhile
        disk.set()
        events = await read_to_close(live)
        shown = await asyncio.wait_for(receive_all(captions), 5)
    for frames in (events, shown):
        kinds = [e["type"] for e in frames]
        assert "speaker.renamed" in kinds, kinds
        assert kinds.index("speaker.renamed") < kinds.index("transcript.final"), kinds


def journal_speakers(config: ServerConfig) -> tuple[Any, Any]:
    """The one journalled session's names and merges as stored (JSON lists), read-only."""
    uri = f"file:{config.data_dir / 'live' / 'sessions.sqlite3'}?mode=ro"
    with sqlite3.connect(uri, uri=True) as db:
        ((names, merges),) = db.execute("SELECT names, merges FROM sessions").fetchall()
    return json.loads(names), json.loads(merges)


async def test_a_restart_keeps_the_merges_for_the_rebuilt_session(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """Durable sessions (DESIGN 5.9): the journal keeps the merges; the next start rebuilds
    the session with them (its backend writes no merged label), replays them on the resume,
    and its final carries them."""
    fake.speakers = SPEAKERS
    client = await aiohttp_client(create_app(server_config, fake))
    ws = await client.ws_connect("/v1/live")
    ready = await start_session(ws)
    await stream(ws, fake, SHOWN_S)
    await ws.send_json(merge("S03", "S01"))
    await read_until(ws, "speaker.merged")
    reading = asyncio.create_task(receive_all(ws))
    await close_live_sockets(client.app)  # a restart: the session stays in the journal
    await asyncio.wait_for(reading, 5)
    await client.close()
    assert [row[0] for row in journal_rows(server_config.data_dir)] == [ready["session_id"]]

    again = FakeTranscriber()
    again.speakers = SPEAKERS
    client = await aiohttp_client(create_app(server_config, again))
    [rebuilt] = again.sessions
    assert rebuilt.log.options.restore is not None
    assert rebuilt.log.options.restore.merges == (("S03", "S01"),)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        replay = await read_until(ws, "speaker.merged")
        assert replay[0]["resumed"] is True and replay[-1] == merged("S03", "S01")
        assert [e["type"] for e in replay[1:-1]] == ["segment.final"] * 3
        await stream(ws, again, 9.0)
        await ws.send_json({"type": "end"})
        events = replay + await read_to_close(ws)
    labels = final_labels(events)
    assert (labels["seg-0002"], labels["seg-0005"]) == ("S03", "S01")
    assert events[-1]["type"] == "transcript.final" and events[-1]["merged"] == {"S03": "S01"}


async def test_a_label_only_a_partial_showed_before_a_restart_can_be_merged_after_it(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> None:
    """A stress trial (seed 221): the client saw S02 in a `segment.partial` only, the server
    restarted, and its `speaker.merge` of S02 right after the resume was refused as a label
    never shown (4400), the rebuilt session knowing its finals' labels alone. The journal
    keeps the labels shown: the merge is answered, and the final carries it."""
    fake.speakers = ("S01", "S02")  # seg-0000 (0-3 s) is S01's, the partials after it S02's
    client = await aiohttp_client(create_app(server_config, fake))
    ws = await client.ws_connect("/v1/live")
    ready = await start_session(ws)
    await stream(ws, fake, 5.0)
    events = await read_until(ws, "segment.final")
    while "S02" not in labels_in(events[-1]):
        events.append(await asyncio.wait_for(ws.receive_json(), 5))
    assert [labels_in(e) for e in of_type(events, "segment.final")] == [["S01"]]
    reading = asyncio.create_task(receive_all(ws))
    await close_live_sockets(client.app)  # a restart: the session stays in the journal
    await asyncio.wait_for(reading, 5)
    await client.close()

    again = FakeTranscriber()  # its partials show S01 alone: none shows S02 again
    client = await aiohttp_client(create_app(server_config, again))
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        assert (await ws.receive_json())["resumed"] is True
        await ws.send_json(merge("S02", "S01"))
        replay = await read_until(ws, "speaker.merged")
        assert replay[-1] == merged("S02", "S01")
        await ws.send_json({"type": "end"})
        events = replay + await read_to_close(ws)
    assert "S02" not in {label for e in events for label in labels_in(e)}
    assert events[-1]["type"] == "transcript.final" and events[-1]["merged"] == {"S02": "S01"}
    assert again.sessions[0].log.merges == [("S02", "S01")]


async def test_a_session_rebuilt_after_its_engine_worker_died_keeps_its_merges(
    client: TestClient, fake: FakeTranscriber
) -> None:
    fake.speakers = SPEAKERS
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await stream_acked(ws, fake, SHOWN_S)
        await ws.send_json(merge("S03", "S01"))
        await read_until(ws, "speaker.merged")
        fake.sessions[0].fail(EngineUnavailable("the engine failed: exited with code -9"))
        await wait_until(lambda: len(fake.sessions) == 2)
        restore = fake.sessions[1].log.options.restore
        assert restore is not None and restore.merges == (("S03", "S01"),)
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    assert events[-1]["type"] == "transcript.final" and events[-1]["merged"] == {"S03": "S01"}


async def test_a_merge_through_the_engine_client_and_scripted_backend(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """The real engine boundary (EngineClient, the scripted backend in a worker thread):
    DEFAULT_SCRIPT's S03 (8-11 s) is merged into S01 once shown; nothing after the answer
    carries S03, and its turn comes out as S01."""
    engine = EngineClient(ModelConfig(backend="scripted"), in_process=True)
    client = await aiohttp_client(create_app(server_config, engine))
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        events = [await ws.receive_json()]
        for _ in range(19):  # to 9.5 s, in real-time-sized frames
            await ws.send_bytes(pcm16(0.5))
        while "S03" not in {label for e in events for label in labels_in(e)}:
            events.append(await asyncio.wait_for(ws.receive_json(), 10))
        await ws.send_json(merge("S03", "S01"))
        events += await read_until(ws, "speaker.merged")
        await ws.send_bytes(pcm16(2.0))
        await ws.send_json({"type": "end"})
        events += await read_to_close(ws)
    for frame in after(events, merged("S03", "S01")):
        if frame["type"] != "transcript.final":
            assert "S03" not in labels_in(frame), frame
    final = of_type(events, "transcript.final")[0]
    assert [s["speaker"] for s in final["segments"]] == ["S01", "S02", "S01", "S01"]
    assert final["merged"] == {"S03": "S01"}
