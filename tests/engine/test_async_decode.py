"""Async decode (one-step lookahead) on the CPU, against the synchronous engine.

The CPU "device" of TokenTransfer copies at once, so the engine's async path runs unchanged:
placeholders in the scheduler, input ids read from the previous step's device tensor, real ids
resolved one step late. Same greedy tokens, finish reasons and per-request token streams as the
synchronous engine for a mixed workload (forced output places EOS deterministically, one EOS at
the length limit, natural tokens to a length limit, staggered arrivals, chunked prefill mixed
with decode, a KV pool small enough to preempt); the allocator audit is clean after every step
and every block is free at the end; aborts between steps are honoured.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest
import torch

from livemeet.engine.engine import Engine, EngineConfig
from livemeet.engine.model_runner import PENDING_TOKEN_ID, DeviceTokens, TokenTransfer
from livemeet.engine.request import Request, RequestClass, Status
from livemeet.engine.scheduler import PrefillChunk, ScheduledBatch, SchedulerConfig
from livemeet.errors import InternalError
from livemeet.models.audio_llm import MossTDModel
from livemeet.transcript.segments import FinishReason
from tests.engine.fakes import TEST_BLOCK_SIZE, SteppingClock
from tests.models import tiny

DURATIONS_S = (1.0, 3.0, 5.0, 8.0, 11.0, 2.0)
MAX_NEW = 12
# request index -> forced output ids (EOS follows them); the rest decode freely to MAX_NEW
FORCED = {0: [101, 102, 103], 2: [7] * 5, 4: list(range(300, 300 + MAX_NEW - 1)), 5: []}
EOS_AT_LIMIT = 4  # forced EOS lands exactly on max_new_tokens: STOP wins over LENGTH
LIVE = 5  # arrives last as a live hop: preempts uploads when the pool is small
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def short_clips(long_speech: np.ndarray) -> list[np.ndarray]:
    return [long_speech[: int(d * 16_000)] for d in DURATIONS_S]


def _engine(model: MossTDModel, *, asynchronous: bool, num_blocks: int | None) -> Engine:
    sched = SchedulerConfig(chunked_prefill_size=64, max_num_batched_tokens=256, max_num_seqs=8)
    config = EngineConfig(num_kv_blocks=num_blocks, block_size=TEST_BLOCK_SIZE, scheduler=sched)
    transfer = TokenTransfer(CPU, sched.max_num_seqs) if asynchronous else None
    return Engine(config, model=(model, model.cfg), clock=SteppingClock(), transfer=transfer)


def _add(engine: Engine, i: int, clip: np.ndarray) -> None:
    engine.add_request(
        f"r{i}",
        clip,
        max_new_tokens=MAX_NEW,
        forced_output_ids=FORCED.get(i),
        request_class=RequestClass.LIVE if i == LIVE else RequestClass.UPLOAD,
    )


def _drive(
    engine: Engine, clips: list[np.ndarray], abort_at: dict[int, str] | None = None
) -> tuple[dict[str, list[int]], dict[str, Request]]:
    """Staggered arrivals (one every second step), optional aborts before given steps; audits
    after every step. Returns the streamed tokens per request and the finished requests."""
    streams: dict[str, list[int]] = defaultdict(list)
    finished: dict[str, Request] = {}
    pending = list(enumerate(clips))
    step = 0
    while pending or engine.has_work():
        if pending and step % 2 == 0:
            _add(engine, *pending.pop(0))
        if abort_at and step in abort_at:
            engine.abort(abort_at[step])
        out = engine.step()
        engine.block_manager.audit(engine.scheduler.live_requests())
        for rid, token in out.new_tokens:
            assert token != PENDING_TOKEN_ID
            assert rid not in finished, f"{rid} got a token after it finished"
            streams[rid].append(token)
        for req in out.finished:
            assert req.request_id not in finished, f"{req.request_id} finished twice"
            finished[req.request_id] = req
        step += 1
        assert step < 1000
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "a KV block leaked"
    return dict(streams), finished


def _expected_reason(i: int) -> FinishReason:
    return FinishReason.STOP if i in FORCED else FinishReason.LENGTH


def test_async_matches_sync_with_eos_and_preemption(
    our_model: MossTDModel, short_clips: list[np.ndarray]
) -> None:
    num_blocks = 24  # 384 tokens for ~900 of prompts and outputs: the live hop preempts
    sync_streams, sync_done = _drive(
        _engine(our_model, asynchronous=False, num_blocks=num_blocks), short_clips
    )
    engine = _engine(our_model, asynchronous=True, num_blocks=num_blocks)
    async_streams, async_done = _drive(engine, short_clips)
    assert async_streams == sync_streams
    assert set(async_done) == set(sync_done) == {f"r{i}" for i in range(len(short_clips))}
    for i in range(len(short_clips)):
        rid = f"r{i}"
        a, s = async_done[rid], sync_done[rid]
        assert a.output_token_ids == s.output_token_ids == async_streams[rid]
        assert a.finish_reason is s.finish_reason is _expected_reason(i), rid
        if i in FORCED:  # the stop token is the last one, never lost
            assert a.output_token_ids == [*FORCED[i], tiny.IM_END]
        else:
            assert len(a.output_token_ids) == MAX_NEW
    assert len(async_done[f"r{EOS_AT_LIMIT}"].output_token_ids) == MAX_NEW
    preempted = sum(r.num_preemptions for r in async_done.values())
    assert preempted > 0, "the small pool should have preempted a request"


def test_eos_request_gets_a_speculative_row_that_is_dropped(
    our_model: MossTDModel, short_clips: list[np.ndarray]
) -> None:
    engine = _engine(our_model, asynchronous=True, num_blocks=None)
    batches: list[ScheduledBatch] = []
    schedule = engine.scheduler.schedule

    def spy(now_s: float) -> ScheduledBatch:
        batches.append(schedule(now_s))
        return batches[-1]

    engine.scheduler.schedule = spy  # type: ignore[method-assign]
    _add(engine, 0, short_clips[0])
    streams, done = _drive(engine, [])
    forced = FORCED[0]
    assert streams["r0"] == [*forced, tiny.IM_END]
    decoded = [b for b in batches if any(r.request_id == "r0" for r in b.decodes)]
    # the prefill samples token 0; decodes sample tokens 1..len(forced) (the last is EOS);
    # then one more row ran before EOS was known on the host, and its token was dropped
    assert len(decoded) == len(forced) + 1
    assert done["r0"].finish_reason is FinishReason.STOP


def test_launch_of_next_step_precedes_reading_the_previous(
    our_model: MossTDModel, short_clips: list[np.ndarray]
) -> None:
    engine = _engine(our_model, asynchronous=True, num_blocks=None)
    events: list[str] = []
    launch, wait = engine.runner.launch, engine.transfer.wait  # type: ignore[union-attr]

    def spy_launch(*args: Any, **kwargs: Any) -> DeviceTokens | None:
        tokens = launch(*args, **kwargs)
        events.append("launch" if tokens is None else "launch+sample")
        return tokens

    def spy_wait(ticket: int) -> list[int]:
        events.append("wait")
        return wait(ticket)

    engine.runner.launch = spy_launch  # type: ignore[method-assign]
    engine.transfer.wait = spy_wait  # type: ignore[method-assign, union-attr]
    _add(engine, 1, short_clips[1])
    _drive(engine, [])
    waits = [i for i, e in enumerate(events) if e == "wait"]
    assert len(waits) == events.count("launch+sample") > 1
    # every wait but the last (nothing left to launch) comes right after the next launch
    assert all(events[i - 1].startswith("launch") for i in waits[:-1])
    assert events[-1] == "wait"


def test_aborts_between_steps_are_honoured(
    our_model: MossTDModel, short_clips: list[np.ndarray]
) -> None:
    # r1 aborted while decoding (a pending token in flight), r3 before it was even admitted
    aborts = {9: "r1", 6: "r3"}
    clips = short_clips[:4]
    sync_streams, sync_done = _drive(
        _engine(our_model, asynchronous=False, num_blocks=None), clips, aborts
    )
    engine = _engine(our_model, asynchronous=True, num_blocks=None)
    async_streams, async_done = _drive(engine, clips, aborts)
    for rid in aborts.values():
        assert rid not in async_done and rid not in sync_done
    # async learns tokens one step late, so an aborted request has streamed a prefix of what
    # the synchronous engine streamed by the same step
    got, ref = async_streams.get("r1", []), sync_streams.get("r1", [])
    assert got and got == ref[: len(got)] and len(got) < len(ref)
    assert "r3" not in async_streams
    for rid in async_done:
        assert async_streams[rid] == sync_streams[rid]
    assert engine.scheduler.get("r1") is None


def test_an_abort_after_the_last_token_was_launched_is_honoured(
    our_model: MossTDModel, short_clips: list[np.ndarray]
) -> None:
    """A request whose in-flight token reaches its length limit is finished by the
    scheduler at launch (placeholder); aborted before that step is read, it got its token and
    its finish anyway, and the resolve forgot its id's state: a new request under the same id,
    added meanwhile, lost its audio (KeyError at its next chunk)."""
    engine = _engine(our_model, asynchronous=True, num_blocks=None)
    x = engine.add_request("x", short_clips[0], max_new_tokens=1)
    while not x.output_token_ids:
        assert not engine.step().finished
    assert x.finish_reason is FinishReason.LENGTH and engine._in_flight is not None
    engine.abort("x")
    again = engine.add_request("x", short_clips[4], max_new_tokens=2)  # 11 s: several chunks
    streams: dict[str, list[int]] = defaultdict(list)
    while engine.has_work():
        out = engine.step()
        for rid, token in out.new_tokens:
            streams[rid].append(token)
        assert all(r is again for r in out.finished)
    assert x.finish_reason is FinishReason.ABORT
    assert again.finish_reason is FinishReason.LENGTH and streams["x"] == again.output_token_ids


def test_token_transfer_two_buffers() -> None:
    transfer = TokenTransfer(CPU, capacity=4)
    a = transfer.start(torch.tensor([1, 2, 3]))
    b = transfer.start(torch.tensor([4]))
    assert transfer.num_busy == 2
    with pytest.raises(InternalError, match="busy"):
        transfer.start(torch.tensor([5]))
    assert transfer.wait(a) == [1, 2, 3]
    with pytest.raises(InternalError, match="not in flight"):
        transfer.wait(a)
    c = transfer.start(torch.tensor([6, 7]))
    assert (transfer.wait(b), transfer.wait(c)) == ([4], [6, 7])
    with pytest.raises(InternalError, match="exceed"):
        transfer.start(torch.arange(5))
    with pytest.raises(InternalError, match="not in flight"):
        transfer.wait(7)


def test_runner_rejects_pending_tokens_it_cannot_resolve(
    our_model: MossTDModel, short_clips: list[np.ndarray]
) -> None:
    engine = _engine(our_model, asynchronous=True, num_blocks=None)
    _add(engine, 1, short_clips[1])
    req = engine.scheduler.get("r1")
    assert req is not None
    while not req.output_token_ids:
        engine.step()  # the last prefill chunk launched: its sampled token is pending
    assert req is not None and req.output_token_ids == [PENDING_TOKEN_ID]
    assert req.status is Status.RUNNING and req.is_decoding
    batch = engine.scheduler.schedule(1.0)
    assert batch.decodes == (req,)
    with pytest.raises(InternalError, match="nobody sampled"):
        engine.runner.launch(batch, engine._audio, lambda r: engine._sampling_of(r))
    other = DeviceTokens(torch.tensor([5]), {"someone-else": 0})
    with pytest.raises(InternalError, match="nobody sampled"):
        engine.runner.launch(batch, {}, lambda r: engine._sampling_of(r), previous=other)
    recompute = ScheduledBatch(now_s=1.0, prefills=(PrefillChunk(req, 0, req.num_tokens, True),))
    with pytest.raises(InternalError, match="pending token"):
        engine.runner.launch(recompute, engine._audio, lambda r: engine._sampling_of(r))
