"""The bound a graceful shutdown puts on uploads in flight (`serve --upload-drain-s`).

A shutdown lets uploads finish, a body still arriving included, for `upload_drain_s` from the
start of its drain; then `UploadCutoff` cuts those still running: each is answered
`engine_unavailable` (retryable: the client sends it again to the restarted server), over
HTTP as a 503 with `Retry-After: 30` (SHUTDOWN_RETRY_AFTER_S: a restart's time, not 1 s) or,
for a streamed (SSE) upload whose status is out already, as the stream's error event.
aiohttp's own shutdown timeout, a few seconds later (UPLOAD_CUTOFF_GRACE_S), cancels whatever
is left, with no answer: a closed connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from livemeet.audio.constants import SHUTDOWN_RETRY_AFTER_S
from livemeet.config import flag_number
from livemeet.errors import EngineUnavailable

log = logging.getLogger(__name__)


def shutting_down(message: str) -> EngineUnavailable:
    """The refusal of an upload that a shutdown stops: retryable, after SHUTDOWN_RETRY_AFTER_S
    (its Retry-After: the time a restart takes, not the default 1 s)."""
    return EngineUnavailable(message, retry_after_s=SHUTDOWN_RETRY_AFTER_S)


class UploadCutoff:
    """Fires once, `after_s` after `start` (the shutdown's drain began). Uploads run their
    long waits (the body, the decode, the transcript) inside `bound()`."""

    def __init__(self) -> None:
        self.passed = False
        self._timer: asyncio.TimerHandle | None = None
        self._drain_s = 0.0
        # one per block running inside `bound()` now: cancels its task
        self._listeners: set[Callable[[], None]] = set()

    def start(self, after_s: float) -> None:
        """Fire `after_s` (s) from now; idempotent (the first start counts)."""
        if self._timer is None and not self.passed:
            self._drain_s = after_s
            self._timer = asyncio.get_running_loop().call_later(after_s, self._fire)

    def stop(self) -> None:
        """Cancel a pending cutoff (the app's cleanup)."""
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        self.passed = True
        if self._listeners:
            log.warning(
                "shutting down: %d uploads still running after --upload-drain-s %s s are "
                "answered engine_unavailable (retryable)",
                len(self._listeners),
                flag_number(self._drain_s),
            )
        for cancel in list(self._listeners):
            cancel()
        self._listeners.clear()

    def error(self) -> EngineUnavailable:
        """The error an upload stopped by the cutoff gets (returned, not raised): EngineUnavailable,
        retryable after SHUTDOWN_RETRY_AFTER_S (`shutting_down`), naming --upload-drain-s."""
        return shutting_down(
            f"the server shut down before this upload finished (--upload-drain-s "
            f"{flag_number(self._drain_s)} s); send it again"
        )

    @contextlib.asynccontextmanager
    async def bound(self) -> AsyncIterator[None]:
        """Run the block until the cutoff: then its task is cancelled and the block raises
        EngineUnavailable instead (as `asyncio.timeout` raises TimeoutError). Raises it at
        once where the cutoff has passed."""
        if self.passed:
            raise self.error()
        task = asyncio.current_task()
        assert task is not None, "UploadCutoff.bound outside a task"
        fired = False

        def cancel() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        self._listeners.add(cancel)
        try:
            yield
        except asyncio.CancelledError:
            if fired and task.uncancel() == 0:
                raise self.error() from None
            raise  # the client left, or the handler is cancelled
        except Exception as exc:
            if fired:  # the block turned the cancel into an error of its own
                task.uncancel()
                raise self.error() from exc
            raise
        finally:
            self._listeners.discard(cancel)
        if fired:  # the block swallowed the cancel (awaiting a task it cancelled itself)
            task.uncancel()
            raise self.error()
