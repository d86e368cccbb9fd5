"""How fast a live client may send audio: a token bucket in seconds of audio (no I/O).

The transport asks `AudioPacer.charge` after each message how long to wait before reading the
next one; while it waits it reads nothing, so the client's TCP window fills and its sends
block (backpressure). Nothing is dropped or refused, so a fast client loses no audio; it is
only slowed to `max_speed` x real time once `burst_s` of audio ahead of that is used up.
Constants and why: livemeet/audio/constants.py (LIVE_MAX_SPEED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from livemeet.audio.constants import LIVE_AUDIO_BURST_S, LIVE_MAX_SPEED, LIVE_MIN_MESSAGE_S


@dataclass
class AudioPacer:
    """Audio accepted since `start_s` (s, on the caller's monotonic clock) may run ahead of
    `max_speed` x the time elapsed by at most `burst_s` seconds of audio."""

    start_s: float
    max_speed: float = LIVE_MAX_SPEED
    burst_s: float = LIVE_AUDIO_BURST_S
    min_message_s: float = LIVE_MIN_MESSAGE_S
    charged_s: float = 0.0  # s of audio counted so far (messages at their minimum)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_speed) and self.max_speed > 0):
            raise ValueError(f"max_speed must be a positive number, not {self.max_speed}")
        if not (math.isfinite(self.burst_s) and self.burst_s >= 0):
            raise ValueError(f"burst_s must be >= 0 s, not {self.burst_s}")

    def charge(self, audio_s: float, now_s: float) -> float:
        """Count a message carrying `audio_s` seconds of audio (0 for a text message), received
        at `now_s`; returns the seconds to wait before reading the next message (0: none)."""
        self.charged_s += max(audio_s, self.min_message_s)
        allowed_s = self.burst_s + self.max_speed * max(0.0, now_s - self.start_s)
        return max(0.0, (self.charged_s - allowed_s) / self.max_speed)
