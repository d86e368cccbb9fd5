"""bench_upload_decode end to end (tiny counts): every format is made, decodes to its length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.loadtest.conftest import run_module


def test_bench_upload_decode_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    args = ("--threads", "1,2", "--files", "2", "--iters", "1", "--json", str(out))
    proc = run_module("loadtest.bench_upload_decode", *args)
    report = json.loads(out.read_text())
    durations = {r["format"]: r["audio_s"] for r in report["results"]}
    assert durations == {
        "wav 11.6 s 16 kHz mono": pytest.approx(11.6, abs=1e-3),
        "wav 37.3 min 16 kHz mono": pytest.approx(2240.0, abs=1e-3),
        "mp3 30 s 44.1 kHz stereo": pytest.approx(30.0, abs=0.1),
        "opus/webm 30 s 48 kHz mono": pytest.approx(30.0, abs=0.1),
    }
    for result in report["results"]:
        assert result["probe_decode_ms"] > result["probe_ms"] > 0
        assert set(result["files_per_s"]) == {"1", "2"}
    assert "files/s" in proc.stdout
