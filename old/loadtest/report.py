"""Benchmark report: markdown tables and a PNG from the JSON written on the GPU machine.

Inputs (any may be missing): `bench_engine.json` (loadtest/bench_engine.py), `hf_reference.json`
(loadtest/hf_reference.py), `http_sweep.jsonl` (loadtest/http_sweep.py). Each throughput figure
is shown as a ratio to
- the floor measured in the same run: a request's decode must read the decoder weights once
  per step and every running request's KV, so c requests of P prompt tokens and N outputs need
  at least N x W + c x kv x (N x P + N^2 / 2) bytes over the copy bandwidth (DESIGN.md 10;
  prefill and encoder time ignored, so the floor is optimistic);
- SGLang-Omni's published figures (long c1 75.8 and c16 136.3 audio-s/s on an H200, short c16
  ~380 on an H100: DESIGN.md 10) and the transformers reference (projected by hf_reference.py).
The plot shows audio-s/s and p95 latency against concurrency, one line per source x workload.
HTTP sweep points recorded with the engine's counters (`engine_steps`, newer sweeps on the
MOSS-TD backend) also show decode and prefill steps as CUDA graph / eager; older records show -.

Usage: python -m loadtest.report --engine e.json --hf hf.json --sweep s.jsonl --png plot.png
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from livemeet.audio.constants import SAMPLE_RATE, num_audio_tokens
from livemeet.models.prompt import HEADER_LEN, PromptConfig, audio_span

SUFFIX_LEN = 71  # prompt ids after the audio span with the default instruction (MODEL.md 5.1)
# Published SGLang-Omni figures, audio-s/s (DESIGN.md section 10): (workload, concurrency).
SGLANG_OMNI = {("long", 1): 75.8, ("long", 16): 136.3, ("short", 16): 380.0}
SGLANG_NOTE = "SGLang-Omni: long on H200, short c16 from the H100 writeup"
# DESIGN.md section 10 targets, audio-s/s: (workload, concurrency, KV) -> target
TARGETS = {
    ("long", 1, "bf16"): 110.0,
    ("long", 16, "bf16"): 160.0,
    ("long", 1, "fp8_e4m3"): 130.0,
    ("long", 16, "fp8_e4m3"): 300.0,
    ("short", 16, "bf16"): 800.0,
}


@dataclass(frozen=True)
class FloorModel:
    """What the floor needs: memory bandwidth (1e12 B/s; `render` passes the read-only figure
    measured in the same run, since a decode step reads weights and KV and writes almost
    nothing), weight bytes read per decode step and KV bytes per token (bf16)."""

    bandwidth_tb_per_s: float
    weight_bytes: int
    kv_bytes_per_token: int

    def audio_s_per_s(
        self, concurrency: int, audio_s: float, prompt: int, outputs: int, kv: str = "bf16"
    ) -> float:
        """Upper bound on audio-s/s for `concurrency` requests decoded in lockstep."""
        per_token = self.kv_bytes_per_token / (2 if kv == "fp8_e4m3" else 1)
        n = outputs
        total = n * self.weight_bytes + concurrency * per_token * (n * prompt + n * n / 2)
        seconds = total / (self.bandwidth_tb_per_s * 1e12)
        return concurrency * audio_s / seconds


def prompt_tokens(audio_s: float) -> int:
    """Prompt length of `audio_s` seconds with the default instruction (MODEL.md 5.1/5.3)."""
    span, _ = audio_span(num_audio_tokens(int(round(audio_s * SAMPLE_RATE))), PromptConfig())
    return HEADER_LEN + len(span) + SUFFIX_LEN


def load_json(path: str | None) -> Any:
    if not path or not Path(path).is_file():
        return None
    return json.loads(Path(path).read_text())


def load_jsonl(path: str | None) -> list[dict[str, Any]]:
    if not path or not Path(path).is_file():
        return []
    lines = Path(path).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _ratio(value: float, ref: float | None) -> str:
    return "-" if not ref else f"{value / ref:.2f}"


def hf_figures(hf: Any) -> dict[tuple[str, int], float]:
    """Projected transformers audio-s/s by (workload, batch)."""
    if not hf:
        return {}
    return {(p["workload"], p["batch"]): p["audio_s_per_s"] for p in hf["projections"]}


def graph_split(row: dict[str, Any], phase: str) -> str:
    """Steps of `phase` (decode or prefill) in a sweep point as "graph / eager"; "-" without
    engine counters (older records, backends without a step engine)."""
    steps = row.get("engine_steps")
    if not steps:
        return "-"
    return f"{steps.get(f'{phase}_graph', 0):,} / {steps.get(f'{phase}_eager', 0):,}"


def throughput_table(
    title: str,
    rows: list[dict[str, Any]],
    floor: FloorModel | None,
    hf: dict[tuple[str, int], float],
    output_tokens: dict[str, int],
) -> list[str]:
    """One markdown table of throughput points (engine runs or sweep points); when any row has
    engine counters, two more columns: decode and prefill steps, CUDA graph / eager."""
    steps = any(r.get("engine_steps") for r in rows)
    extra = " decode steps graph / eager | prefill steps graph / eager |" if steps else ""
    lines = [
        f"### {title}",
        "",
        "| workload | KV | c | n | req/s | audio-s/s | RTF mean | latency mean s | p95 s "
        "| floor | x floor | x SGLang-Omni | x transformers | target | errors |" + extra,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        + ("---|---|" if steps else ""),
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['workload']} | - | {r['concurrency']} | skipped: {r['skipped']} |")
            continue
        kv = r.get("kv_cache_dtype", "bf16")
        key = (r["workload"], r["concurrency"])
        floor_v = None
        if floor is not None:
            prompt = r.get("prompt_tokens") or prompt_tokens(r["audio_s"])
            outputs = r.get("output_tokens") or output_tokens.get(r["workload"], 0)
            if outputs:
                floor_v = floor.audio_s_per_s(r["concurrency"], r["audio_s"], prompt, outputs, kv)
        target = TARGETS.get((*key, kv))
        lines.append(
            f"| {r['workload']} | {kv} | {r['concurrency']} | {r['num_requests']} | "
            f"{r['req_per_s']:.3f} | {r['audio_s_per_s']:.1f} | {r['rtf_mean']:.4f} | "
            f"{r['latency_mean_s']:.2f} | {r['latency_p95_s']:.2f} | "
            f"{'-' if floor_v is None else f'{floor_v:.0f}'} | "
            f"{_ratio(r['audio_s_per_s'], floor_v)} | "
            f"{_ratio(r['audio_s_per_s'], SGLANG_OMNI.get(key))} | "
            f"{_ratio(r['audio_s_per_s'], hf.get(key))} | "
            f"{'-' if target is None else f'{target:.0f}'} | {r.get('num_errors', 0)} |"
            + (f" {graph_split(r, 'decode')} | {graph_split(r, 'prefill')} |" if steps else "")
        )
    return lines + [""]


HF_CONTEXT_MATCH = 0.1  # relative context difference within which a reference row matches


def hf_ms_for(hf: Any, batch: int, context: int) -> float | None:
    """transformers' ms/step at this batch and the nearest measured context within
    HF_CONTEXT_MATCH (the engine's contexts include the prompt: 1069 vs 1024), or None."""
    rows = [d for d in (hf or {}).get("decode", []) if d["batch"] == batch]
    if not rows:
        return None
    best = min(rows, key=lambda d: abs(d["context"] - context))
    close = abs(best["context"] - context) <= HF_CONTEXT_MATCH * context
    return float(best["ms_per_step"]) if close else None


def decode_table(engine: dict[str, Any], hf: Any) -> list[str]:
    lines = [
        "### Decode step vs floor",
        "",
        f"copy bandwidth {engine['bandwidth']['copy_tb_per_s']:.2f} TB/s, read-only "
        f"{engine['bandwidth']['read_tb_per_s']:.2f} TB/s, weights "
        f"{engine['weight_bytes'] / 1e9:.3f} GB per step, "
        f"KV {engine['kv_bytes_per_token']} B/token",
        "",
        "| KV | batch | context | ms/step | floor ms (copy) | floor ms (read) | x floor "
        "| transformers ms/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in engine["decode"]:
        ref = hf_ms_for(hf, d["batch"], d["context"])
        lines.append(
            f"| {d['kv_cache_dtype']} | {d['batch']} | {d['context']} | {d['ms_per_step']:.2f} | "
            # x floor against the read-only floor, like every other table (bench JSON before
            # session 3 stored floor_ms / ms_per_step, the copy floor, as x_floor)
            f"{d['floor_ms']:.2f} | {d['floor_read_ms']:.2f} | "
            f"{d['floor_read_ms'] / d['ms_per_step']:.2f} | "
            f"{'-' if ref is None else f'{ref:.2f}'} |"
        )
    return lines + [""]


def hf_table(hf: dict[str, Any]) -> list[str]:
    lines = [
        "### transformers reference (PROJECTED from measured ms/step)",
        "",
        "| workload | batch | prompt | outputs | encoder s | prefill s | decode s (projected) "
        "| total s (projected) | audio-s/s (projected) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in hf["projections"]:
        lines.append(
            f"| {p['workload']} | {p['batch']} | {p['prompt_tokens']} | {p['output_tokens']} | "
            f"{p['encoder_s']:.2f} | {p['prefill_s']:.2f} | {p['decode_s']:.1f} | "
            f"{p['total_s']:.1f} | {p['audio_s_per_s']:.2f} |"
        )
    return lines + [""]


def render(engine: Any, hf: Any, sweep: list[dict[str, Any]]) -> str:
    """The whole markdown report."""
    floor = None
    if engine:
        floor = FloorModel(
            engine["bandwidth"]["read_tb_per_s"],
            engine["weight_bytes"],
            engine["kv_bytes_per_token"],
        )
    outputs = {r["workload"]: r["output_tokens"] for r in (engine or {}).get("runs", [])}
    for name, tokens in (("long", 12_320), ("short", 64)):
        outputs.setdefault(name, tokens)
    figures = hf_figures(hf)
    lines = [f"## Benchmarks ({(engine or {}).get('device', 'device unknown')})", ""]
    if engine:
        lines += decode_table(engine, hf)
        runs = engine["runs"] + [{**s, "skipped": s["reason"]} for s in engine["skipped"]]
        lines += throughput_table("Engine (offline)", runs, floor, figures, outputs)
    points = [r for r in sweep if "event" not in r]
    if points:
        lines += throughput_table("HTTP sweep", points, floor, figures, outputs)
    if hf:
        lines += hf_table(hf)
    lines.append(
        f"Notes: {SGLANG_NOTE}; floors use the read-only bandwidth of the same run and "
        "ignore prefill and encoder time."
    )
    return "\n".join(lines)


def plot(engine: Any, sweep: list[dict[str, Any]], path: Path) -> None:
    """audio-s/s and p95 latency against concurrency (log2 x), a line per source x workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict[str, Any]]] = {}
    for r in (engine or {}).get("runs", []):
        series.setdefault(f"engine {r['workload']} {r['kv_cache_dtype']}", []).append(r)
    for r in sweep:
        if "event" not in r and "skipped" not in r:
            series.setdefault(f"http {r['workload']}", []).append(r)
    fig, (ax_tp, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, rows in sorted(series.items()):
        rows = sorted(rows, key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in rows]
        ax_tp.plot(cs, [r["audio_s_per_s"] for r in rows], marker="o", label=label)
        ax_lat.plot(cs, [r["latency_p95_s"] for r in rows], marker="o", label=label)
    for (workload, c), value in SGLANG_OMNI.items():
        ax_tp.scatter([c], [value], marker="x", color="black")
        ax_tp.annotate(f"SGLang-Omni {workload}", (c, value), fontsize=7)
    for ax, ylabel in ((ax_tp, "audio-s/s"), (ax_lat, "p95 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    ax_lat.set_yscale("log")
    ax_tp.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", default=None, help="bench_engine JSON")
    p.add_argument("--hf", default=None, help="hf_reference JSON")
    p.add_argument("--sweep", default=None, help="http_sweep JSON lines")
    p.add_argument("--png", default=None, help="write the plot here")
    p.add_argument("--md", default=None, help="also write the markdown here")
    args = p.parse_args(argv)
    engine, hf, sweep = load_json(args.engine), load_json(args.hf), load_jsonl(args.sweep)
    text = render(engine, hf, sweep)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.png:
        plot(engine, sweep, Path(args.png))
    return text


if __name__ == "__main__":
    main()
