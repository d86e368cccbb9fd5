"""The API-key policy (livemeet/gateway/auth.py): which mode asks for a key, the verdict on a
presented key, the headers that present one, the refusals' messages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from livemeet.audio.constants import MAX_API_KEY_CHARS
from livemeet.config import AuthMode, GatewayConfig, parse_auth_mode
from livemeet.errors import ConfigError, InvalidRequest, Unauthorized
from livemeet.gateway.auth import (
    INVALID_CHALLENGE,
    MISSING_CHALLENGE,
    ApiKey,
    AuthFailure,
    KeyRing,
    Verdict,
    authenticate,
    check_key_name,
    describe,
    is_loopback_host,
    key_digest,
    key_id_of,
    keys_required,
    new_key,
    presented_key,
    refusal,
    withdrawal,
    withdrawn,
)

ACTIVE, ACTIVE_ID = new_key()
REVOKED, REVOKED_ID = new_key()
WRONG, _ = new_key()  # well-formed, not in the store


def ring(*, active: bool = True, revoked: bool = True) -> KeyRing:
    keys = []
    if active:
        keys.append(ApiKey(ACTIVE_ID, "ci", key_digest(ACTIVE), 1.0))
    if revoked:
        keys.append(ApiKey(REVOKED_ID, "old", key_digest(REVOKED), 1.0, revoked_at=2.0))
    return KeyRing.of(keys)


def test_a_new_key_is_its_prefix_a_hex_id_and_256_random_bits() -> None:
    key, key_id = new_key()
    assert re.fullmatch(r"lm_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", key), key
    assert key.split("_", 2)[1] == key_id
    assert new_key() != new_key()
    assert key_digest(key) == key_digest(key) != key_digest(key + "x")
    assert len(key_digest(key)) == 64  # sha256, hex


@pytest.mark.parametrize(
    ("mode", "store", "required"),
    [
        (AuthMode.OFF, ring(), False),
        (AuthMode.OFF, KeyRing(), False),
        (AuthMode.KEYS, ring(), True),
        (AuthMode.KEYS, KeyRing(), True),  # no key at all: nobody gets in
        (AuthMode.AUTO, KeyRing(), False),  # a server without keys stays open
        (AuthMode.AUTO, ring(revoked=False), True),
        (AuthMode.AUTO, ring(active=False), True),  # every key revoked: still closed
    ],
)
def test_which_mode_asks_for_a_key(mode: AuthMode, store: KeyRing, required: bool) -> None:
    assert keys_required(mode, store) is required


@pytest.mark.parametrize(
    ("mode", "store", "presented", "failure"),
    [
        (AuthMode.OFF, ring(), None, None),
        (AuthMode.OFF, ring(), WRONG, None),  # an open server does not look at keys
        (AuthMode.AUTO, KeyRing(), "unused", None),  # OpenAI SDKs send one whatever
        (AuthMode.AUTO, ring(), None, AuthFailure.MISSING),
        (AuthMode.AUTO, ring(), WRONG, AuthFailure.WRONG),
        (AuthMode.AUTO, ring(), REVOKED, AuthFailure.REVOKED),
        (AuthMode.AUTO, ring(), ACTIVE, None),
        (AuthMode.AUTO, ring(active=False), REVOKED, AuthFailure.REVOKED),
        (AuthMode.AUTO, ring(active=False), None, AuthFailure.MISSING),
        (AuthMode.KEYS, KeyRing(), ACTIVE, AuthFailure.WRONG),
        (AuthMode.KEYS, KeyRing(), None, AuthFailure.MISSING),
        (AuthMode.KEYS, ring(), ACTIVE, None),
        (AuthMode.KEYS, ring(), ACTIVE + " ", AuthFailure.WRONG),
        (AuthMode.KEYS, ring(), ACTIVE_ID, AuthFailure.WRONG),  # the id is no key
        (AuthMode.KEYS, ring(), "x" * (MAX_API_KEY_CHARS + 1), AuthFailure.WRONG),
        # header bytes that are not UTF-8 (aiohttp keeps them as surrogates): no key's
        # digest, and no UnicodeEncodeError (an unauthenticated 500: a security review)
        (AuthMode.KEYS, ring(), "\udcff\udcfe", AuthFailure.WRONG),
        (AuthMode.KEYS, ring(), ACTIVE[:-1] + "\u00e9", AuthFailure.WRONG),
    ],
)
def test_the_verdict_on_a_presented_key(
    mode: AuthMode, store: KeyRing, presented: str | None, failure: AuthFailure | None
) -> None:
    verdict = authenticate(mode, store, presented)
    assert verdict.failure is failure
    assert verdict.allowed is (failure is None)
    if presented == ACTIVE and failure is None:
        assert verdict.key is not None and verdict.key.key_id == ACTIVE_ID


@pytest.mark.parametrize(
    ("authorization", "x_api_key", "presented"),
    [
        ("Bearer lm_a", None, "lm_a"),
        ("bearer   lm_a ", None, "lm_a"),  # the scheme in any case (RFC 9110 11.1)
        ("BEARER lm_a", "lm_b", "lm_a"),  # the Bearer token first
        (None, "lm_b", "lm_b"),
        (None, " lm_b ", "lm_b"),
        ("Basic dXNlcjpwYXNz", None, None),  # a proxy's login is no API key
        ("Basic dXNlcjpwYXNz", "lm_b", "lm_b"),
        ("Bearer", None, None),
        ("Bearer ", "", None),
        (None, None, None),
    ],
)
def test_the_key_a_request_presents(
    authorization: str | None, x_api_key: str | None, presented: str | None
) -> None:
    assert presented_key(authorization, x_api_key) == presented


def test_refusals_say_why_and_never_hold_the_key() -> None:
    missing = refusal(Verdict(None, AuthFailure.MISSING))
    live = refusal(Verdict(None, AuthFailure.MISSING), live=True)
    wrong = refusal(authenticate(AuthMode.KEYS, ring(), WRONG))
    revoked = refusal(authenticate(AuthMode.KEYS, ring(), REVOKED))
    for error in (missing, live, wrong, revoked):
        assert isinstance(error, Unauthorized)
        assert (error.code, error.http_status, error.close_code) == ("unauthorized", 401, 4401)
        assert WRONG not in error.message and REVOKED not in error.message
    assert len({missing.message, wrong.message, revoked.message}) == 3
    assert "Authorization: Bearer" in missing.message and "x-api-key" in missing.message
    assert "start" not in missing.message and "'api_key' in the 'start'" in live.message
    assert REVOKED_ID in revoked.message and "revoked" in revoked.message
    assert missing.challenge == MISSING_CHALLENGE == "Bearer"
    assert wrong.challenge == revoked.challenge == INVALID_CHALLENGE
    with pytest.raises(AssertionError):
        refusal(Verdict(None, None))


def test_the_keys_a_new_ring_no_longer_lets_in() -> None:
    """Revoked since, or gone from the store: withdrawn; none while the server needs no key
    (`auto` with an empty store, `off`), and an id it never let in is no concern here."""
    in_use = {ACTIVE_ID, REVOKED_ID}
    assert withdrawn(AuthMode.AUTO, ring(), in_use) == {REVOKED_ID}
    assert withdrawn(AuthMode.KEYS, ring(active=False), in_use) == in_use  # gone and revoked
    assert withdrawn(AuthMode.AUTO, ring(), ()) == frozenset()
    assert withdrawn(AuthMode.AUTO, KeyRing(), in_use) == frozenset()  # open: no key needed
    assert withdrawn(AuthMode.OFF, ring(revoked=True), in_use) == frozenset()
    assert withdrawn(AuthMode.KEYS, KeyRing(), in_use) == in_use


def test_a_withdrawn_key_is_told_by_id_and_why() -> None:
    revoked, gone = withdrawal(ring(), REVOKED_ID), withdrawal(ring(), "0123456789ab")
    for error in (revoked, gone):
        assert (error.code, error.http_status, error.close_code) == ("unauthorized", 401, 4401)
        assert error.challenge == INVALID_CHALLENGE and "session is ended" in error.message
        assert REVOKED not in error.message
    assert f"API key {REVOKED_ID} was revoked" in revoked.message
    assert "0123456789ab was removed" in gone.message


def test_a_key_id_is_named_by_itself_or_by_its_key() -> None:
    assert key_id_of(ACTIVE_ID) == ACTIVE_ID
    assert key_id_of(f" {ACTIVE} ") == ACTIVE_ID
    for text in ("", "lm_", "nothex123456", ACTIVE_ID[:-1], ACTIVE_ID.upper(), "sk-abc"):
        assert key_id_of(text) is None, text


def test_key_names() -> None:
    assert check_key_name("  ci runner ") == "ci runner"
    assert check_key_name("") == ""
    for bad in ("x" * 65, "two\nlines", "tab\there"):
        with pytest.raises(InvalidRequest):
            check_key_name(bad)


def test_the_summary_says_who_may_use_the_api(tmp_path: Path) -> None:
    assert "anyone" in describe(AuthMode.OFF, ring(), tmp_path)
    assert "open" in describe(AuthMode.AUTO, KeyRing(), tmp_path)
    assert describe(AuthMode.AUTO, ring(), tmp_path) == (
        "auth auto: API keys required (1 active API key, 1 revoked)"
    )
    assert "nobody" in describe(AuthMode.KEYS, KeyRing(), tmp_path)
    assert "nobody" in describe(AuthMode.AUTO, ring(active=False), tmp_path)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("meet.example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_the_auth_mode_setting() -> None:
    assert GatewayConfig().auth is AuthMode.AUTO
    assert parse_auth_mode("keys") is AuthMode.KEYS
    with pytest.raises(ConfigError, match="--auth must be one of auto, keys, off"):
        parse_auth_mode("on")
    with pytest.raises(ConfigError):
        GatewayConfig(auth="maybe").validate()  # type: ignore[arg-type]
