"""`GET /v1/sessions/{id}/transcript`: a live session's transcript, rendered server-side by the
writers of `GET /v1/transcriptions/{id}` (livemeet/transcript/formats.py).

While the session runs: its finals so far over the audio received so far; once its
`transcript.final` came: that transcript, from the session while the server holds it, then
from the TranscriptStore (which keeps it across restarts); once its `transcript.revised` came
(DESIGN 5.7): the revised one, the newest. `?version=final` or `?version=revised` asks for one
(`revised` without one: NotFound, saying whether one is still coming; `final` while the
session runs: its finals so far). Readable with the session's `captions_token`
(`?token=`), as its captions are: session ids come from the backend and may be guessable. The
response header `X-Livemeet-Transcript-Status` says which it is, `X-Livemeet-Revision` where
its revision is (REVISION_HEADER), and, for a final or revised one, `X-Livemeet-Finish-Reason`
why its decode stopped (transcript.final's `finish_reason`), which no rendered format carries:
a page that lost the session's socket reads them here.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from livemeet.errors import InvalidRequest, NotFound, Unauthorized
from livemeet.gateway.keys import SESSIONS_KEY, STORE_KEY, TRANSCRIBER_KEY
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.gateway.session_tokens import CAPTIONS_CHALLENGE
from livemeet.gateway.transcript_store import StoredTranscript, TranscriptStore, token_digest
from livemeet.transcriber import Error, TranscriptFinal
from livemeet.transcript import formats
from livemeet.transcript.language import reported_language
from livemeet.transcript.segments import Transcript

TRANSCRIPT_PATH = "/v1/sessions/{id}/transcript"
STATUS_HEADER = "X-Livemeet-Transcript-Status"
FINISH_HEADER = "X-Livemeet-Finish-Reason"
# where the session's revision is: one stands (`revised`), one is coming (`pending`), it
# failed (`failed`; the store keeps that too, in the revision's place), or none will come
# (`none`). A page waiting for a revision whose socket went quiet reads this: "final" alone
# did not tell a revision still running from one that failed unheard.
REVISION_HEADER = "X-Livemeet-Revision"
REVISION_DONE, REVISION_PENDING, REVISION_FAILED, REVISION_NONE = (
    "revised",
    "pending",
    "failed",
    "none",
)
# the header's values: still streaming (finals so far), the final transcript, the revised
# transcript, or the finals of a session that ended in an error (all it will have)
RUNNING, FINAL, REVISED, FAILED = "running", "final", "revised", "failed"
VERSIONS = ("final", "revised")  # ?version= (absent: the newest)


async def get_session_transcript(request: web.Request) -> web.Response:
    """Raises NotFound (unknown session, one that ended without a final transcript and is
    gone, or `version=revised` with no revision), Unauthorized (missing or wrong token),
    InvalidRequest (response_format, version)."""
    session_id = request.match_info["id"]
    token = request.query.get("token", "")
    # empty as absent, as /v1/transcriptions/{id}'s
    fmt = formats.parse_response_format(request.query.get("response_format") or "json")
    # not so `version`: "any other value is a 400" (docs/protocol.md), the empty one too
    version = request.query.get("version")
    if version is not None and version not in VERSIONS:
        raise InvalidRequest(
            f"version must be one of {', '.join(VERSIONS)}, not {version!r}", param="version"
        )
    holder = request.app[SESSIONS_KEY].get(session_id)
    if holder is not None:
        if not holder.authorizes_captions(token):
            raise _unauthorized(session_id)
        transcript, status = _held(holder, version)
        revision = revision_state(holder)
    else:
        store = request.app[STORE_KEY]
        transcript, status, revision = await _stored(store, session_id, token, version)
    language = reported_language(transcript.language, request.app[TRANSCRIBER_KEY].info.language)
    body, content_type = formats.render(transcript, fmt, language=language)
    response = web.Response(text=body, content_type=content_type, charset="utf-8")
    response.headers[STATUS_HEADER] = status
    response.headers[REVISION_HEADER] = revision
    if status in (FINAL, REVISED):  # a running transcript's reason is not known yet
        response.headers[FINISH_HEADER] = transcript.finish_reason.value
    return response


def _held(holder: LiveSessionHolder, version: str | None) -> tuple[Transcript, str]:
    """The held session's transcript for `version` and its status. Raises NotFound."""
    revised = holder.revised_transcript()
    if version != "final" and revised is not None:
        return revised, REVISED
    if version == "revised":
        raise _no_revision(holder)
    terminal = holder.replay.terminal
    status = (
        FINAL
        if isinstance(terminal, TranscriptFinal)
        else FAILED
        if isinstance(terminal, Error)
        else RUNNING
    )
    return holder.transcript_so_far(), status


async def _stored(
    store: TranscriptStore, session_id: str, token: str, version: str | None
) -> tuple[Transcript, str, str]:
    """A stored transcript for `version` (absent: the revised one where stored), its status
    and the revision's (REVISION_HEADER); the token is checked against the final one's
    first. Raises NotFound, Unauthorized."""
    final = await store.get_live(session_id)
    # constant time over digests of equal length, whatever the token's length
    expected = final.access_sha256 or ""
    if not hmac.compare_digest(expected.encode(), token_digest(token).encode()):
        raise _unauthorized(session_id)
    try:
        revised: StoredTranscript | None = await store.get_live(session_id, revised=True)
    except NotFound:
        revised = None
    if revised is None or revised.revision_failed is not None:
        # the server holds a session until its revision comes or fails: gone, it has none (one
        # promised was lost: the server stopped before it came, a crash or a drain's end)
        lost = revised is None and final.revision_promised
        if version == "revised":
            if revised is not None:
                why = f": {revised.revision_failed}"  # the error's message: "...final stands"
            elif lost:
                why = ": the server stopped before its revision came; its final one stands"
            else:
                why = " (it was not revised): its final one stands"
            raise NotFound(
                f"live session {session_id!r} has no revised transcript, and none will come{why}",
                param="version",
            )
        failed = revised is not None or lost
        return final.transcript, FINAL, REVISION_FAILED if failed else REVISION_NONE
    if version == "final":
        return final.transcript, FINAL, REVISION_DONE
    return revised.transcript, REVISED, REVISION_DONE


def revision_state(holder: LiveSessionHolder) -> str:
    """Where a held session's revision is (REVISION_HEADER's values)."""
    replay = holder.replay
    if holder.revised_transcript() is not None:
        return REVISION_DONE
    if replay.revision_pending or (_revise_promised(holder) and replay.terminal is None):
        return REVISION_PENDING
    if isinstance(replay.revision, Error):
        return REVISION_FAILED
    return REVISION_NONE


def _revise_promised(holder: LiveSessionHolder) -> bool:
    """Whether session.ready promised a revision (its `revise`)."""
    return holder.options is not None and holder.options.revise


def _no_revision(holder: LiveSessionHolder) -> NotFound:
    """The 404 of `version=revised` for a held session without a revised transcript, saying
    whether one is still coming: "(yet)" told a client of a session that will never be
    revised (session.ready's `revise: false`) to keep asking."""
    state = revision_state(holder)
    if state == REVISION_PENDING:
        why = "not yet: it comes after transcript.final"
    elif state == REVISION_FAILED:
        why = "its revision failed, and none will come: its final one stands"
    elif not _revise_promised(holder):
        why = (
            "none will come: session.ready said `revise: false` (a backend that cannot revise, "
            "or a server run with --no-revise), so its final one stands"
        )
    else:  # a final that promised none (no audio), or a session that failed
        why = "none will come"
    return NotFound(f"live session {holder.id!r} has no revised transcript: {why}", param="version")


def _unauthorized(session_id: str) -> Unauthorized:
    return Unauthorized(
        f"the transcript of live session {session_id!r} needs its captions_token "
        "(session.ready's) as ?token=",
        challenge=CAPTIONS_CHALLENGE,
    )
