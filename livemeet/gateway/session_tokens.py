"""A live session's two capability tokens, kept so that a restarted server can check them.

`resume_token` (docs/protocol.md, "Resume") lets a client carry the session on; the
`captions_token` lets anyone it is shared with read the session's captions and transcript.
Only their SHA-256 digests are written to disk (the live journal, the transcript store), so a
leaked data dir does not leak working tokens. The captions token is derived from the resume
token (a keyed hash, one-way), so a server that restarted and kept only digests can still
tell a resuming client its captions token, once that client proved it has the resume token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from livemeet.audio.constants import RESUME_TOKEN_BYTES

# WWW-Authenticate of a 401 for a missing or wrong captions token (RFC 9110 section 11.6.1
# asks one of every 401). Not `Bearer`: the token is no Authorization header's but the query
# parameter `token` (docs/protocol.md, Captions), so the challenge names its own scheme and
# where the token goes, and a Bearer client is not sent to try its API key there.
CAPTIONS_CHALLENGE = 'CaptionsToken realm="captions", query="token"'
# the key of the captions token's derivation: fixed, as the resume token is the secret
_CAPTIONS_KEY = b"livemeet captions token v1"


def token_digest(token: str) -> str:
    """What the server keeps of a capability token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def captions_token_for(resume_token: str) -> str:
    """The captions token of the session whose resume token is `resume_token`: HMAC-SHA-256
    keyed by the resume token, URL-safe base64 without padding (43 characters, 256 bits).
    Knowing it tells nothing of the resume token."""
    mac = hmac.new(resume_token.encode(), _CAPTIONS_KEY, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def _matches(token: str, digest: str) -> bool:
    # constant time: the comparison must not tell how much of a guess was right
    return hmac.compare_digest(token_digest(token).encode(), digest.encode())


@dataclass(frozen=True)
class SessionTokens:
    """The digests of a session's tokens, and the tokens themselves where this process knows
    them (a session it opened, or one a client resumed since a restart: `learned`)."""

    resume_sha256: str
    captions_sha256: str
    resume_token: str | None = None

    @classmethod
    def new(cls) -> SessionTokens:
        """Fresh tokens for a new session (256 random bits, `secrets`)."""
        token = secrets.token_urlsafe(RESUME_TOKEN_BYTES)
        return cls(token_digest(token), token_digest(captions_token_for(token)), token)

    @property
    def captions_token(self) -> str | None:
        """The captions token, where the resume token is known."""
        return captions_token_for(self.resume_token) if self.resume_token is not None else None

    def authorizes_resume(self, token: str) -> bool:
        """Whether `token` is the session's resume token (constant time)."""
        return _matches(token, self.resume_sha256)

    def authorizes_captions(self, token: str) -> bool:
        """Whether `token` is the session's captions token (constant time)."""
        return _matches(token, self.captions_sha256)

    def learned(self, resume_token: str) -> SessionTokens:
        """These tokens with the plaintext resume token a client just proved it holds."""
        assert self.authorizes_resume(resume_token), "learn only a token that was checked"
        return SessionTokens(self.resume_sha256, self.captions_sha256, resume_token)
