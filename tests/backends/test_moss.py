"""The MOSS-TD backend (`MossCore`) on the tiny checkpoint, CPU fp32, driven as the worker does.

Random weights write no grammar, so transcript-level checks force a reference transcript
(`--forced-output`); token-level checks compare against `livemeet.models.audio_llm.generate`,
which is parity-tested against transformers.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from livemeet.audio.constants import KV_BLOCK_SIZE, MIN_PREFILL_CHUNK, SAMPLE_RATE
from livemeet.audio.features import log_mel, split_windows
from livemeet.backends import create_backend
from livemeet.backends.moss import MossCore, engine_config
from livemeet.backends.moss_state import LiveState, UploadState, keep_after_cut
from livemeet.config import ModelConfig, UploadHold
from livemeet.engine.engine import Engine, EngineConfig
from livemeet.engine.messages import EngineStats
from livemeet.engine.scheduler import SchedulerConfig, StepOutput
from livemeet.errors import (
    BadAudio,
    ConfigError,
    InternalError,
    InvalidRequest,
    NotFound,
    ProtocolError,
)
from livemeet.models.audio_llm import MossTDModel, generate
from livemeet.models.prompt import EOS, build_prompt
from livemeet.models.tokenizer import load_tokenizer
from livemeet.session.forced_budget import BudgetState
from livemeet.session.live import LiveSession
from livemeet.session.vad import LiveVad
from livemeet.transcriber import (
    Error,
    Event,
    LiveRestore,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TextDelta,
    TranscriptFinal,
)
from livemeet.transcript.parser import parse_transcript, render_segment
from livemeet.transcript.segments import FinishReason, Segment, SegmentFlag, Transcript
from tests.backends.helpers import run_to_idle
from tests.engine.fakes import TEST_BLOCK_SIZE, SteppingClock

NUM_BLOCKS = 400  # 6,400 tokens of KV: room for a 40 s prompt and its retained predecessor

REFERENCE = (
    "[0.00][S01] Hello there.[1.20][1.20][S02]你好[2.50][2.50][S02]世界[3.10]"
    "[3.10][S01] Okay, [5.00] people.[4.00][4.40][S03] Bye[6.00]"
)


def make_core(
    model: MossTDModel,
    tmp_path: Path,
    forced: str | None = None,
    num_blocks: int = NUM_BLOCKS,
    scheduler: SchedulerConfig | None = None,
    block_size: int = TEST_BLOCK_SIZE,
    **model_options: Any,
) -> MossCore:
    forced_path = None
    if forced is not None:
        forced_path = tmp_path / "forced.txt"
        forced_path.write_text(forced, encoding="utf-8")
    config = EngineConfig(
        num_kv_blocks=num_blocks,
        block_size=block_size,
        scheduler=scheduler or SchedulerConfig(),
    )
    engine = Engine(config, model=(model, model.cfg), clock=SteppingClock())
    core = MossCore(
        ModelConfig(forced_output=str(forced_path) if forced_path else None, **model_options),
        engine=engine,
    )
    core.load()
    return core


def record_tokens(core: MossCore) -> dict[str, list[int]]:
    """Wrap the engine's step to record every request's generated tokens."""
    assert core.engine is not None
    engine = core.engine
    tokens: dict[str, list[int]] = {}
    inner: Callable[[], StepOutput] = engine.step

    def step() -> StepOutput:
        out = inner()
        for rid, token in out.new_tokens:
            tokens.setdefault(rid, []).append(token)
        return out

    engine.step = step  # type: ignore[method-assign]
    return tokens


def upload(core: MossCore, audio: np.ndarray, sid: str = "u", **options: object) -> list[Event]:
    core.open(sid, SessionOptions(live=False, **options))  # type: ignore[arg-type]
    core.append(sid, audio[: len(audio) // 2])
    core.append(sid, audio[len(audio) // 2 :])
    core.end(sid)
    out: list[tuple[str, Event]] = []
    run_to_idle(core, out)
    return [e for s, e in out if s == sid]


def assert_pool_clean(core: MossCore) -> None:
    assert core.engine is not None
    bm = core.engine.block_manager
    bm.audit(core.engine.scheduler.live_requests())
    assert bm.num_free_blocks == bm.num_blocks


def check_upload_events(events: list[Event]) -> TranscriptFinal:
    """Deltas and segment finals, then exactly one TranscriptFinal; the deltas join to its
    text and the segment finals are its segments."""
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert not any(isinstance(e, TranscriptFinal) for e in events[:-1])
    assert all(isinstance(e, TextDelta | SegmentFinal) for e in events[:-1])
    deltas = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert deltas == Transcript(final.segments, final.duration_s).text
    finals = tuple(e.segment for e in events if isinstance(e, SegmentFinal))
    assert finals == final.segments
    assert [s.id for s in finals] == [f"seg-{i + 1:04d}" for i in range(len(finals))]
    return final


def same_segments(got: tuple[Segment, ...], want: list[Segment]) -> None:
    assert [(s.start_s, s.end_s, s.speaker, s.text, s.flags) for s in got] == [
        (s.start_s, s.end_s, s.speaker, s.text, s.flags) for s in want
    ]


# -- uploads -------------------------------------------------------------------------------


def test_forced_upload_gives_the_reference_segments_and_joined_deltas(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path, forced=REFERENCE)
    events = upload(core, clips[11.0])
    final = check_upload_events(events)
    assert final.finish_reason is FinishReason.STOP
    same_segments(final.segments, parse_transcript(REFERENCE, 11.0))
    # CJK joins without a space, other joints with one (join_texts rules).
    assert Transcript(final.segments, 11.0).text == "Hello there. 你好世界 Okay, [5.00] people. Bye"
    assert final.duration_s == 11.0 and final.coverage == pytest.approx(6.0 / 11.0)
    # Each delta comes before its segment's final (so the SSE tracker does not add it twice).
    assert isinstance(events[0], TextDelta) and isinstance(events[1], SegmentFinal)
    assert_pool_clean(core)


def test_stats_are_the_engine_counters(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    assert MossCore(ModelConfig()).stats() is None  # before load(): no engine
    core = make_core(our_model, tmp_path, forced=REFERENCE)
    assert core.engine is not None
    pool = core.engine.scheduler.block_manager.num_blocks
    assert core.stats() == EngineStats(kv_blocks_total=pool)  # counters 0, the pool idle
    tokens = record_tokens(core)
    check_upload_events(upload(core, clips[11.0]))
    stats = core.stats()
    assert core.engine is not None and stats == core.engine.stats()
    assert stats.num_prefill_steps >= 1 and stats.num_decode_steps >= 1
    assert stats.num_prefill_tokens > 0
    # idle again: no block held, no request left, nothing evicted
    assert stats.kv_blocks_used == 0 and stats.kv_blocks_total == pool
    assert (stats.num_running_requests, stats.num_waiting_requests) == (0, 0)
    assert (stats.num_retained_requests, stats.num_preemptions) == (0, 0)
    # one request: its first token comes from the prefill, every other one from a decode row
    assert [len(t) for t in tokens.values()] == [stats.num_decode_tokens + 1]


def test_parser_departures_survive_the_upload(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    forced = "[0.00][S01] first[2.00][2.50] untagged[20.0][3.00][S02] open end"
    core = make_core(our_model, tmp_path, forced=forced)
    final = check_upload_events(upload(core, clips[11.0]))
    flags = [s.flags for s in final.segments]
    assert flags == [
        (),
        (SegmentFlag.INHERITED_SPEAKER, SegmentFlag.END_CLAMPED),
        (SegmentFlag.MISSING_END,),
    ]
    # a forced reference is in audio time: clamped to the audio's end
    assert final.segments[1].end_s == 11.0 and final.segments[2].end_s == 11.0


def test_upload_stamps_in_marker_time_past_the_audio_end_are_kept(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model's stamps are marker time (62.5 / 62 of the audio's): a last segment ending at
    11.05 s of an 11.0-s upload lies inside the audio (11.09 s in marker time) and keeps its
    end, unflagged, where an audio-time clamp cut it to 11.0; the reported duration stays the
    audio's. (A forced reference is in audio time, so the test gives the core the scale a
    model's own output has.)"""
    forced = "[0.00][S01] first[2.00][10.40][S02] last words[11.05][11.05][S01] late[11.50]"
    core = make_core(our_model, tmp_path, forced=forced)
    assert core._time_scale() == 1.0
    scale = core._engine().prompt_config.marker_time_scale
    assert scale == pytest.approx(62.5 / 62)
    monkeypatch.setattr(core, "_time_scale", lambda: scale)
    final = check_upload_events(upload(core, clips[11.0]))
    got = [(s.end_s, s.flags) for s in final.segments]
    assert got[:2] == [(2.0, ()), (11.05, ())]
    assert got[2][0] == pytest.approx(11.0 * scale) and got[2][1] == (SegmentFlag.END_CLAMPED,)
    assert final.duration_s == 11.0


def test_upload_segments_starting_past_the_audio_end_are_dropped(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """A segment that starts at or after the audio's end has no audio under it: dropped, with
    no text delta (an independent trial got zero-length cues at the end, "00:00:04.204 -->
    00:00:04.204", which WebVTT does not allow); one crossing the end is clamped."""
    forced = "[0.00][S01] first[2.00][10.00][S02] across[12.00][11.00][S01] after[12.50]"
    forced += "[13.00][S02] later[14.00]"
    core = make_core(our_model, tmp_path, forced=forced)
    events = upload(core, clips[11.0])
    final = check_upload_events(events)
    assert [(s.start_s, s.end_s, s.text) for s in final.segments] == [
        (0.0, 2.0, "first"),
        (10.0, 11.0, "across"),
    ]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "first across"
    assert_pool_clean(core)


def test_generated_tokens_equal_dense_generate(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path)
    tokens = record_tokens(core)
    audio = clips[11.0]
    final = check_upload_events(upload(core, audio, max_new_tokens=20))
    windows, counts = split_windows(audio)
    with torch.no_grad():
        embeds = our_model.encode_audio(log_mel(windows), counts)
    ids = build_prompt(load_tokenizer(None), embeds.shape[0]).ids
    want = generate(our_model, torch.tensor(ids), embeds, 20, EOS)
    assert tokens["u/upload"] == want
    assert len(set(want)) >= 6  # the tiny model does not just repeat one token
    expected = FinishReason.STOP if want[-1] == EOS else FinishReason.LENGTH
    assert final.finish_reason is expected
    assert_pool_clean(core)


def test_repetition_guard_stops_a_forced_loop(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    loop = "".join(f"[{t}.00][S01] Thank you.[{t + 1}.00]" for t in range(1, 9))
    forced = "[0.00][S02] Hello.[1.00]" + loop
    core = make_core(our_model, tmp_path, forced=forced)
    tokens = record_tokens(core)
    final = check_upload_events(upload(core, clips[11.0]))
    assert final.finish_reason is FinishReason.REPETITION
    assert [(s.speaker, s.text) for s in final.segments] == [
        ("S02", "Hello."),
        ("S01", "Thank you."),
    ]
    assert core.engine is not None
    forced_len = len(core.engine.tokenizer.encode(forced, add_special_tokens=False).ids)
    assert len(tokens["u/upload"]) < forced_len  # stopped before the loop ran out
    assert_pool_clean(core)


def test_budget_cut_reports_length_and_keeps_segments(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path, forced=REFERENCE)
    assert core.engine is not None
    head = "[0.00][S01] Hello there.[1.20][1.20][S02]你好[2.50]"
    budget = len(core.engine.tokenizer.encode(head, add_special_tokens=False).ids) + 2
    final = check_upload_events(upload(core, clips[11.0], max_new_tokens=budget))
    assert final.finish_reason is FinishReason.LENGTH
    assert [s.text for s in final.segments[:2]] == ["Hello there.", "你好"]
    assert_pool_clean(core)


def test_abort_mid_decode_frees_every_block(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path)
    core.open("a", SessionOptions(live=False, max_new_tokens=200))
    core.append("a", clips[11.0])
    core.end("a")
    tokens = record_tokens(core)
    while not tokens.get("a/upload"):
        core.step()
    assert core.engine is not None and core.engine.block_manager.num_free_blocks < NUM_BLOCKS
    core.abort("a")
    assert_pool_clean(core)
    assert not core.has_work() and core.step() == []
    with pytest.raises(NotFound):
        core.abort("a")


def test_a_failing_transcript_fails_only_its_session(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """An exception while turning one request's tokens into events (detokenizer, parser) is
    that session's internal_error; the other upload finishes and the pool is clean."""
    core = make_core(our_model, tmp_path)
    for sid in ("good", "bad"):
        core.open(sid, SessionOptions(live=False, max_new_tokens=24))
        core.append(sid, clips[11.0])
        core.end(sid)
    tokens = record_tokens(core)
    out: list[tuple[str, Event]] = []
    while not tokens.get("bad/upload"):
        out += core.step()
    bad = core._sessions["bad"]
    assert isinstance(bad, UploadState) and bad.stream is not None

    def broken(token_id: int) -> list[Segment]:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a corrupt byte sequence")

    bad.stream.push = broken  # type: ignore[method-assign]
    run_to_idle(core, out)
    errors = [e for s, e in out if s == "bad" and isinstance(e, Error)]
    assert len(errors) == 1 and errors[0].code == "internal_error"
    assert not any(isinstance(e, TranscriptFinal) for s, e in out if s == "bad")
    good = [e for s, e in out if s == "good"]
    assert isinstance(good[-1], TranscriptFinal) and good[-1].finish_reason is FinishReason.LENGTH
    assert "bad" not in core._sessions and "good" not in core._sessions
    assert_pool_clean(core)


def test_uploads_are_held_for_incoming_ones_counted_on_both_sides(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """The scheduler waits for the gateway's incoming uploads and for the core's own not yet
    queued ones; while the engine only holds, `has_work()` is False (no empty steps), and
    the two uploads are prefilled in one step once the second is in."""
    core = make_core(our_model, tmp_path, forced=REFERENCE)
    assert core.engine is not None
    sched = core.engine.scheduler
    core.set_incoming_uploads(1)  # the gateway is still decoding "b"
    core.open("a", SessionOptions(live=False))
    core.append("a", clips[11.0])
    assert not core.has_work()
    assert sched.num_incoming_uploads == 2  # "b" in the gateway, "a" opened here
    core.end("a")
    assert core.has_work()  # "a" is to be queued
    assert core.step() == []
    assert [r.request_id for r in sched.waiting] == ["a/upload"]
    assert sched.num_incoming_uploads == 1 and not core.has_work()  # held for "b"
    core.open("b", SessionOptions(live=False))
    core.append("b", clips[11.0])
    core.set_incoming_uploads(0)  # the gateway handed "b" over; its end is still on the way
    assert not core.has_work() and sched.num_incoming_uploads == 1  # "b", counted here
    core.end("b")
    tokens = record_tokens(core)
    core.step()  # queues "b"; nothing is incoming any more: one prefill step for both
    assert sorted(tokens) == ["a/upload", "b/upload"] and sched.num_incoming_uploads == 0
    out: list[tuple[str, Event]] = []
    run_to_idle(core, out)
    for sid in ("a", "b"):
        check_upload_events([e for s, e in out if s == sid])
    assert_pool_clean(core)
    with pytest.raises(InternalError):  # only a gateway bug sends one
        core.set_incoming_uploads(-1)


def test_open_live_sessions_keep_the_engine_on_short_steps(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """Every core step tells the scheduler how many live sessions are open, hops queued or
    not, so uploads get the long step budget only while none is."""
    core = make_core(our_model, tmp_path, forced=REFERENCE)
    assert core.engine is not None
    sched = core.engine.scheduler
    core.open("u", SessionOptions(live=False))
    core.append("u", clips[11.0])
    core.end("u")
    core.step()
    assert sched.current_step_budget_s() == sched.config.upload_step_budget_s
    core.open("L", SessionOptions(live=True, hop_s=1.0))  # no audio yet: no hop queued
    core.step()
    assert sched.current_step_budget_s() == sched.config.step_budget_s
    core.abort("L")
    core.step()
    assert sched.current_step_budget_s() == sched.config.upload_step_budget_s
    run_to_idle(core, [])
    assert_pool_clean(core)


def test_a_held_upload_waits_at_most_the_batch_wait(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path)  # SteppingClock: 10 ms per read; the wait is 50 ms
    core.set_incoming_uploads(3)  # e.g. long files the gateway decodes for seconds
    core.open("a", SessionOptions(live=False, max_new_tokens=4))
    core.append("a", clips[11.0])
    core.end("a")
    core.step()
    polls = 0
    while not core.has_work():
        polls += 1
        assert polls < 10, "the hold outlived its wait"
    assert polls >= 2  # it was held for a while
    out: list[tuple[str, Event]] = []
    run_to_idle(core, out)
    assert isinstance(out[-1][1], TranscriptFinal)
    assert_pool_clean(core)


CONTINUED_REFERENCE = (
    "[0.00][S01] Hello there.[1.20][1.40][S02] Second one.[2.80][3.00][S01] Third part.[4.50]"
    "[5.00][S02] After the stop.[6.80][7.00][S01] And the end.[10.50]"
)


def continuing_core(
    model: MossTDModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    forced: str = CONTINUED_REFERENCE,
    gap_s: float = 3.0,
) -> MossCore:
    """A core forcing `forced` that continues uploads stopping `gap_s` before their end."""
    from livemeet.backends import moss

    monkeypatch.setattr(moss, "UPLOAD_CONTINUE_GAP_S", gap_s)
    return make_core(model, tmp_path, forced=forced)


def stop_early_at(core: MossCore, first_s: float, later_s: float | None = None) -> None:
    """The model stops early (DESIGN 5.8): an upload's first request gets the forced ids of
    its audio up to `first_s` only (`forced_hop_parts`: the words spoken by then), then EOS; a
    continuation (forced after a cut) those up to `later_s` (None: the whole rest)."""
    inner = core._forced_ids

    def forced_ids(edge_s: float | None, tail_from_s: float | None = None) -> Any:
        if edge_s is None:
            return inner(first_s)
        return inner(edge_s if later_s is None else later_s, tail_from_s)

    core._forced_ids = forced_ids  # type: ignore[method-assign]


@pytest.mark.parametrize("gap_s", [3.0, 30.0])
def test_an_upload_that_stops_early_is_continued_after_its_last_segments(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gap_s: float,
) -> None:
    """DESIGN 5.8: a decode that ends at 4.5 s of an 11-s upload, 6.5 s before its end, is
    continued when that is at least UPLOAD_CONTINUE_GAP_S (3 s here): one request over the same
    audio whose forced prefix is the transcript so far (whole segments, less the last `]`), so
    the transcript is every reference segment once, in order, with one id sequence and joined
    deltas. With the default 30 s the upload ends where the model stopped."""
    core = continuing_core(our_model, tmp_path, monkeypatch, gap_s=gap_s)
    stop_early_at(core, 4.5)
    prefixes = record_prefixes(core)
    final = check_upload_events(upload(core, clips[11.0]))
    want = parse_transcript(CONTINUED_REFERENCE, 11.0)
    assert final.finish_reason is FinishReason.STOP
    stats = core.stats()
    assert stats is not None
    if gap_s == 30.0:
        same_segments(final.segments, want[:3])
        assert list(prefixes) == ["u/upload"] and stats.num_upload_continuations == 0
    else:
        same_segments(final.segments, want)
        assert list(prefixes) == ["u/upload", "u/upload1"] and prefixes["u/upload"] == []
        assert core.engine is not None
        forced = parse_transcript(core.engine.tokenizer.decode(prefixes["u/upload1"]) + "]")
        same_segments(tuple(forced), want[:3])
        assert stats.num_upload_continuations == 1
    assert_pool_clean(core)


def test_continuations_stop_when_they_add_nothing_and_at_the_limit(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A continuation that adds no segment (the model stops at once again) is not followed by
    another, and no upload continues more than UPLOAD_MAX_CONTINUATIONS times, even while each
    adds a segment."""
    from livemeet.backends import moss

    want = parse_transcript(CONTINUED_REFERENCE, 11.0)
    core = continuing_core(our_model, tmp_path, monkeypatch)
    stop_early_at(core, 4.5, later_s=4.5)  # the continuation writes nothing new
    prefixes = record_prefixes(core)
    final = check_upload_events(upload(core, clips[11.0]))
    same_segments(final.segments, want[:3])
    assert list(prefixes) == ["u/upload", "u/upload1"]
    assert_pool_clean(core)

    monkeypatch.setattr(moss, "UPLOAD_MAX_CONTINUATIONS", 1)
    core = make_core(our_model, tmp_path, forced=CONTINUED_REFERENCE)
    stop_early_at(core, 1.2, later_s=2.8)  # each continuation could add one segment more
    final = check_upload_events(upload(core, clips[11.0], sid="v"))
    same_segments(final.segments, want[:2])
    assert core.num_upload_continuations == 1
    assert_pool_clean(core)


def test_a_decode_that_stops_inside_a_segment_is_continued_from_the_last_closed_one(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EOS inside a segment (no end stamp) gives it the audio's end (MISSING_END), which must
    not pass for full coverage: the decision is taken on the closed segments, the open one
    is held back, and the continuation writes it whole, once."""
    core = continuing_core(our_model, tmp_path, monkeypatch)
    inner = core._forced_ids
    cut_off = CONTINUED_REFERENCE[: CONTINUED_REFERENCE.index("stop.")]  # "... After the "

    def forced_ids(edge_s: float | None, tail_from_s: float | None = None) -> Any:
        return core._encode(cut_off) if edge_s is None else inner(edge_s, tail_from_s)

    core._forced_ids = forced_ids  # type: ignore[method-assign]
    prefixes = record_prefixes(core)
    final = check_upload_events(upload(core, clips[11.0]))
    same_segments(final.segments, parse_transcript(CONTINUED_REFERENCE, 11.0))
    assert list(prefixes) == ["u/upload", "u/upload1"]
    assert_pool_clean(core)


def test_a_segment_past_the_audio_is_dropped_and_the_upload_continued_from_the_last_kept(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decode that jumps past the audio's end (a segment at 12 s of 11 s: no audio under it,
    dropped) and stops there has still transcribed only up to 4.5 s: the continuation
    decision is taken on the kept segments, so the rest is written by a continuation, and the
    made-up segment is in no event."""
    core = continuing_core(our_model, tmp_path, monkeypatch)
    inner = core._forced_ids
    head = CONTINUED_REFERENCE[: CONTINUED_REFERENCE.index("[5.00]")]
    jumped = head + "[12.00][S02] Made up.[13.00]"

    def forced_ids(edge_s: float | None, tail_from_s: float | None = None) -> Any:
        return core._encode(jumped) if edge_s is None else inner(edge_s, tail_from_s)

    core._forced_ids = forced_ids  # type: ignore[method-assign]
    prefixes = record_prefixes(core)
    events = upload(core, clips[11.0])
    final = check_upload_events(events)
    same_segments(final.segments, parse_transcript(CONTINUED_REFERENCE, 11.0))
    assert list(prefixes) == ["u/upload", "u/upload1"]
    assert not any("Made up" in repr(event) for event in events)
    assert_pool_clean(core)


def test_a_max_new_tokens_cap_spans_the_continuations(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = continuing_core(our_model, tmp_path, monkeypatch)
    stop_early_at(core, 4.5)
    tokens = record_tokens(core)
    assert core.engine is not None
    budgets: dict[str, int | None] = {}
    inner = core.engine.add_request

    def add_request(rid: str, *args: Any, **kwargs: Any) -> Any:
        budgets[rid] = kwargs.get("max_new_tokens")
        return inner(rid, *args, **kwargs)

    core.engine.add_request = add_request  # type: ignore[method-assign]
    final = check_upload_events(upload(core, clips[11.0], max_new_tokens=60))
    assert set(budgets) == {"u/upload", "u/upload1"}
    assert budgets["u/upload1"] == 60 - len(tokens["u/upload"]) > 0
    assert len(tokens["u/upload"]) + len(tokens["u/upload1"]) <= 60
    assert final.finish_reason is FinishReason.LENGTH
    assert_pool_clean(core)


def test_a_forced_reference_with_nothing_past_the_cut_is_not_continued(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Benchmarks: a reference that ends 6.5 s before the audio (trailing silence) has
    nothing to force after it; the upload ends without a useless continuation. An upload
    too short to stop early keeps no copy of its audio."""
    from livemeet.backends import moss

    short = CONTINUED_REFERENCE[: CONTINUED_REFERENCE.index("[5.00]")]
    core = continuing_core(our_model, tmp_path, monkeypatch, forced=short)
    prefixes = record_prefixes(core)
    final = check_upload_events(upload(core, clips[11.0]))
    assert len(final.segments) == 3 and list(prefixes) == ["u/upload"]
    assert core.num_upload_continuations == 0
    monkeypatch.setattr(moss, "UPLOAD_CONTINUE_GAP_S", 30.0)
    core.open("v", SessionOptions(live=False))
    core.append("v", clips[11.0])
    core.end("v")
    core.step()
    sess = core._sessions["v"]
    assert isinstance(sess, UploadState) and sess.request_id is not None and sess.samples is None
    core.abort("v")
    assert_pool_clean(core)


def test_a_step_submits_at_most_its_share_of_uploads(
    our_model: MossTDModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload's submit joins and scans its whole audio: a step takes at most
    MAX_UPLOAD_SUBMITS_PER_STEP of them (the longest-due), and live sessions beside them."""
    from livemeet.backends import moss

    monkeypatch.setattr(moss, "MAX_UPLOAD_SUBMITS_PER_STEP", 2)
    core = make_core(our_model, tmp_path, live_vad=None)  # zeros: VAD would skip the hop
    for i in range(4):
        core.open(f"u{i}", SessionOptions(live=False))
        core.append(f"u{i}", np.zeros(SAMPLE_RATE, np.float32))
        core.end(f"u{i}")
    core.open("L", SessionOptions(live=True))
    core.append("L", np.zeros(2 * SAMPLE_RATE, np.float32))
    assert [sid for sid, _ in core._submits_now(0.0)] == ["u0", "u1", "L"]
    for sid in ("u0", "u1", "u2", "u3", "L"):
        core.abort(sid)


def test_empty_upload_and_bad_input(our_model: MossTDModel, tmp_path: Path) -> None:
    core = make_core(our_model, tmp_path)
    core.open("e", SessionOptions(live=False))
    core.end("e")
    out: list[tuple[str, Event]] = []
    run_to_idle(core, out)
    assert out == [("e", TranscriptFinal((), FinishReason.STOP, 0.0, 0.0))]
    with pytest.raises(InvalidRequest):
        core.open("x", SessionOptions(sample_rate=8000))
    with pytest.raises(InvalidRequest):
        core.open("x", SessionOptions(live=False, max_new_tokens=0))
    core.open("x", SessionOptions(live=False))
    core.end("x")
    with pytest.raises(ProtocolError):
        core.append("x", np.zeros(160, np.float32))
    with pytest.raises(NotFound):
        core.append("nope", np.zeros(160, np.float32))
    bad = tmp_path / "empty.txt"
    bad.write_text("no segments here")
    with pytest.raises(ConfigError):
        MossCore(ModelConfig(forced_output=str(bad)), engine=core.engine).load()
    with pytest.raises(ConfigError):
        ModelConfig(forced_output=str(tmp_path / "missing.txt")).validate()


def test_engine_config_carries_the_model_flags() -> None:
    """Every ModelConfig field `serve` parses for the engine reaches its EngineConfig (each set
    to a value other than its default, the ms flags in seconds); a block size no kernel pages
    by is refused."""
    cfg = ModelConfig(
        model="/ckpt/moss",
        load_format="dummy",
        device="cpu",
        dtype="float32",
        num_kv_blocks=123,
        kv_cache_dtype="fp8_e4m3",
        kv_block_size=32,
        prefill_graphs=False,
        mem_fraction=0.5,
        chunked_prefill_size=16_384,
        upload_batch_wait_ms=30.0,
        upload_hold="arrivals",
        upload_step_budget_ms=120.0,
        live_step_budget_ms=10.0,
        live_decode_steps=3,
        upload_min_share=0.5,
    )
    defaults = ModelConfig()
    changed = ("num_kv_blocks", "kv_cache_dtype", "kv_block_size", "prefill_graphs")
    changed += ("mem_fraction", "chunked_prefill_size", "upload_batch_wait_ms", "upload_hold")
    changed += ("upload_step_budget_ms", "live_step_budget_ms", "live_decode_steps")
    changed += ("upload_min_share",)
    assert all(getattr(cfg, f) != getattr(defaults, f) for f in changed)  # else proves nothing
    engine = engine_config(cfg)
    assert (engine.model, engine.load_format, engine.device, engine.dtype) == (
        "/ckpt/moss",
        "dummy",
        "cpu",
        "float32",
    )
    assert (engine.num_kv_blocks, engine.kv_cache_dtype, engine.block_size) == (
        123,
        "fp8_e4m3",
        32,
    )
    assert not engine.prefill_graphs and engine.mem_fraction == 0.5
    sched = engine.scheduler
    assert sched.chunked_prefill_size == 16_384
    assert sched.max_num_batched_tokens == 16_384  # room for one whole chunk
    assert sched.upload_batch_wait_s == pytest.approx(0.030)
    assert sched.upload_hold is UploadHold.ARRIVALS
    assert sched.upload_step_budget_s == pytest.approx(0.120)
    assert sched.step_budget_s == pytest.approx(0.010)
    assert sched.live_decode_steps == 3
    assert sched.upload_min_share == 0.5
    assert engine_config(ModelConfig()).block_size == KV_BLOCK_SIZE
    with pytest.raises(ConfigError, match="--upload-min-share"):
        ModelConfig(upload_min_share=0.95).validate()
    with pytest.raises(ConfigError, match="--kv-block-size"):
        ModelConfig(kv_block_size=24).validate()
    # a prefill chunk need not fill a KV block: 64-token chunks over 128-token blocks are valid
    ModelConfig(kv_block_size=128, chunked_prefill_size=64).validate()
    with pytest.raises(ConfigError, match="--chunked-prefill-size"):
        ModelConfig(chunked_prefill_size=MIN_PREFILL_CHUNK - 1).validate()


def test_registry_selects_moss() -> None:
    assert ModelConfig(model="/some/dir").backend_name == "moss"
    assert ModelConfig(load_format="dummy").backend_name == "moss"
    core = create_backend(ModelConfig(load_format="dummy"))
    assert isinstance(core, MossCore)
    assert core.info.name == "moss" and core.info.model_id == "moss-td-dummy"
    assert not core.info.demo and core.info.diarization
    assert MossCore(ModelConfig(model="/ckpt/moss-td")).info.model_id == "moss-td"


# -- live ----------------------------------------------------------------------------------

LIVE_REFERENCE = (
    "[0.50][S01] one[2.00][2.50][S02] two[4.00][4.50][S01] three[6.00]"
    "[6.50][S02] four[8.00][8.50][S01] five[10.00]"
)


def stream_live(
    core: MossCore, audio: np.ndarray, head_s: float, chunk_s: float, hop_s: float
) -> list[Event]:
    """Append the first `head_s` at once, then `chunk_s` chunks, stepping to idle after each."""
    core.open("L", SessionOptions(live=True, hop_s=hop_s))
    out: list[tuple[str, Event]] = []
    head = round(head_s * SAMPLE_RATE)
    core.append("L", audio[:head])
    run_to_idle(core, out)
    step = round(chunk_s * SAMPLE_RATE)
    for i in range(head, len(audio), step):
        core.append("L", audio[i : i + step])
        run_to_idle(core, out)
    core.end("L")
    run_to_idle(core, out)
    return [e for s, e in out if s == "L"]


def stream_chunks(
    core: MossCore, audio: np.ndarray, sizes_s: list[float], hop_s: float
) -> list[Event]:
    """`stream_live` with chunks of the given sizes (s), then the rest of `audio` at once."""
    core.open("L", SessionOptions(live=True, hop_s=hop_s))
    out: list[tuple[str, Event]] = []
    start = 0
    for size in [*sizes_s, len(audio) / SAMPLE_RATE]:
        end = min(len(audio), start + round(size * SAMPLE_RATE))
        if end > start:
            core.append("L", audio[start:end])
            run_to_idle(core, out)
        start = end
    core.end("L")
    run_to_idle(core, out)
    return [e for s, e in out if s == "L"]


@pytest.mark.slow
def test_live_forced_partials_finals_and_kv_reuse(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)
    events = stream_live(core, clips[11.0], head_s=2.0, chunk_s=2.0, hop_s=2.0)
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert sum(isinstance(e, TranscriptFinal) for e in events) == 1
    finals = [e.segment for e in events if isinstance(e, SegmentFinal)]
    partial_at = [i for i, e in enumerate(events) if isinstance(e, SegmentPartial)]
    final_at = [i for i, e in enumerate(events) if isinstance(e, SegmentFinal)]
    assert partial_at and final_at and partial_at[0] < final_at[0]
    # Finals are immutable: each id once, in order, and the transcript repeats them unchanged.
    assert [s.id for s in finals] == [f"seg-{i + 1:04d}" for i in range(len(finals))]
    assert final.segments == tuple(finals)
    revs = [e.rev for e in events if isinstance(e, SegmentPartial)]
    assert revs == list(range(1, len(revs) + 1))
    # Every reference segment comes out once, with its label: labels never renumbered.
    want = parse_transcript(LIVE_REFERENCE)
    assert [(s.speaker, s.text, s.start_s, s.end_s) for s in final.segments] == [
        (s.speaker, s.text, s.start_s, s.end_s) for s in want
    ]
    for e in events:
        if isinstance(e, SegmentPartial):
            for seg in e.segments:
                ref = next(w for w in want if w.text == seg.text)
                assert seg.speaker == ref.speaker
    assert final.finish_reason is FinishReason.STOP
    assert core.num_reused_tokens > 0  # later hops forked the header from the previous hop
    assert_pool_clean(core)


@pytest.mark.slow
def test_forced_live_hops_write_the_words_spoken_so_far(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """A forced hop whose audio edge falls inside a reference segment writes the words that end
    by the edge (`word_end_times`: a uniform rate over the segment) and no end stamp, as a
    model does with a turn still being spoken: the partial shows that segment open
    (MISSING_END, its end at the edge), one word more each hop, and the transcript is the
    reference whole."""
    reference = "[0.50][S01] one two three four[4.50][5.00][S02] five six seven[8.00]"
    core = make_core(our_model, tmp_path, forced=reference)
    events = stream_live(core, clips[11.0], head_s=1.0, chunk_s=1.0, hop_s=1.0)
    want = parse_transcript(reference)
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert [(s.speaker, s.text, s.start_s, s.end_s) for s in final.segments] == [
        (s.speaker, s.text, s.start_s, s.end_s) for s in want
    ]
    shown: dict[float, list[str]] = {}  # reference start -> texts shown open, in order
    for e in events:
        if isinstance(e, SegmentPartial):
            for seg in e.segments:
                ref = next(w for w in want if w.start_s == seg.start_s)
                assert seg.speaker == ref.speaker
                if SegmentFlag.MISSING_END in seg.flags:
                    assert ref.start_s < seg.end_s < ref.end_s
                    shown.setdefault(ref.start_s, []).append(seg.text)
                else:
                    assert (seg.text, seg.end_s) == (ref.text, ref.end_s)
    # edges 1, 2, 3, 4 s: 0, 1, 2, 3 of the first turn's words (ending 1.5, 2.5, 3.5, 4.5 s)
    assert shown[0.5] == ["one", "one two", "one two three"]
    assert shown[5.0] == ["five", "five six"]  # words end at 6, 7, 8 s; edges 6 and 7 s
    assert_pool_clean(core)


def test_the_hop_an_end_waits_on_has_no_slack(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """A live hop's deadline is a hop after it was due, also one due because of a `finalize`
    (a client could send one with every frame); the last one, which `end` waits on (the
    client waits for transcript.final), is due at once, so it goes before the hops of other
    sessions that fell due with it."""
    core = make_core(our_model, tmp_path)
    assert core.engine is not None
    engine = core.engine
    slack: dict[str, float] = {}  # request id -> deadline less the clock at submission
    inner = engine.add_request

    def add_request(rid: str, *args: Any, **kwargs: Any) -> Any:
        slack[rid] = kwargs["deadline_s"] - engine.clock.now  # type: ignore[attr-defined]
        return inner(rid, *args, **kwargs)

    engine.add_request = add_request  # type: ignore[method-assign]
    audio = clips[11.0]
    out: list[tuple[str, Event]] = []
    core.open("L", SessionOptions(live=True, hop_s=1.0, max_new_tokens=4))
    core.append("L", audio[: 2 * SAMPLE_RATE])
    run_to_idle(core, out)
    core.append("L", audio[2 * SAMPLE_RATE : 5 * SAMPLE_RATE // 2])
    core.finalize("L")  # half a hop of new audio: due only because of the finalize
    run_to_idle(core, out)
    core.append("L", audio[5 * SAMPLE_RATE // 2 : 4 * SAMPLE_RATE])
    run_to_idle(core, out)
    core.append("L", audio[4 * SAMPLE_RATE : 9 * SAMPLE_RATE // 2])
    core.end("L")  # half a hop again: the last hop, due because of the end
    run_to_idle(core, out)
    hops = sorted(slack)
    assert len(hops) == 4, hops
    assert all(0.9 < slack[rid] <= 1.0 for rid in hops[:3])  # due a hop later, with finalize's
    assert slack[hops[3]] <= 0.0  # the end's
    assert isinstance(out[-1][1], TranscriptFinal)
    assert_pool_clean(core)


def test_an_end_during_a_hop_brings_that_hops_deadline_to_when_it_fell_due(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """`end` while a hop runs: the client now waits on that hop, so it loses its hop of slack
    (found by a review: only a hop submitted after `end` had none); the final still comes."""
    core = make_core(our_model, tmp_path)
    assert core.engine is not None
    core.open("L", SessionOptions(live=True, hop_s=1.0, max_new_tokens=4))
    core.append("L", clips[11.0][: 2 * SAMPLE_RATE])
    out: list[tuple[str, Event]] = list(core.step())  # submits the hop; it does not finish
    hop = core._sessions["L"].hop  # type: ignore[union-attr]
    assert hop is not None
    request = core.engine.scheduler.get(hop.request_id)
    assert request is not None and request.deadline_s == pytest.approx(hop.due_s + 1.0)
    core.end("L")
    assert request.deadline_s == hop.due_s
    run_to_idle(core, out)
    assert isinstance(out[-1][1], TranscriptFinal)
    assert_pool_clean(core)


def test_keep_after_cut_drops_the_committed_words_of_a_turn_written_again() -> None:
    """A hop writing the meeting again (no forced prefix) repeats a turn committed in part:
    of the straddler only the words after the committed ones are kept, from the cut."""
    committed = [
        Segment(0.0, 2.0, "S01", "Before that."),
        Segment(5.12, 6.0, "S01", "Charlie, november"),
    ]
    turn = Segment(5.12, 8.76, "S02", "charlie november November charlie bravo")
    later = Segment(9.0, 10.0, "S02", "after")
    kept = keep_after_cut([committed[0], turn, later], 6.0, committed)
    assert [(s.start_s, s.text) for s in kept] == [
        (6.0, "November charlie bravo"),
        (9.0, "after"),
    ]
    # committed up to 8.0 (all but the last word): its midpoint (6.94) is before the cut,
    # and it was dropped whole, with "bravo"
    committed[1] = Segment(5.12, 8.0, "S01", "charlie november november charlie")
    assert [(s.start_s, s.text) for s in keep_after_cut([turn], 8.0, committed)] == [(8.0, "bravo")]
    # all of it committed already: nothing
    assert keep_after_cut([turn], 8.0, [Segment(5.12, 8.0, "S01", turn.text)]) == []
    # no committed words in its span, or written otherwise: its midpoint (6.94) decides
    assert keep_after_cut([turn], 6.0, committed[:1]) == [turn]
    other = replace(turn, text="something else entirely")
    assert keep_after_cut([other], 6.0, committed) == [other]
    assert keep_after_cut([other], 8.0, committed) == []


def stream_with_finalize(
    core: MossCore, audio: np.ndarray, finalize_after_s: int | None
) -> list[Event]:
    """1-s chunks at 1-s hops, stepping to idle after each; `finalize` after the given second."""
    core.open("L", SessionOptions(live=True, hop_s=1.0))
    out: list[tuple[str, Event]] = []
    for k in range(0, len(audio), SAMPLE_RATE):
        core.append("L", audio[k : k + SAMPLE_RATE])
        run_to_idle(core, out)
        if k // SAMPLE_RATE + 1 == finalize_after_s:
            core.finalize("L")
            run_to_idle(core, out)
    core.end("L")
    run_to_idle(core, out)
    return [e for s, e in out if s == "L"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("words", "finalize_after_s", "clip_s", "forced_tokens"),
    [
        (10, 4, 11.0, 2048),
        (10, 7, 11.0, 2048),
        (35, None, 40.0, 2048),
        # hops that re-decode the whole meeting write the turn again whole (a trial: words
        # came twice, or were lost, at every commit inside a turn)
        (10, 4, 11.0, 0),
        (10, 7, 11.0, 0),
        (35, None, 40.0, 0),
    ],
)
def test_a_turn_committed_while_spoken_goes_on_from_the_commit(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    words: int,
    finalize_after_s: int | None,
    clip_s: float,
    forced_tokens: int,
) -> None:
    """A forced turn committed while it is spoken (`finalize` mid-turn, or a turn longer than
    the 25-s window, force-committed) goes on in the next hops from the commit: the transcript
    holds each of its words once, in order, from its start to its end (a word a second)."""
    text = " ".join(f"w{i}" for i in range(words))
    reference = f"[0.50][S01] {text}[{0.5 + words:.2f}]"
    core = make_core(
        our_model, tmp_path, forced=reference, live_forced_transcript_tokens=forced_tokens
    )
    final = stream_with_finalize(core, clips[clip_s], finalize_after_s)[-1]
    assert isinstance(final, TranscriptFinal)
    segments = final.segments
    assert " ".join(s.text for s in segments) == text
    assert len(segments) >= 2  # committed in pieces
    assert segments[0].start_s == 0.5 and segments[-1].end_s == 0.5 + words
    for a, b in zip(segments, segments[1:], strict=False):
        assert a.end_s == pytest.approx(b.start_s, abs=0.01)  # each goes on where one stopped
    if finalize_after_s is not None:  # the words ending by then (0.5 + i + 1 s) come first
        assert segments[0].text == " ".join(f"w{i}" for i in range(finalize_after_s - 1))
    assert_pool_clean(core)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [TEST_BLOCK_SIZE, 128])
def test_live_hop_with_forked_kv_matches_a_fresh_decode(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path, block_size: int
) -> None:
    """The second hop forks the first's stable prefix, which ends inside a KV block (the
    first hop's KV is released at the fork, so the block is written in place, not copied:
    tests/engine/test_engine.py forks a running request), and decodes what a fresh decode of
    the whole audio does."""
    core = make_core(
        our_model,
        tmp_path,
        num_blocks=NUM_BLOCKS * TEST_BLOCK_SIZE // block_size,
        block_size=block_size,
    )
    tokens = record_tokens(core)
    audio = clips[40.0][: round(32.0 * SAMPLE_RATE)]
    core.open("L", SessionOptions(live=True, hop_s=1.0, max_new_tokens=12))
    out: list[tuple[str, Event]] = []
    core.append("L", audio[: 31 * SAMPLE_RATE])
    run_to_idle(core, out)
    core.append("L", audio[31 * SAMPLE_RATE :])
    run_to_idle(core, out)
    assert core.num_reused_tokens >= 375  # the second hop forked the first window's KV
    windows, counts = split_windows(audio)
    with torch.no_grad():
        embeds = our_model.encode_audio(log_mel(windows), counts)
    ids = build_prompt(load_tokenizer(None), embeds.shape[0]).ids
    assert tokens["L/hop000001"] == generate(our_model, torch.tensor(ids), embeds, 12, EOS)
    core.abort("L")
    assert_pool_clean(core)


def record_prefixes(core: MossCore) -> dict[str, list[int]]:
    """Wrap the engine's add_request to record each request's forced assistant prefix."""
    assert core.engine is not None
    engine = core.engine
    prefixes: dict[str, list[int]] = {}
    inner = engine.add_request

    def add_request(rid: str, *args: Any, **kwargs: Any) -> Any:
        prefixes[rid] = list(kwargs.get("prefix_token_ids", ()))
        return inner(rid, *args, **kwargs)

    engine.add_request = add_request  # type: ignore[method-assign]
    return prefixes


@pytest.mark.slow
def test_live_hops_prefill_the_committed_transcript_and_decode_only_the_tail(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """DESIGN 5.3: a hop prefills the committed transcript (rendered in the output grammar,
    session labels) as forced assistant tokens and decodes only what follows, so the decode
    work per hop stops growing with the meeting; the transcript is the same as with
    cumulative re-decode (`live_forced_transcript_tokens=0`)."""
    want = [(s.speaker, s.text, s.start_s, s.end_s) for s in parse_transcript(LIVE_REFERENCE)]
    decoded: dict[int, int] = {}
    for budget in (0, 2_048):
        core = make_core(
            our_model, tmp_path, forced=LIVE_REFERENCE, live_forced_transcript_tokens=budget
        )
        tokens, prefixes = record_tokens(core), record_prefixes(core)
        events = stream_live(core, clips[11.0], head_s=2.0, chunk_s=1.0, hop_s=1.0)
        final = events[-1]
        assert isinstance(final, TranscriptFinal)
        got = [(s.speaker, s.text, s.start_s, s.end_s) for s in final.segments]
        assert got == want, budget
        decoded[budget] = sum(len(t) for t in tokens.values())
        assert core.engine is not None
        lengths = []
        for rid, prefix in prefixes.items():
            # the prefix stops before its last `]` (token healing: the decode writes `][`)
            text = core.engine.tokenizer.decode(prefix)
            assert not prefix or not text.endswith("]")
            forced = parse_transcript(text + "]" if prefix else "")
            # the prefix is the committed finals so far, whole and in order
            assert [(s.speaker, s.text, s.start_s, s.end_s) for s in forced] == want[
                : len(forced)
            ], rid
            lengths.append(len(forced))
        if budget == 0:
            assert not any(prefixes.values())
        else:
            assert lengths == sorted(lengths) and lengths[-1] >= 3
        assert_pool_clean(core)
    assert decoded[2_048] < 0.6 * decoded[0], decoded


@pytest.mark.slow
def test_slow_hops_shrink_the_forced_transcript_and_the_transcript_stays_whole(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """Under load (every hop "slow" here) each hop forces at most its session's budget, which
    halves hop by hop to the floor (livemeet/session/forced_budget.py): hops then force only
    the newest committed segments that fit, and the transcript is still every reference
    segment once, in order. The hops' forced tokens are counted for /metrics."""
    from livemeet.session.forced_budget import ForcedBudget

    want = [(s.speaker, s.text, s.start_s, s.end_s) for s in parse_transcript(LIVE_REFERENCE)]
    core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)
    # any hop is slow: the budget goes 80, 40, 20 and stays (a segment is ~16 ids: 20 holds one)
    core.forced_budget = ForcedBudget(80, 20, slow_fraction=1e-9, fast_fraction=1e-9, step_tokens=1)
    prefixes = record_prefixes(core)
    budgets: list[int] = []
    inner = core._submit_hop

    def submit_hop(sid: str, sess: Any, due_s: float | None = None) -> None:
        budgets.append(sess.forced_budget.tokens)
        inner(sid, sess, due_s)

    core._submit_hop = submit_hop  # type: ignore[method-assign]
    events = stream_live(core, clips[11.0], head_s=2.0, chunk_s=1.0, hop_s=1.0)
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert [(s.speaker, s.text, s.start_s, s.end_s) for s in final.segments] == want
    assert budgets[:4] == [80, 40, 20, 20] and set(budgets[3:]) == {20}
    lengths = [len(p) for p in prefixes.values()]
    assert all(n <= b for n, b in zip(lengths, budgets, strict=True))
    assert core.engine is not None
    forced_segments = []
    for prefix in prefixes.values():
        text = core.engine.tokenizer.decode(prefix)
        forced_segments.append(len(parse_transcript(text + "]" if prefix else "")))
    assert max(forced_segments[3:]) == 1  # late hops: only the newest segment fits
    assert max(forced_segments) >= 1
    stats = core.stats()
    assert stats is not None and stats.live_forced_tokens == sum(lengths) > 0
    assert_pool_clean(core)


def test_live_sessions_read_the_models_stamps_in_marker_time_unless_forced(
    our_model: MossTDModel, tmp_path: Path
) -> None:
    """The model writes marker time (62.5 / 62 of the audio's); a forced reference transcript is
    in audio time (bench_live measures latency from its ends: nothing may be forced, cut or
    committed early by a scale it does not have)."""
    for forced, scale in ((None, 62.5 / 62), (LIVE_REFERENCE, 1.0)):
        core = make_core(our_model, tmp_path, forced=forced)
        core.open("L", SessionOptions(live=True))
        live = core._sessions["L"].live  # type: ignore[union-attr]
        assert live.options.time_scale == pytest.approx(scale)
        core.abort("L")


@pytest.mark.slow
@pytest.mark.parametrize("budget", [0, 2_048])
def test_a_committed_zero_length_segment_is_not_cut_in_again_in_marker_time(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    budget: int,
) -> None:
    """In marker time the window start (the committed end rounded to a sample) converts back
    to a stamp up to ~31 us below the committed end: a hop's cut must not go below the end
    itself, or a committed zero-length segment at it is decoded past the cut and committed
    again. (The core is given the scale a model's own output has; 2.02 s is such a stamp.)"""
    reference = "[1.00][S01] hello[2.02][2.02][S01] uh[2.02][6.00][S01] next[7.00]"
    core = make_core(our_model, tmp_path, forced=reference, live_forced_transcript_tokens=budget)
    scale = core._engine().prompt_config.marker_time_scale
    monkeypatch.setattr(core, "_time_scale", lambda: scale)
    events = stream_live(core, clips[11.0][: 9 * SAMPLE_RATE], head_s=1.0, chunk_s=1.0, hop_s=1.0)
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert [s.text for s in final.segments] == ["hello", "uh", "next"]
    assert_pool_clean(core)


LOOP_REFERENCE = (
    "[0.50][S01] one[1.50]"
    + "".join(f"[{t + 1.5:.2f}][S01] Thank you.[{t + 2.5:.2f}]" for t in range(7))
    + "[8.50][S02] two[10.00]"
)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [0, 2_048])
def test_a_loop_does_not_grow_past_the_forced_transcript(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path, budget: int
) -> None:
    """A decode loop that crosses the forced prefix (each hop decodes only a segment or two of
    it) is still cut: the hop's repetition guard and the session's hypothesis cleaning count
    the prefix's trailing copies. In both modes a hop whose loop shows only at its close
    frees the KV the engine kept for it (it leaked once). A hop cut by the guard looks fast,
    so it leaves the session's forced budget as it was (ForcedBudget)."""
    core = make_core(
        our_model, tmp_path, forced=LOOP_REFERENCE, live_forced_transcript_tokens=budget
    )
    reasons: list[FinishReason] = []
    budget_updates: list[float] = []
    rule, finish = core.forced_budget, core._finish_hop

    class Recorder:
        def start(self) -> BudgetState:
            return rule.start()

        def after_hop(self, state: BudgetState, hop_duration_s: float, hop_s: float) -> BudgetState:
            budget_updates.append(hop_duration_s)
            return rule.after_hop(state, hop_duration_s, hop_s)

    def finish_hop(sid: str, sess: Any, reason: FinishReason) -> Any:
        events = finish(sid, sess, reason)
        reasons.append(sess.last_reason)
        return events

    core.forced_budget = Recorder()  # type: ignore[assignment]
    core._finish_hop = finish_hop  # type: ignore[method-assign]
    events = stream_live(core, clips[11.0], head_s=2.0, chunk_s=1.0, hop_s=1.0)
    assert FinishReason.REPETITION in reasons
    assert len(budget_updates) == sum(r is not FinishReason.REPETITION for r in reasons)
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    texts = [s.text for s in final.segments]
    longest, run = 1, 1
    for prev, cur in zip(texts, texts[1:], strict=False):
        run = run + 1 if prev == cur else 1
        longest = max(longest, run)
    assert texts[0] == "one" and longest <= 3, texts
    assert_pool_clean(core)


def test_due_sessions_are_submitted_longest_due_first_and_their_wait_counts(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step submits at most MAX_SUBMITS_PER_STEP requests, the sessions due longest first
    (not in the order they opened: with 4 per step, 100 sessions' hops queued unseen before
    submission, docs/benchmarks.md session 18). A hop's wait from due to submission is summed
    for /metrics, and the forced budget judges the hop from when it was due."""
    from livemeet.backends import moss

    monkeypatch.setattr(moss, "MAX_SUBMITS_PER_STEP", 2)
    core = make_core(our_model, tmp_path, forced=REFERENCE)
    for sid in ("a", "b", "c"):
        core.open(sid, SessionOptions(live=True))
        core.append(sid, clips[11.0][: 2 * SAMPLE_RATE])
    sessions = core._sessions
    sessions["b"].due_s, sessions["c"].due_s = -3.0, -2.0  # due before "a" (unstamped)
    assert core.engine is not None
    now = core.engine.clock()
    assert [sid for sid, _ in core._due_sessions(now)] == ["b", "c", "a"]
    assert sessions["a"].due_s == now
    durations: list[float] = []
    rule = core.forced_budget

    class Recorder:
        def start(self) -> BudgetState:
            return rule.start()

        def after_hop(self, state: BudgetState, hop_duration_s: float, hop_s: float) -> BudgetState:
            durations.append(hop_duration_s)
            return rule.after_hop(state, hop_duration_s, hop_s)

    core.forced_budget = Recorder()  # type: ignore[assignment]
    deadlines: dict[str, float] = {}
    inner = core.engine.add_request

    def add_request(rid: str, *args: Any, **kwargs: Any) -> Any:
        deadlines[rid.split("/")[0]] = kwargs["deadline_s"]
        return inner(rid, *args, **kwargs)

    core.engine.add_request = add_request  # type: ignore[method-assign]
    core.step()
    # a hop's deadline runs from when it was due: those that waited longest go first
    assert deadlines == {"b": -3.0 + 1.0, "c": -2.0 + 1.0}
    hops = {sid: s.hop for sid, s in sessions.items()}  # type: ignore[union-attr]
    assert hops["b"] is not None and hops["c"] is not None and hops["a"] is None
    assert hops["b"].due_s == -3.0 and hops["c"].due_s == -2.0
    waited = (hops["b"].submitted_s + 3.0) + (hops["c"].submitted_s + 2.0)
    assert core.live_hop_wait_s == pytest.approx(waited)
    out: list[tuple[str, Event]] = []
    run_to_idle(core, out)  # "a" goes next; every hop finishes
    assert sessions["a"].hop is None and core.live_hop_wait_s > waited
    assert len(durations) == 3 and sorted(durations)[-1] > 3.0  # "b": due 3 s before 0
    stats = core.stats()
    assert stats is not None and stats.live_hop_wait_s == core.live_hop_wait_s
    # each hop's first sampled id came after its submission and before its end
    assert 0 < stats.live_hop_first_token_s < stats.live_hop_s
    for sid in ("a", "b", "c"):
        core.abort(sid)
    assert_pool_clean(core)


def test_the_forced_prefix_is_a_token_prefix_of_the_transcript_going_on() -> None:
    """Token healing: the prefix stops before its last `]`, so its ids begin the canonical
    tokenization of the transcript as the model goes on writing it (`][` merges the end
    stamp's `]` with the next `[`; a lone `]` there would precede only the end of output)."""
    from livemeet.session.live import LiveOptions, LiveSession

    tok = load_tokenizer(None)

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    a = Segment(start_s=0.0, end_s=1.2, speaker="S01", text="Hello there.")
    b = Segment(start_s=1.2, end_s=2.5, speaker="S02", text="你好")
    c = Segment(start_s=2.5, end_s=3.1, speaker="S01", text="Okay then")
    sess = LiveState(SessionOptions(live=True), LiveSession(LiveOptions()))
    sess.live = SimpleNamespace(committed=(a, b))  # type: ignore[assignment]
    prefix = sess.forced_transcript_ids(encode, 2_048)
    for going_on in (render_segment(c), ""):
        whole = encode(render_segment(a) + render_segment(b) + going_on)
        assert whole[: len(prefix)] == prefix and len(whole) > len(prefix)
    assert sess.prefix_segments == (a, b)


def test_forced_transcript_is_the_most_recent_whole_segments_within_the_cap() -> None:
    """The cap keeps the newest whole segments whose ids fit; the ids are rebuilt only when a
    segment commits, from each segment's two tokenizations made once (first of the run, and
    after a `]`: livemeet/transcript/pieces.py); the joined text is never tokenized."""
    from livemeet.session.live import LiveOptions, LiveSession

    calls: list[str] = []

    def encode(text: str) -> list[int]:  # one id per character
        calls.append(text)
        return [ord(c) for c in text]

    sess = LiveState(SessionOptions(live=True), LiveSession(LiveOptions()))
    committed = [
        Segment(start_s=1.0 * i, end_s=i + 0.5, speaker=f"S0{1 + i % 2}", text=f"w{i}")
        for i in range(6)
    ]
    rendered = [render_segment(s) for s in committed]
    assert len(set(map(len, rendered))) == 1  # each "[ss.ss][S0n] wi[ee.ee]": equal lengths
    one = len(rendered[0])
    fake = SimpleNamespace(committed=())
    sess.live = fake  # type: ignore[assignment]
    assert sess.forced_transcript_ids(encode, 3 * one) == []  # nothing committed yet
    fake.committed = tuple(committed[:4])
    ids = sess.forced_transcript_ids(encode, 3 * one + 5)
    # newest three, whole but for the closing `]` (token healing)
    assert "".join(map(chr, ids)) == "".join(rendered[1:4])[:-1]
    assert sess.prefix_segments == tuple(committed[1:4])
    n = len(calls)
    assert sess.forced_transcript_ids(encode, 3 * one + 5) == ids and len(calls) == n  # cached
    fake.committed = tuple(committed)
    ids = sess.forced_transcript_ids(encode, 3 * one + 5)
    assert "".join(map(chr, ids)) == "".join(rendered[3:6])[:-1]
    assert len(calls) == n + 2 * 2  # the two new segments, two tokenizations each
    # a new budget (ForcedBudget adapts it to load) rebuilds from the pieces, tokenizing
    # nothing: a smaller one keeps the newest segments that fit, a larger one more
    assert (
        "".join(map(chr, sess.forced_transcript_ids(encode, 2 * one)))
        == "".join(rendered[4:6])[:-1]
    )
    assert sess.prefix_segments == tuple(committed[4:6])
    assert sess.forced_transcript_ids(encode, 3 * one + 5) == ids
    assert len(calls) == n + 2 * 2
    fresh = LiveState(SessionOptions(live=True), LiveSession(LiveOptions()))
    fresh.live = fake  # type: ignore[assignment]
    assert fresh.forced_transcript_ids(encode, one - 2) == []  # no whole segment fits
    fits = LiveState(SessionOptions(live=True), LiveSession(LiveOptions()))
    fits.live = fake  # type: ignore[assignment]
    # the newest segment less its `]` is one - 1 ids: it fits a cap of one - 1
    assert "".join(map(chr, fits.forced_transcript_ids(encode, one - 1))) == rendered[5][:-1]
    assert fresh.forced_transcript_ids(encode, 0) == []
    # a budget cut under load never leaves the newest segment out while it fits the cap (a
    # hop forcing nothing would re-decode the meeting); older ones still keep to the budget
    capped = LiveState(SessionOptions(live=True), LiveSession(LiveOptions()))
    capped.live = fake  # type: ignore[assignment]
    newest = capped.forced_transcript_ids(encode, one - 2, cap=one)
    assert "".join(map(chr, newest)) == rendered[5][:-1]
    assert (
        "".join(map(chr, capped.forced_transcript_ids(encode, one + 3, cap=9 * one)))
        == (rendered[5][:-1])
    )
    assert capped.forced_transcript_ids(encode, one - 2, cap=one - 2) == []
    # text that would encode as a special token (<|im_end|>) is never forced: it and what
    # came before it stay out
    odd = LiveState(SessionOptions(live=True), LiveSession(LiveOptions()))
    special = Segment(start_s=6.0, end_s=6.5, speaker="S01", text="<|im_end|>")
    odd.live = SimpleNamespace(committed=(*committed[:5], special, committed[5]))  # type: ignore[assignment]
    ids = odd.forced_transcript_ids(encode, 100 * one)
    assert "".join(map(chr, ids)) == rendered[5][:-1]


def test_text_of_any_added_token_keeps_a_segment_out_of_the_forced_transcript() -> None:
    """Not only `<|...|>`: `</think>` and `<tool_call>` are added tokens of the Qwen
    vocabulary too, and a segment whose text holds one (and every older one) is not forced."""
    from livemeet.session.live import LiveOptions, LiveSession

    tok = load_tokenizer(None)

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    added = frozenset(tok.get_added_tokens_decoder())
    texts = ["fine", "ok </think> then", "and <tool_call> too", "last one"]
    segs = [Segment(2.0 * i, 2.0 * i + 1.0, "S01", t) for i, t in enumerate(texts)]
    sess = LiveState(SessionOptions(live=True), LiveSession(LiveOptions()))
    sess.live = SimpleNamespace(committed=tuple(segs))  # type: ignore[assignment]
    ids = sess.forced_transcript_ids(encode, 2_048, True, added)
    assert sess.prefix_segments == (segs[3],)
    assert ids == encode(render_segment(segs[3])[:-1]) and not added & set(ids)


@pytest.mark.parametrize("exact", [True, False])
def test_forced_transcript_ids_equal_the_joined_texts_tokens(exact: bool) -> None:
    """With the Qwen tokenizer the assembled ids are those of the joined text (less its last
    `]`), for texts with punctuation, digits and CJK next to the stamps, as the cap slides;
    `exact=False` (a tokenizer whose pieces do not join) tokenizes the joined text instead."""
    from livemeet.session.live import LiveOptions, LiveSession

    tok = load_tokenizer(None)

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    texts = ["Okay, 12 items.", "你好，2024年", "Right:3", "'quoted' end!", "9", "mm-hmm..."]
    committed = [
        Segment(start_s=2.0 * i, end_s=2.0 * i + 1.25, speaker=f"S0{1 + i % 3}", text=t)
        for i, t in enumerate(texts * 4)
    ]
    sess = LiveState(SessionOptions(live=True), LiveSession(LiveOptions()))
    fake = SimpleNamespace(committed=())
    sess.live = fake  # type: ignore[assignment]
    for n in range(1, len(committed) + 1):
        fake.committed = tuple(committed[:n])
        ids = sess.forced_transcript_ids(encode, 60, exact)
        kept = sess.prefix_segments
        assert kept == tuple(committed[n - len(kept) : n]) and 0 < len(ids) <= 60
        assert ids == encode("".join(render_segment(s) for s in kept)[:-1])
        older = committed[n - len(kept) - 1 : n] if len(kept) < n else None
        if older:  # one segment more would not have fitted
            assert len(encode("".join(render_segment(s) for s in older)[:-1])) > 60


def test_live_audio_grows_in_place_and_hashes_each_window_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A live session's audio is append-only: `audio_to` returns the samples heard so far
    without copying the whole meeting per hop, and each full window's encoder-cache key is
    computed once for the session, then handed to every later hop."""
    import livemeet.engine.encoder_runner as er
    from livemeet.session.live import LiveOptions, LiveSession

    rng = np.random.default_rng(4)
    audio = (0.1 * rng.standard_normal(16_000 * 95)).astype(np.float32)
    sess = LiveState(SessionOptions(live=True), LiveSession(LiveOptions(hop_s=1.0)))
    hashed: list[int] = []
    real = er.window_key
    monkeypatch.setattr(er, "window_key", lambda w: hashed.append(1) or real(w))
    fed = 0
    for edge_s in (7, 31, 33, 61, 95):
        edge = 16_000 * edge_s
        for piece in np.array_split(audio[fed:edge], 3):  # uneven chunks, as a client sends
            sess.chunks.append(piece)
        fed = edge
        heard = sess.audio_to(edge)
        np.testing.assert_array_equal(heard, audio[:edge])
        keys = sess.full_window_keys(heard)
        assert len(keys) == edge // (16_000 * 30)
    assert len(hashed) == 3  # windows 0, 1 and 2, each once over five hops
    assert keys == er.full_window_keys(audio)
    assert sess.audio_to(16_000 * 200).size == audio.size  # an edge past the audio: all of it


def test_live_sessions_hold_their_full_windows_until_they_end(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """Each live session holds its full windows in the encoder cache from its first hop past
    30 s until it ends or is aborted (so a hop re-encodes only the partial window, whatever
    passes through the LRU meanwhile); then nothing is held and the pool is clean."""
    core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)
    engine = core.engine
    assert engine is not None
    out: list[tuple[str, Event]] = []
    for sid in ("ended", "aborted"):
        core.open(sid, SessionOptions(live=True, hop_s=4.0))
    audio = clips[40.0]
    for start in range(0, audio.size, 4 * SAMPLE_RATE):
        for sid in ("ended", "aborted"):
            core.append(sid, audio[start : start + 4 * SAMPLE_RATE])
        run_to_idle(core, out)
    held = engine.encoder.num_held_windows
    assert held == 1  # one full window, the same audio: both sessions hold one key
    encoded = engine.encoder.num_encoded_windows
    core.append("ended", audio[: 4 * SAMPLE_RATE])  # one more hop: the partial window only
    run_to_idle(core, out)
    assert engine.encoder.num_encoded_windows == encoded + 1
    core.end("ended")
    run_to_idle(core, out)
    assert any(isinstance(e, TranscriptFinal) for s, e in out if s == "ended")
    assert engine.encoder.num_held_windows == 1  # still held by the other session
    core.abort("aborted")
    assert engine.encoder.num_held_windows == 0
    stats = core.stats()  # the hops and the windows they encoded, for /metrics
    assert stats is not None and stats.num_live_hops >= 2 * 10 and stats.live_hop_s > 0
    assert stats.num_encoded_windows == engine.encoder.num_encoded_windows
    assert engine.encoder._holds == {} and engine.encoder._holders == {}
    assert_pool_clean(core)


@pytest.mark.slow
def test_a_hops_work_does_not_grow_with_the_meeting(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path, monkeypatch: Any
) -> None:
    """Over 100 s of meeting in 5-s hops, each hop prefills at most the audio since the last
    window complete at the previous hop (forked KV covers the rest) plus its forced
    transcript, and encodes at most the partial window and one window completed since: no
    per-hop cost may grow with the meeting (session 15: the encoder's did, and 100 live
    sessions fell minutes behind). The forced reference covers the whole clip, so the forced
    prefix grows; it is counted apart."""
    forced = "".join(f"[{t:.2f}][S0{1 + (t // 5) % 2}] w{t}[{t + 4:.2f}]" for t in range(0, 100, 5))
    core = make_core(our_model, tmp_path, forced=forced)
    engine = core.engine
    assert engine is not None
    engine.encoder.cache_windows = 1  # the LRU cannot keep the meeting: only the holds can
    hops: list[tuple[int, int]] = []  # (prefilled tokens less the forced prefix, encoded)
    real_add = engine.add_request

    def spy(rid: str, samples: np.ndarray, **kw: Any) -> Any:
        encoded = engine.encoder.num_encoded_windows
        request = real_add(rid, samples, **kw)
        prefix = len(kw.get("prefix_token_ids", ()))
        hops.append((request.num_prompt_tokens - request.num_cached_tokens - prefix, encoded))
        return request

    monkeypatch.setattr(engine, "add_request", spy)
    events = stream_live(core, clips[100.0], head_s=5.0, chunk_s=5.0, hop_s=5.0)
    assert isinstance(events[-1], TranscriptFinal)
    counts = [b - a for (_, a), (_, b) in zip(hops, hops[1:], strict=False)]
    assert len(hops) >= 19
    assert max(counts) <= 2  # windows encoded between two hops: the partial one, one completed
    prefilled = [p for p, _ in hops[1:]]  # the first hop prefills everything
    assert max(prefilled) <= 2 * 375 + 64  # two windows' tokens, time markers, prompt tail
    assert max(prefilled[-5:]) <= max(prefilled[:8]) + 64, prefilled
    assert_pool_clean(core)


def test_a_live_chunk_with_nan_is_rejected_whole_and_the_session_goes_on(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """Live audio is checked once, as it arrives (hops then skip the scan): a chunk holding a
    NaN or an infinity is BadAudio and none of it is kept, so no hop can carry it into the
    engine's step, where it could not be pinned on the session."""
    core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)
    core.open("L", SessionOptions(live=True, hop_s=2.0))
    audio = clips[11.0]
    out: list[tuple[str, Event]] = []
    core.append("L", audio[: 4 * SAMPLE_RATE])
    run_to_idle(core, out)
    for bad in (np.nan, np.inf):
        chunk = audio[4 * SAMPLE_RATE : 6 * SAMPLE_RATE].copy()
        chunk[10] = bad
        with pytest.raises(BadAudio, match="NaN or infinite"):
            core.append("L", chunk)
    core.append("L", audio[4 * SAMPLE_RATE :])
    core.end("L")
    run_to_idle(core, out)
    final = out[-1][1]
    assert isinstance(final, TranscriptFinal) and final.duration_s == pytest.approx(11.0)
    assert_pool_clean(core)


@pytest.mark.parametrize("pieces_join", [True, False])
def test_forced_hop_ids_are_the_words_spoken_between_cut_and_edge(
    tmp_path: Path, pieces_join: bool
) -> None:
    """A benchmark hop's forced ids are those of what a perfect model writes (after a `]` when
    the hop follows a forced transcript): for each reference segment in order, its words (at
    a uniform rate over it) ending after the cut and by the edge; a segment the cut falls in
    goes on from the cut as a new one; one still being spoken stays open (no end stamp) and
    ends the output. Whole segments come from ids tokenized once at load (or the joined text
    re-encoded, for a tokenizer whose pieces do not join); while the last segment is open a
    hop's ids are a prefix of a later hop's, also where mixed-width text renders without the
    leading space."""
    tok = load_tokenizer(None)
    texts = ["Okay, 12 items.", "你好", "Right:3", "", "fine one two", "Hello 世界 again"]
    segments = [
        Segment(start_s=3.0 * i, end_s=3.0 * i + 2.5, speaker=f"S0{1 + i % 2}", text=t)
        for i, t in enumerate(texts * 3)
    ]
    path = tmp_path / "forced.txt"
    path.write_text("".join(render_segment(s) for s in segments), encoding="utf-8")
    core = MossCore(ModelConfig(), engine=SimpleNamespace(tokenizer=tok))  # type: ignore[arg-type]
    core._load_forced(path)
    core._exact_pieces = pieces_join
    assert core._forced is not None and len(core._forced) >= 12
    segments = core._forced  # as parsed from the file (the empty text is not a segment)

    def expected(edge_s: float, tail_from_s: float | None) -> list[int]:
        after = -1.0 if tail_from_s is None else tail_from_s
        text = "" if tail_from_s is None else "]"
        for s in segments:
            words = s.text.split()
            step = (s.end_s - s.start_s) / len(words)
            ends = [s.start_s + (i + 1) * step for i in range(len(words))]
            left = [i for i, t in enumerate(ends) if t > after + 1e-6]
            spoken = [i for i in left if ends[i] <= edge_s + 1e-6]
            if left and not spoken:
                break
            if not left:
                continue
            start = s.start_s if len(left) == len(words) else after
            wide = any(unicodedata.east_asian_width(c) in "WF" for c in s.text)
            text += f"[{start:.2f}][{s.speaker}]" + ("" if wide else " ")
            text += " ".join(words[i] for i in spoken)
            if len(spoken) < len(left):
                break  # open: no end stamp, nothing after it
            text += f"[{s.end_s:.2f}]"
        return list(tok.encode(text).ids)

    in_progress = resumed = 0
    for tail_from_s in (None, 0.0, 1.0, 4.0, 10.1, 13.0, 16.0):
        earlier: list[int] = []
        for edge_s in np.arange(0.0, 52.0, 0.25):
            if tail_from_s is not None and edge_s <= tail_from_s:
                continue
            ids = core._forced_ids(float(edge_s), tail_from_s)
            assert ids == expected(float(edge_s), tail_from_s), (edge_s, tail_from_s)
            text = tok.decode(ids)
            if earlier:  # the last hop ended in an open segment: this one goes on from it
                assert ids[: len(earlier)] == earlier, (edge_s, tail_from_s)
            earlier = ids if ids and not text.endswith("]") else []
            in_progress += bool(earlier)
            resumed += tail_from_s in (1.0, 13.0, 16.0) and f"[{tail_from_s:.2f}]" in text
        assert core._forced_ids(1e9, tail_from_s) == expected(1e9, tail_from_s)
    assert in_progress > 50 and resumed > 20  # both paths ran many times


@pytest.mark.parametrize("finalize_at", [47_840, 47_920])  # samples: 2.990 s and 2.995 s
def test_a_word_spoken_between_an_off_grid_finalize_and_end_reaches_the_final(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path, finalize_at: int
) -> None:
    """`finalize` at 2.995 s cuts inside a turn whose word "b" ends at 3.000 s, where `end`
    comes: the end hop writes "b" from the cut's stamp rounded up, 3.00, the audio edge. A
    start stamp at the edge was dropped as past the audio, and with it the last word (found by
    a review); one within a stamp step of the edge is kept. At 2.990 s the stamp is before the
    edge (the case that always worked)."""
    core = make_core(our_model, tmp_path, forced="[1.00][S01] a b c d[5.00]")
    core.open("L", SessionOptions(live=True, hop_s=1.0))
    audio = clips[11.0]
    out: list[tuple[str, Event]] = []
    core.append("L", audio[:finalize_at])
    run_to_idle(core, out)
    core.finalize("L")
    run_to_idle(core, out)
    core.append("L", audio[finalize_at : 3 * SAMPLE_RATE])
    core.end("L")
    run_to_idle(core, out)
    final = out[-1][1]
    assert isinstance(final, TranscriptFinal)
    assert " ".join(seg.text for seg in final.segments) == "a b"
    assert all(seg.end_s <= 3.0 for seg in final.segments)
    assert_pool_clean(core)


def live_runs_without_and_with(
    option: str,
    model: MossTDModel,
    tmp_path: Path,
    audio: np.ndarray,
    *,
    values: tuple[object, object] = (False, True),
    **stream: float,
) -> list[tuple[list[Event], EngineStats]]:
    """`stream_live` of `audio` on a forced-output core with ModelConfig `option` off, then
    on (`values`): each run's events and stats, the pool checked clean after each."""
    runs = []
    for value in values:
        core = make_core(model, tmp_path, forced=LIVE_REFERENCE, **{option: value})
        events = stream_live(core, audio, **stream)
        stats = core.stats()
        assert stats is not None
        runs.append((events, stats))
        assert_pool_clean(core)
    return runs


@pytest.mark.slow
def test_live_drafts_change_no_event_and_save_decode_steps(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """Each hop drafts what the previous one decoded after the same forced transcript
    (livemeet/session/draft.py): the events are the same as without drafts, most draft ids
    are accepted (forced output: the tail repeats exactly), and fewer decode rows run."""
    runs = live_runs_without_and_with(
        "live_draft", our_model, tmp_path, clips[11.0], head_s=2.0, chunk_s=1.0, hop_s=1.0
    )
    (plain, plain_stats), (drafted, stats) = runs
    assert drafted == plain
    assert plain_stats.num_draft_tokens == 0
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_draft_tokens >= 0.8 * stats.num_draft_tokens
    saved = plain_stats.num_decode_tokens - stats.num_decode_tokens
    assert saved >= stats.num_accepted_draft_tokens > 0


@pytest.mark.slow
def test_live_segments_closed_mid_hop_go_out_before_the_hop_ends(
    our_model: MossTDModel,
    clips: dict[float, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A segment a hop closes goes out as a partial right away (LiveSession.preview, from the
    token that closes it), not when the hop ends. 1-s chunks until both speakers are in the
    forced transcript, then 4.5 s at once: that hop decodes two new segments after it. The
    meeting's finals are the same as with previews off, and every partial keeps the
    reference's labels."""
    previews: list[Event] = []
    real = LiveSession.preview

    def recorded(self: LiveSession, *args: Any, **kwargs: Any) -> list[Event]:
        events = real(self, *args, **kwargs)
        previews.extend(events)
        return events

    runs = []
    for on in (False, True):
        core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)
        preview = recorded if on else (lambda self, *a, **k: [])
        monkeypatch.setattr(LiveSession, "preview", preview)
        sizes = [2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.5]
        runs.append(stream_chunks(core, clips[11.0], sizes, hop_s=1.0))
        assert_pool_clean(core)
    plain, early = runs
    assert previews and all(isinstance(e, SegmentPartial) for e in previews)
    assert [e for e in early if isinstance(e, SegmentFinal)] == [
        e for e in plain if isinstance(e, SegmentFinal)
    ]
    assert early[-1] == plain[-1]  # the same TranscriptFinal
    want = {s.text: s.speaker for s in parse_transcript(LIVE_REFERENCE)}
    seen: set[str] = set()
    first_by_preview = 0
    for e in early:
        if isinstance(e, SegmentPartial):
            assert e.rev == 1 + sum(isinstance(x, SegmentPartial) for x in early[: early.index(e)])
            new = {s.text for s in e.segments} - seen
            first_by_preview += bool(new) and any(e is p for p in previews)
            assert all(want[s.text] == s.speaker for s in e.segments)
        segs = e.segments if isinstance(e, SegmentPartial) else ()
        seen |= {s.text for s in segs}
    assert first_by_preview > 0  # some segment was first shown by a preview


@pytest.mark.slow
@pytest.mark.parametrize("vad", list(LiveVad))
def test_live_vad_decodes_at_speech_ends_and_commits_the_same(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path, vad: LiveVad
) -> None:
    """With the session's VAD (livemeet/session/vad.py), either of them, hops also fall due
    where speech ends in the real-speech clip: they are counted, and the meeting's final
    transcript is the one without VAD (the forced output fixes what each edge holds)."""
    if vad is LiveVad.SILERO:
        pytest.importorskip("faster_whisper")
    runs = live_runs_without_and_with(
        "live_vad",
        our_model,
        tmp_path,
        clips[11.0],
        values=(None, vad),
        head_s=0.5,
        chunk_s=0.25,
        hop_s=2.0,
    )
    (plain, plain_stats), (voiced, stats) = runs
    assert plain_stats.num_live_endpoint_hops == 0
    assert stats.num_live_endpoint_hops > 0
    # an early hop restarts the count to the next whole hop: at most one extra hop each
    hops, plain_hops = stats.num_live_hops, plain_stats.num_live_hops
    assert plain_hops <= hops <= plain_hops + stats.num_live_endpoint_hops
    final, plain_final = voiced[-1], plain[-1]
    assert isinstance(final, TranscriptFinal) and isinstance(plain_final, TranscriptFinal)
    assert [(s.start_s, s.end_s, s.text) for s in final.segments] == [
        (s.start_s, s.end_s, s.text) for s in plain_final.segments
    ]


@pytest.mark.slow
def test_live_decode_only_steps_change_no_event(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    """Two live sessions, B's hop queued while A's decodes: with decode-only steps between
    prefills (SchedulerConfig.live_decode_steps) A's row takes steps of its own before B's
    prefill, more steps run, and every event of both sessions is the one without them."""
    audio, chunk = clips[11.0], 2 * SAMPLE_RATE
    runs = []
    for decode_steps in (0, 2):
        scheduler = SchedulerConfig(live_decode_steps=decode_steps)
        core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE, scheduler=scheduler)
        out: list[tuple[str, Event]] = []
        for sid in "AB":
            core.open(sid, SessionOptions(live=True, hop_s=2.0))
        for i in range(0, len(audio), chunk):
            core.append("A", audio[i : i + chunk])
            out.extend(core.step())  # A's hop is prefilled and decodes from here
            core.append("B", audio[i : i + chunk])
            run_to_idle(core, out)
        for sid in "AB":
            core.end(sid)
        run_to_idle(core, out)
        stats = core.stats()
        assert stats is not None
        runs.append((out, stats))
        assert_pool_clean(core)
    (plain, plain_stats), (interleaved, stats) = runs
    for sid in "AB":
        events = [e for s, e in interleaved if s == sid]
        assert events == [e for s, e in plain if s == sid]
        assert isinstance(events[-1], TranscriptFinal) and events[-1].segments
    assert stats.num_decode_steps > plain_stats.num_decode_steps


# -- restored live sessions (a restarted server, DESIGN 5.9) -----------------------------------


def stream_restored(
    core: MossCore, audio: np.ndarray, stored: tuple[Segment, ...], head_s: float
) -> list[Event]:
    """A live session re-opened from `stored`: the first `head_s` of `audio` again at once (as
    the gateway re-sends stored audio), then 1 s chunks, stepping to idle after each."""
    core.open("L", SessionOptions(live=True, hop_s=1.0, restore=LiveRestore(stored)))
    out: list[tuple[str, Event]] = []
    head = round(head_s * SAMPLE_RATE)
    core.append("L", audio[:head])
    run_to_idle(core, out)
    for i in range(head, len(audio), SAMPLE_RATE):
        core.append("L", audio[i : i + SAMPLE_RATE])
        run_to_idle(core, out)
    core.end("L")
    run_to_idle(core, out)
    return [e for s, e in out if s == "L"]


@pytest.mark.slow
@pytest.mark.parametrize("budget", [0, 2_048])
def test_a_restored_live_session_forces_its_finals_and_never_sends_them_again(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path, budget: int
) -> None:
    """A live session re-opened from its first two stored finals and sent all its audio again
    from 0: its first hop forces those finals as the transcript so far (DESIGN 5.3; none with
    a forced budget of 0, whose hops re-decode the whole meeting and have the restored turns
    cut off after them), none of them comes out again, and the transcript is the
    uninterrupted session's, ids included."""
    whole = make_core(
        our_model, tmp_path, forced=LIVE_REFERENCE, live_forced_transcript_tokens=budget
    )
    want = stream_live(whole, clips[11.0], head_s=2.0, chunk_s=1.0, hop_s=1.0)[-1]
    assert isinstance(want, TranscriptFinal) and len(want.segments) == 5
    stored = want.segments[:2]  # to 4.0 s
    core = make_core(
        our_model, tmp_path, forced=LIVE_REFERENCE, live_forced_transcript_tokens=budget
    )
    prefixes = record_prefixes(core)
    events = stream_restored(core, clips[11.0], stored, head_s=6.0)
    first = prefixes["L/hop000000"]
    assert core.engine is not None
    if budget:
        text = core.engine.tokenizer.decode(first)
        assert not text.endswith("]")  # token healing: the decode writes the last `]`
        forced = parse_transcript(text + "]")
        assert [(s.speaker, s.text, s.start_s, s.end_s) for s in forced] == [
            (s.speaker, s.text, s.start_s, s.end_s) for s in stored
        ]
    else:
        assert not any(prefixes.values())
    new = [e.segment for e in events if isinstance(e, SegmentFinal)]
    assert not {s.id for s in new} & {s.id for s in stored}
    assert not {s.text for s in new} & {s.text for s in stored}
    final = events[-1]
    assert isinstance(final, TranscriptFinal)
    assert final.segments == (*stored, *new) == want.segments
    assert_pool_clean(core)


def test_a_restore_is_for_live_sessions_and_its_finals_are_checked(
    our_model: MossTDModel, tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path)
    stored = (Segment(0.0, 1.0, "S01", "a", id="seg-0001", is_final=True),)
    with pytest.raises(InvalidRequest, match="restore is for live sessions"):
        core.open("x", SessionOptions(live=False, restore=LiveRestore(stored)))
    unchecked = object.__new__(LiveRestore)  # as unpickled in the worker: no __post_init__
    object.__setattr__(unchecked, "finals", stored * 2)
    with pytest.raises(InvalidRequest, match="repeats the id"):
        core.open("x", SessionOptions(restore=unchecked))
    core.open("x", SessionOptions(restore=LiveRestore(stored)))
    live = core._sessions["x"].live  # type: ignore[union-attr]
    assert live.committed == stored
    core.abort("x")
