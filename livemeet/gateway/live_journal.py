"""The journal of live sessions: their audio, finals, finalizes, speaker names, merges and labels
on disk, so a crash of the server loses nothing it acknowledged (DESIGN 5.9 "Nothing lost").

Under `root`:
- `sessions.sqlite3` (WAL, synchronous=FULL: a committed transaction survives a crash of this
  process or of the machine, with the audio it records: each file is fdatasynced before, and
  the audio folder once a group created a file in it): a row per unfinished session (its
  meta, whether its `end` came, its durable frames, its speaker names and merges, and the
  labels its segments showed, which a merge may name after a rebuild), a row per committed
  final and a row per `finalize` (where in its audio the client asked for a commit: a rebuild
  asks again there, so a finalize the backend had not applied yet is not lost, and one it had
  applied still bounds the windows after it). Schema version 4; an older file is brought to it
  as it opens (version 1 gains the merges column, version 2 the finalizes table, version 3 the
  labels column, empty: its sessions know the labels of their finals only). A finished or
  discarded session's rows go (with its prompt and hotwords: nothing of a session outlives it
  here; its transcript is the transcript store's).
- `audio/<ls_hex>.s16le`: a session's audio as its client sent it (interleaved PCM16 LE at the
  declared rate), append-only, named by a hash of the session id (ids come from the backend:
  any string).

One writer thread owns the connection and the audio files; the event loop only enqueues. The
writer group-commits: it waits for work, then until `commit_interval_s` after its previous
group began, takes everything queued, appends and fdatasyncs each session's audio, then
records the new durable lengths, finals, finalizes, names, merges, labels and ends in one
transaction, and reports each session's new durable length on the loop (`on_durable`). A
recorded length never exceeds what was synced before it, so a reload finds everything ever
reported durable; bytes past the record were never reported and are cut off. A group's files
are synced at once on JOURNAL_SYNC_THREADS threads (one after another, a group's cost grew
with the sessions streaming; `loadtest.journal_load` measures it on a data dir's disk).

Threads: the public methods run on the event loop's thread (`load_unfinished` on any thread,
before `start`); the writer runs `Writer.run`. They share the queue, and the callbacks the
writer posts back with `call_soon_threadsafe`.

This module is the journal's API (`LiveJournal`, what it stores and returns, the lock, reading
a session's audio back); the writer thread and the ops it takes off the queue are in
live_journal_writer.py, the database's schema, migrations and row JSON in
live_journal_schema.py.
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import itertools
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from livemeet.audio.constants import (
    JOURNAL_COMMIT_INTERVAL_S,
    JOURNAL_READ_CHUNK_BYTES,
    PCM_S16LE_BYTES,
)
from livemeet.errors import ConfigError, InternalError, StorageFailed
from livemeet.gateway.disk import make_private_dir, refusal_hint
from livemeet.gateway.live_journal_schema import (
    DELETE_ROWS,
    SELECT_LIVE,
    connect,
    options_from_json,
    segment_from_json,
)
from livemeet.gateway.live_journal_writer import (
    Append,
    End,
    Ending,
    Final,
    Finalize,
    Handle,
    KeyId,
    Labels,
    Merges,
    Names,
    Op,
    Open,
    SessionState,
    Writer,
)
from livemeet.gateway.transcript_store import live_transcript_id
from livemeet.transcript.segments import Segment

log = logging.getLogger(__name__)

DB_NAME = "sessions.sqlite3"
AUDIO_DIR = "audio"
AUDIO_SUFFIX = ".s16le"
LOCK_NAME = "lock"  # flock'd by the journal's server while it runs; holds its pid
# what a start could not read is moved under here, in a directory per start (`load_unfinished`)
DROPPED_DIR = "dropped"


@dataclass(frozen=True)
class JournalSession:
    """What the journal keeps of a live session besides its audio, finals and names."""

    session_id: str  # any string from the backend (the audio file is named by its hash)
    resume_token_sha256: str  # hex
    captions_token_sha256: str  # hex
    sample_rate: int  # Hz, the client's declared rate
    channels: int  # interleaved in the audio file
    created_at: float  # unix seconds
    # what the client's `start` asked for: a rebuilt session is opened with the same
    prompt: str | None = None
    hotwords: tuple[str, ...] = ()
    language: str | None = None
    # the API key it runs on (its public id; None: none), so that a start after a restart
    # ends a session whose key was revoked or removed meanwhile (`set_key_id` on a resume)
    key_id: str | None = None

    @property
    def frame_bytes(self) -> int:
        """Bytes per sample frame of its audio (PCM16, every channel)."""
        return self.channels * PCM_S16LE_BYTES


@dataclass(frozen=True)
class RestoredSession:
    """An unfinished session as `load_unfinished` found it on disk."""

    meta: JournalSession
    durable_frames: int  # sample frames (at meta.sample_rate) durable in the audio file
    finals: tuple[Segment, ...]  # committed, in order, ids and flags kept
    names: tuple[tuple[str, str], ...]  # (label, name), in naming order
    audio_path: Path  # raw interleaved PCM16 LE, exactly durable_frames * frame_bytes bytes
    ended: bool = False  # its `end` had reached the backend (`mark_ended`)
    merges: tuple[tuple[str, str], ...] = ()  # (label, into), in merge order
    # where its client's finalizes came: sample frames of its audio received before each,
    # increasing, none past durable_frames (`LiveJournal.add_finalize`)
    finalizes: tuple[int, ...] = ()
    # labels its segments showed, sorted (`LiveJournal.set_labels`; maybe short of the last
    # ones shown before a crash, and of its finals' labels in a journal of schema 3)
    labels: tuple[str, ...] = ()


DurableCallback = Callable[[int], None]  # sample frames now durable
CommitCallback = Callable[[float, int], None]  # a group commit's seconds, audio files synced
FailedCallback = Callable[[StorageFailed], None]


async def read_pcm(
    path: Path, frame_bytes: int, limit_bytes: int | None = None
) -> AsyncIterator[bytes]:
    """A session's audio file (`RestoredSession.audio_path`, `LiveJournal.audio_path`) in
    chunks of whole sample frames of at most JOURNAL_READ_CHUNK_BYTES, read off the loop, up to
    `limit_bytes` (a whole number of frames; None: to its end; a file the writer still appends
    to is read only as far as its durable audio). Raises OSError, and InternalError where the
    file ends short of `limit_bytes`."""
    chunk = max(frame_bytes, JOURNAL_READ_CHUNK_BYTES // frame_bytes * frame_bytes)
    left = limit_bytes
    f = await asyncio.to_thread(open, path, "rb")
    try:
        while left is None or left > 0:
            data = await asyncio.to_thread(f.read, chunk if left is None else min(chunk, left))
            if not data:
                break
            if left is not None:
                left -= len(data)
            yield data
    finally:
        f.close()
    if left:
        raise InternalError(f"{path} ends {left} bytes short of the audio it should hold")


def journal_holder(root: Path) -> str | None:
    """Who holds the journal under `root` (its lock file), as `holder_phrase` names it, for a
    config check before a start; None where no running server does (or there is no journal
    yet). Takes the lock and lets it go. Raises ConfigError (`_take_lock`)."""
    path = root / LOCK_NAME
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):  # check_data_dir names a file in the way
        return None
    except OSError as exc:  # a data dir another user's run made (0700): was a traceback
        raise ConfigError(_lock_refusal(path, exc)) from exc
    held = _take_lock(path)
    if held is None:
        return holder_phrase(path)
    held.close()  # lets the flock go
    return None


def holder_phrase(path: Path) -> str:
    """How a refusal names the server holding the lock file at `path`: its pid where the file
    names one, so the operator knows which process to stop. One phrase for the journal's own
    refusal, `serve`'s before it loads anything and `serve --check-config`'s notice (which
    passes: it vets a config for that server's restart), so all say the same."""
    pid = _lock_holder(path)
    which = "" if pid is None else f"pid {pid}; "
    return f"another livemeet server ({which}one server per --data-dir)"


def _lock_refusal(path: Path, exc: OSError) -> str:
    """Why the lock file at `path` (the data dir's live/lock) cannot be used."""
    # the journal's root is the data dir's live/: its parent is the data dir
    hint = refusal_hint(exc, path, path.parent.parent)
    return f"cannot open the live journal's lock file {path}: {exc.strerror or exc}{hint}"


def _take_lock(path: Path) -> io.BufferedRandom | None:
    """`path` opened and exclusively flock'ed (without waiting), this process's pid written in
    it (`_lock_holder`), or None where another open file holds the lock. The lock lasts until
    the file is closed or the process dies. Raises ConfigError where the file cannot be opened
    (another user's, a directory in its place): the server cannot use that data dir."""
    try:
        f = open(path, "a+b")  # noqa: SIM115  (the caller closes it)
    except OSError as exc:
        raise ConfigError(_lock_refusal(path, exc)) from exc
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    try:
        f.truncate(0)
        f.write(f"{os.getpid()}\n".encode())
        f.flush()
    except OSError as exc:  # a full disk: the lock holds all the same, only unnamed
        log.warning("live journal: the lock file %s does not name its holder: %s", path, exc)
    return f


def _lock_holder(path: Path) -> int | None:
    """The pid the lock file at `path` names (its holder wrote it on taking the lock), or None
    where it names none (written by a livemeet before this, or being written now)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def audio_name(session_id: str) -> str:
    """The file name of a session's audio under `root/audio`."""
    return live_transcript_id(session_id) + AUDIO_SUFFIX


class LiveJournal:
    """The durable store of live sessions (see the module docstring for layout and threads).

    Use: `load_unfinished()` once at start-up, then `start(loop)`; `open_session` or `adopt`
    each session, feed it (`append_audio`, `add_final`, `add_finalize`, `set_names`,
    `set_merges`) and end it (`finish` or `discard`); `await close()` at shutdown. Sessions
    still open at close stay unfinished and come back from the next `load_unfinished`.

    Every method but `load_unfinished` and `close` only enqueues: nothing blocks the loop.
    Errors: a method called after `close()`, or naming a session that is not open, raises
    InternalError (a bug in the caller). Storage failures in the writer never raise here: they
    reach the sessions concerned as `on_failed(StorageFailed)`.
    """

    def __init__(
        self,
        root: Path,
        *,
        commit_interval_s: float = JOURNAL_COMMIT_INTERVAL_S,
        on_commit: CommitCallback | None = None,
    ) -> None:
        """`root`: the journal's directory (created when needed). `commit_interval_s`: the
        shortest time between two group commits, s. `on_commit(seconds, files)`: called in
        the writer thread after each group commit with its duration (audio written and
        synced, then the transaction) and how many audio files it synced, for metrics (it
        must be thread-safe and quick; what it raises is logged). Raises ValueError for a
        negative interval."""
        if commit_interval_s < 0:
            raise ValueError(f"commit_interval_s must be >= 0, not {commit_interval_s}")
        self.root = root
        self.commit_interval_s = commit_interval_s
        self._on_commit = on_commit
        self._queue: queue.SimpleQueue[Op] = queue.SimpleQueue()
        # set by close() and by an op a client waits for: commit what is queued at once
        self._hurry = threading.Event()
        self._handles: dict[str, Handle] = {}  # open sessions by id
        self._thread: threading.Thread | None = None
        self._joined: asyncio.Future[None] | None = None
        self._closed = False
        self._lock_file: io.BufferedRandom | None = None  # the held lock (`_lock`)

    @property
    def db_path(self) -> Path:
        """The SQLite database: sessions, finals, names."""
        return self.root / DB_NAME

    @property
    def audio_dir(self) -> Path:
        """Where the sessions' raw PCM16 LE files are (`audio_path`)."""
        return self.root / AUDIO_DIR

    def audio_path(self, session_id: str) -> Path:
        """Where a session's audio file is (its durable audio: `durable_frames` frames)."""
        return self.audio_dir / audio_name(session_id)

    def load_unfinished(self) -> list[RestoredSession]:
        """The sessions neither finished nor discarded, oldest first, with their finals in
        order. Each audio file is cut to its recorded durable length (bytes past it were never
        reported durable); a file shorter than its record (or missing: it is created empty)
        gives the frames it holds, logged, and the record is lowered to them. Audio files of
        no unfinished session are deleted, unless the database is new (missing, or emptied:
        cut to nothing by a full disk or a hand): then they are the audio of sessions it lost,
        and are moved to `dropped/<time>/` as a damaged database's are.

        What cannot be read does not stop a start (a crash trial: a damaged journal made every
        start fail with a traceback): a damaged database is moved, with every audio file, to
        `dropped/<time>/` (`DROPPED_DIR`) and the journal starts empty; a session whose record
        is malformed is dropped from it, its audio file moved there. Each is logged (ERROR)
        with what went where; their sessions are not rebuilt.

        Blocking; call before `start`. Raises ConfigError for a journal of a newer schema,
        StorageFailed when the journal's files cannot be read or written (a failing disk),
        InternalError after `start` or `close`.
        """
        self._check_open()
        if self._thread is not None:
            raise InternalError("LiveJournal.load_unfinished() runs before start()")
        self._make_dirs()
        try:
            return self._load()
        except StorageFailed as exc:
            if not _damaged(exc):
                raise
            self._set_aside(exc)
        return self._load()

    def _load(self) -> list[RestoredSession]:
        # a database with no bytes has lost its sessions; connect() makes it a new one
        lost = not self.db_path.exists() or self.db_path.stat().st_size == 0
        conn = connect(self.db_path)
        conn.row_factory = sqlite3.Row
        try:
            restored: list[RestoredSession] = []
            for row in conn.execute(SELECT_LIVE).fetchall():
                try:
                    restored.append(self._restore(conn, row))
                except (ValueError, TypeError, KeyError) as exc:  # JSON, a field's value
                    self._drop_malformed(conn, row, exc)
            if lost:
                self._set_aside_lost_audio()
            else:
                self._remove_orphans({r.audio_path.name for r in restored})
        except (OSError, sqlite3.Error) as exc:
            # a session's file another user's run left (root's): whose it is, and what to do
            filename = getattr(exc, "filename", None)  # sqlite3.Error has none
            hint = refusal_hint(exc, Path(filename), self.root.parent) if filename else ""
            raise StorageFailed(
                f"live journal {self.root} could not be loaded: {exc}{hint}"
            ) from exc
        finally:
            conn.close()
        return restored

    def _move_aside(self, paths: Sequence[Path]) -> Path:
        """Move `paths` (files) into a new directory under DROPPED_DIR, for what this start
        sets aside; returns that directory. Raises OSError."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in itertools.count():
            into = self.root / DROPPED_DIR / (stamp if n == 0 else f"{stamp}-{n}")
            if not into.exists():
                make_private_dir(into)
                for path in paths:
                    path.rename(into / path.name)
                return into
        raise AssertionError("unreachable")

    def _set_aside(self, exc: StorageFailed) -> None:
        """Move the damaged database and every audio file (the audio of its sessions) to a
        new dropped directory, so the journal starts empty. Raises StorageFailed where they
        cannot be moved."""
        try:
            database = list(self.root.glob(DB_NAME + "*"))  # with its -wal and -shm
            audio = list(self.audio_dir.iterdir())
            into = self._move_aside([*database, *audio])
        except OSError as move_exc:
            raise StorageFailed(
                f"live journal {self.db_path} cannot be read ({exc.__cause__ or exc}) nor "
                f"set aside: {move_exc}"
            ) from move_exc
        log.error(
            "live journal: %s cannot be read (%s): moved to %s with %d audio files; the live "
            "sessions it held are not rebuilt (a resume gets not_found)",
            self.db_path,
            str(exc.__cause__ or exc),  # a string: a record kept (tests) holds no traceback
            into,
            len(audio),
        )
        assert database  # connect() found the file damaged: it was there

    def _drop_malformed(self, conn: sqlite3.Connection, row: sqlite3.Row, exc: Exception) -> None:
        """A session whose record cannot be read back: its rows go, its audio file is moved
        to a new dropped directory (an operator may want the meeting's audio). Raises
        OSError, sqlite3.Error."""
        session_id = row["session_id"]
        audio = self.audio_dir / str(row["audio_name"])
        where = "no audio file"
        if audio.name.endswith(AUDIO_SUFFIX) and audio.parent == self.audio_dir and audio.exists():
            into = self._move_aside([audio])
            where = f"its audio moved to {into / audio.name}"
        conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
        for sql in DELETE_ROWS:
            conn.execute(sql, (session_id,))
        log.error(
            "live journal: the record of live session %r cannot be read (%s: %s): dropped, "
            "not rebuilt (%s)",
            session_id,
            type(exc).__name__,
            str(exc),
            where,
        )

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the journal and start its writer thread; callbacks run on `loop`. Raises
        ConfigError for a newer schema, StorageFailed when the journal cannot be opened or
        created, InternalError when started twice or after `close`."""
        self._check_open()
        if self._thread is not None:
            raise InternalError("LiveJournal.start() was called twice")
        self._make_dirs()
        # made here, so start() raises what opening it raises; used by the writer alone after
        conn = connect(self.db_path)
        writer = Writer(
            conn, self.audio_dir, loop, self._queue, self._hurry, self.commit_interval_s
        )
        writer.on_commit = self._on_commit
        self._thread = threading.Thread(target=writer.run, name="live-journal", daemon=True)
        self._thread.start()

    def open_session(
        self, meta: JournalSession, on_durable: DurableCallback, on_failed: FailedCallback
    ) -> None:
        """Journal a new session, its audio starting empty. A finished or discarded record of
        the same id is replaced (so is an unfinished one: adopt or discard restored sessions
        first). `on_durable(frames)` gets each new durable length (sample frames, increasing);
        `on_failed` the first storage failure, after which nothing more of the session is
        stored. Both run on the loop, never after `finish`/`discard`. Raises InternalError when
        the id is open already or after `close`."""
        self._open(
            Open(
                self._new_handle(meta, 0, on_durable, on_failed),
                meta,
                audio_name(meta.session_id),
                start_frames=0,
                adopted=False,
            )
        )

    def adopt(
        self, restored: RestoredSession, on_durable: DurableCallback, on_failed: FailedCallback
    ) -> None:
        """Continue a session `load_unfinished` returned: appends go after its durable audio,
        finals after its finals. Callbacks and errors as `open_session`'s."""
        handle = self._new_handle(restored.meta, restored.durable_frames, on_durable, on_failed)
        self._open(
            Open(
                handle,
                restored.meta,
                restored.audio_path.name,
                start_frames=restored.durable_frames,
                adopted=True,
            )
        )

    def append_audio(self, session_id: str, pcm: bytes) -> None:
        """Queue `pcm` (interleaved PCM16 LE, whole frames) for the session's audio file.
        Raises InternalError for a session not open, after `close`, or for a part frame."""
        handle = self._live(session_id)
        if len(pcm) % handle.frame_bytes:  # the gateway refuses such frames before this
            raise InternalError(
                f"{len(pcm)} bytes of audio are not whole {handle.frame_bytes}-byte frames"
            )
        if pcm and not handle.failed:
            self._queue.put(Append(handle, pcm))

    def add_final(self, session_id: str, segment: Segment) -> asyncio.Future[None]:
        """Queue a committed segment (stored as given: id, times, speaker, text, flags), and
        commit it without waiting out the commit interval. Returns a future done on the loop
        once the journal holds it, or once it will not (the session's storage failed, which
        `on_failed` hears first; the journal closed with the loop): a final is shown to
        clients only then, or a crash could lose a final they saw and the rebuilt session
        write another under its id. Raises InternalError for a session not open or after
        `close`."""
        return self._waited(session_id, lambda handle, stored: Final(handle, segment, stored))

    def add_finalize(self, session_id: str, frames: int) -> asyncio.Future[None]:
        """Queue the client's `finalize`, made after `frames` sample frames of the session's
        audio (all of them queued before it with `append_audio`: the record never names audio
        that is not durable with it). A second one at the same place is the same record.
        Committed with the next group, not at once (a crash before that loses it, and its
        client sends it again on its resume: docs/protocol.md, `finalize_offset`). Returns a
        future done on the loop once the journal holds it, or once it will not, as
        `add_final`'s. Raises InternalError for a session not open or after `close`."""
        return self._waited(
            session_id, lambda handle, stored: Finalize(handle, frames, stored), hurry=False
        )

    def set_labels(self, session_id: str, labels: Collection[str]) -> None:
        """Queue the whole set of speaker labels the session's segments have shown (stored
        sorted), committed with the next group and not waited for: a label promises the client
        nothing, it only widens what a merge may name after a rebuild (one lost to a crash
        right after it was shown is refused there until a partial shows it again). Raises
        InternalError for a session not open or after `close`."""
        handle = self._live(session_id)
        if not handle.failed:
            self._queue.put(Labels(handle, tuple(sorted(labels))))

    def set_key_id(self, session_id: str, key_id: str | None) -> None:
        """Queue the id of the API key the session runs on from now on (a resume with another
        key: `JournalSession.key_id`), committed with the next group and not waited for: a
        crash before it rebuilds the session on the key before. Raises InternalError for a
        session not open or after `close`."""
        handle = self._live(session_id)
        if not handle.failed:
            self._queue.put(KeyId(handle, key_id))

    def set_names(self, session_id: str, names: Sequence[tuple[str, str]]) -> asyncio.Future[None]:
        """Queue the session's whole current speaker-name map, (label, name) in naming order,
        committed and its future done as `add_final`'s (the rename is answered then). Raises
        InternalError for a session not open or after `close`."""
        names = tuple(names)
        return self._waited(session_id, lambda handle, stored: Names(handle, names, stored))

    def set_merges(
        self, session_id: str, merges: Sequence[tuple[str, str]]
    ) -> asyncio.Future[None]:
        """Queue the session's whole current speaker-merge map, (label, into) in merge order,
        committed and its future done as `add_final`'s (the merge is answered then). Raises
        InternalError for a session not open or after `close`."""
        merges = tuple(merges)
        return self._waited(session_id, lambda handle, stored: Merges(handle, merges, stored))

    def _waited(
        self,
        session_id: str,
        make: Callable[[Handle, asyncio.Future[None]], Op],
        *,
        hurry: bool = True,
    ) -> asyncio.Future[None]:
        """Queue the op `make` gives, committed at once (`hurry`; else with the next group);
        its future (`add_final`)."""
        handle = self._live(session_id)
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if handle.failed:
            stored.set_result(None)
        else:
            self._queue.put(make(handle, stored))
            if hurry:
                self._hurry.set()
        return stored

    def mark_ended(self, session_id: str) -> None:
        """The session's `end` reached the backend (its client's, or the server's): a rebuild
        after a crash ends it as well (`RestoredSession.ended`), rather than wait for an `end`
        the client sent once already. Raises InternalError for a session not open or after
        `close`."""
        handle = self._live(session_id)
        if not handle.failed:
            self._queue.put(Ending(handle))

    def finish(self, session_id: str) -> None:
        """The session ended and its final transcript is stored elsewhere: its rows go, and its
        audio file once that is committed. Raises InternalError for a session not open or
        after `close`."""
        self._end(session_id, SessionState.FINISHED)

    def discard(self, session_id: str) -> asyncio.Future[None]:
        """The session was dropped with no final transcript (or its storage failed): its audio
        file is deleted at once (a full disk gets the space back even if the transaction that
        drops its rows fails), then its rows, committed without waiting out the commit
        interval. Returns a future done on the loop once that commit is done or failed (the
        writer logs a failure): until then a crash may leave the session for the next start
        to rebuild. Raises InternalError for a session not open or after `close`."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._end(session_id, SessionState.DISCARDED, done)
        self._hurry.set()
        return done

    def durable_frames(self, session_id: str) -> int:
        """Sample frames of the session's audio reported durable so far (what on_durable last
        got). Raises InternalError for a session not open or after `close`."""
        return self._live(session_id).durable_frames

    async def close(self) -> None:
        """Commit what is queued and stop the writer thread. Sessions still open stay
        unfinished on disk. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._thread is not None:
                self._queue.put(None)
                self._hurry.set()
                loop = asyncio.get_running_loop()
                self._joined = loop.run_in_executor(None, self._thread.join)
        if self._joined is not None:
            await self._joined
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    def _check_open(self) -> None:
        if self._closed:
            raise InternalError("the live journal is closed")

    def _make_dirs(self) -> None:
        try:
            make_private_dir(self.audio_dir)
        except OSError as exc:
            raise StorageFailed(f"live journal {self.root} could not be created: {exc}") from exc
        self._lock()

    def _lock(self) -> None:
        """Hold the journal's lock file (an exclusive flock, released at `close` or when the
        process dies), so that a second server on the same data dir is refused rather than
        rebuilding and appending to the first one's sessions. Raises ConfigError."""
        if self._lock_file is not None:
            return
        path = self.root / LOCK_NAME
        self._lock_file = _take_lock(path)
        if self._lock_file is None:
            raise ConfigError(f"live journal {self.root} is in use by {holder_phrase(path)}")

    def _new_handle(
        self,
        meta: JournalSession,
        durable_frames: int,
        on_durable: DurableCallback,
        on_failed: FailedCallback,
    ) -> Handle:
        self._check_open()
        if meta.session_id in self._handles:
            raise InternalError(f"live session {meta.session_id!r} is open in the journal already")
        return Handle(meta.session_id, meta.frame_bytes, on_durable, on_failed, durable_frames)

    def _open(self, op: Open) -> None:
        self._handles[op.meta.session_id] = op.handle
        self._queue.put(op)

    def _live(self, session_id: str) -> Handle:
        self._check_open()
        handle = self._handles.get(session_id)
        if handle is None:
            raise InternalError(f"live session {session_id!r} is not open in the journal")
        return handle

    def _end(
        self, session_id: str, state: SessionState, done: asyncio.Future[None] | None = None
    ) -> None:
        handle = self._live(session_id)
        del self._handles[session_id]
        handle.ended = True
        self._queue.put(End(handle, state, done))

    def _restore(self, conn: sqlite3.Connection, row: sqlite3.Row) -> RestoredSession:
        meta = JournalSession(
            session_id=_text(row["session_id"]),
            resume_token_sha256=_text(row["resume_token_sha256"]),
            captions_token_sha256=_text(row["captions_token_sha256"]),
            sample_rate=_count(row["sample_rate"], "sample_rate", minimum=1),
            channels=_count(row["channels"], "channels", minimum=1),
            created_at=float(row["created_at"]),
            **options_from_json(row["options"]),
            key_id=None if row["key_id"] is None else _text(row["key_id"]),
        )
        path = self.audio_dir / _text(row["audio_name"])
        if path.parent != self.audio_dir:  # a name with a slash: not a file of the journal's
            raise ValueError(f"audio_name {row['audio_name']!r} is not a file name")
        recorded_frames = _count(row["durable_frames"], "durable_frames", minimum=0)
        frames = _cut_audio(path, recorded_frames, meta.frame_bytes)
        if frames < recorded_frames:
            log.warning(
                "live journal: the audio of session %r holds %d frames, its record says %d: "
                "restored with %d",
                meta.session_id,
                frames,
                recorded_frames,
                frames,
            )
            conn.execute(
                "UPDATE sessions SET durable_frames = ? WHERE session_id = ?",
                (frames, meta.session_id),
            )
        finals = conn.execute(
            "SELECT segment FROM finals WHERE session_id = ? ORDER BY seq", (meta.session_id,)
        ).fetchall()
        # past the audio only where the file lost audio its record claims (logged above)
        finalizes = conn.execute(
            "SELECT frames FROM finalizes WHERE session_id = ? AND frames <= ? ORDER BY frames",
            (meta.session_id, frames),
        ).fetchall()
        return RestoredSession(
            meta=meta,
            durable_frames=frames,
            finals=tuple(segment_from_json(final["segment"]) for final in finals),
            names=_pairs(row["names"], "names"),
            audio_path=path,
            ended=bool(row["ended"]),
            merges=_pairs(row["merges"], "merges"),
            finalizes=tuple(int(f["frames"]) for f in finalizes),
            labels=_labels(row["labels"]),
        )

    def _set_aside_lost_audio(self) -> None:
        """A new database beside audio files: they are the audio of the sessions a lost
        database held (a crash trial: an emptied database's meetings were deleted as orphans,
        logged at INFO). Moved to a new dropped directory, logged (ERROR). Raises OSError."""
        audio = [p for p in self.audio_dir.iterdir() if p.name.endswith(AUDIO_SUFFIX)]
        if not audio:
            return
        into = self._move_aside(audio)
        log.error(
            "live journal: %s is new or empty but %d audio files of sessions it held are "
            "there: moved to %s; those sessions are not rebuilt (a resume gets not_found)",
            self.db_path,
            len(audio),
            into,
        )

    def _remove_orphans(self, keep: set[str]) -> None:
        """Delete audio files of no unfinished session: left by a crash between an end's commit
        and its file's deletion, or by a deletion that failed."""
        for path in self.audio_dir.iterdir():
            if path.name.endswith(AUDIO_SUFFIX) and path.name not in keep:
                log.info("live journal: deleting %s, the audio of no unfinished session", path)
                path.unlink(missing_ok=True)


def _damaged(exc: StorageFailed) -> bool:
    """Whether `exc` says the database file is damaged (not a database, malformed), rather
    than unreadable (a failing disk, permissions): its cause is SQLite's error."""
    cause = exc.__cause__
    code = getattr(cause, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not text")
    return value


def _count(value: object, what: str, *, minimum: int) -> int:
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} {value!r} is not an integer >= {minimum}")
    return value


def _pairs(text: str, what: str) -> tuple[tuple[str, str], ...]:
    """A JSON list of [str, str] pairs (names, merges). Raises ValueError."""
    pairs = json.loads(text)
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs
    ):
        raise ValueError(f"{what} {text!r} is not a list of [label, text] pairs")
    return tuple((a, b) for a, b in pairs)


def _labels(text: str) -> tuple[str, ...]:
    """A JSON list of labels (`set_labels`). Raises ValueError."""
    labels = json.loads(text)
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise ValueError(f"labels {text!r} is not a list of labels")
    return tuple(labels)


def _cut_audio(path: Path, recorded_frames: int, frame_bytes: int) -> int:
    """Cut the audio file at `path` (created empty if missing) to at most `recorded_frames`
    whole frames; returns the frames it holds then."""
    with open(path, "ab") as f:
        size = os.fstat(f.fileno()).st_size
        frames = min(size // frame_bytes, recorded_frames)
        if size > frames * frame_bytes:
            f.truncate(frames * frame_bytes)
    return frames
