"""A device trace of a running server's engine over a chosen window, for benchmarks.

Where the GPU's time goes under a live load (which kernels, how much of the time it idles
between steps) cannot be read from a synthetic engine loop: the steps, their mix and the
host's pace are the server's. With the environment below set, the engine worker records
torch.profiler's CUDA activity (kernels, copies, memsets, runtime calls: no CPU op events, so
the host keeps its pace) from `LIVEMEET_TRACE_AFTER_S` seconds after its first step for
`LIVEMEET_TRACE_S` seconds, then writes the chrome trace to
`LIVEMEET_TRACE_DIR/trace_engine.json.gz` (analysed offline: `python -m
loadtest.trace_summary`). Writing it holds the worker for a few seconds, so put the window
where a stall does not matter (the end of a benchmark point).

Unset (the default), the worker makes no window and torch.profiler is never imported.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from livemeet.errors import ConfigError

log = logging.getLogger(__name__)

TRACE_AFTER_ENV = "LIVEMEET_TRACE_AFTER_S"
TRACE_SECONDS_ENV = "LIVEMEET_TRACE_S"
TRACE_DIR_ENV = "LIVEMEET_TRACE_DIR"
TRACE_FILE = "trace_engine.json.gz"
MAX_TRACE_S = 30.0  # a longer window writes hundreds of MB of JSON


@dataclass(frozen=True)
class TraceConfig:
    """When to record (seconds after the worker's first step, and for how long) and where to
    write the trace."""

    after_s: float
    duration_s: float
    out_dir: Path

    def __post_init__(self) -> None:
        if not self.after_s >= 0:
            raise ConfigError(f"{TRACE_AFTER_ENV} must be >= 0, not {self.after_s}")
        if not 0 < self.duration_s <= MAX_TRACE_S:
            raise ConfigError(f"{TRACE_SECONDS_ENV} must be in (0, {MAX_TRACE_S}]")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> TraceConfig | None:
        """The window the environment asks for; None when `LIVEMEET_TRACE_AFTER_S` is unset.
        Raises ConfigError for values that are not numbers or out of range."""
        after = env.get(TRACE_AFTER_ENV)
        if after is None:
            return None
        try:
            after_s = float(after)
            duration_s = float(env.get(TRACE_SECONDS_ENV, "5"))
        except ValueError:
            raise ConfigError(f"{TRACE_AFTER_ENV} and {TRACE_SECONDS_ENV} take seconds") from None
        return cls(after_s, duration_s, Path(env.get(TRACE_DIR_ENV, ".")))


class Recorder(Protocol):
    """What `TraceWindow` drives: start recording, then stop and write to a path."""

    def start(self) -> None: ...

    def stop_and_write(self, path: Path) -> None: ...


class CudaRecorder:
    """torch.profiler over CUDA activity only, written as a gzipped chrome trace."""

    def __init__(self) -> None:
        self._prof: Any = None

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CUDA])
        self._prof.__enter__()

    def stop_and_write(self, path: Path) -> None:
        """Stop the profiler and write its chrome trace to `path`, gzip-compressed (level 5)."""
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            with raw.open("rb") as src, gzip.open(path, "wb", compresslevel=5) as dst:
                shutil.copyfileobj(src, dst)


class TraceWindow:
    """Records one window of device activity (module docstring). `tick(now_s, stepped)` once
    per worker loop, with monotonic seconds and whether the loop ran a step: the first step
    starts the clock, recording starts at a step `after_s` later and stops `duration_s` after
    it started, at a step or not (so an idle engine still ends it); `close()` ends a window
    still open (shutdown). A failure to record or to write is logged, never raised: a
    benchmark aid must not take the server down."""

    def __init__(
        self, config: TraceConfig, recorder_factory: Callable[[], Recorder] = CudaRecorder
    ) -> None:
        self.config = config
        self._factory = recorder_factory
        self._recorder: Recorder | None = None
        self._t0: float | None = None
        self._started_s = 0.0
        self.done = False

    @property
    def recording(self) -> bool:
        return self._recorder is not None

    def tick(self, now_s: float, stepped: bool = True) -> None:
        if self.done:
            return
        if self._recorder is not None:
            if now_s - self._started_s >= self.config.duration_s:
                self._finish()
            return
        if not stepped:
            return
        if self._t0 is None:
            self._t0 = now_s
        if now_s - self._t0 >= self.config.after_s:
            try:
                recorder = self._factory()
                recorder.start()
            except Exception:
                log.exception("device trace failed to start")
                self.done = True
                return
            self._recorder, self._started_s = recorder, now_s
            log.info("device trace: recording for %.1f s", self.config.duration_s)

    def close(self) -> None:
        """Write a window still recording (the worker is stopping); nothing otherwise."""
        if self._recorder is not None:
            self._finish()

    def _finish(self) -> None:
        recorder, self._recorder = self._recorder, None
        self.done = True
        if recorder is None:
            return
        path = self.config.out_dir / TRACE_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            recorder.stop_and_write(path)
        except Exception:
            log.exception("device trace failed to write")
            return
        log.info("device trace written to %s", path)
