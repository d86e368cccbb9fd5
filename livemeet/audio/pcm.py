"""Live-stream input: raw PCM frames from the WebSocket -> float32 mono 16 kHz samples.

Sans-I/O: `PcmStreamDecoder` owns no socket and no task; the live handler feeds it each binary
frame and appends what comes back. The wire format is DESIGN.md section 6: little-endian signed
16-bit PCM, channels interleaved, at the rate the client declared in `start`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr

from livemeet.audio.constants import (
    LIVE_RESAMPLE_QUALITY,
    MAX_PCM_CHANNELS,
    MAX_PCM_SAMPLE_RATE,
    MIN_PCM_SAMPLE_RATE,
    PCM_S16LE_BYTES,
    SAMPLE_RATE,
)
from livemeet.errors import BadAudio, InvalidRequest, ProtocolError

Samples = npt.NDArray[np.float32]  # [n] mono float32 in [-1, 1] at 16 kHz

PCM_ENCODINGS = ("pcm_s16le",)  # the encodings a live client may declare
_S16_FULL_SCALE = 32_768.0  # int16 -> [-1, 1)


class PcmStreamDecoder:
    """Decodes one live stream's PCM frames incrementally, resampling to 16 kHz mono.

    `sample_rate` (Hz) must lie in [MIN_PCM_SAMPLE_RATE, MAX_PCM_SAMPLE_RATE] and `channels` in
    [1, MAX_PCM_CHANNELS], else BadAudio; `encoding` must be one of `PCM_ENCODINGS`, else
    InvalidRequest. Channels are averaged; rates other than 16 kHz go through a soxr
    `ResampleStream` (`LIVE_RESAMPLE_QUALITY`), whose output lags its input by the filter delay
    until `flush()` drains it.

    Counters: `num_input_frames` counts sample frames (one sample per channel) accepted at the
    client's rate, the unit of `audio.ack` offsets (DESIGN.md section 5.9); `num_output_samples`
    counts 16 kHz samples returned so far.
    """

    def __init__(self, sample_rate: int, channels: int = 1, encoding: str = "pcm_s16le") -> None:
        if encoding not in PCM_ENCODINGS:
            raise InvalidRequest(
                f"unsupported PCM encoding {encoding!r}; accepted: {', '.join(PCM_ENCODINGS)}"
            )
        if not _is_int(sample_rate) or not (
            MIN_PCM_SAMPLE_RATE <= sample_rate <= MAX_PCM_SAMPLE_RATE
        ):
            raise BadAudio(
                f"sample_rate must be an integer in [{MIN_PCM_SAMPLE_RATE}, "
                f"{MAX_PCM_SAMPLE_RATE}] Hz, got {sample_rate!r}"
            )
        if not _is_int(channels) or not (1 <= channels <= MAX_PCM_CHANNELS):
            raise BadAudio(
                f"channels must be an integer in [1, {MAX_PCM_CHANNELS}], got {channels!r}"
            )
        self.sample_rate = sample_rate
        self.channels = channels
        self.encoding = encoding
        self.frame_bytes = PCM_S16LE_BYTES * channels  # bytes per sample frame
        self.num_input_frames = 0
        self.num_output_samples = 0
        self._flushed = False
        self._resampler: soxr.ResampleStream | None = None
        if sample_rate != SAMPLE_RATE:
            self._resampler = soxr.ResampleStream(
                sample_rate, SAMPLE_RATE, 1, dtype="float32", quality=LIVE_RESAMPLE_QUALITY
            )

    def feed(self, frame: bytes | bytearray | memoryview) -> Samples:
        """Decode one binary frame; returns the new 16 kHz mono samples, shape [m] (may be 0).

        Raises ProtocolError, with nothing consumed, when the byte count is not a whole number of
        sample frames (`frame_bytes`) or when the stream was already flushed.
        """
        if self._flushed:
            raise ProtocolError("audio received after the end of the stream")
        num_bytes = memoryview(frame).nbytes
        if num_bytes % self.frame_bytes:
            raise ProtocolError(
                f"binary frame of {num_bytes} bytes is not a whole number of {self.channels}-"
                f"channel s16le sample frames ({self.frame_bytes} bytes each)"
            )
        pcm = np.frombuffer(frame, dtype="<i2").reshape(-1, self.channels)  # [n, channels]
        mono = pcm.mean(axis=1, dtype=np.float32) / np.float32(_S16_FULL_SCALE)
        out = mono if self._resampler is None else self._resampler.resample_chunk(mono)
        self.num_input_frames += pcm.shape[0]
        self.num_output_samples += out.shape[0]
        return np.asarray(out, dtype=np.float32)

    def flush(self) -> Samples:
        """End of stream: drain the resampler's delay line, shape [m]. Later calls return [0]."""
        if self._flushed or self._resampler is None:
            self._flushed = True
            return np.zeros(0, np.float32)
        self._flushed = True
        out = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
        self.num_output_samples += out.shape[0]
        return np.asarray(out, dtype=np.float32)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_finite(samples: np.ndarray) -> None:
    """BadAudio when float `samples` hold a NaN or an infinity (what the encoder cannot take)."""
    if not np.isfinite(samples).all():
        raise BadAudio("audio contains NaN or infinite samples")
