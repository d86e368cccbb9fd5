"""livemeet.audio.joined: a chained Ogg file's links and FLAC files joined, read one at a time,
byte for byte."""

from __future__ import annotations

import io
from typing import BinaryIO, cast

import numpy as np
import soundfile as sf

from livemeet.audio.joined import members


def ogg(seconds: float, rate: int, subtype: str = "VORBIS") -> bytes:
    out = io.BytesIO()
    sf.write(out, np.zeros(round(seconds * rate), np.float32), rate, format="OGG", subtype=subtype)
    return out.getvalue()


class ShortReads(io.RawIOBase):
    """`data` in reads of at most `most` bytes, as a pipe gives it."""

    def __init__(self, data: bytes, most: int) -> None:
        self._data, self._offset, self._most = data, 0, most

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        piece = self._data[self._offset : self._offset + min(len(buffer), self._most)]
        buffer[: len(piece)] = piece
        self._offset += len(piece)
        return len(piece)


def short_reads(data: bytes, most: int) -> BinaryIO:
    return cast(BinaryIO, ShortReads(data, most))


def read_all(member: BinaryIO, size: int) -> bytes:
    pieces = []
    while piece := member.read(size):
        pieces.append(piece)
    return b"".join(pieces)


def test_each_link_is_a_member_whatever_the_read_sizes() -> None:
    links = [ogg(1.0, 16_000), ogg(20.0, 48_000), ogg(0.5, 24_000, "OPUS")]
    data = b"".join(links)
    for most in (7, 4096, 1 << 20):
        for size in (1, 1000, 1 << 16):
            got = [read_all(m.reader, size) for m in members(short_reads(data, most))]
            assert got == links


def test_bytes_between_pages_go_with_the_page_before() -> None:
    """Damage, or a tag between two links: handed on (FFmpeg skips to the next page), and
    the next link still starts its own member."""
    first, second = ogg(1.0, 16_000), ogg(1.0, 48_000)
    junk = b"junk" * 50_000  # longer than a read of the source
    got = [m.reader.read() for m in members(io.BytesIO(first + junk + second))]
    assert got == [first + junk, second]


def test_other_files_and_cut_ones_are_one_member() -> None:
    wav = io.BytesIO()
    sf.write(wav, np.zeros(16_000, np.float32), 16_000, format="WAV")
    assert [m.reader.read() for m in members(io.BytesIO(wav.getvalue()))] == [wav.getvalue()]
    assert [m.reader.read() for m in members(io.BytesIO(b""))] == [b""]
    first, second = ogg(1.0, 16_000), ogg(1.0, 48_000)
    cut = first + second[:40]  # inside the next link's first page
    assert [m.reader.read() for m in members(io.BytesIO(cut))] == [first, second[:40]]


def test_what_a_member_leaves_unread_is_skipped() -> None:
    first, second = ogg(1.0, 16_000), ogg(1.0, 48_000)
    parts = members(io.BytesIO(first + second))
    assert first.startswith(next(parts).reader.read(100))  # its first page, or part of it
    assert next(parts).reader.read() == second


def flac(seconds: float, rate: int, subtype: str = "PCM_16") -> bytes:
    out = io.BytesIO()
    noise = np.random.default_rng(rate).uniform(-0.5, 0.5, round(seconds * rate))
    sf.write(out, noise.astype(np.float32), rate, format="FLAC", subtype=subtype)
    return out.getvalue()


def test_flac_files_joined_are_members_with_their_declared_lengths() -> None:
    """Each starts at its marker and STREAMINFO block header; its total samples come with
    it. A tag in front (ID3v2) goes with the first."""
    files = [flac(1.0, 16_000), flac(0.5, 44_100, "PCM_24"), flac(2.0, 8_000)]
    tag = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10)  # a 10-byte tag
    data = tag + b"".join(files)
    for most in (3, 4096, 1 << 20):
        for size in (7, 1000, 1 << 16):
            parts = members(short_reads(data, most))
            got = [(read_all(m.reader, size), m.flac, m.flac_frames) for m in parts]
            assert got == [
                (tag + files[0], True, 16_000),
                (files[1], True, 22_050),
                (files[2], True, 16_000),
            ]


def test_a_flac_marker_alone_does_not_split() -> None:
    """ "fLaC" in a frame's bytes (1 in 2**32 a position) without STREAMINFO's block header
    after it is audio, not a file's start."""
    one = flac(1.0, 16_000)
    middle = len(one) // 2
    data = one[:middle] + b"fLaC\x00\x00\x00\x21" + one[middle:]
    assert [m.reader.read() for m in members(io.BytesIO(data))] == [data]
