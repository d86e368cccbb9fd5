"""Skinny matmuls for decode: y = x @ w.T with few rows of x (a decode batch) over a large w.

At batch 1 a decode step's projections (qkv, o, gate_up, down: ~30 MB of bf16 weights per
layer) should run at memory bandwidth, but cuBLAS's GEMM kernels for one row measured ~1 TB/s
on an H200 (loadtest/bench_decode_step.py --profile: 29 us per layer of GEMMs against ~7 us
to read the weights at 4.3 TB/s). `skinny_linear` is a Triton kernel for M <= SKINNY_MAX_M
rows: each program reads a [BLOCK_N, K] slab of w once and produces y[:, slab]. M == 1 uses a
broadcast multiply and row sum (no tensor-core padding); 2..16 rows use tl.dot with M padded
to 16. `skinny_silu_linear` folds the MLP's SiLU*mul into the one-row down projection (one
launch fewer per layer).

Which kernel wins depends on the shape and the GPU, so `LinearPlan.tune` times cuBLAS and a
few fixed Triton configurations per (weight shape, row class) once at start-up, inside CUDA
graphs and over enough weight copies to defeat the L2 cache, and `LinearPlan.linear`
dispatches by that table (cuBLAS for anything not tuned, for more rows, and on the CPU).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from livemeet.errors import InternalError
from livemeet.layers import fused as fk
from livemeet.layers.paged_attention import Impl, select_triton

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU-only install path
    HAS_TRITON = False

log = logging.getLogger(__name__)

TUNED_DTYPES = (torch.bfloat16, torch.float16)  # the serving dtypes; fp32 is the parity path
SKINNY_MAX_M = 16  # rows; above this a decode batch is a real GEMM and cuBLAS wins
DOT_BLOCK_M = 16  # tl.dot needs >= 16 rows; 2..16 rows are padded to it
TUNE_L2_DEFEAT_BYTES = 256 << 20  # weight copies cycled per timing (H200 L2: 50 MB)
TUNE_REP_MS = 10  # ms of replays per candidate (triton.testing.do_bench_cudagraph)


@dataclass(frozen=True)
class GemmConfig:
    """One fixed launch configuration of the skinny kernel (no autotuning at run time)."""

    block_n: int  # output columns per program
    block_k: int  # reduction elements per loop iteration
    num_warps: int = 4
    num_stages: int = 3


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
DOT_CANDIDATES = (
    GemmConfig(16, 256),
    GemmConfig(32, 128),
    GemmConfig(32, 256),
    GemmConfig(64, 128),
)


def row_class(num_rows: int) -> int | None:
    """The tuning class of an M-row input: 1, SKINNY_MAX_M (2..16 rows), or None (cuBLAS)."""
    if num_rows == 1:
        return 1
    if 1 < num_rows <= SKINNY_MAX_M:
        return SKINNY_MAX_M
    return None


if HAS_TRITON:

    @triton.jit
    def _row_chunk(x_row, kk, K, EVEN_K: tl.constexpr, SILU_MUL: tl.constexpr):
        """Elements kk of one input row as fp32 [BLOCK_K]. SILU_MUL: the row is [gate | up]
        (2K wide) and the elements are silu(gate) * up, rounded to the input dtype where
        livemeet.layers.fused.silu_and_mul rounds them."""
        if EVEN_K:
            x = tl.load(x_row + kk)
        else:
            x = tl.load(x_row + kk, mask=kk < K, other=0.0)
        if SILU_MUL:
            if EVEN_K:
                u = tl.load(x_row + K + kk)
            else:
                u = tl.load(x_row + K + kk, mask=kk < K, other=0.0)
            g32 = x.to(tl.float32)
            act = (g32 / (1.0 + tl.exp(-g32))).to(x.dtype).to(tl.float32)
            x = (act * u.to(tl.float32)).to(u.dtype)
        return x.to(tl.float32)

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
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        SILU_MUL: tl.constexpr,
    ):
        # grid: (cdiv(N, BLOCK_N), M); one row of x per program along axis 1
        pid_n = tl.program_id(0)
        m = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        nmask = offs_n < N
        w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
        x_row = X + m * stride_xm
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            if EVEN_K:
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
            else:
                w = tl.load(
                    w_rows + kk[None, :], mask=nmask[:, None] & (kk < K)[None, :], other=0.0
                )
            x = _row_chunk(x_row, kk, K, EVEN_K, SILU_MUL)
            acc += w.to(tl.float32) * x[None, :]
        y = tl.sum(acc, 1)
        tl.store(Out + m * stride_om + offs_n, y.to(Out.dtype.element_ty), mask=nmask)

    @triton.jit(do_not_specialize=["M"])
    def _skinny_dot_kernel(
        X,
        W,
        Out,
        M,
        N,
        K,
        stride_xm,
        stride_wn,
        stride_om,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
    ):
        # grid: (cdiv(N, BLOCK_N),); all M <= BLOCK_M rows in one program
        pid_n = tl.program_id(0)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        mmask = offs_m < M
        nmask = offs_n < N
        x_rows = X + offs_m[:, None] * stride_xm
        w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            if EVEN_K:
                x = tl.load(x_rows + kk[None, :], mask=mmask[:, None], other=0.0)
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
            else:
                kmask = kk < K
                x = tl.load(x_rows + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
                w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        out = Out + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(Out.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


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
        return _rows_launch(x, weight, k, config, silu_mul=False)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _skinny_dot_kernel[(triton.cdiv(n, config.block_n),)](
        x,
        weight,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        BLOCK_M=DOT_BLOCK_M,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        EVEN_K=k % config.block_k == 0,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def _rows_launch(
    x: torch.Tensor, weight: torch.Tensor, k: int, config: GemmConfig, *, silu_mul: bool
) -> torch.Tensor:
    """`_skinny_rows_kernel` over every row of x (checked by the callers): [M, N]."""
    m, n = x.shape[0], weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
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
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        EVEN_K=k % config.block_k == 0,
        SILU_MUL=silu_mul,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
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
    return _rows_launch(gate_up, weight, weight.shape[1], config, silu_mul=True)


@dataclass(frozen=True)
class TuneResult:
    """One tuned (weight shape, row class): microseconds per call of cuBLAS and of the best
    Triton config, and the choice (None = cuBLAS)."""

    shape: tuple[int, int]  # (N, K)
    rows: int  # row class (1 or SKINNY_MAX_M)
    cublas_us: float  # with silu: the SiLU*mul kernel, then cuBLAS
    best_us: float
    choice: GemmConfig | None
    silu: bool = False  # timed as silu(gate) * up of a [rows, 2K] input, then the projection


def describe(results: Iterable[TuneResult]) -> list[str]:
    """One line per tuned (shape, row class), for benchmark logs."""
    return [
        f"linear {r.shape} x {r.rows} rows{' (SiLU*mul fused)' if r.silu else ''}: cuBLAS "
        f"{r.cublas_us:.1f} us, best Triton {r.best_us:.1f} us -> {r.choice or 'cuBLAS'}"
        for r in results
    ]


class LinearPlan:
    """Per (weight shape, dtype, row class): cuBLAS or a Triton `GemmConfig` (see module doc).

    An empty plan (the default; the CPU) always runs F.linear, so tuning only changes speed.
    `impl` is passed to `skinny_linear` ("triton" lets CPU tests drive the interpreter).
    """

    def __init__(self, impl: Impl = "auto") -> None:
        self.impl: Impl = impl
        # (N, K, dtype, row class, SiLU*mul fused) -> config
        self._choices: dict[tuple[int, int, torch.dtype, int, bool], GemmConfig] = {}
        self.results: list[TuneResult] = []

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ weight[N, K].T -> [M, N] by the tuned kernel for (N, K, M's class)."""
        rows = row_class(x.shape[0]) if x.dim() == 2 else None
        config = None
        if rows is not None:
            config = self._choices.get((*weight.shape, weight.dtype, rows, False))
        if config is None:
            return F.linear(x, weight)
        return skinny_linear(x, weight, config, impl=self.impl)

    def silu_mul_linear(self, gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of gate_up [M, 2K], times weight[N, K].T -> [M, N]. One row with a
        fused Triton choice for the weight (`tune(..., silu_weights=)`, or `set_choice(...,
        silu=True)`) runs one kernel (`skinny_silu_linear`); otherwise the SiLU*mul kernel then
        `linear`."""
        config = None
        if gate_up.dim() == 2 and row_class(gate_up.shape[0]) == 1:
            config = self._choices.get((*weight.shape, weight.dtype, 1, True))
        if config is not None:
            return skinny_silu_linear(gate_up, weight, config, impl=self.impl)
        return self.linear(fk.silu_and_mul(gate_up, impl="triton"), weight)

    def set_choice(
        self,
        shape: tuple[int, int],
        dtype: torch.dtype,
        rows: int,
        config: GemmConfig | None,
        *,
        silu: bool = False,
    ) -> None:
        """Use `config` (None: cuBLAS) for weights of `shape` (N, K) and `dtype` at the row
        class `rows` (1 or SKINNY_MAX_M; see `row_class`); `silu`: for `silu_mul_linear`."""
        key = (shape[0], shape[1], dtype, rows, silu)
        if config is None:
            self._choices.pop(key, None)
        else:
            self._choices[key] = config

    def tune(
        self, weights: Iterable[torch.Tensor], *, silu_weights: Iterable[torch.Tensor] = ()
    ) -> list[TuneResult]:
        """Time cuBLAS and every candidate for each distinct CUDA bf16/fp16 weight shape at 1
        and SKINNY_MAX_M rows, and for each of `silu_weights` (projections fed by SiLU*mul)
        the fused one-row kernel against SiLU*mul + cuBLAS; keep the fastest. Returns (and
        logs) the measurements. Needs no graph capture in progress; allocates
        ~TUNE_L2_DEFEAT_BYTES of scratch per shape."""
        self.results = []  # a second tune replaces the first one's measurements
        plan = [(w, rows, False) for w in weights for rows in (1, SKINNY_MAX_M)]
        plan += [(w, 1, True) for w in silu_weights]
        seen: set[tuple[int, int, torch.dtype, int, bool]] = set()
        for w, rows, silu in plan:
            key = (w.shape[0], w.shape[1], w.dtype, rows, silu)
            if not (HAS_TRITON and w.is_cuda and w.dim() == 2) or key in seen:
                continue
            if w.dtype not in TUNED_DTYPES:
                continue  # fp32 stays on cuBLAS: tl.dot would round it to TF32
            seen.add(key)
            result = _tune_one(w, rows, silu=silu)
            self.set_choice(result.shape, w.dtype, rows, result.choice, silu=silu)
            self.results.append(result)
            log.info("%s", describe([result])[0])
        return self.results


def _skinny(x: torch.Tensor, weight: torch.Tensor, *, config: GemmConfig) -> torch.Tensor:
    return skinny_linear(x, weight, config)


def _silu_then_cublas(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(fk.silu_and_mul(gate_up, impl="triton"), weight)


def _skinny_silu(
    gate_up: torch.Tensor, weight: torch.Tensor, *, config: GemmConfig
) -> torch.Tensor:
    return skinny_silu_linear(gate_up, weight, config)


def _tune_one(weight: torch.Tensor, rows: int, *, silu: bool = False) -> TuneResult:
    n, k = weight.shape
    copies = max(2, -(-TUNE_L2_DEFEAT_BYTES // (weight.numel() * weight.element_size())))
    ws = [torch.randn_like(weight) * 0.02 for _ in range(copies)]
    x = torch.randn(rows, 2 * k if silu else k, dtype=weight.dtype, device=weight.device)
    baseline = _silu_then_cublas if silu else F.linear
    kernel = _skinny_silu if silu else _skinny

    def timed(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
        def run_all() -> None:
            for w in ws:
                fn(x, w)

        ms = triton.testing.do_bench_cudagraph(run_all, rep=TUNE_REP_MS)
        return 1e3 * float(ms) / copies

    cublas_us = timed(baseline)
    candidates = ROW_CANDIDATES if rows == 1 else DOT_CANDIDATES
    best: tuple[float, GemmConfig] | None = None
    for config in candidates:
        if config.block_n > n:
            continue
        us = timed(functools.partial(kernel, config=config))
        if best is None or us < best[0]:
            best = (us, config)
    if best is None or best[0] >= cublas_us:
        return TuneResult((n, k), rows, cublas_us, best[0] if best else cublas_us, None, silu)
    return TuneResult((n, k), rows, cublas_us, best[0], best[1], silu)
