"""Scheduler: unit tests per operation and error path, randomized runs with the allocator audit
after every step, and simulations with a fake runner and a fake clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from livemeet.audio.constants import (
    AUDIO_TOKENS_PER_SECOND,
    MAX_AUDIO_S,
    MIN_PREFILL_CHUNK,
    TIME_MARKER_EVERY_S,
    TOKENS_PER_WINDOW,
)
from livemeet.config import UploadHold
from livemeet.engine.block_manager import BlockManager, BlockManagerError
from livemeet.engine.cost_model import StepCostModel
from livemeet.engine.request import PENDING_TOKEN_ID, Request, RequestClass, Status
from livemeet.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig, SchedulerError
from livemeet.errors import ConfigError, InvalidRequest, TooLong
from livemeet.transcript.segments import FinishReason
from tests.engine.fakes import (
    TEST_BLOCK_SIZE,
    FakeClock,
    FakeRunner,
    blocks_freed_by,
    run_steps,
    scripted_tokens,
)

LIVE, UPLOAD = RequestClass.LIVE, RequestClass.UPLOAD


def req(
    rid: str,
    n: int,
    cls: RequestClass = UPLOAD,
    *,
    max_new: int = 4,
    deadline: float | None = None,
    arrival: float = 0.0,
    base: int = 0,
) -> Request:
    return Request(
        rid,
        [base + i for i in range(n)],
        request_class=cls,
        max_new_tokens=max_new,
        deadline_s=deadline,
        arrival_s=arrival,
    )


def make(num_blocks: int = 256, **cfg: object) -> tuple[Scheduler, FakeRunner, FakeClock]:
    bm = BlockManager(num_blocks, TEST_BLOCK_SIZE)
    sched = Scheduler(bm, SchedulerConfig(**cfg))  # type: ignore[arg-type]
    return sched, FakeRunner(bm), FakeClock()


def summary(batch: ScheduledBatch) -> tuple[object, ...]:
    return (
        tuple((c.request.request_id, c.start, c.num_tokens, c.samples) for c in batch.prefills),
        tuple(r.request_id for r in batch.decodes),
        batch.preempted_ids,
        batch.block_copies,
        round(batch.estimated_cost_s, 12),
    )


def run_until_idle(
    sched: Scheduler, runner: FakeRunner, clock: FakeClock, max_steps: int = 2000
) -> list[ScheduledBatch]:
    batches: list[ScheduledBatch] = []
    while sched.has_work():
        assert len(batches) < max_steps, "scheduler made no progress"
        batches += run_steps(sched, runner, clock, 1)
    return batches


# -- configuration and add --------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"chunked_prefill_size": 0},
        {"max_num_batched_tokens": 100, "chunked_prefill_size": 200},
        {"max_num_seqs": 0},
        {"step_budget_s": 0.0},
        {"upload_step_budget_s": 0.01},  # below step_budget_s
        {"upload_step_budget_s": 0.3},  # three such steps would outlast a live hop
        {"upload_step_budget_s": float("inf")},
        {"step_budget_s": float("nan")},
        {"upload_min_share": 1.0},
        {"max_model_len": 1},
        {"upload_batch_wait_s": -0.01},
        {"upload_batch_wait_s": float("inf")},
        {"live_decode_steps": -1},
        {"live_decode_steps": 9},
    ],
)
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        SchedulerConfig(**bad)  # type: ignore[arg-type]


def test_cost_model_rejects_negative_coefficients() -> None:
    with pytest.raises(ConfigError):
        StepCostModel(per_token_s=-1.0)


def test_request_validation() -> None:
    with pytest.raises(InvalidRequest):
        Request("a", [])
    with pytest.raises(InvalidRequest):
        Request("a", [1], max_new_tokens=0)
    with pytest.raises(InvalidRequest):
        Request("a", [1, 2, 3], audio_positions=(1, 1))
    with pytest.raises(InvalidRequest):
        Request("a", [1, 2, 3], audio_positions=(3,))
    with pytest.raises(InvalidRequest):
        Request("a", [1, 2, 3], audio_positions=(0, 2, 1))
    r = Request("a", list(range(10)), audio_positions=(2, 3, 4, 8))
    assert r.audio_span_in(3, 8) == (1, 3)  # positions 3 and 4
    assert r.audio_positions[1:3].tolist() == [3, 4]


def test_add_errors() -> None:
    sched, _, _ = make(num_blocks=4, max_model_len=100)
    sched.add(req("a", 10))
    with pytest.raises(InvalidRequest):
        sched.add(req("a", 10))
    used = req("b", 10)
    used.num_computed_tokens = 3
    with pytest.raises(InvalidRequest):
        sched.add(used)
    with pytest.raises(TooLong):
        sched.add(req("c", 100))  # no room left in the context
    with pytest.raises(TooLong):
        sched.add(req("d", 64))  # 65 tokens need 5 blocks, the pool has 4
    assert [r.request_id for r in sched.waiting] == ["a"]


# -- one request's life -----------------------------------------------------------------------


def test_chunked_prefill_then_decode_until_max_new_tokens() -> None:
    sched, runner, clock = make(chunked_prefill_size=64, max_num_batched_tokens=128)
    r = req("a", 150, max_new=3)
    sched.add(r)
    batches = run_until_idle(sched, runner, clock)
    chunks = [(c.start, c.num_tokens, c.samples) for b in batches for c in b.prefills]
    assert chunks == [(0, 64, False), (64, 64, False), (128, 22, True)]
    assert [len(b.decodes) for b in batches] == [0, 0, 0, 1, 1]
    assert r.output_token_ids == [scripted_tokens(r, i) for i in range(3)]
    assert r.finish_reason is FinishReason.LENGTH and r.status is Status.FINISHED
    assert r.block_table == [] and sched.block_manager.num_free_blocks == 256


def test_eos_stops_and_ignore_eos_does_not() -> None:
    sched, runner, clock = make(eos_token_id=42)
    runner.sample = lambda r, i: 42 if i == 1 else 7
    a, b = req("a", 20, max_new=5), req("b", 20, max_new=5)
    b.ignore_eos = True
    sched.add(a)
    sched.add(b)
    run_until_idle(sched, runner, clock)
    assert a.output_token_ids == [7, 42] and a.finish_reason is FinishReason.STOP
    assert b.num_output_tokens == 5 and b.finish_reason is FinishReason.LENGTH


def test_context_limit_finishes_with_length() -> None:
    sched, runner, clock = make(max_model_len=24)
    r = req("a", 20, max_new=100)
    sched.add(r)
    run_until_idle(sched, runner, clock)
    assert r.num_tokens == 24 and r.finish_reason is FinishReason.LENGTH


def test_kv_pool_too_small_to_grow_finishes_with_length() -> None:
    sched, runner, clock = make(num_blocks=2)
    r = req("a", 30, max_new=100)
    sched.add(r)
    run_until_idle(sched, runner, clock)
    assert r.finish_reason is FinishReason.LENGTH and r.num_tokens == 33
    assert sched.block_manager.num_free_blocks == 2


def test_a_request_evicted_as_it_outgrows_the_pool_finishes_with_length() -> None:
    """An upload evicted by a live hop right after sampling the token the pool cannot hold
    waited forever (only a running request was finished for it), and blocked every admission
    behind it: the engine stalled with free KV (a fuzzer's find). It ends for length, with
    its tokens, and the work behind it runs."""
    sched, runner, clock = make(num_blocks=4, upload_batch_wait_s=0.0)  # 64 tokens of KV
    up = req("up", 60, max_new=30)
    sched.add(up)
    while up.num_tokens < 65:  # 64 with KV, the 65th sampled
        run_steps(sched, runner, clock, 1)
    sched.add(req("hop", 10, LIVE, max_new=1, deadline=clock.now_s + 1.0, base=900))
    assert run_steps(sched, runner, clock, 1)[0].preempted_ids == ("up",)
    after = req("after", 8, max_new=2, base=5000)
    sched.add(after)
    run_until_idle(sched, runner, clock, max_steps=50)
    assert up.finish_reason is FinishReason.LENGTH and up.num_tokens == 65
    assert after.finish_reason is FinishReason.LENGTH and after.num_output_tokens == 2
    assert sched.block_manager.num_free_blocks == 4


def test_postprocess_rejects_wrong_token_count() -> None:
    sched, _, clock = make()
    sched.add(req("a", 10))
    batch = sched.schedule(clock.now_s)
    with pytest.raises(SchedulerError):
        sched.postprocess(batch, [])


# -- budget, priorities, share ------------------------------------------------------------------


def test_late_chunk_of_a_90_minute_prompt_costs_150_to_250_ms() -> None:
    """DESIGN.md section 4 puts it at ~150-200 ms; the extend kernel as measured on an H200
    (~300 TFLOP/s on late chunks, the model's bf16 coefficient) makes it ~230 ms."""
    markers = MAX_AUDIO_S // TIME_MARKER_EVERY_S
    prompt = int(MAX_AUDIO_S * AUDIO_TOKENS_PER_SECOND) + markers * 4 + 86
    model = StepCostModel()
    late = model.prefill_cost_s(prompt - 4096, 4096)
    early = model.prefill_cost_s(0, 4096)
    assert 0.150 <= late <= 0.250
    assert late > 10 * early


def test_budget_shrinks_chunks_as_context_grows() -> None:
    sched, runner, clock = make(num_blocks=2048, step_budget_s=0.030)
    r = req("long", 30_000, LIVE, max_new=1, deadline=1e9)  # live: the short budget
    sched.add(r)
    batches = run_until_idle(sched, runner, clock)
    sizes = [c.num_tokens for b in batches for c in b.prefills]
    assert sum(sizes) == 30_000
    assert sizes[0] == 4096  # the budget pays for a whole early chunk
    assert all(a >= b for a, b in zip(sizes[:-1], sizes[1:-1], strict=False))
    # late in the prompt a token costs ~0.76 ns x 28k context + 2 us ~ 23 us: ~1.3k per step
    assert sizes[-2] < 1500
    usable = 0.030 - sched.cost_model.fixed_s
    for c in [c for b in batches for c in b.prefills][:-1]:
        if c.num_tokens < 4096:  # cut by the budget: one more token would not fit
            assert sched.cost_model.prefill_cost_s(c.start, c.num_tokens + 1) > usable
    assert all(b.estimated_cost_s <= 0.030 + 1e-9 for b in batches)


def test_uploads_alone_get_the_upload_budget_and_whole_chunks() -> None:
    """With no live session, late chunks of a long upload stay whole (the upload budget pays for
    them) and no step is planned past that budget; the same upload beside an open live session
    (hop queued or not) or a retained live cache is cut to the short budget again, while a
    retained upload cache changes nothing."""
    budget, upload_budget = 0.050, 0.200
    for company in (None, "retained upload", "open session", "retained live", "queued hop"):
        sched, runner, clock = make(
            num_blocks=8192, step_budget_s=budget, upload_step_budget_s=upload_budget
        )
        if company in ("retained live", "retained upload"):
            cls = LIVE if company == "retained live" else UPLOAD
            sched.add(req("kept", 20, cls, max_new=1, deadline=1e9, base=500_000), retain_kv=True)
            run_until_idle(sched, runner, clock)
            assert [r.request_id for r in sched.retained] == ["kept"]
        elif company == "open session":
            sched.set_live_sessions(1)
        elif company == "queued hop":  # a live hop whose prompt outlasts the upload's
            sched.add(req("hop", 60_000, LIVE, max_new=1, deadline=1e9, base=500_000))
        short = company not in (None, "retained upload")
        assert sched.current_step_budget_s() == (budget if short else upload_budget)
        up = req("up", 30_000, max_new=50)  # still running after the steps
        sched.add(up)
        batches = run_steps(sched, runner, clock, 12)
        chunks = [c for b in batches for c in b.prefills if c.request is up]
        assert 0 < sum(c.num_tokens for c in chunks) == min(up.num_computed_tokens, 30_000)
        if not short:
            assert all(c.num_tokens == 4096 for c in chunks if not c.samples)  # all but the tail
            assert all(b.estimated_cost_s <= upload_budget + 1e-9 for b in batches)
        else:
            late = [c for c in chunks if c.start >= 12_000]
            assert late and all(c.num_tokens < 4096 for c in late)
            assert all(b.estimated_cost_s <= budget + 1e-9 for b in batches[1:])


def test_an_uploads_encoder_time_is_charged_only_on_the_live_budget() -> None:
    """An upload whose windows the engine has still to encode (it encodes them as the upload's
    chunks reach them: Engine._encode_scheduled) pays for them while live sessions run: its
    chunk is cut so that prefill and encoder time fit the step, and the step's estimate holds
    whole windows. Uploads alone pay nothing (their steps only take turns among themselves),
    nor does an upload whose audio is encoded."""
    budget, upload_budget = 0.015, 0.200
    tokens = TOKENS_PER_WINDOW * 16  # 16 windows of audio after a 10-token header
    for live, encoded in ((False, 0), (True, 0), (True, tokens)):
        sched, runner, clock = make(
            num_blocks=8192, step_budget_s=budget, upload_step_budget_s=upload_budget
        )
        cost = sched.cost_model
        sched.set_live_sessions(int(live))
        up = Request("up", list(range(tokens + 10)), audio_positions=range(10, tokens + 10))
        up.num_encoded_audio = encoded
        sched.add(up)
        batch = run_steps(sched, runner, clock, 1)[0]
        (chunk,) = batch.prefills
        usable = (budget if live else upload_budget) - cost.fixed_s
        plain = cost.max_prefill_tokens(0, usable, 4096)
        prefill = cost.prefill_cost_s(0, chunk.num_tokens)
        if not live or encoded:
            assert chunk.num_tokens == plain
            assert batch.estimated_cost_s == pytest.approx(cost.fixed_s + prefill)
            continue
        assert 10 < chunk.num_tokens < plain  # the encoder's time took part of the step
        windows = (chunk.num_tokens - 10 - 1) // TOKENS_PER_WINDOW + 1  # the windows it reaches
        charged = prefill + cost.encode_cost_s(windows)
        assert batch.estimated_cost_s == pytest.approx(cost.fixed_s + charged)
        assert charged <= usable  # whole windows in the sizing too: no overrun
        more = cost.prefill_cost_s(0, chunk.num_tokens + 1)
        windows = (chunk.num_tokens - 10) // TOKENS_PER_WINDOW + 1  # those a token more reaches
        assert more + cost.encode_cost_s(windows) > usable  # and no token more fitted


def test_an_uploads_windows_already_encoded_cost_its_chunk_nothing() -> None:
    """Windows an earlier chunk or an encoder batch's padding encoded are free: a chunk that
    stays within them is as long as an encoded upload's, and one that runs past them pays
    only for the windows it reaches beyond (sizing per average token charged every token, so
    a chunk within encoded windows came out ~a quarter shorter)."""
    budget = 0.015
    tokens = TOKENS_PER_WINDOW * 16
    chunks = {}
    ahead = 11 * TOKENS_PER_WINDOW
    for encoded in (0, ahead, tokens):
        sched, runner, clock = make(num_blocks=8192, step_budget_s=budget)
        sched.set_live_sessions(1)
        up = Request("up", list(range(tokens + 10)), audio_positions=range(10, tokens + 10))
        up.num_encoded_audio = encoded
        sched.add(up)
        (chunk,) = run_steps(sched, runner, clock, 1)[0].prefills
        chunks[encoded] = chunk.num_tokens
    cost = StepCostModel()
    plain = cost.max_prefill_tokens(0, budget - cost.fixed_s, 4096)
    assert plain <= 10 + ahead  # the plain chunk stays within the 11 windows encoded
    assert chunks[ahead] == chunks[tokens] == plain
    assert chunks[0] < plain


def test_an_uploads_windows_in_the_encoders_cache_cost_its_chunk_nothing() -> None:
    """Windows the engine finds in the encoder's cache (`Request.cached_audio_windows`: a
    repeated upload's) are not encoded, and beside live work they were charged all the same:
    an upload whose windows are all cached now gets the chunk of an encoded upload, charged
    its prefill only; with every other window cached, a chunk is charged for the others it
    reaches, and is longer than with none cached."""
    budget = 0.015
    tokens = TOKENS_PER_WINDOW * 16
    cost = StepCostModel()
    plain = cost.max_prefill_tokens(0, budget - cost.fixed_s, 4096)
    chunks = {}
    for cached in (frozenset(), frozenset(range(0, 16, 2)), frozenset(range(16))):
        sched, runner, clock = make(num_blocks=8192, step_budget_s=budget)
        sched.set_live_sessions(1)
        up = Request("up", list(range(tokens + 10)), audio_positions=range(10, tokens + 10))
        up.cached_audio_windows = cached
        sched.add(up)
        batch = run_steps(sched, runner, clock, 1)[0]
        (chunk,) = batch.prefills
        reached = range((chunk.num_tokens - 10 - 1) // TOKENS_PER_WINDOW + 1)
        windows = sum(1 for w in reached if w not in cached)
        charged = cost.prefill_cost_s(0, chunk.num_tokens) + cost.encode_cost_s(windows)
        assert batch.estimated_cost_s == pytest.approx(cost.fixed_s + charged)
        chunks[len(cached)] = chunk.num_tokens
    assert chunks[0] < chunks[8] < chunks[16] == plain


@settings(max_examples=150, deadline=None)
@given(
    header=st.integers(1, 40),
    windows=st.integers(1, 10),
    gap=st.integers(0, 30),
    encoded=st.integers(0, 10),
    cached=st.frozensets(st.integers(0, 9)),
    budget_ms=st.integers(8, 60),
    encode_ms=st.floats(0.0, 8.0),
    steps=st.integers(1, 6),
)
def test_an_uploads_chunk_is_the_longest_its_budget_pays_with_the_windows_it_reaches(
    header: int,
    windows: int,
    gap: int,
    encoded: int,
    cached: frozenset[int],
    budget_ms: int,
    encode_ms: float,
    steps: int,
) -> None:
    """Beside live work, every chunk of an upload with windows to encode costs (prefill plus
    each whole window it reaches past `num_encoded_audio` but for those in the encoder's
    cache) at most what the step has left, and one more token would not fit: audio laid out
    with `gap` text tokens between windows (time markers), any part of it encoded, any of
    the rest cached, any encoder rate."""
    positions: list[int] = []
    for w in range(windows):
        first = header + w * (TOKENS_PER_WINDOW + gap)
        positions += range(first, first + TOKENS_PER_WINDOW)
    total = positions[-1] + 1 + 5
    budget = budget_ms / 1000
    cost = StepCostModel(encode_s_per_window=encode_ms / 1000)
    sched = Scheduler(
        BlockManager(8192, TEST_BLOCK_SIZE),
        SchedulerConfig(step_budget_s=budget, chunked_prefill_size=2048),
        cost_model=cost,
    )
    runner, clock = FakeRunner(sched.block_manager), FakeClock()
    sched.set_live_sessions(1)
    up = Request("up", list(range(total)), audio_positions=positions, max_new_tokens=2)
    up.num_encoded_audio = min(encoded, windows) * TOKENS_PER_WINDOW
    up.cached_audio_windows = cached
    sched.add(up)
    usable = budget - cost.fixed_s

    def charged(start: int, n: int) -> float:
        lo, hi = up.audio_span_in(start, start + n)
        lo = max(lo, up.num_encoded_audio)
        reached = range(lo // TOKENS_PER_WINDOW, (hi - 1) // TOKENS_PER_WINDOW + 1)
        to_encode = 0 if lo >= hi else sum(1 for w in reached if w not in cached)
        return cost.prefill_cost_s(start, n) + cost.encode_cost_s(to_encode)

    for _ in range(steps):
        if up.num_computed_tokens >= total:
            break
        start = up.num_computed_tokens
        batch = run_steps(sched, runner, clock, 1)[0]
        (chunk,) = batch.prefills
        n = chunk.num_tokens
        assert batch.estimated_cost_s == pytest.approx(cost.fixed_s + charged(start, n))
        limit = min(total - start, 2048)
        if n == min(limit, MIN_PREFILL_CHUNK) and charged(start, n) > usable:
            continue  # nothing fitted: an empty step takes the smallest chunk anyway
        assert charged(start, n) <= usable + 1e-12
        assert n == limit or charged(start, n + 1) > usable


def test_a_live_hop_cuts_the_next_step_back_to_the_short_budget() -> None:
    """Uploads run whole 4,096-token chunks until a live hop arrives; the very next step is
    planned within the short budget, and closing the session gives uploads the long one back."""
    sched, runner, clock = make(num_blocks=8192, step_budget_s=0.050, upload_step_budget_s=0.200)
    up = req("up", 60_000, max_new=50)
    sched.add(up)
    first = run_steps(sched, runner, clock, 4)
    assert all(b.prefills[0].num_tokens == 4096 for b in first)
    sched.set_live_sessions(1)
    sched.add(req("hop", 300, LIVE, max_new=2, deadline=clock.now_s + 1.0, base=900_000))
    batch = run_steps(sched, runner, clock, 1)[0]
    assert batch.prefills[0].request.request_class is LIVE
    assert batch.estimated_cost_s <= 0.050 + 1e-9
    run_steps(sched, runner, clock, 3)  # the hop finishes
    sched.set_live_sessions(0)
    assert sched.current_step_budget_s() == 0.200
    with pytest.raises(SchedulerError):
        sched.set_live_sessions(-1)


def test_an_fp8_cache_makes_prefill_attention_dearer_and_decode_cheaper() -> None:
    """The FP8 model (its kernels' measured rates) plans smaller late chunks and cheaper
    decode rows than the bf16 one; another cache dtype has no model."""
    bf16, fp8 = StepCostModel.for_kv_cache("auto"), StepCostModel.for_kv_cache("fp8_e4m3")
    assert bf16 == StepCostModel()
    assert fp8.attention_s_per_pair > bf16.attention_s_per_pair
    assert fp8.decode_cost_s(36_000) < bf16.decode_cost_s(36_000)
    assert fp8.max_prefill_tokens(25_000, 0.05, 4096) < bf16.max_prefill_tokens(25_000, 0.05, 4096)
    with pytest.raises(ConfigError):
        StepCostModel.for_kv_cache("int8")


def test_live_before_upload_and_earliest_deadline_first() -> None:
    sched, _, clock = make(max_num_seqs=2, upload_min_share=0.0)
    sched.add(req("up", 10, arrival=0.0))
    sched.add(req("late", 10, LIVE, deadline=5.0, arrival=1.0))
    sched.add(req("soon", 10, LIVE, deadline=2.0, arrival=2.0))
    batch = sched.schedule(clock.now_s)
    assert [c.request.request_id for c in batch.prefills] == ["soon", "late"]
    assert [r.request_id for r in sched.waiting] == ["up"]


def test_an_advanced_deadline_moves_a_live_request_ahead_and_never_back() -> None:
    sched, _, clock = make(max_num_seqs=1, upload_min_share=0.0)
    sched.add(req("up", 10, arrival=0.0))
    sched.add(req("soon", 10, LIVE, deadline=2.0, arrival=0.0))
    late = req("late", 10, LIVE, deadline=5.0, arrival=1.0)
    sched.add(late)
    assert sched.advance_deadline("late", 1.5) and late.deadline_s == 1.5
    assert sched.advance_deadline("late", 9.0) and late.deadline_s == 1.5  # never later
    assert not sched.advance_deadline("up", 0.0) and not sched.advance_deadline("nobody", 0.0)
    batch = sched.schedule(clock.now_s)
    assert [c.request.request_id for c in batch.prefills] == ["late"]


def test_uploads_keep_their_minimum_share() -> None:
    share, budget = 0.3, 0.040
    sched, runner, clock = make(num_blocks=8192, step_budget_s=budget, upload_min_share=share)
    for i in range(3):
        sched.add(req(f"live{i}", 20_000, LIVE, deadline=10.0 + i, base=i * 100_000))
    up = req("up", 20_000, base=900_000)
    sched.add(up)
    usable = budget - sched.cost_model.fixed_s

    def upload_cost(batch: ScheduledBatch) -> float:
        m = sched.cost_model
        return sum(
            m.prefill_cost_s(c.start, c.num_tokens) for c in batch.prefills if c.request is up
        )

    batches = run_steps(sched, runner, clock, 12)
    for batch in batches:
        if batch.upload_turn:  # the share across steps: live prefill waits this step
            assert [c.request for c in batch.prefills] == [up]
            continue
        assert batch.prefills[0].request.request_class is LIVE
        # the share of the time budget (less one token's worth) or of the token limit
        up_tokens = sum(c.num_tokens for c in batch.prefills if c.request is up)
        assert upload_cost(batch) >= share * usable - 2e-4 or up_tokens >= int(share * 8192)
    assert up.num_computed_tokens > 0


# -- the uploads' share across steps -------------------------------------------------------------


def _turn_runs_s(batches: list[ScheduledBatch]) -> list[float]:
    """Estimated seconds of each run of consecutive upload turns, in order."""
    runs: list[float] = []
    previous_is_turn = False
    for batch in batches:
        if batch.upload_turn and previous_is_turn:
            runs[-1] += batch.estimated_cost_s
        elif batch.upload_turn:
            runs.append(batch.estimated_cost_s)
        previous_is_turn = batch.upload_turn
    return runs


def _live_rows(batch: ScheduledBatch) -> tuple[object, ...]:
    return (
        tuple(
            (c.request.request_id, c.start, c.num_tokens)
            for c in batch.prefills
            if c.request.request_class is LIVE
        ),
        tuple(r.request_id for r in batch.decodes if r.request_class is LIVE),
    )


def _live_work(sched: Scheduler) -> list[Request]:
    """Four live rows that decode for a while and one long hop to prefill (deadline first)."""
    live = [
        req(f"dec{i}", 500, LIVE, max_new=120, deadline=50.0 + i, base=10_000 * (i + 1))
        for i in range(4)
    ]
    live.append(req("hop", 20_000, LIVE, max_new=4, deadline=10.0, base=500_000))
    for r in live:
        sched.add(r)
    return live


def _run_live(share: float, with_upload: bool) -> list[ScheduledBatch]:
    """Steps until `_live_work` is done, beside a decoding upload or not."""
    sched, runner, clock = make(num_blocks=4096, upload_min_share=share)
    runner.check_reads = False  # many long decode rows: the other tests check KV reads
    if with_upload:
        sched.add(req("up", 1_000, max_new=10_000, base=900_000))
        run_steps(sched, runner, clock, 1)
        assert sched.get("up").is_decoding  # type: ignore[union-attr]
    live = _live_work(sched)
    batches: list[ScheduledBatch] = []
    while not all(r.is_finished for r in live):
        batches += run_steps(sched, runner, clock, 1)
        assert len(batches) < 2_000
    return batches


def test_share_zero_gives_live_work_pure_priority() -> None:
    """With upload_min_share = 0 a decoding upload changes no live row of any step (it gets
    what live work leaves); with the default share the same work gives uploads turns."""
    alone = _run_live(0.0, with_upload=False)
    beside = _run_live(0.0, with_upload=True)
    assert [_live_rows(b) for b in beside] == [_live_rows(b) for b in alone]
    assert not any(b.upload_turn for b in beside)
    shared = _run_live(0.25, with_upload=True)
    assert any(b.upload_turn for b in shared)
    for batch in shared:
        if batch.upload_turn:  # live prefill waits; live decode rows ride along
            assert all(c.request.request_class is UPLOAD for c in batch.prefills)
            assert any(r.request_class is UPLOAD for r in batch.decodes)


@pytest.mark.parametrize("work", ["live only", "uploads only"])
def test_the_share_changes_nothing_without_uploads_or_without_live_work(work: str) -> None:
    """No upload that can run: live batches are those of pure priority. No live work: uploads
    run as they would with no share."""

    cls = LIVE if work == "live only" else UPLOAD

    def trace(share: float) -> list[tuple[object, ...]]:
        sched, runner, clock = make(num_blocks=4096, upload_min_share=share)
        runner.check_reads = False  # long contexts: the other tests check KV reads
        out: list[ScheduledBatch] = []
        for wave in range(3):
            at_s = clock.now_s
            for i in range(3):
                deadline = at_s + 1.0 + i if cls is LIVE else None
                n = 3_000 + 1_500 * i
                base = 100_000 * (3 * wave + i)
                sched.add(req(f"w{wave}r{i}", n, cls, max_new=30, deadline=deadline, base=base))
            out += run_steps(sched, runner, clock, 25)
        out += run_until_idle(sched, runner, clock)
        assert not any(b.upload_turn for b in out)
        return [summary(b) for b in out]

    assert trace(0.25) == trace(0.0)


def _decoding_beside_live_rows(
    num_steps: int,
) -> tuple[Scheduler, FakeRunner, FakeClock, list[ScheduledBatch]]:
    """An upload decodes beside eight live rows that decode only (no live prefill waits) for
    about `num_steps` steps and then finish; returns the steps too."""
    sched, runner, clock = make(num_blocks=4096, upload_batch_wait_s=0.0)
    runner.check_reads = False  # long contexts, many steps: the other tests check KV reads
    sched.set_live_sessions(1)
    for i in range(8):
        sched.add(
            req(
                f"dec{i}", 2_000, LIVE, max_new=num_steps, deadline=100.0 + i, base=10_000 * (i + 1)
            )
        )
    sched.add(req("up", 1_000, max_new=100_000, base=900_000))
    batches: list[ScheduledBatch] = []
    while any(r.request_class is LIVE for r in sched.running + sched.waiting):
        batches += run_steps(sched, runner, clock, 1)
        assert clock.now_s < 10.0
    assert sched.get("up").is_decoding  # type: ignore[union-attr]
    return sched, runner, clock, batches


def _prefill_hop(sched: Scheduler, runner: FakeRunner, clock: FakeClock) -> list[ScheduledBatch]:
    """A long live hop arrives; the steps until its prefill is done."""
    hop = req("hop", 30_000, LIVE, max_new=2, deadline=clock.now_s + 1.0, base=500_000)
    sched.add(hop)
    batches: list[ScheduledBatch] = []
    while hop.num_output_tokens == 0:
        batches += run_steps(sched, runner, clock, 1)
        assert len(batches) < 1_000
    return batches


def _upload_time_s(batch: ScheduledBatch) -> float:
    """A step's estimated time that went to uploads (its cost split by its rows' costs)."""
    cost = StepCostModel()
    rows = [(r.request_class, cost.decode_cost_s(r.num_tokens)) for r in batch.decodes]
    rows += [
        (c.request.request_class, cost.prefill_cost_s(c.start, c.num_tokens))
        for c in batch.prefills
    ]
    total = sum(t for _, t in rows)
    return batch.estimated_cost_s * sum(t for k, t in rows if k is UPLOAD) / total if total else 0.0


def test_upload_turns_keep_the_share_and_each_run_is_capped() -> None:
    """Beside live rows that only decode, the upload still gets its share of time, in upload
    turns that hold no live row; when a long hop then arrives, no run of turns lasts more
    than share / (1 - share) of a step budget (and the turn crossing it), so the hop's
    prefill waits at most that per live step."""
    share, budget_s = 0.25, SchedulerConfig().step_budget_s
    sched, runner, clock, stretch = _decoding_beside_live_rows(num_steps=500)
    total_s = sum(b.estimated_cost_s for b in stretch)
    assert sum(map(_upload_time_s, stretch)) >= (share - 0.02) * total_s
    for batch in stretch:
        if batch.upload_turn:
            assert all(r.request_class is UPLOAD for r in batch.decodes) and not batch.prefills
    batches = _prefill_hop(sched, runner, clock)
    longest_turn_s = max(b.estimated_cost_s for b in (*stretch, *batches) if b.upload_turn)
    cap_s = share / (1 - share) * budget_s
    assert max(_turn_runs_s(stretch + batches)) <= cap_s + longest_turn_s
    live_steps_s = sum(b.estimated_cost_s for b in batches if not b.upload_turn)
    assert sum(_turn_runs_s(batches)) <= share / (1 - share) * live_steps_s + 2 * cap_s
    assert not batches[-1].upload_turn


def test_no_credit_is_kept_while_no_upload_can_run() -> None:
    """An upload that was behind its share leaves (aborted); live work runs alone; a new upload
    that comes with the next live hop starts from no credit: its first turns pay back only the
    share of the live time since it came, not what the first upload was owed."""
    share = 0.25
    sched, runner, clock, _ = _decoding_beside_live_rows(num_steps=500)
    sched.abort("up")
    sched.add(req("live", 3_000, LIVE, max_new=20, deadline=clock.now_s + 1.0, base=600_000))
    run_until_idle(sched, runner, clock)
    sched.add(req("up2", 500, max_new=100_000, arrival=clock.now_s, base=700_000))
    batches = _prefill_hop(sched, runner, clock)
    first_turn = next(i for i, b in enumerate(batches) if b.upload_turn)
    live_before_s = sum(b.estimated_cost_s for b in batches[:first_turn])
    longest_turn_s = max(b.estimated_cost_s for b in batches if b.upload_turn)
    assert _turn_runs_s(batches)[0] <= share / (1 - share) * live_before_s + longest_turn_s


# -- memory: admission, preemption, retained caches --------------------------------------------


def test_admission_waits_for_kv_and_resumes() -> None:
    sched, runner, clock = make(num_blocks=4)
    a, b = req("a", 40, max_new=2), req("b", 40, max_new=2)
    sched.add(a)
    sched.add(b)
    first = run_steps(sched, runner, clock, 1)[0]
    assert [c.request.request_id for c in first.prefills] == ["a"]
    assert b.status is Status.WAITING and not b.block_table
    run_until_idle(sched, runner, clock)
    assert a.num_preemptions == b.num_preemptions == 0
    assert a.num_output_tokens == b.num_output_tokens == 2


def test_live_preempts_upload_which_recomputes_to_the_same_output() -> None:
    ref_sched, ref_runner, ref_clock = make()
    ref = req("up", 60, max_new=6)
    ref_sched.add(ref)
    run_until_idle(ref_sched, ref_runner, ref_clock)

    sched, runner, clock = make(num_blocks=6)
    up = req("up", 60, max_new=6)
    sched.add(up)
    run_steps(sched, runner, clock, 3)  # prefilled and decoding
    assert up.num_output_tokens >= 2 and up.block_table
    live = req("live", 60, LIVE, max_new=2, deadline=clock.now_s + 1.0, base=500)
    sched.add(live)
    assert sched.request_counts() == (1, 1, 0)  # (running, waiting, retained)
    batch = run_steps(sched, runner, clock, 1)[0]
    assert batch.preempted_ids == ("up",)
    assert up.status is Status.PREEMPTED and not up.block_table and up.num_preemptions == 1
    assert sched.num_preemptions == 1 and sched.request_counts() == (1, 1, 0)
    run_until_idle(sched, runner, clock)
    assert sched.request_counts() == (0, 0, 0)
    assert live.finish_reason is FinishReason.LENGTH
    assert up.output_token_ids == ref.output_token_ids  # recomputed prompt + outputs
    assert sched.block_manager.num_free_blocks == 6


def test_every_upload_is_preempted_before_a_live_hop() -> None:
    sched, runner, clock = make(num_blocks=8)
    low_live = req("low", 30, LIVE, max_new=50, deadline=9.0, base=100)
    ups = [req(f"u{i}", 30, max_new=50, base=1000 * (i + 1)) for i in range(2)]
    for r in (low_live, *ups):
        sched.add(r)
    run_steps(sched, runner, clock, 2)
    assert all(r.status is Status.RUNNING for r in (low_live, *ups))
    urgent = req("urgent", 100, LIVE, max_new=2, deadline=1.0, base=9000)
    sched.add(urgent)  # needs 7 blocks, 2 are free: both uploads (2 each), then the live one
    batch = run_steps(sched, runner, clock, 1)[0]
    assert batch.preempted_ids == ("u1", "u0", "low")
    run_until_idle(sched, runner, clock)


def test_retained_kv_is_forked_into_the_next_hop_and_copy_on_write_keeps_it_right() -> None:
    sched, runner, clock = make()
    hop1 = req("hop1", 50, LIVE, max_new=2, deadline=1.0)
    sched.add(hop1, retain_kv=True)
    run_until_idle(sched, runner, clock)
    assert sched.retained == [hop1] and hop1.block_table
    # the next hop keeps 37 tokens (inside a block) and appends new audio
    hop2 = Request("hop2", list(range(37)) + [700 + i for i in range(30)], LIVE, 2, 2.0)
    assert sched.add(hop2, fork_from="hop1", num_fork_tokens=37) == 37
    assert sched.retained == [] and hop1.block_table == []
    assert hop2.num_cached_tokens == hop2.num_computed_tokens == 37
    batches = run_until_idle(sched, runner, clock)  # the runner checks every KV read
    # hop1 was released, so the partial block is hop2's alone: written in place, no copy
    assert batches[0].block_copies == () and batches[0].prefills[0].start == 37
    assert sched.block_manager.num_free_blocks == 256


def test_fork_from_a_running_request_copies_the_shared_partial_block() -> None:
    sched, runner, clock = make()
    a = req("a", 50, LIVE, max_new=8, deadline=1.0)
    sched.add(a)
    run_steps(sched, runner, clock, 2)
    assert a.is_decoding
    b = Request("b", list(range(37)) + [700 + i for i in range(30)], LIVE, 3, 2.0)
    assert sched.add(b, fork_from="a", num_fork_tokens=37) == 37
    batch = run_steps(sched, runner, clock, 1)[0]  # the runner checks a's and b's KV reads
    (copy,) = batch.block_copies
    assert copy.num_tokens == 37 - 32 and copy.src == a.block_table[2]
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] == copy.dst
    run_until_idle(sched, runner, clock)
    assert sched.block_manager.num_free_blocks == 256


def test_a_block_shared_only_by_evictable_requests_is_freed_for_a_live_hop() -> None:
    """Two uploads forked from one prefix share its block; a live hop that needs the whole
    pool was refused, since the room eviction would make counted only each victim's own
    blocks, and nothing ran again (a fuzzer's stall). Evicting both frees the shared block
    too: the hop runs, and so do they after it."""
    sched, runner, clock = make(num_blocks=4, upload_batch_wait_s=0.0)
    src = req("src", 20, max_new=5)
    sched.add(src)
    run_steps(sched, runner, clock, 1)
    forks = [Request(rid, list(range(16)) + [500, 501], max_new_tokens=2) for rid in ("w1", "w2")]
    for fork in forks:
        assert sched.add(fork, fork_from="src", num_fork_tokens=16) == 16
    sched.abort("src")
    bm = sched.block_manager
    # the forks alone hold the prefix block: either one freed returns nothing, both return it
    assert bm.num_free_blocks == 3
    assert blocks_freed_by(bm, forks[:1]) == 0 and blocks_freed_by(bm, forks) == 1
    hop = req("hop", 50, LIVE, max_new=2, deadline=clock.now_s + 1.0, base=9000)
    sched.add(hop)
    batch = run_steps(sched, runner, clock, 1)[0]
    assert set(batch.preempted_ids) == {"w1", "w2"}
    assert [c.request.request_id for c in batch.prefills] == ["hop"]
    run_until_idle(sched, runner, clock, max_steps=50)
    assert [r.finish_reason for r in (hop, *forks)] == [FinishReason.LENGTH] * 3
    assert bm.num_free_blocks == 4


def test_fork_from_an_evicted_source_reuses_nothing() -> None:
    sched, runner, clock = make()
    assert sched.add(req("a", 10), fork_from="nobody", num_fork_tokens=5) == 0
    src = req("src", 20, max_new=1)
    sched.add(src, retain_kv=True)
    run_until_idle(sched, runner, clock)
    with pytest.raises(BlockManagerError):
        sched.add(req("bad", 20, base=1), fork_from="src", num_fork_tokens=10)
    assert sched.get("bad") is None and src.block_table


def test_retained_caches_are_evicted_before_running_requests() -> None:
    sched, runner, clock = make(num_blocks=6)
    cache = req("cache", 40, LIVE, max_new=1)
    sched.add(cache, retain_kv=True)
    run_until_idle(sched, runner, clock)
    assert sched.request_counts() == (0, 0, 1)
    up = req("up", 30, max_new=20, base=100)
    sched.add(up)
    run_steps(sched, runner, clock, 1)
    new = req("new", 40, LIVE, max_new=1, deadline=1.0, base=200)
    sched.add(new)
    batch = run_steps(sched, runner, clock, 1)[0]
    assert batch.preempted_ids == () and sched.retained == []
    assert sched.num_retained_evictions == 1 and sched.num_preemptions == 0
    assert up.status is Status.RUNNING
    run_until_idle(sched, runner, clock)


# -- abort at every phase ---------------------------------------------------------------------


def _phase_setup() -> tuple[Scheduler, FakeRunner, FakeClock, Request]:
    sched, runner, clock = make(num_blocks=64, chunked_prefill_size=32, max_num_batched_tokens=64)
    sched.add(req("other", 40, max_new=10, base=5000))
    r = req("r", 100, max_new=10)
    sched.add(r)
    return sched, runner, clock, r


@pytest.mark.parametrize("phase", ["waiting", "mid_prefill", "decoding", "preempted", "retained"])
def test_abort_frees_everything_exactly_once(phase: str) -> None:
    sched, runner, clock, r = _phase_setup()
    if phase == "mid_prefill":
        run_steps(sched, runner, clock, 1)
        assert 0 < r.num_computed_tokens < r.num_prompt_tokens
    elif phase == "decoding":
        while not r.is_decoding:
            run_steps(sched, runner, clock, 1)
    elif phase == "preempted":
        run_steps(sched, runner, clock, 2)
        assert sched.preempt("r") and r.status is Status.PREEMPTED
        assert not sched.preempt("r")
    elif phase == "retained":
        sched.abort("r")
        r = req("r2", 20, max_new=1)
        sched.add(r, retain_kv=True)
        run_until_idle(sched, runner, clock)
        assert r in sched.retained
    assert sched.abort(r.request_id) is r
    assert r.block_table == [] and sched.get(r.request_id) is None
    if phase != "retained":
        assert r.finish_reason is FinishReason.ABORT
    sched.block_manager.audit(sched.live_requests())
    assert sched.abort(r.request_id) is None
    run_until_idle(sched, runner, clock)
    assert sched.block_manager.num_free_blocks == 64


def test_abort_while_the_step_is_in_flight_ignores_its_results() -> None:
    sched, runner, clock, r = _phase_setup()
    while not r.is_decoding:
        run_steps(sched, runner, clock, 1)
    batch = sched.schedule(clock.now_s)
    tokens = runner.run(batch)
    assert sched.abort("r") is r
    out = sched.postprocess(batch, tokens)
    assert "r" not in [rid for rid, _ in out.new_tokens]
    assert r.block_table == [] and r.finish_reason is FinishReason.ABORT
    sched.block_manager.audit(sched.live_requests())


def test_preempting_a_request_whose_token_is_still_pending_is_refused() -> None:
    """Between an async step's placeholder tokens and their resolve, a preempt would have its
    recompute prefill the placeholder (the model runner raises then, far from the cause): it
    is refused here, evicting nothing."""
    sched, runner, clock, r = _phase_setup()
    while not r.is_decoding:
        run_steps(sched, runner, clock, 1)
    batch = sched.schedule(clock.now_s)
    sched.postprocess(batch, [PENDING_TOKEN_ID] * sum(batch.sample_counts), pending=True)
    table = list(r.block_table)
    with pytest.raises(SchedulerError, match="pending"):
        sched.preempt("r")
    assert r.status is Status.RUNNING and r.block_table == table
    r.output_token_ids[-1] = 5  # resolved (the engine's job)
    assert sched.preempt("r") and r.status is Status.PREEMPTED


def test_abort_unknown_id_returns_none() -> None:
    sched, _, _ = make()
    assert sched.abort("nope") is None
    assert sched.release("nope") is None


# -- simulation and determinism ----------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    at_s: float
    request_id: str
    request_class: RequestClass
    num_tokens: int
    max_new_tokens: int
    deadline_s: float | None = None


def meeting_arrivals() -> list[Arrival]:
    """3 live sessions with a hop every second for 6 s (prompts growing 12.5 tokens/s from
    ~1.5k, 1.5 s deadlines), and 3 uploads of 6k-12k tokens (300 outputs) in the first 0.3 s."""
    out = [Arrival(0.1 * i, f"up{i}", UPLOAD, 6000 + 3000 * i, 300) for i in range(3)]
    for hop in range(6):
        for s in range(3):
            at = 0.2 + hop * 1.0 + s * 0.05
            n = 1500 + 500 * s + int(12.5 * hop)
            out.append(Arrival(at, f"s{s}h{hop}", LIVE, n, 24, at + 1.5))
    return sorted(out, key=lambda a: a.at_s)


def simulate(
    arrivals: list[Arrival], num_blocks: int, **cfg: object
) -> tuple[list[tuple[object, ...]], dict[str, Request], dict[str, float], list[ScheduledBatch]]:
    sched, runner, clock = make(num_blocks=num_blocks, **cfg)
    pending = list(arrivals)
    requests: dict[str, Request] = {}
    done_at: dict[str, float] = {}
    batches: list[ScheduledBatch] = []
    while pending or sched.has_work():
        while pending and pending[0].at_s <= clock.now_s:
            a = pending.pop(0)
            r = Request(
                a.request_id,
                [sum(map(ord, a.request_id)) * 10 + i for i in range(a.num_tokens)],
                a.request_class,
                a.max_new_tokens,
                a.deadline_s,
                a.at_s,
            )
            requests[a.request_id] = r
            sched.add(r)
        if not sched.has_work():
            clock.now_s = pending[0].at_s
            continue
        (batch,) = run_steps(sched, runner, clock, 1)
        batches.append(batch)
        for r in requests.values():
            if r.is_finished and r.request_id not in done_at:
                done_at[r.request_id] = clock.now_s
        assert len(batches) < 20_000
    return [summary(b) for b in batches], requests, done_at, batches


def test_simulation_live_hops_meet_deadlines_while_uploads_progress() -> None:
    arrivals = meeting_arrivals()
    _, requests, done_at, batches = simulate(arrivals, num_blocks=4096)
    for a in arrivals:
        r = requests[a.request_id]
        assert r.finish_reason is FinishReason.LENGTH  # the fake never samples EOS
        if a.deadline_s is not None:
            assert done_at[a.request_id] <= a.deadline_s, a.request_id
    # uploads progress in every step while they are running (the minimum share)
    for batch in batches:
        rows = [c.request for c in batch.prefills] + list(batch.decodes)
        if any(r.request_class is LIVE for r in rows) and any(
            r.request_class is UPLOAD and r.status is not Status.WAITING
            for r in requests.values()
            if not r.is_finished and r.block_table
        ):
            assert any(r.request_class is UPLOAD for r in rows)


def test_simulation_under_a_tiny_pool_preempts_and_recomputes() -> None:
    arrivals = meeting_arrivals()
    # 1000 blocks hold up0 + up1 (976 blocks) but not a live hop as well
    _, requests, done_at, batches = simulate(arrivals, num_blocks=1000)
    preempted = [rid for b in batches for rid in b.preempted_ids]
    assert preempted, "the pool was meant to be too small"
    assert all(done_at[a.request_id] <= a.deadline_s for a in arrivals if a.deadline_s)
    assert all(requests[rid].request_class is UPLOAD for rid in preempted)
    for r in requests.values():
        assert r.num_output_tokens == r.max_new_tokens
        assert r.output_token_ids == [scripted_tokens(r, i) for i in range(r.max_new_tokens)]


def test_same_arrivals_give_identical_schedules() -> None:
    arrivals = meeting_arrivals()
    first, _, _, _ = simulate(arrivals, num_blocks=1000)
    second, _, _, _ = simulate(arrivals, num_blocks=1000)
    assert first == second


# -- randomized operations ----------------------------------------------------------------------

op = st.one_of(
    st.tuples(
        st.just("add"),
        st.sampled_from([LIVE, UPLOAD]),
        st.integers(1, 180),  # up to nearly the pool (192 tokens)
        st.integers(1, 40),  # some outgrow the pool: they end for length
        st.booleans(),
    ),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("preempt"), st.integers(0, 30)),
    st.tuples(st.just("inflight_abort"), st.integers(0, 30)),
    st.tuples(
        st.just("fork"),
        st.integers(0, 30),
        st.integers(1, 60),
        st.sampled_from([LIVE, UPLOAD]),
        st.integers(1, 2),  # forks of the source at once (two share its blocks)
        st.booleans(),  # then the source goes (its forks alone share its blocks)
    ),
    st.tuples(st.just("incoming"), st.integers(0, 3)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, min_size=1, max_size=40))
def test_random_operations_keep_the_allocator_consistent(ops: list[tuple[object, ...]]) -> None:
    """The audit after every operation, then a run to idle in which every request finishes:
    a liveness check (two stalls a fuzzer found, every step empty with work left, are pinned
    by the tests above: forks sharing a block only their eviction frees, and a request
    evicted as it outgrew the pool; forks here are of either class, one or two at once, their
    source gone after them or not: on the code before the fix, 2 runs of 8 found the first)."""
    sched, runner, clock = make(
        num_blocks=12, chunked_prefill_size=48, max_num_batched_tokens=64, max_num_seqs=4
    )
    bm = sched.block_manager
    ids: list[str] = []

    def pick(i: object) -> str | None:
        return ids[int(i) % len(ids)] if ids else None  # type: ignore[call-overload]

    for o in ops:
        kind = o[0]
        if kind == "add":
            _, cls, n, max_new, retain = o
            rid = f"r{len(ids)}"
            r = Request(
                rid,
                [len(ids) * 1000 + i for i in range(int(n))],  # type: ignore[call-overload]
                cls,
                int(max_new),
                1.0 if cls is LIVE else None,
            )  # type: ignore[arg-type,call-overload]
            sched.add(r, retain_kv=bool(retain))
            ids.append(rid)
        elif kind == "step":
            run_steps(sched, runner, clock, int(o[1]))  # type: ignore[call-overload]
        elif kind == "incoming":
            sched.set_incoming_uploads(int(o[1]))  # type: ignore[call-overload]
        elif kind in ("abort", "preempt"):
            rid = pick(o[1])
            if rid is not None:
                (sched.abort if kind == "abort" else sched.preempt)(rid)
        elif kind == "inflight_abort":
            batch = sched.schedule(clock.now_s)
            tokens = runner.run(batch)
            rid = pick(o[1])
            if rid is not None:
                sched.abort(rid)
            sched.postprocess(batch, tokens)
        elif kind == "fork":
            src = sched.get(pick(o[1]) or "")
            for _ in range(int(o[4]) if src is not None and src.num_computed_tokens else 0):  # type: ignore[call-overload]
                assert src is not None
                rid = f"r{len(ids)}"
                prefix = src.token_ids(0, src.num_computed_tokens)
                # what the pool can hold with one token to decode (more: TooLong at add)
                n = min(int(o[2]), bm.num_blocks * bm.block_size - 1 - len(prefix))  # type: ignore[call-overload]
                if n < 1:
                    break
                cls = o[3]
                dst = Request(
                    rid,
                    prefix + [77_000 + i for i in range(n)],
                    cls,  # type: ignore[arg-type]
                    3,
                    2.0 if cls is LIVE else None,
                )
                sched.add(dst, fork_from=src.request_id, num_fork_tokens=len(prefix))
                ids.append(rid)
            if src is not None and o[5]:
                sched.abort(src.request_id)
        bm.audit(sched.live_requests())
    sched.set_incoming_uploads(0)
    run_until_idle(sched, runner, clock, max_steps=1000)  # no stall: each one finishes
    for r in sched.retained:
        sched.release(r.request_id)
    bm.audit(sched.live_requests())
    assert bm.num_free_blocks == bm.num_blocks


# -- upload batching ------------------------------------------------------------------------


def _decoding(
    sched: Scheduler, runner: FakeRunner, clock: FakeClock, n: int, cls: RequestClass = UPLOAD
) -> None:
    """n requests admitted and prefilled at t=0; afterwards they only decode."""
    for i in range(n):
        sched.add(req(f"run{i}", 20, cls, max_new=200, deadline=100.0 if cls is LIVE else None))
    run_steps(sched, runner, clock, 1)
    assert all(r.is_decoding for r in sched.running)


def _admitted(batch: ScheduledBatch) -> set[str]:
    return {c.request.request_id for c in batch.prefills}


def test_new_uploads_wait_for_company_while_decodes_run() -> None:
    sched, runner, clock = make(upload_batch_wait_s=0.05)
    _decoding(sched, runner, clock, 3)
    sched.add(req("late", 20, arrival=clock.now_s))
    arrival = clock.now_s
    held = []
    while clock.now_s - arrival < 0.05:
        (batch,) = run_steps(sched, runner, clock, 1)
        held.append(_admitted(batch))
        assert len(batch.decodes) == 3  # decodes go on: pure decode (graph) steps
    assert held and all(not a for a in held)
    (batch,) = run_steps(sched, runner, clock, 1)  # the oldest has waited long enough
    assert _admitted(batch) == {"late"}


def test_as_many_waiting_as_decoding_are_admitted_at_once() -> None:
    sched, runner, clock = make(upload_batch_wait_s=10.0)
    _decoding(sched, runner, clock, 2)
    sched.add(req("a", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert not _admitted(batch)
    sched.add(req("b", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"a", "b"}  # one eager step prefills both


def test_uploads_are_not_held_when_nothing_decodes_or_when_disabled() -> None:
    sched, runner, clock = make(upload_batch_wait_s=10.0)
    sched.add(req("first", 20))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"first"}  # an idle engine starts at once
    sched, runner, clock = make(upload_batch_wait_s=0.0)
    _decoding(sched, runner, clock, 3)
    sched.add(req("late", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"late"}


def test_live_hops_are_never_held_and_take_held_uploads_along() -> None:
    sched, runner, clock = make(upload_batch_wait_s=10.0)
    _decoding(sched, runner, clock, 3)
    sched.add(req("hop", 20, LIVE, deadline=clock.now_s + 1.0, arrival=clock.now_s))
    sched.add(req("upload", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    # the hop makes this step eager anyway, so the upload is not held back for another one
    assert _admitted(batch) == {"hop", "upload"}


def test_held_uploads_leave_the_whole_budget_to_live_work() -> None:
    """With only live requests running, a held upload reserves no share: the live hop is not
    capped at (1 - upload_min_share) of the step's tokens."""
    sched, runner, clock = make(
        upload_batch_wait_s=10.0, max_num_batched_tokens=2048, chunked_prefill_size=2048
    )
    _decoding(sched, runner, clock, 3, LIVE)
    sched.add(req("hop", 3000, LIVE, deadline=clock.now_s + 1.0, arrival=clock.now_s))
    sched.add(req("upload", 300, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    chunks = {c.request.request_id: c.num_tokens for c in batch.prefills}
    # uncapped: with the upload's share reserved the hop would get 0.75 x 2048 = 1536 tokens
    assert chunks["hop"] > 1536, chunks


# -- upload batching: the pipeline-aware hold ---------------------------------------------------


def test_idle_engine_holds_new_uploads_while_more_are_incoming() -> None:
    """The first arrivals of a wave wait for the rest (the gateway says they are coming) and
    the wave is prefilled in one step; ARRIVALS would start the first one alone."""
    sched, runner, clock = make(upload_batch_wait_s=0.05)
    sched.set_incoming_uploads(2)
    sched.add(req("a", 20, arrival=clock.now_s))
    assert sched.is_holding(clock.now_s)
    (batch,) = run_steps(sched, runner, clock, 1)
    assert batch.is_empty
    sched.set_incoming_uploads(1)
    sched.add(req("b", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert batch.is_empty
    sched.set_incoming_uploads(0)
    sched.add(req("c", 20, arrival=clock.now_s))
    assert not sched.is_holding(clock.now_s)
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"a", "b", "c"}


def test_incoming_uploads_are_waited_for_at_most_the_batch_wait() -> None:
    sched, runner, clock = make(upload_batch_wait_s=0.05)
    sched.set_incoming_uploads(5)  # e.g. long files still decoding in the gateway
    sched.add(req("a", 20, arrival=clock.now_s))
    arrival = clock.now_s
    while clock.now_s - arrival < 0.05:
        assert sched.is_holding(clock.now_s)
        (batch,) = run_steps(sched, runner, clock, 1)
        assert batch.is_empty
    assert not sched.is_holding(clock.now_s)
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"a"}


def test_uploads_that_fill_a_step_are_not_held() -> None:
    """Waiting uploads whose prompts already reach the step's token limit go at once: no more
    could join their prefill step, so waiting for company only adds latency (both rules)."""
    for hold in (UploadHold.PIPELINE, UploadHold.ARRIVALS):
        sched, runner, clock = make(
            upload_batch_wait_s=10.0,
            max_num_batched_tokens=512,
            chunked_prefill_size=512,
            upload_hold=hold,
        )
        _decoding(sched, runner, clock, 3)
        sched.set_incoming_uploads(4)
        sched.add(req("a", 300, arrival=clock.now_s))
        (batch,) = run_steps(sched, runner, clock, 1)
        assert not _admitted(batch)  # 300 of 512 tokens: held
        sched.add(req("b", 212, arrival=clock.now_s))
        (batch,) = run_steps(sched, runner, clock, 1)
        assert _admitted(batch), hold  # 512 tokens wait: a full step


def test_incoming_uploads_hold_even_when_as_many_wait_as_decode() -> None:
    sched, runner, clock = make(upload_batch_wait_s=10.0)
    _decoding(sched, runner, clock, 2)
    sched.set_incoming_uploads(1)
    sched.add(req("a", 20, arrival=clock.now_s))
    sched.add(req("b", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert not _admitted(batch) and len(batch.decodes) == 2  # decodes go on meanwhile
    assert not sched.is_holding(clock.now_s)  # there is decode work: not idle
    sched.set_incoming_uploads(0)
    sched.add(req("c", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"a", "b", "c"}


def test_nothing_incoming_keeps_the_fewer_than_decoding_rule() -> None:
    """With nothing on its way, PIPELINE still holds while fewer wait than decode: in a closed
    loop the clients of the running requests come back (test_upload_hold_sim.py measures it)."""
    sched, runner, clock = make(upload_batch_wait_s=10.0)
    _decoding(sched, runner, clock, 3)
    sched.set_incoming_uploads(0)
    sched.add(req("late", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert not _admitted(batch)
    sched.add(req("late2", 20, arrival=clock.now_s))
    sched.add(req("late3", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"late", "late2", "late3"}


def test_arrivals_policy_ignores_incoming_uploads() -> None:
    sched, runner, clock = make(upload_batch_wait_s=10.0, upload_hold=UploadHold.ARRIVALS)
    sched.set_incoming_uploads(7)
    sched.add(req("first", 20, arrival=clock.now_s))
    assert not sched.is_holding(clock.now_s)
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"first"}  # an idle engine starts at once
    sched, runner, clock = make(upload_batch_wait_s=10.0, upload_hold="arrivals")
    _decoding(sched, runner, clock, 1)
    sched.set_incoming_uploads(7)
    sched.add(req("a", 20, arrival=clock.now_s))
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"a"}  # as many wait as decode


def test_a_preempted_upload_is_never_held_for_incoming_uploads() -> None:
    sched, runner, clock = make(upload_batch_wait_s=10.0)
    sched.add(req("up", 20, max_new=50))
    run_steps(sched, runner, clock, 2)
    assert sched.preempt("up")
    sched.set_incoming_uploads(4)
    assert not sched.is_holding(clock.now_s)
    (batch,) = run_steps(sched, runner, clock, 1)
    assert _admitted(batch) == {"up"}  # it already waited once


def test_live_hops_are_never_held_for_incoming_uploads() -> None:
    sched, runner, clock = make(upload_batch_wait_s=10.0)
    sched.set_incoming_uploads(4)
    sched.add(req("upload", 20, arrival=clock.now_s))
    sched.add(req("hop", 20, LIVE, deadline=clock.now_s + 1.0, arrival=clock.now_s))
    assert not sched.is_holding(clock.now_s)
    (batch,) = run_steps(sched, runner, clock, 1)
    # the hop runs at once and its eager step takes the held upload along
    assert _admitted(batch) == {"hop", "upload"}


def test_incoming_count_is_validated() -> None:
    sched, _, _ = make()
    with pytest.raises(SchedulerError):
        sched.set_incoming_uploads(-1)
    with pytest.raises(ConfigError):
        SchedulerConfig(upload_hold="sometimes")  # type: ignore[arg-type]


def test_pipeline_hold_is_deterministic() -> None:
    def trace() -> list[tuple[object, ...]]:
        sched, runner, clock = make(upload_batch_wait_s=0.02)
        _decoding(sched, runner, clock, 2)
        out: list[tuple[object, ...]] = []
        for i in range(12):
            sched.set_incoming_uploads((12 - i) % 4)
            sched.add(req(f"u{i}", 20 + i, arrival=clock.now_s))
            out += [summary(b) for b in run_steps(sched, runner, clock, 3)]
        return out

    first = trace()
    assert first == trace()
    assert any(b[0] for b in first) and any(not b[0] for b in first)  # holds and admissions


def _hop_latency_beside(share: float, rows: int) -> float:
    """Estimated s from a 30k-token hop's arrival to its first token, while `rows` live
    sessions decode their tails at 30k context (later deadlines) beside a decoding upload.
    The scheduler alone (no fake KV): the clock moves by each step's estimate."""
    sched = Scheduler(
        BlockManager(40_000, TEST_BLOCK_SIZE),
        SchedulerConfig(upload_min_share=share, upload_batch_wait_s=0.0),
    )
    sched.set_live_sessions(rows + 1)
    now_s = 0.0

    def step() -> ScheduledBatch:
        nonlocal now_s
        batch = sched.schedule(now_s)
        now_s += batch.estimated_cost_s
        sched.postprocess(batch, [7] * len(batch.sampled_requests))
        return batch

    sched.add(req("up", 1_000, max_new=100_000, base=10**8))
    for i in range(rows):
        sched.add(
            req(f"d{i}", 30_000, LIVE, max_new=100_000, deadline=100.0 + i, base=10**6 * (i + 1))
        )
    while sched.waiting or not all(r.is_decoding for r in sched.running):
        step()
    hop = req("hop", 30_000, LIVE, max_new=1, deadline=now_s + 1.0, arrival=now_s, base=9 * 10**8)
    sched.add(hop)
    start_s = now_s
    while not hop.is_finished:
        batch = step()
        if batch.upload_turn:  # the uploads' alone: no later-deadline live row jumps ahead
            assert all(r.request_class is UPLOAD for r in batch.decodes) and not batch.prefills
    return now_s - start_s


@pytest.mark.parametrize("rows", [8, 16])
def test_upload_turns_slow_an_urgent_hop_by_the_share_at_most(rows: int) -> None:
    """With many live rows decoding at long context, a hop's prefill takes at most
    1 / (1 - share) as long as with no share (plus a step budget), within its deadline."""
    share, budget_s = 0.25, SchedulerConfig().step_budget_s
    alone_s = _hop_latency_beside(0.0, rows)
    shared_s = _hop_latency_beside(share, rows)
    assert shared_s <= alone_s / (1 - share) + budget_s
    assert shared_s <= 1.0


# -- decode-only steps between live prefills --------------------------------------------------


def _hop_decoding_beside_prefills(
    decode_steps: int, cls: RequestClass = LIVE
) -> tuple[Request, list[ScheduledBatch]]:
    """A request of `cls` decoding 40 ids while long live hops keep every step's budget in
    prefill; the steps until it has finished."""
    sched, runner, clock = make(
        num_blocks=4096, live_decode_steps=decode_steps, upload_min_share=0.0, step_budget_s=0.050
    )
    runner.check_reads = False  # long prompts: the other tests check KV reads
    deadline = 5.0 if cls is LIVE else None
    hop = req("new-text", 300, cls, max_new=40, deadline=deadline, base=800_000)
    sched.add(hop)
    run_steps(sched, runner, clock, 1)
    assert hop.is_decoding
    for i in range(24):  # each needs two 50-ms steps of prefill: they outlast the hop
        # one id each, sampled by the last chunk: no decode row of their own
        sched.add(req(f"hop{i}", 12_000, LIVE, max_new=1, deadline=6.0 + i, base=i * 20_000))
    batches: list[ScheduledBatch] = []
    while not hop.is_finished:
        batches += run_steps(sched, runner, clock, 1)
        assert len(batches) < 500
    return hop, batches


def _prefilled(batch: ScheduledBatch) -> bool:
    return bool(batch.prefills)


def test_decode_only_steps_follow_each_prefill_while_a_live_hop_decodes() -> None:
    """With two decode-only steps per prefill, every step that prefills is followed by two
    that only decode (the hop's row in both) while the hop decodes; its 39 further ids take
    a third of the prefill steps they take when its row only rides along."""
    hop, batches = _hop_decoding_beside_prefills(2)
    kinds = ["P" if _prefilled(b) else "D" for b in batches]
    # the hop's own prefill came just before: two decode-only steps, then the hops' prefills
    assert "".join(kinds).startswith("DDPDDPDDP"), kinds
    for i, batch in enumerate(batches):
        assert hop in batch.decodes
        if _prefilled(batch) and i + 2 < len(batches) - 1:
            assert kinds[i + 1 : i + 3] == ["D", "D"]
    interleaved = sum(map(_prefilled, batches))
    _, along = _hop_decoding_beside_prefills(0)
    assert all(map(_prefilled, along))  # with none, every step prefills
    assert interleaved <= len(along) // 3 + 1
    # decode-only steps cost a fixed part and the row: far less than a prefill step
    decode_only = [b.estimated_cost_s for b in batches if not _prefilled(b)]
    assert max(decode_only) < 0.2 * min(b.estimated_cost_s for b in along)


def test_no_decode_only_steps_for_upload_rows_alone() -> None:
    """Only a live row decoding makes steps decode-only: beside an upload's row (which, with
    no upload share, waits for the live prefills) every step prefills while prefill waits."""
    _, batches = _hop_decoding_beside_prefills(2, cls=UPLOAD)
    kinds = "".join("P" if _prefilled(b) else "D" for b in batches)
    assert "D" not in kinds[: kinds.rindex("P")], kinds


def test_decode_only_steps_do_not_hold_back_a_prefill_with_nothing_decoding() -> None:
    """A live hop queued while nothing decodes is prefilled at once, whatever the setting."""
    sched, runner, clock = make(num_blocks=4096, live_decode_steps=2)
    sched.add(req("hop", 3_000, LIVE, max_new=1, deadline=1.0))
    first = run_steps(sched, runner, clock, 1)[0]
    assert first.prefills and first.prefills[0].request.request_id == "hop"


def test_a_hop_due_before_every_decoding_row_is_not_held_back() -> None:
    """Decode-only steps run only while the most urgent live request decodes: a hop queued
    with an earlier deadline than the decoding row is prefilled in the very next step."""
    sched, runner, clock = make(num_blocks=4096, live_decode_steps=2, upload_min_share=0.0)
    runner.check_reads = False
    row = req("row", 300, LIVE, max_new=40, deadline=5.0, base=800_000)
    sched.add(row)
    run_steps(sched, runner, clock, 1)
    assert row.is_decoding
    sched.add(req("urgent", 3_000, LIVE, max_new=1, deadline=1.0))
    batch = run_steps(sched, runner, clock, 1)[0]
    assert [c.request.request_id for c in batch.prefills] == ["urgent"]
    sched.add(req("later", 3_000, LIVE, max_new=1, deadline=9.0, base=100_000))
    after = run_steps(sched, runner, clock, 3)
    assert [bool(b.prefills) for b in after] == [False, False, True]


def test_decode_only_steps_take_live_rows_only() -> None:
    """An upload decoding beside the live row gets no row in the decode-only steps (its
    share across steps is the upload turns'); it keeps its rows in the other steps."""
    sched, runner, clock = make(num_blocks=8192, live_decode_steps=2, upload_min_share=0.0)
    runner.check_reads = False
    sched.add(req("up", 300, max_new=400, base=900_000))
    sched.add(req("row", 300, LIVE, max_new=40, deadline=5.0, base=800_000))
    run_steps(sched, runner, clock, 1)
    for i in range(6):
        sched.add(req(f"hop{i}", 3_000, LIVE, max_new=1, deadline=6.0 + i, base=i * 10_000))
    batches = run_steps(sched, runner, clock, 9)
    decode_only = [b for b in batches if not b.prefills]
    assert decode_only
    for batch in decode_only:
        assert [r.request_id for r in batch.decodes] == ["row"]


def test_upload_turns_do_not_restart_the_run_of_decode_only_steps() -> None:
    """Uploads arriving every step take turns that prefill; those turns do not count as the
    live prefill that starts a new run of decode-only steps, so queued hops are still
    prefilled (a reset on every prefill starved them: D, turns, D, turns... for 400 steps;
    the hops now finish in ~250)."""
    # the 50-ms steps of session 21, where the starvation was found (step counts scale with it)
    sched, runner, clock = make(
        num_blocks=400_000, live_decode_steps=2, upload_batch_wait_s=0.0, step_budget_s=0.050
    )
    runner.check_reads = False
    rows = [  # the most urgent live work, decoding for longer than the test runs
        req(f"row{i}", 20_000, LIVE, max_new=4_000, deadline=1.0, base=1 + i * 30_000)
        for i in range(8)
    ]
    for r in rows:
        sched.add(r)
    while not all(r.is_decoding for r in rows):
        run_steps(sched, runner, clock, 1)
    hops = [
        req(f"hop{i}", 12_000, LIVE, max_new=1, deadline=100.0 + i, base=50_000_000 + i * 20_000)
        for i in range(6)
    ]
    for hop in hops:
        sched.add(hop)
    batches: list[ScheduledBatch] = []
    while not all(h.is_finished for h in hops):
        upload = req(f"u{len(batches)}", 200, max_new=2, arrival=clock.now_s,
                     base=90_000_000 + 1_000 * len(batches))  # fmt: skip
        sched.add(upload)
        batches += run_steps(sched, runner, clock, 1)
        assert len(batches) < 400, "live prefill starved"
    assert any(b.upload_turn for b in batches)
    assert any(not b.prefills and not b.upload_turn for b in batches)  # decode-only ran


@pytest.mark.parametrize("decode_steps", [0, 2])
def test_a_request_finished_for_lack_of_kv_in_a_fallback_step_is_reported(
    decode_steps: int,
) -> None:
    """A live row that cannot grow (the pool is two blocks) finishes with LENGTH inside a
    decode-only attempt that comes out empty; the step built instead reports it."""
    sched, runner, clock = make(num_blocks=2, live_decode_steps=decode_steps)
    row = req("row", 30, LIVE, max_new=100, deadline=5.0)
    sched.add(row)
    reported: list[str] = []
    while sched.has_work():
        batch = run_steps(sched, runner, clock, 1)[0]
        reported += [r.request_id for r in batch.finished]
        assert len(reported) <= 1
    assert row.finish_reason is FinishReason.LENGTH
    assert reported == ["row"]
