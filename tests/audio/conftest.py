"""Audio fixtures: compressed clips encoded once per session from real speech with PyAV."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf

SPEECH_FILE = Path("librispeech-lhotse") / "2412-153948-0000.flac"  # 11.66 s, 16 kHz mono s16


@dataclass(frozen=True)
class EncodedClip:
    """A compressed encoding of `speech` and how it was made."""

    path: Path
    codec: str  # FFmpeg encoder name
    sample_rate: int  # Hz the codec ran at
    channels: int
    gain: float  # expected amplitude of the decoded mono mix relative to the source


# file name -> (container format, encoder, rate, channels, options for the muxer)
_CLIPS: dict[str, tuple[str, str, int, int, dict[str, str]]] = {
    "speech.mp3": ("mp3", "libmp3lame", 16_000, 1, {}),
    "stereo44k.mp3": ("mp3", "libmp3lame", 44_100, 2, {}),
    "speech.opus": ("ogg", "libopus", 48_000, 1, {}),
    "speech.m4a": ("mp4", "aac", 16_000, 1, {}),
    "speech.webm": ("webm", "libopus", 48_000, 1, {}),
    "live.webm": ("webm", "libopus", 48_000, 1, {"live": "1"}),  # no declared duration
    "mp3_in.wav": ("wav", "libmp3lame", 44_100, 2, {}),  # WAVE_FORMAT_MPEGLAYER3 (0x55)
}


@pytest.fixture(scope="session")
def speech(shared_data: Path) -> npt.NDArray[np.float32]:
    """The source speech, float32 mono 16 kHz, shape [186_560]."""
    x, rate = sf.read(shared_data / SPEECH_FILE, dtype="float32")
    assert rate == 16_000 and x.ndim == 1
    return np.asarray(x, dtype=np.float32)


@pytest.fixture(scope="session")
def encoded_clips(
    speech: npt.NDArray[np.float32], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, EncodedClip]:
    """Every compressed format the upload path must accept, encoded from `speech`.

    Stereo clips carry the speech at full level on the left and half level on the right, so a
    correct down-mix (the mean) has gain 0.75.
    """
    folder = tmp_path_factory.mktemp("encoded")
    clips = {}
    for name, (fmt, codec, rate, channels, options) in _CLIPS.items():
        path = folder / name
        planes = speech[None, :] if channels == 1 else np.stack([speech, 0.5 * speech])
        encode_with_pyav(path, planes, fmt, codec, rate, options)
        gain = 1.0 if channels == 1 else 0.75
        clips[name] = EncodedClip(path, codec, rate, channels, gain)
    return clips


def encode_with_pyav(
    target: Path | BinaryIO,
    planes: npt.NDArray[np.float32],
    fmt: str,
    codec: str,
    rate: int,
    options: dict[str, str] | None = None,
    *,
    source_rate: int = 16_000,
) -> None:
    """Encode `planes` ([channels, n] float32 at `source_rate` Hz; 1, 2 or 6 channels) with PyAV
    into `target` (a path, or a writable file object) as `codec` at `rate` Hz in the
    container `fmt`. Timestamps start at 0, so the MP4 muxer writes the edit list that trims
    the codec's priming samples."""
    layout = {1: "mono", 2: "stereo", 6: "5.1"}[planes.shape[0]]
    where = str(target) if isinstance(target, Path) else target
    with av.open(where, "w", format=fmt, options=options or {}) as out:
        stream = out.add_stream(codec, rate=rate)
        assert isinstance(stream, av.AudioStream)
        stream.layout = layout
        formats = stream.codec_context.codec.audio_formats
        assert formats, f"{codec} lists no sample formats"
        resampler = av.AudioResampler(format=formats[0].name, layout=layout, rate=rate)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(planes), "fltp", layout)
        frame.sample_rate, frame.pts = source_rate, 0
        frame.time_base = Fraction(1, source_rate)
        for resampled in [*resampler.resample(frame), *resampler.resample(None)]:
            out.mux(stream.encode(resampled))
        out.mux(stream.encode(None))


def with_flac_total_samples(flac: bytes, total: int) -> bytes:
    """`flac` whose STREAMINFO declares `total` samples (per channel)."""
    data = bytearray(flac)
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first
    info = 8  # after the marker and the block header
    # the 36-bit total samples: the low 4 bits of byte 13, then bytes 14-17
    data[info + 13] = (data[info + 13] & 0xF0) | (total >> 32)
    data[info + 14 : info + 18] = struct.pack(">I", total & 0xFFFF_FFFF)
    return bytes(data)


def id3v2_tag(art_bytes: int, *, footer: bool = False) -> bytes:
    """An ID3v2.4 tag (section 3.1 of its structure document) holding one APIC frame (front
    cover, section 4.14 of its frames document) of `art_bytes` of "cover art": a PNG
    signature, then noise in which a FLAC stream's start, an ID3v2 header and an Ogg capture
    pattern lie, so a reader that searched the tag in front of a file for them, not passed it
    by its length, would be misled (between two FLACs joined, it would be: a tag there is
    bytes of the file before). `footer`: the tag ends with the 10-byte footer (section 3.4)."""
    rng = np.random.default_rng(art_bytes)
    art = bytearray(b"\x89PNG\r\n\x1a\n" + rng.integers(0, 256, art_bytes - 8, np.uint8).tobytes())
    for at, decoy in ((art_bytes // 4, b"fLaC\x00\x00\x00\x22"), (art_bytes // 2, b"ID3\x04\x00")):
        art[at : at + len(decoy)] = decoy
    art[-4:] = b"OggS"
    body = b"\x00image/png\x00\x03\x00" + art  # encoding, MIME type, picture type, description
    frame = b"APIC" + syncsafe(len(body)) + b"\x00\x00" + body
    flags = 0x10 if footer else 0x00
    tag = b"ID3\x04\x00" + bytes([flags]) + syncsafe(len(frame)) + frame
    return tag + (b"3DI" + tag[3:10] if footer else b"")


def syncsafe(size: int) -> bytes:
    """`size` as ID3v2's 4-byte syncsafe integer: 28 bits, 7 in each byte."""
    assert 0 <= size < 1 << 28
    return bytes((size >> shift) & 0x7F for shift in (21, 14, 7, 0))
