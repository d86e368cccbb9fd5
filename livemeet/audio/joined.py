"""Files joined end to end, read one member at a time: the links of a chained Ogg file (Ogg
files joined with cat, or a stream recorder's dump whose settings changed). FFmpeg reads such
a file as one stream and refuses a member whose format differs from the first's; each member
read alone gets its own demuxer and decoder, so its own rate, channels, codec and gapless
trimming (audio/decode.py decodes them in turn). Pure byte bookkeeping: no decoding.

- Ogg (RFC 3533): a physical stream is a series of pages, each a 27-byte header (capture
  pattern "OggS", version 0, a flags byte, granule position, serial number, sequence number,
  CRC, segment count) then that many lacing values, whose sum is the length of the body that
  follows. A link begins with the beginning-of-stream (BOS, flag 0x02) pages of its logical
  streams, all together before any other page, so a BOS page after any other page begins the
  next link. FFmpeg's Ogg demuxer refuses a link of another sample rate or channel count
  ("Sample rate change is not supported": AVERROR_PATCHWELCOME) and one of another codec
  (EINVAL): a Vorbis link of 16 kHz followed by one of 48 kHz was BadAudio.

The probe's duration of a chained file stays FFmpeg's: the last page's granule at the first
link's rate, so a later link of a higher rate overstates it (3 s at 16 kHz then 3 s at 48
kHz: 9 s), which only the length limit's check before decoding sees.

The members are read as they are needed, a page at a time: a file of hours, or a pipe, is
never read ahead. A source that is not Ogg is one member, to its end; bytes between Ogg pages
(damage) go with the page before them, as FFmpeg's demuxer skips them.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO, cast

OGG_CAPTURE = b"OggS"
_OGG_HEADER_BYTES = 27  # before the lacing values
_OGG_BOS = 0x02  # header flags: the first page of a logical stream
_READ_BYTES = 1 << 16  # bytes read from the source at a time


def members(raw: BinaryIO) -> Iterator[BinaryIO]:
    """The members of the file `raw` reads from its current position, in order: each a
    readable, unseekable stream of that member's bytes. One member (everything, maybe
    nothing) unless `raw` is an Ogg file of several links. Whatever a member's reader left
    unread is skipped when the next is taken."""
    splitter = _Splitter(raw)
    while True:
        yield cast(BinaryIO, _Member(splitter))  # a raw stream: what PyAV reads of a file
        if not splitter.next_member():
            return


class _Splitter:
    """`raw`'s bytes, buffered a page ahead, and where the current member ends."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._buffer = bytearray()  # read from `raw`, not yet handed to a member
        self._eof = False
        self._fill(len(OGG_CAPTURE))
        self._ogg = self._buffer.startswith(OGG_CAPTURE)  # else one member, passed through
        self._page_left = 0  # bytes of the current page not yet handed over
        self._in_body = False  # the member has had a page other than a BOS page
        self._member_ended = False  # the page at the buffer's head begins another member

    def next_member(self) -> bool:
        """Skip what is left of the current member and start the next; False if none."""
        scratch = memoryview(bytearray(_READ_BYTES))
        while self.read_into(scratch):
            pass
        if not self._member_ended:
            return False
        self._member_ended = self._in_body = False
        return True

    def read_into(self, out: memoryview) -> int:
        """Copy the current member's next bytes into `out`; 0 at its end."""
        if not self._ogg:
            return self._take(out)
        if self._page_left == 0 and not self._next_page():
            return 0
        n = self._take(out[: self._page_left])
        self._page_left -= n
        return n

    def _take(self, out: memoryview) -> int:
        """Move up to len(out) bytes from the buffer into `out`, reading once if it is empty
        (a pipe's writer may not have written more yet)."""
        if not self._buffer:
            self._fill(1)
        n = min(len(out), len(self._buffer))
        out[:n] = self._buffer[:n]
        del self._buffer[:n]  # a bytearray drops its head in place, without a copy
        return n

    def _next_page(self) -> bool:
        """Measure the page at the buffer's head; False where it begins another member or
        nothing is left."""
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

    def _fill(self, size: int) -> None:
        """Read until the buffer holds `size` bytes, or `raw` ends."""
        while len(self._buffer) < size and not self._eof:
            piece = self._raw.read(max(size - len(self._buffer), _READ_BYTES))
            if piece:
                self._buffer += piece
            else:
                self._eof = True


class _Member(io.RawIOBase):
    """One member's bytes, as FFmpeg reads a pipe."""

    def __init__(self, splitter: _Splitter) -> None:
        self._splitter = splitter

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        return self._splitter.read_into(memoryview(buffer).cast("B"))
