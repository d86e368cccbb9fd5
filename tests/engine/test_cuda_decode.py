"""The CUDA decode kernel's host side (livemeet.layers.cuda_decode) on a CPU-only machine, and
its source through nvcc where the CUDA toolkit is installed (the kernel itself runs only in
the `gpu`-marked tests of test_paged_attention.py)."""

from __future__ import annotations

import ctypes
import dataclasses
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from livemeet.errors import ConfigError, InternalError
from livemeet.layers import cuda_decode
from livemeet.layers import paged_attention as pa


@pytest.mark.parametrize(
    "bad",
    [
        {"stages": 1},
        {"stages": cuda_decode.MAX_STAGES_BF16 + 1},
        {"fp8": True, "stages": cuda_decode.MAX_STAGES_FP8 + 1},
        {"page": 24},
    ],
)
def test_variant_rejects_forms_the_kernel_does_not_build(bad: dict[str, object]) -> None:
    form: dict[str, object] = {"fp8": False, "page": 16, "stages": 2, "early_loads": True}
    form.update(bad)
    with pytest.raises(ConfigError):
        cuda_decode.Variant(**form)  # type: ignore[arg-type]


def test_default_variants_are_valid_for_every_block_size() -> None:
    for page in pa.SUPPORTED_BLOCK_SIZES:
        for fp8 in (False, True):
            v = cuda_decode.default_variant(fp8, page)
            assert (v.fp8, v.page) == (fp8, page)


def test_cpu_tensors_take_the_triton_or_torch_path() -> None:
    cache = torch.zeros(4, 16, 8, 128, dtype=torch.bfloat16)
    assert not cuda_decode.supported(torch.bfloat16, cache, 2)
    assert pa.cuda_variant(torch.bfloat16, cache, 2, None) is None
    assert pa.decode_programs_per_sm(torch.bfloat16, cache, 2) == pa.DECODE_PROGRAMS_PER_SM


def nvcc() -> str | None:
    return shutil.which("nvcc")


def build(tmp_path: Path, variant: cuda_decode.Variant) -> str:
    """ptxas's resource report for the variant compiled the way compile_cubin asks NVRTC to
    (sm_90, C++17, the same -D switches)."""
    out = tmp_path / "kernel.cubin"
    cmd = [
        str(nvcc()),
        "-cubin",
        "-arch=sm_90",
        "-std=c++17",
        "-Xptxas",
        "-v",
        f"-DKV_FP8={int(variant.fp8)}",
        f"-DPAGE={variant.page}",
        f"-DNUM_STAGES={variant.stages}",
        f"-DEARLY_LOADS={int(variant.early_loads)}",
        f"-DHEADS_INNER={int(variant.heads_inner)}",
        f"-DFUSED_QK={int(variant.fused_qk)}",
        str(cuda_decode.SOURCE),
        "-o",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0
    return done.stderr


@pytest.mark.skipif(nvcc() is None, reason="needs the CUDA toolkit's nvcc")
@pytest.mark.parametrize("fp8", [False, True])
def test_every_kernel_form_compiles_without_register_spills(tmp_path: Path, fp8: bool) -> None:
    """Each pipeline depth the Variant accepts builds, and none spills registers to local
    memory (the reason bf16 stops at 2 stages: 3 spilled)."""
    most = cuda_decode.MAX_STAGES_FP8 if fp8 else cuda_decode.MAX_STAGES_BF16
    for stages in range(cuda_decode.MIN_STAGES, most + 1):
        for early in (False, True):
            report = build(tmp_path, cuda_decode.Variant(fp8, 16, stages, early))
            spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
            assert spills and not any(spills), report
    for fused in (False, True):  # the fused q/k prologue spills nothing either
        report = build(tmp_path, replace(cuda_decode.default_variant(fp8, 128), fused_qk=fused))
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
        assert spills and not any(spills), report


@pytest.mark.skipif(nvcc() is None, reason="needs the CUDA toolkit's nvcc")
@pytest.mark.parametrize("fp8", [False, True])
def test_the_fused_prologue_keeps_the_programs_per_sm(tmp_path: Path, fp8: bool) -> None:
    """The q/k prologue's registers are dead by the main loop: the fused form must fit as
    many programs on an SM as the plain one (registers per thread, rounded to the allocation
    unit of 8, times 128 threads, into 64K registers; shared memory is far from its limit)."""
    per_sm = []
    for fused in (False, True):
        report = build(tmp_path, replace(cuda_decode.default_variant(fp8, 128), fused_qk=fused))
        (regs,) = re.findall(r"Used (\d+) registers", report)
        per_sm.append(65536 // ((int(regs) + 7) // 8 * 8 * cuda_decode.THREADS))
    assert per_sm[0] == per_sm[1], per_sm


@pytest.mark.skipif(nvcc() is None, reason="needs the CUDA toolkit's nvcc")
@pytest.mark.parametrize("fp8", [False, True])
def test_both_grid_orders_use_the_same_registers(tmp_path: Path, fp8: bool) -> None:
    """The KV-head-fastest grid order only renames block indices: it must not cost registers
    (which would change how many programs fit per SM) or spill."""
    reports = [
        build(tmp_path, cuda_decode.Variant(fp8, 16, 2, True, heads_inner))
        for heads_inner in (False, True)
    ]
    regs = [re.findall(r"Used (\d+) registers", r) for r in reports]
    assert regs[0] and regs[0] == regs[1], reports
    assert not any(int(n) for n in re.findall(r"(\d+) bytes spill stores", reports[1]))


@pytest.mark.skipif(nvcc() is None, reason="needs the CUDA toolkit's nvcc")
def test_large_blocks_compile(tmp_path: Path) -> None:
    build(tmp_path, cuda_decode.default_variant(True, 128))


@pytest.mark.parametrize("error", [OSError("libnvrtc.so.13: cannot open"), RuntimeError("capture")])
def test_a_kernel_that_does_not_build_or_load_is_reported_unusable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    """NVRTC or the driver missing, a compile error, a load refused: the form is unusable
    (callers then run Triton) and the reason is logged, never raised."""

    def fails(variant: cuda_decode.Variant, device_index: int) -> None:
        raise error

    monkeypatch.setattr(cuda_decode, "_kernel", fails)
    cuda_decode.usable.cache_clear()
    try:
        assert not cuda_decode.usable(cuda_decode.default_variant(True, 16), 0)
    finally:
        cuda_decode.usable.cache_clear()
    assert "using Triton" in caplog.text and str(error) in caplog.text


def test_layout_supported_wants_aligned_pieces_and_one_stride_pair() -> None:
    k = torch.zeros(4, 16, 8, 128, dtype=torch.bfloat16)
    v = torch.zeros_like(k)
    q = torch.zeros(3, 16, 128, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    assert cuda_decode.layout_supported(q, k, v, out)
    shifted = torch.zeros(k.numel() + 1, dtype=torch.bfloat16)[1:].view(k.shape)  # 2 bytes off
    assert not cuda_decode.layout_supported(q, shifted, v, out)
    assert not cuda_decode.layout_supported(q, k, shifted, out)
    q_shifted = torch.zeros(q.numel() + 1, dtype=torch.bfloat16)[1:].view(q.shape)
    assert not cuda_decode.layout_supported(q_shifted, k, v, out)
    wider = torch.zeros(4, 16, 8, 136, dtype=torch.bfloat16)[..., :128]  # other token stride
    assert not cuda_decode.layout_supported(q, k, wider, out)
    odd_heads = torch.zeros(3, 16, 129, dtype=torch.bfloat16)[..., :128]  # odd head stride
    assert not cuda_decode.layout_supported(odd_heads, k, v, out)


def kernel_signature() -> list[str]:
    """The C types of the kernel's parameters, in order, read from the .cu source."""
    src = cuda_decode.SOURCE.read_text()
    params = src.split("livemeet_decode_split(", 1)[1].split(")", 1)[0]
    return [" ".join(p.split()[:-1]) for p in params.split(",")]


def test_launch_parameter_types_follow_the_kernel_signature() -> None:
    """PARAM_TYPES is what the driver copies per parameter: a size or kind that drifted from
    the .cu signature would shift every later argument."""
    expected = {"float": ctypes.c_float, "long long": ctypes.c_int64, "int": ctypes.c_int}
    got = []
    for decl in kernel_signature():
        got.append(ctypes.c_void_p if "*" in decl else expected[decl.replace("const ", "")])
    assert tuple(got) == cuda_decode.PARAM_TYPES


def read_params(params: ctypes.Array[ctypes.c_void_p]) -> list[int | float | None]:
    """The values the driver would read: parameter i at the address params[i], as PARAM_TYPES[i]."""
    return [
        t.from_address(addr).value  # type: ignore[attr-defined]
        for t, addr in zip(cuda_decode.PARAM_TYPES, params, strict=True)
    ]


def test_launch_args_are_refilled_in_place() -> None:
    args = cuda_decode.LaunchArgs()
    fused_part = (11, 12, 13, 14, 15, 16, 17, 18, 19, 1e-6, 0.5)
    first = (*range(1, 9), 0.5, 2.0, *range(10, 17), 2, 64, 0, *fused_part)
    params = args.fill(*first)
    addresses = list(params)
    got = read_params(params)
    assert got[:20] == [*first[:19], None]  # a null c_void_p reads as None
    assert got[20:29] == list(fused_part[:9]) and got[29] == pytest.approx(1e-6)
    second = (*range(101, 109), -1.25, 3.0, *range(-7, 0), 8, 3, 0xDEAD00, *range(1, 10), 2.0, 4.0)
    assert list(args.fill(*second)) == addresses  # the same slots, new values
    assert read_params(params) == list(second)
    with pytest.raises(InternalError):
        args.fill(1, 2)


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """The CUDA driver, kernel lookup, device and stream faked on the CPU: each
    cuLaunchKernelEx is recorded (grid, block, stream, function, the parameters' values)."""
    launches: list[dict[str, object]] = []

    class FakeDriver:
        def cuLaunchKernelEx(self, config_ref, function, params, extra) -> int:  # noqa: N802
            config = config_ref._obj
            launches.append({
                "grid": (config.grid_x, config.grid_y, config.grid_z),
                "block": config.block_x,
                "stream": config.stream,
                "function": function,
                "params": read_params(params),
            })  # fmt: skip
            return 0

    monkeypatch.setattr(cuda_decode, "_libraries", lambda: (None, FakeDriver()))
    monkeypatch.setattr(cuda_decode, "_kernel", lambda v, i: cuda_decode._Kernel(None, "fn"))
    monkeypatch.setattr(cuda_decode, "device_index", lambda t: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda d=None: SimpleNamespace(cuda_stream=77)
    )
    return launches


@pytest.mark.parametrize("heads_inner", [False, True])
def test_launch_passes_every_argument_and_the_grid(
    fake_driver: list[dict[str, object]], heads_inner: bool
) -> None:
    """A PreparedLaunch run once on the CPU with the driver faked: what cuLaunchKernelEx
    receives is each tensor's address and stride in the signature's order, the grid of the
    variant's order and the current stream."""
    batch, heads, kv_heads, splits, page = 3, 16, 8, 5, 16
    q = torch.zeros(batch, heads, 128, dtype=torch.bfloat16)
    k = torch.zeros(10, page, kv_heads, 128, dtype=torch.float8_e4m3fn)
    v = torch.zeros_like(k)
    tables = torch.zeros(batch, 7, dtype=torch.int32)
    lens = torch.zeros(batch, dtype=torch.int32)
    mid_o = torch.zeros(batch, heads, 8, 128)
    mid_lse = torch.zeros(batch, heads, 8)
    out = torch.zeros_like(q)
    counters = torch.zeros(64, dtype=torch.int32)
    variant = cuda_decode.Variant(True, page, 2, True, heads_inner)
    cuda_decode.PreparedLaunch(
        k, tables, lens, mid_o, mid_lse, batch=batch, num_splits=splits, group=2,
        qk_scale=0.25, v_scale=1.5, variant=variant, counters=counters,
    )(q, k, v, out)  # fmt: skip
    (seen,) = fake_driver
    grid = (kv_heads, splits, batch) if heads_inner else (splits, kv_heads, batch)
    assert seen["grid"] == grid and seen["block"] == cuda_decode.THREADS
    assert seen["stream"] == 77 and seen["function"] == "fn"
    pointers = [t.data_ptr() for t in (q, k, v, tables, lens, mid_o, mid_lse, out)]
    strides = [q.stride(0), q.stride(1), out.stride(0), out.stride(1), k.stride(0), k.stride(1)]
    expected = [*pointers, 0.25, 1.5, *strides, tables.stride(0), 2, 8, counters.data_ptr()]
    unfused = [None, None, 0, 0, None, None, None, None, None, 0.0, 0.0]  # FUSED_QK's: unset
    assert seen["params"] == [*expected, *unfused]


def test_prepared_launch_sets_only_the_layer_tensors_per_call(
    fake_driver: list[dict[str, object]],
) -> None:
    """One PreparedLaunch run for two layers: each launch carries that layer's q, caches and
    out (addresses and q/out strides) and the step's fixed values; a cache of another geometry
    or a misaligned query is refused (accepts False, the call raises)."""
    batch, heads, kv_heads, page = 2, 16, 8, 16
    caches = [torch.zeros(6, page, kv_heads, 128, dtype=torch.bfloat16) for _ in range(4)]
    tables = torch.zeros(batch, 3, dtype=torch.int32)
    lens = torch.zeros(batch, dtype=torch.int32)
    mid_o, mid_lse = torch.zeros(batch, heads, 4, 128), torch.zeros(batch, heads, 4)
    prepared = cuda_decode.PreparedLaunch(
        caches[0], tables, lens, mid_o, mid_lse, batch=batch, num_splits=4, group=2,
        qk_scale=0.5, v_scale=1.0,
    )  # fmt: skip
    qs = [torch.zeros(batch, heads, 128, dtype=torch.bfloat16) for _ in range(2)]
    wide = torch.zeros(batch, heads, 256, dtype=torch.bfloat16)[:, :, :128]  # other strides
    outs = [torch.zeros_like(qs[0]), wide]
    for layer in range(2):
        q, k, v, out = qs[layer], caches[2 * layer], caches[2 * layer + 1], outs[layer]
        prepared(q, k, v, out)
        got = fake_driver[-1]["params"]
        assert isinstance(got, list)
        assert got[:3] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
        assert got[3:7] == [t.data_ptr() for t in (tables, lens, mid_o, mid_lse)]
        assert got[7] == out.data_ptr()
        assert got[8:10] == [0.5, 1.0]
        assert got[10:14] == [q.stride(0), q.stride(1), out.stride(0), out.stride(1)]
        assert got[14:20] == [caches[0].stride(0), caches[0].stride(1), 3, 2, 4, None]
    other = torch.zeros(7, page, kv_heads, 128, dtype=torch.bfloat16)
    assert not prepared.accepts(qs[0], other, caches[1], outs[0])
    misaligned = torch.zeros(batch * heads * 128 + 1, dtype=torch.bfloat16)[1:].view(
        batch, heads, 128
    )
    assert not prepared.accepts(misaligned, caches[0], caches[1], outs[0])
    with pytest.raises(InternalError, match="do not suit"):
        prepared(misaligned, caches[0], caches[1], outs[0])
    assert len(fake_driver) == 2


def fused_inputs(batch: int) -> tuple[cuda_decode.FusedQK, cuda_decode.FusedQKLayer]:
    """A step's FusedQK and one layer's tensors, shaped as the model hands them over: k and v
    as views of a qkv row of 16 q, 8 k and 8 v heads."""
    qkv = torch.zeros(batch, 32 * 128, dtype=torch.bfloat16)
    k = qkv[:, 16 * 128 : 24 * 128].view(batch, 8, 128)
    v = qkv[:, 24 * 128 :].view(batch, 8, 128)
    norms = torch.ones(2, 128, dtype=torch.bfloat16)
    step = cuda_decode.FusedQK(
        torch.arange(batch, dtype=torch.int64),
        torch.ones(64),
        torch.full((batch,), -1, dtype=torch.int64),
        1e-6,
        0.5,
    )
    return step, cuda_decode.FusedQKLayer(k, v, norms[0], norms[1])


def test_a_fused_launch_passes_the_step_and_layer_inputs(
    fake_driver: list[dict[str, object]],
) -> None:
    """The fused form's launch carries the step's positions, inv_freq, slots, eps and scale
    (fixed) and each layer's raw k, v, their strides and the norm weights; an unfused launch
    given them, or a fused one without them, is refused."""
    batch, page = 2, 16
    cache = torch.zeros(6, page, 8, 128, dtype=torch.bfloat16)
    tables, lens = torch.zeros(batch, 3, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)
    mid_o, mid_lse = torch.zeros(batch, 16, 4, 128), torch.zeros(batch, 16, 4)
    step, layer = fused_inputs(batch)
    variant = replace(cuda_decode.default_variant(False, page), fused_qk=True)
    prepared = cuda_decode.PreparedLaunch(
        cache, tables, lens, mid_o, mid_lse, batch=batch, num_splits=4, group=2,
        qk_scale=0.5, v_scale=1.0, variant=variant, fused=step,
    )  # fmt: skip
    q = layer.k.new_zeros(batch, 32 * 128)[:, : 16 * 128].view(batch, 16, 128)  # raw, strided
    out = torch.zeros(batch, 16, 128, dtype=torch.bfloat16)
    prepared(q, cache, cache, out, layer)
    got = fake_driver[-1]["params"]
    assert isinstance(got, list)
    assert got[0] == q.data_ptr() and got[10:12] == [q.stride(0), q.stride(1)]
    assert got[20:26] == [
        layer.k.data_ptr(), layer.v.data_ptr(), layer.k.stride(0), layer.k.stride(1),
        layer.q_norm_weight.data_ptr(), layer.k_norm_weight.data_ptr(),
    ]  # fmt: skip
    assert got[26:29] == [t.data_ptr() for t in (step.positions, step.inv_freq, step.slots)]
    assert got[29] == pytest.approx(1e-6) and got[30] == 0.5
    with pytest.raises(InternalError, match="fused_qk launch"):
        prepared(q, cache, cache, out)
    plain = cuda_decode.PreparedLaunch(
        cache, tables, lens, mid_o, mid_lse, batch=batch, num_splits=4, group=2,
        qk_scale=0.5, v_scale=1.0,
    )  # fmt: skip
    with pytest.raises(InternalError, match="fused_qk launch"):
        plain(q, cache, cache, out, layer)
    with pytest.raises(InternalError, match="FusedQK inputs"):
        cuda_decode.PreparedLaunch(
            cache, tables, lens, mid_o, mid_lse, batch=batch, num_splits=4, group=2,
            qk_scale=0.5, v_scale=1.0, variant=variant,
        )  # fmt: skip


def test_fused_inputs_the_kernel_cannot_take_are_refused() -> None:
    step, layer = fused_inputs(3)
    step.check(3)
    assert layer.fits()
    with pytest.raises(InternalError, match="positions"):
        replace(step, positions=step.positions.to(torch.int32)).check(3)
    with pytest.raises(InternalError, match="slots"):
        replace(step, slots=torch.zeros(4, dtype=torch.int64)).check(3)
    with pytest.raises(InternalError, match="inv_freq"):
        replace(step, inv_freq=torch.ones(128)).check(3)
    odd = torch.zeros(3 * 32 * 128 + 1, dtype=torch.bfloat16)[1:].view(3, 32 * 128)
    misaligned = odd[:, 16 * 128 : 24 * 128].view(3, 8, 128)  # 2-byte aligned
    assert not replace(layer, k=misaligned, v=misaligned).fits()
    assert not replace(layer, v=layer.v.float()).fits()
    assert not replace(layer, q_norm_weight=torch.ones(64, dtype=torch.bfloat16)).fits()
    assert not replace(layer, v=layer.v.contiguous()).fits()  # k and v share one stride pair


def reference_k_rows(
    k: torch.Tensor,
    weight: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    eps: float,
    inv_scale: float | None,
) -> torch.Tensor:
    """The new k rows [N, H, D] as both kernels mean to store them, on the CPU: RMSNorm with
    float64 statistics, the bf16 roundings of `fused._norm_rope_head` (normalised, weighted,
    each RoPE product and their sum), and cos/sin of the fp32 angle pos * inv_freq taken in
    float64 (exact, as a precise cosf is to within its last bit) and rounded to bf16; then as
    stored: bf16, or e4m3 of clamp(x * inv_scale, -448, 448) (`inv_scale`), as float32."""
    a = k.detach().cpu().float()
    rstd = (a.double().pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt().float()
    bf = torch.bfloat16
    n = ((a * rstd).to(bf).float() * weight.cpu().float()).to(bf).float()
    half = n.shape[-1] // 2
    angle = positions.cpu().float()[:, None] * inv_freq.cpu().float()[None, :]  # fp32, [N, D/2]
    c = angle.double().cos().to(bf).float()[:, None, :]
    s = angle.double().sin().to(bf).float()[:, None, :]
    n1, n2 = n[..., :half], n[..., half:]
    o1 = ((n1 * c).to(bf).float() - (n2 * s).to(bf).float()).to(bf).float()
    o2 = ((n2 * c).to(bf).float() + (n1 * s).to(bf).float()).to(bf).float()
    rows = torch.cat([o1, o2], dim=-1)
    if inv_scale is None:
        return rows
    return (rows * inv_scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()


def test_the_reference_k_rows_match_the_torch_path_on_the_cpu() -> None:
    """`reference_k_rows` against the model's own CPU path (`fused.qk_norm_rope`, torch): at
    most a scattered few of the elements differ (the statistics' rounding)."""
    from livemeet.layers import fused as fk

    torch.manual_seed(7)
    n, heads = 4, 8
    k = (2 * torch.randn(n, heads, 128)).to(torch.bfloat16)
    q = (2 * torch.randn(n, 2 * heads, 128)).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(128)).to(torch.bfloat16)
    positions = torch.tensor([7, 394, 12301, 115])
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, 128, 2).float() / 128))
    _, k_rot = fk.qk_norm_rope(q, k, w, w, 1e-6, positions, inv_freq, impl="torch")
    ref = reference_k_rows(k, w, positions, inv_freq, 1e-6, None)
    assert (k_rot.float() != ref).float().mean() < 0.01


def fused_case(fp8: bool, seq_lens: list[int], page: int = 128) -> dict[str, torch.Tensor | float]:
    """A decode step on CUDA for the fused/unfused comparison: random caches with each
    sequence's blocks shuffled, the new token of row b at KV index seq_lens[b] - 1 (a 0 row is
    padding: slot -1), raw qkv rows, norm weights near 1, Qwen3's RoPE (theta 1e6)."""
    dev = "cuda"
    blocks = [max(1, -(-n // page)) for n in seq_lens]
    order = torch.randperm(sum(blocks) + 1, device=dev).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32, device=dev)
    slots = []
    at = 0
    for b, (n, nb) in enumerate(zip(seq_lens, blocks, strict=True)):
        tables[b, :nb] = order[at : at + nb]
        at += nb
        slots.append(int(tables[b, (n - 1) // page]) * page + (n - 1) % page if n else -1)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    shape = (sum(blocks) + 1, page, 8, 128)
    kv_scale = 0.5 if fp8 else 1.0
    qkv = (2 * torch.randn(len(seq_lens), 32 * 128, device=dev)).to(torch.bfloat16)
    return {
        "kc": torch.randn(shape, device=dev).to(dtype),
        "vc": torch.randn(shape, device=dev).to(dtype),
        "tables": tables,
        "lens": torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        "slots": torch.tensor(slots, dtype=torch.int64, device=dev),
        "positions": (torch.tensor(seq_lens, device=dev) - 1).clamp(min=0) * 3 + 7,
        "qkv": qkv,
        "qw": (1 + 0.1 * torch.randn(128, device=dev)).to(torch.bfloat16),
        "kw": (1 + 0.1 * torch.randn(128, device=dev)).to(torch.bfloat16),
        "inv_freq": 1.0 / (1e6 ** (torch.arange(0, 128, 2, device=dev).float() / 128)),
        "kv_scale": kv_scale,
    }


def assert_rotated_rows_close(rows_a: torch.Tensor, rows_b: torch.Tensor, fp8: bool) -> None:
    """Two computations of the same normalised, rotated k rows [S, H, D] (as stored: bf16, or
    e4m3 values) agree. Their sums of squares add in another order, so a rounding to bf16
    before RoPE may flip by one ulp; the rotation mixes each pair (d, d + D/2), so the flip
    moves an output by up to one bf16 ulp of the pair's norm, which where the rotation
    cancels is many ulps of the output itself (the first GPU run, on an H100: -0.0117 against
    -0.0121 beside elements near 1). Bound: one stored ulp of the element (the last
    rounding) plus 2.5 bf16 ulps of its pair's norm (sqrt(2) from the pair, rounding the
    products and their sum). At most 1 % of elements may differ at all."""
    half = rows_a.shape[-1] // 2
    pair_norm = (rows_a[..., :half] ** 2 + rows_a[..., half:] ** 2).sqrt().repeat(1, 1, 2)
    stored_ulp = 2.0 ** (-3 if fp8 else -7)  # one e4m3 / bf16 step, relative
    bound = stored_ulp * rows_a.abs() + 2.5 * 2.0**-7 * pair_norm + 1e-6
    excess = (rows_a - rows_b).abs() - bound
    assert (excess <= 0).all(), (
        f"{int((excess > 0).sum())} of {excess.numel()} elements past the bound, "
        f"the worst by {float(excess.max()):.3g}"
    )
    differs = rows_a != rows_b  # [S, H, D]
    per_head = differs.sum(dim=-1)  # [S, H]: elements that differ in each row's head
    where = ", ".join(
        f"row {r} head {h}: {int(per_head[r, h])}" for r, h in per_head.nonzero().tolist()
    )
    # session 35's H100 run: 15.7 % of bf16 elements differed, all within the bound; the
    # message says whether whole heads differ (a systematic difference) or scattered ones
    worst = float(((rows_a - rows_b).abs() / (pair_norm + 1e-6)).max())
    assert differs.float().mean() < 0.01, (
        f"{float(differs.float().mean()):.1%} of elements differ ({where}); the largest "
        f"difference is {worst:.3g} of its pair's norm"
    )


def test_the_rotated_rows_bound_takes_a_flipped_rounding_and_refuses_a_wrong_position() -> None:
    """`assert_rotated_rows_close` on the CPU: a one-ulp flip before RoPE carried into a
    cancelling output passes; rows rotated at another position, or moved by more, fail."""
    torch.manual_seed(5)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, 128, 2).float() / 128))

    def rotate(x: torch.Tensor, pos: float) -> torch.Tensor:
        c, s = torch.cos(pos * inv_freq), torch.sin(pos * inv_freq)
        x1, x2 = x[..., :64], x[..., 64:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).bfloat16().float()

    x = torch.randn(4, 8, 128).bfloat16().float()
    flipped = x.clone()
    flipped[:, 0, 3] += 2.0**-7 * flipped[:, 0, 3].abs().clamp(min=0.5)  # one ulp, a row's
    rows = rotate(x, 1000.0)
    assert_rotated_rows_close(rows, rotate(flipped, 1000.0), fp8=False)
    with pytest.raises(AssertionError, match="past the bound"):
        assert_rotated_rows_close(rows, rotate(x, 1001.0), fp8=False)
    nudged = rows.clone()  # every element of one head a bf16 ulp off: within the bound
    nudged[1, 2] += 2.0**-8 * nudged[1, 2].abs()
    with pytest.raises(AssertionError, match=r"differ \(row 1 head 2: 1\d\d\)"):
        assert_rotated_rows_close(rows, nudged, fp8=False)
    moved = rows.clone()
    moved[0, 0, 3] += 0.1
    with pytest.raises(AssertionError, match="1 of 4096 elements past the bound"):
        assert_rotated_rows_close(rows, moved, fp8=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("num_splits", [1, 7, None])
def test_the_fused_prologue_matches_the_qk_kernel_and_the_plain_decode(
    fp8: bool, num_splits: int | None
) -> None:
    """One decode step two ways over copies of the same caches: the q/k kernel
    (`qk_norm_rope_store_kv`, storing k and v) then the plain CUDA decode, against the
    `fused_qk` form doing both in its prologue. The caches must end up the same (v exactly, a
    new k within `assert_rotated_rows_close`), and the outputs agree to bf16 rounding; a
    padding row stores nothing and gives zeros."""
    from livemeet.layers import fused as fk
    from livemeet.layers.paged_attention import DecodeLaunch, KVSink

    torch.manual_seed(33)
    case = fused_case(fp8, [1, 130, 4099, 0, 37])
    qkv = case["qkv"]
    assert isinstance(qkv, torch.Tensor)
    n = qkv.shape[0]
    q, k, v = (qkv[:, a:b].view(n, -1, 128) for a, b in ((0, 2048), (2048, 3072), (3072, 4096)))
    s = float(case["kv_scale"])
    kc_a, vc_a = case["kc"].clone(), case["vc"].clone()
    kc_b, vc_b = case["kc"].clone(), case["vc"].clone()
    common = (case["tables"], case["lens"], 128**-0.5)
    sink = KVSink(kc_a, vc_a, case["slots"], s)
    q_a = fk.qk_norm_rope_store_kv(
        q, k, v, case["qw"], case["kw"], 1e-6, case["positions"], case["inv_freq"], sink,
        impl="triton",
    )  # fmt: skip
    plain = DecodeLaunch(q_a, kc_a, vc_a, *common, num_splits=num_splits, k_scale=s, v_scale=s)
    out_a = plain(q_a, kc_a, vc_a)
    step = cuda_decode.FusedQK(case["positions"], case["inv_freq"], case["slots"], 1e-6, 1 / s)
    fused = DecodeLaunch(
        q, kc_b, vc_b, *common, num_splits=num_splits, k_scale=s, v_scale=s, fused=step
    )
    assert fused.cuda is not None and fused.cuda.fused_qk
    layer = cuda_decode.FusedQKLayer(k, v, case["qw"], case["kw"])
    out_b = fused(q, kc_b, vc_b, None, layer)
    torch.cuda.synchronize()
    assert torch.equal(vc_a.view(torch.uint8), vc_b.view(torch.uint8))
    changed = (kc_a.view(torch.uint8) != kc_b.view(torch.uint8)).any(dim=-1)  # per (slot, head)
    slots = case["slots"]
    assert isinstance(slots, torch.Tensor)
    touched = changed.flatten(0, 1).nonzero()[:, 0].unique()
    assert set(touched.tolist()) <= set(slots[slots >= 0].tolist())  # nowhere else
    rows_a, rows_b = (c.flatten(0, 1)[slots[slots >= 0]].float() for c in (kc_a, kc_b))
    # which path departs from what both mean to store (session 35: they differed in 16 % of
    # the elements, more at larger positions, all within the bound below; session 36: the q/k
    # kernel; session 37: its x1*cos - x2*sin contracted into one bf16 fma, now kept apart)
    stored = slots >= 0
    positions = case["positions"]
    assert isinstance(positions, torch.Tensor)
    ref = reference_k_rows(
        k[stored], case["kw"], positions[stored], case["inv_freq"], 1e-6, 1 / s if fp8 else None
    ).to(rows_a.device)
    off_a, off_b = (float((rows != ref).float().mean()) for rows in (rows_a, rows_b))
    assert off_a < 0.01 and off_b < 0.01, (
        f"differ from the CPU reference: the q/k kernel in {off_a:.1%} of the elements, the "
        f"fused prologue in {off_b:.1%}"
    )
    assert_rotated_rows_close(rows_a, rows_b, fp8)
    assert out_b[3].abs().max() == 0 and out_a[3].abs().max() == 0  # the padding row
    tol = 0.05 if fp8 else 0.02
    assert (out_a.float() - out_b.float()).abs().max() < tol, (out_a - out_b).abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_decode_step_takes_the_fused_path_and_a_prefill_step_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PagedAttentionBackend.attend_fused on CUDA with LIVEMEET_FUSED_QK on: a decode-only
    step is fused, a step with prefill rows returns None (the caller normalises); with it
    off (the default), no step is."""
    from livemeet.engine import paged_backend
    from livemeet.engine.paged_backend import PagedAttentionBackend, StepMetadata
    from livemeet.layers.attention import QKNorms

    monkeypatch.setattr(paged_backend, "_fused_qk_setting", "1")

    torch.manual_seed(34)
    lens = [300, 5000]
    case = fused_case(False, lens)
    qkv = case["qkv"]
    assert isinstance(qkv, torch.Tensor)
    q, k, v = (qkv[:, a:b].view(2, -1, 128) for a, b in ((0, 2048), (2048, 3072), (3072, 4096)))
    meta = StepMetadata(
        case["slots"], case["tables"], case["lens"],
        torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda"), 1, max(lens), True,
    )  # fmt: skip
    norms = QKNorms(case["qw"], case["kw"], 1e-6)
    backend = PagedAttentionBackend([case["kc"]], [case["vc"]], meta)
    args = (q, k, v, norms, case["positions"], case["inv_freq"], 128**-0.5)
    out = backend.attend_fused(0, *args)
    assert out is not None and out.shape == (2, 16, 128)
    monkeypatch.setattr(paged_backend, "_fused_qk_setting", "0")
    off = PagedAttentionBackend([case["kc"]], [case["vc"]], meta)
    assert off.attend_fused(0, *args) is None
    monkeypatch.setattr(paged_backend, "_fused_qk_setting", "1")
    mixed = dataclasses.replace(meta, decode_only=False, num_decode_seqs=1)
    assert PagedAttentionBackend([case["kc"]], [case["vc"]], mixed).attend_fused(0, *args) is None
