"""Python's cyclic garbage collector in the long-running processes: freeze what start-up
built, and time every collection.

A collection of the oldest generation walks every tracked container the process holds. An
engine worker holds ~300k of them from start-up alone (torch, the model's modules, the
tokenizer): one full collection of a loaded small-model MossCore took ~150 ms on a 2-core CPU
(docs/benchmarks.md, session 20), time in which the engine thread launches nothing. A device
trace of 100 live sessions on an H200 showed such a stop: 230 ms without a CUDA call, the GPU
idle, once in a 3-s window. `freeze_startup_heap` collects once and then moves everything
alive into the permanent generation (`gc.freeze`), which later collections skip: after it the
same collection took microseconds. Objects made later (sessions, requests) are collected as
before, and they still cost: at 100 live sessions, after the freeze, full collections came
about once a minute and took up to 85 ms, all collections ~2 % of the worker's time (a list
of token ids is traversed item by item). A cycle among the frozen objects that becomes garbage
is never freed, which is why this runs once, after start-up, in a process of our own.

`GcPauses` times each collection through `gc.callbacks`, so the worker's stats show what the
collector costs while serving (`EngineStats.gc_pause_s` and the counts beside it).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

OLDEST_GENERATION = 2  # CPython's generations: 0, 1, 2 (the "full" collection)


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive (module docstring). Returns how many objects
    are frozen. Call once, after start-up, only in a process of our own (a test runner's heap
    would stay frozen), and `thaw_heap` before it exits."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> None:
    """Hand the frozen objects back to the collector (shutdown: extension modules that count
    their objects at exit, such as Triton's bindings, report the frozen ones as leaked)."""
    gc.unfreeze()


class GcPauses:
    """Counts and times the collector's runs while installed (`install` ... `remove`, or
    `with GcPauses() as pauses:`). `clock`: seconds (time.perf_counter by default)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.num_collections = 0  # collections of any generation
        self.num_full_collections = 0  # of them, of the oldest generation
        self.pause_s = 0.0  # s; summed time inside collections
        self.pause_max_s = 0.0  # s; the longest collection
        self._started_s: float | None = None
        self._installed = False

    def install(self) -> None:
        """Start timing collections (once; a second call does nothing)."""
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def remove(self) -> None:
        """Stop timing them; the counts stay (no-op when not installed)."""
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def __enter__(self) -> GcPauses:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_s = self.clock()
            return
        if self._started_s is None:  # installed during a collection: its start went unseen
            return
        pause_s = self.clock() - self._started_s
        self._started_s = None
        self.num_collections += 1
        if info.get("generation") == OLDEST_GENERATION:
            self.num_full_collections += 1
        self.pause_s += pause_s
        self.pause_max_s = max(self.pause_max_s, pause_s)
