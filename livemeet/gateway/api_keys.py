"""The API key store: `<data-dir>/api_keys.sqlite3` (SQLite, WAL), written by `livemeet keys`
and read by the server (gateway/auth.py says what a key is and who needs one).

A row per key ever made: its public id, the operator's name for it, the SHA-256 of the whole
key (never the key: `create` returns it, to be shown once), when it was made and when it was
revoked (NULL while active). A revoked key keeps its row, so a client presenting it is told
it was revoked rather than wrong, and `--auth auto` stays closed once any key was made.

A running server reads the store again when it changed (`ring_if_changed`): SQLite's `PRAGMA
data_version` moves with every commit of another connection (`livemeet keys`, another
process), and the file's identity (device, inode) with a store replaced by a restored copy.
Reading never creates the file: no file is no keys, but a path the file cannot be at (its
directory is a regular file: `--data-dir` naming a file) is an error, not "no keys".
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from livemeet.errors import ConfigError, NotFound
from livemeet.gateway.auth import ApiKey, KeyRing, check_key_name, key_digest, new_key
from livemeet.gateway.disk import make_private_dir, permission_hint

SCHEMA_VERSION = 1  # PRAGMA user_version of the stores this code writes and reads
DB_NAME = "api_keys.sqlite3"
BUSY_TIMEOUT_S = 5.0  # s a write waits for another writer (two `livemeet keys` at once)
_NEW_ID_ATTEMPTS = 3  # ids are 48 random bits: a clash is a freak, met by drawing again
_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    revoked_at REAL
);
"""
_COLUMNS = "id, name, sha256, created_at, revoked_at"
# what tells a reader the store changed: (st_dev, st_ino) of the file, PRAGMA data_version
_Seen = tuple[int, int, int]


def _not_a_directory(directory: Path) -> Path | None:
    """The first of `directory` and its parents, from the root, that exists and is not a
    directory (a regular file), or None: then it is, or may be made."""
    for candidate in (*reversed(directory.parents), directory):
        try:
            if candidate.exists() and not candidate.is_dir():
                return candidate
        except OSError:  # one it may not look into: its own error comes on opening
            return None
    return None


def store_path(data_dir: Path) -> Path:
    """Where the API keys of the server on `data_dir` are."""
    return data_dir / DB_NAME


class ApiKeyStore:
    """The keys at `path`. The file is opened on first use: `create` makes it (and its
    directory) when missing; the readers take a missing file as no keys. One thread at a time
    may use a store (the server's watcher hands it from thread to thread, never two at once).
    Every method raises ConfigError where the file cannot be opened, read or written, or has
    a newer schema."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._seen: _Seen | None = None  # when the keys were last read (`ring_if_changed`)

    def create(self, name: str = "") -> tuple[ApiKey, str]:
        """A new active key named `name` (stripped; `check_key_name`): its record, and the key
        itself, which nothing keeps: show it once. Raises InvalidRequest for the name, ConfigError
        when the store cannot be opened or written."""
        name = check_key_name(name)
        conn = self._connect(create=True)
        assert conn is not None, "create=True makes the store"
        for attempt in range(_NEW_ID_ATTEMPTS):
            key, key_id = new_key()
            record = ApiKey(key_id, name, key_digest(key), time.time())
            try:
                with self._failing_as("write"):
                    conn.execute(
                        f"INSERT INTO api_keys ({_COLUMNS}) VALUES (?, ?, ?, ?, NULL)",
                        (record.key_id, record.name, record.sha256, record.created_at),
                    )
            except sqlite3.IntegrityError as exc:
                if attempt + 1 < _NEW_ID_ATTEMPTS:
                    continue
                raise ConfigError(f"cannot write the API key store {self.path}: {exc}") from exc
            return record, key
        raise AssertionError("the last attempt returns or raises")

    def keys(self) -> list[ApiKey]:
        """Every key, active and revoked, oldest first."""
        conn = self._connect(create=False)
        return [] if conn is None else self._read(conn)

    def find(self, key_id: str) -> ApiKey | None:
        """The key with id `key_id`, or None."""
        return next((key for key in self.keys() if key.key_id == key_id), None)

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke the key `key_id` (for good: a revoked key stays revoked); the key as stored
        after. Revoking a revoked key changes nothing (it keeps its first revocation's time).
        Raises NotFound for an id the store does not hold."""
        conn = self._connect(create=False)
        if conn is not None:
            with self._failing_as("write"):
                conn.execute(
                    "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?",
                    (time.time(), key_id),
                )
        key = self.find(key_id)
        if key is None:
            raise NotFound(f"no API key {key_id!r} in {self.path}", param="id")
        return key

    def ring(self) -> KeyRing:
        """Every key, by digest, as the store holds them now."""
        return KeyRing.of(self.keys())

    def ring_if_changed(self) -> KeyRing | None:
        """The keys when they may have changed since the last call (the first call reads
        them), else None. Raises ConfigError, besides the store's errors, when the file that
        was read before is gone: the caller decides what the keys it knew then are worth."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            if self._seen is None:
                return None  # still no store: still no keys
            raise ConfigError(f"the API key store {self.path} was removed") from None
        except OSError as exc:
            raise ConfigError(f"cannot read the API key store {self.path}: {exc}") from exc
        if self._seen is not None and self._seen[:2] != (stat.st_dev, stat.st_ino):
            self.close()  # replaced (a restored copy): what this connection reads is gone
        conn = self._connect(create=False)
        if conn is None:  # removed between the stat and the open
            raise ConfigError(f"the API key store {self.path} was removed")
        with self._failing_as("read"):
            version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        seen = (stat.st_dev, stat.st_ino, version)
        if seen == self._seen:
            return None
        ring = KeyRing.of(self._read(conn))
        self._seen = seen
        return ring

    def close(self) -> None:
        """Close the store's connection, if open (idempotent; the next read opens another)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        """The open connection; None when the file is missing and `create` is off."""
        if self._conn is not None:
            return self._conn
        what = "create" if create else "open"
        if (blocker := _not_a_directory(self.path.parent)) is not None:
            # the store cannot exist: not the "no keys" of a missing file (a trial's
            # `keys list --data-dir FILE` said "no API keys in FILE/api_keys.sqlite3")
            raise ConfigError(
                f"cannot {what} the API key store {self.path}: {blocker} is not a directory "
                "(--data-dir names the server's data directory)"
            )
        try:
            if not create and not self.path.exists():
                return None
        except OSError as exc:  # e.g. a directory it may not search
            hint = permission_hint(self.path, self.path.parent) if _read_only(exc) else ""
            raise ConfigError(f"cannot {what} the API key store {self.path}: {exc}{hint}") from exc
        try:
            if create:
                make_private_dir(self.path.parent)
            # `mode=rw`: a reader never creates the file (a plain open would, empty)
            uri = f"{self.path.resolve().as_uri()}?mode={'rwc' if create else 'rw'}"
            # autocommit: each write is one statement, its own transaction; check_same_thread
            # off: the server's watcher reads from whichever thread asyncio.to_thread picks
            conn = sqlite3.connect(
                uri,
                uri=True,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
        except (OSError, sqlite3.Error) as exc:
            hint = permission_hint(self.path, self.path.parent) if _read_only(exc) else ""
            raise ConfigError(f"cannot {what} the API key store {self.path}: {exc}{hint}") from exc
        try:
            self._prepare(conn, create=create)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _prepare(self, conn: sqlite3.Connection, *, create: bool) -> None:
        with self._failing_as("read"):
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"the API key store {self.path} has schema version {version}; this livemeet "
                f"reads up to {SCHEMA_VERSION}: run a newer livemeet"
            )
        if create and version == 0:  # a new file
            with self._failing_as("create"):
                conn.execute("PRAGMA journal_mode = WAL")  # readers never wait for a writer
                conn.executescript(
                    f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
                )

    def _read(self, conn: sqlite3.Connection) -> list[ApiKey]:
        with self._failing_as("read"):
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version == 0:  # made a moment ago, its schema not yet committed: no keys
                return []
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, id"
            ).fetchall()
        return [ApiKey(row[0], row[1], row[2], row[3], row[4]) for row in rows]

    @contextlib.contextmanager
    def _failing_as(self, what: str) -> Iterator[None]:
        """SQLite's errors as ConfigError naming the store and `what` was done to it; a
        clash of unique values (IntegrityError) is the caller's to handle."""
        try:
            yield
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            # a store `keys` made as root, then the service user's `keys revoke`: whose it is
            hint = permission_hint(self.path, self.path.parent) if _read_only(exc) else ""
            raise ConfigError(f"cannot {what} the API key store {self.path}: {exc}{hint}") from exc


def _read_only(exc: BaseException) -> bool:
    """Whether `exc` is a refusal by permissions: the OS's, or SQLite's for a file it may
    only read ("attempt to write a readonly database")."""
    return isinstance(exc, PermissionError) or (
        isinstance(exc, sqlite3.OperationalError) and "readonly database" in str(exc)
    )
