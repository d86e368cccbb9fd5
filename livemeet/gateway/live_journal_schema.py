"""The live journal's database: the SQLite schema of `sessions.sqlite3` and the statements run
on it, opening it (created, or migrated from an older schema version), and the JSON its rows
hold (a session's options, a final segment).

Separate from live_journal.py (the API the event loop uses) and live_journal_writer.py (the
writer thread), which both use it: what the file on disk holds, and how it is brought to
this version, in one place.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from livemeet.errors import ConfigError, StorageFailed
from livemeet.transcript.segments import Segment, SegmentFlag

if TYPE_CHECKING:
    from livemeet.gateway.live_journal import JournalSession

# the journal's one logger, as before the split: its records keep their name
log = logging.getLogger("livemeet.gateway.live_journal")

SCHEMA_VERSION = 5  # PRAGMA user_version of the journals this code writes and reads

# a finalize's place in its session's audio (v3); a session's finalizes at one place are one
_FINALIZES_TABLE = """
CREATE TABLE finalizes (
    session_id TEXT NOT NULL,
    frames INTEGER NOT NULL,  -- sample frames of the session's audio received before it
    PRIMARY KEY (session_id, frames)
) WITHOUT ROWID;
"""
_SCHEMA = (
    """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    audio_name TEXT NOT NULL,  -- the file under audio/, a hash of session_id
    resume_token_sha256 TEXT NOT NULL,
    captions_token_sha256 TEXT NOT NULL,
    sample_rate INTEGER NOT NULL,  -- Hz, the client's declared rate
    channels INTEGER NOT NULL,
    created_at REAL NOT NULL,  -- unix seconds
    options TEXT NOT NULL DEFAULT '{}',  -- JSON: the session's prompt, hotwords, language
    ended INTEGER NOT NULL DEFAULT 0,  -- 1 once `end` reached the backend: a rebuild ends it
    durable_frames INTEGER NOT NULL DEFAULT 0,  -- sample frames synced in the audio file
    names TEXT NOT NULL DEFAULT '[]',  -- JSON [[label, name], ...] in naming order
    merges TEXT NOT NULL DEFAULT '[]',  -- JSON [[label, into], ...] in merge order (v2)
    labels TEXT NOT NULL DEFAULT '[]',  -- JSON [label, ...]: every label a segment showed (v4)
    key_id TEXT  -- the id of the API key the session runs on; NULL: none (v5)
);
CREATE TABLE finals (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,  -- 0, 1, ... in commit order
    segment TEXT NOT NULL,  -- JSON: id, start, end, speaker, text, is_final, flags
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""
    + _FINALIZES_TABLE
)

INSERT_SESSION = """
INSERT OR REPLACE INTO sessions (session_id, audio_name, resume_token_sha256,
    captions_token_sha256, sample_rate, channels, created_at, options, key_id)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
# seq from the table itself, so an adopted session's finals go on after its restored ones
INSERT_FINAL = """
INSERT INTO finals (session_id, seq, segment)
VALUES (?, (SELECT COALESCE(MAX(seq) + 1, 0) FROM finals WHERE session_id = ?), ?)
"""
INSERT_FINALIZE = "INSERT OR IGNORE INTO finalizes (session_id, frames) VALUES (?, ?)"
SELECT_LIVE = """
SELECT session_id, audio_name, resume_token_sha256, captions_token_sha256, sample_rate,
    channels, created_at, options, durable_frames, names, merges, labels, ended, key_id
FROM sessions ORDER BY created_at, session_id
"""
# what each older schema version needs to become SCHEMA_VERSION, in order
_MIGRATIONS = {
    1: "ALTER TABLE sessions ADD COLUMN merges TEXT NOT NULL DEFAULT '[]';",
    2: _FINALIZES_TABLE,
    3: "ALTER TABLE sessions ADD COLUMN labels TEXT NOT NULL DEFAULT '[]';",
    4: "ALTER TABLE sessions ADD COLUMN key_id TEXT;",
}
# the rows of a session besides its own: dropped with it, or when its id is opened anew
DELETE_ROWS = (
    "DELETE FROM finals WHERE session_id = ?",
    "DELETE FROM finalizes WHERE session_id = ?",
)


def connect(path: Path) -> sqlite3.Connection:
    """The journal database at `path`, its schema created if new. Raises ConfigError for a
    newer schema, StorageFailed when it cannot be opened or created."""
    try:
        # autocommit: transactions are the explicit BEGIN / COMMIT of the writer;
        # check_same_thread off: start() opens it, the writer thread alone uses it after
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StorageFailed(f"live journal {path} could not be opened: {exc}") from exc
    try:
        _prepare(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _prepare(conn: sqlite3.Connection, path: Path) -> None:
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        # FULL in WAL mode: each commit syncs the WAL, so an ack survives a power loss too
        # (NORMAL: a crash of the process only); one sync a group beside ~one per session
        # streaming costs nothing measurable (loadtest.journal_load at 100 sessions)
        conn.execute("PRAGMA synchronous = FULL")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version == 0:  # a new file
            conn.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            )
            version = SCHEMA_VERSION
        elif version < SCHEMA_VERSION:
            _migrate(conn, version)
            version = SCHEMA_VERSION
    except sqlite3.Error as exc:
        raise StorageFailed(f"live journal {path} could not be opened: {exc}") from exc
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"live journal {path} has schema version {version}; this livemeet reads up to "
            f"{SCHEMA_VERSION}: run a newer livemeet, or move the file away to start empty"
        )
    if mode != "wal":  # a filesystem without shared memory: still safe, slower commits
        log.warning("live journal %s: journal mode %s, not WAL", path, mode)


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring a journal of schema `version` (older) to SCHEMA_VERSION, in one transaction: its
    unfinished sessions are rebuilt as before (an older livemeet then refuses the file, as it
    does any newer one). Raises sqlite3.Error."""
    steps = " ".join(_MIGRATIONS[v] for v in range(version, SCHEMA_VERSION))
    conn.executescript(f"BEGIN IMMEDIATE; {steps} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
    log.info("live journal: schema %d brought to %d", version, SCHEMA_VERSION)


def options_to_json(meta: JournalSession) -> str:
    """The JSON of the `sessions.options` column: `{"prompt", "hotwords", "language"}` of `meta`
    (read back by `options_from_json`)."""
    options = {"prompt": meta.prompt, "hotwords": list(meta.hotwords), "language": meta.language}
    return json.dumps(options, ensure_ascii=False)


def options_from_json(text: str) -> dict[str, Any]:
    """A session's options (`options_to_json`). Raises ValueError for a malformed record."""
    options = json.loads(text)
    if not isinstance(options, dict):
        raise ValueError(f"options {text!r} are not a JSON object")
    prompt, language = options.get("prompt"), options.get("language")
    hotwords = options.get("hotwords") or []
    if not (
        isinstance(prompt, str | None)
        and isinstance(language, str | None)
        and isinstance(hotwords, list)
        and all(isinstance(w, str) for w in hotwords)
    ):
        raise ValueError(f"options {text!r} are malformed")
    return {"prompt": prompt, "hotwords": tuple(hotwords), "language": language}


def segment_to_json(segment: Segment) -> str:
    """The JSON of one final in the `finals` table: `{"id", "start", "end", "speaker", "text",
    "is_final", "flags"}`, times in seconds (read back by `segment_from_json`)."""
    # times as Python floats: JSON keeps their repr, so they come back exact
    return json.dumps(
        {
            "id": segment.id,
            "start": segment.start_s,
            "end": segment.end_s,
            "speaker": segment.speaker,
            "text": segment.text,
            "is_final": segment.is_final,
            "flags": [f.value for f in segment.flags],
        },
        ensure_ascii=False,
    )


def segment_from_json(text: str) -> Segment:
    """A final as `segment_to_json` wrote it. Raises ValueError, TypeError, KeyError for a
    malformed record."""
    d = json.loads(text)
    return Segment(
        start_s=float(d["start"]),
        end_s=float(d["end"]),
        speaker=str(d["speaker"]),
        text=str(d["text"]),
        id=str(d["id"]),
        is_final=bool(d["is_final"]),
        flags=tuple(SegmentFlag(f) for f in d["flags"]),
    )
