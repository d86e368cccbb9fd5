"""The paged engine against the transformers reference on a tiny checkpoint (CPU, fp32).

Greedy tokens must be identical for every request of a mixed batch of 8 (1 s to 3 min of real
speech, staggered arrivals, one abort), for chunked prefill sizes 64, 512 and 4096, and with a
KV pool so small that requests are preempted and recomputed. The allocator audit runs after
every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from livemeet.engine.cost_model import StepCostModel
from livemeet.engine.engine import Engine, EngineConfig, output_budget
from livemeet.engine.paged_backend import StepAttention
from livemeet.engine.request import RequestClass, Status
from livemeet.engine.scheduler import ScheduledBatch, SchedulerConfig
from livemeet.models.audio_llm import MossTDModel
from tests.engine.fakes import TEST_BLOCK_SIZE, SteppingClock
from tests.models import tiny

NEW_TOKENS = 24
DURATIONS_S = (1.0, 3.0, 11.0, 20.0, 40.0, 71.3, 100.0, 180.0)
ABORTED = 3  # index of the request aborted mid-flight
EMBED = "language_model.embed_tokens.weight"


@pytest.fixture(scope="module")
def batch_clips(long_speech: np.ndarray) -> list[np.ndarray]:
    audio = np.concatenate([long_speech, long_speech])
    return [audio[: int(round(d * 16_000))] for d in DURATIONS_S]


@pytest.fixture(scope="module")
def reference_tokens(ref_model: Any, batch_clips: list[np.ndarray]) -> list[list[int]]:
    return [_reference_greedy(ref_model, clip) for clip in batch_clips]


def _engine(
    model: MossTDModel, chunk: int, num_blocks: int | None, block_size: int = TEST_BLOCK_SIZE
) -> Engine:
    sched = SchedulerConfig(chunked_prefill_size=chunk, max_num_batched_tokens=max(chunk, 1024))
    config = EngineConfig(num_kv_blocks=num_blocks, block_size=block_size, scheduler=sched)
    return Engine(config, model=(model, model.cfg), clock=SteppingClock())


def _run_together(engine: Engine, clips: list[np.ndarray]) -> list[list[int]]:
    """Greedy output tokens of every clip, all added at once and stepped to the end."""
    for i, clip in enumerate(clips):
        engine.add_request(f"r{i}", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    done: dict[str, list[int]] = {}
    while engine.has_work():
        done.update({r.request_id: list(r.output_token_ids) for r in engine.step().finished})
    return [done[f"r{i}"] for i in range(len(clips))]


def _reference_greedy(ref: Any, clip: np.ndarray) -> list[int]:
    """The transformers model `ref`'s greedy NEW_TOKENS tokens for one clip."""
    return tiny.reference_greedy(ref, tiny.reference_inputs([clip]), NEW_TOKENS)[0]


def _run_staggered(engine: Engine, clips: list[np.ndarray]) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    pending = list(enumerate(clips))
    step = 0
    while pending or engine.has_work():
        if pending and step % 3 == 0:  # a new arrival every third step
            i, clip = pending.pop(0)
            engine.add_request(f"r{i}", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        if step == 12:
            engine.abort(f"r{ABORTED}")
        out = engine.step()
        engine.block_manager.audit(engine.scheduler.live_requests())
        for req in out.finished:
            done[req.request_id] = list(req.output_token_ids)
        step += 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return done


@pytest.mark.parametrize(
    ("chunk", "block_size"),
    [(64, TEST_BLOCK_SIZE), (512, TEST_BLOCK_SIZE), (4096, TEST_BLOCK_SIZE), (512, 128)],
)
def test_mixed_batch_matches_reference(
    our_model: MossTDModel,
    batch_clips: list[np.ndarray],
    reference_tokens: list[list[int]],
    chunk: int,
    block_size: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # staggered arrivals make mixed steps: their decode rows must take the decode kernel;
    # blocks of 128 (the default) hold whole extend tiles; 16 puts many block boundaries
    # inside each chunk
    engine = _engine(our_model, chunk, num_blocks=None, block_size=block_size)
    runner = engine.runner
    launch, metadata, attend = runner.launch, runner._metadata, StepAttention.__call__
    batches: list[Any] = []
    marked: list[tuple[int, int]] = []  # (decode rows scheduled, decode rows marked) per step
    mixed_calls: list[int] = []

    def spy_launch(batch: Any, *args: Any, **kwargs: Any) -> Any:
        batches.append(batch)
        return launch(batch, *args, **kwargs)

    def spy_metadata(rows: Any) -> Any:
        meta = metadata(rows)
        if batches[-1].prefills:
            marked.append((len(batches[-1].decodes), meta.num_decode_seqs))
        return meta

    def spy_attend(self: StepAttention, q: torch.Tensor, *args: Any) -> torch.Tensor:
        if self.extend is not None and self.decode is not None:  # a mixed step's layer
            mixed_calls.append(q.shape[0] - self.num_prefill_rows)
        return attend(self, q, *args)

    monkeypatch.setattr(runner, "launch", spy_launch)
    monkeypatch.setattr(runner, "_metadata", spy_metadata)
    monkeypatch.setattr(StepAttention, "__call__", spy_attend)
    done = _run_staggered(engine, batch_clips)
    assert all(scheduled == got for scheduled, got in marked), marked
    assert any(scheduled for scheduled, _ in marked), "no step mixed chunks with decode rows"
    assert len(mixed_calls) == our_model.cfg.text.layers * sum(1 for s, _ in marked if s)
    assert f"r{ABORTED}" not in done
    for i, ref in enumerate(reference_tokens):
        if i != ABORTED:
            assert done[f"r{i}"] == ref, f"request {i} ({DURATIONS_S[i]} s) differs"
    assert all(len(set(toks)) >= 8 for toks in done.values())


def test_tiny_pool_preempts_and_still_matches(
    our_model: MossTDModel,
    batch_clips: list[np.ndarray],
    reference_tokens: list[list[int]],
) -> None:
    # 200 blocks x 16 = 3,200 tokens: the 3-minute prompt (~2.4k) fits alone, not with others.
    # Uploads r0..r6 arrive first; the 3-minute clip arrives as a live hop while they hold KV,
    # so uploads must be preempted, and later recomputed to the same tokens.
    engine = _engine(our_model, 512, num_blocks=200)
    live = len(batch_clips) - 1
    for i, clip in enumerate(batch_clips[:live]):
        engine.add_request(f"r{i}", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    done: dict[str, list[int]] = {}
    preempted: set[str] = set()
    step = 0
    while engine.has_work():
        if step == 4:
            engine.add_request(
                f"r{live}",
                batch_clips[live],
                max_new_tokens=NEW_TOKENS,
                ignore_eos=True,
                request_class=RequestClass.LIVE,
            )
        out = engine.step()
        engine.block_manager.audit(engine.scheduler.live_requests())
        preempted.update(r.request_id for r in engine.scheduler.waiting if r.num_preemptions)
        done.update({r.request_id: list(r.output_token_ids) for r in out.finished})
        step += 1
    assert preempted, "the tiny pool should have forced a preemption"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    for i, ref in enumerate(reference_tokens):
        assert done[f"r{i}"] == ref, f"request {i} differs"


def test_forced_output_substitutes_tokens(
    our_model: MossTDModel, batch_clips: list[np.ndarray]
) -> None:
    engine = _engine(our_model, 512, num_blocks=None)
    forced = [15, 16, 17, 18]
    req = engine.add_request("f", batch_clips[0], forced_output_ids=forced)
    engine.run_to_completion()
    assert req.status is Status.FINISHED
    assert req.output_token_ids == [*forced, tiny.IM_END]


def test_live_requests_are_accepted_and_budget_scales() -> None:
    assert output_budget(1.0, 100, 131_072) == 512
    assert output_budget(3600.0, 48_000, 131_072) == 36_000
    assert output_budget(5400.0, 120_000, 131_072) == 131_072 - 120_000 - 1
    assert RequestClass.LIVE != RequestClass.UPLOAD


def test_audio_of_one_step_is_encoded_in_one_batch(
    our_model: MossTDModel, batch_clips: list[np.ndarray]
) -> None:
    # Regression (H200 short-clip benchmark): each add_request ran its own encoder pass, so 16
    # arrivals cost 16 single-window passes; windows are now batched across the requests a
    # step first schedules.
    engine = _engine(our_model, 4096, num_blocks=None)
    for i, clip in enumerate(batch_clips[:3]):  # 1 s, 3 s, 11 s: one window each
        engine.add_request(f"e{i}", clip, max_new_tokens=2)
    assert engine.encoder.num_encoded_windows == 0  # nothing encoded before scheduling
    engine.step()
    assert engine.encoder.num_encoded_windows == 3
    assert engine.encoder.num_eager_batches == 1
    engine.run_to_completion()


def test_an_upload_is_encoded_as_its_chunks_reach_its_windows(
    our_model: MossTDModel, batch_clips: list[np.ndarray]
) -> None:
    """A long upload's windows are encoded by the steps whose chunks reach them, not all in
    its first step, which every live hop would wait for (a 37-minute meeting: 75 windows,
    ~0.27 s on an H100); the tokens are those of an engine that encodes it at once."""
    clip = batch_clips[6]  # 100 s: 4 windows (375, 375, 375, 125 audio tokens)
    whole = _engine(our_model, 4096, num_blocks=None)
    whole.add_request("u", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    whole.step()
    assert whole.encoder.num_encoded_windows == 4  # one chunk: every window at once
    expected = whole.run_to_completion()["u"].output_token_ids
    engine = _engine(our_model, 256, num_blocks=None)
    up = engine.add_request("u", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    encoded, ready = [], []
    while engine.has_work():
        engine.step()
        engine.block_manager.audit(engine.scheduler.live_requests())
        encoded.append(engine.encoder.num_encoded_windows)
        ready.append(up.num_encoded_audio)
    assert encoded[0] == 1  # the first 256-token chunk reaches window 0 only
    assert encoded == sorted(encoded) and encoded[-1] == 4  # each window once, in order
    assert len(set(encoded)) == 4  # spread over steps
    assert ready[-1] == len(up.audio_positions)
    assert up.output_token_ids == expected


def test_an_uploads_next_windows_fill_the_encoder_batchs_padding(
    our_model: MossTDModel, batch_clips: list[np.ndarray]
) -> None:
    """With encoder buckets, the rows a step's micro-batch would pad with silence take the
    upload's next windows: a first chunk that reaches 3 of 4 windows encodes all 4 in one
    bucket of 4, and no later step encodes any; the tokens do not change."""
    from livemeet.engine.encoder_runner import EncoderRunner

    clip = batch_clips[6]  # 100 s: 4 windows
    engine = _engine(our_model, 900, num_blocks=None)
    engine.encoder = EncoderRunner(
        our_model, cache_windows=0, batch_buckets=(1, 2, 4), warm_up_at_start=False
    )
    up = engine.add_request("u", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    engine.step()
    lo, hi = up.audio_span_in(0, 900)
    assert (hi - 1) // 375 + 1 == 3  # the chunk reaches windows 0-2
    assert engine.encoder.num_encoded_windows == 4 and engine.encoder.num_eager_batches == 1
    assert up.num_encoded_audio == len(up.audio_positions)
    engine.run_to_completion()
    assert engine.encoder.num_encoded_windows == 4
    whole = _engine(our_model, 4096, num_blocks=None)
    whole.add_request("u", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    assert up.output_token_ids == whole.run_to_completion()["u"].output_token_ids


def test_a_forked_upload_is_charged_only_for_windows_it_has_encoded(
    our_model: MossTDModel, batch_clips: list[np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload forking another's KV (a revision forks the last hop's) never encodes the
    windows before its fork: its chunks start past them. `num_encoded_audio` counted from 0,
    so it stayed 0 and each later chunk was charged (on the live budget) for the windows the
    first one had encoded already. It counts from the next audio position instead, reaches
    the end once every window after the fork is encoded (no charge any more), and after a
    preemption the recompute from 0 is charged for the windows before the fork again."""
    clip = batch_clips[6]  # 100 s: 4 windows
    engine = _engine(our_model, 256, num_blocks=None)
    engine.set_live_sessions(1)
    a = engine.add_request("a", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    while not a.output_token_ids:
        engine.step()
    b = engine.add_request(
        "b", clip, max_new_tokens=4, ignore_eos=True, fork_from="a", num_fork_tokens=900
    )
    assert b.num_cached_tokens == 900
    engine.step()  # b's first chunk: from token 900, inside window 2
    encoded = list(engine._sources["b"].encoded)
    assert encoded[:2] == [False, False] and encoded[2]
    ready = b.num_encoded_audio // 375  # the windows past it are the ones still to encode
    assert all(encoded[b.audio_span_in(b.num_computed_tokens, b.num_tokens)[0] // 375 : ready])
    assert not any(encoded[ready:])
    while b.num_computed_tokens < b.audio_positions[-1] + 1:
        engine.step()
    assert b.num_encoded_audio == len(b.audio_positions)  # nothing left to charge
    seen: list[int] = []  # b's value as the scheduler charges its chunk with it
    schedule = engine.scheduler.schedule
    monkeypatch.setattr(
        engine.scheduler,
        "schedule",
        lambda now: (seen.append(b.num_encoded_audio), schedule(now))[1],
    )
    engine.preempt("b")
    engine.step()  # re-admitted from token 0: its chunk reaches window 0 again
    assert seen == [0] and engine._sources["b"].encoded[0]
    done = engine.run_to_completion()
    assert b.num_encoded_audio == len(b.audio_positions)
    whole = _engine(our_model, 4096, num_blocks=None)
    whole.add_request("b", clip, max_new_tokens=4, ignore_eos=True)
    assert done["b"].output_token_ids == whole.run_to_completion()["b"].output_token_ids


@pytest.mark.parametrize("asynchronous", [False, True])
def test_an_upload_the_scheduler_evicts_is_recounted_in_the_step_that_evicts_it(
    our_model: MossTDModel,
    batch_clips: list[np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    asynchronous: bool,
) -> None:
    """A forked upload evicted for a live hop's KV (the scheduler's own eviction, while it
    builds a batch) has `num_encoded_audio` recounted in the step that evicts it, from the
    batch's `preempted_ids`; a scan of every request with audio still to encode did it before
    the next schedule. It is 0: the recompute from token 0 reaches the two windows before the
    fork, never encoded, and is charged for them. The recompute encodes them, from window 0,
    and its tokens are those of the same upload unforked."""
    from livemeet.engine.model_runner import TokenTransfer

    clip = batch_clips[6]  # 100 s: 4 windows
    sched = SchedulerConfig(chunked_prefill_size=256, max_num_batched_tokens=1024)
    config = EngineConfig(num_kv_blocks=120, block_size=TEST_BLOCK_SIZE, scheduler=sched)
    transfer = TokenTransfer(torch.device("cpu"), sched.max_num_seqs) if asynchronous else None
    engine = Engine(
        config, model=(our_model, our_model.cfg), clock=SteppingClock(), transfer=transfer
    )
    engine.set_live_sessions(1)
    a = engine.add_request("a", clip, max_new_tokens=4, ignore_eos=True, retain_kv=True)
    while not a.is_finished:
        engine.step()
    b = engine.add_request(
        "b", clip, max_new_tokens=4, ignore_eos=True, fork_from="a", num_fork_tokens=900
    )
    engine.scheduler.release("a")
    while b.num_computed_tokens < b.audio_positions[-1] + 1:
        engine.step()
    assert engine._sources["b"].encoded == [False, False, True, True]
    assert b.num_encoded_audio == len(b.audio_positions)
    # the live hop needs more KV than is free: b goes (an upload, below any live hop)
    engine.add_request(
        "hop", np.roll(batch_clips[5], 8_000), max_new_tokens=4, request_class=RequestClass.LIVE
    )
    engine.step()
    assert b.status is Status.PREEMPTED and b.num_computed_tokens == 0
    assert b.num_encoded_audio == 0  # recounted at once: window 0 is to encode
    seen: list[int] = []  # b's count at each schedule, as the scheduler charges its chunk
    schedule = engine.scheduler.schedule
    monkeypatch.setattr(
        engine.scheduler,
        "schedule",
        lambda now: (seen.append(b.num_encoded_audio), schedule(now))[1],
    )
    while b.status is Status.PREEMPTED:
        engine.step()
    assert seen and set(seen) == {0}
    assert engine._sources["b"].encoded[0]  # its first chunk encoded window 0
    done = engine.run_to_completion()
    assert b.num_encoded_audio == len(b.audio_positions) and "b" not in engine._sources
    whole = _engine(our_model, 4096, num_blocks=None)
    whole.add_request("b", clip, max_new_tokens=4, ignore_eos=True)
    assert done["b"].output_token_ids == whole.run_to_completion()["b"].output_token_ids


def test_a_wave_of_uploads_beside_live_sessions_is_encoded_within_the_step_budget(
    our_model: MossTDModel, batch_clips: list[np.ndarray]
) -> None:
    """Three 100-s uploads arrive at once. Alone they are prefilled and encoded in one step
    (12 windows: the upload budget pays for them). With a live session open the step keeps
    the live budget (15 ms estimated), whose upload share pays for encoding too: the first
    step encodes the first upload's 4 windows (and at most the next one's first, in what the
    budget has left), so a hop that comes meanwhile waits for about one upload's encode, not
    the wave's. The tokens are the same."""
    # 100 s each (4 windows), rotated apart so that no window is in the encoder's cache
    clips = [np.roll(batch_clips[6], 48_000 * i) for i in range(3)]
    first: dict[bool, int] = {}
    tokens: dict[bool, dict[str, list[int]]] = {}
    for live in (False, True):
        engine = Engine(EngineConfig(), model=(our_model, our_model.cfg), clock=SteppingClock())
        engine.set_live_sessions(int(live))
        for i, clip in enumerate(clips):
            engine.add_request(f"u{i}", clip, max_new_tokens=4, ignore_eos=True)
        engine.step()
        first[live] = engine.encoder.num_encoded_windows
        done = engine.run_to_completion()
        assert engine.encoder.num_encoded_windows == 12  # each window once, either way
        tokens[live] = {rid: r.output_token_ids for rid, r in done.items()}
    assert first[False] == 12 and 4 <= first[True] <= 5
    assert tokens[True] == tokens[False]


def _batches(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[ScheduledBatch]:
    """The batches the engine's scheduler builds from now on, in order."""
    batches: list[ScheduledBatch] = []
    schedule = engine.scheduler.schedule
    monkeypatch.setattr(
        engine.scheduler, "schedule", lambda now: batches.append(schedule(now)) or batches[-1]
    )
    return batches


@pytest.mark.parametrize(("seconds", "to_encode"), [(90.0, 0), (100.0, 1)])
def test_a_repeated_upload_beside_live_work_is_charged_only_for_windows_it_encodes(
    our_model: MossTDModel,
    batch_clips: list[np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    seconds: float,
    to_encode: int,
) -> None:
    """An upload whose full windows the encoder's cache holds (the same audio again: a repeat,
    or an upload continued after an early stop) encodes none of them, yet beside live work
    its chunk was charged for them (`encode_s_per_window` each), and came out shorter than
    an encoded upload's. The engine tells the scheduler which windows are cached: the
    repeat's first chunk is as long as that of an upload with nothing to encode (here its
    whole prompt), charged for the windows the encoder runs only: the partial last one (never
    cached), or none, and the encoder runs just those."""
    clip = batch_clips[7][: int(seconds * 16_000)]  # 90 s: 3 full windows; 100 s: and 10 s
    engine = _engine(our_model, 4096, num_blocks=None)
    engine.set_live_sessions(1)
    cost = StepCostModel(encode_s_per_window=5e-3)  # 3 windows: more than the step's budget
    engine.scheduler.cost_model = cost
    engine.encoder.encode([clip])  # what an earlier upload of the same audio left cached
    encoded = engine.encoder.num_encoded_windows
    batches = _batches(engine, monkeypatch)
    up = engine.add_request("again", clip, max_new_tokens=4, ignore_eos=True)
    engine.step()
    (chunk,) = batches[0].prefills
    usable = engine.scheduler.config.step_budget_s - cost.fixed_s
    plain = cost.max_prefill_tokens(0, usable - cost.encode_cost_s(to_encode), 4096)
    assert chunk.num_tokens == min(plain, up.num_prompt_tokens) == up.num_prompt_tokens
    assert up.cached_audio_windows == {0, 1, 2}
    charged = cost.prefill_cost_s(0, chunk.num_tokens) + cost.encode_cost_s(to_encode)
    assert batches[0].estimated_cost_s == pytest.approx(cost.fixed_s + charged)
    assert engine.encoder.num_encoded_windows - encoded == to_encode


@pytest.mark.parametrize("first", ["again", "new"])
@pytest.mark.parametrize("chunk", [4096, 512])
def test_an_uploads_encode_charge_is_the_encoders_work_when_the_step_evicts_its_windows(
    our_model: MossTDModel,
    batch_clips: list[np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    chunk: int,
    first: str,
) -> None:
    """Beside live work a repeated upload (its 3 full windows cached) and a new one run in a
    cache of 3 windows, so the new one's encodes evict the repeat's windows: in whole-prompt
    chunks within the step that found them cached, in chunks of 512 tokens also before the
    repeat's later chunks reach them. Every step's charge is the windows the encoder runs in
    it: a step looks its windows up before it stores any output (none is charged short), and
    a window evicted before a later step's look is charged and encoded again. With the new
    upload first in the step, an encoder that stored its outputs before it looked up the
    repeat's windows would run windows the step found cached, more than it charged; with the
    repeat first it would not show."""
    from livemeet.engine import scheduler as scheduler_module
    from livemeet.engine.encoder_runner import EncoderRunner

    clip = batch_clips[6]  # 100 s: 3 full windows and a partial one
    engine = _engine(our_model, chunk, num_blocks=None)
    engine.encoder = EncoderRunner(our_model, cache_windows=3, warm_up_at_start=False)
    engine.set_live_sessions(1)
    engine.encoder.encode([clip])
    charged: list[int] = []  # windows charged to each chunk of the step being built
    count = scheduler_module._windows_to_encode
    monkeypatch.setattr(
        scheduler_module,
        "_windows_to_encode",
        lambda request, start, end: charged.append(count(request, start, end)) or charged[-1],
    )
    uploads = {"again": clip, "new": np.roll(clip, 8_000)}
    for rid in sorted(uploads, key=lambda r: r != first):  # `first` arrives first
        engine.add_request(rid, uploads[rid], max_new_tokens=4, ignore_eos=True)
    steps = []
    while engine.has_work():
        charged.clear()
        before = engine.encoder.num_encoded_windows
        engine.step()
        steps.append((sum(charged), engine.encoder.num_encoded_windows - before))
    assert all(c == e for c, e in steps), steps
    # each of the 8 windows (4 each) found or encoded once; some of the repeat's were found
    encoded, found = sum(e for _, e in steps), engine.encoder.num_cache_hits
    assert encoded + found == 8 and found > 0


def test_a_step_hashes_the_windows_of_the_uploads_first_in_line_only(
    our_model: MossTDModel, batch_clips: list[np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside live work the engine hashes an upload's next windows to ask the encoder's cache
    for them (`cached_windows`), on the engine thread before each schedule (~1 ms a window at
    real size): only for the uploads first in line whose chunks' reaches together stay within
    a step's token limit, so eight queued uploads cost the step the hashing of two (1024
    tokens, chunks of 512: two windows each), not of all eight; the later ones are hashed as
    they come to the front."""
    import livemeet.engine.encoder_runner as er

    engine = _engine(our_model, 512, num_blocks=None)  # 1024 tokens a step
    engine.set_live_sessions(1)
    for i in range(8):
        clip = np.roll(batch_clips[6], 1_000 * (i + 1))  # 100 s each: 3 full windows
        engine.add_request(f"u{i}", clip, max_new_tokens=4, ignore_eos=True)
    hashed: list[int] = []
    real = er.window_key
    monkeypatch.setattr(er, "window_key", lambda w: hashed.append(1) or real(w))
    engine.step()
    assert len(hashed) == 4  # u0's and u1's first two windows; the encode takes those keys
    known = {rid for rid, s in engine._sources.items() if any(k is not None for k in s.keys)}
    assert known == {"u0", "u1"}


def test_run_to_completion_refuses_to_wait_for_incoming_uploads(our_model: MossTDModel) -> None:
    from livemeet.errors import InternalError

    engine = _engine(our_model, 4096, num_blocks=None)
    engine.set_incoming_uploads(1)  # an offline job never has any: only a caller bug
    with pytest.raises(InternalError):
        engine.run_to_completion()
    engine.set_incoming_uploads(0)
    assert engine.run_to_completion() == {}


def test_bad_audio_is_refused_at_add(our_model: MossTDModel) -> None:
    from livemeet.errors import BadAudio

    engine = _engine(our_model, 4096, num_blocks=None)
    with pytest.raises(BadAudio):
        engine.add_request("nan", np.full(16_000, np.nan, dtype=np.float32))
    with pytest.raises(BadAudio):
        engine.add_request("empty", np.zeros(0, dtype=np.float32))
    assert not engine.has_work()


def test_warm_up_runs_every_shape_class_and_leaves_results_unchanged(
    our_model: MossTDModel, batch_clips: list[np.ndarray], reference_tokens: list[list[int]]
) -> None:
    # On CUDA the runner warms up at construction; on the CPU call it by hand: it must run
    # every warm-up batch and leave no trace in what requests compute afterwards.
    engine = _engine(our_model, 512, num_blocks=None)
    engine.runner.warm_up()
    engine.add_request("w", batch_clips[2], max_new_tokens=NEW_TOKENS, ignore_eos=True)
    done = engine.run_to_completion()
    assert done["w"].output_token_ids == reference_tokens[2]


def test_runner_warms_up_at_start_with_every_graph_option(our_model: MossTDModel) -> None:
    """The start-up order of a GPU runner (warm-up before any capture, through a forward that
    consults `graphs` and `piecewise`), forced on the CPU: a GPU start with prefill graphs
    once failed on an attribute set only after the warm-up."""
    from livemeet.engine.model_runner import ModelRunner

    runner = ModelRunner(
        our_model, our_model.cfg, block_size=16, num_kv_blocks=256, cuda_graphs=True,
        prefill_graphs=True, warm_up_at_start=True,
    )  # fmt: skip
    assert runner.graphs is None and runner.piecewise is None  # CUDA only
    assert runner.k_caches[0][0].abs().sum() > 0  # the warm-up wrote its scratch KV


def test_warm_up_runs_mixed_steps(our_model: MossTDModel, monkeypatch: pytest.MonkeyPatch):
    """Warm-up's mixed steps (WARM_UP_MIXED) reach the decode kernel from an eager step, with
    one decode row and with two."""
    from livemeet.engine.model_runner import WARM_UP_MIXED, ModelRunner

    decode_rows: list[int] = []
    real = StepAttention.__call__

    def spy(self: StepAttention, q: torch.Tensor, *args: Any) -> torch.Tensor:
        if self.extend is not None and self.decode is not None:  # a mixed step's layer
            decode_rows.append(q.shape[0] - self.num_prefill_rows)
        return real(self, q, *args)

    monkeypatch.setattr(StepAttention, "__call__", spy)
    runner = ModelRunner(our_model, our_model.cfg, block_size=16, num_kv_blocks=256)
    runner.warm_up()
    layers = our_model.cfg.text.layers
    assert decode_rows == [n for _, n in WARM_UP_MIXED for _ in range(layers)]


def _int_class(value: int) -> str:
    """How Triton specialises an int kernel argument: one compiled variant for 1, one for
    multiples of 16, one for the rest (triton.backends.compiler.BaseBackend)."""
    return "one" if value == 1 else "multiple_of_16" if value % 16 == 0 else "other"


def test_block_tables_keep_the_kernel_variant_warm_up_compiled(our_model: MossTDModel) -> None:
    """The attention kernels take the block table's row stride (its width: the longest table
    of the step) as an int argument. A prefill step that carries a decode row whose table has
    just reached 16 blocks (what the HTTP short c4/c8 points formed: a 234-token prompt
    admitted while another request was 7 to 22 tokens into decoding) must not need a variant
    that warm-up did not compile: on an H200 that compile stalled the step for ~2 s."""
    engine = _engine(our_model, 512, num_blocks=None)
    strides: list[int] = []
    metadata = engine.runner._metadata

    def spy(rows: Any) -> Any:
        meta = metadata(rows)
        strides.append(meta.block_tables.stride(0))
        return meta

    engine.runner._metadata = spy  # type: ignore[method-assign]
    engine.runner.warm_up()
    warmed = {_int_class(s) for s in strides}
    strides.clear()
    clip = np.sin(np.arange(int(11.6 * 16_000), dtype=np.float32) * 0.05) * 0.1
    first = engine.add_request("decoding", clip, max_new_tokens=64, ignore_eos=True)
    assert first.num_prompt_tokens <= 240  # 15 blocks; its 16th comes while it decodes
    while len(first.block_table) < 16:
        engine.step()
    second = engine.add_request("admitted", clip, max_new_tokens=64, ignore_eos=True)
    engine.step()
    assert second.num_computed_tokens == second.num_prompt_tokens  # prefilled in that step
    assert len(first.block_table) == 16 and first.num_output_tokens < 64  # ... beside this row
    engine.run_to_completion()
    served = {_int_class(s) for s in strides}
    assert served <= warmed, f"serving needs {served - warmed}, warm-up compiled {warmed}"


def test_forced_assistant_prefix_matches_reference(
    our_model: MossTDModel, ref_model: Any, batch_clips: list[np.ndarray]
) -> None:
    """DESIGN 5.3 (a live hop's committed transcript): forced assistant tokens after the prompt
    are prefilled, in 64-token chunks here, and greedy decoding goes on from them exactly as the
    transformers reference does with the same tokens appended to its input ids."""
    engine = _engine(our_model, 64, num_blocks=None)
    clip = batch_clips[2]  # 11 s
    text = "[0.00][S01] Hello there.[1.20][1.20][S02]你好[2.50][2.50][S01] Okay[3.10]"
    prefix = list(engine.tokenizer.encode(text, add_special_tokens=False).ids)
    req = engine.add_request(
        "p", clip, prefix_token_ids=prefix, max_new_tokens=NEW_TOKENS, ignore_eos=True
    )
    engine.run_to_completion()
    assert req.prompt_token_ids[-len(prefix) :] == prefix
    inputs = tiny.reference_inputs([clip])
    (want,) = tiny.reference_greedy(ref_model, inputs, NEW_TOKENS, prefix)
    assert req.output_token_ids == want
    assert len(set(req.output_token_ids)) >= 8


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_request_the_whole_pool_cannot_grow_is_reported_finished(
    our_model: MossTDModel, batch_clips: list[np.ndarray], asynchronous: bool
) -> None:
    """The scheduler finishes a decoding request whose next token needs more blocks than the
    whole pool (LENGTH). The step reports it, once, after its last token (with async decode
    that token was still in flight), and the engine forgets it; before, nobody was told and
    its session waited for ever."""
    from livemeet.engine.model_runner import TokenTransfer

    clip = batch_clips[0]
    prompt_len = len(_engine(our_model, 64, None).build_prompt(13).ids)  # 1 s: 13 audio tokens
    blocks = -(-(prompt_len + 1) // TEST_BLOCK_SIZE)
    sched = SchedulerConfig(chunked_prefill_size=64, max_num_batched_tokens=1024)
    transfer = TokenTransfer(torch.device("cpu"), 1024) if asynchronous else None
    engine = Engine(
        EngineConfig(num_kv_blocks=blocks, block_size=TEST_BLOCK_SIZE, scheduler=sched),
        model=(our_model, our_model.cfg),
        clock=SteppingClock(),
        transfer=transfer,
    )
    engine.add_request("r", clip, max_new_tokens=1_000, ignore_eos=True)
    streamed: list[int] = []
    finished = []
    for _ in range(200):
        out = engine.step()
        assert not finished, "a token or a finish after the request finished"
        streamed += [t for _, t in out.new_tokens]
        finished += list(out.finished)
        if not engine.has_work():
            break
    assert [r.request_id for r in finished] == ["r"]
    request = finished[0]
    assert request.finish_reason.value == "length"
    assert streamed == request.output_token_ids
    assert request.num_tokens == blocks * 16 + 1  # grew until the pool was full
    assert "r" not in engine._audio and "r" not in engine._sampling
    assert engine.block_manager.num_free_blocks == blocks


@pytest.mark.parametrize("block_size", [TEST_BLOCK_SIZE, 128])
def test_a_fork_from_a_running_request_copies_on_write_and_changes_no_token(
    our_model: MossTDModel,
    batch_clips: list[np.ndarray],
    block_size: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request forks the prompt of one still decoding, up to a position inside a KV block:
    the shared partial block is copied before either writes into it (the model runner's
    `copy_blocks`, up to 127 tokens at 128), and each decodes exactly what it decodes alone."""
    clip, prefix = batch_clips[2], [11, 12, 13]  # 11 s; B = A's prompt + forced prefix

    def run(fork: bool) -> tuple[dict[str, list[int]], list[tuple[int, int, int]]]:
        engine = _engine(our_model, 512, num_blocks=None, block_size=block_size)
        copies: list[tuple[int, int, int]] = []
        inner = engine.runner.copy_blocks
        monkeypatch.setattr(engine.runner, "copy_blocks", lambda c: (copies.extend(c), inner(c)))
        a = engine.add_request("a", clip, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        done: dict[str, list[int]] = {}
        while engine.has_work():
            if a.num_output_tokens == 4 and engine.scheduler.get("b") is None and "b" not in done:
                n = a.num_prompt_tokens - 3
                n -= n % block_size == 0  # the fork ends inside a block
                n *= fork
                engine.add_request(
                    "b",
                    clip,
                    max_new_tokens=NEW_TOKENS,
                    ignore_eos=True,
                    prefix_token_ids=prefix,
                    fork_from="a" if fork else None,
                    num_fork_tokens=n,
                )
            out = engine.step()
            engine.block_manager.audit(engine.scheduler.live_requests())
            done.update({r.request_id: list(r.output_token_ids) for r in out.finished})
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        return done, copies

    alone, no_copies = run(fork=False)
    forked, copies = run(fork=True)
    assert not no_copies and len(copies) == 1
    (_, _, num_tokens) = copies[0]
    assert 0 < num_tokens < block_size
    assert forked == alone and set(alone) == {"a", "b"}


@pytest.mark.parametrize("head_dim", [8, 12])
def test_model_md_tiny_geometry_with_small_head_dims_matches_reference(
    batch_clips: list[np.ndarray], head_dim: int, tmp_path: Any
) -> None:
    """MODEL.md section 9's tiny config (widths 32, 2 layers, 4 heads over 2 KV heads,
    head_dim 8) and a head_dim that is no power of two (12) run on the CPU path: the CUDA
    kernels' head_dim rule refused them at the first request (found by an independent trial:
    the server said ready, then every request failed). Greedy tokens equal the reference's."""
    from livemeet.models.config import AudioConfig, MossTDConfig, TextConfig
    from livemeet.models.loader import load_model

    transformers = pytest.importorskip("transformers")
    cfg = MossTDConfig(
        audio=AudioConfig(d_model=32, layers=2, heads=2, ffn=64),
        text=TextConfig(
            hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2, head_dim=head_dim
        ),
    )
    weights = tiny.random_weights(cfg)
    ours, _ = load_model(
        str(tiny.write_upstream(tmp_path / "up", weights, cfg)), device="cpu", dtype="float32"
    )
    ref = transformers.MossTranscribeDiarizeForConditionalGeneration.from_pretrained(
        str(tiny.write_hf_native(tmp_path / "hf", weights, cfg)), dtype=torch.float32
    ).eval()
    clips = [batch_clips[1], batch_clips[4]]  # 3 s and 40 s (two windows)
    done = _run_together(_engine(ours, 64, num_blocks=None), clips)
    for i, clip in enumerate(clips):
        assert done[i] == _reference_greedy(ref, clip), i


def test_a_checkpoint_transformers_saved_matches_it(
    batch_clips: list[np.ndarray], tmp_path: Any
) -> None:
    """A checkpoint as transformers writes one, with geometry and files the fixtures do not
    have: save_pretrained of the native model (bf16, in shards with an index; config.json with
    use_sliding_window, which a trial found refused) and of the reference processor (its
    tokenizer.json and processor_config.json), one KV head, 4 decoder layers, head_dim 24.
    The engine reads it all from the directory, as `transcribe --model` does; its greedy
    tokens equal those of transformers' model loaded from the same directory."""
    from livemeet.models.config import AudioConfig, MossTDConfig, TextConfig
    from tests.models.reference import make_reference_processor

    transformers = pytest.importorskip("transformers")
    cfg = MossTDConfig(
        audio=AudioConfig(d_model=32, layers=2, heads=2, ffn=48),
        text=TextConfig(hidden=32, intermediate=80, layers=4, heads=4, kv_heads=1, head_dim=24),
    )
    hf_cfg = tiny.hf_config(cfg)
    hf_cfg.text_config.use_sliding_window = True  # layers 28+ only: none here
    model_cls = transformers.MossTranscribeDiarizeForConditionalGeneration
    saved = model_cls(hf_cfg)
    weights = {tiny.checkpoint_key(n, "hf"): w for n, w in tiny.random_weights(cfg).items()}
    assert saved.load_state_dict(weights, strict=False).missing_keys == ["lm_head.weight"]
    assert torch.equal(saved.lm_head.weight, weights[tiny.checkpoint_key(EMBED, "hf")])  # tied
    root = tmp_path / "saved"
    saved.to(torch.bfloat16).save_pretrained(str(root), max_shard_size="2MB")
    make_reference_processor().save_pretrained(str(root))
    assert (root / "model.safetensors.index.json").is_file()

    ref = model_cls.from_pretrained(str(root), dtype=torch.float32).eval()
    config = EngineConfig(
        model=str(root), device="cpu", dtype="float32", num_kv_blocks=96,
        block_size=TEST_BLOCK_SIZE,
    )  # fmt: skip
    clips = [batch_clips[1], batch_clips[4]]  # 3 s and 40 s (two windows)
    done = _run_together(Engine(config, clock=SteppingClock()), clips)
    for i, clip in enumerate(clips):
        # the processor saved above (loading it back costs 2.5 s of tokenizer parsing)
        expected = _reference_greedy(ref, clip)
        assert done[i] == expected, i
        assert len(set(expected)) > NEW_TOKENS // 2  # not one token repeated
