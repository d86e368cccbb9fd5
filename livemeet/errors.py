"""The error classes of livemeet and the one table that maps each to an HTTP status and a
WebSocket close code.

Every error that reaches a client is a `LivemeetError`. The gateway renders it as an
OpenAI-shaped JSON body (`{"error": {"message", "type", "param", "code"}}`) with `http_status`,
or, on a WebSocket, as an `{"type": "error", "code", "message", "retryable"}` frame followed by
a close with `close_code`. Close codes 4000-4999 are reserved for applications by RFC 6455
section 7.4.2; ours mirror the HTTP status where that status is used by one class only.
"""

from __future__ import annotations

from typing import ClassVar


class LivemeetError(Exception):
    """Base class: a typed, client-visible failure.

    Subclasses fix `code` (a stable machine-readable string), `http_status`, `close_code`
    and whether retrying the same request later may succeed (`retryable`). `param`, when
    known, names the request parameter at fault (the `param` of OpenAI's error body).
    """

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500
    close_code: ClassVar[int] = 4500
    retryable: ClassVar[bool] = False

    def __init__(
        self, message: str, *, param: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        # s after which a retry may succeed, where known (HTTP Retry-After; else 1 s)
        self.retry_after_s = retry_after_s

    def to_dict(self) -> dict[str, object]:
        """The WebSocket `error` event body (without its `type` field)."""
        return {"code": self.code, "message": self.message, "retryable": self.retryable}


class InternalError(LivemeetError):
    """A bug or an unexpected failure inside livemeet."""


class ConfigError(LivemeetError):
    """Invalid configuration or checkpoint; raised at start-up or when loading a model."""

    code = "config_error"
    http_status = 500
    close_code = 4501


class InvalidRequest(LivemeetError):
    """A malformed request: missing field, bad parameter value, bad JSON."""

    code = "invalid_request"
    http_status = 400
    close_code = 4400


class BadAudio(LivemeetError):
    """Audio that cannot be decoded or used: not audio, truncated, empty, bad sample rate."""

    code = "bad_audio"
    http_status = 400
    close_code = 4415


class ProtocolError(LivemeetError):
    """A live-protocol violation: message out of order, unknown type, odd PCM byte count."""

    code = "protocol_error"
    http_status = 400
    close_code = 4402


class Unauthorized(LivemeetError):
    """A missing, wrong or revoked API key; a wrong resume or captions token.

    `challenge`: the HTTP `WWW-Authenticate` value (RFC 9110 section 11.6.1) telling the
    client which credentials to send: `Bearer` for an API key, `CaptionsToken` for a captions
    token (gateway/session_tokens.py). Every one raised over HTTP needs one."""

    code = "unauthorized"
    http_status = 401
    close_code = 4401

    def __init__(
        self, message: str, *, param: str | None = None, challenge: str | None = None
    ) -> None:
        super().__init__(message, param=param)
        self.challenge = challenge


class NotFound(LivemeetError):
    """An unknown transcription, session or model."""

    code = "not_found"
    http_status = 404
    close_code = 4404


class SessionTakenOver(LivemeetError):
    """A live session was resumed on another socket; this one no longer carries it. Not
    retryable: the other socket (a reconnected client) has the session now."""

    code = "session_taken_over"
    http_status = 409
    close_code = 4409


class MethodNotAllowed(LivemeetError):
    """An HTTP method the route does not serve (the response carries `Allow`)."""

    code = "method_not_allowed"
    http_status = 405
    close_code = 4405


class ExpectationFailed(LivemeetError):
    """An `Expect` header the server cannot meet: any but `100-continue` (RFC 9110 section
    10.1.1)."""

    code = "expectation_failed"
    http_status = 417
    close_code = 4417


class ClientTimeout(LivemeetError):
    """The client sent nothing (not even a keepalive) for too long."""

    code = "client_timeout"
    http_status = 408
    close_code = 4408


class RequestRejected(LivemeetError):
    """A well-formed request that livemeet refuses by policy."""

    code = "request_rejected"
    http_status = 400
    close_code = 4403


class PayloadTooLarge(RequestRejected):
    """An upload body over the configured byte limit."""

    code = "payload_too_large"
    http_status = 413
    close_code = 4413


class TooLong(RequestRejected):
    """Audio longer than `MAX_AUDIO_S` (or the configured limit)."""

    code = "audio_too_long"
    http_status = 413
    close_code = 4414


class HeadersTooLarge(RequestRejected):
    """A request line or header field over the HTTP parser's limit (aiohttp's 8190 bytes); the
    status is RFC 6585's, as Node.js answers for an oversized request head."""

    code = "headers_too_large"
    http_status = 431
    close_code = 4431


class QueueFull(RequestRejected):
    """The server is at capacity; retry later."""

    code = "queue_full"
    http_status = 429
    close_code = 4429
    retryable = True


class TooManySessions(RequestRejected):
    """Live: the client (its API key, or its address where the server asks for no key) holds
    as many live sessions as one client may (`serve --max-live-sessions-per-client`), so
    that one client cannot take every session slot; retry once one of its own has ended.
    429 as a server at capacity, with a close code of its own: the remedy differs (the
    client ends a session of its own; an operator raises the cap, not the server's size)."""

    code = "too_many_sessions"
    http_status = 429
    close_code = 4430
    retryable = True


class EngineUnavailable(LivemeetError):
    """The engine is not ready, has failed, or the server is draining."""

    code = "engine_unavailable"
    http_status = 503
    close_code = 4503
    retryable = True


class ServerRestarting(LivemeetError):
    """Live: the server is stopping to start again (SIGTERM with the live journal and resume
    on) and keeps the session for its next start: the client resumes it there, with its
    session id and resume token, once the server answers again. Closed with 1012, RFC 6455's
    "Service Restart" (IANA WebSocket close code registry); HTTP 503 as a draining server's."""

    code = "server_restarting"
    http_status = 503
    close_code = 1012
    retryable = True


class StorageFailed(LivemeetError):
    """The server could not store what it must keep durable (a live session's audio, finals or
    names in its journal: disk full, read-only or failing storage). RFC 4918's 507 Insufficient
    Storage, a condition it calls temporary: retryable once the storage is fixed or freed."""

    code = "storage_failed"
    http_status = 507
    close_code = 4507
    retryable = True


class RevisionFailed(LivemeetError):
    """A live session's revision (`transcript.revised`, DESIGN 5.7) did not come: the re-decode
    failed, was cancelled (shutdown) or ran out of time. The session itself succeeded: its
    `transcript.final` stands, so the socket closes normally (1000) after this error."""

    code = "revision_failed"
    http_status = 500
    close_code = 1000


ERROR_CLASSES: tuple[type[LivemeetError], ...] = (
    InternalError,
    ConfigError,
    InvalidRequest,
    BadAudio,
    ProtocolError,
    Unauthorized,
    NotFound,
    SessionTakenOver,
    MethodNotAllowed,
    ExpectationFailed,
    ClientTimeout,
    RequestRejected,
    PayloadTooLarge,
    TooLong,
    HeadersTooLarge,
    QueueFull,
    TooManySessions,
    EngineUnavailable,
    ServerRestarting,
    StorageFailed,
    RevisionFailed,
)


def unexpected_text(exc: BaseException) -> str:
    """An unexpected exception (a bug, a failing device) as a client hears of it, in an
    `internal_error`'s message: its class, not its text, which may name the server's files,
    devices or memory. Whoever says this logs the exception whole (log.exception)."""
    return f"{type(exc).__name__} (an internal error: the server's log has its details)"


def error_for_code(code: str, message: str) -> LivemeetError:
    """Rebuild a typed error from its `code` (e.g. after crossing the engine process boundary).

    Unknown codes become `InternalError`.
    """
    for cls in ERROR_CLASSES:
        if cls.code == code:
            return cls(message)
    return InternalError(message)
