"""livemeet.audio.joined: a chained Ogg file's links, read one at a time, byte for byte."""

from __future__ import annotations

import io

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


def read_all(member: io.RawIOBase, size: int) -> bytes:
    pieces = []
    while piece := member.read(size):
        pieces.append(piece)
    return b"".join(pieces)


def test_each_link_is_a_member_whatever_the_read_sizes() -> None:
    links = [ogg(1.0, 16_000), ogg(20.0, 48_000), ogg(0.5, 24_000, "OPUS")]
    data = b"".join(links)
    for most in (7, 4096, 1 << 20):
        for size in (1, 1000, 1 << 16):
            source = ShortReads(data, most)
            got = [read_all(m, size) for m in members(source)]  # type: ignore[arg-type]
            assert got == links


def test_bytes_between_pages_go_with_the_page_before() -> None:
    """Damage, or a tag between two links: handed on (FFmpeg skips to the next page), and
    the next link still starts its own member."""
    first, second = ogg(1.0, 16_000), ogg(1.0, 48_000)
    junk = b"junk" * 50_000  # longer than a read of the source
    got = [m.read() for m in members(io.BytesIO(first + junk + second))]
    assert got == [first + junk, second]


def test_other_files_and_cut_ones_are_one_member() -> None:
    wav = io.BytesIO()
    sf.write(wav, np.zeros(16_000, np.float32), 16_000, format="WAV")
    assert [m.read() for m in members(io.BytesIO(wav.getvalue()))] == [wav.getvalue()]
    assert [m.read() for m in members(io.BytesIO(b""))] == [b""]
    first, second = ogg(1.0, 16_000), ogg(1.0, 48_000)
    cut = first + second[:40]  # inside the next link's first page
    assert [m.read() for m in members(io.BytesIO(cut))] == [first, second[:40]]


def test_what_a_member_leaves_unread_is_skipped() -> None:
    first, second = ogg(1.0, 16_000), ogg(1.0, 48_000)
    parts = members(io.BytesIO(first + second))
    assert first.startswith(next(parts).read(100))  # its first page, or part of it
    assert next(parts).read() == second
