"""loadtest.trace_summary on a hand-made chrome trace (CPU)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from loadtest.trace_summary import load_trace, main, summarise


def _runtime(name: str, corr: int, ts: float) -> dict[str, object]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}  # fmt: skip


def _kernel(name: str, corr: int, ts: float, dur: float) -> dict[str, object]:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}  # fmt: skip


def make_trace() -> dict[str, object]:
    return {
        "traceEvents": [
            _runtime("cudaGraphLaunch", 1, 0),  # the encoder's graph: a convolution in it
            _kernel("sm90_xmma_fprop_implicit_gemm", 1, 10, 20),
            _kernel("nvjet_tst_128x256", 1, 30, 30),
            _runtime("cudaGraphLaunch", 2, 5),  # a decoder piece: projections only
            _kernel("nvjet_tst_128x256", 2, 60, 10),
            _runtime("cuLaunchKernelEx", 3, 6),  # eager attention, after a 10-us gap
            _kernel("_extend_kernel", 3, 80, 15),
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": "Memcpy HtoD (Pinned -> Device)",
                "ts": 95,
                "dur": 5,
                "args": {"correlation": 4},
            },  # fmt: skip
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},  # ignored
        ]
    }


def test_summary_splits_encoder_graph_families_and_gaps() -> None:
    out = summarise(make_trace())
    assert out["span_ms"] == pytest.approx(0.090)  # 10 .. 100 us
    assert out["busy_ms"] == pytest.approx(0.080) and out["idle_ms"] == pytest.approx(0.010)
    parts = out["parts_ms"]
    assert parts["encoder graph"] == pytest.approx(0.050)  # both kernels of launch 1
    assert parts["projections"] == pytest.approx(0.010)  # launch 2's GEMM only
    assert parts["extend attention"] == pytest.approx(0.015)
    assert parts["copies"] == pytest.approx(0.005)
    kinds = out["launch_kinds"]
    assert kinds["cudaGraphLaunch"] == {"launches": 2, "device_us": 60.0}
    assert kinds["(unknown)"]["launches"] == 1  # the copy has no runtime event here
    (gap,) = out["top_gaps"]
    assert gap["after"] == "_extend_kernel" and gap["total_us"] == pytest.approx(10.0)


def test_main_reads_a_gzipped_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace_engine.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(make_trace(), f)
    assert load_trace(path) == make_trace()
    main([str(path), "--json", str(tmp_path / "s.json")])
    printed = capsys.readouterr().out
    assert "GPU busy 0.1 ms (88.9 %)" in printed and "encoder graph" in printed
    assert json.loads((tmp_path / "s.json").read_text())["num_gaps"] == 1
