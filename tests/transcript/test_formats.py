"""livemeet.transcript.formats: every writer, checked with independent parsers and schemas.

Oracles: the `srt` and `webvtt-py` libraries parse the subtitles back; openai-python's own
pydantic models (`Transcription`, `TranscriptionVerbose`, `TranscriptionDiarized`) validate the
JSON shapes the OpenAI client libraries expect.
"""

from __future__ import annotations

import html
import io
import json
import re
import unicodedata
from dataclasses import replace
from datetime import timedelta

import pytest
import srt
import webvtt
from hypothesis import example, given
from hypothesis import strategies as st
from openai.types.audio import Transcription, TranscriptionDiarized, TranscriptionVerbose

from livemeet.errors import InvalidRequest
from livemeet.transcript.formats import (
    CHARSET,
    ResponseFormat,
    parse_response_format,
    render,
    srt_timestamp,
    vtt_timestamp,
)
from livemeet.transcript.segments import Segment, SegmentFlag, Transcript

MEETING = Transcript(
    segments=(
        Segment(0.0, 2.5, "S01", "Good morning, everyone.", "seg-0000", True),
        Segment(2.64, 5.123, "S02", "Morning! Shall we start?", "seg-0001", True),
        Segment(61.0, 62.345, "S01", "Yes.", "seg-0002", True),
    ),
    duration_s=62.5,
)
TAG = re.compile(r"\[(S\d+|\d+(\.\d+)?)\]")  # the model's [Sxx] and [ts] tags


def segment(start: float, end: float, text: str, speaker: str = "S01") -> Segment:
    return Segment(start, end, speaker, text, f"seg-{int(start * 1000):07d}", True)


def parse_vtt(body: str) -> list[webvtt.Caption]:
    captions: list[webvtt.Caption] = webvtt.from_buffer(io.StringIO(body)).captions
    return captions


# ---- parse_response_format


@pytest.mark.parametrize("fmt", list(ResponseFormat))
def test_parse_every_format(fmt: ResponseFormat) -> None:
    assert parse_response_format(fmt.value) is fmt


@pytest.mark.parametrize("value", ["", "JSON", "xml", "srt ", "diarized-json"])
def test_unknown_format_lists_accepted_values(value: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_response_format(value)
    for fmt in ResponseFormat:
        assert fmt.value in info.value.message


# ---- JSON shapes


def test_json_is_openai_transcription() -> None:
    body, content_type = render(MEETING, ResponseFormat.JSON)
    assert content_type == "application/json"
    obj = json.loads(body)
    assert obj == {
        "text": "Good morning, everyone. Morning! Shall we start? Yes.",
        "usage": {"type": "duration", "seconds": 63},
    }
    Transcription.model_validate(obj)


def test_verbose_json_is_openai_transcription_verbose() -> None:
    body, content_type = render(MEETING, ResponseFormat.VERBOSE_JSON, language="en")
    assert content_type == "application/json"
    obj = json.loads(body)
    model = TranscriptionVerbose.model_validate(obj)  # every field the schema requires
    assert (obj["task"], model.language, model.duration) == ("transcribe", "en", 62.5)
    assert model.text == MEETING.text
    assert model.segments is not None
    assert [s.id for s in model.segments] == [0, 1, 2]
    assert [(s.start, s.end, s.text) for s in model.segments] == [
        (0.0, 2.5, "Good morning, everyone."),
        (2.64, 5.123, "Morning! Shall we start?"),
        (61.0, 62.345, "Yes."),
    ]
    assert [s["speaker"] for s in obj["segments"]] == ["S01", "S02", "S01"]
    assert obj["segments"][2]["seek"] == 6100  # 10 ms mel frames
    assert obj["usage"] == {"type": "duration", "seconds": 63}


def test_verbose_json_language() -> None:
    def language(transcript: Transcript, given: str | None) -> str:
        body, _ = render(transcript, ResponseFormat.VERBOSE_JSON, language=given)
        return str(json.loads(body)["language"])

    assert language(MEETING, None) == "unknown"
    tagged = Transcript(MEETING.segments, MEETING.duration_s, language="zh")
    assert language(tagged, None) == "zh"
    assert language(tagged, "en") == "en"


def test_diarized_json_is_openai_transcription_diarized() -> None:
    body, content_type = render(MEETING, ResponseFormat.DIARIZED_JSON)
    assert content_type == "application/json"
    obj = json.loads(body)
    model = TranscriptionDiarized.model_validate(obj)
    assert (model.task, model.duration, model.text) == ("transcribe", 62.5, MEETING.text)
    assert [(s.type, s.id, s.start, s.end, s.speaker, s.text) for s in model.segments] == [
        ("transcript.text.segment", "seg-0000", 0.0, 2.5, "S01", "Good morning, everyone."),
        ("transcript.text.segment", "seg-0001", 2.64, 5.123, "S02", "Morning! Shall we start?"),
        ("transcript.text.segment", "seg-0002", 61.0, 62.345, "S01", "Yes."),
    ]
    assert obj["usage"] == {"type": "duration", "seconds": 63}


def test_diarized_segments_without_ids_get_distinct_ones() -> None:
    t = Transcript((Segment(0, 1, "S01", "a"), Segment(1, 2, "S02", "b")), 2.0)
    ids = [s["id"] for s in json.loads(render(t, ResponseFormat.DIARIZED_JSON).body)["segments"]]
    assert len(set(ids)) == 2 and all(isinstance(i, str) and i for i in ids)


@pytest.mark.parametrize(
    ("duration_s", "seconds"),
    [(0.0, 0), (1 / 16_000, 1), (0.0004, 1), (0.2, 1), (30.0, 30), (30.0000001, 30), (30.01, 31)],
)
def test_usage_bills_whole_seconds_rounded_up(duration_s: float, seconds: int) -> None:
    t = Transcript((), duration_s)
    assert json.loads(render(t, ResponseFormat.JSON).body)["usage"]["seconds"] == seconds


# ---- text


def test_text_is_plain_and_newline_terminated() -> None:
    body, content_type = render(MEETING, ResponseFormat.TEXT)
    assert content_type == "text/plain"
    assert body == "Good morning, everyone. Morning! Shall we start? Yes.\n"
    assert "S01" not in body and not TAG.search(body)


def test_cjk_segments_join_without_spaces() -> None:
    t = Transcript(
        (segment(0, 1, "大家好。", "S01"), segment(1, 2, "开始吧", "S02"), segment(2, 3, "OK")),
        3.0,
    )
    assert render(t, ResponseFormat.TEXT).body == "大家好。开始吧 OK\n"
    for fmt in (ResponseFormat.JSON, ResponseFormat.VERBOSE_JSON, ResponseFormat.DIARIZED_JSON):
        body = render(t, fmt).body
        assert json.loads(body)["text"] == "大家好。开始吧 OK"
        assert "大家好" in body  # UTF-8, not \u escapes
    cues = list(srt.parse(render(t, ResponseFormat.SRT).body))
    assert [c.content for c in cues] == ["S01: 大家好。", "S02: 开始吧", "S01: OK"]
    assert render(t, ResponseFormat.SRT).body.encode(CHARSET).decode(CHARSET)


# ---- subtitles


def test_srt_round_trips_through_the_srt_library() -> None:
    body, content_type = render(MEETING, ResponseFormat.SRT)
    assert content_type == "application/x-subrip"
    cues = list(srt.parse(body))
    assert [c.index for c in cues] == [1, 2, 3]
    assert [(c.start, c.end) for c in cues] == [
        (timedelta(0), timedelta(seconds=2.5)),
        (timedelta(seconds=2.64), timedelta(seconds=5.123)),
        (timedelta(seconds=61), timedelta(seconds=62.345)),
    ]
    assert [c.content for c in cues] == [
        "S01: Good morning, everyone.",
        "S02: Morning! Shall we start?",
        "S01: Yes.",
    ]
    assert "00:01:02,345" in body


def test_vtt_round_trips_through_webvtt_py() -> None:
    body, content_type = render(MEETING, ResponseFormat.VTT)
    assert content_type == "text/vtt"
    assert body.startswith("WEBVTT\n\n")
    cues = parse_vtt(body)
    assert [(c.start, c.end, c.voice, c.text) for c in cues] == [
        ("00:00:00.000", "00:00:02.500", "S01", "Good morning, everyone."),
        ("00:00:02.640", "00:00:05.123", "S02", "Morning! Shall we start?"),
        ("00:01:01.000", "00:01:02.345", "S01", "Yes."),
    ]
    assert "<v S02>Morning! Shall we start?" in body


@pytest.mark.parametrize(
    ("seconds", "srt_text", "vtt_text"),
    [
        (0.0, "00:00:00,000", "00:00:00.000"),
        (62.345, "00:01:02,345", "00:01:02.345"),
        (59.9996, "00:01:00,000", "00:01:00.000"),  # rounding carries into minutes
        (99 * 60 + 1.5, "01:39:01,500", "01:39:01.500"),
        (5400.0, "01:30:00,000", "01:30:00.000"),
        (100 * 3600 + 0.001, "100:00:00,001", "100:00:00.001"),
        (-0.01, "00:00:00,000", "00:00:00.000"),
    ],
)
def test_timestamps(seconds: float, srt_text: str, vtt_text: str) -> None:
    assert srt_timestamp(seconds) == srt_text
    assert vtt_timestamp(seconds) == vtt_text


def test_long_meeting_times_parse_back() -> None:
    t = Transcript((segment(5399.25, 5400.0, "last words"),), 5400.0)
    (cue,) = srt.parse(render(t, ResponseFormat.SRT).body)
    assert cue.start == timedelta(seconds=5399.25) and cue.end == timedelta(seconds=5400)
    (vcue,) = parse_vtt(render(t, ResponseFormat.VTT).body)
    assert (vcue.start, vcue.end) == ("01:29:59.250", "01:30:00.000")


def test_arrows_newlines_and_markup_in_text_do_not_break_cues() -> None:
    nasty = "a --> b\n\nsecond paragraph <b>&amp;</b>\r\n3 > 2 < 4"
    t = Transcript((segment(1, 2, nasty), segment(3, 4, "next", "S02")), 4.0)
    srt_cues = list(srt.parse(render(t, ResponseFormat.SRT).body))
    assert len(srt_cues) == 2
    assert srt_cues[0].content == "S01: a --＞ b second paragraph ＜b＞&amp;＜/b＞ 3 ＞ 2 ＜ 4"
    assert srt_cues[1].content == "S02: next"
    vtt_body = render(t, ResponseFormat.VTT).body
    vtt_cues = parse_vtt(vtt_body)
    assert len(vtt_cues) == 2
    assert vtt_body.count("-->") == 2  # only the timing lines
    assert html.unescape(vtt_cues[0].text) == "a --> b second paragraph <b>&amp;</b> 3 > 2 < 4"
    assert (vtt_cues[1].voice, vtt_cues[1].text) == ("S02", "next")
    # JSON keeps the text exactly
    segs = json.loads(render(t, ResponseFormat.DIARIZED_JSON).body)["segments"]
    assert segs[0]["text"] == nasty


def test_empty_text_segments_make_no_cues() -> None:
    t = Transcript((segment(0, 1, "  "), segment(1, 2, "words")), 2.0)
    assert [c.content for c in srt.parse(render(t, ResponseFormat.SRT).body)] == ["S01: words"]
    assert [c.text for c in parse_vtt(render(t, ResponseFormat.VTT).body)] == ["words"]
    assert len(json.loads(render(t, ResponseFormat.VERBOSE_JSON).body)["segments"]) == 2


def test_control_characters_are_left_out_of_cues_and_kept_in_json() -> None:
    """A byte-level tokenizer can write a NUL, an ESC or a C1 control: they went into cues (a
    player in C cut the cue at the NUL; a terminal ran the escape); a segment of controls
    alone made an empty cue line, which ends an SRT cue early. JSON keeps the text exactly."""
    text = "a\x00b \x1b[31mred\x7f \x85c"
    t = Transcript((segment(0, 1, text), segment(1, 2, "\x00\x07"), segment(2, 3, "next")), 3.0)
    assert [c.content for c in srt.parse(render(t, ResponseFormat.SRT).body)] == [
        "S01: ab [31mred c",
        "S01: next",
    ]
    assert [c.text for c in parse_vtt(render(t, ResponseFormat.VTT).body)] == [
        "ab [31mred c",
        "next",
    ]
    for fmt in (ResponseFormat.SRT, ResponseFormat.VTT):
        body = render(t, fmt).body
        assert not any(unicodedata.category(ch) == "Cc" for ch in body.replace("\n", ""))
    segs = json.loads(render(t, ResponseFormat.DIARIZED_JSON).body)["segments"]
    assert [s["text"] for s in segs] == [text, "\x00\x07", "next"]


def test_no_break_spaces_stay_in_cues_and_no_control_leaves_a_double_space() -> None:
    """A no-break space keeps a number with its unit and French punctuation with its word; cues
    turned it into a plain space, where a player may wrap the line. A control between two
    spaces left two spaces behind. A segment of no-break spaces alone makes no cue."""
    text = "Prix\u00a0: 10\u202f% a \x00 b"
    t = Transcript((segment(0, 1, text), segment(1, 2, "\u00a0\u202f"), segment(2, 3, "x")), 3.0)
    shown = "Prix\u00a0: 10\u202f% a b"
    assert [c.content for c in srt.parse(render(t, ResponseFormat.SRT).body)] == [
        f"S01: {shown}",
        "S01: x",
    ]
    assert [c.text for c in parse_vtt(render(t, ResponseFormat.VTT).body)] == [shown, "x"]


def test_zero_length_segments_make_cues_of_one_millisecond() -> None:
    """A cue's end must come after its start (WebVTT 4.1): a segment stamped with one time,
    or one whose end rounds to its start's millisecond, lasts 1 ms in SRT and VTT (a review
    found 00:00:05.000 --> 00:00:05.000); JSON keeps the model's times."""
    t = Transcript((segment(5.0, 5.0, "one"), segment(10.9996, 11.0, "two")), 11.0)
    assert [(c.start, c.end) for c in parse_vtt(render(t, ResponseFormat.VTT).body)] == [
        ("00:00:05.000", "00:00:05.001"),
        ("00:00:11.000", "00:00:11.001"),
    ]
    cues = list(srt.parse(render(t, ResponseFormat.SRT).body))
    assert all(c.end - c.start == timedelta(milliseconds=1) for c in cues)
    verbose = json.loads(render(t, ResponseFormat.VERBOSE_JSON).body)["segments"]
    assert [(s["start"], s["end"]) for s in verbose] == [(5.0, 5.0), (11.0, 11.0)]


def test_empty_transcript() -> None:
    empty = Transcript((), 0.0)
    assert render(empty, ResponseFormat.TEXT).body == "\n"
    assert render(empty, ResponseFormat.SRT).body == ""
    assert list(srt.parse(render(empty, ResponseFormat.SRT).body)) == []
    assert render(empty, ResponseFormat.VTT).body == "WEBVTT\n"
    assert parse_vtt(render(empty, ResponseFormat.VTT).body) == []
    assert json.loads(render(empty, ResponseFormat.JSON).body)["text"] == ""
    TranscriptionVerbose.model_validate_json(render(empty, ResponseFormat.VERBOSE_JSON).body)
    diarized = TranscriptionDiarized.model_validate_json(
        render(empty, ResponseFormat.DIARIZED_JSON).body
    )
    assert diarized.segments == []


_texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)


def _on_a_cue(text: str) -> bool:
    """Whether `text` leaves anything on a cue line: a character not whitespace nor control."""
    return any(not ch.isspace() and unicodedata.category(ch) != "Cc" for ch in text)


@example(rows=[(0.0005, 0.0, "S01", "0"), (0.0, 0.0, "S02", "0")])
@given(
    st.lists(
        st.tuples(st.floats(0, 20_000), st.floats(0, 30), st.sampled_from(["S01", "S02"]), _texts),
        max_size=6,
    )
)
def test_any_text_gives_one_parseable_cue_per_nonempty_segment(
    rows: list[tuple[float, float, str, str]],
) -> None:
    segments = tuple(segment(start, start + length, text, spk) for start, length, spk, text in rows)
    t = Transcript(segments, 40_000.0)
    # cues in order of their starts in whole ms as written (`round(t, 3)`, as JSON's), stably:
    # a start of 0.0005 s is written 0.001, after a later segment's 0.0 (hypothesis found it)
    kept = sorted(
        (s for s in segments if _on_a_cue(s.text)), key=lambda s: round(round(s.start_s, 3) * 1000)
    )
    srt_cues = list(srt.parse(render(t, ResponseFormat.SRT).body))
    assert len(srt_cues) == len(kept)
    for cue, s in zip(srt_cues, kept, strict=True):
        assert abs(cue.start.total_seconds() - s.start_s) <= 0.0005 + 1e-9
        assert cue.content.startswith(f"{s.speaker}: ")
        assert "\n" not in cue.content
    vtt_body = render(t, ResponseFormat.VTT).body
    assert vtt_body.count(" --> ") == len(kept)
    for fmt in (ResponseFormat.JSON, ResponseFormat.VERBOSE_JSON, ResponseFormat.DIARIZED_JSON):
        assert json.loads(render(t, fmt).body)["text"] == t.text


def test_no_format_adds_model_tags() -> None:
    for fmt in ResponseFormat:
        assert not TAG.search(render(MEETING, fmt).body), fmt


def test_segment_flags_reach_the_verbose_and_diarized_bodies() -> None:
    """protocol.md names `end_clamped` for uploads, but only live events carried flags (found
    by an independent trial); a segment without flags keeps OpenAI's fields only."""
    clamped = Segment(0.0, 2.0, "S01", "a", flags=(SegmentFlag.END_CLAMPED,))
    t = Transcript((clamped, Segment(2.0, 3.0, "S02", "b")), 2.0)
    for fmt in (ResponseFormat.VERBOSE_JSON, ResponseFormat.DIARIZED_JSON):
        segments = json.loads(render(t, fmt).body)["segments"]
        assert segments[0]["flags"] == ["end_clamped"]
        assert "flags" not in segments[1]


NAMED = replace(MEETING, speaker_names=(("S02", "Bob --> <B&B>"), ("S01", "Alice")))


def test_named_speakers_show_their_names_in_cues_and_a_speakers_map_in_json() -> None:
    """A live client's names (`speaker.rename`) show where the label would be; segments keep
    their labels; JSON bodies gain `speakers`."""
    srt_body = render(NAMED, ResponseFormat.SRT).body
    assert "Alice: Good morning, everyone." in srt_body
    assert "Bob --＞ ＜B&B＞: Morning!" in srt_body and "S01:" not in srt_body  # no markup
    vtt = parse_vtt(render(NAMED, ResponseFormat.VTT).body)
    assert [html.unescape(c.voice) for c in vtt] == ["Alice", "Bob --> <B&B>", "Alice"]
    names = {"S02": "Bob --> <B&B>", "S01": "Alice"}
    for fmt in (ResponseFormat.JSON, ResponseFormat.VERBOSE_JSON, ResponseFormat.DIARIZED_JSON):
        body = json.loads(render(NAMED, fmt).body)
        assert body["speakers"] == names
        assert [s["speaker"] for s in body.get("segments", [])] in ([], ["S01", "S02", "S01"])
    assert render(NAMED, ResponseFormat.TEXT) == render(MEETING, ResponseFormat.TEXT)


@pytest.mark.parametrize("fmt", list(ResponseFormat))
def test_a_transcript_without_names_renders_as_before(fmt: ResponseFormat) -> None:
    """Uploads have no names: no `speakers` key, labels in the cues."""
    body = render(MEETING, fmt).body
    assert "speakers" not in body
    if fmt in (ResponseFormat.SRT, ResponseFormat.VTT):
        assert "S01" in body


# S02 was merged into S01 ("S02 is S01"), and S01 named; S03's merge into S02 resolved to S01
MERGED = replace(
    MEETING, speaker_names=(("S01", "Alice"),), speaker_merges=(("S02", "S01"), ("S03", "S01"))
)


def test_a_merged_labels_cues_show_its_target_and_json_gains_a_merged_map() -> None:
    """A live client's merges (`speaker.merge`): a merged label's cues show its target's name
    (else its label); segments keep their labels; JSON bodies gain `merged` beside
    `speakers`."""
    srt_body = render(MERGED, ResponseFormat.SRT).body
    assert "Alice: Morning! Shall we start?" in srt_body and "S02" not in srt_body
    vtt = parse_vtt(render(MERGED, ResponseFormat.VTT).body)
    assert [c.voice for c in vtt] == ["Alice", "Alice", "Alice"]
    unnamed = replace(MERGED, speaker_names=())
    assert [c.voice for c in parse_vtt(render(unnamed, ResponseFormat.VTT).body)] == ["S01"] * 3
    for fmt in (ResponseFormat.JSON, ResponseFormat.VERBOSE_JSON, ResponseFormat.DIARIZED_JSON):
        body = json.loads(render(MERGED, fmt).body)
        assert body["merged"] == {"S02": "S01", "S03": "S01"}
        assert body["speakers"] == {"S01": "Alice"}
        assert [s["speaker"] for s in body.get("segments", [])] in ([], ["S01", "S02", "S01"])
        assert "speakers" not in json.loads(render(unnamed, fmt).body)
    assert render(MERGED, ResponseFormat.TEXT) == render(MEETING, ResponseFormat.TEXT)


@pytest.mark.parametrize("fmt", list(ResponseFormat))
def test_a_transcript_without_merges_has_no_merged_map(fmt: ResponseFormat) -> None:
    assert "merged" not in render(NAMED, fmt).body


@pytest.mark.parametrize(
    "markup",
    ["<i>yes</i>", "<Enter>", "a < b and c > d", "{\\an8}up", "{\\b1}bold", "C:\\Net", "--->"],
)
def test_srt_cue_text_holds_no_markup_a_player_would_act_on(markup: str) -> None:
    """SubRip players read tags (<i> styled the words; FFmpeg's decoder dropped `<Enter>`,
    VLC all between `<` and `>` in a cue of malformed markup), `{\\...}` overrides (`{\\an8}`
    moved the cue to the top, others hid their text) and `\\N`-style escapes, and SRT has no
    escape: those characters are written as their fullwidth forms, in the text and in a
    speaker's name, so the words show as said (NFKC gives them back); no `-->` is left either
    (the timing separator). JSON and WebVTT (which escapes) keep the text."""
    t = Transcript(
        (segment(1, 2, f"say {markup} now"), segment(3, 4, "next", "S02")),
        4.0,
        speaker_names=(("S02", f"Ann {markup}"),),
    )
    body = render(t, ResponseFormat.SRT).body
    assert body.count("-->") == 2  # only the timing lines
    cues = list(srt.parse(body))
    assert [unicodedata.normalize("NFKC", c.content) for c in cues] == [
        f"S01: say {markup} now",
        f"Ann {markup}: next",
    ]
    for cue in cues:
        assert not set("<>{}\\") & set(cue.content), cue.content
    (first, _) = parse_vtt(render(t, ResponseFormat.VTT).body)
    assert html.unescape(first.text) == f"say {markup} now"
    segs = json.loads(render(t, ResponseFormat.DIARIZED_JSON).body)["segments"]
    assert segs[0]["text"] == f"say {markup} now"


def test_srt_hours_past_99_are_written_whole_and_parse_back() -> None:
    """A live session has no length limit: its 100th hour is `100:00:00,000` (players read
    the hours as any number: FFmpeg's and VLC's parsers, `%d`), not a wrap to `00` or a
    clamp that would put the cue out of order."""
    t = Transcript((segment(100 * 3600 + 0.001, 100 * 3600 + 2.5, "still here"),), 360_003.0)
    body = render(t, ResponseFormat.SRT).body
    assert "100:00:00,001 --> 100:00:02,500" in body
    (cue,) = srt.parse(body)
    assert cue.start == timedelta(hours=100, milliseconds=1)
    assert cue.end == timedelta(hours=100, seconds=2.5)


def test_cues_are_in_order_of_their_starts_whatever_the_segments_order() -> None:
    """A WebVTT cue's start must be >= every earlier cue's (W3C WebVTT 4.1, cue timings) and
    SRT players number and show cues in file order; a model may write a segment that starts
    before the one ahead of it (overlapping speech), so the cues are sorted by start (stably:
    equal starts keep their order); JSON keeps the segments as written."""
    t = Transcript(
        (
            segment(5, 6, "third"),
            segment(1, 2, "first"),
            segment(3, 9, "second"),
            segment(5, 5.5, "fourth"),
        ),
        9.0,
    )
    vtt = parse_vtt(render(t, ResponseFormat.VTT).body)
    assert [c.text for c in vtt] == ["first", "second", "third", "fourth"]
    cues = list(srt.parse(render(t, ResponseFormat.SRT).body))
    assert [(c.index, c.content) for c in cues] == [
        (1, "S01: first"),
        (2, "S01: second"),
        (3, "S01: third"),
        (4, "S01: fourth"),
    ]
    segs = json.loads(render(t, ResponseFormat.DIARIZED_JSON).body)["segments"]
    assert [s["text"] for s in segs] == ["third", "first", "second", "fourth"]


@pytest.mark.parametrize("name", ["Team A --", "x--", "--", "Bob ---", "Ann-"])
def test_a_speaker_name_ending_in_dashes_does_not_close_its_voice_tag_as_an_arrow(
    name: str,
) -> None:
    """`<v Team A -->` holds `-->`: a WebVTT parser reads that payload line as the next cue's
    timings, and the cue's text is lost (webvtt-py found no text in it). A name's last dash is
    written as a character reference, so the tag's `>` never follows two dashes."""
    t = Transcript(
        (segment(1, 2, "hello there"), segment(3, 4, "second", "S02")),
        4.0,
        speaker_names=(("S01", name),),
    )
    body = render(t, ResponseFormat.VTT).body
    assert body.count("-->") == 2  # only the timing lines
    cues = parse_vtt(body)
    assert [(html.unescape(c.voice), c.text) for c in cues] == [
        (name, "hello there"),
        ("S02", "second"),
    ]


@pytest.mark.parametrize("start", [0.0025, 1.0005, 3599.9995, 59.9996, 40 / 16_000, 7.0000625])
def test_cue_times_are_the_json_times(start: float) -> None:
    """A time on a half millisecond (a live cut on a sample, 40 samples at 16 kHz = 2.5 ms)
    was written 0.003 in JSON (`round(t, 3)`) and 00:00:00.002 in the cues (`round(t * 1000)`
    rounds the product half to even): the same transcript's formats said different times."""
    t = Transcript((segment(start, start + 1, "words"),), start + 1)
    verbose = json.loads(render(t, ResponseFormat.VERBOSE_JSON).body)["segments"][0]
    (cue,) = srt.parse(render(t, ResponseFormat.SRT).body)
    assert cue.start == timedelta(milliseconds=round(verbose["start"] * 1000))
    assert cue.end == timedelta(milliseconds=round(verbose["end"] * 1000))
    (vcue,) = parse_vtt(render(t, ResponseFormat.VTT).body)
    assert vcue.start == vtt_timestamp(verbose["start"])
