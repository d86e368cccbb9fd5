"""`livemeet serve`: run the gateway (HTTP upload API, live WebSocket, web page, metrics)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket
import ssl
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

from livemeet.audio.constants import (
    CHUNKED_PREFILL_SIZE,
    GIL_SWITCH_INTERVAL_S,
    KV_BLOCK_SIZES,
    KV_CACHE_DTYPES,
    LIVE_FORCED_BUDGET_STEP_TOKENS,
    MAX_AUDIO_S,
    MAX_LIVE_DECODE_STEPS,
    MAX_LIVE_HOP_LOAD,
    MAX_UPLOAD_BYTES,
    MAX_UPLOAD_MIN_SHARE,
    MIN_LIVE_HOP_LOAD,
    UPLOAD_CUTOFF_GRACE_S,
)
from livemeet.backends import BACKENDS, TEST_BACKENDS, check_backend
from livemeet.cli.stop_signal import INTERRUPTED_STATUS, stop_signal_interrupts
from livemeet.config import (
    LOG_FORMAT,
    SHUTDOWN_LIVE_MODES,
    AuthMode,
    GatewayConfig,
    ModelConfig,
    ServerConfig,
    UploadHold,
    flag_number,
)
from livemeet.engine.gc_pauses import freeze_startup_heap, thaw_heap
from livemeet.errors import ConfigError, EngineUnavailable
from livemeet.gateway.disk import (
    MIB,
    DiskGuard,
    exposed_dirs,
    make_private_dir,
    owner_root_writes_for,
    refusal_hint,
)
from livemeet.gateway.keys import LIFECYCLE_KEY, live_dir, tmp_dir, transcripts_dir
from livemeet.gateway.live_journal import journal_holder
from livemeet.session.vad import LiveVad

log = logging.getLogger("livemeet.serve")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the transcription API and live WebSocket", description=__doc__
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument(
        "--model",
        default=None,
        help="MOSS-TD checkpoint directory or hub id; omitted: the demo backend",
    )
    add_backend_flag(p)
    add_model_flags(p)
    add_scheduling_flags(p)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path("./livemeet-data"),
        help="where large uploads are spilled and transcripts kept; made if missing "
        "(default: ./livemeet-data, in the directory serve is started from)",
    )
    p.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate (enables https)")
    p.add_argument("--tls-key", type=Path, default=None, help="PEM private key for --tls-cert")
    p.add_argument(
        "--max-upload-bytes",
        type=int,
        default=MAX_UPLOAD_BYTES,
        help="largest upload body in bytes (413 payload_too_large; default %(default)d, 1 GiB)",
    )
    p.add_argument(
        "--max-audio-s",
        type=float,
        default=MAX_AUDIO_S,
        help="longest upload in seconds (413 audio_too_long; default %(default)g, 90 min); "
        "live sessions have no limit of their own: each hop prefills all audio heard so far, "
        "so a meeting is bounded by the model's 131,072-token context (~2.8 h of audio)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=GatewayConfig.max_sessions,
        help="open sessions (live and upload) at once; more get queue_full (default %(default)d)",
    )
    p.add_argument(
        "--max-live-sessions-per-client",
        type=int,
        default=GatewayConfig.max_live_sessions_per_client,
        metavar="N",
        help="live sessions one client may hold at once, detached ones waiting for a resume "
        "included (a resume is never refused); its next start gets too_many_sessions (4430). "
        "A client is its API key, or its address where no key is asked for (an IPv6 one by "
        "its /64; a loopback one, as a proxy on this machine, is not capped). 0: no cap "
        "(default %(default)d)",
    )
    p.add_argument(
        "--max-concurrent-decodes",
        type=int,
        default=GatewayConfig.max_concurrent_decodes,
        help="uploads decoded to PCM at once (each holds its decoded audio in memory; "
        "default %(default)d)",
    )
    p.add_argument(
        "--live-hop-s",
        type=float,
        default=GatewayConfig.live_hop_s,
        help="seconds of new audio between a live session's re-decodes, 0.1-5: a shorter hop "
        "shows words sooner and costs GPU time in proportion (default %(default)g)",
    )
    p.add_argument(
        "--live-max-speed",
        type=float,
        default=GatewayConfig.live_max_speed,
        help="x real time a live client may send audio at past a burst of a minute of audio; "
        "faster frames are read later (TCP backpressure), none dropped (default %(default)g)",
    )
    p.add_argument(
        "--revise",
        action=argparse.BooleanOptionalAction,
        default=GatewayConfig.revise,
        help="after a live session's transcript.final, re-decode the whole meeting offline from "
        "the KV its hops built and send it as transcript.revised, superseding the finals "
        "(MOSS-TD only: the demo cannot; --no-revise closes after the final; default: on)",
    )
    p.add_argument(
        "--live-resume-window",
        type=float,
        default=GatewayConfig.live_resume_window_s,
        metavar="SECONDS",
        help="seconds a live session whose socket dropped keeps transcribing and waits for "
        "its client to resume it (session id + resume token), then is ended as by 'end'; "
        "0 turns resume off. Sessions are kept in --data-dir: a server started again after a "
        "crash rebuilds them and waits as long for their clients (default %(default)g)",
    )
    p.add_argument(
        "--shutdown-live",
        choices=SHUTDOWN_LIVE_MODES,
        default=GatewayConfig.shutdown_live,
        help="what a graceful stop (SIGTERM, SIGINT: a restart, an upgrade) does to streaming "
        "live sessions: keep, each is kept in --data-dir, its client told the server is "
        "restarting (close 1012) and resumed by the next start, nothing lost, as after a "
        "crash; end, each is ended as by 'end' and gets its final transcript (close 1001), "
        "the rest of its audio left to the client. Sessions already ending finish either way; "
        "with --live-resume-window 0 it is end (default %(default)s)",
    )
    p.add_argument(
        "--upload-drain-s",
        type=float,
        default=GatewayConfig.upload_drain_s,
        metavar="SECONDS",
        help="what a graceful stop (SIGTERM, SIGINT) gives uploads in flight, a body still "
        "arriving included, to finish; those still running then get engine_unavailable (503, "
        "or a streamed upload's error event: retryable). Keep it under your supervisor's "
        "stop timeout (systemd TimeoutStopSec, Kubernetes terminationGracePeriodSeconds) "
        "(default %(default)g)",
    )
    p.add_argument(
        "--min-free-disk-mb",
        type=float,
        default=GatewayConfig.min_free_disk_mb,
        metavar="MIB",
        help="free space the data dir's disk keeps: below it new live sessions and uploads "
        "get storage_failed (507) and /readyz fails, until 256 MiB more are free, so none "
        "fails mid-meeting on a full disk; 0: no floor (default %(default)g)",
    )
    p.add_argument(
        "--retention-days",
        type=float,
        default=GatewayConfig.retention_days,
        metavar="DAYS",
        help="days stored transcripts (uploads' and live sessions') are kept, swept hourly; "
        "0 keeps them (default %(default)g)",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page origin (e.g. https://meet.example.com) besides the server's own "
        "that may open live sessions from a browser and call the HTTP API (CORS); "
        "repeatable; '*' allows any (default: none)",
    )
    p.add_argument(
        "--auth",
        choices=[m.value for m in AuthMode],
        default=GatewayConfig.auth.value,
        help="when the API asks for a key (`livemeet keys` makes them, in --data-dir): auto, "
        "once the data dir holds any key, active or revoked; keys, always (none made: nobody "
        "gets in); off, never. /healthz, /readyz, /metrics, the page and a session's captions "
        "and transcript (its captions token) need none (default %(default)s)",
    )
    p.add_argument(
        "--in-process-engine",
        action="store_true",
        help="run the backend in this process (tests, debugging)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="debug also logs every HTTP request and live or captions connection as it ends "
        "(method, path, status, time, client, API key id: the access log) and each upload's "
        "phases (receive, decode, transcribe, respond; default %(default)s)",
    )
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the flags, the TLS files, the data directory (made if missing, as a "
        "start makes it, and a probe file written in it and removed) and (MOSS-TD) the "
        "device, the checkpoint's config.json and --forced-output, then exit (0 valid, 2 "
        "with the error) without loading weights or binding the port, which only a start "
        "checks. A server running on the data directory passes (it is named: a start needs "
        "it stopped), so a new config can be checked before that server's restart",
    )
    p.set_defaults(func=run)


def add_backend_flag(p: argparse.ArgumentParser) -> None:
    """`--backend`, shared by `serve` and `transcribe`."""
    # named in the help, not `choices`: a backend registered later (register_backend) is
    # checked by check_backend, with the names registered then
    names = ", ".join(
        f"{name} (for tests: a scripted transcript, no model)" if name in TEST_BACKENDS else name
        for name in sorted(BACKENDS)
    )
    p.add_argument(
        "--backend",
        default=None,
        help=f"force a registered backend by name: {names} (default: demo without --model or "
        "--load-format dummy, else moss)",
    )


def add_model_flags(p: argparse.ArgumentParser, *, prefill_graphs: bool = True) -> None:
    """The MOSS-TD loading and engine flags shared by `serve` and `transcribe` (ModelConfig
    fields).
    `prefill_graphs`: the command's default for --prefill-graphs (a server captures them once;
    a one-shot `transcribe` would pay ~15 s of captures per run for little)."""
    p.add_argument(
        "--load-format",
        default="auto",
        choices=["auto", "safetensors", "dummy"],
        help="how to read --model's weights: auto and safetensors read them; dummy makes "
        "real-size random weights (benchmarks; no --model needed; default %(default)s)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="auto (the first GPU, else the CPU), cpu, cuda or cuda:N (default %(default)s)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights' and activations' dtype; auto: bfloat16 on a GPU, float32 on the CPU "
        "(default %(default)s)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=KV_CACHE_DTYPES,
        help="KV pool dtype; auto: the model's (default %(default)s)",
    )
    p.add_argument(
        "--kv-block-size",
        type=int,
        default=ModelConfig.kv_block_size,
        choices=KV_BLOCK_SIZES,
        help="tokens per paged-KV block (default %(default)d)",
    )
    p.add_argument(
        "--num-kv-blocks",
        type=int,
        default=None,
        help="KV pool size in blocks of --kv-block-size tokens (default: from free memory)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="cap on output tokens per request (default: scaled with the audio duration)",
    )
    p.add_argument(
        "--forced-output",
        default=None,
        help="benchmarks: a reference transcript [0.00][S01]text[1.20]... forced as the output",
    )
    p.add_argument(
        "--mem-fraction",
        type=float,
        default=0.85,
        help="fraction of the GPU's memory for weights + KV pool (the pool gets what the "
        "weights leave; CUDA graphs, prefill graphs and activations use the rest; <= 0.95; "
        "default %(default)g)",
    )
    p.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=CHUNKED_PREFILL_SIZE,
        help="largest prefill chunk of one request per engine step, in tokens "
        "(default %(default)d)",
    )
    p.add_argument(
        "--prefill-graphs",
        action=argparse.BooleanOptionalAction,
        default=prefill_graphs,
        help="CUDA: run steps that prefill as piecewise CUDA graphs, captured at start-up "
        f"(~15 s on an H200; default: {'on' if prefill_graphs else 'off'})",
    )


def add_scheduling_flags(p: argparse.ArgumentParser) -> None:
    """The engine's scheduling flags for uploads beside live sessions (ModelConfig fields):
    `serve` only; `transcribe` runs one upload at a time on the defaults."""
    p.add_argument(
        "--upload-batch-wait-ms",
        type=float,
        default=ModelConfig.upload_batch_wait_ms,
        help="ms a new upload may wait to be prefilled together with later arrivals (0: admit "
        "at once; default %(default)g)",
    )
    p.add_argument(
        "--upload-hold",
        choices=[h.value for h in UploadHold],
        default=ModelConfig.upload_hold.value,
        help="what a new upload waits for, up to --upload-batch-wait-ms: arrivals (while others "
        "decode, until as many wait as decode) or pipeline (that, and while the gateway is "
        "still receiving or decoding uploads; default %(default)s)",
    )
    p.add_argument(
        "--upload-step-budget-ms",
        type=float,
        default=ModelConfig.upload_step_budget_ms,
        help="ms of estimated GPU time per engine step while no live session is open (live "
        "sessions keep --live-step-budget-ms steps; one that opens meanwhile can find up to "
        "three such steps ahead of its first hop; at most a quarter hop; default %(default)g)",
    )
    p.add_argument(
        "--upload-min-share",
        type=float,
        default=ModelConfig.upload_min_share,
        help=f"of the engine's time that uploads keep while live sessions compete, their "
        f"audio's encoding included (0-{MAX_UPLOAD_MIN_SHARE:g}): more finishes uploads sooner "
        "and delays live captions; "
        "0 gives live work pure priority (default %(default)g)",
    )
    p.add_argument(
        "--live-step-budget-ms",
        type=float,
        default=ModelConfig.live_step_budget_ms,
        help="ms of estimated GPU time per engine step while live sessions are open (5-50): "
        "a hop decodes its new text one step per token, so under load a hop lasts about "
        "that many steps of this budget (default %(default)g)",
    )
    p.add_argument(
        "--live-decode-steps",
        type=int,
        default=ModelConfig.live_decode_steps,
        help=f"decode-only engine steps after each step that prefills live work, while the "
        f"most urgent live hop decodes (0-{MAX_LIVE_DECODE_STEPS}): its new text gets that many "
        "more tokens per prefill step, for one more pass over the weights each "
        "(default %(default)s)",
    )
    p.add_argument(
        "--live-forced-transcript-tokens",
        type=int,
        default=ModelConfig.live_forced_transcript_tokens,
        help="tokens of committed transcript a live hop prefills as forced assistant tokens, "
        "so it decodes only the new tail (our technique, not the reference's: unvalidated on "
        "real weights; 0 re-decodes the whole meeting every hop; default %(default)d)",
    )
    p.add_argument(
        "--live-forced-transcript-min-tokens",
        type=int,
        default=ModelConfig.live_forced_transcript_min_tokens,
        help="the least a session's hops force while the GPU is behind: the budget halves "
        "towards it while its hops take over --live-hop-load of a hop interval (smoothed) and "
        f"grows back by {LIVE_FORCED_BUDGET_STEP_TOKENS} tokens a hop while they are fast, so "
        f"it must be >= {LIVE_FORCED_BUDGET_STEP_TOKENS}; a value >= "
        "--live-forced-transcript-tokens keeps the budget fixed (default %(default)d)",
    )
    p.add_argument(
        "--live-hop-load",
        type=float,
        default=ModelConfig.live_hop_load,
        help="the share of a hop interval a live session's hops may take (smoothed) before its "
        "forced transcript budget halves; below half of it the budget grows back. Lower gives "
        f"faster partials under load and hops with less context ({MIN_LIVE_HOP_LOAD:g}-"
        f"{MAX_LIVE_HOP_LOAD:g}; default %(default)s)",
    )
    p.add_argument(
        "--live-draft",
        action=argparse.BooleanOptionalAction,
        default=ModelConfig.live_draft,
        help="a live hop drafts what the previous hop decoded after the same forced transcript "
        "and the engine verifies it greedily in the prefill: the same transcript in fewer "
        "decode steps (default: on)",
    )
    p.add_argument(
        "--live-vad",
        nargs="?",
        choices=[v.value for v in LiveVad],
        const=ModelConfig.live_vad,
        default=ModelConfig.live_vad,
        help="a live session's voice activity detector makes a hop due as soon as speech ends, "
        "instead of after a whole hop of new audio, and skips hops over audio without speech "
        "once everything heard is committed (at most 5 s): webrtc (webrtcvad) or silero "
        "(faster-whisper's Silero model: the demo extra; ~8x webrtc's CPU, fewer silent hops "
        "run, quiet speech missed more often; README). The bare flag: %(const)s; "
        "default %(default)s",
    )
    p.add_argument(
        "--no-live-vad",
        dest="live_vad",
        action="store_const",
        const=None,
        help="no live VAD: hops every whole hop of new audio, silence included",
    )


# ModelConfig fields that only `add_scheduling_flags` sets (absent: the defaults)
SCHEDULING_FIELDS = (
    "upload_batch_wait_ms",
    "upload_hold",
    "upload_step_budget_ms",
    "upload_min_share",
    "live_step_budget_ms",
    "live_decode_steps",
    "live_draft",
    "live_vad",
    "live_forced_transcript_tokens",
    "live_forced_transcript_min_tokens",
    "live_hop_load",
)


def model_config_from_args(args: argparse.Namespace) -> ModelConfig:
    """The ModelConfig for parsed `--model`/`--backend`/`add_model_flags` arguments, and
    `add_scheduling_flags` ones where the command has them."""
    scheduling = {f: getattr(args, f) for f in SCHEDULING_FIELDS if hasattr(args, f)}
    if "upload_hold" in scheduling:
        scheduling["upload_hold"] = UploadHold(scheduling["upload_hold"])
    if scheduling.get("live_vad") is not None:
        scheduling["live_vad"] = LiveVad(scheduling["live_vad"])
    return ModelConfig(
        model=args.model,
        backend=args.backend,
        load_format=args.load_format,
        device=args.device,
        dtype=args.dtype,
        forced_output=args.forced_output,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_dtype=args.kv_cache_dtype,
        kv_block_size=args.kv_block_size,
        max_new_tokens=args.max_new_tokens,
        prefill_graphs=args.prefill_graphs,
        mem_fraction=args.mem_fraction,
        chunked_prefill_size=args.chunked_prefill_size,
        **scheduling,
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The validated ServerConfig for parsed `serve` arguments. Raises ConfigError."""
    config = ServerConfig(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        in_process_engine=args.in_process_engine,
        model=model_config_from_args(args),
        gateway=GatewayConfig(
            max_upload_bytes=args.max_upload_bytes,
            max_audio_s=args.max_audio_s,
            max_sessions=args.max_sessions,
            max_live_sessions_per_client=args.max_live_sessions_per_client,
            max_concurrent_decodes=args.max_concurrent_decodes,
            live_hop_s=args.live_hop_s,
            live_max_speed=args.live_max_speed,
            live_resume_window_s=args.live_resume_window,
            shutdown_live=args.shutdown_live,
            upload_drain_s=args.upload_drain_s,
            min_free_disk_mb=args.min_free_disk_mb,
            retention_days=args.retention_days,
            revise=args.revise,
            allowed_origins=tuple(args.allowed_origin),
            auth=AuthMode(args.auth),
        ),
    )
    config.validate()
    return config


def preflight_model(model: ModelConfig) -> None:
    """What a start would load, checked without loading it (`--check-config`): the backend is
    registered; for MOSS-TD, the device exists, torch can make its cache directory (a
    writable temporary directory), a named checkpoint resolves, its config.json
    is this model's, its safetensors headers name every tensor in the shape the model needs,
    its tokenizer and prompt settings load, and the forced-output transcript parses; the
    packages of the demo extra that the backend (or MOSS-TD's `--live-vad silero`) needs are
    installed. No weight is read. Raises ConfigError with the reason a start would give."""
    check_backend(model)
    if model.backend_name == "demo":
        # as a start says it (create_demo): --check-config said only "configuration ok"
        from livemeet.backends.demo import demo_packages, warn_of_unused_settings

        warn_of_unused_settings(model)
        demo_packages()  # `pip install livemeet` without [demo] passed, then failed to start
    if model.backend_name != "moss":
        return
    if model.live_vad is not None:
        from livemeet.session.vad import live_classifier

        live_classifier(LiveVad(model.live_vad))  # Silero: the demo extra, as a start checks
    from livemeet.backends.forced_output import read_forced_output
    from livemeet.models.loader import (
        check_checkpoint,
        check_torch_cache_dir,
        checkpoint_tokenizer,
        read_checkpoint_config,
        resolve_checkpoint,
        resolve_device,
    )
    from livemeet.models.prompt import PromptConfig

    resolve_device(model.device)
    check_torch_cache_dir()
    if model.model is not None:
        root = resolve_checkpoint(model.model)
        if model.load_format == "dummy":  # the geometry only: no weights are read
            read_checkpoint_config(root)
        else:
            check_checkpoint(root)
        checkpoint_tokenizer(model.model, root)
        PromptConfig.from_checkpoint(root)
    if model.forced_output is not None:
        read_forced_output(Path(model.forced_output))


def check_auth(config: ServerConfig) -> None:
    """Say who may use the API of a server started on `config` (`--check-config`): its --auth
    and the data dir's keys, active and revoked, as a start reads them. Raises ConfigError for
    a key store a start could not read (`read_keys`: not under --auth off)."""
    from livemeet.gateway.api_keys import ApiKeyStore, store_path
    from livemeet.gateway.auth_http import read_keys, report_auth

    mode = config.gateway.auth
    store = ApiKeyStore(store_path(config.data_dir))
    try:
        report_auth(mode, read_keys(mode, store), config.host, config.data_dir)
    finally:
        store.close()


def ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    """A server TLS context from --tls-cert/--tls-key (browsers need https for the mic on
    other machines). Raises ConfigError for unreadable files."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load --tls-cert/--tls-key: {exc}") from exc
    return context


def run(args: argparse.Namespace) -> int:
    """`livemeet serve`: check the configuration, build the app and serve until stopped. Returns
    the exit status: 0 after a clean stop (and for a valid `--check-config`), 1 when a second
    stop signal cut the drain short, 2 for a bad configuration, a model or engine that would
    not start, or an address it cannot listen on (each logged as one line), 130 for a stop
    signal (SIGTERM, SIGINT) before it served."""
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format=LOG_FORMAT)
    # aiohttp handles SIGTERM once its loop runs; before, the checks stop at it (stop_signal.py)
    try:
        with stop_signal_interrupts():
            return _run(args)
    except KeyboardInterrupt:
        log.info("livemeet stopped by a signal before it served")
        return INTERRUPTED_STATUS


def _run(args: argparse.Namespace) -> int:
    from livemeet.gateway.app import cors_package, create_app
    from livemeet.gateway.engine_client import WorkerLoadFailed

    try:
        config = config_from_args(args)
        context = ssl_context(config)
        # what a start would refuse (live_journal.py); --check-config vets a config for the
        # restart of the server running on the data dir (a deploy gate), so it only says so
        holder = journal_holder(live_dir(config))
        if holder is not None and not args.check_config:
            raise ConfigError(f"cannot use --data-dir {config.data_dir}: {holder} is using it")
        check_data_dir(config)
        if config.gateway.allowed_origins:
            cors_package()
        if args.check_config:
            preflight_model(config.model)
            check_auth(config)
            if holder is not None:
                log.info(
                    "--data-dir %s is in use now by %s: a start on it needs that server "
                    "stopped first (as a restart does)",
                    config.data_dir,
                    holder,
                )
            log.info("configuration ok (no weights loaded, nothing listened on)")
            return 0
        check_listen(config.host, config.port)
        app = create_app(config)
    except ConfigError as exc:
        log.error("%s", exc.message)
        return 2
    # the event loop and the decode threads hand each upload back and forth (GIL_SWITCH_INTERVAL_S)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    # full collections would walk the imports' objects while events wait (engine/gc_pauses.py)
    freeze_startup_heap()
    scheme = "https" if context else "http"
    log.info(
        "livemeet starting on %s://%s:%d (data dir %s): it listens once the model is loaded",
        scheme,
        config.host,
        config.port,
        config.data_dir,
    )
    try:
        _run_app(app, config, context)
    except web.GracefulExit:  # SystemExit(1): a second stop signal cut the first's stop
        log.warning(
            "a second stop signal: stopped at once%s, without the rest of the drain (uploads "
            "in flight cut unanswered, live sessions as the drain had left them)",
            _stop_took(app),
        )
        return 1
    except (ConfigError, EngineUnavailable) as exc:  # start-up: a bad checkpoint, no engine
        log.error("%s: %s", exc.code, exc.message)
        return 2
    except WorkerLoadFailed as exc:
        # the engine's load failed on what no check foresaw (a read-only /tmp was one): the
        # worker logged its traceback; this was a second one, and exit 1 (the container trial).
        # Any other InternalError (the gateway's start or stop: a bug) keeps its traceback.
        log.error("%s: %s (its traceback is above)", exc.code, exc.message)
        return 2
    except OSError as exc:
        if exc.errno not in _BIND_ERRNOS:
            raise
        # the bind, after check_listen passed (another process was faster)
        log.error("config_error: %s", cannot_listen(_endpoint(config.host, config.port), exc))
        return 2
    finally:
        thaw_heap()
    log.info("livemeet stopped%s", _stop_took(app))
    return 0


def _stop_took(app: web.Application) -> str:
    """How long the graceful stop took, for the last log line (an operator checks it against
    the supervisor's stop timeout); nothing where no stop began (a failed start)."""
    began_at = app[LIFECYCLE_KEY].drain_started_at
    return "" if began_at is None else f" {time.monotonic() - began_at:.1f} s after the stop began"


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


DATA_DIR_PROBE_PREFIX = ".livemeet-probe-"  # not the spill files' prefix: a start removes those


def check_data_dir(config: ServerConfig) -> None:
    """Make the data directory's subdirectories the server writes (gateway/keys.py), as a
    start does, and write and remove a probe file in each. Asking os.access instead said yes
    to root for places no one can write (/proc): --check-config passed a data directory a
    start refused. Nothing here needs the data dir free of a running server (`run` checks
    that), whose own files these probes leave alone. Raises ConfigError naming the path and
    the OS error."""
    where = f"cannot use --data-dir {config.data_dir}"
    directories = [tmp_dir(config), transcripts_dir(config), live_dir(config)]
    for directory in directories:
        try:
            make_private_dir(directory)
        except FileExistsError as exc:  # exist_ok: what is there is not a directory
            raise ConfigError(f"{where}: {directory} is not a directory") from exc
        except OSError as exc:  # e.g. a file as a parent, /proc, no permission
            failed = Path(exc.filename or directory)
            raise ConfigError(
                f"{where}: cannot create {failed}: {exc.strerror or exc}"
                f"{refusal_hint(exc, failed, config.data_dir)}"
            ) from exc
        try:
            fd, probe = tempfile.mkstemp(prefix=DATA_DIR_PROBE_PREFIX, dir=directory)
        except OSError as exc:  # e.g. a read-only file system, a full disk
            raise ConfigError(
                f"{where}: cannot write a file in {directory}: {exc.strerror or exc}"
                f"{refusal_hint(exc, directory, config.data_dir)}"
            ) from exc
        os.close(fd)
        os.unlink(probe)
    owner = owner_root_writes_for(config.data_dir)
    if owner is not None:
        log.warning(
            "serve runs as root on --data-dir %s, which is %s's: what it writes there will be "
            "root's, and a server run as %s is refused it later; run serve as %s",
            config.data_dir,
            owner,
            owner,
            owner,
        )
    exposed = exposed_dirs(directories)
    if exposed:  # made by hand, or by a livemeet that made them so
        log.warning(
            "%s: readable by every user of this machine, and they hold meetings' audio and "
            "transcripts: chmod 700 them (livemeet makes its directories so)",
            ", ".join(exposed),
        )
    floor_mb = config.gateway.min_free_disk_mb
    disk = DiskGuard(config.data_dir, int(floor_mb * MIB))  # as the server checks it
    if disk.low:  # it would start, and refuse every new session
        log.warning(
            "--data-dir %s has %.0f MiB free, under --min-free-disk-mb %s: the server would "
            "refuse new live sessions and uploads (free space, or lower the floor)",
            config.data_dir,
            (disk.free_bytes() or 0) / MIB,
            flag_number(floor_mb),
        )


def check_listen(host: str, port: int) -> None:
    """Raise ConfigError when `host:port` cannot be listened on now (an unknown host, a port
    another process holds, no permission), so `serve` says so in one line before it loads a
    model for minutes. Probes as asyncio's server binds: every address the host resolves to,
    SO_REUSEADDR (a port in TIME_WAIT is free, one LISTENing is not), IPv6 sockets IPv6-only,
    address families the kernel lacks skipped. A bind that fails later anyway (a race) is
    reported the same way."""
    where = _endpoint(host, port)
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {where}: {exc.strerror}") from exc
    for family, kind, proto, _, address in infos:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:
            continue  # e.g. no IPv6 in this kernel: asyncio skips the family too
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise ConfigError(cannot_listen(where, exc)) from exc


def cannot_listen(where: str, exc: OSError) -> str:
    """What a failed bind of `where` says: the system's reason, and for a port in use what to
    do ("Address already in use" alone: a new user's trial)."""
    hint = ""
    if exc.errno == errno.EADDRINUSE:
        hint = " (another server holds the port: stop it, or pick another with --port)"
    return f"cannot listen on {where}: {exc.strerror}{hint}"


# what a failed bind raises: the only OSErrors `serve` reports as "cannot listen"
_BIND_ERRNOS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)


def _run_app(app: web.Application, config: ServerConfig, context: ssl.SSLContext | None) -> None:
    loop = asyncio.new_event_loop()  # run_app runs it, and closes it
    if hasattr(signal, "SIGHUP"):  # not on Windows
        # a hang-up (the terminal or SSH session that started the server closed) stops it as
        # SIGTERM and SIGINT do, its drain included: by default it killed the server with
        # nothing drained (an operations trial)
        loop.add_signal_handler(signal.SIGHUP, _hang_up)
    web.run_app(
        app,
        loop=loop,
        host=config.host,
        port=config.port,
        ssl_context=context,
        print=None,
        access_log=None,
        # a client that disconnects cancels its handler, whose cleanup aborts its engine
        # session: the GPU stops working for nobody (aiohttp's default lets it run to the end)
        handler_cancellation=True,
        # after the drain (the live sessions', then the uploads' --upload-drain-s, which cuts
        # those still running with an answer): what is left is cancelled, unanswered
        shutdown_timeout=config.gateway.upload_drain_s + UPLOAD_CUTOFF_GRACE_S,
    )


def _hang_up() -> None:
    raise web.GracefulExit  # as aiohttp's own SIGTERM and SIGINT handlers do
