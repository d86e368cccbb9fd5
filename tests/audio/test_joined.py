"""livemeet.audio.joined: a chained Ogg file's links and FLAC files joined, read one at a time,
byte for byte."""

from __future__ import annotations

import array
import io
from typing import BinaryIO, cast

import numpy as np
import soundfile as sf

from livemeet.audio.joined import Tail, audio_start, members, splits
from tests.audio.conftest import id3v2_tag


def ogg(seconds: float, rate: int, subtype: str = "VORBIS") -> bytes:
    out = io.BytesIO()
    sf.write(out, np.zeros(round(seconds * rate), np.float32), rate, format="OGG", subtype=subtype)
    return out.getvalue()


class ShortReads(io.RawIOBase):
    """`data` in reads of at most `most` bytes, as a pipe gives it; keeps the largest read
    asked of it."""

    def __init__(self, data: bytes, most: int) -> None:
        self._data, self._offset, self._most = data, 0, most
        self.largest_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        self.largest_read = max(self.largest_read, len(buffer))
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
    it. A tag in front (ID3v2) is dropped: the first starts at its marker too."""
    files = [flac(1.0, 16_000), flac(0.5, 44_100, "PCM_24"), flac(2.0, 8_000)]
    tag = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10)  # a 10-byte tag
    data = tag + b"".join(files)
    for most in (3, 4096, 1 << 20):
        for size in (7, 1000, 1 << 16):
            parts = members(short_reads(data, most))
            got = [(read_all(m.reader, size), m.flac, m.flac_frames) for m in parts]
            assert got == [
                (files[0], True, 16_000),
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


def test_a_flac_behind_id3_tags_starts_at_its_marker() -> None:
    """Tags in front of a FLAC (any number, of any size, a footer too), passed by their
    lengths: the first member is the FLAC alone, from a pipe a read at a time (none asked
    over 64 KiB) or from a file (sought past). Behind a tag of more than 1 MiB the whole file
    was one member, not a FLAC."""
    files = [flac(1.0, 16_000), flac(0.5, 44_100, "PCM_24")]
    tags = id3v2_tag(1000) + id3v2_tag(2 << 20, footer=True)
    data = tags + b"".join(files)
    expected = [(files[0], True, 16_000), (files[1], True, 22_050)]
    for most in (1000, 1 << 20):  # (reads of a few bytes: the test above, a small tag)
        source = ShortReads(data, most)
        got = [(read_all(m.reader, 1000), m.flac, m.flac_frames) for m in members(source)]
        assert got == expected
        assert source.largest_read <= 1 << 16
    file = io.BytesIO(data)
    assert splits(file) and audio_start(file) == len(tags) and file.tell() == 0
    assert [(m.reader.read(), m.flac, m.flac_frames) for m in members(file)] == expected


def test_any_audio_behind_id3_tags_starts_at_its_start() -> None:
    """Tags in front of a format that `_AUDIO_START` knows (here a WAV, an Ogg chain, ADTS
    AAC: a sync whose layer is 0, never MPEG audio's) are dropped as in front of a FLAC: the
    first member begins at the audio's start, from a pipe and from a file. A WAV or ADTS
    was one member with its tags (a pipe's given back, which FFmpeg then refused past its
    probe's MiB), an Ogg chain too (FFmpeg then refused its links' change of rate)."""
    out = io.BytesIO()
    sf.write(out, np.zeros(8000, np.float32), 16_000, format="WAV", subtype="PCM_16")
    wav = out.getvalue()
    links = [ogg(1.0, 16_000), ogg(0.5, 48_000)]
    adts = b"\xff\xf1\x50\x80\x02\x1f\xfc" + bytes(100)  # its 7-byte header, then a frame
    tags = id3v2_tag(1000) + id3v2_tag(2 << 20)
    for parts in ([wav], links, [adts]):
        data = tags + b"".join(parts)
        assert audio_start(io.BytesIO(data)) == len(tags)
        for source in (short_reads(data, 4096), io.BytesIO(data)):
            assert [read_all(m.reader, 1000) for m in members(source)] == parts
    assert splits(io.BytesIO(tags + links[0])) and not splits(io.BytesIO(tags + wav))


def test_what_is_behind_id3_tags_is_a_flac_only_at_their_end() -> None:
    """Zeros after a tag (padding belongs inside it), or no FLAC at all: not a FLAC, as
    FFmpeg and libsndfile read it; nor is a header FFmpeg does not take for one (a size
    byte over 0x7F). Nor is one behind more than 16 tags (a tagger writes one or two): an
    upload of empty tags would cost a Python step per 10 bytes. Nor MPEG audio (an MP3's
    first frame header), whose tags FFmpeg reads: the source as it came."""
    one = flac(1.0, 16_000)
    tag, empty = id3v2_tag(1000), b"ID3\x04\x00\x00\x00\x00\x00\x00"
    assert audio_start(io.BytesIO(one)) == 0
    assert audio_start(io.BytesIO(tag + tag + one)) == 2 * len(tag)
    assert audio_start(io.BytesIO(empty * 16 + one)) == 160
    not_tags = bytearray(tag)
    not_tags[9] |= 0x80
    for data in (
        tag + bytes(100) + one,
        tag + b"\xff\xfb\x90\x64" + bytes(413),
        tag,
        bytes(not_tags) + one,
        empty * 17 + one,
    ):
        assert audio_start(io.BytesIO(data)) == 0 and not splits(io.BytesIO(data))
        parts = members(short_reads(data, 4096))
        member = next(parts)
        assert not member.flac and read_all(member.reader, 1000) == data
        assert next(parts, None) is None


def test_a_streams_tags_are_given_back_before_mpeg_audio() -> None:
    """A stream (no seek) of MPEG audio behind ID3v2 tags (an MP3: no start `_AUDIO_START`
    knows) is read by FFmpeg as it came: its tags' first 1 MiB (what FFmpeg's probe reads)
    as they were read, the rest as zeros, a whole tag past the first MiB as a stand-in tag
    of its length, so FFmpeg's reader of tags ends where it ended."""
    audio = b"\xff\xfb" + bytes(range(256)) * 100  # an MP3 frame's sync, then bytes
    first, second = id3v2_tag((1 << 20) + 5000), id3v2_tag(3000)
    small = id3v2_tag(1000) + audio  # small tags: given back as they were
    assert read_all(next(members(short_reads(small, 4096))).reader, 1000) == small
    data = first + second + audio
    got = read_all(next(members(short_reads(data, 4096))).reader, 1000)
    assert len(got) == len(data) and got.endswith(audio)
    assert got[: 1 << 20] == data[: 1 << 20]
    assert got[1 << 20 : len(first)] == bytes(len(first) - (1 << 20))
    stand_in = got[len(first) : len(first) + len(second)]
    assert stand_in[:6] == b"ID3\x04\x00\x00" and stand_in[10:] == bytes(len(second) - 10)
    assert stand_in[6:10] == second[6:10]  # the same size
    header_cut = id3v2_tag((1 << 20) - 37)  # the held MiB ends in the next tag's header
    data = header_cut + second + audio
    got = read_all(next(members(short_reads(data, 4096))).reader, 1000)
    assert got[: len(header_cut)] == header_cut and got.endswith(audio)
    stand_in = got[len(header_cut) : len(header_cut) + len(second)]
    assert stand_in[6:10] == second[6:10] and stand_in[10:] == bytes(len(second) - 10)
    assert len(got) == len(data)
    cut = first + second[:100]  # a stream that ends inside its second tag
    got = read_all(next(members(short_reads(cut, 4096))).reader, 1000)
    assert len(got) == len(cut) and got[: 1 << 20] == cut[: 1 << 20]


def test_tags_after_one_whose_header_the_held_mib_cuts_are_not_held() -> None:
    """The held MiB ends 5 bytes into the second tag's header: that tag and every one after
    it come back as stand-ins of their lengths, none of their bytes held. The third tag's
    first bytes were held in the room the cut header left, so the stream came back 5 bytes
    longer, its stand-in 5 bytes late (FFmpeg read a bogus tag size there)."""
    audio = b"\xff\xfb" + bytes(range(256)) * 100  # an MP3 frame's sync, then bytes
    first = id3v2_tag((1 << 20) - 5 - 33)  # 33: its header, its APIC frame's and more
    assert len(first) == (1 << 20) - 5
    second, third = id3v2_tag(3000), id3v2_tag(2000)
    data = first + second + third + audio
    got = read_all(next(members(short_reads(data, 4096))).reader, 1000)
    assert len(got) == len(data) and got.endswith(audio)
    assert got[: len(first)] == first
    stand_in = got[len(first) : -len(audio)]
    assert stand_in[:6] == b"ID3\x04\x00\x00" and stand_in[10:] == bytes(len(stand_in) - 10)
    size = sum(b << shift for b, shift in zip(stand_in[6:10], (21, 14, 7, 0), strict=True))
    assert size == len(second) + len(third) - 10


def test_a_tail_reads_into_any_writable_buffer_as_a_file_does() -> None:
    """`Tail` is a raw file from its start on: `readinto` fills any writable buffer with
    bytes, as a file's does (an int16 array, an array.array of shorts: their bytes, not
    items); such a buffer was refused (ValueError, "different structures"). Seeking and
    reading at and past its end read nothing; SEEK_END counts from the file's end."""
    data = b"ID3-tag-" + bytes(range(40))
    tail = Tail(io.BytesIO(data), 8)
    shorts = np.zeros(4, np.int16)
    assert tail.readinto(shorts) == 8 and shorts.tobytes() == bytes(range(8))
    packed = array.array("h", [0] * 3)
    assert tail.readinto(packed) == 6 and packed.tobytes() == bytes(range(8, 14))
    window = memoryview(bytearray(10))[2:6]
    assert tail.readinto(window) == 4 and bytes(window) == bytes(range(14, 18))
    assert tail.seek(-2, io.SEEK_END) == 38 and tail.read() == bytes([38, 39])
    assert tail.read(5) == b"" and tail.tell() == 40
    assert tail.seek(100) == 100 and tail.read(3) == b"" and tail.tell() == 100
