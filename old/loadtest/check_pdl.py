"""Programmatic dependent launch (livemeet.layers.pdl) against plain launches, on a GPU.

Runs a chain of one-row mini decoder layers (`decoder_chain`) in which every kernel reads the
kernel before it, eagerly and as a CUDA graph, with PDL off (the reference) and on, and
compares every intermediate tensor bit for bit: a kernel that read its input before its
predecessor finished changes the result. It runs once over a bf16 KV cache (decode partials
merged by `_decode_merge_kernel`) and once over an FP8 one (merged in the split kernel through
the shared counters). Where a mode differs it prints the first (layer, stage) that differs,
then bisects by enabling PDL for one kernel at a time. Usage:
    python -m loadtest.check_pdl [--layers 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from livemeet.layers import fused, linear, pdl
from livemeet.layers import paged_attention as pa
from livemeet.layers.rotary import RotaryEmbedding

STAGES = ("qkv", "q", "attn", "o", "gate_up", "down")  # intermediates of one layer, in order
# KV splits of every decode attention: at the chain's contexts (<= one token per layer) the
# default would be 1 split, which writes its output directly and launches no merge at all
CHAIN_SPLITS = 4
KV_DTYPES = (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn))  # (name, KV cache dtype)
PDL_KERNELS = (
    "_skinny_rows_kernel",
    "_qk_norm_rope_kernel",
    "_decode_split_kernel",
    "_decode_merge_kernel",
)  # the Triton kernels the chain launches (the CUDA decode kernel follows pdl.is_enabled())


class ChainState:
    """Weights, KV caches and per-layer index tensors of `decoder_chain`, made before any
    capture (nothing is allocated from a generator inside the chain). Qwen3-0.6B-like sizes."""

    hidden, heads, kv_heads, dim, inter, page = 1024, 16, 8, 128, 3072, 16

    def __init__(self, layers: int, device: str, kv_dtype: torch.dtype = torch.bfloat16) -> None:
        g = torch.Generator(device=device).manual_seed(3)
        bf16 = torch.bfloat16

        def weight(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, generator=g, device=device) / k**0.5).to(bf16)

        self.layers = layers
        self.w_qkv = weight((self.heads + 2 * self.kv_heads) * self.dim, self.hidden)
        self.w_o = weight(self.hidden, self.heads * self.dim)
        self.w_up = weight(2 * self.inter, self.hidden)
        self.w_down = weight(self.hidden, self.inter)
        self.norm_w = torch.ones(self.hidden, device=device, dtype=bf16)
        blocks = -(-layers // self.page)
        shape = (blocks, self.page, self.kv_heads, self.dim)

        def cache() -> torch.Tensor:
            return torch.randn(shape, generator=g, device=device).to(kv_dtype)

        # one cache per layer, as in the engine: a layer's earlier tokens come from before the
        # chain (an earlier step), and only its new token is written inside it
        self.k_caches = [cache() for _ in range(layers)]
        self.v_caches = [cache() for _ in range(layers)]
        perm = torch.randperm(blocks, generator=torch.Generator().manual_seed(4))
        self.table = perm.to(torch.int32).view(1, blocks).to(device)  # shuffled pages
        at = {"device": device}
        self.slots = [
            (self.table[0, i // self.page].long() * self.page + i % self.page).view(1)
            for i in range(layers)
        ]
        self.lens = [torch.full((1,), i + 1, dtype=torch.int32, **at) for i in range(layers)]
        self.positions = [torch.full((1,), i, dtype=torch.int64, **at) for i in range(layers)]
        self.head_norm_w = torch.ones(self.dim, device=device, dtype=bf16)
        self.inv_freq = RotaryEmbedding(self.dim, 1_000_000.0).inv_freq.to(device)


def decoder_chain(s: ChainState, x: torch.Tensor) -> list[torch.Tensor]:
    """`s.layers` one-row layers: norm+qkv GEMV, q/k norm + RoPE storing the new token's K/V
    (as the engine's fused path: `qk_norm_rope_store_kv`), decode attention
    over every token so far (the one just stored included; in CHAIN_SPLITS splits, merged by
    the merge kernel over a bf16 cache and in the split kernel over an FP8 one), o GEMV,
    norm+gate_up GEMV, SiLU*mul+down GEMV. Returns every intermediate, STAGES per layer (each
    its own buffer). Layer i has its own cache, filled before the chain, and stores token i,
    the last one it reads (the engine's contract: the CUDA decode kernel may read the other
    tokens before its PDL wait)."""
    narrow, wide = linear.GemmConfig(8, 512), linear.GemmConfig(4, 2048)
    groups = [s.heads, s.kv_heads, s.kv_heads]
    residual = None
    out = []
    for i in range(s.layers):
        qkv, residual = linear.skinny_norm_linear(x, residual, s.norm_w, 1e-6, s.w_qkv, narrow)
        q, k, v = qkv.view(1, sum(groups), s.dim).split(groups, 1)
        k_cache, v_cache = s.k_caches[i], s.v_caches[i]
        sink = pa.KVSink(k_cache, v_cache, s.slots[i])
        w, pos = s.head_norm_w, s.positions[i]
        q = fused.qk_norm_rope_store_kv(q, k, v, w, w, 1e-6, pos, s.inv_freq, sink)
        attn = pa.paged_decode_attention(
            q, k_cache, v_cache, s.table, s.lens[i], 0.088, num_splits=CHAIN_SPLITS
        )
        o = linear.skinny_linear(attn.view(1, -1), s.w_o, wide)
        up, residual = linear.skinny_norm_linear(o, residual, s.norm_w, 1e-6, s.w_up, narrow)
        x = linear.skinny_silu_linear(up, s.w_down, wide)
        out += [qkv, q, attn, o, up, x]
    return out


def first_difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> str | None:
    """'layer L stage S: max |diff| D' for the first intermediate that differs, else None."""
    for j, (a, b) in enumerate(zip(got, want, strict=True)):
        if not torch.equal(a, b):
            diff = (a.float() - b.float()).abs().max().item()
            return f"layer {j // len(STAGES)} {STAGES[j % len(STAGES)]}: max |diff| {diff:.3g}"
    return None


@contextmanager
def pdl_only_for(kernels: set[str] | None) -> Iterator[None]:
    """PDL on, for the named kernels only (None: all of them)."""
    full = pdl.launch_options
    before = pdl.is_enabled()

    def some(t: torch.Tensor, kernel: object) -> dict[str, bool]:
        name = getattr(getattr(kernel, "fn", kernel), "__name__", "")
        return full(t, kernel) if kernels is None or name in kernels else {"PDL": False}

    pdl.set_enabled(True)
    pdl.launch_options = some  # type: ignore[assignment]
    try:
        yield
    finally:
        pdl.launch_options = full  # type: ignore[assignment]
        pdl.set_enabled(before)


def run_mode(
    s: ChainState, x: torch.Tensor, graph: bool, replays: int = 3
) -> list[list[torch.Tensor]]:
    """The chain's intermediates: once eagerly, or `replays` graph replays (copied after each)."""
    if not graph:
        out = decoder_chain(s, x)
        torch.cuda.synchronize()
        return [out]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = decoder_chain(s, x)
    results = []
    for _ in range(replays):
        g.replay()
        torch.cuda.synchronize()
        results.append([t.clone() for t in captured])
    return results


def check(layers: int, log: Callable[[str], None] = print) -> dict[str, str]:
    """Every mode against eager plain launches, for each KV cache dtype:
    {'<kv> KV, <mode>': 'equal' or the first difference}."""
    report: dict[str, str] = {}
    for kv_name, kv_dtype in KV_DTYPES:
        report.update(_check_kv(layers, kv_name, kv_dtype, log))
    return report


def _check_kv(
    layers: int, kv_name: str, kv_dtype: torch.dtype, log: Callable[[str], None]
) -> dict[str, str]:
    torch.manual_seed(21)
    s = ChainState(layers, "cuda", kv_dtype)
    x = torch.randn(1, s.hidden, device="cuda", dtype=torch.bfloat16)
    pdl.set_enabled(False)
    want = run_mode(s, x, graph=False)[0]
    modes: list[tuple[str, set[str] | None, bool]] = [("graph, PDL off", set(), True)]
    modes += [("eager, PDL on", None, False), ("graph, PDL on", None, True)]
    report: dict[str, str] = {}

    def one(mode: str, kernels: set[str] | None, graph: bool) -> None:
        with pdl_only_for(kernels):
            runs = run_mode(s, x, graph)
        diffs = [first_difference(r, want) for r in runs]
        name = f"{kv_name} KV, {mode}"
        report[name] = next((d for d in diffs if d), "equal")
        log(f"{name}: {report[name]}")

    for mode, kernels, graph in modes:
        one(mode, kernels, graph)
    if any(report[f"{kv_name} KV, {m}"] != "equal" for m in ("eager, PDL on", "graph, PDL on")):
        for kernel in PDL_KERNELS:
            one(f"graph, PDL for {kernel} only", {kernel}, True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    report = check(args.layers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
