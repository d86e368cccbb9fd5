"""`/healthz` (the process is alive), `/readyz` (model loaded, engine up), `/metrics`."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from livemeet.gateway.disk import MIB
from livemeet.gateway.keys import (
    DISK_KEY,
    LIFECYCLE_KEY,
    METRICS_KEY,
    REGISTRY_KEY,
    SESSIONS_KEY,
    TRANSCRIBER_KEY,
)


async def healthz(request: web.Request) -> web.Response:
    """200 while the process can serve, now or once its engine is back; 503 once the engine
    could not be started again (Transcriber.failed), so a supervisor replaces the process."""
    if request.app[TRANSCRIBER_KEY].failed:
        return web.json_response({"status": "failed", "reason": "engine_failed"}, status=503)
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 when the backend is ready, the server is not draining and its data dir's disk is
    above --min-free-disk-mb; 503 otherwise."""
    app = request.app
    transcriber = app[TRANSCRIBER_KEY]
    disk = app[DISK_KEY]
    ready = transcriber.ready and app[LIFECYCLE_KEY].started and not app[LIFECYCLE_KEY].draining
    ready = ready and not disk.low  # new sessions would get storage_failed
    free = disk.free_bytes()
    body = {
        "status": "ready" if ready else "unavailable",
        "backend": transcriber.info.name,
        "model": transcriber.info.model_id,
        "demo": transcriber.info.demo,
        "draining": app[LIFECYCLE_KEY].draining,
        "live_sessions": len(app[REGISTRY_KEY]),
        "live_sessions_detached": app[SESSIONS_KEY].num_detached,
        "disk_low": disk.low,
        "disk_free_mb": None if free is None else round(free / MIB),
    }
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
