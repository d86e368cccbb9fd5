"""Sweep the skinny tl.dot projection's launch configurations at 2..16 rows on a GPU.

For each of the decoder's projection shapes (MOSS-TD's Qwen3: qkv, o, gate_up, down;
livemeet.models.config) at `--rows` rows, times F.linear (cuBLAS) and every `GemmConfig` of a
grid wider than the tuner's DOT_CANDIDATES (block_n, block_k, warps, pipeline stages, K
splits), each output first checked against F.linear, the way `LinearPlan.tune` times them:
back to back in a CUDA graph over enough weight copies to defeat the L2 cache
(livemeet.layers.linear). Reported per shape: cuBLAS, the tuner's pick among its candidates,
and the sweep's fastest configurations, in us per call and as weight bytes over the
read-only bandwidth measured in the same run (the floor of a projection at this size). It
tells whether a configuration the tuner does not time would win (session 39 measured the
2..16-row projections at ~23 us a layer against ~9.6 us of weights on an H100).

Usage: python -m loadtest.sweep_linear [--rows 16] [--json sweep_linear.json]
       [--max-seconds 200]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from livemeet.layers import linear
from livemeet.layers.linear import (
    GemmConfig,
    dot_candidates,
    full_wave,
    per_call_us,
    tune_copies,
)
from loadtest.bench_attention import read_bandwidth_tb_per_s

# (N, K) of the decoder's projections: hidden 1024, 16 query + 8 KV heads of 128, MLP 3072
SHAPES = {
    "qkv": (4096, 1024),
    "o_proj": (1024, 2048),
    "gate_up": (6144, 1024),
    "down_proj": (1024, 3072),
}
GRID = {
    "block_n": (16, 32, 64),
    "block_k": (128, 256, 512),
    "num_warps": (2, 4, 8),
    "num_stages": (2, 3, 4),
    "split_k": (1, 2, 4, 8),
}
# weight-tile elements per thread above which a configuration is left out (registers: the
# 2-warp 16 x 512 tile, at 128, already takes ~200 of them)
MAX_TILE_PER_THREAD = 128
TOP = 8  # fastest configurations printed per shape


@dataclass(frozen=True)
class Row:
    """One timed (shape, configuration); config None: cuBLAS."""

    shape: str
    n: int
    k: int
    rows: int
    config: dict[str, int] | None
    us: float
    fraction_of_read_bw: float
    tuner_candidate: bool


def candidates(n: int, k: int, num_sms: int) -> list[GemmConfig]:
    """The tuner's candidates for an [n, k] weight (`dot_candidates`), then the grid's: a
    program for every SM (`full_wave`, as the tuner asks), every K split at least one block_k
    wide, the weight tile within MAX_TILE_PER_THREAD elements per thread."""
    out = dot_candidates(n, num_sms)
    for values in itertools.product(*GRID.values()):
        config = GemmConfig(**dict(zip(GRID, values, strict=True)))
        if config.block_n > n or not full_wave(config, n, num_sms):
            continue
        if config.split_k > 1 and k // config.split_k < config.block_k:
            continue
        if config.block_n * config.block_k > MAX_TILE_PER_THREAD * 32 * config.num_warps:
            continue
        if config not in out:
            out.append(config)
    return out


class ShapeBench:
    """One projection shape's weights (enough copies to defeat L2), input and reference."""

    def __init__(self, name: str, rows: int, read_bw: float) -> None:
        self.name, (self.n, self.k), self.rows = name, SHAPES[name], rows
        weight = torch.randn(self.n, self.k, device="cuda", dtype=torch.bfloat16) * 0.02
        self.copies = tune_copies(weight.numel() * weight.element_size())
        self.ws = [weight] + [torch.randn_like(weight) * 0.02 for _ in range(self.copies - 1)]
        self.x = torch.randn(rows, self.k, device="cuda", dtype=torch.bfloat16)
        self.ref = F.linear(self.x.float(), weight.float())
        self.floor_us = weight.numel() * weight.element_size() / (read_bw * 1e12) * 1e6
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.tuner = set(dot_candidates(self.n, num_sms))
        self.grid = set(candidates(self.n, self.k, num_sms))

    def row(self, config: GemmConfig | None, us: float) -> Row:
        """The Row of `config` (None: cuBLAS) timed at `us` microseconds a call."""
        as_dict = None if config is None else asdict(config)
        tuner = config in self.tuner
        return Row(self.name, self.n, self.k, self.rows, as_dict, us, self.floor_us / us, tuner)

    def cublas(self) -> Row:
        """F.linear (cuBLAS) timed as the tuner times its baseline."""
        x = self.x
        return self.row(None, per_call_us(lambda: [F.linear(x, w) for w in self.ws], self.copies))

    def time(self, config: GemmConfig) -> Row | None:
        """The configuration's row, or None (and a line saying why) when it fails or is wrong."""
        x = self.x
        try:
            got = linear.skinny_linear(x, self.ws[0], config).float()
            if float((got - self.ref).abs().max()) > 2e-2 * float(self.ref.abs().max()):
                print(f"  {self.name} {config}: wrong output, left out", flush=True)
                return None
            fn = lambda: [linear.skinny_linear(x, w, config) for w in self.ws]  # noqa: E731
            return self.row(config, per_call_us(fn, self.copies))
        except Exception as exc:  # out of registers or shared memory on this GPU
            print(f"  {self.name} {config}: skipped ({type(exc).__name__})", flush=True)
            return None


def sweep(benches: list[ShapeBench], deadline: float) -> list[Row]:
    """cuBLAS on every shape, then configuration by configuration (the tuner's first, so a
    deadline leaves the comparison whole) on every shape whose grid has it."""
    rows = [b.cublas() for b in benches]
    tuner = {c for b in benches for c in b.tuner}
    every = {c for b in benches for c in b.grid}
    ordered = sorted(tuner, key=repr) + sorted(every - tuner, key=repr)
    for i, config in enumerate(ordered):
        if time.monotonic() > deadline:
            print(f"out of time after {i} of {len(ordered)} configurations", flush=True)
            break
        for bench in benches:
            if config in bench.grid:
                row = bench.time(config)
                rows += [row] if row is not None else []
    return rows


def summary(rows: list[Row]) -> list[str]:
    """Per shape: cuBLAS, the tuner's pick, and the TOP fastest configurations."""
    lines = []
    for name in dict.fromkeys(r.shape for r in rows):
        mine = [r for r in rows if r.shape == name]
        cublas = next(r for r in mine if r.config is None)
        timed = sorted((r for r in mine if r.config is not None), key=lambda r: r.us)
        picks = [r for r in timed if r.tuner_candidate]
        lines.append(f"{name} {mine[0].n}x{mine[0].k} at {mine[0].rows} rows:")
        lines.append(f"  cuBLAS {cublas.us:.2f} us ({cublas.fraction_of_read_bw:.2f} of read BW)")
        if picks:
            lines.append(
                f"  tuner's pick {picks[0].us:.2f} us ({picks[0].fraction_of_read_bw:.2f}) "
                f"{picks[0].config}"
            )
        for r in timed[:TOP]:
            mark = " (a tuner candidate)" if r.tuner_candidate else ""
            lines.append(f"  {r.us:.2f} us ({r.fraction_of_read_bw:.2f}) {r.config}{mark}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=linear.SKINNY_MAX_M)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--max-seconds", type=float, default=200.0)
    parser.add_argument("--json", default="sweep_linear.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sweep_linear needs a CUDA device")
    if not 2 <= args.rows <= linear.SKINNY_MAX_M:
        raise SystemExit(f"--rows must be 2..{linear.SKINNY_MAX_M} (the tl.dot kernel's rows)")
    start = time.monotonic()
    torch.manual_seed(0)
    read_bw = read_bandwidth_tb_per_s()
    print(f"read-only bandwidth {read_bw:.2f} TB/s", flush=True)
    benches = [ShapeBench(name, args.rows, read_bw) for name in args.shapes.split(",")]
    rows = sweep(benches, start + args.max_seconds)
    for line in summary(rows):
        print(line)
    with open(args.json, "w") as f:
        json.dump({"read_bw_tb_s": read_bw, "rows": [asdict(r) for r in rows]}, f, indent=1)
    print(f"wrote {args.json} in {time.monotonic() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
