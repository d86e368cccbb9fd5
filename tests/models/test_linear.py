"""Skinny decode matmuls (livemeet.layers.linear) against F.linear, the plan's dispatch, and the
warm-up batches that compile every extend-kernel variant.

On a CPU-only machine the kernels run under the Triton interpreter in float32 on small shapes;
the `gpu` test tunes the real decoder's shapes in bf16 and checks every choice's output.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from livemeet.errors import ConfigError, InternalError
from livemeet.layers import linear, split_k
from tests.kernels import interpreted, kernel_marks

linear = interpreted(linear, "_skinny_rows_kernel")
needs_interpreter, needs_cuda = kernel_marks(linear)
gpu = pytest.mark.gpu


@needs_interpreter
@pytest.mark.parametrize("rows", [1, 2, 5, 16])
@pytest.mark.parametrize(
    ("n", "k", "config"),
    [
        (48, 64, linear.GemmConfig(16, 32)),  # K a multiple of block_k
        (40, 72, linear.GemmConfig(16, 32)),  # ragged N and K: masked tiles
        (24, 64, linear.GemmConfig(32, 64)),  # one program wider than N
    ],
)
def test_skinny_linear_matches_f_linear(
    rows: int, n: int, k: int, config: linear.GemmConfig
) -> None:
    torch.manual_seed(rows * 100 + n)
    x = torch.randn(rows, k)
    w = torch.randn(n, k)
    out = linear.skinny_linear(x, w, config, impl="triton")
    assert out.shape == (rows, n) and out.dtype == x.dtype
    torch.testing.assert_close(out, F.linear(x, w), atol=1e-4, rtol=1e-4)


@needs_interpreter
@pytest.mark.parametrize("rows", [2, 16])
@pytest.mark.parametrize(
    ("n", "k", "config"),
    [
        (48, 128, linear.GemmConfig(16, 32, split_k=2)),  # two whole tiles per split
        (40, 72, linear.GemmConfig(16, 32, split_k=2)),  # ragged N and K: a partial last tile
        (24, 40, linear.GemmConfig(16, 32, split_k=4)),  # two K tiles over four splits: two empty
        (48, 64, linear.GemmConfig(16, 32, split_k=4)),  # the same with K a multiple of block_k
    ],
)
def test_split_k_matches_f_linear_deterministically(
    rows: int, n: int, k: int, config: linear.GemmConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K cut across programs, the last of each column tile summing the partials in split
    order: F.linear up to rounding, the same bits on every call, every counter re-armed. The
    split path really runs: the kernel got the counters (without them it runs one pass)."""
    got_counters: list[bool] = []
    real = split_k.counters

    def spy(device: torch.device, needed: int) -> torch.Tensor | None:
        buf = real(device, needed)
        got_counters.append(buf is not None)
        return buf

    monkeypatch.setattr(split_k, "counters", spy)
    torch.manual_seed(rows * 10 + k)
    x, w = torch.randn(rows, k), torch.randn(n, k)
    out = linear.skinny_linear(x, w, config, impl="triton")
    assert got_counters == [True]
    torch.testing.assert_close(out, F.linear(x, w), atol=1e-4, rtol=1e-4)
    assert torch.equal(linear.skinny_linear(x, w, config, impl="triton"), out)
    counters = split_k.counters(torch.device("cpu"), 1)
    assert counters is not None and int(counters.abs().sum()) == 0


@pytest.mark.parametrize(
    "bad", [{"block_n": 12}, {"block_k": 0}, {"num_warps": 3}, {"split_k": 3}, {"num_stages": 0}]
)
def test_gemm_config_rejects_bad_values(bad: dict[str, int]) -> None:
    fields = {"block_n": 16, "block_k": 32, **bad}
    with pytest.raises(ConfigError):
        linear.GemmConfig(**fields)


@gpu
@needs_cuda
def test_split_k_has_no_race_cuda() -> None:
    """Back-to-back split-K projections in one CUDA graph, replayed: a reducer that read a
    partial before its program stored it, or a counter left armed, would differ from the
    one-pass kernel."""
    torch.manual_seed(7)
    w = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16) * 0.02
    xs = torch.randn(40, 16, 3072, device="cuda", dtype=torch.bfloat16)
    split, whole = linear.GemmConfig(16, 256, split_k=8), linear.GemmConfig(16, 256)
    linear.skinny_linear(xs[0], w, split)  # compile; makes the counters before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [linear.skinny_linear(x, w, split) for x in xs]
    for _ in range(3):
        xs.normal_()  # new inputs: a partial left over from the last replay would show
        graph.replay()
        torch.cuda.synchronize()
        for x, out in zip(xs, outs, strict=True):
            want = linear.skinny_linear(x, w, whole).float()
            torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=0)
    # deterministic on the GPU too: the parts are summed in split order, not by atomics
    assert torch.equal(linear.skinny_linear(xs[0], w, split), linear.skinny_linear(xs[0], w, split))


@needs_interpreter
@pytest.mark.parametrize(("n", "k"), [(40, 72), (32, 256)])
def test_one_row_narrow_slab_wide_chunk(n: int, k: int) -> None:
    """The 4-column slabs with a chunk wider than K (masked) or equal to it (one load)."""
    torch.manual_seed(n + k)
    x, w = torch.randn(1, k), torch.randn(n, k)
    out = linear.skinny_linear(x, w, linear.GemmConfig(4, 256), impl="triton")
    torch.testing.assert_close(out, F.linear(x, w), atol=1e-4, rtol=1e-4)


@needs_interpreter
def test_skinny_linear_reads_strided_rows() -> None:
    """The decoder feeds views (e.g. attention output reshaped); row stride != K is fine."""
    base = torch.randn(3, 96)
    x = base[:, :64]  # row stride 96
    w = torch.randn(32, 64)
    out = linear.skinny_linear(x, w, linear.GemmConfig(16, 32), impl="triton")
    torch.testing.assert_close(out, F.linear(x, w), atol=1e-4, rtol=1e-4)


def test_skinny_linear_rejects_bad_inputs() -> None:
    config = linear.GemmConfig(16, 32)
    with pytest.raises(InternalError, match="rows"):
        linear.skinny_linear(torch.randn(17, 8), torch.randn(4, 8), config)
    with pytest.raises(InternalError, match=r"\[M, K\]"):
        linear.skinny_linear(torch.randn(2, 8), torch.randn(4, 9), config)
    with pytest.raises(InternalError, match="dtype|is torch"):
        linear.skinny_linear(torch.randn(2, 8), torch.randn(4, 8, dtype=torch.float64), config)


def test_skinny_norm_linear_rejects_bad_inputs() -> None:
    config, x, w, nw = linear.GemmConfig(8, 32), torch.randn(1, 8), torch.randn(4, 8), torch.ones(8)
    with pytest.raises(InternalError, match=r"\[M, K\]"):
        linear.skinny_norm_linear(x, None, nw, 1e-6, torch.randn(4, 9), config)
    with pytest.raises(InternalError, match="dtype"):  # the fused kernel would round silently
        linear.skinny_norm_linear(x, None, nw.double(), 1e-6, w, config)
    with pytest.raises(InternalError, match="norm weight"):
        linear.skinny_norm_linear(x, None, torch.ones(9), 1e-6, w, config)
    with pytest.raises(InternalError, match="residual"):
        linear.skinny_norm_linear(x, torch.randn(2, 8), nw, 1e-6, w, config)


def test_row_classes() -> None:
    assert linear.row_class(1) == 1
    assert linear.row_class(2) == linear.row_class(16) == linear.SKINNY_MAX_M
    assert linear.row_class(0) is None and linear.row_class(17) is None


@needs_interpreter
def test_plan_dispatches_by_shape_and_row_class(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, linear.GemmConfig]] = []
    real = linear.skinny_linear

    def spy(x: torch.Tensor, w: torch.Tensor, config: linear.GemmConfig, **kw: object):
        calls.append((x.shape[0], config))
        return real(x, w, config, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(linear, "skinny_linear", spy)
    plan = linear.LinearPlan(impl="triton")
    w = torch.randn(48, 64)
    one, many = linear.GemmConfig(8, 32), linear.GemmConfig(16, 64)
    plan.set_choice((48, 64), w.dtype, 1, one)
    plan.set_choice((48, 64), w.dtype, linear.SKINNY_MAX_M, many)
    for rows in (1, 4, 16, 17):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(plan.linear(x, w), F.linear(x, w), atol=1e-4, rtol=1e-4)
    assert calls == [(1, one), (4, many), (16, many)]  # 17 rows: cuBLAS
    other = torch.randn(32, 64)  # an untuned shape: cuBLAS
    plan.linear(torch.randn(1, 64), other)
    plan.set_choice((48, 64), w.dtype, 1, None)  # back to cuBLAS
    plan.linear(torch.randn(1, 64), w)
    assert len(calls) == 3


def test_empty_plan_is_f_linear() -> None:
    x, w = torch.randn(1, 8), torch.randn(4, 8)
    assert torch.equal(linear.LinearPlan().linear(x, w), F.linear(x, w))
    assert linear.LinearPlan().tune([w]) == []  # CPU weights are not tuned


def test_warm_up_batches_reach_every_extend_tile() -> None:
    from livemeet.engine.model_runner import WARM_UP_BATCHES, warm_up_batches
    from livemeet.layers.paged_attention import (
        EXTEND_ROWS,
        EXTEND_ROWS_SMALL,
        extend_tile_rows,
    )

    for kv_heads, group, sms in ((8, 2, 132), (8, 2, 78), (2, 4, 132), (4, 1, 16)):
        batches = warm_up_batches(kv_heads, group, sms)
        assert batches[: len(WARM_UP_BATCHES)] == list(WARM_UP_BATCHES)
        tiles = {extend_tile_rows(len(b), kv_heads, max(b), group, sms) for b in batches}
        assert tiles == {EXTEND_ROWS, EXTEND_ROWS_SMALL}
    # the burst that missed the warm-up on an H200: 16 short clips of 234 prompt tokens
    assert extend_tile_rows(16, 8, 234, 2, 132) == EXTEND_ROWS


@gpu
@needs_cuda
def test_tuned_plan_matches_f_linear_cuda() -> None:
    """Tune the real decoder's four projection shapes and its LM head in bf16; every choice
    computes F.linear up to bf16 rounding at 1, 4 and 16 rows."""
    shapes = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (151_936, 1024))
    weights = [torch.randn(s, device="cuda", dtype=torch.bfloat16) * 0.02 for s in shapes]
    plan = linear.LinearPlan()
    # down_proj also with SiLU*mul fused in; qkv and gate_up with the residual add + RMSNorm
    results = plan.tune(weights, silu_weights=weights[3:4], norm_weights=weights[0:3:2])
    assert len(results) == 2 * len(shapes) + 3
    assert [r.prologue for r in results[-3:]] == ["silu_mul", "add_rms_norm", "add_rms_norm"]
    for line in linear.describe(results):
        print(line)
    assert all(r.baseline_us > 0 and r.best_us > 0 for r in results)
    for w in weights:
        for rows in (1, 4, 16):
            x = torch.randn(rows, w.shape[1], device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            out = plan.linear(x, w).float()
            assert float((out - ref).abs().max()) <= 2e-2 * float(ref.abs().max())
        if w.shape == (1024, 3072):  # the down projection: SiLU*mul fused for one row
            from livemeet.layers.fused import ref_silu_and_mul

            gate_up = torch.randn(1, 2 * w.shape[1], device="cuda", dtype=torch.bfloat16)
            ref = F.linear(ref_silu_and_mul(gate_up).float(), w.float())
            out = plan.silu_mul_linear(gate_up, w).float()
            assert float((out - ref).abs().max()) <= 2e-2 * float(ref.abs().max())
        if w.shape[1] == 1024:  # qkv and gate_up: residual add + RMSNorm fused for one row
            from livemeet.layers.fused import ref_fused_add_rms_norm

            x, res = (torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16) for _ in "xr")
            nw = torch.rand(1024, device="cuda", dtype=torch.bfloat16) + 0.5
            normed, want_res = ref_fused_add_rms_norm(x, res, nw, 1e-6)
            ref = F.linear(normed.float(), w.float())
            out, got_res = plan.norm_linear(x, res, nw, 1e-6, w)
            assert float((out.float() - ref).abs().max()) <= 2e-2 * float(ref.abs().max())
            assert torch.equal(got_res, want_res)
        pairs = [(c, 1) for c in linear.ROW_CANDIDATES] + [(c, 16) for c in linear.DOT_CANDIDATES]
        for config, rows in pairs:  # each candidate with the row class it is tuned for
            x = torch.randn(rows, w.shape[1], device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            out = linear.skinny_linear(x, w, config).float()
            assert float((out - ref).abs().max()) <= 2e-2 * float(ref.abs().max())


@needs_interpreter
@pytest.mark.parametrize(
    ("k", "config"), [(64, linear.GemmConfig(16, 32)), (72, linear.GemmConfig(8, 32))]
)
def test_skinny_silu_linear_matches_silu_then_linear(k: int, config: linear.GemmConfig) -> None:
    from livemeet.layers.fused import ref_silu_and_mul

    torch.manual_seed(k)
    gate_up = torch.randn(2, 2 * k)
    w = torch.randn(40, k)
    out = linear.skinny_silu_linear(gate_up, w, config, impl="triton")
    torch.testing.assert_close(out, F.linear(ref_silu_and_mul(gate_up), w), atol=1e-4, rtol=1e-4)
    with pytest.raises(InternalError, match="2K"):
        linear.skinny_silu_linear(torch.randn(1, 2 * k + 2), w, config)


@needs_interpreter
def test_plan_fuses_silu_into_the_one_row_down_projection(monkeypatch: pytest.MonkeyPatch) -> None:
    fused_calls: list[int] = []
    real = linear.skinny_silu_linear

    def spy(gate_up: torch.Tensor, w: torch.Tensor, config: linear.GemmConfig, **kw: object):
        fused_calls.append(gate_up.shape[0])
        return real(gate_up, w, config, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(linear, "skinny_silu_linear", spy)
    from livemeet.layers.fused import ref_silu_and_mul

    plan = linear.LinearPlan(impl="triton")
    w = torch.randn(24, 32)
    for rows in (1, 3):  # untuned: SiLU*mul kernel, then linear
        gate_up = torch.randn(rows, 64)
        want = F.linear(ref_silu_and_mul(gate_up), w)
        torch.testing.assert_close(plan.silu_mul_linear(gate_up, w), want, atol=1e-4, rtol=1e-4)
    assert fused_calls == []
    plan.set_choice((24, 32), w.dtype, 1, linear.GemmConfig(8, 32))  # the plain projection's
    gate_up = torch.randn(1, 64)
    plan.silu_mul_linear(gate_up, w)
    assert fused_calls == []  # a plain choice does not make the fused kernel run
    plan.set_choice((24, 32), w.dtype, 1, linear.GemmConfig(8, 32), prologue="silu_mul")
    for rows in (1, 3):  # tuned for one row: fused; 3 rows still unfused
        gate_up = torch.randn(rows, 64)
        want = F.linear(ref_silu_and_mul(gate_up), w)
        torch.testing.assert_close(plan.silu_mul_linear(gate_up, w), want, atol=1e-4, rtol=1e-4)
    assert fused_calls == [1]


@needs_interpreter
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize(
    ("k", "config"), [(64, linear.GemmConfig(8, 32)), (72, linear.GemmConfig(4, 64))]
)
def test_skinny_norm_linear_matches_norm_then_linear(
    with_residual: bool, k: int, config: linear.GemmConfig
) -> None:
    """Residual add + RMSNorm folded into the projection: the two-kernel path's results, and
    the new residual written once (ragged K: masked chunks; two rows)."""
    from livemeet.layers.fused import fused_add_rms_norm

    torch.manual_seed(k + with_residual)
    x, w, nw = torch.randn(2, k), torch.randn(40, k), torch.rand(k) + 0.5
    residual = torch.randn(2, k) if with_residual else None
    normed, want_residual = fused_add_rms_norm(x, residual, nw, 1e-6, impl="triton")
    want = linear.skinny_linear(normed, w, config, impl="triton")
    got, got_residual = linear.skinny_norm_linear(x, residual, nw, 1e-6, w, config, impl="triton")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_residual, want_residual, atol=0, rtol=0)
    ref, ref_residual = linear.skinny_norm_linear(x, residual, nw, 1e-6, w, config, impl="torch")
    torch.testing.assert_close(ref, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(ref_residual, want_residual)


@needs_interpreter
@pytest.mark.parametrize("prologue", ["none", "silu_mul", "add_rms_norm"])
@pytest.mark.parametrize("k", [24, 64, 80])  # one partial chunk, one exact chunk, one and a bit
def test_one_row_kernel_first_chunk_peeled_before_the_wait(prologue: str, k: int) -> None:
    """The one-row kernel reads its first weight chunk before the PDL wait and loops from the
    second: K shorter than, equal to, and just past one 64-wide chunk, with every prologue,
    on a ragged N (13 outputs in 8-column slabs)."""
    from livemeet.layers.fused import ref_fused_add_rms_norm, ref_silu_and_mul

    torch.manual_seed(k)
    config, w = linear.GemmConfig(8, 64), torch.randn(13, k)
    if prologue == "none":
        x = torch.randn(1, k)
        got, want = linear.skinny_linear(x, w, config, impl="triton"), F.linear(x, w)
    elif prologue == "silu_mul":
        gate_up = torch.randn(1, 2 * k)
        got = linear.skinny_silu_linear(gate_up, w, config, impl="triton")
        want = F.linear(ref_silu_and_mul(gate_up), w)
    else:
        x, residual, nw = torch.randn(1, k), torch.randn(1, k), torch.rand(k) + 0.5
        got, _ = linear.skinny_norm_linear(x, residual, nw, 1e-6, w, config, impl="triton")
        want = F.linear(ref_fused_add_rms_norm(x, residual, nw, 1e-6)[0], w)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_tune_copies_cover_l2_and_stay_bounded() -> None:
    """Real-size weights cycle enough copies to defeat L2; tiny test weights are capped (a
    64-wide model once needed ~10k launches per timing and stalled the GPU tests)."""
    o_proj = 1024 * 2048 * 2  # bytes, bf16
    gate_up = 6144 * 1024 * 2
    assert linear.tune_copies(gate_up) * gate_up >= linear.TUNE_L2_DEFEAT_BYTES
    assert linear.tune_copies(o_proj) * o_proj >= linear.TUNE_L2_DEFEAT_BYTES
    assert linear.tune_copies(64 * 64 * 2) == linear.TUNE_MAX_COPIES
    assert linear.tune_copies(1 << 40) == 2


@pytest.mark.parametrize("n", [1024, 2048, 4096, 6144])
def test_dot_candidates_fill_every_sm(n: int) -> None:
    """The 2..16-row candidates the tuner times each put a program on every SM (a narrow grid
    times well back to back but idles SMs in a decode step); the others are left out."""
    num_sms = 132
    picked = linear.dot_candidates(n, num_sms)
    assert picked, "every decoder shape keeps some candidates"
    for c in picked:
        assert -(-n // c.block_n) * c.split_k >= num_sms and c.block_n <= n
    assert linear.GemmConfig(16, 512, split_k=4) in picked  # the H200's pick for N = 1024
    assert linear.GemmConfig(64, 128) not in picked  # 16-96 programs
    if n == 1024:  # 64 column tiles: only the 4- and 8-way splits reach 132 programs
        assert picked == [c for c in linear.DOT_CANDIDATES if c.split_k >= 4]
