from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import threading
import time
from multiprocessing import resource_tracker
from pathlib import Path

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends import BACKENDS
from livemeet.backends.scripted import DEFAULT_SCRIPT, Script, ScriptedCore
from livemeet.config import ModelConfig
from livemeet.errors import (
    BadAudio,
    ConfigError,
    EngineUnavailable,
    InvalidRequest,
    ProtocolError,
    QueueFull,
)
from livemeet.gateway.engine_client import EngineClient, EngineSession
from livemeet.transcriber import (
    Error,
    Event,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TextDelta,
    TranscriptFinal,
)
from livemeet.transcript.segments import FinishReason, Segment

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
    assert all(isinstance(e, TextDelta) for e in events[:-1])


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
    client = EngineClient(
        ModelConfig(backend="scripted", model=script_file(tmp_path, script)), in_process=True
    )
    await client.start()
    try:
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
    finally:
        await client.close()
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
async def test_child_process_round_trip_crash_and_clean_close() -> None:
    resource_tracker.ensure_running()  # multiprocessing's own singleton, not ours to close
    fds_before = open_fds()
    client = EngineClient(SCRIPTED, start_timeout_s=60)
    await client.start()
    try:
        assert client.ready and len(multiprocessing.active_children()) == 1
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
