"""Sample-exact trimming where FFmpeg's own trimming of encoder delay (priming) and of the
last frame's padding falls short: which samples of each decoded frame to keep. `trim_for`
picks the `Trim` a stream needs; audio/decode.py's FFmpeg loop shows it each packet and
slices each frame by its answer ("Sample-exact lengths" there). Pure bookkeeping on PyAV's
packets and frames: no I/O, no decoding.

Where each format records its audio's true extent (what the classes below read):
- MP4, M4A, MOV, 3GP: the edit list (the `elst` box of ISO/IEC 14496-12, the ISO base media
  file format; Apple's QuickTime File Format, appendix "Audio Priming - Handling Encoder
  Delay in AAC"): its media time is where the audio starts (after the priming), its segment
  duration how long it lasts, in the movie's timescale. Files without one may carry iTunes'
  `iTunSMPB` tag instead (a de-facto format Apple never published, read as iTunes and
  FFmpeg's mov demuxer read it): space-separated hex fields, the second the priming, the third
  the padding, the fourth the length in samples. Last, the sample table: the duration of
  the encoder's last packet, where it is shorter than the samples the packet decodes to.
- Ogg Vorbis: granule positions (RFC 3533, the Ogg format; the Vorbis I specification,
  appendix A, "Embedding Vorbis into an Ogg stream"): a page's granule is the number of
  samples decoded by the end of its last complete packet, so the last page's granule, short
  of what its packets decode to, ends the audio mid-packet. A chained file (Ogg files joined
  end to end) is a series of links, each with its own headers and granules: each is decoded
  alone (audio/joined.py), so it is trimmed as a file of its own.

Where FFmpeg falls short, and what is done instead:
- Ogg Vorbis whose first audio page is also its last (a few seconds of speech, or of silence):
  FFmpeg's timestamps run a packet ahead of the granules and it cut the end up to a block
  wrong, the error depending on the content (3 s at 16 kHz: 47,744 samples of silence, 48,128
  of a tone). Decoded with skip_manual, the end is cut at the last granule.
- MP4 (M4A, MOV, 3GP): FFmpeg skips the priming the edit list (or iTunes' iTunSMPB tag)
  skips, but kept the end padding (up to a frame: 1,023 samples of AAC at the file's rate).
  The audio ends where the edit list, the iTunSMPB length or the sample table does,
  whichever is first; an edit list counts in the movie's timescale (FFmpeg writes
  milliseconds: then within 16 samples at 16 kHz).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from fractions import Fraction
from typing import Protocol, cast

import av
import av.container
from av.sidedata.sidedata import SideData
from av.sidedata.sidedata import Type as SideDataType

MP4_DEMUXER = "mov,mp4,m4a,3gp,3g2,mj2"  # FFmpeg's one demuxer of MP4, M4A, MOV and 3GP

# Frame side data: samples to drop from the frame's start and from its end (uint32 LE each;
# AV_FRAME_DATA_SKIP_SAMPLES, which FFmpeg exports instead of applying with skip_manual)
_SKIP_SAMPLES = struct.Struct("<II")


class Trim(Protocol):
    """Which samples of each decoded frame to keep, where FFmpeg's own trimming of encoder delay
    and padding falls short (module docstring): `see` each packet as it is demuxed, then ask
    `kept` about each frame it decodes to."""

    def see(self, packet: av.Packet[av.AudioStream]) -> None: ...

    def kept(self, frame: av.AudioFrame, num_samples: int) -> tuple[int, int] | None:
        """(start, stop): the samples of `frame` (`num_samples` of them) to keep; None: all
        of them (most frames: the answer costs well under a microsecond, and 37 minutes of
        audio are ~100,000 frames)."""
        ...


def trim_for(container: av.container.InputContainer, stream: av.AudioStream) -> Trim | None:
    """The `Trim` `stream` of `container` needs (made before its first packet decodes);
    None: FFmpeg's frames are kept whole."""
    demuxer = container.format.name
    if demuxer == MP4_DEMUXER and stream.time_base:
        return _Mp4Trim(stream, container.metadata.get("iTunSMPB", ""))
    if demuxer == "ogg" and stream.codec_context.name == "vorbis":
        return _OggVorbisTrim(stream)
    return None


class _Mp4Trim:
    """MP4 (and MOV, 3GP): FFmpeg skips the priming that the edit list (or an iTunSMPB tag)
    skips, but keeps the end padding. A frame is cut where the edit list ends, or the
    iTunSMPB tag's length, or its packet where that is shorter than its samples by a tick or
    more (the sample table's duration: the encoder's last packet is short), whichever is
    first; and where the edit list starts, if FFmpeg left it starting before (an Opus track
    in a 16 kHz timescale, which decodes at 48 kHz: FFmpeg skipped the priming in 16 kHz
    samples). The first frame starts where its packet does plus the samples FFmpeg skipped
    (the packet's skip side data): not where its packet ends less its samples, which is
    wrong where that packet is also the short last one (10 ms of Opus: 104 of 160 samples).

    Timestamps are in ticks of the stream's time base, num/den s (ints: Fractions are too
    slow per frame)."""

    def __init__(self, stream: av.AudioStream, itunsmpb: str) -> None:
        assert stream.time_base is not None
        self._num, self._den = stream.time_base.numerator, stream.time_base.denominator
        # where the audio starts (the edit list's start) and ends (its end, or the iTunSMPB
        # tag's length; exclusive): None where unknown
        self._start = stream.start_time
        self._end: int | None = None
        if stream.duration is not None:
            length = _itunsmpb_length(itunsmpb, stream)
            self._end = (stream.start_time or 0) + (stream.duration if length is None else length)
        # the first packet's pts (ticks) and the samples FFmpeg skips from its start (its
        # skip side data), until the first frame is trimmed
        self._first_packet: tuple[int, int] | None = None
        self._first_frame = True

    def see(self, packet: av.Packet[av.AudioStream]) -> None:
        if self._first_frame and self._first_packet is None and packet.pts is not None:
            skip = 0
            if packet.has_sidedata("skip_samples"):
                skip = _SKIP_SAMPLES.unpack_from(bytes(packet.get_sidedata("skip_samples")))[0]
            self._first_packet = (packet.pts, skip)

    def kept(self, frame: av.AudioFrame, num_samples: int) -> tuple[int, int] | None:
        first_frame, self._first_frame = self._first_frame, False
        pts = frame.pts
        if pts is None:
            return None
        den = self._den
        # a tick lasts den / scale samples: times in ticks x scale are integers, compared exactly
        scale = self._num * frame.sample_rate
        duration = frame.duration
        end = self._end
        # its packet's end (FFmpeg's frame duration) where the packet is shorter than its
        # samples by a whole tick or more (the encoder's last packet): a time base coarser than
        # a sample (milliseconds) rounds every packet's duration by less, and cutting every
        # frame there dropped samples between frames all through the file (a review)
        short = duration > 0 and num_samples * den - duration * scale >= scale
        if short and (end is None or pts + duration < end):
            end = pts + duration
        outlasts = end is not None and (end - pts) * scale < num_samples * den
        early = self._start is not None and pts < self._start
        if not (outlasts or early):
            return None
        start, stop = 0, num_samples
        first = pts * scale  # where its first sample lies, in ticks x scale
        if self._start is not None and early:
            # its pts is rounded where FFmpeg skipped priming in ticks longer than a sample
            # (Opus in a 16 kHz timescale: -69 ticks for -69.33, one 48 kHz sample off), so
            # the first frame starts where its packet does plus the samples skipped; a later
            # one ends where its packet does (none is short but the last)
            if first_frame and self._first_packet is not None:
                packet_pts, skipped = self._first_packet
                first = packet_pts * scale + skipped * den
            elif duration > 0:
                first = (pts + duration) * scale - num_samples * den
            start = min(max(self._samples(self._start * scale - first), 0), num_samples)
        if end is not None and outlasts:
            stop = min(max(self._samples(end * scale - first), start), num_samples)
        return start, stop

    def _samples(self, scaled_ticks: int) -> int:
        """A time in ticks x scale (the time base's numerator times the rate) in samples,
        rounded."""
        return (2 * scaled_ticks + self._den) // (2 * self._den)


def _itunsmpb_length(tag: str, stream: av.AudioStream) -> int | None:
    """The audio's length in samples from an iTunSMPB tag (iTunes' gapless data: hex fields,
    the second priming, the third padding, the fourth the length), if the stream is what it
    describes: no edit list (FFmpeg's duration is the whole track, the priming its start,
    read from this tag) and a time base of one sample. None otherwise (no tag, or a stale
    one, such as one a re-encode copied over)."""
    fields = tag.split()
    try:
        priming, padding, length = (int(field, 16) for field in fields[1:4])
    except ValueError:  # not hex, or fewer than four fields
        return None
    one_sample = stream.time_base == Fraction(1, stream.codec_context.sample_rate or 1)
    whole_track = stream.duration == priming + length + padding
    return length if one_sample and whole_track and stream.start_time == priming else None


class _OggVorbisTrim:
    """Ogg Vorbis, decoded with skip_manual: FFmpeg's frames come whole, with what to trim as
    side data, and the trimming is ours.

    FFmpeg cuts a stream's last packet where its timestamps reach the last page's granule,
    and they run ahead of the granules by the first packet's samples when the first audio
    page is also the last (a short or silent file): its first-page handling leaves an
    end-of-stream page alone, and the first packet, whose samples a Vorbis decoder drops,
    keeps pts 0 (not minus their count). Such a stream starts at granule 0; its end is found
    from the timestamps less that `_shift`. (A chained file's links come here one at a time:
    audio/joined.py.)

    A frame's pts and duration are its packet's (in samples); FFmpeg keeps the last packet's
    duration (the granule less the packets before it) in 32 unsigned bits, so one that comes
    out negative wraps.
    """

    def __init__(self, stream: av.AudioStream) -> None:
        stream.codec_context.flags2 |= int(av.codec.context.Flags2.skip_manual)
        self._shift: int | None = None  # None until the first frame

    def see(self, packet: av.Packet[av.AudioStream]) -> None:
        pass

    def kept(self, frame: av.AudioFrame, num_samples: int) -> tuple[int, int] | None:
        duration = frame.duration
        if duration == num_samples and self._shift is not None:
            return None  # most packets: not the first or the last, and no side data
        if duration >= 2**31:
            duration -= 2**32
        # side data is on the first frame and the last (the packets whose durations differ
        # from their frames' are those, and the first of a page, which FFmpeg times from its
        # granule): reading it costs ~2 us
        skip, discard = _skip_samples(frame)
        if self._shift is None:  # the first frame, whose samples FFmpeg has us drop (`skip`)
            self._shift = skip if frame.pts == 0 else 0
        stop = num_samples - discard
        if self._shift and (discard > 0 or duration <= 0):
            # the last packet (a duration FFmpeg cut short, or one that came out negative):
            # what lies before the last page's granule, on the timestamps less the shift. A
            # packet FFmpeg gave no pts (pages whose granules break RFC 3533: -1 on a page
            # where packets end, then 0 on the last) has the duration its end trim came from
            stop = duration + self._shift
        start, stop = min(skip, num_samples), min(max(stop, skip), num_samples)
        return None if (start, stop) == (0, num_samples) else (start, stop)


def _skip_samples(frame: av.AudioFrame) -> tuple[int, int]:
    """The samples FFmpeg would drop from `frame`'s start and end (its skip_manual side
    data); (0, 0) if none."""
    side = cast(Mapping[object, object], frame.side_data).get(SideDataType.SKIP_SAMPLES)
    if not isinstance(side, SideData):
        return 0, 0
    skip, discard = _SKIP_SAMPLES.unpack_from(bytes(side))
    return int(skip), int(discard)
