"""Upload decoding: any audio file -> float32 mono 16 kHz in [-1, 1]. The only codec code.

Routing: libsndfile (soundfile) reads the lossless containers it knows (WAV, AIFF, ...) and
FLAC's header; everything else, the lossy formats libsndfile also claims (MP3, Ogg, MP3 in a
WAV) and FLAC's audio go through FFmpeg (PyAV), which applies encoder-delay trimming, copes
with odd streams and reads a FLAC to its last frame (libsndfile stops at its header's count).
So does a W64 in WAVE_FORMAT_EXTENSIBLE of any codec but integer PCM (float, mu-law, A-law,
ADPCM): libsndfile read it as integer PCM, noise without an error.
Channels (up to MAX_FILE_CHANNELS) are averaged; the rate is converted with soxr
(`FILE_RESAMPLE_QUALITY`). Library errors never escape: each is mapped to `BadAudio` naming
what failed.

`decode_file` returns the whole array (uploads); `iter_decode` yields the same samples in chunks
as they decode, in bounded memory (`livemeet stream` of a file of hours); `iter_decode_stream`
decodes a pipe as its writer fills it (`livemeet stream -`), through FFmpeg, with nothing probed
ahead.

A source is a file's path or its whole contents in memory (`AudioSource`, a small upload). Bytes
decode exactly like a file of the same contents whose name has no extension (the gateway's spill
files): neither library then has a file name to guess the format from.

Sample-exact lengths: a lossy file decodes to the samples its encoder was given, without the
encoder's delay (priming) or the padding of its last frame, wherever the file records them, so
transcript times and durations follow the audio (tests/audio/test_gapless.py: the length to
the sample, a tone burst's onset within one, at 16, 44.1 and 48 kHz). FFmpeg trims MP3's
(LAME/Xing header), Opus's (pre-skip, and the end: Ogg granule, WebM CodecDelay and
DiscardPadding) and most Vorbis; where it falls short (Ogg Vorbis whose first audio page is
also its last, MP4's end padding), `audio/gapless.py` trims the frames. A chained Ogg file's
links are decoded one at a time (`audio/joined.py`), each trimmed as a file of its own.
A file that records neither keeps its codec's delay and padding, as FFmpeg and the ffmpeg
command line keep them: an MP3 without a LAME/Xing header, one in a WAV too (LAME's delay,
1,105 samples at the file's rate, 69 ms at 16 kHz and 25 ms at 44.1 kHz, comes first), raw
AAC (ADTS: 1,024 samples of priming, 64 ms at 16 kHz), AAC in an MP4 without an edit list or
tag (fragmented, as FFmpeg writes it: the priming; the end is still cut) and AAC in Matroska
(no DiscardPadding: its end; it starts on time). Each measured on a click track, to the
sample at 16, 44.1 and 48 kHz; a transcript's times may come as late, less than one 80-ms audio
token. No standard fixes a delay to remove instead: AAC's priming is its encoder's (1,024
samples from FFmpeg's, 2,112 from Apple's), and of an MP3's 1,105 only the decoder's 529 are
the format's, the other 576 LAME's. Read from a pipe (`iter_decode_stream`), an MP3 keeps
the padding of its last frame: FFmpeg cuts that end only in a file it can seek in (its delay
is trimmed either way); in a breadth probe of codecs, up to 58 ms of near-silence at its end
at 8 kHz, 35 ms at 16 kHz, 13 ms at 48 kHz.

Decisions on damaged input:
- Truncated files that libsndfile reads raise `BadAudio` when its decoder fails or yields fewer
  frames than the header declares.
- FLAC files joined with `cat` decode whole, a file at a time (`audio/joined.py` finds each
  one's marker and STREAMINFO), whatever their formats: read as one stream (libsndfile stopped
  at the first header's count, dropping the rest without an error), FFmpeg's decoder cannot
  switch bit depth and its parser mis-split joins of other formats (a frame lost at 48 -> 16
  kHz; 44.1 kHz 16-bit then 16 kHz 24-bit: the second file dropped without an error). Each
  file's STREAMINFO total samples are a lower bound, not its length: a header that
  under-states the length decodes whole. Fewer frames than a file's count is `BadAudio`
  (truncated), and so is any frame FFmpeg rejects: none is skipped, as other FFmpeg formats'
  bad packets are, since a FLAC frame carries a CRC-16 (checked: `err_detect`) and a rejected
  one is a cut or damage. A sample rate or channel count that changes within one FLAC stream
  is `BadAudio` too. A FLAC of unknown length (total samples 0, written to a pipe) has no
  count to fall short of: cut exactly between two frames, it yields its intact frames.
- A truncated PCM WAV yields its intact prefix: libsndfile sizes the data chunk from the file, so
  every returned sample is genuine audio (nothing is invented), only the tail is missing. How
  much is missing comes with the probe of an integer-PCM WAV (`AudioInfo.cut_from_s`, from the
  data chunk's declared size as the standard library's `wave` reads it): the gateway logs it
  as a warning, `livemeet transcribe` and `stream` warn on stderr.
- A WAV whose data chunk declares 0 bytes (the placeholder of a writer that could not seek back
  to fill it in) is read to the end of the file, by FFmpeg.
- A big-endian WAV (RIFX) decodes where libsndfile reads it (a file or bytes) and is
  `BadAudio` where FFmpeg would (a pipe, a data size of 0): FFmpeg's WAV demuxer takes its
  PCM as little-endian, noise without an error.
- FFmpeg-decoded files raise `BadAudio` on any error FFmpeg reports (e.g. an MP4 cut before
  its moov atom), and when a container with an exact declared duration (WebM/Matroska, MP4)
  decodes more than `TRUNCATION_TOLERANCE_S` short of it. One exception (not FLAC's, above): a
  packet the codec rejects as invalid data is skipped, as the ffmpeg command line (and
  whisper's `load_audio`, which runs it) skips it, unless more than `MAX_BAD_PACKET_FRACTION`
  of the packets are. MP3 files joined with `cat` carry the second file's ID3 tag mid-stream,
  which the mp3 demuxer hands over as a packet; one damaged frame would otherwise lose the
  whole file.
- A truncated MP3 or Ogg file yields its intact prefix: their declared durations may be
  estimates (bitrate) or come from the cut end itself (last Ogg page), so a shortfall proves
  nothing; again every returned sample is genuine.
- Audio whose sample rate changes mid-stream (MP3 files of 16 and 44.1 kHz joined with `cat`)
  is resampled part by part, each from its own rate, where FFmpeg's decoder decodes each part
  as it decodes it alone (MPEG audio: `_RATE_CHANGE_DECODERS`), and so is a chained Ogg file
  whose links differ in rate, channels or codec (each link decoded alone: FFmpeg's Ogg
  demuxer refuses such a chain), and FLAC files joined (above). Elsewhere the change is
  `BadAudio` naming both rates: FFmpeg's AAC and AC-3 decoders decode every frame after it
  wrong. A channel count that changes (mono and stereo ADTS AAC, AC-3 or E-AC-3 joined) is
  no error: each frame is averaged from its own channels, and FFmpeg decodes each part as it
  decodes it alone (at the file's rate, every sample within 2.5e-4 of it).
- A chained Ogg file's `probe` duration is FFmpeg's, not what decoding yields (every link):
  its last link's last granule at its first link's rate (3 s then 2 s, both 16 kHz: 2.0 s;
  3 s at 16 kHz then 3 s at 48 kHz: 9.0 s, and in the other order 1.0 s). It serves only the
  length check before decoding (and `livemeet stream`'s length of a file it stopped
  early): a length understated is caught as the decode runs (TooLong, "decodes to"), one
  overstated (a later link of a higher rate) refuses a file within the limit.
- Leading ID3v2 tags (cover art, of MiB at times: rippers and taggers write them in front
  of files of many formats) are never audio. In front of a FLAC, Ogg, WAV (RIFF, RIFX,
  RF64, BW64), W64, AIFF/AIFC, IFF 8SVX, CAF, AU, NIST SPHERE, ADTS AAC, AC-3/E-AC-3,
  MP4/M4A, Matroska/WebM, WavPack or TTA file, the file probes and decodes as without them,
  whatever their size, from a file, bytes or a pipe alike (the same samples, duration, rate,
  channels and codec, and a cut WAV's `cut_from_s`). `audio/joined.py` passes them by the
  lengths their headers give (one or several one after another, a footer included), sought
  past in a file and read and dropped from a pipe, never held whole (a stream holds its
  first 1 MiB until it sees what follows, to give them back if it is none of those), and
  both libraries read the file from the audio's start on (`joined.Tail`). Neither looked
  past them everywhere: libsndfile passes one tag in a file it opens by name, but through
  a file object (bytes) it sized a WAV's or AIFF's data from the whole length, tag
  included, and lost the tag's length of audio at its end without an error (100 kB of
  cover art: 3 s of a 16 kHz 16-bit WAV); an MP4, Matroska, WavPack, CAF, RF64 or NIST
  file behind a tag of any size was `BadAudio`, others behind a large one (Ogg behind
  200 kB, ADTS and TTA behind 3 MiB: FFmpeg's format probe reads 1 MiB at most, and does
  not always look past a tag), FFmpeg counted the tag in an AC-3's probed duration, and a
  pipe's WAV behind one was `BadAudio`. MPEG audio (MP3, MP2) is read with its tags, as
  before: FFmpeg decodes it behind tags of any size (its probe trusts a large tag for MP3)
  and reads their metadata. In front of anything else the tags stay too (libsndfile's
  rarer formats, VOC or IRCAM say, are then `BadAudio`, as before). As FFmpeg (and
  libsndfile), zeros between a tag and the audio (padding outside the tag) are not passed:
  `BadAudio`.
"""

from __future__ import annotations

import io
import math
import struct
import threading
import wave
from collections.abc import Generator, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple, cast

import av
import av.container
import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

from livemeet.audio.constants import (
    DECODE_BLOCK_FRAMES,
    FILE_RESAMPLE_QUALITY,
    MAX_AUDIO_S,
    MAX_BAD_PACKET_FRACTION,
    MAX_FILE_CHANNELS,
    MAX_FILE_SAMPLE_RATE,
    MIN_FILE_SAMPLE_RATE,
    SAMPLE_RATE,
    TRUNCATION_TOLERANCE_S,
)
from livemeet.audio.gapless import MP4_DEMUXER, trim_for
from livemeet.audio.joined import RIFX_MARKER, Tail, audio_start, members, splits
from livemeet.errors import BadAudio, TooLong

Samples = npt.NDArray[np.float32]  # [n] mono float32 in [-1, 1] at 16 kHz

AudioSource = Path | bytes
"""A file on disk, or bytes: a whole file's contents held in memory (e.g. a small upload)."""

# libsndfile major formats sent to FFmpeg instead: lossy codecs with encoder delay/padding.
_FFMPEG_FORMATS = frozenset({"MP3", "OGG"})
# ... and the same codecs inside a container libsndfile reads otherwise (MP3 in a WAV, format
# tag 0x55): libsndfile sizes those from a bitrate estimate, so an intact file decoded short
# of it and was refused as truncated.
_FFMPEG_SUBTYPES = frozenset({"MPEG_LAYER_I", "MPEG_LAYER_II", "MPEG_LAYER_III", "VORBIS", "OPUS"})
# The only FFmpeg demuxers an upload may use (matched against each comma-separated part of a
# demuxer's name, as FFmpeg's `format_whitelist` does). Why a list: FFmpeg picks a demuxer from
# the bytes, and some read more than the upload: a `concat` playlist opens files on the
# server's disk by relative path (an upload could have them transcribed), an `sdp` description
# opens UDP sockets and holds a decode slot until it times out, `hls` fetches URLs. These are
# audio and recorder containers that read only their own bytes.
FFMPEG_DEMUXERS = (
    "wav,w64,aiff,caf,au,nistsphere,flac,mp3,ogg,matroska,mov,aac,ac3,eac3,amr,amrnb,amrwb,"
    "asf,avi,flv,mpegts,mpeg,wv,ape,tta,dts,loas,truehd,mlp,tak,voc,xwma,dsf,dss,mpc,mpc8,shn,"
    "gsm,nut,rm,mxf"
)
# Nested opens (none of the demuxers above make any by default) may only read local files.
_FFMPEG_OPTIONS = {"format_whitelist": FFMPEG_DEMUXERS, "protocol_whitelist": "file"}
# libsndfile's frame count for a file that does not declare its length (SF_COUNT_MAX), e.g. a
# FLAC written to a pipe (STREAMINFO total samples 0, "unknown" in RFC 9639): FFmpeg decodes
# such files, as it does other containers without a duration.
_SF_UNKNOWN_FRAMES = 2**63 - 1
# FFmpeg demuxers whose header stores an exact duration (Matroska Duration, MP4 mvhd/edit list).
# MP3 durations may be estimated from the bitrate and Ogg's comes from the last page, so a
# shortfall there proves nothing.
_EXACT_DURATION_DEMUXERS = frozenset({"matroska,webm", MP4_DEMUXER})


@dataclass(frozen=True)
class AudioInfo:
    """What a file's header or container says, without decoding the samples.

    `duration_s` in seconds; `sample_rate` in Hz (the file's, before resampling); `channels`
    before down-mixing; `codec` a lower-case name such as "flac/pcm_24", "wav/float" (libsndfile
    format/subtype) or "opus", "aac", "mp3float" (FFmpeg decoder name). `duration_declared`:
    the header or container states the duration; else (MediaRecorder WebM) it is the sum of
    the packets' durations (`probe`). `cut_from_s`: a cut file read to its intact prefix (a WAV
    whose data chunk declares more bytes than the file holds: module docstring), the seconds
    its header declares, of which `duration_s` are there; None for any other file.
    """

    duration_s: float
    sample_rate: int
    channels: int
    codec: str
    duration_declared: bool = True
    cut_from_s: float | None = None

    @property
    def cut_note(self) -> str | None:
        """What a cut file (`cut_from_s`) lacks, in words for a log or a CLI warning; None for
        a whole file. The one wording of it wherever it is said."""
        if self.cut_from_s is None:
            return None
        return (
            f"the audio is cut: its header declares {self.cut_from_s:.2f} s, the file holds "
            f"{self.duration_s:.2f} s ({self.cut_from_s - self.duration_s:.2f} s missing); "
            "the part it holds is transcribed"
        )

    @property
    def length_verb(self) -> str:
        """How `check_length`'s error says where `duration_s` comes from."""
        return "declares" if self.duration_declared else "lasts, by its packets,"


def probe(source: AudioSource) -> AudioInfo:
    """Read duration, rate, channels and codec from the header or container (no decoding).

    `source` is the file's Path or its whole contents as bytes; both give the same AudioInfo.
    FFmpeg containers without a declared duration (e.g. MediaRecorder WebM) are demuxed, not
    decoded, and the packet durations summed.
    Raises BadAudio for a missing or empty file (or empty bytes), non-audio bytes, an unreadable
    container, one with no audio stream, a declared rate outside MIN_FILE_SAMPLE_RATE ..
    MAX_FILE_SAMPLE_RATE (0, not known before decoding, passes: `sample_rate` is then 0), or
    more than MAX_FILE_CHANNELS channels.
    """
    return _probe(source).info


class _Probe(NamedTuple):
    info: AudioInfo
    use_soundfile: bool  # libsndfile decodes it (else FFmpeg)
    exact_duration: bool  # the container's declared duration is exact, not an estimate
    flac: bool = False  # FFmpeg decodes FLAC: frame checksums checked, no bad frame skipped


def _probe(source: AudioSource) -> _Probe:
    probed = _probe_header(source)
    if probed.info.sample_rate != 0:  # 0: not known before decoding
        _check_rate(probed.info.sample_rate, "declares")
    return probed


def _check_channels(channels: int) -> None:
    """Raise BadAudio when a file declares more than MAX_FILE_CHANNELS channels (constants)."""
    if channels > MAX_FILE_CHANNELS:
        raise BadAudio(
            f"the audio declares {channels} channels, more than the {MAX_FILE_CHANNELS} a file "
            "may have"
        )


def _check_rate(rate: int, verb: str) -> None:
    """Raise BadAudio unless `rate` (Hz; the audio `verb`s it) is a file's (constants)."""
    if not MIN_FILE_SAMPLE_RATE <= rate <= MAX_FILE_SAMPLE_RATE:
        raise BadAudio(
            f"the audio {verb} a sample rate of {rate} Hz, outside "
            f"{MIN_FILE_SAMPLE_RATE}..{MAX_FILE_SAMPLE_RATE} Hz"
        )


def _probe_header(source: AudioSource) -> _Probe:
    if _num_bytes(source) == 0:
        raise BadAudio("the audio file is empty (0 bytes)")
    with _past_tags(source) as audio:
        return _probe_contents(audio)


@contextmanager
def _past_tags(source: AudioSource) -> Iterator[AudioSource | Tail]:
    """`source` as the libraries read it: itself, or, behind leading ID3v2 tags that are
    dropped (audio/joined.py's `audio_start`), a file of its own from its audio's start on,
    so it probes and decodes as without them, which the libraries do not always look past
    (module docstring)."""
    with _seekable(source) as raw:
        if start := audio_start(raw):
            yield Tail(raw, start)
            return
    yield source  # opened again by whoever reads it, as before


def _seekable(source: AudioSource) -> BinaryIO:
    """`source` as a seekable file: its file opened (BadAudio when it cannot be), or a
    BytesIO over its bytes."""
    return io.BytesIO(source) if isinstance(source, bytes) else _open_file(source)


def _open_file(path: Path) -> BinaryIO:
    """`path` opened to read; BadAudio when it cannot be."""
    try:
        return path.open("rb")
    except OSError as e:
        raise BadAudio(f"cannot read the audio file: {e.strerror}") from e


def _probe_contents(source: AudioSource | Tail) -> _Probe:
    """`_probe_header` of a source, or of its audio past its tags (`_past_tags`)."""
    info = _soundfile_info(source)
    # a WAV's own header: its declared length (a cut file), and its channels where libsndfile
    # refused it; no second open of any other file libsndfile read
    header = _wav_header(source) if info is None or info.format in _WAV_FORMATS else None
    # libsndfile refuses a WAV of more than 1024 channels, and FFmpeg's decoder one of more
    # than 512 with only "Invalid argument" (PyAV reports it as 0 channels): the header says
    _check_channels(int(info.channels) if info is not None else header.channels if header else 0)
    if info is not None:
        duration_s = info.frames / info.samplerate
        sf_info = AudioInfo(
            duration_s=duration_s,
            sample_rate=int(info.samplerate),
            channels=int(info.channels),
            codec=f"{info.format}/{info.subtype}".lower(),
            cut_from_s=_cut_from_s(header, duration_s),
        )
        if info.format == "FLAC":  # the header's length is a lower bound (module docstring)
            return _Probe(sf_info, use_soundfile=False, exact_duration=False, flac=True)
        return _Probe(sf_info, use_soundfile=True, exact_duration=True)
    try:
        with _open_container(source) as container:
            stream = _audio_stream(container)
            declared = stream.duration is not None or container.duration is not None
            av_info = AudioInfo(
                duration_s=_container_duration_s(container, stream),
                sample_rate=int(stream.codec_context.sample_rate),
                channels=int(stream.codec_context.channels),
                codec=str(stream.codec_context.name),
                duration_declared=declared,
            )
            exact = declared and container.format.name in _EXACT_DURATION_DEMUXERS
            flac = av_info.codec == "flac"  # a FLAC of unknown length (written to a pipe)
            return _Probe(av_info, use_soundfile=False, exact_duration=exact, flac=flac)
    except av.FFmpegError as e:
        raise BadAudio(f"cannot read the audio container: FFmpeg: {_ffmpeg_message(e)}") from e


_WAV_FORMATS = ("WAV", "WAVEX")  # libsndfile's names of the RIFF WAVE files `wave` may read


class _WavHeader(NamedTuple):
    """What an integer-PCM WAV's header says (the standard library's `wave` reads it)."""

    channels: int
    declared_s: float | None  # the data chunk's size as written, in s (None: a placeholder)


def _wav_header(source: AudioSource | Tail) -> _WavHeader | None:
    """The header of an integer-PCM WAV (`wave` takes the data chunk's size as written, not
    from the file's length as libsndfile does); None for any other file, float WAVs among
    them (`wave` reads integer PCM only), or an unreadable header."""
    try:
        with wave.open(_openable(source), "rb") as w:
            channels, frames, rate = w.getnchannels(), w.getnframes(), w.getframerate()
            frame_bytes = channels * w.getsampwidth()
    except (wave.Error, EOFError, OSError, ValueError):
        return None
    # 0 and 0xFFFFFFFF are the sizes a writer that could not seek back leaves
    placeholder = frames in (0, 0xFFFF_FFFF // max(frame_bytes, 1))
    return _WavHeader(channels, None if placeholder or rate <= 0 else frames / rate)


def _cut_from_s(header: _WavHeader | None, duration_s: float) -> float | None:
    """The seconds a WAV's header declares where the file holds less (`duration_s`: what
    libsndfile, sizing the data chunk from the file, reads); None for a whole file or any
    file `_wav_header` does not read."""
    if header is None or header.declared_s is None:
        return None
    # a frame's worth of rounding is not a cut
    return header.declared_s if header.declared_s - duration_s > 1e-6 else None


class DecodeCancelled(Exception):
    """`decode_file` stopped because its caller set `cancel` (the client went away)."""


def decode_file(
    source: AudioSource,
    *,
    max_audio_s: float = MAX_AUDIO_S,
    cancel: threading.Event | None = None,
) -> Samples:
    """Decode `source` to float32 mono 16 kHz samples in [-1, 1], shape [n].

    `source` is the file's Path or its whole contents as bytes; both give the same samples and
    errors. Calls `probe` first and raises TooLong before decoding when the declared duration
    exceeds `max_audio_s` (seconds); decoding stops with TooLong as soon as the decoded audio
    exceeds it too (containers can lie). Raises BadAudio for a missing or empty file (or empty
    bytes), non-audio bytes, unreadable or truncated files (see the module docstring),
    zero-length audio and non-finite samples. `cancel`: set from another thread, the decode
    stops at its next block with DecodeCancelled (a 90-minute file of a client that left
    would otherwise decode to the end, holding its memory).
    """
    return decode_file_with_info(source, max_audio_s=max_audio_s, cancel=cancel).samples


class Decoded(NamedTuple):
    """`decode_file_with_info`'s result."""

    samples: Samples  # [n] float32 mono 16 kHz in [-1, 1]
    info: AudioInfo  # `probe`'s: a cut WAV's `cut_from_s` says how much was missing


def decode_file_with_info(
    source: AudioSource,
    *,
    max_audio_s: float = MAX_AUDIO_S,
    cancel: threading.Event | None = None,
) -> Decoded:
    """`decode_file`'s samples (same arguments, same errors) with what the probe read of the
    header, so a caller can say what the samples alone cannot: that a cut WAV's are only its
    intact prefix (`AudioInfo.cut_note`)."""
    probed = _probe(source)
    info = probed.info
    check_length(info.duration_s, max_audio_s, info.length_verb)
    chunks = list(_decode_chunks(source, probed, max_audio_s, cancel, whole=True))
    if not chunks:
        raise BadAudio("the audio has no samples (zero length)")
    # one array already (a mono 16 kHz file read whole): no copy
    samples = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    _check_truncation(probed, samples.size)
    if not np.all(np.isfinite(samples)):
        raise BadAudio("the audio contains non-finite samples (NaN or infinity)")
    check_length(samples.size / SAMPLE_RATE, max_audio_s, "decodes to")
    np.clip(samples, -1.0, 1.0, out=samples)
    return Decoded(samples, info)


def iter_decode(
    source: AudioSource,
    *,
    max_audio_s: float = MAX_AUDIO_S,
    cancel: threading.Event | None = None,
) -> Generator[Samples, None, None]:
    """`decode_file`'s samples in chunks as they decode (each non-empty, float32 [n] in
    [-1, 1]; concatenated, bit for bit the array `decode_file` returns), so memory stays
    bounded by a decode block whatever the file's length (`livemeet stream` of a 3-hour file).

    Probes now: a missing file, non-audio, a bad declared rate or a declared duration over
    `max_audio_s` raise here, before the first chunk. The errors `decode_file` finds while
    decoding (truncation, non-finite samples, a container that lied about its length, zero
    length, `cancel`) are raised by the iterator, after the chunks before them: a file cut
    at minute 100 yields its first 100 minutes, then BadAudio. Close the iterator (or exhaust
    it) to close the file.
    """
    probed = _probe(source)
    check_length(probed.info.duration_s, max_audio_s, probed.info.length_verb)
    chunks = _decode_chunks(source, probed, max_audio_s, cancel, whole=False)
    return _checked_chunks(chunks, probed)


def iter_decode_stream(
    stream: BinaryIO, *, max_audio_s: float = MAX_AUDIO_S
) -> Generator[Samples, None, None]:
    """`iter_decode`'s chunks of audio read from `stream` as it comes, each read returning
    what is there (a pipe whose writer records as it goes: `livemeet stream -`), through FFmpeg:
    a container it reads without seeking (WAV, FLAC, MP3, Ogg, WebM, ...; not an MP4 whose
    index is at its end). Nothing is probed ahead, and there is no declared length to check:
    every error (not audio, a bad rate, more than `max_audio_s` seconds, non-finite samples,
    no samples at all) is BadAudio or TooLong raised by the iterator, after the chunks before
    it. The first chunk comes once FFmpeg has read enough to know the format (~100 KB of a
    WAV: 3.3 s of 16-kHz mono recorded as it goes). `stream` stays open. A BadAudio of
    FFmpeg's before the first chunk says which formats it cannot read from a pipe
    (`_STREAM_HINT`)."""
    blocks = _hinted_stream_blocks(_ffmpeg_blocks(stream))
    return _checked_chunks(_resampled(blocks, max_audio_s, None), None)


# FFmpeg (8.0) refuses these from a pipe with only "Invalid data found when processing input",
# as it refuses an MP4 whose index follows its audio (`_ffmpeg_part_blocks` names that one): a
# CAF of compressed audio (FLAC, ALAC, AC-3: its packet table) and a WavPack of more than 2
# channels, as it opens them; they decode from a file or bytes (a breadth probe of codecs)
_STREAM_HINT = (
    "; from a pipe FFmpeg cannot read every format: a CAF of compressed audio, a WavPack of "
    "more than 2 channels or an MP4 whose index follows its audio must be sought in: save it "
    "to a file and pass that, or pipe a WAV, FLAC, MP3, Ogg or WebM"
)


def _hinted_stream_blocks(
    blocks: Iterator[tuple[npt.NDArray[np.float32], int]],
) -> Iterator[tuple[npt.NDArray[np.float32], int]]:
    """A stream's `blocks`; a BadAudio from an FFmpeg error before the first of them (where a
    format FFmpeg cannot read without seeking fails) with `_STREAM_HINT` added."""
    started = False
    try:
        for block in blocks:
            started = True
            yield block
    except BadAudio as e:
        if started or not isinstance(e.__cause__, av.FFmpegError) or "save it" in e.message:
            raise
        raise BadAudio(e.message + _STREAM_HINT) from e


def _checked_chunks(
    chunks: Iterator[Samples], probed: _Probe | None
) -> Generator[Samples, None, None]:
    """`chunks` finite-checked and clipped; BadAudio after them for none at all, and (`probed`,
    None for a stream: nothing declared) for a shortfall from the declared length."""
    num_samples = 0
    for chunk in chunks:
        if not np.all(np.isfinite(chunk)):
            raise BadAudio("the audio contains non-finite samples (NaN or infinity)")
        np.clip(chunk, -1.0, 1.0, out=chunk)
        num_samples += chunk.size
        yield chunk
    if num_samples == 0:
        raise BadAudio("the audio has no samples (zero length)")
    if probed is not None:
        _check_truncation(probed, num_samples)


def _decode_chunks(
    source: AudioSource,
    probed: _Probe,
    max_audio_s: float,
    cancel: threading.Event | None,
    *,
    whole: bool,
) -> Iterator[Samples]:
    """The 16 kHz mono chunks (float32 [n], not yet clipped, never empty) as they decode.
    `whole`: read a mono 16 kHz soundfile file in one array (`_read_whole`), not in blocks."""
    blocks = (
        _soundfile_blocks(source, whole)
        if probed.use_soundfile
        else _ffmpeg_blocks(source, flac=probed.flac)
    )
    return _resampled(blocks, max_audio_s, cancel)


def _resampled(
    blocks: Iterator[tuple[npt.NDArray[np.float32], int]],
    max_audio_s: float,
    cancel: threading.Event | None,
) -> Iterator[Samples]:
    """(mono block, rate in Hz) blocks -> 16 kHz chunks (float32 [n], never empty)."""
    resampler = _Resampler(max_audio_s, cancel)
    for mono, rate in blocks:
        if (chunk := resampler.push(mono, rate)).size:
            yield chunk
    if (tail := resampler.finish()).size:
        yield tail


def _check_truncation(probed: _Probe, num_samples: int) -> None:
    """BadAudio when a container whose declared duration is exact decodes short of it."""
    info = probed.info
    decoded_s = num_samples / SAMPLE_RATE
    if probed.exact_duration and decoded_s < info.duration_s - TRUNCATION_TOLERANCE_S:
        raise BadAudio(
            f"the {info.codec} audio is truncated: the container declares "
            f"{info.duration_s:.2f} s, only {decoded_s:.2f} s decode"
        )


class _Resampler:
    """Resamples mono blocks to 16 kHz as they come (soxr's streaming resampler: its output is
    the same whatever the block sizes). Audio whose rate changes (MP3 files of different rates
    joined) is resampled part by part: at a change, the part before is drained and the next
    is resampled from its own rate.

    Counts the input's duration and raises TooLong once it exceeds `max_audio_s`, so a lying
    container never makes us decode hours of audio.
    """

    def __init__(self, max_audio_s: float, cancel: threading.Event | None = None) -> None:
        self._max_audio_s = max_audio_s
        self._cancel = cancel
        self._rate = 0  # Hz of the part being resampled (0: none yet)
        self._stream: soxr.ResampleStream | None = None
        self._num_input_frames = 0  # of the part being resampled
        self._earlier_parts_s = 0.0  # s of input in the parts before it

    def push(self, mono: npt.NDArray[np.float32], rate: int) -> Samples:
        """Take `mono` ([n] float32) sampled at `rate` Hz and return the 16 kHz samples it
        completes (maybe none; after a rate change, the previous part's last ones first).
        Raises BadAudio for a rate outside the file range, TooLong past `max_audio_s`, and
        DecodeCancelled once the caller's `cancel` is set."""
        if self._cancel is not None and self._cancel.is_set():
            raise DecodeCancelled("the decode was cancelled")
        drained = None
        if not self._rate or rate != self._rate:  # the first block, or a change
            _check_rate(rate, "decodes at")
            if self._rate:
                drained = self.finish()
                self._earlier_parts_s += self._num_input_frames / self._rate
            self._rate, self._num_input_frames = rate, 0
            self._stream = None
            if rate != SAMPLE_RATE:
                self._stream = soxr.ResampleStream(
                    rate, SAMPLE_RATE, 1, dtype="float32", quality=FILE_RESAMPLE_QUALITY
                )
        self._num_input_frames += mono.shape[0]
        decoded_s = self._earlier_parts_s + self._num_input_frames / self._rate
        check_length(decoded_s, self._max_audio_s, "decodes to")
        mono = np.ascontiguousarray(mono, dtype=np.float32)
        out: Samples = mono if self._stream is None else self._stream.resample_chunk(mono)
        if drained is not None and drained.size:
            out = np.concatenate([drained, out])
        return out

    def finish(self) -> Samples:
        """Drain the resampler: the samples it still holds of the current part, shape [n]."""
        if self._stream is None:
            return np.zeros(0, np.float32)
        tail: Samples = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        return tail


def check_length(duration_s: float, max_audio_s: float, verb: str) -> None:
    """Raise TooLong when `duration_s` (s; the audio "declares", "decodes to" or "lasts, by
    its packets," it: `verb`) exceeds `max_audio_s` (s); the one wording of that error
    wherever it is checked."""
    if duration_s > max_audio_s:
        # tenths rounded up, so the figure shown is over the limit too (30.02 s: "30.1 s")
        shown = math.ceil(duration_s * 10) / 10
        raise TooLong(f"the audio {verb} {shown:.1f} s, longer than the {max_audio_s:g} s limit")


def _num_bytes(source: AudioSource) -> int:
    if isinstance(source, bytes):
        return len(source)
    try:
        return source.stat().st_size
    except OSError as e:
        raise BadAudio(f"cannot read the audio file: {e.strerror}") from e


def _openable(source: AudioSource | BinaryIO | Tail) -> str | BinaryIO:
    """What soundfile, PyAV and `wave` open: the path, a fresh BytesIO over the bytes, audio
    past its tags (`_past_tags`) from its start, or a stream as it is (read once, by one
    opener: `iter_decode_stream`).

    A fresh one per open, so no reader depends on where an earlier one left the position. (A
    BytesIO over bytes shares their buffer until written, so this copies nothing.)
    """
    if isinstance(source, bytes):
        return io.BytesIO(source)
    if isinstance(source, Tail):
        source.seek(0)
        return cast(BinaryIO, source)
    return str(source) if isinstance(source, Path) else source


def _soundfile_info(source: AudioSource | Tail) -> sf._SoundFileInfo | None:
    """libsndfile's header info, or None when libsndfile cannot open it or FFmpeg should."""
    try:
        info = sf.info(_openable(source))
    except sf.LibsndfileError:
        return None
    if info.format in _FFMPEG_FORMATS or info.subtype in _FFMPEG_SUBTYPES or info.samplerate <= 0:
        return None
    # 0 frames: libsndfile takes a WAV data chunk's size at its word, and 0 is the placeholder
    # writers leave when they cannot seek back to fill it in (a recorder streaming to a pipe, or
    # one killed before it finished the header). FFmpeg reads such a chunk to the end of the
    # file; a file with no samples at all decodes to none there too (BadAudio, zero length).
    if info.frames == 0 or info.frames >= _SF_UNKNOWN_FRAMES:
        return None
    if info.format == "W64" and _w64_extensible_subformat(source) not in (None, _WAVE_FORMAT_PCM):
        return None  # libsndfile would read it as integer PCM (`_w64_extensible_subformat`)
    return info


_WAVE_FORMAT_PCM = 0x0001
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE
# Sony Wave64's chunk GUIDs: the header's ('riff' GUID, 8-byte size, 'wave' GUID) is 40 bytes,
# then chunks of a 16-byte GUID and an 8-byte size that counts those 24 bytes, each padded to
# 8 bytes
_W64_HEADER_BYTES = 40
_W64_FMT_GUID = b"fmt \xf3\xac\xd3\x11\x8c\xd1\x00\xc0\x4f\x8e\xdb\x8a"
_W64_CHUNK_HEADER = struct.Struct("<16sQ")
_W64_MAX_CHUNKS = 64  # chunks looked through for 'fmt ' (it comes first in every writer's)


def _w64_extensible_subformat(source: AudioSource | Tail) -> int | None:
    """The format tag of a Wave64 file's WAVE_FORMAT_EXTENSIBLE SubFormat GUID (its first two
    bytes: 0x0001 integer PCM, 0x0003 IEEE float, 0x0007 mu-law, ...); None for any other file.

    libsndfile (1.2) reads such a W64 as integer PCM of its bit depth whatever the SubFormat
    says: float as PCM_32, mu-law, A-law and MS ADPCM as PCM_U8, noise without an error (FFmpeg
    writes extensible W64 above 2 channels or 48 kHz; a WAV's it reads right). FFmpeg reads it.
    """
    opened = _openable(source)
    with open(opened, "rb") if isinstance(opened, str) else nullcontext(opened) as f:
        f.seek(_W64_HEADER_BYTES)
        for _ in range(_W64_MAX_CHUNKS):
            header = f.read(_W64_CHUNK_HEADER.size)
            if len(header) < _W64_CHUNK_HEADER.size:
                return None
            guid, size = _W64_CHUNK_HEADER.unpack(header)
            if guid == _W64_FMT_GUID:
                body = f.read(40)  # WAVEFORMATEXTENSIBLE: the SubFormat GUID at byte 24
                if len(body) < 40 or struct.unpack_from("<H", body)[0] != _WAVE_FORMAT_EXTENSIBLE:
                    return None
                return int(struct.unpack_from("<H", body, 24)[0])
            if size < _W64_CHUNK_HEADER.size:
                return None
            f.seek((size + 7) // 8 * 8 - _W64_CHUNK_HEADER.size, io.SEEK_CUR)
    return None


def _soundfile_blocks(
    source: AudioSource, whole: bool
) -> Iterator[tuple[npt.NDArray[np.float32], int]]:
    """libsndfile's audio as (mono [n] float32, rate in Hz) blocks; BadAudio when it fails or
    decodes fewer frames than the header declares (raised after the blocks it did decode)."""
    try:
        with _past_tags(source) as audio, sf.SoundFile(_openable(audio)) as f:
            declared_frames, kind = f.frames, f.format
            rate = int(f.samplerate)
            if whole and f.channels == 1 and rate == SAMPLE_RATE and declared_frames > 0:
                got = _read_whole(f, declared_frames)
                num_frames = int(got.shape[0])
                yield got, rate
            else:
                num_frames = 0
                for block in _read_blocks(f):
                    num_frames += block.shape[0]
                    yield block, rate
    except sf.LibsndfileError as e:
        raise BadAudio(
            f"cannot decode the audio (truncated or corrupt?): libsndfile: {e.error_string}"
        ) from e
    _check_frame_count(kind, declared_frames, num_frames)


def _check_frame_count(kind: str, declared: int, decoded: int) -> None:
    """BadAudio when fewer frames decode (`decoded`, per channel) than a `kind` file's header
    declares (`declared`: libsndfile's count, or a FLAC's STREAMINFO total samples): the one
    wording of that error, whichever library decoded the file."""
    if decoded < declared:
        raise BadAudio(
            f"the {kind.lower()} audio is truncated or corrupt: the header declares {declared} "
            f"frames, only {decoded} decode"
        )


def _read_whole(f: sf.SoundFile, declared_frames: int) -> npt.NDArray[np.float32]:
    """Mono audio already at 16 kHz (most uploads): decoded straight into one array of the
    declared length (its duration was checked against the limit before decoding), without
    the block path's per-block arrays and final concatenation (a 37-minute 16-bit WAV on a
    CPU box: ~0.17 -> ~0.09 s, and half the peak memory). Fewer frames if the file is short."""
    return f.read(out=np.empty(declared_frames, np.float32))  # type: ignore[no-any-return]


def _read_blocks(f: sf.SoundFile) -> Iterator[npt.NDArray[np.float32]]:
    """Every other file (and every file streamed), DECODE_BLOCK_FRAMES at a time, channels
    averaged: mono [n] float32 blocks."""
    while True:
        block = f.read(DECODE_BLOCK_FRAMES, dtype="float32", always_2d=True)  # [n, ch]
        if block.shape[0] == 0:
            return
        # mono: the column itself (the mean of one value is that value, bit for bit)
        yield block[:, 0] if block.shape[1] == 1 else block.mean(axis=1, dtype=np.float32)


def _ffmpeg_blocks(
    source: AudioSource | BinaryIO, *, flac: bool = False
) -> Iterator[tuple[npt.NDArray[np.float32], int]]:
    """FFmpeg's audio as (mono [n] float32, rate in Hz) blocks, one per decoded frame. A file
    of several members (audio/joined.py: a chained Ogg file's links, FLAC files joined with
    cat) is decoded a member at a time, each through its own demuxer and decoder: FFmpeg
    refuses or garbles members of different formats read as one stream.

    `flac` (or a member found to be one): FFmpeg checks each frame's CRC-16 and rejects a
    frame that fails it, and any rejected frame is BadAudio (no frame is skipped: see the
    module docstring), as is a member that decodes fewer frames than its STREAMINFO declares;
    both raised after the blocks that did decode. Each block comes with its frame's rate,
    which changes between members and where MPEG audio files of different rates were joined
    (`_RATE_CHANGE_DECODERS`); within a member of other codecs a rate change, and in a FLAC
    one of the channel count too, is BadAudio when it comes. A BadAudio of a later member
    names it ("in FLAC file 2 of those joined", "in link 2 of the Ogg chain").
    """
    for index, (part, part_flac, min_frames, rifx) in enumerate(_parts(source)):
        try:
            yield from _ffmpeg_part_blocks(
                part, flac=flac or part_flac, min_frames=min_frames, rifx=rifx
            )
        except BadAudio as e:
            if index == 0:
                raise
            # a later member's own header, count and frames: the message said "the header"
            # of a file whose first header declared another length, and decoded in full
            n = index + 1
            which = f"FLAC file {n} of those joined" if part_flac else f"link {n} of the Ogg chain"
            raise BadAudio(f"{e.message} (in {which}; the ones before it decoded)") from e


def _parts(
    source: AudioSource | BinaryIO,
) -> Iterator[tuple[AudioSource | BinaryIO | Tail, bool, int, bool]]:
    """`source` as the parts FFmpeg decodes one at a time, each with whether it is a FLAC,
    the frames its STREAMINFO declares (0: unknown, or not a FLAC) and whether it is a
    big-endian WAV (RIFX, `_ffmpeg_part_blocks`): an Ogg or FLAC file's
    members, as streams (audio/joined.py); any other file, itself (a path FFmpeg opens as
    before), or its audio past the tags in front of it (`_past_tags`). A stream is always
    read through audio/joined.py (anything else passes)."""
    if not isinstance(source, (Path, bytes)):
        yield from members(source)
        return
    with _seekable(source) as raw:
        start = audio_start(raw)
        audio = cast(BinaryIO, Tail(raw, start)) if start else raw
        if splits(audio):
            yield from members(audio)
            return
        rifx = audio.read(len(RIFX_MARKER)) == RIFX_MARKER
        audio.seek(0)
        if start:  # read while `raw` is open
            yield audio, False, 0, rifx
            return
    yield source, False, 0, rifx


# FFmpeg's WAV demuxer (FFmpeg 8.0, libavformat 62, as PyAV 18 ships it) takes a RIFX file's
# PCM as little-endian: its samples byte-swapped, loud noise without an error. libsndfile
# reads RIFX right, but not from a pipe, nor a WAV it leaves to FFmpeg (a data size of 0).
_RIFX_REFUSED = (
    "cannot decode a big-endian WAV (RIFX) here: FFmpeg would read its samples as "
    "little-endian (noise); pass it as a file or an upload of its bytes (not a pipe), or "
    "convert it to an ordinary (RIFF) WAV first, e.g. with sox"
)


def _ffmpeg_part_blocks(
    source: AudioSource | BinaryIO | Tail, *, flac: bool, min_frames: int, rifx: bool = False
) -> Iterator[tuple[npt.NDArray[np.float32], int]]:
    """`_ffmpeg_blocks` of one part (a file, or one member of a joined one); `min_frames`:
    BadAudio when fewer frames (at its rate) decode. `rifx`: the part is a big-endian WAV,
    BadAudio before any block where FFmpeg would decode its samples as little-endian."""
    converter = _MonoConverter()
    num_packets = num_bad_packets = num_frames = 0
    first: tuple[int, int] | None = None  # the first frame's (rate, channels)
    rate = 0  # Hz of the last frame
    demuxer = ""  # FFmpeg's name for the container, once open
    try:
        with _open_container(source) as container:
            demuxer = container.format.name
            stream = _audio_stream(container)
            if rifx and stream.codec_context.name.endswith("le"):
                raise BadAudio(_RIFX_REFUSED)
            if flac:  # a failed CRC is only logged by default, and the frame returned
                stream.codec_context.options = {"err_detect": "crccheck+explode"}
            trim = trim_for(container, stream)
            rate_free = stream.codec_context.name in _RATE_CHANGE_DECODERS
            for packet in _packets(container, stream):
                num_packets += 1
                if trim is not None:
                    trim.see(packet)
                try:
                    frames = packet.decode()
                except av.InvalidDataError:  # skipped, as ffmpeg does (module docstring)
                    num_bad_packets += 1
                    continue
                for frame in frames:
                    shape = (int(frame.sample_rate), len(frame.layout.channels))
                    if first is None:
                        first = shape
                    elif shape != first and (flac or (shape[0] != first[0] and not rate_free)):
                        # within one FLAC stream: a damaged frame header (joined files are
                        # members of their own)
                        raise BadAudio(_format_change(first, shape))
                    num_frames += frame.samples
                    rate = shape[0]
                    monos = converter.convert(frame)
                    if trim is not None and (kept := trim.kept(frame, frame.samples)):
                        monos = _sliced(monos, *kept)
                    for mono in monos:
                        yield mono, rate
            for mono in converter.flush():
                yield mono, rate
    except av.FFmpegError as e:
        if demuxer.startswith("mov") and not isinstance(source, (Path, bytes, Tail)):
            # read without seeking (`livemeet stream -`), FFmpeg's mov demuxer fails on a file
            # whose moov follows its audio with no hint of why (a trial)
            raise BadAudio(
                f"cannot decode the MP4/M4A/MOV as a stream (FFmpeg: {_ffmpeg_message(e)}): "
                "one with its index (moov atom) after its audio, as most recorders write it, "
                "cannot be read without seeking: save it to a file and pass that, or remux "
                "it with `ffmpeg -i IN -c copy -movflags +faststart OUT.m4a`"
            ) from e
        raise BadAudio(f"cannot decode the audio: FFmpeg: {_ffmpeg_message(e)}") from e
    _check_frame_count("flac", min_frames, num_frames)
    if flac and num_bad_packets:
        raise BadAudio(
            f"the flac audio is truncated or corrupt: FFmpeg rejected {num_bad_packets} of its "
            f"{num_packets} frames (a cut or a failed checksum)"
        )
    if num_bad_packets > MAX_BAD_PACKET_FRACTION * num_packets:
        raise BadAudio(
            f"cannot decode the audio: FFmpeg rejected {num_bad_packets} of its {num_packets} "
            "packets as invalid data"
        )


def _packets(
    container: av.container.InputContainer, stream: av.AudioStream
) -> Iterator[av.Packet[av.AudioStream]]:
    """`container.demux(stream)`, but for the end of a WavPack read from a pipe: FFmpeg's wv
    demuxer passes the APE tag at a WavPack's end (which its writers, FFmpeg among them, put
    there) only where it can seek to it first, and from a pipe read it as a block: "Invalid
    data found when processing input" once every sample had been demuxed (a breadth probe of
    codecs). That error, after packets that reach the samples the WavPack's block headers
    declare, ends it."""
    end = 0  # where the packets so far end, in the stream's time base
    try:
        for packet in container.demux(stream):
            if packet.pts is not None and packet.duration:
                end = max(end, packet.pts + packet.duration)
            yield packet
    except av.InvalidDataError:
        if container.format.name != "wv" or not stream.duration or end < stream.duration:
            raise


def _sliced(
    monos: Iterator[npt.NDArray[np.float32]], start: int, stop: int
) -> Iterator[npt.NDArray[np.float32]]:
    """Samples [start, stop) of one frame's mono blocks, as non-empty blocks."""
    offset = 0
    for mono in monos:
        lo, hi = max(start - offset, 0), min(stop - offset, mono.shape[0])
        if hi > lo:
            yield mono[lo:hi]
        offset += mono.shape[0]


# FFmpeg decoders that decode audio whose rate changes mid-stream as they decode each part alone:
# MPEG audio layers I-III, whose every frame is self-contained (MP3 files of 16 and 48 kHz
# joined with cat: each part bit for bit). Not AAC's or AC-3's: after a change (ADTS 16 ->
# 48 kHz, AC-3 32 -> 48 kHz) they decode every later frame wrong, samples off by up to 0.5, so
# a rate change there stays BadAudio
_RATE_CHANGE_DECODERS = frozenset({"mp1", "mp1float", "mp2", "mp2float", "mp3", "mp3float"})

# 16- and 32-bit integer sample formats (packed and planar) -> the factor that scales them to
# [-1, 1), as libswresample's conversion to float does (FLAC decodes to these)
_INT_SCALES = {"s16": 2.0**-15, "s16p": 2.0**-15, "s32": 2.0**-31, "s32p": 2.0**-31}


class _MonoConverter:
    """Decoded frames -> mono float32 [n]: channels averaged after a conversion to float.

    Float and 16/32-bit integer frames (every FLAC, MP3, AAC, Opus and Vorbis frame) are
    converted with numpy, bit for bit as libswresample's conversion to fltp converts them (an
    exact scaling by a power of two, then the same channel mean), without its per-frame cost:
    `decode_file` of a 37-minute 16 kHz mono FLAC on a 2-core CPU box, ~0.46 s through it,
    ~0.38 s here (libsndfile, before FLAC came to FFmpeg: ~0.30 s). Other sample formats go
    through libswresample (`av.AudioResampler`), a fresh one whenever the format or layout
    changes (it refuses frames unlike its first).
    """

    def __init__(self) -> None:
        self._resampler: av.AudioResampler | None = None
        self._resampler_kind: tuple[str, str] = ("", "")  # its frames' (format, layout)

    def convert(self, frame: av.AudioFrame) -> Iterator[npt.NDArray[np.float32]]:
        fmt = frame.format
        if fmt.name in _INT_SCALES or fmt.name in ("flt", "fltp"):
            channels = len(frame.layout.channels)
            samples = frame.to_ndarray()  # [channels, n] planar, [1, n * channels] packed
            if not fmt.is_planar:
                samples = samples.reshape(-1, channels).T
            # C order: the channel mean below adds the same rows in the same order as on
            # libswresample's [channels, n] planes
            planes = samples.astype(np.float32, order="C")
            if fmt.name in _INT_SCALES:
                planes *= np.float32(_INT_SCALES[fmt.name])
            yield _mono(planes)
            return
        kind = (fmt.name, frame.layout.name)
        if kind != self._resampler_kind:
            yield from self.flush()
            self._resampler = av.AudioResampler(format="fltp")
            self._resampler_kind = kind
        assert self._resampler is not None
        for out in self._resampler.resample(frame):
            yield _mono(np.asarray(out.to_ndarray(), np.float32))  # fltp: no copy

    def flush(self) -> Iterator[npt.NDArray[np.float32]]:
        """What the resampler still holds (nothing, as it never changes the rate)."""
        if self._resampler is not None:
            for out in self._resampler.resample(None):
                yield _mono(np.asarray(out.to_ndarray(), np.float32))  # fltp: no copy


def _mono(planes: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """[channels, n] float planes -> their mean, [n] (one channel: itself, bit for bit)."""
    mono: Samples = planes[0] if planes.shape[0] == 1 else planes.mean(axis=0, dtype=np.float32)
    return mono


def _format_change(first: tuple[int, int], now: tuple[int, int]) -> str:
    """BadAudio's message for decoded frames whose (rate in Hz, channels) changed."""
    (rate, channels), (new_rate, new_channels) = first, now
    what = (
        f"sample rate changes mid-stream ({rate} -> {new_rate} Hz)"
        if new_rate != rate
        else f"channel count changes mid-stream ({channels} -> {new_channels})"
    )
    return f"the audio's {what}: files of different formats joined (e.g. with cat)?"


def _open_container(source: AudioSource | BinaryIO | Tail) -> av.container.InputContainer:
    """Open `source` with FFmpeg; BadAudio when neither libsndfile nor FFmpeg can read it."""
    try:
        # No format= for bytes: FFmpeg recognises our containers from their content alone;
        # one outside FFMPEG_DEMUXERS fails here, before its header is read.
        return av.open(
            _openable(source),
            mode="r",
            metadata_errors="ignore",
            container_options=_FFMPEG_OPTIONS,
        )
    except av.FFmpegError as e:
        raise BadAudio(
            "not an audio file, a damaged or truncated one, or a container livemeet does not "
            "read: "
            f"FFmpeg: {_ffmpeg_message(e)}"
        ) from e


def _audio_stream(container: av.container.InputContainer) -> av.AudioStream:
    if not container.streams.audio:
        kinds = ", ".join(sorted({s.type for s in container.streams})) or "none"
        raise BadAudio(
            f"no audio stream in the {container.format.name} container (streams: {kinds})"
        )
    stream = container.streams.audio[0]
    if stream.codec_context is None:  # demuxed, but this FFmpeg build has no decoder for it
        raise BadAudio(
            f"the audio in the {container.format.name} container is in a codec that cannot "
            "be decoded"
        )
    return stream


def _container_duration_s(container: av.container.InputContainer, stream: av.AudioStream) -> float:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    total = 0.0  # no declared duration (e.g. MediaRecorder WebM): sum the demuxed packets
    for packet in container.demux(stream):
        if packet.duration and packet.time_base is not None:
            total += float(packet.duration * packet.time_base)
    return total if math.isfinite(total) else 0.0


def _ffmpeg_message(e: av.FFmpegError) -> str:
    # str(e) embeds the server-side file path; strerror does not.
    return str(e.strerror or type(e).__name__)
