from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from livemeet.audio.constants import ENGINE_IDLE_POLL_S, ENGINE_POLL_S, SAMPLE_RATE
from livemeet.backends import BACKENDS
from livemeet.backends.scripted import DEFAULT_SCRIPT, Script, ScriptedCore
from livemeet.config import ModelConfig
from livemeet.engine.messages import (
    AbortSession,
    AppendAudio,
    AppendSharedAudio,
    EndSession,
    EngineStats,
    IncomingUploads,
    MergeSpeakers,
    OpenSession,
    SessionEvent,
    SharedAudioConsumed,
    Shutdown,
    WorkerFailed,
    WorkerReady,
)
from livemeet.engine.shared_audio import SharedAudioBlock, shared_audio_supported
from livemeet.engine.worker import Worker, run_worker
from livemeet.transcriber import (
    BackendInfo,
    Error,
    Event,
    Samples,
    SessionOptions,
    TranscriptFinal,
)
from tests.engine.fakes import FakeClock, RecordingCore

needs_shm = pytest.mark.skipif(not shared_audio_supported(), reason="no /dev/shm")


class CountingCore(ScriptedCore):
    """Counts how each session is freed: by its terminal event or by abort."""

    def __init__(self, script: Script = DEFAULT_SCRIPT) -> None:
        super().__init__(script)
        self.opened: list[str] = []
        self.freed: Counter[str] = Counter()
        self.closed = 0

    def open(self, session_id, options):  # type: ignore[no-untyped-def]
        super().open(session_id, options)
        self.opened.append(session_id)

    def abort(self, session_id):  # type: ignore[no-untyped-def]
        super().abort(session_id)
        self.freed[session_id] += 1

    def step(self):  # type: ignore[no-untyped-def]
        out = super().step()
        for sid, event in out:
            if isinstance(event, TranscriptFinal | Error):
                self.freed[sid] += 1
        return out

    def close(self) -> None:
        self.closed += 1
        super().close()


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> list[CountingCore]:
    cores: list[CountingCore] = []

    def factory(config: ModelConfig) -> CountingCore:
        script = (
            DEFAULT_SCRIPT
            if config.model is None
            else Script(DEFAULT_SCRIPT.reference, crash_on_step=int(config.model))
        )
        cores.append(CountingCore(script))
        return cores[-1]

    monkeypatch.setitem(BACKENDS, "counting", factory)
    return cores


def run(
    commands: list[object], config: ModelConfig, until: Callable[[list[object]], bool] | None = None
) -> list[object]:
    """Run the worker in a thread over `commands`; once `until(output)` holds, send Shutdown and
    return everything it posted."""
    inbox: queue.Queue[object] = queue.Queue()
    outbox: queue.Queue[object] = queue.Queue()
    for c in commands:
        inbox.put(c)
    thread = threading.Thread(target=run_worker, args=(config, inbox, outbox))
    thread.start()
    out: list[object] = []
    deadline = time.monotonic() + 30
    while until is not None and not until(out) and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            out.append(outbox.get(timeout=0.05))
    inbox.put(Shutdown())
    thread.join(timeout=30)
    assert not thread.is_alive()
    while not outbox.empty():
        out.append(outbox.get())
    return out


def has_terminal(sid: str) -> Callable[[list[object]], bool]:
    def check(out: list[object]) -> bool:
        return any(isinstance(e, TranscriptFinal | Error) for e in events_of(out, sid))

    return check


def audio(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


def events_of(out: list[object], sid: str) -> list[object]:
    return [m.event for m in out if isinstance(m, SessionEvent) and m.session_id == sid]


def test_unknown_backend_reports_config_error() -> None:
    out = run([], ModelConfig(backend="no-such-backend"))
    assert len(out) == 1 and isinstance(out[0], WorkerFailed)
    assert out[0].code == "config_error" and "no-such-backend" in out[0].message


def test_missing_script_reports_config_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = run([], ModelConfig(backend="scripted", model=str(tmp_path / "missing.json")))
    assert isinstance(out[0], WorkerFailed) and out[0].code == "config_error"


def test_round_trip_and_every_session_freed_once(counting: list[CountingCore]) -> None:
    cmds: list[object] = [OpenSession("a", SessionOptions()), OpenSession("b", SessionOptions())]
    cmds += [AppendAudio("a", audio(1.0)) for _ in range(12)]
    cmds += [AppendAudio("b", audio(2.0)), EndSession("a")]
    out = run(cmds, ModelConfig(backend="counting"), until=has_terminal("a"))
    assert isinstance(out[0], WorkerReady) and out[0].info.name == "scripted"
    a = events_of(out, "a")
    assert isinstance(a[-1], TranscriptFinal)
    assert [s.text for s in a[-1].segments] == [s.text for s in DEFAULT_SCRIPT.reference]
    assert not any(isinstance(e, TranscriptFinal) for e in events_of(out, "b"))
    core = counting[0]
    assert core.freed == Counter({"a": 1, "b": 1})  # a by its final, b at shutdown
    assert core.num_sessions == 0 and core.closed == 1


def test_one_session_error_does_not_stop_the_worker(counting: list[CountingCore]) -> None:
    cmds: list[object] = [
        AppendAudio("ghost", audio(1.0)),
        OpenSession("bad", SessionOptions(sample_rate=8000)),
        OpenSession("a", SessionOptions()),
        AppendAudio("a", audio(2.0)),
        EndSession("a"),
        AppendAudio("a", audio(1.0)),  # after end, before its final: a protocol error
    ]
    out = run(cmds, ModelConfig(backend="counting"), until=has_terminal("a"))
    ghost = events_of(out, "ghost")
    assert len(ghost) == 1 and isinstance(ghost[0], Error) and ghost[0].code == "not_found"
    bad = events_of(out, "bad")
    assert len(bad) == 1 and isinstance(bad[0], Error) and bad[0].code == "invalid_request"
    a = events_of(out, "a")
    assert isinstance(a[-1], Error) and a[-1].code == "protocol_error"
    assert sum(isinstance(e, TranscriptFinal | Error) for e in a) == 1  # one terminal event
    assert counting[0].freed == Counter({"a": 1})


def test_a_speaker_merge_reaches_the_core_and_one_for_no_open_session_is_ignored() -> None:
    """`MergeSpeakers`, sent once the session showed S03 (DEFAULT_SCRIPT's turn at 8-11 s),
    relabels what follows: that turn, still open, commits as S01. One for a session the
    worker has no longer open (its final raced the merge) fails nothing: no error event,
    where another command for an unknown session gets one."""
    inbox: queue.Queue[object] = queue.Queue()
    outbox: queue.Queue[object] = queue.Queue()
    inbox.put(OpenSession("a", SessionOptions()))
    for _ in range(9):
        inbox.put(AppendAudio("a", audio(1.0)))
    thread = threading.Thread(
        target=run_worker, args=(ModelConfig(backend="scripted"), inbox, outbox)
    )
    thread.start()
    out: list[object] = []

    def shown(label: str) -> bool:
        return any(
            label in {seg.speaker for seg in getattr(e, "segments", ())}
            for e in events_of(out, "a")
        )

    deadline = time.monotonic() + 30
    while not shown("S03") and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            out.append(outbox.get(timeout=0.05))
    for cmd in (MergeSpeakers("a", "S03", "S01"), MergeSpeakers("ghost", "S03", "S01")):
        inbox.put(cmd)
    for _ in range(3):
        inbox.put(AppendAudio("a", audio(1.0)))
    inbox.put(EndSession("a"))
    while not has_terminal("a")(out) and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            out.append(outbox.get(timeout=0.05))
    inbox.put(Shutdown())
    thread.join(timeout=30)
    final = events_of(out, "a")[-1]
    assert isinstance(final, TranscriptFinal)
    assert [s.speaker for s in final.segments] == ["S01", "S02", "S01", "S01"]
    assert events_of(out, "ghost") == []


def test_abort_frees_once_and_silences_the_session(counting: list[CountingCore]) -> None:
    cmds: list[object] = [
        OpenSession("a", SessionOptions()),
        AppendAudio("a", audio(3.0)),
        AbortSession("a"),
        AbortSession("a"),
    ]
    out = run(cmds, ModelConfig(backend="counting"))
    assert events_of(out, "a") == []  # aborted before any step ran
    assert counting[0].freed == Counter({"a": 1})


def test_step_crash_fails_the_worker_and_frees_sessions(counting: list[CountingCore]) -> None:
    cmds: list[object] = [OpenSession("a", SessionOptions()), AppendAudio("a", audio(3.0))]
    out = run(
        cmds,
        ModelConfig(backend="counting", model="0"),
        until=lambda out: any(isinstance(m, WorkerFailed) for m in out),
    )
    assert isinstance(out[-1], WorkerFailed) and out[-1].code == "internal_error"
    assert counting[0].freed == Counter({"a": 1}) and counting[0].closed == 1


def test_a_failed_command_tells_its_client_the_class_not_the_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The session's error carried the exception's repr (a path under the model's directory,
    a device's memory figures) to the client; the log keeps it whole."""

    class Failing(ScriptedCore):
        def append(self, session_id, samples):  # type: ignore[no-untyped-def]
            raise RuntimeError("cannot map /srv/models/secret/weights.bin: out of memory")

    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(Failing(), outbox)
    worker.apply(OpenSession("a", SessionOptions()))
    worker.apply(AppendAudio("a", audio(1.0)))
    (error,) = [e for e in events_of(list(outbox.queue), "a") if isinstance(e, Error)]
    assert error.code == "internal_error" and "RuntimeError" in error.message
    assert "/srv/models" not in error.message
    assert "/srv/models/secret" in caplog.text  # for the operator


def test_incoming_uploads_reach_the_core_in_command_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count goes to the core in its place among the session commands, so the core sees
    the gateway's count as it was when each later command was sent; a core without upload
    batching (scripted) accepts it without an error event."""
    core = RecordingCore()
    monkeypatch.setitem(BACKENDS, "recording", lambda config: core)
    upload = SessionOptions(live=False)
    cmds: list[object] = [
        IncomingUploads(2),
        OpenSession("a", upload),
        AppendAudio("a", audio(2.0)),
        IncomingUploads(1),
        EndSession("a"),
        OpenSession("b", upload),
        AppendAudio("b", audio(2.0)),
        IncomingUploads(0),
        EndSession("b"),
    ]
    out = run(
        cmds,
        ModelConfig(backend="recording"),
        until=lambda o: has_terminal("a")(o) and has_terminal("b")(o),
    )
    assert core.calls == [
        ("incoming", 2),
        ("open", "a"),
        ("append", "a"),
        ("incoming", 1),
        ("end", "a"),
        ("open", "b"),
        ("append", "b"),
        ("incoming", 0),
        ("end", "b"),
    ]
    assert not any(isinstance(m.event, Error) for m in out if isinstance(m, SessionEvent))
    assert all(isinstance(events_of(out, sid)[-1], TranscriptFinal) for sid in "ab")


# -- audio through shared memory ---------------------------------------------------------------


class SamplesCore(ScriptedCore):
    """Records every append's samples in order."""

    def __init__(self) -> None:
        super().__init__()
        self.appended: list[tuple[str, np.ndarray]] = []

    def append(self, session_id: str, samples: Samples) -> None:
        super().append(session_id, samples)
        self.appended.append((session_id, samples))


def consumed(out: list[object]) -> list[str]:
    return [m.block_name for m in out if isinstance(m, SharedAudioConsumed)]


@needs_shm
def test_shared_audio_is_read_in_order_and_reported_consumed() -> None:
    core = SamplesCore()
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(core, outbox)
    rng = np.random.default_rng(1)
    small, large, tail = (rng.standard_normal(n).astype(np.float32) for n in (800, 40_000, 400))
    block = SharedAudioBlock(large)
    try:
        for cmd in [
            OpenSession("a", SessionOptions(live=False)),
            AppendAudio("a", small),
            AppendSharedAudio("a", block.name, block.num_samples, block.dtype),
            AppendAudio("a", tail),
            EndSession("a"),
        ]:
            worker.apply(cmd)
    finally:
        block.release()  # the gateway's part once the worker reported it consumed
    out = list(outbox.queue)
    assert consumed(out) == [block.name] and events_of(out, "a") == []
    assert [sid for sid, _ in core.appended] == ["a", "a", "a"]
    for (_, got), sent in zip(core.appended, (small, large, tail), strict=True):
        assert got.dtype == np.float32 and np.array_equal(got, sent)
    while core.has_work():
        worker.step()
    assert isinstance(events_of(list(outbox.queue), "a")[-1], TranscriptFinal)


@needs_shm
def test_shared_audio_is_reported_consumed_when_its_command_fails() -> None:
    """Unknown session, audio after end, a block that is gone: each fails its session only,
    and the gateway still hears it may unlink the block."""
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(ScriptedCore(), outbox)
    worker.apply(OpenSession("ended", SessionOptions(live=False)))
    worker.apply(AppendAudio("ended", audio(1.0)))
    worker.apply(EndSession("ended"))
    worker.apply(OpenSession("gone", SessionOptions(live=False)))
    blocks = [SharedAudioBlock(audio(1.0)) for _ in range(2)]
    try:
        worker.apply(AppendSharedAudio("nobody", blocks[0].name, 16_000, "<f4"))
        worker.apply(AppendSharedAudio("ended", blocks[1].name, 16_000, "<f4"))
    finally:
        for block in blocks:
            block.release()
    worker.apply(AppendSharedAudio("gone", blocks[0].name, 16_000, "<f4"))  # released above
    out = list(outbox.queue)
    assert consumed(out) == [blocks[0].name, blocks[1].name, blocks[0].name]
    codes = {
        sid: [e.code for e in events_of(out, sid) if isinstance(e, Error)]
        for sid in ("nobody", "ended", "gone")
    }
    assert codes == {
        "nobody": ["not_found"],
        "ended": ["protocol_error"],
        "gone": ["internal_error"],
    }
    assert worker.open_sessions == set()


# -- engine stats ----------------------------------------------------------------------------


class StatsCore:
    """A BackendCore whose `step()` does one unit of work, moves `clock` by `step_s` and counts
    it as a decode step of 3 rows; `stats()` reports the count (None with `has_stats=False`)."""

    def __init__(self, clock: FakeClock, work: int, step_s: float, has_stats: bool = True):
        self.clock = clock
        self.work = work
        self.step_s = step_s
        self.has_stats = has_stats
        self.num_steps = 0
        self.num_stats_calls = 0
        self.holding = False

    @property
    def info(self) -> BackendInfo:
        return BackendInfo("stats", "fake")

    def load(self) -> None: ...

    def open(self, session_id: str, options: SessionOptions) -> None: ...

    def append(self, session_id: str, samples: Samples) -> None: ...

    def finalize(self, session_id: str) -> None: ...

    def end(self, session_id: str) -> None: ...

    def abort(self, session_id: str) -> None: ...

    def has_work(self) -> bool:
        return self.num_steps < self.work

    def step(self) -> list[tuple[str, Event]]:
        self.num_steps += 1
        self.clock.advance(self.step_s)
        return []

    def set_incoming_uploads(self, count: int) -> None: ...

    def is_holding(self) -> bool:
        return self.holding

    def stats(self) -> EngineStats | None:
        self.num_stats_calls += 1
        if not self.has_stats:
            return None
        return EngineStats(
            num_decode_eager_steps=self.num_steps, num_decode_tokens=3 * self.num_steps
        )

    def close(self) -> None: ...


class IdleShutdownInbox:
    """No commands; `Shutdown` on the `idle_polls`-th blocking get (the worker blocks only
    when its core has no work)."""

    def __init__(self, idle_polls: int = 1) -> None:
        self.idle_polls = idle_polls
        self.timeouts: list[float | None] = []  # of each blocking get

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        if block:
            self.timeouts.append(timeout)
            self.idle_polls -= 1
            if self.idle_polls == 0:
                return Shutdown()
        raise queue.Empty


def serve_with_stats(core: StatsCore, clock: FakeClock, idle_polls: int = 1) -> list[object]:
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(core, outbox, clock=lambda: clock.now_s, stats_interval_s=0.5)
    worker.serve(IdleShutdownInbox(idle_polls))
    return [outbox.get() for _ in range(outbox.qsize())]


def test_stats_posted_at_most_every_interval_while_stepping_and_once_idle() -> None:
    clock = FakeClock()
    core = StatsCore(clock, work=9, step_s=0.2)
    out = serve_with_stats(core, clock)
    assert all(isinstance(m, EngineStats) for m in out)
    # first step at 0.2 s posts; then due at 0.7 -> step 4 (0.8 s); due 1.3 -> step 7 (1.4 s);
    # the last two steps are not due: the idle post carries them, exact
    assert [m.num_steps for m in out if isinstance(m, EngineStats)] == [1, 4, 7, 9]
    assert out[-1] == EngineStats(num_decode_eager_steps=9, num_decode_tokens=27)


def test_stats_not_reposted_while_idle() -> None:
    clock = FakeClock()
    core = StatsCore(clock, work=3, step_s=0.5)  # every step is due: the last post is exact
    out = serve_with_stats(core, clock, idle_polls=5)
    assert [m.num_steps for m in out if isinstance(m, EngineStats)] == [1, 2, 3]
    idle = StatsCore(clock, work=0, step_s=0.5)  # never steps: the zeros once, at start
    assert serve_with_stats(idle, clock, idle_polls=5) == [EngineStats()]


def test_core_without_stats_posts_nothing() -> None:
    clock = FakeClock()
    core = StatsCore(clock, work=4, step_s=0.3, has_stats=False)
    assert serve_with_stats(core, clock) == []
    assert core.num_steps == 4 and core.num_stats_calls >= 2


def test_audio_command_waits_reach_the_stats() -> None:
    """Each audio append's wait since the gateway queued it (`sent_s`, on the monotonic clock
    both processes share) is summed and its longest kept, beside the core's own counters;
    commands without a send time are not counted."""
    clock = FakeClock()
    clock.advance(10.0)
    core = StatsCore(clock, work=0, step_s=0.1)
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(core, outbox, clock=lambda: clock.now_s)
    samples = np.zeros(SAMPLE_RATE // 10, np.float32)
    worker.apply(AppendAudio("s", samples, sent_s=9.75))
    worker.apply(AppendAudio("s", samples, sent_s=9.5))
    worker.apply(AppendAudio("s", samples))  # no send time (an older gateway): not counted
    worker.post_stats(clock.now_s)
    stats = outbox.get_nowait()
    assert isinstance(stats, EngineStats)
    lags = (stats.audio_command_lag_s, stats.audio_command_lag_max_s)
    assert stats.num_audio_commands == 2 and lags == (0.75, 0.5)
    assert stats == EngineStats(
        num_audio_commands=2, audio_command_lag_s=0.75, audio_command_lag_max_s=0.5
    )


def test_audio_waits_reach_the_stats_of_a_worker_that_stays_idle() -> None:
    """Appends too short to make work never step the worker: its idle post carries them."""
    clock = FakeClock()
    clock.advance(5.0)
    core = StatsCore(clock, work=0, step_s=0.1)
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(core, outbox, clock=lambda: clock.now_s)
    worker.serve(IdleShutdownInbox(idle_polls=1))  # the start's post, all zeros
    worker.apply(AppendAudio("s", np.zeros(160, np.float32), sent_s=4.0))
    worker.serve(IdleShutdownInbox(idle_polls=2))
    posts = [outbox.get_nowait() for _ in range(outbox.qsize())]
    waited = EngineStats(num_audio_commands=1, audio_command_lag_s=1.0, audio_command_lag_max_s=1.0)
    assert posts == [EngineStats(), waited]


def test_an_abort_that_frees_kv_reaches_an_idle_workers_stats() -> None:
    """The KV gauges change without a step (an aborted session's retained KV is freed): the
    idle post must follow any command, not only steps and audio appends."""

    class RetainingCore(StatsCore):
        def stats(self) -> EngineStats | None:
            return EngineStats(kv_blocks_total=10, kv_blocks_used=self.used)

        def abort(self, session_id: str) -> None:
            self.used = 0

    clock = FakeClock()
    core = RetainingCore(clock, work=0, step_s=0.1)
    core.used = 4
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(core, outbox, clock=lambda: clock.now_s)
    worker.serve(IdleShutdownInbox(idle_polls=1))
    worker.open_sessions.add("s")
    worker.apply(AbortSession("s"))
    worker.serve(IdleShutdownInbox(idle_polls=2))
    posts = [outbox.get_nowait() for _ in range(outbox.qsize())]
    assert [p.kv_blocks_used for p in posts if isinstance(p, EngineStats)] == [4, 0]


@pytest.mark.parametrize(
    ("holding", "poll_s"), [(False, ENGINE_POLL_S), (True, ENGINE_IDLE_POLL_S)]
)
def test_idle_worker_polls_often_only_while_uploads_are_held(holding: bool, poll_s: float) -> None:
    """An idle worker blocks ENGINE_POLL_S per poll; only a core holding uploads for incoming
    ones makes it poll every ENGINE_IDLE_POLL_S (to notice the hold's wait running out)."""
    clock = FakeClock()
    core = StatsCore(clock, work=0, step_s=0.1)
    core.holding = holding
    inbox = IdleShutdownInbox(idle_polls=3)
    Worker(core, queue.Queue(), clock=lambda: clock.now_s).serve(inbox)
    assert inbox.timeouts == [poll_s] * 3
