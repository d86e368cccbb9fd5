"""loadtest.live_report: the real-time part's engine figures from bench_live records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadtest import live_report


def _bucket(hops: int, endpoint: int, wait_s: float, prefill_steps: int) -> dict[str, Any]:
    return {
        "engine_steps": {
            "decode_graph": 10,
            "decode_eager": 2,
            "prefill_graph": prefill_steps,
            "prefill_eager": 1,
        },
        "engine_step_s": {"schedule": 0.1, "encode": 0.2, "launch": 0.3, "wait": wait_s},
        "live_hops": hops,
        "live_endpoint_hops": endpoint,
        "prefill_tokens": 500 * hops,
        "decode_tokens": 6 * hops,
        "live_forced_mean_tokens": 250.0 if hops < 3000 else 300.0,
        "live_hop_mean_s": 0.5 if hops < 3000 else 0.8,
        "live_hop_first_token_mean_s": 0.2 if hops < 3000 else 0.25,
    }


def _record() -> dict[str, Any]:
    return {
        "latency_p50_s": 1.234,
        "latency_p95_s": 2.0,
        "latency_p99_s": 2.5,
        "latency_max_s": 3.0,
        "engine_by_time": {
            "90-120": _bucket(9_999, 99, 99.0, 99),  # the head start's catch-up: left out
            "120-150": _bucket(2_000, 60, 4.0, 500),
            "150-180": _bucket(4_000, 120, 8.0, 700),
            "240-270": _bucket(9_999, 99, 99.0, 99),  # past the window: left out
        },
        "latency_by_time": {
            "450-480": {"p50_s": 1.5, "p95_s": 2.25},
            "1020-1050": {"p50_s": 1.75, "p95_s": 2.5},
        },
    }


def test_figures_sum_the_buckets_that_start_in_the_window() -> None:
    f = live_report.figures(_record(), 120.0, 240.0)
    hops = 6_000
    assert f.seconds == 60.0
    assert f.hops_per_s == pytest.approx(hops / 60)
    assert f.endpoint_hops_per_s == pytest.approx(180 / 60)
    assert f.engine_ms_per_hop == pytest.approx(1000 * (0.6 + 4.0 + 0.6 + 8.0) / hops)
    assert f.wait_ms_per_hop == pytest.approx(1000 * 12.0 / hops)
    assert f.encode_ms_per_hop == pytest.approx(1000 * 0.4 / hops)
    assert f.prefill_steps_per_s == pytest.approx((501 + 701) / 60)
    assert f.decode_steps_per_s == pytest.approx(24 / 60)
    assert f.prefill_ids_per_hop == pytest.approx(500)
    assert f.decode_ids_per_hop == pytest.approx(6)
    # forced ids weighted by each bucket's hops, not the buckets' plain mean
    assert f.forced_ids_per_hop == pytest.approx((250 * 2_000 + 300 * 4_000) / hops)
    assert f.hop_s == pytest.approx((0.5 * 2_000 + 0.8 * 4_000) / hops)
    assert f.first_id_s == pytest.approx((0.2 * 2_000 + 0.25 * 4_000) / hops)
    assert live_report.figures_row("x", _record(), f).endswith(" | 0.70 / 0.23 | - |")


def test_records_of_servers_without_first_id_times_show_a_dash() -> None:
    record = _record()
    for bucket in record["engine_by_time"].values():
        del bucket["live_hop_first_token_mean_s"]
    f = live_report.figures(record, 120.0, 240.0)
    assert f.first_id_s is None
    assert live_report.figures_row("x", record, f).endswith(" | 0.70 / - | - |")


def test_counters_bench_live_leaves_out_count_as_zero() -> None:
    """A bucket where no hop finished has no live_hops; a run forcing no transcript has no
    live_forced_mean_tokens; neither breaks the sums."""
    record = _record()
    del record["engine_by_time"]["150-180"]["live_forced_mean_tokens"]
    record["engine_by_time"]["180-210"] = {"engine_steps": {"decode_graph": 6}}
    f = live_report.figures(record, 120.0, 240.0)
    assert f.seconds == 90.0 and f.hops_per_s == pytest.approx(6_000 / 90)
    assert f.forced_ids_per_hop == pytest.approx(250 * 2_000 / 6_000)
    assert f.decode_steps_per_s == pytest.approx((12 + 12 + 6) / 90)


def test_an_empty_window_or_one_without_hops_is_an_error() -> None:
    with pytest.raises(ValueError, match="no engine_by_time bucket"):
        live_report.figures(_record(), 300.0, 400.0)
    record = _record()
    record["engine_by_time"] = {"120-150": _bucket(0, 0, 1.0, 1)}
    with pytest.raises(ValueError, match="no live hop"):
        live_report.figures(record, 120.0, 240.0)


def test_buckets_are_ordered_by_time_and_missing_cells_marked() -> None:
    other = {"latency_by_time": {"480-510": {"p50_s": 1.0, "p95_s": 2.0}}}
    rows = live_report.bucket_rows([("a", _record()), ("b", other)])
    names = [row.split(" | ")[0].strip("| ") for row in rows[2:]]
    assert names == ["450-480", "480-510", "1020-1050"]  # numeric, not lexical, order
    assert rows[2] == "| 450-480 | 1.50 / 2.25 | - |"
    assert rows[3] == "| 480-510 | - | 1.00 / 2.00 |"


def test_the_command_reads_the_last_record_of_each_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "call1_bench_live.jsonl"
    first = _record() | {"latency_p50_s": 9.0}
    path.write_text(json.dumps(first) + "\n" + json.dumps(_record()) + "\n")
    live_report.main([str(path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == live_report.FIGURES_HEADER.splitlines()[0]
    row = out[2]
    # the per-word cell: "-" for a record from before bench_live measured words
    assert row.startswith("| call1_bench_live | 1.23 / 2.00 / 2.50 / 3.00 | - | - | 100.0 | 3.00 |")
    live_report.main([str(path), "--all-records"])
    labels = [line.split(" | ")[0] for line in capsys.readouterr().out.splitlines()[2:4]]
    assert labels == ["| call1_bench_live[0]", "| call1_bench_live[1]"]
    words = {"word_latency_p50_s": 0.5, "word_latency_p95_s": 1.25}
    words |= {"word_latency_p99_s": 1.5, "word_latency_max_s": 2.0}
    (path := tmp_path / "call2_bench_live.jsonl").write_text(json.dumps(_record() | words) + "\n")
    live_report.main([str(path)])
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith(
        "| call2_bench_live | 1.23 / 2.00 / 2.50 / 3.00 | 0.50 / 1.25 / 1.50 / 2.00 | - |"
    )
    # per word without the head's catch-up (records since session 27)
    steady = {f"steady_{k}": v / 2 for k, v in words.items()}
    path.write_text(json.dumps(_record() | words | steady) + "\n")
    live_report.main([str(path)])
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith(
        "| call2_bench_live | 1.23 / 2.00 / 2.50 / 3.00 | 0.50 / 1.25 / 1.50 / 2.00 "
        "| 0.25 / 0.62 / 0.75 / 1.00 | 100.0 |"
    )
    # the per-word buckets get their own table, after the per-segment one
    by_word = {"word_latency_by_time": {"450-480": {"p50_s": 0.75, "p95_s": 1.5}}}
    path.write_text(json.dumps(_record() | words | by_word) + "\n")
    live_report.main([str(path)])
    out = capsys.readouterr().out.splitlines()
    at = out.index("| bucket (s), per word | call2_bench_live |")
    assert out[at + 2] == "| 450-480 | 0.75 / 1.50 |"
    assert out.index("| bucket (s) | call2_bench_live |") < at


def test_the_last_column_is_end_to_final_with_the_servers_phases() -> None:
    assert live_report.final_cell(_record()) == "-"  # no final in the record
    finals = {"final_after_end_p50_s": 1.234, "final_after_end_max_s": 2.5}
    assert live_report.final_cell(_record() | finals) == "1.23 / 2.50"  # before session 46
    phases = {"final_phase_mean_s": {"engine": 0.75, "hold": 0.5}}
    assert live_report.final_cell(_record() | finals | phases) == "1.23 / 2.50 (0.75 / 0.50)"
    row = live_report.figures_row("r", _record() | finals | phases, live_report.figures(
        _record(), 120, 240))  # fmt: skip
    assert row.endswith("| 1.23 / 2.50 (0.75 / 0.50) |")
    header = live_report.FIGURES_HEADER.splitlines()
    assert header[0].count("|") == row.count("|") == header[1].count("|")


def test_the_command_says_when_its_window_holds_no_bucket(tmp_path: Path) -> None:
    """A window past the record's buckets exits with one line, not a traceback (a 30-minute
    point's meeting minutes given as --from-s, session 32)."""
    path = tmp_path / "call1_bench_live.jsonl"
    path.write_text(json.dumps(_record()) + "\n")
    with pytest.raises(SystemExit, match="no engine_by_time bucket starts in"):
        live_report.main([str(path), "--from-s", "1650", "--to-s", "1800"])
