"""A seeded stress trial of what a live client sees (docs/protocol.md: `segment.final`,
`audio.ack`, Resume, Captions, Speaker names, Speaker merges), over the real engine boundary
(EngineClient, the scripted backend in a thread) and a real journal.

A client streams a meeting (16 to 48 kHz, mono or stereo) in frames of random sizes,
finalizes, renames and merges speakers at random points (renames and merges after `end` too),
drops its socket abruptly or sends a message the server refuses (4400: the session is kept),
and resumes (from `session.ready`'s offset, sending again what was not acknowledged, as the
recorder does), while the journal's group commits stall at random moments and a captions
subscriber watches throughout. Some trials also crash the server, mid-meeting or right after
`end` (its journal as a crash leaves it: what was committed), and resume on the next start.
What every socket got is held against the protocol's promises (`Trial.check`):

1. a final id always comes with the same segment, on every socket, across a crash;
2. the finals the client assembled (deduplicated by id) are the final transcript's segments,
   in order, as they were sent (`merged` carries the merges);
3. `segment.partial` revs increase on each socket, and none follows `transcript.final`;
4. each socket's finals, partials and transcripts follow the backend's order (the pump's),
   partials coalesced, no final skipped: nothing overtakes a final;
5. the captions subscriber's finals are the client's;
6. acks (and a resume's offset) never go down, never pass the audio sent, and the last
   covers all of it;
7. a final, a name or a merge the client (or the subscriber) is told is in the journal then.

The client's actions are seeded; the interleavings are the machine's, and the invariants hold
for every one of them (no timing is asserted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient

from livemeet.backends.scripted import Revision, Script
from livemeet.config import GatewayConfig, ModelConfig, ServerConfig
from livemeet.gateway import live_journal
from livemeet.gateway.app import create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.keys import SESSIONS_KEY, STORE_KEY
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.transcriber import (
    Event,
    SegmentFinal,
    SegmentPartial,
    TranscriptFinal,
    TranscriptRevised,
)
from livemeet.transcript.segments import Segment
from tests.gateway.conftest import ClientFactory
from tests.gateway.test_live_resume import vanish
from tests.gateway.test_speaker_merge import stalled_commits
from tests.gateway.test_ws_live import START, wait_until

Frame = dict[str, Any]
MEETING_S = 24.0
LABELS = ("S01", "S02", "S03", "S04")
WORDS = (
    "budget travel review quarter plan launch hiring design metrics roadmap vendor contract "
    "release testing support pricing churn growth office remote training security audit"
).split()
# (seed, when the server crashes: never, mid-meeting or right after the client's `end`, the
# client's sample rate and channels)
TRIALS = [
    (1, None, 16_000, 1),
    (2, None, 48_000, 2),
    (3, "mid", 16_000, 1),
    (4, "ending", 44_100, 1),
]


def meeting_script(rng: random.Random) -> Script:
    """A meeting of MEETING_S s: turns of 1-4 s with short gaps, speakers in order of first
    appearance (as the scripted backend wants), and a misrecognition now and then so that
    partials change under the client."""
    turns: list[Segment] = []
    start_s, seen = rng.uniform(0.2, 0.8), 0
    while start_s < MEETING_S - 1.5:
        end_s = min(MEETING_S - 0.2, start_s + rng.uniform(1.0, 4.0))
        k = rng.randrange(min(seen + 1, len(LABELS)))
        seen = max(seen, k + 1)
        words = [rng.choice(WORDS) for _ in range(max(2, round((end_s - start_s) * 2.5)))]
        turns.append(Segment(round(start_s, 2), round(end_s, 2), LABELS[k], " ".join(words)))
        start_s = end_s + rng.choice((0.0, 0.0, 0.3, 0.8))
    revisions = tuple(
        _misheard(rng, hop, rng.randrange(len(turns)), turns) for hop in rng.sample(range(60), 8)
    )
    return Script(reference=tuple(turns), revisions=revisions)


def _misheard(rng: random.Random, hop: int, index: int, turns: list[Segment]) -> Revision:
    words = turns[index].text.split()
    words[rng.randrange(len(words))] = "mm"
    return Revision(hop, index, " ".join(words))


@pytest.fixture
def backend_order(monkeypatch: pytest.MonkeyPatch) -> dict[LiveSessionHolder, list[Event]]:
    """The backend's events of each session as its pump read them (after the finals a rebuilt
    session starts with): the order a socket's events must keep (invariant 4)."""
    traces: dict[LiveSessionHolder, list[Event]] = {}
    take = LiveSessionHolder._take

    async def traced(self: LiveSessionHolder, event: Event) -> None:
        traces.setdefault(self, [*self.replay.finals]).append(event)
        await take(self, event)

    monkeypatch.setattr(LiveSessionHolder, "_take", traced)
    return traces


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The journal's group commits wait while this is clear (it starts set)."""
    stall = stalled_commits(monkeypatch)
    yield stall
    stall.set()


async def scripted_server(
    aiohttp_client: ClientFactory, data_dir: Path, script_path: Path
) -> TestClient:
    engine = EngineClient(ModelConfig(backend="scripted", model=str(script_path)), in_process=True)
    config = ServerConfig(port=0, data_dir=data_dir, gateway=GatewayConfig(live_hop_s=0.5))
    return await aiohttp_client(create_app(config, engine))


@dataclass
class Journalled:
    """One session's record in a journal, read-only: its finals by id, names, merges, and the
    labels its segments showed."""

    finals: dict[str, Frame]
    names: dict[str, str]
    merges: dict[str, str]
    labels: set[str]

    def resolve(self, label: str) -> str:
        while label in self.merges:
            label = self.merges[label]
        return label


def read_journal(data_dir: Path, session_id: str) -> Journalled | None:
    """The session as the journal under `data_dir` holds it now; None once it is gone from it
    (finished: its final transcript is stored)."""
    uri = f"file:{data_dir / 'live' / live_journal.DB_NAME}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        row = conn.execute(
            "SELECT names, merges, labels FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is None:
            return None
        finals = conn.execute(
            "SELECT segment FROM finals WHERE session_id = ? ORDER BY seq", (session_id,)
        ).fetchall()
    segments = [json.loads(segment) for (segment,) in finals]
    return Journalled(
        {s["id"]: wire_of(s) for s in segments},
        dict(json.loads(row[0])),
        dict(json.loads(row[1])),
        set(json.loads(row[2])),
    )


def wire_of(stored: dict[str, Any]) -> Frame:
    """A journalled final as `segment.final` carries it."""
    segment = Segment(
        stored["start"], stored["end"], stored["speaker"], stored["text"], id=stored["id"]
    )
    return {**segment.to_wire(), **({"flags": stored["flags"]} if stored["flags"] else {})}


def snapshot_journal(src: Path, dst: Path) -> None:
    """What a crash of the server running on `src` leaves: the journal's committed state (an
    SQLite backup: what a reader sees), then the audio files as they are (bytes past a
    session's recorded length were never reported durable, and a start cuts them off)."""
    (dst / "live" / "audio").mkdir(parents=True)
    uri = f"file:{src / 'live' / live_journal.DB_NAME}?mode=ro"
    with (
        contextlib.closing(sqlite3.connect(uri, uri=True)) as conn,
        contextlib.closing(sqlite3.connect(dst / "live" / live_journal.DB_NAME)) as copy,
    ):
        conn.backup(copy)
    for path in (src / "live" / "audio").iterdir():
        shutil.copyfile(path, dst / "live" / "audio" / path.name)


def meeting_audio(rate: int, channels: int) -> bytes:
    """MEETING_S of PCM16 LE at `rate`, `channels` interleaved: a ramp, so that a frame sent
    twice or out of place would change what the backend hears."""
    ramp = (np.arange(round(MEETING_S * rate)) % 32768).astype("<i2")
    return np.repeat(ramp[:, None], channels, axis=1).tobytes()


def segment_of(frame: Frame) -> Frame:
    return {k: v for k, v in frame.items() if k != "type"}


def same_partial(frame: Frame, event: Event) -> bool:
    """Whether `frame` is the backend's partial `event` (revs are the session's own, and a
    merge may relabel its segments: times and texts say which)."""
    if not isinstance(event, SegmentPartial):
        return False
    mine = [(s["start"], s["end"], s["text"]) for s in frame["segments"]]
    theirs = [(round(s.start_s, 3), round(s.end_s, 3), s.text) for s in event.segments]
    return mine == theirs


def matches(frame: Frame, event: Event) -> bool:
    kind = frame["type"]
    if kind == "segment.final":
        return isinstance(event, SegmentFinal) and event.segment.id == frame["id"]
    if kind == "segment.partial":
        return same_partial(frame, event)
    if kind == "transcript.final":
        return isinstance(event, TranscriptFinal)
    return kind == "transcript.revised" and isinstance(event, TranscriptRevised)


ORDERED = ("segment.final", "segment.partial", "transcript.final", "transcript.revised")


@dataclass
class Socket:
    """One socket of the client's (or of the captions subscriber's), and what it got."""

    ws: aiohttp.ClientWebSocketResponse
    data_dir: Path  # the journal of the server it was open to
    holder: LiveSessionHolder  # that server's session
    frames: list[Frame] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None
    captions: bool = False
    gone: bool = False  # the client dropped it (vanished, or a crash)
    refused: bool = False  # it sent a message the server refuses (invalid_request)


class Trial:
    """The client, its captions subscriber, and the checks (module docstring)."""

    def __init__(
        self,
        seed: int,
        rate: int,
        channels: int,
        http: TestClient,
        data_dir: Path,
        disk: threading.Event,
        traces: dict[LiveSessionHolder, list[Event]],
    ) -> None:
        self.rng = random.Random(seed)
        self.http = http
        self.data_dir = data_dir
        self.disk = disk
        self.traces = traces
        self.start = {**START, "sample_rate": rate, "channels": channels}
        self.frame_bytes = 2 * channels
        self.audio = meeting_audio(rate, channels)
        self.total = len(self.audio) // self.frame_bytes  # sample frames at the client's rate
        self.rate = rate
        self.pos = 0  # where the current socket's next frame starts
        self.sent = 0  # the furthest frame the client has sent
        self.acked = 0  # the highest ack (or resume offset) it got
        self.ready: Frame = {}  # the first session.ready
        self.resume: Frame = {}  # its id and resume token
        self.holder: LiveSessionHolder  # the session, on the server running now
        self.sockets: list[Socket] = []
        self.subscriptions: list[Socket] = []
        self.finals: dict[str, Frame] = {}  # every final the client saw, by id
        self.order: list[str] = []  # their ids, first seen first
        self.caption_finals: dict[str, Frame] = {}
        self.caption_order: list[str] = []
        self.shown: set[str] = set()  # labels the client saw in a segment
        self.renames: dict[str, list[str | None]] = {}  # every name sent, per label, in order
        self.names: dict[str, str] = {}  # what the client was told last
        self.merged: dict[str, str] = {}  # label -> into, as told
        self.merge_sources: set[str] = set()  # labels the client asked to merge away
        self.num_names = 0
        self.stall_left = 0  # actions until the stalled journal goes on
        self.num_stalls = self.num_detaches = self.num_refused = self.num_checked = 0

    # -- the client ---------------------------------------------------------------------

    async def connect(self, *, resume: bool) -> Socket:
        ws = await self.http.ws_connect("/v1/live")
        await ws.send_json({**self.start, "resume": self.resume} if resume else self.start)
        ready = await asyncio.wait_for(ws.receive_json(), 10)
        assert ready["type"] == "session.ready" and ready["resumed"] is resume, ready
        if not resume:
            holder = self.http.app[SESSIONS_KEY].get(ready["session_id"])
            assert holder is not None
            self.holder = holder
        assert ready["session_id"] == self.holder.id
        sock = Socket(ws, self.data_dir, self.holder)
        sock.frames.append(ready)
        if resume:
            offset = ready["offset"]
            assert self.acked <= offset <= self.sent, (self.acked, offset, self.sent)
            self.acked, self.pos = offset, offset
            # the recorder takes session.ready's names and merges for its own
            self.names, self.merged = dict(ready["speakers"]), dict(ready["merged"])
        else:
            self.ready = ready
            self.resume = {"session_id": ready["session_id"], "resume_token": ready["resume_token"]}
        self.told_speakers(sock, ready["speakers"], ready["merged"])
        self.sockets.append(sock)
        sock.reader = asyncio.create_task(self.read(sock))
        return sock

    async def subscribe(self) -> None:
        """Subscribe to the session's captions: at its start, and on the next start after a
        crash, unless the session is over there already (its final came to the resume)."""
        path = f"/v1/sessions/{self.ready['session_id']}/captions"
        ws = await self.http.ws_connect(path, params={"token": self.ready["captions_token"]})
        head = await asyncio.wait_for(ws.receive_json(), 10)
        if head["type"] == "error" and head["code"] == "not_found" and self.subscriptions:
            assert any(f["type"] == "transcript.final" for f in self.sockets[-1].frames), head
            await ws.close()
            return
        assert head["type"] == "captions.ready", head
        sock = Socket(ws, self.data_dir, self.holder, [head], captions=True)
        self.told_speakers(sock, head["speakers"], head["merged"])
        self.subscriptions.append(sock)
        sock.reader = asyncio.create_task(self.read(sock))

    async def read(self, sock: Socket) -> None:
        async for msg in sock.ws:
            if msg.type is not WSMsgType.TEXT:
                break
            frame = json.loads(msg.data)
            sock.frames.append(frame)
            self.on_frame(sock, frame)

    def on_frame(self, sock: Socket, frame: Frame) -> None:
        """What is checked as a frame arrives: the journal's state then (invariant 7), and
        the acks against the audio sent (6)."""
        kind = frame["type"]
        if kind == "audio.ack":
            assert frame["offset"] <= self.sent, (frame, self.sent)
            self.acked = max(self.acked, frame["offset"])
        elif kind == "segment.final":
            self.saw_final(sock, segment_of(frame))
        elif kind == "segment.partial":
            self.shown.update(s["speaker"] for s in frame["segments"])
        elif kind == "speaker.renamed":
            self.told_speakers(sock, {frame["speaker"]: frame["name"]}, {})
        elif kind == "speaker.merged":
            self.told_speakers(sock, {}, {frame["speaker"]: frame["into"]})

    def saw_final(self, sock: Socket, segment: Frame) -> None:
        finals, order = (
            (self.caption_finals, self.caption_order)
            if sock.captions
            else (self.finals, self.order)
        )
        seen = finals.setdefault(segment["id"], segment)
        assert seen == segment, f"final {segment['id']} came as {seen}, then as {segment}"
        if seen is segment:
            order.append(segment["id"])
        self.shown.add(segment["speaker"])
        journal = read_journal(sock.data_dir, sock.holder.id)
        if journal is not None:  # None: finished meanwhile (the read lags the socket)
            self.num_checked += 1
            assert journal.finals.get(segment["id"]) == segment, (
                f"final {segment['id']} sent before the journal held it: {segment}"
            )

    def told_speakers(
        self, sock: Socket, names: dict[str, str | None], merges: dict[str, str]
    ) -> None:
        """Names and merges the socket was told (an answer, a replay, a ready frame): the
        journal holds each (a crash cannot take it back), or a later rename of the label."""
        if not sock.captions:
            for label, name in names.items():
                if name is None:
                    self.names.pop(label, None)
                else:
                    self.names[label] = name
            self.merged.update(merges)
        journal = read_journal(sock.data_dir, sock.holder.id)
        if journal is None:
            return
        for label, name in names.items():
            sent = self.renames.get(label, [])
            told_at = max((i for i, n in enumerate(sent) if n == name), default=-1)
            later = sent[told_at + 1 :] if told_at >= 0 else sent
            assert journal.names.get(label) in (name, *later), (
                f"{label} was told the name {name!r}, the journal has {journal.names.get(label)!r}"
            )
        for label, into in merges.items():
            assert label in journal.merges, f"{label} was told merged into {into}, not journalled"
            assert journal.resolve(label) == journal.resolve(into), (label, into, journal.merges)

    async def send_audio(self, ended: bool) -> None:
        """The next frame, of 1 sample frame to ~0.7 s. `ended`: sent again after `end` and
        a resume, where the session may have sent its final and closed already."""
        most = self.rate * 0.7
        frames = min(self.total - self.pos, round(most ** self.rng.uniform(0, 1)))
        chunk = self.audio[self.pos * self.frame_bytes : (self.pos + frames) * self.frame_bytes]
        with contextlib.suppress(*((ConnectionError,) if ended else ())):
            await self.sockets[-1].ws.send_bytes(chunk)
        self.pos += frames
        self.sent = max(self.sent, self.pos)
        # at ~20x real time: the backend decodes between frames, finals come mid-stream
        await asyncio.sleep(frames / self.rate / 20 * self.rng.uniform(0, 2))

    async def act(self) -> None:
        """Maybe one of the client's other actions, and maybe a change of the journal's pace."""
        self.pace_journal()
        roll = self.rng.random()
        if roll < 0.03:
            await self.sockets[-1].ws.send_json({"type": "finalize"})
        elif roll < 0.09:
            await self.speak()
        elif roll < 0.12:
            assert await self.detach_and_resume(), self.sockets[-1].frames[-3:]
        elif roll < 0.125:
            await self.violate()

    def pace_journal(self) -> None:
        """The journal's group commits stall for a few of the client's actions, now and then."""
        if self.stall_left:
            self.stall_left -= 1
            if not self.stall_left:
                self.disk.set()
        elif self.rng.random() < 0.05:
            self.num_stalls += 1
            self.stall_left = self.rng.randint(2, 25)
            self.disk.clear()

    async def speak(self) -> None:
        """A rename (of a label seen, or not yet: a client may name those) or, one time in
        three, a merge of two labels seen. Labels merged away are not renamed nor merged
        again (the server would refuse: invalid_request)."""
        ws = self.sockets[-1].ws
        pairs = [
            (a, b)
            for a in sorted(self.shown - self.merge_sources)
            for b in sorted(self.shown - self.merge_sources)
            if a != b
        ]
        if pairs and self.rng.random() < 1 / 3:
            a, b = self.rng.choice(pairs)
            self.merge_sources.add(a)
            await ws.send_json({"type": "speaker.merge", "speaker": a, "into": b})
            return
        label = self.rng.choice(sorted((self.shown | {"S01", "S02"}) - self.merge_sources))
        self.num_names += 1
        name = None if self.rng.random() < 0.2 else f"Name {self.num_names}"
        self.renames.setdefault(label, []).append(name)
        await ws.send_json({"type": "speaker.rename", "speaker": label, "name": name})

    async def violate(self) -> None:
        """A message the server refuses (a rename of what is not a label): it closes the socket
        with invalid_request and keeps the session, as after a drop; the client resumes, as
        the recorder does."""
        sock = self.sockets[-1]
        sock.refused = True
        self.num_refused += 1
        await sock.ws.send_json({"type": "speaker.rename", "speaker": "Bob", "name": "Bob"})
        assert sock.reader is not None
        await asyncio.wait_for(sock.reader, 10)
        await sock.ws.close()
        await self.connect(resume=True)

    async def detach_and_resume(self) -> bool:
        """The network drops the socket (no close frame); the client resumes, at once (the
        server may not have seen the drop: a takeover) or once the server has detached it.
        False, doing nothing, where the server has closed the socket already (after `end`:
        the final came), or has its final (transcript.final) already: it may be on its way,
        and a session whose final went out on a socket is let go with it, its client left to
        read the stored transcript (docs/protocol.md, Resume), which this one does not (a
        drop racing the final waited 5 s for a detach that never came). The server runs in
        this loop: with no await between that look and the drop, only a final recorded in
        the moment before the server reads the drop can still go out on the dead socket."""
        sock = self.sockets[-1]
        if sock.ws.closed or sock.ws._response.connection is None:
            return False
        if self.holder.replay.terminal is not None:
            return False
        self.num_detaches += 1
        vanish(sock.ws)
        sock.gone = True
        assert sock.reader is not None
        await asyncio.wait_for(sock.reader, 10)
        await sock.ws.close()
        if self.rng.random() < 0.5:
            await wait_until(lambda: self.http.app[SESSIONS_KEY].num_detached == 1)
        await self.connect(resume=True)
        return True

    async def crash(self, aiohttp_client: ClientFactory, script_path: Path, root: Path) -> None:
        """The server dies: what its journal holds is all the next start has. Its client's
        and subscriber's sockets go with it; the client resumes on the next start, and a
        new subscription follows the session there."""
        for sock in (self.sockets[-1], self.subscriptions[-1]):
            if not sock.ws.closed and sock.ws._response.connection is not None:
                vanish(sock.ws)
            sock.gone = True
            assert sock.reader is not None
            await asyncio.wait_for(sock.reader, 10)
            await sock.ws.close()
        told = dict(self.names), dict(self.merged)
        after = root / f"after-crash-{len(self.subscriptions)}"
        snapshot_journal(self.data_dir, after)
        self.disk.set()
        self.stall_left = 0
        journalled = read_journal(after, self.holder.id)
        if journalled is None:
            # too late: the session had finished (its final transcript stored), so the
            # server goes on; the client resumes there for the final it may have missed
            if not any(f["type"] == "transcript.final" for f in self.sockets[-1].frames):
                await self.connect(resume=True)
            return
        await self.http.close()
        self.http = await scripted_server(aiohttp_client, after, script_path)
        self.data_dir = after
        holder = self.http.app[SESSIONS_KEY].get(self.holder.id)
        assert holder is not None, "the session was not rebuilt from the journal"
        self.holder = holder
        # the rebuilt session knows the labels of its finals as shown and those the journal
        # held (a label is journalled with the next commit, not waited for: one shown since
        # is refused, invalid_request, until a partial of the rebuilt session shows it again)
        self.shown = {self.finals[i]["speaker"] for i in self.order} | journalled.labels
        await self.connect(resume=True)
        await self.subscribe()
        # what the client was told before the crash stands (unless it renamed since)
        for label, name in told[0].items():
            if self.renames.get(label, [None])[-1] == name:
                assert self.names.get(label) == name, (label, name, self.names)
        assert told[1].items() <= self.merged.items(), (told[1], self.merged)

    async def run(
        self, aiohttp_client: ClientFactory, script_path: Path, crash: str | None
    ) -> Frame:
        """The meeting, start to `transcript.final`; returns that final. `crash`: when the
        server crashes, if it does ("mid": mid-meeting, "ending": right after `end`)."""
        await self.connect(resume=False)
        await self.subscribe()
        crash_at = round(self.total * self.rng.uniform(0.3, 0.7)) if crash == "mid" else None
        ended = False  # the client sent `end`
        while True:
            while self.pos < self.total:
                await self.send_audio(ended)
                if not ended:
                    await self.act()
                if crash_at is not None and self.pos >= crash_at:
                    crash_at = None
                    await self.crash(aiohttp_client, script_path, script_path.parent)
            self.disk.set()  # the final waits (2 s at most) for the audio to be on disk
            self.stall_left = 0
            if not ended and self.rng.random() < 0.2:
                assert await self.detach_and_resume(), self.sockets[-1].frames[-3:]
                continue  # from the offset: some audio goes again
            with contextlib.suppress(ConnectionError):  # a resume that got its final: closed
                await self.sockets[-1].ws.send_json({"type": "end"})
                # names and merges still apply until the final transcript (ignored after it)
                for _ in range(self.rng.choice((0, 0, 1, 2))):
                    await self.speak()
            ended = True
            if crash == "ending":
                crash = None
                # the journal stalls soon after: the crash finds the session ended or not
                await asyncio.sleep(self.rng.uniform(0, 0.03))
                self.disk.clear()
                await asyncio.sleep(self.rng.uniform(0, 0.1))
                await self.crash(aiohttp_client, script_path, script_path.parent)
                continue  # from the offset again, and `end` again (ignored once ending)
            if self.rng.random() < 0.7:
                break
            # the socket drops after `end`, which the server may not have read: the client
            # resends from the offset and ends again (ignored where the session is ending)
            await asyncio.sleep(self.rng.uniform(0, 0.05))
            if not await self.detach_and_resume():
                break
        last = self.sockets[-1]
        assert last.reader is not None
        await asyncio.wait_for(last.reader, 30)
        assert self.subscriptions[-1].reader is not None
        await asyncio.wait_for(self.subscriptions[-1].reader, 30)
        finals = [f for f in last.frames if f["type"] == "transcript.final"]
        assert finals, [f["type"] for f in last.frames[-5:]]
        return finals[0]

    # -- the checks -----------------------------------------------------------------------

    def check(self, final: Frame) -> None:
        # (2) the finals seen, deduplicated, are the final transcript's segments, as sent
        assert [self.finals[i] for i in self.order] == final["segments"]
        for sock in self.sockets:  # one the client lost in a crash too: the same segments
            for other in (f for f in sock.frames if f["type"] == "transcript.final"):
                assert other["segments"] == final["segments"], (other, final)
        assert final["duration"] == pytest.approx(MEETING_S, abs=2e-3)  # all audio, once
        revised = [f for f in self.sockets[-1].frames if f["type"] == "transcript.revised"]
        assert [r["supersedes"] for r in revised] == [self.order]
        assert final.get("merged", {}) == {
            label: _resolve(self.merged, label) for label in self.merged
        }
        for sock in self.sockets + self.subscriptions:
            self.check_socket(sock)
        # (5) the captions subscriber's finals are the client's (its subscriptions together:
        # after a crash, a new one's snapshot holds the last CAPTIONS_SNAPSHOT_FINALS only)
        captions = [self.caption_finals[i] for i in self.caption_order]
        seen = [self.finals[i] for i in self.order]
        if self.subscriptions[-1].gone:  # a crash, and the session was over on the next start
            assert captions == seen[: len(captions)]
        else:
            assert captions == seen
            last_captions = self.subscriptions[-1].frames
            assert [f for f in last_captions if f["type"] == "transcript.final"] == [final]
        # (6) acks never passed the audio, and the last one (or offset) covers all of it
        assert self.acked == self.total

    def check_socket(self, sock: Socket) -> None:
        frames = sock.frames
        kinds = [f["type"] for f in frames]
        errors = [f for f in frames if f["type"] == "error"]
        if sock.refused:
            assert [e["code"] for e in errors] == ["invalid_request"], errors
        elif sock is not self.sockets[-1] and not sock.captions:
            # a socket the server took over: its last word is that
            assert [e["code"] for e in errors] in ([], ["session_taken_over"]), errors
        else:
            assert not errors, errors
        # (3) revs go up; no partial after the final transcript
        revs = [f["rev"] for f in frames if f["type"] == "segment.partial"]
        assert revs == sorted(set(revs)), revs
        if "transcript.final" in kinds:
            assert "segment.partial" not in kinds[kinds.index("transcript.final") :], kinds
        # (6) acks and offsets never go down on a socket
        acks = [f["offset"] for f in frames if f["type"] in ("audio.ack", "session.ready")]
        assert acks == sorted(acks), acks
        # (4) the backend's order, no final skipped, partials coalesced
        trace = self.traces.get(sock.holder, [*sock.holder.replay.finals])
        replayed = snapshot_partial(frames)
        i = 0
        for n, frame in enumerate(f for f in frames if f["type"] in ORDERED):
            if frame is replayed:
                shown = [k for k in snapshot_partials(trace, i) if same_partial(frame, trace[k])]
                if shown:
                    i = max(i, shown[0] + 1)
                    continue
            while i < len(trace) and not matches(frame, trace[i]):
                event = trace[i]
                # a captions snapshot starts at the last CAPTIONS_SNAPSHOT_FINALS finals
                skipped = sock.captions and n == 0
                assert skipped or not isinstance(event, SegmentFinal), (
                    f"{frame['type']} {frame.get('id', frame.get('rev'))} went out before "
                    f"final {event.segment.id}, which came before it: {describe(frames, trace)}"
                )
                i += 1
            assert i < len(trace), f"{frame} is not in the backend's order at all: {kinds}"
            i += 1


def snapshot_partial(frames: list[Frame]) -> Frame | None:
    """The partial of a resume's replay or a subscriber's snapshot, if it has one: right
    after the finals, names and merges that follow the ready frame."""
    if frames[0]["type"] == "session.ready" and not frames[0]["resumed"]:
        return None  # a new session: no replay
    for frame in frames[1:]:
        if frame["type"] == "segment.partial":
            return frame
        if frame["type"] not in ("segment.final", "speaker.renamed", "speaker.merged"):
            return None
    return None


def snapshot_partials(trace: list[Event], i: int) -> list[int]:
    """Where, in the backend's events, the partial of a snapshot taken once the finals
    before `i` were recorded may be: the latest recorded then, which is the last before `i`
    (a final that leaves the tail as it was brings no partial: that one still shows the
    tail) or one after it, before the next final."""
    end = next(
        (k for k in range(i, len(trace)) if isinstance(trace[k], SegmentFinal | TranscriptFinal)),
        len(trace),
    )
    before = [k for k in range(i) if isinstance(trace[k], SegmentPartial)][-1:]
    return before + [k for k in range(i, end) if isinstance(trace[k], SegmentPartial)]


def describe(frames: list[Frame], trace: list[Event]) -> str:
    """A socket's frames and its session's backend events, short (a failure's message)."""

    def texts(segments: Any) -> list[str]:
        return [s["text"] if isinstance(s, dict) else s.text for s in segments]

    got = [(f["type"], f.get("id", f.get("rev")), texts(f.get("segments", ()))) for f in frames]
    came = [
        e.segment.id if isinstance(e, SegmentFinal) else (type(e).__name__, texts(e.segments))
        for e in trace
        if isinstance(e, SegmentFinal | SegmentPartial)
    ]
    return f"the socket got {got}; the backend sent {came}"


def _resolve(merges: dict[str, str], label: str) -> str:
    while label in merges:
        label = merges[label]
    return label


@pytest.mark.parametrize(("seed", "crash", "rate", "channels"), TRIALS)
async def test_what_a_live_client_sees_keeps_the_protocols_promises(
    aiohttp_client: ClientFactory,
    tmp_path: Path,
    disk: threading.Event,
    backend_order: dict[LiveSessionHolder, list[Event]],
    seed: int,
    crash: str | None,
    rate: int,
    channels: int,
) -> None:
    rng = random.Random(seed)
    script_path = tmp_path / "script.json"
    script_path.write_text(meeting_script(rng).to_json(), encoding="utf-8")
    http = await scripted_server(aiohttp_client, tmp_path / "data", script_path)
    trial = Trial(seed, rate, channels, http, tmp_path / "data", disk, backend_order)
    final = await trial.run(aiohttp_client, script_path, crash)
    trial.check(final)
    # the stored transcript has the names the client was told last
    await trial.http.app[STORE_KEY].flush()
    params = {"token": trial.ready["captions_token"], "response_format": "json"}
    response = await trial.http.get(
        f"/v1/sessions/{trial.ready['session_id']}/transcript", params=params
    )
    assert response.status == 200, await response.text()
    assert (await response.json()).get("speakers", {}) == trial.names
    # the trial did what it is for
    assert trial.num_checked and len(trial.order) >= 5
    assert trial.num_detaches and trial.num_stalls and trial.num_names
