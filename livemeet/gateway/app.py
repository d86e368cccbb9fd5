"""The aiohttp application of the gateway: routes, typed state, lifecycle.

`create_app(config, transcriber)` builds it; `cleanup_ctx` reads the API keys and keeps them
current (gateway/auth_http.py), then starts and stops the transcriber;
`on_shutdown` drains: with `--shutdown-live keep` (the default) and resume on, the shutdown is a
restart: each streaming live session's audio is put on disk, its client is sent
`server_restarting` and a 1012 close, and the session stays in the journal, as after a crash,
for the next start to rebuild and its client to resume (a detached one stays too). Otherwise
(`end`, or resume off) each live session is ended as by its client's `end` and gets its final
transcript, then a 1001 close (one with nothing to transcribe, or whose final is late, gets an
`engine_unavailable` error); a detached one (its socket gone, waiting for a resume) is ended,
its final stored (no socket to send it to), and freed. Either way, a session already ending
gets its final within the drain's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import ModuleType

from aiohttp import HttpVersion11, hdrs, web

from livemeet.audio.constants import (
    CORS_MAX_AGE_S,
    LIVE_DRAIN_CLOSE_S,
    RETENTION_SWEEP_INTERVAL_S,
)
from livemeet.config import ServerConfig, amount, flag_number
from livemeet.errors import (
    ClientTimeout,
    ConfigError,
    InternalError,
    InvalidRequest,
    LivemeetError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RequestRejected,
    StorageFailed,
)
from livemeet.gateway import health, openai_api, session_transcript
from livemeet.gateway.api_keys import ApiKeyStore, store_path
from livemeet.gateway.auth_http import (
    KeyGuard,
    auth_middleware,
    check_request_key,
    key_note,
    key_watch,
    refused_client,
)
from livemeet.gateway.disk import MIB, DiskGuard, make_private_dir
from livemeet.gateway.errors_http import error_response
from livemeet.gateway.http_protocol import malformed_body, name_the_server, serve_json_refusals
from livemeet.gateway.incoming import CountListener, IncomingUploadCounter, IncomingUploadsSink
from livemeet.gateway.keys import (
    AUTH_KEY,
    CAPTIONS_KEY,
    CONFIG_KEY,
    DISK_KEY,
    JOURNAL_KEY,
    LIFECYCLE_KEY,
    METRICS_KEY,
    REGISTRY_KEY,
    SESSIONS_KEY,
    STORE_KEY,
    TRANSCRIBER_KEY,
    Lifecycle,
    live_dir,
    tmp_dir,
    transcripts_dir,
)
from livemeet.gateway.live_journal import LiveJournal, RestoredSession
from livemeet.gateway.live_protocol import LIVE_PATH
from livemeet.gateway.live_sessions import LiveSessions
from livemeet.gateway.metrics import EngineStatsSource, GatewayMetrics, StatsSource
from livemeet.gateway.origin import canonical_origin
from livemeet.gateway.origin_http import request_hosts
from livemeet.gateway.pages import page_headers
from livemeet.gateway.transcript_store import TranscriptStore, remove_partial_writes
from livemeet.gateway.upload_form import remove_spill_files
from livemeet.gateway.ws_captions import CAPTIONS_PATH, CaptionsRegistry, captions_handler
from livemeet.gateway.ws_live import LiveRegistry, end_withdrawn_keys, live_handler
from livemeet.transcriber import BackendInfo, Transcriber

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
TRANSCRIPT_FLUSH_TIMEOUT_S = 10.0  # s a shutdown waits for transcript files to be written
CLIENT_CLOSED_STATUS = 499  # requests whose client left before the response (nginx's code)
# the HTTP API routes a page of an `--allowed-origin` may call (CORS); the live socket checks
# the origin itself (gateway/origin.py), and health and metrics are for operators
CORS_ROUTES = ("transcriptions", "models", "model", "transcript", "session_transcript")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(config: ServerConfig, transcriber: Transcriber | None = None) -> web.Application:
    """The gateway app. Without `transcriber`, an `EngineClient` for `config.model` is built
    (the demo backend when no model is given). Raises ConfigError for an invalid config."""
    config.validate()
    if transcriber is None:
        from livemeet.gateway.engine_client import EngineClient

        transcriber = EngineClient(
            config.model,
            in_process=config.in_process_engine,
            max_sessions=config.gateway.max_sessions,
        )
    # the error middleware outside: it renders the auth middleware's refusals too
    app = web.Application(middlewares=[error_middleware, auth_middleware])
    app[CONFIG_KEY] = config
    app[TRANSCRIBER_KEY] = transcriber
    app[REGISTRY_KEY] = LiveRegistry()
    app[CAPTIONS_KEY] = CaptionsRegistry()
    metrics = GatewayMetrics.create(engine_stats=_engine_stats_of(transcriber))
    app[METRICS_KEY] = metrics
    app[AUTH_KEY] = KeyGuard(config.gateway.auth, ApiKeyStore(store_path(config.data_dir)), metrics)
    app[STORE_KEY] = TranscriptStore(transcripts_dir(config))
    app[JOURNAL_KEY] = LiveJournal(live_dir(config), on_commit=metrics.journal_committed)
    guard = app[DISK_KEY] = DiskGuard(config.data_dir, int(config.gateway.min_free_disk_mb * MIB))
    # NaN (Prometheus's unknown) where it cannot be read: 0 read as a full disk (a trial)
    metrics.disk_free_bytes.set_function(lambda: _or_nan(guard.free_bytes()))
    app[SESSIONS_KEY] = LiveSessions(
        config.gateway.live_resume_window_s,
        config.gateway.final_timeout_s,
        metrics,
        app[STORE_KEY],
        app[JOURNAL_KEY],
        transcriber,
        keep_on_shutdown=config.gateway.shutdown_live == "keep",
        max_per_client=config.gateway.max_live_sessions_per_client,
    )
    # a key revoked while live sessions run on it ends them (ws_live.end_withdrawn_keys)
    app[AUTH_KEY].on_change(functools.partial(end_withdrawn_keys, app))
    listeners: list[CountListener] = [metrics.uploads_incoming.set]
    if isinstance(transcriber, IncomingUploadsSink):
        listeners.append(transcriber.set_incoming_uploads)
    app[LIFECYCLE_KEY] = Lifecycle(
        decode_slots=asyncio.Semaphore(config.gateway.max_concurrent_decodes),
        incoming_uploads=IncomingUploadCounter(*listeners),
    )
    app.cleanup_ctx.append(key_watch)  # the keys are read before the engine loads
    app.cleanup_ctx.append(transcriber_lifecycle)
    app.on_shutdown.append(begin_drain)  # first: the upload drain runs from the shutdown's start
    app.on_shutdown.append(close_live_sockets)
    app.on_cleanup.append(flush_transcripts)
    app.on_response_prepare.append(name_the_server)
    _add_routes(app)
    _allow_cross_origin(app, config.gateway.allowed_origins)
    serve_json_refusals(app, on_error=_refusal_counter(metrics))
    return app


def _refusal_counter(metrics: GatewayMetrics) -> Callable[[LivemeetError], None]:
    """Counts a request the HTTP parser refused as the error middleware counts the rest: no
    route matched it, and its error code."""

    def count(error: LivemeetError) -> None:
        metrics.requests.labels("unmatched", str(error.http_status)).inc()
        metrics.errors.labels(error.code).inc()

    return count


def cors_package() -> ModuleType:
    """aiohttp-cors, imported only where `--allowed-origin` needs it (a server without runs
    without the package: the GPU benchmark image). Raises ConfigError naming the package."""
    try:
        import aiohttp_cors
    except ImportError as exc:
        raise ConfigError(
            f"--allowed-origin needs the aiohttp-cors package ({exc}): pip install aiohttp-cors"
        ) from exc
    return aiohttp_cors


def _allow_cross_origin(app: web.Application, allowed: tuple[str, ...]) -> None:
    """CORS (aiohttp-cors) on the HTTP API for the `--allowed-origin` pages, so a web app
    served elsewhere can upload and fetch transcripts as it may open live sessions: preflight
    answers, `Access-Control-Allow-Origin` on every response (errors included). Any request
    header is allowed: aiohttp-cors answers a preflight with the headers it asked for, by
    name, as browsers need for `Authorization` (a `*` would not cover it), so a page may send
    an API key as `Authorization: Bearer` (the OpenAI JS client, beside its own
    `x-stainless-*` headers) or `x-api-key`. No credentials in the CORS sense (cookies): the
    API takes none."""
    if not allowed:
        return
    aiohttp_cors = cors_package()
    options = aiohttp_cors.ResourceOptions(
        allow_credentials=False,
        allow_methods="*",  # those the route serves; any other is still a 405
        allow_headers="*",
        expose_headers=(
            openai_api.ID_HEADER,
            session_transcript.STATUS_HEADER,
            session_transcript.FINISH_HEADER,
            session_transcript.REVISION_HEADER,
            "Retry-After",
            "WWW-Authenticate",
        ),
        max_age=CORS_MAX_AGE_S,
    )
    cors = aiohttp_cors.setup(app, defaults={canonical_origin(o): options for o in allowed})
    for name in CORS_ROUTES:
        cors.add(app.router[name])
    app.on_response_prepare.append(_vary_by_origin)


async def _vary_by_origin(request: web.Request, response: web.StreamResponse) -> None:
    """`Vary: Origin` on every answer of a CORS route (one without `Origin` too): whether it
    carries `Access-Control-Allow-Origin`, and which, depends on the request's `Origin`, so a
    cache between the page and the server must not hand one origin's answer to another
    (aiohttp-cors does not say so)."""
    if request.match_info.route.name not in CORS_ROUTES:
        return
    vary = response.headers.get(hdrs.VARY)
    if vary is None:
        response.headers[hdrs.VARY] = hdrs.ORIGIN
    elif hdrs.ORIGIN.lower() not in {v.strip().lower() for v in vary.split(",")}:
        response.headers[hdrs.VARY] = f"{vary}, {hdrs.ORIGIN}"


def _engine_stats_of(transcriber: Transcriber) -> StatsSource:
    """Where /metrics reads the engine's counters: the transcriber's `engine_stats` when it has
    one (EngineClient), else nowhere."""
    if isinstance(transcriber, EngineStatsSource):
        source = transcriber
        return lambda: source.engine_stats
    return lambda: None


async def flush_transcripts(app: web.Application) -> None:
    """At shutdown: every finished upload's transcript file is written before the exit, unless
    the disk hangs for TRANSCRIPT_FLUSH_TIMEOUT_S (then the exit goes on, and says so)."""
    try:
        await asyncio.wait_for(app[STORE_KEY].flush(), TRANSCRIPT_FLUSH_TIMEOUT_S)
    except TimeoutError:
        log.error(
            "transcript files not written within %g s at shutdown", TRANSCRIPT_FLUSH_TIMEOUT_S
        )


def _add_routes(app: web.Application) -> None:
    app.router.add_post(
        "/v1/audio/transcriptions",
        openai_api.create_transcription,
        name="transcriptions",
        expect_handler=_expect_upload,
    )
    app.router.add_get("/v1/models", openai_api.list_models, name="models")
    # ids may hold a slash (a hub id, owner/name)
    app.router.add_get("/v1/models/{model:.+}", openai_api.retrieve_model, name="model")
    app.router.add_get("/v1/transcriptions/{id}", openai_api.get_transcription, name="transcript")
    app.router.add_get(LIVE_PATH, live_handler, name="live")
    app.router.add_get(CAPTIONS_PATH, captions_handler, name="captions")
    app.router.add_get(
        session_transcript.TRANSCRIPT_PATH,
        session_transcript.get_session_transcript,
        name="session_transcript",
    )
    app.router.add_get("/healthz", health.healthz, name="healthz")
    app.router.add_get("/readyz", health.readyz, name="readyz")
    app.router.add_get("/metrics", health.metrics, name="metrics")
    add_page_routes(app, WEB_DIR)


def add_page_routes(app: web.Application, web_dir: Path) -> None:
    """`/` and a route per file of `web_dir` (the recorder, the captions overlay, their
    scripts). Without the recorder page there, the API is served alone and the log says why
    `/` answers 404: a `pip install .` that shipped no page said nothing (a trial)."""
    if not (web_dir / "index.html").is_file():
        log.error(
            "no web pages in %s (an install without livemeet's package data): GET / and the "
            "captions overlay answer 404; the API and live sessions are served",
            web_dir,
        )
        return
    # One route per file rather than a catch-all static resource, so unknown paths still
    # get the JSON 404 of the error middleware.
    app.router.add_get("/", _file_handler(web_dir / "index.html"), name="web")
    for path in sorted(web_dir.iterdir()):
        if path.is_file():  # unnamed (any file name): `endpoint` label "web"
            app.router.add_get(f"/{path.name}", _file_handler(path))


def _file_handler(path: Path) -> Handler:
    headers = page_headers(path)  # a page's CSP, with the hashes of its styles now

    async def handler(request: web.Request) -> web.StreamResponse:
        # its sockets' host named in its CSP too, for Safari before 16 (gateway/pages.py)
        return web.FileResponse(path, headers=headers(request_hosts(request)))

    return handler


async def transcriber_lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Start the transcriber (and data dirs) before serving; close it after shutdown."""
    config = app[CONFIG_KEY]
    try:
        make_private_dir(tmp_dir(config))
        make_private_dir(transcripts_dir(config))
    except OSError as exc:  # serve's check_data_dir passed; the disk changed since, or a race
        raise ConfigError(f"cannot use --data-dir {config.data_dir}: {exc}") from exc
    stale = remove_spill_files(tmp_dir(config))  # a crashed run's; this run has none yet
    if stale:
        log.warning("removed %d upload spill files left by an earlier run", stale)
    stale = remove_partial_writes(transcripts_dir(config))  # a killed run's, none of this one's
    if stale:
        log.warning("removed %d half-written transcript files left by an earlier run", stale)
    transcriber = app[TRANSCRIBER_KEY]
    journal = app[JOURNAL_KEY]
    try:
        unfinished = await asyncio.to_thread(journal.load_unfinished)
    except (OSError, StorageFailed) as exc:  # a failing disk: one line and exit 2, no traceback
        raise ConfigError(f"cannot use --data-dir {config.data_dir}: {exc}") from exc
    await transcriber.start()
    journal.start(asyncio.get_running_loop())
    if app[DISK_KEY].low:  # the guard logs its later changes, not this first look
        free = app[DISK_KEY].free_bytes() or 0
        log.warning(
            "the data dir's disk has %.0f MiB free, under --min-free-disk-mb %s: new live "
            "sessions and uploads are refused until %s MiB are free",
            free / MIB,
            flag_number(config.gateway.min_free_disk_mb),
            flag_number(app[DISK_KEY].ready_bytes / MIB),
        )
    retention = None
    if config.gateway.retention_days > 0:
        retention = asyncio.create_task(_sweep_transcripts(app), name="retention")
    try:
        if unfinished:
            await _restore_live_sessions(app, unfinished)
        info = transcriber.info
        app[METRICS_KEY].demo.set(1 if info.demo else 0)
        if info.demo:
            log.warning(
                "DEMO BACKEND: serving %s, not MOSS-TD%s. Pass --model to serve "
                "MOSS-Transcribe-Diarize.",
                info.model_id,
                _demo_limits(info),
            )
        if config.gateway.revise and not info.revise:  # --revise is on by default: no warning
            log.info(
                "the %s backend cannot revise: live sessions end at their transcript.final "
                "(session.ready says revise: false)",
                info.name,
            )
        log.info("%s", ready_line(config, info, app[DISK_KEY].free_bytes()))
        app[LIFECYCLE_KEY].started = True
        yield
    finally:
        app[LIFECYCLE_KEY].started = False
        app[LIFECYCLE_KEY].upload_cutoff.stop()
        if retention is not None:
            retention.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retention
        await app[SESSIONS_KEY].close()  # detached sessions' engine slots, before the engine
        await transcriber.close()
        # finished sessions leave the journal once their transcript files are written
        await flush_transcripts(app)
        await journal.close()


async def _sweep_transcripts(app: web.Application) -> None:
    """Retention (--retention-days): delete stored transcripts older than it, at start and
    every RETENTION_SWEEP_INTERVAL_S."""
    max_age_s = app[CONFIG_KEY].gateway.retention_days * 86_400
    while True:
        try:
            removed = await app[STORE_KEY].sweep(max_age_s)
        except OSError as exc:
            log.warning("retention: the transcripts could not be swept: %s", exc)
        else:
            if removed:
                log.info(
                    "retention: %s older than %s deleted",
                    amount(removed, "stored transcript"),
                    amount(app[CONFIG_KEY].gateway.retention_days, "day"),
                )
        await asyncio.sleep(RETENTION_SWEEP_INTERVAL_S)


def _or_nan(value: int | None) -> float:
    return math.nan if value is None else float(value)


def ready_line(config: ServerConfig, info: BackendInfo, disk_free_bytes: int | None) -> str:
    """The start's last line (the listener opens next): where it serves, what, and the
    settings an operator checks first, as the `serve` flags that set them."""
    gateway = config.gateway
    scheme = "https" if config.tls_cert is not None else "http"
    host = f"[{config.host}]" if ":" in config.host else config.host
    free = "unknown" if disk_free_bytes is None else f"{disk_free_bytes / MIB:.0f} MiB"
    settings = {
        "--data-dir": f"{config.data_dir} ({free} free)",
        "--max-sessions": str(gateway.max_sessions),
        "--max-live-sessions-per-client": str(gateway.max_live_sessions_per_client),
        "--live-hop-s": flag_number(gateway.live_hop_s),
        "--live-resume-window": flag_number(gateway.live_resume_window_s),
        "--shutdown-live": gateway.shutdown_live,
        "--upload-drain-s": flag_number(gateway.upload_drain_s),
        "--max-audio-s": flag_number(gateway.max_audio_s),
        "--max-upload-bytes": str(gateway.max_upload_bytes),
        "--min-free-disk-mb": flag_number(gateway.min_free_disk_mb),
        "--retention-days": flag_number(gateway.retention_days),
        "--revise": "on" if gateway.revise and info.revise else "off",
        "--auth": gateway.auth.value,
        "--allowed-origin": ", ".join(gateway.allowed_origins) or "none",
    }
    return (
        f"ready: serving {info.name} backend, model {info.model_id}, on "
        f"{scheme}://{host}:{config.port} with "
        + ", ".join(f"{flag} {value}" for flag, value in settings.items())
    )


def _demo_limits(info: BackendInfo) -> str:
    """What the demo backend's banner says it lacks, from its info (the scripted test backend
    diarizes: the banner said "no diarization" over its S01-S03; a trial)."""
    limits = [f"{info.language.capitalize()} only"] if info.language else []
    if not info.diarization:
        limits.append("no diarization")
    return f": {', '.join(limits)}" if limits else ""


async def _restore_live_sessions(app: web.Application, unfinished: list[RestoredSession]) -> None:
    """Rebuild the live sessions a stopped (or crashed) server left unfinished (DESIGN 5.9)."""
    log.info("rebuilding %d live sessions left unfinished by the last run", len(unfinished))
    started = time.monotonic()
    transcriber = app[TRANSCRIBER_KEY]
    hop_s = app[CONFIG_KEY].gateway.live_hop_s
    revise = app[CONFIG_KEY].gateway.revise and transcriber.info.revise
    rebuilt = await app[SESSIONS_KEY].restore(unfinished, transcriber.open_session, hop_s, revise)
    log.info("rebuilt %d live sessions in %.1f s", rebuilt, time.monotonic() - started)
    # a key revoked (or removed) while the server was down ends the sessions rebuilt on it,
    # as a revocation while it runs does (their transcripts stored; docs/protocol.md)
    end_withdrawn_keys(app, app[AUTH_KEY].ring)


async def begin_drain(app: web.Application) -> None:
    """`on_shutdown`, first (the listener is closed): readiness fails, new work is refused, and
    the uploads in flight get `--upload-drain-s` from now to finish (gateway/drain.py)."""
    lifecycle = app[LIFECYCLE_KEY]
    lifecycle.draining = True
    lifecycle.drain_started_at = time.monotonic()
    drain_s = app[CONFIG_KEY].gateway.upload_drain_s
    lifecycle.upload_cutoff.start(drain_s)
    if lifecycle.num_uploads_in_flight:
        log.info(
            "shutting down: %d uploads in flight get up to %s s to finish (--upload-drain-s)",
            lifecycle.num_uploads_in_flight,
            flag_number(drain_s),
        )


async def close_live_sockets(app: web.Application) -> None:
    """`on_shutdown` (the listener is closed; the engine still runs): new live connections
    are refused, and open live sessions are drained (LiveRegistry.drain_all: kept for the next
    start where the sessions keep on shutdown, else each ended as by its client's `end`, its
    final transcript sent, then closed); then the captions subscribers, each told how its
    session ends, get LIVE_DRAIN_CLOSE_S to close before their connections are dropped."""
    app[LIFECYCLE_KEY].draining = True
    registry = app[REGISTRY_KEY]
    sessions = app[SESSIONS_KEY]
    keep = sessions.keeps_on_shutdown
    if keep:
        # counted over the sessions, not the registry's sockets (a trial saw "keeping 1
        # (1 detached)" with 2 kept)
        count = sessions.streaming()
        log.info(
            "shutting down: keeping %d live sessions (%d detached) for the next start: their "
            "clients resume there; %d ending first; %d with no audio not kept",
            count.with_audio,
            count.detached,
            len(sessions) - count.with_audio - count.no_audio,
            count.no_audio,
        )
    else:
        log.info("shutting down: draining %d live sessions", len(registry))
        if sessions.num_detached:
            log.info("shutting down: ending %d detached live sessions", sessions.num_detached)
    started = time.monotonic()
    # a kept session's overlays hear of the restart as it is kept, not after the ending ones
    await asyncio.gather(registry.drain_all(keep=keep), sessions.drain())
    if keep:  # any kept without a socket to see it through (an engine lost during the drain)
        sessions.end_subscriptions_for_restart()
    done = "kept for the next start" if keep else "drained"
    log.info("live sessions %s in %.1f s", done, time.monotonic() - started)
    # each overlay has its end queued now: one that stopped reading must not hold the stop
    await app[CAPTIONS_KEY].close_all(LIVE_DRAIN_CLOSE_S)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render every LivemeetError (and router 404/405s, and bugs) as an OpenAI-shaped error;
    count requests by route and status."""
    metrics = request.app[METRICS_KEY]
    started = time.monotonic()
    match = request.match_info
    plain_options = _is_plain_options(request)
    # the page's files are the only unnamed routes; no route (404, 405) is "unmatched"
    unmatched = match.http_exception is not None or plain_options
    route = match.route.name or ("unmatched" if unmatched else "web")
    try:
        try:
            if plain_options:
                raise web.HTTPMethodNotAllowed(request.method, _served_methods(match.route))
            response = await handler(request)
        except web.RequestPayloadError as exc:  # e.g. a body that does not inflate
            raise malformed_body(exc) from None
    except LivemeetError as exc:
        level = logging.WARNING if exc.http_status >= 500 else logging.INFO
        log.log(
            level,
            "%s %s: %s: %s%s",
            request.method,
            _log_path(request),
            exc.code,
            exc.message,
            refused_client(exc, request.remote),
        )
        response = _render_error(request, exc)
    except web.HTTPNotFound:
        response = _render_error(request, NotFound(f"no route for {request.path}"))
    except web.HTTPMethodNotAllowed as exc:
        # OPTIONS is there (with --allowed-origin) for browsers' CORS preflights only
        allowed = ", ".join(sorted(exc.allowed_methods - {hdrs.METH_OPTIONS}))
        message = f"{request.method} is not allowed on {request.path}; use {allowed}"
        response = _render_error(request, MethodNotAllowed(message))
        response.headers["Allow"] = allowed  # as HTTP clients expect with a 405
    # aiohttp-cors refusing a preflight, which says why in its text (the only 403 raised here:
    # nothing of ours raises it, so every HTTPForbidden is a refused preflight)
    except web.HTTPForbidden as exc:
        response = _render_error(request, RequestRejected(exc.text or "forbidden"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = _typed_http_error(exc)
        log.info("%s %s: %s: %s", request.method, _log_path(request), error.code, error.message)
        response = _render_error(request, error)
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError included
        # the client went away mid-request (mid-upload, most often): nobody to answer, and no
        # server bug; counted as nginx's 499, "client closed request"
        log.info("client closed the connection during %s %s", request.method, _log_path(request))
        response = web.Response(status=CLIENT_CLOSED_STATUS)  # aiohttp drops it: no transport
    except asyncio.CancelledError:  # aiohttp cancels the handler of a lost connection too
        log.info("request cancelled: %s %s", request.method, _log_path(request))
        metrics.requests.labels(route, str(CLIENT_CLOSED_STATUS)).inc()
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, _log_path(request))
        response = _render_error(request, InternalError("internal server error"))
    metrics.requests.labels(route, str(response.status)).inc()
    if log.isEnabledFor(logging.DEBUG):  # the access log, at --log-level debug
        log.debug(
            "%s %s: %d in %.1f ms (client %s%s)",
            request.method,
            _log_path(request),
            response.status,
            1e3 * (time.monotonic() - started),
            request.remote or "unknown",
            key_note(request),
        )
    return response


async def _expect_upload(request: web.Request) -> web.StreamResponse | None:
    """`Expect: 100-continue` on an upload (RFC 9110 section 10.1.1): a page of an origin not
    allowed, a refused API key, a Content-Encoding the server does not decode, a declared body
    over the limit, or an upload the server cannot take now (not ready or draining, short of
    disk, every session slot in use: `check_admission`) is answered (400, 401, 413, 503, 507,
    429) before the client sends the body, rendered and counted by the error middleware as any
    refusal. aiohttp answers 100 ahead of every middleware, so a client with a wrong key
    uploaded the whole file to learn that. Another Expect value never comes here: the server
    refuses it before routing (417, http_protocol.refuse_unknown_expectations)."""
    if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
        return None
    try:
        openai_api.check_upload_origin(request)
        await check_request_key(request)
        openai_api.check_content_encoding(request)
        openai_api.check_declared_size(request, request.app[CONFIG_KEY].gateway.max_upload_bytes)
        openai_api.check_admission(request.app)
    except LivemeetError as exc:
        return await error_middleware(request, functools.partial(_raise, exc))
    if request.version >= HttpVersion11:  # HTTP/1.0 has no interim responses
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response proper has not started
    return None


async def _raise(error: LivemeetError, request: web.Request) -> web.StreamResponse:
    raise error


def _typed_http_error(exc: web.HTTPException) -> LivemeetError:
    """An HTTP error aiohttp raised (a body over the app's `client_max_size` read whole: 413)
    as the error class of its status: it was rendered as `internal_error` (500's class) with
    the 4xx status, two answers in one body."""
    message = exc.text or exc.reason
    if exc.status == PayloadTooLarge.http_status:
        return PayloadTooLarge(message)
    if exc.status == ClientTimeout.http_status:
        return ClientTimeout(message)
    return InternalError(message) if exc.status >= 500 else InvalidRequest(message)


def _is_plain_options(request: web.Request) -> bool:
    """An OPTIONS request that is not a browser's CORS preflight (which has both `Origin` and
    `Access-Control-Request-Method`) but reached aiohttp-cors's preflight route: answered as
    a server without `--allowed-origin` answers it (405, `Allow`), where aiohttp-cors would
    refuse it as a failed preflight (a 400 `request_rejected` to a client that sent none)."""
    if request.method != hdrs.METH_OPTIONS or request.match_info.http_exception is not None:
        return False
    headers = request.headers
    return hdrs.ORIGIN not in headers or hdrs.ACCESS_CONTROL_REQUEST_METHOD not in headers


def _served_methods(route: web.AbstractRoute) -> set[str]:
    """The methods the resource of `route` serves (its preflight route's OPTIONS aside)."""
    resource = route.resource
    routes = list(resource) if isinstance(resource, web.Resource) else [route]
    return {r.method for r in routes} - {hdrs.METH_OPTIONS}


def _log_path(request: web.Request) -> str:
    """The request's path as sent, still percent-encoded: the decoded `request.path` may hold a
    newline (`%0A`), which would forge a line in the log."""
    return request.rel_url.raw_path


def _render_error(request: web.Request, error: LivemeetError) -> web.Response:
    request.app[METRICS_KEY].errors.labels(error.code).inc()
    return error_response(error)
