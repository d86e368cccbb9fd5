"""`GET /v1/sessions/{id}/transcript`: a live session's transcript, rendered server-side by the
writers of `GET /v1/transcriptions/{id}` (livemeet/transcript/formats.py).

While the session runs: its finals so far over the audio received so far; once its
`transcript.final` came: that transcript, from the session while the server holds it, then
from the TranscriptStore (which keeps it across restarts). Readable with the session's
`captions_token` (`?token=`), as its captions are: session ids come from the backend and may
be guessable. The response header `X-Livemeet-Transcript-Status` says which it is.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from livemeet.errors import Unauthorized
from livemeet.gateway.keys import SESSIONS_KEY, STORE_KEY
from livemeet.gateway.transcript_store import token_digest
from livemeet.transcriber import Error, TranscriptFinal
from livemeet.transcript import formats

TRANSCRIPT_PATH = "/v1/sessions/{id}/transcript"
STATUS_HEADER = "X-Livemeet-Transcript-Status"
# the header's values: still streaming (finals so far), the final transcript, or the finals
# of a session that ended in an error (all it will have)
RUNNING, FINAL, FAILED = "running", "final", "failed"


async def get_session_transcript(request: web.Request) -> web.Response:
    """Raises NotFound (unknown session, or one that ended without a final transcript and is
    gone), Unauthorized (missing or wrong token), InvalidRequest (response_format)."""
    session_id = request.match_info["id"]
    token = request.query.get("token", "")
    # empty as absent, as /v1/transcriptions/{id}'s
    fmt = formats.parse_response_format(request.query.get("response_format") or "json")
    holder = request.app[SESSIONS_KEY].get(session_id)
    if holder is not None:
        if not holder.authorizes_captions(token):
            raise _unauthorized(session_id)
        transcript = holder.transcript_so_far()
        terminal = holder.replay.terminal
        status = (
            FINAL
            if isinstance(terminal, TranscriptFinal)
            else FAILED
            if isinstance(terminal, Error)
            else RUNNING
        )
    else:
        stored = await request.app[STORE_KEY].get_live(session_id)
        # constant time over digests of equal length, whatever the token's length
        expected = stored.access_sha256 or ""
        if not hmac.compare_digest(expected.encode(), token_digest(token).encode()):
            raise _unauthorized(session_id)
        transcript, status = stored.transcript, FINAL
    body, content_type = formats.render(transcript, fmt)
    response = web.Response(text=body, content_type=content_type, charset="utf-8")
    response.headers[STATUS_HEADER] = status
    return response


def _unauthorized(session_id: str) -> Unauthorized:
    return Unauthorized(
        f"the transcript of live session {session_id!r} needs its captions_token "
        "(session.ready's) as ?token="
    )
