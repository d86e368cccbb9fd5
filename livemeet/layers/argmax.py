"""Greedy sampling's argmax over the vocabulary in one kernel.

torch.argmax over one row of 151,936 bf16 logits runs as one reduction of ~9-10 us on an H200
(docs/benchmarks.md, session 37's decode profile: `reduce_kernel`, 9.7 us a step), ~0.6 % of a
1.6-ms batch-1 decode step. `greedy_argmax` cuts each row into chunks of CHUNK_BLOCK elements
(149 programs for one row of that vocabulary), each program writes its chunk's (max, first
index), and the last program of a row to finish (livemeet.layers.split_k's counters) reduces
the row's partials in chunk order.

Same result as torch.argmax(dim=-1) on finite and infinite values: the largest value, ties to
the lowest index, a row of -inf gives 0. NaN counts as larger than every number (torch.argmax
returns a NaN's index too); a row with NaNs and +inf may pick either.
"""

from __future__ import annotations

import torch

from livemeet.errors import InternalError
from livemeet.layers import pdl, split_k
from livemeet.layers.paged_attention import Impl, select_triton

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU-only install path
    HAS_TRITON = False

CHUNK_BLOCK = 1024  # elements a program loads at once: 4 warps x 32 lanes x 8 bf16 (16 bytes)
MAX_CHUNKS = 256  # partials per row the last program reduces (it loads them all at once)
NUM_WARPS = 4


if HAS_TRITON:

    @triton.jit
    def _best(values, indices):
        """(max, lowest index holding it) of [B] fp32 values and their int32 indices."""
        top = tl.max(values, 0)
        return top, tl.min(tl.where(values == top, indices, 2147483647), 0)

    @triton.jit
    def _argmax_kernel(
        Logits,
        Out,
        PartVal,
        PartIdx,
        Counters,
        V,
        stride_m,
        NUM_CHUNKS,
        ITERS: tl.constexpr,
        BLOCK: tl.constexpr,
        CHUNKS_POW2: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid: (NUM_CHUNKS, M); a chunk is ITERS x BLOCK elements of one row. Each lane keeps
        # its running (max, first index); NaN becomes +inf so that it wins as in torch.argmax.
        c = tl.program_id(0)
        m = tl.program_id(1)
        pdl.dependency_sync(PDL)
        row = Logits + m.to(tl.int64) * stride_m
        lanes = tl.arange(0, BLOCK)
        best_v = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = tl.full([BLOCK], 2147483647, tl.int32)
        for it in tl.static_range(ITERS):
            idx = (c * ITERS + it) * BLOCK + lanes
            x = tl.load(row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
            x = tl.where(x != x, float("inf"), x)
            # indices only grow along a lane, so a tie keeps the earlier one; -inf == -inf
            # takes a lane's first index, so a row of -inf ends at 0
            take = (x > best_v) | ((best_i == 2147483647) & (idx < V))
            best_v = tl.where(take, x, best_v)
            best_i = tl.where(take, idx, best_i)
        top, first = _best(best_v, best_i)
        tl.store(PartVal + m * NUM_CHUNKS + c, top)
        tl.store(PartIdx + m * NUM_CHUNKS + c, first)
        if split_k.arrive_last(Counters + m, NUM_CHUNKS):
            parts = tl.arange(0, CHUNKS_POW2)
            pmask = parts < NUM_CHUNKS
            vals = tl.load(PartVal + m * NUM_CHUNKS + parts, mask=pmask, other=float("-inf"),
                           cache_modifier=".cg")  # fmt: skip
            idxs = tl.load(PartIdx + m * NUM_CHUNKS + parts, mask=pmask, other=2147483647,
                           cache_modifier=".cg")  # fmt: skip
            _, winner = _best(vals, idxs)
            tl.store(Out + m, winner.to(tl.int64))
            split_k.rearm(Counters + m)


def chunking(vocab: int) -> tuple[int, int]:
    """(chunks per row, BLOCK loads per chunk) for a row of `vocab` logits: one load per chunk
    up to MAX_CHUNKS chunks, more loads per chunk past that."""
    loads = -(-vocab // CHUNK_BLOCK)
    iters = -(-loads // MAX_CHUNKS)
    return -(-loads // iters), iters


def greedy_argmax(logits: torch.Tensor, *, impl: Impl = "auto") -> torch.Tensor:
    """logits [M, V] (any float dtype, rows contiguous) -> int64 [M] on the same device: each
    row's argmax as torch.argmax(dim=-1) gives it (see the module doc). `impl="torch"` (or no
    Triton, or a CPU tensor under "auto") runs torch.argmax, as does a launch inside a graph
    capture before the split-K counters exist. Raises InternalError for another rank, an
    empty vocabulary or a last dim that is not contiguous."""
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise InternalError(f"need logits [M, V] with V > 0, got {tuple(logits.shape)}")
    if not select_triton(impl, logits, available=HAS_TRITON):
        return logits.argmax(dim=-1)
    if logits.stride(1) != 1:
        raise InternalError("greedy_argmax needs each row contiguous")
    m, vocab = logits.shape
    out = torch.empty(m, dtype=torch.int64, device=logits.device)
    if m == 0:
        return out
    counters = split_k.counters(logits.device, m)
    if counters is None:
        return logits.argmax(dim=-1)
    chunks, iters = chunking(vocab)
    part_val = torch.empty((m, chunks), dtype=torch.float32, device=logits.device)
    part_idx = torch.empty((m, chunks), dtype=torch.int32, device=logits.device)
    _argmax_kernel[(chunks, m)](
        logits,
        out,
        part_val,
        part_idx,
        counters,
        vocab,
        logits.stride(0),
        chunks,
        ITERS=iters,
        BLOCK=CHUNK_BLOCK,
        CHUNKS_POW2=triton.next_power_of_2(chunks),
        num_warps=NUM_WARPS,
        **pdl.launch_options(logits, _argmax_kernel),
    )
    return out
