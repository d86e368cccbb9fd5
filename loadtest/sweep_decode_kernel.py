"""Sweep the split-K decode kernel's launch configurations on a GPU (bf16 and FP8 KV caches).

For each cache dtype and (batch, context) point, times `paged_decode_attention` per layer with
each `DecodeKernelConfig` candidate (keys per tile, warps, pipeline stages) in CUDA graphs over
enough layers to defeat the L2 cache, like `loadtest/bench_attention.py`. Reported: us per
layer, KV TB/s, and that as a fraction of the read-only bandwidth measured in the same run.
Each candidate's output is first checked against the torch reference on layer 0. The best
candidate per point is printed last; the kernel's defaults (`default_decode_config`) come
from it.

`--splits` times instead each dtype's default configuration at a range of split counts: the
powers of two from a quarter of the default to twice it, and the largest counts whose grid of
batch x KV heads x splits programs fits r times on the GPU's SMs (r = 1..6), to find where a
partial last wave of programs costs time.

`--layouts` times each dtype's default on two
arrangements of the same bytes with the same grid: the pool's token-major cache (a token's
KV heads side by side, so a program reads one head's 128- or 256-byte row every 1 or 2 KiB)
and one KV head per sequence (batch x KV heads sequences of one head each: every block's keys
of a head contiguous, as a head-major pool would hold them). It tells whether a head-major
pool would read faster before any kernel is changed for one.

Usage: python -m loadtest.sweep_decode_kernel [--points 1x36000,16x36000] [--json out.json]
       [--max-seconds 150] [--defaults-only | --splits | --layouts] [--block-size 128]
(`--block-size`: tokens per KV block of the caches, by default the engine's, KV_BLOCK_SIZE)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import torch

from livemeet.audio.constants import KV_BLOCK_SIZE
from livemeet.layers import cuda_decode
from livemeet.layers import paged_attention as pa
from livemeet.layers.paged_attention_ref import ref_paged_decode_attention
from loadtest.bench_attention import (
    HEAD_DIM,
    L2_DEFEAT_BYTES,
    NUM_HEADS,
    NUM_KV_HEADS,
    NUM_LAYERS,
    read_bandwidth_tb_per_s,
    time_graph_ms,
)

BLOCK_SIZE = KV_BLOCK_SIZE  # the engine's default KV block
FP8_SCALE = 0.05  # per-tensor scale of the FP8 caches (values ~N(0, 1) / scale stay < 448)
TOKEN_MAJOR = "token-major"  # the pool's layout: [blocks, block size, KV heads, head dim]
HEAD_PER_SEQUENCE = "head-per-sequence"  # the same bytes as B x KV heads one-head sequences


@dataclass(frozen=True)
class SweepRow:
    """One timed (cache dtype, batch, context, splits, launch configuration)."""

    kv_dtype: str
    batch: int
    context: int
    num_splits: int
    config: pa.DecodeKernelConfig
    us_per_layer: float
    kv_tb_per_s: float
    frac_of_read: float
    max_abs_err: float  # against the torch reference on layer 0 (the FP8 forms are approximate)
    layout: str = TOKEN_MAJOR


def candidates(full: bool = True, fp8: bool = False) -> list[pa.DecodeKernelConfig]:
    """The point's default (the CUDA kernel where it runs) and the CUDA kernel's other forms
    (pipeline stages, loads before the PDL wait, the merge kernel, the other grid order with
    either merge), then the Triton kernel:
    both dtype defaults, each with the other merge (kernel or in-kernel), (fp8) the FP8
    default with e4m3 scores, then (full) the tile/warp/stage grid, merged as the point's
    dtype merges by default (so a grid row differs from that default only in its tiles, warps
    and stages)."""
    merge = pa.default_decode_config(fp8).merge_in_kernel
    grid = [
        pa.DecodeKernelConfig(n, w, stages, merge_in_kernel=merge, backend="triton")
        for n, w, stages in itertools.product((64, 128), (4, 8), (1, 2, 3))
    ]
    # the Triton defaults first, then each with the other merge; dict.fromkeys drops repeats
    # from the grid
    triton = [
        dataclasses.replace(pa.default_decode_config(f), backend="triton") for f in (False, True)
    ]
    other_merge = [dataclasses.replace(c, merge_in_kernel=not c.merge_in_kernel) for c in triton]
    fp8_forms = [dataclasses.replace(triton[1], fp8_qk=True)]
    default = pa.default_decode_config(fp8)
    max_stages = cuda_decode.MAX_STAGES_FP8 if fp8 else cuda_decode.MAX_STAGES_BF16
    cuda_forms = [
        dataclasses.replace(default, cuda_stages=n, cuda_early_loads=early)
        for n in range(cuda_decode.MIN_STAGES, max_stages + 1)
        for early in (False, True)
    ]
    other_merge_cuda = not default.cuda_merge_in_kernel
    cuda_forms.append(dataclasses.replace(default, cuda_merge_in_kernel=other_merge_cuda))
    # the other grid order (KV head or split fastest), both merges
    other_order = dataclasses.replace(default, cuda_heads_inner=not default.cuda_heads_inner)
    cuda_forms.append(other_order)
    cuda_forms.append(dataclasses.replace(other_order, cuda_merge_in_kernel=other_merge_cuda))
    chosen = [
        default,
        *cuda_forms,
        *triton,
        *other_merge,
        *(fp8_forms if fp8 else []),
        *(grid if full else []),
    ]
    return list(dict.fromkeys(chosen))


def exact(rows: list[SweepRow]) -> list[SweepRow]:
    """The rows of exact configurations (the approximate e4m3-score form is reported, never
    chosen as best)."""
    return [r for r in rows if not r.config.fp8_qk]


def split_candidates(batch: int, context: int, num_sms: int) -> list[int]:
    """Split counts for `--splits` at one point, ascending: powers of two from a quarter of the
    default to twice it, and floor(r * num_sms / (batch * kv heads)) for r = 1..6 (the largest
    counts whose programs fit on the SMs r times over), each kept to 1..128 and to >= 16 keys
    per split."""
    default = pa.choose_num_splits(batch, context, NUM_KV_HEADS, num_sms)
    pow2 = {1 << k for k in range(8) if default // 4 <= 1 << k <= default * 2}
    waves = {r * num_sms // (batch * NUM_KV_HEADS) for r in range(1, 7)}
    limit = min(128, max(1, context // 16))
    return sorted(n for n in pow2 | waves if 1 <= n <= limit)


def make_caches(
    batch: int, context: int, fp8: bool, kv_heads: int = NUM_KV_HEADS, block_size: int = BLOCK_SIZE
):
    """Per-layer (k, v) caches of `kv_heads` heads in shuffled blocks of `block_size` tokens,
    one block table, the lengths, and the KV bytes a layer reads."""
    elem = 1 if fp8 else 2
    kv_bytes = batch * context * kv_heads * HEAD_DIM * 2 * elem
    layers = max(1, min(NUM_LAYERS, math.ceil(L2_DEFEAT_BYTES / kv_bytes)))
    blocks_per_seq = math.ceil(context / block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, kv_heads, HEAD_DIM)
    caches = []
    for _ in range(layers):
        k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        if fp8:
            k = (k.float() / FP8_SCALE).to(torch.float8_e4m3fn)
            v = (v.float() / FP8_SCALE).to(torch.float8_e4m3fn)
        caches.append((k, v))
    perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    tables = perm.reshape(batch, blocks_per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return caches, tables, lens, kv_bytes


def sweep_point(
    batch: int,
    context: int,
    fp8: bool,
    read_bw: float,
    deadline: float,
    full: bool,
    split_sweep: bool = False,
    block_size: int = BLOCK_SIZE,
) -> list[SweepRow]:
    """Time `candidates(full, fp8)` and two split counts around the default at one point
    (batch sequences of `context` tokens) until `deadline` (time.monotonic() seconds), or with
    `split_sweep`, the dtype's default configuration at every `split_candidates` count;
    `read_bw`: the read-only bandwidth (TB/s) the fractions are of."""
    caches, tables, lens, kv_bytes = make_caches(batch, context, fp8, block_size=block_size)
    q, ref = query_and_reference(NUM_HEADS, caches, tables, lens, fp8)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    group = NUM_HEADS // NUM_KV_HEADS

    def default_splits(cfg: pa.DecodeKernelConfig) -> int:
        per_sm = pa.decode_programs_per_sm(q.dtype, caches[0][0], group, cfg)
        return pa.choose_num_splits(batch, context, NUM_KV_HEADS, num_sms, programs_per_sm=per_sm)

    plan: list[tuple[pa.DecodeKernelConfig | None, int]]
    if split_sweep:
        default_cfg = pa.default_decode_config(fp8)
        plan = [(default_cfg, n) for n in split_candidates(batch, context, num_sms)]
    else:
        plan = [(cfg, default_splits(cfg)) for cfg in candidates(full, fp8)]
        best_splits = default_splits(pa.default_decode_config(fp8))
        plan += [(None, best_splits * 2), (None, max(1, best_splits // 2))]
    rows: list[SweepRow] = []
    for cfg, splits in plan:
        if time.monotonic() > deadline:
            print(f"  (time budget spent: skipping the rest of {batch}x{context})")
            break
        if cfg is None:  # split-count variations of the best exact configuration so far
            cfg = min(exact(rows), key=lambda r: r.us_per_layer).config

        timed = time_config(q, caches, tables, lens, ref, cfg, splits, fp8)
        if timed is None:
            continue
        us, err = timed
        rows.append(report_row(fp8, batch, context, splits, cfg, us, kv_bytes / us, read_bw, err))
    caches.clear()
    torch.cuda.empty_cache()
    return rows


def query_and_reference(
    num_heads: int,
    caches: list[tuple[torch.Tensor, torch.Tensor]],
    tables: torch.Tensor,
    lens: torch.Tensor,
    fp8: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A random bf16 query [sequences, num_heads, HEAD_DIM] for `caches` and the fp32 torch
    reference output over their first layer, at the caches' scale (FP8_SCALE for FP8)."""
    q = torch.randn(len(lens), num_heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    s = FP8_SCALE if fp8 else 1.0
    ref = ref_paged_decode_attention(
        q.float(), *caches[0], tables, lens, HEAD_DIM**-0.5, k_scale=s, v_scale=s
    )
    return q, ref


def time_config(
    q: torch.Tensor,
    caches: list[tuple[torch.Tensor, torch.Tensor]],
    tables: torch.Tensor,
    lens: torch.Tensor,
    ref: torch.Tensor,
    cfg: pa.DecodeKernelConfig,
    splits: int,
    fp8: bool,
) -> tuple[float, float] | None:
    """(us per layer over `caches` in a CUDA graph, max |error| on layer 0 against `ref`), or
    None (printed) when the configuration fails to build or run."""
    scale = HEAD_DIM**-0.5
    s = FP8_SCALE if fp8 else 1.0
    scales = {"k_scale": s, "v_scale": s}

    def run() -> None:
        for k, v in caches:
            pa.paged_decode_attention(q, k, v, tables, lens, scale, num_splits=splits, kernel=cfg,
                                      **scales)  # fmt: skip

    try:
        out = pa.paged_decode_attention(
            q, *caches[0], tables, lens, scale, num_splits=splits, kernel=cfg, **scales
        )
        err = (out.float() - ref).abs().max().item()
        return time_graph_ms(run) / len(caches) * 1e3, err
    except Exception as exc:  # a configuration Triton cannot compile (shared memory, ...)
        print(f"  {cfg} splits={splits}: failed: {type(exc).__name__}: {exc}"[:300])
        return None


def report_row(
    fp8: bool,
    batch: int,
    context: int,
    splits: int,
    cfg: pa.DecodeKernelConfig,
    us: float,
    bytes_per_us: float,
    read_bw: float,
    err: float,
    layout: str = TOKEN_MAJOR,
) -> SweepRow:
    """The timed row, printed."""
    tb = bytes_per_us * 1e-6
    kv_dtype = "fp8_e4m3" if fp8 else "bf16"
    row = SweepRow(kv_dtype, batch, context, splits, cfg, us, tb, tb / read_bw, err, layout)
    print(
        f"  {kv_dtype} {batch}x{context} {layout} splits={splits} {cfg}: {us:.1f} us "
        f"{tb:.2f} TB/s ({tb / read_bw:.2f} x read) err {err:.1e}",
        flush=True,
    )
    return row


def layout_point(
    batch: int,
    context: int,
    fp8: bool,
    read_bw: float,
    deadline: float,
    block_size: int = BLOCK_SIZE,
) -> list[SweepRow]:
    """`--layouts` at one point: the dtype's default on the token-major cache and on the same
    bytes as one KV head per sequence, at the token-major default's split count on both (so
    the grids are the same size)."""
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    group = NUM_HEADS // NUM_KV_HEADS
    default = pa.default_decode_config(fp8)
    rows: list[SweepRow] = []
    splits = 0
    # (layout, sequences, KV heads each): the same sequences x heads x context either way
    for layout, seqs, heads in ((TOKEN_MAJOR, batch, NUM_KV_HEADS), (HEAD_PER_SEQUENCE,
                                batch * NUM_KV_HEADS, 1)):  # fmt: skip
        if time.monotonic() > deadline:  # before building caches that would go unused
            print(f"  (time budget spent: skipping the rest of {batch}x{context})")
            break
        caches, tables, lens, kv_bytes = make_caches(seqs, context, fp8, heads, block_size)
        q, ref = query_and_reference(heads * group, caches, tables, lens, fp8)
        if not splits:
            per_sm = pa.decode_programs_per_sm(q.dtype, caches[0][0], group, default)
            splits = pa.choose_num_splits(batch, context, NUM_KV_HEADS, num_sms,
                                          programs_per_sm=per_sm)  # fmt: skip
        timed = time_config(q, caches, tables, lens, ref, default, splits, fp8)
        if timed is not None:
            us, err = timed
            rows.append(report_row(fp8, batch, context, splits, default, us, kv_bytes / us,
                                   read_bw, err, layout))  # fmt: skip
        caches.clear()
        torch.cuda.empty_cache()
    return rows


def point_key(row: SweepRow) -> tuple[str, int, int, str]:
    """What the best configuration is chosen per: dtype, batch, context, layout."""
    return row.kv_dtype, row.batch, row.context, row.layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="1x36000,16x36000", help="BATCHxCONTEXT,...")
    parser.add_argument("--dtypes", default="bf16,fp8_e4m3")
    parser.add_argument("--max-seconds", type=float, default=150.0)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--defaults-only", action="store_true", help="only the defaults, merged both ways"
    )
    mode.add_argument("--splits", action="store_true", help="the defaults at a range of splits")
    mode.add_argument(
        "--layouts", action="store_true", help="token-major vs one KV head per sequence"
    )
    parser.add_argument("--json", default="sweep_decode_kernel.json")
    parser.add_argument(
        "--block-size",
        type=int,
        default=BLOCK_SIZE,
        choices=pa.SUPPORTED_BLOCK_SIZES,
        help="tokens per KV block of the caches",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sweep_decode_kernel needs a CUDA device")
    start = time.monotonic()
    torch.manual_seed(0)
    read_bw = read_bandwidth_tb_per_s()
    print(f"read-only bandwidth {read_bw:.2f} TB/s")
    rows: list[SweepRow] = []
    work = [(d, p) for d in args.dtypes.split(",") for p in args.points.split(",")]
    for i, (dtype, point) in enumerate(work):
        batch, context = (int(x) for x in point.split("x"))
        deadline = start + args.max_seconds * (i + 1) / len(work)  # an equal share per point
        fp8 = dtype == "fp8_e4m3"
        if args.layouts:
            rows += layout_point(batch, context, fp8, read_bw, deadline, args.block_size)
            continue
        rows += sweep_point(
            batch, context, fp8, read_bw, deadline, not args.defaults_only, args.splits,
            args.block_size,
        )  # fmt: skip
    print("best per point:")
    for key, group in itertools.groupby(rows, key=point_key):
        best = min(exact(list(group)), key=lambda r: r.us_per_layer)
        print(f"  {key}: {best}")
    with open(args.json, "w") as f:
        record = {"read_tb_per_s": read_bw, "block_size": args.block_size, "argv": sys.argv[1:]}
        json.dump({**record, "rows": [asdict(r) for r in rows]}, f, indent=2)


if __name__ == "__main__":
    main()
