"""livemeet.audio.decode against real speech: lossless files, compressed encodings, bad input."""

from __future__ import annotations

import io
import os
import re
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import av
import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from livemeet.audio import decode
from livemeet.audio.constants import SAMPLE_RATE
from livemeet.audio.decode import AudioInfo, decode_file, iter_decode, probe
from livemeet.errors import BadAudio, TooLong
from tests.audio.conftest import (
    SPEECH_FILE,
    EncodedClip,
    encode_with_pyav,
    id3v2_tag,
    syncsafe,
    with_flac_total_samples,
)

F32 = npt.NDArray[np.float32]
MAX_LAG = 160  # samples (10 ms) of codec delay tolerated when aligning with the source


def best_lag_correlation(reference: F32, decoded: F32) -> tuple[int, float]:
    """(lag, Pearson r) of `decoded` shifted by the lag in [-MAX_LAG, MAX_LAG] that best matches."""
    n = min(reference.size, decoded.size) - 2 * MAX_LAG
    best = (0, -1.0)
    for lag in range(-MAX_LAG, MAX_LAG + 1, 4):
        a = reference[MAX_LAG : MAX_LAG + n]
        b = decoded[MAX_LAG + lag : MAX_LAG + lag + n]
        r = float(np.corrcoef(a, b)[0, 1])
        best = max(best, (lag, r), key=lambda t: t[1])
    return best


def swresample_mono_16k(path: Path) -> F32:
    """An independent oracle: FFmpeg's decoder and resampler (libswresample), then the channel
    mean (swresample's own stereo->mono mix is (L+R)/sqrt(2), not the mean)."""
    resampler = av.AudioResampler(format="fltp", rate=SAMPLE_RATE)
    chunks = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            chunks += [f.to_ndarray() for f in resampler.resample(frame)]
        chunks += [f.to_ndarray() for f in resampler.resample(None)]
    return np.asarray(np.concatenate(chunks, axis=1).mean(axis=0), dtype=np.float32)


# ---- lossless files from the shared data


def test_s16_wav_at_16k_is_returned_sample_exact(shared_data: Path) -> None:
    path = shared_data / "ami-lhotse" / "ES2011a.Headset-0-40s-46s.wav"
    pcm, rate = sf.read(path, dtype="int16")
    assert rate == SAMPLE_RATE
    out = decode_file(path)
    assert out.dtype == np.float32 and out.ndim == 1
    np.testing.assert_array_equal(out, pcm.astype(np.float32) / 32768)
    assert probe(path) == AudioInfo(6.0, 16_000, 1, "wav/pcm_16")


def test_mono_16k_files_are_read_whole_with_the_block_paths_samples(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mono 16 kHz files skip the block path (one read into an array of the declared length),
    with the same samples and the same truncation errors as the block path; others keep it."""
    wav = shared_data / "ami-lhotse" / "ES2011a.Headset-0-40s-46s.wav"
    float_wav = shared_data / "ami-pyannote-debug" / "dev00.wav"
    flac = tmp_path / "mono16k.flac"
    sf.write(flac, sf.read(wav, dtype="int16")[0], SAMPLE_RATE, subtype="PCM_16")
    cut_flac = tmp_path / "cut.flac"
    cut_flac.write_bytes(flac.read_bytes()[: flac.stat().st_size // 2])
    whole: list[int] = []
    real_whole = decode._read_whole

    def spy(f: sf.SoundFile, declared: int) -> F32:
        whole.append(declared)
        return real_whole(f, declared)

    monkeypatch.setattr(decode, "_read_whole", spy)
    fast = {p: decode_file(p) for p in (wav, float_wav, flac)}
    with pytest.raises(BadAudio, match="truncated") as fast_cut:
        decode_file(cut_flac)
    assert len(whole) == 2  # the WAVs: FFmpeg decodes FLAC (its header's length is a minimum)
    whole.clear()
    decode_file(shared_data / "jfk" / "jfk.flac")  # 44.1 kHz stereo: resampled in blocks
    assert whole == []
    for path, samples in fast.items():  # iter_decode reads every file in blocks
        np.testing.assert_array_equal(samples, np.concatenate(list(iter_decode(path))))
    with pytest.raises(BadAudio, match="truncated") as block_cut:
        list(iter_decode(cut_flac))
    assert str(fast_cut.value) == str(block_cut.value)
    assert whole == []


def test_float32_wav(shared_data: Path) -> None:
    path = shared_data / "ami-pyannote-debug" / "dev00.wav"
    info = probe(path)
    assert (info.sample_rate, info.channels, info.codec) == (16_000, 1, "wav/float")
    assert info.duration_s == pytest.approx(30.0, abs=1e-3)
    raw, _ = sf.read(path, dtype="float32")
    np.testing.assert_array_equal(decode_file(path), np.clip(raw, -1, 1))


@pytest.mark.parametrize(
    ("codec", "max_error"), [("pcm_f32le", 1e-3), ("pcm_mulaw", 0.05), ("adpcm_ms", 0.1)]
)
def test_an_extensible_w64_of_another_codec_than_integer_pcm_decodes_right(
    tmp_path: Path, codec: str, max_error: float
) -> None:
    """FFmpeg writes a W64 of 96 kHz (or of more than 2 channels) as WAVE_FORMAT_EXTENSIBLE,
    and libsndfile read one whose SubFormat is not integer PCM as integer PCM of its bit depth:
    float as PCM_32, mu-law and MS ADPCM as PCM_U8, noise without an error (a breadth probe of
    codecs). FFmpeg decodes it now: the tone it holds, from a file and from its bytes."""
    t = np.arange(int(0.3 * SAMPLE_RATE)) / SAMPLE_RATE
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    path = tmp_path / f"{codec}.w64"
    encode_with_pyav(path, tone[None, :], "w64", codec, 96_000)
    data = path.read_bytes()
    assert struct.unpack_from("<H", data, 64)[0] == 0xFFFE  # the fmt chunk's format tag
    for source in (path, data):
        out = decode_file(source)
        # ADPCM fills its last block: up to 2,048 samples at 96 kHz after the tone
        assert tone.size <= out.size <= tone.size + 2048 * SAMPLE_RATE // 96_000
        assert np.abs(out[: tone.size] - tone)[100:-100].max() < max_error  # past the edges


def test_24bit_stereo_44k_flac_matches_ffmpeg_resampler(shared_data: Path) -> None:
    path = shared_data / "jfk" / "jfk.flac"
    assert probe(path) == AudioInfo(11.0, 44_100, 2, "flac/pcm_24")
    out = decode_file(path)
    assert out.size == pytest.approx(11.0 * SAMPLE_RATE, abs=2)
    oracle = swresample_mono_16k(path)
    lag, r = best_lag_correlation(oracle, out)
    assert abs(lag) <= 8 and r > 0.999
    # a mean, not a sum, of the two channels
    assert np.sqrt(np.mean(out**2)) == pytest.approx(np.sqrt(np.mean(oracle**2)), rel=0.01)


def test_flac_16k_mono(shared_data: Path, speech: F32) -> None:
    out = decode_file(shared_data / "librispeech-lhotse" / "2412-153948-0000.flac")
    np.testing.assert_array_equal(out, speech)


# ---- compressed encodings made at test time


@pytest.mark.parametrize(
    "name",
    ["speech.mp3", "stereo44k.mp3", "speech.opus", "speech.m4a", "speech.webm", "live.webm"],
)
def test_compressed_formats_decode_to_the_source(
    name: str, encoded_clips: dict[str, EncodedClip], speech: F32
) -> None:
    clip = encoded_clips[name]
    info = probe(clip.path)
    assert (info.sample_rate, info.channels) == (clip.sample_rate, clip.channels)
    source_s = speech.size / SAMPLE_RATE
    assert info.duration_s == pytest.approx(source_s, abs=0.07)
    out = decode_file(clip.path)
    assert out.dtype == np.float32 and out.ndim == 1
    # to the sample: each records its encoder's delay and padding (AAC kept its padding, 52 ms)
    assert out.size == speech.size
    assert np.abs(out).max() <= 1.0
    lag, r = best_lag_correlation(speech, out)
    assert abs(lag) <= 40, f"{name}: misaligned by {lag} samples"
    assert r > 0.95, f"{name}: correlation {r:.3f}"
    gain = np.sqrt(np.mean(out**2) / np.mean(speech**2))
    assert gain == pytest.approx(clip.gain, rel=0.05)


def test_mp3_in_a_wav_decodes_whole(encoded_clips: dict[str, EncodedClip], speech: F32) -> None:
    """A WAV holding MP3 (format tag 0x55, as FFmpeg's wav muxer and some recorders write it)
    goes to FFmpeg, as an .mp3 does: libsndfile claimed it, took its length from a bitrate
    estimate and refused the intact file as truncated."""
    path = encoded_clips["mp3_in.wav"].path
    for source in (path, path.read_bytes()):
        out = decode_file(source)
        # no LAME tag in a WAV to say how much to trim: encoder delay and padding stay (~50 ms)
        assert 0 <= out.size - speech.size <= 0.1 * SAMPLE_RATE
        oracle = swresample_mono_16k(path)
        lag, r = best_lag_correlation(oracle, out)
        assert abs(lag) <= 8 and r > 0.999
        assert np.sqrt(np.mean(out**2)) == pytest.approx(np.sqrt(np.mean(oracle**2)), rel=0.01)
    info = probe(path)
    assert (info.sample_rate, info.channels, info.codec) == (44_100, 2, "mp3float")


# ---- bytes in memory (small uploads)

# the lossless files of the tests above, by a name saying what they are
SHARED_FILES = {
    "pcm16.wav": Path("ami-lhotse") / "ES2011a.Headset-0-40s-46s.wav",
    "float.wav": Path("ami-pyannote-debug") / "dev00.wav",
    "stereo44k.flac": Path("jfk") / "jfk.flac",
    "speech.flac": SPEECH_FILE,
}
ENCODED = ["speech.mp3", "stereo44k.mp3", "speech.opus", "speech.m4a", "speech.webm", "live.webm"]


def fixture_path(name: str, shared_data: Path, encoded_clips: dict[str, EncodedClip]) -> Path:
    return shared_data / SHARED_FILES[name] if name in SHARED_FILES else encoded_clips[name].path


@pytest.mark.parametrize("name", [*SHARED_FILES, *ENCODED])
def test_bytes_decode_like_the_file(
    name: str, shared_data: Path, encoded_clips: dict[str, EncodedClip]
) -> None:
    path = fixture_path(name, shared_data, encoded_clips)
    data = path.read_bytes()
    assert probe(data) == probe(path)
    np.testing.assert_array_equal(decode_file(data), decode_file(path), strict=True)


@pytest.mark.parametrize(
    ("name", "cut", "max_audio_s", "error"),
    [
        ("stereo44k.flac", 0.5, 60.0, "truncated or corrupt"),  # libsndfile loses sync
        ("speech.webm", 0.5, 60.0, "truncated: the container declares"),
        ("speech.m4a", 0.5, 60.0, "FFmpeg"),  # cut before its moov atom
        ("speech.flac", 0.01, 60.0, "not an audio file"),  # too short for either library
        ("stereo44k.flac", 1.0, 10.0, "declares 11.0 s"),  # TooLong
        ("speech.webm", 1.0, 1.0, "the audio declares"),
        # MediaRecorder's WebM declares no duration: its packets' is not "declared" (a trial)
        ("live.webm", 1.0, 1.0, "the audio lasts, by its packets,"),
        ("garbage", 1.0, 60.0, "not an audio file"),
    ],
)
def test_bad_bytes_raise_like_the_file(
    name: str,
    cut: float,
    max_audio_s: float,
    error: str,
    shared_data: Path,
    encoded_clips: dict[str, EncodedClip],
    tmp_path: Path,
) -> None:
    if name == "garbage":
        data = b"\x00\x01not audio at all\xff" * 200
    else:
        whole = fixture_path(name, shared_data, encoded_clips).read_bytes()
        data = whole[: int(len(whole) * cut)]
    path = tmp_path / f"cut.{name}"
    path.write_bytes(data)
    with pytest.raises((BadAudio, TooLong), match=error) as from_file:
        decode_file(path, max_audio_s=max_audio_s)
    with pytest.raises((BadAudio, TooLong)) as from_bytes:
        decode_file(data, max_audio_s=max_audio_s)
    assert (type(from_bytes.value), from_bytes.value.message) == (
        type(from_file.value),
        from_file.value.message,
    )


# ---- decoding in chunks (`livemeet stream` of hours of audio)


@pytest.mark.parametrize("name", [*SHARED_FILES, *ENCODED])
def test_iter_decode_yields_decode_files_samples(
    name: str, shared_data: Path, encoded_clips: dict[str, EncodedClip]
) -> None:
    """Bit for bit the same samples, for each route: a mono 16 kHz WAV (read whole by
    decode_file, in blocks here), float samples, 44.1 kHz stereo FLAC (soxr in blocks), and
    FFmpeg's codecs at 16, 44.1 and 48 kHz."""
    path = fixture_path(name, shared_data, encoded_clips)
    chunks = list(iter_decode(path))
    assert len(chunks) > 1 and all(c.size > 0 and c.dtype == np.float32 for c in chunks)
    np.testing.assert_array_equal(np.concatenate(chunks), decode_file(path))


def write_in_two(
    write_fd: int,
    data: bytes,
    first_read: threading.Event,
    rest_written: threading.Event,
    at: int | None = None,
) -> None:
    """A pipe's writer: `data` up to `at` (a third of it by default), then (once
    `first_read`, at most 5 s) the rest."""
    at = len(data) // 3 if at is None else at
    with open(write_fd, "wb") as pipe:
        pipe.write(data[:at])
        pipe.flush()
        first_read.wait(5.0)
        rest_written.set()
        pipe.write(data[at:])


def decoded_as_written(data: bytes, at: int | None = None) -> F32:
    """`iter_decode_stream`'s samples of `data` written into a pipe in two parts (split as
    `write_in_two` splits), asserting that the first chunk came before the second part was
    written: nothing is read ahead."""
    read_fd, write_fd = os.pipe()
    first_read, rest_written = threading.Event(), threading.Event()
    writer = threading.Thread(
        target=write_in_two, args=(write_fd, data, first_read, rest_written, at)
    )
    writer.start()
    with open(read_fd, "rb", buffering=0) as pipe:
        chunks = decode.iter_decode_stream(pipe)
        got = [next(chunks)]
        assert not rest_written.is_set()
        first_read.set()
        got += list(chunks)
    writer.join()
    return np.concatenate(got)


def test_iter_decode_stream_reads_a_pipe_as_its_writer_fills_it(shared_data: Path) -> None:
    """`livemeet stream -` had no way to read a pipe (every decode probed a path or bytes
    first, then opened it again). From a pipe: the first chunk before the writer has written
    the rest, and the samples decode_file gives for the same bytes (a 16 kHz WAV; JFK's
    44.1 kHz stereo FLAC, resampled in blocks)."""
    wav = io.BytesIO()  # 20 s: FFmpeg reads ~100 KB of a WAV (3.3 s here) before its first frame
    t = np.arange(20 * SAMPLE_RATE) / SAMPLE_RATE
    sf.write(
        wav,
        (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
        SAMPLE_RATE,
        "PCM_16",
        format="WAV",
    )
    for data in (wav.getvalue(), (shared_data / "jfk" / "jfk.flac").read_bytes()):
        np.testing.assert_array_equal(decoded_as_written(data), decode_file(data))


def test_an_mp4_streamed_with_its_index_at_the_end_says_to_save_it_to_a_file(
    encoded_clips: dict[str, EncodedClip],
) -> None:
    """`cat talk.m4a | livemeet stream -` said only "cannot decode the audio: FFmpeg: Invalid
    data found when processing input" (a new user's trial): an MP4 whose index (moov) follows
    its audio cannot be read without seeking, and the message now says so and what to do."""
    data = encoded_clips["speech.m4a"].path.read_bytes()
    assert data.find(b"moov") > data.find(b"mdat")  # PyAV's muxer writes the index last
    read_fd, write_fd = os.pipe()
    writer = threading.Thread(target=lambda: _write_all(write_fd, data))
    writer.start()
    with open(read_fd, "rb", buffering=0) as pipe, pytest.raises(BadAudio) as refused:
        list(decode.iter_decode_stream(pipe))
    writer.join()
    assert "index (moov atom) after its audio" in refused.value.message
    assert "save it to a file" in refused.value.message
    assert decode_file(data).size > 0  # the same bytes read whole, with seeking


@pytest.mark.parametrize(
    ("fmt", "codec", "channels"), [("caf", "flac", 1), ("caf", "alac", 1), ("wv", "wavpack", 6)]
)
def test_a_file_ffmpeg_cannot_read_from_a_pipe_says_to_save_it_to_a_file(
    tmp_path: Path, fmt: str, codec: str, channels: int
) -> None:
    """A CAF of compressed audio or a WavPack of 6 channels piped to `livemeet stream -` was
    "not an audio file, a damaged or truncated one, ..." (a breadth probe of codecs): FFmpeg
    cannot open them without seeking. The message now says so and what to do; the same bytes
    decode."""
    data = _tone_file(tmp_path, fmt, codec, channels)
    with pytest.raises(BadAudio) as refused:
        piped(data)
    assert "from a pipe FFmpeg cannot read every format" in refused.value.message
    assert "save it to a file" in refused.value.message
    assert decode_file(data).size > 0


def test_a_wavpack_from_a_pipe_decodes_as_its_bytes(tmp_path: Path) -> None:
    """A WavPack piped to `livemeet stream -` was BadAudio ("cannot decode the audio: FFmpeg:
    Invalid data found ...") after all its samples (a breadth probe of codecs): FFmpeg read
    the APE tag at its end, which it passes only where it can seek, as a block. Its samples
    now end it, as its bytes do; a WavPack cut short is still BadAudio."""
    data = _tone_file(tmp_path, "wv", "wavpack", channels=2)
    assert data.rfind(b"APETAGEX") > 0  # FFmpeg's muxer ends it with an APE tag
    whole = decode_file(data)
    np.testing.assert_array_equal(piped(data), whole)
    with pytest.raises(BadAudio):
        piped(data[: len(data) // 2])


def _tone_file(tmp_path: Path, fmt: str, codec: str, channels: int = 1) -> bytes:
    """0.3 s of a 440 Hz tone at 44.1 kHz encoded by PyAV as `codec` in `fmt`."""
    t = np.arange(int(0.3 * SAMPLE_RATE)) / SAMPLE_RATE
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    path = tmp_path / f"tone.{fmt}"
    encode_with_pyav(path, np.stack([tone] * channels), fmt, codec, 44_100)
    return path.read_bytes()


def _write_all(fd: int, data: bytes) -> None:
    """Write `data` to the pipe `fd` and close it; a reader that gave up (EPIPE) ends it."""
    try:
        with open(fd, "wb", buffering=0) as pipe:
            pipe.write(data)
    except BrokenPipeError:
        pass


def test_iter_decode_stream_errors_come_from_the_iterator() -> None:
    for data, needle in (
        (b"not audio at all" * 100, "not an audio file"),
        (b"", "empty|not an audio file"),
    ):
        with pytest.raises(BadAudio, match=needle):
            list(decode.iter_decode_stream(io.BytesIO(data)))
    wav = io.BytesIO()
    sf.write(wav, np.zeros(2 * SAMPLE_RATE, np.float32), SAMPLE_RATE, "PCM_16", format="WAV")
    with pytest.raises(TooLong, match="decodes to"):
        list(decode.iter_decode_stream(io.BytesIO(wav.getvalue()), max_audio_s=1.0))


def test_iter_decode_holds_a_block_not_the_file(tmp_path: Path) -> None:
    """`stream` decoded a whole file first: ~230 MB an hour of audio. Chunk by chunk, the
    memory held is a decode block's, whatever the length: 2 minutes of 44.1 kHz stereo
    (7.7 MB at 16 kHz) decode with under 2 MB allocated at any time."""
    path = tmp_path / "two-minutes.flac"
    sf.write(path, np.zeros((2 * 60 * 44_100, 2), np.int16), 44_100)
    tracemalloc.start()
    try:
        num_samples = sum(chunk.size for chunk in iter_decode(path))
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert num_samples == pytest.approx(2 * 60 * SAMPLE_RATE, abs=2)
    assert peak_bytes < 2_000_000, peak_bytes


def test_iter_decode_reads_the_file_lazily(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is decoded before a chunk is asked for, and a chunk takes one block."""
    blocks = 0
    real_push = decode._Resampler.push

    def counting_push(self: object, mono: object, rate: int) -> F32:
        nonlocal blocks
        blocks += 1
        return real_push(self, mono, rate)  # type: ignore[arg-type]

    monkeypatch.setattr(decode._Resampler, "push", counting_push)
    chunks = iter_decode(shared_data / "ami-pyannote-debug" / "dev00.wav")  # 30 s
    assert blocks == 0
    next(chunks)
    assert blocks == 1
    chunks.close()


def test_iter_decode_raises_up_front_what_the_probe_finds(
    shared_data: Path, tmp_path: Path
) -> None:
    with pytest.raises(BadAudio, match="cannot read"):
        iter_decode(tmp_path / "missing.wav")
    with pytest.raises(TooLong, match="declares"):
        iter_decode(shared_data / SHARED_FILES["float.wav"], max_audio_s=10.0)


def test_iter_decode_yields_the_intact_prefix_before_a_decode_error(
    shared_data: Path, tmp_path: Path
) -> None:
    """A file found damaged mid-way: what decoded before the damage comes first (a stream
    has sent it already), then decode_file's error."""
    path = tmp_path / "nan.wav"
    x = np.zeros(200_000, np.float32)
    x[150_000] = np.nan
    sf.write(path, x, 16_000, subtype="FLOAT")
    chunks = iter_decode(path)
    assert next(chunks).size == decode.DECODE_BLOCK_FRAMES
    with pytest.raises(BadAudio, match="non-finite"):
        list(chunks)
    data = (shared_data / "jfk" / "jfk.flac").read_bytes()
    cut = tmp_path / "half.flac"
    cut.write_bytes(data[: len(data) // 2])
    got: list[F32] = []
    with pytest.raises(BadAudio, match="truncated or corrupt"):
        got.extend(iter_decode(cut))
    assert got and sum(c.size for c in got) < 11 * SAMPLE_RATE
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.int16), 16_000, subtype="PCM_16")
    with pytest.raises(BadAudio, match="no samples"):
        next(iter_decode(empty))


def test_empty_bytes() -> None:
    for fn in (probe, decode_file):
        with pytest.raises(BadAudio, match="empty"):
            fn(b"")


# ---- limits


def test_too_long_is_refused_before_decoding(
    shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_decode(*_: object) -> None:
        raise AssertionError("decoded although the header was over the limit")

    monkeypatch.setattr(decode, "_soundfile_blocks", must_not_decode)
    monkeypatch.setattr(decode, "_ffmpeg_blocks", must_not_decode)
    with pytest.raises(TooLong, match="11.0 s"):
        decode_file(shared_data / "jfk" / "jfk.flac", max_audio_s=10.0)
    with pytest.raises(TooLong, match="6.0 s"):
        decode_file(shared_data / SHARED_FILES["pcm16.wav"], max_audio_s=5.0)


@pytest.mark.parametrize("name", ["speech.webm", "live.webm"])
def test_a_lying_container_is_stopped_while_decoding(
    name: str, encoded_clips: dict[str, EncodedClip], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = encoded_clips[name].path
    real = decode._probe(path)
    lie = real._replace(info=AudioInfo(1.0, 48_000, 1, "opus"))
    monkeypatch.setattr(decode, "_probe", lambda _path: lie)
    with pytest.raises(TooLong, match="decodes to"):
        decode_file(path, max_audio_s=5.0)


# libsndfile's blocks, FFmpeg's frames (FLAC's and Opus')
@pytest.mark.parametrize("kind", ["wav", "flac", "webm"])
def test_a_cancelled_decode_stops_at_its_next_block(
    tmp_path: Path, encoded_clips: dict[str, EncodedClip], kind: str
) -> None:
    """A client that leaves sets `cancel`: a 90-minute upload stopped decoding only at its end,
    holding ~1 GB meanwhile (a trial)."""
    if kind in ("wav", "flac"):
        path = tmp_path / f"long.{kind}"
        sf.write(path, np.zeros(10 * 60 * 8_000, np.float32), 8_000)  # 10 min at 8 kHz
    else:
        path = encoded_clips["speech.webm"].path
    whole = decode_file(path).size
    cancel = threading.Event()
    pushes = 0
    real_push = decode._Resampler.push

    def push_then_cancel(self: object, mono: object, rate: int) -> F32:
        nonlocal pushes
        pushes += 1
        if pushes == 3:
            cancel.set()
        return real_push(self, mono, rate)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode._Resampler, "push", push_then_cancel)
        with pytest.raises(decode.DecodeCancelled):
            decode_file(path, cancel=cancel)
    assert pushes == 3  # no block is taken once `cancel` is set
    assert decode_file(path, cancel=threading.Event()).size == whole


def test_limit_is_inclusive(shared_data: Path) -> None:
    assert decode_file(shared_data / "jfk" / "jfk.flac", max_audio_s=11.0).size > 0


def test_the_length_shown_is_over_the_limit_it_breaks() -> None:
    """30.02 s against 30 s said "30.0 s, longer than the 30 s limit"."""
    with pytest.raises(TooLong, match=r"decodes to 30\.1 s, longer than the 30 s limit"):
        decode.check_length(30.02, 30.0, "decodes to")
    decode.check_length(30.0, 30.0, "decodes to")


# ---- bad input


def test_non_audio_bytes(tmp_path: Path) -> None:
    path = tmp_path / "upload.bin"
    path.write_bytes(b"\x00\x01not audio at all\xff" * 200)
    for fn in (probe, decode_file):
        with pytest.raises(BadAudio, match="not an audio file"):
            fn(path)


def test_a_text_file_is_not_audio(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"  # FFmpeg's tty demuxer would open .txt as a video stream
    path.write_text("minutes of the meeting\n" * 50)
    with pytest.raises(BadAudio, match="not an audio file"):
        decode_file(path)


def test_a_video_without_audio_has_no_audio_stream(
    encoded_clips: dict[str, EncodedClip], tmp_path: Path
) -> None:
    path = tmp_path / "silent_film.mp4"
    with av.open(str(path), "w") as out:
        video = out.add_stream("mpeg4", rate=10)
        video.width, video.height = 32, 32
        for _ in range(5):
            frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
            for packet in video.encode(frame):
                out.mux(packet)
        for packet in video.encode(None):
            out.mux(packet)
    with pytest.raises(BadAudio, match="no audio stream"):
        decode_file(path)


def _tone_flac(path: Path) -> None:
    t = np.arange(SAMPLE_RATE, dtype=np.float32) / SAMPLE_RATE
    sf.write(path, 0.3 * np.sin(2 * np.pi * 220 * t), SAMPLE_RATE, subtype="PCM_16")


@pytest.mark.parametrize("spilled", [False, True])
def test_a_concat_playlist_cannot_read_the_servers_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spilled: bool
) -> None:
    """FFmpeg's concat demuxer would open the files a playlist names, relative to the cwd
    (bytes) or to the upload's spill file, and decode them as the upload."""
    (tmp_path / "private").mkdir()
    _tone_flac(tmp_path / "private" / "meeting.flac")
    assert decode_file(tmp_path / "private" / "meeting.flac").size == SAMPLE_RATE
    monkeypatch.chdir(tmp_path)
    playlist = b"ffconcat version 1.0\nfile private/meeting.flac\n"
    source: Path | bytes = playlist
    if spilled:
        source = tmp_path / "upload"
        source.write_bytes(playlist)
    for fn in (probe, decode_file):
        with pytest.raises(BadAudio, match="not an audio file"):
            fn(source)


def test_an_sdp_description_is_not_audio() -> None:
    """FFmpeg's sdp demuxer would listen for RTP on the ports it names, holding the decode
    until its ~20 s read timeout."""
    sdp = (
        b"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=x\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        b"m=audio 5004 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    start = time.monotonic()
    with pytest.raises(BadAudio, match="not an audio file"):
        decode_file(sdp)
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize("format_tag", [0x1234, 0xFFFE])
def test_a_codec_without_a_decoder_is_bad_audio(
    shared_data: Path, tmp_path: Path, format_tag: int
) -> None:
    """A WAV whose format tag (or WAVE_FORMAT_EXTENSIBLE GUID) no decoder knows: FFmpeg
    demuxes the stream but has no codec context for it."""
    wav = tmp_path / "plain.wav"
    sf.write(wav, sf.read(shared_data / "jfk" / "jfk.flac")[0][:16_000], SAMPLE_RATE)
    data = bytearray(wav.read_bytes())
    fmt = data.index(b"fmt ")
    if format_tag == 0xFFFE:  # extensible, with a SubFormat GUID nobody registered
        data = bytearray(_extensible_with_unknown_guid(bytes(data), fmt))
    else:
        data[fmt + 8 : fmt + 10] = struct.pack("<H", format_tag)
    path = tmp_path / "odd.wav"
    path.write_bytes(bytes(data))
    for source in (path, bytes(data)):
        with pytest.raises(BadAudio, match="cannot be decoded"):
            decode_file(source)


def _extensible_with_unknown_guid(wav: bytes, fmt: int) -> bytes:
    """`wav` (PCM, a 16-byte fmt chunk at `fmt`) rewritten as WAVE_FORMAT_EXTENSIBLE."""
    channels, rate, byte_rate, align, bits = struct.unpack_from("<HIIHH", wav, fmt + 10)
    guid = bytes(range(16))
    body = struct.pack("<HHIIHHHHI", 0xFFFE, channels, rate, byte_rate, align, bits, 22, bits, 4)
    chunk = b"fmt " + struct.pack("<I", len(body) + 16) + body + guid
    rest = wav[fmt + 8 + 16 :]
    riff = wav[12:fmt] + chunk + rest
    return b"RIFF" + struct.pack("<I", 4 + len(riff)) + b"WAVE" + riff


def flac_bytes(
    seconds: float, rate: int = SAMPLE_RATE, channels: int = 1, subtype: str = "PCM_16"
) -> bytes:
    """A FLAC of noise, `seconds` long (different noise for each length)."""
    rng = np.random.default_rng(int(seconds * 1000) + rate + channels)
    buf = io.BytesIO()
    noise = rng.uniform(-0.5, 0.5, (int(seconds * rate), channels)).astype(np.float32)
    sf.write(buf, noise, rate, format="FLAC", subtype=subtype)
    return buf.getvalue()


def decode_every_way(data: bytes, tmp_path: Path, **kw: float) -> F32:
    """decode_file's samples for `data` and for its file, checked equal to iter_decode's."""
    path = tmp_path / "upload.flac"
    path.write_bytes(data)
    out = decode_file(data, **kw)
    np.testing.assert_array_equal(decode_file(path, **kw), out, strict=True)
    np.testing.assert_array_equal(np.concatenate(list(iter_decode(path, **kw))), out)
    return out


def test_flac_files_joined_with_cat_decode_whole(tmp_path: Path) -> None:
    """libsndfile stopped at the first file's STREAMINFO count: the second file's audio was
    dropped without an error (found by a checker). Lossless: the two files' samples exactly."""
    first, second = flac_bytes(1.0), flac_bytes(1.5)
    out = decode_every_way(first + second, tmp_path)
    expected = np.concatenate([decode_file(first), decode_file(second)])
    np.testing.assert_array_equal(out, expected)
    assert probe(first + second).duration_s == 1.0  # the first header's: a lower bound
    stereo = flac_bytes(0.5, 44_100, 2) + flac_bytes(0.75, 44_100, 2)
    assert decode_every_way(stereo, tmp_path).size == pytest.approx(1.25 * SAMPLE_RATE, abs=2)


def test_a_flac_whose_header_understates_its_length_decodes_whole(tmp_path: Path) -> None:
    """STREAMINFO says 1 s, the frames hold 3 s: all 3 s decode (libsndfile returned 1 s), and
    the duration limit is kept while decoding (the header's 1 s passed the probe)."""
    data = flac_bytes(3.0)
    understated = with_flac_total_samples(data, SAMPLE_RATE)
    assert probe(understated).duration_s == 1.0
    np.testing.assert_array_equal(decode_every_way(understated, tmp_path), decode_file(data))
    with pytest.raises(TooLong, match="decodes to 2.1 s, longer than the 2 s limit"):
        decode_file(understated, max_audio_s=2.0)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({}, {"rate": 48_000}),
        # FFmpeg's FLAC parser lost a frame at this join, without an error
        ({"rate": 48_000}, {}),
        ({}, {"channels": 2}),
        ({"channels": 2}, {}),
        ({}, {"subtype": "PCM_24"}),
        ({"subtype": "PCM_24"}, {}),
        # the second file went into the first's last frame and was dropped, without an error
        ({"rate": 44_100}, {"subtype": "PCM_24"}),
        ({}, {"rate": 44_100, "channels": 2, "subtype": "PCM_24"}),
    ],
    ids=[
        "rate",
        "rate-down",
        "mono-stereo",
        "stereo-mono",
        "bit-depth",
        "bit-depth-down",
        "rate-and-bit-depth",
        "all",
    ],
)
def test_flac_files_of_different_formats_joined_decode_as_each_alone(
    tmp_path: Path, first: dict[str, Any], second: dict[str, Any]
) -> None:
    """FFmpeg's one decoder cannot switch bit depth (frames rejected), and its parser, finding
    frames by their headers, mis-splits a join of another format: these were BadAudio, or
    decoded short without an error. Each file now has its own decoder (audio/joined.py): the
    samples are the two files' own, exactly, whichever way the file comes."""
    one, two = flac_bytes(1.0, **first), flac_bytes(1.5, **second)
    expected = np.concatenate([decode_file(one), decode_file(two)])
    np.testing.assert_array_equal(decode_every_way(one + two, tmp_path), expected)
    piped = np.concatenate(list(decode.iter_decode_stream(io.BytesIO(one + two))))
    np.testing.assert_array_equal(piped, expected)


def test_flac_files_with_id3_tags_joined_decode_whole(tmp_path: Path) -> None:
    """Two FLACs of one format, each behind an ID3v2 tag, joined: the second tag hid the
    second header from FFmpeg's parser, and a frame was lost without an error (19,904 of
    24,000 samples here; whether one is depends on the lengths)."""
    tag = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10)  # a 10-byte tag
    one, two = flac_bytes(0.5), flac_bytes(1.0)
    expected = np.concatenate([decode_file(one), decode_file(two)])
    np.testing.assert_array_equal(decode_every_way(tag + one + tag + two, tmp_path), expected)


def piped(data: bytes) -> F32:
    """`iter_decode_stream`'s samples of `data` written into a pipe (as `livemeet stream -`
    reads it), concatenated."""
    read_fd, write_fd = os.pipe()
    writer = threading.Thread(target=_write_all, args=(write_fd, data))
    writer.start()
    try:
        with open(read_fd, "rb", buffering=0) as pipe:
            return np.concatenate(list(decode.iter_decode_stream(pipe)))
    finally:
        writer.join()


# ID3v2 tags in front of a FLAC, as some rippers and taggers write them: cover art of MiB
ID3_TAGS = {
    "3MiB": lambda: id3v2_tag(3 << 20),
    # 1 MiB in all: the largest audio/joined.py looked past, and FFmpeg's probe (1 MiB)
    # held it, but not the STREAMINFO after it
    "1MiB": lambda: id3v2_tag((1 << 20) - 33),
    "footer": lambda: id3v2_tag(2 << 20, footer=True),
    "two": lambda: id3v2_tag(1000) + id3v2_tag(2 << 20),  # read one after another, as FFmpeg
}


@pytest.mark.parametrize("tags", ID3_TAGS.values(), ids=ID3_TAGS.keys())
def test_a_flac_behind_a_large_id3_tag_decodes_as_without_it(
    tags: Any, shared_data: Path, tmp_path: Path
) -> None:
    """Cover art in an ID3v2 tag in front of a FLAC: BadAudio from bytes (an upload), a pipe
    or a file whose name does not end in .flac (an upload's spill file has none), FFmpeg's
    probe (1 MiB) not reaching the FLAC behind it (audio/joined.py looked past 1 MiB at
    most). The tag is passed by its length, and the file probes and decodes as the FLAC
    without it, every way it comes."""
    untagged = shared_data / SPEECH_FILE
    data = tags() + untagged.read_bytes()
    path = tmp_path / "tagged"
    path.write_bytes(data)
    expected = decode_file(untagged)
    assert probe(path) == probe(data) == probe(untagged)
    for source in (path, data):
        np.testing.assert_array_equal(decode_file(source), expected, strict=True)
    np.testing.assert_array_equal(np.concatenate(list(iter_decode(path))), expected)
    np.testing.assert_array_equal(piped(data), expected)


def test_a_flac_of_undeclared_length_behind_a_large_tag_probes_as_without_it(
    shared_data: Path, tmp_path: Path
) -> None:
    """A FLAC written to a pipe (total samples 0), then tagged: libsndfile gives no length,
    so FFmpeg probes it, from its marker on, as it probes the FLAC alone (it refused the
    tagged file)."""
    flac = with_flac_total_samples((shared_data / "jfk" / "jfk.flac").read_bytes(), 0)
    data = id3v2_tag(3 << 20) + flac
    path = tmp_path / "tagged.flac"
    path.write_bytes(data)
    assert probe(path) == probe(data) == probe(flac)
    assert not probe(flac).duration_declared  # FFmpeg's probe, not libsndfile's
    np.testing.assert_array_equal(decode_file(path), decode_file(flac))


def test_flac_files_joined_behind_a_large_id3_tag_decode_whole(tmp_path: Path) -> None:
    """The files joined with cat, the first behind cover art (and a small tag in front of the
    second, which goes with the first file, as before): each file's samples, exactly."""
    one, two = flac_bytes(1.0, 44_100, 2), flac_bytes(1.5, subtype="PCM_24")
    expected = np.concatenate([decode_file(one), decode_file(two)])
    small_tag = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10)  # searched, as the file's bytes
    data = id3v2_tag(3 << 20) + one + small_tag + two
    np.testing.assert_array_equal(decode_every_way(data, tmp_path), expected)
    np.testing.assert_array_equal(piped(data), expected)


class RecordedReads(io.RawIOBase):
    """A pipe's reader (no seek) of an ID3v2 tag of `art_bytes` of cover art, made as it is
    read so the test holds none of it, then `audio`; keeps the largest read asked of it."""

    def __init__(self, art_bytes: int, audio: bytes) -> None:
        body = b"\x00image/png\x00\x03\x00"
        frame = b"APIC" + syncsafe(len(body) + art_bytes) + b"\x00\x00" + body
        self._head = b"ID3\x04\x00\x00" + syncsafe(len(frame) + art_bytes) + frame
        self._art_bytes, self._audio, self._at = art_bytes, audio, 0
        self.largest_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        self.largest_read = max(self.largest_read, len(buffer))
        head, art, audio = len(self._head), self._art_bytes, self._audio
        at = self._at
        if at < head:
            piece = self._head[at : at + len(buffer)]
        elif at < head + art:
            piece = bytes([at & 0xFF]) * min(len(buffer), head + art - at)
        else:
            piece = audio[at - head - art : at - head - art + len(buffer)]
        buffer[: len(piece)] = piece
        self._at += len(piece)
        return len(piece)


@pytest.mark.parametrize(
    "name", [SPEECH_FILE, Path("ami-lhotse") / "ES2011a.Headset-0-40s-46s.wav"], ids=["flac", "wav"]
)
def test_a_large_tag_is_passed_not_held(shared_data: Path, tmp_path: Path, name: Path) -> None:
    """20 MiB of cover art in front of a FLAC or a WAV: from a pipe, read a block at a time
    (64 KiB) and dropped, at most FFmpeg's 1 MiB probe's worth held until the audio's start
    shows the rest was a tag (under 2 MB allocated at any time, the 21 MB stream never);
    from a file, sought past (under 1 MB). It was BadAudio, from a pipe (the WAV too)."""
    audio = (shared_data / name).read_bytes()
    expected = decode_file(audio)
    stream = RecordedReads(20 << 20, audio)
    tracemalloc.start()
    try:
        got = np.concatenate(list(decode.iter_decode_stream(cast(BinaryIO, stream))))
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, expected)
    assert stream.largest_read <= 1 << 16, stream.largest_read
    assert peak_bytes < 2_000_000, peak_bytes
    path = tmp_path / "tagged"
    with path.open("wb") as f:
        f.write(id3v2_tag(20 << 20))
        f.write(audio)
    tracemalloc.start()
    try:
        num_samples = sum(chunk.size for chunk in iter_decode(path))
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert num_samples == expected.size
    assert peak_bytes < 1_000_000, peak_bytes


def test_a_tagged_flac_from_a_pipe_comes_as_its_writer_writes_it(shared_data: Path) -> None:
    """Past its tag (3 MiB), the FLAC is read as the pipe fills: the first chunk comes
    before the writer has written the rest of the audio."""
    flac = (shared_data / SPEECH_FILE).read_bytes()
    tag = id3v2_tag(3 << 20)
    got = decoded_as_written(tag + flac, at=len(tag) + len(flac) // 3)
    np.testing.assert_array_equal(got, decode_file(flac))


def test_an_mp3_behind_a_large_id3_tag_still_decodes(
    encoded_clips: dict[str, EncodedClip], tmp_path: Path
) -> None:
    """FFmpeg reads MP3 behind tags of any size (its probe trusts a large tag for MP3); a
    stream's tags, passed while looking for a FLAC marker, are given back for it to read
    (audio/joined.py): each way in, the samples of the MP3 without them. Two tags, the
    second past the first 1 MiB, which a stream gives back as a stand-in of its length;
    three, the held MiB ending in the second's header (from a pipe, 60% of the samples were
    lost: the third tag's first bytes were given back too, and FFmpeg read them as a tag)."""
    mp3 = encoded_clips["speech.mp3"].path.read_bytes()
    path = tmp_path / "tagged.mp3"
    header_cut = id3v2_tag((1 << 20) - 5 - 33) + id3v2_tag(3000) + id3v2_tag(2000)
    for tags in (id3v2_tag(3 << 20), id3v2_tag((1 << 20) + 5000) + id3v2_tag(3000), header_cut):
        data = tags + mp3
        path.write_bytes(data)
        with av.open(path) as container:  # the cover art: FFmpeg reads the tag as a tag
            assert container.streams.video[0].disposition & av.stream.Disposition.attached_pic
        expected = decode_file(mp3)
        np.testing.assert_array_equal(decode_file(path), expected)
        np.testing.assert_array_equal(decode_file(data), expected)
        # from a pipe as the MP3 without tags from a pipe: with its end padding, which
        # FFmpeg cuts from a file's (111 samples here, tags or none)
        np.testing.assert_array_equal(piped(data), piped(mp3))


def test_a_flac_behind_a_tag_then_padding_is_refused_as_ffmpeg_refuses_it() -> None:
    """ID3v2 padding belongs inside the tag (its size counts it); zeros after a tag are not a
    tag, and FFmpeg does not look past them for a FLAC (nor does libsndfile): neither does
    livemeet, every way in."""
    flac = flac_bytes(1.0)
    data = id3v2_tag(1000) + bytes(100) + flac
    for source in (data, io.BytesIO(data)):
        with pytest.raises(BadAudio, match="not an audio file"):
            if isinstance(source, bytes):
                decode_file(source)
            else:
                list(decode.iter_decode_stream(source))
    with pytest.raises(BadAudio, match="not an audio file"):
        piped(data)


def soundfile_bytes(
    fmt: str, subtype: str = "PCM_16", rate: int = SAMPLE_RATE, channels: int = 1, **kw: str
) -> bytes:
    """Half a second of noise in a file libsndfile writes (`kw`: its `endian`)."""
    rng = np.random.default_rng(rate + channels)
    noise = rng.uniform(-0.5, 0.5, (rate // 2, channels)).astype(np.float32)
    out = io.BytesIO()
    sf.write(out, noise, rate, format=fmt, subtype=subtype, **kw)
    return out.getvalue()


def ffmpeg_bytes(fmt: str, codec: str, rate: int = SAMPLE_RATE) -> bytes:
    """Half a second of mono noise encoded by FFmpeg (PyAV) into the container `fmt`."""
    noise = np.random.default_rng(rate).uniform(-0.5, 0.5, (1, rate // 2)).astype(np.float32)
    out = io.BytesIO()
    encode_with_pyav(out, noise, fmt, codec, rate, source_rate=rate)
    return out.getvalue()


def bw64_bytes() -> bytes:
    """A BW64 file (ITU-R BS.2088: RF64 by another name; FFmpeg reads it, libsndfile not)."""
    rf64 = soundfile_bytes("RF64")
    assert rf64.startswith(b"RF64")
    return b"BW64" + rf64[4:]


def unfinished_wav_bytes() -> bytes:
    """A WAV whose data chunk declares 0 bytes (a writer that could not seek back to fill it
    in): libsndfile refuses it, FFmpeg reads it to its end."""
    data = bytearray(soundfile_bytes("WAV"))
    struct.pack_into("<I", data, data.index(b"data") + 4, 0)
    return bytes(data)


# Files of the formats whose leading ID3v2 tags are dropped (audio/joined.py's
# `_AUDIO_START`), but FLAC (above) and MPEG audio (whose tags FFmpeg reads: kept)
TAGGED_FORMATS = {
    "wav": lambda: soundfile_bytes("WAV"),  # 16 kHz mono: read whole, not in blocks
    "wavex-24bit-stereo-44k": lambda: soundfile_bytes("WAVEX", "PCM_24", 44_100, 2),
    "wav-float": lambda: soundfile_bytes("WAV", "FLOAT"),
    "wav-unfinished": unfinished_wav_bytes,
    "rifx": lambda: soundfile_bytes("WAV", endian="BIG"),
    "rf64": lambda: soundfile_bytes("RF64"),
    "bw64": bw64_bytes,
    "w64": lambda: soundfile_bytes("W64"),
    "aiff": lambda: soundfile_bytes("AIFF"),
    "aifc": lambda: soundfile_bytes("AIFF", "FLOAT"),
    "svx": lambda: soundfile_bytes("SVX"),  # IFF 16SV
    "caf": lambda: soundfile_bytes("CAF"),
    "au": lambda: soundfile_bytes("AU"),
    "nist": lambda: soundfile_bytes("NIST"),
    "ogg-vorbis": lambda: soundfile_bytes("OGG", "VORBIS"),
    "ogg-opus": lambda: ffmpeg_bytes("ogg", "libopus", 48_000),
    "adts": lambda: ffmpeg_bytes("adts", "aac"),
    "ac3": lambda: ffmpeg_bytes("ac3", "ac3", 48_000),
    "eac3": lambda: ffmpeg_bytes("eac3", "eac3", 48_000),
    "m4a": lambda: ffmpeg_bytes("mp4", "aac"),
    "webm": lambda: ffmpeg_bytes("webm", "libopus", 48_000),
    "mka": lambda: ffmpeg_bytes("matroska", "pcm_s16le"),
    "wavpack": lambda: ffmpeg_bytes("wv", "wavpack"),
    "tta": lambda: ffmpeg_bytes("tta", "tta"),
}


def piped_or_refused(data: bytes) -> F32 | str:
    """`piped`'s samples of `data`, or the message of the BadAudio it raised."""
    try:
        return piped(data)
    except BadAudio as e:
        return e.message


@pytest.mark.parametrize("make", TAGGED_FORMATS.values(), ids=TAGGED_FORMATS.keys())
def test_audio_behind_id3_tags_decodes_as_without_them(make: Any, tmp_path: Path) -> None:
    """A leading ID3v2 tag (cover art, of 1 kB or 3 MiB) is never audio, whatever follows
    it: each format here probes and decodes as without it from a path, bytes (an upload held
    in memory) and a pipe. Each failed on the old code: from bytes libsndfile sized a WAV's
    or AIFF's data from the whole length, tag included, and lost the tag's length of audio
    at its end without an error (BadAudio where the tag outweighed the audio); FFmpeg
    refuses an MP4, Matroska, WavPack, CAF or RF64 behind a tag of any size and an Ogg or
    ADTS behind a large one (200 kB, 3 MiB), and counted the tag in an AC-3's probed
    duration; from a pipe, a WAV, AIFF or AU behind any tag was BadAudio."""
    untagged = make()
    plain = tmp_path / "plain"
    plain.write_bytes(untagged)
    info, expected = probe(untagged), decode_file(untagged)
    assert probe(plain) == info
    np.testing.assert_array_equal(decode_file(plain), expected, strict=True)
    from_pipe = piped_or_refused(untagged)  # CAF and WavPack need seeking (BadAudio)
    for tags in (id3v2_tag(1000), id3v2_tag(3 << 20)):
        data = tags + untagged
        path = tmp_path / "tagged"
        path.write_bytes(data)
        assert probe(path) == probe(data) == info
        for source in (path, data):
            np.testing.assert_array_equal(decode_file(source), expected, strict=True)
        np.testing.assert_array_equal(np.concatenate(list(iter_decode(path))), expected)
        got = piped_or_refused(data)
        if isinstance(from_pipe, str):
            assert got == from_pipe
        else:
            np.testing.assert_array_equal(got, from_pipe)


@pytest.mark.parametrize("tags", ID3_TAGS.values(), ids=ID3_TAGS.keys())
def test_a_wav_behind_id3_tags_of_any_shape_decodes_as_without_them(
    tags: Any, shared_data: Path, tmp_path: Path
) -> None:
    """The FLAC cases (a tag of 1 MiB in all, a footer, two tags, the second past the first
    MiB) in front of a WAV of real speech (6 s, 16 kHz mono): as the WAV without them."""
    untagged = shared_data / "ami-lhotse" / "ES2011a.Headset-0-40s-46s.wav"
    data = tags() + untagged.read_bytes()
    path = tmp_path / "tagged"
    path.write_bytes(data)
    expected = decode_file(untagged)
    assert probe(path) == probe(data) == probe(untagged)
    for source in (path, data):
        np.testing.assert_array_equal(decode_file(source), expected, strict=True)
    np.testing.assert_array_equal(piped(data), expected)


def test_a_cut_wav_behind_an_id3_tag_says_what_its_header_declares(tmp_path: Path) -> None:
    """A WAV cut to a third, behind a tag: the probe gives the length its header declares, as
    for the cut WAV alone. From a path it said nothing (`wave`, reading the header, did not
    pass the tag); from bytes libsndfile read the tag's length short."""
    path = tmp_path / "whole.wav"
    sf.write(path, np.zeros((3 * SAMPLE_RATE, 2), np.float32), SAMPLE_RATE, subtype="PCM_16")
    whole = path.read_bytes()
    start = whole.index(b"data") + 8
    cut = whole[: start + (len(whole) - start) // 3]
    info, expected = probe(cut), decode_file(cut)
    assert info.cut_from_s == pytest.approx(3.0)
    data = id3v2_tag(50_000) + cut
    (tmp_path / "tagged").write_bytes(data)
    for source in (tmp_path / "tagged", data):
        decoded = decode.decode_file_with_info(source)
        assert probe(source) == decoded.info == info
        np.testing.assert_array_equal(decoded.samples, expected, strict=True)


def test_a_chained_ogg_behind_an_id3_tag_decodes_link_by_link(tmp_path: Path) -> None:
    """Ogg links of 16 and 48 kHz joined, behind a tag: each link decoded alone, as without
    the tag. FFmpeg read them as one stream (audio/joined.py did not look past the tag) and
    refused the change of rate."""
    links = [soundfile_bytes("OGG", "VORBIS", rate) for rate in (16_000, 48_000)]
    chain = b"".join(links)
    expected = decode_file(chain)
    assert expected.size == SAMPLE_RATE
    data = id3v2_tag(1000) + chain
    np.testing.assert_array_equal(decode_every_way(data, tmp_path), expected)
    np.testing.assert_array_equal(piped(data), piped(chain))


@pytest.mark.parametrize("declared", ["declared", "piped"])
def test_a_cut_flac_is_bad_audio_wherever_it_is_cut(tmp_path: Path, declared: str) -> None:
    """A cut inside the first file, or inside the second of two joined (more than the first
    header's count decodes); a FLAC of undeclared length cut (its cut last frame was skipped as
    a bad packet, the prefix returned); a cut between two frames (nothing rejected, but short
    of the header's count)."""
    whole = flac_bytes(2.0)
    if declared == "piped":
        whole = with_flac_total_samples(whole, 0)
    joined = whole + flac_bytes(2.0)
    cuts = [whole[: len(whole) // 2], joined[: len(whole) + len(whole) // 2]]
    for cut in cuts:
        with pytest.raises(BadAudio, match="truncated or corrupt"):
            decode_every_way(cut, tmp_path)
    with av.open(io.BytesIO(whole)) as container:  # where each frame starts
        starts = [p.pos for p in container.demux(audio=0) if p.pos is not None and p.pos > 0]
    boundary = whole[: starts[len(starts) // 2]]
    if declared == "declared":
        with pytest.raises(BadAudio, match="header declares 32000 frames, only"):
            decode_every_way(boundary, tmp_path)
    else:  # nothing says more was there: the intact frames, as for any stream
        assert 0 < decode_file(boundary).size < 2 * SAMPLE_RATE


def test_a_cut_in_a_later_joined_file_says_which(tmp_path: Path) -> None:
    """A FLAC joined after another and cut (a copy that stopped): the error named "the
    header" and its count, the second file's (44,100 here), in a file whose first header
    declares 16,000 frames, all of which decoded; or, cut inside its metadata, said the
    whole file was "not an audio file". It names the file the fault is in."""
    first, second = flac_bytes(1.0), flac_bytes(1.0, 44_100)
    with av.open(io.BytesIO(second)) as container:  # where each frame starts
        starts = [p.pos for p in container.demux(audio=0) if p.pos is not None and p.pos > 0]
    at_a_frame = first + second[: starts[len(starts) // 2]]
    with pytest.raises(BadAudio, match=r"declares 44100 frames, only \d+ decode \(in FLAC file 2"):
        decode_every_way(at_a_frame, tmp_path)
    with pytest.raises(BadAudio, match=r"\(in FLAC file 2 of those joined; the ones before"):
        decode_every_way(first + second[: starts[0] // 2], tmp_path)  # its header alone
    links = []
    for rate in (16_000, 48_000):
        link = io.BytesIO()
        sf.write(link, np.zeros(rate, np.float32), rate, format="OGG", subtype="VORBIS")
        links.append(link.getvalue())
    chain = links[0] + links[1][:60]  # the second cut in its first page
    with pytest.raises(BadAudio, match=r"\(in link 2 of the Ogg chain;"):
        decode_file(chain)


def test_a_short_decode_is_worded_alike_whichever_library_decoded_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer frames than the header declares, from libsndfile (a WAV whose last block its
    decoder did not give) and from FFmpeg (a FLAC cut between two frames): one message, where
    there were two near-identical ones ("the WAV audio is truncated: ..." and "the flac audio
    is truncated or corrupt: ...")."""
    wording = r"^the (wav|flac) audio is truncated or corrupt: the header declares (\d+) frames, "
    wording += r"only (\d+) decode$"
    flac = flac_bytes(2.0)
    with av.open(io.BytesIO(flac)) as container:  # where each frame starts
        starts = [p.pos for p in container.demux(audio=0) if p.pos is not None and p.pos > 0]
    with pytest.raises(BadAudio, match=wording) as flac_error:
        decode_file(flac[: starts[len(starts) // 2]])
    wav = tmp_path / "stereo.wav"
    sf.write(wav, np.zeros((100_000, 2), np.float32), 44_100)  # read in blocks
    real_read_blocks = decode._read_blocks

    def all_but_the_last(f: sf.SoundFile) -> Iterator[F32]:
        yield from list(real_read_blocks(f))[:-1]

    monkeypatch.setattr(decode, "_read_blocks", all_but_the_last)
    with pytest.raises(BadAudio, match=wording) as wav_error:
        decode_file(wav)
    wav_match, flac_match = (re.match(wording, str(e.value)) for e in (wav_error, flac_error))
    assert wav_match is not None and wav_match.groups() == ("wav", "100000", "65536")
    assert flac_match is not None and flac_match.group(2) == "32000"


def test_a_flac_frame_failing_its_checksum_is_bad_audio(tmp_path: Path) -> None:
    """FFmpeg only logs a FLAC frame's CRC mismatch by default, and returns the damaged audio;
    libsndfile refused the file, and so does FFmpeg told to (err_detect)."""
    data = bytearray(flac_bytes(2.0))
    data[len(data) // 2] ^= 0x55  # inside a frame's audio
    with pytest.raises(BadAudio, match="truncated or corrupt"):
        decode_every_way(bytes(data), tmp_path)


def test_a_flac_of_undeclared_length_decodes(shared_data: Path, tmp_path: Path) -> None:
    """STREAMINFO's total samples 0 means "unknown" (a FLAC written to a pipe); libsndfile
    then reports 2**63 - 1 frames, which is not a length to refuse."""
    data = with_flac_total_samples((shared_data / "jfk" / "jfk.flac").read_bytes(), 0)
    path = tmp_path / "piped.flac"
    path.write_bytes(bytes(data))
    whole = decode_file(shared_data / "jfk" / "jfk.flac")
    for source in (path, bytes(data)):
        got = decode_file(source)
        assert got.size == whole.size
        assert best_lag_correlation(whole, got)[1] > 0.999
    with pytest.raises(TooLong, match="11.0 s"):  # the limit still holds (FFmpeg's count)
        decode_file(path, max_audio_s=5.0)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(BadAudio, match="empty"):
        decode_file(empty)
    with pytest.raises(BadAudio, match="cannot read"):
        decode_file(tmp_path / "absent.wav")


def test_zero_length_wav(tmp_path: Path) -> None:
    path = tmp_path / "zero.wav"
    sf.write(path, np.zeros(0, np.int16), 16_000, subtype="PCM_16")
    assert probe(path).duration_s == 0.0
    with pytest.raises(BadAudio, match="no samples"):
        decode_file(path)


def test_zero_length_webm(tmp_path: Path) -> None:
    path = tmp_path / "zero.webm"
    with av.open(str(path), "w", format="webm") as out:
        out.add_stream("libopus", rate=48_000)
    with pytest.raises(BadAudio):
        decode_file(path)


@pytest.mark.parametrize("rate", [1, 999, 768_001])
def test_a_declared_rate_outside_the_file_range_is_bad_audio(tmp_path: Path, rate: int) -> None:
    """A damaged header's 1 Hz would read as 16,000 s for 32 KB of samples: TooLong, the
    wrong error (found by a user trial)."""
    path = tmp_path / "odd-rate.wav"
    sf.write(path, np.zeros(16_000, np.int16), rate, subtype="PCM_16")
    for source in (path, path.read_bytes()):
        with pytest.raises(BadAudio, match=f"declares a sample rate of {rate} Hz"):
            decode_file(source)
        with pytest.raises(BadAudio, match="outside 1000..768000 Hz"):
            probe(source)


def pcm16_wav(channels: int, frames: int, *, data_bytes: int | None = None) -> bytes:
    """A 16-kHz 16-bit PCM WAV of silence written by hand (libsndfile writes at most 1024
    channels); `data_bytes`: what its data chunk declares (default: the samples it holds)."""
    block = 2 * channels
    fmt = struct.pack("<HHIIHH", 1, channels, SAMPLE_RATE, SAMPLE_RATE * block, block, 16)
    data = bytes(frames * block)
    declared = len(data) if data_bytes is None else data_bytes
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", declared)
    return b"RIFF" + struct.pack("<I", 4 + len(chunks) + declared) + b"WAVE" + chunks + data


@pytest.mark.parametrize("channels", [513, 1024, 4096])
def test_a_file_of_more_channels_than_decode_says_the_limit(channels: int) -> None:
    """A trial's 4096-channel WAV was refused with only "FFmpeg: Invalid argument": FFmpeg's
    decoders open at most 512 channels (libsndfile reads up to 1024; past it the file went to
    FFmpeg). Whichever library would read it, and with a data chunk that declares 0 bytes (read
    by FFmpeg), the error names the count and the limit; 512 decode."""
    for data_bytes in (None, 0):
        wav = pcm16_wav(channels, 16, data_bytes=data_bytes)
        message = f"the audio declares {channels} channels, more than the 512 a file may have"
        with pytest.raises(BadAudio, match=message):
            probe(wav)
        with pytest.raises(BadAudio, match=message):
            decode_file(wav)
        assert decode_file(pcm16_wav(512, 16, data_bytes=data_bytes)).size == 16


@pytest.mark.parametrize("rate", [1_000, 4_000, 384_000, 768_000])
def test_files_at_unusual_but_real_rates_decode(tmp_path: Path, rate: int) -> None:
    """The file range is wider than the live socket's 8-192 kHz: 4 kHz and 384 kHz files are
    real (a review found them refused by a first form of the check)."""
    path = tmp_path / "edge-rate.wav"
    sf.write(path, np.zeros(rate // 10, np.int16), rate, subtype="PCM_16")
    assert decode_file(path).size == SAMPLE_RATE // 10


def test_a_rate_known_only_after_decoding_is_checked_then() -> None:
    """Some containers (MPEG-TS) report rate 0 until a frame is decoded: the probe lets 0
    through (a review found such files refused) and the decoded rate is checked."""
    sink = decode._Resampler(max_audio_s=60.0)
    with pytest.raises(BadAudio, match="decodes at a sample rate of 0 Hz"):
        sink.push(np.zeros(10, np.float32), 0)
    out = sink.push(np.zeros(48_000, np.float32), 48_000)
    assert out.size + sink.finish().size == pytest.approx(16_000, abs=2)


def test_non_finite_float_wav(tmp_path: Path) -> None:
    path = tmp_path / "nan.wav"
    x = np.zeros(16_000, np.float32)
    x[100] = np.nan
    sf.write(path, x, 16_000, subtype="FLOAT")
    with pytest.raises(BadAudio, match="non-finite"):
        decode_file(path)


def test_float_wav_over_full_scale_is_clipped(tmp_path: Path) -> None:
    path = tmp_path / "hot.wav"
    x = np.full(1_000, 1.5, np.float32)
    x[::2] = -3.0
    sf.write(path, x, 16_000, subtype="FLOAT")
    out = decode_file(path)
    assert out.max() == 1.0 and out.min() == -1.0


def test_flac_cut_in_half(shared_data: Path, tmp_path: Path) -> None:
    data = (shared_data / "jfk" / "jfk.flac").read_bytes()
    path = tmp_path / "half.flac"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadAudio, match="truncated or corrupt"):
        decode_file(path)


def test_webm_cut_in_half(encoded_clips: dict[str, EncodedClip], tmp_path: Path) -> None:
    data = encoded_clips["speech.webm"].path.read_bytes()
    path = tmp_path / "half.webm"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadAudio, match="truncated"):
        decode_file(path)


def test_m4a_cut_before_its_index(encoded_clips: dict[str, EncodedClip], tmp_path: Path) -> None:
    data = encoded_clips["speech.m4a"].path.read_bytes()
    path = tmp_path / "half.m4a"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadAudio, match="FFmpeg"):
        decode_file(path)


@pytest.mark.parametrize("name", ["speech.mp3", "speech.opus"])
def test_cut_mp3_and_ogg_yield_a_genuine_prefix(
    name: str, encoded_clips: dict[str, EncodedClip], speech: F32, tmp_path: Path
) -> None:
    data = encoded_clips[name].path.read_bytes()
    path = tmp_path / f"half.{name}"
    path.write_bytes(data[: len(data) // 2])
    out = decode_file(path)
    assert 3.0 < out.size / SAMPLE_RATE < 8.0
    _, r = best_lag_correlation(speech[: out.size], out)
    assert r > 0.95


def test_mp3_files_joined_with_cat_decode_whole(
    encoded_clips: dict[str, EncodedClip], tmp_path: Path
) -> None:
    """The second file's ID3 tag comes mid-stream, as a packet the MP3 decoder rejects: it is
    skipped, as the ffmpeg command line skips it; the whole upload failed with BadAudio."""
    data = encoded_clips["speech.mp3"].path.read_bytes()
    path = tmp_path / "joined.mp3"
    path.write_bytes(data + data)
    once = decode_file(encoded_clips["speech.mp3"].path)
    for joined in (path, data + data):
        out = decode_file(joined)
        # longer by the second file's encoder delay and padding (~80 ms): its LAME tag, which
        # says how much to trim, is read only at the start of a stream
        assert 0 <= out.size - 2 * once.size <= 0.1 * SAMPLE_RATE
        np.testing.assert_array_equal(out[: once.size // 2], once[: once.size // 2])
        second = out[once.size :]  # the second file's speech, as loud as the first's
        assert np.std(second) == pytest.approx(np.std(once), rel=0.02)


def test_mp3_files_of_different_rates_joined_decode_each_part(
    encoded_clips: dict[str, EncodedClip], tmp_path: Path
) -> None:
    """A 16 kHz mono and a 44.1 kHz stereo MP3 joined with cat, either way round: was BadAudio
    (the rate changes mid-stream); each part is now resampled from its own rate, FFmpeg's MP3
    decoder decoding it as it decodes the file alone."""
    low, high = encoded_clips["speech.mp3"].path, encoded_clips["stereo44k.mp3"].path
    for first, second in ((low, high), (high, low)):
        path = tmp_path / "joined.mp3"
        path.write_bytes(first.read_bytes() + second.read_bytes())
        alone = [decode_file(first), decode_file(second)]
        out = decode_file(path)
        np.testing.assert_array_equal(out[: alone[0].size // 2], alone[0][: alone[0].size // 2])
        # the second part: its file's audio after its LAME frame and delay (not trimmed
        # mid-stream, as where rates match), ~60-110 ms
        rest, reference = out[alone[0].size :], alone[1][SAMPLE_RATE : 4 * SAMPLE_RATE]
        fit = np.correlate(rest[: 2 * SAMPLE_RATE + reference.size], reference, mode="valid")
        lag = int(np.argmax(fit))  # where the reference's second 1 starts
        assert 0 < lag - SAMPLE_RATE < 0.2 * SAMPLE_RATE
        part = rest[lag : lag + reference.size]
        assert np.corrcoef(part, reference)[0, 1] > 0.999
        assert 0 <= out.size - alone[0].size - alone[1].size <= 0.2 * SAMPLE_RATE


def test_aac_whose_rate_changes_is_bad_audio(tmp_path: Path) -> None:
    """Raw AAC files of 16 and 48 kHz joined: FFmpeg's AAC decoder decodes every frame after
    the change wrong (samples off by up to 0.5 against the file alone), so the change stays
    refused, naming both rates."""
    parts = []
    for rate in (16_000, 48_000):
        out = io.BytesIO()
        with av.open(out, "w", format="adts") as container:
            stream = container.add_stream("aac", rate=rate)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, rate), np.float32), "fltp", "mono")
            frame.sample_rate = rate
            for packet in [*stream.encode(frame), *stream.encode(None)]:
                container.mux(packet)
        parts.append(out.getvalue())
    with pytest.raises(BadAudio, match=r"sample rate changes mid-stream \(16000 -> 48000 Hz\)"):
        decode_file(b"".join(parts))


def test_truncated_wav_yields_its_intact_prefix(shared_data: Path, tmp_path: Path) -> None:
    source = shared_data / "ami-lhotse" / "ES2011a.Headset-0-40s-46s.wav"
    data = source.read_bytes()
    path = tmp_path / "half.wav"
    path.write_bytes(data[: len(data) // 2])
    out = decode_file(path)
    full = decode_file(source)
    assert 0 < out.size < full.size
    np.testing.assert_array_equal(out, full[: out.size])


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_24", "PCM_U8"])
def test_a_cut_wav_says_what_its_header_declares(tmp_path: Path, subtype: str) -> None:
    """A cut WAV yields its intact prefix, and said nothing of the rest (a trial): the probe
    (and `decode_file_with_info`) give the duration the data chunk declares, for a path and
    bytes alike; a whole file, and one whose data chunk declares 0 bytes, have none. (Integer
    PCM, what recorders write: the standard library's `wave` reads the header.)"""
    path = tmp_path / "whole.wav"
    sf.write(path, np.zeros((3 * SAMPLE_RATE, 2), np.float32), SAMPLE_RATE, subtype=subtype)
    whole = path.read_bytes()
    start = whole.index(b"data") + 8
    cut = whole[: start + (len(whole) - start) // 3]
    (tmp_path / "cut.wav").write_bytes(cut)
    for source in (tmp_path / "cut.wav", cut):
        info = probe(source)
        assert info.duration_s == pytest.approx(1.0)
        assert info.cut_from_s == pytest.approx(3.0)
        assert info.cut_note == (
            "the audio is cut: its header declares 3.00 s, the file holds 1.00 s (2.00 s "
            "missing); the part it holds is transcribed"
        )
        decoded = decode.decode_file_with_info(source)
        assert decoded.info == info and decoded.samples.size == SAMPLE_RATE
    unfinished = bytearray(cut)
    struct.pack_into("<I", unfinished, start - 4, 0)
    for intact in (path, whole, bytes(unfinished)):
        assert probe(intact).cut_from_s is None and probe(intact).cut_note is None


@pytest.mark.parametrize("riff_size", ["kept", "zero"])
def test_a_wav_whose_header_says_no_data_decodes_to_its_end(
    shared_data: Path, tmp_path: Path, riff_size: str
) -> None:
    """A data chunk of size 0 is the placeholder a writer that cannot seek back leaves (a
    recorder streaming to a pipe, or one killed before it finished the header); libsndfile read
    it as zero length (BadAudio). The samples after it are the audio."""
    source = shared_data / "ami-lhotse" / "ES2011a.Headset-0-40s-46s.wav"
    data = bytearray(source.read_bytes())
    assert data[36:40] == b"data"  # the canonical 44-byte header
    struct.pack_into("<I", data, 40, 0)
    if riff_size == "zero":
        struct.pack_into("<I", data, 4, 0)
    path = tmp_path / "unfinished.wav"
    path.write_bytes(bytes(data))
    full = decode_file(source)
    for unfinished in (path, bytes(data)):
        assert probe(unfinished).duration_s == pytest.approx(full.size / SAMPLE_RATE)
        np.testing.assert_array_equal(decode_file(unfinished), full)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    source=st.sampled_from(["speech.webm", "speech.m4a", "speech.mp3", "flac"]),
    offsets=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    garbage=st.binary(min_size=1, max_size=8),
)
def test_corrupted_files_raise_bad_audio_or_decode_cleanly(
    source: str,
    offsets: list[float],
    garbage: bytes,
    encoded_clips: dict[str, EncodedClip],
    shared_data: Path,
    tmp_path: Path,
) -> None:
    """Overwrite bytes anywhere (headers included): only BadAudio may escape, never a raw
    soundfile/PyAV exception, and whatever decodes is valid model input."""
    original = (
        shared_data / "librispeech-lhotse" / "2412-153948-0000.flac"
        if source == "flac"
        else encoded_clips[source].path
    )
    data = bytearray(original.read_bytes())
    for offset in offsets:
        at = int(offset * (len(data) - len(garbage)))
        data[at : at + len(garbage)] = garbage
    path = tmp_path / f"corrupt.{source}"
    path.write_bytes(bytes(data))
    try:
        out = decode_file(path)
    except BadAudio as e:
        assert e.message
        return
    assert out.dtype == np.float32 and out.ndim == 1 and out.size > 0
    assert np.isfinite(out).all() and np.abs(out).max() <= 1.0


def test_a_big_endian_wav_ffmpeg_would_read_as_noise_is_refused(tmp_path: Path) -> None:
    """A RIFX (big-endian) WAV decodes right where libsndfile reads it (a path, bytes) and is
    refused with BadAudio naming RIFX where FFmpeg would read it: from a pipe, or with a
    data size of 0 (a writer that could not seek back). FFmpeg's WAV demuxer takes its PCM
    as little-endian; on the old code both gave loud noise (samples off by up to ~1.5)
    without an error."""
    riff = soundfile_bytes("WAV")
    rifx = soundfile_bytes("WAV", endian="BIG")
    assert rifx.startswith(b"RIFX") and riff.startswith(b"RIFF")
    expected = decode_file(riff)
    path = tmp_path / "big-endian.wav"
    path.write_bytes(rifx)
    for source in (path, rifx):
        np.testing.assert_allclose(decode_file(source), expected, atol=1e-6)
    with pytest.raises(BadAudio, match="RIFX"):
        piped(rifx)
    np.testing.assert_array_equal(piped(riff), expected)  # little-endian: as before
    unfinished = bytearray(rifx)
    data_at = unfinished.index(b"data") + 4
    unfinished[data_at : data_at + 4] = bytes(4)  # the data chunk's size: 0, big-endian
    with pytest.raises(BadAudio, match="RIFX"):
        decode_file(bytes(unfinished))
