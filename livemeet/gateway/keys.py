"""Typed application state of the gateway (aiohttp `AppKey`s), shared by every handler."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from livemeet.audio.constants import UPLOAD_MEMORY_TOTAL_BYTES, UPLOAD_SPILL_TOTAL_BYTES
from livemeet.config import ServerConfig
from livemeet.gateway.disk import DiskGuard
from livemeet.gateway.drain import UploadCutoff
from livemeet.gateway.incoming import IncomingUploadCounter
from livemeet.gateway.metrics import GatewayMetrics
from livemeet.gateway.transcript_store import TranscriptStore
from livemeet.gateway.upload_form import ByteBudget
from livemeet.transcriber import Transcriber

if TYPE_CHECKING:
    from livemeet.gateway.auth_http import KeyGuard
    from livemeet.gateway.live_journal import LiveJournal
    from livemeet.gateway.live_sessions import LiveSessions
    from livemeet.gateway.ws_captions import CaptionsRegistry
    from livemeet.gateway.ws_live import LiveRegistry


@dataclass
class Lifecycle:
    """Runtime facts of the app (not configuration): set by the cleanup context and shutdown."""

    started: bool = False
    draining: bool = False
    drain_started_at: float | None = None  # time.monotonic() of the shutdown's start
    num_uploads_in_flight: int = 0  # upload requests admitted and not yet answered
    upload_cutoff: UploadCutoff = field(default_factory=UploadCutoff)
    decode_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    incoming_uploads: IncomingUploadCounter = field(default_factory=IncomingUploadCounter)
    # upload file bytes held in memory across requests (the rest is spilled to disk)
    upload_memory: ByteBudget = field(default_factory=lambda: ByteBudget(UPLOAD_MEMORY_TOTAL_BYTES))
    # upload file bytes spilled to disk across requests (past it: queue_full)
    upload_disk: ByteBudget = field(default_factory=lambda: ByteBudget(UPLOAD_SPILL_TOTAL_BYTES))


CONFIG_KEY = web.AppKey("config", ServerConfig)
TRANSCRIBER_KEY = web.AppKey("transcriber", Transcriber)
REGISTRY_KEY: web.AppKey[LiveRegistry] = web.AppKey("live_registry")
CAPTIONS_KEY: web.AppKey[CaptionsRegistry] = web.AppKey("captions_registry")
SESSIONS_KEY: web.AppKey[LiveSessions] = web.AppKey("live_sessions")
JOURNAL_KEY: web.AppKey[LiveJournal] = web.AppKey("live_journal")
DISK_KEY = web.AppKey("disk", DiskGuard)
METRICS_KEY = web.AppKey("metrics", GatewayMetrics)
STORE_KEY = web.AppKey("transcripts", TranscriptStore)
LIFECYCLE_KEY = web.AppKey("lifecycle", Lifecycle)
AUTH_KEY: web.AppKey[KeyGuard] = web.AppKey("auth")
# the id of the API key a request was let in with (auth_middleware; absent: none was needed),
# for the request's log lines: the id, never the key
API_KEY_ID_KEY = web.RequestKey("api_key_id", str)


def tmp_dir(config: ServerConfig) -> Path:
    """Where upload files larger than UPLOAD_MEMORY_BYTES are spilled."""
    return config.data_dir / "tmp"


def transcripts_dir(config: ServerConfig) -> Path:
    """`<data_dir>/transcriptions`: the TranscriptStore's folder, one JSON file per transcript
    (docs/protocol.md, Other endpoints)."""
    return config.data_dir / "transcriptions"


def live_dir(config: ServerConfig) -> Path:
    """The live journal: live sessions' audio and finals (gateway/live_journal.py)."""
    return config.data_dir / "live"
