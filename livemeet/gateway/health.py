"""`/healthz` (the process is alive), `/readyz` (ready for new work), `/metrics`."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from livemeet.errors import InvalidRequest
from livemeet.gateway.disk import MIB
from livemeet.gateway.keys import (
    CONFIG_KEY,
    DISK_KEY,
    LIFECYCLE_KEY,
    METRICS_KEY,
    REGISTRY_KEY,
    SESSIONS_KEY,
    TRANSCRIBER_KEY,
)
from livemeet.transcriber import SlottedTranscriber


async def healthz(request: web.Request) -> web.Response:
    """200 while the process can serve, now or once its engine is back; 503 once the engine
    could not be started again (Transcriber.failed), so a supervisor replaces the process."""
    if request.app[TRANSCRIBER_KEY].failed:
        return web.json_response({"status": "failed", "reason": "engine_failed"}, status=503)
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 when the backend is ready, the server is not draining and its data dir's disk is
    not low (DiskGuard: under --min-free-disk-mb, until it is back above the floor plus a
    margin); 503 otherwise. With `?capacity=1`, also 503 while no session slot is free
    (--max-sessions). Raises InvalidRequest (400) for another `capacity` than 0 or 1.

    A full server is ready by default: it still serves its meetings (their resumes, captions
    and transcripts, the page), which a load balancer that took it out of its pool would send
    elsewhere (a resume elsewhere finds no session), and new work there gets 429 with
    Retry-After; when every server is full, a pool that took them all out answers nothing.
    `capacity=1` is for a dispatcher that routes only new sessions by it."""
    app = request.app
    capacity = request.query.get("capacity", "0")
    if capacity not in ("0", "1"):
        raise InvalidRequest("capacity must be 0 or 1", param="capacity")
    transcriber = app[TRANSCRIBER_KEY]
    disk = app[DISK_KEY]
    ready = transcriber.ready and app[LIFECYCLE_KEY].started and not app[LIFECYCLE_KEY].draining
    ready = ready and not disk.low  # new sessions would get storage_failed
    free_slots = transcriber.free_slots if isinstance(transcriber, SlottedTranscriber) else None
    full = free_slots == 0
    if capacity == "1":
        ready = ready and not full  # new sessions would get queue_full
    free = disk.free_bytes()
    body = {
        "status": "ready" if ready else "unavailable",
        "backend": transcriber.info.name,
        "model": transcriber.info.model_id,
        "demo": transcriber.info.demo,
        "draining": app[LIFECYCLE_KEY].draining,
        "live_sessions": len(app[REGISTRY_KEY]),
        "live_sessions_detached": app[SESSIONS_KEY].num_detached,
        "max_sessions": app[CONFIG_KEY].gateway.max_sessions,
        "free_slots": free_slots,
        "full": full,
        "disk_low": disk.low,
        "disk_free_mb": None if free is None else round(free / MIB),
        "disk_ready_mb": round(disk.ready_bytes / MIB) if disk.min_free_bytes > 0 else None,
    }
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    """`GET /metrics`: the app's Prometheus registry in the text exposition format
    (prometheus_client's `CONTENT_TYPE_LATEST`)."""
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
