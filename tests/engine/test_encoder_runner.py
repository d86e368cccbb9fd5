"""EncoderRunner: per-window encoding equals the model's whole-audio encoding, the LRU cache
serves full windows only, micro-batches are bounded, and (GPU) graph replay equals eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from livemeet.audio.constants import N_FRAMES, N_MELS
from livemeet.audio.features import log_mel, split_windows
from livemeet.engine.encoder_runner import (
    CPU_WINDOWS_PER_BATCH,
    ENCODER_GRAPH_BUCKETS,
    EncoderRunner,
)
from livemeet.models.audio_llm import MossTDModel


def _reference(model: MossTDModel, samples: np.ndarray) -> torch.Tensor:
    windows, counts = split_windows(samples)
    with torch.no_grad():
        return model.encode_audio(log_mel(windows), counts)


def test_batched_windows_equal_whole_audio_encoding(
    our_model: MossTDModel, long_speech: np.ndarray
) -> None:
    clips = [long_speech[: 16_000 * 100], long_speech[: 16_000 * 7], long_speech[: 16_000 * 61]]
    runner = EncoderRunner(our_model, max_windows_per_batch=3)
    outs = runner.encode(clips)
    for clip, out in zip(clips, outs, strict=True):
        torch.testing.assert_close(out, _reference(our_model, clip), rtol=0, atol=1e-5)
    assert runner.num_encoded_windows == 4 + 1 + 3
    assert runner.num_eager_batches == 3  # 8 windows in micro-batches of at most 3


def test_cache_serves_full_windows_only(our_model: MossTDModel, long_speech: np.ndarray) -> None:
    runner = EncoderRunner(our_model, cache_windows=8)
    first = runner.encode([long_speech[: 16_000 * 65]])[0]  # 2 full windows + 5 s
    again = runner.encode([long_speech[: 16_000 * 65]])[0]
    assert runner.num_cache_hits == 2 and runner.num_encoded_windows == 3 + 1
    torch.testing.assert_close(again[:750], first[:750], rtol=0, atol=0)  # served from cache
    # the partial window ran alone this time (batch of 1, not 3): rounding may differ
    torch.testing.assert_close(again[750:], first[750:], rtol=0, atol=1e-5)


class _FakeGraph:
    """Stands in for a captured CUDA graph: records its bucket when replayed."""

    def __init__(self, bucket: int, replayed: list[int]) -> None:
        self.bucket, self.replayed = bucket, replayed

    def replay(self) -> None:
        self.replayed.append(self.bucket)


def test_a_micro_batch_replays_the_smallest_graph_that_holds_it(our_model: MossTDModel) -> None:
    """Graphs are captured largest first, so their dict is in descending order; a batch of n
    windows must still replay the smallest bucket >= n (it replayed the largest until session
    11, which only the time showed: padding leaves the outputs unchanged)."""
    runner = EncoderRunner(our_model)
    replayed: list[int] = []
    d = our_model.cfg.audio.d_model
    runner._graphs = {  # type: ignore[assignment]
        b: (_FakeGraph(b, replayed), torch.zeros(b, N_MELS, N_FRAMES), torch.zeros(b, 1500, d))
        for b in sorted(ENCODER_GRAPH_BUCKETS, reverse=True)
    }
    for n, bucket in ((1, 1), (3, 4), (11, 16), (64, 64)):
        frames = runner._encoder_frames(torch.ones(n, N_MELS, N_FRAMES))
        assert replayed[-1] == bucket and frames.shape[0] == n
        static_in = runner._graphs[bucket][1]
        assert static_in[:n].eq(1).all() and static_in[n:].eq(0).all()  # padding is silence
    assert runner.graph_bucket(65) is None and runner.graph_bucket(0) is None
    frames = runner._encoder_frames(torch.ones(65, N_MELS, N_FRAMES))  # no graph holds it
    assert runner.num_eager_batches == 1 and frames.shape[0] == 65


def test_log_mel_in_slices_equals_one_pass() -> None:
    """The runner's log-mel in slices of LOG_MEL_WINDOWS equals one pass over every window
    (each window's floor is its own), for a count that is not a multiple of the slice."""
    from livemeet.audio.features import log_mel
    from livemeet.engine.encoder_runner import LOG_MEL_WINDOWS

    rows = 2 * LOG_MEL_WINDOWS + 3
    windows = 0.1 * torch.randn(rows, 480_000, generator=torch.Generator().manual_seed(5))
    windows[-1] = 0.0  # a window of silence, as padding rows are
    got = EncoderRunner._log_mel(windows, torch.float32)
    torch.testing.assert_close(got, log_mel(windows), rtol=0, atol=0)


def test_no_graphs_on_cpu(our_model: MossTDModel) -> None:
    runner = EncoderRunner(our_model, cuda_graphs=True)
    assert runner.num_graph_replays == 0 and not runner._graphs
    assert runner.max_windows_per_batch == CPU_WINDOWS_PER_BATCH  # memory, not launches


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_matches_eager(our_model: MossTDModel, long_speech: np.ndarray) -> None:
    # Tolerance: the padded bucket changes the GEMM shapes, so cuBLAS may pick other kernels
    # (measured on an H200: 18 of 150,000 values off by up to 3.6e-4 in fp32/TF32).
    model = our_model.to("cuda")
    try:
        eager = EncoderRunner(model, cache_windows=0)
        graphs = EncoderRunner(model, cache_windows=0, cuda_graphs=True)
        assert sorted(graphs._graphs) == sorted(ENCODER_GRAPH_BUCKETS)
        assert graphs.max_windows_per_batch == ENCODER_GRAPH_BUCKETS[-1]  # one launch each
        for seconds in (5, 31, 95, 250, 301, 2100):  # 1, 2, 4, 9, 11, 70 (64 + 6) windows
            reps = -(-16_000 * seconds // long_speech.size)
            clip = np.tile(long_speech, reps)[: 16_000 * seconds]
            torch.testing.assert_close(
                graphs.encode([clip])[0], eager.encode([clip])[0], rtol=1e-2, atol=1e-3
            )
        assert graphs.num_graph_replays > 0 and graphs.num_eager_batches == 0
    finally:
        our_model.to("cpu")


def test_threaded_window_keys_equal_sequential_ones() -> None:
    """A long audio's full windows are hashed on threads: same keys as one by one, in order,
    the partial last window unkeyed; different samples give different keys."""
    from livemeet.engine.encoder_runner import (
        PARALLEL_HASH_MIN_WINDOWS,
        full_window_keys,
        window_key,
    )

    rng = np.random.default_rng(3)
    seconds = 30 * (PARALLEL_HASH_MIN_WINDOWS + 1) + 7
    samples = (0.1 * rng.standard_normal(16_000 * seconds)).astype(np.float32)
    windows, counts = split_windows(samples)
    keys = full_window_keys(samples)
    assert len(keys) == len(counts) - 1 == PARALLEL_HASH_MIN_WINDOWS + 1
    assert keys == [window_key(w.numpy()) for w in windows[:-1]]  # padded copy == slice
    assert len(set(keys)) == len(keys)
    assert full_window_keys(samples, keys[:3]) == keys
    assert full_window_keys(samples[: 16_000 * 29]) == []


def test_given_window_keys_are_trusted_and_not_rehashed(
    our_model: MossTDModel, long_speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live session passes the keys of windows it has hashed before: encode uses them (no
    hashing), serves those windows from the cache, and returns what a plain encode does."""
    import livemeet.engine.encoder_runner as er

    audio = np.tile(long_speech, 3)[: 16_000 * 75]  # two full windows and a partial one
    runner = EncoderRunner(our_model, cache_windows=8)
    plain = runner.encode([audio])[0]
    keys = er.full_window_keys(audio)
    hashed: list[int] = []
    real = er.window_key
    monkeypatch.setattr(er, "window_key", lambda w: hashed.append(1) or real(w))
    hits = runner.num_cache_hits
    again = runner.encode([audio], window_keys=[keys])[0]
    assert hashed == [] and runner.num_cache_hits == hits + 2
    torch.testing.assert_close(again, plain, rtol=0, atol=0)
    runner.encode([audio], window_keys=[keys[:1]])  # one known, one hashed here
    assert hashed == [1]


def test_cached_windows_says_what_an_encode_would_find_and_hashes_each_window_once(
    our_model: MossTDModel, long_speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cached_windows` (the engine asks it for an upload's next windows before each schedule
    on the live budget) returns the full windows of a span the cache holds, writing the keys
    it hashes into the caller's list, which an encode then takes without hashing again; it
    moves neither the LRU nor the hit counter; `hash_new=False` counts an unknown window as
    not cached."""
    import livemeet.engine.encoder_runner as er

    audio = np.tile(long_speech, 3)[: 16_000 * 100]  # three full windows and a partial one
    runner = EncoderRunner(our_model, cache_windows=2)
    runner.encode([audio[: 16_000 * 60]])  # windows 0 and 1 cached, 0 the older
    hashed: list[int] = []
    real = er.window_key
    monkeypatch.setattr(er, "window_key", lambda w: hashed.append(1) or real(w))
    keys: list[bytes | None] = []
    assert runner.cached_windows(audio, keys, 1, 4, hash_new=False) == []
    assert keys == [None, None, None] and hashed == []
    hits = runner.num_cache_hits
    assert runner.cached_windows(audio, keys, 1, 4) == [1]  # 2 is not cached, 3 is partial
    assert keys[0] is None and None not in keys[1:] and len(hashed) == 2
    assert runner.cached_windows(audio, keys, 0, 4) == [0, 1] and len(hashed) == 3
    assert runner.num_cache_hits == hits and list(runner._cache) == keys[:2]  # LRU as it was
    encoded = runner.num_encoded_windows
    runner.encode_filling([audio], [keys], spans=[(0, 4)])
    assert len(hashed) == 3  # the keys came with the list
    assert runner.num_encoded_windows - encoded == 2 and runner.num_cache_hits == hits + 2


def test_a_span_of_windows_is_encoded_alone_and_hashed_alone(
    our_model: MossTDModel, long_speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`spans` encodes windows [lo, hi) of an audio (an upload's, as its prefill chunks reach
    them): their rows of the whole audio's embeddings, hashing only the full windows among
    them; a span outside the audio is a caller's bug."""
    import livemeet.engine.encoder_runner as er
    from livemeet.errors import InternalError

    audio = np.tile(long_speech, 3)[: 16_000 * 75]  # two full windows and a partial one
    whole = EncoderRunner(our_model, cache_windows=0).encode([audio])[0]
    runner = EncoderRunner(our_model, cache_windows=8)
    hashed: list[int] = []
    real = er.window_key
    monkeypatch.setattr(er, "window_key", lambda w: hashed.append(1) or real(w))
    (tail,) = runner.encode_filling([audio], spans=[(1, 3)])
    assert tail is not None and runner.num_encoded_windows == 2
    assert hashed == [1]  # window 1 (full); window 2 is partial, never cached
    # fp32 tolerances: a batch of 1, 2 or 3 windows may take other BLAS blockings
    torch.testing.assert_close(tail, whole[375:])
    (head,) = runner.encode_filling([audio], spans=[(0, 1)])
    assert head is not None
    torch.testing.assert_close(head, whole[:375])
    for bad in ((0, 4), (2, 2), (-1, 1)):
        with pytest.raises(InternalError):
            runner.encode_filling([audio], spans=[bad])


def test_a_span_grows_into_the_padding_after_the_queued_live_audio(
    our_model: MossTDModel, long_speech: np.ndarray
) -> None:
    """`grow_to`: an upload's span takes its next windows into the rows its last micro-batch
    would pad with silence, after the queued live audio (`extra`) has taken its own."""
    audio = np.tile(long_speech, 3)[: 16_000 * 100]  # 3 full windows and a partial one
    whole = EncoderRunner(our_model, cache_windows=0).encode([audio])[0]
    hop = long_speech[: 16_000 * 5]  # one window
    for extra, grown in (((), 4), ((hop,), 3)):
        runner = EncoderRunner(
            our_model, cache_windows=0, batch_buckets=(1, 2, 4), warm_up_at_start=False
        )
        out = runner.encode_filling([audio], spans=[(0, 3)], grow_to=[4], extra=extra)
        assert runner.num_eager_batches == 1  # one bucket of 4: 3 windows and 1 padding row
        assert runner.num_encoded_windows == 4
        rows = min(grown * 375, whole.shape[0])
        assert out[0] is not None
        torch.testing.assert_close(out[0], whole[:rows])
        assert len(out) == 1 + len(extra) and all(e is not None for e in out)
    runner = EncoderRunner(
        our_model, cache_windows=0, batch_buckets=(1, 2, 4), warm_up_at_start=False
    )
    (kept,) = runner.encode_filling([audio], spans=[(0, 3)], grow_to=[3])
    assert kept is not None and kept.shape[0] == 3 * 375  # no room to grow into: none taken


def test_padded_windows_are_built_from_the_real_samples_only() -> None:
    from livemeet.engine.encoder_runner import _padded_windows

    rng = np.random.default_rng(5)
    full = rng.standard_normal(480_000).astype(np.float32)
    short = rng.standard_normal(185_600).astype(np.float32)  # an 11.6 s clip
    windows = _padded_windows([short, full, short[:7]], torch.device("cpu"))
    assert windows.shape == (3, 480_000) and windows.dtype == torch.float32
    assert torch.equal(windows[0, :185_600], torch.from_numpy(short))
    assert not windows[0, 185_600:].any() and not windows[2, 7:].any()
    assert torch.equal(windows[1], torch.from_numpy(full))
    assert torch.equal(windows[2, :7], torch.from_numpy(short[:7]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_padded_windows_through_the_reused_pinned_buffer_cuda() -> None:
    """Encodes through one PinnedSamples while the GPU is busy (so every copy is still
    pending when the next batch is written): the third batch reuses the first buffer, the
    second grows its own, and a batch past the bound goes the per-batch way. Each equals the
    CPU build of the same chunks."""
    from livemeet.engine.encoder_runner import PinnedSamples, _padded_windows

    rng = np.random.default_rng(6)
    pinned = PinnedSamples(max_samples=600_000)
    batches = [
        [rng.standard_normal(16_000).astype(np.float32)],
        [
            rng.standard_normal(480_000).astype(np.float32),
            rng.standard_normal(9).astype(np.float32),
        ],
        [rng.standard_normal(300_000).astype(np.float32)],
        [rng.standard_normal(480_000).astype(np.float32)] * 2,  # past the bound
    ]
    torch.cuda._sleep(500_000_000)  # type: ignore[attr-defined]  # ~0.3 s of queued GPU work
    built = [_padded_windows(b, torch.device("cuda"), 4, pinned) for b in batches]
    assert pinned.upload(batches[3], torch.device("cuda")) is None
    for chunks, got in zip(batches, built, strict=True):
        want = _padded_windows(chunks, torch.device("cpu"), 4)
        assert torch.equal(got.cpu(), want)


def _spy_log_mel(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the window count of every log-mel call the runner makes."""
    import livemeet.engine.encoder_runner as er

    rows: list[int] = []
    real = er.log_mel
    monkeypatch.setattr(er, "log_mel", lambda w: rows.append(w.shape[0]) or real(w))
    return rows


def test_micro_batches_are_padded_to_the_buckets(
    our_model: MossTDModel, long_speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With buckets, the front end only ever sees bucket-sized batches (silence as padding),
    and the real windows' embeddings are what an unpadded runner gives."""
    clips = [long_speech[: 16_000 * s] for s in (7, 11, 29)]  # 3 windows
    plain = EncoderRunner(our_model, cache_windows=0, warm_up_at_start=False).encode(clips)
    rows = _spy_log_mel(monkeypatch)
    runner = EncoderRunner(
        our_model, cache_windows=0, batch_buckets=(1, 2, 4, 8), warm_up_at_start=False
    )
    padded = runner.encode(clips)
    assert rows == [4]
    for a, b in zip(padded, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert runner.num_encoded_windows == 3


def test_warm_up_runs_every_bucket_and_leaves_no_trace(
    our_model: MossTDModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch of each size paid a cuFFT plan (0.6-1.8 s on an H200) inside a serving
    step; warm-up pays them at start, caching nothing and counting nothing."""
    rows = _spy_log_mel(monkeypatch)
    runner = EncoderRunner(
        our_model, cache_windows=8, batch_buckets=(1, 2, 4), warm_up_at_start=True
    )
    assert rows == [1, 2, 4, CPU_WINDOWS_PER_BATCH]  # the micro-batch limit is a bucket too
    assert runner.num_encoded_windows == runner.num_eager_batches == 0
    assert not runner._cache
    rows.clear()
    EncoderRunner(
        our_model, max_windows_per_batch=2, batch_buckets=(1, 2, 4), warm_up_at_start=True
    )
    assert rows == [1, 2]  # no bucket above the micro-batch limit
    rows.clear()
    runner = EncoderRunner(
        our_model, max_windows_per_batch=3, batch_buckets=(1, 2, 4), warm_up_at_start=True
    )
    assert rows == [1, 2, 3]  # a limit between buckets is a bucket: batches of 3 are warm too
    assert runner.batch_buckets == (1, 2, 3)


def test_held_windows_are_encoded_once_under_lru_pressure(
    our_model: MossTDModel, long_speech: np.ndarray
) -> None:
    """A live session's full windows, held, stay cached while other audio churns the LRU (one
    window here): re-encoding its meeting costs only the partial window. Released, they go
    back to the LRU and are evicted like any other (session 15: with only the LRU, 100 live
    sessions re-encoded their whole meetings every hop once their windows outgrew it)."""
    from livemeet.engine.encoder_runner import full_window_keys

    runner = EncoderRunner(our_model, cache_windows=1)
    meeting = long_speech[: 16_000 * 65]  # 2 full windows + 5 s
    keys = full_window_keys(meeting)
    runner.hold("live-1", keys)  # before the first encode: held once stored
    first = runner.encode([meeting], window_keys=[keys])[0]
    assert runner.num_encoded_windows == 3 and runner.num_held_windows == 2
    for k in range(3):  # other audio through the one-window LRU
        runner.encode([long_speech[16_000 * (70 + 30 * k) :][: 16_000 * 30]])
    encoded = runner.num_encoded_windows
    again = runner.encode([meeting], window_keys=[keys])[0]
    assert runner.num_encoded_windows == encoded + 1  # the partial window only
    torch.testing.assert_close(again[:750], first[:750], rtol=0, atol=0)
    runner.release("live-1")
    runner.release("live-1")  # a second release is a no-op
    assert runner.num_held_windows == 0
    # released to the LRU's cold end: its one slot keeps the more recent window
    assert len(runner._cache) == 1 and not any(k in runner._cache for k in keys)
    encoded = runner.num_encoded_windows
    runner.encode([meeting], window_keys=[keys])
    assert runner.num_encoded_windows == encoded + 3


def test_holds_are_counted_per_owner_and_capped(
    our_model: MossTDModel, long_speech: np.ndarray
) -> None:
    """Two owners holding one window keep it until both release; past max_held_windows keys
    are left to the LRU; cached windows are copies, not views of their micro-batch (which a
    held window would keep alive whole)."""
    from livemeet.engine.encoder_runner import full_window_keys

    runner = EncoderRunner(our_model, cache_windows=0, max_held_windows=2)
    meeting = long_speech[: 16_000 * 95]  # 3 full windows + 5 s
    keys = full_window_keys(meeting)
    runner.hold("a", keys[:2])
    runner.hold("b", [keys[2], keys[1]])  # the cap is reached: keys[2] is not held, keys[1] is
    runner.encode([meeting], window_keys=[keys])
    assert runner.num_held_windows == 2
    held = runner._held[keys[0]]
    assert held.untyped_storage().nbytes() == held.numel() * held.element_size()
    runner.release("a")
    assert runner.num_held_windows == 1  # "b" still holds the second window
    runner.release("b")
    assert runner.num_held_windows == 0  # an LRU of 0 windows keeps nothing
    encoded = runner.num_encoded_windows
    runner.encode([meeting], window_keys=[keys])
    assert runner.num_encoded_windows == encoded + 4


def test_only_the_windows_encoded_are_scanned_for_nan(
    our_model: MossTDModel, long_speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NaN in a window the encoder has to encode is BadAudio; the cached windows are not
    rescanned per call (a live hop at minute 10 would scan 9.6M samples)."""
    import livemeet.engine.encoder_runner as er
    from livemeet.errors import BadAudio

    runner = EncoderRunner(our_model, cache_windows=8)
    meeting = long_speech[: 16_000 * 65].copy()
    runner.encode([meeting])
    scanned: list[int] = []
    real = er.check_finite
    monkeypatch.setattr(er, "check_finite", lambda w: scanned.append(w.size) or real(w))
    runner.encode([meeting])
    assert scanned == [16_000 * 5]  # the partial window; both full windows came from the cache
    meeting[16_000 * 62] = np.nan  # in the partial window, encoded on every call
    with pytest.raises(BadAudio, match="NaN"):
        runner.encode([meeting])


def test_audio_the_caller_checked_is_not_scanned_again(
    our_model: MossTDModel, long_speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`checked` (a live hop's audio, checked chunk by chunk as it arrived) skips the scan of
    the windows encoded, for the scheduled audio and for audio riding in the padding; the
    others are scanned as before."""
    import livemeet.engine.encoder_runner as er

    runner = EncoderRunner(
        our_model, cache_windows=0, batch_buckets=(1, 2, 4, 8), warm_up_at_start=False
    )
    clips = [long_speech[: 16_000 * s] for s in (7, 11, 29)]
    extra = [long_speech[: 16_000 * 5]]  # rides in the 4-window bucket's free row
    scanned: list[int] = []
    real = er.check_finite
    monkeypatch.setattr(er, "check_finite", lambda w: scanned.append(w.size) or real(w))
    out = runner.encode_filling(clips, extra=extra, checked=[True, False, True, True])
    assert all(e is not None for e in out)
    assert scanned == [16_000 * 11]  # the one audio not vouched for
    scanned.clear()
    runner.encode_filling(clips, extra=extra)
    assert sorted(scanned) == sorted(16_000 * s for s in (7, 11, 29, 5))


def test_extra_audio_rides_in_the_padding_of_the_last_micro_batch(
    our_model: MossTDModel, long_speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 windows pad to a bucket of 4: one extra one-window audio fills the free row, the next
    one (and a longer one) would need another batch and are left; what rides along is what
    encoding it alone gives."""
    clips = [long_speech[: 16_000 * s] for s in (7, 11, 29)]
    extra = [long_speech[: 16_000 * 5], long_speech[: 16_000 * 9], long_speech[: 16_000 * 70]]
    plain = EncoderRunner(our_model, cache_windows=0, warm_up_at_start=False)
    want = plain.encode(clips + extra)
    rows = _spy_log_mel(monkeypatch)
    runner = EncoderRunner(
        our_model, cache_windows=0, batch_buckets=(1, 2, 4, 8), warm_up_at_start=False
    )
    got = runner.encode_filling(clips, None, extra=extra)
    assert rows == [4] and runner.num_encoded_windows == 4
    assert [g is None for g in got] == [False, False, False, False, True, True]
    for a, b in zip(got[:4], want[:4], strict=True):
        assert a is not None
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # nothing required: nothing encoded, not even extras
    assert runner.encode_filling([], None, extra=extra[:1]) == [None]


def test_extra_audio_all_in_the_cache_or_bad_is_left_for_its_own_encode(
    our_model: MossTDModel, long_speech: np.ndarray
) -> None:
    """An extra whose windows are all cached needs no encoder row: it is left (assembled when
    its own request is scheduled, not held early); one with non-finite samples is left too,
    for its own request to report, and the required audio is encoded all the same."""
    runner = EncoderRunner(
        our_model, cache_windows=8, batch_buckets=(1, 2, 4), warm_up_at_start=False
    )
    full = long_speech[: 16_000 * 60]  # two full windows
    runner.encode([full])
    encoded = runner.num_encoded_windows
    bad = long_speech[: 16_000 * 4].copy()
    bad[100] = np.nan
    short = [long_speech[: 16_000 * 3], long_speech[: 16_000 * 7], long_speech[: 16_000 * 9]]
    got = runner.encode_filling(short, None, extra=[full, bad, long_speech[: 16_000 * 5]])
    assert [g is None for g in got] == [False, False, False, True, True, False]
    assert runner.num_encoded_windows == encoded + 4  # 3 required, 1 extra in the 4-bucket
