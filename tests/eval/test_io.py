"""Readers: every format on real files and on strings, and each malformed-input error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from livemeet.errors import InvalidRequest
from livemeet.eval.io import (
    CTM_SPEAKER,
    DEFAULT_SESSION,
    KALDI_SPEAKER,
    SpeakerTurn,
    TextSegment,
    UemRegion,
    detect_format,
    has_text,
    has_times,
    load_segments,
    load_turns,
    load_uem,
    parse_ctm,
    parse_rttm,
    parse_seglst,
    parse_stm,
    parse_transcript_json,
    parse_uem,
)


def test_stm_skips_comments_and_label_and_keeps_empty_text() -> None:
    text = ";; comment\nrec 1 spk 1.5 2.0 <o,f0,male> hello world\n\nrec 1 spk2 2 3\n"
    assert parse_stm(text) == (
        TextSegment("rec", "spk", 1.5, 2.0, "hello world"),
        TextSegment("rec", "spk2", 2.0, 3.0, ""),
    )


def test_rttm_end_is_start_plus_duration_and_other_types_skipped() -> None:
    text = "SPKR-INFO rec 1 <NA> <NA> <NA> unknown A <NA> <NA>\n"
    text += "SPEAKER rec 1 0.5 1.25 <NA> <NA> A <NA> <NA>\n"
    assert parse_rttm(text) == (SpeakerTurn("rec", "A", 0.5, 1.75),)


def test_uem_and_ctm() -> None:
    assert parse_uem("rec NA 0 30.5\n") == (UemRegion("rec", 0.0, 30.5),)
    assert parse_ctm("rec 1 1.0 0.5 hello 0.9\nrec 1 2 0 world\n") == (
        TextSegment("rec", CTM_SPEAKER, 1.0, 1.5, "hello"),
        TextSegment("rec", CTM_SPEAKER, 2.0, 2.0, "world"),
    )


def test_transcript_json_both_key_styles() -> None:
    body = {
        "text": "ignored",
        "segments": [
            {"id": "seg-0", "start": 0.0, "end": 1.0, "speaker": "S01", "text": "你好"},
            {"start_s": 1.0, "end_s": 2.5, "text": "no speaker"},
        ],
    }
    assert parse_transcript_json(json.dumps(body)) == (
        TextSegment(DEFAULT_SESSION, "S01", 0.0, 1.0, "你好"),
        TextSegment(DEFAULT_SESSION, "", 1.0, 2.5, "no speaker"),
    )


def test_seglst_equals_stm_on_meeteval_examples(shared_data: Path) -> None:
    folder = shared_data / "meeteval-examples"
    seglst = load_segments(folder / "hyp.seglst.json")
    stm = load_segments(folder / "hyp.stm")
    assert seglst == stm
    assert len(seglst) == 6


def test_real_files_load(shared_data: Path) -> None:
    turns = load_turns(shared_data / "ami-pyannote-debug" / "debug.test.rttm")
    assert len(turns) == 27 and {t.session for t in turns} == {"tst00", "tst01"}
    uem = load_uem(shared_data / "ami-pyannote-debug" / "debug.test.uem")
    assert uem == (UemRegion("tst00", 0.0, 30.0), UemRegion("tst01", 0.0, 30.0))
    ctm = load_segments(shared_data / "meeteval-examples" / "hyp2.ctm")
    assert len(ctm) == 22 and ctm[0].text == "Strategic"
    stm_turns = load_turns(shared_data / "oracle-vectors" / "cjk_ref.stm")
    assert stm_turns[1] == SpeakerTurn("m1", "B", 2.0, 4.0)


@pytest.mark.parametrize(
    ("name", "fmt", "expected"),
    [
        # a Kaldi text under another name than `text` was "cannot tell the format", or (a
        # .txt) plain text with its utterance ids scored as words (a CLI trial)
        ("text.ref", None, "kaldi"),
        ("text.orig", None, "kaldi"),
        ("ref.text", None, "kaldi"),
        ("REF.TEXT", None, "kaldi"),
        ("text_ref", None, "kaldi"),  # meeteval's example files' names
        ("hyp-text", None, "kaldi"),
        ("ref.txt", "kaldi", "kaldi"),
        ("ref", "kaldi", "kaldi"),
        ("text.txt", None, "plain"),  # a `text` response saved as text.txt: its extension says
        ("text.stm", None, "stm"),
        ("context", "kaldi", "kaldi"),  # only a whole `text` part names it: "context" has none
        ("a.stm", "txt", "plain"),  # the caller's word outranks the extension
        ("a.txt", "json", "json_text"),
    ],
)
def test_a_kaldi_name_or_the_callers_format_decides(
    tmp_path: Path, name: str, fmt: str | None, expected: str
) -> None:
    content = '{"text": "hello"}' if fmt == "json" else "utt-1 hello there\nutt-2 hi\n"
    path = tmp_path / name
    path.write_text(content)
    assert detect_format(path, content, fmt) == expected
    if expected == "kaldi":
        assert [s.session for s in load_segments(path, fmt)] == ["utt-1", "utt-2"]


def test_a_format_that_cannot_be_told_names_the_way_out(tmp_path: Path) -> None:
    path = tmp_path / "context"
    path.write_text("utt-1 hello there\n")
    with pytest.raises(InvalidRequest, match="cannot tell the format") as raised:
        load_segments(path)
    assert "--ref-format" in raised.value.message and "kaldi" in raised.value.message
    with pytest.raises(InvalidRequest, match="unknown format 'trn'"):
        load_segments(path, "trn")


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("a.stm", "", "stm"),
        ("a.RTTM", "", "rttm"),
        ("a.txt", "SPEAKER r 1 0 1 <NA> <NA> A <NA> <NA>", "rttm"),
        ("a.txt", "r 1 A 0 1 hello there", "stm"),
        ("a.txt", "r 1 0.5 0.2 hello", "ctm"),
        ("a.txt", "r NA 0 30", "uem"),
        ("a.json", ' [{"session_id": "r"}]', "seglst"),
        # a .txt is another format only if it parses whole as one (else a transcript's words)
        ("a.txt", "[Music] Welcome everyone", "plain"),
        ("a.txt", "so we said 10 20 and then they\nleft", "plain"),  # line 2: no STM
        ("a.txt", '{"segments": []}', "json"),
    ],
)
def test_detect_format(name: str, content: str, expected: str) -> None:
    assert detect_format(Path(name), content) == expected


@pytest.mark.parametrize(
    ("parser", "text", "needle"),
    [
        (parse_stm, "ok 1 A 0 1 fine\nbad 1 A\n", "<stm>:2"),
        (parse_stm, "r 1 A x 1 t\n", "not a number"),
        (parse_stm, "r 1 A 2 1 t\n", "bad interval"),
        (parse_stm, "r 1 A 0 nan t\n", "not finite"),
        (parse_rttm, "SPEAKER r 1 0 1\n", "<rttm>:1"),
        (parse_rttm, "SPEAKER r 1 0 -1 <NA> <NA> A <NA> <NA>\n", "bad interval"),
        (parse_uem, "r 1 0\n", "<uem>:1"),
        (parse_ctm, "r 1 0\n", "<ctm>:1"),
        (parse_seglst, "{}", "must be a JSON list"),
        (parse_seglst, '[{"session_id": "r"}]', "missing field 'start_time'"),
        (parse_seglst, "[1]", "expected an object"),
        (parse_transcript_json, "{\n bad", "<json>:2: bad JSON"),
        (parse_transcript_json, '{"text": "x"}', "'segments' list"),
        (parse_transcript_json, '{"segments": [{"start": 0, "end": 1}]}', "missing field 'text'"),
    ],
)
def test_malformed_input_names_file_and_line(parser, text: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest, match=needle):
        parser(text)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="no such file"):
        load_segments(tmp_path / "missing.stm")
    rttm = tmp_path / "x.rttm"
    rttm.write_text("SPEAKER r 1 0 1 <NA> <NA> A <NA> <NA>\n")
    with pytest.raises(InvalidRequest, match="RTTM has no text"):
        load_segments(rttm)
    assert not has_text(rttm)
    uem = tmp_path / "x.uem"
    uem.write_text("r 1 0 1\n")
    with pytest.raises(InvalidRequest, match="UEM holds no speaker turns"):
        load_turns(uem)
    odd = tmp_path / "x.dat"
    odd.write_text("just some words\n")
    with pytest.raises(InvalidRequest, match="cannot tell the format"):
        load_segments(odd)
    empty = tmp_path / "empty.dat"
    empty.write_text("\n")
    with pytest.raises(InvalidRequest, match="empty file"):
        load_segments(empty)
    # a .txt of words is a plain transcript (the `text` response format); empty: no words
    words = tmp_path / "x.txt"
    words.write_text("just some\nwords\n")
    assert [s.text for s in load_segments(words)] == ["just some words"]
    assert not has_times(words)
    words.write_text("\n")
    assert [s.text for s in load_segments(words)] == [""]
    binary = tmp_path / "x.stm"
    binary.write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(InvalidRequest, match="cannot read"):
        load_segments(binary)
    # an audio file passed by mistake: what eval reads, not a codec's words (a new user's trial)
    audio = tmp_path / "meeting.mp4"
    audio.write_bytes(b"\x00\x00\x00\x1cftypisom\x9f\x00")
    with pytest.raises(InvalidRequest) as refused:
        load_segments(audio)
    assert refused.value.message == (
        f"{audio}: cannot read: not UTF-8 text (byte 12); eval scores transcripts (STM, RTTM, "
        "CTM, SegLST, livemeet JSON, Kaldi text, SRT, WebVTT, text), not audio"
    )


def test_kaldi_text_is_one_untimed_segment_per_utterance(tmp_path: Path) -> None:
    path = tmp_path / "text"
    path.write_text("utt1 HELLO THERE\nutt2\n\nutt3 A  B\n")
    assert detect_format(path, path.read_text()) == "kaldi"
    assert load_segments(path) == (
        TextSegment("utt1", KALDI_SPEAKER, 0.0, 0.0, "HELLO THERE"),
        TextSegment("utt2", KALDI_SPEAKER, 0.0, 0.0, ""),
        TextSegment("utt3", KALDI_SPEAKER, 0.0, 0.0, "A B"),
    )
    assert has_text(path) and not has_times(path)
    with pytest.raises(InvalidRequest, match="no times"):
        load_turns(path)


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_our_own_captions_read_back_as_they_were_written(tmp_path: Path, fmt: str) -> None:
    """`livemeet eval --hyp out.srt` said "cannot tell the format" for livemeet's own srt and
    vtt responses (a trial). Both read back with speakers, times and texts, named or not."""
    from livemeet.eval.io import load_segments, load_turns
    from livemeet.transcript.formats import ResponseFormat, render
    from livemeet.transcript.segments import Segment, Transcript

    segments = (
        Segment(0.0, 7.54, "S01", "And so, my fellow Americans: R&D <matters>", id="seg-0001"),
        Segment(7.54, 3723.5, "S02", "ask what you can do", id="seg-0002"),
    )
    body, _ = render(Transcript(segments, 3725.0), ResponseFormat(fmt))
    for name in (f"hyp.{fmt}", "hyp.txt"):  # by its name, and by its content
        path = tmp_path / name
        path.write_text(body, encoding="utf-8")
        read = load_segments(path)
        assert [(s.speaker, s.start_s, s.end_s, s.text) for s in read] == [
            (s.speaker, s.start_s, s.end_s, s.text) for s in segments
        ]
        assert [t.speaker for t in load_turns(path)] == ["S01", "S02"]


def test_malformed_captions_are_a_clear_error(tmp_path: Path) -> None:
    from livemeet.eval.io import load_segments

    path = tmp_path / "hyp.vtt"
    path.write_text("not a caption file\n", encoding="utf-8")
    with pytest.raises(InvalidRequest, match="hyp.vtt: malformed VTT"):
        load_segments(path)
