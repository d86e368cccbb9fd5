"""GPU micro-benchmark of the paged attention kernels (DESIGN.md sections 4 and 10).

Decode: batch 1 and 16 x context 1k / 36k / 72k, bf16 KV at the decoder's shapes (16 query heads,
8 KV heads, head_dim 128). Each case captures one call per layer (enough layers that the KV read
is well past the 60 MB L2, at most 28 like the model) in a CUDA graph, replays it after a warm-up
and times the replays with CUDA events. Reported: time per call, KV bytes read per second, and
that figure as a fraction of the device-to-device copy bandwidth measured in the same run (bytes
read + written by `Tensor.copy_` of a 2 GiB tensor, the DESIGN.md "floor" bandwidth), next to
torch SDPA over a contiguous [B, kv_heads, L, D] cache. Extend: one prefill chunk over a prefix,
in TFLOP/s, next to causal SDPA without the prefix (a lower bound on SDPA's work).

Fixed kernel configurations, no autotuning; about a minute on an H200.
Usage: python loadtest/bench_attention.py [--json out.json] [--block-size 128] [--sweep-splits]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from livemeet.audio.constants import KV_BLOCK_SIZE
from livemeet.layers import paged_attention as pa

NUM_HEADS = 16  # Qwen3-0.6B query heads
NUM_KV_HEADS = 8
HEAD_DIM = 128
NUM_LAYERS = 28
L2_DEFEAT_BYTES = 512 << 20  # bytes of KV per timed graph, ~8x the H200's 60 MB L2
COPY_BYTES = 2 << 30  # bytes per copy-bandwidth sample
GRAPH_REPLAYS = 20  # replays per timing sample
SAMPLES = 5  # timing samples; the median is reported


@dataclass(frozen=True)
class DecodeRow:
    impl: str  # "paged-cuda" (the CUDA decode kernel), "paged-triton" or "sdpa-dense"
    batch: int
    context: int  # tokens per sequence
    block_size: int  # 0 for the dense SDPA cache
    num_splits: int  # 0 for SDPA
    us_per_call: float  # one layer's attention
    kv_tb_per_s: float  # KV bytes read / time, 1e12 bytes per s
    frac_of_copy: float  # kv_tb_per_s / copy bandwidth
    frac_of_read: float  # kv_tb_per_s / read-only bandwidth (a reduction)
    max_abs_err: float  # against SDPA on the same data (paged rows only)


@dataclass(frozen=True)
class ExtendRow:
    impl: str
    prefix: int
    new_tokens: int
    ms_per_call: float
    tflop_per_s: float  # causal QK and PV FLOPs / time


def time_graph_ms(fn: Callable[[], object]) -> float:
    """Median time of one graph replay of `fn` (captured after an eager warm-up call)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(SAMPLES):
        start.record()
        for _ in range(GRAPH_REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / GRAPH_REPLAYS)
    return statistics.median(samples)


def copy_bandwidth_tb_per_s() -> float:
    """Device-to-device copy: (bytes read + bytes written) / time, in 1e12 bytes per s."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_graph_ms(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e12


def read_bandwidth_tb_per_s() -> float:
    """Read-only stream: bytes read by a float32-accumulating sum of a bf16 tensor / time."""
    src = torch.ones(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    ms = time_graph_ms(lambda: src.sum(dtype=torch.float32))
    return COPY_BYTES / (ms * 1e-3) / 1e12


def paged_inputs(batch: int, context: int, block_size: int, layers: int):
    """Per-layer (k_cache, v_cache) with shuffled blocks, and one shared block table."""
    blocks_per_seq = math.ceil(context / block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    caches = [
        (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16),
            torch.randn(shape, device="cuda", dtype=torch.bfloat16),
        )
        for _ in range(layers)
    ]
    perm = torch.randperm(num_blocks, device="cuda", dtype=torch.int64).to(torch.int32)
    tables = perm.reshape(batch, blocks_per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return caches, tables, lens


def dense_from_paged(cache: torch.Tensor, tables: torch.Tensor, context: int) -> torch.Tensor:
    """[B, kv_heads, L, D] contiguous copy of one layer's paged cache (for SDPA)."""
    gathered = cache[tables.long()]  # [B, blocks, block_size, kv_heads, D]
    batch = tables.shape[0]
    flat = gathered.reshape(batch, -1, NUM_KV_HEADS, HEAD_DIM)[:, :context]
    return flat.transpose(1, 2).contiguous()


def bench_decode(
    batch: int,
    context: int,
    block_size: int,
    bandwidth: tuple[float, float],
    splits: list[int | None],
) -> list[DecodeRow]:
    kv_bytes_per_layer = batch * context * NUM_KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16
    layers = max(1, min(NUM_LAYERS, math.ceil(L2_DEFEAT_BYTES / kv_bytes_per_layer)))
    caches, tables, lens = paged_inputs(batch, context, block_size, layers)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    scale = HEAD_DIM**-0.5
    rows = []

    # SDPA over contiguous caches: the comparison and the correctness oracle for layer 0
    k0, v0 = caches[0]
    dense = [(dense_from_paged(k0, tables, context), dense_from_paged(v0, tables, context))]
    dense += [
        (torch.empty_like(dense[0][0]).normal_(), torch.empty_like(dense[0][1]).normal_())
        for _ in range(layers - 1)
    ]
    q4 = q.unsqueeze(2)  # [B, H, 1, D]

    def sdpa_all() -> None:
        for k, v in dense:
            F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

    expected = F.scaled_dot_product_attention(q4, *dense[0], scale=scale, enable_gqa=True)[:, :, 0]
    ms = time_graph_ms(sdpa_all) / layers
    tb = kv_bytes_per_layer / (ms * 1e-3) / 1e12
    copy_bw, read_bw = bandwidth
    rows.append(
        DecodeRow("sdpa-dense", batch, context, 0, 0, ms * 1e3, tb, tb / copy_bw, tb / read_bw, 0)
    )
    dense.clear()

    group = NUM_HEADS // NUM_KV_HEADS
    variant = pa.cuda_variant(q.dtype, caches[0][0], group, None)
    impl = "paged-triton" if variant is None else "paged-cuda"
    per_sm = pa.decode_programs_per_sm(q.dtype, caches[0][0], group)
    for num_splits in splits:
        chosen = num_splits or pa.choose_num_splits(
            batch, context, NUM_KV_HEADS, programs_per_sm=per_sm
        )

        def paged_all(n: int = chosen) -> None:
            for k, v in caches:
                pa.paged_decode_attention(q, k, v, tables, lens, scale, num_splits=n)

        out = pa.paged_decode_attention(q, *caches[0], tables, lens, scale, num_splits=chosen)
        err = (out.float() - expected.float()).abs().max().item()
        ms = time_graph_ms(paged_all) / layers
        tb = kv_bytes_per_layer / (ms * 1e-3) / 1e12
        fractions = (tb / copy_bw, tb / read_bw)
        row = (impl, batch, context, block_size, chosen, ms * 1e3, tb, *fractions, err)
        rows.append(DecodeRow(*row))
    return rows


def bench_extend(prefix: int, new_tokens: int, block_size: int) -> list[ExtendRow]:
    total = prefix + new_tokens
    caches, tables, lens = paged_inputs(1, total, block_size, 1)
    q = torch.randn(new_tokens, NUM_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, new_tokens], dtype=torch.int32, device="cuda")
    scale = HEAD_DIM**-0.5
    # visible (query, key) pairs: every query sees the prefix, plus a causal triangle
    pairs = new_tokens * prefix + new_tokens * (new_tokens + 1) / 2
    flops = 4 * pairs * NUM_HEADS * HEAD_DIM
    k, v = caches[0]
    ms = time_graph_ms(
        lambda: pa.paged_extend_attention(q, k, v, tables, cu, lens, scale, max_seqlen_q=new_tokens)
    )
    rows = [ExtendRow("paged-triton", prefix, new_tokens, ms, flops / (ms * 1e-3) / 1e12)]
    qd = q.transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    kd = torch.randn(1, NUM_KV_HEADS, new_tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    ms = time_graph_ms(
        lambda: F.scaled_dot_product_attention(qd, kd, kd, is_causal=True, enable_gqa=True)
    )
    self_flops = 4 * new_tokens * (new_tokens + 1) / 2 * NUM_HEADS * HEAD_DIM
    rows.append(
        ExtendRow("sdpa-causal-no-prefix", 0, new_tokens, ms, self_flops / (ms * 1e-3) / 1e12)
    )
    return rows


def markdown(
    copy_bw: float, read_bw: float, decode: list[DecodeRow], extend: list[ExtendRow]
) -> str:
    lines = [
        f"device-to-device copy: {copy_bw:.2f} TB/s (read + write); read-only: {read_bw:.2f} TB/s",
        "",
        "| impl | batch | context | block | splits | us/call | KV TB/s | x copy | x read | err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in decode:
        lines.append(
            f"| {r.impl} | {r.batch} | {r.context} | {r.block_size or '-'} | "
            f"{r.num_splits or '-'} | {r.us_per_call:.1f} | {r.kv_tb_per_s:.2f} | "
            f"{r.frac_of_copy:.2f} | {r.frac_of_read:.2f} | {r.max_abs_err:.1e} |"
        )
    lines += ["", "| impl | prefix | new tokens | ms/call | TFLOP/s |", "|---|---|---|---|---|"]
    for e in extend:
        lines.append(
            f"| {e.impl} | {e.prefix} | {e.new_tokens} | {e.ms_per_call:.2f} | "
            f"{e.tflop_per_s:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="bench_attention.json", help="output JSON path")
    parser.add_argument(
        "--block-size", type=int, default=KV_BLOCK_SIZE, help="tokens per KV block (the engine's)"
    )
    parser.add_argument("--sweep-splits", action="store_true", help="also time fixed splits")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention needs a CUDA device")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth_tb_per_s()
    read_bw = read_bandwidth_tb_per_s()
    decode: list[DecodeRow] = []
    for batch in (1, 16):
        for context in (1024, 36_000, 72_000):
            splits: list[int | None] = [None]
            if args.sweep_splits:
                splits += [1, 8, 16, 32, 64, 128]
            decode += bench_decode(batch, context, args.block_size, (copy_bw, read_bw), splits)
            torch.cuda.empty_cache()
    extend = []
    for prefix, new_tokens in ((0, 4096), (30_000, 4096), (30_000, 512)):
        extend += bench_extend(prefix, new_tokens, args.block_size)
    print(markdown(copy_bw, read_bw, decode, extend))
    report = {
        "device": torch.cuda.get_device_name(),
        "copy_tb_per_s": copy_bw,
        "read_tb_per_s": read_bw,
        "decode": [asdict(r) for r in decode],
        "extend": [asdict(e) for e in extend],
    }
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
