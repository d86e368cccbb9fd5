"""Paged attention kernels against their torch references.

On a CPU-only machine the Triton kernels run under the Triton interpreter (TRITON_INTERPRET=1,
set before the kernels are decorated), in float32 on small shapes. On a CUDA machine the
`gpu`-marked tests run the same comparisons in bf16 at the decoder's shapes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from livemeet.errors import ConfigError, InternalError
from livemeet.layers import cuda_decode, split_k
from livemeet.layers import paged_attention as pa
from livemeet.layers import paged_attention_kernels as kernels
from livemeet.layers.paged_attention_ref import (
    ref_paged_decode_attention,
    ref_paged_extend_attention,
    ref_store_kv,
)
from tests.kernels import interpreted, kernel_marks

kernels = interpreted(kernels, "_decode_split_kernel")
# masked lanes compute log2(0) and (-inf) - (-inf) on purpose; the kernels select them away
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
needs_interpreter, needs_cuda = kernel_marks(kernels)
gpu = pytest.mark.gpu


def make_cache(
    num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return (
        torch.randn(shape, device=device).to(dtype),
        torch.randn(shape, device=device).to(dtype),
    )


def make_block_tables(seq_lens: list[int], block_size: int, num_blocks: int) -> torch.Tensor:
    """Each sequence gets distinct, shuffled blocks (so page order matters); unused entries 0."""
    needed = [math.ceil(n / block_size) for n in seq_lens]
    width = max(max(needed), 1)
    assert sum(needed) <= num_blocks
    perm = torch.randperm(num_blocks)
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(needed):
        table[b, :n] = perm[used : used + n]
        used += n
    return table


def check_decode(
    seq_lens: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    num_splits: int | None,
    dtype: torch.dtype,
    device: str,
    atol: float,
    kernel: pa.DecodeKernelConfig | None = None,
) -> None:
    num_blocks = sum(math.ceil(n / block_size) for n in seq_lens) + 3
    k_cache, v_cache = make_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device)
    tables = make_block_tables(seq_lens, block_size, num_blocks).to(device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    q = torch.randn(len(seq_lens), heads, head_dim, device=device).to(dtype)
    scale = head_dim**-0.5
    out = pa.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, scale, num_splits=num_splits, impl="triton",
        kernel=kernel,
    )  # fmt: skip
    ref = ref_paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=0)


def check_extend(
    prefix_and_new: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    atol: float,
) -> None:
    seq_lens = [p + n for p, n in prefix_and_new]
    num_blocks = sum(math.ceil(n / block_size) for n in seq_lens) + 2
    k_cache, v_cache = make_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device)
    tables = make_block_tables(seq_lens, block_size, num_blocks).to(device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    new = [n for _, n in prefix_and_new]
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(sum(new), heads, head_dim, device=device).to(dtype)
    scale = head_dim**-0.5
    out = pa.paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, scale, impl="triton")
    ref = ref_paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, scale)
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=0)


def naive_attention_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """softmax(q k^T * scale) v for one head: q [D], k, v [L, D] -> [D] (float64)."""
    w = torch.softmax((k.double() @ q.double()) * scale, dim=0)
    return w @ v.double()


# ---------------------------------------------------------------------------------------------
# References and policy (plain CPU, no Triton needed)
# ---------------------------------------------------------------------------------------------


def test_ref_decode_matches_naive_per_head_softmax() -> None:
    torch.manual_seed(0)
    block_size, kv_heads, heads, d = 16, 2, 4, 8
    k_cache, v_cache = make_cache(6, block_size, kv_heads, d, torch.float32, "cpu")
    tables = torch.tensor([[4, 1, 3], [0, 5, 2]], dtype=torch.int32)
    lens = torch.tensor([35, 1], dtype=torch.int32)
    q = torch.randn(2, heads, d)
    out = ref_paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.3)
    for b in range(2):
        tokens = range(int(lens[b]))
        for h in range(heads):
            kvh = h // (heads // kv_heads)
            k = torch.stack(
                [k_cache[tables[b, t // block_size], t % block_size, kvh] for t in tokens]
            )
            v = torch.stack(
                [v_cache[tables[b, t // block_size], t % block_size, kvh] for t in tokens]
            )
            expected = naive_attention_row(q[b, h], k, v, 0.3)
            torch.testing.assert_close(out[b, h].double(), expected, atol=1e-5, rtol=0)


def test_ref_extend_last_token_equals_decode() -> None:
    """The last new token of an extend sees exactly what a decode at that length sees."""
    torch.manual_seed(1)
    k_cache, v_cache = make_cache(8, 16, 2, 8, torch.float32, "cpu")
    tables = make_block_tables([40, 20], 16, 8)
    lens = torch.tensor([40, 20], dtype=torch.int32)
    cu = torch.tensor([0, 7, 27], dtype=torch.int32)  # 7 new tokens, then 20 (no prefix)
    q = torch.randn(27, 4, 8)
    ext = ref_paged_extend_attention(q, k_cache, v_cache, tables, cu, lens, 0.35)
    dec = ref_paged_decode_attention(q[[6, 26]], k_cache, v_cache, tables, lens, 0.35)
    torch.testing.assert_close(ext[[6, 26]], dec)
    # the first token of the second sequence (position 0) attends only to itself: out = v[0]
    torch.testing.assert_close(ext[7, :2], v_cache[tables[1, 0], 0, 0].expand(2, 8))


def test_ref_store_kv_writes_slots_and_skips_padding() -> None:
    k_cache = torch.zeros(3, 16, 2, 4)
    v_cache = torch.zeros(3, 16, 2, 4)
    k = torch.arange(3 * 8, dtype=torch.float32).reshape(3, 2, 4)
    slots = torch.tensor([5, -1, 33], dtype=torch.int64)
    ref_store_kv(k, -k, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache[0, 5], k[0])
    torch.testing.assert_close(k_cache[2, 1], k[2])
    torch.testing.assert_close(v_cache[2, 1], -k[2])
    assert k_cache.abs().sum() == k[0].sum() + k[2].sum()


def test_cpu_tensors_use_reference_by_default() -> None:
    torch.manual_seed(2)
    k_cache, v_cache = make_cache(4, 16, 1, 16, torch.float32, "cpu")
    tables = torch.tensor([[2, 0]], dtype=torch.int32)
    lens = torch.tensor([20], dtype=torch.int32)
    q = torch.randn(1, 2, 16)
    out = pa.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.25)
    ref = ref_paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.25)
    assert torch.equal(out, ref)


@pytest.mark.parametrize(
    ("batch", "max_len", "expected"),
    [
        (1, 36_000, 64),
        (1, 72_000, 64),
        (16, 36_000, 4),
        (64, 36_000, 1),
        (4, 200, 2),
        (1, 1024, 16),
        (3, 36_000, 22),
    ],
)
def test_choose_num_splits_examples(batch: int, max_len: int, expected: int) -> None:
    assert pa.choose_num_splits(batch, max_len, num_kv_heads=8, num_sms=132) == expected


@pytest.mark.parametrize(
    ("batch", "per_sm", "expected"), [(1, 3, 49), (16, 3, 3), (1, 2, 33), (16, 2, 2)]
)
def test_choose_num_splits_fills_one_wave_of_resident_programs(
    batch: int, per_sm: int, expected: int
) -> None:
    """The CUDA kernel's occupancy (2 programs per SM for bf16, 3 for FP8 on an H200) gives
    the split counts its sweep measured best: one wave, not the next power of two."""
    got = pa.choose_num_splits(batch, 36_000, 8, 132, programs_per_sm=per_sm)
    assert got == expected


def test_choose_num_splits_is_bounded() -> None:
    for per_sm in (1, 2, 3, 4):
        for batch in (1, 2, 3, 7, 16, 33, 128):
            for max_len in (0, 1, 255, 256, 1000, 36_000, 100_000):
                n = pa.choose_num_splits(batch, max_len, 8, programs_per_sm=per_sm)
                assert 1 <= n <= pa.MAX_DECODE_SPLITS
                assert n == 1 or max_len // n >= pa.MIN_TOKENS_PER_SPLIT
                assert n == 1 or batch * 8 * n <= per_sm * 132  # at most one wave


def test_choose_num_splits_rejects_zero() -> None:
    with pytest.raises(ConfigError):
        pa.choose_num_splits(0, 100, 8)
    with pytest.raises(ConfigError):
        pa.choose_num_splits(1, 100, 8, programs_per_sm=0)


# ---------------------------------------------------------------------------------------------
# Input validation (typed errors, raised before any kernel runs)
# ---------------------------------------------------------------------------------------------


def _decode_args() -> dict[str, object]:
    k_cache, v_cache = make_cache(4, 16, 2, 16, torch.float32, "cpu")
    return {
        "q": torch.randn(2, 4, 16),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": torch.zeros(2, 2, dtype=torch.int32),
        "seq_lens": torch.ones(2, dtype=torch.int32),
        "scale": 0.25,
    }


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"k_cache": torch.zeros(4, 24, 2, 16), "v_cache": torch.zeros(4, 24, 2, 16)}, ConfigError),
        (
            {"k_cache": torch.zeros(4, 16, 2, 16), "v_cache": torch.zeros(4, 16, 2, 24)},
            InternalError,
        ),
        ({"k_cache": torch.zeros(4, 16, 3, 16), "v_cache": torch.zeros(4, 16, 3, 16)}, ConfigError),
        ({"q": torch.randn(2, 4, 8)}, InternalError),  # head_dim mismatch
        ({"seq_lens": torch.ones(2, dtype=torch.int64)}, InternalError),
        ({"block_tables": torch.zeros(3, 2, dtype=torch.int32)}, InternalError),
        ({"v_cache": torch.zeros(4, 16, 2, 16, dtype=torch.float16)}, InternalError),
    ],
)
def test_decode_rejects_bad_input(change: dict[str, object], error: type[Exception]) -> None:
    args = _decode_args() | change
    with pytest.raises(error):
        pa.paged_decode_attention(**args)  # type: ignore[arg-type]


def test_extend_rejects_bad_cu_seqlens() -> None:
    args = _decode_args()
    args.pop("seq_lens")
    with pytest.raises(InternalError):
        pa.paged_extend_attention(
            cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32),  # 2 sequences need 3 entries
            seq_lens=torch.ones(2, dtype=torch.int32),
            **args,  # type: ignore[arg-type]
        )


def test_store_kv_rejects_bad_slots() -> None:
    k_cache, v_cache = make_cache(2, 16, 2, 16, torch.float32, "cpu")
    k = torch.randn(3, 2, 16)
    with pytest.raises(InternalError):
        pa.store_kv(k, k, k_cache, v_cache, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(InternalError):
        pa.store_kv(k, k, k_cache, v_cache, torch.zeros(2, dtype=torch.int64))


def test_triton_impl_without_triton_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "HAS_TRITON", False)
    with pytest.raises(ConfigError, match="triton"):
        pa.paged_decode_attention(**_decode_args(), impl="triton")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Triton kernels under the interpreter (CPU, float32, small shapes)
# ---------------------------------------------------------------------------------------------


@needs_interpreter
@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_kernel_interpreted(block_size: int, heads: int, kv_heads: int, num_splits: int):
    torch.manual_seed(block_size + heads + num_splits)
    check_decode([1, 17, 130, 0], heads, kv_heads, 16, block_size, num_splits, torch.float32,
                 "cpu", atol=1e-5)  # fmt: skip


SMALL_TILES = pa.DecodeKernelConfig(block_n=16, num_warps=2, num_stages=1)


@needs_interpreter
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2), (6, 2)])
@pytest.mark.parametrize("block_size", [16, 64])
def test_decode_kernel_other_configuration_interpreted(heads: int, kv_heads: int, block_size: int):
    """A non-default launch configuration (16-key tiles: a tile inside a block for either block
    size; no pipeline) with GQA groups of 1, 2 and 3 heads."""
    torch.manual_seed(heads + block_size)
    check_decode([1, 17, 130, 0], heads, kv_heads, 16, block_size, 3, torch.float32, "cpu",
                 atol=1e-5, kernel=SMALL_TILES)  # fmt: skip


@needs_interpreter
@pytest.mark.parametrize("num_splits", [1, 3, 4])
def test_decode_merge_in_kernel_equals_merge_kernel_and_rearms(num_splits: int) -> None:
    """The last split merges (or one split writes directly): the same output as the separate
    merge kernel, the counters are all zero again afterwards, and a second call agrees. The
    in-kernel merge is asked for by name: the float32/bf16 default merges in a second kernel."""
    torch.manual_seed(num_splits)
    k_cache, v_cache = make_cache(20, 16, 2, 16, torch.float32, "cpu")
    tables = make_block_tables([130, 17, 0], 16, 20)
    lens = torch.tensor([130, 17, 0], dtype=torch.int32)
    q = torch.randn(3, 4, 16)
    args = (q, k_cache, v_cache, tables, lens, 0.25)
    separate = pa.DecodeKernelConfig(merge_in_kernel=False)
    in_kernel = pa.DecodeKernelConfig(merge_in_kernel=True)
    want = pa.paged_decode_attention(*args, num_splits=num_splits, impl="triton", kernel=separate)
    for _ in range(2):
        got = pa.paged_decode_attention(
            *args, num_splits=num_splits, impl="triton", kernel=in_kernel
        )
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert int(split_k.counters(q.device, 1).abs().sum()) == 0
    ref = ref_paged_decode_attention(*args)
    torch.testing.assert_close(want, ref, atol=1e-5, rtol=0)


def test_merge_counters_are_refused_past_their_size() -> None:
    assert split_k.counters(torch.device("cpu"), split_k.NUM_COUNTERS + 1) is None
    counters = split_k.counters(torch.device("cpu"), 8)
    assert counters is not None and counters.dtype == torch.int32
    assert counters is split_k.counters(torch.device("cpu"), split_k.NUM_COUNTERS)


@pytest.mark.parametrize(
    "bad",
    [{"block_n": 48}, {"block_n": 8}, {"num_warps": 3}, {"num_stages": 0}],
)
def test_decode_kernel_config_rejects_bad_values(bad: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        pa.DecodeKernelConfig(**bad)  # type: ignore[arg-type]


@needs_interpreter
def test_decode_kernel_interpreted_default_splits() -> None:
    torch.manual_seed(3)
    check_decode([300, 64], 4, 2, 16, 16, None, torch.float32, "cpu", atol=1e-5)


@needs_interpreter
@pytest.mark.parametrize("max_rows", [1, 2])
def test_decode_attention_asks_for_pdl_only_up_to_its_row_limit(
    max_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split and merge kernels take PDL's launch options only for batches of at most
    `pdl_max_rows` rows (pa.DECODE_PDL_MAX_ROWS: 1); larger ones launch plainly. Results
    are the same either way."""
    asked: list[str] = []
    real = pa.pdl.launch_options

    def spy(t: torch.Tensor, kernel: object) -> dict[str, bool]:
        asked.append(getattr(getattr(kernel, "fn", kernel), "__name__", "?"))
        return real(t, kernel)

    monkeypatch.setattr(pa.pdl, "launch_options", spy)
    kernel = pa.DecodeKernelConfig(merge_in_kernel=False, pdl_max_rows=max_rows)
    assert pa.DecodeKernelConfig().pdl_max_rows == pa.DECODE_PDL_MAX_ROWS == 1
    torch.manual_seed(4)
    for lens in ([90], [90, 40]):
        asked.clear()
        check_decode(lens, 4, 2, 16, 16, 2, torch.float32, "cpu", atol=1e-5, kernel=kernel)
        expected = ["_decode_split_kernel", "_decode_merge_kernel"]
        assert asked == (expected if len(lens) <= max_rows else [])


@needs_interpreter
@pytest.mark.parametrize("block_size", [16, 64, 128])
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2)])
@pytest.mark.parametrize("rows", [pa.EXTEND_ROWS, pa.EXTEND_ROWS_SMALL])
def test_extend_kernel_interpreted(
    block_size: int, heads: int, kv_heads: int, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pa, "EXTEND_ROWS", rows)  # the CPU path always picks EXTEND_ROWS
    torch.manual_seed(block_size + heads)
    # (cached prefix, new tokens): empty prefix, one new token, a chunk spanning two query
    # tiles after a long prefix, a sequence with nothing new
    cases = [(0, 5), (17, 1), (100, 70), (9, 0), (63, 2)]
    check_extend(cases, heads, kv_heads, 16, block_size, torch.float32, "cpu", atol=1e-5)


@needs_interpreter
@pytest.mark.parametrize("block_size", [16, 64])
def test_store_kv_kernel_interpreted(block_size: int) -> None:
    torch.manual_seed(4)
    k_cache, v_cache = make_cache(3, block_size, 2, 16, torch.float32, "cpu")
    k, v = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    slots = torch.tensor([3, -1, block_size + 7, 2 * block_size, -1], dtype=torch.int64)
    got_k, got_v = k_cache.clone(), v_cache.clone()
    pa.store_kv(k, v, got_k, got_v, slots, impl="triton")
    ref_store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(got_k, k_cache) and torch.equal(got_v, v_cache)


@needs_interpreter
def test_fp8_cache_interpreted() -> None:
    """FP8 store (scale, slots) and in-kernel dequantisation in decode and extend.

    The values are exactly representable after scaling, because the interpreter's float-to-fp8
    rounding differs from the hardware's (the GPU test covers rounding).
    """
    torch.manual_seed(5)
    fp8 = torch.float8_e4m3fn
    k_scale, v_scale = 0.5, 0.25
    k_cache = torch.zeros(4, 16, 2, 16, dtype=fp8)
    v_cache = torch.zeros(4, 16, 2, 16, dtype=fp8)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    k = torch.randn(40, 2, 16).to(fp8).float() * k_scale
    v = torch.randn(40, 2, 16).to(fp8).float() * v_scale
    slots = torch.arange(40, dtype=torch.int64)
    slots[[5, 20]] = -1
    pa.store_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale, impl="triton")
    ref_store_kv(k, v, ref_k, ref_v, slots, k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(k_cache.view(torch.uint8), ref_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), ref_v.view(torch.uint8))

    tables = torch.tensor([[0, 1, 2], [3, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([40, 9], dtype=torch.int32)
    scales = {"k_scale": k_scale, "v_scale": v_scale}
    q = torch.randn(2, 4, 16)
    out = pa.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.25, num_splits=2, impl="triton", **scales
    )
    ref = ref_paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.25, **scales)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    qe = torch.randn(9, 4, 16)
    out = pa.paged_extend_attention(qe, k_cache, v_cache, tables, cu, lens, 0.25, impl="triton",
                                    **scales)  # fmt: skip
    ref = ref_paged_extend_attention(qe, k_cache, v_cache, tables, cu, lens, 0.25, **scales)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# CUDA (bf16, the decoder's shapes: 16 query heads, 8 KV heads, head_dim 128)
# ---------------------------------------------------------------------------------------------


def test_cuda_head_dims_are_the_tiled_powers_of_two() -> None:
    """The GPU path's head_dim rule (check_cache raises ConfigError on a CUDA cache outside
    it; the CPU path takes any): 16 to 128, powers of two only."""
    assert [d for d in range(0, 520) if pa.cuda_head_dim_ok(d)] == [16, 32, 64, 128]
    assert not pa.cuda_head_dim_ok(-128)


@gpu
@needs_cuda
@pytest.mark.parametrize("block_size", pa.SUPPORTED_BLOCK_SIZES)
@pytest.mark.parametrize("num_splits", [1, 7, None])
def test_decode_kernel_cuda(block_size: int, num_splits: int | None) -> None:
    torch.manual_seed(10)
    lens = [1, 15, 1000, 4099, 0, 3000]
    check_decode(lens, 16, 8, 128, block_size, num_splits, torch.bfloat16, "cuda", atol=2e-2)
    check_decode(lens, 8, 8, 128, block_size, num_splits, torch.bfloat16, "cuda", atol=2e-2)


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "kernel",
    [
        pa.DecodeKernelConfig(64, 4, 1, backend="triton"),
        pa.DecodeKernelConfig(64, 4, 2, merge_in_kernel=False, backend="triton"),
        pa.DecodeKernelConfig(128, 4, 2, merge_in_kernel=False, backend="triton"),
        pa.DecodeKernelConfig(64, 8, 3, backend="triton"),
        pa.DecodeKernelConfig(128, 8, 3, backend="triton"),
        pa.DecodeKernelConfig(),  # the CUDA kernel
    ],
)
def test_decode_kernel_configs_cuda(kernel: pa.DecodeKernelConfig) -> None:
    """Every configuration the sweep may pick, bf16 and FP8 caches."""
    torch.manual_seed(14)
    lens = [1, 15, 1000, 4099, 0, 3000]
    check_decode(lens, 16, 8, 128, 16, None, torch.bfloat16, "cuda", atol=2e-2, kernel=kernel)
    fp8 = torch.float8_e4m3fn
    k_cache = (torch.randn(40, 16, 8, 128, device="cuda") * 0.5).to(fp8)
    v_cache = (torch.randn(40, 16, 8, 128, device="cuda") * 0.5).to(fp8)
    tables = torch.randperm(40, device="cuda").to(torch.int32).reshape(2, 20)
    seq = torch.tensor([317, 5], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 16, 128, device="cuda", dtype=torch.bfloat16)
    out = pa.paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.088, kernel=kernel)
    ref = ref_paged_decode_attention(q.float(), k_cache, v_cache, tables, seq, 0.088)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def poisoned_caches(
    lens: list[int], block_size: int, fp8: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(k_cache, v_cache, block tables, kv scale) on the GPU, 8 KV heads: random K/V for each
    sequence's tokens in shuffled blocks, and a NaN pattern in every unused slot, so a kernel
    that reads past a sequence poisons its row."""
    num_blocks = sum(math.ceil(n / block_size) for n in lens) + 3
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    kv_scale = 0.05 if fp8 else 1.0
    shape = (num_blocks, block_size, 8, 128)
    k_cache, v_cache = (torch.full(shape, float("nan"), device="cuda").to(dtype) for _ in "kv")
    tables = make_block_tables(lens, block_size, num_blocks).cuda()
    for cache in (k_cache, v_cache):
        real = (torch.randn(len(lens), max(lens), 8, 128, device="cuda") / kv_scale).to(dtype)
        for b, n in enumerate(lens):
            slots = torch.arange(n, device="cuda")
            blocks = tables[b, slots // block_size].long()
            cache[blocks, slots % block_size] = real[b, :n]
    return k_cache, v_cache, tables, kv_scale


@gpu
@needs_cuda
@pytest.mark.parametrize("block_size", pa.SUPPORTED_BLOCK_SIZES)
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("heads", [8, 16, 24, 32, 48, 64, 80])
def test_cuda_decode_kernel_matches_reference(block_size: int, fp8: bool, heads: int) -> None:
    """The tensor-core CUDA kernel (livemeet.layers.cuda_decode) against the fp32 reference
    and the Triton kernel: GQA groups 1-8 (odd and even), both caches, one split (direct
    output), an odd split count and more splits than some sequences have tiles; lengths around
    the 16-key tile, empty rows, and shuffled blocks. A group of 10 is beyond the kernel's
    16-row tile and runs on Triton, still correct."""
    torch.manual_seed(15 + heads)
    lens = [1, 15, 16, 17, 1000, 4099, 0, 3000, 33]
    k_cache, v_cache, tables, kv_scale = poisoned_caches(lens, block_size, fp8)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), heads, 128, device="cuda", dtype=torch.bfloat16)
    group = heads // 8
    assert cuda_decode.supported(q.dtype, k_cache, group) is (group <= cuda_decode.MAX_GROUP)
    scales = {"k_scale": kv_scale, "v_scale": kv_scale}
    ref = ref_paged_decode_attention(q.float(), k_cache, v_cache, tables, seq, 0.088, **scales)
    triton = pa.DecodeKernelConfig(backend="triton")
    for splits in (1, 3, 64):
        out = pa.paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.088,
                                        num_splits=splits, **scales)  # fmt: skip
        assert out.dtype == torch.bfloat16 and not out.isnan().any()
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
        other = pa.paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.088,
                                          num_splits=splits, kernel=triton, **scales)  # fmt: skip
        torch.testing.assert_close(out.float(), other.float(), atol=2e-2, rtol=2e-2)


@gpu
@needs_cuda
def test_cuda_decode_kernel_misaligned_views_run_on_triton() -> None:
    """A cache or query view the kernel's vector loads cannot take (a base 2 bytes off a
    16-byte boundary) is computed by the Triton kernel instead, correctly."""
    torch.manual_seed(18)
    lens = [300, 40]
    k_cache, v_cache, tables, _ = poisoned_caches(lens, 16, False)
    flat = torch.empty(k_cache.numel() + 1, device="cuda", dtype=torch.bfloat16)
    k_view = flat[1:].view(k_cache.shape)
    k_view.copy_(k_cache)
    q_flat = torch.randn(2 * 16 * 128 + 1, device="cuda", dtype=torch.bfloat16)
    q_view = q_flat[1:].view(2, 16, 128)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q_view)
    assert not cuda_decode.layout_supported(q_view, k_cache, v_cache, out)
    assert not cuda_decode.layout_supported(q_view.contiguous(), k_view, v_cache, out)
    for q, k in ((q_view, k_cache), (q_view.contiguous(), k_view)):
        got = pa.paged_decode_attention(q, k, v_cache, tables, seq, 0.088, num_splits=4)
        ref = ref_paged_decode_attention(q.float(), k, v_cache, tables, seq, 0.088)
        torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)


def cuda_forms() -> list[pa.DecodeKernelConfig]:
    forms = []
    for fp8, most in ((False, cuda_decode.MAX_STAGES_BF16), (True, cuda_decode.MAX_STAGES_FP8)):
        base = pa.default_decode_config(fp8)
        for stages in range(cuda_decode.MIN_STAGES, most + 1):
            for early in (False, True):
                forms.append(dataclasses.replace(base, cuda_stages=stages, cuda_early_loads=early))
        other_merge = not base.cuda_merge_in_kernel
        forms.append(dataclasses.replace(base, cuda_merge_in_kernel=other_merge))
        other_order = dataclasses.replace(base, cuda_heads_inner=not base.cuda_heads_inner)
        forms.append(other_order)
        forms.append(dataclasses.replace(other_order, cuda_merge_in_kernel=other_merge))
    return forms


@gpu
@needs_cuda
@pytest.mark.parametrize("kernel", cuda_forms(), ids=str)
def test_cuda_decode_kernel_forms_match_reference(kernel: pa.DecodeKernelConfig) -> None:
    """Every pipeline depth, both load orders, both merges and both grid orders (KV head or
    split fastest; the in-kernel merge's counters are indexed the same either way), at lengths
    around the
    pipeline's prologue (1 to NUM_STAGES tiles per warp) and long ones; one split, several,
    the most the in-kernel merge takes and more (the merge kernel then runs), each twice (the
    in-kernel merge re-arms its counters)."""
    torch.manual_seed(16)
    fp8 = kernel.block_n == pa.DECODE_BLOCK_N_FP8
    lens = [1, 16, 17, 64, 65, 129, 200, 5000, 0]
    k_cache, v_cache, tables, kv_scale = poisoned_caches(lens, 16, fp8)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), 16, 128, device="cuda", dtype=torch.bfloat16)
    assert pa.cuda_variant(q.dtype, k_cache, 2, kernel) is not None
    scales = {"k_scale": kv_scale, "v_scale": kv_scale}
    ref = ref_paged_decode_attention(q.float(), k_cache, v_cache, tables, seq, 0.088, **scales)
    for splits in (1, 5, 5, cuda_decode.MAX_MERGE_SPLITS, 100, 64):
        out = pa.paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.088,
                                        num_splits=splits, kernel=kernel, **scales)  # fmt: skip
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@gpu
@needs_cuda
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_decode_kernel_follows_rising_scores(fp8: bool) -> None:
    """Scores that climb along the sequence by steps of 3 log2 units (42 in all) and one late
    spike, so the running max moves over and over inside a split and between splits and the
    accumulators are rescaled each time; one split and several, against the fp32 reference."""
    torch.manual_seed(21)
    lens = [3000, 777]
    k_cache, v_cache, tables, kv_scale = poisoned_caches(lens, 16, fp8)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), 16, 128, device="cuda", dtype=torch.bfloat16)
    scale = 0.088
    for b, n in enumerate(lens):
        pos = torch.arange(n, device="cuda")
        # score gain in log2 units per unit of `ramp` along the group's mean query direction
        ramp = (pos // 200).float() * 3.0
        ramp[pos == n - 40] += 25.0  # one late spike
        u = q[b].float().view(8, 2, 128).mean(1)  # [kv heads, 128]
        gain = u / (u.pow(2).sum(-1, keepdim=True) * scale * 1.4427)
        blocks = tables[b, pos // 16].long()
        k = k_cache[blocks, pos % 16].float() * kv_scale
        k = k + ramp[:, None, None] * gain[None] + 0.1 * torch.randn_like(k)
        k_cache[blocks, pos % 16] = (k / kv_scale).clamp(-400, 400).to(k_cache.dtype)  # e4m3
    scales = {"k_scale": kv_scale, "v_scale": kv_scale}
    ref = ref_paged_decode_attention(q.float(), k_cache, v_cache, tables, seq, scale, **scales)
    assert pa.cuda_variant(q.dtype, k_cache, 2, None) is not None
    for splits in (1, 7):
        out = pa.paged_decode_attention(q, k_cache, v_cache, tables, seq, scale,
                                        num_splits=splits, **scales)  # fmt: skip
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@gpu
@needs_cuda
def test_cuda_decode_kernel_off_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.randn(1, 16, 128, device="cuda", dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    assert cuda_decode.supported(q.dtype, cache, 2)
    assert not cuda_decode.supported(torch.float32, cache, 2)
    monkeypatch.setenv(cuda_decode.KERNEL_ENV, "triton")
    assert not cuda_decode.supported(q.dtype, cache, 2)


@gpu
@needs_cuda
@pytest.mark.parametrize("block_size", pa.SUPPORTED_BLOCK_SIZES)
def test_extend_kernel_cuda(block_size: int) -> None:
    torch.manual_seed(11)
    cases = [(0, 300), (17, 1), (2000, 513), (9, 0), (4096, 64)]
    check_extend(cases, 16, 8, 128, block_size, torch.bfloat16, "cuda", atol=2e-2)
    # one short chunk: few programs, so the kernel takes EXTEND_ROWS_SMALL tiles
    check_extend([(3000, 200)], 16, 8, 128, block_size, torch.bfloat16, "cuda", atol=2e-2)


@gpu
@needs_cuda
@pytest.mark.parametrize("block_size", pa.SUPPORTED_BLOCK_SIZES)
def test_extend_kernel_fp8_cache_cuda(block_size: int) -> None:
    """bf16 queries over an e4m3 cache (the fp16-dot path) against the fp32 reference."""
    torch.manual_seed(15)
    lens = [300, 2513, 64]
    q_lens = [300, 513, 1]
    k_cache, v_cache, tables, kv_scale = poisoned_caches(lens, block_size, fp8=True)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device="cuda")
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(sum(q_lens), 16, 128, device="cuda", dtype=torch.bfloat16)
    scales = {"k_scale": kv_scale, "v_scale": kv_scale}
    out = pa.paged_extend_attention(q, k_cache, v_cache, tables, cu, seq, 0.088, **scales)
    ref = ref_paged_extend_attention(q.float(), k_cache, v_cache, tables, cu, seq, 0.088,
                                        **scales)  # fmt: skip
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@gpu
@needs_cuda
def test_store_kv_and_fp8_cuda() -> None:
    torch.manual_seed(12)
    for dtype, k_scale in ((torch.bfloat16, 1.0), (torch.float8_e4m3fn, 0.05)):
        k_cache = torch.zeros(10, 16, 8, 128, dtype=dtype, device="cuda")
        v_cache = torch.zeros_like(k_cache)
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        k = torch.randn(150, 8, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        slots = torch.randperm(160, device="cuda")[:150]
        slots[::7] = -1
        pa.store_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=k_scale)
        ref_store_kv(k, v, ref_k, ref_v, slots, k_scale=k_scale, v_scale=k_scale)
        assert torch.equal(k_cache.view(torch.uint8), ref_k.view(torch.uint8))
        assert torch.equal(v_cache.view(torch.uint8), ref_v.view(torch.uint8))
        tables = torch.arange(10, dtype=torch.int32, device="cuda").reshape(1, 10)
        lens = torch.tensor([160], dtype=torch.int32, device="cuda")
        q = torch.randn(1, 16, 128, device="cuda", dtype=torch.bfloat16)
        scales = {"k_scale": k_scale, "v_scale": k_scale}
        out = pa.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.088, **scales)
        ref = ref_paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.088, **scales)
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=0)


@gpu
@needs_cuda
def test_decode_cuda_graph_replays_with_new_lengths() -> None:
    """Captured once with a fixed grid, replayed after seq_lens and tables change."""
    torch.manual_seed(13)
    block_size, num_blocks = 16, 600
    k_cache, v_cache = make_cache(num_blocks, block_size, 8, 128, torch.bfloat16, "cuda")
    tables = make_block_tables([4000, 4000], block_size, num_blocks).cuda()
    lens = torch.tensor([4000, 10], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 16, 128, device="cuda", dtype=torch.bfloat16)
    call = lambda: pa.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.088)  # noqa: E731
    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for new_lens in ([4000, 10], [1, 3999], [0, 2500]):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.normal_()
        graph.replay()
        ref = ref_paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.088)
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=0)


@needs_interpreter
def test_fp8_cache_with_bf16_query_interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16-bit query over an FP8 cache takes the fp16 dot path: it matches the reference up
    to 16-bit rounding (the fp32 test above covers the exact path)."""
    torch.manual_seed(6)
    fp8 = torch.float8_e4m3fn
    k_cache = (torch.randn(4, 16, 2, 16) * 0.5).to(fp8)
    v_cache = (torch.randn(4, 16, 2, 16) * 0.5).to(fp8)
    tables = torch.tensor([[0, 1, 2], [3, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([40, 9], dtype=torch.int32)
    scales = {"k_scale": 0.5, "v_scale": 0.25}
    q = torch.randn(2, 4, 16).to(torch.bfloat16)
    ref = ref_paged_decode_attention(q.float(), k_cache, v_cache, tables, lens, 0.25, **scales)
    for kernel in (None, SMALL_TILES):
        out = pa.paged_decode_attention(
            q, k_cache, v_cache, tables, lens, 0.25, num_splits=2, impl="triton", kernel=kernel,
            **scales,
        )  # fmt: skip
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    # extend (prefill chunks) takes the same fp16 path: two chunks after cached prefixes
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    qe = torch.randn(9, 4, 16).to(torch.bfloat16)
    ref = ref_paged_extend_attention(qe.float(), k_cache, v_cache, tables, cu, lens, 0.25,
                                        **scales)  # fmt: skip
    fp16_dot = _spy_extend_fp16_dot(monkeypatch)
    out = pa.paged_extend_attention(qe, k_cache, v_cache, tables, cu, lens, 0.25, impl="triton",
                                    **scales)  # fmt: skip
    assert out.dtype == torch.bfloat16 and fp16_dot == [True]
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    pa.paged_extend_attention(qe.float(), k_cache, v_cache, tables, cu, lens, 0.25,
                              impl="triton", **scales)  # fmt: skip
    assert fp16_dot == [True, False]  # an fp32 query keeps the exact path


def _spy_extend_fp16_dot(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The FP16_DOT value of every later `_extend_kernel` launch."""
    seen: list[bool] = []
    real = kernels._extend_kernel

    class Spy:
        def __getitem__(self, grid: object) -> object:
            def launch(*args: object, **kwargs: object) -> object:
                seen.append(bool(kwargs["FP16_DOT"]))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(kernels, "_extend_kernel", Spy())
    return seen


@needs_interpreter
@pytest.mark.parametrize("fp8", [False, True])
def test_block_table_entries_past_a_sequence_are_never_used(fp8: bool) -> None:
    """On the GPU the step's block tables come from a reused pinned arena: entries past a
    sequence's blocks hold stale ids, and the last row may end exactly at its last block
    (FP8 decode reads 128-key tiles over 16-token blocks). Results must equal the reference
    on clean tables."""
    torch.manual_seed(7)
    dtype = torch.float8_e4m3fn if fp8 else torch.float32
    k_cache = (torch.randn(8, 16, 2, 16) * 0.5).to(dtype)
    v_cache = (torch.randn(8, 16, 2, 16) * 0.5).to(dtype)
    lens = torch.tensor([37, 20], dtype=torch.int32)
    clean = torch.tensor([[5, 2, 7], [1, 4, 0]], dtype=torch.int32)
    stale = clean.clone()
    stale[1, 2] = 2**30  # past the second sequence's two blocks
    q = torch.randn(2, 4, 16)
    got = pa.paged_decode_attention(
        q, k_cache, v_cache, stale, lens, 0.25, num_splits=1, impl="triton"
    )
    want = ref_paged_decode_attention(q, k_cache, v_cache, clean, lens, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    narrow = clean[:, :2].contiguous()  # the last row ends at its last block
    lens2 = torch.tensor([20, 32], dtype=torch.int32)
    got = pa.paged_decode_attention(
        q, k_cache, v_cache, narrow, lens2, 0.25, num_splits=1, impl="triton"
    )
    want = ref_paged_decode_attention(q, k_cache, v_cache, narrow, lens2, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    qe = torch.randn(9, 4, 16)
    got = pa.paged_extend_attention(qe, k_cache, v_cache, stale, cu, lens, 0.25, impl="triton")
    want = ref_paged_extend_attention(qe, k_cache, v_cache, clean, cu, lens, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@gpu
@needs_cuda
def test_merge_in_kernel_has_no_race_cuda() -> None:
    """Many splits per (sequence, KV head) and many back-to-back calls in one graph: a merge
    that read a partial before its split stored it would differ from the two-kernel path."""
    torch.manual_seed(15)
    lens = [4000, 3000, 1, 0, 2500]  # a padded row (0) and a one-token one
    k_cache, v_cache = make_cache(800, 16, 8, 128, torch.bfloat16, "cuda")
    tables = make_block_tables(lens, 16, 800).cuda()
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    qs = torch.randn(50, len(lens), 16, 128, device="cuda", dtype=torch.bfloat16)
    separate = pa.DecodeKernelConfig(merge_in_kernel=False)
    in_kernel = pa.DecodeKernelConfig(merge_in_kernel=True)
    call = lambda q, kernel=in_kernel: pa.paged_decode_attention(  # noqa: E731
        q, k_cache, v_cache, tables, seq, 0.088, num_splits=48, kernel=kernel
    )  # 48: not a power of two
    call(qs[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [call(q) for q in qs]
    for _ in range(3):
        graph.replay()
        for q, out in zip(qs, outs, strict=True):
            want = call(q, separate)
            torch.testing.assert_close(out.float(), want.float(), atol=1e-2, rtol=0)


@gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_capture_without_merge_counters_falls_back_cuda(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A graph captured before any eager decode made the counters merges with the separate
    kernel (no graph-pool tensor may outlive its graph) and is still correct; for both
    kernels (an earlier form of this test ran the CUDA one's in-kernel merge by mistake)."""
    torch.manual_seed(16)
    monkeypatch.setattr(split_k, "_buffers", {})
    k_cache, v_cache = make_cache(300, 16, 8, 128, torch.bfloat16, "cuda")
    tables = make_block_tables([3000, 700], 16, 300).cuda()
    seq = torch.tensor([3000, 700], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 16, 128, device="cuda", dtype=torch.bfloat16)
    in_kernel = pa.DecodeKernelConfig(merge_in_kernel=True, backend=backend)  # type: ignore[arg-type]
    separate = pa.DecodeKernelConfig(
        merge_in_kernel=False,
        cuda_merge_in_kernel=False,
        backend=backend,  # type: ignore[arg-type]
    )
    call = lambda: pa.paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.088, num_splits=8,  # noqa: E731
                                             kernel=in_kernel)  # fmt: skip
    # compile the two-kernel path eagerly (the separate-merge config makes no counters)
    pa.paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.088, num_splits=8,
                              kernel=separate)  # fmt: skip
    torch.cuda.synchronize()
    assert not split_k._buffers
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    assert not split_k._buffers  # nothing made during the capture
    graph.replay()
    ref = ref_paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.088)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=0)


@needs_interpreter
def test_fp8_tensor_core_scores_interpreted() -> None:
    """The opt-in e4m3 scores (S^T = K Q^T). The query is built so that its per-row scaling
    into e4m3 is exact (each row's largest magnitude is 448 x 2^-7, every value an e4m3 number
    times 2^-7): the output then matches the reference up to the fp16 V path."""
    torch.manual_seed(8)
    fp8 = torch.float8_e4m3fn
    k_cache = (torch.randn(40, 16, 2, 32) * 40).to(fp8)
    v_cache = (torch.randn(40, 16, 2, 32) * 20).to(fp8)
    tables = torch.randperm(40).to(torch.int32).reshape(2, 20)
    lens = torch.tensor([300, 37], dtype=torch.int32)
    q8 = torch.randn(2, 4, 32).mul(60).to(fp8).float()
    q8[..., 0] = 448.0
    q = (q8 * 2.0**-7).to(torch.bfloat16)
    assert torch.equal(q.float(), q8 * 2.0**-7)  # exact in bf16 too
    scales = {"k_scale": 0.05, "v_scale": 0.05}
    kernel = pa.DecodeKernelConfig(block_n=16, num_stages=1, fp8_qk=True)
    out = pa.paged_decode_attention(q, k_cache, v_cache, tables, lens, 32**-0.5, num_splits=3,
                                    impl="triton", kernel=kernel, **scales)  # fmt: skip
    ref = ref_paged_decode_attention(q.float(), k_cache, v_cache, tables, lens, 32**-0.5,
                                        **scales)  # fmt: skip
    torch.testing.assert_close(out.float(), ref, atol=0.01 * float(ref.abs().max()), rtol=0)
    # a 16-bit cache ignores the FP8 form: exactly the default kernel's result
    kc, vc = k_cache.float().to(torch.bfloat16), v_cache.float().to(torch.bfloat16)
    plain = pa.paged_decode_attention(q, kc, vc, tables, lens, 0.2, num_splits=3, impl="triton")
    form = pa.paged_decode_attention(q, kc, vc, tables, lens, 0.2, num_splits=3, impl="triton",
                                     kernel=pa.DecodeKernelConfig(fp8_qk=True))  # fmt: skip
    assert torch.equal(plain, form)
    with pytest.raises(ConfigError, match="head_dim"):  # an e4m3 dot reduces over >= 32
        small = (k_cache[..., :16].contiguous(), v_cache[..., :16].contiguous())
        pa.paged_decode_attention(q[..., :16].contiguous(), *small, tables, lens, 0.2,
                                  impl="triton", kernel=kernel)  # fmt: skip


@gpu
@needs_cuda
def test_fp8_tensor_core_scores_cuda() -> None:
    """The opt-in e4m3 scores on the hardware: approximate (the query loses mantissa bits), so
    within 10 % of the output's range of the reference, and replayable in a CUDA graph."""
    torch.manual_seed(17)
    fp8 = torch.float8_e4m3fn
    k_cache = (torch.randn(420, 16, 8, 128, device="cuda") * 0.5).to(fp8)
    v_cache = (torch.randn(420, 16, 8, 128, device="cuda") * 0.5).to(fp8)
    tables = make_block_tables([4000, 1, 0, 2500], 16, 420).cuda()
    seq = torch.tensor([4000, 1, 0, 2500], dtype=torch.int32, device="cuda")
    q = torch.randn(4, 16, 128, device="cuda", dtype=torch.bfloat16)
    kernel = pa.DecodeKernelConfig(block_n=128, fp8_qk=True)
    call = lambda: pa.paged_decode_attention(q, k_cache, v_cache, tables, seq, 0.088, kernel=kernel)  # noqa: E731
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    ref = ref_paged_decode_attention(q.float(), k_cache, v_cache, tables, seq, 0.088)
    atol = 0.1 * float(ref.abs().max())
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=0)
    assert float(out[2].abs().max()) == 0.0  # the padded row
