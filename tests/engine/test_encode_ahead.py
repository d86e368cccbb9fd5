"""Queued live requests' audio rides in the encoder batch's padding (Engine._encode_ahead):
hops encoded ahead skip their own encode later, and every output is what the engine gives
without it."""

from __future__ import annotations

import numpy as np
import pytest

from livemeet.engine.encoder_runner import EncoderRunner
from livemeet.engine.engine import Engine, EngineConfig
from livemeet.engine.request import RequestClass
from livemeet.engine.scheduler import SchedulerConfig
from livemeet.errors import BadAudio
from livemeet.models.audio_llm import MossTDModel
from tests.engine.fakes import SteppingClock

SECONDS = (65.0, 4.0, 5.0, 6.0)


def _run(model: MossTDModel, clips: list[np.ndarray], buckets: tuple[int, ...]) -> tuple:
    # a budget that admits one hop's prefill per step, so the others wait queued
    sched = SchedulerConfig(chunked_prefill_size=64, max_num_batched_tokens=64, max_num_seqs=8)
    engine = Engine(EngineConfig(scheduler=sched), model=(model, model.cfg), clock=SteppingClock())
    engine.encoder = EncoderRunner(
        model, cache_windows=0, batch_buckets=buckets, warm_up_at_start=False
    )
    for i, clip in enumerate(clips):
        engine.add_request(
            f"h{i}", clip, max_new_tokens=4, request_class=RequestClass.LIVE, deadline_s=float(i)
        )
    first_step_encoded = None
    outputs = {}
    while engine.has_work():
        out = engine.step()
        if first_step_encoded is None:
            first_step_encoded = set(engine._audio)
        for r in out.finished:
            outputs[r.request_id] = r.output_token_ids
    return outputs, first_step_encoded, engine.encoder.num_encoded_windows


def test_queued_live_audio_rides_in_the_padding_and_outputs_do_not_change(
    our_model: MossTDModel, long_speech: np.ndarray
) -> None:
    """The first hop's 3 windows pad to a bucket of 4: the earliest-deadline queued hop's one
    window rides in the free row, the next would not fit; outputs and the windows encoded are
    those of an engine without padding."""
    clips = [long_speech[: int(s * 16_000)] for s in SECONDS]
    plain, plain_first, plain_windows = _run(our_model, clips, ())
    ahead, ahead_first, ahead_windows = _run(our_model, clips, (1, 2, 4))
    assert ahead == plain and len(ahead) == len(SECONDS)
    assert plain_first == {"h0"}  # no buckets, no padding: only the scheduled hop
    assert ahead_first == {"h0", "h1"}
    assert ahead_windows == plain_windows == 3 + len(SECONDS) - 1


def test_audio_a_caller_checked_is_not_scanned_by_the_encoder(
    our_model: MossTDModel, long_speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audio reaches the encoder checked: `add_request` scans what its caller did not vouch
    for (`samples_checked`, as a live session checks each chunk on arrival) and refuses
    non-finite samples, so the encoder scans no window again. (Audio riding in the padding:
    test_encoder_runner.py.)"""
    import livemeet.engine.encoder_runner as er

    scanned: list[int] = []
    real = er.check_finite
    monkeypatch.setattr(er, "check_finite", lambda w: scanned.append(w.size) or real(w))
    engine = Engine(EngineConfig(), model=(our_model, our_model.cfg), clock=SteppingClock())
    engine.encoder = EncoderRunner(
        our_model, cache_windows=0, batch_buckets=(1, 2, 4), warm_up_at_start=False
    )
    for rid, seconds, checked in (("a", 7, True), ("b", 5, True), ("c", 3, False)):
        engine.add_request(
            rid,
            long_speech[: seconds * 16_000],
            max_new_tokens=2,
            request_class=RequestClass.LIVE,
            samples_checked=checked,
        )
    engine.run_to_completion()
    assert scanned == []
    bad = long_speech[: 2 * 16_000].copy()
    bad[123] = np.nan
    with pytest.raises(BadAudio):
        engine.add_request("d", bad, max_new_tokens=2)
    huge = long_speech[: 2 * 16_000].astype(np.float64)
    huge[5] = 1e300  # finite in float64, inf once cast to the encoder's float32
    with pytest.raises(BadAudio):
        engine.add_request("e", huge, max_new_tokens=2)
    assert engine.scheduler.get("d") is None  # refused before it was queued
