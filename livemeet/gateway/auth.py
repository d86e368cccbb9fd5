"""API keys: who may use the API. Sans-I/O policy: the keys are stored by gateway/api_keys.py
and checked on requests by gateway/auth_http.py.

A key is `lm_<id>_<secret>`: `id` is 12 hex characters, public (logs and `livemeet keys list`
name a key by it), and `secret` 256 random bits, URL-safe base64. The server keeps the
SHA-256 of the whole key, never the key, and finds a presented key by that digest. A plain
SHA-256, not a slow password hash: slowness protects guessable passwords, and nobody can
search 256 random bits, digest in hand or not.

Whether a request needs a key is `AuthMode`'s (livemeet/config.py), decided on the keys the
store held when last read (`KeyRing`, `keys_required`). `authenticate` checks the key a
request presented: its `Verdict` names the key, or why it was refused (`AuthFailure`, the
`reason` of `livemeet_auth_failures_total`), and `refusal` is the error the client gets.

A key that stops letting requests in while a live session runs on it (revoked, or removed
from the store: `withdrawn`) ends that session (`withdrawal` is what its socket is told;
ws_live.py and live_sessions.py act on it): checked at `start` only, it carried the session on
for as long as its client streamed.

Credentials (`presented_key`): `Authorization: Bearer <key>` (what OpenAI's SDKs send), else
`x-api-key: <key>`; a live session may give it in its `start` instead, as browsers cannot set
a WebSocket's headers. Never a query string: URLs end up in access logs and histories.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import secrets
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

from livemeet.audio.constants import (
    API_KEY_ID_BYTES,
    API_KEY_SECRET_BYTES,
    MAX_API_KEY_CHARS,
    MAX_API_KEY_NAME_CHARS,
)
from livemeet.config import AuthMode
from livemeet.errors import InvalidRequest, Unauthorized
from livemeet.gateway.live_protocol import name_problem

KEY_PREFIX = "lm"
API_KEY_HEADER = "X-Api-Key"
# WWW-Authenticate of a 401 (RFC 6750 section 3): no key sent (no error code, as the RFC asks
# for a request without credentials), or one that is not (or no longer) valid
MISSING_CHALLENGE = "Bearer"
INVALID_CHALLENGE = 'Bearer error="invalid_token"'
_ID_CHARS = 2 * API_KEY_ID_BYTES  # hex
_KEY_ID = re.compile(f"[0-9a-f]{{{_ID_CHARS}}}")
_WHOLE_KEY = re.compile(f"{KEY_PREFIX}_([0-9a-f]{{{_ID_CHARS}}})_[A-Za-z0-9_-]+")


class AuthFailure(StrEnum):
    """Why a request's key was refused."""

    MISSING = "missing"  # none presented
    WRONG = "wrong"  # not a key of this server's store
    REVOKED = "revoked"  # a key of the store, revoked


@dataclass(frozen=True)
class ApiKey:
    """A key as the store holds it (never the key itself). `key_id`: public, 12 hex
    characters; `name`: the operator's label ("" for none); `sha256`: the hex digest of the
    whole key; `created_at`, `revoked_at`: s since the epoch (`revoked_at` None: active)."""

    key_id: str
    name: str
    sha256: str
    created_at: float
    revoked_at: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class KeyRing:
    """Every key of the store, active and revoked, by digest, as read at one moment."""

    by_digest: Mapping[str, ApiKey] = field(default_factory=dict)

    @classmethod
    def of(cls, keys: Iterable[ApiKey]) -> KeyRing:
        """A ring of `keys` (digests are unique in the store: a later one would win)."""
        return cls({key.sha256: key for key in keys})

    @property
    def num_keys(self) -> int:
        return len(self.by_digest)

    @property
    def num_active(self) -> int:
        return sum(1 for key in self.by_digest.values() if key.active)


class Verdict(NamedTuple):
    """`authenticate`'s answer. `key`: the key found for what was presented (None where none
    was needed, so none was looked at, or none was found); `failure`: why the request is
    refused (None: it may go on)."""

    key: ApiKey | None
    failure: AuthFailure | None

    @property
    def allowed(self) -> bool:
        return self.failure is None


def new_key() -> tuple[str, str]:
    """A fresh key and its id: (`lm_<id>_<secret>`, `<id>`), from the secrets module."""
    key_id = secrets.token_hex(API_KEY_ID_BYTES)
    return f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(API_KEY_SECRET_BYTES)}", key_id


def key_digest(key: str) -> str:
    """What the store keeps of a key: the SHA-256 of all of it, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_id_of(text: str) -> str | None:
    """The id `text` names: a key id as it is, or the id inside a whole key (an operator
    revoking a leaked key may have only the key). None when `text` is neither."""
    text = text.strip()
    if _KEY_ID.fullmatch(text):
        return text
    whole = _WHOLE_KEY.fullmatch(text)
    return whole.group(1) if whole else None


def check_key_name(name: str) -> str:
    """`name` stripped, as a key's name: at most MAX_API_KEY_NAME_CHARS characters, none a
    control character or line break (`livemeet keys list` prints it in a table). Raises
    InvalidRequest."""
    name = name.strip()
    if len(name) > MAX_API_KEY_NAME_CHARS:
        raise InvalidRequest(
            f"a key's name holds at most {MAX_API_KEY_NAME_CHARS} characters, not {len(name)}",
            param="name",
        )
    if (problem := name_problem(name)) is not None:
        raise InvalidRequest(f"a key's name may not hold {problem}", param="name")
    return name


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request presents in its headers: the token of `Authorization: Bearer`
    (the scheme in any case, RFC 9110 section 11.1), else `x-api-key`; None when neither
    holds one. Another scheme (`Basic`, from a proxy's login) presents no key."""
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    if x_api_key is not None and x_api_key.strip():
        return x_api_key.strip()
    return None


def keys_required(mode: AuthMode, ring: KeyRing) -> bool:
    """Whether requests need a key under `mode` with the store's keys `ring`."""
    if mode is AuthMode.OFF:
        return False
    if mode is AuthMode.KEYS:
        return True
    # AUTO: any key made, revoked ones too, so revoking the last key never opens the server
    return ring.num_keys > 0


def authenticate(mode: AuthMode, ring: KeyRing, presented: str | None) -> Verdict:
    """The verdict on a request that presented the key `presented` (None: none). A server that
    needs no key does not look at one (OpenAI's SDKs send a key whatever the server)."""
    if not keys_required(mode, ring):
        return Verdict(None, None)
    if presented is None:
        return Verdict(None, AuthFailure.MISSING)
    # every key is ASCII; anything else is none, and may not even encode (header bytes that
    # are not UTF-8 come as surrogates: their digest raised, a 500)
    if len(presented) > MAX_API_KEY_CHARS or not presented.isascii():
        return Verdict(None, AuthFailure.WRONG)
    # a lookup by digest: its timing could tell a guesser only about the digests of guesses
    key = ring.by_digest.get(key_digest(presented))
    if key is None:
        return Verdict(None, AuthFailure.WRONG)
    return Verdict(key, None if key.active else AuthFailure.REVOKED)


def refusal(verdict: Verdict, *, live: bool = False) -> Unauthorized:
    """The error a refused request gets; `live`: a `/v1/live` session's (its key may also
    come in `start`). The message never holds what was presented: a revoked key is named by
    its id only."""
    assert verdict.failure is not None, "a refusal needs a failed verdict"
    if verdict.failure is AuthFailure.MISSING:
        where = "'Authorization: Bearer <key>' or 'x-api-key: <key>'"
        if live:
            where += ", or 'api_key' in the 'start' message"
        return Unauthorized(
            f"this server needs an API key: send it as {where}", challenge=MISSING_CHALLENGE
        )
    if verdict.failure is AuthFailure.REVOKED:
        assert verdict.key is not None
        return Unauthorized(
            f"the API key {verdict.key.key_id} was revoked: ask the server's operator for a "
            "new one",
            challenge=INVALID_CHALLENGE,
        )
    return Unauthorized(
        "the API key is not one of this server's (mistyped, or made for another server)",
        challenge=INVALID_CHALLENGE,
    )


def withdrawn(mode: AuthMode, ring: KeyRing, key_ids: Iterable[str]) -> frozenset[str]:
    """Of the keys `key_ids` (ids of keys that let requests in before), those `ring` no longer
    lets in under `mode`: revoked since, or gone from the store. None while the server needs no
    key (`keys_required`): it would let their clients in without one."""
    if not keys_required(mode, ring):
        return frozenset()
    active = {key.key_id for key in ring.by_digest.values() if key.active}
    return frozenset(key_id for key_id in key_ids if key_id not in active)


def withdrawal(ring: KeyRing, key_id: str) -> Unauthorized:
    """The error a live session running on the key `key_id` is closed with once `ring` no
    longer lets that key in (`withdrawn`): revoked, or gone from the store."""
    revoked = any(key.key_id == key_id and not key.active for key in ring.by_digest.values())
    why = "was revoked" if revoked else "was removed from this server's keys"
    return Unauthorized(
        f"the API key {key_id} {why} while this live session ran: the session is ended, what "
        "it heard transcribed and stored (its transcript opens with its captions_token); ask "
        "the server's operator for a new key",
        challenge=INVALID_CHALLENGE,
    )


def describe(mode: AuthMode, ring: KeyRing, data_dir: Path) -> str:
    """One line saying who may use the API of the server on `data_dir` (the start log, `serve
    --check-config`)."""
    active, revoked = ring.num_active, ring.num_keys - ring.num_active
    counts = f"{active} active API key{'s' if active != 1 else ''}, {revoked} revoked"
    if mode is AuthMode.OFF:
        return "auth off: anyone who can reach the server may use the API"
    if not keys_required(mode, ring):
        return (
            "auth auto: no API key in the store, so the API is open to anyone who can reach "
            f"it (the first `{create_key_command(data_dir)}` closes it)"
        )
    if active == 0:
        return (
            f"auth {mode.value}: API keys required, and none is active ({counts}): nobody can "
            f"use the API until `{create_key_command(data_dir)}` makes one"
        )
    return f"auth {mode.value}: API keys required ({counts})"


def closing_advice(mode: AuthMode, ring: KeyRing, data_dir: Path) -> str:
    """What closes the API of a server on `data_dir` that asks for no key (`mode`, `ring`), as
    advice in its warning. Under `--auth off` a new key changes nothing: only a start without
    it does (with a key to give clients, made first where the store holds no active one)."""
    assert not keys_required(mode, ring), "advice for an open server only"
    make = f"make a key (`{create_key_command(data_dir)}`)"
    if mode is not AuthMode.OFF:
        return make
    if ring.num_active == 0:
        return f"{make} and start the server without `--auth off`"
    return "start the server without `--auth off` (its data dir holds active API keys)"


def create_key_command(data_dir: Path) -> str:
    """The command that makes a key for the server on `data_dir`, for advice in a message.
    With --data-dir always, as an absolute path: `livemeet keys create` run from another
    directory makes its key in that directory's ./livemeet-data, where the server never
    looks, and the server stays open."""
    return f"livemeet keys create --data-dir {shlex.quote(str(data_dir.absolute()))}"


def is_loopback_host(host: str) -> bool:
    """Whether listening on `host` reaches this machine only: `localhost` or a loopback
    address. Any other name counts as reachable from outside (it is not resolved)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
