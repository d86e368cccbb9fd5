"""The engine's device trace window (livemeet/engine/trace_window.py): configuration from the
environment, when it records and writes, failures that must not reach the server, and the
worker ticking it after each step."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest

from livemeet.engine.trace_window import (
    TRACE_AFTER_ENV,
    TRACE_DIR_ENV,
    TRACE_FILE,
    TRACE_SECONDS_ENV,
    TraceConfig,
    TraceWindow,
)
from livemeet.engine.worker import Worker
from livemeet.errors import ConfigError
from tests.engine.fakes import FakeClock
from tests.engine.test_worker import IdleShutdownInbox, StatsCore


class FakeRecorder:
    def __init__(self, log: list[str], fail_on: str = "") -> None:
        self.log = log
        self.fail_on = fail_on

    def start(self) -> None:
        self.log.append("start")
        if self.fail_on == "start":
            raise RuntimeError("no CUPTI")

    def stop_and_write(self, path: Path) -> None:
        self.log.append(f"write {path.name}")
        if self.fail_on == "write":
            raise OSError("disk full")
        path.write_text("{}")


def test_config_from_env(tmp_path: Path) -> None:
    assert TraceConfig.from_env({}) is None
    env = {TRACE_AFTER_ENV: "120", TRACE_SECONDS_ENV: "4.5", TRACE_DIR_ENV: str(tmp_path)}
    assert TraceConfig.from_env(env) == TraceConfig(120.0, 4.5, tmp_path)
    assert TraceConfig.from_env({TRACE_AFTER_ENV: "0"}) == TraceConfig(0.0, 5.0, Path("."))
    for bad in ({TRACE_AFTER_ENV: "soon"}, {TRACE_AFTER_ENV: "-1"},
                {TRACE_AFTER_ENV: "1", TRACE_SECONDS_ENV: "0"},
                {TRACE_AFTER_ENV: "1", TRACE_SECONDS_ENV: "600"}):  # fmt: skip
        with pytest.raises(ConfigError):
            TraceConfig.from_env(bad)


def test_records_once_from_after_s_for_duration_s(tmp_path: Path) -> None:
    log: list[str] = []
    window = TraceWindow(TraceConfig(10.0, 2.0, tmp_path / "out"), lambda: FakeRecorder(log))
    window.tick(50.0, stepped=False)  # idle before the first step: the clock has not started
    for now in (100.0, 105.0, 109.9):  # the first step starts the clock
        window.tick(now)
    assert log == [] and not window.recording
    window.tick(110.5, stepped=False)  # due, but recording starts at a step
    assert not window.recording
    window.tick(111.0)
    assert log == ["start"] and window.recording
    window.tick(112.9)
    assert log == ["start"]
    window.tick(113.0, stepped=False)  # two seconds after it started, idle or not
    assert log == ["start", f"write {TRACE_FILE}"] and window.done and not window.recording
    assert (tmp_path / "out" / TRACE_FILE).exists()
    window.tick(200.0)
    window.close()
    assert len(log) == 2  # one window only


def test_close_writes_a_window_still_recording(tmp_path: Path) -> None:
    log: list[str] = []
    window = TraceWindow(TraceConfig(0.0, 5.0, tmp_path), lambda: FakeRecorder(log))
    window.close()  # nothing recorded yet: nothing written
    assert log == [] and not window.done
    window.tick(1.0)
    window.close()
    assert log == ["start", f"write {TRACE_FILE}"] and window.done


@pytest.mark.parametrize("fail_on", ["start", "write"])
def test_a_failing_recorder_is_logged_never_raised(
    tmp_path: Path, fail_on: str, caplog: pytest.LogCaptureFixture
) -> None:
    log: list[str] = []
    window = TraceWindow(TraceConfig(0.0, 1.0, tmp_path), lambda: FakeRecorder(log, fail_on))
    for now in (0.0, 0.5, 1.0, 2.0):
        window.tick(now)
    window.close()
    assert window.done and not window.recording
    assert "device trace failed" in caplog.text
    assert log.count("start") == 1


def test_worker_ticks_the_window_after_each_step(tmp_path: Path) -> None:
    clock = FakeClock()
    core = StatsCore(clock, work=6, step_s=1.0)
    log: list[str] = []
    window = TraceWindow(TraceConfig(2.0, 2.0, tmp_path), lambda: FakeRecorder(log))
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(core, outbox, clock=lambda: clock.now_s, trace=window)
    worker.serve(IdleShutdownInbox())
    # first step ends at 1 s (the clock's start), recording from 3 s, written at 5 s
    assert log == ["start", f"write {TRACE_FILE}"] and window.done


def test_an_idle_worker_ends_the_window_on_time(tmp_path: Path) -> None:
    """Load that stops mid-window: the idle loop's ticks end and write it."""
    clock = FakeClock()
    core = StatsCore(clock, work=3, step_s=1.0)
    log: list[str] = []
    window = TraceWindow(TraceConfig(2.0, 0.5, tmp_path), lambda: FakeRecorder(log))
    inbox = AdvancingIdleInbox(clock, idle_polls=3)
    Worker(core, queue.Queue(), clock=lambda: clock.now_s, trace=window).serve(inbox)
    # steps end at 1, 2 and 3 s: recording from the last; no step follows, the first idle
    # poll (4 s) ends it
    assert core.num_steps == 3
    assert log == ["start", f"write {TRACE_FILE}"] and window.done


class AdvancingIdleInbox(IdleShutdownInbox):
    """An idle inbox whose blocking polls take 1 s of the fake clock."""

    def __init__(self, clock: FakeClock, idle_polls: int) -> None:
        super().__init__(idle_polls)
        self.clock = clock

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        if block:
            self.clock.advance(1.0)
        return super().get(block, timeout)
