"""SSE flush policy (injected clock) and text tracking."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from livemeet.gateway.sse import DeltaFlusher, TextTracker, encode_event


def test_first_text_goes_out_at_once_then_windowed() -> None:
    f = DeltaFlusher(0.05)
    assert f.due_in(0.0) is None
    assert f.push("Hel", 10.0) == "Hel"
    assert f.push("lo", 10.01) == ""
    assert f.push(" wo", 10.03) == ""
    assert abs(f.due_in(10.03) - 0.02) < 1e-9  # type: ignore[operator]
    assert f.poll(10.049) == ""
    assert f.poll(10.05) == "lo wo"
    assert f.due_in(10.05) is None
    assert f.push("rld", 10.2) == "rld"  # window since the last flush has passed
    assert f.finish() == ""


def test_finish_flushes_held_text() -> None:
    f = DeltaFlusher(0.05)
    f.push("a", 0.0)
    f.push("b", 0.001)
    assert f.has_pending
    assert f.finish() == "b"
    assert not f.has_pending


def test_bytes_split_inside_a_character_are_held() -> None:
    f = DeltaFlusher(0.0)
    euro = "€".encode()  # 3 bytes
    assert f.push(b"x" + euro[:1], 0.0) == "x"
    assert f.push(euro[1:2], 1.0) == ""
    assert f.push(euro[2:], 2.0) == "€"


def test_dangling_bytes_at_end_become_replacement_char() -> None:
    f = DeltaFlusher(0.0)
    f.push(b"ok" + "é".encode()[:1], 0.0)
    assert f.finish() == "\ufffd"


@given(
    st.text(), st.lists(st.integers(0, 20), max_size=30), st.lists(st.floats(0, 0.2), max_size=30)
)
def test_utf8_chunks_reassemble_exactly(text: str, cuts: list[int], gaps: list[float]) -> None:
    data = text.encode()
    pieces, pos = [], 0
    for c in cuts:
        pieces.append(data[pos : pos + c])
        pos += c
    pieces.append(data[pos:])
    f, now, out = DeltaFlusher(0.05), 0.0, []
    for i, piece in enumerate(pieces):
        now += gaps[i] if i < len(gaps) else 0.01
        out.append(f.push(piece, now))
    out.append(f.finish())
    assert "".join(out) == text
    assert all("\ufffd" not in o for o in out) or "\ufffd" in text


def test_tracker_derives_deltas_from_finals_when_backend_streams_none() -> None:
    t = TextTracker()
    assert t.on_final_segment(" Hello ") == "Hello"
    assert t.on_final_segment("world.") == " world."
    assert t.on_final_segment("你好") == " 你好"
    assert t.on_final_segment("世界") == "世界"  # CJK joints get no space
    assert t.final_tail("Hello world. 你好世界") == ""
    assert t.sent == "Hello world. 你好世界"


def test_tracker_passes_backend_deltas_and_repairs_the_tail() -> None:
    t = TextTracker()
    assert t.on_backend_delta("Hel") == "Hel"
    assert t.on_final_segment("Hello") == ""
    assert t.final_tail("Hello there") == "lo there"


def test_encode_event_is_one_data_line() -> None:
    raw = encode_event({"type": "transcript.text.delta", "delta": "é\nx"})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    assert raw.count(b"\n") == 2  # JSON escapes the newline inside the payload
    assert json.loads(raw[6:]) == {"type": "transcript.text.delta", "delta": "é\nx"}
