"""Sweep the extend (prefill) attention kernel's launch configurations on a GPU.

Long prompts spend most of their prefill in this kernel: on an H200 the 16 prompts of long c16
(29.7k tokens each, FP8 KV) ran it for 7.4 s of device time in 13.9 s of prefill steps, at 281
TFLOP/s in the steps without decode rows (docs/benchmarks.md, session 10, call 1). For each KV
dtype (bf16, e4m3 with bf16 queries) and chunk shape, times `paged_extend_attention` for one
layer (16 query heads, 8 KV heads, head_dim 128, blocks of the engine's KV_BLOCK_SIZE tokens in
shuffled order) with each `ExtendKernelConfig` candidate, and reports TFLOP/s ((query, key)
pairs x 4 x heads x head_dim / time). A candidate's output is first compared with the default
configuration's (max |delta|; above MAX_DELTA it cannot be chosen); one that does not compile
(too much shared memory) is reported and skipped. The best candidate per dtype, by total time
over the shapes, is printed last.

`--block-sizes 16,64,128` times instead the default configuration at every shape over caches
paged in blocks of each size (a tile of 128 keys then lies in one block from 128 on: one
block-table read per tile instead of one per key).

Usage: python -m loadtest.sweep_extend_kernel [--json out.json] [--max-seconds 200]
    [--block-sizes 16,64,128]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from livemeet.audio.constants import KV_BLOCK_SIZE
from livemeet.layers import paged_attention as pa
from loadtest.bench_decode_step import device_ms

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, KV_BLOCK_SIZE
FP8_SCALE = 0.05  # per-tensor scale of the FP8 cache (values ~N(0, 1) / scale stay < 448)
# outputs are softmax-weighted averages of ~N(0, 1) values; another summation order moves them
# by a few bf16 ulps, a wrong kernel by far more
MAX_DELTA = 0.02
# (cached prefix, new tokens) per sequence: a first chunk, a middle one, a late one of a
# 29.7k-token prompt, two requests' chunks in one step (what long c16 schedules), and five live
# hops at minute ~8.5 of a meeting (a hop prefills ~550 ids after ~6.2k stable tokens; 100
# sessions' mixed steps held ~5: docs/benchmarks.md, session 19)
SHAPES: dict[str, list[tuple[int, int]]] = {
    "first": [(0, 4096)],
    "mid": [(16_384, 4096)],
    "late": [(26_000, 2_500)],
    "two": [(8_192, 4096), (4_096, 4096)],
    "live": [(6_200, 547)] * 5,
}


@dataclass(frozen=True)
class Row:
    """One timed (KV dtype, chunk shape, configuration): ms per call of one layer."""

    kv_dtype: str
    shape: str
    config: pa.ExtendKernelConfig
    ms: float
    tflop_per_s: float
    max_abs_delta: float  # against the default configuration's output


def candidates() -> list[pa.ExtendKernelConfig]:
    """The default first, then tiles of 128 and 256 query rows x 64 or 128 keys, 2-4 stages."""
    out = [pa.ExtendKernelConfig()]
    for rows, block_n, stages, warps in itertools.product((128, 256), (64, 128), (2, 3, 4), (4, 8)):
        if rows == 256 and warps == 4:
            continue  # a 256 x 128 fp32 accumulator does not fit four warps' registers
        cfg = pa.ExtendKernelConfig(rows=rows, block_n=block_n, num_stages=stages, num_warps=warps)
        if cfg != pa.ExtendKernelConfig(rows=pa.EXTEND_ROWS) and cfg not in out:
            out.append(cfg)
    return out


def make_step(
    chunks: list[tuple[int, int]], fp8: bool, block_size: int = BLOCK_SIZE
) -> dict[str, object]:
    """Caches (in shuffled blocks of `block_size` tokens), block tables, lengths and queries of
    one step over `chunks`."""
    lens = [p + n for p, n in chunks]
    blocks = [math.ceil(n / block_size) for n in lens]
    shape = (sum(blocks) + 1, block_size, KV_HEADS, HEAD_DIM)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    scale = FP8_SCALE if fp8 else 1.0
    k, v = ((torch.randn(shape, device="cuda") / scale).to(dtype) for _ in "kv")
    perm = torch.randperm(shape[0] - 1, device="cuda").to(torch.int32)
    table = torch.zeros(len(lens), max(blocks), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(blocks):
        table[b, :n] = perm[used : used + n]
        used += n
    q_lens = [n for _, n in chunks]
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device="cuda")
    return {
        "q": torch.randn(sum(q_lens), HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
        "k_cache": k,
        "v_cache": v,
        "block_tables": table,
        "cu_seqlens_q": cu,
        "seq_lens": torch.tensor(lens, dtype=torch.int32, device="cuda"),
        "max_seqlen_q": max(q_lens),
        "k_scale": scale,
        "v_scale": scale,
    }


def pair_flop(chunks: list[tuple[int, int]]) -> float:
    """FLOP of causal attention over `chunks`: QK^T and PV, a multiply-add each."""
    pairs = sum(n * p + n * (n + 1) / 2 for p, n in chunks)
    return pairs * 4 * HEADS * HEAD_DIM


def sweep(fp8: bool, deadline: float) -> list[Row]:
    """Time every candidate at every shape of SHAPES over a bf16 (or, with `fp8`, e4m3) cache
    until `deadline` (time.monotonic() seconds); prints each row as it is timed."""
    rows: list[Row] = []
    name = "fp8_e4m3" if fp8 else "bf16"
    steps = {shape: make_step(chunks, fp8) for shape, chunks in SHAPES.items()}
    scale = HEAD_DIM**-0.5
    base = {s: pa.paged_extend_attention(scale=scale, **a) for s, a in steps.items()}  # type: ignore[arg-type]
    for cfg in candidates():
        if time.monotonic() > deadline:
            print(f"{name}: out of time, stopping at {cfg}", flush=True)
            break
        for shape, args in steps.items():
            call = lambda a=args, c=cfg: pa.paged_extend_attention(scale=scale, kernel=c, **a)  # noqa: E731
            try:
                out = call()
            except (OutOfResources, CompilationError) as exc:  # e.g. too much shared memory
                print(f"{name} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                break
            delta = (out.float() - base[shape].float()).abs().max().item()
            ms = device_ms(call, 8)  # after `call()` above: compiled and warm
            row = Row(name, shape, cfg, ms, pair_flop(SHAPES[shape]) / ms / 1e9, delta)
            rows.append(row)
            print(
                f"{name} {shape:5s} {ms:8.3f} ms {row.tflop_per_s:6.1f} TFLOP/s "
                f"delta {delta:.3g}  {cfg}",
                flush=True,
            )
    return rows


def block_size_sweep(fp8: bool, sizes: list[int], deadline: float) -> list[Row]:
    """The default configuration at every shape over caches in blocks of each of `sizes`
    tokens (a row's `shape` is "NAME/bBLOCK"), until `deadline` (time.monotonic() seconds)."""
    rows: list[Row] = []
    name = "fp8_e4m3" if fp8 else "bf16"
    scale = HEAD_DIM**-0.5
    for shape, chunks in SHAPES.items():
        for size in sizes:
            if time.monotonic() > deadline:
                print(f"{name}: out of time at {shape}, blocks of {size}", flush=True)
                return rows
            args = make_step(chunks, fp8, size)
            call = lambda a=args: pa.paged_extend_attention(scale=scale, **a)  # noqa: E731
            call()
            ms = device_ms(call, 8)
            row = Row(name, f"{shape}/b{size}", pa.ExtendKernelConfig(), ms,
                      pair_flop(chunks) / ms / 1e9, 0.0)  # fmt: skip
            rows.append(row)
            print(f"{name} {shape:5s} blocks of {size:3d}: {ms:8.3f} ms "
                  f"{row.tflop_per_s:6.1f} TFLOP/s", flush=True)  # fmt: skip
            del args
            torch.cuda.empty_cache()
    return rows


def best(rows: list[Row]) -> dict[str, tuple[pa.ExtendKernelConfig, float]]:
    """Per KV dtype, the configuration with the least total time over every shape, among those
    whose output stayed within MAX_DELTA of the default's on every shape."""
    totals: dict[tuple[str, pa.ExtendKernelConfig], list[float]] = {}
    wrong = {(r.kv_dtype, r.config) for r in rows if not r.max_abs_delta <= MAX_DELTA}
    for r in rows:
        if (r.kv_dtype, r.config) not in wrong:
            totals.setdefault((r.kv_dtype, r.config), []).append(r.ms)
    out: dict[str, tuple[pa.ExtendKernelConfig, float]] = {}
    for (dtype, cfg), times in totals.items():
        if len(times) == len(SHAPES) and (dtype not in out or sum(times) < out[dtype][1]):
            out[dtype] = (cfg, sum(times))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default="sweep_extend_kernel.json")
    parser.add_argument("--max-seconds", type=float, default=200.0)
    parser.add_argument("--block-sizes", default="", help="e.g. 16,64,128 (module docstring)")
    args = parser.parse_args()
    deadline = time.monotonic() + args.max_seconds
    torch.manual_seed(0)
    if args.block_sizes:
        sizes = [int(b) for b in args.block_sizes.split(",")]
        if not set(sizes) <= set(pa.SUPPORTED_BLOCK_SIZES):
            parser.error(f"--block-sizes: each one of {pa.SUPPORTED_BLOCK_SIZES}, not {sizes}")
        rows = block_size_sweep(False, sizes, deadline - args.max_seconds / 2)
        rows += block_size_sweep(True, sizes, deadline)
    else:
        rows = sweep(False, deadline - args.max_seconds / 2) + sweep(True, deadline)
        default = {r.kv_dtype: 0.0 for r in rows}
        for r in rows:
            if r.config == pa.ExtendKernelConfig():
                default[r.kv_dtype] += r.ms
        for dtype, (cfg, total) in best(rows).items():
            base = default[dtype]
            print(f"best {dtype}: {total:.2f} ms over the shapes (default {base:.2f}): {cfg}")
    with open(args.json, "w") as f:
        json.dump([{**asdict(r), "config": asdict(r.config)} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
