"""The live journal's writer thread (`Writer`) and what the event loop hands it: the ops that
cross the queue, each carrying its session's `Handle`, which the writer posts back in its
callbacks. The writer alone touches the database connection and the audio files; the group
commit is described in live_journal.py.

Separate from live_journal.py (the API the event loop calls, which only enqueues) so that
each side of the queue reads on its own. That module imports this one; this one imports it
for annotations only, so `SessionState`, which the writer needs at run time, is defined here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from livemeet.audio.constants import JOURNAL_SYNC_THREADS
from livemeet.errors import StorageFailed
from livemeet.gateway.disk import sync_directory
from livemeet.gateway.live_journal_schema import (
    DELETE_ROWS,
    INSERT_FINAL,
    INSERT_FINALIZE,
    INSERT_SESSION,
    options_to_json,
    segment_to_json,
)
from livemeet.transcript.segments import Segment

if TYPE_CHECKING:
    from livemeet.gateway.live_journal import (
        CommitCallback,
        DurableCallback,
        FailedCallback,
        JournalSession,
    )

# the journal's one logger, as before the split: its records keep their name
log = logging.getLogger("livemeet.gateway.live_journal")


class SessionState(StrEnum):
    """How a journalled session left the journal."""

    LIVE = "live"  # open, or unfinished when the server stopped: restored on start
    FINISHED = "finished"  # ended; its final transcript is stored elsewhere
    DISCARDED = "discarded"  # aborted with no final transcript


# -- the event loop's side ---------------------------------------------------------------------


@dataclass(eq=False)
class Handle:
    """One open session as the event loop sees it. Loop thread only: the writer merely carries
    it back in the callbacks it posts."""

    session_id: str
    frame_bytes: int
    on_durable: DurableCallback
    on_failed: FailedCallback
    durable_frames: int  # as last reported to on_durable
    failed: bool = False
    ended: bool = False  # finished or discarded: no more callbacks


def _deliver_durable(handle: Handle, frames: int) -> None:
    if handle.ended or handle.failed:
        return
    handle.durable_frames = frames
    handle.on_durable(frames)


def _deliver_failed(handle: Handle, error: StorageFailed) -> None:
    if handle.ended or handle.failed:
        return
    handle.failed = True
    handle.on_failed(error)


def _settle(stored: asyncio.Future[None]) -> None:
    if not stored.done():  # the waiter may have been cancelled (its session dropped)
        stored.set_result(None)


# -- what crosses the queue (frozen: the writer reads them on another thread) -------------------


@dataclass(frozen=True)
class Open:
    """Start recording a session: its row (unless `adopted`) and its audio file `audio_name`,
    cut to `start_frames`."""

    handle: Handle
    meta: JournalSession
    audio_name: str
    start_frames: int  # frames its file holds already (an adopted session's durable audio)
    adopted: bool  # its row exists: keep it; else a new row replaces any of the same id


@dataclass(frozen=True)
class Append:
    """PCM bytes of the session, appended to its audio file and fdatasynced in its group."""

    handle: Handle
    pcm: bytes


@dataclass(frozen=True)
class Final:
    """A final segment, inserted as a `finals` row (`segment_to_json`)."""

    handle: Handle
    segment: Segment
    # done on the loop once the group that holds it was committed (or failed): the final is
    # shown only then (`LiveJournal.add_final`)
    stored: asyncio.Future[None]


@dataclass(frozen=True)
class Finalize:
    """A `finalize` at `frames` (sample frames of the session's audio received before it)."""

    handle: Handle
    frames: int
    # done on the loop once the group that holds it was committed (or failed): a resume's
    # `session.ready` names it held only then (`LiveJournal.add_finalize`)
    stored: asyncio.Future[None]


@dataclass(frozen=True)
class Names:
    """The session's speaker names ({label: name} pairs), replacing its `names` column."""

    handle: Handle
    names: tuple[tuple[str, str], ...]
    stored: asyncio.Future[None]  # as Final's: the answer to the rename waits for it


@dataclass(frozen=True)
class Merges:
    """The session's speaker merges ({label: into} pairs), replacing its `merges` column."""

    handle: Handle
    merges: tuple[tuple[str, str], ...]
    stored: asyncio.Future[None]  # as Final's: the answer to the merge waits for it


@dataclass(frozen=True)
class Labels:
    """The labels the session showed, replacing its `labels` column."""

    handle: Handle
    labels: tuple[str, ...]  # every label the session's segments showed, sorted


@dataclass(frozen=True)
class KeyId:
    """The session's API key id, replacing its `key_id` column."""

    handle: Handle
    key_id: str | None  # the API key the session runs on from now on (None: none)


@dataclass(frozen=True)
class End:
    """The session is over (`state`): its rows deleted and its audio file removed (a DISCARDED
    session's before the commit, any other's after it)."""

    handle: Handle
    state: SessionState
    # done on the loop once the group that deletes its rows was committed (or failed): a
    # session ended early for its storage tells its client so only then (`LiveJournal.discard`)
    done: asyncio.Future[None] | None = None


@dataclass(frozen=True)
class Ending:
    """The session's `end` reached the backend: its row is marked `ended`, so a rebuild after
    a crash ends it too (`LiveJournal.mark_ended`)."""

    handle: Handle


# None: stop after the rest
Op = Open | Append | Final | Finalize | Names | Merges | Labels | KeyId | End | Ending | None


# -- the writer thread -------------------------------------------------------------------------


@dataclass(eq=False)
class _Tape:
    """One open session as the writer sees it: its audio file and how much of it is synced."""

    handle: Handle
    session_id: str
    path: Path
    frame_bytes: int
    synced_bytes: int  # written and fdatasynced
    reported_frames: int  # recorded in the database and posted to on_durable
    file: io.FileIO | None = None  # None once failed or ended
    failed: bool = False


@dataclass
class _Group:
    """What one group commit does."""

    # (the session it records, SQL, parameters), in op order
    statements: list[tuple[_Tape, str, tuple[object, ...]]] = field(default_factory=list)
    audio: dict[_Tape, list[bytes]] = field(default_factory=dict)
    unlinks: dict[str, Path] = field(default_factory=dict)  # audio files of ended sessions
    created: list[_Tape] = field(default_factory=list)  # sessions whose audio file is new

    def add(self, tape: _Tape, sql: str, *params: object) -> None:
        self.statements.append((tape, sql, params))


def _column_of(op: Names | Merges | Labels | KeyId) -> tuple[str, str | None]:
    """The `sessions` column `op` replaces (a name written here, never the client's) and its
    new value: the whole map or set as JSON, or the key id."""
    if isinstance(op, KeyId):
        return "key_id", op.key_id
    if isinstance(op, Labels):
        return "labels", json.dumps(op.labels, ensure_ascii=False)
    if isinstance(op, Merges):
        return "merges", json.dumps(op.merges, ensure_ascii=False)
    return "names", json.dumps(op.names, ensure_ascii=False)


class Writer:
    """The journal's writer thread: drains the queue in groups (`run`). Owns `conn` and every
    audio file; touches loop state only through `call_soon_threadsafe`."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        audio_dir: Path,
        loop: asyncio.AbstractEventLoop,
        ops: queue.SimpleQueue[Op],
        hurry: threading.Event,
        interval_s: float,
    ) -> None:
        self._conn = conn
        self._audio_dir = audio_dir
        self._loop = loop
        self._ops = ops
        self._hurry = hurry
        self._interval_s = interval_s
        self._tapes: dict[Handle, _Tape] = {}
        self._last_group = -float("inf")  # time.monotonic() when the last group was taken
        # runs a group's fdatasyncs at once (`_sync_all`); set while `run` runs
        self._sync_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.on_commit: CommitCallback | None = None

    def run(self) -> None:
        """The thread's body: group commits until the stop op, then every file and the
        connection closed, and the sync threads stopped."""
        with concurrent.futures.ThreadPoolExecutor(
            JOURNAL_SYNC_THREADS, thread_name_prefix="live-journal-sync"
        ) as pool:
            self._sync_pool = pool
            try:
                self._run_groups()
            finally:
                self._sync_pool = None

    def _run_groups(self) -> None:
        try:
            while True:
                ops = self._next_group()
                try:
                    self._commit_group([op for op in ops if op is not None])
                except Exception:  # a bug: the sessions must still hear that storing stopped
                    log.exception("live journal: a group commit failed")
                    self._rollback()
                    self._fail_all(StorageFailed("the server's journal failed (internal error)"))
                finally:  # after the failures it posted: a waiter sees its session failed
                    for op in ops:
                        if isinstance(op, Final | Finalize | Names | Merges):
                            self._post(_settle, op.stored)
                        elif isinstance(op, End) and op.done is not None:
                            self._post(_settle, op.done)
                if ops[-1] is None:
                    return
        finally:
            for tape in self._tapes.values():
                _close(tape)
            self._conn.close()

    def _next_group(self) -> list[Op]:
        """Blocks for the next op, then until `interval_s` after the previous group (cut short
        by `hurry`: close(), or a final queued, whose client waits for its commit to see it),
        then takes everything queued."""
        ops = [self._ops.get()]
        wait_s = self._last_group + self._interval_s - time.monotonic()
        if wait_s > 0 and ops[0] is not None:
            self._hurry.wait(wait_s)
        # before the queue is drained: a final queued after this hurries the next group
        # (close() queues its stop before it sets `hurry`, so this group takes the stop)
        self._hurry.clear()
        while True:
            try:
                ops.append(self._ops.get_nowait())
            except queue.Empty:
                self._last_group = time.monotonic()
                return ops

    def _commit_group(self, ops: list[Op]) -> None:
        started = time.monotonic()
        group = _Group()
        for op in ops:
            self._gather(op, group)
        synced = self._write_audio(group)
        if not self._commit(group):
            return
        if self.on_commit is not None:
            try:
                self.on_commit(time.monotonic() - started, len(synced))
            except Exception:  # metrics must not stop the journal
                log.exception("live journal: on_commit failed")
        for path in group.unlinks.values():
            _unlink(path)
        for tape in synced:
            if tape.failed:  # its record's statements failed (`_commit_each`)
                continue
            frames = tape.synced_bytes // tape.frame_bytes
            if frames > tape.reported_frames:
                tape.reported_frames = frames
                self._post(_deliver_durable, tape.handle, frames)

    def _gather(self, op: Op, group: _Group) -> None:
        """Turn one op into the group's statements and audio, in the order ops came."""
        if isinstance(op, Open):
            self._open_tape(op, group)
            return
        assert op is not None
        tape = self._tapes[op.handle]
        if isinstance(op, End):
            _close(tape)
            del self._tapes[op.handle]
            group.audio.pop(tape, None)  # no use syncing audio about to be deleted
            if op.state is SessionState.DISCARDED:
                _unlink(tape.path)  # before the commit, which a full disk may fail
            else:  # after it: a crash in between rebuilds the session with its audio
                group.unlinks[tape.path.name] = tape.path
            group.add(tape, "DELETE FROM sessions WHERE session_id = ?", tape.session_id)
            for sql in DELETE_ROWS:
                group.add(tape, sql, tape.session_id)
        elif isinstance(op, Ending):
            if not tape.failed:
                group.add(
                    tape, "UPDATE sessions SET ended = 1 WHERE session_id = ?", tape.session_id
                )
        elif tape.failed:
            return  # its record stopped where it failed
        elif isinstance(op, Append):
            group.audio.setdefault(tape, []).append(op.pcm)
        elif isinstance(op, Final):
            group.add(
                tape, INSERT_FINAL, tape.session_id, tape.session_id, segment_to_json(op.segment)
            )
        elif isinstance(op, Finalize):
            group.add(tape, INSERT_FINALIZE, tape.session_id, op.frames)
        else:  # Names, Merges, Labels, KeyId: one column of the session's row, replaced
            column, value = _column_of(op)
            group.add(
                tape, f"UPDATE sessions SET {column} = ? WHERE session_id = ?", value,
                tape.session_id,
            )  # fmt: skip

    def _open_tape(self, op: Open, group: _Group) -> None:
        meta = op.meta
        path = self._audio_dir / op.audio_name
        # the same id ended earlier in this group: its file is this session's now
        group.unlinks.pop(op.audio_name, None)
        start_bytes = op.start_frames * meta.frame_bytes
        tape = _Tape(
            op.handle, meta.session_id, path, meta.frame_bytes, start_bytes, op.start_frames
        )
        self._tapes[op.handle] = tape
        if not op.adopted:
            for sql in DELETE_ROWS:
                group.add(tape, sql, meta.session_id)
            group.add(
                tape,
                INSERT_SESSION,
                meta.session_id,
                op.audio_name,
                meta.resume_token_sha256,
                meta.captions_token_sha256,
                meta.sample_rate,
                meta.channels,
                meta.created_at,
                options_to_json(meta),
                meta.key_id,
            )
        try:
            # O_APPEND and unbuffered: each write goes to the end, nothing waits in a buffer
            f = open(path, "ab", buffering=0)
        except OSError as exc:
            self._fail(tape, "audio", exc)
            return
        tape.file = f
        if not op.adopted:
            group.created.append(tape)
        try:
            f.truncate(start_bytes)  # a new session's stale file, an adopted one's unsynced tail
        except OSError as exc:
            self._fail(tape, "audio", exc)

    def _write_audio(self, group: _Group) -> list[_Tape]:
        """Append and fdatasync each session's audio of the group; add its durable length to
        the group's statements. Returns the sessions synced. The audio folder is synced
        first where the group created a file in it: a file's own fdatasync does not cover its
        name, which a power loss could take with the audio the record then claims."""
        synced: list[_Tape] = []
        if group.created:
            try:
                sync_directory(self._audio_dir)
            except OSError as exc:
                for tape in group.created:
                    if not tape.failed:
                        self._fail(tape, "audio", exc)
        written: list[tuple[_Tape, io.FileIO, int]] = []
        for tape, chunks in group.audio.items():
            if tape.failed or tape.file is None:
                continue
            data = b"".join(chunks)
            try:
                _write_all(tape.file, data)
            except OSError as exc:
                self._fail(tape, "audio", exc)  # part of `data` may be in the file: never recorded
                continue
            written.append((tape, tape.file, len(data)))
        # the syncs at once (JOURNAL_SYNC_THREADS); the bookkeeping after, on this thread
        results = self._sync_all([f for _, f, _ in written])
        for (tape, _, size), error in zip(written, results, strict=True):
            if error is not None:
                self._fail(tape, "audio", error)  # its bytes may be in the file: never recorded
                continue
            tape.synced_bytes += size
            synced.append(tape)
            frames = tape.synced_bytes // tape.frame_bytes
            group.add(
                tape,
                "UPDATE sessions SET durable_frames = ? WHERE session_id = ?",
                frames,
                tape.session_id,
            )
        return synced

    def _sync_all(self, files: list[io.FileIO]) -> list[OSError | None]:
        """fdatasync each of `files`, on the sync threads where there are several; each's
        error, or None, in their order."""
        if self._sync_pool is None or len(files) < 2:
            return [_sync(f) for f in files]
        return list(self._sync_pool.map(_sync, files))

    def _commit(self, group: _Group) -> bool:
        """Run the group's statements as one transaction; where a statement fails, again
        session by session (`_commit_each`). False where nothing was committed: every open
        session failed (what was recorded before stays)."""
        if not group.statements:
            return True
        try:
            self._conn.execute("BEGIN")
            for _, sql, params in group.statements:
                self._conn.execute(sql, params)
            self._conn.execute("COMMIT")
            return True
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a str SQLite cannot encode
            log.warning("live journal: a group commit failed (%s): again session by session", exc)
            self._rollback()
        return self._commit_each(group)

    def _commit_each(self, group: _Group) -> bool:
        """The group's statements in one transaction, each session's in a savepoint: a
        session whose statement fails is failed alone, its record left where it was (one
        session's bad row failed every live session on the server: a security review).
        Where the transaction itself fails (a full disk), every open session fails."""
        by_tape: dict[_Tape, list[tuple[str, tuple[object, ...]]]] = {}
        for tape, sql, params in group.statements:
            by_tape.setdefault(tape, []).append((sql, params))
        try:
            self._conn.execute("BEGIN")
            for tape, statements in by_tape.items():
                self._conn.execute("SAVEPOINT session")
                try:
                    for sql, params in statements:
                        self._conn.execute(sql, params)
                except (sqlite3.Error, ValueError) as exc:
                    self._conn.execute("ROLLBACK TO session")
                    self._fail_record(tape, group, exc)
                self._conn.execute("RELEASE session")
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.error(
                "live journal: a commit failed (%d open sessions fail): %s",
                sum(not t.failed for t in self._tapes.values()),
                exc,
            )
            self._rollback()
            self._fail_all(StorageFailed(f"the server could not store this session ({exc})"))
            return False
        return True

    def _fail_record(self, tape: _Tape, group: _Group, exc: Exception) -> None:
        """A session whose statements failed: failed, if still open; an ended one keeps its
        audio file (its record still names it, and a start rebuilds it)."""
        log.error(
            "live journal: the record of session %r could not be stored: %s", tape.session_id, exc
        )
        if group.unlinks.get(tape.path.name) == tape.path and tape.handle not in self._tapes:
            del group.unlinks[tape.path.name]
        if not tape.failed and self._tapes.get(tape.handle) is tape:
            self._fail_tape(
                tape,
                StorageFailed(f"the server could not store this session ({type(exc).__name__})"),
            )

    def _rollback(self) -> None:
        if not self._conn.in_transaction:
            return
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error as exc:  # the commit's failure is already being reported
            log.error("live journal: rollback failed: %s", exc)

    def _fail(self, tape: _Tape, what: str, exc: OSError) -> None:
        log.error(
            "live journal: the %s of session %r could not be stored: %s", what, tape.session_id, exc
        )
        reason = exc.strerror or type(exc).__name__
        self._fail_tape(
            tape, StorageFailed(f"the server could not store this session's {what} ({reason})")
        )

    def _fail_all(self, error: StorageFailed) -> None:
        for tape in self._tapes.values():
            if not tape.failed:
                self._fail_tape(tape, error)

    def _fail_tape(self, tape: _Tape, error: StorageFailed) -> None:
        tape.failed = True
        _close(tape)
        self._post(_deliver_failed, tape.handle, error)

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop closed without close(): nobody is left to tell
            log.warning("live journal: event loop closed, %s dropped", callback.__name__)


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:  # load_unfinished deletes it on the next start
        log.warning("live journal: %s was not deleted: %s", path, exc)


def _sync(f: io.FileIO) -> OSError | None:
    """fdatasync `f`; its error, or None (a sync thread's: the writer fails the session)."""
    try:
        os.fdatasync(f.fileno())
    except OSError as exc:
        return exc
    return None


def _write_all(f: io.FileIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]


def _close(tape: _Tape) -> None:
    """Close the tape's file. Nothing waits in it (unbuffered), so a failing close loses
    nothing the record claims."""
    if tape.file is None:
        return
    f, tape.file = tape.file, None
    try:
        f.close()
    except OSError as exc:
        log.warning("live journal: closing %s failed: %s", tape.path, exc)
