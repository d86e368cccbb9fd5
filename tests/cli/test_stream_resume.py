"""`livemeet stream` resumes its live session after a dropped connection (docs/protocol.md,
"Resume"): against the real gateway, over the engine boundary with the scripted backend (or
the fake transcriber), through a TCP proxy that resets the connection mid-stream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient

from livemeet.__main__ import main
from livemeet.audio.constants import SAMPLE_RATE
from livemeet.audio.decode import iter_decode
from livemeet.backends.redecode import RedecodeCore
from livemeet.cli import live_client, stream
from livemeet.config import ModelConfig, ServerConfig
from livemeet.gateway.app import close_live_sockets, create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.keys import SESSIONS_KEY, STORE_KEY
from livemeet.transcriber import Samples
from tests.cli.test_cli import write_wav
from tests.gateway.conftest import ClientFactory, client, fake, server_config  # noqa: F401
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_live_journal_finalize import (
    commits,  # noqa: F401
    crashed_copy,
    crossing,
    scripted_app,
)
from tests.gateway.test_live_revise import RevisionGate, revise_gate  # noqa: F401
from tests.gateway.test_ws_live import gateway_client, wait_until

FILE_S = 12.0  # the scripted backend's DEFAULT_SCRIPT runs to 11 s


class BlipProxy:
    """A TCP proxy in front of a test server. `drop()` resets every connection it carries,
    at both ends: no close frame either way, as a network blip. `upstream_port` may change
    between connections (a restarted server); while `refusing`, a connection is closed as
    soon as it opens (the network still down)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.refusing = False
        self.num_connections = 0
        self.num_refused = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}/v1/live"

    async def close(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def drop(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            self.num_refused += 1
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.num_connections += 1
        self._writers += [writer, up_writer]
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(1 << 16):
                dst.write(data)
                await dst.drain()
        finally:
            dst.transport.abort()


@pytest.fixture
async def proxy_for() -> AsyncIterator[Any]:
    proxies: list[BlipProxy] = []

    async def make(target: TestClient) -> tuple[BlipProxy, str]:
        proxy = BlipProxy(target.port or 0)
        proxies.append(proxy)
        return proxy, await proxy.start()

    yield make
    for proxy in proxies:
        await proxy.close()


class ReceivedAudio:
    """What the backend's sessions took in, in order (it decodes in the engine's thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.chunks: list[Samples] = []
        self._lock = threading.Lock()
        append = RedecodeCore.append

        def recording(core: RedecodeCore, session_id: str, samples: Samples) -> None:
            with self._lock:
                self.chunks.append(np.array(samples, dtype=np.float32))
            append(core, session_id, samples)

        monkeypatch.setattr(RedecodeCore, "append", recording)

    @property
    def num_samples(self) -> int:
        with self._lock:
            return sum(c.size for c in self.chunks)

    def pcm16(self) -> bytes:
        with self._lock:
            whole = np.concatenate(self.chunks)
        return (whole * 32_768.0).round().astype("<i2").tobytes()  # the gateway's inverse


@pytest.fixture
async def scripted(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[TestClient, ReceivedAudio]:
    """The gateway over the engine boundary (EngineClient, scripted backend in a thread), and
    the audio its backend takes in."""
    received = ReceivedAudio(monkeypatch)
    engine = EngineClient(ModelConfig(backend="scripted"), in_process=True)
    return await aiohttp_client(create_app(server_config, engine)), received


def file_pcm16(wav: Path) -> bytes:
    from livemeet.audio.decode import decode_file

    return live_client.to_pcm16(decode_file(wav))


async def stream_a_second_in(url: str, tmp_path: Path, backend: FakeTranscriber) -> Any:
    """`livemeet stream` of a 4-s file at 4x to `url`, in a thread: its exit code's future,
    once the backend has taken its first second of audio."""
    wav = write_wav(tmp_path / "meeting.wav", 4.0)
    args = ["stream", str(wav), "--url", url, "--speed", "4", "--hop-s", "0.5"]
    running = asyncio.ensure_future(asyncio.to_thread(main, args))
    await wait_until(
        lambda: backend.sessions and backend.sessions[0].log.num_samples >= SAMPLE_RATE
    )
    return running


async def test_a_dropped_connection_is_resumed_with_every_sample_and_final_once(
    scripted: tuple[TestClient, ReceivedAudio], proxy_for: Any, tmp_path: Path
) -> None:
    """The connection is reset as the first final arrives, mid-file: `stream` reconnects,
    resumes, sends on from the server's offset (the backend gets the file's samples once,
    no gap, none twice), shows each final once though the resume replays them, shows no
    ack, and its final covers the whole file."""
    from livemeet.audio.decode import iter_decode

    gateway, received = scripted
    proxy, url = await proxy_for(gateway)
    wav = write_wav(tmp_path / "meeting.wav", FILE_S)
    shown: list[dict[str, Any]] = []
    notices: list[str] = []
    sent_at_drop: list[float] = []

    def on_event(event: dict[str, Any]) -> None:
        shown.append(event)
        if event["type"] == "segment.final" and not sent_at_drop:
            sent_at_drop.append(received.num_samples / SAMPLE_RATE)
            proxy.drop()

    result = await live_client.stream_audio(
        url,
        iter_decode(wav),
        hop_s=0.5,
        speed=12.0,
        on_event=on_event,
        on_notice=notices.append,
    )
    assert sent_at_drop and sent_at_drop[0] < FILE_S  # the drop came mid-file
    assert proxy.num_connections == 2 and result.num_resumes == 1
    assert notices == ["connection lost (close 1006): resuming in 0.25 s"]
    assert result.close_code == 1000 and result.final is not None
    assert received.pcm16() == file_pcm16(wav)
    kinds = [e["type"] for e in shown]
    assert "audio.ack" not in kinds
    assert kinds.count("session.ready") == 2 and shown[kinds.index("segment.final") + 1 :]
    finals = [e["id"] for e in shown if e["type"] == "segment.final"]
    assert finals == [s["id"] for s in result.final["segments"]]  # each once, in order
    assert len(finals) == 4
    assert stream.report(result, wav) == 0


async def test_a_finalize_a_crash_took_is_sent_again_by_the_client_at_its_place(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    commits: threading.Event,  # noqa: F811
    proxy_for: Any,
    tmp_path: Path,
) -> None:
    """`stream_audio` finalizes at 2 s and 6.5 s; the server is killed after the journal's
    commit of the audio past 3 s, the one at 6.5 s taken in but not committed, with the
    audio before it (`crashed_copy`), and started again. The client resumes, is told the
    offset (~3 s) and that the last finalize on disk came at 2 s, sends the audio on from
    there with the finalize again at 6.5 s, and the rebuilt session cuts there: no final
    crosses either place (without it, "We are about ten percent over.", 5.5-8 s, did)."""
    first = await scripted_app(aiohttp_client, server_config)
    proxy, url = await proxy_for(first)
    after = replace(server_config, data_dir=tmp_path / "after-the-crash")
    ready: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "session.ready":
            ready.append(event)

    async def kill_and_restart() -> None:
        await wait_until(lambda: bool(ready))
        holder = first.app[SESSIONS_KEY].get(ready[0]["session_id"])
        assert holder is not None
        await wait_until(lambda: holder.num_frames_durable >= 3 * SAMPLE_RATE)
        commits.clear()
        try:
            assert holder.num_frames_durable < 6 * SAMPLE_RATE
            await wait_until(lambda: holder.finalizes[-1:] == [round(6.5 * SAMPLE_RATE)])
            crashed_copy(server_config.data_dir, after.data_dir)
        finally:
            commits.set()
        second = await scripted_app(aiohttp_client, after)
        proxy.upstream_port = second.port or 0
        proxy.drop()

    killing = asyncio.create_task(kill_and_restart())
    wav = write_wav(tmp_path / "meeting.wav", FILE_S)
    result = await live_client.stream_audio(
        url, iter_decode(wav), hop_s=0.5, speed=4.0, on_event=on_event, finalize_at_s=[2.0, 6.5]
    )
    await killing
    assert result.num_resumes == 1 and len(ready) == 2
    assert 3 * SAMPLE_RATE <= ready[1]["offset"] < 6 * SAMPLE_RATE
    assert ready[1]["finalize_offset"] == 2 * SAMPLE_RATE
    assert result.final is not None and result.final["duration"] == FILE_S
    segments = result.final["segments"]
    assert crossing(segments, 2.0) == [] and crossing(segments, 6.5) == []
    assert [s["text"] for s in segments if s["end"] == 6.5] == ["We are"]


async def test_stream_resumes_and_prints_each_final_once_and_no_ack(
    scripted: tuple[TestClient, ReceivedAudio],
    proxy_for: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command itself (its own loop in a thread; the server in this test's): the blip
    is reported on stderr, the resume on stdout, and it exits 0."""
    gateway, received = scripted
    proxy, url = await proxy_for(gateway)
    wav = write_wav(tmp_path / "meeting.wav", FILE_S)
    args = ["stream", str(wav), "--url", url, "--speed", "12", "--hop-s", "0.5"]
    running = asyncio.ensure_future(asyncio.to_thread(main, args))
    await wait_until(lambda: received.num_samples >= 5 * SAMPLE_RATE)
    proxy.drop()
    assert await asyncio.wait_for(running, 10) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].endswith("ready, model scripted (tests) (DEMO backend), resumable for 60 s")
    session_id = lines[0].split()[2]
    resumed = [line for line in lines if " resumed at " in line]
    assert len(resumed) == 1 and resumed[0].startswith(f"# session {session_id} resumed at ")
    finals = [line for line in lines if line.startswith("= ")]
    assert len(finals) == len(set(finals)) == 4
    assert lines[-6].startswith("# transcript.final: 4 segments, 12.00 s")
    # the scripted backend revises: the revision comes last, superseding the 4 finals, its
    # segments shown as the finals were (the script's reference again)
    assert lines[-5] == "# transcript.revised: 4 segments, superseding 4 finals, stop"
    assert [line[2:] for line in lines[-4:]] == [line[2:] for line in finals]
    assert all(line.startswith("r [") for line in lines[-4:])
    assert not [line for line in lines if line.startswith("{")]  # no raw JSON: no ack
    assert "connection lost (close 1006): resuming in 0.25 s" in err
    assert received.pcm16() == file_pcm16(wav)
    # the read-only links, once (not again on the resume), to the server behind the proxy
    (overlay,) = [line for line in err.splitlines() if line.startswith("captions overlay ")]
    (transcript,) = [line for line in err.splitlines() if line.startswith("transcript ")]
    base = url.removesuffix("/v1/live").replace("ws://", "http://")
    assert f"{base}/captions.html?session={session_id}&token=" in overlay
    assert f"{base}/v1/sessions/{session_id}/transcript?token=" in transcript


async def test_a_refused_resume_ends_the_stream_with_exit_1(
    client: TestClient,  # noqa: F811
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    proxy_for: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """During the blip another server took the address, one without the session (a
    restart that lost its data dir): the resume is `not_found` (4404), which is final: no
    more reconnects, the server's error on stdout, why on stderr, exit 1."""
    proxy, url = await proxy_for(client)
    elsewhere = replace(server_config, data_dir=tmp_path / "another-data-dir")
    restarted = await aiohttp_client(create_app(elsewhere, FakeTranscriber()))
    running = await stream_a_second_in(url, tmp_path, fake)
    proxy.upstream_port = restarted.port or 0
    proxy.drop()
    assert await asyncio.wait_for(running, 10) == 1
    assert proxy.num_connections == 2  # one resume, refused: no retry
    out, err = capsys.readouterr()
    assert "! error not_found: no live session 'fake-0' to resume" in out
    assert (
        "error: the session could not be resumed after the connection dropped: not_found: "
        "no live session 'fake-0' to resume"
    ) in err
    assert err.rstrip().endswith("(close 4404)")


async def test_a_restart_is_resumed_and_its_notice_says_why_once(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    proxy_for: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server restarts mid-stream (SIGTERM, `--shutdown-live keep`: server_restarting,
    1012): `stream` resumes on the next start and exits 0. Its notice printed the reason
    twice ("the server is restarting: the server is restarting: resume the session ...": a
    trial): the server's message, once."""
    gateway = await aiohttp_client(create_app(server_config, fake))
    proxy, url = await proxy_for(gateway)
    running = await stream_a_second_in(url, tmp_path, fake)
    proxy.refusing = True  # down between the stop and the next start
    await close_live_sockets(gateway.app)
    await gateway.close()
    restarted = await aiohttp_client(create_app(server_config, FakeTranscriber()))
    proxy.upstream_port = restarted.port or 0
    proxy.refusing = False
    assert await asyncio.wait_for(running, 30) == 0
    err = capsys.readouterr().err
    (notice,) = [line for line in err.splitlines() if "the server is restarting:" in line]
    assert notice.startswith("the server is restarting: resume the session"), notice
    assert notice.count("the server is restarting") == 1


async def test_a_drop_while_a_pipe_is_quiet_is_resumed_at_once_and_loses_nothing(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    proxy_for: Any,
) -> None:
    """`stream -`: the connection drops while the pipe's writer has nothing more. The
    stream reconnects then, not once the writer writes again (past the server's resume
    window, for a writer quiet long enough), and the frame that was being read goes out on
    the resumed connection: every sample once."""
    gateway = await gateway_client(aiohttp_client, server_config, fake)
    proxy, url = await proxy_for(gateway)
    waiting, release = threading.Event(), threading.Event()

    def recording() -> Iterator[Samples]:
        yield np.full(SAMPLE_RATE, 0.25, np.float32)
        waiting.set()
        release.wait(30.0)  # the writer is quiet
        yield np.full(SAMPLE_RATE, 0.5, np.float32)

    streaming = asyncio.ensure_future(
        live_client.stream_audio(url, recording(), hop_s=0.5, speed=1e6, from_pipe=True)
    )
    try:
        await wait_until(
            lambda: waiting.is_set() and fake.sessions[0].log.num_samples == SAMPLE_RATE
        )
        proxy.drop()
        await wait_until(lambda: proxy.num_connections == 2)  # while the writer is quiet
    finally:
        release.set()
    result = await asyncio.wait_for(streaming, 10)
    assert result.num_resumes == 1 and result.final is not None and not result.stopped_early
    assert result.sent_s == 2.0 and fake.sessions[0].log.num_samples == 2 * SAMPLE_RATE


async def test_with_resume_off_a_drop_ends_the_stream_as_before(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    proxy_for: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`serve --live-resume-window 0` (resume_token null): no reconnect; no final, exit 1."""
    gateway = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0)
    proxy, url = await proxy_for(gateway)
    running = await stream_a_second_in(url, tmp_path, fake)
    proxy.drop()
    assert await asyncio.wait_for(running, 10) == 1
    assert proxy.num_connections == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0].endswith("ready, model fake-model (DEMO backend), no resume")
    assert "no transcript.final (close code 1006: the connection dropped)" in err
    await wait_until(lambda: len(gateway.app[SESSIONS_KEY]) == 0)


async def test_a_drop_not_resumed_within_the_window_ends_the_stream_with_exit_1(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    fake: FakeTranscriber,  # noqa: F811
    proxy_for: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The network stays down: `stream` retries with backoff (0.25 s, 0.5 s) while the
    server keeps the session (0.9 s here), then gives up with exit 1."""
    gateway = await gateway_client(aiohttp_client, server_config, fake, live_resume_window_s=0.9)
    proxy, url = await proxy_for(gateway)
    running = await stream_a_second_in(url, tmp_path, fake)
    proxy.refusing = True
    proxy.drop()
    assert await asyncio.wait_for(running, 10) == 1
    assert proxy.num_connections == 1 and proxy.num_refused == 2
    err = capsys.readouterr().err
    assert "connection lost (close 1006): resuming in 0.25 s" in err
    assert "cannot reconnect (" in err and "): resuming in 0.50 s" in err
    assert err.rstrip().endswith("not resumed within the 0.9 s the server keeps the session")


# ---- the Sans-I/O parts


def pcm(num_frames: int, first: int = 0) -> bytes:
    return np.arange(first, first + num_frames, dtype="<i2").tobytes()


def test_unacked_audio_keeps_what_an_ack_does_not_cover_and_resends_from_any_offset() -> None:
    unacked = live_client.UnackedAudio()
    for first in (0, 100, 200):
        unacked.push(pcm(100, first))
    unacked.ack(150)  # the frame [100, 200) is only half covered: kept whole
    assert unacked.num_held == 200 and unacked.num_acked == 150
    assert b"".join(unacked.since(150)) == pcm(150, 150)
    assert b"".join(unacked.since(100)) == pcm(200, 100)
    assert unacked.since(300) == []  # the session holds everything sent
    for outside in (99, 301):  # below what is held, past what was sent
        with pytest.raises(live_client.ResumeMismatch, match=f"sample frame {outside}, but"):
            unacked.since(outside)
    unacked.ack(120)  # acks never go down
    assert unacked.num_acked == 150
    unacked.ack(300)
    assert unacked.num_held == 0 and unacked.since(300) == []


def test_session_link_bounds_what_waits_for_an_ack_and_drops_replayed_finals() -> None:
    link = live_client.SessionLink(max_unacked_frames=200)
    ready = {"type": "session.ready", "session_id": "s-1", "resume_token": "t"}
    assert link.receive({**ready, "resume_window_s": 60.0, "resumed": False, "offset": 0})
    assert link.resume == {"session_id": "s-1", "resume_token": "t"} and link.window_s == 60
    link.sent(pcm(100))
    link.sent(pcm(100, 100))
    assert not link.can_send  # 200 frames wait for an ack
    assert not link.receive({"type": "audio.ack", "offset": 100})  # not shown
    assert link.can_send
    final = {"type": "segment.final", "id": "seg-0001"}
    assert link.receive(final) and not link.receive(dict(final))  # a replay: shown once
    resumed = {**ready, "resumed": True, "offset": 150}
    assert link.receive(resumed)  # shown ("resumed at"), and the session stays the same
    assert b"".join(link.resumed(resumed)) == pcm(50, 150)
    with pytest.raises(live_client.ResumeMismatch, match="new one"):
        link.resumed({**ready, "resumed": False, "offset": 0})


def test_a_resume_sends_each_finalize_past_finalize_offset_again_at_its_place() -> None:
    """The link keeps the place of each finalize sent (frames sent before it); a resume's
    `session.ready` drops those at or before its `finalize_offset` (the server holds them)
    and has the others sent again among the audio from `offset`: first where one is at the
    offset, after the frame that ends at one. They stay kept for a next resume. A server
    older than `finalize_offset` gets none: it would cut again at one it holds."""
    finalize = live_client.FINALIZE_MESSAGE
    link = live_client.SessionLink(max_unacked_frames=1000)
    ready = {"type": "session.ready", "session_id": "s-1", "resume_token": "t"}
    link.receive({**ready, "resumed": False, "offset": 0})
    link.sent(pcm(100))
    link.finalized()
    link.finalized()  # nothing sent between: the same place
    link.sent(pcm(100, 100))
    link.finalized()
    link.sent(pcm(100, 200))
    link.finalized()
    assert link.finalizes == [100, 200, 300]
    link.receive({"type": "audio.ack", "offset": 150})
    resumed = {**ready, "resumed": True, "offset": 200, "finalize_offset": 100}
    assert link.resumed(resumed) == [finalize, pcm(100, 200), finalize]
    assert link.finalizes == [200, 300]  # a crash may take them again
    again = {**resumed, "finalize_offset": None}  # the server holds none (a rebuild, say)
    assert link.resumed(again) == [finalize, pcm(100, 200), finalize]
    assert link.resumed({**resumed, "finalize_offset": 300}) == [pcm(100, 200)]
    assert link.finalizes == []
    link.finalized()
    older = {**ready, "resumed": True, "offset": 300}  # no finalize_offset: sent none
    assert link.resumed(older) == [] and link.finalizes == []


def test_a_finalize_within_a_frame_is_sent_again_where_it_came() -> None:
    finalize = live_client.FINALIZE_MESSAGE
    frames = [pcm(100, 200), pcm(100, 300)]
    assert live_client.with_finalizes(frames, 200, [250, 300, 400]) == [
        pcm(50, 200),
        finalize,
        pcm(50, 250),
        finalize,
        pcm(100, 300),
        finalize,
    ]
    assert live_client.with_finalizes([], 400, [400]) == [finalize]


def test_with_resume_off_nothing_is_kept_and_sending_never_waits() -> None:
    link = live_client.SessionLink(max_unacked_frames=10)
    assert link.receive({"type": "session.ready", "session_id": "s", "resume_token": None})
    link.sent(pcm(100))
    link.finalized()
    assert link.can_send and link.resume is None and link.unacked.num_held == 0
    assert link.finalizes == []


def test_only_a_close_without_a_close_frame_or_a_restart_is_resumed() -> None:
    assert live_client.resumable_close(1006) and live_client.resumable_close(1005)
    assert live_client.resumable_close(1012)  # server_restarting: its next start has the session
    # the server's other closes end the session: final, drained, and every error
    for code in (1000, 1001, 1009, 1011, 4401, 4404, 4409, 4429, 4503):
        assert not live_client.resumable_close(code), code


def test_an_unreachable_server_is_waited_for_as_a_restarting_one() -> None:
    """A drop with the server still up: the session is kept `window` from the drop. With no
    server to reach (a trial: killed, restarting, its model loading), the client gave up at
    the same moment, while the restarted server went on to keep the session `window` from its
    own start: each failed attempt moves the deadline a window past it, up to the cap."""
    window = 60.0
    assert live_client.resume_deadline(100.0, window, None) == 160.0
    assert live_client.resume_deadline(100.0, window, 130.0) == 190.0
    assert live_client.resume_deadline(100.0, window, 101.0) == 161.0  # a window past the attempt
    far = 100.0 + live_client.RECONNECT_OUTAGE_MAX_S + 50
    assert (
        live_client.resume_deadline(100.0, window, far)
        == 100.0 + live_client.RECONNECT_OUTAGE_MAX_S
    )


async def test_no_wait_revision_closes_after_the_final_and_the_server_still_revises(
    scripted: tuple[TestClient, ReceivedAudio],
    revise_gate: RevisionGate,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The revision is held in the engine: `stream --no-wait-revision` exits 0 with the
    final, says the revision is still to come, and the server stores it once done."""
    gateway, _ = scripted
    url = str(gateway.make_url("/v1/live")).replace("http", "ws", 1)
    wav = write_wav(tmp_path / "meeting.wav", FILE_S)
    args = ["stream", str(wav), "--url", url, "--speed", "24", "--hop-s", "0.5"]
    code = await asyncio.wait_for(asyncio.to_thread(main, [*args, "--no-wait-revision"]), 10)
    assert code == 0 and revise_gate.started.is_set()
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith("# transcript.final: 4 segments, 12.00 s")
    assert "transcript.revised" not in out
    assert "still revising" in err
    session_id = out.splitlines()[0].split()[2]
    revise_gate.release.set()
    holder = gateway.app[SESSIONS_KEY].get(session_id)  # held, detached, for its revision
    assert holder is not None and holder.sink is None
    await wait_until(lambda: holder.revised_transcript() is not None)
    await gateway.app[STORE_KEY].flush()
    stored = await gateway.app[STORE_KEY].get_live(session_id, revised=True)
    assert len(stored.transcript.segments) == 4


async def test_a_drop_between_the_final_and_its_revision_is_resumed_for_the_revision(
    scripted: tuple[TestClient, ReceivedAudio],
    revise_gate: RevisionGate,  # noqa: F811
    proxy_for: Any,
    tmp_path: Path,
) -> None:
    gateway, _ = scripted
    proxy, url = await proxy_for(gateway)
    shown: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        shown.append(event)
        if event["type"] == "transcript.final":
            proxy.drop()
            asyncio.get_running_loop().call_later(0.5, revise_gate.release.set)

    wav = write_wav(tmp_path / "meeting.wav", FILE_S)
    result = await live_client.stream_audio(
        url, iter_decode(wav), hop_s=0.5, speed=24.0, on_event=on_event
    )
    assert result.num_resumes == 1 and result.close_code == 1000, result.failure
    kinds = [e["type"] for e in shown]
    assert kinds.count("transcript.final") == 1 and kinds[-1] == "transcript.revised"
    assert result.revised is not None and not result.revision_pending
    assert stream.report(result, wav) == 0


async def test_a_session_lost_while_its_revision_runs_leaves_the_final_standing(
    scripted: tuple[TestClient, ReceivedAudio],
    revise_gate: RevisionGate,  # noqa: F811
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,  # noqa: F811
    proxy_for: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server was killed during the revision (a crash trial): the final had been stored,
    the revision was lost, and the restarted server answers the resume with not_found.
    `stream` exited 1 ("the session could not be resumed"), the final in hand; as after a
    revision that fails, the final and its exit status now stand, with a warning."""
    gateway, _ = scripted
    proxy, url = await proxy_for(gateway)
    elsewhere = replace(server_config, data_dir=tmp_path / "restarted-data-dir")
    restarted = await aiohttp_client(create_app(elsewhere, FakeTranscriber()))

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "transcript.final":  # the kill, then the restart without it
            proxy.upstream_port = restarted.port or 0
            proxy.drop()

    wav = write_wav(tmp_path / "meeting.wav", FILE_S)
    result = await live_client.stream_audio(
        url, iter_decode(wav), hop_s=0.5, speed=24.0, on_event=on_event
    )
    revise_gate.release.set()
    assert result.final is not None and result.revised is None
    assert result.failure is None and result.close_code == 4404
    assert stream.report(result, wav) == 0
    err = capsys.readouterr().err
    assert "warning: no transcript.revised: the session could not be resumed" in err
    assert "not_found" in err and "transcript.final stands" in err


def test_a_result_waits_for_a_revision_only_where_one_was_promised() -> None:
    final = {"type": "transcript.final", "duration": 1.0, "segments": []}
    revised = {"type": "transcript.revised", "segments": [], "supersedes": []}
    failed = {"type": "error", "code": "revision_failed", "message": "", "retryable": False}
    promised = {"type": "session.ready", "session_id": "s", "revise": True}
    plain = {**promised, "revise": False}
    assert live_client.StreamResult([promised, final]).revision_pending
    assert not live_client.StreamResult([promised, final, revised]).revision_pending
    assert not live_client.StreamResult([promised, final, failed]).revision_pending
    assert not live_client.StreamResult([plain, final]).revision_pending
    assert not live_client.StreamResult([promised]).revision_pending
    link = live_client.SessionLink(16000)
    assert link.receive(final) and not link.receive(dict(final))  # a resume's replay: once
