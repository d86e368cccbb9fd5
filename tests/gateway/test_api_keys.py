"""The API key store (livemeet/gateway/api_keys.py): create, list, revoke; digests only on
disk; what a reader sees change."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from livemeet.errors import ConfigError, InvalidRequest, NotFound
from livemeet.gateway.api_keys import DB_NAME, SCHEMA_VERSION, ApiKeyStore, store_path
from livemeet.gateway.auth import key_digest
from tests.denied import deny_access


@pytest.fixture
def store(tmp_path: Path) -> ApiKeyStore:
    return ApiKeyStore(store_path(tmp_path / "data"))


def test_create_list_and_revoke(store: ApiKeyStore) -> None:
    assert store.keys() == [] and not store.path.exists()  # reading makes no file
    first, first_key = store.create("ci")
    second, second_key = store.create("  laptop ")
    assert store.path.parent.is_dir()
    assert first_key.startswith(f"lm_{first.key_id}_") and first_key != second_key
    assert (first.name, second.name) == ("ci", "laptop")
    assert first.sha256 == key_digest(first_key) and first.active
    assert [k.key_id for k in store.keys()] == [first.key_id, second.key_id]  # oldest first
    revoked = store.revoke(first.key_id)
    assert not revoked.active and revoked.revoked_at is not None
    assert revoked.revoked_at >= revoked.created_at
    again = store.revoke(first.key_id)  # nothing changes: it keeps its first revocation
    assert again.revoked_at == revoked.revoked_at
    assert store.find(second.key_id) == second and store.find("0" * 12) is None
    ring = store.ring()
    assert (ring.num_keys, ring.num_active) == (2, 1)
    assert ring.by_digest[key_digest(second_key)] == second
    with pytest.raises(NotFound):
        store.revoke("0" * 12)


def test_the_data_dir_a_first_key_makes_is_its_owners_alone(tmp_path: Path) -> None:
    """`livemeet keys create` before any server made the data dir with mode 0755, where the
    server then kept meetings' audio and transcripts (a security review)."""
    old = os.umask(0o022)
    try:
        ApiKeyStore(store_path(tmp_path / "new" / "data")).create("ci")
    finally:
        os.umask(old)
    for made in (tmp_path / "new", tmp_path / "new" / "data"):
        assert made.stat().st_mode & 0o777 == 0o700


def test_a_store_another_user_made_says_whose_it_is(
    store: ApiKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`keys create` run as root, then `keys revoke` as the service user that runs the server:
    "attempt to write a readonly database" (the container trial), without whose the store
    is or what to do."""
    key, _ = store.create("ci")
    store.close()
    real_connect = sqlite3.connect

    def read_only(database: str, **kwargs: object) -> sqlite3.Connection:  # as the OS lets it
        return real_connect(database.replace("mode=rw", "mode=ro"), **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite3, "connect", read_only)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # the service user, no passwd entry
    other = ApiKeyStore(store.path)
    with pytest.raises(ConfigError, match="attempt to write a readonly database") as refused:
        other.revoke(key.key_id)
    data_dir = store.path.parent
    assert (
        "and livemeet runs as uid 4242: another user's run made it? "
        f"as root, `chown -R 4242 {data_dir}`"
    ) in refused.value.message
    assert other.find(key.key_id) == key  # reading it is fine
    other.close()
    # `keys create` made the data dir too (root's, 0700): the service user's `keys list`
    deny_access(monkeypatch, data_dir)
    with pytest.raises(ConfigError, match="cannot open the API key store") as refused:
        ApiKeyStore(store.path).keys()
    assert f"({data_dir} is " in refused.value.message
    assert "`chown -R 4242" in refused.value.message


def test_revoking_in_a_store_not_made_yet_is_not_found(store: ApiKeyStore) -> None:
    with pytest.raises(NotFound):
        store.revoke("0" * 12)
    assert not store.path.exists()


def test_the_key_is_never_on_disk_only_its_digest(store: ApiKeyStore) -> None:
    records = [store.create(f"k{i}") for i in range(3)]
    store.revoke(records[0][0].key_id)
    store.close()  # WAL: the rows are in the main file once the last connection closes
    files = [p for p in store.path.parent.iterdir() if p.name.startswith(DB_NAME)]
    held = b"".join(p.read_bytes() for p in files)
    for record, key in records:
        secret = key.split("_", 2)[2]
        assert secret.encode() not in held and key.encode() not in held
        assert record.sha256.encode() in held and record.key_id.encode() in held


def test_the_store_is_sqlite_in_wal_mode_with_its_schema_version(store: ApiKeyStore) -> None:
    store.create()
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        columns = [row[1] for row in conn.execute("PRAGMA table_info(api_keys)")]
    assert columns == ["id", "name", "sha256", "created_at", "revoked_at"]


def test_a_newer_schema_or_an_unreadable_file_is_a_config_error(store: ApiKeyStore) -> None:
    store.path.parent.mkdir(parents=True)
    with sqlite3.connect(store.path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match="schema version"):
        ApiKeyStore(store.path).keys()
    store.path.unlink()
    store.path.write_bytes(b"not a database, but long enough to be read as one" * 100)
    with pytest.raises(ConfigError, match="API key store"):
        ApiKeyStore(store.path).keys()


def test_a_bad_name_makes_no_key(store: ApiKeyStore) -> None:
    with pytest.raises(InvalidRequest):
        store.create("a\nb")
    assert store.keys() == []


def test_a_reader_sees_what_another_connection_changes(store: ApiKeyStore) -> None:
    reader = ApiKeyStore(store.path)
    assert reader.ring_if_changed() is None  # no store yet: no keys, nothing changed
    record, _ = store.create("ci")
    first = reader.ring_if_changed()
    assert first is not None and first.num_active == 1
    assert reader.ring_if_changed() is None  # unchanged since
    store.revoke(record.key_id)  # another connection (another process: `livemeet keys`)
    second = reader.ring_if_changed()
    assert second is not None and (second.num_keys, second.num_active) == (1, 0)
    assert reader.ring_if_changed() is None


def test_a_reader_follows_a_store_replaced_and_says_when_it_is_removed(
    store: ApiKeyStore, tmp_path: Path
) -> None:
    store.create("old")
    store.close()
    backup = tmp_path / "backup.sqlite3"
    shutil.copy(store.path, backup)
    reader = ApiKeyStore(store.path)
    assert reader.ring_if_changed() is not None
    restored = ApiKeyStore(backup)
    restored.create("restored")
    restored.close()
    os.replace(backup, store.path)  # a restored copy: a new file where the old one was
    replaced = reader.ring_if_changed()
    assert replaced is not None and sorted(k.name for k in replaced.by_digest.values()) == [
        "old",
        "restored",
    ]
    store.path.unlink()
    with pytest.raises(ConfigError, match="was removed"):
        reader.ring_if_changed()
