"""The serving engine: schedule -> encode -> run -> sample -> postprocess, one step at a time.

`Engine.add_request` turns audio into a prompt (livemeet.models.prompt) and audio embeddings
(EncoderRunner), and queues a `Request`; `Engine.step()` runs one scheduled batch on the
ModelRunner and returns the new tokens and finished requests. The engine is single-threaded:
the worker process (livemeet/engine/worker.py) owns it. Policy lives in the Scheduler and
BlockManager (plain Python); the device lives in the ModelRunner and EncoderRunner.

Async decode (CUDA by default): step N+1 is scheduled and launched while the GPU still runs
step N, and N's tokens are read afterwards. The scheduler sees N's sampled tokens as
PENDING_TOKEN_ID placeholders (`postprocess` with placeholders right after the launch), so it
can schedule N+1; decode rows of N+1 read their input ids from N's device tensor. Once N+1 is
launched, N's ids arrive through a pinned buffer (`TokenTransfer`) and replace the
placeholders. A request whose real token is EOS is finished then (`Scheduler.finish`), which
frees its KV once, including the block of its speculative row in N+1; that row's result is
then dropped by `postprocess(N+1)` because the request is no longer running. A request
aborted between steps gets nothing more.

Counters (`stats()`, posted to the gateway by the worker): steps by kind (decode-only or with a
prefill; CUDA graph or eager) and tokens by phase, counted at launch from the scheduled batch
and the graph runners' replay counters (host ints only, no device sync); and the host seconds
of each step by part (schedule, encode, launch, wait, other; read from `timer`, six reads per
step), so a step that stalls on the host (a kernel compiled for a new shape, a library plan,
an allocation) shows where, with its shape in a warning once it takes ENGINE_SLOW_STEP_S.
With async decode a step's `wait` is for the step launched before it, whose shape the warning
does not give.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from livemeet.audio.constants import (
    ENCODER_MAX_HELD_WINDOWS,
    ENGINE_SLOW_STEP_S,
    KV_BLOCK_SIZE,
    MAX_DRAFT_TOKENS,
    SAMPLE_RATE,
    TOKENS_PER_WINDOW,
    num_audio_tokens,
)
from livemeet.audio.features import check_samples, window_token_counts
from livemeet.audio.pcm import check_finite
from livemeet.engine.block_manager import BlockManager
from livemeet.engine.cost_model import StepCostModel
from livemeet.engine.encoder_runner import EncoderRunner
from livemeet.engine.messages import STEP_PARTS, EngineStats
from livemeet.engine.model_runner import DeviceTokens, ModelRunner, TokenTransfer
from livemeet.engine.request import PENDING_TOKEN_ID, Request, RequestClass
from livemeet.engine.sampler import SamplingParams
from livemeet.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig, StepOutput
from livemeet.errors import InternalError
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import MossTDConfig
from livemeet.models.loader import checkpoint_tokenizer, load_model, resolve_checkpoint
from livemeet.models.prompt import EOS, PromptBuilder, PromptConfig, PromptIds
from livemeet.transcript.segments import FinishReason

log = logging.getLogger(__name__)

# queued live requests considered for the encoder batch's padding per step (each holds ~1
# window to encode: a hop's open window); the largest bucket below the top one holds 32
ENCODE_AHEAD_REQUESTS = 32
MIN_OUTPUT_BUDGET = 512  # tokens; floor of the duration-scaled budget (SGLang-Omni default)
OUTPUT_TOKENS_PER_AUDIO_S = 10  # tokens per audio second; dense meetings use ~4.5-6 (MODEL 5.5)


def output_budget(duration_s: float, num_prompt_tokens: int, max_model_len: int) -> int:
    """Duration-scaled max_new_tokens: max(512, ceil(10 x duration)), clamped to the context.

    Source: SGLang-Omni's MOSS-TD budget (MODEL.md section 5.5). Returns >= 1.
    """
    wanted = max(MIN_OUTPUT_BUDGET, math.ceil(OUTPUT_TOKENS_PER_AUDIO_S * duration_s))
    return max(1, min(wanted, max_model_len - num_prompt_tokens - 1))


@dataclass(frozen=True)
class EngineConfig:
    """How the engine is built. `model`: checkpoint dir / hub id, or None with `load_format`
    "dummy" (real-size random weights). `num_kv_blocks`: fixed pool size (tests), else sized
    from free memory x `mem_fraction`. `kv_cache_dtype`: "auto" (model dtype) or "fp8_e4m3".
    `cuda_graphs`: replay captured decode steps (CUDA only). `async_decode`: one-step lookahead
    (CUDA only unless a TokenTransfer is given to Engine). `prefill_graphs`: piecewise graphs
    for steps that prefill (CUDA only, with `cuda_graphs`)."""

    model: str | None = None
    load_format: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = KV_BLOCK_SIZE
    num_kv_blocks: int | None = None
    mem_fraction: float = 0.85
    kv_cache_dtype: str = "auto"
    encoder_cache_windows: int = 256
    # windows live sessions may hold in the encoder cache (EncoderRunner.hold)
    encoder_max_held_windows: int = ENCODER_MAX_HELD_WINDOWS
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cuda_graphs: bool = True
    async_decode: bool = True
    prefill_graphs: bool = True


class _StepTimer:
    """Host seconds of one step's parts (messages.STEP_PARTS): each `done(part)` charges the
    time since the previous one (or the start) to `part`."""

    def __init__(self, timer: Callable[[], float]) -> None:
        self.timer = timer
        self.start_s = self.last_s = timer()
        self.seconds = dict.fromkeys(STEP_PARTS, 0.0)

    def done(self, part: str) -> None:
        now_s = self.timer()
        self.seconds[part] += now_s - self.last_s
        self.last_s = now_s

    @property
    def total_s(self) -> float:
        return self.last_s - self.start_s


@dataclass
class _AudioSource:
    """A request's samples until every window it needs is encoded (`Engine._encode_scheduled`):
    `keys`, the encoder-cache keys of its full windows known so far (the caller's first ones,
    then those `Engine._note_cached_windows` hashed; None where not known); `encoded`, per
    30-s window, whether its embeddings are in the request's tensor."""

    samples: np.ndarray  # float32 [S], 16 kHz mono
    keys: list[bytes | None]
    encoded: list[bool]

    @property
    def untouched(self) -> bool:
        return not any(self.encoded)


@dataclass(frozen=True)
class _InFlight:
    """A launched step whose sampled ids are not on the host yet (async decode)."""

    batch: ScheduledBatch
    tokens: DeviceTokens
    ticket: int
    accounted: StepOutput  # what postprocess did with the placeholders


class Engine:
    """See module docstring. `clock` returns seconds (monotonic) for the scheduler; `timer`
    seconds for the step-time counters (separate, so measuring never moves the scheduler's
    time in tests that step a fake clock).

    `transfer`: the host buffers of async decode; given, it turns async decode on for any
    device (tests drive the async path on the CPU with it); None builds pinned buffers on CUDA.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        model: tuple[MossTDModel, MossTDConfig] | None = None,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
        transfer: TokenTransfer | None = None,
    ) -> None:
        self.config = config
        # a hub id's cached snapshot, resolved once: its weights, tokenizer and prompt settings
        root = resolve_checkpoint(config.model) if config.model else None
        self.model, self.model_config = model or load_model(
            root,
            load_format=config.load_format,
            device=config.device,
            dtype=config.dtype,
        )
        self.tokenizer = checkpoint_tokenizer(config.model, root)
        self.prompt_config = PromptConfig.from_checkpoint(root) if root else PromptConfig()
        self.prompts = PromptBuilder(self.tokenizer, self.prompt_config)
        kv_dtype = torch.float8_e4m3fn if config.kv_cache_dtype == "fp8_e4m3" else None
        self.runner = ModelRunner(
            self.model,
            self.model_config,
            block_size=config.block_size,
            num_kv_blocks=config.num_kv_blocks,
            mem_fraction=config.mem_fraction,
            kv_dtype=kv_dtype,
            cuda_graphs=config.cuda_graphs,
            max_model_len=config.scheduler.max_model_len,
            max_num_seqs=config.scheduler.max_num_seqs,
            prefill_graphs=config.prefill_graphs and config.cuda_graphs,
            max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        )
        self.encoder = EncoderRunner(
            self.model,
            cache_windows=config.encoder_cache_windows,
            max_held_windows=config.encoder_max_held_windows,
            cuda_graphs=config.cuda_graphs,
        )
        self.block_manager = BlockManager(self.runner.num_kv_blocks, config.block_size)
        cost = StepCostModel.for_kv_cache(config.kv_cache_dtype)
        self.scheduler = Scheduler(self.block_manager, config.scheduler, cost)
        self.clock = clock
        self.timer = timer
        # [num audio tokens, hidden] per request: rows of the windows encoded so far
        self._audio: dict[str, torch.Tensor] = {}
        self._sources: dict[str, _AudioSource] = {}  # requests with windows not yet encoded
        self._sampling: dict[str, SamplingParams] = {}
        self._forced: dict[str, Sequence[int]] = {}
        if transfer is None and config.async_decode and self.runner.device.type == "cuda":
            # a step samples at most one row per query token (draft verification: several)
            sched = config.scheduler
            capacity = max(sched.max_num_seqs, sched.max_num_batched_tokens)
            transfer = TokenTransfer(self.runner.device, capacity)
        self.transfer = transfer if config.async_decode else None
        self._in_flight: _InFlight | None = None
        # Cumulative step counters (counted at launch) and host seconds by EngineStats field.
        self._counts: dict[str, float] = dict.fromkeys((f.name for f in fields(EngineStats)), 0)

    def build_prompt(
        self, num_audio_tokens: int, prompt: str | None = None, hotwords: Sequence[str] = ()
    ) -> PromptIds:
        """The prompt ids around `num_audio_tokens` audio tokens, with this engine's tokenizer
        and prompt config (`models.prompt.build_prompt`). Raises BadAudio for num_audio_tokens < 1,
        InvalidRequest for `hotwords` given as one string."""
        return self.prompts.build(num_audio_tokens, prompt, hotwords)

    def add_request(
        self,
        request_id: str,
        samples: np.ndarray,
        *,
        prompt: str | None = None,
        hotwords: Sequence[str] = (),
        request_class: RequestClass = RequestClass.UPLOAD,
        max_new_tokens: int | None = None,
        deadline_s: float | None = None,
        sampling: SamplingParams | None = None,
        forced_output_ids: Sequence[int] | None = None,
        prefix_token_ids: Sequence[int] = (),
        draft_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        retain_kv: bool = False,
        fork_from: str | None = None,
        num_fork_tokens: int = 0,
        window_keys: Sequence[bytes] = (),
        samples_checked: bool = False,
    ) -> Request:
        """Queue a request for `samples` (16 kHz mono float32 [n]); each 30-s window is encoded
        in the first step whose prefill chunk reaches it, together with the other requests'
        windows of that step (a long upload's are spread over its chunks, so its encoder time
        is not one stall of every live hop: `_encode_scheduled`).

        `prefix_token_ids` are forced assistant tokens appended after the prompt (DESIGN 5.3).
        `draft_token_ids`: a guess of the first outputs, verified by the last prefill chunk
        (livemeet.engine.request: draft verification); the outputs are the greedy ones either
        way. Kept to its first MAX_DRAFT_TOKENS ids (and fewer than a prefill chunk); dropped
        for a request that does not sample greedily.
        `forced_output_ids` (benchmarks): after sampling, the i-th output token is replaced by
        forced_output_ids[i], then EOS once they run out. `ignore_eos` decodes to
        max_new_tokens (tests, benchmarks). `retain_kv`, `fork_from`, `num_fork_tokens`: passed
        to `Scheduler.add` (keep this request's KV after it finishes; share the first tokens' KV
        of another request); the caller vouches that the audio embeddings at the forked
        positions are unchanged; `request.num_cached_tokens` then counts the reused tokens.
        `window_keys`: encoder-cache keys of the audio's first full windows
        (`encoder_runner.window_key`), which the caller vouches for; the rest are hashed.
        `samples_checked`: the caller has checked every sample finite (a live session checks
        each chunk as it arrives), so the O(n) scan is skipped; either way the encoder does
        not scan the audio again.
        Raises BadAudio (empty, not 1-D, not float or non-finite audio), InvalidRequest
        (`hotwords` given as one string, a request id already queued), TooLong (no room in the
        context, or more KV than the whole pool) and BlockManagerError (`fork_from`'s token ids
        differ).
        """
        # float32 first: float64 samples beyond float32's range become inf in the cast, which
        # the scan below refuses (so numpy's overflow warning says nothing new)
        with np.errstate(over="ignore"):
            samples = check_samples(samples, finite=False).astype(np.float32, copy=False)
        if not samples_checked:
            check_finite(samples)
        built = self.build_prompt(num_audio_tokens(samples.size), prompt, hotwords)
        sampling = sampling or SamplingParams()
        cap = min(MAX_DRAFT_TOKENS, self.scheduler.config.chunked_prefill_size - 1)
        draft = list(draft_token_ids[:cap]) if sampling.greedy else []
        ids = built.ids  # the caller's own list: no copy of a long meeting's ~24k ids
        ids.extend(prefix_token_ids)
        ids.extend(draft)
        duration_s = len(samples) / SAMPLE_RATE
        budget = max_new_tokens or output_budget(
            duration_s, len(ids), self.scheduler.config.max_model_len
        )
        request = Request(
            request_id,
            ids,
            request_class=request_class,
            max_new_tokens=budget,
            deadline_s=deadline_s,
            arrival_s=self.clock(),
            audio_positions=built.audio_positions,
            ignore_eos=ignore_eos,
            num_draft_tokens=len(draft),
        )
        self.scheduler.add(
            request, retain_kv=retain_kv, fork_from=fork_from, num_fork_tokens=num_fork_tokens
        )
        num_windows = len(window_token_counts(samples.size))
        self._sources[request_id] = _AudioSource(samples, list(window_keys), [False] * num_windows)
        self._sampling[request_id] = sampling
        self._counts["num_draft_tokens"] += len(draft)
        if forced_output_ids is not None:
            self._forced[request_id] = forced_output_ids
        return request

    def abort(self, request_id: str) -> None:
        """Stop a request at any phase; frees its KV exactly once. Unknown ids are ignored."""
        self.scheduler.abort(request_id)
        if self._in_flight is not None:
            for request in self._in_flight.accounted.finished:
                if request.request_id == request_id:
                    # finished by its in-flight token (length): that token and the finish are
                    # not delivered either, and the resolve leaves the id (maybe reused) alone
                    request.finish_reason = FinishReason.ABORT
        self._forget(request_id)

    def preempt(self, request_id: str) -> bool:
        """Evict an unfinished request's KV now; it is recomputed later (Scheduler.preempt,
        whose False and SchedulerError this returns and raises), its encoded audio counted
        for the recompute (`_recount_evicted`). Evict through here, not through the
        scheduler: the engine recounts only the evictions it sees."""
        evicted = self.scheduler.preempt(request_id)
        if evicted:
            self._recount_evicted((request_id,))
        return evicted

    def advance_deadline(self, request_id: str, deadline_s: float) -> bool:
        """Bring a live request's deadline forward (Scheduler.advance_deadline): e.g. the hop a
        session's `end` now waits on. False when it is not an unfinished live request."""
        return self.scheduler.advance_deadline(request_id, deadline_s)

    def hold_windows(self, owner: str, keys: Sequence[bytes]) -> None:
        """Keep the encoder's outputs for these full-window keys (`window_keys` of a request)
        cached until `release_windows(owner)`, e.g. a live session's windows for its life
        (EncoderRunner.hold). Every hold needs its release."""
        self.encoder.hold(owner, keys)

    def release_windows(self, owner: str) -> None:
        """End `owner`'s holds (EncoderRunner.release); a no-op when it holds nothing."""
        self.encoder.release(owner)

    def has_work(self) -> bool:
        """True while a request is unfinished or a launched step's sampled ids are still on the
        device (async decode): `step()` has something to do."""
        return self.scheduler.has_work() or self._in_flight is not None

    def set_incoming_uploads(self, count: int) -> None:
        """Uploads on their way to `add_request`; the scheduler's upload hold waits for them."""
        self.scheduler.set_incoming_uploads(count)

    def set_live_sessions(self, count: int) -> None:
        """Open live sessions; while any is, the scheduler keeps short steps for their hops."""
        self.scheduler.set_live_sessions(count)

    def is_holding(self) -> bool:
        """True when a step now would do nothing: no step is in flight and the scheduler holds
        new uploads for the incoming ones (Scheduler.is_holding). Reads the clock only then."""
        if self._in_flight is not None or self.scheduler.num_incoming_uploads == 0:
            return False  # with nothing incoming, uploads are held only while others decode
        return self.scheduler.is_holding(self.clock())

    def stats(self) -> EngineStats:
        """The cumulative step counters, and the KV and queue gauges as of now
        (livemeet.engine.messages.EngineStats)."""
        # accepted draft ids are counted where they are accepted (Scheduler.accept_draft)
        sched, bm = self.scheduler, self.scheduler.block_manager
        running, waiting, retained = sched.request_counts()
        counts = {
            **self._counts,
            "num_accepted_draft_tokens": sched.num_accepted_draft_tokens,
            "num_preemptions": sched.num_preemptions,
            "num_retained_evictions": sched.num_retained_evictions,
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_used": bm.num_blocks - bm.num_free_blocks,
            "num_running_requests": running,
            "num_waiting_requests": waiting,
            "num_retained_requests": retained,
        }
        return EngineStats(**counts)  # type: ignore[arg-type]

    def step(self) -> StepOutput:
        """Run one step. Returns new tokens and finished requests: of this step (synchronous),
        or of the step launched by the previous call (async decode)."""
        timer = _StepTimer(self.timer)
        windows_before = self.encoder.num_encoded_windows
        if self.transfer is not None:
            batch, out = self._step_async(self.transfer, timer)
        else:
            batch, out = self._step_sync(timer)
        timer.done("other")
        self._count_time(timer, batch, self.encoder.num_encoded_windows - windows_before)
        return out

    def run_to_completion(self) -> dict[str, Request]:
        """Step until idle (offline jobs and tests); returns the finished requests by id.
        Raises InternalError while uploads are still incoming: the scheduler would hold the
        waiting ones for them, and nothing here can add them."""
        if self.scheduler.num_incoming_uploads:
            raise InternalError("run_to_completion with uploads still incoming")
        done: dict[str, Request] = {}
        while self.has_work():
            for request in self.step().finished:
                done[request.request_id] = request
        return done

    def _step_sync(self, timer: _StepTimer) -> tuple[ScheduledBatch, StepOutput]:
        self._note_cached_windows()
        batch = self.scheduler.schedule(self.clock())
        self._recount_evicted(batch.preempted_ids)
        timer.done("schedule")
        if batch.is_empty:
            return batch, self._with_scheduled_finishes(StepOutput((), ()), batch)
        self._encode_scheduled(batch)
        timer.done("encode")
        replays = self._graph_replays()
        tokens = self.runner.launch(
            batch, self._audio, self._sampling_of, forced=self._forced_ids(batch)
        )
        self._count_step(batch, replays)
        timer.done("launch")
        sampled = [] if tokens is None else tokens.token_ids.tolist()
        timer.done("wait")
        out = self.scheduler.postprocess(batch, sampled)
        for request in out.finished:
            self._forget(request.request_id)
        return batch, self._with_scheduled_finishes(out, batch)

    def _step_async(
        self, transfer: TokenTransfer, timer: _StepTimer
    ) -> tuple[ScheduledBatch, StepOutput]:
        previous, self._in_flight = self._in_flight, None
        self._note_cached_windows()
        batch = self.scheduler.schedule(self.clock())
        self._recount_evicted(batch.preempted_ids)
        timer.done("schedule")
        tokens = None
        if not batch.is_empty:
            self._encode_scheduled(batch)
            timer.done("encode")
            replays = self._graph_replays()
            tokens = self.runner.launch(
                batch,
                self._audio,
                self._sampling_of,
                forced=self._forced_ids(batch),
                previous=previous.tokens if previous else None,
            )
            self._count_step(batch, replays)
            timer.done("launch")
        # The GPU now has this step queued behind the previous one: read the previous one.
        out = StepOutput((), ())
        if previous is not None:
            values = transfer.wait(previous.ticket)
            timer.done("wait")
            out = self._resolve(previous, values)
        if tokens is not None:
            ticket = transfer.start(tokens.token_ids)
            pending = [PENDING_TOKEN_ID] * sum(batch.sample_counts)
            accounted = self.scheduler.postprocess(batch, pending, pending=True)
            self._in_flight = _InFlight(batch, tokens, ticket, accounted)
        elif not batch.is_empty:  # only non-final prefill chunks: nothing to wait for
            self.scheduler.postprocess(batch, [])
        return batch, self._with_scheduled_finishes(out, batch)

    def _with_scheduled_finishes(self, out: StepOutput, batch: ScheduledBatch) -> StepOutput:
        """`out` with the requests the scheduler finished while building `batch` (LENGTH: the
        pool cannot hold their next token) after its own, forgotten here. With async decode
        such a request's last token, still in flight then, came in `out` (resolved first)."""
        if not batch.finished:
            return out
        for request in batch.finished:
            self._forget(request.request_id)
        done = {r.request_id for r in out.finished}
        extra = tuple(r for r in batch.finished if r.request_id not in done)
        return StepOutput(out.new_tokens, out.finished + extra)

    def _resolve(self, step: _InFlight, values: Sequence[int]) -> StepOutput:
        """Put a launched step's real ids (`values`, read from its ticket) in place of its
        placeholders; finish on EOS."""
        accounted = {rid for rid, _ in step.accounted.new_tokens}
        finished_early = {r.request_id for r in step.accounted.finished}
        eos = self.scheduler.config.eos_token_id
        new_tokens: list[tuple[str, int]] = []
        finished: list[Request] = []
        batch, first = step.batch, 0
        for request, count in zip(batch.sampled_requests, batch.sample_counts, strict=True):
            rid = request.request_id
            row, first = values[first : first + count], first + count
            if count > 1:  # a draft to verify, unless aborted or evicted since
                if self.scheduler.is_verifying(request):
                    tokens, reason = self.scheduler.accept_draft(request, row)
                    new_tokens.extend((rid, t) for t in tokens)
                    if reason is not None:
                        finished.append(request)
                continue
            token_id = row[0]
            if rid not in accounted:
                continue  # aborted or evicted before the step was accounted
            if request.output_token_ids[-1] != PENDING_TOKEN_ID:
                raise InternalError(f"{rid!r}: its last token is not the pending one")
            request.output_token_ids[-1] = token_id
            if request.finish_reason is FinishReason.ABORT:
                continue  # aborted between steps: nothing more reaches the client
            new_tokens.append((rid, token_id))
            if token_id == eos and not request.ignore_eos:
                if request.is_finished:  # also at its length limit: EOS wins, as in sync
                    request.finish_reason = FinishReason.STOP
                else:
                    self.scheduler.finish(rid, FinishReason.STOP)
                finished.append(request)
            elif rid in finished_early:
                finished.append(request)
        for request in finished:
            self._forget(request.request_id)
        return StepOutput(tuple(new_tokens), tuple(finished))

    def _encode_scheduled(self, batch: ScheduledBatch) -> None:
        """Encode, in one batched encoder call, the windows this step's prefill chunks reach
        that are not encoded yet (DESIGN 4: windows are batched across requests). An upload's
        chunk needs the windows of the audio positions it splices, so a long upload is encoded
        as its chunks come rather than in one step that every live hop waits for (75 windows
        of a 37-minute meeting: ~0.27 s on an H100, docs/benchmarks.md session 47); the step's
        time budget pays for them while live sessions run (Scheduler). A live hop's windows
        are encoded, most of them found in the cache, at its first chunk."""
        spans: dict[str, tuple[int, int]] = {}
        for chunk in batch.prefills:
            request = chunk.request
            rid = request.request_id
            source = self._sources.get(rid)
            if source is None:
                continue
            if request.request_class is RequestClass.LIVE:
                # a hop's windows are the session's held ones but for its open window: all
                # looked up (or encoded) at its first chunk, as a queued hop's are when they
                # ride in the padding (`_encode_ahead`), and a recompute from 0 finds them all
                if source.untouched:
                    spans[rid] = (0, len(source.encoded))
                continue
            lo, hi = request.audio_span_in(chunk.start, chunk.start + chunk.num_tokens)
            if lo == hi:
                continue
            first, last = lo // TOKENS_PER_WINDOW, (hi - 1) // TOKENS_PER_WINDOW
            missing = [w for w in range(first, last + 1) if not source.encoded[w]]
            if missing:
                was = spans.get(rid, (missing[0], missing[-1] + 1))
                spans[rid] = (min(was[0], missing[0]), max(was[1], missing[-1] + 1))
        if not spans:
            return
        todo = list(spans)
        extra = self._encode_ahead(set(todo))
        embeds = self.encoder.encode_filling(
            [self._sources[rid].samples for rid in todo],
            [self._sources[rid].keys for rid in todo],
            extra=[self._sources[rid].samples for rid in extra],
            extra_keys=[self._sources[rid].keys for rid in extra],
            # every source is finite: add_request scanned it, or its caller had
            checked=[True] * (len(todo) + len(extra)),
            spans=[spans[rid] for rid in todo],
            # an upload's next windows may fill the micro-batch's padding rows too
            grow_to=[self._unencoded_run_end(rid, spans[rid][1]) for rid in todo],
        )
        for rid, e in zip(todo, embeds[: len(todo)], strict=True):
            assert e is not None
            self._place(rid, spans[rid][0], e)
        for rid, e in zip(extra, embeds[len(todo) :], strict=True):
            if e is not None:
                self._place(rid, 0, e)

    def _note_cached_windows(self) -> None:
        """Tell each upload with windows to encode which of them its next chunk may reach the
        encoder's cache holds (`Request.cached_audio_windows`), so that the scheduler charges
        its chunk for the windows the encoder will run only (a repeated upload's, a continued
        upload's, a revision's held windows cost none). Only before a step that charges
        encodes (`Scheduler.charges_encode`).

        Made right before the schedule, whose step's encode looks every window up before it
        stores any output (`EncoderRunner.encode_filling`): nothing stores into or evicts from
        the cache in between, so every window found is found again and no chunk is charged
        short. A chunk reaches at most `chunked_prefill_size` tokens past the request's next
        one: only those windows are looked at. A window's key is hashed once per request
        (~1 ms; the encode then takes it from `_AudioSource.keys`), and only for the uploads
        first in line whose reaches together stay within a step's token limit, which bounds
        a step's hashing; the others' windows not hashed yet count as not cached (charged)."""
        if not self.scheduler.charges_encode():
            return  # the sets are read only by such a step, and made afresh before each
        cfg = self.scheduler.config
        hash_tokens = cfg.max_num_batched_tokens
        for rid, source in self._sources.items():
            request = self.scheduler.get(rid)
            if request is None or request.request_class is RequestClass.LIVE:
                continue  # a live hop's windows are never charged
            start = request.num_computed_tokens
            end = min(request.num_tokens, start + cfg.chunked_prefill_size)
            lo, hi = request.audio_span_in(start, end)
            lo = max(lo, request.num_encoded_audio)  # those before are encoded
            found: list[int] = []
            if lo < hi:
                found = self.encoder.cached_windows(
                    source.samples,
                    source.keys,
                    lo // TOKENS_PER_WINDOW,
                    (hi - 1) // TOKENS_PER_WINDOW + 1,
                    hash_new=hash_tokens > 0,
                )
                hash_tokens -= end - start
            request.cached_audio_windows = frozenset(found)

    def _recount_evicted(self, request_ids: Sequence[str]) -> None:
        """The requests `request_ids` were just evicted (a batch's `preempted_ids`, or
        `preempt`): each is recomputed from token 0, whose chunks reach again the windows
        before a fork, never encoded (`_mark_encoded`), so its count is made again now, before
        the schedule that charges their encode. Every eviction goes through here: the
        scheduler evicts only while it builds a batch, or when `preempt` asks it to."""
        for rid in request_ids:
            self._mark_encoded(rid)

    def _unencoded_run_end(self, rid: str, hi: int) -> int:
        """For an upload, the end of the run of windows from `hi` not encoded yet (what its
        span may grow into); `hi` for a live request (encoded whole)."""
        request, source = self.scheduler.get(rid), self._sources[rid]
        if request is None or request.request_class is RequestClass.LIVE:
            return hi
        end = hi
        while end < len(source.encoded) and not source.encoded[end]:
            end += 1
        return end

    def _place(self, rid: str, lo: int, embeds: torch.Tensor) -> None:
        """Put the embeddings of request `rid`'s windows from `lo` on, as many as `embeds`
        holds, in its tensor (rows from audio token 375 x lo on; all but the last window of
        an audio are full)."""
        source = self._sources[rid]
        hi = lo + -(-embeds.shape[0] // TOKENS_PER_WINDOW)
        total = num_audio_tokens(source.samples.size)  # the windows' counts summed
        if lo == 0 and embeds.shape[0] == total:
            self._audio[rid] = embeds  # the whole audio at once: no copy
        else:
            whole = self._audio.get(rid)
            if whole is None:
                whole = embeds.new_empty((total, embeds.shape[1]))
                self._audio[rid] = whole
            start = lo * TOKENS_PER_WINDOW
            whole[start : start + embeds.shape[0]] = embeds
        source.encoded[lo:hi] = [True] * (hi - lo)
        if all(source.encoded):
            del self._sources[rid]
        self._mark_encoded(rid)

    def _mark_encoded(self, rid: str) -> None:
        """Set `num_encoded_audio` of request `rid`: the audio its next chunks reach is encoded
        up to there. Counted from the window of its next audio position, not from 0: a fork's
        first windows are never encoded (its chunks start past them), and a count from 0 had
        its later chunks charged for windows already encoded (a revision forking a hop's KV).
        After a preemption the recompute needs them again (`_recount_evicted`)."""
        request = self.scheduler.get(rid)
        if request is None:
            return
        source = self._sources.get(rid)
        total = len(request.audio_positions)
        if source is None:
            request.num_encoded_audio = total
            return
        nxt, _ = request.audio_span_in(request.num_computed_tokens, request.num_computed_tokens)
        w = min(nxt // TOKENS_PER_WINDOW, len(source.encoded))
        while w < len(source.encoded) and source.encoded[w]:
            w += 1
        request.num_encoded_audio = min(total, w * TOKENS_PER_WINDOW)

    def _encode_ahead(self, scheduled: set[str]) -> list[str]:
        """Queued live requests whose audio may ride in the encoder batch's padding (the
        bucket's graph runs its silent rows anyway; EncoderRunner.encode_filling), earliest
        deadline first, at most ENCODE_AHEAD_REQUESTS: a hop later found encoded skips its
        encode, whose micro-batches would be padded in turn."""
        waiting = []
        for rid, source in self._sources.items():
            request = self.scheduler.get(rid)
            if (
                rid in scheduled
                or not source.untouched
                or request is None
                or request.request_class is not RequestClass.LIVE
            ):
                continue
            waiting.append((math.inf if request.deadline_s is None else request.deadline_s, rid))
        waiting.sort()
        return [rid for _, rid in waiting[:ENCODE_AHEAD_REQUESTS]]

    def _graph_replays(self) -> tuple[int, int]:
        """(decode graph, piecewise graph) replays so far: host ints, no device sync."""
        graphs, piecewise = self.runner.graphs, self.runner.piecewise
        return (
            0 if graphs is None else graphs.num_replays,
            0 if piecewise is None else piecewise.num_replays,
        )

    def _count_step(self, batch: ScheduledBatch, replays_before: tuple[int, int]) -> None:
        """Count one launched step; `replays_before`: `_graph_replays()` before its launch."""
        decode_replays, piecewise_replays = self._graph_replays()
        decode_graph = decode_replays != replays_before[0]
        counts = self._counts
        counts["num_decode_tokens"] += len(batch.decodes)
        if batch.prefills:
            counts["num_prefill_tokens"] += sum(c.num_tokens for c in batch.prefills)
            graphed = decode_graph or piecewise_replays != replays_before[1]
            counts["num_prefill_graph_steps" if graphed else "num_prefill_eager_steps"] += 1
        elif decode_graph:
            counts["num_decode_graph_steps"] += 1
        else:
            counts["num_decode_eager_steps"] += 1
            if self.runner.graphs is not None:
                counts["num_decode_graph_fallbacks"] += 1

    def _count_time(self, timer: _StepTimer, batch: ScheduledBatch, num_windows: int) -> None:
        """Add a step's host seconds by part; count and log it when it is slow (module doc)."""
        counts = self._counts
        for part, seconds in timer.seconds.items():
            counts[f"{part}_s"] += seconds
        counts["num_encoded_windows"] += num_windows
        if timer.total_s < ENGINE_SLOW_STEP_S:
            return
        counts["num_slow_steps"] += 1
        parts = ", ".join(f"{p} {1e3 * s:.1f} ms" for p, s in timer.seconds.items())
        log.warning(  # with async decode, `wait` belongs to the previous step (module doc)
            "slow engine step: %.2f s (%s); %d prefill chunks of %d tokens, %d audio windows "
            "encoded, %d decode rows",
            timer.total_s,
            parts,
            len(batch.prefills),
            sum(c.num_tokens for c in batch.prefills),
            num_windows,
            len(batch.decodes),
        )

    def _sampling_of(self, request: Request) -> SamplingParams:
        return self._sampling.get(request.request_id, SamplingParams())

    def _forced_ids(self, batch: ScheduledBatch) -> list[int | None]:
        """Per sampled row: the forced output id (then EOS once they run out), else None. A
        verifying chunk's rows are the outputs from the request's next one on."""
        if not self._forced:
            return []
        out: list[int | None] = []
        for request, count in zip(batch.sampled_requests, batch.sample_counts, strict=True):
            forced = self._forced.get(request.request_id)
            for k in range(request.num_output_tokens, request.num_output_tokens + count):
                out.append(None if forced is None else forced[k] if k < len(forced) else EOS)
        return out

    def _forget(self, request_id: str) -> None:
        self._sources.pop(request_id, None)
        self._audio.pop(request_id, None)
        self._sampling.pop(request_id, None)
        self._forced.pop(request_id, None)
