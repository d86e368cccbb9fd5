"""Uploads in flight before the engine: accepted by the upload handler and not yet handed to
the engine (receiving the body, probing, waiting for a decode slot, decoding, opening the
engine session; from then on the backend counts the upload until it is queued).

The count is what the engine's upload hold waits for (livemeet.engine.scheduler: upload
batching): the gateway is the only place that knows how many uploads are on their way. It is
exported as `livemeet_uploads_incoming` and sent to the engine (`EngineClient`) whenever it
changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

CountListener = Callable[[int], None]


@runtime_checkable
class IncomingUploadsSink(Protocol):
    """A transcriber whose engine holds uploads for incoming ones (EngineClient). Must not
    raise: it is called from the handler's acquire and release."""

    def set_incoming_uploads(self, count: int) -> None: ...


class IncomingUpload:
    """One upload's place in the count; `release()` (idempotent) gives it up early, once the
    upload's engine session is open (the backend counts it from then on)."""

    def __init__(self, counter: IncomingUploadCounter) -> None:
        self._counter = counter
        self._counted = False

    def acquire(self) -> None:
        """Count the upload (once; `IncomingUploadCounter.track` calls it)."""
        assert not self._counted, "an upload is counted once"
        self._counted = True
        self._counter._change(+1)

    def release(self) -> None:
        if self._counted:
            self._counted = False
            self._counter._change(-1)


class IncomingUploadCounter:
    """Counts uploads between the handler's accept and the opening of their engine session.

    `track()` is the only way to change the count: it counts one upload for its `with` block
    and releases it at the block's end whatever way it ends (an error response, a client that
    disconnects, a cancelled task), or earlier through `IncomingUpload.release()`. Every change
    goes to each listener in order (the /metrics gauge, the engine). Event-loop thread only.
    """

    def __init__(self, *listeners: CountListener) -> None:
        self._listeners = listeners
        self._count = 0

    @property
    def count(self) -> int:
        """Uploads counted now (>= 0)."""
        return self._count

    @contextmanager
    def track(self) -> Iterator[IncomingUpload]:
        """Count one upload for the `with` block (see the class docstring)."""
        upload = IncomingUpload(self)
        try:
            upload.acquire()
            yield upload
        finally:
            upload.release()

    def _change(self, delta: int) -> None:
        self._count += delta
        assert self._count >= 0, "an upload was released twice"
        for listener in self._listeners:
            listener(self._count)
