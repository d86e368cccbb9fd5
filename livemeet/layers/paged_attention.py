"""Paged attention for the decoder: store-KV, split-K decode and causal extend, dispatched to
the Triton kernels (livemeet.layers.paged_attention_kernels, which gives the methods and their
sources), the CUDA decode kernel (livemeet.layers.cuda_decode) or the torch references
(livemeet.layers.paged_attention_ref); with their launch configurations, the split-K
heuristic, the input checks and the launches resolved once per step (`DecodeLaunch`,
`ExtendLaunch`).

KV layout (the contract with the engine), per layer:
- `k_cache`, `v_cache`: [num_blocks, block_size, num_kv_heads, head_dim], bf16/fp16/fp32 or
  float8_e4m3fn (then with a per-tensor `k_scale`/`v_scale`: real value = stored * scale);
  block_size in {16, 32, 64, 128}.
- `block_tables`: int32 [num_seqs, max_blocks_per_seq]; token t of sequence b lives in block
  `block_tables[b, t // block_size]` at offset `t % block_size`.
- `seq_lens`: int32 [num_seqs], tokens in the cache for each sequence (including new ones).
- slot of a token = block_id * block_size + offset; slot -1 marks padding.
- `cu_seqlens_q`: int32 [num_seqs + 1], offsets of each sequence's new tokens in a ragged batch.

`impl="auto"` runs Triton on CUDA tensors when Triton imports, and the torch references
otherwise. `impl="triton"` forces the kernels (the tests use it on CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from livemeet.audio.constants import KV_BLOCK_SIZES
from livemeet.errors import ConfigError, InternalError
from livemeet.layers import cuda_decode, pdl, split_k
from livemeet.layers import paged_attention_kernels as kernels
from livemeet.layers.paged_attention_ref import (
    ref_paged_decode_attention,
    ref_paged_extend_attention,
    ref_store_kv,
)

Impl = Literal["auto", "triton", "torch"]

SUPPORTED_BLOCK_SIZES = KV_BLOCK_SIZES  # tokens per KV block
# head sizes the GPU kernels tile: powers of two (tl.arange, MMA shapes) from 16 (the smallest
# MMA reduction) to 128 (Qwen3's and MODEL.md's; the CUDA decode kernel's only size, and the
# largest every Triton tile configuration here was sized and tested for on the GPU)
MIN_CUDA_HEAD_DIM, MAX_CUDA_HEAD_DIM = 16, 128
H200_NUM_SMS = 132  # streaming multiprocessors of an H200 SXM (HOPPER/H200 device notes)
LOG2E = 1.4426950408889634  # log2(e): the kernels use exp2

# Split-K heuristic (see choose_num_splits); checked on an H200 with loadtest/bench_attention.py.
DECODE_PROGRAMS_PER_SM = 4  # resident decode programs per SM to keep enough loads in flight
MIN_TOKENS_PER_SPLIT = 64  # below this a split's fixed cost (q load, merge) dominates
MAX_DECODE_SPLITS = 64  # upper bound; also the mid-buffer size per (seq, head)

# Fixed kernel configurations (no autotuning: deterministic start-up and CUDA-graph capture).
DECODE_BLOCK_N = 64  # keys per decode tile
# FP8 KV: twice the keys per tile keeps the bytes in flight per load equal to bf16's (the FP8
# long-context run at 64-key tiles was slower than bf16: 61.3 vs 70.7 audio-s/s, H200).
DECODE_BLOCK_N_FP8 = 128
DECODE_NUM_WARPS = 4
DECODE_NUM_STAGES = 2


# Decode attention launches with PDL only at batch 1. Replays of the real-size decode graph on
# an H200 (loadtest/pdl_study.py, docs/benchmarks.md session 8), ms, PDL on every kernel /
# on every kernel but attention: FP8 1x36k 1.20 / 1.24, 4x36k 3.41 / 3.01, 16x36k 10.93 / 9.08;
# bf16 1x36k 1.55 / 1.60, 4x36k 5.84 / 4.67, 16x36k 20.38 / 15.64, 16x1k 1.49 / 1.46. Batches
# of 2..16 rows run the tl.dot projections, and attention launched early together with them
# costs more than it hides; with PDL off for the projections instead it is as slow (9.22,
# 15.77 ms at 16x36k) but loses batch 1's gain.
DECODE_PDL_MAX_ROWS = 1


@dataclass(frozen=True)
class DecodeKernelConfig:
    """Launch configuration of the split-K decode kernel (fixed, never autotuned).

    block_n: keys per tile (a power of two >= 16); num_warps, num_stages: Triton launch
    parameters (num_stages=1: no cp.async pipeline, tiles go straight to registers);
    merge_in_kernel: the last split to finish merges the partials instead of a second kernel
    (a single split always writes the output directly). backend "cuda": the tensor-core CUDA
    kernel (`livemeet.layers.cuda_decode`) wherever it supports the call; the Triton fields
    then apply only to the calls it does not support, and cuda_stages (0: the dtype's
    default), cuda_early_loads and cuda_heads_inner pick its form (`cuda_decode.Variant`);
    cuda_merge_in_kernel: its last split merges (at most
    `cuda_decode.MAX_MERGE_SPLITS` splits; else the merge kernel runs after it).
    fp8_qk (FP8 caches with a 16-bit query only; ignored otherwise; head_dim >= 32): the
    scores on e4m3 tensor cores with the query scaled per row into e4m3, so no K tile is
    converted. Approximate (the query loses
    mantissa bits), off by default, for the sweep to measure against the conversion-bound FP8
    default. (An e4m3 PV as well was dropped unmeasured: with the GQA group as M = 16 rows,
    Triton converts both e4m3 operands to fp16 on Hopper anyway.)
    `loadtest/sweep_decode_kernel.py` times the choices on a GPU: the tile, warp and stage
    defaults measured best or within 3 % (bf16) / 10 % (FP8) of the best on an H200
    (docs/benchmarks.md, session 3). Session 4's sweep put the merge kernel ahead of the
    in-kernel merge for bf16 (44.4 vs 46.8 us per layer at 1x36k, 6.9 vs 8.0 at 1x1k) and
    behind it for FP8 (40.8 vs 43.6-55.4 us at 1x36k, 425 vs 494 at 16x36k) for the Triton
    kernel: each dtype's default takes its winner (the CUDA kernel merges in the kernel for
    both since session 39: DECODE_CONFIG_BF16). Two forms
    measured and dropped: fp32 multiply-adds over the real GQA rows instead of tensor cores
    (3-10x slower), and K loaded as [D, block_n] instead of transposed in registers (no faster).
    pdl_max_rows: the split and merge kernels launch with PDL (livemeet.layers.pdl) only for
    batches of at most this many rows; larger batches launch them after the kernels ahead have
    finished (see DECODE_PDL_MAX_ROWS).
    """

    block_n: int = DECODE_BLOCK_N
    num_warps: int = DECODE_NUM_WARPS
    num_stages: int = DECODE_NUM_STAGES
    merge_in_kernel: bool = True
    fp8_qk: bool = False
    backend: Literal["cuda", "triton"] = "cuda"
    cuda_stages: int = 0
    cuda_early_loads: bool = cuda_decode.EARLY_LOADS
    cuda_heads_inner: bool = cuda_decode.HEADS_INNER
    cuda_merge_in_kernel: bool = True
    pdl_max_rows: int = DECODE_PDL_MAX_ROWS

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ConfigError(f"block_n must be a power of two >= 16, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ConfigError("num_warps must be a power of two <= 16 and num_stages >= 1")


# bf16: the merge kernel after the Triton split kernel; the CUDA kernel's last split merges.
# Its merge waits for L2 once per head since session 39 (a loop of 4-load batches before), and
# at 1x36k on an H100 the step's graph replays in 1.926 ms merging in the kernel against 1.939
# with the merge kernel, long c1 85.5 against 85.0 audio-s/s (FP8 1x36k: 1.324 against 1.401
# ms, both merging in the kernel). The old in-kernel merge lost to the merge kernel on an
# H200: 41.1 against 40.4 us a layer at 1x36k (docs/benchmarks.md, sessions 4 and 39).
DECODE_CONFIG_BF16 = DecodeKernelConfig(merge_in_kernel=False, cuda_merge_in_kernel=True)
DECODE_CONFIG_FP8 = DecodeKernelConfig(block_n=DECODE_BLOCK_N_FP8)


# How the split kernel's partials reach the output (its MERGE constexpr).
MERGE_SEPARATE = 0  # partials, then _decode_merge_kernel
MERGE_NONE_NEEDED = 1  # one split: the output directly
MERGE_IN_LAST_SPLIT = 2  # partials; the last split of each (sequence, KV head) merges (split_k)


def default_decode_config(fp8: bool) -> DecodeKernelConfig:
    """The decode kernel configuration for a bf16/fp16/fp32 (False) or FP8 (True) cache."""
    return DECODE_CONFIG_FP8 if fp8 else DECODE_CONFIG_BF16


def cuda_variant(
    q_dtype: torch.dtype, k_cache: torch.Tensor, group: int, kernel: DecodeKernelConfig | None
) -> cuda_decode.Variant | None:
    """The CUDA kernel's form for a decode with this query dtype, cache and GQA group, or None
    when the Triton kernel runs it (the configuration asks for Triton, or the CUDA kernel does
    not support the call)."""
    fp8 = k_cache.element_size() == 1
    cfg = kernel or default_decode_config(fp8)
    if cfg.backend != "cuda" or not cuda_decode.supported(q_dtype, k_cache, group):
        return None
    default = cuda_decode.default_variant(fp8, k_cache.shape[1])
    stages = cfg.cuda_stages or default.stages
    variant = cuda_decode.Variant(
        fp8, k_cache.shape[1], stages, cfg.cuda_early_loads, cfg.cuda_heads_inner
    )
    if not cuda_decode.usable(variant, cuda_decode.device_index(k_cache)):
        return None
    return variant


def decode_programs_per_sm(
    q_dtype: torch.dtype,
    k_cache: torch.Tensor,
    group: int,
    kernel: DecodeKernelConfig | None = None,
) -> int:
    """Resident decode programs per SM for `choose_num_splits`: the CUDA kernel's occupancy
    where it runs the call, else DECODE_PROGRAMS_PER_SM (the Triton kernel's)."""
    return _programs_per_sm(cuda_variant(q_dtype, k_cache, group, kernel), k_cache)


def _programs_per_sm(variant: cuda_decode.Variant | None, t: torch.Tensor) -> int:
    """The CUDA kernel's occupancy on `t`'s device for `variant`, or DECODE_PROGRAMS_PER_SM
    when the Triton kernel runs (variant None)."""
    if variant is None:
        return DECODE_PROGRAMS_PER_SM
    return cuda_decode.programs_per_sm(variant, cuda_decode.device_index(t))


def _choose_merge(
    cfg: DecodeKernelConfig, cuda: bool, num_splits: int, device: torch.device, tiles: int
) -> tuple[int, torch.Tensor | None]:
    """(MERGE_* mode, the split-K counters it needs or None) for a decode of `num_splits`
    splits over `tiles` (sequence, KV head) pairs, by the CUDA (`cuda`) or Triton kernel's
    merge setting; the in-kernel merge falls back to the merge kernel when the counters cannot
    be had (split_k.counters) or, for the CUDA kernel, past cuda_decode.MAX_MERGE_SPLITS."""
    if num_splits == 1:  # nothing to merge, whichever way merging is configured
        return MERGE_NONE_NEEDED, None
    in_kernel = cfg.cuda_merge_in_kernel if cuda else cfg.merge_in_kernel
    if not in_kernel or (cuda and num_splits > cuda_decode.MAX_MERGE_SPLITS):
        return MERGE_SEPARATE, None
    counters = split_k.counters(device, tiles)
    return (MERGE_SEPARATE if counters is None else MERGE_IN_LAST_SPLIT), counters


EXTEND_ROWS = 128  # query rows (tokens x heads of a group) per extend tile
EXTEND_ROWS_SMALL = 64  # rows per tile when 128-row tiles would leave SMs idle
EXTEND_BLOCK_N = 128  # keys per extend tile
EXTEND_NUM_STAGES = 3


@dataclass(frozen=True)
class ExtendKernelConfig:
    """Launch configuration of the extend (prefill) kernel; the defaults are the module's
    EXTEND_* constants. rows: query rows per tile (None: `extend_tile_rows` picks EXTEND_ROWS
    or EXTEND_ROWS_SMALL); block_n: keys per tile; num_warps: for tiles of >= 128 rows
    (num_warps_small below). For benchmarks (loadtest/sweep_extend_kernel.py)."""

    rows: int | None = None
    block_n: int = EXTEND_BLOCK_N
    num_stages: int = EXTEND_NUM_STAGES
    num_warps: int = 8
    num_warps_small: int = 4


DEFAULT_EXTEND_KERNEL = ExtendKernelConfig()


def choose_num_splits(
    batch_size: int,
    max_seq_len: int,
    num_kv_heads: int,
    num_sms: int = H200_NUM_SMS,
    max_splits: int = MAX_DECODE_SPLITS,
    *,
    programs_per_sm: int = DECODE_PROGRAMS_PER_SM,
) -> int:
    """Number of KV splits per sequence for `paged_decode_attention`.

    The split kernel launches batch_size x num_kv_heads x num_splits programs. We want one full
    wave of them: `programs_per_sm` resident programs on each SM (the kernel's occupancy:
    `decode_programs_per_sm`), so a batch-1 decode at 36k tokens uses every SM instead of 8
    and no second, partial wave trails. Each split must also keep at least
    `MIN_TOKENS_PER_SPLIT` tokens of the longest sequence (that bound is rounded down to a power
    of two, so the count changes only at 64 x 2^k tokens and few CUDA graphs cover every
    length: `split_variants`), and there are at most `max_splits`. Examples (8 KV heads, 132
    SMs, 4 programs per SM): batch 1 at 36k -> 64, batch 3 at 36k -> 22, batch 16 at 36k -> 4,
    batch 64 -> 1, batch 1 at 1k -> 16, any batch at 100 tokens -> 1.

    For CUDA graphs, call it with the bucket's batch size and the largest context the graph will
    see; the kernel sizes the splits from each sequence's own length at run time.
    """
    if min(batch_size, num_kv_heads, num_sms, max_splits, programs_per_sm) < 1:
        raise ConfigError(
            "batch_size, num_kv_heads, num_sms, max_splits and programs_per_sm must be >= 1"
        )
    wave = programs_per_sm * num_sms // (batch_size * num_kv_heads)
    by_length = max(1, max_seq_len // MIN_TOKENS_PER_SPLIT)
    by_length = 1 << (by_length.bit_length() - 1)
    return max(1, min(wave, by_length, max_splits))


# ----------------------------------------------------------------------------------------------
# Python API.
# ----------------------------------------------------------------------------------------------


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def select_triton(impl: Impl, t: torch.Tensor, *, available: bool) -> bool:
    """Whether a kernel call on `t` runs in Triton: "torch" never, "triton" always (ConfigError
    when Triton is not `available`), "auto" when Triton is available and `t` is on CUDA."""
    if impl == "torch":
        return False
    if impl == "triton":
        if not available:
            raise ConfigError("impl='triton' needs the triton package (pip install triton)")
        return True
    return available and t.is_cuda


def _use_triton(impl: Impl, t: torch.Tensor) -> bool:
    # kernels.HAS_TRITON read at call time (tests patch it)
    return select_triton(impl, t, available=kernels.HAS_TRITON)


@dataclass(frozen=True)
class KVSink:
    """Where one layer's new K/V go in a step: its paged caches, each token's slot
    (slot = block * block_size + offset; -1 for a padding row, never stored) and the e4m3
    scale (1.0 for a bf16/fp16 cache). A kernel ahead of attention that takes a sink writes K/V
    itself (livemeet.layers.fused.qk_norm_rope_store_kv); attention then reads them from the
    caches.

    k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim]; slot_mapping: int64 [N].
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor
    scale: float = 1.0


def cuda_head_dim_ok(head_dim: int) -> bool:
    """Whether the GPU kernels take this head size: a power of two within
    [MIN_CUDA_HEAD_DIM, MAX_CUDA_HEAD_DIM]. A larger one would fail only when its kernels
    compile, after the model had loaded: at 256 the extend kernel's three stages of 128-key
    K and V tiles alone need 384 KiB of shared memory (an H200 SM has 228 KiB)."""
    power_of_two = head_dim > 0 and not head_dim & (head_dim - 1)
    return power_of_two and MIN_CUDA_HEAD_DIM <= head_dim <= MAX_CUDA_HEAD_DIM


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int]:
    """Validates the KV caches; returns (block_size, num_kv_heads, head_dim). Raises
    InternalError for mismatched caches, ConfigError for a block size no kernel pages by and,
    on CUDA, for a head_dim the kernels do not tile (`cuda_head_dim_ok`; the torch path on the
    CPU takes any, e.g. MODEL.md section 9's tiny config's 8)."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise InternalError(
            "k_cache and v_cache must both be [num_blocks, block_size, kv_heads, head_dim], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.dtype != v_cache.dtype:
        raise InternalError(f"k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}")
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ConfigError(f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {block_size}")
    if k_cache.is_cuda and not cuda_head_dim_ok(head_dim):
        raise ConfigError(
            f"the CUDA kernels need a head_dim that is a power of two in "
            f"[{MIN_CUDA_HEAD_DIM}, {MAX_CUDA_HEAD_DIM}], got {head_dim}"
        )
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(3) != 1 or cache.stride(2) != head_dim:
            raise InternalError(f"{name} must have contiguous [kv_heads, head_dim] rows")
    return block_size, num_kv_heads, head_dim


def _check_query(q: torch.Tensor, num_kv_heads: int, head_dim: int, cache: torch.Tensor) -> int:
    """Validates q [*, heads, head_dim]; returns the GQA group size heads // kv_heads."""
    if q.dim() != 3 or q.shape[2] != head_dim:
        raise InternalError(f"q must be [tokens, heads, {head_dim}], got {tuple(q.shape)}")
    if q.shape[1] % num_kv_heads:
        raise ConfigError(f"{q.shape[1]} query heads are not a multiple of {num_kv_heads} KV heads")
    if q.stride(2) != 1:
        raise InternalError("q must be contiguous in head_dim")
    if q.device != cache.device:
        raise InternalError(f"q is on {q.device} but the KV cache is on {cache.device}")
    return q.shape[1] // num_kv_heads


def _check_int32(name: str, t: torch.Tensor, dims: int) -> None:
    if t.dtype != torch.int32 or t.dim() != dims:
        raise InternalError(f"{name} must be int32 with {dims} dims, got {t.dtype} {t.dim()}")


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    impl: Impl = "auto",
) -> None:
    """Write new keys and values into the paged cache, in place.

    k, v: [N, kv_heads, head_dim]; slot_mapping: int64 [N], slot = block_id * block_size + offset,
    -1 for a padding token (skipped). For a float8_e4m3fn cache the values are stored as
    clamp(x / scale, -448, 448). Raises InternalError on mismatched shapes/dtypes and ConfigError
    on an unsupported cache geometry.
    """
    block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    expected = (slot_mapping.shape[0], num_kv_heads, head_dim)
    if k.shape != expected or v.shape != expected:
        raise InternalError(
            f"k and v must be {expected}, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if slot_mapping.dtype != torch.int64 or slot_mapping.dim() != 1:
        raise InternalError(f"slot_mapping must be int64 [N], got {slot_mapping.dtype}")
    if not _use_triton(impl, k):
        ref_store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
        return
    if slot_mapping.shape[0] == 0:
        return
    k = k.reshape(k.shape[0], -1)  # [N, kv_heads * D]: contiguous rows
    v = v.reshape(v.shape[0], -1)
    row = num_kv_heads * head_dim
    kernels._store_kv_kernel[(slot_mapping.shape[0],)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        1.0 / k_scale,
        1.0 / v_scale,
        k.stride(0),
        v.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        ROW=row,
        ROW_POW2=next_pow2(row),
        PAGE=block_size,
        FP8=k_cache.dtype == torch.float8_e4m3fn,
        num_warps=4,
        **pdl.launch_options(k, kernels._store_kv_kernel),
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    impl: Impl = "auto",
    kernel: DecodeKernelConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence over its paged KV (split-K / Flash-Decoding).

    q: [B, heads, D] (the token at position seq_len - 1, its K/V already stored);
    block_tables: int32 [B, max_blocks]; seq_lens: int32 [B] (0 for a padded row: output 0);
    scale: softmax scale (1/sqrt(D) for Qwen3). Returns [B, heads, D] in q's dtype.

    `num_splits` (a power of two is best; at most `MAX_DECODE_SPLITS` is sensible): KV chunks per
    sequence; None picks `choose_num_splits(B, max_seq_len, kv_heads)`, with `max_seq_len`
    defaulting to the block-table capacity (no host sync). The grid depends only on B, kv_heads
    and num_splits, and splits are sized from seq_lens inside the kernel, so one call can be
    captured in a CUDA graph and replayed for any lengths within the block table.
    `kernel` overrides the launch configuration (default: `default_decode_config`). `out`: the
    [B, heads, D] tensor (a view contiguous in head_dim) to write and return instead of a new
    one. A `DecodeLaunch` made and run once; a caller that runs the same decode over many
    layers' caches makes one and calls it per layer.
    """
    launch = DecodeLaunch(
        q, k_cache, v_cache, block_tables, seq_lens, scale,
        num_splits=num_splits, max_seq_len=max_seq_len, k_scale=k_scale, v_scale=v_scale,
        impl=impl, kernel=kernel,
    )  # fmt: skip
    return launch(q, k_cache, v_cache, out)


@dataclass(frozen=True)
class LayerGeometry:
    """What every layer's inputs share in a prepared launch: the query's shape and dtype, and
    the caches' shape, dtype and device (K and V alike, `check_cache`) and each one's strides
    (the engine's pool gives every layer the same)."""

    q_shape: torch.Size
    q_dtype: torch.dtype
    shape: torch.Size
    k_stride: tuple[int, ...]
    v_stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> LayerGeometry:
        k = k_cache
        return cls(q.shape, q.dtype, k.shape, k.stride(), v_cache.stride(), k.dtype, k.device)

    def check(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor | None,
    ) -> None:
        """Raises InternalError when q has another shape or dtype or is not contiguous in
        head_dim, either cache has another shape, strides, dtype or device, q is on another
        device, or `out` does not match q (`_check_out`)."""
        if q.shape != self.q_shape or q.dtype != self.q_dtype or q.stride(2) != 1:
            raise InternalError(f"q must be {tuple(self.q_shape)} {self.q_dtype}, contiguous "
                                f"in head_dim, got {tuple(q.shape)} {q.dtype}")  # fmt: skip
        for cache, stride in ((k_cache, self.k_stride), (v_cache, self.v_stride)):
            if (
                cache.shape != self.shape
                or cache.stride() != stride
                or cache.dtype != self.dtype
                or cache.device != self.device
            ):
                raise InternalError(
                    f"a layer's cache is {tuple(cache.shape)} {cache.stride()} {cache.dtype} on "
                    f"{cache.device}, not the prepared {tuple(self.shape)} {stride} "
                    f"{self.dtype} on {self.device}"
                )
        if q.device != self.device:
            raise InternalError(f"q is on {q.device} but the KV cache is on {self.device}")
        _check_out(out, q)


class DecodeLaunch:
    """`paged_decode_attention` resolved once for one step's metadata and run per layer.

    The constructor takes the arguments of `paged_decode_attention` with q and the caches of
    any one layer, validates them and resolves everything that is the same for every layer:
    the kernel (CUDA or Triton) and its configuration, the split count, the merge mode and
    its counters, the partial buffers (shared by the layers: see
    `cuda_decode.PreparedLaunch`), the grid. A call then launches over one layer's caches.
    Launched eagerly between the piecewise graph's pieces, doing that per layer cost a prefill
    step ~15 % of the worker's time at 100 live sessions (py-spy, docs/benchmarks.md session
    16). Raises as `paged_decode_attention`.
    """

    def __init__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        num_splits: int | None = None,
        max_seq_len: int | None = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        impl: Impl = "auto",
        kernel: DecodeKernelConfig | None = None,
        fused: cuda_decode.FusedQK | None = None,
    ) -> None:
        block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
        group = _check_query(q, num_kv_heads, head_dim, k_cache)
        _check_int32("block_tables", block_tables, 2)
        _check_int32("seq_lens", seq_lens, 1)
        batch = q.shape[0]
        if block_tables.shape[0] != batch or seq_lens.shape[0] != batch:
            raise InternalError(f"block_tables and seq_lens must have {batch} rows")
        self.geometry = LayerGeometry.of(q, k_cache, v_cache)
        self.block_tables, self.seq_lens = block_tables, seq_lens
        self.scale, self.k_scale, self.v_scale = scale, k_scale, v_scale
        self.triton = _use_triton(impl, q)
        self.cuda: cuda_decode.PreparedLaunch | None = None
        self.fused = fused is not None
        if not self.triton:
            if self.fused:
                raise InternalError("fused q/k needs the CUDA decode kernel")
            return
        variant = cuda_variant(q.dtype, k_cache, group, kernel)
        # the output's only need (contiguous head_dim) is every out's (_check_out): q stands in;
        # a layer whose tensors the kernel cannot take runs on Triton (PreparedLaunch.accepts)
        if variant is not None and not cuda_decode.layout_supported(q, k_cache, v_cache, q):
            variant = None
        if fused is not None:  # only the CUDA kernel takes q raw (`fused_qk_supported`)
            if variant is None:
                raise InternalError("fused q/k needs the CUDA decode kernel for this call")
            variant = replace(variant, fused_qk=True)
        if num_splits is None:
            if max_seq_len is None:
                max_seq_len = block_tables.shape[1] * block_size
            num_sms = H200_NUM_SMS
            if q.is_cuda:
                num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            per_sm = _programs_per_sm(variant, q)
            num_splits = choose_num_splits(
                max(batch, 1), max_seq_len, num_kv_heads, num_sms, programs_per_sm=per_sm
            )
        if num_splits < 1:
            raise ConfigError(f"num_splits must be >= 1, got {num_splits}")
        cfg = kernel or default_decode_config(k_cache.element_size() == 1)
        self.cfg = cfg
        self.fp16_dot = _fp16_dots(q, k_cache)
        if self.fp16_dot and cfg.fp8_qk and head_dim < 32:
            raise ConfigError(
                f"fp8_qk needs head_dim >= 32 (an e4m3 dot's reduction), not {head_dim}"
            )
        self.num_splits, self.group = num_splits, group
        if batch == 0:
            return
        tiles = batch * num_kv_heads
        self.merge, self.counters = _choose_merge(
            cfg, variant is not None, num_splits, q.device, tiles
        )
        f32 = {"device": q.device, "dtype": torch.float32}
        splits_pow2 = next_pow2(num_splits)
        num_heads = q.shape[1]
        self.mid_o = torch.empty(batch, num_heads, splits_pow2, head_dim, **f32)
        self.mid_lse = torch.empty(batch, num_heads, splits_pow2, **f32)  # past num_splits: unread
        self.early = batch <= cfg.pdl_max_rows  # DECODE_PDL_MAX_ROWS
        self.qk_scale = scale * LOG2E * k_scale
        if variant is not None:
            self.cuda = cuda_decode.PreparedLaunch(
                k_cache, block_tables, seq_lens, self.mid_o, self.mid_lse,
                batch=batch, num_splits=num_splits, group=group, qk_scale=self.qk_scale,
                v_scale=v_scale, variant=variant, counters=self.counters, launch_early=self.early,
                fused=fused,
            )  # fmt: skip

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor | None = None,
        layer: cuda_decode.FusedQKLayer | None = None,
    ) -> torch.Tensor:
        """Decode attention of q [B, heads, D] (the prepared shape and dtype) over one layer's
        caches (the prepared geometry), into `out` (as in `paged_decode_attention`) or a new
        tensor; returns it. Prepared with `fused`, q is raw and `layer` brings the layer's raw
        k, v and norm weights (the kernel normalises, rotates and stores them). Raises
        InternalError on another shape, dtype or geometry, or tensors a fused launch cannot
        take."""
        self.geometry.check(q, k_cache, v_cache, out)
        if self.fused:
            out = torch.empty_like(q) if out is None else out
            if self.cuda is None or not self.cuda.accepts(q, k_cache, v_cache, out):
                raise InternalError("a fused q/k decode got tensors the CUDA kernel cannot take")
            if q.shape[0]:
                self.cuda(q, k_cache, v_cache, out, layer)
                self._merge(q, out)
            return out
        if not self.triton:
            ref = ref_paged_decode_attention(
                q, k_cache, v_cache, self.block_tables, self.seq_lens, self.scale,
                k_scale=self.k_scale, v_scale=self.v_scale,
            )  # fmt: skip
            return ref if out is None else out.copy_(ref)
        out = torch.empty_like(q) if out is None else out
        if q.shape[0] == 0:
            return out
        if self.cuda is not None and self.cuda.accepts(q, k_cache, v_cache, out):
            self.cuda(q, k_cache, v_cache, out)
        else:  # the Triton kernel takes any layout (a view the CUDA kernel's loads cannot)
            _launch_triton_split(
                q, k_cache, v_cache, self.block_tables, self.seq_lens, self.mid_o,
                self.mid_lse, out, self.cfg, self.merge, self.counters, self.num_splits,
                self.group, self.qk_scale, self.v_scale, self.fp16_dot, self.early,
            )  # fmt: skip
        self._merge(q, out)
        return out

    def _merge(self, q: torch.Tensor, out: torch.Tensor) -> None:
        """The merge kernel over the splits' partials, where the split kernel left them."""
        if self.merge != MERGE_SEPARATE:
            return
        kernels._decode_merge_kernel[(q.shape[0], q.shape[1])](
            self.mid_o,
            self.mid_lse,
            out,
            self.v_scale,
            self.num_splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=q.shape[2],
            MID_SPLITS=self.mid_o.shape[2],
            num_warps=4,
            **_pdl_options(q, kernels._decode_merge_kernel, self.early),
        )


def _check_out(out: torch.Tensor | None, q: torch.Tensor) -> None:
    """An attention output given by the caller must match q's shape, dtype and device, and be
    contiguous in head_dim (the kernels take its token and head strides only)."""
    if out is None:
        return
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise InternalError(
            f"out must be {tuple(q.shape)} {q.dtype} on {q.device}, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if out.stride(2) != 1:
        raise InternalError("out must be contiguous in head_dim")


def _fp16_dots(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the Triton attention kernels run their dots in fp16 (their FP16_DOT): an e4m3
    cache read by a 16-bit query. e4m3 converts to fp16 in one instruction per pair on sm_89+
    and to bf16 in three; an fp32 query (tests, the parity path) keeps fp32."""
    return k_cache.element_size() == 1 and q.dtype in (torch.bfloat16, torch.float16)


def _pdl_options(q: torch.Tensor, kernel: object, early: bool) -> dict[str, bool]:
    """`pdl.launch_options`, or no PDL when the batch is too large for it (`early` False)."""
    return pdl.launch_options(q, kernel) if early else {"PDL": False}


def _launch_triton_split(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    out: torch.Tensor,
    cfg: DecodeKernelConfig,
    merge: int,
    counters: torch.Tensor | None,
    num_splits: int,
    group: int,
    qk_scale: float,
    v_scale: float,
    fp16_dot: bool,
    early: bool,
) -> None:
    """The Triton split kernel over grid (B, kv_heads, num_splits) (see paged_decode_attention);
    with PDL (where on) when `early`."""
    kernels._decode_split_kernel[(q.shape[0], k_cache.shape[2], num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        mid_o,
        mid_lse,
        out,
        mid_lse if counters is None else counters,  # unused unless MERGE == 2
        qk_scale,
        v_scale,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        block_tables.stride(0),
        GROUP=group,
        BLOCK_H=max(16, next_pow2(group)),  # tl.dot needs >= 16 rows
        HEAD_DIM=k_cache.shape[3],
        PAGE=k_cache.shape[1],
        BLOCK_N=cfg.block_n,
        MID_SPLITS=mid_o.shape[2],
        FP16_DOT=fp16_dot,
        MERGE=merge,
        FP8_QK=fp16_dot and cfg.fp8_qk,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **_pdl_options(q, kernels._decode_split_kernel, early),
    )


def extend_tile_rows(
    num_seqs: int, num_kv_heads: int, max_seqlen_q: int, group: int, num_sms: int
) -> int:
    """Query rows (tokens x heads of a GQA group) per extend tile: EXTEND_ROWS, or
    EXTEND_ROWS_SMALL when 128-row tiles would leave SMs idle (e.g. one 512-token chunk: 64
    programs of 128 rows). Each value is a separately compiled kernel variant, so a server
    warms both up (ModelRunner.warm_up)."""
    tiles = -(-max_seqlen_q * next_pow2(group) // EXTEND_ROWS)
    return EXTEND_ROWS if num_seqs * num_kv_heads * tiles >= num_sms else EXTEND_ROWS_SMALL


def paged_extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_seqlen_q: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    impl: Impl = "auto",
    out: torch.Tensor | None = None,
    kernel: ExtendKernelConfig | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached prefix and themselves.

    q: [Nq, heads, D], the new tokens of all sequences concatenated (ragged);
    cu_seqlens_q: int32 [B + 1] (sequence b owns q rows cu[b]..cu[b+1]-1);
    seq_lens: int32 [B], tokens in the cache per sequence INCLUDING the new ones, whose K/V must
    already be stored (`store_kv`); new token i of b sits at position seq_len - q_len + i.
    Returns [Nq, heads, D] in q's dtype. KV is read in place through the block table.

    `max_seqlen_q` (the longest q_len) sizes the grid; None reads it from cu_seqlens_q, which
    syncs with the host (pass it when capturing a CUDA graph). `out`: the [Nq, heads, D]
    tensor (a view contiguous in head_dim) to write and return instead of a new one. `kernel`
    overrides the launch configuration (ExtendKernelConfig). An `ExtendLaunch` made and run
    once; a caller that runs the same step over many layers' caches makes one and calls it
    per layer.
    """
    launch = ExtendLaunch(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale,
        max_seqlen_q=max_seqlen_q, k_scale=k_scale, v_scale=v_scale, impl=impl, kernel=kernel,
    )  # fmt: skip
    return launch(q, k_cache, v_cache, out)


class ExtendLaunch:
    """`paged_extend_attention` resolved once for one step's metadata and run per layer: the
    constructor takes its arguments with q and the caches of any one layer, validates them and
    fixes the grid, tile size, warps and scales; a call launches the kernel over one layer's
    caches (see `DecodeLaunch` for why). Raises as `paged_extend_attention`."""

    def __init__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        max_seqlen_q: int | None = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        impl: Impl = "auto",
        kernel: ExtendKernelConfig | None = None,
    ) -> None:
        block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
        group = _check_query(q, num_kv_heads, head_dim, k_cache)
        _check_int32("block_tables", block_tables, 2)
        _check_int32("cu_seqlens_q", cu_seqlens_q, 1)
        _check_int32("seq_lens", seq_lens, 1)
        num_seqs = seq_lens.shape[0]
        if block_tables.shape[0] != num_seqs or cu_seqlens_q.shape[0] != num_seqs + 1:
            raise InternalError(
                f"block_tables must have {num_seqs} rows and cu_seqlens_q {num_seqs + 1} entries"
            )
        self.geometry = LayerGeometry.of(q, k_cache, v_cache)
        self.block_tables, self.cu_seqlens_q, self.seq_lens = block_tables, cu_seqlens_q, seq_lens
        self.scale, self.k_scale, self.v_scale = scale, k_scale, v_scale
        self.triton = _use_triton(impl, q)
        self.empty = num_seqs == 0 or q.shape[0] == 0
        if not self.triton or self.empty:
            return
        if max_seqlen_q is None:
            max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
        group_pow2 = next_pow2(group)
        num_sms = (
            torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        )
        cfg = kernel or DEFAULT_EXTEND_KERNEL
        rows = cfg.rows or extend_tile_rows(num_seqs, num_kv_heads, max_seqlen_q, group, num_sms)
        block_m = max(16, rows // group_pow2)
        self.grid = (num_seqs, num_kv_heads, -(-max(max_seqlen_q, 1) // block_m))
        self.qk_scale = scale * LOG2E * k_scale
        self.cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
        self.constexprs = {
            "GROUP": group,
            "GROUP_POW2": group_pow2,
            "BLOCK_M": block_m,
            "HEAD_DIM": head_dim,
            "PAGE": block_size,
            "BLOCK_N": cfg.block_n,
            "FP16_DOT": _fp16_dots(q, k_cache),
            "num_warps": cfg.num_warps if rows >= 128 else cfg.num_warps_small,
            "num_stages": cfg.num_stages,
        }

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Extend attention of q [Nq, heads, D] (the prepared shape and dtype) over one layer's
        caches (the prepared geometry), into `out` (as in `paged_extend_attention`) or a new
        tensor; returns it. Raises InternalError on another shape, dtype or geometry."""
        self.geometry.check(q, k_cache, v_cache, out)
        if not self.triton:
            ref = ref_paged_extend_attention(
                q, k_cache, v_cache, self.block_tables, self.cu_seqlens_q, self.seq_lens,
                self.scale, k_scale=self.k_scale, v_scale=self.v_scale,
            )  # fmt: skip
            return ref if out is None else out.copy_(ref)
        out = torch.empty_like(q) if out is None else out
        if self.empty:
            return out
        kernels._extend_kernel[self.grid](
            q,
            k_cache,
            v_cache,
            self.block_tables,
            self.cu_seqlens_q,
            self.seq_lens,
            out,
            self.qk_scale,
            self.v_scale,
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            *self.cache_strides,
            self.block_tables.stride(0),
            **self.constexprs,
        )
        return out
