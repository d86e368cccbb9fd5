"""A live session's revision through the gateway (DESIGN 5.7, docs/protocol.md
`transcript.revised`): the real engine boundary (EngineClient) over the scripted backend."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from livemeet.backends.scripted import DEFAULT_SCRIPT, Script, ScriptedCore
from livemeet.config import ModelConfig, ServerConfig
from livemeet.gateway.app import create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.keys import LIFECYCLE_KEY, REGISTRY_KEY, SESSIONS_KEY, STORE_KEY
from livemeet.gateway.session_transcript import revision_state
from livemeet.gateway.transcript_store import TranscriptStore
from livemeet.transcriber import Error, TranscriptFinal
from livemeet.transcript.segments import FinishReason, Segment
from tests.gateway.conftest import ClientFactory, pcm16
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_live_resume import (
    detach,
    metric,
    of_type,
    read_to_close,
    read_until,
    resume_start,
)
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


async def revised_404(client: TestClient, ready: dict[str, Any]) -> str:
    """`version=revised`'s 404 message, after checking its shape."""
    response = await client.get(transcript_url(ready, "json") + "&version=revised")
    body = await response.json()
    assert response.status == 404 and body["error"]["code"] == "not_found", body
    assert body["error"]["param"] == "version"
    return str(body["error"]["message"])


@pytest.mark.parametrize("revise", [True, False])
async def test_the_transcript_versions_of_a_session_say_whether_a_revision_comes(
    aiohttp_client: ClientFactory, server_config: ServerConfig, tmp_path: Path, revise: bool
) -> None:
    """`version=revised` on a session never to be revised (`revise: false`: the demo,
    --no-revise) said "no revised transcript (yet)" (a trial): it says none will come, held
    or stored; on one that will be, that it comes after the final. `version=` (empty) was
    taken as absent, where any value but final and revised is a 400. `version=final` while
    the session runs is its finals so far."""
    client = await scripted_client(
        aiohttp_client, server_config, tmp_path, DEFAULT_SCRIPT, revise=revise
    )
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        ready = await ws.receive_json()
        assert ready["revise"] is revise
        await ws.send_bytes(pcm16(0.5))
        empty = await client.get(transcript_url(ready, "json") + "&version=")
        assert empty.status == 400 and (await empty.json())["error"]["code"] == "invalid_request"
        final = await client.get(transcript_url(ready, "json") + "&version=final")
        assert final.status == 200 and final.headers["X-Livemeet-Transcript-Status"] == "running"
        assert final.headers["X-Livemeet-Revision"] == ("pending" if revise else "none")
        message = await revised_404(client, ready)
        if revise:
            assert "not yet: it comes after transcript.final" in message
        else:
            assert "(yet)" not in message and "none will come" in message
            assert "`revise: false`" in message
        await ws.send_json({"type": "end"})
        await read_to_close(ws)
    if revise:
        return
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    await client.app[STORE_KEY].flush()
    message = await revised_404(client, ready)  # stored, the session gone
    assert "none will come (it was not revised): its final one stands" in message
    stored = await client.get(transcript_url(ready, "json"))
    assert stored.headers["X-Livemeet-Revision"] == "none"


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
    assert error["retryable"] is False and "decode failed: RuntimeError" in error["message"]
    assert "scripted revision failure" not in error["message"]  # the exception's text: the log's
    assert metric(client, "livemeet_live_revisions_total", result="failed") == 1
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    await client.app[STORE_KEY].flush()
    # the session let go, the store says the revision failed (it said `none`, as of a session
    # never to be revised: the store kept no failures); on disk too (a restart reads it)
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    assert response.headers["X-Livemeet-Revision"] == "failed"
    body = json.loads(await response.text())
    assert [s["text"] for s in body["segments"]] == [s["text"] for s in final["segments"]]
    message = await revised_404(client, ready)
    assert "none will come: the revision failed" in message
    assert "decode failed: RuntimeError" in message
    final_only = await client.get(transcript_url(ready, "json") + "&version=final")
    assert final_only.headers["X-Livemeet-Revision"] == "failed"
    reread = TranscriptStore(client.app[STORE_KEY].directory)
    failed = await reread.get_live(ready["session_id"], revised=True)
    assert (
        failed.revision_failed is not None
        and "decode failed: RuntimeError" in failed.revision_failed
    )


@pytest.fixture
def revise_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[RevisionGate]:
    """Holds every scripted revision in flight until the test opens it (opened at the end,
    so the engine thread is never left waiting)."""
    gate = RevisionGate()
    revise = ScriptedCore.revise_meeting

    def held(core: ScriptedCore, duration_s: float, prompt: str | None) -> list[Segment]:
        gate.started.set()
        gate.release.wait(timeout=10)
        return revise(core, duration_s, prompt)

    monkeypatch.setattr(ScriptedCore, "revise_meeting", held)
    yield gate
    gate.release.set()


@dataclass
class RevisionGate:
    """`started`: a revision is in flight (in the engine's thread); `release` lets it end."""

    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    async def wait_started(self) -> None:
        await wait_until(self.started.is_set)


async def test_a_client_that_vanishes_while_the_revision_runs_still_gets_it_stored(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    tmp_path: Path,
    revise_gate: RevisionGate,
) -> None:
    """The socket dies (no close handshake) while the re-decode runs: the session is held,
    detached, for its revision, which completes, is counted and is stored; then the
    session is let go."""
    script = replace(DEFAULT_SCRIPT, revised=REVISED)
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)
    ws = await client.ws_connect("/v1/live")
    ready = await meeting(ws)
    await read_until(ws, "transcript.final")
    await revise_gate.wait_started()
    await detach(client, ws)
    revise_gate.release.set()
    await wait_until(lambda: _revised(client, ready))
    assert metric(client, "livemeet_live_revisions_total", result="revised") == 1
    await client.app[STORE_KEY].flush()
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.headers["X-Livemeet-Transcript-Status"] == "revised"
    assert [s["text"] for s in (await response.json())["segments"]] == [s.text for s in REVISED]


async def test_the_revision_header_says_a_revision_is_coming_then_that_it_came(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    tmp_path: Path,
    revise_gate: RevisionGate,
) -> None:
    """`X-Livemeet-Revision`: after the final, while the re-decode runs, the resource says
    "final" and the revision "pending" ("final" alone did not tell it from a revision that
    failed unheard: a page whose socket went quiet waited out its bound); once it came,
    "revised", for either version, held and stored."""
    script = replace(DEFAULT_SCRIPT, revised=REVISED)
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)
    async with client.ws_connect("/v1/live") as ws:
        ready = await meeting(ws)
        await read_until(ws, "transcript.final")
        await revise_gate.wait_started()
        running = await client.get(transcript_url(ready, "json"))
        assert running.headers["X-Livemeet-Transcript-Status"] == "final"
        assert running.headers["X-Livemeet-Revision"] == "pending"
        revise_gate.release.set()
        await read_to_close(ws)
    answers = []
    for when in ("held", "stored"):
        if when == "stored":
            await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
            await client.app[STORE_KEY].flush()
        for version in ("", "&version=final"):
            response = await client.get(transcript_url(ready, "json") + version)
            answers.append(
                (response.headers["X-Livemeet-Transcript-Status"],
                 response.headers["X-Livemeet-Revision"])
            )  # fmt: skip
    assert answers == [("revised", "revised"), ("final", "revised")] * 2


def test_revision_state_tells_pending_failed_and_none_apart() -> None:
    """Every branch of the header's value for a held session (a failed revision is held only
    briefly: the server lets the session go once the error is out)."""
    final = TranscriptFinal((), FinishReason.STOP, 1.0, 1.0, revision=True)

    def holder(
        *,
        revise: bool,
        terminal: object = None,
        pending: bool = False,
        revision: object = None,
        revised: object = None,
    ) -> Any:
        replay = SimpleNamespace(terminal=terminal, revision_pending=pending, revision=revision)
        return SimpleNamespace(replay=replay, options=SimpleNamespace(revise=revise),
                               revised_transcript=lambda: revised)  # fmt: skip

    assert revision_state(holder(revise=True)) == "pending"  # running, promised
    assert revision_state(holder(revise=True, terminal=final, pending=True)) == "pending"
    failed = Error("revision_failed", "boom")
    assert revision_state(holder(revise=True, terminal=final, revision=failed)) == "failed"
    assert revision_state(holder(revise=False)) == "none"  # never promised
    assert revision_state(holder(revise=True, terminal=final)) == "none"  # promised none after
    assert revision_state(holder(revise=True, terminal=final, revised=object())) == "revised"


async def test_a_resume_after_the_final_gets_the_replayed_final_then_the_revision(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    tmp_path: Path,
    revise_gate: RevisionGate,
) -> None:
    script = replace(DEFAULT_SCRIPT, revised=REVISED)
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)
    ws = await client.ws_connect("/v1/live")
    ready = await meeting(ws)
    final = (await read_until(ws, "transcript.final"))[-1]
    await revise_gate.wait_started()
    await detach(client, ws)
    async with client.ws_connect("/v1/live") as again:
        await again.send_json(resume_start(ready))
        resumed = await again.receive_json()
        assert resumed["resumed"] is True and resumed["revise"] is True
        # all the audio: the final holds it (its ack said so), durable or not
        assert resumed["offset"] == MEETING_S * 16000
        replayed = await read_until(again, "transcript.final")
        revise_gate.release.set()
        events = await read_to_close(again)
        assert again.close_code == 1000
    assert replayed[-1] == final
    assert [e["type"] for e in events] == ["transcript.revised"]
    assert events[0]["supersedes"] == [s["id"] for s in final["segments"]]
    assert [s["text"] for s in events[0]["segments"]] == [s.text for s in REVISED]
    assert metric(client, "livemeet_live_revisions_total", result="revised") == 1


async def shut_down(client: TestClient, timeout_s: float) -> None:
    """The server's shutdown (app.close_live_sockets) with a drain of `timeout_s`."""
    client.app[LIFECYCLE_KEY].draining = True
    await asyncio.gather(
        client.app[REGISTRY_KEY].drain_all(timeout_s), client.app[SESSIONS_KEY].drain(timeout_s)
    )


async def test_a_shutdown_waits_for_a_revision_in_flight_within_its_drain(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    tmp_path: Path,
    revise_gate: RevisionGate,
) -> None:
    script = replace(DEFAULT_SCRIPT, revised=REVISED)
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)
    async with client.ws_connect("/v1/live") as ws:
        await meeting(ws)
        await read_until(ws, "transcript.final")
        await revise_gate.wait_started()
        shutdown = asyncio.create_task(shut_down(client, 5.0))
        await wait_until(lambda: client.app[LIFECYCLE_KEY].draining)
        revise_gate.release.set()
        events = await read_to_close(ws)
        await shutdown
        assert ws.close_code == 1000
    assert [e["type"] for e in events] == ["transcript.revised"]
    assert metric(client, "livemeet_live_revisions_total", result="revised") == 1


async def test_a_shutdown_cancels_a_revision_not_done_within_its_drain(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    tmp_path: Path,
    revise_gate: RevisionGate,
) -> None:
    """docs/protocol.md, Revision: past the drain, the revision is cancelled: the client gets
    `revision_failed` and a normal close (the final stands, and is stored); no revision is
    stored, and the cancelled one counts as failed."""
    client = await scripted_client(aiohttp_client, server_config, tmp_path, DEFAULT_SCRIPT)
    async with client.ws_connect("/v1/live") as ws:
        ready = await meeting(ws)
        await read_until(ws, "transcript.final")
        await revise_gate.wait_started()
        shutdown = asyncio.create_task(shut_down(client, 0.3))
        events = await read_to_close(ws)
        await shutdown
        assert ws.close_code == 1000
    assert [(e["type"], e.get("code")) for e in events] == [("error", "revision_failed")]
    assert "shutting down" in events[0]["message"] and events[0]["retryable"] is False
    await wait_until(lambda: len(client.app[SESSIONS_KEY]) == 0)
    assert metric(client, "livemeet_live_revisions_total", result="failed") == 1
    revise_gate.release.set()
    await client.app[STORE_KEY].flush()
    response = await client.get(transcript_url(ready, "verbose_json"))
    assert response.headers["X-Livemeet-Transcript-Status"] == "final"
    # the revision promised was lost: it read `none` (none was to come; a trial's crash too)
    assert response.headers["X-Livemeet-Revision"] == "failed"
    message = await revised_404(client, ready)
    assert "the server stopped before its revision came; its final one stands" in message


@pytest.mark.parametrize(
    ("script", "last", "close_code"),
    [
        (replace(DEFAULT_SCRIPT, revised=REVISED), "transcript.revised", 1001),
        (replace(DEFAULT_SCRIPT, fail_revise=True), "error", 1000),
    ],
    ids=["revised", "revision_failed"],
)
async def test_a_session_the_shutdown_ends_gets_its_final_then_its_revision(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    tmp_path: Path,
    script: Script,
    last: str,
    close_code: int,
) -> None:
    """The revision, then 1001 (the server is going away); or its failure, which closes
    1000 as `revision_failed` always does (docs/protocol.md: an error's close is its table
    code; before, 1001 here, as if the revision had come)."""
    client = await scripted_client(aiohttp_client, server_config, tmp_path, script)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        for _ in range(round(MEETING_S / 0.5)):
            await ws.send_bytes(pcm16(0.5))
        while (await read_until(ws, "audio.ack"))[-1]["offset"] < MEETING_S * 16000:
            pass
        shutdown = asyncio.create_task(shut_down(client, 5.0))
        events = await read_to_close(ws)
        await shutdown
        assert ws.close_code == close_code
    assert [e["type"] for e in events[-2:]] == ["transcript.final", last]


@pytest.mark.parametrize("revise", [True, False])
async def test_the_start_log_says_a_backend_that_cannot_revise_will_not(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    caplog: pytest.LogCaptureFixture,
    revise: bool,
) -> None:
    """`serve --revise` over the demo (which cannot revise) was accepted silently (a trial):
    one info line at start says so; under --no-revise there is nothing to say."""
    config = replace(server_config, gateway=replace(server_config.gateway, revise=revise))
    with caplog.at_level(logging.INFO):
        await aiohttp_client(create_app(config, FakeTranscriber()))
    lines = [r for r in caplog.records if "cannot revise" in r.getMessage()]
    assert len(lines) == (1 if revise else 0)
    if revise:
        assert lines[0].levelno == logging.INFO
        assert lines[0].getMessage().startswith("the fake backend cannot revise: live sessions")
