"""Typed messages that cross the gateway <-> engine process boundary (pickled over queues).

Commands go to the engine worker; `SessionEvent`s and status messages (`WorkerReady`,
`WorkerFailed`, `EngineStats`, `SharedAudioConsumed`) come back. Names follow DESIGN.md
section 3. Audio crosses as float32 numpy arrays at 16 kHz: inside `AppendAudio`, or, for an
array of at least SHARED_AUDIO_MIN_BYTES sent to a worker process, in a shared-memory block that
`AppendSharedAudio` names (livemeet/engine/shared_audio.py: who owns the block when).
"""

from __future__ import annotations

from dataclasses import dataclass

from livemeet.transcriber import BackendInfo, Event, Samples, SessionOptions


@dataclass(frozen=True)
class OpenSession:
    """Open session `session_id` with `options`; its events come back as `SessionEvent`s."""

    session_id: str
    options: SessionOptions


@dataclass(frozen=True)
class AppendAudio:
    """`sent_s`: the gateway's `time.monotonic()` when it queued the command (0: unknown). The
    clock is system-wide (CLOCK_MONOTONIC on Linux), so the worker's time at applying it less
    `sent_s` is the command's wait in the queue and the pipe (EngineStats.audio_command_lag_s)."""

    session_id: str
    samples: Samples  # [n] float32, 16 kHz mono
    sent_s: float = 0.0


@dataclass(frozen=True)
class AppendSharedAudio:
    """`AppendAudio` whose samples wait in shared-memory block `block_name`; the worker copies
    them out and answers `SharedAudioConsumed`, and the gateway unlinks the block."""

    session_id: str
    block_name: str  # POSIX shared-memory object name (a file in /dev/shm)
    num_samples: int  # samples at the start of the block (16 kHz mono)
    dtype: str  # numpy dtype string of the samples ("<f4")
    sent_s: float = 0.0  # as AppendAudio.sent_s


@dataclass(frozen=True)
class FinalizeSession:
    """`TranscriberSession.finalize`: commit what the session has heard; it stays open."""

    session_id: str


@dataclass(frozen=True)
class MergeSpeakers:
    """A live session's speaker merge (`TranscriberSession.merge_speakers`)."""

    session_id: str
    speaker: str  # the label merged away
    into: str  # the label it shows as from now on


@dataclass(frozen=True)
class EndSession:
    """`TranscriberSession.end`: no more audio; the session's `TranscriptFinal` follows."""

    session_id: str


@dataclass(frozen=True)
class AbortSession:
    """`TranscriberSession.abort`: free the session now; no more of its events are sent."""

    session_id: str


@dataclass(frozen=True)
class IncomingUploads:
    """How many uploads the gateway has accepted and not yet handed to the engine (receiving
    the body, probing, waiting for or in a decode slot, opening their session); the
    scheduler's upload hold waits for them.
    Sent when the count changes, and always ahead of any later command, so an upload's
    `EndSession` finds a count that no longer includes it."""

    count: int


@dataclass(frozen=True)
class Shutdown:
    """Stop the worker after freeing every session."""


Command = (
    OpenSession
    | AppendAudio
    | AppendSharedAudio
    | FinalizeSession
    | MergeSpeakers
    | EndSession
    | AbortSession
    | IncomingUploads
    | Shutdown
)


@dataclass(frozen=True)
class WorkerReady:
    """The backend loaded; the worker accepts sessions."""

    info: BackendInfo


@dataclass(frozen=True)
class WorkerFailed:
    """The worker could not start or crashed; `code`/`message` as in livemeet.errors."""

    code: str
    message: str


@dataclass(frozen=True)
class SharedAudioConsumed:
    """The worker copied block `block_name` out (whether or not its session then took the
    samples); the gateway may unlink it."""

    block_name: str


@dataclass(frozen=True)
class SessionEvent:
    """One `event` of session `session_id`, in the session's order."""

    session_id: str
    event: Event


STEP_PARTS = ("schedule", "encode", "launch", "wait", "other")  # EngineStats.host_s parts


@dataclass(frozen=True)
class EngineStats:
    """Cumulative step counters and host seconds of the engine since its worker started (a
    restart resets them).

    A step is one forward over a non-empty scheduled batch. It is a prefill step when it holds
    at least one prefill chunk (decode rows may ride along: a mixed step), else a decode step.
    A decode step is a graph step when it replayed the decode graphs (`GraphRunner`); one that
    could not is eager and a fallback when decode graphs exist, even if it then ran on the
    piecewise graphs. A prefill step is a graph step when it replayed the piecewise graphs
    (`PiecewiseRunner`), or the decode graphs (every row of the step had one query token).
    Host seconds inside `Engine.step`, by part (STEP_PARTS): `schedule` (Scheduler.schedule),
    `encode` (the audio of requests prefilled for the first time), `launch` (building and
    enqueueing the forward and sampling; the JIT, allocator and library set-up a new shape may
    need happen here), `wait` (for sampled ids on the host: the device time the host could not
    overlap; with async decode, the previous step's), `other` (postprocess, bookkeeping).
    They sum to the time spent stepping, so time outside them is the worker's own (commands,
    events) or idle. A step of at least ENGINE_SLOW_STEP_S counts in `num_slow_steps` and is
    logged with its parts and shape.
    `num_encoded_windows` counts the 30-s windows the encoder computed (cache hits excluded);
    `num_live_hops` and `live_hop_s` the live decodes that finished and their summed engine
    time from submission to end (the backend's: MossCore), whose ratio is the mean hop time a
    live session waits for, and which grows when live serving falls behind;
    `live_forced_tokens` the forced-transcript tokens of the hops submitted, summed (their
    budget adapts to load: livemeet/session/forced_budget.py).
    `live_hop_wait_s`: the hops' summed wait from being due (step() first found the session's
    hop due) to submission, a queue in front of the engine that `live_hop_s` does not see.
    `live_hop_first_token_s`: the finished hops' summed time from submission to their first
    sampled id (encode, the wait for a step, prefill); the rest of `live_hop_s` is decoding,
    one step per new id.
    `num_draft_tokens` and `num_accepted_draft_tokens`: draft ids added with requests and
    those their verifying chunks accepted (livemeet.engine.request: draft verification).
    `num_upload_continuations`: uploads whose decode stopped well before their audio's end
    and was continued (DESIGN 5.8; the backend's: MossCore).
    `num_live_endpoint_hops`: live hops submitted before a whole hop of new audio because the
    session's VAD heard speech end (livemeet/session/vad.py; the backend's: MossCore).
    `num_audio_commands`, `audio_command_lag_s` and `audio_command_lag_max_s` (the worker's):
    audio commands applied with a send time, their summed and their longest wait from the
    gateway's queue to the worker (AppendAudio.sent_s); audio that waits there is heard late
    by every hop, so a lag that grows is live latency that grows.
    `num_gc_collections`, `num_gc_full_collections`, `gc_pause_s` and `gc_pause_max_s` (the
    worker's, livemeet/engine/gc_pauses.py): the garbage collector's runs in the engine
    process, those of the oldest generation, their summed and their longest time; the engine
    thread launches nothing meanwhile.
    `num_preemptions`: requests evicted under KV pressure, to be recomputed later;
    `num_retained_evictions`: finished live hops' retained KV released under pressure (the
    next hop then prefills what it would have forked). The rest are gauges, as of the post:
    `kv_blocks_total` and `kv_blocks_used` (blocks held by any request, retained ones
    included), and the requests `num_running_requests` (admitted), `num_waiting_requests`
    (waiting or preempted) and `num_retained_requests` (finished, KV kept for the next hop).
    The worker posts these at most every ENGINE_STATS_INTERVAL_S while it steps, and once when
    it goes idle.
    """

    num_decode_graph_steps: int = 0  # steps; decode-only steps replayed on the decode graphs
    num_decode_eager_steps: int = 0  # steps; decode-only steps run without them
    num_prefill_graph_steps: int = 0  # steps; steps with a prefill replayed on CUDA graphs
    num_prefill_eager_steps: int = 0  # steps; steps with a prefill run eagerly
    num_decode_graph_fallbacks: int = 0  # steps; decode eager steps although decode graphs exist
    num_prefill_tokens: int = 0  # tokens; computed by prefill chunks (cache hits excluded)
    num_decode_tokens: int = 0  # tokens; decode rows computed (one new token each)
    num_slow_steps: int = 0  # steps; steps that took at least ENGINE_SLOW_STEP_S
    schedule_s: float = 0.0  # s; host time by part (see above)
    encode_s: float = 0.0
    launch_s: float = 0.0
    wait_s: float = 0.0
    other_s: float = 0.0
    num_encoded_windows: int = 0  # windows; computed by the encoder (cache hits excluded)
    num_live_hops: int = 0  # live decodes finished (set by the backend)
    live_hop_s: float = 0.0  # s; their summed time from submission to end (engine clock)
    live_forced_tokens: int = 0  # tokens; forced transcript the live hops submitted prefilled
    live_hop_wait_s: float = 0.0  # s; the hops' summed wait from due to submission
    live_hop_first_token_s: float = 0.0  # s; their summed time to the first sampled id
    num_upload_continuations: int = 0  # requests; uploads continued after an early stop
    num_live_endpoint_hops: int = 0  # live hops due early: their session's speech ended
    num_draft_tokens: int = 0  # ids; drafts the requests carried (draft verification)
    num_accepted_draft_tokens: int = 0  # ids; of them, accepted: decode steps saved
    num_audio_commands: int = 0  # commands; audio appends applied that carried a send time
    audio_command_lag_s: float = 0.0  # s; their summed wait from the gateway's queue
    audio_command_lag_max_s: float = 0.0  # s; the longest such wait since the worker started
    num_gc_collections: int = 0  # collections of any generation in the engine process
    num_gc_full_collections: int = 0  # of them, of the oldest generation
    gc_pause_s: float = 0.0  # s; their summed time
    gc_pause_max_s: float = 0.0  # s; the longest since the worker started
    num_preemptions: int = 0  # requests; evicted under KV pressure (recomputed later)
    num_retained_evictions: int = 0  # retained KV caches released under KV pressure
    kv_blocks_total: int = 0  # blocks; gauge: the KV pool
    kv_blocks_used: int = 0  # blocks; gauge: held by any request (retained ones included)
    num_running_requests: int = 0  # gauge: admitted requests
    num_waiting_requests: int = 0  # gauge: waiting or preempted requests
    num_retained_requests: int = 0  # gauge: finished requests whose KV is kept

    @property
    def num_decode_steps(self) -> int:
        return self.num_decode_graph_steps + self.num_decode_eager_steps

    @property
    def num_prefill_steps(self) -> int:
        return self.num_prefill_graph_steps + self.num_prefill_eager_steps

    @property
    def num_steps(self) -> int:
        return self.num_decode_steps + self.num_prefill_steps

    @property
    def host_s(self) -> dict[str, float]:
        """Host seconds by part, in STEP_PARTS order."""
        return {part: getattr(self, f"{part}_s") for part in STEP_PARTS}


WorkerMessage = WorkerReady | WorkerFailed | SessionEvent | EngineStats | SharedAudioConsumed
