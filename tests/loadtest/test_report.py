"""report.py on fixture JSON: floors against DESIGN.md section 10, tables, and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest import report
from tests.loadtest.conftest import run_module

DESIGN_BW = 4.1  # TB/s, DESIGN.md section 10's measured copy bandwidth
DESIGN_WEIGHTS = 1_190_000_000  # bytes, "weights ~1.19 GB"
KV_PER_TOKEN = 112 * 1024  # bytes, MODEL.md section 0


def test_prompt_lengths_match_model_md() -> None:
    assert report.prompt_tokens(40.0) == 601  # MODEL.md 5.3 checked example
    assert report.prompt_tokens(2240.0) == pytest.approx(29_700, abs=100)  # DESIGN 10


def test_floor_reproduces_design_figures() -> None:
    floor = report.FloorModel(DESIGN_BW, DESIGN_WEIGHTS, KV_PER_TOKEN)
    prompt = report.prompt_tokens(2240.0)
    assert floor.audio_s_per_s(1, 2240.0, prompt, 12_320) == pytest.approx(145, rel=0.05)
    assert floor.audio_s_per_s(16, 2240.0, prompt, 12_320) == pytest.approx(178, rel=0.05)
    fp8 = floor.audio_s_per_s(16, 2240.0, prompt, 12_320, kv="fp8_e4m3")
    assert fp8 > 1.8 * floor.audio_s_per_s(16, 2240.0, prompt, 12_320)


SWEEP_POINT = {
    "workload": "short",
    "concurrency": 16,
    "num_requests": 32,
    "num_errors": 0,
    "audio_s": 11.6,
    "makespan_s": 0.5,
    "req_per_s": 64.0,
    "audio_s_per_s": 742.4,
    "rtf_mean": 0.01,
    "latency_mean_s": 0.2,
    "latency_p95_s": 0.3,
}


def _fixtures(tmp_path: Path) -> tuple[Path, Path, Path]:
    run = {
        "workload": "long",
        "kv_cache_dtype": "bf16",
        "concurrency": 1,
        "num_requests": 1,
        "audio_s": 2240.0,
        "prompt_tokens": 29_659,
        "output_tokens": 12_320,
        "makespan_s": 20.0,
        "req_per_s": 0.05,
        "audio_s_per_s": 112.0,
        "rtf_mean": 0.0089,
        "latency_mean_s": 20.0,
        "latency_p95_s": 20.0,
        "graph_replays": 12_000,
        "graph_eager_fallbacks": 3,
    }
    engine = {
        "device": "NVIDIA H200",
        # the floor uses the read-only figure (DESIGN's 4.1 TB/s); the copy figure is ignored
        "bandwidth": {"copy_tb_per_s": 2.7, "read_tb_per_s": 4.1},
        "weight_bytes": DESIGN_WEIGHTS,
        "kv_bytes_per_token": KV_PER_TOKEN,
        "decode": [
            {
                "kv_cache_dtype": "bf16",
                "batch": 1,
                "context": 36_000,
                "ms_per_step": 2.0,
                "ms_per_step_median": 2.0,
                "floor_ms": 1.3,
                "floor_read_ms": 1.2,
                "x_floor": 0.65,
            }
        ],
        "runs": [
            run,
            {
                **run,
                "concurrency": 16,
                "num_requests": 16,
                "audio_s_per_s": 150.0,
                "latency_p95_s": 240.0,
            },
        ],
        "skipped": [
            {
                "workload": "long",
                "concurrency": 4,
                "kv_cache_dtype": "fp8_e4m3",
                "reason": "over --max-seconds",
            }
        ],
    }
    hf = {
        "device": "NVIDIA H200",
        "dtype": "bfloat16",
        "decode": [{"batch": 1, "context": 36_002, "steps": 8, "ms_per_step": 70.0}],
        "encoder_ms_per_window": 5.0,
        "projections": [
            {
                "workload": "long",
                "batch": 1,
                "audio_s": 2240.0,
                "prompt_tokens": 29_659,
                "output_tokens": 12_320,
                "encoder_s": 0.4,
                "prefill_s": 2.0,
                "decode_s": 930.0,
                "total_s": 932.4,
                "audio_s_per_s": 2.4,
                "projected": True,
            }
        ],
    }
    sweep = [
        {"event": "server_ready", "workload": "short", "ready_s": 20.0},
        SWEEP_POINT,
        {"workload": "short", "concurrency": 64, "num_requests": 128, "skipped": "over budget"},
    ]
    paths = tmp_path / "e.json", tmp_path / "hf.json", tmp_path / "s.jsonl"
    paths[0].write_text(json.dumps(engine))
    paths[1].write_text(json.dumps(hf))
    paths[2].write_text("\n".join(json.dumps(x) for x in sweep))
    return paths


def test_report_tables_and_png(tmp_path: Path) -> None:
    e, hf, s = _fixtures(tmp_path)
    png, md = tmp_path / "plot.png", tmp_path / "report.md"
    run_module(
        "loadtest.report",
        "--engine",
        str(e),
        "--hf",
        str(hf),
        "--sweep",
        str(s),
        "--png",
        str(png),
        "--md",
        str(md),
    )
    text = md.read_text()
    rows = {
        line.split("|")[1].strip() + line.split("|")[3].strip(): line
        for line in text.splitlines()
        if line.startswith("| long") or line.startswith("| short")
    }
    long1 = [c.strip() for c in rows["long1"].split("|")]
    # columns: floor, x floor, x SGLang-Omni, x transformers, target
    assert long1[10:15] == ["141", "0.80", "1.48", "46.67", "110"]
    long16 = [c.strip() for c in rows["long16"].split("|")]
    assert long16[10:13] == ["178", "0.84", "1.10"]
    short16 = [c.strip() for c in rows["short16"].split("|")]
    assert short16[12] == f"{742.4 / 380:.2f}"
    assert "skipped: over budget" in text and "skipped: over --max-seconds" in text
    assert "PROJECTED" in text
    decode = next(line for line in text.splitlines() if line.startswith("| bf16 | 1 | 36000"))
    # x floor = read-only floor / ms per step (1.2 / 2.0), not the stored copy-floor ratio
    assert [c.strip() for c in decode.split("|")][5:8] == ["1.30", "1.20", "0.60"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_transformers_row_matches_the_nearest_context() -> None:
    from loadtest.report import hf_ms_for

    hf = {"decode": [{"batch": 1, "context": 1024, "ms_per_step": 60.0},
                     {"batch": 1, "context": 36_000, "ms_per_step": 70.0},
                     {"batch": 16, "context": 1024, "ms_per_step": 72.0}]}  # fmt: skip
    assert hf_ms_for(hf, 1, 1069) == 60.0  # the engine's context includes the prompt
    assert hf_ms_for(hf, 1, 36_205) == 70.0
    assert hf_ms_for(hf, 16, 36_168) is None  # no reference within 10 %
    assert hf_ms_for(None, 1, 1024) is None


def test_report_with_nothing_is_still_a_report() -> None:
    text = report.render(None, None, [])
    assert text.startswith("## Benchmarks")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_http_table_shows_graph_and_eager_steps_when_recorded() -> None:
    newer = {
        **SWEEP_POINT,
        "concurrency": 32,
        "engine_steps": {
            "decode_graph": 1_240,
            "decode_eager": 3,
            "prefill_graph": 16,
            "prefill_eager": 0,
        },
        "decode_graph_fallbacks": 3,
        "prefill_tokens": 31_000,
        "decode_tokens": 12_500,
    }
    text = report.render(None, None, [SWEEP_POINT, newer])
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| workload"))
    assert _cells(header)[-2:] == ["decode steps graph / eager", "prefill steps graph / eager"]
    separator = lines[lines.index(header) + 1]
    assert len(_cells(separator)) == len(_cells(header)) == 17
    rows = {_cells(line)[2]: _cells(line) for line in lines if line.startswith("| short")}
    assert rows["16"][-2:] == ["-", "-"]  # an older record without the counters
    assert rows["32"][-2:] == ["1,240 / 3", "16 / 0"]
    assert len(rows["16"]) == len(rows["32"]) == 17


def test_http_table_without_engine_counters_keeps_its_columns() -> None:
    text = report.render(None, None, [SWEEP_POINT])
    assert "graph / eager" not in text
    row = next(line for line in text.splitlines() if line.startswith("| short"))
    assert len(_cells(row)) == 15 and _cells(row)[-1] == "0"
