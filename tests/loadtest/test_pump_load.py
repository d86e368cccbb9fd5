"""loadtest/pump_load.py: live pumps over a real journal, bursts of finals, measured."""

from __future__ import annotations

from pathlib import Path

from loadtest import pump_load


async def test_every_final_and_partial_is_delivered_and_measured(tmp_path: Path) -> None:
    """Three sessions, a hop every 0.2 s of 2 finals and a partial for 0.7 s: every event
    reaches the socket (none lost behind a commit), the partials one a hop, each lag measured
    from its emission; the bursts share group commits."""
    report = await pump_load.run(3, 0.7, 0.2, 2, tmp_path / "journal")
    hops = report["partials"]
    assert hops >= 3 * 3
    assert report["finals"] == 2 * hops
    for lag in (report["final_lag_s"], report["partial_lag_s"]):
        assert 0 <= lag["p50"] <= lag["p95"] <= lag["max"] < 5
    assert report["commits"] < report["finals"]
