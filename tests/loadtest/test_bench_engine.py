"""bench_engine end to end on the tiny config (CPU), and its budget guard."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from loadtest.bench_engine import Budget, EncodeTimer, parse_points
from tests.loadtest.conftest import run_module


def test_tiny_engine_bench_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    proc = run_module(
        "loadtest.bench_engine",
        "--config",
        "tiny",
        "--workloads",
        "short,long",
        "--short-concurrency",
        "1,2",
        "--long-concurrency",
        "1",
        "--long-audio-s",
        "20",
        "--decode-batches",
        "1,2",
        "--decode-contexts",
        "64",
        "--decode-steps",
        "3",
        "--fp8",
        "short:2",
        "--json",
        str(out),
    )
    report = json.loads(out.read_text())
    assert "| workload | KV | c |" in proc.stdout
    runs = {(r["workload"], r["kv_cache_dtype"], r["concurrency"]): r for r in report["runs"]}
    assert set(runs) == {
        ("short", "fp32", 1),
        ("short", "fp32", 2),
        ("long", "fp32", 1),
        ("short", "fp8_e4m3", 2),
    }
    # forced transcripts drive every request to exactly the workload's output length
    assert runs[("short", "fp32", 2)]["output_tokens"] == 64
    assert runs[("long", "fp32", 1)]["output_tokens"] == 110  # 330 tokens/min x 20 s
    for r in report["runs"]:
        assert r["num_decode_steps"] >= r["output_tokens"] - 2
        assert r["audio_s_per_s"] == pytest.approx(
            r["concurrency"] * r["audio_s"] / r["makespan_s"]
        )
        assert r["latency_p95_s"] <= r["makespan_s"] + 1e-6
        assert r["encode_s"] > 0 and r["encoder_device_s"] is None  # no CUDA events on a CPU
    decode = {(d["batch"]): d for d in report["decode"]}
    assert set(decode) == {1, 2} and all(d["ms_per_step"] > 0 for d in decode.values())
    assert decode[2]["kv_bytes"] == 2 * decode[2]["context"] * report["kv_bytes_per_token"]


def test_budget_skips_runs_that_do_not_fit() -> None:
    now = [0.0]
    budget = Budget(100.0, clock=lambda: now[0], assumed_rate=10.0)
    assert budget.fits("long", 900.0) and not budget.fits("long", 1100.0)
    budget.observe("long", 50.0)
    now[0] = 60.0
    assert budget.fits("long", 2000.0) and not budget.fits("long", 2100.0)
    assert not budget.fits("short", 500.0)  # other workloads keep the assumed rate
    assert Budget(None).fits("long", 1e9)


def test_budget_estimates_per_dtype_and_concurrency_and_says_why_it_skipped() -> None:
    """Session 8 lost FP8 long c16 twice: it was estimated from the c1 rate. A point uses the
    rate measured at its own concurrency, else the assumed rate raised to any lower
    concurrency's (a floor); a bf16 rate never estimates an FP8 point; a skipped point records
    its estimate, the rate's origin and the time left."""
    now = [0.0]
    budget = Budget(250.0, clock=lambda: now[0], assumed_rate=280.0)
    budget.observe("long/fp8_e4m3", 131.2, 1)
    budget.observe("long/bf16", 105.0, 1)
    now[0] = 120.0
    c16 = 16 * 2240.0
    assert budget.rate("long/fp8_e4m3", 16) == (280.0, "assumed")  # not c1's 131.2
    assert budget.fits("long/fp8_e4m3", c16, 16)  # ~128 s of 130 left
    assert budget.rate("long/fp8_e4m3", 1) == (131.2, "measured")
    assert not budget.fits("long/fp8_e4m3", c16, 1)
    budget.observe("long/fp8_e4m3", 300.0, 4)  # a floor above the assumed rate is used
    assert budget.rate("long/fp8_e4m3", 16) == (300.0, "lower-concurrency")
    assert budget.rate("long/fp8_e4m3", 2) == (280.0, "assumed")  # c4 is no floor for c2
    assert budget.rate("long/bf16", 16) == (280.0, "assumed")
    reason = budget.why_skipped("long/fp8_e4m3", c16, 1)
    assert reason == "over --max-seconds: ~273 s at the measured 131 audio-s/s, 130 s left"


def test_parse_points() -> None:
    assert parse_points("long:1, short:16") == [("long", 1), ("short", 16)]
    for bad in ("long", "medium:2", "long:x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_points(bad)


@pytest.mark.parametrize("sync", [False, True])
def test_encode_timer_passes_calls_through_and_counts_each(sync: bool) -> None:
    import torch

    calls: list[tuple[object, ...]] = []

    def encode(*args: object, **kwargs: object) -> str:
        calls.append((args, tuple(kwargs.items())))
        return "embeddings"

    timer = EncodeTimer(encode, torch.device("cpu"), sync=sync)
    assert timer("a", window_keys=None) == "embeddings" and timer("b") == "embeddings"
    assert calls == [(("a",), (("window_keys", None),)), (("b",), ())]
    assert len(timer.host_s) == 2 and all(t >= 0 for t in timer.host_s)
    assert timer.device_s() is None
