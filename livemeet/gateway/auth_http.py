"""API keys on the gateway (gateway/auth.py is the policy, gateway/api_keys.py the store):
the app's `KeyGuard`, the middleware that asks the HTTP API for a key, and the cleanup context
that loads the keys before the server serves and keeps them current while it runs.

Which requests need a key: every named route but PUBLIC_ROUTES (health, readiness and metrics
for operators and probes, the page's files, and a live session's captions and transcript,
which its captions token opens: a capability the session's client hands to an overlay) and
SELF_CHECKED_ROUTES (`/v1/live` checks its key itself, ws_live.py: the key may come in
`start`, and a refusal there is an `error` frame and close 4401 on an accepted handshake).
Unnamed routes are the page's files. A CORS preflight (OPTIONS) never needs one: browsers send
no credentials with it. A request to no route gets its 404 or 405 without a key: it reaches
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import hdrs, web

from livemeet.audio.constants import API_KEYS_RELOAD_INTERVAL_S
from livemeet.config import AuthMode
from livemeet.errors import ConfigError, LivemeetError, Unauthorized
from livemeet.gateway.api_keys import ApiKeyStore
from livemeet.gateway.auth import (
    API_KEY_HEADER,
    ApiKey,
    AuthFailure,
    KeyRing,
    authenticate,
    closing_advice,
    describe,
    is_loopback_host,
    keys_required,
    presented_key,
    refusal,
)
from livemeet.gateway.keys import API_KEY_ID_KEY, AUTH_KEY, CONFIG_KEY
from livemeet.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

PUBLIC_ROUTES = frozenset({"healthz", "readyz", "metrics", "web", "captions", "session_transcript"})
SELF_CHECKED_ROUTES = frozenset({"live"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class KeyGuard:
    """The API-key check of one app: its `mode` and the store's keys as last read (`ring`).
    `authenticate` works on them in memory; `watch` reads the store again (off the event loop)
    every API_KEYS_RELOAD_INTERVAL_S when it changed, and `authenticate` does at once for a
    key it does not know (one made a moment ago by a script that uses it next). Each listener
    (`on_change`) is called with the keys read whenever they changed (on the loop, at once:
    a request checked after the change sees it, and a live session's key revoked meanwhile
    is ended by the listener ws_live.py gives)."""

    def __init__(self, mode: AuthMode, store: ApiKeyStore, metrics: GatewayMetrics) -> None:
        self.mode = mode
        self.store = store
        self.ring = KeyRing()
        self._metrics = metrics
        self._refreshing: asyncio.Task[None] | None = None
        self._problem: str | None = None  # the last read's failure, logged once
        self._listeners: list[Callable[[KeyRing], None]] = []

    def on_change(self, listener: Callable[[KeyRing], None]) -> None:
        """Call `listener` (synchronous, non-blocking) with the keys each time they changed
        while the server runs (not for the first read, `load`)."""
        self._listeners.append(listener)

    def load(self) -> None:
        """Read the keys (at start, before serving; blocking; `read_keys`). Raises
        ConfigError."""
        self.ring = read_keys(self.mode, self.store)

    async def authenticate(self, presented: str | None, *, live: bool = False) -> ApiKey | None:
        """The key that lets a request that presented `presented` (None: none) in, or None
        where no key is needed. Raises Unauthorized (counted by reason); `live`: for a live
        session (whose key may also come in `start`: the message says so)."""
        verdict = authenticate(self.mode, self.ring, presented)
        if verdict.failure is AuthFailure.WRONG:
            # maybe made since the last read; a flood of wrong keys costs a stat and a PRAGMA
            # each, in one shared read at a time
            await self.refresh()
            verdict = authenticate(self.mode, self.ring, presented)
        if verdict.failure is not None:
            self._metrics.auth_failures.labels(verdict.failure.value).inc()
            raise refusal(verdict, live=live)
        return verdict.key

    async def refresh(self) -> None:
        """Read the keys again if the store changed; concurrent callers share one read. A
        store that cannot be read (or was removed) leaves the keys read last in force, and the
        log says so once: a failing disk never opens the server."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh(), name="api-keys-read")
        await asyncio.shield(self._refreshing)

    async def watch(self) -> None:
        """Refresh every API_KEYS_RELOAD_INTERVAL_S, until cancelled."""
        while True:
            await asyncio.sleep(API_KEYS_RELOAD_INTERVAL_S)
            await self.refresh()

    async def close(self) -> None:
        """Close the store, after a read under way (its thread uses the connection)."""
        if self._refreshing is not None:
            await asyncio.gather(self._refreshing, return_exceptions=True)
        self.store.close()

    async def _refresh(self) -> None:
        try:
            ring = await asyncio.to_thread(self.store.ring_if_changed)
        except ConfigError as exc:
            if exc.message != self._problem:
                log.warning("%s: the API keys read before stay in force", exc.message)
                self._problem = exc.message
            return
        self._problem = None
        if ring is not None and ring != self.ring:
            self.ring = ring
            log.info("API keys changed: %s", describe(self.mode, ring, self.store.path.parent))
            for listener in self._listeners:
                try:
                    listener(ring)
                except Exception:  # a bug there must not stop the keys' reloads
                    log.exception("API keys changed: a listener failed")


def read_keys(mode: AuthMode, store: ApiKeyStore) -> KeyRing:
    """The store's keys, as a start reads them. Raises ConfigError where the store cannot be
    read, but under `--auth off`, which never uses a key: there the keys only shape the
    start's advice, so an unreadable store is warned of and counts as none, and `--auth off`
    stays the way into a server whose store broke."""
    try:
        return store.ring_if_changed() or KeyRing()
    except ConfigError as exc:
        if mode is not AuthMode.OFF:
            raise
        log.warning("%s (--auth off reads no key: the server runs without them)", exc.message)
        return KeyRing()


def report_auth(mode: AuthMode, ring: KeyRing, host: str, data_dir: Path) -> None:
    """Log who may use the API of a server on `data_dir` listening on `host` with `ring`'s
    keys (its start, `serve --check-config`): a warning where nobody can, or where anyone who
    reaches a host other machines may reach can."""
    summary = describe(mode, ring, data_dir)
    if keys_required(mode, ring) and ring.num_active == 0:
        log.warning("%s", summary)
    else:
        log.info("%s", summary)
    if not keys_required(mode, ring) and not is_loopback_host(host):
        log.warning(
            "THE API IS OPEN: no API key is asked for (--auth %s) while listening on %s, "
            "which other machines may reach: %s, or listen on 127.0.0.1 behind an "
            "authenticating proxy",
            mode.value,
            host or "every interface",
            closing_advice(mode, ring, data_dir),
        )


def request_key(request: web.Request) -> str | None:
    """The key a request presents in its headers (auth.presented_key)."""
    return presented_key(
        request.headers.get(hdrs.AUTHORIZATION), request.headers.get(API_KEY_HEADER)
    )


def needs_key(request: web.Request) -> bool:
    """Whether the middleware asks `request` for a key (the module docstring says which)."""
    if request.method == hdrs.METH_OPTIONS:
        return False
    match = request.match_info
    if match.http_exception is not None:
        return False
    name = match.route.name
    return name is not None and name not in PUBLIC_ROUTES and name not in SELF_CHECKED_ROUTES


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a request that needs a key without a valid one: Unauthorized, which the error
    middleware (outside this one) renders as a 401 with `WWW-Authenticate`, before the
    handler reads any of the body."""
    await check_request_key(request)
    return await handler(request)


async def check_request_key(request: web.Request) -> None:
    """Where `request` needs a key (`needs_key`), check the one it presents; the accepted
    key's id goes into the request (`API_KEY_ID_KEY`, for the handler's log lines). Raises
    Unauthorized. The middleware's check, also made from an upload's `Expect: 100-continue`
    before its body comes (app._expect_upload)."""
    if needs_key(request):
        key = await request.app[AUTH_KEY].authenticate(request_key(request))
        if key is not None:
            request[API_KEY_ID_KEY] = key.key_id  # the access log line names it (app.py)


def key_note(request: web.Request) -> str:
    """What a log line says of the API key `request` was let in with: its id (never the
    key), or nothing where none was needed (`check_request_key`)."""
    key_id = request.get(API_KEY_ID_KEY)
    return "" if key_id is None else f", API key {key_id}"


def refused_client(error: LivemeetError, remote: str | None) -> str:
    """What the log line of a refused request adds: for `unauthorized`, the client's address
    (request.remote), so an operator can tell a misconfigured client from someone trying keys
    or tokens; for any other refusal, nothing."""
    if not isinstance(error, Unauthorized):
        return ""
    return f" (client {remote or 'unknown'})"


async def key_watch(app: web.Application) -> AsyncIterator[None]:
    """Cleanup context: read the keys before the server serves (ConfigError when the store
    cannot be read), say who may use the API, and keep the keys current until shutdown."""
    guard = app[AUTH_KEY]
    await asyncio.to_thread(guard.load)
    config = app[CONFIG_KEY]
    report_auth(guard.mode, guard.ring, config.host, config.data_dir)
    # --auth off never looks at a key: a store read again would only warn of its failures
    watcher = None
    if guard.mode is not AuthMode.OFF:
        watcher = asyncio.create_task(guard.watch(), name="api-keys")
    try:
        yield
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await guard.close()
