"""The paged-KV attention backend the decoder calls during one engine step.

Implements `livemeet.layers.attention.AttentionBackend` over the engine's KV pool: per layer a
`k_cache`/`v_cache` pair of [num_blocks, block_size, kv_heads, head_dim]. The fused decoder
path takes `kv_sink(layer)` and stores the step's new K/V in its q/k rotation kernel; otherwise
`attend` stores them through `slot_mapping`. `attend` then runs the split-K decode kernel when every
sequence has exactly one new token, else the causal extend kernel over the prefill chunks and,
in a mixed step, the split-K decode kernel over the decode rows that follow them (the extend
kernel walks a sequence's whole context in one program per KV head: a 30k-token decode row
became the step's tail; long c16 FP8 on an H200, docs/benchmarks.md session 10, call 1:
prefill steps with 15 decode rows ran the extend kernel at 173 TFLOP/s against 281 with
none). On the CPU both fall back to the torch references in
livemeet.layers.paged_attention_ref (gather + SDPA); on CUDA they never gather KV.

Every layer of a step attends with the same metadata, so the first `attend` of a step
resolves its launches (`StepAttention`: checks, kernel choice, grid, split-K buffers) and the
others only launch them over their own caches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from livemeet.errors import InternalError
from livemeet.layers import cuda_decode
from livemeet.layers.attention import QKNorms
from livemeet.layers.paged_attention import (
    DecodeLaunch,
    ExtendLaunch,
    KVSink,
    cuda_variant,
    store_kv,
)

# "0": attention stores K/V itself (store_kv) instead of handing out a sink; for side-by-side
# benchmarks of the fused store (read at import; captured graphs keep what they captured)
FUSED_KV_STORE_ENV = "LIVEMEET_FUSED_KV_STORE"
_fused_store = os.environ.get(FUSED_KV_STORE_ENV, "1") != "0"


# Decode-only steps may run the q/k RMSNorm, RoPE and K/V store in the decode kernel's
# prologue (`attend_fused`) instead of a kernel of their own ahead of it: "1" always, "0"
# never, unset (or "auto") with a bf16 KV cache only (`fuses_qk`). Its tests pass on an H100
# and an H200 (the k rows it stores equal the reference's in every element), bf16 parity as
# without it (top-1 1.000, greedy identical). Measured, arms on one loan (docs/benchmarks.md,
# sessions 37-38): bf16 long c1 85.4 audio-s/s against 84.5 / 84.4 off on an H100, 107.1
# against 104.4 on an H200, bf16 16 x 36k 16.74 ms against 16.98; but FP8 long c16 273.8
# against 277.2 off, its 16 x 36k graph 9.327 ms against 9.218 (the FP8 kernel's prologue
# costs 6 us a layer at batch 16, more than the separate kernel it replaces under PDL).
# Read at import, as LIVEMEET_FUSED_KV_STORE
FUSED_QK_ENV = "LIVEMEET_FUSED_QK"
_fused_qk_setting = os.environ.get(FUSED_QK_ENV, "auto")


def fuses_qk(kv_dtype: torch.dtype, setting: str | None = None) -> bool:
    """Whether decode steps over a KV cache of `kv_dtype` take the fused q/k prologue, by the
    LIVEMEET_FUSED_QK `setting` (default: the environment's, read at import): "0" never,
    "1" always, anything else where it measured faster, a bf16 cache (above)."""
    setting = _fused_qk_setting if setting is None else setting
    if setting in ("0", "1"):
        return setting == "1"
    return kv_dtype == torch.bfloat16


def fused_store_enabled() -> bool:
    """Whether kernels ahead of attention store K/V through a sink (read at call time)."""
    return _fused_store


@dataclass
class StepMetadata:
    """Per-step attention metadata (device tensors).

    slot_mapping: int64 [N] (slot = block * block_size + offset, -1 for padding rows);
    block_tables: int32 [B, max_blocks]; seq_lens: int32 [B] (cached + new tokens);
    cu_seqlens_q: int32 [B + 1]; max_seqlen_q: longest new-token count; max_seq_len: longest
    context; decode_only: every sequence has exactly one new token. num_decode_seqs: in a step
    that is not decode_only, how many sequences at the end are decode rows (one new token each,
    after every prefill chunk's rows), run by the decode kernel; num_splits: the decode kernel's
    split count (None: chosen from max_seq_len).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    max_seqlen_q: int
    max_seq_len: int
    decode_only: bool
    num_splits: int | None = None
    num_decode_seqs: int = 0


class PagedAttentionBackend:
    """AttentionBackend over paged KV for one forward (see module docstring)."""

    def __init__(
        self,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        meta: StepMetadata,
        *,
        kv_scale: float = 1.0,
    ) -> None:
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.meta = meta
        self.kv_scale = kv_scale
        self._plan: StepAttention | None = None
        self._fuses_qk: bool | None = None  # decided by the step's first `attend_fused`

    def kv_sink(self, layer: int) -> KVSink | None:
        """The layer's caches and this step's slots, for the kernel that rotates k to store
        k and v itself (then `attend` gets k = v = None); None when that is switched off."""
        if not _fused_store:
            return None
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        return KVSink(kc, vc, self.meta.slot_mapping, self.kv_scale)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Store k, v (unless both are None: a `kv_sink` user stored them), then attend; into
        `out` ([N, heads, D], contiguous in head_dim) when given. The first call of a step
        resolves its launches for every layer (`StepAttention`); every layer must then pass
        q of the same shape and the same scale."""
        m = self.meta
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        s = self.kv_scale
        if k is not None and v is not None:
            store_kv(k, v, kc, vc, m.slot_mapping, k_scale=s, v_scale=s)
        elif k is not None or v is not None or not _fused_store:
            # without a sink handed out, nothing would have stored this step's K/V
            raise InternalError("attend needs both k and v, or neither (stored through kv_sink)")
        plan = self._plan
        if plan is None:
            plan = self._plan = StepAttention(q, kc, vc, m, scale, s)
        elif scale != plan.scale:
            raise InternalError(f"layer {layer} attends with scale {scale}, not {plan.scale}")
        return plan(q, kc, vc, out)

    def attend_fused(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        norms: QKNorms,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        scale: float,
    ) -> torch.Tensor | None:
        """A decode-only step on the CUDA kernel: attention of the raw q [B, heads, 128] (the
        qkv projection's view) over the layer's caches, the kernel's prologue doing the q/k
        RMSNorm and RoPE and storing k and v [B, kv_heads, 128] (raw too) at the step's slots
        (`cuda_decode.FusedQK`): one kernel a layer fewer. Returns the output [B, heads, 128],
        or None where the step cannot (a step with prefill rows, the CPU, the Triton kernel,
        tensors the kernel's loads cannot take) or may not (LIVEMEET_FUSED_QK=0): the caller
        then normalises, rotates and calls `attend`. The step's
        first call decides for all its layers."""
        m = self.meta
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        fits = cuda_decode.FusedQKLayer(k, v, norms.q_weight, norms.k_weight)
        if self._fuses_qk is None:
            self._fuses_qk = self._can_fuse(q, kc, vc, fits, positions, inv_freq)
            if self._fuses_qk:
                step = cuda_decode.FusedQK(
                    positions, inv_freq, m.slot_mapping, norms.eps, 1.0 / self.kv_scale
                )
                self._plan = StepAttention(q, kc, vc, m, scale, self.kv_scale, fused=step)
        if not self._fuses_qk:
            return None
        plan = self._plan
        assert plan is not None
        if scale != plan.scale or not fits.fits():
            raise InternalError(f"layer {layer} does not fit the step's fused q/k decode")
        return plan(q, kc, vc, None, fits)

    def _can_fuse(
        self,
        q: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        layer: cuda_decode.FusedQKLayer,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
    ) -> bool:
        m = self.meta
        if not (_fused_store and m.decode_only and q.is_cuda and q.dim() == 3):
            return False
        if not fuses_qk(kc.dtype):
            return False
        group = q.shape[1] // max(1, kc.shape[2])
        if not cuda_decode.supported(q.dtype, kc, group) or not layer.fits():
            return False
        variant = cuda_variant(q.dtype, kc, group, None)
        if variant is None or not cuda_decode.layout_supported(q, kc, vc, q):
            return False
        try:
            cuda_decode.FusedQK(positions, inv_freq, m.slot_mapping, 0.0, 1.0).check(q.shape[0])
        except InternalError:
            return False
        fused = replace(variant, fused_qk=True)
        return cuda_decode.usable(fused, cuda_decode.device_index(kc))


class StepAttention:
    """One step's attention launches, resolved at its first layer and run for every layer
    (`DecodeLaunch`, `ExtendLaunch`): the split-K decode kernel when every sequence has one new
    token, else the extend kernel over the prefill chunks and, in a mixed step, the decode
    kernel over the decode rows after them (module docstring). The CUDA kernel merges its own
    splits (both dtypes' default since session 39; mixed steps, which launch eagerly, were
    given it before: a merge kernel's launch costs the host more than the in-kernel merge
    costs the GPU)."""

    def __init__(
        self,
        q: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        meta: StepMetadata,
        scale: float,
        kv_scale: float,
        fused: cuda_decode.FusedQK | None = None,
    ) -> None:
        m, s = meta, kv_scale
        self.scale = scale
        self.decode: DecodeLaunch | None = None
        self.extend: ExtendLaunch | None = None
        self.num_prefill_rows = q.shape[0]  # rows before the decode rows
        if m.decode_only:
            self.decode = DecodeLaunch(
                q, kc, vc, m.block_tables, m.seq_lens, scale,
                num_splits=m.num_splits, max_seq_len=m.max_seq_len, k_scale=s, v_scale=s,
                fused=fused,
            )  # fmt: skip
            self.num_prefill_rows = 0
            return
        if fused is not None:
            raise InternalError("fused q/k is for decode-only steps")
        d = m.num_decode_seqs
        p = m.seq_lens.shape[0] - d  # prefill sequences: their rows come first
        t = q.shape[0] - d  # rows of the prefill chunks
        if p < 1 or t < p:
            raise InternalError(f"a mixed step of {q.shape[0]} rows cannot end in {d} decode rows")
        self.num_prefill_rows = t
        self.extend = ExtendLaunch(
            q[:t], kc, vc, m.block_tables[:p], m.cu_seqlens_q[: p + 1], m.seq_lens[:p], scale,
            max_seqlen_q=m.max_seqlen_q, k_scale=s, v_scale=s,
        )  # fmt: skip
        if d:  # the dtype's default configuration: the CUDA kernel merges its own splits
            self.decode = DecodeLaunch(
                q[t:], kc, vc, m.block_tables[p:], m.seq_lens[p:], scale,
                num_splits=m.num_splits,  # the decode rows' own (ModelRunner); None on the CPU
                k_scale=s, v_scale=s,
            )  # fmt: skip
        self._views: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._views_of: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(
        self,
        q: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        out: torch.Tensor | None,
        layer: cuda_decode.FusedQKLayer | None = None,
    ) -> torch.Tensor:
        """Attention of q over one layer's caches, into `out` or a new tensor; returns it
        (`layer`: a fused q/k decode's raw k, v and norms)."""
        if self.extend is None:
            assert self.decode is not None
            return self.decode(q, kc, vc, out, layer)
        if self.decode is None:
            return self.extend(q, kc, vc, out)
        out = torch.empty_like(q) if out is None else out
        q_ext, q_dec, out_ext, out_dec = self._split(q, out)
        self.extend(q_ext, kc, vc, out_ext)
        self.decode(q_dec, kc, vc, out_dec)
        return out

    def _split(
        self, q: torch.Tensor, out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q's prefill rows, q's decode rows, the same of out); the views are kept while the
        layers pass the same q and out tensors (the piecewise runner's static buffers)."""
        views_of = self._views_of
        if self._views is not None and views_of is not None:
            if views_of[0] is q and views_of[1] is out:
                return self._views
        t = self.num_prefill_rows
        self._views = (q[:t], q[t:], out[:t], out[t:])
        self._views_of = (q, out)
        return self._views
