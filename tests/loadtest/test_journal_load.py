"""loadtest/journal_load.py: the live journal driven as a gateway would, measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest import journal_load


async def test_every_append_is_acknowledged_and_measured(tmp_path: Path) -> None:
    """Three sessions appending 0.1-s frames for 0.5 s: every append gets its ack lag (the
    journal's close commits the last), every commit its duration and files, each session's
    audio once per commit at most."""
    report = await journal_load.run(3, 0.5, 0.1, tmp_path / "journal")
    assert report["appends"] == report["acked_appends"] >= 12
    lag = report["ack_lag_s"]
    assert 0 <= lag["p50"] <= lag["p95"] <= lag["p99"] <= lag["max"] < 5
    assert report["commits"] >= 2 and report["files_per_commit_mean"] <= 3
    assert not list((tmp_path / "journal" / "audio").iterdir())  # finished: files deleted


def test_the_command_prints_a_row_and_appends_a_json_line_per_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "points.jsonl"
    argv = ["--sessions", "1", "2", "--seconds", "0.3", "--finals-per-min", "600"]
    assert journal_load.main([*argv, "--dir", str(tmp_path), "--json", str(out)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| 1", "| 2"]
    assert [json.loads(line)["sessions"] for line in out.read_text().splitlines()] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["journal-1", "journal-2"]
