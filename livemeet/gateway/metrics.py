"""Prometheus metrics of one gateway app, in a registry of its own (tests build many apps)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class GatewayMetrics:
    """The gateway's metrics. Label values: `endpoint` (route name), `status` (HTTP status),
    `state` (live session state), `outcome` (how a session ended), `kind` (upload|live),
    `code` (LivemeetError.code)."""

    registry: CollectorRegistry
    requests: Counter
    sessions: Gauge
    sessions_ended: Counter
    audio_seconds_in: Counter
    errors: Counter
    demo: Gauge
    upload_latency_s: Histogram

    @classmethod
    def create(cls) -> GatewayMetrics:
        registry = CollectorRegistry(auto_describe=True)
        return cls(
            registry=registry,
            requests=Counter(
                "livemeet_requests",
                "HTTP requests by endpoint and status",
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
            audio_seconds_in=Counter(
                "livemeet_audio_seconds_in",
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
                buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
                registry=registry,
            ),
        )
