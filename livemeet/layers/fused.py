"""Fused decoder and encoder kernels (Triton) with torch references of the same signatures.

A decode step at batch 1 is launch-bound: the unfused Qwen3 layer runs ~55 small kernels
(RMSNorm alone is ~7 elementwise ops). These kernels fold each chain into one launch:
- `fused_add_rms_norm`: residual add + RMSNorm (livemeet.layers.norm order: statistics in fp32,
  cast to the input dtype, then times the weight in the input dtype);
- `qk_norm_rope`: per-head q/k RMSNorm then NeoX rotate-half RoPE with angles computed in fp32
  from the positions (livemeet.layers.rotary order: cos/sin in fp32, cast to the tensor dtype,
  then x*cos + rotate_half(x)*sin in the tensor dtype, each product rounded: compiled without
  fp contraction), q and k in one launch;
  `qk_norm_rope_store_kv` the same, writing the rotated k and v straight into a paged KV
  cache (`paged_attention.KVSink`, e4m3 included) instead of returning k: `store_kv` fused in;
- `silu_and_mul`: silu(gate) * up over a fused [N, 2I] gate/up projection;
- `add_layer_norm`: the Whisper encoder's residual add + the next LayerNorm (statistics and the
  affine in fp32, rounded once), so each residual sum is read once instead of twice: the
  encoder's elementwise kernels were ~21 % of its graph's time at 100 live sessions
  (docs/benchmarks.md, session 21).

Every intermediate is rounded to the tensor dtype where the torch reference rounds it, so in
bf16 the kernels match the references up to the fp32 reduction order and rsqrt/exp ulps.

`impl="auto"` runs Triton on CUDA tensors when Triton imports, and the references otherwise;
`impl="triton"` forces the kernels (the tests use it on CPU under TRITON_INTERPRET=1).
Fixed launch configurations, no autotuning, no host syncs: CUDA-graph capturable.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from livemeet.errors import ConfigError, InternalError
from livemeet.layers import pdl
from livemeet.layers.norm import rms_norm
from livemeet.layers.paged_attention import (
    Impl,
    KVSink,
    check_cache,
    next_pow2,
    select_triton,
    store_kv,
)
from livemeet.layers.rotary import apply_rotary, rope_cos_sin

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    HAS_TRITON = True
except ImportError:  # the CPU-only install path
    HAS_TRITON = False

SILU_BLOCK = 1024  # output columns per silu_and_mul program
NORM_NUM_WARPS = 4  # rows of up to a few thousand elements: one row per program
# qk_norm_rope from this many rows: one program per row and all its heads (16 + 8 + 8 of 128),
# so the row's angles are computed once and a prefill step of n rows is n programs. Per (row,
# head), a ~3k-row live step was ~100k one-warp programs: 171 us a layer, 7.5 % of the GPU's
# time at 100 live sessions (docs/benchmarks.md, session 20). Above the largest decode batch
# (Scheduler max_num_seqs, 128): decode steps keep the per-head form, which spreads a few rows
# over more SMs, as measured in every decode step so far. (The forms reduce a head's sum of
# squares in other orders: a token's k may differ by an ulp between a small and a large step,
# as attention already does between the decode and extend kernels.)
QK_ROWS_KERNEL_MIN_ROWS = 256
QK_ROWS_NUM_WARPS = 4


def _use_triton(impl: Impl, t: torch.Tensor) -> bool:
    return select_triton(impl, t, available=HAS_TRITON)


# ----------------------------------------------------------------------------------------------
# torch references
# ----------------------------------------------------------------------------------------------


def ref_fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of `fused_add_rms_norm`."""
    new_residual = x if residual is None else x + residual
    return rms_norm(new_residual, weight, eps), new_residual


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    return apply_rotary(x, *rope_cos_sin(positions, inv_freq, x.dtype))


def ref_qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of `qk_norm_rope`."""
    q = _rotate(rms_norm(q, q_weight, eps), positions, inv_freq)
    k = _rotate(rms_norm(k, k_weight, eps), positions, inv_freq)
    return q, k


def ref_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Reference of `silu_and_mul`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def ref_add_layer_norm(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of `add_layer_norm`: the ops of the encoder's layer, in its order."""
    h = x if delta is None else x + delta
    return F.layer_norm(h, h.shape[-1:], weight, bias, eps), h


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def add_residual(X, R, ROut, cols, mask, HAS_RESIDUAL: tl.constexpr, store):
        """One row's residual add: x (+ r, the sum rounded to the input dtype as torch's
        x + residual, written to ROut when `store`) over the `cols` of X/R/ROut (row pointers).
        Returns x in the input dtype. Shared by the norm kernels (RMSNorm and LayerNorm)."""
        x = tl.load(X + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(R + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
            if store:
                tl.store(ROut + cols, x, mask=mask)
        return x

    @triton.jit
    def add_residual_rstd(X, R, ROut, cols, mask, dim, eps, HAS_RESIDUAL: tl.constexpr, store):
        """One row's `add_residual` and RMS: rsqrt(mean(x^2) + eps) in fp32 over `dim`
        elements. Returns (x, rstd). Shared by _add_rms_norm_kernel and the norm-folded GEMV
        (livemeet.layers.linear)."""
        x = add_residual(X, R, ROut, cols, mask, HAS_RESIDUAL, store)
        x32 = x.to(tl.float32)
        return x, tl.rsqrt(tl.sum(x32 * x32, axis=0) / dim + eps)

    @triton.jit
    def scale_by_rstd(x, rstd, w32):
        """RMSNorm's output before its final rounding: (x * rstd) rounded to x's dtype, times
        the fp32 weight w32; fp32."""
        return (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32) * w32

    @triton.jit
    def _add_rms_norm_kernel(
        X,
        R,
        W,
        Out,
        ROut,
        stride_x,
        stride_r,
        stride_o,
        stride_ro,
        eps,
        DIM: tl.constexpr,
        BLOCK: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.dependency_sync(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < DIM
        x, rstd = add_residual_rstd(
            X + row * stride_x, R + row * stride_r, ROut + row * stride_ro, cols, mask, DIM, eps,
            HAS_RESIDUAL, True,
        )  # fmt: skip
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        out = scale_by_rstd(x, rstd, w).to(Out.dtype.element_ty)
        tl.store(Out + row * stride_o + cols, out, mask=mask)

    @triton.jit
    def _rope_cos_sin(pos, InvFreq, HALF: tl.constexpr, PRECISE_TRIG: tl.constexpr):
        """cos and sin [HALF] of one row's angles in fp32 (`_norm_rope_head(s)` round them to
        the tensors' dtype, as livemeet.layers.rotary does)."""
        angle = pos.to(tl.float32) * tl.load(InvFreq + tl.arange(0, HALF))
        if PRECISE_TRIG:
            # tl.cos/tl.sin may lower to the approximate PTX instructions, which are far off
            # at angles of ~1e5 rad; libdevice's are CUDA's cosf/sinf (the range reduced
            # exactly), which the CUDA prologue's cosf matches in every element
            c = libdevice.cos(angle)
            s = libdevice.sin(angle)
        else:  # the interpreter has no libdevice
            c = tl.cos(angle)
            s = tl.sin(angle)
        return c, s

    @triton.jit
    def _norm_rope_head(
        X,
        W,
        pos,
        InvFreq,
        eps,
        HALF: tl.constexpr,
        PRECISE_TRIG: tl.constexpr,
    ):
        """One head [2 * HALF]: RMSNorm, cast, weight, then rotate-half RoPE at `pos`. Returns
        the two halves in fp32, each already rounded to the input dtype."""
        cols = tl.arange(0, HALF)
        x1 = tl.load(X + cols)
        x2 = tl.load(X + HALF + cols)
        dtype = x1.dtype
        a1 = x1.to(tl.float32)
        a2 = x2.to(tl.float32)
        ms = (tl.sum(a1 * a1, axis=0) + tl.sum(a2 * a2, axis=0)) / (2 * HALF)
        rstd = tl.rsqrt(ms + eps)
        w1 = tl.load(W + cols).to(tl.float32)
        w2 = tl.load(W + HALF + cols).to(tl.float32)
        n1 = ((a1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        n2 = ((a2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
        c, s = _rope_cos_sin(pos, InvFreq, HALF, PRECISE_TRIG)
        c = c.to(dtype).to(tl.float32)
        s = s.to(dtype).to(tl.float32)
        # x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1), each product rounded
        o1 = (n1 * c).to(dtype).to(tl.float32) - (n2 * s).to(dtype).to(tl.float32)
        o2 = (n2 * c).to(dtype).to(tl.float32) + (n1 * s).to(dtype).to(tl.float32)
        return o1.to(dtype).to(tl.float32), o2.to(dtype).to(tl.float32)

    @triton.jit
    def _store_head(Out, lo, hi, inv_scale, HALF: tl.constexpr, FP8: tl.constexpr):
        """Write one head's halves (fp32 holding dtype-rounded values) to Out [2 * HALF] in
        Out's dtype; an e4m3 cache gets clamp(x / scale, -448, 448) as `_store_kv_kernel`."""
        cols = tl.arange(0, HALF)
        if FP8:
            lo = tl.clamp(lo * inv_scale, -448.0, 448.0)
            hi = tl.clamp(hi * inv_scale, -448.0, 448.0)
        tl.store(Out + cols, lo.to(Out.dtype.element_ty))
        tl.store(Out + HALF + cols, hi.to(Out.dtype.element_ty))

    @triton.jit
    def _qk_norm_rope_kernel(
        Q,
        K,
        V,
        QOut,
        KOut,
        VOut,
        QW,
        KW,
        Positions,
        InvFreq,
        Slots,
        inv_scale,
        stride_qn,
        stride_qh,
        stride_kn,
        stride_kh,
        stride_vn,
        stride_vh,
        stride_ko_blk,  # KOut: row r at r // PAGE * stride_ko_blk + r % PAGE * stride_ko_tok
        stride_ko_tok,
        stride_ko_h,
        stride_vo_blk,  # VOut: the same (STORE only)
        stride_vo_tok,
        stride_vo_h,
        eps,
        Q_HEADS: tl.constexpr,
        KV_HEADS: tl.constexpr,
        HALF: tl.constexpr,
        PRECISE_TRIG: tl.constexpr,
        PAGE: tl.constexpr,  # rows per KOut/VOut block: the cache's block size, or 1
        STORE: tl.constexpr,  # K/V go to cache slots Slots[n] (-1: skipped), V heads too
        FP8: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.dependency_sync(PDL)
        n = tl.program_id(0)
        h = tl.program_id(1)  # q heads, then k heads, then (STORE) v heads
        pos = tl.load(Positions + n)
        if h < Q_HEADS:
            lo, hi = _norm_rope_head(
                Q + n * stride_qn + h * stride_qh, QW, pos, InvFreq, eps, HALF, PRECISE_TRIG
            )
            _store_head(QOut + (n * Q_HEADS + h) * (2 * HALF), lo, hi, 1.0, HALF, False)
        else:
            row = n
            if STORE:
                row = tl.load(Slots + n)
            if row >= 0:  # a padding row's slot is -1: its K/V are not stored
                hk = h - Q_HEADS
                if hk < KV_HEADS:
                    lo, hi = _norm_rope_head(
                        K + n * stride_kn + hk * stride_kh, KW, pos, InvFreq, eps, HALF,
                        PRECISE_TRIG,
                    )  # fmt: skip
                    out = KOut + (row // PAGE) * stride_ko_blk + (row % PAGE) * stride_ko_tok
                    out += hk * stride_ko_h
                else:
                    hv = hk - KV_HEADS
                    cols = tl.arange(0, HALF)
                    src = V + n * stride_vn + hv * stride_vh
                    lo = tl.load(src + cols).to(tl.float32)
                    hi = tl.load(src + HALF + cols).to(tl.float32)
                    out = VOut + (row // PAGE) * stride_vo_blk + (row % PAGE) * stride_vo_tok
                    out += hv * stride_vo_h
                _store_head(out, lo, hi, inv_scale, HALF, FP8)

    @triton.jit
    def _norm_rope_heads(
        X, stride_h, W, c, s, eps, NUM_HEADS: tl.constexpr, HEADS_POW2: tl.constexpr,
        HALF: tl.constexpr,
    ):  # fmt: skip
        """One row's heads [HEADS_POW2, 2 * HALF] (heads past NUM_HEADS masked): per head
        RMSNorm, cast, weight, then rotate-half RoPE with the row's fp32 `c`, `s` [HALF]. Returns
        the two halves [HEADS_POW2, HALF] in fp32, each already rounded to the input dtype."""
        heads = tl.arange(0, HEADS_POW2)
        cols = tl.arange(0, HALF)
        mask = (heads < NUM_HEADS)[:, None]
        offs = heads[:, None] * stride_h + cols[None, :]
        x1 = tl.load(X + offs, mask=mask, other=0.0)
        x2 = tl.load(X + HALF + offs, mask=mask, other=0.0)
        dtype = x1.dtype
        a1 = x1.to(tl.float32)
        a2 = x2.to(tl.float32)
        ms = (tl.sum(a1 * a1, axis=1) + tl.sum(a2 * a2, axis=1)) / (2 * HALF)
        rstd = tl.rsqrt(ms + eps)[:, None]
        w1 = tl.load(W + cols).to(tl.float32)[None, :]
        w2 = tl.load(W + HALF + cols).to(tl.float32)[None, :]
        n1 = ((a1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        n2 = ((a2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
        c = c.to(dtype).to(tl.float32)[None, :]
        s = s.to(dtype).to(tl.float32)[None, :]
        # x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1), each product rounded
        o1 = (n1 * c).to(dtype).to(tl.float32) - (n2 * s).to(dtype).to(tl.float32)
        o2 = (n2 * c).to(dtype).to(tl.float32) + (n1 * s).to(dtype).to(tl.float32)
        return o1.to(dtype).to(tl.float32), o2.to(dtype).to(tl.float32)

    @triton.jit
    def _store_heads(
        Out, stride_h, lo, hi, inv_scale, NUM_HEADS: tl.constexpr, HEADS_POW2: tl.constexpr,
        HALF: tl.constexpr, FP8: tl.constexpr,
    ):  # fmt: skip
        """Write one row's heads' halves (fp32 holding dtype-rounded values) to Out (head h at
        h * stride_h) in Out's dtype; an e4m3 cache gets clamp(x / scale, -448, 448) as
        `_store_kv_kernel`."""
        heads = tl.arange(0, HEADS_POW2)
        cols = tl.arange(0, HALF)
        mask = (heads < NUM_HEADS)[:, None]
        offs = heads[:, None] * stride_h + cols[None, :]
        if FP8:
            lo = tl.clamp(lo * inv_scale, -448.0, 448.0)
            hi = tl.clamp(hi * inv_scale, -448.0, 448.0)
        tl.store(Out + offs, lo.to(Out.dtype.element_ty), mask=mask)
        tl.store(Out + HALF + offs, hi.to(Out.dtype.element_ty), mask=mask)

    @triton.jit
    def _qk_norm_rope_rows_kernel(
        Q,
        K,
        V,
        QOut,
        KOut,
        VOut,
        QW,
        KW,
        Positions,
        InvFreq,
        Slots,
        inv_scale,
        stride_qn,
        stride_qh,
        stride_kn,
        stride_kh,
        stride_vn,
        stride_vh,
        stride_ko_blk,  # KOut: row r at r // PAGE * stride_ko_blk + r % PAGE * stride_ko_tok
        stride_ko_tok,
        stride_ko_h,
        stride_vo_blk,  # VOut: the same (STORE only)
        stride_vo_tok,
        stride_vo_h,
        eps,
        Q_HEADS: tl.constexpr,
        KV_HEADS: tl.constexpr,
        Q_POW2: tl.constexpr,
        KV_POW2: tl.constexpr,
        HALF: tl.constexpr,
        PRECISE_TRIG: tl.constexpr,
        PAGE: tl.constexpr,  # rows per KOut/VOut block: the cache's block size, or 1
        STORE: tl.constexpr,  # K/V go to cache slots Slots[n] (-1: skipped), V heads too
        FP8: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # one program per row and all its heads (QK_ROWS_KERNEL_MIN_ROWS says why)
        pdl.dependency_sync(PDL)
        n = tl.program_id(0)
        pos = tl.load(Positions + n)
        c, s = _rope_cos_sin(pos, InvFreq, HALF, PRECISE_TRIG)
        # q, k and v get their own names: Triton types a name once per scope, and the q heads'
        # [Q_POW2, HALF] may not be rebound to the k heads' [KV_POW2, HALF] inside the branch
        q_lo, q_hi = _norm_rope_heads(
            Q + n * stride_qn, stride_qh, QW, c, s, eps, Q_HEADS, Q_POW2, HALF
        )
        _store_heads(
            QOut + n * Q_HEADS * (2 * HALF), 2 * HALF, q_lo, q_hi, 1.0, Q_HEADS, Q_POW2, HALF, False
        )
        row = n
        if STORE:
            row = tl.load(Slots + n)
        if row >= 0:  # a padding row's slot is -1: its K/V are not stored
            k_lo, k_hi = _norm_rope_heads(
                K + n * stride_kn, stride_kh, KW, c, s, eps, KV_HEADS, KV_POW2, HALF
            )
            out = KOut + (row // PAGE) * stride_ko_blk + (row % PAGE) * stride_ko_tok
            _store_heads(out, stride_ko_h, k_lo, k_hi, inv_scale, KV_HEADS, KV_POW2, HALF, FP8)
            if STORE:
                heads = tl.arange(0, KV_POW2)
                cols = tl.arange(0, HALF)
                mask = (heads < KV_HEADS)[:, None]
                src = V + n * stride_vn + heads[:, None] * stride_vh + cols[None, :]
                v_lo = tl.load(src, mask=mask, other=0.0).to(tl.float32)
                v_hi = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
                out = VOut + (row // PAGE) * stride_vo_blk + (row % PAGE) * stride_vo_tok
                _store_heads(out, stride_vo_h, v_lo, v_hi, inv_scale, KV_HEADS, KV_POW2, HALF, FP8)

    @triton.jit
    def _silu_and_mul_kernel(
        GateUp,
        Out,
        stride_in,
        stride_out,
        INTER: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.dependency_sync(PDL)
        n = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < INTER
        g = tl.load(GateUp + n * stride_in + cols, mask=mask, other=0.0)
        u = tl.load(GateUp + n * stride_in + INTER + cols, mask=mask, other=0.0)
        g32 = g.to(tl.float32)
        act = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype).to(tl.float32)
        tl.store(Out + n * stride_out + cols, (act * u.to(tl.float32)).to(g.dtype), mask=mask)

    @triton.jit
    def _add_layer_norm_kernel(
        X,
        D,
        W,
        B,
        Out,
        HOut,
        stride_x,
        stride_d,
        stride_o,
        stride_h,
        eps,
        DIM: tl.constexpr,
        BLOCK: tl.constexpr,
        HAS_DELTA: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.dependency_sync(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < DIM
        x = add_residual(
            X + row * stride_x, D + row * stride_d, HOut + row * stride_h, cols, mask, HAS_DELTA,
            True,
        )  # fmt: skip
        x32 = x.to(tl.float32)
        mean = tl.sum(x32, axis=0) / DIM
        centred = tl.where(mask, x32 - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / DIM + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        out = centred * rstd * w + b
        tl.store(Out + row * stride_o + cols, out.to(Out.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# public entry points
# ----------------------------------------------------------------------------------------------


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, dim] (+ residual [N, dim]) -> (normed [N, dim], new_residual [N, dim]).

    new_residual = x + residual (x itself when residual is None); normed = weight *
    (r32 * rsqrt(mean(r32^2) + eps)).to(dtype) with r32 = new_residual in float32. Rows must be
    contiguous in the last dim. Raises InternalError on mismatched shapes or dtypes.
    """
    if x.dim() != 2 or weight.shape != x.shape[1:]:
        raise InternalError(
            f"need x [N, dim] and weight [dim], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise InternalError(
            f"residual {tuple(residual.shape)} {residual.dtype} does not match x "
            f"{tuple(x.shape)} {x.dtype}"
        )
    if not _use_triton(impl, x):
        return ref_fused_add_rms_norm(x, residual, weight, eps)
    if x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise InternalError("fused_add_rms_norm needs rows contiguous in the last dim")
    n, dim = x.shape
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty((n, dim), dtype=out_dtype, device=x.device)
    new_residual = x if residual is None else torch.empty_like(x)
    if n == 0:
        return out, new_residual
    r = x if residual is None else residual
    _add_rms_norm_kernel[(n,)](
        x,
        r,
        weight,
        out,
        new_residual,
        x.stride(0),
        r.stride(0),
        out.stride(0),
        new_residual.stride(0),
        eps,
        DIM=dim,
        BLOCK=next_pow2(dim),
        HAS_RESIDUAL=residual is not None,
        num_warps=NORM_NUM_WARPS,
        **pdl.launch_options(x, _add_rms_norm_kernel),
    )
    return out, new_residual


def _check_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise InternalError(f"need q [N, Hq, D] and k [N, Hkv, D], got {q.shape} and {k.shape}")
    n, _, head_dim = q.shape
    for w in (q_weight, k_weight):
        if w.shape != (head_dim,) or w.dtype != q.dtype or k.dtype != q.dtype:
            raise InternalError(f"q, k and their norm weights [{head_dim}] need one dtype")
    if positions.shape != (n,) or inv_freq.shape != (head_dim // 2,):
        raise InternalError(
            f"need positions [{n}] and inv_freq [{head_dim // 2}], got "
            f"{tuple(positions.shape)} and {tuple(inv_freq.shape)}"
        )


def _check_kernel_inputs(head_dim: int, *heads: torch.Tensor) -> None:
    if head_dim < 2 or head_dim & (head_dim - 1):
        raise ConfigError(f"head_dim must be a power of two >= 2, got {head_dim}")
    if any(t.stride(2) != 1 for t in heads):
        raise InternalError("q, k and v must be contiguous in head_dim")


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm then NeoX RoPE on q [N, Hq, D] and k [N, Hkv, D] -> new contiguous
    (q, k) of the same shapes and dtype.

    q_weight, k_weight: [D] in the tensors' dtype; positions: int64 [N] (absolute); inv_freq:
    float32 [D / 2] (livemeet.layers.rotary). q and k may be strided views (e.g. slices of a
    fused qkv projection) but each head's D values must be contiguous. Raises InternalError on
    mismatched shapes, ConfigError when D is not a power of two >= 2.
    """
    _check_qk(q, k, q_weight, k_weight, positions, inv_freq)
    if not _use_triton(impl, q):
        return ref_qk_norm_rope(q, k, q_weight, k_weight, eps, positions, inv_freq)
    n, q_heads, head_dim = q.shape
    _check_kernel_inputs(head_dim, q, k)
    q_out = torch.empty((n, q_heads, head_dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((n, k.shape[1], head_dim), dtype=k.dtype, device=k.device)
    if n > 0:
        # k_out [N, Hkv, D] as blocks of one row; v and its output are unused stand-ins
        _launch_qk_norm_rope(
            q, k, k, q_out, k_out, k_out, q_weight, k_weight, eps, positions, inv_freq,
            slots=positions, inv_scale=1.0, page=1, store=False,
        )  # fmt: skip
    return q_out, k_out


def qk_norm_rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    sink: KVSink,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """`qk_norm_rope`, then `store_kv` of the rotated k and of v [N, Hkv, D] into
    `sink`'s paged caches, in one launch (one kernel fewer per layer and no k copy); returns
    the rotated q [N, Hq, D].

    Stores exactly what the two calls store, e4m3 caches included (clamp(x / scale, -448,
    448)); rows whose slot is -1 (padding) store nothing. Raises what `qk_norm_rope` and
    `store_kv` raise.
    """
    _check_qk(q, k, q_weight, k_weight, positions, inv_freq)
    if v.shape != k.shape or v.dtype != k.dtype:
        raise InternalError(f"v must match k {tuple(k.shape)}, got {tuple(v.shape)} {v.dtype}")
    block_size, num_kv_heads, head_dim = check_cache(sink.k_cache, sink.v_cache)
    if k.shape[1:] != (num_kv_heads, head_dim) or sink.slot_mapping.shape != (k.shape[0],):
        raise InternalError(
            f"k {tuple(k.shape)} and slots {tuple(sink.slot_mapping.shape)} do not fit caches "
            f"of [blocks, {block_size}, {num_kv_heads}, {head_dim}]"
        )
    if sink.slot_mapping.dtype != torch.int64:  # int32 slots would overflow slot * stride
        raise InternalError(f"slot_mapping must be int64 [N], got {sink.slot_mapping.dtype}")
    if not _use_triton(impl, q):
        q_out, k_out = ref_qk_norm_rope(q, k, q_weight, k_weight, eps, positions, inv_freq)
        store_kv(k_out, v, sink.k_cache, sink.v_cache, sink.slot_mapping,
                 k_scale=sink.scale, v_scale=sink.scale, impl=impl)  # fmt: skip
        return q_out
    n, q_heads, _ = q.shape
    _check_kernel_inputs(head_dim, q, k, v)
    q_out = torch.empty((n, q_heads, head_dim), dtype=q.dtype, device=q.device)
    if n > 0:
        _launch_qk_norm_rope(
            q, k, v, q_out, sink.k_cache, sink.v_cache, q_weight, k_weight, eps, positions,
            inv_freq, slots=sink.slot_mapping, inv_scale=1.0 / sink.scale, page=block_size,
            store=True,
        )  # fmt: skip
    return q_out


def qk_rows_kernel(num_rows: int) -> bool:
    """Whether `qk_norm_rope` over `num_rows` rows runs one program per row (True) or per (row,
    head) (QK_ROWS_KERNEL_MIN_ROWS says why)."""
    return num_rows >= QK_ROWS_KERNEL_MIN_ROWS


def _launch_qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    slots: torch.Tensor,
    inv_scale: float,
    page: int,
    store: bool,
    rows_kernel: bool | None = None,
) -> None:
    """k_out/v_out: [rows, page, Hkv, D] caches, or (page 1) [N, Hkv, D] read as such.
    `rows_kernel`: one program per row (`_qk_norm_rope_rows_kernel`) or per (row, head)
    (`_qk_norm_rope_kernel`); None picks by the row count (QK_ROWS_KERNEL_MIN_ROWS)."""
    n, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if page == 1 and k_out.dim() == 3:
        k_out, v_out = k_out.unsqueeze(1), v_out.unsqueeze(1)  # [N, 1, Hkv, D]
    if rows_kernel is None:
        rows_kernel = qk_rows_kernel(n)
    if rows_kernel:
        kernel, grid = _qk_norm_rope_rows_kernel, (n,)
        shape: dict[str, Any] = {"Q_POW2": next_pow2(q_heads), "KV_POW2": next_pow2(kv_heads)}
        shape["num_warps"] = QK_ROWS_NUM_WARPS
    else:
        kernel, grid = _qk_norm_rope_kernel, (n, q_heads + kv_heads * (2 if store else 1))
        shape = {"num_warps": 1}
    kernel[grid](
        q,
        k,
        v,
        q_out,
        k_out,
        v_out,
        q_weight,
        k_weight,
        positions,
        inv_freq,
        slots,
        inv_scale,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_out.stride(0),
        k_out.stride(1),
        k_out.stride(2),
        v_out.stride(0),
        v_out.stride(1),
        v_out.stride(2),
        eps,
        Q_HEADS=q_heads,
        KV_HEADS=kv_heads,
        HALF=head_dim // 2,
        PRECISE_TRIG=not pdl.is_interpreted(kernel),
        # No fp contraction: with it, this Triton turned x1*cos - x2*sin, each product rounded
        # to bf16 first as the reference rounds it, into one bf16 fma of the unrounded x1*cos
        # (fma.rn.bf16x2 in the PTX): the stored k rows were a bf16 ulp off the reference in
        # 15.7 % of the elements on an H100 (sessions 35-36), wherever cos was not ~1.
        enable_fp_fusion=False,
        PAGE=page,
        STORE=store,
        FP8=k_out.dtype == torch.float8_e4m3fn,
        **shape,
        **pdl.launch_options(q, kernel),
    )


def silu_and_mul(gate_up: torch.Tensor, *, impl: Impl = "auto") -> torch.Tensor:
    """gate_up [N, 2I] (gate columns first, then up) -> silu(gate) * up [N, I], same dtype.

    Raises InternalError when the last dim is odd or not contiguous.
    """
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise InternalError(f"need gate_up [N, 2I], got {tuple(gate_up.shape)}")
    if not _use_triton(impl, gate_up):
        return ref_silu_and_mul(gate_up)
    if gate_up.stride(1) != 1:
        raise InternalError("gate_up must be contiguous in the last dim")
    n, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((n, inter), dtype=gate_up.dtype, device=gate_up.device)
    if n == 0:
        return out
    block = min(SILU_BLOCK, next_pow2(inter))
    _silu_and_mul_kernel[(n, triton.cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), INTER=inter, BLOCK=block, num_warps=4,
        **pdl.launch_options(gate_up, _silu_and_mul_kernel),
    )  # fmt: skip
    return out


def add_layer_norm(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    *,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, dim] (+ delta [N, dim]) -> (normed [N, dim], h [N, dim]).

    h = x + delta (x itself when delta is None), rounded to x's dtype; normed =
    (h - mean) * rsqrt(var + eps) * weight + bias over the last dim (biased variance, as
    torch.nn.LayerNorm), computed in float32 and rounded once to x's dtype. The kernel takes
    the mean first and then the centred squares (torch's CUDA kernel uses Welford's update), so
    in bf16 the two agree up to the fp32 reduction order. Rows must be contiguous in the last
    dim. Raises InternalError on mismatched shapes or dtypes.
    """
    if x.dim() != 2 or weight.shape != x.shape[1:] or bias.shape != x.shape[1:]:
        raise InternalError(
            f"need x [N, dim], weight and bias [dim], got {tuple(x.shape)}, "
            f"{tuple(weight.shape)} and {tuple(bias.shape)}"
        )
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        raise InternalError(
            f"delta {tuple(delta.shape)} {delta.dtype} does not match x {tuple(x.shape)} {x.dtype}"
        )
    if not _use_triton(impl, x):
        return ref_add_layer_norm(x, delta, weight, bias, eps)
    strided = [t for t in (x, delta, weight, bias) if t is not None and t.stride(-1) != 1]
    if strided:
        raise InternalError("add_layer_norm needs rows, weight and bias contiguous in the last dim")
    n, dim = x.shape
    out = torch.empty((n, dim), dtype=x.dtype, device=x.device)
    h = x if delta is None else torch.empty_like(x)
    if n == 0:
        return out, h
    d = x if delta is None else delta
    _add_layer_norm_kernel[(n,)](
        x, d, weight, bias, out, h, x.stride(0), d.stride(0), out.stride(0), h.stride(0), eps,
        DIM=dim, BLOCK=next_pow2(dim), HAS_DELTA=delta is not None, num_warps=NORM_NUM_WARPS,
        **pdl.launch_options(x, _add_layer_norm_kernel),
    )  # fmt: skip
    return out, h
