"""Readers for the reference and hypothesis formats that `livemeet eval` scores.

Formats (one record per line unless noted; times in seconds):

- STM (NIST sclite): `session channel speaker start end [<label>] text...`; `;;` starts a comment.
- RTTM (NIST md-eval): `SPEAKER session channel start duration <NA> <NA> speaker <NA> <NA>`;
  lines of other types (SPKR-INFO, LEXEME...) are skipped.
- UEM (NIST md-eval): `session channel start end`.
- CTM (NIST sclite): `session channel start duration word [confidence]`; one word a line and no
  speaker, so the whole file is one speaker stream (as meeteval reads it).
- SegLST (meeteval, JSON): a list of `{session_id, speaker, start_time, end_time, words}`.
- Kaldi `text` (a Kaldi data directory's file of that name): `utterance-id word...`, untimed
  and without speakers: each utterance is a session of one `KALDI_SPEAKER` segment at 0..0,
  for the text metrics only (no DER). Its lines read as plain text too (the id as a word), so
  the name tells it (`kaldi_named`), or the caller says so (`fmt="kaldi"`).
- livemeet transcript JSON (verbose_json / diarized_json): `{"segments": [{start, end, speaker,
  text}, ...]}`; it names no session, so its records get `session=DEFAULT_SESSION`.
- livemeet's (OpenAI's) `json` response, `{"text": ...}` without segments, and a `.txt` file
  whose first line is none of the formats above (the `text` response format): the whole text
  as one untimed segment of session `DEFAULT_SESSION` and speaker `PLAIN_SPEAKER`, for the
  text metrics only (no DER).

Channels are read and dropped: sessions are keyed by id alone (md-eval silently ignores a UEM
whose channel does not match; we do not). Malformed input raises `InvalidRequest` naming
`file:line`.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from livemeet.errors import InvalidRequest
from livemeet.transcript.formats import SRT_MARKUP_UNDONE

DEFAULT_SESSION = "default"  # session id of records read from a format that names none
CTM_SPEAKER = "ctm"  # speaker label of records read from a CTM (which has no speaker field)
KALDI_SPEAKER = "kaldi"  # speaker label of records read from a Kaldi text file (none there)
KALDI_TEXT_NAME = "text"  # the file name of a Kaldi data directory's transcripts
PLAIN_SPEAKER = "text"  # speaker label of a transcript without segments (json `text`, .txt)


def _check_span(record: TextSegment | SpeakerTurn | UemRegion) -> None:
    """ValueError unless `0 <= start_s <= end_s`, both finite: the readers refuse such times
    with the file and line (`_interval`); records made in code get this."""
    start_s, end_s = record.start_s, record.end_s
    if not (0 <= start_s <= end_s and math.isfinite(end_s)):
        raise ValueError(f"{type(record).__name__} needs finite 0 <= start_s <= end_s: {record}")


@dataclass(frozen=True)
class TextSegment:
    """One timed, speaker-labelled stretch of text (finite `0 <= start_s <= end_s`, seconds;
    else ValueError)."""

    session: str
    speaker: str
    start_s: float
    end_s: float
    text: str

    def __post_init__(self) -> None:
        _check_span(self)


@dataclass(frozen=True)
class SpeakerTurn:
    """One stretch of time in which `speaker` talks (finite `0 <= start_s <= end_s`, seconds;
    else ValueError)."""

    session: str
    speaker: str
    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        _check_span(self)


@dataclass(frozen=True)
class UemRegion:
    """One scored region of a session (finite `0 <= start_s <= end_s`, seconds; else
    ValueError)."""

    session: str
    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        _check_span(self)


def _lines(text: str) -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, whitespace fields) of each non-blank, non-comment line."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith(";;"):
            yield lineno, stripped.split()


def _number(value: object, where: str, name: str) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidRequest(f"{where}: {name} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise InvalidRequest(f"{where}: {name} is not finite: {value!r}")
    return number


def _interval(start: object, end: object, where: str) -> tuple[float, float]:
    start_s = _number(start, where, "start time")
    end_s = _number(end, where, "end time")
    if start_s < 0 or end_s < start_s:
        raise InvalidRequest(f"{where}: bad interval {start_s}..{end_s} (need 0 <= start <= end)")
    return start_s, end_s


def parse_stm(text: str, source: str = "<stm>") -> tuple[TextSegment, ...]:
    """STM lines -> segments in file order. The optional `<...>` label field is skipped, as
    sclite does (meeteval reads it as a word of the transcript)."""
    out = []
    for lineno, fields in _lines(text):
        where = f"{source}:{lineno}"
        if len(fields) < 5:
            raise InvalidRequest(f"{where}: STM needs 'session channel speaker start end text'")
        start_s, end_s = _interval(fields[3], fields[4], where)
        words = fields[5:]
        if words and words[0].startswith("<") and words[0].endswith(">"):
            words = words[1:]
        out.append(TextSegment(fields[0], fields[2], start_s, end_s, " ".join(words)))
    return tuple(out)


def parse_rttm(text: str, source: str = "<rttm>") -> tuple[SpeakerTurn, ...]:
    """RTTM `SPEAKER` lines -> turns in file order (end = start + duration)."""
    out = []
    for lineno, fields in _lines(text):
        where = f"{source}:{lineno}"
        if fields[0] != "SPEAKER":
            continue
        if len(fields) < 8:
            raise InvalidRequest(f"{where}: RTTM SPEAKER line needs at least 8 fields")
        start_s = _number(fields[3], where, "start time")
        duration_s = _number(fields[4], where, "duration")
        start_s, end_s = _interval(start_s, start_s + duration_s, where)
        out.append(SpeakerTurn(fields[1], fields[7], start_s, end_s))
    return tuple(out)


def parse_uem(text: str, source: str = "<uem>") -> tuple[UemRegion, ...]:
    """UEM lines -> scored regions in file order."""
    out = []
    for lineno, fields in _lines(text):
        where = f"{source}:{lineno}"
        if len(fields) != 4:
            raise InvalidRequest(f"{where}: UEM needs 'session channel start end'")
        start_s, end_s = _interval(fields[2], fields[3], where)
        out.append(UemRegion(fields[0], start_s, end_s))
    return tuple(out)


def parse_kaldi_text(text: str, source: str = "<text>") -> tuple[TextSegment, ...]:
    """Kaldi `text` lines (`utterance-id word...`) -> one untimed segment per utterance, its
    id the session (an id alone: an empty utterance)."""
    del source  # every non-blank line parses
    return tuple(
        TextSegment(fields[0], KALDI_SPEAKER, 0.0, 0.0, " ".join(fields[1:]))
        for _, fields in _lines(text)
    )


def parse_ctm(text: str, source: str = "<ctm>") -> tuple[TextSegment, ...]:
    """CTM lines -> one single-word segment per line, speaker `CTM_SPEAKER`."""
    out = []
    for lineno, fields in _lines(text):
        where = f"{source}:{lineno}"
        if len(fields) not in (5, 6):
            raise InvalidRequest(f"{where}: CTM needs 'session channel start duration word [conf]'")
        start_s = _number(fields[2], where, "start time")
        duration_s = _number(fields[3], where, "duration")
        start_s, end_s = _interval(start_s, start_s + duration_s, where)
        out.append(TextSegment(fields[0], CTM_SPEAKER, start_s, end_s, fields[4]))
    return tuple(out)


def _load_json(text: str, source: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{source}:{exc.lineno}: bad JSON: {exc.msg}") from None


def _field(record: object, keys: tuple[str, ...], where: str) -> object:
    if not isinstance(record, dict):
        raise InvalidRequest(f"{where}: expected an object, got {type(record).__name__}")
    for key in keys:
        if key in record:
            return record[key]
    raise InvalidRequest(f"{where}: missing field {keys[0]!r}")


def parse_seglst(text: str, source: str = "<seglst>") -> tuple[TextSegment, ...]:
    """SegLST JSON -> segments in list order. `where` in errors is `file:#index`."""
    data = _load_json(text, source)
    if not isinstance(data, list):
        raise InvalidRequest(f"{source}: SegLST must be a JSON list")
    out = []
    for index, record in enumerate(data):
        where = f"{source}:#{index}"
        start_s, end_s = _interval(
            _field(record, ("start_time",), where), _field(record, ("end_time",), where), where
        )
        words = _field(record, ("words",), where)
        if isinstance(words, list):
            words = " ".join(str(w) for w in words)
        out.append(
            TextSegment(
                str(_field(record, ("session_id",), where)),
                str(_field(record, ("speaker",), where)),
                start_s,
                end_s,
                str(words),
            )
        )
    return tuple(out)


def parse_transcript_json(text: str, source: str = "<json>") -> tuple[TextSegment, ...]:
    """livemeet verbose_json/diarized_json -> segments, all in session `DEFAULT_SESSION`.

    Accepts `start`/`end` or `start_s`/`end_s`. A segment without `speaker` gets speaker "".
    """
    data = _load_json(text, source)
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise InvalidRequest(f"{source}: transcript JSON needs a 'segments' list or a 'text'")
    out = []
    for index, record in enumerate(data["segments"]):
        where = f"{source}:segments[{index}]"
        start_s, end_s = _interval(
            _field(record, ("start", "start_s"), where),
            _field(record, ("end", "end_s"), where),
            where,
        )
        speaker = record.get("speaker") or ""
        text_value = _field(record, ("text",), where)
        out.append(TextSegment(DEFAULT_SESSION, str(speaker), start_s, end_s, str(text_value)))
    return tuple(out)


def parse_text_json(text: str, source: str = "<json>") -> tuple[TextSegment, ...]:
    """A `{"text": ...}` response (livemeet's or OpenAI's `json` format) -> one untimed
    segment holding the text."""
    data = _load_json(text, source)
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise InvalidRequest(f"{source}: transcript JSON needs a 'segments' list or a 'text'")
    return (TextSegment(DEFAULT_SESSION, PLAIN_SPEAKER, 0.0, 0.0, data["text"]),)


# an SRT cue's speaker prefix as livemeet's writer puts it ("S01: text", DESIGN section 6)
_SRT_SPEAKER = re.compile(r"^(S\d+):\s*")


def parse_captions(text: str, source: str, fmt: str) -> tuple[TextSegment, ...]:
    """SRT or WebVTT captions (`fmt` "srt" or "vtt"; livemeet's own `srt`/`vtt` responses or
    any others) -> segments, read with webvtt-py. A cue's lines are joined with spaces; its
    speaker is a WebVTT voice (`<v S01>`) or livemeet's SRT prefix (`S01: `), else "". WebVTT
    escapes (`&amp;`, `&lt;`) are undone, as livemeet's writer makes them.
    Raises InvalidRequest for malformed captions."""
    import webvtt

    try:
        captions = webvtt.from_buffer(text.splitlines(), format=fmt)
    except webvtt.errors.MalformedFileError as exc:
        raise InvalidRequest(f"{source}: malformed {fmt.upper()}: {exc}") from None
    out = []
    for cue in captions.captions:
        # WebVTT: tags dropped (`text`), then its escapes undone; SRT escapes nothing, and a
        # "<...>" there is text (`raw_text`), whose markup characters livemeet's writer puts as
        # their fullwidth forms (SRT_MARKUP_FORMS): read back as they were
        if fmt == "vtt":
            body = html.unescape(cue.text)
        else:
            body = cue.raw_text.translate(SRT_MARKUP_UNDONE)
        body = " ".join(body.split())
        speaker = cue.voice or ""
        if fmt == "srt" and (prefix := _SRT_SPEAKER.match(body)):
            speaker, body = prefix.group(1), body[prefix.end() :]
        start_s = cue.start_time.in_milliseconds() / 1000
        end_s = cue.end_time.in_milliseconds() / 1000
        out.append(TextSegment(DEFAULT_SESSION, speaker, start_s, max(start_s, end_s), body))
    return tuple(out)


def parse_srt(text: str, source: str = "<srt>") -> tuple[TextSegment, ...]:
    """SubRip captions -> segments (`parse_captions`). Raises InvalidRequest."""
    return parse_captions(text, source, "srt")


def parse_vtt(text: str, source: str = "<vtt>") -> tuple[TextSegment, ...]:
    """WebVTT captions (W3C WebVTT) -> segments (`parse_captions`). Raises InvalidRequest."""
    return parse_captions(text, source, "vtt")


def parse_plain_text(text: str, source: str = "<txt>") -> tuple[TextSegment, ...]:
    """A plain text transcript (the `text` response format) -> one untimed segment."""
    del source  # any text parses
    return (TextSegment(DEFAULT_SESSION, PLAIN_SPEAKER, 0.0, 0.0, " ".join(text.split())),)


def turns_from_segments(segments: tuple[TextSegment, ...]) -> tuple[SpeakerTurn, ...]:
    """The speaker turns of timed text segments (their text dropped)."""
    return tuple(SpeakerTurn(s.session, s.speaker, s.start_s, s.end_s) for s in segments)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidRequest(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        # an audio file given to eval said only "'utf-8' codec can't decode byte 0x9f in
        # position 38" (a new user's trial)
        raise InvalidRequest(
            f"{path}: cannot read: not UTF-8 text (byte {exc.start}); eval scores transcripts "
            "(STM, RTTM, CTM, SegLST, livemeet JSON, Kaldi text, SRT, WebVTT, text), not audio"
        ) from None
    except OSError as exc:
        raise InvalidRequest(f"{path}: cannot read: {exc}") from None


# the formats a caller may name (`livemeet eval --ref-format/--hyp-format`): "json" is either
# transcript JSON (segments, or a `text` response: the content tells), "txt" a plain transcript
FORMATS = ("stm", "rttm", "ctm", "seglst", "json", "kaldi", "srt", "vtt", "txt")
# extensions that name their format outright (a `.txt` is checked against its content)
_NAMED_SUFFIXES = ("stm", "rttm", "uem", "ctm", "srt", "vtt")


# a Kaldi-named file: `text`, or `text` and a tag joined by `.`, `_` or `-` either way round
# (`text.ref`, Kaldi's `text.filt`, meeteval's example `text_ref`, `hyp-text`, `ref.text`)
_KALDI_NAME = re.compile(r"text(?:[._-].*)?|.*[._-]text", re.IGNORECASE)


def kaldi_named(path: Path) -> bool:
    """Whether the file's name marks a Kaldi `text` (`_KALDI_NAME`), unless its extension
    names another format (`text.stm`, `text_ref.json`) or a plain transcript (`text.txt`)."""
    suffix = path.suffix.lower().lstrip(".")
    known = suffix in (*_NAMED_SUFFIXES, "txt", "json")
    return _KALDI_NAME.fullmatch(path.name) is not None and not known


def detect_format(path: Path, text: str, fmt: str | None = None) -> str:
    """One of "stm", "rttm", "uem", "ctm", "srt", "vtt", "seglst", "json" (with segments),
    "json_text" (`{"text": ...}` only), "kaldi" or "plain".

    `fmt`, one of FORMATS, is the caller's word for it (only "json" still looks at the content,
    for which of the two JSON shapes it is). Without it: the extension (.stm, .rttm, .uem, .ctm,
    .srt, .vtt); "kaldi" for a Kaldi-named file (`kaldi_named`); else the content. A `.txt`
    that does not parse whole as one of those is "plain" (a transcript may begin with
    "[Music]"); one whose every line reads as, say, STM is read so, which a `.stm` name, a
    `text` response in JSON or `fmt` avoids. A Kaldi text under another name reads as plain
    text (a `.txt`) or not at all: its lines are words. Raises InvalidRequest when nothing
    tells, or for an unknown `fmt`.
    """
    if fmt is not None:
        return _declared(path, text, fmt)
    suffix = path.suffix.lower().lstrip(".")
    if suffix in _NAMED_SUFFIXES:
        return suffix
    if kaldi_named(path):
        return "kaldi"
    if suffix != "txt":
        return _sniff(path, text)
    try:
        fmt = _sniff(path, text)
        _STRUCTURED_PARSERS[fmt](text, str(path))
    except InvalidRequest:
        return "plain"
    return fmt


def _declared(path: Path, text: str, fmt: str) -> str:
    """`detect_format` for a format the caller named."""
    if fmt not in FORMATS:
        raise InvalidRequest(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if fmt == "txt":
        return "plain"
    if fmt == "json":
        return _json_kind(path, text)
    return fmt


def _json_kind(path: Path, text: str) -> str:
    """ "json_text" for a `{"text": ...}` response without segments, else "json"."""
    data = _load_json(text, str(path))
    untimed = isinstance(data, dict) and "segments" not in data and "text" in data
    return "json_text" if untimed else "json"


def _sniff(path: Path, text: str) -> str:
    """The format the content looks like (`detect_format`, without the extension's say)."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("WEBVTT"):
        return "vtt"
    head = stripped.splitlines()[:2]
    if len(head) == 2 and head[0].strip().isdigit() and "-->" in head[1]:
        return "srt"
    if stripped.startswith("["):
        return "seglst"
    if stripped.startswith("{"):
        return _json_kind(path, text)
    first = next((fields for _, fields in _lines(text)), None)
    if first is None:
        raise InvalidRequest(f"{path}: empty file of unknown format")
    if first[0] == "SPEAKER" or first[0] == "SPKR-INFO":
        return "rttm"
    if len(first) == 4 and _is_number(first[2]) and _is_number(first[3]):
        return "uem"
    if len(first) in (5, 6) and _is_number(first[2]) and _is_number(first[3]):
        return "ctm"
    if len(first) >= 5 and _is_number(first[3]) and _is_number(first[4]):
        return "stm"
    raise InvalidRequest(
        f"{path}: cannot tell the format from its name or its first line; name it (--ref-format "
        f"or --hyp-format: {', '.join(FORMATS)}; kaldi for `utterance-id words...` lines) or "
        "rename it (.stm, .rttm, .ctm, .json, .srt, .vtt, .txt; `text` for Kaldi)"
    )


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


_TEXT_PARSERS = {
    "stm": parse_stm,
    "ctm": parse_ctm,
    "seglst": parse_seglst,
    "json": parse_transcript_json,
    "json_text": parse_text_json,
    "kaldi": parse_kaldi_text,
    "plain": parse_plain_text,
    "srt": parse_srt,
    "vtt": parse_vtt,
}
# text formats without times: no speaker turns, no DER
_UNTIMED = ("kaldi", "json_text", "plain")
# what a `.txt` must parse as, whole, to be read as other than plain text
_STRUCTURED_PARSERS = {**_TEXT_PARSERS, "rttm": parse_rttm, "uem": parse_uem}


def load_segments(path: Path, fmt: str | None = None) -> tuple[TextSegment, ...]:
    """Timed text segments from any text-bearing format (STM, CTM, SegLST, transcript JSON,
    Kaldi text, captions, plain text); `fmt` as `detect_format` takes it (None: detected).

    Raises InvalidRequest for a missing or malformed file or a format without text (RTTM, UEM).
    """
    text = _read_text(path)
    fmt = detect_format(path, text, fmt)
    parser = _TEXT_PARSERS.get(fmt)
    if parser is None:
        raise InvalidRequest(f"{path}: {fmt.upper()} has no text to score")
    return parser(text, str(path))


def load_turns(path: Path, fmt: str | None = None) -> tuple[SpeakerTurn, ...]:
    """Speaker turns from an RTTM or any timed text-bearing format (`fmt` as `load_segments`).
    Raises InvalidRequest."""
    text = _read_text(path)
    fmt = detect_format(path, text, fmt)
    if fmt == "rttm":
        return parse_rttm(text, str(path))
    if fmt == "uem":
        raise InvalidRequest(f"{path}: a UEM holds no speaker turns")
    if fmt in _UNTIMED:
        raise InvalidRequest(f"{path}: {fmt} has no times; DER needs RTTM/STM/segment JSON")
    return turns_from_segments(_TEXT_PARSERS[fmt](text, str(path)))


def load_uem(path: Path) -> tuple[UemRegion, ...]:
    """Scored regions from a UEM file. Raises InvalidRequest."""
    return parse_uem(_read_text(path), str(path))


def has_times(path: Path, fmt: str | None = None) -> bool:
    """Whether the file's format carries times (so speaker turns, and DER, can come from it)."""
    return detect_format(path, _read_text(path), fmt) not in _UNTIMED


def has_text(path: Path, fmt: str | None = None) -> bool:
    """Whether the file's format carries text (so text metrics can be computed from it)."""
    return detect_format(path, _read_text(path), fmt) in _TEXT_PARSERS
