"""Transcript writers: the one set of renderers shared by the CLI, HTTP and WebSocket paths.

Formats follow OpenAI's `POST /v1/audio/transcriptions` `response_format` values (DESIGN.md
section 6) so the OpenAI client libraries work unchanged; the JSON shapes are those of the
openai-python models `Transcription` (json), `TranscriptionVerbose` (verbose_json) and
`TranscriptionDiarized` (diarized_json, as returned by gpt-4o-transcribe-diarize). Subtitles:
SRT cues carry the speaker as a `S01: ` prefix, WebVTT cues as a `<v S01>` voice span (W3C
WebVTT section 4.2.2). Plain text never carries speaker or time tags. A live transcript whose
client named speakers (`speaker.rename`) shows each name where its label would be (`Alice: `,
`<v Alice>`), and its JSON bodies gain `speakers`, {label: name}; segments keep their labels.
One whose client merged labels (`speaker.merge`: "S03 is S01") shows a merged label's cues as
its target's (its name, else its label), and its JSON bodies gain `merged`, {label: target}.
Uploads have no names or merges: their bodies are as before.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
import zlib
from collections.abc import Mapping
from dataclasses import replace
from enum import StrEnum
from typing import NamedTuple

from livemeet.errors import InvalidRequest
from livemeet.transcript.segments import Segment, Transcript

CHARSET = "utf-8"  # every body is text in this encoding; content types carry no charset
UNKNOWN_LANGUAGE = "unknown"  # verbose_json's required `language` when none was given
_CUE_ARROW = "-->"  # the SRT/WebVTT timing separator; must never appear in cue text
# whitespace a cue line may break at: all of Unicode's but the no-break spaces (NBSP, figure
# space, narrow NBSP), which glue a number to its unit or French punctuation to its word
_BREAKING_SPACE = re.compile(r"[^\S\u00a0\u2007\u202f]+")
# What SubRip players read as markup in cue text, which SRT cannot escape, written as the
# fullwidth forms of the same characters (NFKC gives the text back): `<` `>` tags (<b>, <i>,
# <u>, <s>, <font> style the cue in VLC and in FFmpeg's subrip decoder, which mpv uses too;
# FFmpeg's drops an unknown tag such as `<Enter>`, its word with it, and VLC all that lies
# between `<` and `>` in a cue whose markup is not well formed, a stray `</i>`), `{` `}`
# override blocks (`{\an8}` moved a cue to the top, `{\...}` is hidden) and `\` escapes (`\N`
# broke the line). With `>` gone no `-->` is left either.
SRT_MARKUP_FORMS = {"<": "\uff1c", ">": "\uff1e", "{": "\uff5b", "}": "\uff5d", "\\": "\uff3c"}
_SRT_MARKUP = str.maketrans(SRT_MARKUP_FORMS)
# the same, undone: what a reader of livemeet's own SRT (`livemeet eval`) maps back
SRT_MARKUP_UNDONE = str.maketrans({form: char for char, form in SRT_MARKUP_FORMS.items()})
_SEEK_FRAMES_PER_S = 100  # Whisper's `seek` unit: mel frames of 10 ms


class ResponseFormat(StrEnum):
    """The accepted `response_format` values (OpenAI's names)."""

    JSON = "json"
    TEXT = "text"
    VERBOSE_JSON = "verbose_json"
    SRT = "srt"
    VTT = "vtt"
    DIARIZED_JSON = "diarized_json"


CONTENT_TYPES: dict[ResponseFormat, str] = {
    ResponseFormat.JSON: "application/json",
    ResponseFormat.TEXT: "text/plain",
    ResponseFormat.VERBOSE_JSON: "application/json",
    ResponseFormat.SRT: "application/x-subrip",
    ResponseFormat.VTT: "text/vtt",
    ResponseFormat.DIARIZED_JSON: "application/json",
}


class Rendered(NamedTuple):
    """A rendered transcript: `body` (encode with CHARSET) and its bare MIME `content_type`
    (aiohttp adds the charset itself when given `text=`)."""

    body: str
    content_type: str


def parse_response_format(value: str) -> ResponseFormat:
    """The ResponseFormat named `value`; InvalidRequest listing the accepted values otherwise."""
    try:
        return ResponseFormat(value)
    except ValueError:
        accepted = ", ".join(f.value for f in ResponseFormat)
        raise InvalidRequest(
            f"unsupported response_format {value!r}; accepted: {accepted}",
            param="response_format",
        ) from None


def render(transcript: Transcript, fmt: ResponseFormat, *, language: str | None = None) -> Rendered:
    """Render `transcript` as `fmt`; returns (body, content_type).

    `language` (echoed, MOSS-TD has no language conditioning) overrides `transcript.language`
    in verbose_json. Subtitle cues drop segments whose text is empty; JSON keeps every segment.
    """
    names = dict(transcript.speaker_names)
    merged = dict(transcript.speaker_merges)
    match fmt:
        case ResponseFormat.TEXT:
            body = transcript.text + "\n"
        case ResponseFormat.SRT:
            body = to_srt(transcript.segments, names, merged)
        case ResponseFormat.VTT:
            body = to_vtt(transcript.segments, names, merged)
        case ResponseFormat.JSON:
            plain: dict[str, object] = {
                "text": transcript.text,
                "usage": usage(transcript.duration_s),
            }
            body = _dumps(_with_speakers(plain, names, merged))
        case ResponseFormat.VERBOSE_JSON:
            verbose = _verbose(transcript, language or transcript.language)
            body = _dumps(_with_speakers(verbose, names, merged))
        case ResponseFormat.DIARIZED_JSON:
            body = _dumps(_with_speakers(_diarized(transcript), names, merged))
    return Rendered(body, CONTENT_TYPES[fmt])


def _with_speakers(
    body: dict[str, object], names: Mapping[str, str], merged: Mapping[str, str]
) -> dict[str, object]:
    """`body` with `speakers` ({label: name}) where any label is named and `merged` ({label:
    target}) where any is merged; as is otherwise, so an upload's body keeps OpenAI's shape
    exactly."""
    extra = {"speakers": dict(names)} if names else {}
    if merged:
        extra["merged"] = dict(merged)
    return {**body, **extra}


# ---- subtitles


def srt_timestamp(seconds: float) -> str:
    """`HH:MM:SS,mmm` (SubRip); hours grow past two digits (a live session has no length
    limit: 100 h is `100:00:00,000`, as players read it: FFmpeg's and VLC's parsers take the
    hours as any number, `%d`, and WebVTT allows two or more digits); negative times clamp to
    0."""
    return _timestamp(seconds, ",")


def vtt_timestamp(seconds: float) -> str:
    """`HH:MM:SS.mmm` (WebVTT, hours always written); negative times clamp to 0."""
    return _timestamp(seconds, ".")


def to_srt(
    segments: tuple[Segment, ...],
    names: Mapping[str, str] | None = None,
    merged: Mapping[str, str] | None = None,
) -> str:
    """SubRip: numbered cues from 1, one text line each, `S01: ` speaker prefix (the label's
    name from `names` where it has one: `Alice: `; a label `merged` away shows as its target).

    Newlines inside a segment become spaces (a blank line would end the cue), and the
    characters players read as markup, which SRT has no escape for, their fullwidth forms
    (`a < b` is `a ＜ b`: _SRT_MARKUP), in the text and in a speaker's name; so no `-->`
    is left in either.
    """
    cues: list[str] = []
    for segment in _cue_segments(segments):
        text = segment.text.translate(_SRT_MARKUP)
        speaker = _one_line(_shown_speaker(segment.speaker, names, merged)).translate(_SRT_MARKUP)
        prefix = f"{speaker}: " if speaker else ""
        timing = f"{srt_timestamp(segment.start_s)} {_CUE_ARROW} {srt_timestamp(segment.end_s)}"
        cues.append(f"{len(cues) + 1}\n{timing}\n{prefix}{text}\n")
    return "\n".join(cues)


def to_vtt(
    segments: tuple[Segment, ...],
    names: Mapping[str, str] | None = None,
    merged: Mapping[str, str] | None = None,
) -> str:
    """WebVTT: a `WEBVTT` header and one cue per segment, text in a `<v S01>` voice span (the
    label's name from `names` where it has one: `<v Alice>`; a label `merged` away shows as
    its target).

    Text is one line with `&`, `<`, `>` escaped as character references (so `-->` cannot occur,
    WebVTT section 4.1); so is the voice's name, whose last `-` is written `&#45;` too (`<v
    Team A -->` would hold `-->`, which a parser reads as the next cue's timings).
    """
    cues = ["WEBVTT\n"]
    for segment in _cue_segments(segments):
        text = _vtt_escape(segment.text)
        speaker = _vtt_voice(_one_line(_shown_speaker(segment.speaker, names, merged)))
        timing = f"{vtt_timestamp(segment.start_s)} {_CUE_ARROW} {vtt_timestamp(segment.end_s)}"
        cues.append(f"{timing}\n<v {speaker}>{text}</v>\n" if speaker else f"{timing}\n{text}\n")
    return "\n".join(cues)


def _shown_speaker(
    label: str, names: Mapping[str, str] | None, merged: Mapping[str, str] | None = None
) -> str:
    """What a cue shows for `label`: its target's where it was merged away (`merged`: label
    -> target, resolved already), then that label's name where the client gave one, else
    the label."""
    label = merged.get(label, label) if merged else label
    return names.get(label, label) if names else label


def _timestamp(seconds: float, decimal_marker: str) -> str:
    total_ms = _whole_ms(seconds)
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, ms = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def _whole_ms(seconds: float) -> int:
    """A cue time as written: whole milliseconds, negative times clamped to 0; the JSON
    bodies' `round(t, 3)` in ms, so every format gives the same time (`round(t * 1000)`
    rounds a product on a half ms to even: 0.0025 s was 0.003 in JSON, 00:00:00.002 in cues)."""
    return round(round(max(0.0, seconds), 3) * 1000)


def _cue_segments(segments: tuple[Segment, ...]) -> list[Segment]:
    """Segments with text, their text as one cue line (`_one_line`), each lasting at least 1
    ms once written in whole ms: a cue's end must come after its start (WebVTT section 4.1;
    players drop or misplace zero-length SubRip cues), and a model may stamp a segment with
    one time or a start pushed up to the previous one's. In order of their starts in whole ms
    (stably): a cue may not start before an earlier one in the file (WebVTT 4.1, cue
    timings), and a model may write a segment that starts before the one ahead of it."""
    cues = []
    for s in segments:
        line = _one_line(s.text)
        if not line:  # no text left on a cue line (whitespace, controls)
            continue
        start_ms = _whole_ms(s.start_s)
        end_s = (start_ms + 1) / 1000 if _whole_ms(s.end_s) <= start_ms else s.end_s
        cues.append(replace(s, text=line, end_s=end_s))
    return sorted(cues, key=lambda s: _whole_ms(s.start_s))


def _one_line(text: str) -> str:
    """`text` as one cue line: runs of breaking whitespace (newlines included) as one space,
    no-break spaces kept (`10\u202f%`, `Prix\u00a0:` must not wrap there), and the other
    control characters (C0, DEL, C1: category Cc) dropped. A byte-level tokenizer can write a
    NUL or an ESC: a player in C cut the cue at a NUL, and a terminal ran an escape. A line of
    no-break spaces alone is no text ("")."""
    parts = (
        "".join(c for c in part if unicodedata.category(c) != "Cc")
        for part in _BREAKING_SPACE.split(text)
    )
    line = " ".join(part for part in parts if part)
    return line if line.strip() else ""


def _vtt_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _vtt_voice(name: str) -> str:
    """`name` as a voice span's annotation: escaped, and a final `-` as a character reference,
    so the tag's closing `>` cannot follow two dashes."""
    escaped = _vtt_escape(name)
    return escaped[:-1] + "&#45;" if escaped.endswith("-") else escaped


# ---- JSON


def _dumps(obj: dict[str, object]) -> str:
    return json.dumps(obj, ensure_ascii=False)


def usage(duration_s: float) -> dict[str, object]:
    """OpenAI's `usage` object for `duration_s` seconds of audio: whole seconds, rounded up
    as OpenAI bills them, after rounding to ms so 30.0000001 s is 30, not 31; any audio at
    all is at least 1 s (a one-sample file rounded to 0 ms was billed 0). Every response
    that carries usage (JSON bodies, the SSE done event) uses this one."""
    seconds = math.ceil(round(duration_s, 3))
    return {"type": "duration", "seconds": max(seconds, 1) if duration_s > 0 else 0}


def _verbose(transcript: Transcript, language: str | None) -> dict[str, object]:
    """openai-python `TranscriptionVerbose`. Whisper's per-segment fields (seek, tokens,
    temperature, avg_logprob, compression_ratio, no_speech_prob) are required by its schema;
    MOSS-TD computes none of them but compression_ratio and seek, so the others hold neutral
    values (no tokens, temperature 0, avg_logprob 0, no_speech_prob 0) that pass Whisper-style
    client filters. `speaker` and `flags` (when any) are our additions."""
    segments = [
        {
            "id": i,
            "seek": round(s.start_s * _SEEK_FRAMES_PER_S),
            "start": round(s.start_s, 3),
            "end": round(s.end_s, 3),
            "text": s.text,
            "speaker": s.speaker,
            "tokens": [],
            "temperature": 0.0,
            "avg_logprob": 0.0,
            "compression_ratio": _compression_ratio(s.text),
            "no_speech_prob": 0.0,
            **s.wire_flags(),
        }
        for i, s in enumerate(transcript.segments)
    ]
    return {
        "task": "transcribe",
        "language": language or UNKNOWN_LANGUAGE,
        "duration": round(transcript.duration_s, 3),
        "text": transcript.text,
        "segments": segments,
        "usage": usage(transcript.duration_s),
    }


def _diarized(transcript: Transcript) -> dict[str, object]:
    """openai-python `TranscriptionDiarized`: segment ids are strings (ours, or `seg_<index>`
    for a segment without one); `flags` (when any) is our addition."""
    segments = [
        {
            "type": "transcript.text.segment",
            "id": s.id or f"seg_{i}",
            "start": round(s.start_s, 3),
            "end": round(s.end_s, 3),
            "text": s.text,
            "speaker": s.speaker,
            **s.wire_flags(),
        }
        for i, s in enumerate(transcript.segments)
    ]
    return {
        "task": "transcribe",
        "duration": round(transcript.duration_s, 3),
        "text": transcript.text,
        "segments": segments,
        "usage": usage(transcript.duration_s),
    }


def _compression_ratio(text: str) -> float:
    """UTF-8 bytes over zlib-compressed bytes, Whisper's repetition signal (1.0 when empty)."""
    data = text.encode(CHARSET)
    return round(len(data) / len(zlib.compress(data)), 3) if data else 1.0
