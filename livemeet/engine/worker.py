"""The engine worker: the loop that owns a `BackendCore` (DESIGN.md section 2).

`run_worker` runs in the engine child process (or, in tests, a thread). It loads the backend,
posts `WorkerReady` (or `WorkerFailed` with a livemeet.errors code), then loops: drain the
inbox (blocking briefly only while the core has no work), apply each command to the core, run
`core.step()` while it has work, and post every event as a `SessionEvent`. `IncomingUploads`
goes to `core.set_incoming_uploads` in its place among the commands, so the core sees the
gateway's count exactly as it was when each later session command was sent.

Stats: the core's cumulative `EngineStats` (None for backends without a step engine: nothing is
posted) go out at most every ENGINE_STATS_INTERVAL_S while the worker steps, and once each time
it goes idle (and once at start), so the gateway's copy is at most one interval stale under
load and exact when idle. The per-step cost is one clock read and a comparison.

Audio: `AppendSharedAudio` names a shared-memory block; the worker copies the samples out before
applying the command and then posts `SharedAudioConsumed`, whatever the command's fate, so the
gateway can unlink the block (livemeet/engine/shared_audio.py). Each audio command's wait since
the gateway queued it (`sent_s`, on the shared monotonic clock) goes into the posted stats
(`EngineStats.audio_command_lag_s`): the inbox is read only between steps, so this is where a
worker that falls behind its inbox shows.

Failures: a command that fails for one session (unknown id, audio after end, ...) becomes an
`Error` event for that session only, and the session is freed. An exception from `step()`
cannot be attributed to a session, so the worker posts `WorkerFailed` and exits; the gateway
then fails every open session with `engine_unavailable`. Every session is freed exactly once:
by its terminal event, by an abort, or at shutdown.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, Protocol

from livemeet.audio.constants import (
    ENGINE_IDLE_POLL_S,
    ENGINE_POLL_S,
    ENGINE_STATS_INTERVAL_S,
    GIL_SWITCH_INTERVAL_S,
)
from livemeet.backends.base import BackendCore
from livemeet.config import LOG_FORMAT, ModelConfig
from livemeet.engine.channel import CommandReceiver
from livemeet.engine.gc_pauses import GcPauses, freeze_startup_heap, thaw_heap
from livemeet.engine.messages import (
    AbortSession,
    AppendAudio,
    AppendSharedAudio,
    Command,
    EndSession,
    FinalizeSession,
    IncomingUploads,
    MergeSpeakers,
    OpenSession,
    SessionEvent,
    SharedAudioConsumed,
    Shutdown,
    WorkerFailed,
    WorkerReady,
)
from livemeet.engine.shared_audio import read_shared_audio
from livemeet.engine.trace_window import TraceConfig, TraceWindow
from livemeet.errors import LivemeetError, unexpected_text
from livemeet.transcriber import Error, Samples, is_terminal

log = logging.getLogger(__name__)

# commands applied between two steps, so steps keep running: ~20 ms of appends. 100 live
# sessions sending 20-ms frames queue ~1,000 commands behind a 200-ms step; fewer per drain
# than arrive per step and the inbox would grow without end.
MAX_COMMANDS_PER_DRAIN = 1024


class Inbox(Protocol):
    """Where the worker's commands come from: a `queue.Queue` (the in-process worker) or
    `channel.CommandReceiver` (the engine process); `get` as `queue.Queue.get`, raising
    `queue.Empty` when nothing came."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any: ...


class Outbox(Protocol):
    """Where the worker's messages go: a `queue.Queue` (the in-process worker) or a
    multiprocessing queue (the engine process)."""

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None: ...


def run_worker(config: ModelConfig, inbox: Inbox, outbox: Outbox) -> None:
    """Serve `config`'s backend until `Shutdown` (or until the parent process dies).

    `inbox` yields `Command`s; `outbox` receives `WorkerMessage`s. Never raises.
    """
    if multiprocessing.parent_process() is not None:  # our own process: the setting is ours
        # the loop hands every event to the queue's feeder thread (GIL_SWITCH_INTERVAL_S)
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        _thread_lock_for_progress_bars()
    try:
        from livemeet.backends import create_backend

        trace_config = TraceConfig.from_env()
        core = create_backend(config)
        core.load()
    except LivemeetError as exc:
        outbox.put(WorkerFailed(exc.code, exc.message))
        return
    except Exception as exc:
        log.exception("backend failed to load")
        outbox.put(WorkerFailed("internal_error", f"backend failed to load: {exc!r}"))
        return
    gc_pauses = GcPauses()
    own_process = multiprocessing.parent_process() is not None  # its heap is ours
    if own_process:
        freeze_startup_heap()  # full collections would walk the model's objects (gc_pauses.py)
    log.info(
        "engine worker ready: %s backend, %s (pid %d)",
        core.info.name,
        core.info.model_id,
        os.getpid(),
    )
    outbox.put(WorkerReady(core.info))
    worker = Worker(
        core,
        outbox,
        trace=TraceWindow(trace_config) if trace_config else None,
        gc_pauses=gc_pauses,
    )
    gc_pauses.install()
    try:
        worker.serve(inbox)
    except Exception as exc:
        log.exception("engine worker crashed")
        outbox.put(WorkerFailed("internal_error", f"engine worker crashed: {exc!r}"))
    finally:
        gc_pauses.remove()
        if worker.trace is not None:
            worker.trace.close()
        try:
            worker.free_all()
            core.close()
        finally:
            if own_process:
                thaw_heap()


def _thread_lock_for_progress_bars() -> None:
    """Give tqdm a thread lock before anything here draws a bar. Its default class-wide lock
    holds a multiprocessing RLock, made on a bar's first use (the demo backend's faster-whisper
    makes a disabled bar per decode, huggingface_hub one per download): a named POSIX
    semaphore, registered with the resource tracker this process shares with the gateway and
    unregistered only by a clean exit. Each worker killed (SIGKILL, an OOM kill) left one, and
    the gateway's exit warned of "leaked semaphore objects". No bar here is shared with another
    process, so a thread lock does."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def run_worker_on_pipe(
    config: ModelConfig, conn: Connection, outbox: Outbox, log_level: int = logging.WARNING
) -> None:
    """`run_worker` reading its commands from `conn`, the reading end of the gateway's command
    channel (livemeet/engine/channel.py): the engine process's entry point. `log_level`: the
    gateway's (a spawned process starts with no logging set up, which showed warnings
    only, whatever `serve --log-level` said)."""
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    # not inherited by any process the engine starts: a copy of the reading end there would
    # keep the gateway's writes blocking after this process is gone
    os.set_inheritable(conn.fileno(), False)
    run_worker(config, CommandReceiver(conn), outbox)


class Worker:
    """Applies commands to `core`, steps it, and posts events and stats (module docstring);
    tracks open sessions. `clock`: monotonic seconds; `stats_interval_s`: s between two stats
    posts while stepping; `trace`: a device trace window ticked every loop
    (livemeet/engine/trace_window.py; benchmarks only; its owner closes it); `gc_pauses`: the
    collector's timings that go into the posted stats (installed by the caller)."""

    def __init__(
        self,
        core: BackendCore,
        outbox: Outbox,
        *,
        clock: Callable[[], float] = time.monotonic,
        stats_interval_s: float = ENGINE_STATS_INTERVAL_S,
        trace: TraceWindow | None = None,
        gc_pauses: GcPauses | None = None,
    ) -> None:
        self.core = core
        self.trace = trace
        self.gc_pauses = gc_pauses
        self.outbox = outbox
        self.clock = clock
        self.stats_interval_s = stats_interval_s
        self.open_sessions: set[str] = set()
        self._stats_due_s = -math.inf  # clock time from which a stepping worker posts stats
        self._stats_stale = True  # the core may have counted something since the last post
        self.num_audio_commands = 0  # audio commands applied with a send time, and their waits
        self.audio_command_lag_s = 0.0
        self.audio_command_lag_max_s = 0.0

    def serve(self, inbox: Inbox) -> None:
        """Loop until `Shutdown` or the parent process is gone. Exceptions from `step()`
        propagate (the caller reports the crash)."""
        parent = multiprocessing.parent_process()
        while True:
            idle = not self.core.has_work()
            if idle and self._stats_stale:
                self.post_stats(self.clock())  # exact: the totals hold until the next step
            # while uploads are held, poll often: the hold's wait may run out between commands
            poll_s = ENGINE_IDLE_POLL_S if idle and self.core.is_holding() else ENGINE_POLL_S
            commands = drain(inbox, block=idle, timeout_s=poll_s)
            for cmd in commands:
                if isinstance(cmd, Shutdown):
                    return
                self.apply(cmd)
            stepped = self.core.has_work()
            if stepped:
                self.step()
                self._stats_stale = True
                now_s = self.clock()
                if now_s >= self._stats_due_s:
                    self.post_stats(now_s)
            if self.trace is not None:  # idle loops too: a window ends on time without steps
                self.trace.tick(self.clock(), stepped)
            if not stepped and not commands and parent is not None and not parent.is_alive():
                log.warning("gateway process is gone; engine worker exits")
                return

    def apply(self, cmd: Command) -> None:
        """Apply one command; a session command's failure becomes that session's `Error`
        event (a failing `IncomingUploads` is the core's bug: it propagates)."""
        if isinstance(cmd, IncomingUploads):
            self.core.set_incoming_uploads(cmd.count)
            return
        sid = getattr(cmd, "session_id", "")
        # a command changes the stats without a step (an abort frees KV, an append's wait is
        # counted): the idle post carries it
        self._stats_stale = True
        try:
            if isinstance(cmd, OpenSession):
                self.core.open(sid, cmd.options)
                self.open_sessions.add(sid)
            elif isinstance(cmd, AppendAudio):
                self._note_lag(cmd.sent_s)
                self.core.append(sid, cmd.samples)
            elif isinstance(cmd, AppendSharedAudio):
                self._note_lag(cmd.sent_s)
                self.core.append(sid, self._read_shared(cmd))
            elif isinstance(cmd, FinalizeSession):
                self.core.finalize(sid)
            elif isinstance(cmd, MergeSpeakers):
                # a merge that raced the session's terminal event has nothing left to relabel
                if sid in self.open_sessions:
                    self.core.merge_speakers(sid, cmd.speaker, cmd.into)
            elif isinstance(cmd, EndSession):
                self.core.end(sid)
            elif isinstance(cmd, AbortSession):
                if sid in self.open_sessions:
                    self.open_sessions.discard(sid)
                    self.core.abort(sid)
            else:
                raise TypeError(f"unknown command {cmd!r}")
        except LivemeetError as exc:
            self._fail(sid, Error(exc.code, exc.message, exc.retryable))
        except KeyError as exc:
            self._fail(sid, Error("not_found", f"unknown session {exc}"))
        except Exception as exc:
            log.exception("command %s failed", type(cmd).__name__)
            self._fail(
                sid, Error("internal_error", f"{type(cmd).__name__} failed: {unexpected_text(exc)}")
            )

    def step(self) -> None:
        """Run one core step and post each event as a `SessionEvent`; events of sessions no longer
        open (failed or aborted) are dropped, and a session's terminal event removes it from
        `open_sessions`. Exceptions from the core propagate (`serve`)."""
        for sid, event in self.core.step():
            if sid not in self.open_sessions:
                continue  # already failed or aborted; nothing more may reach the client
            self.outbox.put(SessionEvent(sid, event))
            if is_terminal(event):
                self.open_sessions.discard(sid)  # the core forgets it with its terminal event

    def post_stats(self, now_s: float) -> None:
        """Post the core's `EngineStats` (when it has any); the next post is due
        `stats_interval_s` after `now_s` (clock seconds)."""
        self._stats_stale = False
        self._stats_due_s = now_s + self.stats_interval_s
        stats = self.core.stats()
        if stats is not None:
            stats = replace(
                stats,
                num_audio_commands=self.num_audio_commands,
                audio_command_lag_s=self.audio_command_lag_s,
                audio_command_lag_max_s=self.audio_command_lag_max_s,
            )
            if self.gc_pauses is not None:
                gcp = self.gc_pauses
                stats = replace(
                    stats,
                    num_gc_collections=gcp.num_collections,
                    num_gc_full_collections=gcp.num_full_collections,
                    gc_pause_s=gcp.pause_s,
                    gc_pause_max_s=gcp.pause_max_s,
                )
            self.outbox.put(stats)

    def _note_lag(self, sent_s: float) -> None:
        """Count an audio command's wait since the gateway queued it (`sent_s` > 0: known)."""
        if sent_s <= 0:
            return
        lag_s = max(0.0, self.clock() - sent_s)
        self.num_audio_commands += 1
        self.audio_command_lag_s += lag_s
        self.audio_command_lag_max_s = max(self.audio_command_lag_max_s, lag_s)

    def free_all(self) -> None:
        """Abort every open session (shutdown or crash); each exactly once."""
        while self.open_sessions:
            sid = self.open_sessions.pop()
            try:
                self.core.abort(sid)
            except Exception:
                log.exception("abort of session %s failed during shutdown", sid)

    def _read_shared(self, cmd: AppendSharedAudio) -> Samples:
        """The block's samples; the gateway hears it may unlink the block on every path."""
        try:
            return read_shared_audio(cmd.block_name, cmd.num_samples, cmd.dtype)
        finally:
            self.outbox.put(SharedAudioConsumed(cmd.block_name))

    def _fail(self, sid: str, error: Error) -> None:
        if sid in self.open_sessions:
            self.open_sessions.discard(sid)
            try:
                self.core.abort(sid)
            except Exception:
                log.exception("abort of failed session %s failed", sid)
        self.outbox.put(SessionEvent(sid, error))


def drain(inbox: Inbox, *, block: bool, timeout_s: float = ENGINE_POLL_S) -> list[Command]:
    """Up to MAX_COMMANDS_PER_DRAIN commands; waits up to `timeout_s` for the first if
    `block`."""
    out: list[Command] = []
    try:
        out.append(inbox.get(block=block, timeout=timeout_s if block else None))
        while len(out) < MAX_COMMANDS_PER_DRAIN:
            out.append(inbox.get(block=False))
    except queue.Empty:
        pass
    return out
