"""Drive a `BackendCore` synchronously, as the worker does, and collect its events."""

from __future__ import annotations

import numpy as np

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends.base import BackendCore
from livemeet.transcriber import Event, SessionOptions


def run_to_idle(core: BackendCore, out: list[tuple[str, Event]]) -> None:
    while core.has_work():
        out.extend(core.step())


def stream(
    core: BackendCore,
    audio: np.ndarray,
    *,
    chunk_s: float = 0.5,
    session_id: str = "s1",
    options: SessionOptions | None = None,
    finalize_at_s: float | None = None,
) -> list[Event]:
    """Open a session, append `audio` in `chunk_s` chunks (stepping after each), end it, and
    return that session's events in order."""
    core.open(session_id, options or SessionOptions())
    out: list[tuple[str, Event]] = []
    chunk = round(chunk_s * SAMPLE_RATE)
    for i in range(0, len(audio), chunk):
        core.append(session_id, audio[i : i + chunk])
        if finalize_at_s is not None and i < finalize_at_s * SAMPLE_RATE <= i + chunk:
            core.finalize(session_id)
        run_to_idle(core, out)
    core.end(session_id)
    run_to_idle(core, out)
    return [e for sid, e in out if sid == session_id]
