"""Draft verification in the scheduler (livemeet.engine.request): where chunks are cut, what a
verifying chunk samples, acceptance (KV truncated, outputs, finish), async placeholders, forks
and eviction; plain Python, the allocator audit after every change."""

from __future__ import annotations

import pytest

from livemeet.engine.block_manager import BlockManager
from livemeet.engine.request import Request, RequestClass
from livemeet.engine.scheduler import Scheduler, SchedulerConfig, SchedulerError
from livemeet.errors import InvalidRequest
from livemeet.transcript.segments import FinishReason

EOS = SchedulerConfig().eos_token_id


def drafted(rid: str, n: int, draft: list[int], *, max_new: int = 8) -> Request:
    """A request of n - len(draft) prompt ids 0.. followed by `draft`."""
    ids = list(range(n - len(draft))) + draft
    return Request(rid, ids, max_new_tokens=max_new, num_draft_tokens=len(draft))


def make(num_blocks: int = 64, **cfg: object) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, 16), SchedulerConfig(**cfg))  # type: ignore[arg-type]


def audit(sched: Scheduler) -> None:
    sched.block_manager.audit(sched.live_requests())


def test_request_validates_its_draft() -> None:
    with pytest.raises(InvalidRequest, match="draft"):
        Request("r", [1, 2, 3], num_draft_tokens=3)  # nothing before the draft to sample from
    with pytest.raises(InvalidRequest, match="draft"):
        Request("r", [1, 2, 3], num_draft_tokens=-1)
    r = Request("r", [1, 2, 3, 4], num_draft_tokens=2)
    assert r.verify_from == 1


def test_no_chunk_ends_inside_the_rows_that_verify() -> None:
    draft = [900 + i for i in range(10)]
    sched = make(chunked_prefill_size=95, max_num_batched_tokens=128)
    r = drafted("r", 100, draft)
    sched.add(r)
    first = sched.schedule(0.0)
    (chunk,) = first.prefills
    # 95 would end inside the draft: the chunk stops before the row that predicts draft[0]
    assert (chunk.start, chunk.num_tokens, chunk.samples, chunk.num_verify) == (0, 89, False, 0)
    assert first.sample_counts == ()
    sched.postprocess(first, [])
    second = sched.schedule(0.0)
    (chunk,) = second.prefills
    assert (chunk.start, chunk.num_tokens, chunk.samples, chunk.num_verify) == (89, 11, True, 10)
    assert second.sample_counts == (11,)
    audit(sched)


@pytest.mark.parametrize("matching", [0, 4, 10])
def test_acceptance_keeps_the_matching_prefix_and_the_sample_after_it(matching: int) -> None:
    draft = [900 + i for i in range(10)]
    sched = make()
    r = drafted("r", 100, draft, max_new=20)
    sched.add(r)
    batch = sched.schedule(0.0)
    assert batch.sample_counts == (11,)
    # samples equal the draft for `matching` ids, then differ
    values = draft[:matching] + [7] * (11 - matching)
    out = sched.postprocess(batch, values)
    expected = values[: matching + 1]
    assert out.new_tokens == tuple(("r", t) for t in expected) and not out.finished
    assert r.output_token_ids == expected and r.num_draft_tokens == 0
    assert r.prompt_token_ids == list(range(90)) and r.num_accepted_draft_tokens == matching
    # KV for the prompt and the accepted ids; the last sample is the next decode row
    assert r.num_computed_tokens == 90 + matching and r.is_decoding
    assert len(r.block_table) == sched.block_manager.num_blocks_for(90 + matching)
    audit(sched)
    decode = sched.schedule(0.0)
    assert decode.decodes == (r,) and not decode.prefills


def test_a_stop_token_or_the_length_limit_among_the_accepted_ids_finishes() -> None:
    draft = [900, 901, EOS, 903]
    sched = make()
    r = drafted("r", 40, draft)
    sched.add(r)
    out = sched.postprocess(sched.schedule(0.0), [900, 901, EOS, 903, 5])
    assert r.output_token_ids == [900, 901, EOS] and out.finished == (r,)
    assert r.finish_reason is FinishReason.STOP
    assert r.num_accepted_draft_tokens == 2  # 3 outputs in one step
    r2 = drafted("r2", 40, [1, 2, 3, 4, 5], max_new=3)
    sched.add(r2, retain_kv=True)
    out = sched.postprocess(sched.schedule(0.0), [1, 2, 3, 4, 5, 6])
    assert r2.output_token_ids == [1, 2, 3] and r2.finish_reason is FinishReason.LENGTH
    # as after decoding them one by one: every output but the last has KV, 2 steps saved
    assert r2.num_accepted_draft_tokens == 2 and r2.num_computed_tokens == r2.num_tokens - 1
    audit(sched)
    # the retained cache forks like any other (its KV ends where its tokens say)
    nxt = Request("n", r2.all_token_ids + [9], max_new_tokens=2)
    assert sched.add(nxt, fork_from="r2", num_fork_tokens=10_000) == r2.num_tokens - 1
    sched.abort("n")
    audit(sched)
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_the_verifying_rows_fit_beside_a_running_upload_past_the_live_share() -> None:
    """Live work may use (1 - upload_min_share) of a step's tokens while an upload runs: 48 of
    64 here. A 63-id draft's 64 verifying rows still go in one chunk (they cannot be split)
    instead of waiting for the upload to end."""
    sched = make(chunked_prefill_size=64, max_num_batched_tokens=64, max_num_seqs=8)
    upload = Request("u", list(range(20)), max_new_tokens=50)
    sched.add(upload)
    sched.postprocess(sched.schedule(0.0), [7])  # the upload decodes from now on
    hop = drafted("h", 100, [500 + i for i in range(63)])
    hop.request_class = RequestClass.LIVE
    sched.add(hop)
    for _ in range(4):
        batch = sched.schedule(0.0)
        sched.postprocess(batch, [7] * sum(batch.sample_counts))
        if hop.output_token_ids:
            break
    assert hop.output_token_ids and hop.num_draft_tokens == 0
    audit(sched)


def test_async_placeholders_leave_the_request_verifying_until_accepted() -> None:
    sched = make()
    r = drafted("r", 50, [900, 901, 902])
    other = Request("o", list(range(30)), max_new_tokens=8)
    sched.add(r)
    sched.add(other)
    batch = sched.schedule(0.0)
    assert batch.sample_counts == (4, 1)
    out = sched.postprocess(batch, [-1] * 5, pending=True)
    assert out.new_tokens == (("o", -1),)  # the plain request gets its placeholder
    assert sched.is_verifying(r) and not r.output_token_ids
    nxt = sched.schedule(0.0)  # the verifying request neither decodes nor prefills
    assert r not in nxt.decodes and all(c.request is not r for c in nxt.prefills)
    tokens, reason = sched.accept_draft(r, [900, 5, 6, 7])
    assert tokens == [900, 5] and reason is None and r.num_computed_tokens == 48
    with pytest.raises(SchedulerError):
        sched.accept_draft(r, [1, 2, 3, 4])  # verified already
    audit(sched)


def test_an_evicted_verifying_request_is_verified_again_after_its_recompute() -> None:
    sched = make()
    r = drafted("r", 50, [900, 901])
    sched.add(r)
    sched.postprocess(sched.schedule(0.0), [-1] * 3, pending=True)
    assert sched.preempt("r")
    assert not sched.is_verifying(r)  # its samples are dropped; the draft is still there
    batch = sched.schedule(0.0)
    assert batch.sample_counts == (3,) and batch.prefills[0].start == 0
    sched.postprocess(batch, [900, 901, 4])
    assert r.output_token_ids == [900, 901, 4]
    audit(sched)


def test_a_fork_stops_before_the_rows_that_verify() -> None:
    sched = make()
    src = Request("src", list(range(64)), max_new_tokens=1)
    sched.add(src, retain_kv=True)
    sched.postprocess(sched.schedule(0.0), [EOS])
    r = drafted("r", 64, [60, 61, 62, 63])  # the same ids as the source's: all could fork
    reused = sched.add(r, fork_from="src", num_fork_tokens=64)
    assert reused == r.verify_from == 59
    batch = sched.schedule(0.0)
    assert (batch.prefills[0].start, batch.sample_counts) == (59, (5,))
    audit(sched)
