"""Draft verification through the engine on the tiny checkpoint: whatever the draft, the
outputs, their stream and finish reasons are those of plain greedy decoding, synchronously and
with async decode, with forced output and under eviction; the accepted ids are counted."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from livemeet.engine.engine import Engine, EngineConfig
from livemeet.engine.model_runner import TokenTransfer
from livemeet.engine.request import RequestClass
from livemeet.engine.sampler import SamplingParams
from livemeet.engine.scheduler import SchedulerConfig
from livemeet.models.audio_llm import MossTDModel
from livemeet.transcript.segments import FinishReason
from tests.engine.fakes import TEST_BLOCK_SIZE, SteppingClock
from tests.models import tiny

MAX_NEW = 12
DURATIONS_S = (2.0, 5.0, 3.0, 7.0)
WRONG = 5  # an id no greedy output below starts with (checked)


def _engine(model: MossTDModel, *, asynchronous: bool, num_blocks: int | None = None) -> Engine:
    sched = SchedulerConfig(chunked_prefill_size=64, max_num_batched_tokens=256, max_num_seqs=8)
    config = EngineConfig(num_kv_blocks=num_blocks, block_size=TEST_BLOCK_SIZE, scheduler=sched)
    transfer = TokenTransfer(torch.device("cpu"), 256) if asynchronous else None
    return Engine(config, model=(model, model.cfg), clock=SteppingClock(), transfer=transfer)


def _run(engine: Engine, jobs: list[dict[str, object]]) -> tuple[dict, dict]:
    """Add every job at once (staggered by a step each), step to the end with the allocator
    audit after every step; returns the streamed ids and the finished requests by id."""
    streams: dict[str, list[int]] = defaultdict(list)
    done = {}
    pending = list(jobs)
    steps = 0
    while pending or engine.has_work():
        if pending:
            job = dict(pending.pop(0))
            engine.add_request(str(job.pop("rid")), job.pop("clip"), **job)  # type: ignore[arg-type]
        out = engine.step()
        engine.block_manager.audit(engine.scheduler.live_requests())
        for rid, token in out.new_tokens:
            assert rid not in done
            streams[rid].append(token)
        for r in out.finished:
            done[r.request_id] = r
        steps += 1
        assert steps < 500
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return dict(streams), done


@pytest.fixture(scope="module")
def clips(long_speech: np.ndarray) -> list[np.ndarray]:
    return [long_speech[: int(d * 16_000)] for d in DURATIONS_S]


@pytest.fixture(scope="module")
def greedy(our_model: MossTDModel, clips: list[np.ndarray]) -> list[list[int]]:
    """Each clip's greedy outputs without a draft (the reference)."""
    jobs = [{"rid": f"r{i}", "clip": c, "max_new_tokens": MAX_NEW} for i, c in enumerate(clips)]
    _, done = _run(_engine(our_model, asynchronous=False), jobs)
    outs = [done[f"r{i}"].output_token_ids for i in range(len(clips))]
    assert all(out[0] != WRONG for out in outs)
    return outs


def _drafts(greedy: list[list[int]]) -> list[tuple[list[int], int]]:
    """(draft, decode steps it should save) per clip: right then wrong, all right past the
    length limit, wrong at once, right up to one before the limit."""
    return [
        (greedy[0][:5] + [WRONG, WRONG], 5),
        (greedy[1] + [WRONG] * 4, MAX_NEW - 1),  # the limit cuts it: 11 steps saved
        ([WRONG] * 6, 0),
        (greedy[3][: MAX_NEW - 1], MAX_NEW - 1),
    ]


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("num_blocks", [None, 12])  # 12 blocks: requests get evicted
def test_any_draft_gives_the_greedy_outputs(
    our_model: MossTDModel,
    clips: list[np.ndarray],
    greedy: list[list[int]],
    asynchronous: bool,
    num_blocks: int | None,
) -> None:
    drafts = _drafts(greedy)
    jobs = [
        {
            "rid": f"r{i}",
            "clip": c,
            "max_new_tokens": MAX_NEW,
            "draft_token_ids": drafts[i][0],
            "request_class": RequestClass.LIVE if i == 3 else RequestClass.UPLOAD,
        }
        for i, c in enumerate(clips)
    ]
    engine = _engine(our_model, asynchronous=asynchronous, num_blocks=num_blocks)
    streams, done = _run(engine, jobs)
    for i in range(len(clips)):
        r = done[f"r{i}"]
        assert r.output_token_ids == streams[f"r{i}"] == greedy[i], i
        assert r.num_accepted_draft_tokens == drafts[i][1], i
        assert r.num_draft_tokens == 0
    stats = engine.stats()
    assert stats.num_draft_tokens == sum(len(d) for d, _ in drafts)
    evicted = sum(r.num_preemptions for r in done.values())
    if num_blocks is None:
        assert evicted == 0
        assert stats.num_accepted_draft_tokens == sum(n for _, n in drafts)
        # a verifying chunk samples the draft's ids at once: fewer decode rows than outputs
        assert stats.num_decode_tokens < sum(len(g) for g in greedy) - sum(n for _, n in drafts)
    else:
        assert evicted > 0, "the small pool should evict a request"


@pytest.mark.parametrize("asynchronous", [False, True])
def test_forced_output_verifies_a_draft_and_stops_at_its_end(
    our_model: MossTDModel, clips: list[np.ndarray], asynchronous: bool
) -> None:
    forced = [101, 102, 103, 104]
    engine = _engine(our_model, asynchronous=asynchronous)
    job = {"rid": "f", "clip": clips[0], "max_new_tokens": MAX_NEW, "forced_output_ids": forced}
    _, done = _run(engine, [{**job, "draft_token_ids": [101, 102, 999]}])
    assert done["f"].output_token_ids == [*forced, tiny.IM_END]
    assert done["f"].num_accepted_draft_tokens == 2
    # the whole forced output as the draft: one prefill step gives every id and the stop
    engine = _engine(our_model, asynchronous=asynchronous)
    _, done = _run(engine, [{**job, "draft_token_ids": forced}])
    assert done["f"].output_token_ids == [*forced, tiny.IM_END]
    assert engine.stats().num_decode_tokens == 0


def test_a_sampled_request_drops_its_draft(our_model: MossTDModel, clips: list[np.ndarray]) -> None:
    engine = _engine(our_model, asynchronous=False)
    request = engine.add_request(
        "s", clips[0], max_new_tokens=4, draft_token_ids=[1, 2], sampling=SamplingParams(0.7)
    )
    assert request.num_draft_tokens == 0 and engine.stats().num_draft_tokens == 0


@pytest.mark.parametrize("action", ["preempt", "abort"])
def test_a_verifying_request_evicted_or_aborted_while_its_ids_are_in_flight(
    our_model: MossTDModel, clips: list[np.ndarray], greedy: list[list[int]], action: str
) -> None:
    """Async decode: the verifying chunk is launched and accounted with placeholders; the
    request is then evicted (it is recomputed and verified again: the greedy outputs) or
    aborted (nothing more comes out) before its ids are read; the pool ends clean."""
    engine = _engine(our_model, asynchronous=True)
    engine.add_request("r", clips[0], max_new_tokens=MAX_NEW, draft_token_ids=greedy[0][:4])
    streams: list[int] = []
    done = {}
    request = engine.scheduler.get("r")
    assert request is not None
    for _ in range(200):
        out = engine.step()
        streams += [t for rid, t in out.new_tokens if rid == "r"]
        done.update((q.request_id, q) for q in out.finished)
        if engine.scheduler.is_verifying(request) and action not in ("done",):
            if action == "preempt":
                assert engine.preempt("r")
            else:
                engine.abort("r")
            action = "done"
        if not engine.has_work():
            break
    assert action == "done", "the verifying chunk was never in flight"
    engine.block_manager.audit(engine.scheduler.live_requests())
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    if "r" in done and done["r"].finish_reason is not FinishReason.ABORT:
        assert streams == done["r"].output_token_ids == greedy[0]
        assert done["r"].num_accepted_draft_tokens == 4
    else:
        assert streams == []
