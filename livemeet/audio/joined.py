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
  (`Member`). A tag before a later member is bytes of the one before it, which FFmpeg's
  parser passes over.
- Leading ID3v2 tags (ID3v2.4 section 3.1: a 10-byte header whose 28-bit size, plus a
  footer where its flag says so, gives the tag's length), one or several one after another
  as FFmpeg reads them (up to 16), of any size (cover art of MiB), are passed by their
  lengths and dropped where the start of a format in `_AUDIO_START` follows them: the
  first member begins there, and the file decodes as without them (`audio_start`,
  `_Splitter._past_tags`; audio/decode.py says which formats, and what the libraries did
  with the tags). In front of anything else, MPEG audio above all (FFmpeg reads an MP3's
  tags and decodes it behind tags of any size), they are read as they came.

The probe's duration of a chained Ogg file stays FFmpeg's: the last page's granule (the last
link's own length) at the first link's rate, so it understates a chain of one rate (3 s then
2 s: 2 s) and a later link of a higher rate overstates it (3 s at 16 kHz then 3 s at 48 kHz:
9 s), which only the length limit's check before decoding sees (audio/decode.py).

The members are read as they are needed, a page or a read at a time: a file of hours, or a
pipe, is never read ahead (leading tags are passed first: sought past in a file, read a
block at a time from a pipe). A source that is neither is one member, to its end, past
leading tags dropped, else as it came (a pipe's tags given back); bytes between Ogg pages
(damage) go with the page before them, as FFmpeg's demuxer skips them. The FLAC search
costs a pass over the bytes: a 37-minute 16 kHz speech FLAC (38 MB) decodes in ~0.46 CPU-s,
~0.42 read by FFmpeg itself.
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
RIFX_MARKER = b"RIFX"  # a big-endian WAV's first bytes (RIFF's are little-endian)
# what begins a FLAC stream: its marker, then STREAMINFO's block header (type 0, maybe flagged
# the last block; 34 bytes long). 8 given bytes: by chance in frame data about once in 2**63
_FLAC_START = re.compile(re.escape(FLAC_MARKER) + b"[\x00\x80]\x00\x00\x22")
_FLAC_START_BYTES = 8
_FLAC_TOTAL_SAMPLES_AT = 21  # STREAMINFO's 36-bit total samples: the low 4 bits of this byte,
_FLAC_HEAD_BYTES = 26  # then 4 bytes (big-endian), from the member's first byte
_ID3_HEADER_BYTES = 10  # an ID3v2 tag's header: "ID3", version (2), flags, size (4 x 7 bits)
_ID3_FOOTER_FLAG = 0x10  # header flags: a footer (10 bytes) ends the tag
_MAX_ID3_SIZE = (1 << 28) - 1  # a header's size: 28 bits, 7 in each of 4 bytes
# leading ID3v2 tags looked past, at most (taggers write one, at times two): an upload of
# tags of 10 bytes each would otherwise cost a step of Python per 10 bytes
_MAX_ID3_TAGS = 16
# The starts of the formats whose leading ID3v2 tags are dropped (`audio_start`), in the
# first `_AUDIO_START_BYTES` after them: FLAC and Ogg (split here), RIFF (WAV, and AVI),
# big-endian RIFX, RF64 and BW64, Sonic Foundry Wave64's "riff" GUID, IFF FORM (AIFF,
# AIFC, 8SVX), CAF, AU, NIST SPHERE, ADTS AAC (sync 0xFFF, layer 0: never MPEG audio, whose
# layer is 1-3), AC-3 and E-AC-3, MP4/MOV (an ftyp box first), EBML (Matroska, WebM),
# WavPack and TTA. Not MPEG audio (MP3, MP2): FFmpeg reads its tags, whatever their size,
# and decodes it as it did.
_AUDIO_START = re.compile(
    rb"fLaC|OggS|RIFF|RIFX|RF64|BW64|riff\x2e\x91\xcf\x11\xa5\xd6\x28\xdb|FORM|caff|\.snd"
    rb"|NIST_1A\n|\xff[\xf0\xf1\xf8\xf9]|\x0b\x77|\x1a\x45\xdf\xa3|....ftyp|wvpk|TTA1",
    re.DOTALL,
)
_AUDIO_START_BYTES = 12
# bytes of a stream's leading ID3v2 tags held while looking past them for an audio start, to
# give back as they were read if none follows: FFmpeg's format probe reads at most this many
# (PROBE_BUF_MAX), so it sees what it saw before (`_Splitter._past_tags`)
_MAX_HELD_TAG_BYTES = 1 << 20
_READ_BYTES = 1 << 16  # bytes read from the source at a time


class Member(NamedTuple):
    """One member of a file (`members`)."""

    reader: BinaryIO  # its bytes: a readable, unseekable raw stream
    flac: bool  # a FLAC stream
    flac_frames: int  # its STREAMINFO total samples (0: unknown, or not a FLAC)
    rifx: bool  # a big-endian WAV (RIFX), which FFmpeg's WAV demuxer reads as little-endian


def splits(raw: BinaryIO) -> bool:
    """Whether the seekable file `raw` is one `members` may split: an Ogg or FLAC file (behind
    ID3v2 tags too: `audio_start`). Reads its first bytes and leaves it at its start."""
    raw.seek(audio_start(raw))
    head = raw.read(len(FLAC_MARKER))
    raw.seek(0)
    return head in (FLAC_MARKER, OGG_CAPTURE)


def audio_start(raw: BinaryIO) -> int:
    """Where the audio in the seekable file `raw` begins, in bytes: past the ID3v2 tags in
    front of it (up to `_MAX_ID3_TAGS` of them, of any size: only their headers are read)
    where the start of a format in `_AUDIO_START` follows them, else 0 (no tags, or tags in
    front of anything else, MPEG audio among them: read as they are). Leaves `raw` at its
    start."""
    at = 0
    for _ in range(_MAX_ID3_TAGS + 1):
        raw.seek(at)
        head = raw.read(max(_ID3_HEADER_BYTES, _AUDIO_START_BYTES))
        if not (length := _id3_tag_bytes(head)):
            break
        at += length
    raw.seek(0)
    return at if _AUDIO_START.match(head) else 0


class Tail(io.RawIOBase):
    """The seekable file `raw` from byte `start` on, read and sought as a file of its own (the
    audio past the ID3v2 tags in front of it: `audio_start`). Each Tail keeps its own
    position, and seeks `raw` to it before each read."""

    def __init__(self, raw: BinaryIO, start: int) -> None:
        self._raw, self._start, self._at = raw, start, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._at
        elif whence == io.SEEK_END:
            offset += self._raw.seek(0, io.SEEK_END) - self._start
        if offset < 0:
            raise OSError(f"cannot seek to {offset}, before the start")
        self._at = offset
        return offset

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        self._raw.seek(self._start + self._at)
        # bytes into any writable buffer, as a file's readinto (one of shorts too: its bytes)
        with memoryview(buffer) as view, view if view.format == "B" else view.cast("B") as out:
            piece = self._raw.read(len(out))
            out[: len(piece)] = piece
        self._at += len(piece)
        return len(piece)


def members(raw: BinaryIO) -> Iterator[Member]:
    """The members of the file `raw` reads from its current position, in order. One member
    (everything, maybe nothing) unless `raw` is an Ogg file of several links or FLAC files
    joined. Whatever a member's reader left unread is skipped when the next is taken."""
    splitter = _Splitter(raw)
    while True:
        reader = cast(BinaryIO, _Member(splitter))  # a raw stream: what PyAV reads of a file
        yield Member(reader, splitter.flac, splitter.flac_frames(), splitter.rifx)
        if not splitter.next_member():
            return


class _Splitter:
    """`raw`'s bytes, buffered a page or a block ahead, and where the current member ends."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._buffer = bytearray()  # read from `raw`, not yet handed to a member
        self._eof = False
        # a stream's leading ID3v2 tags given back (`_past_tags`), in pieces, before the buffer
        self._given_back: Iterator[bytes] = iter(())
        self._piece = b""  # what reads left of the last piece given back
        self._past_tags()
        self._fill(len(FLAC_MARKER))
        # FLAC files (one, or joined); Ogg pages (a chained file's links). Never where tags
        # were given back: they come first
        self.flac = self._buffer.startswith(FLAC_MARKER) and not self._piece
        self._ogg = self._buffer.startswith(OGG_CAPTURE) and not self._piece
        self.rifx = self._buffer.startswith(RIFX_MARKER) and not self._piece  # one member
        self._head = 0  # where the current FLAC member begins in the buffer, until handed over
        self._page_left = 0  # Ogg: bytes of the current page not yet handed over
        self._clear = 0  # FLAC: bytes at the buffer's head known to be the current member's
        self._in_body = False  # Ogg: the member has had a page other than a BOS page
        self._member_ended = False  # the bytes at the buffer's head begin another member

    def _past_tags(self) -> None:
        """Pass the ID3v2 tags `raw` begins with (as `audio_start`). Where the start of a
        format in `_AUDIO_START` follows them, they are dropped, whatever their size (cover
        art of megabytes): the first member begins there, and its decode is the untagged
        file's. Where none does, `raw` reads as it did: a seekable one is sought back; a
        stream's tags are given back in front of the buffer, their first
        `_MAX_HELD_TAG_BYTES` as they were read and the rest as zeros, but for whole tags
        whose headers lie past those bytes or across their end (and every tag after such
        a one), given back as stand-ins of their length
        (`_stand_in_tags`): FFmpeg probes the bytes it probed, and its ID3v2 reader, going
        from tag to tag by their lengths, ends where it ended (MP3: decoded behind tags of
        any size as before; what is lost is tag content past the first MiB, which FFmpeg
        reads as metadata and cover art, not audio)."""
        seekable = self._raw.seekable()
        start = self._raw.tell() if seekable else 0
        held = bytearray()  # a stream's first tag bytes (up to _MAX_HELD_TAG_BYTES)
        # where the held bytes end: the start of the first tag whose header they cut (the
        # room it leaves in `held` fills with later tags' bytes, which are stand-ins too)
        held_end = _MAX_HELD_TAG_BYTES
        at = 0  # bytes of tags passed
        # the rest, given back: zeros to the end of the tag `held` ends in, then the whole
        # tags after it (as stand-ins), then zeros for a tag `raw` ended in
        num_zeros = num_stand_in = num_cut = 0
        self._fill(_ID3_HEADER_BYTES)
        for _ in range(_MAX_ID3_TAGS):
            if not (length := _id3_tag_bytes(bytes(self._buffer[:_ID3_HEADER_BYTES]))):
                break
            passed = self._drop(length, None if seekable else held)
            if at + _ID3_HEADER_BYTES <= _MAX_HELD_TAG_BYTES:  # its header is held
                num_zeros += max(at + passed - _MAX_HELD_TAG_BYTES, 0)
            else:  # a header the held bytes cut goes with the stand-in instead
                held_end = min(held_end, at)
                if passed == length:
                    num_stand_in += length
                else:
                    num_cut = passed
            at += passed
            self._fill(_ID3_HEADER_BYTES)
        del held[held_end:]
        if not at:
            return
        self._fill(_AUDIO_START_BYTES)
        if _AUDIO_START.match(self._buffer):
            return
        if seekable:
            self._raw.seek(start)
            self._buffer.clear()
            self._eof = False
        else:
            self._given_back = _given_back(bytes(held), num_zeros, num_stand_in, num_cut)
            self._piece = next(self._given_back)

    def _drop(self, size: int, held: bytearray | None) -> int:
        """Pass `size` bytes (fewer where `raw` ends first): sought past in a seekable `raw`
        (`held` None), else read a block at a time, kept in `held` while it is shorter than
        `_MAX_HELD_TAG_BYTES`. Returns how many bytes were passed."""
        passed = min(size, len(self._buffer))
        if held is not None:
            held += self._buffer[: min(passed, _MAX_HELD_TAG_BYTES - len(held))]
        del self._buffer[:passed]
        if passed < size and held is None:
            here = self._raw.tell()
            end = self._raw.seek(0, io.SEEK_END)
            passed += self._raw.seek(min(here + size - passed, end)) - here
        while passed < size and not self._eof:
            piece = self._raw.read(min(size - passed, _READ_BYTES))
            if not piece:
                self._eof = True
            elif held is not None and len(held) < _MAX_HELD_TAG_BYTES:
                held += piece[: _MAX_HELD_TAG_BYTES - len(held)]
            passed += len(piece)
        return passed

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
        if self._piece:  # a stream's tags given back come first
            piece, self._piece = self._piece[:size], self._piece[size:]
            if not self._piece:
                self._piece = next(self._given_back, b"")
            return piece
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
    """The length of the ID3v2 tag whose header `head` begins with, header and footer
    included (ID3v2.4 section 3.1); 0 if none. A header as FFmpeg's ID3v2 reader takes one:
    version and revision other than 0xFF, each size byte under 0x80."""
    if len(head) < _ID3_HEADER_BYTES or not head.startswith(b"ID3"):
        return 0
    if 0xFF in head[3:5] or any(byte & 0x80 for byte in head[6:10]):
        return 0
    size = 0
    for byte in head[6:10]:  # 28 bits, 7 in each byte
        size = size << 7 | byte
    footer = _ID3_HEADER_BYTES if head[5] & _ID3_FOOTER_FLAG else 0
    return _ID3_HEADER_BYTES + size + footer


def _given_back(held: bytes, num_zeros: int, num_stand_in: int, num_cut: int) -> Iterator[bytes]:
    """A stream's leading ID3v2 tags given back (`_Splitter._past_tags`), in non-empty pieces
    of at most _READ_BYTES: the `held` bytes, `num_zeros` zeros, stand-in tags taking up
    `num_stand_in` bytes, then `num_cut` zeros."""
    for at in range(0, len(held), _READ_BYTES):
        yield held[at : at + _READ_BYTES]
    yield from _zeros(num_zeros)
    for header, num_padding in _stand_in_tags(num_stand_in):
        yield header
        yield from _zeros(num_padding)
    yield from _zeros(num_cut)


def _stand_in_tags(num_bytes: int) -> Iterator[tuple[bytes, int]]:
    """ID3v2.4 tags of padding alone that take up `num_bytes` (0, or 10 or more: whole tags),
    as (header, bytes of padding after it): a tag's size has 28 bits, so more than 256 MiB
    are several."""
    while num_bytes:
        length = num_bytes if num_bytes <= _ID3_HEADER_BYTES + _MAX_ID3_SIZE else 1 << 27
        size = length - _ID3_HEADER_BYTES
        syncsafe = bytes((size >> shift) & 0x7F for shift in (21, 14, 7, 0))
        yield b"ID3\x04\x00\x00" + syncsafe, size
        num_bytes -= length


def _zeros(num_bytes: int) -> Iterator[bytes]:
    """`num_bytes` zeros, in non-empty pieces of at most _READ_BYTES."""
    for at in range(0, num_bytes, _READ_BYTES):
        yield bytes(min(_READ_BYTES, num_bytes - at))


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
