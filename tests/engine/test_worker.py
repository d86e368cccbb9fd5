from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends import BACKENDS
from livemeet.backends.scripted import DEFAULT_SCRIPT, Script, ScriptedCore
from livemeet.config import ModelConfig
from livemeet.engine.messages import (
    AbortSession,
    AppendAudio,
    EndSession,
    OpenSession,
    SessionEvent,
    Shutdown,
    WorkerFailed,
    WorkerReady,
)
from livemeet.engine.worker import run_worker
from livemeet.transcriber import Error, SessionOptions, TranscriptFinal


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
