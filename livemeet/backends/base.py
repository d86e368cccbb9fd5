"""The synchronous backend core that runs inside the engine worker (one thread, owns the model).

The worker (livemeet/engine/worker.py) turns `Command`s into calls on a `BackendCore` and
calls `step()` while `has_work()`; the gateway-side `EngineClient` turns that into the async
`Transcriber` interface. Backends register by name in livemeet/backends/__init__.py.
"""

from __future__ import annotations

from typing import Protocol

from livemeet.engine.messages import EngineStats
from livemeet.errors import InvalidRequest
from livemeet.transcriber import BackendInfo, Event, Samples, SessionOptions
from livemeet.transcript.commit import check_restored_finals
from livemeet.transcript.segments import Segment
from livemeet.transcript.speakers import SpeakerMerges


class BackendCore(Protocol):
    """Contract:
    - `load()` is called once, in the worker, before anything else; it may take minutes.
    - `open/append/finalize/end/abort` only record intent and return quickly; the work happens
      in `step()`. Unknown session ids raise NotFound (the worker reports it, as it does a
      KeyError, as a `not_found` Error event).
    - `open` with `SessionOptions.restore` re-opens a live session after a restart: the owner
      appends all its audio again from sample 0, and the core goes on from the restored finals
      (`LiveRestore`: never sent again, new ids after theirs, decoding from their end;
      `LiveSession(restored=...)` does it for a core built on it). It raises InvalidRequest for
      a restore on an upload or for bad restored finals (`restored_finals`); the restore's
      speaker merges (`LiveRestore.merges`) hold on, as `merge_speakers` made them.
    - `merge_speakers(sid, speaker, into)`: the client merged a label into another (the
      gateway checked both; DESIGN 5.6): a live session writes `into` where it would have
      written `speaker` from now on (`LiveSession.merge_speakers`), after `end` too; a session
      past its final (a revision running) may ignore it: the gateway relabels what it sends.
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

    def merge_speakers(self, session_id: str, speaker: str, into: str) -> None: ...

    def end(self, session_id: str) -> None: ...

    def abort(self, session_id: str) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> list[tuple[str, Event]]: ...

    def stats(self) -> EngineStats | None: ...

    def set_incoming_uploads(self, count: int) -> None: ...

    def is_holding(self) -> bool: ...

    def close(self) -> None: ...


def restored_finals(options: SessionOptions) -> tuple[Segment, ...]:
    """The finals a session is opened with: `options.restore`'s, or none for a fresh session.
    Raises InvalidRequest for a restore on an upload (it has no finals before `end`), and for
    restored finals or merges that `LiveRestore` refuses (its own check does not run on
    unpickling)."""
    if options.restore is None:
        return ()
    if not options.live:
        raise InvalidRequest("restore is for live sessions: an upload has no finals to restore")
    try:
        check_restored_finals(options.restore.finals)
        SpeakerMerges(options.restore.merges)
    except ValueError as exc:
        raise InvalidRequest(f"bad restored finals: {exc}") from exc
    return options.restore.finals


def restored_merges(options: SessionOptions) -> tuple[tuple[str, str], ...]:
    """The speaker merges a session is opened with (`LiveRestore.merges`; checked by
    `restored_finals`), or none."""
    return options.restore.merges if options.restore is not None else ()
