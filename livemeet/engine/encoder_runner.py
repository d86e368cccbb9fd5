"""Encoder runner: audio samples -> audio embeddings [T, hidden], window by window.

30 s windows are independent (MODEL.md section 2), so windows from any number of requests are
encoded together in micro-batches of at most `max_windows_per_batch`. Outputs of FULL windows
are kept in a bounded LRU cache keyed by a hash of the window's samples (a repeated upload is
free), and a live session holds its complete windows out of the LRU for its life (`hold` /
`release`), so each is encoded once however many sessions are open. A partial (last) window is
never cached: its embeddings change as audio arrives (its mel floor, padding and attention all
move; MODEL.md section 2). Samples are checked for NaN/inf only in the windows encoded.

On CUDA the Whisper encoder (the heavy part: 24 layers over 1,500 frames per window) replays a
CUDA graph captured per window-count bucket (ENCODER_GRAPH_BUCKETS); a micro-batch of n
windows runs in the smallest bucket >= n with zero windows as padding, whose outputs are
dropped. Windows are independent (no cross-window attention), so padding cannot change the
real windows' outputs beyond kernel-choice rounding. The 4x merge and the adaptor run eagerly
(they depend on each window's token count).

On CUDA the log-mel front end runs at the same bucket sizes (padding windows of silence), and
`warm_up` runs every bucket once at start: the first STFT of a new batch size builds a cuFFT
plan, which on an H200 stalled a serving step for 0.6 s (1 window) and 1.8 s (2 windows)
(docs/benchmarks.md, session 4: the HTTP short c4 dip).

Buckets go up to 64 windows, so a 37-minute upload (75 windows) is two graph launches (64 and
16) rather than ten of 8. cudaGraphLaunch holds the host while earlier work is still pending
on the GPU, so every launch of an encode can stall the engine thread and with it the one-step
lookahead (H200, `loadtest/bench_encoder.py --blocking`, docs/benchmarks.md session 11: one
meeting's encode took 198 ms of host time with the GPU idle and 501.5 ms behind 300 ms of
queued work, 361 ms of it in 10 launches; with 64-window buckets 104.8 and 215.0 ms, 103 ms in
2 launches). The 64-window graph holds ~2 GB of activations in the buckets' shared pool
(estimated from the activations, not measured; FP8 long c16 ran with it at the default
--mem-fraction 0.85), and log-mel runs in slices of 8 windows.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from livemeet.audio.constants import (
    ENCODER_MAX_HELD_WINDOWS,
    N_FRAMES,
    N_MELS,
    PINNED_SAMPLES_MAX_WINDOWS,
    SAMPLE_RATE,
    WINDOW_SAMPLES,
)
from livemeet.audio.features import check_samples, log_mel, window_token_counts
from livemeet.audio.pcm import check_finite
from livemeet.engine.cuda_graph import choose_bucket
from livemeet.errors import BadAudio, InternalError
from livemeet.models.adaptor import merge_frames
from livemeet.models.audio_llm import MossTDModel

# windows per captured encoder graph; on CUDA the largest is the micro-batch (module docstring)
ENCODER_GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# windows per micro-batch on the CPU (no graphs there)
CPU_WINDOWS_PER_BATCH = 8
LOG_MEL_WINDOWS = 8  # windows per log-mel slice: bounds the STFT's transient memory
PARALLEL_HASH_MIN_WINDOWS = 8  # full windows from which hashing runs on threads
HASH_THREADS = 8  # threads hashing window samples (each ~1 ms per 30 s window)


def window_key(window: np.ndarray) -> bytes:
    """Cache key of one full window: 128 bits of SHA-256 over its 480,000 float32 samples, read
    in place (~1 ms per window on one core)."""
    data = np.ascontiguousarray(window, dtype=np.float32)
    return hashlib.sha256(memoryview(data).cast("B")).digest()[:16]


def full_window_keys(samples: np.ndarray, known: Sequence[bytes] = ()) -> list[bytes]:
    """Keys of every full 30 s window of `samples` (float32 [S]), in order; the first
    len(known) are taken from `known` (the caller vouches for them). Many windows are hashed
    on threads (hashlib releases the GIL): a 37-minute meeting has 74 full windows."""
    num_full = samples.size // WINDOW_SAMPLES
    keys = list(known[:num_full])
    return keys + _hash_windows([_window(samples, w) for w in range(len(keys), num_full)])


def _span_keys(
    samples: np.ndarray, known: Sequence[bytes | None], lo: int, hi: int
) -> list[bytes | None]:
    """Keys of windows [lo, hi) of `samples`: from `known` where it has them (not None),
    hashed where a window is full, None for the partial last window (never cached)."""
    num_full = samples.size // WINDOW_SAMPLES
    keys: list[bytes | None] = [known[w] if w < len(known) else None for w in range(lo, hi)]
    todo = [w for w in range(lo, min(hi, num_full)) if keys[w - lo] is None]
    for w, key in zip(todo, _hash_windows([_window(samples, w) for w in todo]), strict=True):
        keys[w - lo] = key
    return keys


def _hash_windows(windows: list[np.ndarray]) -> list[bytes]:
    """`window_key` of each full window; many on threads (hashlib releases the GIL)."""
    if len(windows) < PARALLEL_HASH_MIN_WINDOWS:
        return [window_key(w) for w in windows]
    with ThreadPoolExecutor(max_workers=min(HASH_THREADS, os.cpu_count() or 1)) as pool:
        return list(pool.map(window_key, windows))


def _window(samples: np.ndarray, w: int) -> np.ndarray:
    """The samples of window w (float32, at most 480,000; a view, not padded)."""
    return samples[w * WINDOW_SAMPLES : (w + 1) * WINDOW_SAMPLES]


class PinnedSamples:
    """Two reusable pinned float32 buffers, used in turn, through which a micro-batch's
    samples cross to the GPU. `np.concatenate` into a fresh array and `pin_memory()` of it
    copied the samples twice per micro-batch and faulted in new pages each time:
    `_padded_windows` was 5.5 % of the engine worker's time at 100 live sessions (a hop
    re-encodes its partial window: ~1 MB of samples; py-spy, docs/benchmarks.md session 16).
    Batches of more than `max_samples` (long uploads, where that cost is amortised) keep the
    old way, so the buffers stay small (8 windows: 15 MB each).

    Hazard: a buffer must not be rewritten while its last copy to the device may be pending;
    `upload` waits on the event recorded after that copy, two micro-batches back (done long
    before in practice: the encoder's kernels that read it have run)."""

    def __init__(self, max_samples: int = PINNED_SAMPLES_MAX_WINDOWS * WINDOW_SAMPLES) -> None:
        self.max_samples = max_samples
        self.buffers: list[torch.Tensor | None] = [None, None]
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    def upload(self, chunks: Sequence[np.ndarray], device: torch.device) -> torch.Tensor | None:
        """The chunks concatenated, float32 [sum of sizes] on the CUDA `device`; None when
        they exceed `max_samples` (the caller copies them another way)."""
        total = sum(c.size for c in chunks)
        if total > self.max_samples:
            return None
        self.turn ^= 1
        event, buffer = self.events[self.turn], self.buffers[self.turn]
        if event is None:
            event = self.events[self.turn] = torch.cuda.Event()  # type: ignore[no-untyped-call]
        else:
            event.synchronize()  # this buffer's last copy is done
        if buffer is None or buffer.numel() < total:
            size = min(self.max_samples, max(total, 2 * (0 if buffer is None else buffer.numel())))
            buffer = self.buffers[self.turn] = torch.empty(
                size, dtype=torch.float32, pin_memory=True
            )
        host = buffer[:total]
        np.concatenate(chunks, out=host.numpy(), casting="same_kind")
        flat = host.to(device, non_blocking=True)
        event.record(torch.cuda.current_stream(device))
        return flat


def _padded_windows(
    chunks: Sequence[np.ndarray],
    device: torch.device,
    rows: int | None = None,
    pinned: PinnedSamples | None = None,
) -> torch.Tensor:
    """[rows, 480000] float32 on `device` (rows defaults to len(chunks)): chunk i, zero-padded
    to a full window, then windows of silence. Only the real samples cross to the device,
    padding is made there (an 11.6 s clip is 39 % of a window); on CUDA through `pinned`
    when given."""
    flat = None
    if device.type == "cuda" and pinned is not None:
        flat = pinned.upload(chunks, device)
    if flat is None:
        flat = torch.from_numpy(np.concatenate(chunks))
        if device.type == "cuda":
            flat = flat.pin_memory().to(device, non_blocking=True)
    rows = len(chunks) if rows is None else rows
    windows = torch.zeros(rows, WINDOW_SAMPLES, dtype=torch.float32, device=device)
    start = 0
    for i, chunk in enumerate(chunks):
        windows[i, : chunk.size] = flat[start : start + chunk.size]
        start += chunk.size
    return windows


class EncoderRunner:
    """Batches encoder + adaptor forwards and caches full-window outputs (see module doc).

    `cache_windows`: LRU capacity in windows (each ~0.77 MB in bf16 at real size: 375 x 1024).
    `max_held_windows`: windows `hold` may keep out of the LRU, all owners together.
    `max_windows_per_batch`: windows per micro-batch (default: the largest graph bucket on
    CUDA, CPU_WINDOWS_PER_BATCH on the CPU).
    `batch_buckets`: window counts each micro-batch is padded up to (default: ENCODER_GRAPH_BUCKETS
    on CUDA, none on the CPU), those below `max_windows_per_batch` and that limit itself;
    `warm_up_at_start` (default: on CUDA) runs `warm_up`.
    """

    def __init__(
        self,
        model: MossTDModel,
        *,
        cache_windows: int = 256,
        max_held_windows: int = ENCODER_MAX_HELD_WINDOWS,
        max_windows_per_batch: int | None = None,
        cuda_graphs: bool = False,
        batch_buckets: Sequence[int] | None = None,
        warm_up_at_start: bool | None = None,
    ) -> None:
        self.model = model
        self.cache_windows = cache_windows
        on_cuda = self.device.type == "cuda"
        if max_windows_per_batch is None:
            max_windows_per_batch = ENCODER_GRAPH_BUCKETS[-1] if on_cuda else CPU_WINDOWS_PER_BATCH
        self.max_windows_per_batch = max_windows_per_batch
        if batch_buckets is None:
            batch_buckets = ENCODER_GRAPH_BUCKETS if on_cuda else ()
        kept = {b for b in batch_buckets if b < max_windows_per_batch}
        if batch_buckets:  # the limit itself is a bucket, so every batch size is warmed up
            kept.add(max_windows_per_batch)
        self.batch_buckets = tuple(sorted(kept))
        self._cache: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        # held windows (`hold`): out of the LRU while any owner holds them
        self.max_held_windows = max_held_windows
        self._held: dict[bytes, torch.Tensor] = {}
        self._holders: dict[bytes, int] = {}  # key -> number of owners holding it
        self._holds: dict[str, set[bytes]] = {}  # owner -> keys it holds
        self.num_encoded_windows = 0
        self.num_cache_hits = 0
        self.num_graph_replays = 0
        self.num_eager_batches = 0
        self._pinned = PinnedSamples()  # the samples' way to the GPU (_padded_windows)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        if cuda_graphs and on_cuda:
            self._capture()
        if on_cuda if warm_up_at_start is None else warm_up_at_start:
            self.warm_up()

    @property
    def device(self) -> torch.device:
        return self.model.language_model.embed_tokens.weight.device

    @torch.inference_mode()
    def encode(
        self,
        audios: Sequence[np.ndarray],
        window_keys: Sequence[Sequence[bytes | None]] | None = None,
    ) -> list[torch.Tensor]:
        """Each mono 16 kHz float32 audio -> embeddings [ceil(S/1280), hidden] on the device.

        `window_keys[a]` (optional): cache keys (`window_key`) of the first full windows of
        audio a, which the caller vouches for (a live session hashes each window once as its
        append-only audio grows; None where not known); the other full windows are hashed
        here. Only windows that miss the cache are copied out of the audio. Raises BadAudio
        for empty or non-finite audio.
        """
        out = self.encode_filling(audios, window_keys)
        return [e for e in out if e is not None]

    @torch.inference_mode()
    def encode_filling(
        self,
        audios: Sequence[np.ndarray],
        window_keys: Sequence[Sequence[bytes | None]] | None = None,
        extra: Sequence[np.ndarray] = (),
        extra_keys: Sequence[Sequence[bytes | None]] = (),
        checked: Sequence[bool] = (),
        spans: Sequence[tuple[int, int] | None] = (),
        grow_to: Sequence[int] = (),
    ) -> list[torch.Tensor | None]:
        """`encode(audios, window_keys)`, plus each of `extra` (in order, with `extra_keys`)
        whose windows that miss the cache fit in the silence the last micro-batch would be
        padded with up to its bucket: those windows ride along at no encoder cost (a bucket's
        graph runs all its rows). Returns the embeddings of every audio, then per extra audio
        its embeddings or None (not encoded: no room, or bad audio, which its own request
        reports when it is encoded). `checked[i]` (audios, then extra; False where missing):
        the caller checked that audio finite, so its windows are not scanned again (a live
        hop's open window, every hop). `spans[a]` (None or missing: every window): only
        windows [lo, hi) of audio a, whose embeddings are returned (rows from audio token
        375 x lo on; an upload encoded as its prefill chunks reach its windows). `grow_to[a]`
        (missing: no growth): after the extras, audio a's span takes its next windows, up to
        window `grow_to[a]`, while they fit in the padding too (the caller reads how far from
        the rows returned). Raises BadAudio for `audios` as `encode`.

        Every window is looked up in the cache before any output is stored (which may evict):
        a window `cached_windows` found just before is found here (the scheduler charges an
        upload's chunk for the others only)."""
        flags = list(checked) + [False] * (len(audios) + len(extra) - len(checked))
        jobs, per_audio = self._jobs(audios, window_keys, checked=flags[: len(audios)], spans=spans)
        free = self._padding_rows(len(jobs))
        taken = [False] * len(extra)
        for i, raw in enumerate(extra):
            if free == 0:
                break
            keys = extra_keys[i] if i < len(extra_keys) else ()
            if not 0 < self._num_missing(raw.size, keys) <= free:
                continue  # no room, or nothing to encode (assembled when it is scheduled)
            try:
                more, slots = self._jobs(
                    [raw], [keys], first=len(per_audio), checked=flags[len(audios) + i :][:1]
                )
            except BadAudio:
                continue
            jobs += more
            per_audio += slots
            free -= len(more)
            taken[i] = True
        for a, limit in enumerate(grow_to):
            if free == 0:
                break
            span = spans[a] if a < len(spans) else None
            hi = len(window_token_counts(audios[a].size)) if span is None else span[1]
            if limit <= hi:
                continue
            keys = window_keys[a] if window_keys is not None else ()
            more, slots = self._jobs(
                [audios[a]], [keys], first=a, checked=flags[a : a + 1],
                spans=[(hi, min(limit, hi + free))],
            )  # fmt: skip
            base = len(per_audio[a])  # the new windows' slots follow the span's
            jobs += [(a, base + slot, *rest) for _, slot, *rest in more]
            per_audio[a] += slots[0]
            free -= len(more)
        for start in range(0, len(jobs), self.max_windows_per_batch):
            self._run(jobs[start : start + self.max_windows_per_batch], per_audio)
        out: list[torch.Tensor | None] = [
            torch.cat([s for s in slots if s is not None]) for slots in per_audio[: len(audios)]
        ]
        extras = iter(per_audio[len(audios) :])
        for fits in taken:
            out.append(torch.cat([s for s in next(extras) if s is not None]) if fits else None)
        return out

    def _num_missing(self, num_samples: int, keys: Sequence[bytes | None]) -> int:
        """Windows of an audio of `num_samples` that miss the cache, its full windows' keys
        being `keys` (a full window without one counts as missing); the LRU is not touched."""
        num_windows = len(window_token_counts(num_samples))
        cached = sum(1 for key in keys[: num_samples // WINDOW_SAMPLES] if self._is_cached(key))
        return num_windows - cached

    def cached_windows(
        self,
        samples: np.ndarray,
        keys: list[bytes | None],
        lo: int,
        hi: int,
        *,
        hash_new: bool = True,
    ) -> list[int]:
        """The full windows among [lo, hi) of `samples` (float32 [S], 16 kHz) whose outputs
        the cache holds now (held or in the LRU), in order: an encode of them finds them all
        until an output is stored (`encode_filling`). `keys[w]`: the key of full window w,
        None where not known yet; `keys` is grown to one entry per full window, and with
        `hash_new` the unknown ones in [lo, hi) are hashed (on threads when many) and written
        in, so that a window is hashed once (the same list passed to `encode_filling` as the
        audio's keys); without it an unknown window counts as not cached. The LRU's order and
        the hit counter are left alone."""
        num_full = samples.size // WINDOW_SAMPLES
        if len(keys) < num_full:
            keys.extend([None] * (num_full - len(keys)))
        hi = min(hi, num_full)  # the partial last window is never cached
        if hash_new:
            todo = [w for w in range(lo, hi) if keys[w] is None]
            hashed = _hash_windows([_window(samples, w) for w in todo])
            for w, key in zip(todo, hashed, strict=True):
                keys[w] = key
        return [w for w in range(lo, hi) if self._is_cached(keys[w])]

    def _is_cached(self, key: bytes | None) -> bool:
        return key is not None and (key in self._held or key in self._cache)

    def _padding_rows(self, num_jobs: int) -> int:
        """Rows of silence the last micro-batch of `num_jobs` windows gets padded with."""
        if num_jobs == 0:
            return 0
        last = (num_jobs - 1) % self.max_windows_per_batch + 1
        bucket = choose_bucket(last, self.batch_buckets) or last
        return bucket - last

    def _jobs(
        self,
        audios: Sequence[np.ndarray],
        window_keys: Sequence[Sequence[bytes | None]] | None,
        first: int = 0,
        checked: Sequence[bool] = (),
        spans: Sequence[tuple[int, int] | None] = (),
    ) -> tuple[
        list[tuple[int, int, np.ndarray, int, bytes | None]], list[list[torch.Tensor | None]]
    ]:
        """The windows of `audios` (of audio a, windows `spans[a]`; all where None or
        missing) that miss the cache (audio index from `first`, slot, samples, tokens, key) and
        each audio's slots (one per window of its span), cache hits filled in. The windows
        encoded are scanned for NaN/inf unless `checked[a]` (BadAudio)."""
        jobs: list[tuple[int, int, np.ndarray, int, bytes | None]] = []
        per_audio: list[list[torch.Tensor | None]] = []
        for a, raw in enumerate(audios):
            # only the windows encoded now are scanned for NaN/inf: a cached window's samples
            # were when it was encoded (its key hashes them, or its caller vouches for them)
            samples = check_samples(raw, finite=False).astype(np.float32, copy=False)
            counts = window_token_counts(samples.size)
            span = spans[a] if a < len(spans) else None
            lo, hi = (0, len(counts)) if span is None else span
            if not 0 <= lo < hi <= len(counts):
                raise InternalError(f"window span {span} of an audio of {len(counts)} windows")
            known = window_keys[a] if window_keys is not None else ()
            keys = _span_keys(samples, known, lo, hi)
            slots: list[torch.Tensor | None] = []
            for w in range(lo, hi):
                key = keys[w - lo]
                hit = self._lookup(key)
                slots.append(hit)
                if hit is None:
                    window = _window(samples, w)
                    if not (a < len(checked) and checked[a]):
                        check_finite(window)
                    jobs.append((first + a, w - lo, window, counts[w], key))
            per_audio.append(slots)
        return jobs, per_audio

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Encode one micro-batch of each bucket size (silent partial windows, not cached), so
        no request pays a first-use cost (cuFFT plans, kernel selection); the counters are
        left as they were."""
        counters = (self.num_encoded_windows, self.num_graph_replays, self.num_eager_batches)
        silence = np.zeros(SAMPLE_RATE, dtype=np.float32)  # 1 s: a partial window, never cached
        count = window_token_counts(silence.size)[0]
        for bucket in self.batch_buckets or (1,):
            jobs = [(i, 0, silence, count, None) for i in range(bucket)]
            self._run(jobs, [[None] for _ in range(bucket)])
        self.num_encoded_windows, self.num_graph_replays, self.num_eager_batches = counters

    def _run(
        self,
        jobs: list[tuple[int, int, np.ndarray, int, bytes | None]],
        per_audio: list[list[torch.Tensor | None]],
    ) -> None:
        n = len(jobs)
        rows = choose_bucket(n, self.batch_buckets) or n  # padded with silence (module doc)
        windows = _padded_windows(
            [j[2] for j in jobs], self.device, rows, self._pinned
        )  # [rows, 480000]
        dtype = self.model.adaptor.linear_1.weight.dtype
        feats = self._log_mel(windows, dtype)  # [rows, 80, 3000]
        counts = [j[3] for j in jobs]
        frames = self._encoder_frames(feats)[:n]  # [n, 1500, d_audio]
        merged = merge_frames(frames, counts, self.model.cfg.merge_size)
        embeds = self.model.adaptor(merged.to(self.model.adaptor.linear_1.weight.dtype))
        self.num_encoded_windows += len(jobs)
        for (a, w, _, _, key), chunk in zip(jobs, embeds.split(counts), strict=True):
            per_audio[a][w] = chunk
            if key is not None:
                self._store(key, chunk)

    @staticmethod
    def _log_mel(windows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Log-mel of [rows, 480000] windows in slices of at most LOG_MEL_WINDOWS: the STFT's
        intermediates (~70 MB per 8 windows) stay bounded at the 64-window bucket, and every
        slice is a size warm-up has planned (rows <= 8, or whole slices of 8)."""
        rows = windows.shape[0]
        out = torch.empty(rows, N_MELS, N_FRAMES, dtype=dtype, device=windows.device)
        for start in range(0, rows, LOG_MEL_WINDOWS):
            out[start : start + LOG_MEL_WINDOWS] = log_mel(windows[start : start + LOG_MEL_WINDOWS])
        return out

    def graph_bucket(self, num_windows: int) -> int | None:
        """The captured graph a micro-batch of `num_windows` replays: the smallest that holds
        it (None: none does, or no graphs). The graphs are captured largest first (one shared
        pool); until session 11 their dict went in that order to the ascending
        `choose_bucket`, and every micro-batch ran the largest graph (a live session's single
        window cost 8 windows of encoder time)."""
        return choose_bucket(num_windows, sorted(self._graphs))

    def _encoder_frames(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [n, 80, 3000] -> encoder frames [n, 1500, d_audio]; a graph when one fits."""
        n = feats.shape[0]
        bucket = self.graph_bucket(n)
        if bucket is None:
            self.num_eager_batches += 1
            return self.model.audio_encoder(feats)
        graph, static_in, static_out = self._graphs[bucket]
        static_in[:n].copy_(feats)
        static_in[n:].zero_()
        graph.replay()
        self.num_graph_replays += 1
        return static_out[:n].clone()  # the next replay overwrites static_out

    @torch.inference_mode()
    def _capture(self) -> None:
        encoder = self.model.audio_encoder
        # before any capture: preparing re-points the projection weights, and a graph captured
        # earlier would read the freed originals (idempotent; ModelRunner prepares too)
        encoder.prepare_for_serving()
        dtype = self.model.adaptor.linear_1.weight.dtype
        pool = None
        for bucket in sorted(ENCODER_GRAPH_BUCKETS, reverse=True):  # largest first: one pool
            static_in = torch.zeros(bucket, N_MELS, N_FRAMES, dtype=dtype, device=self.device)
            encoder(static_in)  # warm-up outside the graph (kernel selection, allocator)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                static_out = encoder(static_in)
            pool = graph.pool()
            self._graphs[bucket] = (graph, static_in, static_out)

    # -- the cache: an LRU of full windows, and the windows owners hold out of it ---------------

    @property
    def num_held_windows(self) -> int:
        """Windows held (`hold`) and cached now; ~0.77 MB of device memory each at real size."""
        return len(self._held)

    def hold(self, owner: str, keys: Sequence[bytes]) -> None:
        """Keep the full windows of `keys` cached for `owner` (a live session) until
        `release(owner)`: held windows are never evicted, so each is encoded once however many
        other windows pass through the LRU (DESIGN 5.1; with only the LRU, 100 sessions of
        7 minutes on an H200 re-encoded their whole meetings every hop once their windows
        outgrew it, and latency diverged: docs/benchmarks.md, session 15). A key not cached
        yet is held from when it is stored. Past `max_held_windows` distinct keys (all owners)
        further keys are not held and stay in the LRU. Idempotent per (owner, key)."""
        held = self._holds.setdefault(owner, set())
        for key in keys:
            if key in held:
                continue
            if key not in self._holders and len(self._holders) >= self.max_held_windows:
                continue  # a key another owner holds already costs no slot: it is still held
            held.add(key)
            self._holders[key] = self._holders.get(key, 0) + 1
            if key in self._cache:
                self._held[key] = self._cache.pop(key)

    def release(self, owner: str) -> None:
        """End every hold of `owner` (no-op for an owner holding nothing): windows no other
        owner holds go to the LRU's cold end, evicted before anything used since (an ended
        session's windows are rarely asked for again)."""
        for key in self._holds.pop(owner, ()):
            left = self._holders[key] - 1
            if left:
                self._holders[key] = left
                continue
            del self._holders[key]
            value = self._held.pop(key, None)
            if value is not None:
                self._store_lru(key, value, cold=True)

    def _lookup(self, key: bytes | None) -> torch.Tensor | None:
        if key is None:
            return None
        hit = self._held.get(key)
        if hit is None and key in self._cache:
            self._cache.move_to_end(key)
            hit = self._cache[key]
        if hit is not None:
            self.num_cache_hits += 1
        return hit

    def _store(self, key: bytes, value: torch.Tensor) -> None:
        # a copy: `value` is a view into its whole micro-batch's output, which a cached
        # window would otherwise keep alive (up to 64 windows' worth) for as long as it stays
        if key in self._holders:
            self._held[key] = value.clone()
        elif self.cache_windows > 0:
            self._store_lru(key, value.clone())

    def _store_lru(self, key: bytes, value: torch.Tensor, cold: bool = False) -> None:
        """Insert as most recently used (`cold`: least recently used), then trim the LRU."""
        if self.cache_windows <= 0:
            return
        self._cache[key] = value
        self._cache.move_to_end(key, last=not cold)
        while len(self._cache) > self.cache_windows:
            self._cache.popitem(last=False)
