"""Compile livemeet's Triton kernels for a CUDA GPU on a machine without one.

The CPU tests run the kernels under Triton's interpreter, which executes them as NumPy and
misses what only the compiler checks: a name rebound to another shape inside a branch, a
constexpr used as a tensor, a dtype a `tl.dot` refuses. This module calls the public kernel
entry points at the real model's shapes (MOSS-TD's Qwen3 decoder: hidden 1024, 16 query and
8 KV heads of 128, MLP 3072; livemeet.models.config) on CPU tensors with the launches
captured instead of run, then compiles each captured launch to a cubin for sm_90 (H100 /
H200) with the ptxas that Triton's wheel ships. Kernels that take a `PDL` constexpr are
compiled with PDL=True, as an sm_90 GPU launches them (CPU tensors capture PDL=False, which
only drops the grid-dependency calls).

Run it in a process where TRITON_INTERPRET is unset (kernels decorated under the interpreter
cannot be compiled): `python -m tests.compile_kernels [--shard I/N]` prints one JSON object per
compiled variant ({"kernel", "variant", "ok", "error"}) of its shard and exits 1 if any
failed, or if a kernel known to be wrong compiled (the harness itself checked).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

CUDA_ARCH = 90  # H100 / H200 (sm_90), the GPUs livemeet is benchmarked on
WARP_SIZE = 32
# options of CUDAOptions that a launch may pass beside the kernel's arguments
COMPILE_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl")

_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "i1",
}


@dataclass
class Launch:
    """One captured `kernel[grid](*args, **kwargs)`."""

    kernel: Any  # triton.runtime.jit.JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


@contextmanager
def captured_launches() -> Iterator[list[Launch]]:
    """Within the block, `kernel[grid](...)` records a Launch instead of running."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []
    original = JITFunction.__getitem__

    def capture(self: Any, grid: object) -> Callable[..., None]:
        return lambda *args, **kwargs: launches.append(Launch(self, args, kwargs))

    JITFunction.__getitem__ = capture  # type: ignore[method-assign]
    try:
        yield launches
    finally:
        JITFunction.__getitem__ = original  # type: ignore[method-assign]


def _arg_type(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def signature(launch: Launch) -> tuple[dict[str, str], dict[str, object], dict[str, object]]:
    """(signature, constexprs, compile options) of a captured launch."""
    fn = launch.kernel
    values = dict(zip(fn.arg_names, launch.args, strict=False))
    values.update({k: v for k, v in launch.kwargs.items() if k in fn.arg_names})
    sig: dict[str, str] = {}
    constexprs: dict[str, object] = {}
    for param in fn.params:
        value = values[param.name]
        if param.is_constexpr or value is None:
            sig[param.name] = "constexpr"
            constexprs[param.name] = value
        else:
            sig[param.name] = _arg_type(value)
    options = {k: launch.kwargs[k] for k in COMPILE_OPTIONS if k in launch.kwargs}
    return sig, constexprs, options


def compile_launch(launch: Launch, *, pdl: bool | None = None) -> None:
    """Compile `launch` for sm_90 (raises Triton's CompilationError, or ptxas's error); `pdl`
    overrides its PDL constexpr and the matching launch option."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, constexprs, options = signature(launch)
    if pdl is not None:
        constexprs["PDL"] = pdl
        options["launch_pdl"] = pdl
    source = ASTSource(launch.kernel, sig, constexprs)
    triton.compile(source, target=GPUTarget("cuda", CUDA_ARCH, WARP_SIZE), options=options)


def variants(launches: list[Launch]) -> dict[tuple[str, str], tuple[Launch, bool | None]]:
    """Distinct (kernel, constexprs + options) variants of the launches, with PDL=True where
    the kernel takes a PDL constexpr (None: it takes none)."""
    out: dict[tuple[str, str], tuple[Launch, bool | None]] = {}
    for launch in launches:
        _, constexprs, options = signature(launch)
        pdl = True if "PDL" in constexprs else None
        key = {**constexprs, **options, **({"PDL": pdl} if pdl else {})}
        out[(launch.name, repr(sorted(key.items())))] = (launch, pdl)
    return out


def _known_bad_kernel() -> Any:
    """A kernel with the fault the interpreter lets through (a name bound to a [16, 64] block
    rebound to [8, 64] inside a branch): the harness must report it."""
    import triton
    import triton.language as tl

    @triton.jit
    def known_bad_kernel(X, flag):
        lo = tl.zeros([16, 64], tl.float32)
        if flag > 0:
            lo = tl.zeros([8, 64], tl.float32)
        tl.store(X + tl.arange(0, 64), tl.sum(lo, axis=0))

    return known_bad_kernel


# ----------------------------------------------------------------------------------------------
# the entry points at the real decoder's shapes
# ----------------------------------------------------------------------------------------------

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 1024, 3072, 16, 8, 128
EPS = 1e-6
DECODE_ROWS = 4  # a decode batch (the per-(row, head) qk kernel)
PREFILL_ROWS = 300  # a prefill piece (the per-row qk kernel: QK_ROWS_KERNEL_MIN_ROWS)
NUM_BLOCKS, BLOCKS_PER_SEQ = 64, 16


def _bf16(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bfloat16)


def _caches(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    from livemeet.audio.constants import KV_BLOCK_SIZE

    shape = (NUM_BLOCKS, KV_BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def _fused_calls() -> None:
    from livemeet.layers import fused
    from livemeet.layers.paged_attention import KVSink

    for rows in (DECODE_ROWS, PREFILL_ROWS):
        x = _bf16(rows, HIDDEN)
        fused.fused_add_rms_norm(x, None, _bf16(HIDDEN), EPS, impl="triton")
        fused.fused_add_rms_norm(x, x, _bf16(HIDDEN), EPS, impl="triton")
        fused.silu_and_mul(_bf16(rows, 2 * INTERMEDIATE), impl="triton")
        qkv = _bf16(rows, HEADS + 2 * KV_HEADS, HEAD_DIM)  # the fused projection's output
        q, k, v = qkv.split([HEADS, KV_HEADS, KV_HEADS], dim=1)
        positions = torch.arange(rows, dtype=torch.int64)
        inv_freq = torch.ones(HEAD_DIM // 2, dtype=torch.float32)
        w = _bf16(HEAD_DIM)
        fused.qk_norm_rope(q, k, w, w, EPS, positions, inv_freq, impl="triton")
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            k_cache, v_cache = _caches(dtype)
            sink = KVSink(k_cache, v_cache, positions, 1.0)
            fused.qk_norm_rope_store_kv(q, k, v, w, w, EPS, positions, inv_freq, sink,
                                        impl="triton")  # fmt: skip


def _attention_calls() -> None:
    from livemeet.audio.constants import KV_BLOCK_SIZE
    from livemeet.layers import paged_attention as pa

    scale = HEAD_DIM**-0.5
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        k_cache, v_cache = _caches(dtype)
        kv = _bf16(DECODE_ROWS, KV_HEADS, HEAD_DIM)
        pa.store_kv(kv, kv, k_cache, v_cache, torch.arange(DECODE_ROWS), impl="triton")
        tables = torch.arange(DECODE_ROWS * BLOCKS_PER_SEQ, dtype=torch.int32)
        tables = tables.view(DECODE_ROWS, BLOCKS_PER_SEQ) % NUM_BLOCKS
        seq_lens = torch.full((DECODE_ROWS,), BLOCKS_PER_SEQ * KV_BLOCK_SIZE, dtype=torch.int32)
        q = _bf16(DECODE_ROWS, HEADS, HEAD_DIM)
        triton_configs = [
            pa.DecodeKernelConfig(backend="triton", merge_in_kernel=merge)
            for merge in (False, True)
        ]
        for config in (pa.default_decode_config(dtype != torch.bfloat16), *triton_configs):
            for splits in (1, 4):
                pa.paged_decode_attention(
                    q, k_cache, v_cache, tables, seq_lens, scale, num_splits=splits,
                    impl="triton", kernel=config,
                )  # fmt: skip
        for q_len in (1, 64, 512):  # small and large extend tiles
            cu = torch.arange(DECODE_ROWS + 1, dtype=torch.int32) * q_len
            pa.paged_extend_attention(_bf16(DECODE_ROWS * q_len, HEADS, HEAD_DIM), k_cache,
                                      v_cache, tables, cu, seq_lens, scale, max_seqlen_q=q_len,
                                      impl="triton")  # fmt: skip


def _linear_calls() -> None:
    from livemeet.layers import linear

    for n, k in (
        (HIDDEN, HIDDEN),
        ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
        (HIDDEN, INTERMEDIATE),
    ):
        weight = _bf16(n, k)
        for config in linear.ROW_CANDIDATES:
            linear.skinny_linear(_bf16(1, k), weight, config, impl="triton")
        for config in linear.DOT_CANDIDATES:
            linear.skinny_linear(_bf16(8, k), weight, config, impl="triton")
    config = linear.ROW_CANDIDATES[0]
    linear.skinny_silu_linear(_bf16(1, 2 * INTERMEDIATE), _bf16(HIDDEN, INTERMEDIATE), config,
                              impl="triton")  # fmt: skip
    x = _bf16(1, HIDDEN)
    for residual in (None, x):
        linear.skinny_norm_linear(x, residual, _bf16(HIDDEN), EPS, _bf16(2 * HIDDEN, HIDDEN),
                                  config, impl="triton")  # fmt: skip


ENTRY_POINTS: dict[str, Callable[[], None]] = {
    "fused": _fused_calls,
    "attention": _attention_calls,
    "linear": _linear_calls,
}


def _self_check() -> bool:
    """Whether the known-bad kernel fails to compile, as it must."""
    bad = Launch(_known_bad_kernel(), (torch.zeros(64), 1))
    try:
        compile_launch(bad)
    except Exception:  # noqa: BLE001 (any compile error is the expected outcome)
        return True
    return False


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    shard, shards = 0, 1
    if argv[:1] == ["--shard"]:
        shard, shards = (int(part) for part in argv[1].split("/"))
    with captured_launches() as launches:
        for entry in ENTRY_POINTS.values():
            entry()
    failed = 0
    if shard == 0 and not _self_check():
        print(json.dumps({"kernel": "known_bad_kernel", "variant": "", "ok": False,
                          "error": "compiled, but it must not"}), flush=True)  # fmt: skip
        failed += 1
    for (name, key), (launch, pdl) in sorted(variants(launches).items())[shard::shards]:
        error = ""
        try:
            compile_launch(launch, pdl=pdl)
        except Exception as exc:  # report every failure, then exit 1
            error = f"{type(exc).__name__}: {exc}"
            failed += 1
        print(json.dumps({"kernel": name, "variant": key, "ok": not error, "error": error}),
              flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
