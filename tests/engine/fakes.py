"""Test doubles for the engine: a manual clock, a stepping engine clock, a fake model
runner with a fake KV, and a backend core that records its commands.

The fake KV stores, for every slot, the (position, token id) whose KV it holds, so a wrong
block table, a missed copy-on-write or a block reused while still referenced shows up as a
read of the wrong (position, token) pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from livemeet.backends.scripted import ScriptedCore
from livemeet.engine.block_manager import BlockManager
from livemeet.engine.request import Request
from livemeet.engine.scheduler import ScheduledBatch, Scheduler
from livemeet.transcriber import Samples, SessionOptions

Slot = tuple[int, int] | None  # (position, token id) whose KV the slot holds
# tokens per KV block the tests' pools are sized in (tiny pools that must preempt, block
# arithmetic), stated rather than taken from the production default (KV_BLOCK_SIZE)
TEST_BLOCK_SIZE = 16


def blocks_freed_by(bm: BlockManager, holders: list[Request]) -> int:
    """Blocks that freeing all of `holders` would return to `bm`'s pool, read from its public
    state: those whose every reference is one of theirs (a block two of them share too)."""
    held: dict[int, int] = {}
    for holder in holders:
        for block_id in holder.block_table:
            held[block_id] = held.get(block_id, 0) + 1
    return sum(1 for block_id, n in held.items() if bm.ref_count(block_id) == n)


class SteppingClock:
    """An engine clock (seconds) that moves `step_s` (10 ms) each time it is read."""

    def __init__(self, step_s: float = 0.01) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


class FakeClock:
    """Seconds; only moves when told to."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now_s += seconds


class FakeKV:
    """The KV tensor of a BlockManager pool, one (position, token) record per slot."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.slots: list[list[Slot]] = [[None] * block_size for _ in range(num_blocks)]

    def copy(self, src: int, dst: int, num_tokens: int) -> None:
        self.slots[dst][:num_tokens] = self.slots[src][:num_tokens]

    def write(self, request: Request, position: int, token_id: int) -> None:
        block = request.block_table[position // self.block_size]
        self.slots[block][position % self.block_size] = (position, token_id)

    def check_prefix(self, request: Request, num_tokens: int) -> None:
        """Assert that slots [0, num_tokens) of `request` hold its own tokens."""
        tokens = request.token_ids(0, num_tokens)
        for p in range(num_tokens):
            block = request.block_table[p // self.block_size]
            got = self.slots[block][p % self.block_size]
            assert got == (p, tokens[p]), f"{request.request_id} pos {p}: KV {got}"


def scripted_tokens(request: Request, step: int) -> int:
    """A deterministic 'model': token = hash of (request, output index), never EOS."""
    return 1000 + (sum(map(ord, request.request_id)) * 31 + step * 7) % 5000


@dataclass
class FakeRunner:
    """Executes ScheduledBatches against a FakeKV and checks every read and write.

    `sample(request, index)` gives the token sampled for a request's `index`-th output.
    """

    block_manager: BlockManager
    sample: Callable[[Request, int], int] = scripted_tokens
    check_reads: bool = True
    kv: FakeKV = field(init=False)

    def __post_init__(self) -> None:
        self.kv = FakeKV(self.block_manager.num_blocks, self.block_manager.block_size)

    def run(self, batch: ScheduledBatch) -> list[int]:
        for copy in batch.block_copies:
            self.kv.copy(copy.src, copy.dst, copy.num_tokens)
        for chunk in batch.prefills:
            req = chunk.request
            assert req.num_computed_tokens == chunk.start
            if self.check_reads:
                self.kv.check_prefix(req, chunk.start)
            tokens = req.token_ids(chunk.start, chunk.start + chunk.num_tokens)
            for i, tok in enumerate(tokens):
                self.kv.write(req, chunk.start + i, tok)
        for req in batch.decodes:
            assert req.is_decoding
            if self.check_reads:
                self.kv.check_prefix(req, req.num_tokens - 1)
            self.kv.write(req, req.num_tokens - 1, req.last_token_id)
        return [self.sample(r, r.num_output_tokens) for r in batch.sampled_requests]


def run_steps(
    scheduler: Scheduler,
    runner: FakeRunner,
    clock: FakeClock,
    num_steps: int,
    on_step: Callable[[ScheduledBatch], None] | None = None,
) -> list[ScheduledBatch]:
    """Drive schedule -> run -> postprocess, advancing the clock by each step's estimate
    (or 1 ms for an empty step) and auditing the allocator after every step; a step the
    scheduler said it would hold (`is_holding`) must be empty."""
    batches = []
    for _ in range(num_steps):
        holding = scheduler.is_holding(clock.now_s)
        batch = scheduler.schedule(clock.now_s)
        assert batch.is_empty or not holding, "is_holding() but the step is not empty"
        tokens = runner.run(batch)
        clock.advance(batch.estimated_cost_s if not batch.is_empty else 1e-3)
        scheduler.postprocess(batch, tokens)
        scheduler.block_manager.audit(scheduler.live_requests())
        batches.append(batch)
        if on_step is not None:
            on_step(batch)
    return batches


class RecordingCore(ScriptedCore):
    """The scripted backend, recording the commands it is given in order as (name, session
    id) pairs, and ("incoming", count) for set_incoming_uploads."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, object]] = []

    def open(self, session_id: str, options: SessionOptions) -> None:
        self.calls.append(("open", session_id))
        super().open(session_id, options)

    def append(self, session_id: str, samples: Samples) -> None:
        self.calls.append(("append", session_id))
        super().append(session_id, samples)

    def end(self, session_id: str) -> None:
        self.calls.append(("end", session_id))
        super().end(session_id)

    def set_incoming_uploads(self, count: int) -> None:
        self.calls.append(("incoming", count))
        super().set_incoming_uploads(count)
