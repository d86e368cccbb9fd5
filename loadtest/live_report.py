"""The live point's figures over its real-time part, from bench_live records.

`loadtest.bench_live` writes one JSON record per point with the engine's counters per
LATENCY_BUCKET_S of the sessions' time (`engine_by_time`, keys "START-END" in seconds). With a
head start the first buckets stream faster than real time; this report sums the buckets that
start within [--from-s, --to-s) and gives, per record: latency p50 / p95 / p99 / max (the whole
point, as bench_live measured it: per segment, per word, then per word without a head's
catch-up bucket, for records since session 27), hops a second, endpoint hops a
second, engine ms per hop (of it waiting on the GPU and encoding), prefill and decode-only steps
a second, prefill and decode ids per hop, forced ids per hop, and a hop's mean time from
submission to its end and to its first sampled id (servers since session 22; the rest is its
decoding); then latency p50 / p95 by bucket of meeting time (`latency_by_time`, then
`word_latency_by_time`). docs/benchmarks.md's live tables are these rows.

Usage: python -m loadtest.live_report call1_bench_live.jsonl call2_bench_live.jsonl \
    [--from-s 120 --to-s 240] [--all-records]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_FROM_S = 120.0  # s of the sessions' time: past the head start's catch-up (session 19)
DEFAULT_TO_S = 240.0


@dataclass(frozen=True)
class LiveFigures:
    """One record's engine figures over the chosen buckets (rates per second of wall time)."""

    seconds: float
    hops_per_s: float
    endpoint_hops_per_s: float
    engine_ms_per_hop: float
    wait_ms_per_hop: float
    encode_ms_per_hop: float
    prefill_steps_per_s: float
    decode_steps_per_s: float
    prefill_ids_per_hop: float
    decode_ids_per_hop: float
    forced_ids_per_hop: float
    hop_s: float  # mean s from a hop's submission to its end
    first_id_s: float | None  # of it, to its first sampled id (None: not in the records)


def bucket_span(name: str) -> tuple[float, float]:
    """(start, end) seconds of an engine_by_time key "START-END". Raises ValueError."""
    start, end = name.split("-")
    return float(start), float(end)


def figures(record: Mapping[str, Any], from_s: float, to_s: float) -> LiveFigures:
    """Sum the record's engine_by_time buckets starting in [from_s, to_s). Raises ValueError
    when none does or they hold no hop."""
    spans = [(bucket_span(name), b) for name, b in record.get("engine_by_time", {}).items()]
    buckets = [(span, b) for span, b in spans if from_s <= span[0] < to_s]
    if not buckets:
        raise ValueError(f"no engine_by_time bucket starts in [{from_s:g}, {to_s:g}) s")
    seconds = sum(end - start for (start, end), _ in buckets)
    # bench_live leaves out counters that stayed zero or were not measured
    hops = sum(b.get("live_hops", 0) for _, b in buckets)
    if hops == 0:
        raise ValueError("the buckets hold no live hop")

    def total(get: Callable[[Mapping[str, Any]], float]) -> float:
        return float(sum(get(b) for _, b in buckets))

    def part_s(b: Mapping[str, Any], name: str) -> float:
        return float(b.get("engine_step_s", {}).get(name, 0.0))

    def steps(b: Mapping[str, Any], kind: str) -> int:
        s = b.get("engine_steps", {})
        return int(s.get(f"{kind}_graph", 0) + s.get(f"{kind}_eager", 0))

    def per_hop(b: Mapping[str, Any], key: str) -> float:  # the records keep means per bucket
        return float(b.get(key, 0.0)) * b.get("live_hops", 0)

    has_first_id = any("live_hop_first_token_mean_s" in b for _, b in buckets)
    return LiveFigures(
        seconds=seconds,
        hops_per_s=hops / seconds,
        endpoint_hops_per_s=total(lambda b: b.get("live_endpoint_hops", 0)) / seconds,
        engine_ms_per_hop=1000.0 * total(lambda b: sum(b.get("engine_step_s", {}).values())) / hops,
        wait_ms_per_hop=1000.0 * total(lambda b: part_s(b, "wait")) / hops,
        encode_ms_per_hop=1000.0 * total(lambda b: part_s(b, "encode")) / hops,
        prefill_steps_per_s=total(lambda b: steps(b, "prefill")) / seconds,
        decode_steps_per_s=total(lambda b: steps(b, "decode")) / seconds,
        prefill_ids_per_hop=total(lambda b: b.get("prefill_tokens", 0)) / hops,
        decode_ids_per_hop=total(lambda b: b.get("decode_tokens", 0)) / hops,
        forced_ids_per_hop=total(lambda b: per_hop(b, "live_forced_mean_tokens")) / hops,
        hop_s=total(lambda b: per_hop(b, "live_hop_mean_s")) / hops,
        first_id_s=(
            total(lambda b: per_hop(b, "live_hop_first_token_mean_s")) / hops
            if has_first_id
            else None
        ),
    )


def latency_cell(record: Mapping[str, Any], prefix: str = "") -> str:
    """The record's latency "p50 / p95 / p99 / max" in seconds, two decimals: per segment, or
    with `prefix` "word_" per word, "steady_word_" per word after a head's catch-up ("-" for
    records without those figures)."""
    keys = [f"{prefix}latency_{q}_s" for q in ("p50", "p95", "p99", "max")]
    if any(record.get(k) is None for k in keys):
        return "-"
    return " / ".join(f"{record[k]:.2f}" for k in keys)


def final_cell(record: Mapping[str, Any]) -> str:
    """From `end` to transcript.final, "p50 / max" in seconds, then the server's mean per
    phase "(engine / hold)" where the record has it (bench_live since session 46); "-"
    without finals."""
    p50, most = record.get("final_after_end_p50_s"), record.get("final_after_end_max_s")
    if p50 is None or most is None:
        return "-"
    phases = record.get("final_phase_mean_s", {})
    split = ""
    if "engine" in phases and "hold" in phases:
        split = f" ({phases['engine']:.2f} / {phases['hold']:.2f})"
    return f"{p50:.2f} / {most:.2f}{split}"


def figures_row(label: str, record: Mapping[str, Any], f: LiveFigures) -> str:
    """One markdown row of FIGURES_HEADER's columns."""
    cells = [
        label,
        latency_cell(record),
        latency_cell(record, "word_"),
        latency_cell(record, "steady_word_"),
        f"{f.hops_per_s:.1f}",
        f"{f.endpoint_hops_per_s:.2f}",
        f"{f.engine_ms_per_hop:.2f}",
        f"{f.wait_ms_per_hop:.2f}",
        f"{f.encode_ms_per_hop:.2f}",
        f"{f.prefill_steps_per_s:.1f}",
        f"{f.decode_steps_per_s:.1f}",
        f"{f.prefill_ids_per_hop:.0f}",
        f"{f.decode_ids_per_hop:.1f}",
        f"{f.forced_ids_per_hop:.0f}",
        f"{f.hop_s:.2f} / " + ("-" if f.first_id_s is None else f"{f.first_id_s:.2f}"),
        final_cell(record),
    ]
    return "| " + " | ".join(cells) + " |"


FIGURES_HEADER = (
    "| record | p50 / p95 / p99 / max (s) | per word | per word after catch-up "
    "| hops / s | endpoint hops / s "
    "| engine ms / hop | of it waiting | of it encoding | prefill steps / s "
    "| decode-only steps / s | prefill ids / hop | decode ids / hop | forced ids / hop "
    "| hop s / to first id | end to final p50 / max (engine / hold) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def bucket_rows(
    labelled: Sequence[tuple[str, Mapping[str, Any]]], key: str = "latency_by_time"
) -> list[str]:
    """Latency p50 / p95 by meeting-time bucket, one column per record: per segment, or with
    `key` "word_latency_by_time" per word."""
    names: list[str] = []
    for _, record in labelled:
        for name in record.get(key, {}):
            if name not in names:
                names.append(name)
    names.sort(key=bucket_span)
    head = "bucket (s)" if key == "latency_by_time" else "bucket (s), per word"
    rows = [f"| {head} | " + " | ".join(label for label, _ in labelled) + " |"]
    rows.append("|---" * (len(labelled) + 1) + "|")
    for name in names:
        cells = []
        for _, record in labelled:
            b = record.get(key, {}).get(name)
            cells.append("-" if b is None else f"{b['p50_s']:.2f} / {b['p95_s']:.2f}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return rows


def load_records(path: Path, all_records: bool) -> list[Mapping[str, Any]]:
    """The records of a bench_live JSON-lines file: the last one, or every one."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records if all_records else records[-1:]


def report(
    labelled: Sequence[tuple[str, Mapping[str, Any]]], from_s: float, to_s: float
) -> list[str]:
    """The figures table (a row per labelled record, `figures` over [from_s, to_s)), a blank
    line, then the latency-by-bucket table (and the per-word one, when a record has it).
    Raises ValueError as `figures` does."""
    lines = [FIGURES_HEADER]
    for label, record in labelled:
        lines.append(figures_row(label, record, figures(record, from_s, to_s)))
    lines.append("")
    lines += bucket_rows(labelled)
    if any("word_latency_by_time" in record for _, record in labelled):
        lines += ["", *bucket_rows(labelled, "word_latency_by_time")]
    return lines


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records", nargs="+", type=Path, help="bench_live JSON-lines files")
    p.add_argument("--from-s", type=float, default=DEFAULT_FROM_S)
    p.add_argument("--to-s", type=float, default=DEFAULT_TO_S)
    p.add_argument("--all-records", action="store_true", help="every record, not the last")
    return p.parse_args(list(argv) if argv is not None else None)


def main(argv: Iterable[str] | None = None) -> None:
    """Print the report of the files on the command line, each record labelled by its file's
    stem (with its index under --all-records)."""
    args = parse_args(argv)
    labelled = []
    for path in args.records:
        records = load_records(path, args.all_records)
        for i, record in enumerate(records):
            label = path.stem if len(records) == 1 else f"{path.stem}[{i}]"
            labelled.append((label, record))
    try:
        lines = report(labelled, args.from_s, args.to_s)
    except ValueError as exc:  # a window without buckets or hops: the user's flags, no bug
        raise SystemExit(
            f"live_report: {exc} (--from-s/--to-s: seconds since the sessions started)"
        ) from None
    print("\n".join(lines))


if __name__ == "__main__":
    main()
