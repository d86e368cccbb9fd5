"""loadtest.profile_engine: the GPU timeline analysis on hand-made traces, and a tiny CPU run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.profile_engine import (
    DeviceActivity,
    by_family,
    device_activities,
    kernel_table,
    timeline,
)
from tests.loadtest.conftest import run_module


def _act(name: str, start: float, end: float) -> DeviceActivity:
    return DeviceActivity(name, start, end)


def test_timeline_counts_overlap_once_and_groups_gaps_by_neighbours() -> None:
    acts = [
        _act("gemm_a", 0, 10),
        _act("attn", 8, 20),  # overlaps gemm_a (PDL): busy once
        _act("Memcpy HtoD", 50, 52),  # 30 us gap after attn
        _act("gemm_a", 52.5, 60),  # 0.5 us: below MIN_GAP_US, not idle
        _act("attn", 100, 110),  # 40 us gap after gemm_a
        _act("Memcpy HtoD", 140, 141),  # 30 us gap after attn again
    ]
    tl = timeline(acts)
    assert tl.span_us == 141
    assert tl.busy_us == pytest.approx(20 + 2 + 7.5 + 10 + 1)
    assert tl.idle_us == pytest.approx(30 + 40 + 30)
    assert tl.num_gaps == 3
    top = tl.top_gaps[0]
    assert (top.before, top.after, top.count, top.total_us) == ("attn", "Memcpy HtoD", 2, 60)
    assert (tl.top_gaps[1].before, tl.top_gaps[1].after) == ("gemm_a", "attn")


def test_timeline_names_the_gap_after_the_activity_that_ended_last() -> None:
    # a long kernel contains a short one: the gap follows the long one
    acts = [_act("long", 0, 100), _act("short", 10, 20), _act("next", 130, 140)]
    tl = timeline(acts)
    assert tl.top_gaps[0].before == "long"
    assert tl.busy_us == 110
    # the span ends with the activity that ends last, not the one that starts last
    assert timeline(acts[:2]).span_us == 100


def test_device_activities_keep_device_events_only_sorted() -> None:
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k2", "ts": 5.0, "dur": 1.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 9.0},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 1.0, "dur": 2.0},
            {"ph": "f", "cat": "kernel", "name": "flow", "ts": 3.0},
        ]
    }
    acts = device_activities(trace)
    assert [(a.name, a.start_us, a.end_us) for a in acts] == [
        ("Memcpy HtoD", 1.0, 3.0),
        ("k2", 5.0, 6.0),
    ]


def test_families_and_kernel_table() -> None:
    acts = [
        _act("_extend_kernel", 0, 30),
        _act("livemeet_decode_split", 30, 40),
        _act("_skinny_rows_kernel", 40, 45),
        _act("_skinny_rows_kernel", 45, 51),
        _act("_qk_norm_rope_kernel", 51, 52),
    ]
    fams = by_family(acts)
    assert fams == {
        "extend attention": 30,
        "decode attention": 10,
        "projections": 11,
        "other": 1,
    }
    table = kernel_table(acts, per=2)
    assert table[0] == {"name": "_extend_kernel", "calls": 1, "us": 30, "us_per_step": 15}
    assert [r["name"] for r in table[1:3]] == ["_skinny_rows_kernel", "livemeet_decode_split"]
    assert table[1]["calls"] == 2 and table[1]["us"] == 11


def test_tiny_run_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    run_module(
        "loadtest.profile_engine",
        "--config",
        "tiny",
        "--batch",
        "2",
        "--context",
        "300",
        "--steps",
        "5",
        "--profile-steps",
        "2",
        "--prefill",
        "--json",
        str(out),
    )
    report = json.loads(out.read_text())
    prefill = report["prefill"]
    assert prefill and all(row["chunks"] for row in prefill)
    # both prompts are prefilled before the first pure decode step
    assert sum(n for row in prefill for _, n in row["chunks"]) >= 2 * 250
    decode = report["decode"]
    assert decode["batch"] == 2 and decode["steps"] == 5
    assert decode["wall_ms_per_step"] > 0
    assert set(decode["host_ms_per_step"]) == {"schedule", "encode", "launch", "wait", "other"}


def test_a_batch_that_shrinks_while_timed_is_an_error() -> None:
    """A request whose budget ends inside the timed window makes the figures mix batch sizes
    (session 10's first c16 profile): the tool must refuse, not report them."""
    from loadtest.bench_engine import BatchLog, add_noise_requests, build_engine
    from loadtest.profile_engine import profile_decode

    engine = build_engine("tiny", device="cpu", dtype="float32", kv_cache_dtype="auto", eager=True)
    log = BatchLog(engine)
    # 16 tokens each: 14 decode steps plus the 2 the prefill of two 300-id prompts may take
    add_noise_requests(engine, "p", 2, 300, decode_steps=14)
    with pytest.raises(RuntimeError, match="shrank"):
        profile_decode(engine, log, 2, steps=30, profile_steps=2)
