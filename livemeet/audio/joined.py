"""Files joined end to end, read one member at a time: the links of a chained Ogg file (Ogg
files joined with cat, or a stream recorder's dump whose settings changed) and FLAC files
joined with cat. FFmpeg reads such a file as one stream and refuses or garbles a member
whose format differs from the first's; each member read alone gets its own demuxer and
decoder, so its own rate, channels, bit depth, codec and gapless trimming (audio/decode.py
decodes them in turn). Pure byte bookkeeping: no decoding.

- Ogg (RFC 3533): a physical stream is a series of pages, each a 27-byte header (capture
  pattern "OggS", version 0, a flags byte, granule position, serial number, sequence number,
  CRC, segment count) then that many lacing values, whose sum is the length of the body that
  follows. A link begins with the beginning-of-stream (BOS, flag 0x02) pages of its logical
  streams, all together before any other page, so a BOS page after any other page begins the
  next link. FFmpeg's Ogg demuxer refuses a link of another sample rate or channel count
  ("Sample rate change is not supported": AVERROR_PATCHWELCOME) and one of another codec
  (EINVAL): a Vorbis link of 16 kHz followed by one of 48 kHz was BadAudio.
- FLAC (RFC 9639): a stream begins with its marker "fLaC" and STREAMINFO, whose block header
  (type 0, maybe flagged the last block, 34 bytes) makes 8 known bytes; frames carry no
  length, so the next member is found by looking for those bytes. FFmpeg's parser, finding
  frames by their headers, passes over a second file's header: its decoder rejected every
  frame of another bit depth (it cannot switch), lost a frame at a 48 -> 16 kHz join, and
  took a 16 kHz 24-bit file after a 44.1 kHz 16-bit one as trailing bytes of the first's
  last frame, dropped without an error. Each member's STREAMINFO total samples come with it
  (`Member`). An ID3v2 tag before the first marker goes with the first member.

The probe's duration of a chained Ogg file stays FFmpeg's: the last page's granule (the last
link's own length) at the first link's rate, so it understates a chain of one rate (3 s then
2 s: 2 s) and a later link of a higher rate overstates it (3 s at 16 kHz then 3 s at 48 kHz:
9 s), which only the length limit's check before decoding sees (audio/decode.py).

The members are read as they are needed, a page or a read at a time: a file of hours, or a
pipe, is never read ahead. A source that is neither is one member, to its end; bytes between
Ogg pages (damage) go with the page before them, as FFmpeg's demuxer skips them. The FLAC
search costs a pass over the bytes: a 37-minute 16 kHz speech FLAC (38 MB) decodes in
~0.46 CPU-s, ~0.42 read by FFmpeg itself.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple, cast

OGG_CAPTURE = b"OggS"
_OGG_HEADER_BYTES = 27  # before the lacing values
_OGG_BOS = 0x02  # header flags: the first page of a logical stream
FLAC_MARKER = b"fLaC"
# what begins a FLAC stream: its marker, then STREAMINFO's block header (type 0, maybe flagged
# the last block; 34 bytes long). 8 given bytes: by chance in frame data about once in 2**63
_FLAC_START = re.compile(re.escape(FLAC_MARKER) + b"[\x00\x80]\x00\x00\x22")
_FLAC_START_BYTES = 8
_FLAC_TOTAL_SAMPLES_AT = 21  # STREAMINFO's 36-bit total samples: the low 4 bits of this byte,
_FLAC_HEAD_BYTES = 26  # then 4 bytes (big-endian), from the member's first byte
_ID3_HEADER_BYTES = 10  # an ID3v2 tag's header: "ID3", version (2), flags, size (4 x 7 bits)
# bytes of an ID3v2 tag looked past for a FLAC marker (held in memory while it is): a FLAC
# behind a larger one (cover art) is read as one stream, as FFmpeg reads it
_MAX_ID3_TAG_BYTES = 1 << 20
_READ_BYTES = 1 << 16  # bytes read from the source at a time


class Member(NamedTuple):
    """One member of a file (`members`)."""

    reader: BinaryIO  # its bytes: a readable, unseekable raw stream
    flac: bool  # a FLAC stream
    flac_frames: int  # its STREAMINFO total samples (0: unknown, or not a FLAC)


def splits(raw: BinaryIO) -> bool:
    """Whether the seekable file `raw` is one `members` may split: an Ogg or FLAC file (a
    FLAC behind an ID3v2 tag too). Reads its first bytes and leaves it at its start."""
    head = raw.read(_ID3_HEADER_BYTES)
    at = _id3_tag_bytes(head)
    if at:
        raw.seek(at)
        head = raw.read(len(FLAC_MARKER))
    raw.seek(0)
    return head.startswith((OGG_CAPTURE, FLAC_MARKER))


def members(raw: BinaryIO) -> Iterator[Member]:
    """The members of the file `raw` reads from its current position, in order. One member
    (everything, maybe nothing) unless `raw` is an Ogg file of several links or FLAC files
    joined. Whatever a member's reader left unread is skipped when the next is taken."""
    splitter = _Splitter(raw)
    while True:
        reader = cast(BinaryIO, _Member(splitter))  # a raw stream: what PyAV reads of a file
        yield Member(reader, splitter.flac, splitter.flac_frames())
        if not splitter.next_member():
            return


class _Splitter:
    """`raw`'s bytes, buffered a page or a block ahead, and where the current member ends."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._buffer = bytearray()  # read from `raw`, not yet handed to a member
        self._eof = False
        self._fill(_ID3_HEADER_BYTES)
        # a FLAC may follow an ID3v2 tag, which goes with the first member
        self._head = _id3_tag_bytes(bytes(self._buffer[:_ID3_HEADER_BYTES]))
        self._fill(self._head + len(FLAC_MARKER))
        kind = bytes(self._buffer[self._head : self._head + len(FLAC_MARKER)])
        self._ogg = self._head == 0 and kind == OGG_CAPTURE
        self.flac = kind == FLAC_MARKER  # FLAC files (one, or joined)
        self._page_left = 0  # Ogg: bytes of the current page not yet handed over
        self._clear = 0  # FLAC: bytes at the buffer's head known to be the current member's
        self._in_body = False  # Ogg: the member has had a page other than a BOS page
        self._member_ended = False  # the bytes at the buffer's head begin another member

    def flac_frames(self) -> int:
        """The current member's STREAMINFO total samples; call before reading it."""
        if not self.flac:
            return 0
        start = self._head + _FLAC_TOTAL_SAMPLES_AT
        self._fill(self._head + _FLAC_HEAD_BYTES)
        head = self._buffer[start : start + 5]
        return ((head[0] & 0x0F) << 32) | int.from_bytes(head[1:], "big") if len(head) == 5 else 0

    def next_member(self) -> bool:
        """Skip what is left of the current member and start the next; False if none."""
        while self.read(_READ_BYTES):
            pass
        if not self._member_ended:
            return False
        self._member_ended = self._in_body = False
        return True

    def read(self, size: int) -> bytes:
        """The current member's next bytes, at most `size` of them; none at its end."""
        if self._ogg:
            if self._page_left == 0 and not self._next_page():
                return b""
            piece = self._take(min(size, self._page_left))
            self._page_left -= len(piece)
            return piece
        if self.flac:
            return self._take(min(size, self._flac_span()))
        return self._take(size)

    def _take(self, size: int) -> bytes:
        """Up to `size` bytes off the buffer's head, reading once if it is empty (a pipe's
        writer may not have written more yet)."""
        if not self._buffer:
            self._fill(1)
        with memoryview(self._buffer) as view:  # released before the buffer is resized
            piece = bytes(view[:size])
        del self._buffer[: len(piece)]  # a bytearray drops its head in place, without a copy
        self._head = max(self._head - len(piece), -1)
        self._clear = max(self._clear - len(piece), 0)
        return piece

    def _next_page(self) -> bool:
        """Measure the Ogg page at the buffer's head; False where it begins another member
        or nothing is left."""
        if self._member_ended:
            return False
        self._fill(_OGG_HEADER_BYTES)
        header = bytes(self._buffer[:_OGG_HEADER_BYTES])
        if len(header) < _OGG_HEADER_BYTES:  # a page cut short, or nothing: what is left
            self._page_left = len(header)
            return self._page_left > 0
        if not header.startswith(OGG_CAPTURE) or header[4]:
            # not a page (damage, bytes between pages): handed on to the next capture
            # pattern, which FFmpeg's demuxer skips to as well
            at = self._buffer.find(OGG_CAPTURE, 1)
            self._page_left = at if at > 0 else max(len(self._buffer) - len(OGG_CAPTURE), 1)
            return True
        num_segments = header[26]
        self._fill(_OGG_HEADER_BYTES + num_segments)
        lacing = self._buffer[_OGG_HEADER_BYTES : _OGG_HEADER_BYTES + num_segments]
        bos = bool(header[5] & _OGG_BOS)
        if bos and self._in_body:
            self._member_ended = True
            return False
        self._in_body = self._in_body or not bos
        self._page_left = _OGG_HEADER_BYTES + num_segments + sum(lacing)
        return True

    def _flac_span(self) -> int:
        """How many bytes at the buffer's head are the current FLAC member's for sure: up to
        the next member's start, or all but a start's length less one (it may begin there);
        0 where the next member begins (`_member_ended`) or nothing is left."""
        if self._member_ended:
            return 0
        if self._clear:  # looked through already
            return self._clear
        if len(self._buffer) < _FLAC_START_BYTES:
            self._fill(_FLAC_START_BYTES)
        # the member's own start, at `_head` until it is handed over, is not the next's
        at = _find_flac_start(self._buffer, self._head + 1)
        if at == 0:
            self._member_ended = True
            self._head = 0
            return 0
        if at > 0:
            self._clear = at
        elif self._eof:
            self._clear = len(self._buffer)
        else:
            self._clear = max(len(self._buffer) - _FLAC_START_BYTES + 1, 1)
        return self._clear

    def _fill(self, size: int) -> None:
        """Read until the buffer holds `size` bytes, or `raw` ends."""
        while len(self._buffer) < size and not self._eof:
            piece = self._raw.read(max(size - len(self._buffer), _READ_BYTES))
            if piece:
                self._buffer += piece
            else:
                self._eof = True


def _find_flac_start(data: bytearray, start: int) -> int:
    """Where a FLAC stream's start (`_FLAC_START`) is in `data` from `start` on; -1 if none."""
    found = _FLAC_START.search(data, start)
    return found.start() if found else -1


def _id3_tag_bytes(head: bytes) -> int:
    """The length of the ID3v2 tag `head` (a file's first bytes) begins, header and footer
    included (ID3v2.4 section 3.1); 0 if none, or one over `_MAX_ID3_TAG_BYTES`."""
    if len(head) < _ID3_HEADER_BYTES or not head.startswith(b"ID3"):
        return 0
    size = 0
    for byte in head[6:10]:  # 28 bits, 7 in each byte
        size = size << 7 | byte & 0x7F
    footer = 10 if head[5] & 0x10 else 0
    length = _ID3_HEADER_BYTES + size + footer
    return length if length <= _MAX_ID3_TAG_BYTES else 0


class _Member(io.RawIOBase):
    """One member's bytes, as FFmpeg reads a pipe: PyAV calls `read` (no `seek`)."""

    def __init__(self, splitter: _Splitter) -> None:
        self._splitter = splitter

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            return self.readall()
        return self._splitter.read(size)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        piece = self._splitter.read(len(out))
        out[: len(piece)] = piece
        return len(piece)
