"""How fast a live client may send audio: a token bucket in seconds of audio (no I/O).

The bucket holds at most `burst_s` seconds of audio and refills at `max_speed` seconds of
audio per second; each message takes its audio (at least `min_message_s`). The transport asks
`AudioPacer.charge` after each message how long to wait before reading the next one; while it
waits it reads nothing, so the client's TCP window fills and its sends block (backpressure).
Nothing is dropped or refused, so a fast client loses no audio; it is only slowed to
`max_speed` x real time once its burst is spent. The bucket never holds more than `burst_s`:
credit does not pile up while a client idles or streams at real time, so waiting first buys
no larger flood later. Constants and why: livemeet/audio/constants.py (LIVE_MAX_SPEED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from livemeet.audio.constants import LIVE_AUDIO_BURST_S, LIVE_MAX_SPEED, LIVE_MIN_MESSAGE_S


@dataclass
class AudioPacer:
    """A bucket of `burst_s` seconds of audio, full at `start_s` (s, on the caller's monotonic
    clock), refilled at `max_speed` x the time elapsed."""

    start_s: float
    max_speed: float = LIVE_MAX_SPEED
    burst_s: float = LIVE_AUDIO_BURST_S
    min_message_s: float = LIVE_MIN_MESSAGE_S
    tokens_s: float = field(init=False)  # s of audio the bucket holds (negative: owed)
    _last_s: float = field(init=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_speed) and self.max_speed > 0):
            raise ValueError(f"max_speed must be a positive number, not {self.max_speed}")
        if not (math.isfinite(self.burst_s) and self.burst_s >= 0):
            raise ValueError(f"burst_s must be >= 0 s, not {self.burst_s}")
        self.tokens_s, self._last_s = self.burst_s, self.start_s

    def charge(self, audio_s: float, now_s: float) -> float:
        """Count a message carrying `audio_s` seconds of audio (0 for a text message), received
        at `now_s`; returns the seconds to wait before reading the next message (0: none)."""
        elapsed_s = max(0.0, now_s - self._last_s)
        self._last_s = max(self._last_s, now_s)
        self.tokens_s = min(self.burst_s, self.tokens_s + self.max_speed * elapsed_s)
        self.tokens_s -= max(audio_s, self.min_message_s)
        return max(0.0, -self.tokens_s / self.max_speed)
