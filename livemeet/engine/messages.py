"""Typed messages that cross the gateway <-> engine process boundary (pickled over queues).

Commands go to the engine worker; `SessionEvent`s and status messages (`WorkerReady`,
`WorkerFailed`, `EngineStats`) come back. Names follow DESIGN.md section 3. Audio crosses as
float32 numpy arrays at 16 kHz.
"""

from __future__ import annotations

from dataclasses import dataclass

from livemeet.transcriber import BackendInfo, Event, Samples, SessionOptions


@dataclass(frozen=True)
class OpenSession:
    session_id: str
    options: SessionOptions


@dataclass(frozen=True)
class AppendAudio:
    session_id: str
    samples: Samples  # [n] float32, 16 kHz mono


@dataclass(frozen=True)
class FinalizeSession:
    session_id: str


@dataclass(frozen=True)
class EndSession:
    session_id: str


@dataclass(frozen=True)
class AbortSession:
    session_id: str


@dataclass(frozen=True)
class Shutdown:
    """Stop the worker after freeing every session."""


Command = OpenSession | AppendAudio | FinalizeSession | EndSession | AbortSession | Shutdown


@dataclass(frozen=True)
class WorkerReady:
    """The backend loaded; the worker accepts sessions."""

    info: BackendInfo


@dataclass(frozen=True)
class WorkerFailed:
    """The worker could not start or crashed; `code`/`message` as in livemeet.errors."""

    code: str
    message: str


@dataclass(frozen=True)
class SessionEvent:
    session_id: str
    event: Event


@dataclass(frozen=True)
class EngineStats:
    """Cumulative step counters of the engine since its worker started (a restart resets them).

    A step is one forward over a non-empty scheduled batch. It is a prefill step when it holds
    at least one prefill chunk (decode rows may ride along: a mixed step), else a decode step.
    A decode step is a graph step when it replayed the decode graphs (`GraphRunner`); one that
    could not is eager and a fallback when decode graphs exist, even if it then ran on the
    piecewise graphs. A prefill step is a graph step when it replayed the piecewise graphs
    (`PiecewiseRunner`), or the decode graphs (every row of the step had one query token).
    The worker posts these at most every ENGINE_STATS_INTERVAL_S while it steps, and once when
    it goes idle.
    """

    num_decode_graph_steps: int = 0  # steps; decode-only steps replayed on the decode graphs
    num_decode_eager_steps: int = 0  # steps; decode-only steps run without them
    num_prefill_graph_steps: int = 0  # steps; steps with a prefill replayed on CUDA graphs
    num_prefill_eager_steps: int = 0  # steps; steps with a prefill run eagerly
    num_decode_graph_fallbacks: int = 0  # steps; decode eager steps although decode graphs exist
    num_prefill_tokens: int = 0  # tokens; computed by prefill chunks (cache hits excluded)
    num_decode_tokens: int = 0  # tokens; decode rows computed (one new token each)

    @property
    def num_decode_steps(self) -> int:
        return self.num_decode_graph_steps + self.num_decode_eager_steps

    @property
    def num_prefill_steps(self) -> int:
        return self.num_prefill_graph_steps + self.num_prefill_eager_steps

    @property
    def num_steps(self) -> int:
        return self.num_decode_steps + self.num_prefill_steps


WorkerMessage = WorkerReady | WorkerFailed | SessionEvent | EngineStats
