"""Paged KV cache allocator: fixed-size blocks, a block table per request, reference counts.

Plain Python (no torch): the model runner owns the KV tensor of `num_blocks` blocks and reads
each request's `block_table`; this module only decides which block ids hold which tokens.

Block size: 128 tokens by default (`KV_BLOCK_SIZE`; any of `KV_BLOCK_SIZES` by configuration).
- The paged decode kernel tiles keys in multiples of 16 (tensor-core MMA tiles and 16-token
  loads of 128-dim bf16 heads, 4 KiB per head per 16 tokens), so a block is a multiple of 16.
- Blocks of 128 tokens hold whole 128-key tiles of the extend kernel (one table read per tile
  instead of one per key): 4-12 % less extend time than blocks of 16 on an H200, and side by
  side in one call long c1 bf16 106.5 against 105.2 audio-s/s and long c16 over an FP8 cache
  291.5 against 289.7 (docs/benchmarks.md, sessions 23-24).
- Larger blocks cost more: copy-on-write after truncating inside a shared block copies up to
  block_size - 1 tokens (128: <= 14 MiB at 112 KiB per token; a fork from a request still
  running; a live hop forks its retained predecessor, released at the fork, and writes into
  the block in place), and every
  request wastes on average half a block (128-token blocks x 200 requests ~ 1.4 GiB, ~1 % of
  an H200's pool); 256 would double both for no kernel gain (the extend tile is 128 keys).
- Smaller blocks cost table length: a 90-minute prompt (~71k tokens) needs ~4.5k entries at 16
  (~560 at 128), O(1) Python work per decode token either way.

Sharing: `fork` gives a second request the blocks of a prefix (refcount + 1 each). A slot a
sharer reads is never overwritten: before a request writes into a shared block (its first write
after a fork or a truncate that ends inside a shared block) the block is copied into a fresh one
(copy-on-write) and a `BlockCopy` is queued; the model runner must perform the queued copies
(`take_copies()`) before the forward of the step that was scheduled with them. One exception,
harmless: a running source's later prefill chunks go on into its partial block that a fork
shares, past the fork's prefix (slots the fork never reads: its own first write copies the
block).

Invariant checked by `audit`: every block is either free (refcount 0, in the free list once)
or held, and a held block's refcount equals the number of live requests whose table holds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from livemeet.audio.constants import KV_BLOCK_SIZE
from livemeet.engine.request import Request
from livemeet.errors import InternalError


class BlockManagerError(InternalError):
    """The block manager was used wrongly (a bug in the caller); nothing was changed."""


class OutOfBlocks(BlockManagerError):
    """Not enough free blocks; call the matching `can_*` first. Nothing was changed."""


class BlockCopy(NamedTuple):
    """Copy KV slots [0, num_tokens) of block `src` into block `dst` (copy-on-write)."""

    src: int
    dst: int
    num_tokens: int


class BlockManager:
    """Allocates KV blocks to requests. Check/act pairs: `can_allocate`/`allocate`,
    `can_append`/`append_slots`; the act raises OutOfBlocks when its check would be False.

    Raises BlockManagerError for invalid sizes (constructor) and for misuse (see each method).
    """

    def __init__(self, num_blocks: int, block_size: int = KV_BLOCK_SIZE) -> None:
        if num_blocks < 1:
            raise BlockManagerError(f"num_blocks must be >= 1, not {num_blocks}")
        if block_size < 16 or block_size % 16:
            raise BlockManagerError(f"block_size must be a multiple of 16, not {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._holders: dict[str, Request] = {}
        self._copies: list[BlockCopy] = []

    # -- queries ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def ref_count(self, block_id: int) -> int:
        """The reference count of block `block_id` (0: free; above 1: shared by a fork)."""
        return self._ref_counts[block_id]

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens: ceil(num_tokens / block_size)."""
        return -(-num_tokens // self.block_size)

    def is_holder(self, request: Request) -> bool:
        """True when `request` (this object, not only its id) holds blocks here."""
        return self._holders.get(request.request_id) is request

    def blocks_needed(
        self, request: Request, num_tokens: int, freed: Iterable[Request] = ()
    ) -> int:
        """Free blocks needed so that `request` can write KV for tokens up to `num_tokens`
        (new table entries plus one copy-on-write of a shared block at the write position),
        once `freed` (other holders) are freed: a block shared only with them is written in
        place then."""
        return self._num_needed(request, num_tokens, self._num_held_by(freed))

    def fits_after_freeing(
        self, request: Request, num_tokens: int, holders: Iterable[Request]
    ) -> bool:
        """Whether freeing all of `holders` would leave `request` room for `num_tokens`
        tokens: the blocks no one else holds come back, a block two of them share included
        (summing each one's refcount-1 blocks missed it, and the scheduler refused an
        eviction that would have made room for good: a fuzzer's stall), and
        `blocks_needed(freed=holders)` are taken, over one count of what they hold."""
        held = self._num_held_by(holders)
        return len(self._free) + self._num_freed(held) >= self._num_needed(
            request, num_tokens, held
        )

    # -- allocation ------------------------------------------------------------------------

    def can_allocate(self, request: Request, num_tokens: int | None = None) -> bool:
        """True when `allocate(request, num_tokens)` would succeed."""
        target = request.num_tokens if num_tokens is None else num_tokens
        return self.blocks_needed(request, target) <= len(self._free)

    def allocate(self, request: Request, num_tokens: int | None = None) -> None:
        """Make the table cover `num_tokens` tokens (default: all of prompt + outputs).

        Keeps any blocks the request already holds (a forked prefix). Raises OutOfBlocks.
        """
        target = request.num_tokens if num_tokens is None else num_tokens
        self._ensure(request, target)

    def can_append(self, request: Request, num_new_tokens: int = 1) -> bool:
        """True when `append_slots(request, num_new_tokens)` would succeed."""
        return self.can_allocate(request, request.num_computed_tokens + num_new_tokens)

    def append_slots(self, request: Request, num_new_tokens: int = 1) -> None:
        """Make room for KV of `num_new_tokens` tokens after the computed ones (decode: 1).

        Raises OutOfBlocks; BlockManagerError when num_new_tokens < 1.
        """
        if num_new_tokens < 1:
            raise BlockManagerError(f"num_new_tokens must be >= 1, not {num_new_tokens}")
        self._ensure(request, request.num_computed_tokens + num_new_tokens)

    def append_slot(self, request: Request) -> None:
        """`append_slots(request, 1)`: the slot of one decode token."""
        self.append_slots(request, 1)

    # -- truncate, fork, free --------------------------------------------------------------

    def truncate(self, request: Request, num_tokens: int) -> None:
        """Keep the KV of the first `num_tokens` tokens only; release the blocks past them.

        A shared block that now ends the table is copied on the request's next write, so the
        other holders' KV is never touched. Sets num_computed_tokens (and num_cached_tokens)
        to at most num_tokens. Raises BlockManagerError unless
        0 <= num_tokens <= request.num_computed_tokens.
        """
        if not 0 <= num_tokens <= request.num_computed_tokens:
            raise BlockManagerError(
                f"truncate {request.request_id!r} to {num_tokens} tokens: must be in "
                f"0..{request.num_computed_tokens} (its computed tokens)"
            )
        self._check_holder_or_empty(request)
        keep = self.num_blocks_for(num_tokens)
        table = request.block_table
        if len(table) > keep:
            self._release_all(table[keep:])
            del table[keep:]
        request.num_computed_tokens = num_tokens
        request.num_cached_tokens = min(request.num_cached_tokens, num_tokens)
        if not request.block_table:
            self._holders.pop(request.request_id, None)

    def fork(self, src: Request, dst: Request, num_tokens: int) -> None:
        """Share the KV of `src`'s first `num_tokens` tokens with `dst` (refcounts + 1).

        `dst` must hold no blocks, have no computed tokens and the same first `num_tokens`
        token ids (audio embeddings cannot be compared here; the caller vouches for them).
        Afterwards dst.num_computed_tokens == dst.num_cached_tokens == num_tokens.
        Raises BlockManagerError on any of these violations.
        """
        self._check_holder_or_empty(src)
        if not 1 <= num_tokens <= src.num_computed_tokens:
            raise BlockManagerError(
                f"fork {num_tokens} tokens of {src.request_id!r}: must be in "
                f"1..{src.num_computed_tokens} (its computed tokens)"
            )
        if dst.block_table or dst.request_id in self._holders or dst.num_computed_tokens:
            raise BlockManagerError(f"fork into {dst.request_id!r}: it already has KV")
        if num_tokens > dst.num_tokens or (
            src.token_ids(0, num_tokens) != dst.token_ids(0, num_tokens)
        ):
            raise BlockManagerError(
                f"fork {src.request_id!r} -> {dst.request_id!r}: the first {num_tokens} "
                "token ids differ"
            )
        shared = src.block_table[: self.num_blocks_for(num_tokens)]
        refs = self._ref_counts
        for block_id in shared:
            refs[block_id] += 1
        dst.block_table.extend(shared)
        dst.num_computed_tokens = num_tokens
        dst.num_cached_tokens = num_tokens
        self._holders[dst.request_id] = dst

    def free(self, request: Request) -> None:
        """Release every block of `request` (each exactly once) and forget its KV.

        A request that holds nothing is a no-op, so freeing twice is harmless; a request
        whose table was not handed out by this manager raises BlockManagerError.
        """
        self._check_holder_or_empty(request)
        if request.block_table:
            self._release_all(request.block_table)
            request.block_table.clear()
        request.num_computed_tokens = 0
        request.num_cached_tokens = 0
        self._holders.pop(request.request_id, None)

    def take_copies(self) -> list[BlockCopy]:
        """The copy-on-write copies queued since the last call, in order; clears the queue."""
        copies, self._copies = self._copies, []
        return copies

    # -- audit -----------------------------------------------------------------------------

    def audit(self, live_requests: Iterable[Request]) -> None:
        """Check the allocator invariant against every request that may hold blocks.

        Every block is free (refcount 0, in the free list exactly once) or its refcount equals
        the number of `live_requests` whose table holds it; every holder is live and every
        live request with a table is a holder; a table covers its computed tokens and has no
        repeated block. Raises BlockManagerError listing every violation.
        """
        problems: list[str] = []
        holders = {r.request_id: r for r in live_requests if r.block_table}
        expected = [0] * self.num_blocks
        for rid, req in holders.items():
            if self._holders.get(rid) is not req:
                problems.append(f"{rid!r} has a table this manager did not hand out")
            if len(set(req.block_table)) != len(req.block_table):
                problems.append(f"{rid!r} holds a block twice: {req.block_table}")
            if len(req.block_table) < self.num_blocks_for(req.num_computed_tokens):
                problems.append(f"{rid!r}: table shorter than its computed tokens")
            for block_id in req.block_table:
                expected[block_id] += 1
        for rid in self._holders.keys() - holders.keys():
            problems.append(f"{rid!r} holds blocks but is not live (leak)")
        free = list(self._free)
        if len(set(free)) != len(free):
            problems.append("a block is in the free list twice")
        free_set = set(free)
        for block_id in range(self.num_blocks):
            ref = self._ref_counts[block_id]
            if ref != expected[block_id]:
                problems.append(f"block {block_id}: refcount {ref}, held {expected[block_id]}x")
            if (ref == 0) != (block_id in free_set):
                problems.append(f"block {block_id}: refcount {ref} but free={ref == 0}")
        if problems:
            raise BlockManagerError("KV allocator audit failed: " + "; ".join(problems))

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _num_held_by(holders: Iterable[Request]) -> dict[int, int]:
        """{block id: how many of `holders` hold it} (a table holds a block at most once)."""
        held: dict[int, int] = {}
        for holder in holders:
            for block_id in holder.block_table:
                held[block_id] = held.get(block_id, 0) + 1
        return held

    def _num_freed(self, held: dict[int, int]) -> int:
        """Blocks its holders (`held`: _num_held_by's) alone hold."""
        return sum(1 for b, n in held.items() if self._ref_counts[b] == n)

    def _num_needed(self, request: Request, num_tokens: int, held: dict[int, int]) -> int:
        """blocks_needed once the holders counted in `held` are freed."""
        new = max(0, self.num_blocks_for(num_tokens) - len(request.block_table))
        table = request.block_table
        return new + sum(
            1
            for i in self._shared_write_blocks(request, num_tokens)
            if self._ref_counts[table[i]] - held.get(table[i], 0) > 1
        )

    def _shared_write_blocks(self, request: Request, num_tokens: int) -> list[int]:
        """Table indexes of shared blocks that writing tokens up to num_tokens would touch."""
        first = request.num_computed_tokens // self.block_size
        last = min(len(request.block_table), self.num_blocks_for(num_tokens))
        return [i for i in range(first, last) if self._ref_counts[request.block_table[i]] > 1]

    def _ensure(self, request: Request, num_tokens: int) -> None:
        self._check_holder_or_empty(request)
        if num_tokens < request.num_computed_tokens:
            raise BlockManagerError(
                f"{request.request_id!r}: cannot allocate {num_tokens} tokens, fewer than its "
                f"{request.num_computed_tokens} computed ones (use truncate)"
            )
        needed = self.blocks_needed(request, num_tokens)
        if needed > len(self._free):
            raise OutOfBlocks(
                f"{request.request_id!r} needs {needed} blocks, {len(self._free)} free"
            )
        for index in self._shared_write_blocks(request, num_tokens):
            # only the block holding the write position can be shared (forks and truncates
            # keep tables no longer than their computed tokens)
            assert index == request.num_computed_tokens // self.block_size
            src = request.block_table[index]
            dst = self._take_free()
            self._copies.append(BlockCopy(src, dst, request.num_computed_tokens % self.block_size))
            self._release(src)
            request.block_table[index] = dst
        while len(request.block_table) < self.num_blocks_for(num_tokens):
            request.block_table.append(self._take_free())
        if request.block_table:
            self._holders[request.request_id] = request

    def _take_free(self) -> int:
        block_id = self._free.popleft()
        assert self._ref_counts[block_id] == 0, f"free block {block_id} is referenced"
        self._ref_counts[block_id] = 1
        return block_id

    def _release_all(self, blocks: list[int]) -> None:
        """`_release` of each of `blocks`, last first (the order a table is popped in), in one
        loop: a live hop at minute 10 frees its predecessor's ~500 blocks every hop."""
        refs = self._ref_counts
        if any(refs[block_id] <= 0 for block_id in blocks):  # before any change
            raise BlockManagerError(f"a block of {blocks} freed twice")
        freed = []
        for block_id in reversed(blocks):
            ref = refs[block_id]
            refs[block_id] = ref - 1
            if ref == 1:
                freed.append(block_id)
        self._free.extend(freed)

    def _release(self, block_id: int) -> None:
        if self._ref_counts[block_id] <= 0:
            raise BlockManagerError(f"block {block_id} freed twice")
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] == 0:
            self._free.append(block_id)

    def _check_holder_or_empty(self, request: Request) -> None:
        holder = self._holders.get(request.request_id)
        if request.block_table and holder is not request:
            raise BlockManagerError(
                f"{request.request_id!r} has a block table this manager did not hand out"
            )
        if not request.block_table and holder is not None:
            raise BlockManagerError(
                f"request id {request.request_id!r} is already held by another request"
            )
