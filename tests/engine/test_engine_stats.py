"""`Engine.stats()` on the tiny CPU model: steps by kind and tokens by phase match the batches the
scheduler handed out, in the synchronous and the async engine; with stub graph runners (CPU has
no CUDA graphs) a step is classified by which runner's replay counter moved during its launch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from livemeet.engine.engine import Engine, EngineConfig
from livemeet.engine.model_runner import TokenTransfer
from livemeet.engine.scheduler import ScheduledBatch, SchedulerConfig
from livemeet.models.audio_llm import MossTDModel
from tests.engine.fakes import SteppingClock

DURATIONS_S = (1.0, 3.0, 5.0)
MAX_NEW = 6
SCHED = SchedulerConfig(chunked_prefill_size=64, max_num_batched_tokens=96, max_num_seqs=4)


@pytest.fixture(scope="module")
def stats_clips(long_speech: np.ndarray) -> list[np.ndarray]:
    return [long_speech[: int(d * 16_000)] for d in DURATIONS_S]


def _engine(model: MossTDModel, *, asynchronous: bool) -> Engine:
    transfer = TokenTransfer(torch.device("cpu"), SCHED.max_num_seqs) if asynchronous else None
    config = EngineConfig(scheduler=SCHED)
    return Engine(config, model=(model, model.cfg), clock=SteppingClock(), transfer=transfer)


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
