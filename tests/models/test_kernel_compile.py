"""Every Triton kernel compiles for sm_90 at the real decoder's shapes, on a CPU-only machine.

The interpreter tests run the kernels' arithmetic; only the compiler checks their typing (a
rows kernel that rebound its q heads' [16, 64] block to the k heads' [8, 64] passed every
interpreter test and failed on the first GPU, session 21). tests/compile_kernels.py captures
the launches of the public entry points and compiles each variant with Triton's own ptxas;
two shards run side by side in processes without TRITON_INTERPRET.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from livemeet.layers import argmax, fused, linear, paged_attention_kernels
from tests.compile_kernels import NO_PDL_KERNELS

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARDS = 2  # the CI machine's cores
TIMEOUT_S = 480  # both shards together (~35 s on the 2-core CI machine)


def _ptxas() -> Path | None:
    try:
        import triton.backends.nvidia as nvidia
    except ImportError:
        return None
    path = Path(nvidia.__file__).parent / "bin" / "ptxas"
    return path if path.is_file() else None


needs_ptxas = pytest.mark.skipif(_ptxas() is None, reason="needs Triton's NVIDIA backend")


def _kernel_names() -> set[str]:
    """The `*_kernel` Triton functions of the kernel modules (jitted or interpreted)."""
    names = set()
    for module in (argmax, fused, linear, paged_attention_kernels):
        for name in dir(module):
            kind = type(getattr(module, name)).__name__
            if name.endswith("_kernel") and kind in ("JITFunction", "InterpretedFunction"):
                names.add(name)
    return names


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton's default, stated (it warns when unset)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.compile_kernels", "--shard", f"{i}/{SHARDS}"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(SHARDS)
    ]
    deadline = time.monotonic() + TIMEOUT_S
    results: list[dict[str, object]] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            assert proc.returncode in (0, 1), f"exited {proc.returncode}: {err[-3000:]}"
            assert rows, f"compile_kernels printed nothing: {err[-3000:]}"
            results.extend(rows)
    finally:
        for proc in procs:  # a shard past the deadline, or one left after a failed assert
            proc.kill()
            proc.wait()
    return results


@needs_ptxas
def test_every_kernel_variant_compiles_for_sm90(compiled: list[dict[str, object]]) -> None:
    failures = [f"{r['kernel']} {r['variant']}: {r['error']}" for r in compiled if not r["ok"]]
    assert not failures, "\n\n".join(failures)


@needs_ptxas
def test_every_kernel_is_covered(compiled: list[dict[str, object]]) -> None:
    covered = {str(r["kernel"]) for r in compiled if r["ok"]}
    missing = _kernel_names() - covered
    assert not missing, f"kernels without a compiled variant (add their entry points): {missing}"
    # the qk kernel in both forms; PDL on for every kernel taking it, off for decode attention
    assert {"_qk_norm_rope_kernel", "_qk_norm_rope_rows_kernel"} <= covered
    takes_pdl = {str(r["kernel"]) for r in compiled if r["pdl"] is not None}
    assert {str(r["kernel"]) for r in compiled if r["pdl"] is True} == takes_pdl
    assert {str(r["kernel"]) for r in compiled if r["pdl"] is False} == NO_PDL_KERNELS
    assert takes_pdl == {name for name in _kernel_names() if "PDL" in _params(name)}


@needs_ptxas
def test_the_qk_kernels_round_each_rope_product_before_the_sum(
    compiled: list[dict[str, object]],
) -> None:
    """The reference rounds x1 * cos and x2 * sin to bf16 before their sum; with fp
    contraction on, the q/k kernels compiled that to one bf16 fma of the unrounded x1 * cos,
    and 15.7 % of the k elements they stored were off the reference on an H100 (session 37).
    Their launch turns contraction off: no variant may hold a bf16 fma."""
    qk = [r for r in compiled if str(r["kernel"]).startswith("_qk_norm_rope")]
    assert qk and all(r["ok"] for r in qk)
    fused_fma = [str(r["kernel"]) for r in qk if r["bf16_fma"]]
    assert not fused_fma, f"{len(fused_fma)} of {len(qk)} variants: {sorted(set(fused_fma))}"


def _params(name: str) -> list[str]:
    for module in (argmax, fused, linear, paged_attention_kernels):
        if hasattr(module, name):
            kernel = getattr(module, name)
            return list(inspect.signature(kernel.fn).parameters)  # jitted or interpreted
    raise KeyError(name)
