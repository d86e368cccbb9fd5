"""SIGTERM as Ctrl-C while a command starts: as PID 1 (a container's) a signal without a
handler is ignored, so a `docker stop` or a pod's deletion in the first second of `serve`
(its imports, its checks) was lost, and the server went on to serve until the supervisor's
SIGKILL (the container trial)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

INTERRUPTED_STATUS = 130  # 128 + SIGINT: a command stopped before its work, as after Ctrl-C


@contextlib.contextmanager
def stop_signal_interrupts() -> Iterator[None]:
    """Inside, SIGTERM raises KeyboardInterrupt, as SIGINT does; the handler before is put
    back on the way out. Off the main thread (where signals cannot be handled) it does
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:  # None: a handler not set from Python, the default here
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # not an Exception: no `except Exception` on the way swallows it
