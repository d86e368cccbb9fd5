"""The CUDA decode kernel's host side (livemeet.layers.cuda_decode) on a CPU-only machine, and
its source through nvcc where the CUDA toolkit is installed (the kernel itself runs only in
the `gpu`-marked tests of test_paged_attention.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from livemeet.errors import ConfigError
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
