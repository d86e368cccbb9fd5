"""Compile livemeet's Triton kernels for a CUDA GPU on a machine without one.

The CPU tests run the kernels under Triton's interpreter, which executes them as NumPy and
misses what only the compiler checks: a name rebound to another shape inside a branch, a
constexpr used as a tensor, a dtype a `tl.dot` refuses. This module calls the public kernel
entry points at the real model's shapes (MOSS-TD's Qwen3 decoder: hidden 1024, 16 query and
8 KV heads of 128, MLP 3072; livemeet.models.config) on CPU tensors with the launches
captured instead of run, then compiles each captured launch to a cubin for sm_90 (H100 /
H200) with the ptxas that Triton's wheel ships, specialized as Triton's launcher specializes
it on a GPU (`specialize`), and checks its shared memory against the block limit. Kernels
that take a `PDL` constexpr are compiled with it on, as an sm_90 launches them (CPU tensors
capture it off), and decode attention also with it off (NO_PDL_KERNELS).
Not covered: fp16 models.

Run it in a process where TRITON_INTERPRET is unset (kernels decorated under the interpreter
cannot be compiled): `python -m tests.compile_kernels [--shard I/N]` prints one JSON object per
compiled variant ({"kernel", "pdl", "variant", "ok", "error", "bf16_fma": whether its PTX
has a BF16_FMA}) of its shard and exits 1 if any
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
# bytes of shared memory one block may use on compute capability 9.0 (227 KiB; CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability")
SM90_MAX_SHARED_BYTES = 232_448
# kernels the engine launches with PDL off as well as on: decode attention over batches of
# more than DecodeKernelConfig.pdl_max_rows rows (every other kernel runs with it on an sm_90)
NO_PDL_KERNELS = frozenset({"_decode_split_kernel", "_decode_merge_kernel"})
# a bf16 multiply-add in one rounding: where a kernel's reference rounds a product to bf16
# before adding it, fp contraction has changed the result (fused.qk_norm_rope_store_kv's launch)
BF16_FMA = "fma.rn.bf16"


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


def _target() -> Any:
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", CUDA_ARCH, WARP_SIZE)


def specialize(launch: Launch, *, pdl: bool | None = None) -> tuple[Any, dict, dict, dict]:
    """(options, signature, constexprs, attrs) of `launch` as `JITFunction.run` derives them
    on an sm_90 GPU: Triton's own binder types and specializes every argument (dtypes,
    pointers aligned to 16 bytes, ints divisible by 16 or equal to 1), so the variant compiled
    here is the one a launch on the GPU compiles (cp.async pipelines, shared memory).
    `pdl` overrides the kernel's PDL constexpr and the matching launch option. Hazard: this
    reaches into Triton's runtime (`create_function_from_signature`, `_pack_args`, 3.9)."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    kwargs = dict(launch.kwargs)
    if pdl is not None:
        kwargs.update(PDL=pdl, launch_pdl=pdl)
    backend = make_backend(_target())
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    return fn._pack_args(backend, kwargs, bound, specialization, options)  # type: ignore[no-any-return]


def compile_launch(launch: Launch, *, pdl: bool | None = None) -> Any:
    """Compile `launch` for sm_90 and return the compiled kernel. Raises Triton's
    CompilationError (or ptxas's error), or ResourceError when the kernel needs more shared
    memory than a block may have (Triton checks that only when loading it on a GPU)."""
    import triton
    from triton.compiler import ASTSource

    options, sig, constexprs, attrs = specialize(launch, pdl=pdl)
    source = ASTSource(launch.kernel, sig, constexprs, attrs)
    kernel = triton.compile(source, target=_target(), options=options.__dict__)
    if kernel.metadata.shared > SM90_MAX_SHARED_BYTES:
        raise ResourceError(
            f"{kernel.metadata.shared} bytes of shared memory, over sm_90's {SM90_MAX_SHARED_BYTES}"
        )
    return kernel


class ResourceError(Exception):
    """A compiled kernel that cannot be launched on sm_90 (shared memory)."""


def variants(launches: list[Launch]) -> dict[tuple[str, str], tuple[Launch, bool | None]]:
    """Distinct variants of the launches by kernel, argument types, specializations,
    constexprs and options: with PDL on where the kernel takes a PDL constexpr, and off too
    for the kernels the engine also launches without it (NO_PDL_KERNELS); as captured
    otherwise (None)."""
    out: dict[tuple[str, str], tuple[Launch, bool | None]] = {}
    for launch in launches:
        settings: tuple[bool | None, ...] = (None,)
        if "PDL" in launch.kernel.arg_names:
            settings = (True, False) if launch.name in NO_PDL_KERNELS else (True,)
        names = launch.kernel.arg_names
        for pdl in settings:
            options, sig, constexprs, attrs = specialize(launch, pdl=pdl)
            named = {names[path[0]]: value for path, value in constexprs.items()}
            parts = (sig.items(), named.items(), attrs.items(), vars(options).items())
            key = repr([sorted(map(repr, part)) for part in parts])
            out[(launch.name, key)] = (launch, pdl)
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


def _known_good_kernel() -> Any:
    """The known-bad kernel with the shapes kept apart: it must compile to a cubin."""
    import triton
    import triton.language as tl

    @triton.jit
    def known_good_kernel(X, flag):
        lo = tl.zeros([16, 64], tl.float32)
        if flag > 0:
            lo = lo + 1.0
        tl.store(X + tl.arange(0, 64), tl.sum(lo, axis=0))

    return known_good_kernel


# ----------------------------------------------------------------------------------------------
# the entry points at the real decoder's shapes
# ----------------------------------------------------------------------------------------------

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 1024, 3072, 16, 8, 128
VOCAB = 151_936  # the tied LM head's rows (MODEL.md section 4)
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
        # the encoder's residual add + LayerNorm (its width is the decoder's hidden, 1024)
        fused.add_layer_norm(x, None, _bf16(HIDDEN), _bf16(HIDDEN), 1e-5, impl="triton")
        fused.add_layer_norm(x, x, _bf16(HIDDEN), _bf16(HIDDEN), 1e-5, impl="triton")
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
        # the default configuration per cache dtype: bf16 merges in its own kernel, FP8 in
        # the last split (MERGE_SEPARATE, MERGE_IN_LAST_SPLIT); the Triton kernel runs where
        # the CUDA one does not apply (cuda_variant), as on these CPU tensors
        config = pa.default_decode_config(dtype != torch.bfloat16)
        # the split and merge kernels compile per next_pow2(splits) (choose_num_splits: 64 for
        # one row at 36k of context, 8 for 8 rows at 20k): none, a few, the most
        for splits in (1, 4, 64):
            pa.paged_decode_attention(
                q, k_cache, v_cache, tables, seq_lens, scale, num_splits=splits,
                impl="triton", kernel=config,
            )  # fmt: skip
        # both tile heights (extend_tile_rows picks by the GPU's SM count: 1 on a CPU)
        for rows in (pa.EXTEND_ROWS, pa.EXTEND_ROWS_SMALL):
            q_len = 64
            cu = torch.arange(DECODE_ROWS + 1, dtype=torch.int32) * q_len
            pa.paged_extend_attention(
                _bf16(DECODE_ROWS * q_len, HEADS, HEAD_DIM), k_cache, v_cache, tables, cu,
                seq_lens, scale, max_seqlen_q=q_len, impl="triton",
                kernel=pa.ExtendKernelConfig(rows=rows),
            )  # fmt: skip


def _linear_calls() -> None:
    from livemeet.layers import linear

    for n, k in (
        (HIDDEN, HIDDEN),
        ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
        (HIDDEN, INTERMEDIATE),
        (VOCAB, HIDDEN),  # the LM head (tuned since session 46)
    ):
        weight = _bf16(n, k)
        for config in linear.ROW_CANDIDATES:
            linear.skinny_linear(_bf16(1, k), weight, config, impl="triton")
        for config in linear.DOT_CANDIDATES:
            linear.skinny_linear(_bf16(8, k), weight, config, impl="triton")
    x = _bf16(1, HIDDEN)
    for config in linear.ROW_CANDIDATES:  # the tuner times every one with each prologue
        linear.skinny_silu_linear(_bf16(1, 2 * INTERMEDIATE), _bf16(HIDDEN, INTERMEDIATE),
                                  config, impl="triton")  # fmt: skip
        for residual in (None, x):
            linear.skinny_norm_linear(x, residual, _bf16(HIDDEN), EPS,
                                      _bf16(2 * HIDDEN, HIDDEN), config, impl="triton")  # fmt: skip


def _sampling_calls() -> None:
    from livemeet.layers import argmax

    # the real vocabulary at one and 16 rows, bf16 and fp32 logits; one chunk past MAX_CHUNKS
    for rows, dtype in ((1, torch.bfloat16), (16, torch.bfloat16), (1, torch.float32)):
        argmax.greedy_argmax(torch.zeros(rows, VOCAB, dtype=dtype), impl="triton")
    argmax.greedy_argmax(_bf16(1, argmax.CHUNK_BLOCK * argmax.MAX_CHUNKS * 2), impl="triton")


ENTRY_POINTS: dict[str, Callable[[], None]] = {
    "fused": _fused_calls,
    "attention": _attention_calls,
    "linear": _linear_calls,
    "sampling": _sampling_calls,
}


def _self_check() -> str:
    """'' when the harness tells the known kernels apart: the bad one fails with Triton's
    CompilationError and the good one gives a cubin (flag 2: a 1 would be specialized away)."""
    from triton.compiler.errors import CompilationError

    args = (torch.zeros(64), 2)
    try:
        compile_launch(Launch(_known_bad_kernel(), args))
        return "the known-bad kernel compiled"
    except CompilationError:
        pass
    if not compile_launch(Launch(_known_good_kernel(), args)).asm.get("cubin"):
        return "the known-good kernel gave no cubin"
    return ""


def main(argv: list[str]) -> int:
    """Capture, then compile this shard's variants (module docstring); 0 when every one
    compiled and the self-check held, 1 otherwise, 2 under the interpreter."""
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
    if shard == 0 and (problem := _self_check()):
        print(json.dumps({"kernel": "self-check", "pdl": None, "variant": "", "ok": False,
                          "error": problem}), flush=True)  # fmt: skip
        failed += 1
    for (name, key), (launch, pdl) in sorted(variants(launches).items())[shard::shards]:
        error, ptx = "", ""
        try:
            ptx = compile_launch(launch, pdl=pdl).asm["ptx"]
        except Exception as exc:  # report every failure, then exit 1
            error = f"{type(exc).__name__}: {exc}"
            failed += 1
        row = {"kernel": name, "pdl": pdl, "variant": key, "ok": not error, "error": error,
               "bf16_fma": BF16_FMA in ptx}  # fmt: skip
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
