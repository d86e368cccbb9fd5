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
none). On the CPU both fall back to the torch references in livemeet.layers.paged_attention
(gather + SDPA); on CUDA they never gather KV.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from livemeet.errors import InternalError
from livemeet.layers.paged_attention import (
    KVSink,
    paged_decode_attention,
    paged_extend_attention,
    store_kv,
)

# "0": attention stores K/V itself (store_kv) instead of handing out a sink; for side-by-side
# benchmarks of the fused store (read at import; captured graphs keep what they captured)
FUSED_KV_STORE_ENV = "LIVEMEET_FUSED_KV_STORE"
_fused_store = os.environ.get(FUSED_KV_STORE_ENV, "1") != "0"


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
    ) -> torch.Tensor:
        """Store k, v (unless both are None: a `kv_sink` user stored them), then attend."""
        m = self.meta
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        s = self.kv_scale
        if k is not None and v is not None:
            store_kv(k, v, kc, vc, m.slot_mapping, k_scale=s, v_scale=s)
        elif k is not None or v is not None or not _fused_store:
            # without a sink handed out, nothing would have stored this step's K/V
            raise InternalError("attend needs both k and v, or neither (stored through kv_sink)")
        if m.decode_only:
            return paged_decode_attention(
                q,
                kc,
                vc,
                m.block_tables,
                m.seq_lens,
                scale,
                num_splits=m.num_splits,
                max_seq_len=m.max_seq_len,
                k_scale=s,
                v_scale=s,
            )
        if not m.num_decode_seqs:
            return paged_extend_attention(
                q,
                kc,
                vc,
                m.block_tables,
                m.cu_seqlens_q,
                m.seq_lens,
                scale,
                max_seqlen_q=m.max_seqlen_q,
                k_scale=s,
                v_scale=s,
            )
        return self._mixed(q, kc, vc, scale)

    def _mixed(
        self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """A step of prefill chunks followed by decode rows: the extend kernel over the chunks'
        rows, the decode kernel over the last `num_decode_seqs` rows, into one output."""
        m, s = self.meta, self.kv_scale
        d = m.num_decode_seqs
        p = m.seq_lens.shape[0] - d  # prefill sequences: their rows come first
        t = q.shape[0] - d  # rows of the prefill chunks
        if p < 1 or t < p:
            raise InternalError(f"a mixed step of {q.shape[0]} rows cannot end in {d} decode rows")
        out = torch.empty_like(q)
        paged_extend_attention(
            q[:t],
            kc,
            vc,
            m.block_tables[:p],
            m.cu_seqlens_q[: p + 1],
            m.seq_lens[:p],
            scale,
            max_seqlen_q=m.max_seqlen_q,
            k_scale=s,
            v_scale=s,
            out=out[:t],
        )
        paged_decode_attention(
            q[t:],
            kc,
            vc,
            m.block_tables[p:],
            m.seq_lens[p:],
            scale,
            num_splits=m.num_splits,  # the decode rows' own (ModelRunner); None on the CPU
            k_scale=s,
            v_scale=s,
            out=out[t:],
        )
        return out
