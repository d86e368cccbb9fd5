"""Prometheus metrics of one gateway app, in a registry of its own (tests build many apps).

Engine counters (`livemeet_engine_*`, the live hops' `livemeet_live_hops`,
`livemeet_live_hop_seconds`, `livemeet_live_hop_wait_seconds`,
`livemeet_live_hop_first_token_seconds` and `livemeet_live_forced_tokens`, the drafts
`livemeet_engine_draft_tokens` (labels: proposed, accepted), and
`livemeet_upload_continuations`, preemptions and retained-cache evictions; gauges among them:
the worker's longest audio-command wait `livemeet_engine_audio_command_lag_max_seconds`, the KV
blocks used and free `livemeet_engine_kv_blocks` and the requests by state
`livemeet_engine_requests`) come from the engine worker as `EngineStats`
(livemeet/engine/messages.py) at most ENGINE_STATS_INTERVAL_S stale while it steps and exact
when idle. `EngineStatsCollector` exports the latest totals as they are, as counters
(the lag maximum as a gauge): the gateway never sees increments, so a custom collector rather
than `Counter`s (which would need deltas). A restarted engine worker (a restarted server) starts
again from zero, which Prometheus' `rate()`/`increase()` treat as a counter reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from livemeet.engine.messages import EngineStats
from livemeet.errors import ERROR_CLASSES, InvalidRequest, NotFound, Unauthorized
from livemeet.gateway.auth import AuthFailure

StatsSource = Callable[[], EngineStats | None]

# prometheus_client writes a `_created` sample (a creation time) beside every counter and
# histogram series: it doubles the exposition's counter lines, and rate() never reads it.
# Process-wide: the process exports only the gateway's registries.
disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream


@runtime_checkable
class EngineStatsSource(Protocol):
    """A transcriber that reports its engine's counters (EngineClient); None until the first
    report, and always for backends without a step engine."""

    @property
    def engine_stats(self) -> EngineStats | None: ...


def _no_stats() -> EngineStats | None:
    return None


class EngineStatsCollector:
    """`livemeet_engine_steps_total{kind}` (kind: decode_graph, decode_eager, prefill_graph,
    prefill_eager; a prefill step may carry decode rows), `livemeet_engine_tokens_total{phase}`
    (phase: prefill, decode), `livemeet_engine_decode_graph_fallbacks_total` (decode steps
    run eagerly although decode graphs exist: batch too large or contexts too long),
    `livemeet_engine_step_seconds_total{part}` (host seconds inside steps by part: schedule,
    encode, launch, wait, other; EngineStats says what each covers) and
    `livemeet_engine_slow_steps_total` (steps of at least ENGINE_SLOW_STEP_S), from
    `source()`; nothing while it returns None."""

    def __init__(self, source: StatsSource) -> None:
        self.source = source

    def describe(self) -> Iterator[Metric]:
        """The families without samples (the registry reserves their names)."""
        return iter(_families(None))

    def collect(self) -> Iterator[Metric]:
        """The families with the latest `source()` stats (prometheus_client's collector protocol);
        none while it returns None."""
        stats = self.source()
        return iter(_families(stats) if stats is not None else [])


def _families(stats: EngineStats | None) -> list[Metric]:
    steps = CounterMetricFamily(
        "livemeet_engine_steps", "Engine steps by kind (cumulative)", labels=["kind"]
    )
    tokens = CounterMetricFamily(
        "livemeet_engine_tokens", "Tokens computed by the engine, by phase", labels=["phase"]
    )
    fallbacks = CounterMetricFamily(
        "livemeet_engine_decode_graph_fallbacks",
        "Decode steps run eagerly although CUDA graphs were captured",
        labels=[],
    )
    seconds = CounterMetricFamily(
        "livemeet_engine_step_seconds",
        "Host seconds inside engine steps, by part (cumulative)",
        labels=["part"],
    )
    slow = CounterMetricFamily(
        "livemeet_engine_slow_steps", "Engine steps that took ENGINE_SLOW_STEP_S or more", labels=[]
    )
    windows = CounterMetricFamily(
        "livemeet_engine_encoded_windows",
        "30-s audio windows the encoder computed (cache hits excluded)",
        labels=[],
    )
    hops = CounterMetricFamily("livemeet_live_hops", "Live decodes (hops) finished", labels=[])
    hop_seconds = CounterMetricFamily(
        "livemeet_live_hop_seconds",
        "Seconds from a live hop's submission to its end, summed (divided by hops: the mean)",
        labels=[],
    )
    forced_tokens = CounterMetricFamily(
        "livemeet_live_forced_tokens",
        "Committed-transcript tokens live hops prefilled as forced assistant tokens, summed",
        labels=[],
    )
    hop_wait = CounterMetricFamily(
        "livemeet_live_hop_wait_seconds",
        "Seconds live hops waited from being due to their submission to the engine, summed",
        labels=[],
    )
    hop_first_token = CounterMetricFamily(
        "livemeet_live_hop_first_token_seconds",
        "Seconds from a live hop's submission to its first sampled id (encode, the wait for a "
        "step, prefill), summed over finished hops; the rest of the hop's time is decoding",
        labels=[],
    )
    drafts = CounterMetricFamily(
        "livemeet_engine_draft_tokens",
        "Draft ids requests carried (proposed) and those their prefill verified (accepted): "
        "each accepted id is a decode step saved",
        labels=["outcome"],
    )
    continuations = CounterMetricFamily(
        "livemeet_upload_continuations",
        "Uploads whose decode stopped well before their audio's end and was continued",
        labels=[],
    )
    audio_commands = CounterMetricFamily(
        "livemeet_engine_audio_commands",
        "Audio appends the engine worker applied (with a send time)",
        labels=[],
    )
    audio_lag = CounterMetricFamily(
        "livemeet_engine_audio_command_lag_seconds",
        "Seconds audio appends waited from the gateway's queue to the worker, summed",
        labels=[],
    )
    audio_lag_max = GaugeMetricFamily(
        "livemeet_engine_audio_command_lag_max_seconds",
        "The longest wait of an audio append from the gateway's queue to the worker",
        labels=[],
    )
    endpoint_hops = CounterMetricFamily(
        "livemeet_live_endpoint_hops",
        "Live hops due before a whole hop of new audio because the session's speech ended",
        labels=[],
    )
    gc_collections = CounterMetricFamily(
        "livemeet_engine_gc_collections",
        "The engine process's garbage collections, young or full (the oldest generation)",
        labels=["generation"],
    )
    gc_pause = CounterMetricFamily(
        "livemeet_engine_gc_pause_seconds",
        "Seconds the engine process spent in garbage collections, summed",
        labels=[],
    )
    gc_pause_max = GaugeMetricFamily(
        "livemeet_engine_gc_pause_max_seconds",
        "The engine process's longest garbage collection",
        labels=[],
    )
    preemptions = CounterMetricFamily(
        "livemeet_engine_preemptions",
        "Requests evicted from the KV cache under memory pressure, to be recomputed",
        labels=[],
    )
    retained_evictions = CounterMetricFamily(
        "livemeet_engine_retained_evictions",
        "Live hops' retained KV released under memory pressure (the next hop prefills it)",
        labels=[],
    )
    kv_blocks = GaugeMetricFamily(
        "livemeet_engine_kv_blocks",
        "KV cache blocks: used (held by any request, retained ones included) and free",
        labels=["state"],
    )
    requests = GaugeMetricFamily(
        "livemeet_engine_requests",
        "Engine requests: running (admitted), waiting (or preempted), retained (finished, KV "
        "kept for the session's next hop)",
        labels=["state"],
    )
    if stats is not None:
        preemptions.add_metric([], stats.num_preemptions)
        retained_evictions.add_metric([], stats.num_retained_evictions)
        kv_blocks.add_metric(["used"], stats.kv_blocks_used)
        kv_blocks.add_metric(["free"], stats.kv_blocks_total - stats.kv_blocks_used)
        requests.add_metric(["running"], stats.num_running_requests)
        requests.add_metric(["waiting"], stats.num_waiting_requests)
        requests.add_metric(["retained"], stats.num_retained_requests)
        steps.add_metric(["decode_graph"], stats.num_decode_graph_steps)
        steps.add_metric(["decode_eager"], stats.num_decode_eager_steps)
        steps.add_metric(["prefill_graph"], stats.num_prefill_graph_steps)
        steps.add_metric(["prefill_eager"], stats.num_prefill_eager_steps)
        tokens.add_metric(["prefill"], stats.num_prefill_tokens)
        tokens.add_metric(["decode"], stats.num_decode_tokens)
        fallbacks.add_metric([], stats.num_decode_graph_fallbacks)
        for part, value in stats.host_s.items():
            seconds.add_metric([part], value)
        slow.add_metric([], stats.num_slow_steps)
        windows.add_metric([], stats.num_encoded_windows)
        hops.add_metric([], stats.num_live_hops)
        hop_seconds.add_metric([], stats.live_hop_s)
        forced_tokens.add_metric([], stats.live_forced_tokens)
        hop_wait.add_metric([], stats.live_hop_wait_s)
        hop_first_token.add_metric([], stats.live_hop_first_token_s)
        continuations.add_metric([], stats.num_upload_continuations)
        drafts.add_metric(["proposed"], stats.num_draft_tokens)
        drafts.add_metric(["accepted"], stats.num_accepted_draft_tokens)
        audio_commands.add_metric([], stats.num_audio_commands)
        audio_lag.add_metric([], stats.audio_command_lag_s)
        audio_lag_max.add_metric([], stats.audio_command_lag_max_s)
        endpoint_hops.add_metric([], stats.num_live_endpoint_hops)
        full = stats.num_gc_full_collections
        gc_collections.add_metric(["young"], stats.num_gc_collections - full)
        gc_collections.add_metric(["full"], full)
        gc_pause.add_metric([], stats.gc_pause_s)
        gc_pause_max.add_metric([], stats.gc_pause_max_s)
    return [
        steps,
        tokens,
        fallbacks,
        seconds,
        slow,
        windows,
        hops,
        hop_seconds,
        forced_tokens,
        hop_wait,
        hop_first_token,
        drafts,
        continuations,
        audio_commands,
        audio_lag,
        audio_lag_max,
        endpoint_hops,
        gc_collections,
        gc_pause,
        gc_pause_max,
        preemptions,
        retained_evictions,
        kv_blocks,
        requests,
    ]


UPLOAD_LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)  # s
UPLOAD_PHASES = ("receive", "decode", "transcribe", "respond")  # livemeet_upload_phase_seconds
LIVE_FINAL_PHASES = ("engine", "hold")  # livemeet_live_final_seconds
# livemeet_live_resumes_total{result}: a resume's outcome, or the code of its refusal
LIVE_RESUME_RESULTS = (
    "resumed",
    "taken_over",
    NotFound.code,
    Unauthorized.code,
    InvalidRequest.code,
)


@dataclass(frozen=True)
class GatewayMetrics:
    """The gateway's metrics. Label values: `endpoint` (route name), `status` (HTTP status),
    `state` (live session state), `outcome` (how a session ended), `kind` (upload|live),
    `code` (LivemeetError.code), `result` (a live resume's), `reason` (why an API key was
    refused: gateway/auth.py's AuthFailure); `engine` exports the engine's counters (module
    docstring)."""

    registry: CollectorRegistry
    requests: Counter
    sessions: Gauge
    sessions_ended: Counter
    audio_received_seconds: Counter
    errors: Counter
    demo: Gauge
    upload_latency_s: Histogram
    upload_phase_s: Histogram
    uploads_incoming: Gauge
    live_resumes: Counter
    live_resume_expiries: Counter
    live_sessions_detached: Gauge
    journal_commit_s: Histogram
    journal_files_synced: Histogram
    journal_failures: Counter
    live_recoveries: Counter
    disk_free_bytes: Gauge
    captions_subscribers: Gauge
    live_revisions: Counter
    live_final_s: Histogram
    live_revision_s: Histogram
    auth_failures: Counter
    engine: EngineStatsCollector

    @classmethod
    def create(cls, engine_stats: StatsSource = _no_stats) -> GatewayMetrics:
        """`engine_stats()`: the engine's latest counters (None: no engine metrics)."""
        registry = CollectorRegistry(auto_describe=True)
        engine = EngineStatsCollector(engine_stats)
        registry.register(engine)
        # the gateway process's own (the engine's runs apart): process_* (resident memory,
        # CPU seconds, open fds, start time: a restart), python_info, python_gc_*, as the
        # default registry exports them
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        metrics = cls(
            registry=registry,
            engine=engine,
            requests=Counter(
                "livemeet_requests",
                "HTTP requests by endpoint and status (499: the client left before the response)",
                ["endpoint", "status"],
                registry=registry,
            ),
            sessions=Gauge(
                "livemeet_sessions",
                "Open sessions by kind and state",
                ["kind", "state"],
                registry=registry,
            ),
            sessions_ended=Counter(
                "livemeet_sessions_ended",
                "Sessions ended, by kind and outcome",
                ["kind", "outcome"],
                registry=registry,
            ),
            audio_received_seconds=Counter(
                "livemeet_audio_received_seconds",
                "Seconds of audio received, by kind",
                ["kind"],
                registry=registry,
            ),
            errors=Counter(
                "livemeet_errors",
                "Errors sent to clients, by code",
                ["code"],
                registry=registry,
            ),
            demo=Gauge(
                "livemeet_demo_backend",
                "1 when the demo backend (not MOSS-TD) serves",
                registry=registry,
            ),
            upload_latency_s=Histogram(
                "livemeet_upload_latency_seconds",
                "Time from request to complete transcript for uploads",
                buckets=UPLOAD_LATENCY_BUCKETS_S,
                registry=registry,
            ),
            upload_phase_s=Histogram(
                "livemeet_upload_phase_seconds",
                "Time per phase of an upload request: receive (the multipart body read), decode "
                "(probe, a decode slot, decoding), transcribe (engine session to final "
                "transcript, or the whole SSE stream), respond (render; the transcript file is "
                "written in the background)",
                ["phase"],
                buckets=(0.005, 0.025, *UPLOAD_LATENCY_BUCKETS_S),
                registry=registry,
            ),
            uploads_incoming=Gauge(
                "livemeet_uploads_incoming",
                "Uploads accepted and not yet handed to the engine (receiving the body, "
                "probing, waiting for or in a decode slot, opening a session); the engine's "
                "upload hold waits for them",
                registry=registry,
            ),
            live_resumes=Counter(
                "livemeet_live_resumes",
                "Live resume attempts by result: resumed (a detached session), taken_over (one "
                "still attached to another socket), or the error code (not_found, "
                "unauthorized, invalid_request)",
                ["result"],
                registry=registry,
            ),
            live_resume_expiries=Counter(
                "livemeet_live_resume_expiries",
                "Detached live sessions not resumed within the resume window (then ended as "
                "by the client's end)",
                registry=registry,
            ),
            live_sessions_detached=Gauge(
                "livemeet_live_sessions_detached",
                "Live sessions whose socket went away, waiting for a resume (or, once ended, "
                "keeping their final for one)",
                registry=registry,
            ),
            journal_commit_s=Histogram(
                "livemeet_live_journal_commit_seconds",
                "Group commits of the live journal: audio appended and synced, then the SQLite "
                "transaction (s); `audio.ack` waits for them, so their tail is the ack's lag",
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                registry=registry,
            ),
            journal_files_synced=Histogram(
                "livemeet_live_journal_files_synced",
                "Audio files a group commit of the live journal synced (one per live session "
                "with new audio)",
                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                registry=registry,
            ),
            disk_free_bytes=Gauge(
                "livemeet_disk_free_bytes",
                "Free bytes on the data dir's file system (under --min-free-disk-mb new "
                "sessions are refused)",
                registry=registry,
            ),
            live_recoveries=Counter(
                "livemeet_live_recoveries",
                "Live sessions whose engine worker died under them, by result: rebuilt (a new "
                "backend session from their finals and journalled audio; the client saw a "
                "pause) or failed (engine_unavailable sent, as without a journal)",
                ["result"],
                registry=registry,
            ),
            journal_failures=Counter(
                "livemeet_live_journal_failures",
                "Live sessions whose journal could not keep their audio, finals or names "
                "(storage_failed), by result: ended (ended early as by the client's end, "
                "transcript.final sent) or failed (no final: no audio, the backend failed "
                "while ending it, or the session was dropped before its final came)",
                ["result"],
                registry=registry,
            ),
            captions_subscribers=Gauge(
                "livemeet_captions_subscribers",
                "Open captions subscriptions (GET /v1/sessions/{id}/captions), all sessions",
                registry=registry,
            ),
            live_revisions=Counter(
                "livemeet_live_revisions",
                "Live sessions' revisions after their final (transcript.revised, DESIGN 5.7), "
                "by result: revised, or failed (the re-decode failed or was cancelled; the final "
                "stands)",
                ["result"],
                registry=registry,
            ),
            live_final_s=Histogram(
                "livemeet_live_final_seconds",
                "Time from a live session's end to its transcript.final, by phase: engine (the "
                "end to the backend's final transcript: its last hops decoded), hold (the final "
                "transcript waiting for the session's finals and audio to be in the journal and "
                "for the answers to renames and merges) (s)",
                ["phase"],
                buckets=(0.005, 0.025, *UPLOAD_LATENCY_BUCKETS_S),
                registry=registry,
            ),
            live_revision_s=Histogram(
                "livemeet_live_revision_seconds",
                "Time from a live session's end to its transcript.revised (s)",
                buckets=UPLOAD_LATENCY_BUCKETS_S,
                registry=registry,
            ),
            auth_failures=Counter(
                "livemeet_auth_failures",
                "HTTP requests and live sessions refused for their API key, by reason: missing "
                "(none sent), wrong (not one of the server's keys), revoked",
                ["reason"],
                registry=registry,
            ),
        )
        for result in ("revised", "failed"):  # exported (at zero) before the first revision
            metrics.live_revisions.labels(result)
        for phase in UPLOAD_PHASES:  # exported (at zero) before the first upload
            metrics.upload_phase_s.labels(phase)
        for phase in LIVE_FINAL_PHASES:
            metrics.live_final_s.labels(phase)
        for reason in AuthFailure:  # at zero, for alerts on their rate
            metrics.auth_failures.labels(reason.value)
        for error in ERROR_CLASSES:  # every code at zero: a rate() needs the series before
            metrics.errors.labels(error.code)
        for result in LIVE_RESUME_RESULTS:
            metrics.live_resumes.labels(result)
        for result in ("rebuilt", "failed"):
            metrics.live_recoveries.labels(result)
        for result in ("ended", "failed"):
            metrics.journal_failures.labels(result)
        return metrics

    def journal_committed(self, seconds: float, files: int) -> None:
        """A live journal group commit (its writer thread calls this: prometheus_client's
        metrics are thread-safe)."""
        self.journal_commit_s.observe(seconds)
        self.journal_files_synced.observe(files)
