"""Rendering `LivemeetError` for clients: OpenAI-shaped JSON over HTTP, `error` frames on WS.

The status and close code always come from the error class (livemeet/errors.py), never from
the call site. OpenAI error body: `{"error": {"message", "type", "param", "code"}}`, where
`type` is OpenAI's coarse category (`invalid_request_error` for 4xx, `server_error` for 5xx).
"""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

from livemeet.errors import LivemeetError, Unauthorized


def openai_error_type(error: LivemeetError) -> str:
    """OpenAI's `error.type` for an error: the 4xx/5xx split the OpenAI API uses."""
    return "server_error" if error.http_status >= 500 else "invalid_request_error"


def error_body(error: LivemeetError) -> dict[str, Any]:
    """The OpenAI-shaped error object; `param` is the error's own (LivemeetError.param)."""
    return {
        "error": {
            "message": error.message,
            "type": openai_error_type(error),
            "param": error.param,
            "code": error.code,
        }
    }


def error_response(error: LivemeetError) -> web.Response:
    """A JSON HTTP response with the error's status. Retryable errors carry Retry-After:
    the error's `retry_after_s` where it knows one (whole seconds, rounded up), else 1; a
    refused API key carries `WWW-Authenticate` (Unauthorized.challenge)."""
    headers: dict[str, str] = {}
    if error.retryable:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s or 1)))
    if isinstance(error, Unauthorized) and error.challenge is not None:
        headers["WWW-Authenticate"] = error.challenge
    return web.Response(
        status=error.http_status,
        text=json.dumps(error_body(error)),
        content_type="application/json",
        headers=headers,
    )


def ws_error_frame(error: LivemeetError) -> str:
    """The WS `error` event: `{"type": "error", "code", "message", "retryable"}`."""
    return json.dumps({"type": "error", **error.to_dict()})
