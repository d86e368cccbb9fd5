"""Where a sustained engine step's time goes: the Engine's loop, not a bare `launch`.

`bench_decode_step` times one `ModelRunner.launch` in isolation; the Engine adds scheduling,
async decode's one-step lookahead, the token transfer and postprocessing, and runs for minutes.
Where its decode ms/step exceeds the bare launch's device time, either the GPU idles between
steps (the host does not keep it fed) or its kernels run slower than in isolation. This tool
tells which (docs/benchmarks.md, session 10: at long c1 bf16 on an H200 neither; the Engine's
1.683 ms per step is the bare launch's 1.695 ms):

1. Decode: `--batch` requests of `--context` prompt tokens are prefilled, then `--steps` decode
   steps are timed by wall clock (GPU synchronised at both ends only), with the engine's host
   seconds per part (EngineStats). Then `--profile-steps` steps run under torch.profiler
   (CUDA activity only, to keep the host as it was): GPU busy time (the union of kernel, copy
   and memset intervals) against the span, the idle gaps between device activities (grouped
   by the activities on either side) and the kernel table.
2. Prefill (`--prefill`): the steps that hold a prefill chunk, from submission to the first
   pure decode step, each synchronised and profiled: per step its chunks, decode rows,
   estimated cost and device time by kernel family (extend attention, decode attention,
   projections, the rest), which shows what a mixed step's decode rows cost.

Writes JSON (`--json`) and prints a summary. Usage (GPU):
    python -m loadtest.profile_engine --batch 1 --context 36000 --json profile_engine.json
    python -m loadtest.profile_engine --batch 16 --context 29700 --prefill \
        --kv-cache-dtype fp8_e4m3 --steps 50
`--config tiny` runs on the CPU in seconds (the smoke test; no device activity to report).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from livemeet.engine.engine import Engine
from livemeet.engine.scheduler import ScheduledBatch
from loadtest.bench_engine import (
    BatchLog,
    add_noise_requests,
    build_engine,
    step_until_decoding,
    synchronize,
)

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")  # chrome-trace "cat" of device work
MIN_GAP_US = 1.0  # idle intervals shorter than this are launch jitter, not host starvation
FAMILIES = (  # kernel-name fragments -> family, first match wins
    ("_extend_kernel", "extend attention"),
    ("decode", "decode attention"),
    ("_skinny", "projections"),
    ("gemm", "projections"),
    ("nvjet", "projections"),
    ("cutlass", "projections"),
    ("Memcpy", "copies"),
    ("Memset", "copies"),
)


@dataclass(frozen=True)
class DeviceActivity:
    """One kernel, copy or memset on the GPU timeline (microseconds, the trace's clock)."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class GapGroup:
    """Idle gaps between device activities named `before` and `after`."""

    before: str
    after: str
    count: int
    total_us: float


@dataclass(frozen=True)
class Timeline:
    """GPU occupancy over a profiled window: `busy_us` is the union of activity intervals,
    `idle_us` the gaps of at least MIN_GAP_US between them, `span_us` first start to last end."""

    span_us: float
    busy_us: float
    idle_us: float
    num_gaps: int
    top_gaps: tuple[GapGroup, ...]


def device_activities(trace: dict[str, Any]) -> list[DeviceActivity]:
    """The device events of a chrome trace (torch.profiler's `export_chrome_trace`), by start."""
    out = [
        DeviceActivity(str(e["name"]), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES
    ]
    return sorted(out, key=lambda a: (a.start_us, a.end_us))


def timeline(acts: Sequence[DeviceActivity], top: int = 8) -> Timeline:
    """Busy and idle time of `acts` (sorted by start; overlapping intervals, as PDL's are,
    count once) and the `top` gap groups by total idle time."""
    if not acts:
        return Timeline(0.0, 0.0, 0.0, 0, ())
    busy = idle = 0.0
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    cur_start, cur_end, last_name = acts[0].start_us, acts[0].end_us, acts[0].name
    for a in acts[1:]:
        if a.start_us > cur_end:
            busy += cur_end - cur_start
            gap = a.start_us - cur_end
            if gap >= MIN_GAP_US:
                idle += gap
                groups[(short_name(last_name), short_name(a.name))].append(gap)
            cur_start, cur_end = a.start_us, a.end_us
        else:
            cur_end = max(cur_end, a.end_us)
        if a.end_us >= cur_end:
            last_name = a.name
    busy += cur_end - cur_start
    ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]
    return Timeline(
        span_us=max(a.end_us for a in acts) - acts[0].start_us,
        busy_us=busy,
        idle_us=idle,
        num_gaps=sum(len(v) for v in groups.values()),
        top_gaps=tuple(GapGroup(b, a, len(v), sum(v)) for (b, a), v in ranked),
    )


def short_name(name: str, width: int = 60) -> str:
    """`name` cut to `width` characters (kernel names from C++ templates run to hundreds)."""
    return name if len(name) <= width else name[: width - 3] + "..."


def family(name: str) -> str:
    """The kernel family (FAMILIES) of a device activity's name; "other" when none matches."""
    lowered = name.lower()
    for fragment, fam in FAMILIES:
        if fragment.lower() in lowered:
            return fam
    return "other"


def kernel_table(acts: Iterable[DeviceActivity], per: int) -> list[dict[str, Any]]:
    """Activities grouped by name: calls and device microseconds, also per `per` steps."""
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for a in acts:
        total[a.name] += a.end_us - a.start_us
        calls[a.name] += 1
    rows = [
        {"name": short_name(n), "calls": calls[n], "us": t, "us_per_step": t / max(per, 1)}
        for n, t in total.items()
    ]
    return sorted(rows, key=lambda r: -r["us"])


def by_family(acts: Iterable[DeviceActivity]) -> dict[str, float]:
    """Device microseconds per kernel family (FAMILIES)."""
    out: dict[str, float] = defaultdict(float)
    for a in acts:
        out[family(a.name)] += a.end_us - a.start_us
    return dict(out)


# ------------------------------------------------------------------ running the engine


def _profiled(fn: Any, steps: int, device: torch.device) -> tuple[list[DeviceActivity], float]:
    """Run `fn()` `steps` times under torch.profiler (CUDA activity only: the host keeps its
    pace); returns the device activities and the wall ms per call."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return device_activities(trace), wall_ms


def profile_prefill(engine: Engine, log: BatchLog) -> list[dict[str, Any]]:
    """Step until the first pure decode step, each step synchronised and profiled on its own;
    per prefill step its shape, wall ms and device microseconds by kernel family."""
    rows: list[dict[str, Any]] = []
    while True:
        acts, wall_ms = _profiled(engine.step, 1, engine.runner.device)
        batch = log.last
        if not batch.prefills:
            return rows
        families = {k: round(v, 1) for k, v in by_family(acts).items()}
        rows.append({**step_shape(batch), "wall_ms": round(wall_ms, 2), "device_us": families})


def step_shape(batch: ScheduledBatch) -> dict[str, Any]:
    """A step's prefill chunks (start, tokens), decode rows and the scheduler's estimate."""
    return {
        "chunks": [(c.start, c.num_tokens) for c in batch.prefills],
        "decode_rows": len(batch.decodes),
        "decode_context": sum(r.num_tokens for r in batch.decodes),
        "estimated_ms": round(1e3 * batch.estimated_cost_s, 2),
    }


def profile_decode(
    engine: Engine, log: BatchLog, batch: int, steps: int, profile_steps: int
) -> dict[str, Any]:
    """Steady-state decode: wall ms/step and host parts, then a profiled window."""
    device = engine.runner.device
    step_until_decoding(engine, log, batch)
    for _ in range(8):  # past the first lookahead steps
        engine.step()
    before = engine.stats().host_s
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    synchronize(device)
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    after = engine.stats().host_s
    _check_full(log, batch)
    host_ms = {part: 1e3 * (after[part] - before[part]) / steps for part in after}
    context = statistics.fmean(r.num_tokens for r in log.last.decodes)
    syncs = host_syncs(engine, 5)
    acts, profiled_ms = _profiled(engine.step, profile_steps, device)
    _check_full(log, batch)
    tl = timeline(acts)
    return {
        "batch": batch,
        "context": round(context),
        "steps": steps,
        "wall_ms_per_step": wall_ms,
        "host_ms_per_step": host_ms,
        "profiled_wall_ms_per_step": profiled_ms,
        "host_syncs": syncs,
        "device_busy_ms_per_step": tl.busy_us / 1e3 / profile_steps,
        "device_idle_ms_per_step": tl.idle_us / 1e3 / profile_steps,
        "timeline": asdict(tl),
        "families_us_per_step": {
            k: v / profile_steps for k, v in sorted(by_family(acts).items(), key=lambda kv: -kv[1])
        },
        "kernels": kernel_table(acts, profile_steps)[:25],
    }


def host_syncs(engine: Engine, steps: int) -> list[str]:
    """Warnings of torch's CUDA sync debug mode over `steps` engine steps: every operation
    that made the host wait for the GPU (the token transfer's own wait does not count: it
    waits on an event). Empty on the CPU."""
    if engine.runner.device.type != "cuda":
        return []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sorted({short_name(str(w.message), 200) for w in caught})


def _check_full(log: BatchLog, batch: int) -> None:
    """Raises RuntimeError when the last step no longer decoded all `batch` requests (one
    finished inside a timed window, which would then mix batch sizes)."""
    rows = len(log.last.decodes)
    if rows != batch or log.last.prefills:
        raise RuntimeError(f"the batch shrank from {batch} to {rows} decode rows while timed")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", choices=("real", "tiny"), default="real")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8_e4m3"))
    p.add_argument("--batch", type=int, default=1, help="requests decoding together")
    p.add_argument("--context", type=int, default=36_000, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=300, help="timed decode steps")
    p.add_argument("--profile-steps", type=int, default=20, help="profiled decode steps")
    p.add_argument("--prefill", action="store_true", help="also profile every prefill step")
    p.add_argument("--json", default="profile_engine.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    engine = build_engine(
        args.config,
        device=args.device,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        eager=False,
    )
    log = BatchLog(engine)
    decode_steps = args.steps + args.profile_steps + 64  # and the lookahead and sync steps
    add_noise_requests(engine, "profile", args.batch, args.context, decode_steps)
    report: dict[str, Any] = {"argv": vars(args)}
    if args.prefill:
        report["prefill"] = profile_prefill(engine, log)
        for row in report["prefill"]:
            print(json.dumps(row), flush=True)
    report["decode"] = profile_decode(engine, log, args.batch, args.steps, args.profile_steps)
    print(summary(report["decode"]), flush=True)
    for request in [*engine.scheduler.running, *engine.scheduler.waiting]:
        engine.abort(request.request_id)
    Path(args.json).write_text(json.dumps(report, indent=2))
    return report


def summary(d: dict[str, Any]) -> str:
    """Printable lines of `profile_decode`'s report."""
    host = ", ".join(f"{k} {v:.3f}" for k, v in d["host_ms_per_step"].items())
    lines = [
        f"decode {d['batch']} x {d['context']}: wall {d['wall_ms_per_step']:.3f} ms/step "
        f"(profiled {d['profiled_wall_ms_per_step']:.3f}); host ms/step: {host}",
        f"  host syncs in 5 steps: {d['host_syncs'] or 'none'}",
        f"  device busy {d['device_busy_ms_per_step']:.3f} ms/step, idle "
        f"{d['device_idle_ms_per_step']:.3f} ms/step in {d['timeline']['num_gaps']} gaps",
    ]
    lines += [
        f"  gap {g['before']} -> {g['after']}: {g['count']} x, {g['total_us']:.0f} us"
        for g in d["timeline"]["top_gaps"]
    ]
    lines += [f"  {k}: {v:.1f} us/step" for k, v in d["families_us_per_step"].items()]
    lines += [
        f"  {r['us_per_step']:9.1f} us/step {r['calls']:6d} x  {r['name']}" for r in d["kernels"]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
