"""The qkv projection of a decode row with the q/k rotation and the K/V store as its epilogue.

At batch 1 a decode step is a chain of ~7 small kernels per layer, and each boundary costs
~1.5-2 us of a ~56 us layer (H200: the add+norm folded qkv projection 3.7 us, then the q/k
norm + RoPE + KV store kernel; docs/benchmarks.md, session 10). Here one kernel does both:
- every program computes a slab of the qkv projection (`linear.row_slab`, the residual add +
  RMSNorm folded in, as `linear.skinny_norm_linear`) and stores it, rounded, to a scratch row;
- the last program to finish a head's columns (a split-K semaphore per (row, head),
  `livemeet.layers.split_k`) reads the head back through L2 and finishes it as
  `fused.qk_norm_rope_store_kv` does: a q head is normed, rotated and written to q; a k head
  normed, rotated and stored into the paged K cache at the row's slot; a v head stored as is
  (slot -1: nothing stored; an e4m3 cache gets clamp(x / scale, -448, 448)).
The values and their roundings are those of the two-kernel path, so outputs and caches are
bit-identical to it.

Used for rows whose qkv projection has a one-row "add_rms_norm" choice in the `LinearPlan`
whose slab width divides head_dim, when the attention backend hands out a `KVSink`; anything
else returns None and the caller runs the two kernels. `LIVEMEET_QKV_ROPE=0` in the
environment (read at import) turns it off, for side-by-side benchmarks.
"""

from __future__ import annotations

import os

import torch

from livemeet.errors import InternalError
from livemeet.layers import fused as fk
from livemeet.layers import linear, pdl, split_k
from livemeet.layers.paged_attention import Impl, KVSink, check_cache, select_triton

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU-only install path
    HAS_TRITON = False

QKV_ROPE_ENV = "LIVEMEET_QKV_ROPE"
_enabled = os.environ.get(QKV_ROPE_ENV, "1") != "0"


def enabled() -> bool:
    """Whether the fused epilogue may be used (LIVEMEET_QKV_ROPE, read at import)."""
    return _enabled


if HAS_TRITON:

    @triton.jit
    def _norm_qkv_rope_kernel(
        X,
        W,
        QKV,
        R,
        NormW,
        ROut,
        QOut,
        KCache,
        VCache,
        QW,
        KW,
        Positions,
        InvFreq,
        Slots,
        Counters,
        N,
        K,
        stride_xm,
        stride_wn,
        stride_rm,
        stride_rom,
        stride_k_blk,  # KCache: slot s at s // PAGE * stride_k_blk + s % PAGE * stride_k_tok
        stride_k_tok,
        stride_k_h,
        stride_v_blk,  # VCache: the same
        stride_v_tok,
        stride_v_h,
        eps,
        qk_eps,
        inv_scale,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        PROLOGUE: tl.constexpr,  # linear.PROLOGUE_CODES["add_rms_norm"]
        K_POW2: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr,
        Q_HEADS: tl.constexpr,
        KV_HEADS: tl.constexpr,
        HALF: tl.constexpr,
        PAGE: tl.constexpr,
        FP8: tl.constexpr,
        PRECISE_TRIG: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid: (N // BLOCK_N, M); BLOCK_N divides the head size 2 * HALF. QKV: scratch
        # [M, N]; Counters: int32 [M * heads], zero between calls (split_k).
        pid_n = tl.program_id(0)
        m = tl.program_id(1)
        y, offs_n, nmask = linear.row_slab(
            X, W, m, pid_n, N, K, stride_xm, stride_wn, R, NormW, ROut, stride_rm, stride_rom,
            eps, BLOCK_N, BLOCK_K, EVEN_K, PROLOGUE, K_POW2, HAS_RESIDUAL, PDL,
        )  # fmt: skip
        row = QKV + m * N
        tl.store(row + offs_n, y.to(QKV.dtype.element_ty), mask=nmask)
        PARTS: tl.constexpr = 2 * HALF // BLOCK_N
        h = pid_n // PARTS
        counter = Counters + m * (Q_HEADS + 2 * KV_HEADS) + h
        if split_k.arrive_last(counter, PARTS):
            head = row + h * (2 * HALF)
            pos = tl.load(Positions + m)
            if h < Q_HEADS:
                lo, hi = fk.norm_rope_head(head, QW, pos, InvFreq, qk_eps, HALF, PRECISE_TRIG, True)
                fk.store_head(QOut + (m * Q_HEADS + h) * (2 * HALF), lo, hi, 1.0, HALF, False)
            else:
                slot = tl.load(Slots + m)
                if slot >= 0:  # a padding row's slot is -1: its K/V are not stored
                    hk = h - Q_HEADS
                    if hk < KV_HEADS:
                        lo, hi = fk.norm_rope_head(
                            head, KW, pos, InvFreq, qk_eps, HALF, PRECISE_TRIG, True
                        )
                        out = KCache + (slot // PAGE) * stride_k_blk
                        out += (slot % PAGE) * stride_k_tok + hk * stride_k_h
                    else:
                        cols = tl.arange(0, HALF)
                        lo = tl.load(head + cols, cache_modifier=".cg").to(tl.float32)
                        hi = tl.load(head + HALF + cols, cache_modifier=".cg").to(tl.float32)
                        out = VCache + (slot // PAGE) * stride_v_blk
                        out += (slot % PAGE) * stride_v_tok + (hk - KV_HEADS) * stride_v_h
                    fk.store_head(out, lo, hi, inv_scale, HALF, FP8)
            split_k.rearm(counter)


def norm_qkv_rope_store_kv(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    qkv_weight: torch.Tensor,
    config: linear.GemmConfig,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    qk_eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    sink: KVSink,
    *,
    num_heads: int,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`linear.skinny_norm_linear` onto qkv_weight, then `fused.qk_norm_rope_store_kv`, in one
    launch (module docstring): x [M, hidden] (+ residual [M, hidden]) -> (q [M, num_heads, D]
    normed and rotated, new residual [M, hidden]); K and V go into `sink`'s caches at its
    slots [M] (int64, -1: not stored).

    qkv_weight: [(num_heads + 2 kv_heads) * D, hidden], rows q, k, v (Qwen3Attention's
    fused weight); q/k_norm_weight [D]; positions int64 [M]; inv_freq float32 [D / 2].
    Returns None, having done nothing, where it does not apply: turned off, no Triton for
    `impl`, a slab width that does not divide D, or no split-K counters (first made inside
    a graph capture). Raises InternalError on shapes that do not fit each other.
    """
    if not (_enabled and HAS_TRITON and select_triton(impl, x, available=HAS_TRITON)):
        return None
    block_size, kv_heads, head_dim = check_cache(sink.k_cache, sink.v_cache)
    m, hidden = x.shape
    n = qkv_weight.shape[0]
    _check(x, residual, norm_weight, qkv_weight, positions, sink, num_heads, kv_heads, head_dim)
    if head_dim % config.block_n or config.block_n > head_dim:
        return None
    heads_total = num_heads + 2 * kv_heads
    counters = split_k.counters(x.device, m * heads_total)
    if counters is None:
        return None
    q = torch.empty((m, num_heads, head_dim), dtype=x.dtype, device=x.device)
    new_residual = x if residual is None else torch.empty_like(x)
    if m == 0:
        return q, new_residual
    scratch = torch.empty((m, n), dtype=x.dtype, device=x.device)
    r = x if residual is None else residual  # a valid pointer where the kernel reads none
    kc, vc = sink.k_cache, sink.v_cache
    _norm_qkv_rope_kernel[(n // config.block_n, m)](
        x, qkv_weight, scratch, r, norm_weight, new_residual, q, kc, vc, q_norm_weight,
        k_norm_weight, positions, inv_freq, sink.slot_mapping, counters, n, hidden,
        x.stride(0), qkv_weight.stride(0), r.stride(0), new_residual.stride(0),
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        eps, qk_eps, 1.0 / sink.scale,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        EVEN_K=hidden % config.block_k == 0,
        PROLOGUE=linear.PROLOGUE_CODES["add_rms_norm"],
        K_POW2=triton.next_power_of_2(hidden),
        HAS_RESIDUAL=residual is not None,
        Q_HEADS=num_heads,
        KV_HEADS=kv_heads,
        HALF=head_dim // 2,
        PAGE=block_size,
        FP8=kc.dtype == torch.float8_e4m3fn,
        PRECISE_TRIG=not pdl.is_interpreted(_norm_qkv_rope_kernel),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl.launch_options(x, _norm_qkv_rope_kernel),
    )  # fmt: skip
    return q, new_residual


def _check(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    qkv_weight: torch.Tensor,
    positions: torch.Tensor,
    sink: KVSink,
    num_heads: int,
    kv_heads: int,
    head_dim: int,
) -> None:
    if x.dim() != 2 or qkv_weight.dim() != 2 or x.shape[1] != qkv_weight.shape[1]:
        raise InternalError(
            f"need x [M, K] and qkv_weight [N, K], got {tuple(x.shape)} and "
            f"{tuple(qkv_weight.shape)}"
        )
    m = x.shape[0]
    if qkv_weight.shape[0] != (num_heads + 2 * kv_heads) * head_dim:
        raise InternalError(
            f"qkv_weight has {qkv_weight.shape[0]} rows, not ({num_heads} + 2 x {kv_heads}) "
            f"heads of {head_dim}"
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise InternalError(f"residual {tuple(residual.shape)} does not match x")
    if norm_weight.shape != x.shape[1:] or not x.dtype == qkv_weight.dtype == norm_weight.dtype:
        raise InternalError("the norm weight must be [K] and both weights in x's dtype")
    if positions.shape != (m,) or sink.slot_mapping.shape != (m,):
        raise InternalError(f"need positions and slots of [{m}]")
    if sink.slot_mapping.dtype != torch.int64:  # int32 slots would overflow slot * stride
        raise InternalError(f"slot_mapping must be int64 [M], got {sink.slot_mapping.dtype}")
    tensors = (x, qkv_weight, *([residual] if residual is not None else []))
    if any(t.stride(1) != 1 for t in tensors):
        raise InternalError("norm_qkv_rope_store_kv needs rows contiguous in the last dim")
