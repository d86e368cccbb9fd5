"""The incremental `[start][Sxx]text[end]` parser: upstream semantics, departures, chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from livemeet.transcript.parser import (
    TranscriptParser,
    parse_transcript,
    render_segment,
    takes_leading_space,
)
from livemeet.transcript.segments import Segment, SegmentFlag

INHERITED = SegmentFlag.INHERITED_SPEAKER
MISSING = SegmentFlag.MISSING_END
CLAMPED = SegmentFlag.END_CLAMPED


def _tuples(segments: list[Segment]) -> list[tuple[float, float, str, str]]:
    return [(s.start_s, s.end_s, s.speaker, s.text) for s in segments]


def test_segments_confirm_one_late() -> None:
    parser = TranscriptParser(audio_duration_s=10.0)
    assert parser.feed("[0.00][S01] Hello there.[1.50]") == []
    held = parser.pending()
    assert held is not None and (held.end_s, held.text, held.flags) == (1.5, "Hello there.", ())
    assert _tuples(parser.feed("[1.50][S02]你好")) == [(0.0, 1.5, "S01", "Hello there.")]
    partial = parser.pending()
    assert partial is not None and (partial.text, partial.end_s, partial.flags) == (
        "你好",
        1.5,
        (MISSING,),
    )
    assert parser.feed("[3") == [] and parser.pending().text == "你好"  # type: ignore[union-attr]
    assert parser.feed(".2]") == []
    assert _tuples(parser.close()) == [(1.5, 3.2, "S02", "你好")]
    assert all(not s.is_final and s.id == "" for s in parse_transcript("[0][S01]a[1]"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("noise [bad] [x][0.5][S01]hi[1.0]", [(0.5, 1.0, "S01", "hi")]),
        ("[0.5] \n [S01] hi there [1.0]", [(0.5, 1.0, "S01", "hi there")]),
        ("[0][S01]see [note] here[2]", [(0.0, 2.0, "S01", "see [note] here")]),
        ("[5][S01]abc[3]def[6]", [(5.0, 6.0, "S01", "abc[3]def")]),
        ("[0][S01]第[2024]年[3.0]", [(0.0, 3.0, "S01", "第[2024]年")]),
        ("[0][S01]in [2024]  we[3]", [(0.0, 3.0, "S01", "in [2024]  we")]),
        ("[0][S01]at [1:02] ok[3]", [(0.0, 3.0, "S01", "at [1:02] ok")]),
        ("[1:02] hello [3][S02]y[4]", [(3.0, 4.0, "S02", "y")]),
        ("[1:02][S01]x[2]", []),
        ("[1.2.3] junk [5][S01]b[6]", [(5.0, 6.0, "S01", "b")]),
        ("[.] junk [.5][S01]b[6.]", [(0.5, 6.0, "S01", "b")]),
        ("[0][SA1]a[1]", []),
        ("[0][s02]a[1]", []),
        ("[0][S]a[1]", []),
        ("[0][S0 1]a[1]", []),
        ("[0][S01]  [1][1][S02]x[2]", [(1.0, 2.0, "S02", "x")]),
        ("[0][S01]a[[1.0]b[2]", [(0.0, 2.0, "S01", "a[[1.0]b")]),
        ("[0][S01]a[1] \n", [(0.0, 1.0, "S01", "a")]),
        ("[0][S01]a[1][2][S01]b[3]", [(0.0, 1.0, "S01", "a"), (2.0, 3.0, "S01", "b")]),
        ("[0][S01]a[1]x[2]", [(0.0, 2.0, "S01", "a[1]x")]),
        ("[0][S123456789012345]a[1]", [(0.0, 1.0, "S123456789012345", "a")]),
        ("[0][S1234567890123456]a[1]", []),
        ("[0]\t[S07]\u3000text\u3000[1]", [(0.0, 1.0, "S07", "text")]),
        ("no segments at all", []),
        ("", []),
    ],
)
def test_upstream_semantics(text: str, expected: list[tuple[float, float, str, str]]) -> None:
    assert _tuples(parse_transcript(text)) == expected


def test_timestamp_length_limit() -> None:
    ok = "1" * 32
    assert _tuples(parse_transcript(f"[0][S01]a[{ok}]")) == [(0.0, float(ok), "S01", "a")]
    assert parse_transcript(f"[{'1' * 33}][S01]a[1e40]") == []
    long_end = "9" * 33
    assert parse_transcript(f"[0][S01]a[{long_end}]b[2]")[0].text == f"a[{long_end}]b"


def test_untagged_segments_inherit_previous_speaker() -> None:
    segments = parse_transcript("[0]first[1][1][S02]a[2][2]b[3][3] [S03]c[4]")
    assert _tuples(segments) == [
        (0.0, 1.0, "S01", "first"),
        (1.0, 2.0, "S02", "a"),
        (2.0, 3.0, "S02", "b"),
        (3.0, 4.0, "S03", "c"),
    ]
    assert [s.flags for s in segments] == [(INHERITED,), (), (INHERITED,), ()]


def test_open_segment_kept_at_close_with_audio_end() -> None:
    segs = parse_transcript("[0][S01]a[1][1][S02]hello wor", audio_duration_s=4.0)
    assert _tuples(segs)[1] == (1.0, 4.0, "S02", "hello wor") and segs[1].flags == (MISSING,)
    assert _tuples(parse_transcript("[2][S01]x")) == [(2.0, 2.0, "S01", "x")]
    assert _tuples(parse_transcript("[5][S01]x", audio_duration_s=3.0)) == [(5.0, 5.0, "S01", "x")]
    half = parse_transcript("[0][S01]hello [12", audio_duration_s=20.0)
    assert _tuples(half) == [(0.0, 20.0, "S01", "hello [12")] and half[0].flags == (MISSING,)
    assert parse_transcript("[0][S01]  ") == [] and parse_transcript("[0][S0") == []
    assert parse_transcript("[0]   ") == []


def test_end_past_audio_is_clamped() -> None:
    seg = parse_transcript("[1][S01]a[9.5]", audio_duration_s=9.0)[0]
    assert (seg.end_s, seg.flags) == (9.0, (CLAMPED,))
    late = parse_transcript("[10][S01]a[12]", audio_duration_s=9.0)[0]
    assert (late.start_s, late.end_s, late.flags) == (10.0, 10.0, (CLAMPED,))
    exact = parse_transcript("[1][S01]a[9]", audio_duration_s=9.0)[0]
    assert (exact.end_s, exact.flags) == (9.0, ())
    both = parse_transcript("[0]a[1][1]b[7]", audio_duration_s=5.0)[1]
    assert both.flags == (INHERITED, CLAMPED)


def test_pending() -> None:
    parser = TranscriptParser()
    assert parser.pending() is None
    parser.feed("junk [0.5][S03]")
    assert parser.pending() is None  # no text yet
    parser.feed(" Good morn")
    partial = parser.pending()
    assert partial is not None
    assert (partial.start_s, partial.end_s, partial.speaker, partial.text) == (
        0.5,
        0.5,
        "S03",
        "Good morn",
    )


def test_error_paths() -> None:
    parser = TranscriptParser()
    with pytest.raises(TypeError):
        parser.feed(b"[0]")  # type: ignore[arg-type]
    parser.close()
    with pytest.raises(RuntimeError):
        parser.feed("[0]")
    assert parser.close() == []
    with pytest.raises(ValueError):
        TranscriptParser(audio_duration_s=-1.0)


def _parse_chunked(text: str, cuts: list[int], duration: float | None) -> list[Segment]:
    parser = TranscriptParser(duration)
    out: list[Segment] = []
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    for a, b in zip(bounds, bounds[1:], strict=False):
        out += parser.feed(text[a:b])
        parser.pending()  # must not disturb the state
    return out + parser.close()


NOISY_ALPHABET = st.sampled_from(list("[]S0123.9 \n:ab第年x"))


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=NOISY_ALPHABET, max_size=80),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
    duration=st.one_of(st.none(), st.floats(min_value=0, max_value=100)),
)
def test_any_chunking_gives_same_segments(
    text: str, cuts: list[int], duration: float | None
) -> None:
    whole = parse_transcript(text, duration)
    assert _parse_chunked(text, cuts, duration) == whole
    for s in whole:
        assert s.start_s <= s.end_s and s.text == s.text.strip() and s.text


segment_strategy = st.tuples(
    st.integers(min_value=0, max_value=99_999),  # start, centiseconds
    st.integers(min_value=0, max_value=2_000),  # duration, centiseconds
    st.integers(min_value=1, max_value=12),  # speaker number
    st.text(alphabet=st.sampled_from(list("abc xyz,.你好世界!?")), min_size=1, max_size=30).filter(
        lambda t: t.strip() != ""
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    segments=st.lists(segment_strategy, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=20),
)
def test_rendered_segments_round_trip_in_any_chunking(
    segments: list[tuple[int, int, int, str]], cuts: list[int]
) -> None:
    text = "noise " + "".join(
        f"[{s / 100:.2f}][S{spk:02d}]{body}[{(s + d) / 100:.2f}]" for s, d, spk, body in segments
    )
    expected = [
        (round(s / 100, 2), round((s + d) / 100, 2), f"S{spk:02d}", body.strip())
        for s, d, spk, body in segments
    ]
    assert _tuples(_parse_chunked(text, cuts, None)) == expected


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(segment_strategy, min_size=1, max_size=8))
def test_render_segment_round_trips_and_restores_the_word_space(
    segments: list[tuple[int, int, int, str]],
) -> None:
    parsed = parse_transcript(
        "".join(
            f"[{s / 100:.2f}][S{spk:02d}]{body}[{(s + d) / 100:.2f}]"
            for s, d, spk, body in segments
        )
    )
    rendered = [render_segment(seg) for seg in parsed]
    assert parse_transcript("".join(rendered)) == parsed
    for seg, text in zip(parsed, rendered, strict=True):
        body = text.split("]", 2)[2].rsplit("[", 1)[0]
        # BPE's word-initial space comes back before Latin text, never before CJK
        assert body == (seg.text if set(seg.text) & set("你好世界") else " " + seg.text)


@pytest.mark.parametrize(
    ("text", "body"),
    [
        ("Okay.", " Okay."),
        ("2024年的计划", "2024年的计划"),
        ("“你好”他说", "“你好”他说"),
        ("3 pm", " 3 pm"),
    ],
)
def test_render_segment_spaces_latin_text_only(text: str, body: str) -> None:
    seg = Segment(start_s=0.0, end_s=1.0, speaker="S01", text=text)
    assert render_segment(seg) == f"[0.00][S01]{body}[1.00]"


def test_render_segment_open_or_with_the_space_of_a_whole_text() -> None:
    """A segment still being written renders without its end stamp; the first words of a
    mixed-width text take the whole text's space (none), so each rendering is a prefix of the
    whole one."""
    whole = Segment(0.0, 4.0, "S01", "Hello 世界 again")
    assert not takes_leading_space(whole.text) and takes_leading_space(" Hello ")
    assert not takes_leading_space("  ")
    first = Segment(0.0, 4.0, "S01", "Hello")
    assert render_segment(first, closed=False) == "[0.00][S01] Hello"
    space = takes_leading_space(whole.text)
    opened = render_segment(first, space=space, closed=False)
    assert opened == "[0.00][S01]Hello" and render_segment(whole).startswith(opened)
    assert render_segment(Segment(0.0, 1.0, "S01", ""), space=True) == "[0.00][S01][1.00]"
