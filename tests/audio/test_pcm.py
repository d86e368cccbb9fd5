"""livemeet.audio.pcm: the live PCM input path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import soxr
from hypothesis import given, settings
from hypothesis import strategies as st

from livemeet.audio.constants import LIVE_RESAMPLE_QUALITY, SAMPLE_RATE
from livemeet.audio.decode import decode_file
from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.errors import BadAudio, InvalidRequest, ProtocolError

RATES = [8_000, 11_025, 16_000, 22_050, 44_100, 48_000, 96_000]


def s16_signal(rate: int, seconds: float, channels: int = 1, seed: int = 0) -> np.ndarray:
    """Interleaved int16 [n, channels]: a chirp plus noise, different on every channel."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    cols = [
        0.4 * np.sin(2 * np.pi * (200 + 300 * c + 800 * t) * t) + 0.05 * rng.standard_normal(t.size)
        for c in range(channels)
    ]
    return (np.stack(cols, axis=1) * 32767).astype(np.int16)


def feed_in_chunks(decoder: PcmStreamDecoder, data: bytes, cuts: list[int]) -> np.ndarray:
    """Feed `data` split at the sample-frame indices `cuts`, then flush; concatenate outputs."""
    out = []
    bounds = [0, *sorted(cuts), len(data) // decoder.frame_bytes]
    for a, b in zip(bounds, bounds[1:], strict=False):
        out.append(decoder.feed(data[a * decoder.frame_bytes : b * decoder.frame_bytes]))
    out.append(decoder.flush())
    return np.concatenate(out)


# ---- validation


@pytest.mark.parametrize("rate", [0, 7_999, 192_001, -16_000, 16_000.0, True, "16000"])
def test_bad_sample_rate(rate: object) -> None:
    with pytest.raises(BadAudio, match="sample_rate"):
        PcmStreamDecoder(rate)  # type: ignore[arg-type]


@pytest.mark.parametrize("channels", [0, 9, -1, 1.0, None])
def test_bad_channels(channels: object) -> None:
    with pytest.raises(BadAudio, match="channels"):
        PcmStreamDecoder(16_000, channels)  # type: ignore[arg-type]


@pytest.mark.parametrize("encoding", ["pcm_f32le", "opus", "PCM_S16LE", ""])
def test_bad_encoding_lists_the_accepted_ones(encoding: str) -> None:
    with pytest.raises(InvalidRequest, match="pcm_s16le"):
        PcmStreamDecoder(16_000, 1, encoding)


@pytest.mark.parametrize("rate", [8_000, 192_000])
def test_rate_limits_are_inclusive(rate: int) -> None:
    assert PcmStreamDecoder(rate, 8).sample_rate == rate


# ---- byte counts


@pytest.mark.parametrize(("channels", "num_bytes"), [(1, 1), (1, 3), (2, 2), (2, 6), (3, 4)])
def test_partial_sample_frame_is_a_protocol_error_and_loses_nothing(
    channels: int, num_bytes: int
) -> None:
    data = s16_signal(48_000, 0.5, channels).tobytes()
    clean, dirty = PcmStreamDecoder(48_000, channels), PcmStreamDecoder(48_000, channels)
    half = len(data) // (2 * clean.frame_bytes) * clean.frame_bytes
    expected = [clean.feed(data[:half]), clean.feed(data[half:]), clean.flush()]
    got = [dirty.feed(data[:half])]
    with pytest.raises(ProtocolError, match=f"{num_bytes} bytes"):
        dirty.feed(data[half : half + num_bytes])
    assert dirty.num_input_frames == half // dirty.frame_bytes
    got += [dirty.feed(data[half:]), dirty.flush()]
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(e, g)
    assert dirty.num_input_frames == clean.num_input_frames == len(data) // clean.frame_bytes


def test_empty_frame_is_fine() -> None:
    decoder = PcmStreamDecoder(44_100)
    assert decoder.feed(b"").shape == (0,)
    assert decoder.num_input_frames == 0


def test_audio_after_flush_is_a_protocol_error() -> None:
    decoder = PcmStreamDecoder(48_000)
    decoder.feed(s16_signal(48_000, 0.1).tobytes())
    decoder.flush()
    assert decoder.flush().shape == (0,)
    with pytest.raises(ProtocolError, match="after the end"):
        decoder.feed(b"\x00\x00")


# ---- samples


def test_16k_mono_is_passed_through_exactly() -> None:
    pcm = s16_signal(16_000, 0.3)
    decoder = PcmStreamDecoder(16_000)
    out = np.concatenate(
        [decoder.feed(bytearray(pcm[:1000].tobytes())), decoder.feed(memoryview(pcm[1000:]))]
    )
    np.testing.assert_array_equal(out, pcm[:, 0].astype(np.float32) / 32768)
    assert decoder.flush().size == 0
    assert decoder.num_output_samples == decoder.num_input_frames == pcm.shape[0]


def test_channels_are_averaged() -> None:
    mono = s16_signal(16_000, 0.2)[:, 0]
    # L = x, R = -x cancels; L = R = x is x
    opposite = np.stack([mono, -mono], axis=1)
    same = np.stack([mono, mono], axis=1)
    assert np.abs(PcmStreamDecoder(16_000, 2).feed(opposite.tobytes())).max() == 0
    np.testing.assert_array_equal(
        PcmStreamDecoder(16_000, 2).feed(same.tobytes()), mono.astype(np.float32) / 32768
    )


def test_little_endian_full_scale() -> None:
    out = PcmStreamDecoder(16_000).feed(b"\x00\x80\xff\x7f\x01\x00")  # -32768, 32767, 1
    np.testing.assert_array_equal(out, np.array([-1.0, 32767 / 32768, 1 / 32768], np.float32))


@settings(max_examples=30, deadline=None)
@given(
    rate=st.sampled_from(RATES),
    channels=st.integers(1, 3),
    cuts=st.lists(st.floats(0.0, 1.0), max_size=25),
)
def test_any_chunking_gives_the_one_shot_output(
    rate: int, channels: int, cuts: list[float]
) -> None:
    pcm = s16_signal(rate, 0.7, channels)
    data = pcm.tobytes()
    one_shot = feed_in_chunks(PcmStreamDecoder(rate, channels), data, [])
    decoder = PcmStreamDecoder(rate, channels)
    chunked = feed_in_chunks(decoder, data, [int(c * pcm.shape[0]) for c in cuts])
    assert chunked.shape == one_shot.shape
    np.testing.assert_allclose(chunked, one_shot, atol=1e-5)
    assert decoder.num_input_frames == pcm.shape[0]
    assert decoder.num_output_samples == chunked.size
    assert abs(chunked.size - pcm.shape[0] * SAMPLE_RATE / rate) <= 1


@pytest.mark.parametrize("rate", [8_000, 44_100, 48_000])
def test_matches_offline_soxr(rate: int) -> None:
    pcm = s16_signal(rate, 1.0)
    x = pcm[:, 0].astype(np.float32) / 32768
    offline = soxr.resample(x, rate, SAMPLE_RATE, quality=LIVE_RESAMPLE_QUALITY)
    live = feed_in_chunks(PcmStreamDecoder(rate), pcm.tobytes(), [123, 4567, 4568, 20_000])
    assert live.shape == offline.shape
    np.testing.assert_allclose(live, offline, atol=1e-4)


def test_real_speech_at_48k_stereo_matches_the_file_decoder(shared_data: Path) -> None:
    """A browser-like stream (48 kHz stereo s16) of real speech comes out as the 16 kHz speech."""
    speech = decode_file(shared_data / "librispeech-lhotse" / "2412-153948-0000.flac")
    up: npt.NDArray[np.float32] = soxr.resample(speech, SAMPLE_RATE, 48_000, quality="VHQ")
    pcm = (np.clip(np.stack([up, up], axis=1), -1, 32767 / 32768) * 32768).astype(np.int16)
    rng = np.random.default_rng(1)
    cuts = list(rng.integers(0, pcm.shape[0], 200))
    out = feed_in_chunks(PcmStreamDecoder(48_000, 2), pcm.tobytes(), cuts)
    assert out.size == speech.size
    assert float(np.corrcoef(out, speech)[0, 1]) > 0.999
