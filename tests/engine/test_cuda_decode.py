"""The CUDA decode kernel's host side (livemeet.layers.cuda_decode) on a CPU-only machine, and
its source through nvcc where the CUDA toolkit is installed (the kernel itself runs only in
the `gpu`-marked tests of test_paged_attention.py)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
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
    first = (*range(1, 9), 0.5, 2.0, *range(10, 17), 2, 64, 0)
    params = args.fill(*first)
    addresses = list(params)
    assert read_params(params) == [*first[:-1], None]  # a null c_void_p reads as None
    second = (*range(101, 109), -1.25, 3.0, *range(-7, 0), 8, 3, 0xDEAD00)
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
    assert seen["params"] == expected


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
        assert got[14:] == [caches[0].stride(0), caches[0].stride(1), 3, 2, 4, None]
    other = torch.zeros(7, page, kv_heads, 128, dtype=torch.bfloat16)
    assert not prepared.accepts(qs[0], other, caches[1], outs[0])
    misaligned = torch.zeros(batch * heads * 128 + 1, dtype=torch.bfloat16)[1:].view(
        batch, heads, 128
    )
    assert not prepared.accepts(misaligned, caches[0], caches[1], outs[0])
    with pytest.raises(InternalError, match="do not suit"):
        prepared(misaligned, caches[0], caches[1], outs[0])
    assert len(fake_driver) == 2
