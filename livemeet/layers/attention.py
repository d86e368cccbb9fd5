"""The attention-backend interface the Qwen3 decoder calls, and a dense reference backend.

Interface (what a paged engine implements)
------------------------------------------
A decoder forward runs on a flat, ragged batch: the new tokens of B requests concatenated,
N = sum(n_i) rows, with their absolute positions. The model never sees a cache. Before the
forward the caller builds one backend object for this step, which knows, per request i, how
many new tokens it has (`cu_seqlens_q`, [B+1], cumulative, starting at 0) and where its
cached prefix lives. Every decoder layer then calls

    out = attn.attend(layer, q, k, v, scale)
        layer: int in [0, num_layers)
        q: [N, num_heads, head_dim]     already q-normed and rotated (RoPE at `positions`)
        k: [N, num_kv_heads, head_dim]  already k-normed and rotated
        v: [N, num_kv_heads, head_dim]
        scale: float                    softmax scale (head_dim ** -0.5)
        returns [N, num_heads, head_dim], same dtype as q

and the backend must (1) store k/v of the new tokens into request i's cache for `layer`,
right after its `context_len_i - n_i` already-cached tokens, and (2) return causal attention of
each new query over that request's cached prefix plus the new tokens up to and including
itself (query j of request i sees cache slots [0, context_len_i - n_i + j]). GQA: query head h
reads kv head h // (num_heads // num_kv_heads). Requests never see each other.
`attend` is called once per layer, in layer order, within one forward; bookkeeping that must
happen once per step (advancing lengths, block tables) is the caller's, before or after.

A paged backend may also hand out `kv_sink(layer)`: the layer's caches and the rows' slots, so
that the kernel that rotates k writes k and v into the cache itself (one kernel fewer per
layer). A caller that used the sink then calls `attend(layer, q, None, None, scale)`: (1) is
done. A backend without one returns None, and the caller passes k and v.

`DenseKVCache` + `DenseAttention` are the CPU/GPU reference: one contiguous K/V buffer per
request and layer, and `torch.nn.functional.scaled_dot_product_attention` per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # paged_attention pulls in Triton; the dense path needs only the name
    from livemeet.layers.paged_attention import KVSink


@dataclass(frozen=True)
class QKNorms:
    """A layer's per-head q and k RMSNorm weights ([head_dim], the model's dtype) and eps."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float


class AttentionBackend(Protocol):
    """Stores the new K/V and attends causally over each request's cache (see module doc)."""

    def kv_sink(self, layer: int) -> KVSink | None:
        """Where `layer`'s new K/V go when a kernel ahead of attention stores them itself (then
        `attend` gets k, v None); None when the backend takes them through `attend`."""
        ...

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
        """Attention of q, k, v before their RMSNorm and RoPE ([N, heads, D], [N, kv_heads,
        D]), the backend normalising, rotating and storing them itself; None where it cannot
        (the caller then does that and calls `attend`)."""
        ...

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [N, heads, D]; k, v [N, kv_heads, D] or both None (stored through `kv_sink`);
        returns [N, heads, D], written into `out` (same shape and dtype) when given."""
        ...


class DenseKVCache:
    """One request's K/V for every layer, in contiguous buffers grown by doubling.

    Buffers are [capacity, num_kv_heads, head_dim] per layer. `num_tokens` is the number of
    cached positions (0..num_tokens-1). Not thread-safe.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        initial_capacity: int = 256,
    ) -> None:
        shape = (initial_capacity, num_kv_heads, head_dim)
        self._k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._lengths = [0] * num_layers

    @property
    def num_tokens(self) -> int:
        """Positions cached in every layer."""
        return min(self._lengths)

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [n, kv_heads, head_dim] to `layer`; return that layer's whole K, V
        [num_tokens_after, kv_heads, head_dim] (views, valid until the next append)."""
        start = self._lengths[layer]
        end = start + k.shape[0]
        if end > self._k[layer].shape[0]:
            self._grow(layer, end)
        self._k[layer][start:end] = k
        self._v[layer][start:end] = v
        self._lengths[layer] = end
        return self._k[layer][:end], self._v[layer][:end]

    def truncate(self, num_tokens: int) -> None:
        """Forget positions >= num_tokens in every layer (e.g. to re-prefill a changed tail).

        Raises ValueError for a negative count; a count above the current length is a no-op.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        self._lengths = [min(length, num_tokens) for length in self._lengths]

    def _grow(self, layer: int, needed: int) -> None:
        capacity = max(needed, 2 * self._k[layer].shape[0])
        for buffers in (self._k, self._v):
            old = buffers[layer]
            new = old.new_empty((capacity, *old.shape[1:]))
            new[: self._lengths[layer]] = old[: self._lengths[layer]]
            buffers[layer] = new


class DenseAttention:
    """AttentionBackend over per-request DenseKVCache objects, for one forward step.

    `caches[i]` receives the `num_new_tokens[i]` rows starting at `cu_seqlens_q[i]` of the flat
    batch. `cu_seqlens_q` ([B+1] int64 on CPU) and `context_lens` ([B], cached + new) are the
    metadata a paged backend would also carry.
    """

    def __init__(self, caches: Sequence[DenseKVCache], num_new_tokens: Sequence[int]) -> None:
        if len(caches) != len(num_new_tokens):
            raise ValueError(f"{len(caches)} caches for {len(num_new_tokens)} requests")
        if any(n <= 0 for n in num_new_tokens):
            raise ValueError(f"every request needs >= 1 new token, got {list(num_new_tokens)}")
        self.caches = list(caches)
        counts = torch.tensor([0, *num_new_tokens], dtype=torch.int64)
        self.cu_seqlens_q = counts.cumsum(0)
        self.context_lens = [c.num_tokens + n for c, n in zip(caches, num_new_tokens, strict=True)]

    def kv_sink(self, layer: int) -> KVSink | None:
        """None: dense caches take k and v through `attend`."""
        return None

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
        """None: the dense path attends over normalised, rotated q and k (`attend`)."""
        return None

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As `AttentionBackend.attend`: appends each request's k, v rows to its cache, then attends
        causally. Raises ValueError when k or v is None (no KV sink here) or q's row count is not
        the batch's total of new tokens."""
        if k is None or v is None:
            raise ValueError("DenseAttention has no KV sink: attend needs k and v")
        bounds = self.cu_seqlens_q.tolist()
        if q.shape[0] != bounds[-1]:
            raise ValueError(f"q has {q.shape[0]} rows, metadata expects {bounds[-1]}")
        outputs = []
        for i, cache in enumerate(self.caches):
            start, end = bounds[i], bounds[i + 1]
            keys, values = cache.append(layer, k[start:end], v[start:end])
            outputs.append(_causal_attention(q[start:end], keys, values, scale))
        if out is None:
            return torch.cat(outputs, dim=0)
        return torch.cat(outputs, dim=0, out=out)


def _causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    # q [n, Hq, D]; k, v [ctx, Hkv, D] where the last n cache rows are the queries' own.
    n, ctx = q.shape[0], k.shape[0]
    query_pos = torch.arange(ctx - n, ctx, device=q.device)[:, None]
    mask = torch.arange(ctx, device=q.device)[None, :] <= query_pos  # [n, ctx]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )  # [1, Hq, n, D]
    return out[0].transpose(0, 1)
