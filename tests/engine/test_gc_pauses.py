"""livemeet.engine.gc_pauses: the collector's runs counted and timed while installed, and the
start-up heap frozen out of later collections."""

from __future__ import annotations

import gc
import queue

from livemeet.engine.gc_pauses import GcPauses, freeze_startup_heap, thaw_heap
from livemeet.engine.messages import EngineStats
from livemeet.engine.worker import Worker
from tests.engine.fakes import FakeClock, SteppingClock
from tests.engine.test_worker import StatsCore


def ticking_clock() -> SteppingClock:
    """Each read is 0.25 s after the previous one: a collection lasts one tick."""
    return SteppingClock(0.25)


def test_collections_counted_and_timed_while_installed() -> None:
    pauses = GcPauses(clock=ticking_clock())
    with pauses:
        gc.collect(0)
        gc.collect(1)
        gc.collect(2)
    assert pauses.num_collections >= 3  # others may run on their own meanwhile
    assert pauses.num_full_collections >= 1
    assert pauses.pause_s == 0.25 * pauses.num_collections
    assert pauses.pause_max_s == 0.25
    before = pauses.num_collections
    gc.collect()  # removed: not seen
    assert pauses.num_collections == before
    assert pauses._on_gc not in gc.callbacks


def test_a_stop_without_its_start_is_ignored() -> None:
    pauses = GcPauses(clock=ticking_clock())
    pauses._on_gc("stop", {"generation": 2})  # installed mid-collection
    assert pauses.num_collections == 0 and pauses.pause_s == 0.0


def test_freeze_moves_the_live_heap_out_of_collections_and_thaw_back() -> None:
    try:
        frozen = freeze_startup_heap()
        assert frozen > 1000  # at least pytest's and torch's objects
        # A frozen object that dies leaves the count (another thread may drop one meanwhile:
        # CI once saw 2 fewer), so the count can only have fallen since the freeze.
        assert 0.99 * frozen <= gc.get_freeze_count() <= frozen
        tracked = len(gc.get_objects())  # frozen objects are not in any generation
        assert tracked < frozen
    finally:
        thaw_heap()  # the test runner's heap goes back to the collector
    assert gc.get_freeze_count() == 0


def test_worker_stats_carry_the_collections() -> None:
    clock = FakeClock()
    pauses = GcPauses(clock=ticking_clock())
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(StatsCore(clock, work=0, step_s=0.1), outbox, gc_pauses=pauses)
    with pauses:
        gc.collect(2)
    worker.post_stats(clock.now_s)
    stats = outbox.get_nowait()
    assert isinstance(stats, EngineStats)
    assert stats.num_gc_collections == pauses.num_collections >= 1
    assert stats.num_gc_full_collections >= 1
    assert stats.gc_pause_s == pauses.pause_s and stats.gc_pause_max_s == 0.25
