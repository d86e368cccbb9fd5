"""http_sweep end to end against a real `livemeet serve` (scripted backend, CPU)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from loadtest.http_sweep import Server, requests_for
from tests.loadtest.conftest import run_module


@pytest.mark.slow
def test_sweep_through_real_server(tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    run_module(
        "loadtest.http_sweep",
        "--workloads",
        "short,long",
        "--short-concurrency",
        "1,4",
        "--long-concurrency",
        "2,100000",
        "--long-audio-s",
        "20",
        "--short-min-requests",
        "2",
        "--long-min-requests",
        "2",
        "--serve-args",
        "--backend scripted",
        "--max-seconds",
        "60",
        "--assumed-audio-s-per-s",
        "50",
        "--out",
        str(out),
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ready = [r for r in lines if r.get("event") == "server_ready"]
    assert [r["workload"] for r in ready] == ["short", "long"]
    assert ready[0]["forced_tokens"] == 64 and ready[1]["forced_tokens"] == 110
    points = {(r["workload"], r["concurrency"]): r for r in lines if "event" not in r}
    assert points[("short", 4)]["num_requests"] == 8  # max(2, 2c)
    assert points[("long", 2)]["num_requests"] == 2
    # 100,000 meetings x 20 s cannot fit in 60 s at any measured rate: reported, not run
    assert "skipped" in points[("long", 100_000)]
    for key in (("short", 1), ("short", 4), ("long", 2)):
        r = points[key]
        assert r["num_errors"] == 0, r["first_error"]
        assert r["audio_s_per_s"] == pytest.approx(
            r["num_requests"] * r["audio_s"] / r["makespan_s"]
        )
        assert r["latency_mean_s"] <= r["latency_p95_s"] + 1e-9 or r["num_requests"] == 1
    assert (tmp_path / "server-short.log").stat().st_size > 0


def test_server_that_exits_is_reported(tmp_path: Path) -> None:
    with open(tmp_path / "log", "wb") as log:
        server = Server(["--no-such-flag"], tmp_path / "data", log)
        try:
            with pytest.raises(RuntimeError, match="exited"):
                asyncio.run(server.wait_ready(60))
        finally:
            server.stop()
    assert b"--no-such-flag" in (tmp_path / "log").read_bytes()


def test_requests_per_point() -> None:
    assert requests_for("long", 1, 4, 16) == 4
    assert requests_for("long", 16, 4, 16) == 16
    assert requests_for("short", 4, 4, 16) == 16
    assert requests_for("short", 64, 4, 16) == 128
