"""The engine's step scheduler: plain Python, no torch, no I/O; time comes in as `now_s`.

Each `schedule(now_s)` builds one step (a `ScheduledBatch`): prefill chunks and decode rows,
in priority order, until the step's estimated time (`StepCostModel`) reaches
`step_budget_s`, the token limit or the row limit. Policy (DESIGN.md section 4):
- Priority: live hops before uploads; live hops earliest deadline first; uploads first come
  first served (arrival time, then the order of `add`).
- Uploads keep a minimum share: while an upload can run, live work may spend at most
  (1 - upload_min_share) of the step's time budget and of its token limit; uploads get the
  rest.
- Uploads also keep that share of estimated time across steps, because a decoding upload
  gains one token per step: in steps that live prefill fills to the budget, a share of each
  step's budget is a few ms, not upload throughput. An upload deficit (estimated seconds)
  gains share / (1 - share) of each step's live time and loses its upload time (a step's
  fixed cost split by its rows' costs); it is clamped to +-step_budget_s and reset while no
  upload can run (held uploads do not count), so no credit is banked for long. While it is
  positive the step is an upload turn: live work waits, and uploads may use the whole budget
  and token limit; a turn of upload decode rows only is a cheap graph step, so a decoding
  upload gets many tokens per live step. A run of turns ends after share / (1 - share) of
  step_budget_s of estimated time (5 ms at 0.25 and 15-ms steps), so live work waits at most
  that (and the turn that crosses it) between live steps.
- Decode-only steps between live prefills (`live_decode_steps`): after a step that prefilled
  live work, up to that many steps hold live decode rows only, while the most urgent live
  request (earliest deadline) is one of them. A hop's new segment is ~26 ids, one step each:
  riding along the prefill steps alone they take ~26 of them, with two decode-only steps after
  each prefill about a third as many. A decode row costs the same KV read in either kind of step;
  an extra step adds a pass over the weights and the launch (StepCostModel.fixed_s, ~0.7 ms).
  Hops queued meanwhile wait for those steps, and a hop due sooner than every decoding row is
  never held back by them. Upload turns keep their place (the run resumes after them), and
  upload decode rows stay out of these steps (their share is kept across steps as before).
  On the 100-session live point (docs/benchmarks.md) two of them gave latency within the
  spread between calls and ~6 % less engine time per hop in session 21; once every hop
  decoded its new words (session 24) they held the queued hops back, and without them per-word
  p95 fell from 2.46 to 1.83 s (session 27), so the server's default is now none.
- Chunked prefill interleaved with decode: a prefill chunk is cut to `chunked_prefill_size`
  and to what the remaining budget pays for, which shrinks chunks late in long prompts
  (attention cost grows with tokens x context). While live work has the short budget, an
  upload's chunk also pays for the audio windows it has the engine encode (the engine encodes
  an upload's windows as its chunks reach them: `Request.num_encoded_audio`), whole windows in
  both sizing and charge: a chunk that reaches into a window pays all of it, and windows
  already encoded (by an earlier chunk, or riding in an encoder batch's padding) pay nothing,
  nor do windows the encoder's cache holds (a repeated upload's, a continued upload's, a
  revision's held ones: the engine says which, `Request.cached_audio_windows`); between
  uploads alone it is not charged.
- The budget is `step_budget_s` (--live-step-budget-ms, default 15 ms: LIVE_STEP_BUDGET_S)
  while a live session is open (`set_live_sessions`), a live request is queued, or a live
  cache is retained; otherwise a step gets `upload_step_budget_s`, so late chunks of long
  uploads stay whole instead of being cut into pieces that leave the GPU's last wave of
  attention programs part-empty. A session that opens meanwhile finds up to three upload
  steps ahead of its first hop (one running, one queued by the engine's async lookahead, one
  scheduled), hence MAX_UPLOAD_STEP_BUDGET_S.
- Admission by KV availability: a request is admitted when blocks for its whole sequence can
  be allocated; the first admission that cannot be met stops admissions for the step.
- Upload batching: a step with a prefill cannot replay a decode CUDA graph and runs eagerly
  (~15-20 ms of launches on an H200 host against ~1.5 ms for a graph step), so new uploads
  are held to be prefilled together, until the oldest has waited `upload_batch_wait_s`, while
  (`upload_hold`, livemeet.config.UploadHold):
  - ARRIVALS: decodes are running and fewer uploads wait than decode;
  - PIPELINE (default): that (the clients of running requests soon send more: in a closed
    loop it pays, tests/engine/test_upload_hold_sim.py), or uploads are still on their way to
    the engine (`set_incoming_uploads`: being received or decoded by the gateway, or not yet
    added by the backend), running decodes or not, so a wave of uploads that reaches the
    engine spread over the gateway's decode slots is prefilled in one step rather than as
    its first arrivals come.
  A preempted upload (it already waited) and live hops are never held, nor are uploads whose
  prompts already fill a step's token limit (no more could join their step); a step that
  prefills anyway (a live hop, a running chunk) takes held uploads at once. `is_holding`
  says when held uploads are all there is, so the caller can wait instead of stepping.
- Preemption by recompute: to admit or grow a request, evict in this order: retained caches
  (least recently finished first), then lower-priority requests from the lowest up, so every
  upload goes before any live hop. An evicted request loses its KV and is recomputed later.
- A step always contains its first item even over budget, so everything progresses.
- Abort at any point frees the request's blocks exactly once; results of a step that was in
  flight during an abort are ignored for that request.
Deterministic: the same calls with the same arguments give the same batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import NamedTuple

from livemeet.audio.constants import (
    CHUNKED_PREFILL_SIZE,
    EOS_TOKEN_ID,
    LIVE_STEP_BUDGET_S,
    MAX_CONTEXT_TOKENS,
    MAX_LIVE_DECODE_STEPS,
    MAX_UPLOAD_STEP_BUDGET_S,
    MIN_PREFILL_CHUNK,
    TOKENS_PER_WINDOW,
    UPLOAD_BATCH_WAIT_S,
    UPLOAD_MIN_SHARE,
    UPLOAD_STEP_BUDGET_S,
)
from livemeet.config import UploadHold, parse_upload_hold
from livemeet.engine.block_manager import BlockCopy, BlockManager
from livemeet.engine.cost_model import StepCostModel
from livemeet.engine.request import PENDING_TOKEN_ID, Request, RequestClass, Status
from livemeet.errors import ConfigError, InternalError, InvalidRequest, TooLong
from livemeet.transcript.segments import FinishReason


class SchedulerError(InternalError):
    """The scheduler was driven wrongly (e.g. sampled tokens that do not match the batch)."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling limits. Raises ConfigError on construction when a value is out of range."""

    chunked_prefill_size: int = CHUNKED_PREFILL_SIZE  # tokens; largest chunk per request/step
    max_num_batched_tokens: int = 8_192  # tokens per step (prefill chunks + decode rows)
    max_num_seqs: int = 128  # rows per step (decode CUDA graphs go up to 128)
    # s of estimated GPU time per step while live work is there (module docstring)
    step_budget_s: float = LIVE_STEP_BUDGET_S
    # s of estimated GPU time of a step while no live session is open (module docstring)
    upload_step_budget_s: float = UPLOAD_STEP_BUDGET_S
    # fraction of each step's budget, and of estimated time across steps, kept for uploads
    # while they can run (module docstring); 0: live work has pure priority
    upload_min_share: float = UPLOAD_MIN_SHARE
    # s a new upload may wait to be prefilled together with later arrivals (module docstring:
    # upload batching); 0 admits every upload at once
    upload_batch_wait_s: float = UPLOAD_BATCH_WAIT_S
    upload_hold: UploadHold = UploadHold.PIPELINE  # what a held upload waits for
    # decode-only steps after each step that prefilled, while a live request decodes (module
    # docstring); 0 (the bare policy): decode rows only ride along the steps the budget
    # fills. The server passes --live-decode-steps (LIVE_DECODE_STEPS by default).
    live_decode_steps: int = 0
    min_prefill_chunk: int = MIN_PREFILL_CHUNK  # tokens; smaller non-final chunks are not worth it
    max_model_len: int = MAX_CONTEXT_TOKENS  # tokens; prompt + output limit (FinishReason.LENGTH)
    eos_token_id: int = EOS_TOKEN_ID

    def __post_init__(self) -> None:
        if self.chunked_prefill_size < 1 or self.min_prefill_chunk < 1:
            raise ConfigError("chunked_prefill_size and min_prefill_chunk must be >= 1")
        if self.max_num_batched_tokens < self.chunked_prefill_size:
            raise ConfigError("max_num_batched_tokens must be >= chunked_prefill_size")
        if self.max_num_seqs < 1 or self.max_model_len < 2:
            raise ConfigError("max_num_seqs must be >= 1 and max_model_len >= 2")
        if not (math.isfinite(self.step_budget_s) and self.step_budget_s > 0):
            raise ConfigError(f"step_budget_s must be > 0, not {self.step_budget_s}")
        if not self.step_budget_s <= self.upload_step_budget_s <= MAX_UPLOAD_STEP_BUDGET_S:
            raise ConfigError(
                f"upload_step_budget_s must be in [step_budget_s ({self.step_budget_s}), "
                f"{MAX_UPLOAD_STEP_BUDGET_S}], not {self.upload_step_budget_s}"
            )
        if not (math.isfinite(self.upload_batch_wait_s) and self.upload_batch_wait_s >= 0):
            raise ConfigError(f"upload_batch_wait_s must be >= 0, not {self.upload_batch_wait_s}")
        if not 0 <= self.live_decode_steps <= MAX_LIVE_DECODE_STEPS:
            raise ConfigError(
                f"live_decode_steps must be in [0, {MAX_LIVE_DECODE_STEPS}], "
                f"not {self.live_decode_steps}"
            )
        if not 0 <= self.upload_min_share < 1:
            raise ConfigError(f"upload_min_share must be in [0, 1), not {self.upload_min_share}")
        parse_upload_hold(self.upload_hold)


class PrefillChunk(NamedTuple):
    """Compute KV for tokens [start, start + num_tokens) of `request`; when `samples` is true
    the chunk reaches the end of the sequence and its last logit is sampled, and with
    `num_verify` draft ids (livemeet.engine.request: draft verification) the `num_verify`
    logits before it too: num_verify + 1 sampled rows, in position order."""

    request: Request
    start: int
    num_tokens: int
    samples: bool
    num_verify: int = 0


@dataclass(frozen=True)
class ScheduledBatch:
    """One engine step. The model runner must first perform `block_copies` (copy-on-write),
    then run `prefills` and `decodes` (decode row r feeds `last_token_id` at position
    `num_tokens - 1`), then return `sample_counts[i]` sampled tokens for `sampled_requests[i]`
    (one, or a verifying chunk's rows), in order."""

    now_s: float
    prefills: tuple[PrefillChunk, ...] = ()
    decodes: tuple[Request, ...] = ()
    preempted_ids: tuple[str, ...] = ()
    block_copies: tuple[BlockCopy, ...] = ()
    estimated_cost_s: float = 0.0
    upload_turn: bool = False  # live work waited for the uploads' time share (module docstring)
    # requests finished while this step was built (the whole pool cannot hold their next
    # token: LENGTH); the engine reports them with the step's output
    finished: tuple[Request, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def num_tokens(self) -> int:
        """Query tokens in the step."""
        return sum(c.num_tokens for c in self.prefills) + len(self.decodes)

    @property
    def sampled_requests(self) -> tuple[Request, ...]:
        """Requests that get a token: sampling prefill chunks in order, then the decodes."""
        return tuple(c.request for c in self.prefills if c.samples) + self.decodes

    @property
    def sample_counts(self) -> tuple[int, ...]:
        """Sampled rows per `sampled_requests` entry: 1, or num_verify + 1 for a chunk that
        verifies a draft (its rows in position order)."""
        chunks = tuple(c.num_verify + 1 for c in self.prefills if c.samples)
        return chunks + (1,) * len(self.decodes)


class StepOutput(NamedTuple):
    """What `postprocess` did: tokens appended (request id, token id) and finished requests."""

    new_tokens: tuple[tuple[str, int], ...]
    finished: tuple[Request, ...]


@dataclass
class _StepBuilder:
    usable_s: float  # budget left after the fixed per-step cost
    live_cap_s: float
    tokens_left: int
    live_tokens_cap: int
    rows_left: int
    live_tokens: int = 0
    live_spent_s: float = 0.0
    upload_spent_s: float = 0.0
    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    admission_blocked: bool = False
    live_left_out: bool = False  # an upload turn kept live work out
    charges_encode: bool = False  # uploads pay for their encoder time (live steps)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    def budget_left_s(self, request_class: RequestClass) -> float:
        if request_class is RequestClass.LIVE:
            return self.live_cap_s - self.live_spent_s
        return self.usable_s - self.live_spent_s - self.upload_spent_s

    def tokens_left_for(self, request_class: RequestClass) -> int:
        if request_class is RequestClass.LIVE:
            return min(self.tokens_left, self.live_tokens_cap - self.live_tokens)
        return self.tokens_left

    def charge(self, request_class: RequestClass, cost_s: float, num_tokens: int) -> None:
        if request_class is RequestClass.LIVE:
            self.live_spent_s += cost_s
            self.live_tokens += num_tokens
        else:
            self.upload_spent_s += cost_s
        self.tokens_left -= num_tokens
        self.rows_left -= 1


def _windows_to_encode(request: Request, start: int, end: int) -> int:
    """The 30-s windows a prefill chunk of tokens [start, end) has the engine encode: those of
    its audio positions past `request.num_encoded_audio` (Engine._encode_scheduled) but for
    the ones the encoder's cache holds (`request.cached_audio_windows`)."""
    lo, hi = request.audio_span_in(start, end)
    lo = max(lo, request.num_encoded_audio)
    if lo >= hi:
        return 0
    # the windows whose first embedding to encode the chunk reaches: one walk for the charge
    # and the sizing (`_max_chunk_with_encode`), which must agree
    return sum(1 for _ in takewhile(lambda stop: stop < hi, _encode_stops(request, lo)))


def _encode_stops(request: Request, todo: int) -> Iterator[int]:
    """For a chunk whose first audio embedding still to encode is `todo`: in order, the first
    embedding of each window it would have the engine encode (`_windows_to_encode`), where a
    chunk that pays for the windows before it must stop (`todo` itself for its own window).
    Windows the encoder's cache holds (`request.cached_audio_windows`) are passed over."""
    cached = request.cached_audio_windows
    num_windows = -(-len(request.audio_positions) // TOKENS_PER_WINDOW)
    for w in range(todo // TOKENS_PER_WINDOW, num_windows):
        if w not in cached:
            yield max(todo, w * TOKENS_PER_WINDOW)


def _is_live_decode_row(request: Request) -> bool:
    """A running live request whose next step is a decode row (what decode-only steps take)."""
    live = request.request_class is RequestClass.LIVE
    return live and request.status is Status.RUNNING and request.is_decoding


class Scheduler:
    """Waiting/running queues over one BlockManager. See the module docstring for the policy.

    Life of a request: `add` -> (admitted) RUNNING -> prefill chunks -> decode rows ->
    FINISHED through `postprocess` (EOS: STOP; max_new_tokens or max_model_len: LENGTH;
    KV pool too small for the sequence: LENGTH) or `abort` (ABORT). A request with
    `retain_kv=True` keeps its KV after finishing (a retained cache, evictable under pressure)
    until `release`, `abort`, or a later `add(..., fork_from=its id)` takes it over.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        config: SchedulerConfig | None = None,
        cost_model: StepCostModel | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.config = config or SchedulerConfig()
        self.cost_model = cost_model or StepCostModel()
        self._requests: dict[str, Request] = {}  # unfinished, in order of add
        self._retained: dict[str, Request] = {}  # finished with KV kept, least recent first
        self._retain: set[str] = set()
        self._order: dict[str, int] = {}
        self._next_order = 0
        self._num_incoming_uploads = 0  # on their way to `add` (set_incoming_uploads)
        self._num_live_sessions = 0  # open live sessions (set_live_sessions)
        # s of estimated GPU time uploads are behind their share across steps, and s the
        # current run of upload turns has lasted (module docstring)
        self._upload_deficit_s = 0.0
        self._upload_turns_s = 0.0
        self._decode_only_steps = 0  # decode-only steps since the last step that prefilled
        self.num_accepted_draft_tokens = 0  # ids accepted by `accept_draft`, all requests
        self.num_preemptions = 0  # requests evicted under KV pressure (`_make_room`, `preempt`)
        self.num_retained_evictions = 0  # retained caches released by `_make_room`

    # -- queues ----------------------------------------------------------------------------

    @property
    def waiting(self) -> list[Request]:
        """Unadmitted requests (WAITING or PREEMPTED), highest priority first."""
        return [r for r in self._by_priority() if r.status is not Status.RUNNING]

    @property
    def running(self) -> list[Request]:
        """Admitted requests, highest priority first."""
        return [r for r in self._by_priority() if r.status is Status.RUNNING]

    @property
    def retained(self) -> list[Request]:
        """Finished requests whose KV is kept, least recently finished first."""
        return list(self._retained.values())

    def get(self, request_id: str) -> Request | None:
        """The unfinished or retained (finished, KV kept) request `request_id`; None otherwise."""
        return self._requests.get(request_id) or self._retained.get(request_id)

    def live_requests(self) -> list[Request]:
        """Every request that may hold KV blocks (for `BlockManager.audit`)."""
        return list(self._requests.values()) + list(self._retained.values())

    def has_work(self) -> bool:
        """True while any request is unfinished (waiting or running)."""
        return bool(self._requests)

    def request_counts(self) -> tuple[int, int, int]:
        """(running, waiting, retained) requests now; waiting includes preempted ones."""
        running = sum(r.status is Status.RUNNING for r in self._requests.values())
        return running, len(self._requests) - running, len(self._retained)

    @property
    def num_incoming_uploads(self) -> int:
        """Uploads on their way to `add`, as last told by `set_incoming_uploads`."""
        return self._num_incoming_uploads

    def is_holding(self, now_s: float) -> bool:
        """True when every unfinished request is a new upload held for company: `schedule(now_s)`
        would be empty, and only an `add`, `set_incoming_uploads` or time changes that."""
        return all(
            r.status is Status.WAITING and r.request_class is RequestClass.UPLOAD
            for r in self._requests.values()
        ) and self._hold_uploads(now_s)

    # -- commands --------------------------------------------------------------------------

    def add(
        self,
        request: Request,
        *,
        retain_kv: bool = False,
        fork_from: str | None = None,
        num_fork_tokens: int = 0,
    ) -> int:
        """Queue `request`; returns how many of its tokens reuse KV (0 without a fork).

        `fork_from`: a running or retained request whose first `num_fork_tokens` tokens'
        KV `request` shares (clamped to what the source has computed and to `verify_from`:
        all but the last token of `request`, which must be recomputed to sample, or with a
        draft all before the rows that verify it). A retained source is
        released afterwards. An unknown or evicted source just means no reuse.
        Raises InvalidRequest (duplicate id, a request that is not fresh), TooLong (the
        prompt does not fit the context or the whole KV pool) and BlockManagerError (the
        forked token ids differ).
        """
        rid = request.request_id
        if rid in self._requests or rid in self._retained:
            raise InvalidRequest(f"request id {rid!r} is already queued")
        if (
            request.status is not Status.WAITING
            or request.block_table
            or (request.num_computed_tokens or request.output_token_ids)
        ):
            raise InvalidRequest(f"request {rid!r} is not fresh (status {request.status.value})")
        if request.num_tokens >= self.config.max_model_len:
            raise TooLong(
                f"prompt of {request.num_tokens} tokens leaves no room in the "
                f"{self.config.max_model_len}-token context"
            )
        bm = self.block_manager
        if bm.num_blocks_for(request.num_tokens + 1) > bm.num_blocks:
            raise TooLong(
                f"prompt of {request.num_tokens} tokens needs more KV than the whole pool "
                f"({bm.num_blocks} blocks of {bm.block_size})"
            )
        reused = self._fork(request, fork_from, num_fork_tokens)
        self._requests[rid] = request
        self._order[rid] = self._next_order
        self._next_order += 1
        if retain_kv:
            self._retain.add(rid)
        return reused

    def abort(self, request_id: str) -> Request | None:
        """Stop a request at any phase and free its KV exactly once; also drops a retained
        cache. Returns the request, or None when the id is unknown (already finished)."""
        request = self._requests.get(request_id)
        if request is not None:
            self._finish(request, FinishReason.ABORT)
            return request
        if request_id in self._retained:
            return self.release(request_id)
        return None

    def advance_deadline(self, request_id: str, deadline_s: float) -> bool:
        """Bring an unfinished live request's deadline forward to `deadline_s` (s, the
        scheduler's clock; a later one leaves it as it is): from the next step it goes before
        the live requests due after it. Returns False when the id is not an unfinished live
        request."""
        request = self._requests.get(request_id)
        if request is None or request.request_class is not RequestClass.LIVE:
            return False
        if request.deadline_s is None or deadline_s < request.deadline_s:
            request.deadline_s = deadline_s
        return True

    def finish(self, request_id: str, reason: FinishReason) -> Request | None:
        """Finish an unfinished request now with `reason`, freeing (or retaining) its KV as
        `postprocess` would; for callers that learn of a stop token late (async decode).
        Returns the request, or None when the id is not unfinished."""
        request = self._requests.get(request_id)
        if request is not None:
            self._finish(request, reason)
        return request

    def release(self, request_id: str) -> Request | None:
        """Free a retained cache; returns it, or None when it is not retained."""
        request = self._retained.pop(request_id, None)
        if request is not None:
            self.block_manager.free(request)
        return request

    def set_incoming_uploads(self, count: int) -> None:
        """How many uploads are on their way to `add` (accepted upstream, not added yet); the
        PIPELINE upload hold waits for them. Raises SchedulerError for a negative count."""
        if count < 0:
            raise SchedulerError(f"incoming upload count must be >= 0, not {count}")
        self._num_incoming_uploads = count

    def set_live_sessions(self, count: int) -> None:
        """How many live sessions are open, hops queued or not; while any is, steps keep the
        short budget (module docstring). Raises SchedulerError for a negative count."""
        if count < 0:
            raise SchedulerError(f"live session count must be >= 0, not {count}")
        self._num_live_sessions = count

    def preempt(self, request_id: str) -> bool:
        """Evict an unfinished request's KV now (it will be recomputed); False if it holds
        none or is unknown. Not while its last token is an async step's placeholder (between
        `postprocess(pending=True)` and the engine's resolve): the recompute would prefill
        the placeholder. The scheduler's own evictions come in `schedule`, after the resolve
        (`ScheduledBatch.preempted_ids`); an engine's requests are evicted through
        `Engine.preempt`, which recounts their encoded audio. Raises SchedulerError while the
        last token is pending so (nothing is evicted)."""
        request = self._requests.get(request_id)
        if request is None or not request.block_table:
            return False
        if request.output_token_ids and request.output_token_ids[-1] == PENDING_TOKEN_ID:
            raise SchedulerError(
                f"cannot preempt {request_id!r}: its last token is still pending (async decode); "
                "preempt it once the step's tokens are resolved"
            )
        self._preempt(request)
        return True

    # -- one step --------------------------------------------------------------------------

    def schedule(self, now_s: float) -> ScheduledBatch:
        """Build the next step at time `now_s` (seconds on the engine's clock)."""
        hold_uploads = self._hold_uploads(now_s)
        # held uploads do not reserve a share: live work may use the whole step meanwhile
        can_run = self._upload_can_run(include_waiting=not hold_uploads)
        if not can_run or self.config.upload_min_share == 0:
            self._upload_deficit_s = 0.0  # bank no credit for uploads that cannot use it
        upload_turn = self._upload_deficit_s > 0 and self._upload_turns_s < self._max_turns_s()
        # sorted once: priorities do not change within a step (a retry skips what the empty
        # attempt finished or evicted)
        ordered = self._by_priority()
        decode_only = not upload_turn and self._decode_only_due(ordered)
        step = self._fill_step(ordered, hold_uploads, can_run, upload_turn, decode_only)
        if upload_turn and step.is_empty:
            # the uploads could not use their turn (no KV for their next token): an empty
            # step would repeat forever, so live work goes on (with what the empty one
            # finished or evicted, which must still be reported)
            self._upload_deficit_s = 0.0
            step = self._fill_step(ordered, hold_uploads, can_run, False, carried=step)
        elif decode_only and step.is_empty:  # no live decode row could take a slot (KV)
            decode_only = False
            step = self._fill_step(ordered, hold_uploads, can_run, upload_turn, carried=step)
        if any(c.request.request_class is RequestClass.LIVE for c in step.prefills):
            self._decode_only_steps = 0
        elif decode_only:
            self._decode_only_steps += 1
        cost_s = 0.0
        if not step.is_empty:
            cost_s = self.cost_model.fixed_s + step.live_spent_s + step.upload_spent_s
        if can_run:
            self._account_upload_share(step, cost_s)
        self._upload_turns_s = self._upload_turns_s + cost_s if step.live_left_out else 0.0
        return ScheduledBatch(
            now_s=now_s,
            prefills=tuple(step.prefills),
            decodes=tuple(step.decodes),
            preempted_ids=tuple(step.preempted),
            block_copies=tuple(self.block_manager.take_copies()),
            estimated_cost_s=cost_s,
            upload_turn=step.live_left_out,
            finished=tuple(step.finished),
        )

    def charges_encode(self) -> bool:
        """Whether the next step charges an upload's chunk for the windows it has the engine
        encode: it has the short budget of live work (`_on_live_budget`; module docstring).
        The engine tells uploads which windows are cached only for such a step."""
        return self._on_live_budget()

    def current_step_budget_s(self) -> float:
        """The estimated GPU time the next step may take: `step_budget_s` while a live session
        is open, a live request queued or a live cache retained (`_on_live_budget`), else
        `upload_step_budget_s` (module docstring)."""
        return self._budget_s(self._on_live_budget())

    def _budget_s(self, live: bool) -> float:
        return self.config.step_budget_s if live else self.config.upload_step_budget_s

    def _on_live_budget(self) -> bool:
        return (
            self._num_live_sessions > 0
            or any(r.request_class is RequestClass.LIVE for r in self._requests.values())
            or any(r.request_class is RequestClass.LIVE for r in self._retained.values())
        )

    def postprocess(
        self, batch: ScheduledBatch, sampled_token_ids: Sequence[int], *, pending: bool = False
    ) -> StepOutput:
        """Account a finished step: advance computed tokens, append sampled tokens, finish.

        `sampled_token_ids` holds `batch.sample_counts[i]` ids for `batch.sampled_requests[i]`,
        in order; a chunk that verifies a draft is accepted here (`accept_draft`). With
        `pending` (async decode) the ids are placeholders: decode rows and plain chunks get
        theirs appended, and a verifying request waits, unchanged, for `accept_draft` with
        the real ids. Requests aborted or evicted while the step was in flight are skipped.
        Raises SchedulerError when the count of sampled tokens does not match the batch.
        """
        sampled = batch.sampled_requests
        counts = batch.sample_counts
        if len(sampled_token_ids) != sum(counts):
            raise SchedulerError(
                f"{len(sampled_token_ids)} sampled tokens for {sum(counts)} sampling rows"
            )
        intact: set[str] = set()
        for chunk in batch.prefills:
            if self._still_owns(chunk.request, chunk.start):
                chunk.request.num_computed_tokens += chunk.num_tokens
                intact.add(chunk.request.request_id)
        for request in batch.decodes:
            if self._still_owns(request, request.num_tokens - 1):
                request.num_computed_tokens += 1
                intact.add(request.request_id)
        new_tokens: list[tuple[str, int]] = []
        finished: list[Request] = []
        first = 0
        for request, count in zip(sampled, counts, strict=True):
            values, first = sampled_token_ids[first : first + count], first + count
            rid = request.request_id
            if rid not in intact or (count > 1 and pending):
                continue
            if count > 1:
                tokens, reason = self.accept_draft(request, values)
            else:
                request.append_token(values[0])
                tokens, reason = [values[0]], self._finish_reason(request, values[0])
                if reason is not None:
                    self._finish(request, reason)
            new_tokens.extend((rid, t) for t in tokens)
            if reason is not None:
                finished.append(request)
        return StepOutput(tuple(new_tokens), tuple(finished))

    def is_verifying(self, request: Request) -> bool:
        """True when `request` is unfinished, holds the KV of its whole prompt and its draft
        is not verified yet: `accept_draft` applies (after async decode's placeholders; a
        request evicted since is recomputed and verified again instead)."""
        return (
            self._requests.get(request.request_id) is request
            and request.status is Status.RUNNING
            and request.num_draft_tokens > 0
            and not request.output_token_ids
            and request.num_computed_tokens == request.num_tokens
        )

    def accept_draft(
        self, request: Request, values: Sequence[int]
    ) -> tuple[list[int], FinishReason | None]:
        """Verify `request`'s draft of k ids with `values`, the k + 1 greedy samples of its
        verifying chunk (values[i] follows the prompt and draft[:i]). Accepts the longest
        prefix draft[:j] that equals values[:j] and the sample after it: the outputs become
        values[:j + 1] (cut at a stop token or the length limit, which finish the request);
        the draft leaves the prompt and the KV past the outputs but the last is truncated
        (`num_accepted_draft_tokens`: outputs - 1, the decode steps saved). Returns the
        tokens appended and the finish reason (None while it goes on decoding). Raises
        SchedulerError unless `is_verifying(request)` and len(values) == k + 1."""
        k = request.num_draft_tokens
        if not self.is_verifying(request) or len(values) != k + 1:
            raise SchedulerError(
                f"{request.request_id!r}: cannot verify {len(values)} samples against its "
                f"{k}-id draft in state {request.status.value}"
            )
        base = request.num_prompt_tokens - k
        draft = request.prompt_token_ids[base:]
        j = 0
        while j < k and values[j] == draft[j]:
            j += 1
        request.prompt_token_ids = request.prompt_token_ids[:base]
        request.num_draft_tokens = 0
        tokens: list[int] = []
        reason = None
        for token_id in values[: j + 1]:
            request.append_token(token_id)
            tokens.append(token_id)
            reason = self._finish_reason(request, token_id)
            if reason is not None:
                break
        # the outputs but the last have KV (draft ids the chunk computed), as after decoding
        # them one by one; a stop or the limit may come before all j accepted ids
        request.num_accepted_draft_tokens = len(tokens) - 1
        self.num_accepted_draft_tokens += request.num_accepted_draft_tokens
        self.block_manager.truncate(request, request.num_tokens - 1)
        if reason is not None:
            self._finish(request, reason)
        return tokens, reason

    # -- filling one step ------------------------------------------------------------------

    def _decode_only_due(self, ordered: Sequence[Request]) -> bool:
        """Whether the next step holds live decode rows only: fewer than `live_decode_steps`
        of them since the last step that prefilled live work, and the most urgent live
        request (the first of `ordered`, by priority: live requests come first) is decoding
        (module docstring)."""
        if self._decode_only_steps >= self.config.live_decode_steps or not ordered:
            return False
        return _is_live_decode_row(ordered[0])

    def _fill_step(
        self,
        ordered: Sequence[Request],
        hold_uploads: bool,
        can_run: bool,
        upload_turn: bool,
        decode_only: bool = False,
        carried: _StepBuilder | None = None,
    ) -> _StepBuilder:
        """Take requests in priority order until the step's budget, tokens or rows run out.
        In an upload turn live requests add no rows (module docstring); a decode-only step
        takes live decode rows only. `ordered`: the unfinished requests by priority. `carried`:
        an empty attempt at this step, whose finished and evicted requests the step reports."""
        cfg = self.config
        live = self._on_live_budget()  # once: it walks every request
        usable = max(0.0, self._budget_s(live) - self.cost_model.fixed_s)
        share = cfg.upload_min_share if can_run else 0.0
        step = _StepBuilder(
            usable_s=usable,
            live_cap_s=usable * (1 - share),
            tokens_left=cfg.max_num_batched_tokens,
            live_tokens_cap=int(cfg.max_num_batched_tokens * (1 - share)),
            rows_left=cfg.max_num_seqs,
            charges_encode=live,
        )
        if carried is not None:
            step.preempted.extend(carried.preempted)
            step.finished.extend(carried.finished)
        for request in ordered:
            if step.rows_left == 0 or step.tokens_left == 0:
                break
            if request.is_finished or request.request_id in step.preempted:
                continue  # finished for lack of KV, or evicted earlier in this step
            if upload_turn and request.request_class is RequestClass.LIVE:
                # the turn is the uploads' alone: a live decode row riding along would take
                # most of a turn at long context and move later-deadline hops ahead of an
                # urgent prefill, while the uploads' time barely moved
                step.live_left_out = True
            elif decode_only and not _is_live_decode_row(request):
                continue
            elif request.status is Status.RUNNING and request.is_decoding:
                self._try_decode(request, step)
            elif request.status is Status.RUNNING:
                self._try_prefill(request, step)
            elif (
                hold_uploads and request.request_class is RequestClass.UPLOAD and not step.prefills
            ):
                continue  # held; a step that prefills anyway (eager) would take it
            elif not step.admission_blocked:
                self._try_admit(request, step)
        return step

    def _max_turns_s(self) -> float:
        """Estimated s a run of upload turns may last: the share's part of one step budget,
        share / (1 - share) of it (5 ms at 0.25 and 15-ms steps), so live work waits at most
        that (and the turn crossing it) per live step."""
        share = self.config.upload_min_share
        return share / (1 - share) * self.config.step_budget_s

    def _account_upload_share(self, step: _StepBuilder, cost_s: float) -> None:
        """Move the upload deficit by one step of `cost_s` estimated seconds: it gains
        share / (1 - share) of the live time and loses the upload time, within
        +-step_budget_s (one step's worth of credit either way, never more)."""
        share = self.config.upload_min_share
        # the fixed cost is split by the rows' costs (an upload turn holds no live rows)
        rows_s = step.live_spent_s + step.upload_spent_s
        live_s = cost_s * step.live_spent_s / rows_s if rows_s > 0 else 0.0
        deficit_s = self._upload_deficit_s + share / (1 - share) * live_s - (cost_s - live_s)
        cap_s = self.config.step_budget_s
        self._upload_deficit_s = min(cap_s, max(-cap_s, deficit_s))

    # -- scheduling one request ------------------------------------------------------------

    def _ended_for_the_pool(self, request: Request, step: _StepBuilder) -> bool:
        """End `request` for length if the whole pool cannot hold its tokens (its last one
        sampled, with no KV yet): running, or evicted just as it outgrew the pool (waiting, it
        never fit and blocked every admission behind it: a fuzzer's stall)."""
        bm = self.block_manager
        if bm.num_blocks_for(request.num_tokens) <= bm.num_blocks:
            return False
        self._finish(request, FinishReason.LENGTH)
        step.finished.append(request)
        return True

    def _try_decode(self, request: Request, step: _StepBuilder) -> None:
        if self._ended_for_the_pool(request, step):
            return
        cost_s = self.cost_model.decode_cost_s(request.num_tokens)
        cls = request.request_class
        if not step.is_empty and (
            cost_s > step.budget_left_s(cls) or step.tokens_left_for(cls) < 1
        ):
            return
        if not self._make_room(request, request.num_tokens, step):
            return
        self.block_manager.append_slot(request)
        step.decodes.append(request)
        step.charge(request.request_class, cost_s, 1)

    def _try_prefill(self, request: Request, step: _StepBuilder) -> None:
        num_tokens = self._chunk_size(request, step)
        if num_tokens == 0:
            return
        start = request.num_computed_tokens
        assert len(request.block_table) >= self.block_manager.num_blocks_for(start + num_tokens)
        samples = start + num_tokens == request.num_tokens
        verify = request.num_draft_tokens if samples else 0
        step.prefills.append(PrefillChunk(request, start, num_tokens, samples, verify))
        cost_s = self.cost_model.prefill_cost_s(start, num_tokens)
        if self._charges_encode(request, step):
            windows = _windows_to_encode(request, start, start + num_tokens)
            cost_s += self.cost_model.encode_cost_s(windows)
        step.charge(request.request_class, cost_s, num_tokens)

    def _try_admit(self, request: Request, step: _StepBuilder) -> None:
        if self._ended_for_the_pool(request, step):
            return
        if self._chunk_size(request, step) == 0:
            return  # no budget to start it; do not take its memory yet
        if not self._make_room(request, request.num_tokens, step):
            step.admission_blocked = True
            return
        self.block_manager.allocate(request)
        request.status = Status.RUNNING
        self._try_prefill(request, step)

    def _chunk_size(self, request: Request, step: _StepBuilder) -> int:
        cfg = self.config
        start = request.num_computed_tokens
        remaining = request.num_tokens - start
        limit = min(
            remaining, cfg.chunked_prefill_size, step.tokens_left_for(request.request_class)
        )
        budget_s = step.budget_left_s(request.request_class)
        if self._charges_encode(request, step):
            n = self._max_chunk_with_encode(request, budget_s, limit)
        else:
            n = self.cost_model.max_prefill_tokens(start, budget_s, limit)
        if n < remaining and n < cfg.min_prefill_chunk:
            n = min(limit, cfg.min_prefill_chunk) if step.is_empty else 0
        if request.num_draft_tokens and 0 < n < remaining and start + n > request.verify_from:
            # the sampling chunk must hold every row that verifies the draft: stop before
            # them, or take them all (at most MAX_DRAFT_TOKENS + 1, < 1 ms at 30k context)
            # even a little over the time budget and the live share of tokens, which a
            # large draft could otherwise never fit beside a running upload
            n = request.verify_from - start
            if n <= 0:
                fits = remaining <= min(cfg.chunked_prefill_size, step.tokens_left)
                n = remaining if fits else 0
        return n

    def _max_chunk_with_encode(self, request: Request, budget_s: float, limit: int) -> int:
        """Largest n <= limit whose prefill chunk from `request.num_computed_tokens`, with the
        whole windows it has the engine encode (`_windows_to_encode`, what `_try_prefill`
        charges), costs at most `budget_s`. With k windows paid for, the chunk may run up to
        the position of the first audio embedding of the (k + 1)-th window still to encode
        (`_encode_stops`); k grows while the budget left for prefill reaches past it."""
        cost, positions = self.cost_model, request.audio_positions
        start = request.num_computed_tokens
        first, _ = request.audio_span_in(start, start)
        todo = max(first, request.num_encoded_audio)  # first audio embedding still to encode
        stops = _encode_stops(request, todo)
        best, k = 0, 0
        while (left_s := budget_s - cost.encode_cost_s(k)) > 0:
            stop = next(stops, len(positions))
            reach = limit if stop >= len(positions) else min(limit, int(positions[stop]) - start)
            n = min(reach, cost.max_prefill_tokens(start, left_s, limit))
            best = max(best, n)
            if n < reach or reach == limit:
                break  # another window only takes budget: no longer chunk fits
            k += 1
        return best

    @staticmethod
    def _charges_encode(request: Request, step: _StepBuilder) -> bool:
        """Whether `request`'s chunks in `step` pay for encoding its audio: an upload with
        windows still to encode, in a step on the live budget (between uploads alone the
        encoder's time only moves work between their own steps)."""
        return (
            step.charges_encode
            and request.request_class is RequestClass.UPLOAD
            and request.num_encoded_audio < len(request.audio_positions)
        )

    # -- memory pressure -------------------------------------------------------------------

    def _make_room(self, request: Request, num_tokens: int, step: _StepBuilder) -> bool:
        """Evict retained caches, then lower-priority requests (lowest first), until
        `request` can hold `num_tokens` tokens. Evicts nothing when that cannot succeed."""
        bm = self.block_manager
        if bm.blocks_needed(request, num_tokens) <= bm.num_free_blocks:
            return True
        victims = self._victims(request)
        if not bm.fits_after_freeing(request, num_tokens, victims):
            return False
        # what is freed here is for `request`: admitting others later in this step would
        # only be evicted again by the requests just preempted
        step.admission_blocked = True
        for victim in victims:
            if victim.is_finished:
                self.release(victim.request_id)
                self.num_retained_evictions += 1
            else:
                self._preempt(victim)
                step.preempted.append(victim.request_id)
            if bm.blocks_needed(request, num_tokens) <= bm.num_free_blocks:
                return True
        return False

    def _victims(self, request: Request) -> list[Request]:
        key = self._priority_key(request)
        lower = [
            r
            for r in self._requests.values()
            if r.block_table and r is not request and self._priority_key(r) > key
        ]
        lower.sort(key=self._priority_key, reverse=True)
        return list(self._retained.values()) + lower

    def _preempt(self, request: Request) -> None:
        assert not request.is_finished
        self.block_manager.free(request)
        request.status = Status.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1

    # -- helpers ---------------------------------------------------------------------------

    def _fork(self, request: Request, fork_from: str | None, num_fork_tokens: int) -> int:
        if fork_from is None or num_fork_tokens <= 0:
            return 0
        source = self._requests.get(fork_from) or self._retained.get(fork_from)
        if source is None or not source.block_table:
            return 0
        # the rows that verify a draft are computed by the request itself
        n = min(num_fork_tokens, source.num_computed_tokens, request.verify_from)
        if n <= 0:
            return 0
        self.block_manager.fork(source, request, n)
        if fork_from in self._retained:
            self.release(fork_from)
        return n

    def _finish(self, request: Request, reason: FinishReason) -> None:
        rid = request.request_id
        request.status = Status.FINISHED
        request.finish_reason = reason
        del self._requests[rid]
        self._order.pop(rid, None)
        keep = rid in self._retain and reason is not FinishReason.ABORT and request.block_table
        self._retain.discard(rid)
        if keep:
            self._retained[rid] = request
        else:
            self.block_manager.free(request)

    def _finish_reason(self, request: Request, token_id: int) -> FinishReason | None:
        if not request.ignore_eos and token_id == self.config.eos_token_id:
            return FinishReason.STOP
        if request.num_output_tokens >= request.max_new_tokens:
            return FinishReason.LENGTH
        if request.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def _still_owns(self, request: Request, start: int) -> bool:
        """True if the step's results still apply: same request object, not finished or
        evicted since, and its computed tokens are where the step started."""
        return (
            self._requests.get(request.request_id) is request
            and request.status is Status.RUNNING
            and request.num_computed_tokens == start
        )

    def _hold_uploads(self, now_s: float) -> bool:
        """Whether waiting uploads stay out of this step (module docstring: upload batching):
        some wait, none has waited `upload_batch_wait_s` or was preempted (it already waited),
        their prompts do not fill a step's token limit already (no more could join that step),
        and fewer wait than decode or (PIPELINE) more are on their way."""
        wait_s = self.config.upload_batch_wait_s
        if wait_s <= 0:
            return False
        num_waiting = num_decoding = waiting_tokens = 0
        for r in self._requests.values():
            if r.status is Status.RUNNING:
                num_decoding += r.is_decoding
            elif r.request_class is RequestClass.UPLOAD:
                if r.status is Status.PREEMPTED or now_s - r.arrival_s >= wait_s:
                    return False
                num_waiting += 1
                waiting_tokens += r.num_prompt_tokens
        if num_waiting == 0 or waiting_tokens >= self.config.max_num_batched_tokens:
            return False
        if num_waiting < num_decoding:
            return True
        return self.config.upload_hold == UploadHold.PIPELINE and self._num_incoming_uploads > 0

    def _upload_can_run(self, *, include_waiting: bool = True) -> bool:
        bm = self.block_manager
        return any(
            r.request_class is RequestClass.UPLOAD
            and (
                r.status is Status.RUNNING
                or ((include_waiting or r.status is Status.PREEMPTED) and bm.can_allocate(r))
            )
            for r in self._requests.values()
        )

    def _priority_key(self, request: Request) -> tuple[int, float, float, int]:
        if request.request_class is RequestClass.LIVE:
            deadline = math.inf if request.deadline_s is None else request.deadline_s
            return (0, deadline, request.arrival_s, self._order.get(request.request_id, -1))
        return (1, 0.0, request.arrival_s, self._order.get(request.request_id, -1))

    def _by_priority(self) -> list[Request]:
        return sorted(self._requests.values(), key=self._priority_key)
