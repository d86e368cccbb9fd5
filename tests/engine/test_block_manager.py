"""BlockManager: every operation, every error path, and randomized sequences with the audit."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from livemeet.audio.constants import KV_BLOCK_SIZE
from livemeet.engine.block_manager import BlockCopy, BlockManager, BlockManagerError, OutOfBlocks
from livemeet.engine.request import Request
from tests.engine.fakes import FakeKV, blocks_freed_by

BS = 16


def make(rid: str, num_tokens: int, first: int = 0) -> Request:
    return Request(rid, list(range(first, first + num_tokens)))


def compute(bm: BlockManager, kv: FakeKV, req: Request, num_tokens: int) -> list[BlockCopy]:
    """Reserve slots for `num_tokens` more tokens, do the queued copies, write the fake KV."""
    bm.append_slots(req, num_tokens)
    copies = apply_copies(bm, kv)
    for p in range(req.num_computed_tokens, req.num_computed_tokens + num_tokens):
        kv.write(req, p, req.token_ids(p, p + 1)[0])
    req.num_computed_tokens += num_tokens
    return copies


def apply_copies(bm: BlockManager, kv: FakeKV) -> list[BlockCopy]:
    copies = bm.take_copies()
    for c in copies:
        kv.copy(c.src, c.dst, c.num_tokens)
    return copies


@pytest.fixture
def bm() -> BlockManager:
    return BlockManager(num_blocks=8, block_size=BS)


def test_constructor_rejects_bad_sizes() -> None:
    with pytest.raises(BlockManagerError):
        BlockManager(0)
    with pytest.raises(BlockManagerError):
        BlockManager(4, block_size=24)
    assert BlockManager(4).block_size == KV_BLOCK_SIZE


def test_allocate_covers_sequence_and_free_returns_everything(bm: BlockManager) -> None:
    req = make("a", 33)
    assert bm.can_allocate(req)
    bm.allocate(req)
    assert len(req.block_table) == 3  # ceil(33 / 16)
    assert bm.num_free_blocks == 5
    assert all(bm.ref_count(b) == 1 for b in req.block_table)
    bm.audit([req])
    bm.free(req)
    assert req.block_table == [] and bm.num_free_blocks == 8
    bm.audit([req])


def test_allocate_without_room_raises_and_changes_nothing(bm: BlockManager) -> None:
    big = make("big", 8 * BS + 1)
    assert not bm.can_allocate(big)
    with pytest.raises(OutOfBlocks):
        bm.allocate(big)
    assert big.block_table == [] and bm.num_free_blocks == 8
    bm.audit([big])


def test_allocate_below_computed_tokens_is_misuse(bm: BlockManager) -> None:
    req = make("a", 40)
    bm.allocate(req)
    req.num_computed_tokens = 40
    with pytest.raises(BlockManagerError):
        bm.allocate(req, 10)


def test_append_slot_takes_a_block_only_at_a_boundary(bm: BlockManager) -> None:
    kv = FakeKV(8, BS)
    req = make("a", BS)
    compute(bm, kv, req, BS)
    assert len(req.block_table) == 1
    assert bm.can_append(req)
    bm.append_slot(req)
    assert len(req.block_table) == 2
    req.num_computed_tokens += 1
    bm.append_slot(req)  # position 17 fits in block 2
    assert len(req.block_table) == 2
    with pytest.raises(BlockManagerError):
        bm.append_slots(req, 0)


def test_append_when_pool_is_full(bm: BlockManager) -> None:
    kv = FakeKV(8, BS)
    req = make("a", 8 * BS + 4)
    compute(bm, kv, req, 8 * BS)
    assert bm.num_free_blocks == 0
    assert not bm.can_append(req)
    with pytest.raises(OutOfBlocks):
        bm.append_slot(req)
    assert len(req.block_table) == 8
    bm.audit([req])


@pytest.mark.parametrize("keep", [0, 1, 15, 16, 17, 40])
def test_truncate_to_any_position(bm: BlockManager, keep: int) -> None:
    kv = FakeKV(8, BS)
    req = make("a", 40)
    compute(bm, kv, req, 40)
    bm.truncate(req, keep)
    assert req.num_computed_tokens == keep
    assert len(req.block_table) == -(-keep // BS)
    assert bm.num_free_blocks == 8 - len(req.block_table)
    kv.check_prefix(req, keep)
    bm.audit([req])


def test_truncate_out_of_range_raises(bm: BlockManager) -> None:
    kv = FakeKV(8, BS)
    req = make("a", 20)
    compute(bm, kv, req, 10)
    with pytest.raises(BlockManagerError):
        bm.truncate(req, 11)
    with pytest.raises(BlockManagerError):
        bm.truncate(req, -1)
    assert req.num_computed_tokens == 10


def test_fork_shares_blocks_with_refcounts(bm: BlockManager) -> None:
    kv = FakeKV(8, BS)
    src = make("src", 40)
    compute(bm, kv, src, 40)
    dst = make("dst", 50)
    bm.fork(src, dst, 32)
    assert dst.block_table == src.block_table[:2]
    assert [bm.ref_count(b) for b in src.block_table] == [2, 2, 1]
    assert dst.num_computed_tokens == dst.num_cached_tokens == 32
    bm.audit([src, dst])
    bm.free(src)
    assert [bm.ref_count(b) for b in dst.block_table] == [1, 1]
    bm.audit([dst])
    kv.check_prefix(dst, 32)


def test_blocks_freed_by_holders_count_the_blocks_only_they_share(bm: BlockManager) -> None:
    """Freeing two forks returns the prefix block they share once no one else holds it
    (summing each one's refcount-1 blocks missed it: the scheduler then refused an eviction
    that would have made room, and stalled); a block shared only with holders about to be
    freed needs no copy-on-write."""
    kv = FakeKV(8, BS)
    src = make("src", 20)
    compute(bm, kv, src, 20)  # blocks: [0..15], [16..19]
    first, second = make("a", 40), make("b", 40)
    for fork in (first, second):
        bm.fork(src, fork, 16)
        compute(bm, kv, fork, 4)  # a block of its own each: [16..19]
    assert blocks_freed_by(bm, [first]) == 1  # its own block; the prefix is shared
    assert blocks_freed_by(bm, [first, second]) == 2  # the prefix still is src's
    assert blocks_freed_by(bm, [src, first, second]) == 4
    # the scheduler's question counts them so: 4 blocks free, and those freed on top
    for holders in ([first], [first, second], [src, first, second]):
        room = bm.num_free_blocks + blocks_freed_by(bm, holders)
        assert bm.fits_after_freeing(make("p", 1, first=900), room * BS, holders)
        assert not bm.fits_after_freeing(make("p", 1, first=900), room * BS + 1, holders)
    late = Request("late", list(range(18)) + [700])
    bm.fork(src, late, 18)  # shares src's partial block: a write copies it first
    assert bm.blocks_needed(late, 19) == 1
    assert bm.blocks_needed(late, 19, freed=[src]) == 0  # written in place once src goes
    bm.audit([src, first, second, late])


def test_fork_errors(bm: BlockManager) -> None:
    kv = FakeKV(8, BS)
    src = make("src", 40)
    with pytest.raises(BlockManagerError):
        bm.fork(src, make("d0", 40), 1)  # src has no computed tokens
    compute(bm, kv, src, 20)
    with pytest.raises(BlockManagerError):
        bm.fork(src, make("d1", 40), 21)  # past the computed tokens
    with pytest.raises(BlockManagerError):
        bm.fork(src, make("d2", 40, first=1), 10)  # different token ids
    holder = make("d3", 40)
    bm.allocate(holder)
    with pytest.raises(BlockManagerError):
        bm.fork(src, holder, 10)  # dst already has KV
    bm.audit([src, holder])


def test_write_into_shared_partial_block_copies_on_write(bm: BlockManager) -> None:
    kv = FakeKV(8, BS)
    src = make("src", 40)
    compute(bm, kv, src, 20)  # blocks: [0..15], [16..19]
    # dst shares 18 tokens, then diverges inside the shared second block
    dst = Request("dst", list(range(18)) + [900, 901, 902])
    bm.fork(src, dst, 18)
    shared = dst.block_table[1]
    assert bm.blocks_needed(dst, 21) == 1  # the copy, no new table entry
    copies = compute(bm, kv, dst, 3)
    assert copies == [BlockCopy(src=shared, dst=dst.block_table[1], num_tokens=2)]
    assert dst.block_table[0] == src.block_table[0] and dst.block_table[1] != shared
    assert bm.ref_count(shared) == 1
    kv.check_prefix(src, 20)  # positions 18, 19 of src were not overwritten by dst's 900, 901
    kv.check_prefix(dst, 21)
    bm.audit([src, dst])


def test_truncate_inside_shared_full_block_then_extend(bm: BlockManager) -> None:
    kv = FakeKV(8, BS)
    a = make("a", 40)
    compute(bm, kv, a, 32)
    b = make("b", 40)
    bm.fork(a, b, 32)
    bm.truncate(b, 20)  # inside shared block 1
    assert bm.ref_count(b.block_table[1]) == 2
    b.prompt_token_ids[20:25] = [800, 801, 802, 803, 804]  # the new tail differs from a's
    copies = compute(bm, kv, b, 5)
    assert len(copies) == 1 and copies[0].num_tokens == 4
    kv.check_prefix(a, 32)
    kv.check_prefix(b, 25)
    bm.audit([a, b])


def test_cow_needs_a_free_block(bm: BlockManager) -> None:
    kv = FakeKV(8, BS)
    a = make("a", 6 * BS + 8)
    compute(bm, kv, a, 6 * BS + 8)
    b = make("b", 6 * BS + 8)
    bm.fork(a, b, 6 * BS + 4)
    filler = make("f", BS)
    bm.allocate(filler)
    assert bm.num_free_blocks == 0
    assert not bm.can_append(b)
    with pytest.raises(OutOfBlocks):
        bm.append_slot(b)
    bm.audit([a, b, filler])


def test_free_twice_is_harmless_and_forged_tables_are_refused(bm: BlockManager) -> None:
    req = make("a", 20)
    bm.allocate(req)
    bm.free(req)
    bm.free(req)
    assert bm.num_free_blocks == 8
    forged = make("x", 20)
    forged.block_table = [3]
    with pytest.raises(BlockManagerError):
        bm.free(forged)
    with pytest.raises(BlockManagerError):
        bm.truncate(forged, 0)
    other = make("a", 20)  # same id as a holder, different object
    bm.allocate(req)
    with pytest.raises(BlockManagerError):
        bm.allocate(other)
    assert bm.num_free_blocks == 6


def test_audit_reports_leaks_and_corruption(bm: BlockManager) -> None:
    a = make("a", 20)
    bm.allocate(a)
    with pytest.raises(BlockManagerError, match="leak"):
        bm.audit([])
    forged = make("x", 5)
    forged.block_table = [a.block_table[0]]
    with pytest.raises(BlockManagerError, match="did not hand out"):
        bm.audit([a, forged])
    bm._ref_counts[a.block_table[0]] += 1  # simulate a lost decrement
    with pytest.raises(BlockManagerError, match="refcount"):
        bm.audit([a])
    bm._ref_counts[a.block_table[0]] -= 1
    bm.audit([a])


def test_a_double_free_raises_and_changes_nothing(bm: BlockManager) -> None:
    with pytest.raises(BlockManagerError, match="freed twice"):
        bm._release(0)
    a = make("a", 40)
    bm.allocate(a)
    table = list(a.block_table)
    refs, free = list(bm._ref_counts), list(bm._free)
    bm._ref_counts[table[-1]] = 0  # as if its last block had been freed already
    with pytest.raises(BlockManagerError, match="freed twice"):
        bm.free(a)
    assert a.block_table == table and bm._ref_counts[table[0]] == refs[table[0]]
    assert list(bm._free) == free  # the check runs before any block is released


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate/append/truncate/fork/free against a tiny pool; the fake KV of every
    request must hold its own tokens and the audit must pass after every rule."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(num_blocks=12, block_size=BS)
        self.kv = FakeKV(12, BS)
        self.live: list[Request] = []
        self.next_id = 0

    def _new(self, tokens: list[int]) -> Request:
        self.next_id += 1
        req = Request(f"r{self.next_id}", tokens)
        self.live.append(req)
        return req

    @rule(n=st.integers(1, 90), base=st.integers(0, 3))
    def add(self, n: int, base: int) -> None:
        self._new([base * 1000 + i for i in range(n)])

    @rule(data=st.data(), n=st.integers(1, 40))
    def extend(self, data: st.DataObject, n: int) -> None:
        if not self.live:
            return
        req = data.draw(st.sampled_from(self.live))
        n = min(n, req.num_tokens - req.num_computed_tokens)
        if n == 0:
            req.output_token_ids.append(7)  # a sampled token makes room to grow
            return
        if not self.bm.can_append(req, n):
            with pytest.raises(OutOfBlocks):
                self.bm.append_slots(req, n)
            return
        self.bm.append_slots(req, n)
        apply_copies(self.bm, self.kv)
        for p in range(req.num_computed_tokens, req.num_computed_tokens + n):
            self.kv.write(req, p, req.token_ids(p, p + 1)[0])
        req.num_computed_tokens += n

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        if not self.live:
            return
        req = data.draw(st.sampled_from(self.live))
        self.bm.truncate(req, data.draw(st.integers(0, req.num_computed_tokens)))

    @rule(data=st.data(), extra=st.integers(0, 30))
    def fork(self, data: st.DataObject, extra: int) -> None:
        sources = [r for r in self.live if r.num_computed_tokens > 0]
        if not sources:
            return
        src = data.draw(st.sampled_from(sources))
        n = data.draw(st.integers(1, src.num_computed_tokens))
        dst = self._new(src.token_ids(0, n) + [5000 + i for i in range(extra)])
        self.bm.fork(src, dst, n)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.live))
        self.bm.free(req)
        self.live.remove(req)
        self.bm.free(req)  # a second free must be a no-op

    @invariant()
    def allocator_is_consistent(self) -> None:
        self.bm.audit(self.live)
        for req in self.live:
            self.kv.check_prefix(req, req.num_computed_tokens)


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
