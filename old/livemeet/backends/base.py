"""The synchronous backend core that runs inside the engine worker (one thread, owns the model).

The worker (livemeet/engine/worker.py) turns `Command`s into calls on a `BackendCore` and
calls `step()` while `has_work()`; the gateway-side `EngineClient` turns that into the async
`Transcriber` interface. Backends register by name in livemeet/backends/__init__.py.
"""

from __future__ import annotations

from typing import Protocol

from livemeet.engine.messages import EngineStats
from livemeet.transcriber import BackendInfo, Event, Samples, SessionOptions


class BackendCore(Protocol):
    """Contract:
    - `load()` is called once, in the worker, before anything else; it may take minutes.
    - `open/append/finalize/end/abort` only record intent and return quickly; the work happens
      in `step()`. Unknown session ids raise KeyError (the worker reports it as an Error event).
    - `step()` does a bounded amount of work (one decode hop, one engine step) and returns the
      events produced, as (session_id, event) pairs in order. After `end(sid)`, the events of
      `sid` eventually include exactly one `TranscriptFinal` (or one `Error`), after which the
      core forgets `sid`. After `abort(sid)` no event of `sid` is returned again.
    - `stats()` returns the engine's cumulative step counters, or None for a backend without
      a step engine (demo, scripted); it is cheap (no device sync), called between steps.
    - `set_incoming_uploads(count)`: how many uploads the gateway is still receiving or
      decoding (messages.IncomingUploads); a scheduling hint that a backend without upload
      batching ignores. `has_work()` may be False while the backend holds uploads for them;
      `is_holding()` is then True, and the worker blocks on its inbox for at most
      ENGINE_IDLE_POLL_S (otherwise ENGINE_POLL_S), so it notices the hold's wait running out.
    """

    @property
    def info(self) -> BackendInfo: ...

    def load(self) -> None: ...

    def open(self, session_id: str, options: SessionOptions) -> None: ...

    def append(self, session_id: str, samples: Samples) -> None: ...

    def finalize(self, session_id: str) -> None: ...

    def end(self, session_id: str) -> None: ...

    def abort(self, session_id: str) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> list[tuple[str, Event]]: ...

    def stats(self) -> EngineStats | None: ...

    def set_incoming_uploads(self, count: int) -> None: ...

    def is_holding(self) -> bool: ...

    def close(self) -> None: ...
