"""`Engine.stats()` on the tiny CPU model: steps by kind and tokens by phase match the batches the
scheduler handed out, in the synchronous and the async engine; with stub graph runners (CPU has
no CUDA graphs) a step is classified by which runner's replay counter moved during its launch;
with a manual timer, each part of a step is charged its own host seconds and a slow step is
counted and logged with its shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from livemeet.audio.constants import ENGINE_SLOW_STEP_S
from livemeet.engine.engine import Engine, EngineConfig
from livemeet.engine.model_runner import TokenTransfer
from livemeet.engine.scheduler import ScheduledBatch, SchedulerConfig
from livemeet.models.audio_llm import MossTDModel
from tests.engine.fakes import TEST_BLOCK_SIZE, FakeClock, SteppingClock

DURATIONS_S = (1.0, 3.0, 5.0)
MAX_NEW = 6
SCHED = SchedulerConfig(chunked_prefill_size=64, max_num_batched_tokens=96, max_num_seqs=4)


@pytest.fixture(scope="module")
def stats_clips(long_speech: np.ndarray) -> list[np.ndarray]:
    return [long_speech[: int(d * 16_000)] for d in DURATIONS_S]


def _engine(
    model: MossTDModel, *, asynchronous: bool, timer: Callable[[], float] = time.perf_counter
) -> Engine:
    transfer = TokenTransfer(torch.device("cpu"), SCHED.max_num_seqs) if asynchronous else None
    config = EngineConfig(block_size=TEST_BLOCK_SIZE, scheduler=SCHED)
    return Engine(
        config, model=(model, model.cfg), clock=SteppingClock(), timer=timer, transfer=transfer
    )


def _record_batches(engine: Engine) -> list[ScheduledBatch]:
    """Every non-empty batch the engine's scheduler hands out, in order."""
    batches: list[ScheduledBatch] = []
    inner = engine.scheduler.schedule

    def schedule(now_s: float) -> ScheduledBatch:
        batch = inner(now_s)
        if not batch.is_empty:
            batches.append(batch)
        return batch

    engine.scheduler.schedule = schedule  # type: ignore[method-assign]
    return batches


def _run(engine: Engine, clips: list[np.ndarray]) -> int:
    """Run every clip to MAX_NEW tokens; returns the prompt tokens submitted."""
    requests = [
        engine.add_request(f"r{i}", clip, max_new_tokens=MAX_NEW, ignore_eos=True)
        for i, clip in enumerate(clips)
    ]
    assert len(engine.run_to_completion()) == len(clips)
    return sum(r.num_prompt_tokens for r in requests)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_steps_and_tokens_match_the_scheduled_batches(
    our_model: MossTDModel, stats_clips: list[np.ndarray], asynchronous: bool
) -> None:
    engine = _engine(our_model, asynchronous=asynchronous)
    batches = _record_batches(engine)
    num_prompt_tokens = _run(engine, stats_clips)
    stats = engine.stats()
    with_prefill = [b for b in batches if b.prefills]
    assert stats.num_prefill_steps == len(with_prefill) > 0
    assert stats.num_decode_steps == len(batches) - len(with_prefill) > 0
    assert stats.num_steps == len(batches)
    assert any(b.decodes for b in with_prefill), "expected mixed prefill + decode steps"
    # CPU: no CUDA graphs, so every step is eager and none is a fallback
    assert stats.num_prefill_eager_steps == stats.num_prefill_steps
    assert stats.num_decode_eager_steps == stats.num_decode_steps
    assert stats.num_decode_graph_fallbacks == 0
    # no preemption or prefix reuse: every prompt token is prefilled once; each request's
    # first output comes from its last prefill chunk, the other MAX_NEW - 1 from decode rows
    assert stats.num_prefill_tokens == num_prompt_tokens
    assert stats.num_decode_tokens == len(stats_clips) * (MAX_NEW - 1)


class StubDecodeGraphs:
    """Stands in for a GraphRunner that never fits a batch: the runner falls back (eager)."""

    num_replays = 0
    num_eager_fallbacks = 0

    def can_run(self, num_rows: int, max_blocks: int) -> bool:
        return False


class StubPiecewise:
    """Stands in for a PiecewiseRunner that fits nothing: prefill runs eagerly."""

    num_replays = 0

    def fits(self, num_tokens: int) -> bool:
        return False


def test_graph_replays_and_fallbacks_classify_steps(
    our_model: MossTDModel, stats_clips: list[np.ndarray]
) -> None:
    engine = _engine(our_model, asynchronous=False)
    graphs, piecewise = StubDecodeGraphs(), StubPiecewise()
    engine.runner.graphs = graphs  # type: ignore[assignment]
    engine.runner.piecewise = piecewise  # type: ignore[assignment]
    launch = engine.runner.launch
    launched: list[tuple[bool, bool]] = []  # (has a prefill, pretended a replay) per step

    def replaying_launch(batch: ScheduledBatch, *args: Any, **kwargs: Any) -> Any:
        replay = len(launched) % 2 == 0  # every other step "replays" its runner's graph
        if replay and batch.prefills:
            piecewise.num_replays += 1
        elif replay:
            graphs.num_replays += 1
        launched.append((bool(batch.prefills), replay))
        return launch(batch, *args, **kwargs)

    engine.runner.launch = replaying_launch  # type: ignore[method-assign]
    _run(engine, stats_clips)
    stats = engine.stats()
    assert stats.num_prefill_graph_steps == launched.count((True, True)) > 0
    assert stats.num_prefill_eager_steps == launched.count((True, False)) > 0
    assert stats.num_decode_graph_steps == launched.count((False, True)) > 0
    assert stats.num_decode_eager_steps == launched.count((False, False)) > 0
    # decode graphs exist, so every eager decode step is a fallback
    assert stats.num_decode_graph_fallbacks == stats.num_decode_eager_steps


@pytest.mark.parametrize("asynchronous", [False, True])
def test_host_seconds_by_part_and_slow_steps(
    our_model: MossTDModel,
    stats_clips: list[np.ndarray],
    asynchronous: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stall inside one part of a step (here: encoding, as a first-time library set-up
    would) lands in that part's seconds, and the step is counted slow and logged."""
    timer = FakeClock()
    engine = _engine(our_model, asynchronous=asynchronous, timer=lambda: timer.now_s)
    stall_s, launch_s, wait_s = ENGINE_SLOW_STEP_S + 0.25, 0.002, 0.003
    calls = {"encode": 0, "launch": 0, "wait": 0}

    def timed(name: str, seconds: float, inner: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            timer.advance(seconds)
            return inner(*args, **kwargs)

        return call

    # the engine encodes through encode_filling (queued live audio may ride in the padding)
    encode = timed("encode", stall_s, engine.encoder.encode_filling)
    engine.encoder.encode_filling = encode  # type: ignore[method-assign]
    engine.runner.launch = timed("launch", launch_s, engine.runner.launch)  # type: ignore[method-assign]
    if engine.transfer is not None:
        engine.transfer.wait = timed("wait", wait_s, engine.transfer.wait)  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="livemeet.engine.engine"):
        _run(engine, stats_clips)
    stats = engine.stats()
    assert calls["encode"] > 0 and calls["launch"] == stats.num_steps
    assert stats.encode_s == pytest.approx(calls["encode"] * stall_s)
    assert stats.launch_s == pytest.approx(calls["launch"] * launch_s)
    assert stats.wait_s == pytest.approx(calls["wait"] * wait_s)  # sync: tolist, no time
    assert stats.schedule_s == stats.other_s == 0.0  # the timer moved nowhere else
    assert sum(stats.host_s.values()) == pytest.approx(timer.now_s)
    # each step that encoded took stall_s + launch_s (+ wait_s): slow; no other step was
    assert stats.num_slow_steps == calls["encode"]
    slow = [r.getMessage() for r in caplog.records if "slow engine step" in r.getMessage()]
    assert len(slow) == calls["encode"]
    assert f"encode {1e3 * stall_s:.1f} ms" in slow[0]
    assert "audio windows encoded" in slow[0] and "prefill chunks of" in slow[0]
