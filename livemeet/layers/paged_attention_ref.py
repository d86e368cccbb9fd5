"""Torch references of livemeet.layers.paged_attention's store-KV, decode and extend attention
(gather + SDPA, float32 math) over the same paged KV layout (that module's docstring): the
correctness oracles of the tests and the CPU path."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn value (OCP FP8 spec)


def ref_store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Reference of `store_kv`: write k, v [N, kv_heads, D] to their slots in place."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for new, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        flat = cache.view(-1, cache.shape[2], cache.shape[3])  # [num_blocks * block_size, H, D]
        flat[slots] = _quantize(new[keep], cache.dtype, scale)


def _quantize(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    if dtype == torch.float8_e4m3fn:
        return (x.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(dtype)
    return x.to(dtype)


def _gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, scale: float, dtype: torch.dtype
) -> torch.Tensor:
    """One sequence's keys or values: [seq_len, kv_heads, D] in `dtype`."""
    block_size = cache.shape[1]
    tokens = torch.arange(seq_len, device=cache.device)
    blocks = block_table[tokens // block_size].long()
    kv = cache[blocks, tokens % block_size]
    if cache.dtype == torch.float8_e4m3fn:
        return (kv.float() * scale).to(dtype)
    return kv.to(dtype)


def _ref_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, q_offset: int
) -> torch.Tensor:
    """q [n, H, D] (positions q_offset..q_offset+n-1) over k, v [L, Hkv, D], causal -> [n, H, D]."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    q_pos = torch.arange(q.shape[0], device=q.device) + q_offset
    k_pos = torch.arange(k.shape[0], device=q.device)
    mask = k_pos[None, :] <= q_pos[:, None]  # [n, L]
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1),
        k.float().transpose(0, 1),
        v.float().transpose(0, 1),
        attn_mask=mask,
        scale=scale,
    )
    return out.transpose(0, 1).to(q.dtype)


def ref_paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Reference of `paged_decode_attention` (float32 math). A sequence of length 0 gives zeros."""
    out = torch.zeros_like(q)
    for b, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        k = _gather_kv(k_cache, block_tables[b], seq_len, k_scale, q.dtype)
        v = _gather_kv(v_cache, block_tables[b], seq_len, v_scale, q.dtype)
        out[b] = _ref_attention(q[b : b + 1], k, v, scale, q_offset=seq_len - 1)[0]
    return out


def ref_paged_extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Reference of `paged_extend_attention` (float32 math)."""
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        if end == start:
            continue
        k = _gather_kv(k_cache, block_tables[b], seq_len, k_scale, q.dtype)
        v = _gather_kv(v_cache, block_tables[b], seq_len, v_scale, q.dtype)
        out[start:end] = _ref_attention(q[start:end], k, v, scale, q_offset=seq_len - (end - start))
    return out
