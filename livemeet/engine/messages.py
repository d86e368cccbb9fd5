"""Typed messages that cross the gateway <-> engine process boundary (pickled over queues).

Commands go to the engine worker; `SessionEvent`s and status messages come back. Names follow
DESIGN.md section 3. Audio crosses as float32 numpy arrays at 16 kHz.
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


WorkerMessage = WorkerReady | WorkerFailed | SessionEvent
