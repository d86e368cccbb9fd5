"""`livemeet keys create|list|revoke`: the API keys of the server on a data directory.

    livemeet keys create [--name NAME] [--json]   # prints the key, once
    livemeet keys list [--json]
    livemeet keys revoke ID

The keys live in `<data-dir>/api_keys.sqlite3` (livemeet/gateway/api_keys.py), which holds
their SHA-256 digests, never the keys: a key is printed once, by `create` (alone on stdout, so
`KEY=$(livemeet keys create)` takes it; what it means goes to stderr), and cannot be shown
again. A running server on that data directory applies a change within a second; whether it
asks for keys at all is its `--auth` (docs/protocol.md, "API keys"). Exit status: 0 on
success, 2 when the command could not do it (an unknown id, a bad name, a store that cannot
be read or written), with one line saying why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from livemeet.audio.constants import MAX_API_KEY_NAME_CHARS
from livemeet.config import ServerConfig
from livemeet.errors import InvalidRequest, LivemeetError
from livemeet.gateway.api_keys import ApiKeyStore, store_path
from livemeet.gateway.auth import ApiKey, create_key_command, key_digest, key_id_of

Command = Callable[[argparse.Namespace, ApiKeyStore], int]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "keys",
        help="create, list and revoke the server's API keys",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", required=True, help="what to do with the keys")
    create = actions.add_parser(
        "create",
        help="make a key and print it, once",
        description="Make an API key and print it on stdout, once; its id and what it means "
        "go to stderr.",
    )
    create.add_argument(
        "--name",
        default=None,
        help=f"a label for the key, e.g. who holds it: 1 to {MAX_API_KEY_NAME_CHARS} "
        "characters, no control characters (default: none)",
    )
    create.add_argument(
        "--json", action="store_true", help="print the key and its record as one JSON object"
    )
    create.set_defaults(func=_with_store(create_key))
    listing = actions.add_parser(
        "list",
        help="list the keys (ids, names, dates; never a key)",
        description="List every API key, active and revoked, oldest first.",
    )
    listing.add_argument("--json", action="store_true", help="print a JSON array of the keys")
    listing.set_defaults(func=_with_store(list_keys))
    revoke = actions.add_parser(
        "revoke",
        help="revoke a key for good",
        description="Revoke an API key for good: a running server refuses it within a second, "
        "and ends the live sessions running on it (each is closed with unauthorized, 4401; "
        "what it heard is transcribed and stored).",
    )
    revoke.add_argument(
        "id", help="the key's id (12 hex characters, as `list` shows it), or the key itself"
    )
    revoke.set_defaults(func=_with_store(revoke_key))
    for parser in (create, listing, revoke):
        parser.add_argument(
            "--data-dir",
            type=Path,
            default=ServerConfig.data_dir,
            help="the data directory of the server the keys are for: its `serve --data-dir` "
            "(default: %(default)s, in the directory the command runs in, as serve's)",
        )


def _with_store(command: Command) -> Callable[[argparse.Namespace], int]:
    """`command` on the data dir's store; a LivemeetError is one line on stderr and exit 2."""

    def run(args: argparse.Namespace) -> int:
        store = ApiKeyStore(store_path(args.data_dir))
        try:
            return command(args, store)
        except LivemeetError as exc:
            print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
            return 2
        finally:
            store.close()

    return run


def create_key(args: argparse.Namespace, store: ApiKeyStore) -> int:
    """Make a key; print it (stdout) and what it means (stderr). Raises InvalidRequest for a
    --name given empty (or only spaces): a key without a name is made by leaving it out, and
    an empty one was a mistake (an unset variable: --name "$WHO") that made it silently."""
    if args.name is not None and not args.name.strip():
        raise InvalidRequest(
            "--name is empty: give the key a name, or leave --name out for a key without one",
            param="name",
        )
    first = not store.keys()
    key, secret = store.create(args.name or "")
    if args.json:
        print(json.dumps({**_key_json(key), "key": secret}))
    else:
        print(secret)
    print(
        f"API key {key.key_id}{_named(key)} created in {store.path}: it is shown only this "
        "once, keep it now",
        file=sys.stderr,
    )
    if first:
        print(
            "the first key of this data directory: a server on it with --auth auto (the "
            "default) now asks every API request for a key",
            file=sys.stderr,
        )
    return 0


def list_keys(args: argparse.Namespace, store: ApiKeyStore) -> int:
    """Print every key, active and revoked, oldest first: ids, names and dates."""
    keys = store.keys()
    if args.json:
        print(json.dumps([_key_json(key) for key in keys], ensure_ascii=False))
        return 0
    if not keys:
        print(f"no API keys in {store.path}", file=sys.stderr)
        return 0
    rows = [("ID", "NAME", "CREATED", "REVOKED")]
    for key in keys:
        revoked = _when(key.revoked_at) if key.revoked_at is not None else "-"
        rows.append((key.key_id, key.name or "-", _when(key.created_at), revoked))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print(
            "  ".join([*(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)), row[3]])
        )
    return 0


def revoke_key(args: argparse.Namespace, store: ApiKeyStore) -> int:
    """Revoke the key `args.id` names (its id, or the key itself, whose digest must then be
    the stored key's)."""
    key_id = key_id_of(args.id)
    if key_id is None:
        raise InvalidRequest(
            "not a key id: give one as `livemeet keys list` shows it (12 hex characters), or "
            "the key itself",
            param="id",
        )
    before = store.find(key_id)
    if before is not None and _mismatched(args.id, before):
        raise InvalidRequest(
            f"that is not API key {key_id}: the id in it is, the rest does not match the "
            "stored key's (mistyped, or copied in part?); nothing was revoked. Give the whole "
            "key as it was made, or its id alone",
            param="id",
        )
    key = store.revoke(key_id)
    if before is not None and before.revoked_at is not None:
        print(f"API key {key_id}{_named(key)} was revoked already, {_when(before.revoked_at)}")
        return 0
    print(
        f"API key {key_id}{_named(key)} revoked: a running server refuses it within a second "
        "and ends its live sessions"
    )
    if not any(k.active for k in store.keys()):
        print(
            "no active key is left: a server on this data directory with --auth auto or keys "
            f"admits nobody until `{create_key_command(args.data_dir)}` makes one",
            file=sys.stderr,
        )
    return 0


def _mismatched(given: str, key: ApiKey) -> bool:
    """Whether `given`, a whole key (not an id alone), is not `key`: its digest differs. A
    whole key naming an id is no proof of it: the id is public (logs, `list`), so a wrong key
    carrying it must not revoke it."""
    given = given.strip()
    return given != key.key_id and key_digest(given) != key.sha256


def _named(key: ApiKey) -> str:
    return f" ({key.name})" if key.name else ""


def _when(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch_s))


def _iso(epoch_s: float | None) -> str | None:
    if epoch_s is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def _key_json(key: ApiKey) -> dict[str, object]:
    return {
        "id": key.key_id,
        "name": key.name,
        "created_at": _iso(key.created_at),
        "revoked_at": _iso(key.revoked_at),
        "active": key.active,
    }
