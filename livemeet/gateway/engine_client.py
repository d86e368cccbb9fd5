"""`EngineClient`: the gateway-side `Transcriber` over the engine worker (DESIGN.md sections 2-3).

The worker (livemeet/engine/worker.py) runs in a child process started with the multiprocessing
"spawn" context (the gateway never imports CUDA; a forked CUDA context would be unusable), or,
with `in_process=True` (tests only), in a thread with `queue.Queue`s. Commands go out with
`put_nowait` through the command channel (livemeet/engine/channel.py: its thread pickles and
writes in batches, so the event loop never blocks on the pipe, and a worker busy in a step
receives everything sent meanwhile at its next read); events come back through a
multiprocessing queue. A reader thread takes worker messages and hands them to the event loop
with `call_soon_threadsafe`, which routes each `SessionEvent` to its session's buffer.

Audio: `append` copies the caller's samples (it may reuse its buffer) into the command. An
array of at least SHARED_AUDIO_MIN_BYTES bound for a worker process is written to a
shared-memory block instead, on a thread (~55 ms for 143 MB that the event loop does not wait
for), and the command only names the block (`AppendSharedAudio`): an upload (or a live frame of
4 s or more) does not go through the pipe. A session's append, finalize, merge and end hold its
send lock while they send, so a later command waits for the block to be written and the session's
commands keep their order. The client keeps each block in `_blocks` until the worker says it
read it (`SharedAudioConsumed`), the send fails, or the worker is gone; then it unlinks it, once
(livemeet/engine/shared_audio.py says who owns a block when). Where no block can be made (not
Linux, /dev/shm full) the array goes through the pipe. A worker thread is sent arrays. Each
audio command carries its send time, and the worker reports how long they waited (EngineStats).

Backpressure: each session buffers at most `event_buffer` events for its reader. Superseded
events are coalesced first (a partial replaces an unread partial just before it; consecutive
text deltas merge, so their concatenation is unchanged). A client still that slow gets
`Error(queue_full, retryable=True)` in place of its unread events and the session is aborted in
the engine: one slow client never makes the engine or other sessions wait.

The worker's latest `EngineStats` (cumulative step counters, livemeet/engine/worker.py says
how often they come) is kept as `engine_stats` for /metrics.

Incoming uploads (`set_incoming_uploads`, livemeet/gateway/incoming.py): the count goes to the
worker as `IncomingUploads` when it changes, coalesced: on the next loop iteration, or at the
latest right before the next command, since commands share one pipe in order. So an upload's
increment precedes its `OpenSession`, and the decrement the handler makes once that session is
open precedes its next command (the backend counts its open, unqueued uploads itself): an
upload is never counted on both sides, nor queued under a count that still includes it.

If the worker dies, every open session gets `Error(engine_unavailable, retryable=True)` and
`ready` turns False; `open_session` then raises EngineUnavailable until a new worker is ready.
The client starts one after ENGINE_RESTART_DELAY_S, doubling the delay with each attempt of
the last ENGINE_RESTART_WINDOW_S; past ENGINE_MAX_RESTARTS attempts there, or as many failed
starts in a row (a load that hangs to its timeout), it gives up and `failed` turns True
(/healthz fails: the process needs replacing). A worker lost as it starts counts as a failed
start, never as ready. Each worker's reader thread
tags what it posts with the worker's generation, so a message of a worker already replaced
(its exit, a late `SharedAudioConsumed`) is dropped rather than taken for the new one's.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from livemeet.audio.constants import (
    ENGINE_CLOSE_TIMEOUT_S,
    ENGINE_MAX_RESTARTS,
    ENGINE_POLL_S,
    ENGINE_RESTART_DELAY_S,
    ENGINE_RESTART_MAX_DELAY_S,
    ENGINE_RESTART_WINDOW_S,
    ENGINE_START_TIMEOUT_S,
    SAMPLE_RATE,
    SESSION_EVENT_BUFFER,
    SHARED_AUDIO_MIN_BYTES,
    SHM_FALLBACK_WARNING_INTERVAL_S,
)
from livemeet.config import ModelConfig
from livemeet.engine.channel import CommandSender
from livemeet.engine.messages import (
    AbortSession,
    AppendAudio,
    AppendSharedAudio,
    Command,
    EndSession,
    EngineStats,
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
from livemeet.engine.shared_audio import SharedAudioBlock, shared_audio_supported
from livemeet.engine.worker import run_worker, run_worker_on_pipe
from livemeet.errors import (
    BadAudio,
    EngineUnavailable,
    InternalError,
    InvalidRequest,
    LivemeetError,
    ProtocolError,
    QueueFull,
    error_for_code,
)
from livemeet.transcriber import (
    BackendInfo,
    Error,
    Event,
    Samples,
    SegmentPartial,
    SessionOptions,
    TextDelta,
    is_terminal,
)

log = logging.getLogger(__name__)

_JOIN_POLL_S = 0.02  # s between liveness polls while waiting for the worker to exit


class _WorkerExited:
    """Posted by the reader thread when the worker process/thread is gone."""

    def __init__(self, detail: str) -> None:
        self.detail = detail


class WorkerLoadFailed(InternalError):
    """The worker's load of the backend failed on what no check foresaw (its internal_error):
    the worker logged the traceback, so `serve` says it in one line. Other InternalErrors of a
    start (the gateway's own) keep theirs."""


class EngineSession:
    """One session on the engine; implements `TranscriberSession`. Loop-thread only."""

    def __init__(self, client: EngineClient, session_id: str, buffer_limit: int) -> None:
        self._client = client
        self._id = session_id
        self._buffer: deque[Event] = deque()
        self._buffer_limit = buffer_limit
        self._wakeup = asyncio.Event()
        self._ended = False  # end() called
        self._closed_by: Error | None = None  # the terminal Error delivered, if any
        self._finished = False  # terminal event delivered (or aborted)
        self._aborted = False
        self._send_lock = asyncio.Lock()  # held by append/finalize/end while they send

    @property
    def id(self) -> str:
        return self._id

    async def append(self, samples: Samples) -> None:
        """Send [n] float32 16 kHz mono samples. Raises ProtocolError after end()/abort(),
        BadAudio for a non-1-D array, or the session's own error once it failed (also when
        that happens while a large array is being written to shared memory)."""
        async with self._send_lock:
            self._check_open("append")
            arr = np.asarray(samples, dtype=np.float32)
            if arr.ndim != 1:
                raise BadAudio(f"expected 1-D mono samples, got shape {arr.shape}")
            if arr.size:
                await self._client._send_samples(self, arr)

    async def finalize(self) -> None:
        """Send `FinalizeSession` to the engine (TranscriberSession). Raises ProtocolError after
        end()/abort() or once the session finished, the session's own error once it failed, and
        EngineUnavailable while the engine is not ready."""
        async with self._send_lock:
            self._check_open("finalize")
            self._client._send(FinalizeSession(self._id))

    async def merge_speakers(self, speaker: str, into: str) -> None:
        """Send the merge (TranscriberSession); after `end` too, until the final. Nothing is
        sent once the session finished or was aborted; raises the session's own error once
        it failed."""
        async with self._send_lock:
            if self._closed_by is not None:
                raise error_for_code(self._closed_by.code, self._closed_by.message)
            if not (self._aborted or self._finished):
                self._client._send(MergeSpeakers(self._id, speaker, into))

    async def end(self) -> None:
        """Send `EndSession` to the engine: no more audio (TranscriberSession). Raises ProtocolError
        on a second end() or after abort() or the session's finish, the session's own error once it
        failed, and EngineUnavailable while the engine is not ready."""
        async with self._send_lock:
            self._check_open("end")
            self._ended = True
            self._client._send(EndSession(self._id))

    async def abort(self) -> None:
        """Free the session in the engine now; idempotent; `events()` stops."""
        if self._aborted:
            return
        self._aborted = True
        self._buffer.clear()
        self._wakeup.set()
        if not self._finished:
            self._finished = True
            self._client._forget(self._id, abort=True)

    async def events(self) -> AsyncIterator[Event]:
        """This session's events in order; ends after the terminal event or an abort."""
        while True:
            while not self._buffer:
                if self._aborted or (self._finished and not self._buffer):
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            event = self._buffer.popleft()
            yield event
            if is_terminal(event):
                return

    # -- called by the client on the loop thread ------------------------------------------------

    def _deliver(self, event: Event) -> None:
        if self._aborted:
            return
        last = self._buffer[-1] if self._buffer else None
        if isinstance(event, SegmentPartial) and isinstance(last, SegmentPartial):
            self._buffer[-1] = event
        elif isinstance(event, TextDelta) and isinstance(last, TextDelta):
            self._buffer[-1] = TextDelta(last.text + event.text)
        else:
            self._buffer.append(event)
        if is_terminal(event):
            self._finished = True
            self._closed_by = event if isinstance(event, Error) else None
        elif len(self._buffer) > self._buffer_limit:
            self._buffer.clear()
            error = Error(QueueFull.code, "events were not read fast enough", True)
            self._buffer.append(error)
            self._finished = True
            self._closed_by = error
            self._client._forget(self._id, abort=True)
        self._wakeup.set()

    def _check_open(self, what: str) -> None:
        if self._closed_by is not None:
            raise error_for_code(self._closed_by.code, self._closed_by.message)
        if self._aborted or self._finished:
            raise ProtocolError(f"{what} on a closed session")
        if self._ended:
            raise ProtocolError(f"{what} after end")


class EngineClient:
    """The `Transcriber` the gateway uses: a worker process (or thread) behind typed messages.

    `max_sessions`: open sessions before `open_session` raises QueueFull. `start_timeout_s`: s
    to wait for the model to load. `event_buffer`: events buffered per session (module doc).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        in_process: bool = False,
        max_sessions: int = 256,
        start_timeout_s: float = ENGINE_START_TIMEOUT_S,
        event_buffer: int = SESSION_EVENT_BUFFER,
    ) -> None:
        self.config = config
        self.in_process = in_process
        self.max_sessions = max_sessions
        self.start_timeout_s = start_timeout_s
        self.event_buffer = event_buffer
        self._info = BackendInfo(name=config.backend_name, model_id="(not loaded)")
        self._engine_stats: EngineStats | None = None
        self._ready = False
        self._started = False
        self._closing = False
        self._sessions: dict[str, EngineSession] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_future: asyncio.Future[BackendInfo] | None = None
        self._inbox: Any = None
        self._outbox: Any = None
        self._process: BaseProcess | None = None
        self._worker_thread: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._stop_reader = threading.Event()
        self._generation = 0  # of the current worker; its reader tags what it posts with it
        self._restart_task: asyncio.Task[None] | None = None
        self._restart_attempts: deque[float] = deque()  # monotonic s of each attempt
        self._next_start_at: float | None = None  # monotonic s the restart's next launch is due
        self._lost_generation = 0  # the generation of the worker last lost
        self._failed = False
        self.num_restarts = 0  # workers started again after one was lost
        self._incoming_uploads = 0  # the gateway's count (set_incoming_uploads)
        self._incoming_uploads_sent = 0  # the count the worker was last sent (it starts at 0)
        self._incoming_flush_due = False  # a call_soon of _flush_incoming_uploads is pending
        self._blocks: dict[str, SharedAudioBlock] = {}  # sent, not yet consumed, by name

    @property
    def info(self) -> BackendInfo:
        return self._info

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def failed(self) -> bool:
        """True once a lost worker could not be started again (module docstring)."""
        return self._failed

    @property
    def restart_in_s(self) -> float | None:
        """s until the next attempt to start a lost worker (0 while one starts or is about to:
        a model load takes what it takes); None when no restart is under way (ready, closed,
        or given up). What a refusal meanwhile tells a client to wait (Retry-After)."""
        if self._restart_task is None:
            return None
        if self._next_start_at is None:
            return 0.0
        return max(0.0, self._next_start_at - time.monotonic())

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    @property
    def engine_stats(self) -> EngineStats | None:
        """The worker's latest cumulative step counters; None before its first report and for
        backends without a step engine (demo, scripted). Kept after the worker is gone."""
        return self._engine_stats

    async def start(self) -> None:
        """Start the worker and wait until its backend is loaded. Raises the worker's typed
        error (e.g. ConfigError) if loading fails, EngineUnavailable on timeout or if the worker
        exits first. Idempotent."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        try:
            await self._launch()
        except LivemeetError:
            await self.close()
            raise
        self._ready = True

    async def _launch(self) -> None:
        """Start a worker and its reader thread, and wait until its backend is loaded. Raises
        the worker's typed error, or EngineUnavailable on timeout or an early exit; what was
        started is then left for `_stop_worker`."""
        assert self._loop is not None
        self._generation += 1
        self._ready_future = self._loop.create_future()
        self._stop_reader = threading.Event()
        self._incoming_uploads_sent = 0  # a new worker starts from none
        if self.in_process:
            self._inbox, self._outbox = queue.Queue(), queue.Queue()
            self._worker_thread = threading.Thread(
                target=run_worker,
                args=(self.config, self._inbox, self._outbox),
                name="livemeet-engine-worker",
                daemon=True,
            )
            self._worker_thread.start()
        else:
            ctx = multiprocessing.get_context("spawn")
            reader, writer = ctx.Pipe(duplex=False)
            self._outbox = ctx.Queue()
            self._process = ctx.Process(
                target=run_worker_on_pipe,
                args=(self.config, reader, self._outbox, logging.getLogger().getEffectiveLevel()),
                name="livemeet-engine",
                daemon=True,
            )
            self._process.start()
            reader.close()  # the child has its copy; with ours, writes would outlive the child
            self._inbox = CommandSender(writer)
        self._reader = threading.Thread(
            target=self._read,
            args=(self._generation, self._outbox, self._stop_reader),
            name="livemeet-engine-reader",
            daemon=True,
        )
        self._reader.start()
        try:
            self._info = await asyncio.wait_for(self._ready_future, self.start_timeout_s)
        except TimeoutError:
            raise EngineUnavailable(
                f"engine did not become ready within {self.start_timeout_s:.0f} s"
            ) from None

    async def close(self) -> None:
        """Fail open sessions (engine_unavailable), stop the worker (Shutdown, then a kill after
        ENGINE_CLOSE_TIMEOUT_S) and the reader thread, and release the queues. Idempotent."""
        if self._closing or not self._started:
            return
        self._closing = True
        self._ready = False
        self._fail_all("the engine is shutting down")
        if self._restart_task is not None:
            self._restart_task.cancel()
            await asyncio.gather(self._restart_task, return_exceptions=True)
        self._ready = False  # a launch the cancel came too late for (3.11's wait_for) set it
        await self._stop_worker(drain=True)

    async def _stop_worker(self, *, drain: bool = False) -> None:
        """Stop the current worker (Shutdown, then a kill after ENGINE_CLOSE_TIMEOUT_S) and its
        reader thread, release its blocks and queues. `drain`: wait up to
        ENGINE_CLOSE_TIMEOUT_S for commands still in the pipe to be written (a clean exit
        reads them); a lost worker's are dropped at once, never blocking the loop for it.
        Idempotent; a no-op with nothing started (also a launch that failed half-way)."""
        if self._inbox is None and self._process is None and self._worker_thread is None:
            return
        if self._inbox is not None:
            try:
                self._inbox.put_nowait(Shutdown())
            except (ValueError, OSError):
                pass  # queue already closed
        await self._join_worker()
        self._release_all_blocks()  # the worker is gone: what it did not consume, it never will
        self._stop_reader.set()
        await _wait_until(lambda: self._reader is None or not self._reader.is_alive(), 5.0)
        if self._process is not None:
            if self._inbox is not None:
                if self._process.exitcode != 0 or not drain:
                    # The worker died without draining its pipe: the sender may never flush.
                    self._inbox.cancel_join_thread()
                self._inbox.close()
                self._inbox.join_thread(ENGINE_CLOSE_TIMEOUT_S)  # blocks on a live reader only
            if self._outbox is not None:
                self._outbox.close()
            self._process.close()
        # Dropping the queues closes their pipe ends (a queue that was never written to has no
        # feeder thread to close them).
        self._inbox = self._outbox = None
        self._process = self._worker_thread = self._reader = None

    async def _restart(self) -> None:
        """Replace a lost worker (module docstring); gives up as `failed` past
        ENGINE_MAX_RESTARTS attempts in ENGINE_RESTART_WINDOW_S or in a row that failed (a
        load that hangs to its timeout each time spreads them wider than the window)."""
        failed_in_a_row = 0
        try:
            while True:
                await self._stop_worker()
                now = time.monotonic()
                attempts = self._restart_attempts
                while attempts and attempts[0] < now - ENGINE_RESTART_WINDOW_S:
                    attempts.popleft()
                if max(len(attempts), failed_in_a_row) >= ENGINE_MAX_RESTARTS:
                    self._give_up(
                        f"{len(attempts)} restarts within {ENGINE_RESTART_WINDOW_S:.0f} s"
                    )
                    return
                delay_s = min(
                    ENGINE_RESTART_DELAY_S * 2 ** len(attempts), ENGINE_RESTART_MAX_DELAY_S
                )
                attempts.append(now)
                log.warning("engine: starting a new worker in %.0f s", delay_s)
                self._next_start_at = now + delay_s
                await asyncio.sleep(delay_s)
                try:
                    await self._launch()
                except Exception as exc:  # a typed load error, or no process / thread / pipe
                    failed_in_a_row += 1
                    log.error("engine: the new worker failed to start: %s", _describe(exc))
                    continue
                if self._closing:
                    return  # close() came as it started (its cancel was lost); close stops it
                if self._lost_generation == self._generation:
                    failed_in_a_row += 1
                    log.error("engine: the new worker was lost as it started")
                    continue
                self.num_restarts += 1
                self._ready = True
                log.warning("engine: a new worker is ready (restart %d)", self.num_restarts)
                return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # never leave the client neither ready nor failed
            self._give_up(f"the restart itself failed: {_describe(exc)}")
            raise
        finally:
            self._restart_task = None
            self._next_start_at = None

    def _give_up(self, why: str) -> None:
        self._failed = True
        log.error("engine: giving up on restarting the worker (%s); /healthz now fails", why)

    def set_incoming_uploads(self, count: int) -> None:
        """The gateway's uploads accepted and not yet handed to the engine; sent to the worker
        coalesced (module docstring). Never raises: before start or after the worker is gone
        nothing is sent."""
        self._incoming_uploads = count
        loop = self._loop
        if loop is not None and not loop.is_closed() and not self._incoming_flush_due:
            self._incoming_flush_due = True
            loop.call_soon(self._flush_incoming_uploads)

    @property
    def free_slots(self) -> int:
        """Sessions `open_session` would still open (`SlottedTranscriber`)."""
        return max(self.max_sessions - len(self._sessions), 0)

    async def open_session(self, options: SessionOptions) -> EngineSession:
        """Open a session. Raises EngineUnavailable when not ready, QueueFull at
        `max_sessions`, InvalidRequest for a sample rate other than 16 kHz or a restore
        (`SessionOptions.restore`) on an upload. Restored finals are checked by the backend:
        bad ones end the session with an `invalid_request` Error event."""
        if options.sample_rate != SAMPLE_RATE:
            raise InvalidRequest(f"sample_rate must be {SAMPLE_RATE}, not {options.sample_rate}")
        if options.restore is not None and not options.live:
            raise InvalidRequest("restore is for live sessions: an upload has no finals to restore")
        if not self._ready:
            raise self._unavailable("the engine is not ready")
        if not self.free_slots:
            raise QueueFull(
                f"all {self.max_sessions} session slots are in use (--max-sessions); retry later"
            )
        session = EngineSession(self, uuid.uuid4().hex, self.event_buffer)
        self._sessions[session.id] = session
        self._send(OpenSession(session.id, options))
        return session

    # -- internals ------------------------------------------------------------------------------

    def _unavailable(self, message: str) -> EngineUnavailable:
        """The error for a request the engine cannot take now: retry once the restart under
        way may have a worker (`restart_in_s`), where one is."""
        return EngineUnavailable(message, retry_after_s=self.restart_in_s)

    def _send(self, cmd: Command) -> None:
        if not self._ready:
            raise self._unavailable("the engine is not available")
        self._send_incoming_uploads()
        self._inbox.put_nowait(cmd)

    async def _send_samples(self, session: EngineSession, samples: Samples) -> None:
        """Send a copy of `samples` ([n] float32, n > 0) for `session` (whose send lock the
        caller holds): inside `AppendAudio`, or through a shared-memory block (module
        docstring)."""
        block = None
        if (
            self._process is not None
            and samples.nbytes >= SHARED_AUDIO_MIN_BYTES
            and shared_audio_supported()
        ):
            if not self._ready:
                raise self._unavailable("the engine is not available")
            block = await _write_block(samples)
            if block is None:  # no room: the pipe, unless the session closed meanwhile
                session._check_open("append")
        if block is None:
            # the channel's thread pickles it later
            self._send(AppendAudio(session.id, samples.copy(), time.monotonic()))
            return
        self._blocks[block.name] = block
        try:
            session._check_open("append")  # it may have closed while the block was written
            self._send(
                AppendSharedAudio(
                    session.id, block.name, block.num_samples, block.dtype, time.monotonic()
                )
            )
        except BaseException:
            self._release_block(block.name)
            raise

    def _release_block(self, name: str) -> None:
        """Unlink block `name` if it is still the client's to release (a late
        `SharedAudioConsumed` after the worker was found gone finds nothing)."""
        block = self._blocks.pop(name, None)
        if block is not None:
            block.release()

    def _release_all_blocks(self) -> None:
        """Only once the worker process is gone: it can no longer read any of them."""
        for name in list(self._blocks):
            self._release_block(name)

    def _forget(self, session_id: str, *, abort: bool) -> None:
        if self._sessions.pop(session_id, None) is not None and abort and self._ready:
            self._send_incoming_uploads()
            self._inbox.put_nowait(AbortSession(session_id))

    def _flush_incoming_uploads(self) -> None:
        self._incoming_flush_due = False
        if self._ready:
            self._send_incoming_uploads()

    def _send_incoming_uploads(self) -> None:
        """Put the current count in the pipe if the worker has another one (ready only)."""
        if self._incoming_uploads != self._incoming_uploads_sent:
            self._incoming_uploads_sent = self._incoming_uploads
            self._inbox.put_nowait(IncomingUploads(self._incoming_uploads))

    def _worker_alive(self) -> bool:
        if self._process is not None:
            return self._process.exitcode is None
        return self._worker_thread is not None and self._worker_thread.is_alive()

    def _read(self, generation: int, outbox: Any, stop: threading.Event) -> None:
        """Reader thread of worker `generation`: its messages -> the event loop, until stopped
        or the worker dies."""
        assert self._loop is not None
        while not stop.is_set():
            try:
                msg: object = outbox.get(timeout=ENGINE_POLL_S)
            except queue.Empty:
                if self._worker_alive():
                    continue
                msg = _WorkerExited(self._exit_detail())
            except (EOFError, OSError, ValueError) as exc:
                msg = _WorkerExited(f"engine queue broke: {exc!r}")
            try:
                self._loop.call_soon_threadsafe(self._dispatch, msg, generation)
            except RuntimeError:
                return  # the event loop is closed
            if isinstance(msg, _WorkerExited):
                return

    def _exit_detail(self) -> str:
        if self._process is not None:
            return f"engine process exited with code {self._process.exitcode}"
        return "engine worker thread exited"

    def _dispatch(self, msg: object, generation: int) -> None:
        """Loop thread: route one message of worker `generation` (dropped if it was replaced:
        its sessions were failed and its blocks released when it was lost)."""
        if generation != self._generation:
            return
        if isinstance(msg, SessionEvent):
            session = self._sessions.get(msg.session_id)
            if session is not None:
                session._deliver(msg.event)
                if is_terminal(msg.event):
                    self._sessions.pop(msg.session_id, None)
        elif isinstance(msg, SharedAudioConsumed):
            self._release_block(msg.block_name)
        elif isinstance(msg, EngineStats):
            self._engine_stats = msg
        elif isinstance(msg, WorkerReady):
            if self._ready_future is not None and not self._ready_future.done():
                self._ready_future.set_result(msg.info)
        elif isinstance(msg, WorkerFailed):
            self._lost(error_for_code(msg.code, msg.message))
        elif isinstance(msg, _WorkerExited):
            if not self._worker_alive():  # not so when only the queue broke: close() releases
                self._release_all_blocks()
            self._lost(EngineUnavailable(msg.detail))

    def _lost(self, error: LivemeetError) -> None:
        if self._ready_future is not None and not self._ready_future.done():
            if type(error) is InternalError:  # the worker logged its traceback (run_worker)
                error = WorkerLoadFailed(error.message)
            self._ready_future.set_exception(error)
            return
        self._lost_generation = self._generation
        if self._closing or self._restart_task is not None:
            return  # e.g. the exit that follows a WorkerFailed (the restart sees it lost)
        log.error("engine lost: %s", error.message)
        self._ready = False
        # a crash's text (its exception's repr) is the log's: it may name the server's files,
        # devices or memory, and every session's client was sent it (a security review)
        public = (
            "its worker crashed (an internal error: the server's log has its details)"
            if isinstance(error, InternalError)
            else error.message
        )
        self._fail_all(f"the engine failed: {public}")
        assert self._loop is not None
        self._restart_task = self._loop.create_task(self._restart())

    def _fail_all(self, message: str) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            session._deliver(Error(EngineUnavailable.code, message, True))

    async def _join_worker(self) -> None:
        deadline = time.monotonic() + ENGINE_CLOSE_TIMEOUT_S
        await _wait_until(lambda: not self._worker_alive(), deadline - time.monotonic())
        if self._process is not None:
            if self._process.exitcode is None:
                log.warning("engine process ignored Shutdown; killing it")
                self._process.kill()
            self._process.join()  # reaps the killed or exited child at once
        elif self._worker_thread is not None and self._worker_thread.is_alive():
            log.error("engine worker thread did not stop within %.0f s", ENGINE_CLOSE_TIMEOUT_S)


def _describe(exc: BaseException) -> str:
    return exc.message if isinstance(exc, LivemeetError) else repr(exc)


async def _write_block(samples: Samples) -> SharedAudioBlock | None:
    """`samples` in a new shared-memory block, written on a thread of the loop's default
    executor; None (logged) if none can be made (/dev/shm full). If the caller is cancelled,
    the block is released once written."""
    future = asyncio.get_running_loop().run_in_executor(None, SharedAudioBlock, samples)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_release_abandoned_block)
        raise
    except OSError as exc:
        _pipe_fallbacks.note(samples.nbytes, exc)
        return None


class _FallbackWarnings:
    """Warns that appends go through the pipe for lack of shared memory at most once per
    `interval_s`, counting the ones in between (a full /dev/shm fails every append)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.unreported = 0  # fallbacks since the last warning
        self._last_s: float | None = None

    def note(self, num_bytes: int, exc: OSError) -> None:
        self.unreported += 1
        now = self.clock()
        if self._last_s is not None and now - self._last_s < self.interval_s:
            return
        log.warning(
            "no shared memory for %.1f MB of audio (%s): %d append(s) went through the pipe "
            "since the last warning",
            num_bytes / 1e6,
            exc,
            self.unreported,
        )
        self._last_s, self.unreported = now, 0


_pipe_fallbacks = _FallbackWarnings(SHM_FALLBACK_WARNING_INTERVAL_S)


def _release_abandoned_block(future: asyncio.Future[SharedAudioBlock]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().release()


async def _wait_until(predicate: Any, timeout_s: float) -> bool:
    """Poll `predicate()` every _JOIN_POLL_S without blocking the loop; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_JOIN_POLL_S)
    return True
