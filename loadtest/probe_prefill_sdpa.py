"""Probe: prefill attention through torch's SDPA kernels against the extend kernel, on a GPU.

Question: would the prefill of long prompts be faster through a library attention kernel over
the chunk's KV gathered out of the paged cache (and, for an FP8 cache, converted to bf16 on the
way) than through the Triton extend kernel (`paged_extend_attention`, ~280-370 TFLOP/s bf16 on
an H200, ~20 % less over e4m3: docs/benchmarks.md, sessions 10 and 24)? Prefill is ~0.48 s of
long c1 bf16's ~20.5 s and ~8.4 s of FP8 long c16's ~123 s, the two targets still short.

For each KV dtype and chunk shape of `sweep_extend_kernel.SHAPES` with one sequence, one
layer (16 query heads, 8 KV heads, head_dim 128), times:
- `extend`: the extend kernel (the engine's path);
- `gather`: copying the sequence's K and V blocks into contiguous [1, 8, L, 128] bf16 tensors
  (times the k/v scale for e4m3), which every SDPA form below needs first;
- `flash`, `efficient`: SDPA with `causal_lower_right(n, L)` (queries aligned to the last keys,
  as a chunk after a cached prefix), on that backend only;
- `cudnn2`: cuDNN's SDPA in two calls merged by their log-sum-exp (the chunk over the prefix
  without a mask, then over itself with the square causal mask, which cuDNN aligns top-left),
  through `torch.ops.aten._scaled_dot_product_cudnn_attention` (a private op: a probe only);
- `cudnn2-fold`: the same with each KV head's query heads folded into the query length of the
  prefix call (no mask there), so the prefix's keys and values are not repeated per query head.
Each form's output is compared with the extend kernel's (max |delta|). TFLOP/s counts only the
causal (query, key) pairs, as `sweep_extend_kernel` does; a form's "+gather" time adds the copy.

Usage: python -m loadtest.probe_prefill_sdpa [--json out.json] [--max-seconds 120]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from livemeet.layers import paged_attention as pa
from loadtest.bench_decode_step import device_ms
from loadtest.sweep_extend_kernel import HEAD_DIM, SHAPES, make_step, pair_flop

ITERS = 8


@dataclass(frozen=True)
class Row:
    """One timed (KV dtype, shape, form): device ms per layer call, and against the extend
    kernel's output."""

    kv_dtype: str
    shape: str
    form: str
    ms: float
    tflop_per_s: float
    max_abs_delta: float
    error: str = ""


def gather(step: dict[str, object]) -> tuple[torch.Tensor, torch.Tensor]:
    """The one sequence's keys and values, contiguous: two [1, KV_HEADS, L, HEAD_DIM] bf16."""
    k_cache, v_cache = step["k_cache"], step["v_cache"]
    assert isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor)
    seq_len = int(step["seq_lens"][0])  # type: ignore[index]
    block = k_cache.shape[1]
    table = step["block_tables"][0, : -(-seq_len // block)].long()  # type: ignore[index]

    def one(cache: torch.Tensor, scale: float) -> torch.Tensor:
        x = cache.index_select(0, table).flatten(0, 1)[:seq_len]  # [L, KV_HEADS, D]
        x = x.to(torch.bfloat16) if scale == 1.0 else (x.float() * scale).to(torch.bfloat16)
        return x.transpose(0, 1).unsqueeze(0)  # [1, KV_HEADS, L, D]: a view, strided

    return one(k_cache, float(step["k_scale"])), one(v_cache, float(step["v_scale"]))  # type: ignore[arg-type]


def sdpa_lower_right(backend: SDPBackend) -> Callable[..., torch.Tensor]:
    """A form over q [1, H, n, D] and k, v [1, KV heads, L, D] (L >= n) on `backend` only:
    SDPA with `causal_lower_right(n, L)`, the KV heads repeated to H. Raises RuntimeError
    where the backend cannot take the inputs (the probe records it)."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        n, length = q.shape[2], k.shape[2]
        heads = q.shape[1]
        # CausalBias dispatch takes no enable_gqa: the KV heads repeated to the query heads
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=causal_lower_right(n, length), scale=scale
            )

    return run


_cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention


def _merge(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> torch.Tensor:
    """Two attention outputs [1, H, n, D] over disjoint keys, by their log-sum-exps [1, H, n]."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    out = (o1.float() * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None]
    return out.to(o1.dtype)


def cudnn_two_part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The chunk over its prefix (no mask) and over itself (square causal), merged by LSE."""
    n, length = q.shape[2], k.shape[2]
    prefix = length - n
    heads = q.shape[1]
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    own: tuple[torch.Tensor, ...] = _cudnn(
        q, k[:, :, prefix:], v[:, :, prefix:], None, True, 0.0, True, False, scale=scale
    )
    if prefix == 0:
        return own[0]
    pre: tuple[torch.Tensor, ...] = _cudnn(
        q, k[:, :, :prefix], v[:, :, :prefix], None, True, 0.0, False, False, scale=scale
    )
    shape = q.shape[:3]
    return _merge(pre[0], pre[1].reshape(shape), own[0], own[1].reshape(shape))


def cudnn_folded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """As `cudnn_two_part`, but the prefix call reads each KV head once: with no mask there, a
    KV head's group of query heads is folded into its query length ([1, 8, group * n, D]);
    only the chunk's own keys are repeated to the query heads."""
    b, heads, n, d = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    group, prefix = heads // kv_heads, length - n
    k_own = k[:, :, prefix:].repeat_interleave(group, dim=1)
    v_own = v[:, :, prefix:].repeat_interleave(group, dim=1)
    own: tuple[torch.Tensor, ...] = _cudnn(
        q, k_own, v_own, None, True, 0.0, True, False, scale=scale
    )
    if prefix == 0:
        return own[0]
    folded = q.reshape(b, kv_heads, group * n, d)  # head kvh * group + g -> rows g * n + i
    pre: tuple[torch.Tensor, ...] = _cudnn(
        folded, k[:, :, :prefix], v[:, :, :prefix], None, True, 0.0, False, False, scale=scale
    )
    o1, lse1 = pre[0].reshape(b, heads, n, d), pre[1].reshape(b, heads, n)
    return _merge(o1, lse1, own[0], own[1].reshape(b, heads, n))


FORMS: dict[str, Callable[..., torch.Tensor]] = {
    "flash": sdpa_lower_right(SDPBackend.FLASH_ATTENTION),
    "efficient": sdpa_lower_right(SDPBackend.EFFICIENT_ATTENTION),
    "cudnn2": cudnn_two_part,
    "cudnn2-fold": cudnn_folded,
}


def probe_shape(name: str, shape: str, fp8: bool) -> list[Row]:
    """Every form at one shape of SHAPES over a bf16 (or, with `fp8`, e4m3) cache."""
    chunks = SHAPES[shape]
    scale = HEAD_DIM**-0.5
    step = make_step(chunks, fp8)
    flop = pair_flop(chunks)

    def extend() -> torch.Tensor:
        return pa.paged_extend_attention(scale=scale, **step)  # type: ignore[arg-type]

    ref = extend()
    ms = device_ms(extend, ITERS)
    rows = [Row(name, shape, "extend", ms, flop / ms / 1e9, 0.0)]
    rows.append(Row(name, shape, "gather", device_ms(lambda: gather(step), ITERS), 0.0, 0.0))
    k, v = (x.contiguous() for x in gather(step))
    q_tokens = step["q"]
    assert isinstance(q_tokens, torch.Tensor)
    q = q_tokens.transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    for form, fn in FORMS.items():

        def call(f: Callable[..., torch.Tensor] = fn) -> torch.Tensor:
            return f(q, k, v, scale)

        try:
            out = call()
            delta = (out[0].transpose(0, 1).float() - ref.float()).abs().max().item()
            ms = device_ms(call, ITERS)
            rows.append(Row(name, shape, form, ms, flop / ms / 1e9, delta))
        except (RuntimeError, TypeError, ValueError) as exc:
            rows.append(Row(name, shape, form, 0.0, 0.0, 0.0, str(exc)[:160]))
    return rows


def report(rows: list[Row]) -> None:
    """Print one line per row: ms and TFLOP/s, a form's TFLOP/s with its shape's gather time
    added, and its max |delta| against the extend kernel (or its error)."""
    gather_ms = {(r.kv_dtype, r.shape): r.ms for r in rows if r.form == "gather"}
    for r in rows:
        line = f"{r.kv_dtype} {r.shape:5s} {r.form:11s} {r.ms:8.3f} ms {r.tflop_per_s:6.1f} TFLOP/s"
        if r.form not in ("extend", "gather") and r.tflop_per_s:
            with_gather = r.tflop_per_s * r.ms / (r.ms + gather_ms[r.kv_dtype, r.shape])
            line += f" ({with_gather:6.1f} with the gather)"
        line += f" error: {r.error}" if r.error else f" delta {r.max_abs_delta:.3g}"
        print(line, flush=True)


def probe(fp8: bool, deadline: float) -> list[Row]:
    """Every form at every one-sequence shape of SHAPES until `deadline` (monotonic s)."""
    rows: list[Row] = []
    name = "fp8_e4m3" if fp8 else "bf16"
    for shape, chunks in SHAPES.items():
        if len(chunks) != 1:
            continue  # one sequence: SDPA's batch has no varlen
        if time.monotonic() > deadline:
            print(f"{name}: out of time at {shape}", flush=True)
            break
        shape_rows = probe_shape(name, shape, fp8)
        report(shape_rows)
        rows += shape_rows
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    """Probe bf16 then e4m3 caches (half of --max-seconds each) and write every row to --json."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default="probe_prefill_sdpa.json")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    cudnn = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    print(f"torch {torch.__version__}, cuDNN {cudnn}, {torch.cuda.get_device_name()}", flush=True)
    deadline = time.monotonic() + args.max_seconds
    rows = probe(False, deadline - args.max_seconds / 2) + probe(True, deadline)
    with open(args.json, "w") as f:
        json.dump([asdict(r) for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
