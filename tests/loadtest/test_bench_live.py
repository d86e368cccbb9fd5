"""bench_live: the latency bookkeeping on made-up logs, and the benchmark end to end against a
real `livemeet serve` running the scripted backend on the same reference (CPU)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pytest

from livemeet.cli import live_client
from livemeet.models.tokenizer import load_tokenizer
from livemeet.transcript.segments import Segment
from loadtest import bench_live
from loadtest import workloads as wl
from loadtest.bench_live import (
    FRAME_S,
    SegmentLatency,
    SessionLog,
    engine_by_time,
    first_word_times,
    frame_of,
    latencies_after,
    latency_by_time,
    meeting_s,
    message_segments,
    scrape_every,
    segment_latencies,
    send_lag_s,
    spoken_at,
    word_latencies,
)
from tests.loadtest.conftest import run_module

TURNS = (wl.Turn(0, 0.0, 1.25), wl.Turn(1, 1.3, 2.0), wl.Turn(0, 2.1, 2.6), wl.Turn(1, 2.7, 3.5))


def on_time_log(num_frames: int, t0: float = 100.0) -> SessionLog:
    """Every frame sent exactly when due: frame k at t0 + (k + 1) FRAME_S."""
    return SessionLog(t0=t0, sent=[t0 + (k + 1) * FRAME_S for k in range(num_frames)])


def final_phase_text(engine: tuple[float, int], hold: tuple[float, int]) -> str:
    """A /metrics text with livemeet_live_final_seconds' sum and count per phase."""
    lines = ["# TYPE livemeet_live_final_seconds histogram"]
    for phase, (total, n) in (("engine", engine), ("hold", hold)):
        lines.append(f'livemeet_live_final_seconds_sum{{phase="{phase}"}} {total}')
        lines.append(f'livemeet_live_final_seconds_count{{phase="{phase}"}} {n}.0')
    return "\n".join(lines) + "\n"


def test_final_phases_are_the_means_over_the_point() -> None:
    before = final_phase_text((2.0, 4), (0.2, 4))
    after = final_phase_text((8.0, 8), (1.0, 8))  # 4 finals: 1.5 s engine, 0.2 s hold each
    fields = bench_live.final_phase_fields(before, after)
    assert fields["final_phase_mean_s"] == pytest.approx({"engine": 1.5, "hold": 0.2})
    assert bench_live.final_phase_fields(None, after) == {}
    assert bench_live.final_phase_fields(before, before) == {}  # no final during the point


def test_frames_hold_the_audio_just_before_a_time() -> None:
    assert frame_of(0.0) == 0
    assert frame_of(0.05) == 0
    assert frame_of(0.1) == 0  # the sample just before 0.1 s is the last of frame 0
    assert frame_of(0.10001) == 1
    assert frame_of(1.25) == 12
    assert frame_of(2.0) == 19


def test_spoken_at_is_real_time_unless_the_client_sent_late() -> None:
    log = on_time_log(30)
    assert spoken_at(log, 1.25) == pytest.approx(101.25)
    log.sent[12] += 0.4  # frame 12 (1.2-1.3 s) went out 0.4 s late
    assert spoken_at(log, 1.25) == pytest.approx(101.65)
    assert spoken_at(log, 5.0) == float("inf")  # never sent
    assert send_lag_s(log) == pytest.approx(0.4)


def test_segment_latencies_count_live_late_and_missed_segments() -> None:
    log = on_time_log(35)  # 3.5 s of audio
    log.events = [
        (101.5, "segment.partial", [(0.0, 1.25)]),  # turn 0, 0.25 s after it was spoken
        (102.05, "segment.partial", [(0.0, 1.25), (1.3, 1.9)]),  # a cut turn 1: no match yet
        (102.4, "segment.final", [(1.3, 2.0)]),  # turn 1 whole, 3-decimal protocol times
        (102.9, "segment.partial", [(1.3004, 2.0005), (2.1, 2.6)]),  # turn 2; turn 1 again
    ]
    log.end_sent = 103.6
    log.events.append((104.0, "transcript.final", [(0.0, 1.25), (1.3, 2.0), (2.7, 3.5)]))
    log.final_at = 104.0
    assert log.final_after_end_s() == pytest.approx(0.4)
    got = segment_latencies(TURNS, log, audio_s=3.5)
    assert got.expected == 4
    # turn 3 only in the final transcript: counted after `end`, its latency kept
    assert got.latencies == pytest.approx((0.25, 0.4, 0.3, 0.5))
    assert got.end_times == (1.25, 2.0, 2.6, 3.5)
    assert (got.after_end, got.missed) == (1, 0)
    # a shorter stream does not expect the turns that end past it; a turn never sent is missed
    shorter = segment_latencies(TURNS, SessionLog(t0=100.0, sent=[], events=[]), audio_s=2.0)
    assert (shorter.expected, shorter.missed, shorter.latencies) == (2, 2, ())
    # shown, but its audio never went out (a session that failed mid-stream): missed, no -inf
    unsent = SessionLog(t0=100.0, sent=[100.1], events=[(101.0, "segment.final", [(0.0, 1.25)])])
    assert segment_latencies(TURNS[:1], unsent, audio_s=1.25).missed == 1


def test_word_latencies_count_each_word_from_its_own_end() -> None:
    """A word counts from its end (`word_end_times`: uniform over its segment) to the first
    message holding its segment's start and at least the words up to it: an open partial
    segment shows the first ones before the segment ends."""
    reference = [Segment(0.0, 1.5, "S01", "one two three"), Segment(2.0, 3.0, "S02", "four five")]
    log = on_time_log(35)
    log.events = [
        (100.8, "segment.partial", [(0.0, 0.6, 1)]),  # "one" (ended 0.5 s), open
        (101.3, "segment.partial", [(0.0, 1.2, 2)]),  # "one two" (two ended 1.0 s)
        (101.9, "segment.final", [(0.0, 1.5, 3)]),  # whole: "three" ended 1.5 s
        (102.7, "segment.partial", [(2.05, 2.6, 1)]),  # another start: not segment 2
    ]
    log.end_sent = 103.5
    log.events.append((103.8, "transcript.final", [(0.0, 1.5, 3), (2.0, 3.0, 2)]))
    got = word_latencies(reference, log, audio_s=3.5)
    assert got.expected == 5 and got.missed == 0 and got.after_end == 2
    assert got.end_times == pytest.approx((0.5, 1.0, 1.5, 2.5, 3.0))
    assert got.latencies == pytest.approx((0.3, 0.3, 0.4, 1.3, 0.8))
    # the first time each count was reached, whatever the order of the references; a later
    # partial with fewer words (retracted) or more than the reference holds changes nothing
    log.events.insert(3, (102.0, "segment.partial", [(2.0, 2.4, 9), (0.0, 1.5, 1)]))
    assert first_word_times(reference[::-1], log) == [[102.0, 102.0], [100.8, 101.3, 101.9]]
    # a head start leaves out words ending within it; a stream cut short expects fewer
    assert word_latencies(reference, log, audio_s=3.5, from_s=1.0).expected == 3
    assert word_latencies(reference, log, audio_s=1.2).expected == 2
    # message_segments reads each segment's word count from its text
    msg = {"type": "segment.partial", "segments": [{"start": 2.0, "end": 2.6, "text": " a b "}]}
    assert message_segments(msg) == [(2.0, 2.6, 2)]


def test_a_head_start_is_left_out_of_latency_and_send_lag() -> None:
    """Frames of a head start go out ahead of real time: they are not late, and segments
    ending within the head do not count; after it, frame k is due at t0 + (k + 1) FRAME_S."""
    log = on_time_log(35)
    log.head_frames = 20  # the first 2 s were streamed fast, 1.5 s early at most
    for k in range(20):
        log.sent[k] = log.t0 + 1.5 + (k + 1) * FRAME_S / 4
    assert send_lag_s(log) == pytest.approx(0.0)
    log.events = [(103.0, "segment.final", [(0.0, 1.25), (1.3, 2.0), (2.1, 2.6)])]
    got = segment_latencies(TURNS, log, audio_s=3.5, from_s=2.0)
    assert got.expected == 2 and got.end_times == (2.6,) and got.missed == 1
    assert got.latencies == pytest.approx((103.0 - 102.6,))


def test_meeting_time_runs_fast_through_the_head_then_in_real_time() -> None:
    assert meeting_s(10.0) == 10.0
    assert meeting_s(10.0, head_s=300.0, head_speed=4.0) == 40.0
    assert meeting_s(75.0, head_s=300.0, head_speed=4.0) == 300.0
    assert meeting_s(100.0, head_s=300.0, head_speed=4.0) == 325.0
    # a pause after the head holds the meeting at the head's end, then real time goes on
    assert meeting_s(80.0, head_s=300.0, head_speed=4.0, head_pause_s=60.0) == 300.0
    assert meeting_s(160.0, head_s=300.0, head_speed=4.0, head_pause_s=60.0) == 325.0
    assert meeting_s(10.0, head_pause_s=60.0) == 10.0  # no head, no pause


@pytest.mark.parametrize(
    "flags",
    [["--head-pause-s", "-1"], ["--head-start-s", "-1"], ["--head-speed", "0.5"]],
)
def test_head_flags_out_of_range_are_refused_before_any_work(flags: list[str]) -> None:
    with pytest.raises(SystemExit, match="--head-pause-s must be >= 0"):
        asyncio.run(bench_live.amain(bench_live.parse_args(flags)))


def test_latencies_after_keep_what_ends_from_a_time_on() -> None:
    a = SegmentLatency((0.5, 0.7, 2.0), 0, 0, 3, end_times=(5.0, 29.9, 31.0))
    b = SegmentLatency((0.9,), 1, 0, 2, end_times=(30.0,))
    assert latencies_after([a, b], 30.0) == [2.0, 0.9]
    assert latencies_after([a, b], 0.0) == [0.5, 0.7, 2.0, 0.9]
    assert latencies_after([a, b], 31.5) == []


def test_latency_by_time_buckets_segments_by_their_end_in_the_meeting() -> None:
    a = SegmentLatency((0.5, 0.7, 2.0), 0, 0, 3, end_times=(5.0, 29.9, 31.0))
    b = SegmentLatency((0.9,), 1, 0, 2, end_times=(30.0,))
    got = latency_by_time([a, b])
    assert list(got) == ["0-30", "30-60"]
    assert got["0-30"]["count"] == 2 and got["30-60"]["count"] == 2
    assert got["0-30"]["p50_s"] == pytest.approx(0.6)
    assert got["30-60"]["p95_s"] == pytest.approx(0.9 + 0.95 * 1.1)
    assert latency_by_time([]) == {}


def test_engine_by_time_differences_consecutive_scrapes() -> None:
    """Each bucket is the counters' increase between two scrapes: hops, their mean time and
    their forced tokens per bucket, so a record shows which grows with the meeting; failed
    scrapes and reset counters leave their buckets out."""
    from tests.loadtest.test_http_sweep import with_samples

    def text(hops: int, hop_s: float, forced: int, windows: int) -> str:
        return with_samples(
            ("livemeet_live_hops_total", "counter", hops),
            ("livemeet_live_hop_seconds_total", "counter", hop_s),
            ("livemeet_live_forced_tokens_total", "counter", forced),
            ("livemeet_engine_encoded_windows_total", "counter", windows),
        )

    scrapes = [
        (0.0, text(0, 0.0, 0, 0)),
        (30.2, text(300, 60.0, 30_000, 310)),
        (60.1, text(600, 240.0, 180_000, 620)),
        (90.0, None),  # a failed scrape: neither bucket around it
        (120.0, text(1_200, 600.0, 500_000, 1_240)),
    ]
    got = engine_by_time(scrapes)
    assert list(got) == ["0-30", "30-60"]
    assert got["0-30"]["live_hops"] == 300 and got["0-30"]["live_hop_mean_s"] == 0.2
    assert got["30-60"]["live_hop_mean_s"] == 0.6
    assert got["30-60"]["live_forced_mean_tokens"] == 500.0
    assert got["30-60"]["encoded_windows"] == 310
    assert engine_by_time([]) == engine_by_time(scrapes[:1]) == {}


def test_scrape_every_keeps_its_schedule_until_cancelled() -> None:
    """Scrapes at start, start + every, ...: a slow scrape does not shift the later ones (the
    fifth comes at 4 intervals, not 4 intervals plus the slow one's delay)."""
    every_s, slow_s = 0.2, 0.3

    async def run() -> list[tuple[float, str | None]]:
        into: list[tuple[float, str | None]] = []
        calls = itertools.count()

        async def scrape() -> str | None:
            n = next(calls)
            if n == 1:
                await asyncio.sleep(slow_s)
            return f"scrape {n}"

        task = asyncio.create_task(scrape_every(scrape, every_s, time.monotonic(), into))
        for _ in range(300):  # at most 3 s
            if len(into) >= 5:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return into

    into = asyncio.run(run())
    assert [text for _, text in into][:5] == [f"scrape {n}" for n in range(5)]
    times = [t for t, _ in into]
    assert all(t >= every_s * k for k, t in enumerate(times[:5]))
    assert times[4] < 4 * every_s + slow_s / 2  # no drift from the slow scrape


def test_message_segments_reads_partials_finals_and_the_transcript() -> None:
    seg = {"id": "", "start": 1.3, "end": 2.0, "speaker": "S02", "text": "a b"}
    assert message_segments({"type": "segment.partial", "rev": 3, "segments": [seg]}) == [
        (1.3, 2.0, 2)
    ]
    assert message_segments({"type": "segment.partial", "rev": 4, "segments": []}) == []
    final = {"type": "segment.final", **seg, "id": "seg-0001"}
    assert message_segments(final) == [(1.3, 2.0, 2)]
    assert message_segments({"type": "transcript.final", "segments": [seg, seg]}) == [
        (1.3, 2.0, 2),
        (1.3, 2.0, 2),
    ]
    assert message_segments({"type": "session.ready", "session_id": "x"}) is None


class FakeSocket:
    """What `_read` uses of a client WebSocket: async iteration over text messages."""

    def __init__(self, payloads: list[dict[str, object]], close_code: int = 1011) -> None:
        self.messages = [
            SimpleNamespace(type=aiohttp.WSMsgType.TEXT, data=json.dumps(p)) for p in payloads
        ]
        self.close_code = close_code

    def __aiter__(self) -> FakeSocket:
        return self

    async def __anext__(self) -> SimpleNamespace:
        if not self.messages:
            raise StopAsyncIteration
        return self.messages.pop(0)


def test_a_socket_closed_before_the_final_transcript_is_an_error() -> None:
    seg = {"id": "", "start": 0.0, "end": 1.25, "speaker": "S01", "text": "a"}
    log = SessionLog()
    partial = {"type": "segment.partial", "rev": 1, "segments": [seg]}
    asyncio.run(bench_live._read(FakeSocket([partial]), log))  # type: ignore[arg-type]
    assert len(log.events) == 1 and log.final_at is None
    assert "closed without transcript.final" in log.error and "1011" in log.error
    done = SessionLog()
    final = {"type": "transcript.final", "segments": [seg]}
    asyncio.run(bench_live._read(FakeSocket([partial, final]), done))  # type: ignore[arg-type]
    assert done.final_at is not None and not done.error


def test_upload_clients_never_send_the_same_meeting_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clients share one cycle of bodies: two uploads in flight carry two meetings (the
    same one twice would hit the encoder's window cache)."""
    in_flight: list[bytes] = []
    overlaps: list[bool] = []

    async def fake_upload(
        session: object, url: str, body: bytes, on_segment: Callable[[float], None]
    ) -> str:
        overlaps.append(body in in_flight)
        in_flight.append(body)
        on_segment(2.0)
        await asyncio.sleep(0.01)
        on_segment(5.0)
        on_segment(3.0)  # an earlier end (overlapping speech) adds no progress
        in_flight.remove(body)
        return ""

    monkeypatch.setattr(bench_live, "streamed_upload", fake_upload)

    async def run() -> bench_live.UploadTally:
        tally = bench_live.UploadTally()
        shared = itertools.cycle([b"a", b"b", b"c", b"d"])
        tasks = [
            asyncio.create_task(bench_live.upload_loop(None, "", shared, tally))  # type: ignore[arg-type]
            for _ in range(2)
        ]
        await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return tally

    tally = asyncio.run(run())
    assert tally.completed >= 4 and tally.errors == 0
    assert not any(overlaps)
    # each upload's furthest segment end, 5 s per finished one, 2 s per one cut off
    assert tally.transcribed_s in (5.0 * tally.completed + 2.0 * k for k in range(3))


def test_pcm16_clips_scales_and_rounds_as_the_cli_sends() -> None:
    """The load test's live frames are `livemeet stream`'s to the last bit: it truncated
    (0.5 -> 16383, where the client sends 16384)."""
    x = np.array([0.0, 0.5, -1.5, 1.0, 0.99999, -0.25001], np.float32)
    got = np.frombuffer(wl.pcm16(x), "<i2")
    assert got.tolist() == [0, 16384, -32767, 32767, 32767, -8192]
    cli = np.frombuffer(live_client.to_pcm16(x), "<i2")
    assert got.tolist() == cli.tolist()


@pytest.mark.slow
def test_bench_live_through_a_real_server(tmp_path: Path) -> None:
    """Two live sessions alone, then beside one upload loop, against the scripted backend
    serving the forced transcript's own segments: every segment that ends inside the stream
    arrives live, within a hop (1 s) plus slack, and the uploads complete."""
    out = tmp_path / "live.jsonl"
    run_module(
        "loadtest.bench_live",
        "--sessions", "2",
        "--uploads", "0,1",
        "--duration-s", "7",
        "--long-audio-s", "30",
        "--serve-args", "--backend scripted --model {script}",
        "--max-seconds", "120",
        "--out", str(out),
    )  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["event"] == "server_ready"
    points = {r["uploads"]: r for r in lines[1:]}
    assert set(points) == {0, 1}
    for r in points.values():
        assert r["num_errors"] == 0, r["first_error"]
        assert r["sessions"] == 2 and r["segments_expected"] >= 2
        assert r["segments_seen"] == r["segments_live"] + r["segments_after_end"]
        assert r["segments_seen"] == r["segments_expected"] and r["segments_missed"] == 0
        assert 0.0 < r["latency_p50_s"] <= r["latency_p95_s"] <= r["latency_max_s"] < 1.5
        assert r["send_lag_max_s"] < 0.5
        assert sum(b["count"] for b in r["latency_by_time"].values()) == r["segments_seen"]
        # per word (DESIGN 10): the scripted backend writes the words spoken so far, so a
        # word is seen within a hop of its own end, sooner than its segment's last word
        assert r["words_seen"] == r["words_expected"] > r["segments_expected"]
        assert r["words_missed"] == 0
        assert 0.0 < r["word_latency_p50_s"] <= r["word_latency_p95_s"] < 1.5
        assert sum(b["count"] for b in r["word_latency_by_time"].values()) == r["words_seen"]
        assert 0.0 <= r["final_after_end_p50_s"] <= r["final_after_end_max_s"] < 5.0
        # the server's two phases of it, within what the clients measured from their `end`
        phases = r["final_phase_mean_s"]
        assert set(phases) == {"engine", "hold"} and min(phases.values()) >= 0.0
        assert sum(phases.values()) <= r["final_after_end_max_s"]
        # the scripted backend revises every session: each waits for it, after its final
        assert r["revisions_promised"] == r["revisions_received"] == 2
        assert r["revisions_failed"] == r["revisions_late"] == r["revisions_closed"] == 0
        assert r["final_after_end_p50_s"] <= r["revised_after_end_p50_s"]
        assert r["revised_after_end_p50_s"] <= r["revised_after_end_p95_s"]
        assert r["revised_after_end_p95_s"] <= r["revised_after_end_max_s"] < 5.0
        assert 0.0 < r["ready_p50_s"] <= r["ready_max_s"] < 5.0
        assert "engine_steps" not in r  # the scripted backend has no step engine to count
    assert points[0]["uploads_completed"] == 0
    assert points[1]["uploads_completed"] >= 1 and points[1]["upload_errors"] == 0
    # streamed uploads report their progress: ~30 s of meeting per finished upload
    assert points[0]["upload_transcribed_audio_s"] == 0.0
    done = points[1]["uploads_completed"]
    assert 20.0 * done <= points[1]["upload_transcribed_audio_s"] <= 30.0 * (done + 1)


@pytest.mark.slow
def test_a_head_start_reaches_late_in_the_meeting_in_less_time(tmp_path: Path) -> None:
    """--head-start-s 8 at 4x, then --head-pause-s 2: 14 s of meeting in ~10 s; only segments
    ending after 8 s count, each live within a hop plus slack (timed from when real time
    resumed after the pause), and the client is never late in real time."""
    out = tmp_path / "live.jsonl"
    run_module(
        "loadtest.bench_live",
        "--sessions", "2",
        "--uploads", "0",
        "--duration-s", "14",
        "--head-start-s", "8",
        "--head-pause-s", "2",
        "--long-audio-s", "30",
        "--serve-args", "--backend scripted --model {script}",
        "--out", str(out),
    )  # fmt: skip
    (r,) = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert r["num_errors"] == 0, r["first_error"]
    assert r["head_start_s"] == 8.0 and r["head_speed"] == 4.0 and r["head_pause_s"] == 2.0
    # the steady figures leave out CATCH_UP_S (30 s) after the head: none of 14 s is left
    assert "steady_word_latency_p95_s" in r and r["steady_word_latency_p95_s"] is None
    turns = wl.make_forced(load_tokenizer(None), wl.get_workload("long", 30.0), seed=1)[1].turns
    late = [t for t in turns if 8.0 < t.end_s <= 14.0]
    assert r["segments_expected"] == 2 * len(late) > 0
    assert r["segments_seen"] == r["segments_expected"]
    assert 0.0 < r["latency_p95_s"] <= r["latency_max_s"] < 1.5
    assert r["send_lag_max_s"] < 0.5
    assert 14.0 - 8.0 + 8.0 / 4 + 2.0 <= r["wall_s"]  # the pause was kept
    assert r["wall_s"] < 14.0 - 8.0 + 8.0 / 4 + 2.0 + 1.0 + r["final_after_end_max_s"]


@pytest.mark.slow
def test_more_sessions_than_the_http_clients_default_pool_all_stream_at_once(
    tmp_path: Path,
) -> None:
    """110 sessions (aiohttp's default pool holds 100 connections): every one is ready at
    once and the point lasts its audio plus a little, not twice it (session 13's 128-session
    points ran 100 sessions, then the other 28)."""
    out = tmp_path / "live.jsonl"
    run_module(
        "loadtest.bench_live",
        "--sessions", "110",
        "--uploads", "0",
        "--duration-s", "3",
        "--long-audio-s", "30",
        "--serve-args", "--backend scripted --model {script}",
        "--out", str(out),
    )  # fmt: skip
    (r,) = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert r["num_errors"] == 0, r["first_error"]
    assert r["ready_max_s"] < 2.0
    assert r["wall_s"] < 3.0 + 1.0 + 2.0 + r["final_after_end_max_s"]


def _serve_sse_and_upload(chunks: list[bytes]) -> tuple[str, list[float]]:
    """`bench_live.streamed_upload` against a local server that writes `chunks` as its SSE
    body, each in its own write; returns its error description and the segment ends seen."""
    from aiohttp import web

    from loadtest.http_sweep import ENDPOINT

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.post()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
            await asyncio.sleep(0.01)  # separate reads on the client
        await response.write_eof()
        return response

    async def run() -> tuple[str, list[float]]:
        app = web.Application()
        app.router.add_post(ENDPOINT, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ends: list[float] = []
        try:
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{port}"
                error = await bench_live.streamed_upload(http, url, b"RIFF", ends.append)
        finally:
            await runner.cleanup()
        return error, ends

    return asyncio.run(run())


def test_streamed_upload_reads_split_events_and_the_gateways_error_body() -> None:
    """Events split across reads (inside a multi-byte character too) parse; the gateway's error
    body (`{"error": {...}}`, no "type") is reported as such; `transcript.text.done` ends it."""
    from livemeet.errors import EngineUnavailable
    from livemeet.gateway.errors_http import error_body
    from livemeet.gateway.sse import encode_event

    segment = encode_event(
        {"type": "transcript.text.segment", "id": "seg-0001", "start": 0.0, "end": 4.5,
         "speaker": "S01", "text": "你好 world"}
    )  # fmt: skip
    cut = segment.index("你".encode()) + 1
    error, ends = _serve_sse_and_upload(
        [segment[:cut], segment[cut:], encode_event(error_body(EngineUnavailable("engine died")))]
    )
    assert ends == [4.5] and error.startswith("error event") and "engine died" in error
    done = encode_event({"type": "transcript.text.done", "text": "x"})
    error, ends = _serve_sse_and_upload([segment, done])
    assert (error, ends) == ("", [4.5])
    error, _ = _serve_sse_and_upload([segment])
    assert error == "the stream ended without transcript.text.done"


def test_final_wait_stops_at_the_points_budget() -> None:
    """FINAL_TIMEOUT_S without a budget; cut to what the budget leaves, never below
    MIN_FINAL_WAIT_S (session 15: 100 sessions of 7 minutes, whose finals were still minutes
    away, ran the point past its budget and it was killed with no record at all)."""
    assert bench_live.final_wait_s(None, 100.0) == bench_live.FINAL_TIMEOUT_S
    assert bench_live.final_wait_s(130.0, 100.0) == 30.0
    assert bench_live.final_wait_s(1000.0, 100.0) == bench_live.FINAL_TIMEOUT_S
    assert bench_live.final_wait_s(90.0, 100.0) == bench_live.MIN_FINAL_WAIT_S


def test_a_session_whose_final_never_comes_is_recorded_as_such() -> None:
    """Against a server that acknowledges the stream but never sends the final: the session
    returns once its wait is spent, with the partials it saw and a "no transcript.final"
    error, instead of holding the point."""
    seg = {"id": "", "start": 0.0, "end": 0.05, "speaker": "S01", "text": "a"}
    partial = {"type": "segment.partial", "rev": 1, "segments": [seg]}
    log, took = asyncio.run(session_against({"session_id": "x"}, [partial], on_end=[]))
    assert log.final_at is None and log.end_sent is not None
    assert log.error.startswith("no transcript.final within")
    assert len(log.events) == 1
    assert took < bench_live.MIN_FINAL_WAIT_S + 1.0


def test_a_revision_that_never_comes_is_late_not_an_error_and_holds_nothing() -> None:
    """The final comes, the promised revision does not: the session returns within the
    point's budget, its final counted and its revision "late"."""
    final = {"type": "transcript.final", "segments": []}
    ready = {"session_id": "x", "revise": True}
    log, took = asyncio.run(session_against(ready, [], on_end=[final]))
    assert log.final_at is not None and not log.error
    assert log.revision == "late" and log.revised_after_end_s() is None
    assert took < bench_live.MIN_FINAL_WAIT_S + 1.0


def test_a_revision_is_timed_from_end_and_its_failure_is_not_the_sessions() -> None:
    final = {"type": "transcript.final", "segments": []}
    revised = {"type": "transcript.revised", "segments": [], "supersedes": []}
    failed = {"type": "error", "code": "revision_failed", "message": "m", "retryable": False}
    logs = []
    for after in ([revised], [failed], []):
        log = SessionLog(revise=True, end_sent=time.monotonic())
        asyncio.run(bench_live._read(FakeSocket([final, *after]), log))  # type: ignore[arg-type]
        assert log.final_at is not None and not log.error
        logs.append(log)
    assert [log.revision for log in logs] == ["revised", "failed", "closed"]
    delay_s = logs[0].revised_after_end_s()
    assert delay_s is not None and delay_s >= 0.0
    plain = SessionLog(end_sent=time.monotonic())  # no revision promised: none waited for
    asyncio.run(bench_live._read(FakeSocket([final, revised]), plain))  # type: ignore[arg-type]
    assert plain.revision == "" and plain.revised_at is None
    fields = bench_live.revision_fields([*logs, plain], [1.0, 2.0, 4.0])
    assert fields["revisions_promised"] == 3 and fields["revisions_received"] == 1
    assert fields["revisions_failed"] == fields["revisions_closed"] == 1
    assert fields["revisions_late"] == 0
    assert fields["revised_after_end_p50_s"] == 2.0 and fields["revised_after_end_max_s"] == 4.0
    assert bench_live.revision_fields([plain], [])["revised_after_end_p95_s"] is None


async def session_against(
    ready: dict[str, Any], before_end: list[dict[str, Any]], on_end: list[dict[str, Any]]
) -> tuple[SessionLog, float]:
    """A one-frame `live_session` (a budget of 0.5 s) against a server that sends
    `session.ready` (`ready`'s fields), then `before_end`, then `on_end` once `end` came, and
    never closes; the log and how long the session took."""
    from aiohttp import web

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive_json()
        await ws.send_json({"type": "session.ready", **ready})
        for event in before_end:
            await ws.send_json(event)
        async for msg in ws:  # audio, then `end`
            if msg.type is aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "end":
                for event in on_end:
                    await ws.send_json(event)
        return ws

    async def run() -> tuple[SessionLog, float]:
        app = web.Application()
        app.router.add_get(bench_live.LIVE_PATH, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as http:
                start = time.monotonic()
                samples = np.zeros(1600, dtype=np.float32)  # 0.1 s: one frame
                log = await bench_live.live_session(
                    http, f"http://127.0.0.1:{port}", samples, 0.0, final_by=start + 0.5
                )
                return log, time.monotonic() - start
        finally:
            await runner.cleanup()

    return await run()
