"""The command channel: gateway -> engine worker commands over one OS pipe, in batches.

Why not a `multiprocessing.Queue`: its feeder thread writes every command as a message of its
own, and the worker reads its inbox only between engine steps, so what crosses per step is
bounded by what the pipe holds (64 KiB on Linux: ~10 live frames of 100 ms in float32). At 100
live sessions (1,000 frames a second) the feeder sat blocked on a full pipe 85% of a 240-s run
on an H200 (py-spy, session 16) and audio reached the engine later and later: partial latency
grew from 0.7 s to 80 s over a 7-minute meeting.

Here `CommandSender.put_nowait` only appends to a list; the sender's thread pickles everything
put since its last write and writes it as one message. While the worker is busy in a step and
the pipe is full, commands pile up on the gateway's side and cross as one batch at the worker's
next read, however many they are, so the pipe's size no longer bounds the rate.
`CommandReceiver` is the worker's end (`livemeet.engine.worker.Inbox`): `get` hands out the
commands of every batch in order. Order is kept end to end: one writer thread, one reader.

Lifetime: the gateway closes its copy of the reading end once the worker process has started
(`Connection.close`), so a write after the worker died fails (BrokenPipeError) instead of
blocking; the sender then drops what it holds (the worker can no longer read it). The
receiver turns the end of the pipe (the gateway closed or died) into `Shutdown`.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
from collections import deque
from multiprocessing.connection import Connection

from livemeet.engine.messages import Command, Shutdown

log = logging.getLogger(__name__)


class CommandSender:
    """The gateway's end over `conn` (the writing end of a one-way pipe). `put_nowait` never
    blocks and never pickles on the caller's thread (the event loop's)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._pending: list[Command] = []
        self._cond = threading.Condition()
        self._closed = False  # no more puts; the thread writes what is pending and exits
        self._cancelled = False  # the reader is gone: drop what is pending
        self.num_batches = 0  # messages written (each a list of commands)
        self._thread = threading.Thread(
            target=self._run, name="livemeet-command-sender", daemon=True
        )
        self._thread.start()

    def put_nowait(self, cmd: Command) -> None:
        """Queue `cmd` for the worker. Raises ValueError once closed."""
        with self._cond:
            if self._closed:
                raise ValueError("the command channel is closed")
            self._pending.append(cmd)
            self._cond.notify()

    def close(self) -> None:
        """No more puts; the thread writes what is pending, then closes the pipe. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def cancel_join_thread(self) -> None:
        """The worker died without reading: drop what is pending rather than write it."""
        with self._cond:
            self._cancelled = True
            self._pending.clear()
            self._cond.notify()

    def join_thread(self, timeout_s: float | None = None) -> None:
        """Wait for the thread to finish (after `close`)."""
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closed:
                        self._cond.wait()
                    batch, self._pending = self._pending, []
                    if not batch and self._closed:
                        return
                if self._cancelled:
                    continue
                try:
                    self._conn.send_bytes(_dumps(batch))
                    self.num_batches += 1
                except (OSError, ValueError) as exc:  # the worker is gone (reported elsewhere)
                    log.debug("engine command pipe closed: %r", exc)
                    self.cancel_join_thread()
        finally:
            self._conn.close()


def _dumps(batch: list[Command]) -> bytes:
    """`batch` pickled; a command that cannot be (a bug) is logged and left out: only it is
    lost, not the rest of its batch or the channel."""
    try:
        return pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
    except Exception:
        good = []
        for cmd in batch:
            try:
                pickle.dumps(cmd, pickle.HIGHEST_PROTOCOL)
                good.append(cmd)
            except Exception:
                log.exception("dropped an engine command that cannot be pickled: %r", cmd)
        return pickle.dumps(good, pickle.HIGHEST_PROTOCOL)


class CommandReceiver:
    """The worker's end over `conn` (the reading end): the `Inbox` protocol. A read takes
    batches while more are in the pipe, until it holds `fill_limit` commands: a sender that
    keeps writing cannot hold the worker in its inbox."""

    def __init__(self, conn: Connection, fill_limit: int = 1024) -> None:
        self._conn = conn
        self._fill_limit = fill_limit
        self._ready: deque[Command] = deque()

    def get(self, block: bool = True, timeout: float | None = None) -> Command:
        """The next command; waits up to `timeout` s (None: forever) for one if `block`, and
        raises queue.Empty when none came. Once the gateway's end is closed: `Shutdown`."""
        if not self._ready:
            self._fill(timeout if block else 0.0)
        if not self._ready:
            raise queue.Empty
        return self._ready.popleft()

    def _fill(self, timeout_s: float | None) -> None:
        """Read every batch already in the pipe (waiting up to `timeout_s` for the first)."""
        try:
            ready = self._conn.poll(timeout_s)
            while ready:
                self._ready.extend(pickle.loads(self._conn.recv_bytes()))
                ready = len(self._ready) < self._fill_limit and self._conn.poll(0)
        except (EOFError, OSError):
            self._ready.append(Shutdown())
