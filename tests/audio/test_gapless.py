"""livemeet.audio.decode: lossy files decode to the samples their encoder was given, to the
sample (module docstring, "Sample-exact lengths").

Every file here is made in the test at its own rate: a background (silence, a tone) with tone
bursts whose onsets are known to the sample, so a decode's length and the bursts' lag show
both the trimmed priming and the trimmed padding.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf
import soxr

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.audio.decode import decode_file, iter_decode, iter_decode_stream
from tests.audio.conftest import encode_with_pyav

F32 = npt.NDArray[np.float32]
DURATION_S = 3.0  # whole milliseconds: an MP4 edit list that FFmpeg writes holds it exactly
BURST_S = 0.02  # a 1.5 kHz tone under a Hann window, well inside 8 kHz
ONSETS_S = (0.5, 2.5)  # where the bursts start, s
RATES = [16_000, 44_100, 48_000]


def burst(t: npt.NDArray[np.float64], onset_s: float) -> npt.NDArray[np.float64]:
    """The burst that starts at `onset_s`, sampled at the times `t` (s)."""
    u = (t - onset_s) / BURST_S
    window = np.where((u >= 0) & (u < 1), 0.5 - 0.5 * np.cos(2 * np.pi * u), 0.0)
    return window * np.sin(2 * np.pi * 1500 * (t - onset_s))


def signal(rate: int, background: str, duration_s: float = DURATION_S) -> F32:
    """[round(duration_s * rate)] float32: `background` ("silence", "tone") and the bursts."""
    t = np.arange(round(duration_s * rate)) / rate
    x = 0.1 * np.sin(2 * np.pi * 440 * t) if background == "tone" else np.zeros(t.size)
    for onset_s in ONSETS_S:
        if onset_s + BURST_S < duration_s:
            x += 0.6 * burst(t, onset_s)
    return x.astype(np.float32)


def onset_lag(decoded: F32, onset_s: float) -> float:
    """How many 16 kHz samples late the burst at `onset_s` decoded (sub-sample: a parabola
    through the cross-correlation's peak), searched within +-25 ms."""
    template = burst(np.arange(round(2 * BURST_S * SAMPLE_RATE)) / SAMPLE_RATE, 0.0)
    start = round(onset_s * SAMPLE_RATE) - 400
    segment = decoded[start : start + 800 + template.size]
    corr = np.correlate(segment, template.astype(np.float32), mode="valid")
    k = int(np.argmax(corr))
    a, b, c = corr[max(k - 1, 0)], corr[k], corr[min(k + 1, corr.size - 1)]
    curve = a - 2 * b + c
    return k - 400 + (0.5 * float(a - c) / float(curve) if curve else 0.0)


def assert_sample_exact(decoded: F32, rate: int, duration_s: float = DURATION_S) -> None:
    """`decoded` (16 kHz) is as long as the source (`duration_s` at `rate` Hz), to the
    sample, with each burst within a sample of its onset."""
    assert decoded.size == round(round(duration_s * rate) * SAMPLE_RATE / rate)
    for onset_s in ONSETS_S:
        if onset_s + BURST_S < duration_s:
            assert abs(onset_lag(decoded, onset_s)) <= 1.0, f"burst at {onset_s} s"


def encode(
    path: Path, x: F32, rate: int, fmt: str, codec: str, options: dict[str, str] | None = None
) -> Path:
    """Encode mono `x` (at `rate` Hz) with PyAV into `path`; timestamps from 0, so the MP4
    muxer writes the edit list that skips the priming."""
    encode_with_pyav(path, x[None, :], fmt, codec, rate, options, source_rate=rate)
    return path


def vorbis(x: F32, rate: int) -> bytes:
    """`x` as Ogg Vorbis (libsndfile's libvorbis, as most Ogg files are made)."""
    out = io.BytesIO()
    sf.write(out, x, rate, format="OGG", subtype="VORBIS")
    return out.getvalue()


class Pipe(io.RawIOBase):
    """`data` read as a pipe gives it: in pieces, never seekable."""

    def __init__(self, data: bytes) -> None:
        self._data, self._offset = data, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        piece = self._data[self._offset : self._offset + min(len(buffer), 4096)]
        buffer[: len(piece)] = piece
        self._offset += len(piece)
        return len(piece)


def assert_every_path_agrees(data: bytes, tmp_path: Path) -> F32:
    """decode_file of the bytes and of a file, iter_decode (`livemeet stream FILE`) and
    iter_decode_stream (`livemeet stream -`): the same samples. Returns them."""
    path = tmp_path / "audio"
    path.write_bytes(data)
    whole = decode_file(data)
    np.testing.assert_array_equal(decode_file(path), whole)
    np.testing.assert_array_equal(np.concatenate(list(iter_decode(path))), whole)
    np.testing.assert_array_equal(np.concatenate(list(iter_decode_stream(Pipe(data)))), whole)
    return whole


# ---- Ogg Vorbis: FFmpeg cut a one-page stream's end by its own (shifted) timestamps


@pytest.mark.parametrize("rate", RATES)
def test_a_one_page_ogg_vorbis_decodes_to_its_length(rate: int, tmp_path: Path) -> None:
    """3 s of silence and two bursts compress to one Ogg page: FFmpeg cut 256 samples too
    many at 16 kHz (the audit's 47,744 of 48,000), 46 and 43 at 44.1 and 48 kHz."""
    decoded = assert_every_path_agrees(vorbis(signal(rate, "silence"), rate), tmp_path)
    assert_sample_exact(decoded, rate)


def test_a_one_page_ogg_vorbis_tone_decodes_to_its_length(tmp_path: Path) -> None:
    """The error depended on the content: a tone under the bursts, 16 kHz (-256 too)."""
    decoded = assert_every_path_agrees(vorbis(signal(SAMPLE_RATE, "tone"), SAMPLE_RATE), tmp_path)
    assert_sample_exact(decoded, SAMPLE_RATE)


def test_ogg_vorbis_of_any_short_length_decodes_to_it() -> None:
    """A few seconds of speech fill one page too: lengths that end anywhere in a block."""
    rng = np.random.default_rng(0)
    for num_samples in (1_000, 7_777, 12_345, 20_011):
        x = (0.05 * rng.standard_normal(num_samples)).astype(np.float32)
        assert decode_file(vorbis(x, SAMPLE_RATE)).size == num_samples


def ogg_crc(page: bytes) -> int:
    """An Ogg page's checksum (RFC 3533 section 6; libogg's): CRC-32 of polynomial 0x04C11DB7,
    not reflected, from 0, over the page with its checksum field zero."""
    crc = 0
    for byte in page:
        crc ^= byte << 24
        for _ in range(8):
            crc = (crc << 1) ^ 0x04C11DB7 if crc & 0x8000_0000 else crc << 1
        crc &= 0xFFFF_FFFF
    return crc


def ogg_page(flags: int, granule: int, serial: int, sequence: int, packets: list[bytes]) -> bytes:
    """One Ogg page of whole `packets` (RFC 3533 section 6)."""
    lacing = b"".join(bytes([255] * (len(p) // 255) + [len(p) % 255]) for p in packets)
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, serial, sequence, 0, len(lacing))
    page = bytearray(header + lacing + b"".join(packets))
    struct.pack_into("<I", page, 22, ogg_crc(bytes(page)))
    return bytes(page)


def ogg_vorbis_parts(data: bytes) -> tuple[bytes, list[bytes], int]:
    """A libsndfile Ogg Vorbis file's two header pages (identification; comment and setup),
    as they are, its audio packets and its serial number."""
    offset, pages = 0, []
    while offset < len(data):
        num_segments = data[offset + 26]
        lacing = data[offset + 27 : offset + 27 + num_segments]
        pages.append((offset, offset + 27 + num_segments, lacing))
        offset += 27 + num_segments + sum(lacing)
    packets, partial = [], b""
    for _, body, lacing in pages[2:]:
        for size in lacing:
            partial += data[body : body + size]
            body += size
            if size < 255:
                packets.append(partial)
                partial = b""
    serial = struct.unpack_from("<I", data, 14)[0]
    return data[: pages[2][0]], packets, serial


@pytest.mark.parametrize("granules", [(-1, -1), (-1, 0)], ids=["last-page-minus-1", "no-pts"])
def test_ogg_vorbis_whose_last_granule_is_meaningless_decodes_within_a_block(
    granules: tuple[int, int], tmp_path: Path
) -> None:
    """Pages written by hand against RFC 3533: the audio in two pages, the first of granule -1
    ("no packet ends here", though all but one do), the last of granule -1 or 0. FFmpeg
    takes the last packet's duration from such a granule (wrapped below 0), and after the
    pair -1, 0 gives it no timestamp at all, the `_OggVorbisTrim` branch no file from an
    encoder reaches. Nothing says where the audio ends: it decodes within a block (512
    samples) of its length, every path alike, the bursts in place."""
    x = signal(SAMPLE_RATE, "tone")
    header_pages, packets, serial = ogg_vorbis_parts(vorbis(x, SAMPLE_RATE))
    first_granule, last_granule = granules
    data = header_pages + ogg_page(0, first_granule, serial, 2, packets[:-1])
    data += ogg_page(0x04, last_granule, serial, 3, packets[-1:])  # end of stream
    with av.open(io.BytesIO(data)) as container:  # the frames as `_OggVorbisTrim` sees them
        stream = container.streams.audio[0]
        stream.codec_context.flags2 |= int(av.codec.context.Flags2.skip_manual)
        last_pts = [frame.pts for frame in container.decode(stream)][-1]
    assert (last_pts is None) == (granules == (-1, 0))
    decoded = assert_every_path_agrees(data, tmp_path)
    assert x.size - 512 <= decoded.size <= x.size
    for onset_s in ONSETS_S:
        assert abs(onset_lag(decoded, onset_s)) <= 1.0


def test_chained_ogg_vorbis_decodes_each_link_whole(tmp_path: Path) -> None:
    """Ogg files joined with cat: FFmpeg's decoder ran on across each join (the next link's
    first samples were the previous link's overlap) and cut each link's end off its own
    timeline (+256 in all for these three). Each link now decodes to its length, the bursts
    of every link where they were."""
    links = [signal(SAMPLE_RATE, "silence"), signal(SAMPLE_RATE, "tone", 2.8)]
    rng = np.random.default_rng(1)
    links.append((0.05 * rng.standard_normal(150_000)).astype(np.float32))  # several pages
    decoded = assert_every_path_agrees(b"".join(vorbis(x, SAMPLE_RATE) for x in links), tmp_path)
    assert decoded.size == sum(x.size for x in links)
    offset_s = 0.0
    for x in links[:2]:
        for onset_s in ONSETS_S:
            if onset_s + BURST_S < x.size / SAMPLE_RATE:
                assert abs(onset_lag(decoded, offset_s + onset_s)) <= 1.0
        offset_s += x.size / SAMPLE_RATE


def test_chained_ogg_of_different_formats_decodes_each_link_at_its_own(tmp_path: Path) -> None:
    """A 16 kHz mono Vorbis link, a 48 kHz stereo one and a 24 kHz Opus one, joined: FFmpeg's
    Ogg demuxer refuses a link of another rate or channel count ("Not yet implemented in
    FFmpeg, patches welcome") or codec ("Invalid argument"), so the file was BadAudio. Each
    link is now decoded alone and resampled from its own rate: to the sample, the bursts of
    every link where they were."""
    links = [
        (signal(16_000, "silence"), 16_000, 1, "VORBIS"),
        (signal(48_000, "tone", 2.8), 48_000, 2, "VORBIS"),
        (signal(24_000, "tone"), 24_000, 1, "OPUS"),
    ]
    data = b""
    for x, rate, channels, subtype in links:
        out = io.BytesIO()
        sf.write(out, np.stack([x] * channels, axis=1), rate, format="OGG", subtype=subtype)
        data += out.getvalue()
    decoded = assert_every_path_agrees(data, tmp_path)
    sizes = [round(x.size * SAMPLE_RATE / rate) for x, rate, _, _ in links]
    assert decoded.size == sum(sizes)
    offset_s = 0.0
    for (x, rate, _, _), size in zip(links, sizes, strict=True):
        for onset_s in ONSETS_S:
            if onset_s + BURST_S < x.size / rate:
                assert abs(onset_lag(decoded, offset_s + onset_s)) <= 1.0
        offset_s += size / SAMPLE_RATE


# ---- MP4: FFmpeg skipped the edit list's priming but kept the end padding


@pytest.mark.parametrize("rate", RATES)
def test_aac_in_m4a_ends_where_its_edit_list_does(rate: int, tmp_path: Path) -> None:
    """It kept the last AAC frame's padding: +128 samples at 16 and 48 kHz, +298 at 44.1."""
    path = encode(tmp_path / "a.m4a", signal(rate, "silence"), rate, "ipod", "aac")
    assert_sample_exact(decode_file(path), rate)
    np.testing.assert_array_equal(np.concatenate(list(iter_decode(path))), decode_file(path))


@pytest.mark.parametrize(
    ("codec", "rate"),
    [("libmp3lame", 44_100), ("libopus", 48_000), ("libopus", 16_000)],
    ids=["mp3", "opus", "opus-16k-timescale"],
)
def test_other_codecs_in_mp4_end_where_the_edit_list_does(
    codec: str, rate: int, tmp_path: Path
) -> None:
    """MP3 and Opus in MP4 kept their padding too (+82 and +216 samples at 16 kHz); Opus
    from a 16 kHz encode (a 16 kHz timescale, decoded at 48 kHz) also started 80 samples
    (5 ms) late, +285 in all: FFmpeg skipped its pre-skip in 16 kHz samples of the 48 kHz
    output."""
    path = encode(tmp_path / "a.mp4", signal(rate, "tone"), rate, "mp4", codec)
    assert_sample_exact(decode_file(path), rate)


@pytest.mark.parametrize("rate", [8_000, 16_000, 24_000])
def test_opus_in_mp4_of_one_packet_starts_and_ends_where_its_edit_list_does(
    rate: int, tmp_path: Path
) -> None:
    """10 ms of Opus from an encode below 48 kHz, with its pre-skip one 20-ms packet, the
    first and the short last at once: the start was found from the packet's end, so 56 of the
    160 samples were cut (104 decoded). The chirp decodes whole and in place (a lag of 0)."""
    t = np.arange(rate // 100) / rate
    x = (0.5 * np.sin(2 * np.pi * (300 * t + 75_000 * t * t))).astype(np.float32)  # to 1.8 kHz
    decoded = decode_file(encode(tmp_path / "a.mp4", x, rate, "mp4", "libopus"))
    assert decoded.size == 160
    source = soxr.resample(x, rate, SAMPLE_RATE)
    inner = slice(20, 140)  # clear of the resampler's edges

    def fit(lag: int) -> float:
        return float(np.dot(decoded[20 + lag : 140 + lag], source[inner]))

    assert max(range(-8, 9), key=fit) == 0
    assert np.corrcoef(decoded[inner], source[inner])[0, 1] > 0.99


def test_an_m4a_edit_list_in_milliseconds_ends_within_one(tmp_path: Path) -> None:
    """FFmpeg's muxer writes the edit list in milliseconds: a length between two ends within
    a millisecond of it (16 samples), not a frame's padding (44.1 kHz: +347)."""
    duration_s = 2.71828
    x = signal(44_100, "silence", duration_s)
    decoded = decode_file(encode(tmp_path / "a.m4a", x, 44_100, "ipod", "aac"))
    assert abs(decoded.size - round(duration_s * SAMPLE_RATE)) <= 16
    assert abs(onset_lag(decoded, ONSETS_S[0])) <= 1.0


def timed_in_milliseconds(m4a: bytes) -> bytes:
    """An M4A without an edit list whose track counts in milliseconds, as some muxers write
    one: each frame's duration truncated to whole ms (1,024 samples at 44.1 kHz: 23 ms, not
    23.22), the track's the sum of those."""
    data = bytearray(m4a)
    mdhd, stts = data.find(b"mdhd"), data.find(b"stts")
    assert data[mdhd + 4] == 0  # version 0: 32-bit times
    rate = struct.unpack_from(">I", data, mdhd + 16)[0]
    num_entries = struct.unpack_from(">I", data, stts + 8)[0]
    total = 0
    for i in range(num_entries):
        count, duration = struct.unpack_from(">II", data, stts + 12 + 8 * i)
        struct.pack_into(">II", data, stts + 12 + 8 * i, count, duration * 1000 // rate)
        total += count * (duration * 1000 // rate)
    struct.pack_into(">II", data, mdhd + 16, 1000, total)
    return bytes(data)


def test_an_mp4_timed_in_milliseconds_loses_no_audio_between_frames(tmp_path: Path) -> None:
    """A packet's duration rounded to a coarse time base is not a short last packet: each
    frame cut at its packet's end dropped ~10 of its 1,024 samples all through the file. The
    audio is the same as that of the file timed in samples, to where its track ends."""
    path = encode(
        tmp_path / "a.m4a", signal(44_100, "tone"), 44_100, "ipod", "aac", {"use_editlist": "0"}
    )
    in_samples = decode_file(path)
    in_ms = decode_file(timed_in_milliseconds(path.read_bytes()))
    # the last frame cut at its packet's end, in whole ms: within a tick (16 samples)
    assert abs(in_ms.size - in_samples.size) <= 16
    # the resampler's flush differs at the cut: compared up to 10 ms before it
    n = in_ms.size - 160
    np.testing.assert_allclose(in_ms[:n], in_samples[:n], atol=1e-6)


def with_itunsmpb(m4a: bytes, stale: bool = False) -> bytes:
    """An M4A with no edit list (FFmpeg's `use_editlist=0`) made as iTunes makes one: every
    sample in the sample table lasts a whole frame, and the gapless data is an iTunSMPB tag
    (priming, padding and length, in hex) appended to its moov (its last box). `stale`: the
    tag says half the length, as one copied from another file: they no longer add up to the
    track's."""
    data = bytearray(m4a)
    stts = data.find(b"stts")
    num_entries = struct.unpack_from(">I", data, stts + 8)[0]
    entries = [struct.unpack_from(">II", data, stts + 12 + 8 * i) for i in range(num_entries)]
    assert entries[-1][0] == 1  # the short last frame
    struct.pack_into(">II", data, stts + 12 + 8 * (num_entries - 1), 1, 1024)
    total = 1024 * sum(count for count, _ in entries)
    struct.pack_into(">I", data, data.find(b"mdhd") + 20, total)  # the track's duration
    length = sum(count * duration for count, duration in entries) - 1024
    padding = total - 1024 - length
    if stale:
        length //= 2

    def box(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I4s", 8 + len(payload), kind) + payload

    tag = box(
        b"----",
        box(b"mean", bytes(4) + b"com.apple.iTunes")
        + box(b"name", bytes(4) + b"iTunSMPB")
        + box(b"data", struct.pack(">II", 1, 0) + f" 0 400 {padding:X} {length:X}".encode()),
    )
    handler = box(b"hdlr", bytes(8) + b"mdirappl" + bytes(9))
    udta = box(b"udta", box(b"meta", bytes(4) + handler + box(b"ilst", tag)))
    moov = data.find(b"moov") - 4
    assert moov + struct.unpack_from(">I", data, moov)[0] == len(data)
    struct.pack_into(">I", data, moov, struct.unpack_from(">I", data, moov)[0] + len(udta))
    return bytes(data + udta)


def test_an_m4a_with_only_an_itunsmpb_tag_ends_at_its_length(tmp_path: Path) -> None:
    """FFmpeg reads the tag's priming, not its length: the padding stayed (+298 at 44.1 kHz)."""
    path = encode(
        tmp_path / "a.m4a", signal(44_100, "silence"), 44_100, "ipod", "aac", {"use_editlist": "0"}
    )
    m4a = with_itunsmpb(path.read_bytes())
    with av.open(io.BytesIO(m4a)) as container:
        assert "iTunSMPB" in container.metadata  # the tag as FFmpeg reads it
    assert_sample_exact(decode_file(m4a), 44_100)


def test_a_stale_itunsmpb_tag_cuts_no_audio(tmp_path: Path) -> None:
    """A tag that does not add up to the track (a re-encode copied it over) says nothing:
    all the audio decodes, its padding with it (followed, it would cut the audio in half)."""
    path = encode(
        tmp_path / "a.m4a", signal(44_100, "silence"), 44_100, "ipod", "aac", {"use_editlist": "0"}
    )
    decoded = decode_file(with_itunsmpb(path.read_bytes(), stale=True))
    assert round(DURATION_S * SAMPLE_RATE) <= decoded.size <= round(DURATION_S * SAMPLE_RATE) + 400
    for onset_s in ONSETS_S:
        assert abs(onset_lag(decoded, onset_s)) <= 1.0


# ---- what held before, and what no file records


def sf_encoded(fmt: str, subtype: str) -> Callable[[F32, int, Path], Path]:
    def write(x: F32, rate: int, folder: Path) -> Path:
        path = folder / f"a.{fmt.lower()}"
        sf.write(path, x, rate, format=fmt, subtype=subtype)
        return path

    return write


def av_encoded(
    fmt: str, codec: str, options: dict[str, str] | None = None
) -> Callable[[F32, int, Path], Path]:
    def write(x: F32, rate: int, folder: Path) -> Path:
        return encode(folder / f"a.{fmt}", x, rate, fmt, codec, options)

    return write


HELD = {
    "ogg-opus-16k": (sf_encoded("OGG", "OPUS"), 16_000),
    "ogg-opus-48k": (sf_encoded("OGG", "OPUS"), 48_000),
    "webm-opus-recorder": (av_encoded("webm", "libopus", {"live": "1"}), 48_000),
    "mp3-lame-16k": (sf_encoded("MP3", "MPEG_LAYER_III"), 16_000),
    "mp3-lame-44k": (av_encoded("mp3", "libmp3lame"), 44_100),
    "flac-44k": (sf_encoded("FLAC", "PCM_16"), 44_100),
    "wav-48k": (sf_encoded("WAV", "PCM_16"), 48_000),
}


@pytest.mark.parametrize("name", HELD)
def test_formats_ffmpeg_trims_stay_sample_exact(name: str, tmp_path: Path) -> None:
    """Exact before these fixes too (FFmpeg trims them: Ogg granules, WebM CodecDelay and
    DiscardPadding, LAME's header), kept so (the trimming is ours only for Vorbis and MP4)."""
    write, rate = HELD[name]
    assert_sample_exact(decode_file(write(signal(rate, "tone"), rate, tmp_path)), rate)


CLICKS_S = (0.5, 1.25, 2.0, 2.75)  # where the click track's clicks start, s


def click_track(rate: int) -> F32:
    """DURATION_S of silence at `rate` Hz with a 1-ms click (noise under a Hann window) at
    each of CLICKS_S: broadband, so a cross-correlation finds each to the sample."""
    x = np.zeros(round(DURATION_S * rate), np.float32)
    width = rate // 1000
    click = 0.5 * np.random.default_rng(7).standard_normal(width) * np.hanning(width)
    for onset_s in CLICKS_S:
        x[round(onset_s * rate) : round(onset_s * rate) + width] += click.astype(np.float32)
    return x


def click_delays(decoded: F32, source: F32, rate: int) -> list[float]:
    """How many 16 kHz samples late each click of `source` (at `rate` Hz) decoded, searched
    from 12.5 ms early to 100 ms late (sub-sample: a parabola through the peak)."""
    reference = soxr.resample(source, rate, SAMPLE_RATE)
    delays = []
    for onset_s in CLICKS_S:
        at = round(onset_s * SAMPLE_RATE)
        template = reference[at - 40 : at + 80]
        corr = np.correlate(decoded[at - 240 : at + 1680], template, mode="valid")
        k = int(np.argmax(corr))
        a, b, c = corr[k - 1], corr[k], corr[k + 1]
        delays.append(k - 200 + 0.5 * float(a - c) / float(a - 2 * b + c))
    return delays


# what decodes late and long where a file records no delay: format, encoder, muxer options,
# the encoder delay left (samples at the file's rate), whether the end padding stays
KEPT_DELAYS = {
    "mp3-without-a-lame-header": ("mp3", "libmp3lame", {"write_xing": "0"}, 1_105, True),
    "mp3-in-a-wav": ("wav", "libmp3lame", {}, 1_105, True),
    "adts-aac": ("adts", "aac", {}, 1_024, True),
    "aac-in-fragmented-mp4": ("mp4", "aac", {"movflags": "frag_keyframe+empty_moov"}, 1_024, False),
    "aac-in-matroska": ("matroska", "aac", {}, 0, True),
}


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("name", KEPT_DELAYS)
def test_files_that_record_no_delay_decode_as_late_as_documented(
    name: str, rate: int, tmp_path: Path
) -> None:
    """Documented, not fixed (decode.py, "Sample-exact lengths"): nothing in these files says
    how long their encoder's delay is, and no standard fixes it (AAC's priming is 1,024
    samples from FFmpeg's encoder, 2,112 from Apple's; of an MP3's 1,105, 576 are LAME's),
    so the audio comes that late, as FFmpeg and the ffmpeg command line give it: LAME's 1,105
    samples at the file's rate (69 ms at 16 kHz, 25 ms at 44.1 kHz), AAC's 1,024 (64 ms,
    23 ms); Matroska's AAC starts on time and keeps its end padding. Every click comes that
    late, to the sample, and the length grows by the delay and any padding (a frame at
    most: 1,152 samples for MP3, 1,024 for AAC)."""
    fmt, codec, options, delay, padded = KEPT_DELAYS[name]
    x = click_track(rate)
    decoded = decode_file(encode(tmp_path / f"a.{fmt}", x, rate, fmt, codec, options))
    late = delay * SAMPLE_RATE / rate
    for found in click_delays(decoded, x, rate):
        assert abs(found - late) <= 0.5
    longer = decoded.size - round(x.size * SAMPLE_RATE / rate)
    frame = (1_152 if codec == "libmp3lame" else 1_024) * SAMPLE_RATE / rate
    if padded:
        assert late < longer <= late + frame + 1
    else:
        assert abs(longer - late) <= 1
