"""Frozen configuration dataclasses. They hold settings only, never runtime values.

Each is validated by `validate()`, which raises ConfigError with an actionable message.
CLI flags are generated from these fields (livemeet/__main__.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from livemeet.audio.constants import (
    CHUNKED_PREFILL_SIZE,
    KV_BLOCK_SIZE,
    KV_BLOCK_SIZES,
    KV_CACHE_DTYPES,
    LIVE_DECODE_STEPS,
    LIVE_FORCED_BUDGET_SLOW_FRACTION,
    LIVE_FORCED_TRANSCRIPT_MIN_TOKENS,
    LIVE_FORCED_TRANSCRIPT_TOKENS,
    LIVE_HOP_MAX_S,
    LIVE_HOP_MIN_S,
    LIVE_HOP_S,
    LIVE_MAX_SPEED,
    LIVE_RESUME_WINDOW_S,
    LIVE_STEP_BUDGET_S,
    MAX_AUDIO_S,
    MAX_CONTEXT_TOKENS,
    MAX_LIVE_DECODE_STEPS,
    MAX_LIVE_HOP_LOAD,
    MAX_LIVE_SESSIONS_PER_CLIENT,
    MAX_LIVE_STEP_BUDGET_S,
    MAX_UPLOAD_BYTES,
    MAX_UPLOAD_MIN_SHARE,
    MAX_UPLOAD_STEP_BUDGET_S,
    MIN_FREE_DISK_MB,
    MIN_LIVE_HOP_LOAD,
    MIN_LIVE_STEP_BUDGET_S,
    MIN_PREFILL_CHUNK,
    UPLOAD_BATCH_WAIT_S,
    UPLOAD_DRAIN_S,
    UPLOAD_MIN_SHARE,
    UPLOAD_SPILL_TOTAL_BYTES,
    UPLOAD_STEP_BUDGET_S,
)
from livemeet.errors import ConfigError
from livemeet.gateway.origin import check_allowed_origin
from livemeet.session.forced_budget import ForcedBudget
from livemeet.session.vad import LiveVad

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # serve and its engine process
MAX_MEM_FRACTION = 0.95  # leaves >= 7 GB of an H200 for CUDA graphs, the encoder, activations
MAX_UPLOAD_BATCH_WAIT_MS = 1000.0  # ms; holding an upload longer only adds latency


class UploadHold(StrEnum):
    """What the engine's scheduler waits for before prefilling new uploads together (its upload
    batching, livemeet.engine.scheduler), always for at most the upload batch wait.

    `ARRIVALS`: while requests decode, until as many uploads wait as decode.
    `PIPELINE`: that, and also (even on an idle engine) while the gateway still has uploads on
    their way to the engine (receiving the body or decoding audio), so a wave of uploads that
    reaches the engine spread over the gateway's decode slots is prefilled together.
    """

    ARRIVALS = "arrivals"
    PIPELINE = "pipeline"


_Choice = TypeVar("_Choice", bound=StrEnum)


def parse_choice(kind: type[_Choice], value: str, name: str) -> _Choice:
    """`value` as a member of the string enum `kind`. Raises ConfigError naming the setting
    (`name`) and the choices."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise ConfigError(f"{name} must be one of {choices}, not {value!r}") from None


def flag_number(value: float) -> str:
    """A float flag's value as a message names it, as the operator wrote it: a whole number
    without an exponent or ".0" (`%g` logged --min-free-disk-mb 100000000 as 1e+08: a
    trial), any other the shortest decimal that reads back as the value (0.5, 1e-07)."""
    # float(): a config made in Python may hold an int, which has no is_integer() in 3.11
    if math.isfinite(value) and float(value).is_integer():
        return f"{value:.0f}"
    return repr(value)


def amount(value: float, unit: str) -> str:
    """`value` `unit`s in a message, the unit singular for exactly one ("1 day", "0.5 days",
    "20 stored transcripts"; "1 days" read as a slip: a trial)."""
    return f"{flag_number(value)} {unit}{'' if value == 1 else 's'}"


def parse_upload_hold(value: str) -> UploadHold:
    """`value` as an UploadHold. Raises ConfigError naming the choices."""
    return parse_choice(UploadHold, value, "--upload-hold")


def parse_live_vad(value: str) -> LiveVad:
    """`value` as a LiveVad. Raises ConfigError naming the choices."""
    return parse_choice(LiveVad, value, "--live-vad")


class AuthMode(StrEnum):
    """Whether the gateway asks for an API key (`serve --auth`; livemeet/gateway/auth.py).

    `AUTO`: keys are required once the key store holds any key, active or revoked (a server
    without keys stays open; revoking the last key does not open it again).
    `KEYS`: always required (no key in the store: nobody gets in).
    `OFF`: never asked for; the server is open.
    """

    AUTO = "auto"
    KEYS = "keys"
    OFF = "off"


def parse_auth_mode(value: str) -> AuthMode:
    """`value` as an AuthMode. Raises ConfigError naming the choices."""
    return parse_choice(AuthMode, value, "--auth")


@dataclass(frozen=True)
class ModelConfig:
    """Which backend serves and how it is loaded.

    `model`: None selects the demo backend (Whisper tiny.en); a local directory or a hub id
    selects MOSS-TD. `backend` forces a registered backend name ("demo", "moss", "scripted").
    `load_format`: "auto" reads safetensors; "dummy" builds real-size random weights.
    `device`: "auto" picks CUDA when available. `dtype`: "auto" is bf16 on CUDA, fp32 on CPU.
    """

    model: str | None = None
    backend: str | None = None
    load_format: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    forced_output: str | None = None  # path of a reference transcript to force (benchmarks)
    num_kv_blocks: int | None = None  # KV pool size in blocks; None sizes it from memory
    kv_cache_dtype: str = "auto"  # "auto" (model dtype) or "fp8_e4m3"
    kv_block_size: int = KV_BLOCK_SIZE  # tokens per paged-KV block, one of KV_BLOCK_SIZES
    max_new_tokens: int | None = None  # cap on output tokens per request (None: duration-scaled)
    prefill_graphs: bool = True  # piecewise CUDA graphs for steps that prefill (CUDA only)
    # of the GPU's memory that weights + KV pool may fill; graphs and activations use the rest
    mem_fraction: float = 0.85
    chunked_prefill_size: int = CHUNKED_PREFILL_SIZE  # tokens; largest prefill chunk per step
    # ms a new upload may wait to be prefilled with later arrivals (what it waits for:
    # `upload_hold`; livemeet.engine.scheduler's upload batching); 0 admits every upload at once
    upload_batch_wait_ms: float = 1000.0 * UPLOAD_BATCH_WAIT_S
    upload_hold: UploadHold = UploadHold.PIPELINE  # what a new upload waits for (UploadHold)
    # ms of estimated GPU time per engine step while no live session is open
    # (livemeet.engine.scheduler); live work keeps live_step_budget_ms steps
    upload_step_budget_ms: float = 1000.0 * UPLOAD_STEP_BUDGET_S
    # of the engine's estimated time that uploads keep while live work competes (the
    # scheduler's upload_min_share); 0: live work has pure priority
    upload_min_share: float = UPLOAD_MIN_SHARE
    # ms of estimated GPU time per engine step while live sessions are open: a hop decodes its
    # new tail one step per token, so this bounds its time under load
    live_step_budget_ms: float = 1000.0 * LIVE_STEP_BUDGET_S
    # decode-only engine steps after each step that prefilled, while a live hop decodes: its
    # new text gets that many more ids per prefill step (livemeet.engine.scheduler)
    live_decode_steps: int = LIVE_DECODE_STEPS
    # tokens of committed transcript a live hop prefills as forced assistant tokens before it
    # decodes the new tail (DESIGN 5.3); 0: every hop re-decodes the whole meeting
    live_forced_transcript_tokens: int = LIVE_FORCED_TRANSCRIPT_TOKENS
    # the floor that budget halves towards while hops take over live_hop_load of a hop interval
    # (livemeet/session/forced_budget.py); >= live_forced_transcript_tokens: a fixed budget
    live_forced_transcript_min_tokens: int = LIVE_FORCED_TRANSCRIPT_MIN_TOKENS
    # the share of a hop interval a session's hops may take (smoothed) before its forced
    # budget halves; it grows back below half of it. Lower: faster partials, less context
    live_hop_load: float = LIVE_FORCED_BUDGET_SLOW_FRACTION
    # a hop drafts what the previous one decoded after the same forced transcript; the engine
    # verifies it greedily (livemeet/session/draft.py): same transcript, fewer decode steps
    live_draft: bool = True
    # a live session's VAD finds speech ends, where a hop is due at once instead of after a
    # whole hop of new audio, and skips hops over silence (livemeet/session/vad.py; DESIGN 5.4).
    # WebRTC by measurement (loadtest/vad_study.py); Silero needs the demo extra; None: off
    live_vad: LiveVad | None = LiveVad.WEBRTC

    @property
    def backend_name(self) -> str:
        """The backend to load: `backend` when set, else "demo" without a model (unless
        `load_format` is "dummy"), else "moss"."""
        if self.backend:
            return self.backend
        return "demo" if self.model is None and self.load_format != "dummy" else "moss"

    def validate(self) -> None:
        """Raises ConfigError, naming the flag, for the first setting out of range or not among its
        choices, and for a `forced_output` that is not a file."""
        if self.load_format not in ("auto", "safetensors", "dummy"):
            raise ConfigError(
                f"--load-format must be auto, safetensors or dummy, not {self.load_format!r}"
            )
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(
                f"--dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"not {self.kv_cache_dtype!r}"
            )
        if self.kv_block_size not in KV_BLOCK_SIZES:
            raise ConfigError(
                f"--kv-block-size must be one of {', '.join(map(str, KV_BLOCK_SIZES))}, "
                f"not {self.kv_block_size}"
            )
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, not {self.max_new_tokens}")
        if not 0.0 < self.mem_fraction <= MAX_MEM_FRACTION:
            raise ConfigError(
                f"--mem-fraction must be in (0, {MAX_MEM_FRACTION}], not {self.mem_fraction}"
            )
        if not MIN_PREFILL_CHUNK <= self.chunked_prefill_size <= MAX_CONTEXT_TOKENS:
            raise ConfigError(
                f"--chunked-prefill-size must be in [{MIN_PREFILL_CHUNK}, {MAX_CONTEXT_TOKENS}] "
                f"tokens, not {self.chunked_prefill_size}"
            )
        if not 0.0 <= self.upload_batch_wait_ms <= MAX_UPLOAD_BATCH_WAIT_MS:
            raise ConfigError(
                f"--upload-batch-wait-ms must be in [0, {MAX_UPLOAD_BATCH_WAIT_MS:g}], "
                f"not {self.upload_batch_wait_ms}"
            )
        parse_upload_hold(self.upload_hold)
        if self.live_vad is not None:
            parse_live_vad(self.live_vad)
        low, high = 1000.0 * MIN_LIVE_STEP_BUDGET_S, 1000.0 * MAX_LIVE_STEP_BUDGET_S
        if not low <= self.live_step_budget_ms <= high:
            raise ConfigError(
                f"--live-step-budget-ms must be in [{low:g}, {high:g}], "
                f"not {self.live_step_budget_ms}"
            )
        if not 0 <= self.live_decode_steps <= MAX_LIVE_DECODE_STEPS:
            raise ConfigError(
                f"--live-decode-steps must be in [0, {MAX_LIVE_DECODE_STEPS}], "
                f"not {self.live_decode_steps}"
            )
        # never below the longest live step: the scheduler needs live <= upload budgets
        low, high = 1000.0 * MAX_LIVE_STEP_BUDGET_S, 1000.0 * MAX_UPLOAD_STEP_BUDGET_S
        if not low <= self.upload_step_budget_ms <= high:
            raise ConfigError(
                f"--upload-step-budget-ms must be in [{low:g}, {high:g}], "
                f"not {self.upload_step_budget_ms}"
            )
        if not 0.0 <= self.upload_min_share <= MAX_UPLOAD_MIN_SHARE:
            raise ConfigError(
                f"--upload-min-share must be in [0, {MAX_UPLOAD_MIN_SHARE:g}], "
                f"not {self.upload_min_share}"
            )
        if not 0 <= self.live_forced_transcript_tokens <= MAX_CONTEXT_TOKENS:
            raise ConfigError(
                f"--live-forced-transcript-tokens must be in [0, {MAX_CONTEXT_TOKENS}], "
                f"not {self.live_forced_transcript_tokens}"
            )
        if not 0 <= self.live_forced_transcript_min_tokens <= MAX_CONTEXT_TOKENS:
            raise ConfigError(
                f"--live-forced-transcript-min-tokens must be in [0, {MAX_CONTEXT_TOKENS}], "
                f"not {self.live_forced_transcript_min_tokens}"
            )
        if not MIN_LIVE_HOP_LOAD <= self.live_hop_load <= MAX_LIVE_HOP_LOAD:
            raise ConfigError(
                f"--live-hop-load must be in [{MIN_LIVE_HOP_LOAD:g}, {MAX_LIVE_HOP_LOAD:g}], "
                f"not {self.live_hop_load}"
            )
        try:
            ForcedBudget.for_hop_load(
                self.live_forced_transcript_tokens,
                self.live_forced_transcript_min_tokens,
                self.live_hop_load,
            )
        except ConfigError as exc:  # the budget's own words, under the flag that set it
            raise ConfigError(f"--live-forced-transcript-min-tokens: {exc.message}") from exc
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"--num-kv-blocks must be >= 1, not {self.num_kv_blocks}")
        if self.forced_output is not None and not Path(self.forced_output).is_file():
            raise ConfigError(f"--forced-output file not found: {self.forced_output}")


SHUTDOWN_LIVE_MODES = ("keep", "end")  # GatewayConfig.shutdown_live


@dataclass(frozen=True)
class GatewayConfig:
    """Limits the gateway enforces on requests and sessions."""

    max_upload_bytes: int = MAX_UPLOAD_BYTES  # bytes; larger bodies get 413
    max_audio_s: float = MAX_AUDIO_S  # s; a longer upload gets 413 (live sessions: no limit)
    max_concurrent_decodes: int = 2  # uploads decoded (ffmpeg/soundfile) at once
    max_sessions: int = 256  # open sessions (live + upload) before QueueFull
    # running live sessions (detached ones included) one client, its API key or else its
    # address, may hold before its next `start` gets TooManySessions (gateway/clients.py);
    # 0: no cap
    max_live_sessions_per_client: int = MAX_LIVE_SESSIONS_PER_CLIENT
    # s without any client message before a live session closes, or without upload body bytes
    # before an upload fails (client_timeout)
    idle_timeout_s: float = 60.0
    # s a live session waits for its final transcript after the client's `end` (the client
    # sends nothing then; a loaded engine may take minutes) before it fails with
    # engine_unavailable: bounds a client gone without a TCP close
    final_timeout_s: float = 600.0
    flush_interval_s: float = 0.050  # s; SSE / WS text flush window
    # s of new audio between a live session's re-decodes (DESIGN 5.1): shorter hops cut the
    # partial latency's wait for the next hop and cost GPU time in proportion
    live_hop_s: float = LIVE_HOP_S
    # x real time a live client may send audio at, past a LIVE_AUDIO_BURST_S burst (gateway/pacing)
    live_max_speed: float = LIVE_MAX_SPEED
    # browser origins besides the server's own that may open /v1/live ("*": any); see
    # livemeet/gateway/origin.py
    allowed_origins: tuple[str, ...] = ()
    # s a live session whose socket went away (a network blip) keeps transcribing and waits
    # for its client to resume it (docs/protocol.md, "Resume"), then is ended as by `end`;
    # 0: no resume, the session goes with its socket. A restarted server rebuilds the
    # unfinished ones from its data dir and waits as long (gateway/live_journal.py)
    live_resume_window_s: float = LIVE_RESUME_WINDOW_S
    # what a graceful shutdown (SIGTERM, SIGINT) does to a streaming live session: "keep" it in
    # the journal for the next start (the client is sent server_restarting, close 1012, and
    # resumes there, as after a crash); "end" it as its client's `end` would (its final, then
    # close 1001). With resume off (live_resume_window_s 0) it is always "end"
    shutdown_live: str = "keep"
    # s uploads in flight get to finish after a graceful shutdown began; still running then,
    # each is answered engine_unavailable (retryable; `serve --upload-drain-s`)
    upload_drain_s: float = UPLOAD_DRAIN_S
    # MiB the data dir's disk keeps free: below, new sessions get storage_failed (0: no floor)
    min_free_disk_mb: float = MIN_FREE_DISK_MB
    # days stored transcripts (uploads' and live sessions') are kept (0: forever)
    retention_days: float = 0.0
    # after a live session's transcript.final, re-decode the whole meeting offline and send it
    # as transcript.revised (DESIGN 5.7), where the backend can (MOSS-TD); `serve --no-revise`
    revise: bool = True
    # when the API asks for a key (AuthMode; the keys: `livemeet keys`, in the data dir)
    auth: AuthMode = AuthMode.AUTO

    def validate(self) -> None:
        """Raises ConfigError, naming the flag, for the first setting out of range or not among its
        choices."""
        parse_auth_mode(self.auth)
        if self.max_upload_bytes <= 0:
            raise ConfigError(f"--max-upload-bytes must be positive, not {self.max_upload_bytes}")
        for flag, value in (
            ("--min-free-disk-mb", self.min_free_disk_mb),
            ("--retention-days", self.retention_days),
        ):
            if not (math.isfinite(value) and value >= 0):  # nan passes `< 0`
                raise ConfigError(f"{flag} must be >= 0, not {flag_number(value)}")
        for flag, count in (
            ("--max-concurrent-decodes", self.max_concurrent_decodes),
            ("--max-sessions", self.max_sessions),
        ):
            if count < 1:
                raise ConfigError(f"{flag} must be >= 1, not {count}")
        if self.max_live_sessions_per_client < 0:
            raise ConfigError(
                "--max-live-sessions-per-client must be >= 0 (0: no cap), "
                f"not {self.max_live_sessions_per_client}"
            )
        for origin in self.allowed_origins:
            problem = check_allowed_origin(origin)
            if problem is not None:
                raise ConfigError(f"--allowed-origin {problem}")
        if self.max_upload_bytes > UPLOAD_SPILL_TOTAL_BYTES:
            raise ConfigError(
                f"--max-upload-bytes {self.max_upload_bytes} is over the {UPLOAD_SPILL_TOTAL_BYTES}"
                " bytes all spilled uploads may hold together"
            )
        if not (math.isfinite(self.live_max_speed) and self.live_max_speed >= 1):
            raise ConfigError(
                f"--live-max-speed must be >= 1 (x real time), not {self.live_max_speed}"
            )
        # NaN passes any `<= 0` test and would switch the limit off; inf is no limit either
        for name, setting in (
            ("max_audio_s", "--max-audio-s"),
            ("idle_timeout_s", "idle_timeout_s"),  # no flag: the setting's own name
            ("final_timeout_s", "final_timeout_s"),
            ("flush_interval_s", "flush_interval_s"),
            ("upload_drain_s", "--upload-drain-s"),
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{setting} must be a positive number of seconds, not {value}")
        if not (math.isfinite(self.live_resume_window_s) and self.live_resume_window_s >= 0):
            raise ConfigError(
                f"--live-resume-window must be >= 0 s (0: no resume), "
                f"not {self.live_resume_window_s}"
            )
        if self.shutdown_live not in SHUTDOWN_LIVE_MODES:
            raise ConfigError(
                f"--shutdown-live must be one of {', '.join(SHUTDOWN_LIVE_MODES)}, "
                f"not {self.shutdown_live!r}"
            )
        if not LIVE_HOP_MIN_S <= self.live_hop_s <= LIVE_HOP_MAX_S:
            raise ConfigError(
                f"--live-hop-s must be in [{LIVE_HOP_MIN_S}, {LIVE_HOP_MAX_S}] s, "
                f"not {self.live_hop_s}"
            )


@dataclass(frozen=True)
class ServerConfig:
    """`livemeet serve`: where to listen and where to keep data."""

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path("./livemeet-data")
    tls_cert: Path | None = None
    tls_key: Path | None = None
    in_process_engine: bool = False  # tests only: run the backend in a thread, not a child process
    model: ModelConfig = field(default_factory=ModelConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)

    def validate(self) -> None:
        """Raises ConfigError for a TLS certificate without its key (or the reverse), a port outside
        0..65535, and whatever `ModelConfig.validate` and `GatewayConfig.validate` raise."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key must be given together")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, not {self.port}")
        self.model.validate()
        self.gateway.validate()
