"""Skinny matmuls for decode: y = x @ w.T with few rows of x (a decode batch) over a large w.

At batch 1 a decode step's projections (qkv, o, gate_up, down: ~30 MB of bf16 weights per
layer) should run at memory bandwidth, but cuBLAS's GEMM kernels for one row measured ~1 TB/s
on an H200 (loadtest/bench_decode_step.py --profile: 29 us per layer of GEMMs against ~7 us
to read the weights at 4.3 TB/s). `skinny_linear` is a Triton kernel for M <= SKINNY_MAX_M
rows: each program reads a [BLOCK_N, K] slab of w once and produces y[:, slab]. M == 1 uses a
broadcast multiply and row sum (no tensor-core padding); 2..16 rows use tl.dot with M padded
to 16, optionally with K split across programs whose last one sums the parts in a fixed order
(`GemmConfig.split_k`, livemeet.layers.split_k). Two one-row variants fold the kernel before a
projection into it (one launch fewer each; at batch 1 every kernel boundary costs ~1.5-2 us
of a ~35 us layer): `skinny_silu_linear` the MLP's SiLU*mul into the down projection,
`skinny_norm_linear` the residual add + RMSNorm into the qkv and gate_up projections (each
program re-reads the K-wide row for its RMS).

Which kernel wins depends on the shape and the GPU, so `LinearPlan.tune` times cuBLAS (or, for
the fused variants, the two-kernel path) and a few fixed Triton configurations per (weight
shape, row class, prologue) once at start-up, inside CUDA graphs and over enough weight copies
to defeat the L2 cache, and `LinearPlan` dispatches by that table (cuBLAS / the two-kernel
path for anything not tuned, for more rows, and on the CPU).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from livemeet.errors import ConfigError, InternalError
from livemeet.layers import fused as fk
from livemeet.layers import pdl, split_k
from livemeet.layers.paged_attention import Impl, select_triton

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU-only install path
    HAS_TRITON = False

log = logging.getLogger(__name__)

Prologue = Literal["none", "silu_mul", "add_rms_norm"]  # what a tuned kernel does to its input
# _skinny_rows_kernel's PROLOGUE constexpr for each prologue
PROLOGUE_CODES: dict[Prologue, int] = {"none": 0, "silu_mul": 1, "add_rms_norm": 2}
TUNED_DTYPES = (torch.bfloat16, torch.float16)  # the serving dtypes; fp32 is the parity path
SKINNY_MAX_M = 16  # rows; above this a decode batch is a real GEMM and cuBLAS wins
DOT_BLOCK_M = 16  # tl.dot needs >= 16 rows; 2..16 rows are padded to it
TUNE_L2_DEFEAT_BYTES = 256 << 20  # weight copies cycled per timing (H200 L2: 50 MB)
# at most this many copies: a tiny test weight would otherwise take ~10k launches per timing
# (one GPU test ran past its 4-minute budget tuning a 64-wide model); real sizes need <= 64
TUNE_MAX_COPIES = 64
TUNE_REP_MS = 10  # ms of replays per candidate (triton.testing.do_bench_cudagraph)


@dataclass(frozen=True)
class GemmConfig:
    """One fixed launch configuration of the skinny kernel (no autotuning at run time)."""

    block_n: int  # output columns per program
    block_k: int  # reduction elements per loop iteration
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # 2..16 rows only: K cut across this many programs per column tile

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps", "split_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ConfigError(f"GemmConfig.{name} must be a power of two, not {value}")
        if self.num_stages < 1:
            raise ConfigError(f"GemmConfig.num_stages must be >= 1, not {self.num_stages}")


# Candidates timed by `LinearPlan.tune`. M == 1 (reduction kernel): narrow slabs keep every SM
# busy on N = 1024 outputs; 2..16 rows (tl.dot): block_n >= 16. The 4- and 8-column slabs with
# 1024-2048-wide chunks put 128-256 programs on o_proj/down_proj (N = 1024), each issuing its
# whole slab in one or two loads: at 16 columns those two ran at ~1 TB/s with 64 programs
# (H200, docs/benchmarks.md, session 3).
ROW_CANDIDATES = (
    GemmConfig(8, 512),
    GemmConfig(16, 256),
    GemmConfig(16, 512, num_warps=8),
    GemmConfig(32, 256),
    GemmConfig(64, 128),
    GemmConfig(4, 1024),
    GemmConfig(8, 1024),
    GemmConfig(4, 2048),
    GemmConfig(8, 2048, num_warps=8),
)
# 2..16 rows: cuBLAS won every shape against the one-pass tiles below (5-8 us per projection,
# ~1.5 TB/s; H200, session 4), since N = 1024 outputs make only 64 programs of 16 columns.
# Split-K tiles put 128-256 programs on those shapes, with 2-warp programs for 16 x 16 tiles
# (splits cover whole BLOCK_K chunks, so a short K can leave the last splits empty: they
# still store zeros and count themselves done). Session 5 picked (16, 256, 2 warps, split 4)
# for the down projection (K = 3072): 6.8 against cuBLAS's 8.0 us. `dot_candidates` times
# only those that fill the SMs (on an H200's 132, the split-2 tiles at N = 1024 are left out).
DOT_CANDIDATES = (
    GemmConfig(16, 256),
    GemmConfig(32, 128),
    GemmConfig(32, 256),
    GemmConfig(64, 128),
    GemmConfig(16, 512, num_warps=2),
    GemmConfig(16, 256, num_warps=2, split_k=2),
    GemmConfig(16, 256, num_warps=2, split_k=4),
    GemmConfig(16, 512, num_warps=2, split_k=2),
    GemmConfig(16, 512, split_k=4),
    GemmConfig(32, 256, split_k=2),
    # loadtest/sweep_linear.py's fastest on an H100 for qkv, and for o_proj and down_proj
    # (5.0 / 4.2 / 6.0 us against the picks above at 5.5 / 4.9 / 6.8; the tuner takes them
    # there, and a 16 x 36k decode step is 0.14 % (bf16) and 0.33 % (FP8) faster: session 40)
    GemmConfig(16, 512, num_warps=2, num_stages=4),
    GemmConfig(32, 256, num_stages=2, split_k=8),
)


@torch.no_grad()
def fuse_linears(
    linears: tuple[torch.nn.Linear, ...],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One projection for several over the same input: their weights [out_i, in] concatenated
    along the output dim, and their biases too when any has one (zeros for those without),
    each weight and bias then re-pointed at its rows of the result (one copy in memory, the
    same values, requires_grad kept). Returns (weight [sum out_i, in], bias [sum out_i] or
    None). Hazard: the old parameters are freed; a CUDA graph captured over them must not
    replay afterwards."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    biases = [lin.bias for lin in linears if lin.bias is not None]
    bias = None
    if biases:
        like = biases[0]
        bias = torch.cat(
            [
                lin.bias.detach() if lin.bias is not None else like.new_zeros(lin.out_features)
                for lin in linears
            ]
        )
    start = 0
    for lin in linears:
        rows = slice(start, start + lin.weight.shape[0])
        lin.weight = torch.nn.Parameter(weight[rows], requires_grad=lin.weight.requires_grad)
        if bias is not None and lin.bias is not None:
            lin.bias = torch.nn.Parameter(bias[rows], requires_grad=lin.bias.requires_grad)
        start = rows.stop
    return weight, bias


def full_wave(config: GemmConfig, n: int, num_sms: int) -> bool:
    """Whether a 2..16-row launch of `config` on N = n outputs has a program for every SM.

    The tuner times copies of one projection back to back, and under PDL each copy's programs
    start on the SMs its predecessor leaves idle; in a decode step the neighbours are other
    kernels that wait for it, so a narrow grid that timed well there leaves SMs idle. (Tiles
    of 64 weight rows with swapped operands, W x^T on wgmma, in grids of 64 and 96 programs
    won the tuning on an H200 by 0.3-0.4 us and made the 16 x 36k FP8 decode step 0.4 ms
    slower; with full waves they never won and were dropped: docs/benchmarks.md, session 9.)"""
    tiles = -(-n // config.block_n)
    return tiles * config.split_k >= num_sms


def dot_candidates(n: int, num_sms: int) -> list[GemmConfig]:
    """The DOT_CANDIDATES `LinearPlan.tune` times for 2..16 rows on N = n outputs: those with
    a full wave of programs."""
    return [c for c in DOT_CANDIDATES if c.block_n <= n and full_wave(c, n, num_sms)]


def row_class(num_rows: int) -> int | None:
    """The tuning class of an M-row input: 1, SKINNY_MAX_M (2..16 rows), or None (cuBLAS)."""
    if num_rows == 1:
        return 1
    if 1 < num_rows <= SKINNY_MAX_M:
        return SKINNY_MAX_M
    return None


if HAS_TRITON:
    SILU_MUL = tl.constexpr(PROLOGUE_CODES["silu_mul"])
    ADD_RMS_NORM = tl.constexpr(PROLOGUE_CODES["add_rms_norm"])

    @triton.jit
    def _row_chunk(
        x_row, kk, K, r_row, norm_w, rstd, EVEN_K: tl.constexpr, PROLOGUE: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr,
    ):  # fmt: skip
        """Elements kk of one input row as fp32 [BLOCK_K], after the prologue, rounded to the
        input dtype where the unfused kernels round. SILU_MUL: the row is [gate | up] (2K
        wide) and the elements are silu(gate) * up (livemeet.layers.fused.silu_and_mul).
        ADD_RMS_NORM: x (+ the residual row r_row) times `rstd`, times norm_w
        (livemeet.layers.fused.fused_add_rms_norm)."""
        kmask = kk < K
        if EVEN_K:
            x = tl.load(x_row + kk)
        else:
            x = tl.load(x_row + kk, mask=kmask, other=0.0)
        if PROLOGUE == SILU_MUL:
            if EVEN_K:
                u = tl.load(x_row + K + kk)
            else:
                u = tl.load(x_row + K + kk, mask=kmask, other=0.0)
            g32 = x.to(tl.float32)
            act = (g32 / (1.0 + tl.exp(-g32))).to(x.dtype).to(tl.float32)
            x = (act * u.to(tl.float32)).to(u.dtype)
        elif PROLOGUE == ADD_RMS_NORM:
            if HAS_RESIDUAL:
                r = tl.load(r_row + kk, mask=kmask, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
            w = tl.load(norm_w + kk, mask=kmask, other=0.0).to(tl.float32)
            x = fk.scale_by_rstd(x, rstd, w).to(x.dtype)
        return x.to(tl.float32)

    @triton.jit
    def _rows_tile(rows, kk, K, rmask, EVEN_K: tl.constexpr):
        """The [R, BLOCK_K] tile at columns kk of the R rows whose starts are `rows` ([R, 1]
        pointers): zeros past K and in rows where `rmask` ([R]) is false."""
        if EVEN_K:
            return tl.load(rows + kk[None, :], mask=rmask[:, None], other=0.0)
        return tl.load(rows + kk[None, :], mask=rmask[:, None] & (kk < K)[None, :], other=0.0)

    @triton.jit(do_not_specialize=["M"])
    def _skinny_rows_kernel(
        X,
        W,
        Out,
        M,
        N,
        K,
        stride_xm,
        stride_wn,
        stride_om,
        R,
        NormW,
        ROut,
        stride_rm,
        stride_rom,
        eps,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        PROLOGUE: tl.constexpr,
        K_POW2: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid: (cdiv(N, BLOCK_N), M); one row of x per program along axis 1. PROLOGUE (see
        # _row_chunk): NONE, SILU_MUL, or ADD_RMS_NORM, where every program first reads its
        # whole row (K_POW2 >= K elements, a few KB) for the RMS and program 0 of the row
        # writes the new residual to ROut; R, NormW, ROut, eps serve only ADD_RMS_NORM.
        pid_n = tl.program_id(0)
        m = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        nmask = offs_n < N
        w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
        # the first weight tile is read before the wait: no kernel writes weights (livemeet.
        # layers.pdl), so under PDL it streams in while the previous kernel finishes
        w_first = _rows_tile(w_rows, offs_k, K, nmask, EVEN_K)
        pdl.dependency_sync(PDL)
        x_row = X + m * stride_xm
        r_row = R + m * stride_rm
        rstd = 1.0
        if PROLOGUE == ADD_RMS_NORM:
            cols = tl.arange(0, K_POW2)
            _, rstd = fk.add_residual_rstd(
                x_row, r_row, ROut + m * stride_rom, cols, cols < K, K, eps, HAS_RESIDUAL,
                pid_n == 0,
            )  # fmt: skip
        x = _row_chunk(x_row, offs_k, K, r_row, NormW, rstd, EVEN_K, PROLOGUE, HAS_RESIDUAL)
        acc = w_first.to(tl.float32) * x[None, :]
        for k0 in range(BLOCK_K, K, BLOCK_K):
            kk = k0 + offs_k
            w = _rows_tile(w_rows, kk, K, nmask, EVEN_K)
            x = _row_chunk(x_row, kk, K, r_row, NormW, rstd, EVEN_K, PROLOGUE, HAS_RESIDUAL)
            acc += w.to(tl.float32) * x[None, :]
        y = tl.sum(acc, 1)
        tl.store(Out + m * stride_om + offs_n, y.to(Out.dtype.element_ty), mask=nmask)

    @triton.jit(do_not_specialize=["M"])
    def _skinny_dot_kernel(
        X,
        W,
        Out,
        Partials,
        Counters,
        M,
        N,
        K,
        stride_xm,
        stride_wn,
        stride_om,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid: (cdiv(N, BLOCK_N), SPLIT_K); all M <= BLOCK_M rows in one program. With
        # SPLIT_K > 1 each program reduces a BLOCK_K-aligned 1/SPLIT_K of K into Partials
        # [SPLIT_K, BLOCK_M, N] fp32 and the last of a column tile's programs sums them in
        # split order (livemeet.layers.split_k; Counters: one per column tile).
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        k_len = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_start = pid_k * k_len
        k_end = tl.minimum(k_start + k_len, K)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        mmask = offs_m < M
        nmask = offs_n < N
        w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
        # the first weight tile is read before the wait, as in _skinny_rows_kernel (an empty
        # last split reads nothing)
        # (k_start < K) broadcast as a block: the interpreter rejects block & scalar masks
        w_first = _rows_tile(
            w_rows, k_start + offs_k, K, nmask & (offs_n * 0 + k_start < K), EVEN_K
        )
        pdl.dependency_sync(PDL)
        x_rows = X + offs_m[:, None] * stride_xm
        x = _rows_tile(x_rows, k_start + offs_k, K, mmask & (offs_m * 0 + k_start < K), EVEN_K)
        acc = tl.dot(x, tl.trans(w_first.to(x.dtype)))
        for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
            kk = k0 + offs_k
            x = _rows_tile(x_rows, kk, K, mmask, EVEN_K)
            w = _rows_tile(w_rows, kk, K, nmask, EVEN_K)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        out = Out + offs_m[:, None] * stride_om + offs_n[None, :]
        omask = mmask[:, None] & nmask[None, :]
        if SPLIT_K == 1:
            tl.store(out, acc.to(Out.dtype.element_ty), mask=omask)
        else:
            tile = offs_m[:, None] * N + offs_n[None, :]  # [BLOCK_M, BLOCK_N] in one split
            tl.store(Partials + pid_k * BLOCK_M * N + tile, acc, mask=omask)
            if split_k.arrive_last(Counters + pid_n, SPLIT_K):
                total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for s in tl.static_range(SPLIT_K):
                    part = Partials + s * BLOCK_M * N + tile
                    total += tl.load(part, mask=omask, other=0.0, cache_modifier=".cg")
                tl.store(out, total.to(Out.dtype.element_ty), mask=omask)
                split_k.rearm(Counters + pid_n)


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, config: GemmConfig, *, impl: Impl = "auto"
) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T -> [M, N] in x's dtype, fp32 accumulation, for
    1 <= M <= SKINNY_MAX_M. `impl="torch"` (or no Triton, or a CPU tensor under "auto") runs
    F.linear. Raises InternalError on mismatched shapes or dtypes, M out of range, or rows not
    contiguous in the last dim."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise InternalError(
            f"need x [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.dtype != weight.dtype:
        raise InternalError(f"x is {x.dtype} but the weight is {weight.dtype}")
    m, k = x.shape
    n = weight.shape[0]
    if not 1 <= m <= SKINNY_MAX_M:
        raise InternalError(f"skinny_linear takes 1..{SKINNY_MAX_M} rows, not {m}")
    if not select_triton(impl, x, available=HAS_TRITON):
        return F.linear(x, weight)
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise InternalError("skinny_linear needs rows contiguous in the last dim")
    if m == 1:
        return _rows_launch(x, weight, k, config)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(n, config.block_n)
    parts = config.split_k
    counters = split_k.counters(x.device, tiles) if parts > 1 else None
    if counters is None:
        parts = 1  # no counters (first made inside a capture, or too many tiles): one pass
    partials = out  # unused with one split
    if parts > 1:
        partials = torch.empty((parts, DOT_BLOCK_M, n), dtype=torch.float32, device=x.device)
    _skinny_dot_kernel[(tiles, parts)](
        x,
        weight,
        out,
        partials,
        out if counters is None else counters,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        BLOCK_M=DOT_BLOCK_M,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        SPLIT_K=parts,
        EVEN_K=k % config.block_k == 0,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl.launch_options(x, _skinny_dot_kernel),
    )
    return out


def _rows_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    config: GemmConfig,
    prologue: Prologue = "none",
    norm: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, float] | None = None,
) -> torch.Tensor:
    """`_skinny_rows_kernel` over every row of x (checked by the callers): [M, N]. `norm`:
    (residual or None, norm weight, new residual, eps) for the "add_rms_norm" prologue
    (without a residual nothing is written to the new residual, which is then x)."""
    m, n = x.shape[0], weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    residual, norm_w, r_out, eps = norm if norm is not None else (None, x, x, 0.0)
    r = x if residual is None else residual  # a valid pointer where the kernel reads none
    _skinny_rows_kernel[(triton.cdiv(n, config.block_n), m)](
        x,
        weight,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        r,
        norm_w,
        r_out,
        r.stride(0),
        r_out.stride(0),
        eps,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        EVEN_K=k % config.block_k == 0,
        PROLOGUE=PROLOGUE_CODES[prologue],
        K_POW2=triton.next_power_of_2(k) if prologue == "add_rms_norm" else 1,
        HAS_RESIDUAL=residual is not None,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl.launch_options(x, _skinny_rows_kernel),
    )
    return out


def skinny_silu_linear(
    gate_up: torch.Tensor, weight: torch.Tensor, config: GemmConfig, *, impl: Impl = "auto"
) -> torch.Tensor:
    """silu(gate) * up of gate_up [M, 2K] (gate columns first), times weight[N, K].T ->
    [M, N]: the MLP's activation fused into its down projection, for decode rows (one
    program per row along the grid's second axis). Same rounding as silu_and_mul followed by
    skinny_linear. `impl="torch"` (or no Triton) runs the references. Raises InternalError on
    mismatched shapes or dtypes, or rows not contiguous in the last dim."""
    if gate_up.dim() != 2 or weight.dim() != 2 or gate_up.shape[1] != 2 * weight.shape[1]:
        raise InternalError(
            f"need gate_up [M, 2K] and weight [N, K], got {tuple(gate_up.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if gate_up.dtype != weight.dtype:
        raise InternalError(f"gate_up is {gate_up.dtype} but the weight is {weight.dtype}")
    if not select_triton(impl, gate_up, available=HAS_TRITON):
        return F.linear(fk.ref_silu_and_mul(gate_up), weight)
    if gate_up.stride(1) != 1 or weight.stride(1) != 1:
        raise InternalError("skinny_silu_linear needs rows contiguous in the last dim")
    return _rows_launch(gate_up, weight, weight.shape[1], config, "silu_mul")


def skinny_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    config: GemmConfig,
    *,
    impl: Impl = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm(x, residual, norm_weight, eps)` followed by the projection onto
    weight [N, K], in one kernel for decode rows: x [M, K] (+ residual [M, K]) ->
    (y [M, N], new_residual [M, K]), with the same roundings as the two-kernel path (one
    program per row along the grid's second axis; every program re-reads its row for the
    RMS). `impl="torch"` (or no Triton) runs the references. Raises InternalError on mismatched
    shapes or dtypes, or rows not contiguous in the last dim."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise InternalError(
            f"need x [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if norm_weight.shape != x.shape[1:] or x.dtype != weight.dtype or x.dtype != norm_weight.dtype:
        raise InternalError("the norm weight must be [K] and both weights in x's dtype")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise InternalError(f"residual {tuple(residual.shape)} does not match x")
    if not select_triton(impl, x, available=HAS_TRITON):
        normed, new_residual = fk.ref_fused_add_rms_norm(x, residual, norm_weight, eps)
        return F.linear(normed.to(x.dtype), weight), new_residual
    contiguous = (
        t.stride(1) == 1 for t in (x, weight, *([residual] if residual is not None else []))
    )
    if not all(contiguous):
        raise InternalError("skinny_norm_linear needs rows contiguous in the last dim")
    new_residual = x if residual is None else torch.empty_like(x)
    norm = (residual, norm_weight, new_residual, eps)
    return _rows_launch(x, weight, x.shape[1], config, "add_rms_norm", norm), new_residual


NORM_TUNE_EPS = 1e-6  # eps of the RMSNorm timed by `tune` (the value does not change the time)


@dataclass(frozen=True)
class TuneResult:
    """One tuned (weight shape, row class, prologue): microseconds per call of the baseline and
    of the best Triton config, and the choice (None = the baseline)."""

    shape: tuple[int, int]  # (N, K)
    rows: int  # row class (1 or SKINNY_MAX_M)
    baseline_us: float  # cuBLAS; with a prologue, its kernel then the plan's plain projection
    best_us: float
    choice: GemmConfig | None
    prologue: Prologue = "none"


def describe(results: Iterable[TuneResult]) -> list[str]:
    """One line per tuned (shape, row class, prologue), for benchmark logs."""
    lines = []
    for r in results:
        fused = "" if r.prologue == "none" else f" with {r.prologue} fused"
        baseline = "cuBLAS" if r.prologue == "none" else "two kernels"
        lines.append(
            f"linear {r.shape} x {r.rows} rows{fused}: {baseline} {r.baseline_us:.1f} us, "
            f"best Triton {r.best_us:.1f} us -> {r.choice or baseline}"
        )
    return lines


class LinearPlan:
    """Per (weight shape, dtype, row class, prologue): the baseline or a Triton `GemmConfig`
    (see module doc). Prologues: "silu_mul" (`silu_mul_linear`: the MLP activation before the
    down projection) and "add_rms_norm" (`norm_linear`: the residual add + RMSNorm before the
    qkv and gate_up projections), tuned for one row (decode at batch 1).

    An empty plan (the default; the CPU) runs F.linear after the unfused prologue, so tuning
    only changes speed. `impl` is passed to the skinny kernels ("triton" lets CPU tests drive
    the interpreter).
    """

    def __init__(self, impl: Impl = "auto") -> None:
        self.impl: Impl = impl
        self._choices: dict[tuple[int, int, torch.dtype, int, Prologue], GemmConfig] = {}
        self.results: list[TuneResult] = []

    def _choice(
        self, weight: torch.Tensor, x: torch.Tensor, prologue: Prologue
    ) -> GemmConfig | None:
        rows = row_class(x.shape[0]) if x.dim() == 2 else None
        if rows is None or (prologue != "none" and rows != 1):
            return None
        return self._choices.get((weight.shape[0], weight.shape[1], weight.dtype, rows, prologue))

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ weight[N, K].T -> [M, N] by the tuned kernel for (N, K, M's class)."""
        config = self._choice(weight, x, "none")
        if config is None:
            return F.linear(x, weight)
        return skinny_linear(x, weight, config, impl=self.impl)

    def silu_mul_linear(self, gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of gate_up [M, 2K], times weight[N, K].T -> [M, N]. One row with a
        "silu_mul" choice for the weight runs one kernel (`skinny_silu_linear`); otherwise the
        SiLU*mul kernel then `linear`."""
        config = self._choice(weight, gate_up, "silu_mul")
        if config is not None:
            return skinny_silu_linear(gate_up, weight, config, impl=self.impl)
        return self.linear(fk.silu_and_mul(gate_up, impl="triton"), weight)

    def norm_linear(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
        weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`fused_add_rms_norm(x, residual, norm_weight, eps)` then the projection onto weight
        [N, K]: (y [M, N], new_residual [M, K]). One row with an "add_rms_norm" choice for the
        weight runs one kernel (`skinny_norm_linear`); otherwise the norm kernel then `linear`."""
        config = self._choice(weight, x, "add_rms_norm")
        if config is not None:
            return skinny_norm_linear(x, residual, norm_weight, eps, weight, config, impl=self.impl)
        h, new_residual = fk.fused_add_rms_norm(x, residual, norm_weight, eps, impl="triton")
        return self.linear(h, weight), new_residual

    def set_choice(
        self,
        shape: tuple[int, int],
        dtype: torch.dtype,
        rows: int,
        config: GemmConfig | None,
        *,
        prologue: Prologue = "none",
    ) -> None:
        """Use `config` (None: the baseline) for weights of `shape` (N, K) and `dtype` at the
        row class `rows` (1 or SKINNY_MAX_M; see `row_class`) with `prologue`."""
        key = (shape[0], shape[1], dtype, rows, prologue)
        if config is None:
            self._choices.pop(key, None)
        else:
            self._choices[key] = config

    def tune(
        self,
        weights: Iterable[torch.Tensor],
        *,
        silu_weights: Iterable[torch.Tensor] = (),
        norm_weights: Iterable[torch.Tensor] = (),
    ) -> list[TuneResult]:
        """Time cuBLAS and every candidate for each distinct CUDA bf16/fp16 weight shape at 1
        and SKINNY_MAX_M rows; then, at one row, the fused kernels for `silu_weights`
        (projections fed by SiLU*mul) and `norm_weights` (fed by residual add + RMSNorm)
        against their two-kernel paths (whose projection uses the plain choice just tuned).
        Keep the fastest. Returns (and logs) the measurements. Needs no graph capture in
        progress; allocates ~TUNE_L2_DEFEAT_BYTES of scratch per shape. A candidate that fails
        to compile is logged and skipped."""
        self.results = []  # a second tune replaces the first one's measurements
        plan: list[tuple[torch.Tensor, int, Prologue]] = [
            (w, rows, "none") for w in weights for rows in (1, SKINNY_MAX_M)
        ]
        plan += [(w, 1, "silu_mul") for w in silu_weights]
        plan += [(w, 1, "add_rms_norm") for w in norm_weights]
        seen: set[tuple[int, int, torch.dtype, int, Prologue]] = set()
        for w, rows, prologue in plan:
            key = (w.shape[0], w.shape[1], w.dtype, rows, prologue)
            if not (HAS_TRITON and w.is_cuda and w.dim() == 2) or key in seen:
                continue
            if w.dtype not in TUNED_DTYPES:
                continue  # fp32 stays on cuBLAS: tl.dot would round it to TF32
            seen.add(key)
            result = _tune_one(self, w, rows, prologue)
            self.set_choice(result.shape, w.dtype, rows, result.choice, prologue=prologue)
            self.results.append(result)
            log.info("%s", describe([result])[0])
        return self.results


def tune_copies(weight_bytes: int) -> int:
    """Weight copies cycled per timing: enough to cover TUNE_L2_DEFEAT_BYTES (so each call reads
    HBM, as in a real step), between 2 and TUNE_MAX_COPIES."""
    return min(TUNE_MAX_COPIES, max(2, -(-TUNE_L2_DEFEAT_BYTES // weight_bytes)))


def per_call_us(run_all: Callable[[], object], copies: int) -> float:
    """Microseconds per projection of `run_all`, which runs one per weight copy (`copies`),
    replayed in a CUDA graph for TUNE_REP_MS (triton.testing.do_bench_cudagraph): how the
    tuner times every candidate, and loadtest/sweep_linear.py its grid. Needs CUDA and Triton;
    raises what the launches raise (e.g. a candidate out of registers)."""
    ms = triton.testing.do_bench_cudagraph(run_all, rep=TUNE_REP_MS)
    return 1e3 * float(ms) / copies


def _tune_one(plan: LinearPlan, weight: torch.Tensor, rows: int, prologue: Prologue) -> TuneResult:
    """Time the baseline and each candidate for one (weight, row class, prologue)."""
    n, k = weight.shape
    copies = tune_copies(weight.numel() * weight.element_size())
    ws = [torch.randn_like(weight) * 0.02 for _ in range(copies)]
    like = {"dtype": weight.dtype, "device": weight.device}
    x = torch.randn(rows, 2 * k if prologue == "silu_mul" else k, **like)
    residual, norm_w = torch.randn(rows, k, **like), torch.ones(k, **like)
    eps = NORM_TUNE_EPS

    def baseline(w: torch.Tensor) -> object:
        if prologue == "silu_mul":
            return plan.linear(fk.silu_and_mul(x, impl="triton"), w)
        if prologue == "add_rms_norm":
            return plan.linear(fk.fused_add_rms_norm(x, residual, norm_w, eps, impl="triton")[0], w)
        return F.linear(x, w)

    def candidate(w: torch.Tensor, config: GemmConfig) -> object:
        if prologue == "silu_mul":
            return skinny_silu_linear(x, w, config)
        if prologue == "add_rms_norm":
            return skinny_norm_linear(x, residual, norm_w, eps, w, config)
        return skinny_linear(x, w, config)

    def timed(fn: Callable[[torch.Tensor], object]) -> float:
        def run_all() -> None:
            for w in ws:
                fn(w)

        return per_call_us(run_all, copies)

    baseline_us = timed(baseline)
    num_sms = torch.cuda.get_device_properties(weight.device).multi_processor_count
    candidates = ROW_CANDIDATES if rows == 1 else dot_candidates(n, num_sms)
    best: tuple[float, GemmConfig] | None = None
    for config in candidates:
        if config.block_n > n:
            continue
        try:
            us = timed(functools.partial(candidate, config=config))
        except Exception as exc:  # e.g. out of registers or shared memory on this GPU
            log.warning("linear %s %s with %s: skipped (%s)", (n, k), prologue, config, exc)
            continue
        if best is None or us < best[0]:
            best = (us, config)
    if best is None or best[0] >= baseline_us:
        fallback_us = best[0] if best else baseline_us
        return TuneResult((n, k), rows, baseline_us, fallback_us, None, prologue)
    return TuneResult((n, k), rows, baseline_us, best[0], best[1], prologue)
