"""Summarise a device trace of a running server (livemeet/engine/trace_window.py).

Reads the gzipped chrome trace the engine worker wrote (CUDA activity only) and prints, over
the traced window:
- the GPU's busy and idle time (the union of kernel, copy and memset intervals; gaps of at least
  profile_engine.MIN_GAP_US), and the largest idle-gap groups by their neighbouring kernels;
- device time per part: the encoder's graph replays (a graph launch whose kernels include
  a convolution), the log-mel's FFTs, then every other kernel by profile_engine's families
  (extend attention, decode attention, projections, copies, other);
- device time per launch kind (graph replays against eager launches) and the kernel table.

Usage: python -m loadtest.trace_summary trace_engine.json.gz [--json out.json] [--top 25]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest.profile_engine import (
    DEVICE_CATEGORIES,
    DeviceActivity,
    family,
    kernel_table,
    timeline,
)

GRAPH_LAUNCH = "cudaGraphLaunch"
# host calls that launch device work: the runtime's, and the driver's (Triton launches)
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
LOG_MEL_MARKER = "fft"  # cuFFT's kernels: the log-mel's STFT (eager, before the encoder graph)
# kernel-name fragments only the audio encoder's graph has: cuDNN's convolutions (forward
# "fprop" implicit GEMMs, and the layout changes around them)
ENCODER_MARKERS = ("fprop", "nchwtonhwc", "nhwctonchw")


@dataclass(frozen=True)
class Kernel:
    """A device activity with the host call that launched it (its correlation id's)."""

    activity: DeviceActivity
    correlation: int | None
    launcher: str  # the runtime call's name, "" when the trace has none


def load_trace(path: Path) -> dict[str, Any]:
    """The chrome trace (torch.profiler's export_chrome_trace JSON) at `path`, gzipped when
    its name ends in .gz. Raises OSError or json.JSONDecodeError for an unreadable file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        return json.load(f)  # type: ignore[no-any-return]


def kernels(trace: dict[str, Any]) -> list[Kernel]:
    """The device events of `trace`, by start, each with its launching runtime call."""
    events = trace.get("traceEvents", [])
    launchers: dict[int, str] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launchers[int(corr)] = str(e.get("name", ""))
    out: list[Kernel] = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATEGORIES:
            continue
        start = float(e["ts"])
        act = DeviceActivity(str(e["name"]), start, start + float(e.get("dur", 0)))
        corr = (e.get("args") or {}).get("correlation")
        corr = int(corr) if corr is not None else None
        out.append(Kernel(act, corr, launchers.get(corr, "") if corr is not None else ""))
    return sorted(out, key=lambda k: (k.activity.start_us, k.activity.end_us))


def encoder_correlations(ks: Sequence[Kernel]) -> set[int]:
    """Correlation ids of graph launches that ran an encoder kernel (ENCODER_MARKERS)."""
    out: set[int] = set()
    for k in ks:
        name = k.activity.name.lower()
        if k.launcher == GRAPH_LAUNCH and k.correlation is not None:
            if any(m in name for m in ENCODER_MARKERS):
                out.add(k.correlation)
    return out


def parts(ks: Sequence[Kernel]) -> dict[str, float]:
    """Device microseconds per part: "encoder graph", then profile_engine's families."""
    enc = encoder_correlations(ks)
    out: dict[str, float] = defaultdict(float)
    for k in ks:
        dur = k.activity.end_us - k.activity.start_us
        if k.correlation in enc:
            key = "encoder graph"
        elif LOG_MEL_MARKER in k.activity.name.lower():
            key = "log-mel fft"
        else:
            key = family(k.activity.name)
        out[key] += dur
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def launch_kinds(ks: Sequence[Kernel]) -> dict[str, dict[str, float]]:
    """Per launching call (graph launch, kernel launch, copy, ...): launches and device us."""
    us: dict[str, float] = defaultdict(float)
    launches: dict[str, set[int]] = defaultdict(set)
    for k in ks:
        name = k.launcher or "(unknown)"
        us[name] += k.activity.end_us - k.activity.start_us
        if k.correlation is not None:
            launches[name].add(k.correlation)
    return {
        name: {"launches": len(launches[name]), "device_us": t}
        for name, t in sorted(us.items(), key=lambda kv: -kv[1])
    }


def summarise(trace: dict[str, Any], top: int = 25) -> dict[str, Any]:
    """The printed summary as a dict (module docstring): span, busy and idle time in ms with
    the busy fraction, the idle-gap groups, device ms per part, launch kinds and the `top`
    kernels by device time."""
    ks = kernels(trace)
    acts = [k.activity for k in ks]
    tl = timeline(acts)
    return {
        "span_ms": tl.span_us / 1e3,
        "busy_ms": tl.busy_us / 1e3,
        "idle_ms": tl.idle_us / 1e3,
        "busy_fraction": tl.busy_us / tl.span_us if tl.span_us else 0.0,
        "num_gaps": tl.num_gaps,
        "top_gaps": [asdict(g) for g in tl.top_gaps],
        "parts_ms": {k: v / 1e3 for k, v in parts(ks).items()},
        "launch_kinds": launch_kinds(ks),
        "kernels": kernel_table(acts, 1)[:top],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trace", type=Path)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    out = summarise(load_trace(args.trace), args.top)
    span = out["span_ms"]
    busy = f"GPU busy {out['busy_ms']:.1f} ms ({100 * out['busy_fraction']:.1f} %)"
    print(f"span {span:.1f} ms, {busy}, idle {out['idle_ms']:.1f} ms in {out['num_gaps']} gaps")
    print("device time by part (ms, % of span):")
    for name, ms in out["parts_ms"].items():
        print(f"  {name:20s} {ms:9.1f} {100 * ms / span if span else 0:6.1f}")
    print("by launching call (launches, device ms):")
    for name, row in out["launch_kinds"].items():
        print(f"  {name:28s} {row['launches']:7d} {row['device_us'] / 1e3:9.1f}")
    print("largest idle gaps (before -> after: count, ms):")
    for g in out["top_gaps"]:
        print(f"  {g['before']} -> {g['after']}: {g['count']}, {g['total_us'] / 1e3:.1f}")
    print("kernels (calls, ms):")
    for row in out["kernels"]:
        print(f"  {row['calls']:7d} {row['us'] / 1e3:9.1f}  {row['name']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
