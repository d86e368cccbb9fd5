"""livemeet.gateway.live_journal: live sessions' audio, finals, finalizes and names on disk
(DESIGN 5.9), reported durable only once synced and committed, back after a reopen or a SIGKILL."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from livemeet.errors import (
    ERROR_CLASSES,
    ConfigError,
    InternalError,
    StorageFailed,
    error_for_code,
)
from livemeet.gateway import live_journal_schema, live_journal_writer
from livemeet.gateway.live_journal import (
    LOCK_NAME,
    JournalSession,
    LiveJournal,
    RestoredSession,
    audio_name,
    journal_holder,
)
from livemeet.gateway.live_journal_schema import (
    SCHEMA_VERSION,
    segment_from_json,
    segment_to_json,
)
from livemeet.transcript.segments import Segment, SegmentFlag

REPO_ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 0.005  # s; a short group commit keeps the tests fast
CHANNELS = 2
FRAME_BYTES = CHANNELS * 2  # bytes per stereo PCM16 frame


def meta(session_id: str = "s-1") -> JournalSession:
    return JournalSession(session_id, "a" * 64, "b" * 64, 48_000, CHANNELS, 1_700_000_000.5)


def final(n: int, *flags: SegmentFlag) -> Segment:
    # times that are not short decimals: they must come back exact
    return Segment(
        n / 3,
        n / 3 + 0.1 + 0.2,
        f"S0{n % 3 + 1}",
        f"café {n} ✓",
        f"seg-{n:04d}",
        is_final=True,
        flags=flags,
    )


@dataclass
class Calls:
    """What a session's callbacks got."""

    durable: list[int] = field(default_factory=list)
    failed: list[StorageFailed] = field(default_factory=list)

    def open(self, journal: LiveJournal, m: JournalSession) -> None:
        journal.open_session(m, self.durable.append, self.failed.append)

    def adopt(self, journal: LiveJournal, restored: RestoredSession) -> None:
        journal.adopt(restored, self.durable.append, self.failed.append)


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def started(root: Path, interval_s: float = INTERVAL_S) -> LiveJournal:
    journal = LiveJournal(root, commit_interval_s=interval_s)
    journal.start(asyncio.get_running_loop())
    return journal


def adopted(root: Path) -> tuple[LiveJournal, RestoredSession]:
    """A journal started over `root` with its one unfinished session adopted, as a restart
    adopts what it rebuilds."""
    journal = LiveJournal(root, commit_interval_s=INTERVAL_S)
    (restored,) = journal.load_unfinished()
    journal.start(asyncio.get_running_loop())
    journal.adopt(restored, lambda _: None, lambda _: None)
    return journal, restored


def reload(root: Path) -> dict[str, RestoredSession]:
    return {r.meta.session_id: r for r in LiveJournal(root).load_unfinished()}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "journal"


@pytest.fixture
async def journal(root: Path) -> AsyncIterator[LiveJournal]:
    journal = started(root)
    yield journal
    await journal.close()


def random_chunks(seed: int, count: int, max_frames: int = 200) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(1, max_frames) * FRAME_BYTES) for _ in range(count)]


async def test_audio_comes_back_byte_exact_after_a_reopen(root: Path, journal: LiveJournal) -> None:
    chunks = random_chunks(0, 300)
    journal.open_session(meta(), lambda _: None, lambda _: None)
    for i, chunk in enumerate(chunks):
        journal.append_audio("s-1", chunk)
        if i % 25 == 0:
            await asyncio.sleep(INTERVAL_S)  # spread over several group commits
    await journal.close()
    (restored,) = reload(root).values()
    audio = b"".join(chunks)
    assert restored.meta == meta()
    assert restored.durable_frames == len(audio) // FRAME_BYTES
    assert restored.audio_path.read_bytes() == audio
    assert restored.finals == () and restored.names == ()


async def test_on_durable_reports_grow_and_come_only_once_synced_and_recorded(
    root: Path, journal: LiveJournal
) -> None:
    seen: list[tuple[int, int, int]] = []  # (frames, file bytes, recorded frames) in the callback
    path = root / "audio" / audio_name("s-1")
    db = sqlite3.connect(root / "sessions.sqlite3")

    def on_durable(frames: int) -> None:
        (recorded,) = db.execute("SELECT durable_frames FROM sessions").fetchone()
        seen.append((frames, path.stat().st_size, recorded))

    journal.open_session(meta(), on_durable, lambda _: None)
    chunks = random_chunks(1, 40)
    for chunk in chunks:
        journal.append_audio("s-1", chunk)
        await asyncio.sleep(0.002)
    total = sum(map(len, chunks)) // FRAME_BYTES
    await wait_until(lambda: bool(seen) and seen[-1][0] == total)
    db.close()
    frames = [f for f, _, _ in seen]
    assert len(frames) > 3 and frames == sorted(set(frames))  # strictly increasing
    assert all(size >= f * FRAME_BYTES and recorded >= f for f, size, recorded in seen)
    assert journal.durable_frames("s-1") == total


async def test_commits_and_new_audio_files_survive_a_power_loss(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal claimed a process crash only: its commits were synchronous=NORMAL (the WAL
    not synced at each), and a new audio file's name was never synced (its folder's entry),
    so a power loss could take back audio already acknowledged. Now every commit syncs
    (FULL), and a group that created files syncs the audio folder, once."""
    synced_dirs: list[str] = []
    real_fsync = live_journal_writer.os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced_dirs.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(live_journal_writer.os, "fsync", fsync)
    journal = started(root)
    calls = Calls()
    calls.open(journal, meta("s-1"))
    calls.open(journal, meta("s-2"))
    journal.append_audio("s-1", bytes(FRAME_BYTES))
    journal.append_audio("s-2", bytes(FRAME_BYTES))
    await wait_until(lambda: journal.durable_frames("s-2") == 1)
    assert synced_dirs == [str(root / "audio")]
    journal.append_audio("s-1", bytes(FRAME_BYTES))  # no new file: no folder sync
    await wait_until(lambda: journal.durable_frames("s-1") == 2)
    assert len(synced_dirs) == 1
    await journal.close()
    conn = live_journal_schema.connect(root / "sessions.sqlite3")
    try:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        conn.close()


async def test_a_burst_is_one_group_commit(root: Path) -> None:
    journal = started(root, interval_s=0.2)
    calls = Calls()
    calls.open(journal, meta())
    journal.append_audio("s-1", bytes(FRAME_BYTES))
    await wait_until(lambda: calls.durable == [1])
    for _ in range(100):  # within the interval after the first commit: all in the next
        journal.append_audio("s-1", bytes(FRAME_BYTES))
    await wait_until(lambda: calls.durable[-1] == 101)
    await journal.close()
    assert calls.durable == [1, 101]


async def test_a_final_is_committed_at_once_and_its_future_says_when(root: Path) -> None:
    """A live session shows a final only once the journal holds it (a crash must not change a
    final a client saw), so a final does not wait out the commit interval: its group goes at
    once, audio queued before it included, and `add_final`'s future is done after that."""
    journal = started(root, interval_s=30.0)
    calls = Calls()
    calls.open(journal, meta())
    journal.append_audio("s-1", bytes(FRAME_BYTES))
    await wait_until(lambda: calls.durable == [1])  # the first group: no interval before it
    journal.append_audio("s-1", bytes(FRAME_BYTES))
    stored = journal.add_final("s-1", final(1))
    await asyncio.wait_for(stored, 5.0)  # not 30 s
    assert calls.durable == [1, 2]  # the audio before it went with it
    assert reload_unlocked(root)["s-1"].finals == (final(1),)
    await journal.close()


def reload_unlocked(root: Path) -> dict[str, RestoredSession]:
    """What the journal holds on disk now, read while its server runs (read-only)."""
    with sqlite3.connect(f"file:{root / 'sessions.sqlite3'}?mode=ro", uri=True) as db:
        finals = db.execute("SELECT session_id, segment FROM finals ORDER BY seq").fetchall()
    by_session: dict[str, list[Segment]] = {}
    for session_id, text in finals:
        by_session.setdefault(session_id, []).append(segment_from_json(text))
    return {
        sid: RestoredSession(meta(sid), 0, tuple(segs), (), root / "audio" / audio_name(sid))
        for sid, segs in by_session.items()
    }


async def test_on_commit_reports_each_group_and_its_failure_stops_nothing(root: Path) -> None:
    """on_commit (metrics) gets each group commit's duration and audio files synced, in the
    writer thread; if it raises, the journal logs it and goes on reporting durable audio."""
    seen: list[tuple[float, int]] = []

    def on_commit(seconds: float, files: int) -> None:
        seen.append((seconds, files))
        raise RuntimeError("a broken metrics backend")

    journal = LiveJournal(root, commit_interval_s=0.01, on_commit=on_commit)
    assert journal.load_unfinished() == []
    journal.start(asyncio.get_running_loop())
    first, second = Calls(), Calls()
    first.open(journal, meta())
    second.open(journal, meta("s-2"))
    journal.append_audio("s-1", bytes(FRAME_BYTES))
    journal.append_audio("s-2", bytes(FRAME_BYTES))
    await wait_until(lambda: first.durable == [1] and second.durable == [1])
    journal.append_audio("s-1", bytes(FRAME_BYTES))
    await wait_until(lambda: first.durable == [1, 2])
    await journal.close()
    assert seen and all(s >= 0 for s, _ in seen)
    assert sum(files for _, files in seen) == 3  # s-1 twice, s-2 once


async def test_finals_and_names_round_trip_and_go_on_after_adopt(root: Path) -> None:
    journal = started(root)
    journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.add_final("s-1", final(1, SegmentFlag.INHERITED_SPEAKER, SegmentFlag.END_CLAMPED))
    journal.set_names("s-1", [("S01", "Ana")])
    journal.add_final("s-1", final(2))
    journal.set_names("s-1", [("S02", "Bo Ström"), ("S01", "Ana María")])
    await journal.close()
    (restored,) = reload(root).values()
    assert restored.finals == (
        final(1, SegmentFlag.INHERITED_SPEAKER, SegmentFlag.END_CLAMPED),
        final(2),
    )
    assert restored.names == (("S02", "Bo Ström"), ("S01", "Ana María"))

    journal, restored = adopted(root)
    journal.add_final("s-1", final(3))
    await journal.close()
    (again,) = reload(root).values()
    assert again.finals == (*restored.finals, final(3))
    assert again.names == restored.names


async def test_merges_round_trip_and_go_on_after_adopt(root: Path) -> None:
    journal = started(root)
    journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.set_merges("s-1", [("S03", "S01")])
    journal.set_merges("s-1", [("S03", "S01"), ("S04", "S01")])
    await journal.close()
    (restored,) = reload(root).values()
    assert restored.merges == (("S03", "S01"), ("S04", "S01"))
    assert restored.names == ()

    journal, restored = adopted(root)
    journal.set_merges("s-1", [*restored.merges, ("S02", "S05")])
    await journal.close()
    (again,) = reload(root).values()
    assert again.merges == (("S03", "S01"), ("S04", "S01"), ("S02", "S05"))


# the sessions table of schema version 1 (before merges), as livemeet wrote it
SCHEMA_V1 = """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY, audio_name TEXT NOT NULL,
    resume_token_sha256 TEXT NOT NULL, captions_token_sha256 TEXT NOT NULL,
    sample_rate INTEGER NOT NULL, channels INTEGER NOT NULL, created_at REAL NOT NULL,
    options TEXT NOT NULL DEFAULT '{}', ended INTEGER NOT NULL DEFAULT 0,
    durable_frames INTEGER NOT NULL DEFAULT 0, names TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE finals (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, segment TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
PRAGMA user_version = 1;
"""


async def test_a_journal_of_schema_1_is_brought_to_the_current_one_with_its_sessions(
    root: Path,
) -> None:
    """A server upgraded while sessions were unfinished rebuilds them from the old journal,
    which gains the merges column, the finalizes table and the labels column (a session of it
    has none of them)."""
    root.mkdir()
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        db.executescript(SCHEMA_V1)
        db.execute(
            "INSERT INTO sessions (session_id, audio_name, resume_token_sha256, "
            "captions_token_sha256, sample_rate, channels, created_at, names) "
            "VALUES ('old', ?, 'a', 'b', 16000, 1, 1.0, '[[\"S01\", \"Ana\"]]')",
            (audio_name("old"),),
        )
    (restored,) = reload(root).values()
    assert (restored.names, restored.merges, restored.finalizes, restored.labels) == (
        (("S01", "Ana"),),
        (),
        (),
        (),
    )
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    journal, restored = adopted(root)
    journal.set_merges("old", [("S02", "S01")])
    await journal.close()
    assert reload(root)["old"].merges == (("S02", "S01"),)


# schema version 2 (before finalizes): version 1's tables and the merges column
SCHEMA_V2 = SCHEMA_V1.replace(
    "names TEXT NOT NULL DEFAULT '[]'",
    "names TEXT NOT NULL DEFAULT '[]', merges TEXT NOT NULL DEFAULT '[]'",
).replace("user_version = 1", "user_version = 2")


def old_journal(root: Path, schema: str, *, merges: str, finalizes: tuple[int, ...] = ()) -> None:
    """A journal of an older `schema` (version 2 or later) at `root` holding one unfinished
    session 'old': 48-kHz stereo, 3 durable frames of audio, the `merges` (JSON), one final,
    and the `finalizes` (a schema with their table)."""
    root.mkdir()
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        db.executescript(schema)
        db.execute(
            "INSERT INTO sessions (session_id, audio_name, resume_token_sha256, "
            "captions_token_sha256, sample_rate, channels, created_at, durable_frames, "
            "merges) VALUES ('old', ?, 'a', 'b', 48000, 2, 1.0, 3, ?)",
            (audio_name("old"), merges),
        )
        db.execute(
            "INSERT INTO finals (session_id, seq, segment) VALUES ('old', 0, ?)",
            (segment_to_json(final(1)),),
        )
        for frames in finalizes:
            db.execute("INSERT INTO finalizes (session_id, frames) VALUES ('old', ?)", (frames,))
    (root / "audio").mkdir()
    (root / "audio" / audio_name("old")).write_bytes(bytes(3 * FRAME_BYTES))


async def test_a_journal_of_schema_2_is_brought_to_the_current_one_with_its_sessions(
    root: Path,
) -> None:
    """A journal written before finalizes were kept: its unfinished session comes back with
    its finals, merges and audio, and no finalize; the journal gains the finalizes table, and
    the adopted session's next finalize is kept."""
    old_journal(root, SCHEMA_V2, merges='[["S02", "S01"]]')
    (restored,) = reload(root).values()
    assert restored.finals == (final(1),) and restored.merges == (("S02", "S01"),)
    assert (restored.durable_frames, restored.finalizes) == (3, ())
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    journal, restored = adopted(root)
    journal.append_audio("old", bytes(FRAME_BYTES))
    journal.add_finalize("old", 4)
    await journal.close()
    assert reload(root)["old"].finalizes == (4,)


# schema version 3 (before labels): version 2's tables and the finalizes table
SCHEMA_V3 = SCHEMA_V2.replace(
    "PRAGMA user_version = 2;",
    """CREATE TABLE finalizes (
    session_id TEXT NOT NULL, frames INTEGER NOT NULL, PRIMARY KEY (session_id, frames)
) WITHOUT ROWID;
PRAGMA user_version = 3;""",
)


async def test_a_journal_of_schema_3_is_brought_to_the_current_one_with_its_sessions(
    root: Path,
) -> None:
    """A journal written before labels were kept: its unfinished session comes back with its
    finals, merges, finalizes and audio, and no labels (its rebuild knows its finals' labels
    only, as before); the journal gains the labels column, and the adopted session's labels
    are kept from then on."""
    old_journal(root, SCHEMA_V3, merges='[["S03", "S01"]]', finalizes=(2,))
    (restored,) = reload(root).values()
    assert restored.finals == (final(1),) and restored.merges == (("S03", "S01"),)
    assert (restored.durable_frames, restored.finalizes, restored.labels) == (3, (2,), ())
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    journal, restored = adopted(root)
    journal.set_labels("old", {"S02", "S01", "S03"})
    await journal.close()
    assert reload(root)["old"].labels == ("S01", "S02", "S03")


# schema version 4 (before key ids): version 3's tables and the labels column
SCHEMA_V4 = SCHEMA_V3.replace(
    "merges TEXT NOT NULL DEFAULT '[]'",
    "merges TEXT NOT NULL DEFAULT '[]', labels TEXT NOT NULL DEFAULT '[]'",
).replace("PRAGMA user_version = 3;", "PRAGMA user_version = 4;")


async def test_a_journal_of_schema_4_is_brought_to_the_current_one_with_its_sessions(
    root: Path,
) -> None:
    """A journal written before key ids were kept: its unfinished session comes back on no
    key (as every rebuilt session did then); the journal gains the column, and the adopted
    session's key id is kept from then on."""
    old_journal(root, SCHEMA_V4, merges="[]", finalizes=(2,))
    (restored,) = reload(root).values()
    assert restored.finals == (final(1),) and restored.meta.key_id is None
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    journal, restored = adopted(root)
    journal.set_key_id("old", "k-b")
    await journal.close()
    assert reload(root)["old"].meta.key_id == "k-b"


async def test_the_key_id_a_session_runs_on_round_trips_and_follows_a_resume(root: Path) -> None:
    """The id of the API key a session was opened with comes back with it; `set_key_id` (a
    resume with another key) replaces it, to None too (a resume on a server that asks for
    no key)."""
    journal = started(root)
    journal.open_session(replace(meta(), key_id="k-a"), lambda _: None, lambda _: None)
    await journal.close()
    assert reload(root)["s-1"].meta.key_id == "k-a"

    journal, _ = adopted(root)
    journal.set_key_id("s-1", "k-b")
    await journal.close()
    assert reload(root)["s-1"].meta.key_id == "k-b"
    journal, _ = adopted(root)
    journal.set_key_id("s-1", None)
    await journal.close()
    assert reload(root)["s-1"].meta.key_id is None


async def test_labels_round_trip_and_go_on_after_adopt(root: Path) -> None:
    """The labels a session's segments showed come back (sorted), the last set queued
    standing, none before the first set; an adopted session's next set replaces them."""
    journal = started(root)
    journal.open_session(meta(), lambda _: None, lambda _: None)
    await journal.close()
    assert reload(root)["s-1"].labels == ()

    journal, _ = adopted(root)
    journal.set_labels("s-1", ["S02"])
    journal.set_labels("s-1", {"S02", "S01", "Sé04"})
    await journal.close()
    assert reload(root)["s-1"].labels == ("S01", "S02", "Sé04")

    journal, restored = adopted(root)
    journal.set_labels("s-1", {*restored.labels, "S05"})
    await journal.close()
    assert reload(root)["s-1"].labels == ("S01", "S02", "S05", "Sé04")


async def test_finalizes_round_trip_go_on_after_adopt_and_go_with_their_session(
    root: Path,
) -> None:
    """Each finalize's place (sample frames of audio before it) comes back in order, one per
    place; an adopted session's go on after them; none outlives its session."""
    journal = started(root)
    journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.add_finalize("s-1", 0)  # before any audio
    journal.append_audio("s-1", bytes(4 * FRAME_BYTES))
    journal.add_finalize("s-1", 4)
    journal.add_finalize("s-1", 4)  # nothing received since: the same place
    journal.append_audio("s-1", bytes(6 * FRAME_BYTES))
    journal.add_finalize("s-1", 10)
    await journal.close()
    (restored,) = reload(root).values()
    assert (restored.durable_frames, restored.finalizes) == (10, (0, 4, 10))

    journal, restored = adopted(root)
    journal.append_audio("s-1", bytes(2 * FRAME_BYTES))
    journal.add_finalize("s-1", 12)
    await journal.close()
    assert reload(root)["s-1"].finalizes == (0, 4, 10, 12)

    journal, restored = adopted(root)
    journal.finish("s-1")
    await journal.close()
    assert reload(root) == {}
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM finalizes").fetchone()[0] == 0


async def test_a_finalize_waits_for_the_next_group_and_its_future_says_when(root: Path) -> None:
    """A finalize is not committed at once, as a final is: a crash before the next group
    loses it though the audio before it is on disk, and its client sends it again on its
    resume (docs/protocol.md, `finalize_offset`). `add_finalize`'s future says when the
    journal holds it: the holder names it held only then."""
    journal = started(root, interval_s=30.0)
    calls = Calls()
    calls.open(journal, meta())
    journal.append_audio("s-1", bytes(4 * FRAME_BYTES))
    await wait_until(lambda: calls.durable == [4])  # the first group: no interval before it
    stored = journal.add_finalize("s-1", 4)
    await asyncio.sleep(0.05)
    assert not stored.done() and finalizes_on_disk(root) == []  # a crash now loses it
    await asyncio.wait_for(journal.add_final("s-1", final(1)), 5.0)  # a final's group takes it
    assert stored.done() and finalizes_on_disk(root) == [4]
    await journal.close()


def finalizes_on_disk(root: Path) -> list[int]:
    """The finalizes the journal holds on disk now, read while its server runs (read-only)."""
    with sqlite3.connect(f"file:{root / 'sessions.sqlite3'}?mode=ro", uri=True) as db:
        return [f for (f,) in db.execute("SELECT frames FROM finalizes ORDER BY frames")]


async def test_a_finalize_past_the_audio_a_short_file_holds_is_not_restored(
    root: Path, journal: LiveJournal
) -> None:
    """The audio file lost frames its record claims (restored with what it holds): a finalize
    past them names audio the rebuild does not have, and is left out."""
    journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.append_audio("s-1", bytes(4 * FRAME_BYTES))
    journal.add_finalize("s-1", 4)
    journal.append_audio("s-1", bytes(6 * FRAME_BYTES))
    journal.add_finalize("s-1", 10)
    await journal.close()
    path = root / "audio" / audio_name("s-1")
    path.write_bytes(path.read_bytes()[: 7 * FRAME_BYTES])
    (restored,) = reload(root).values()
    assert (restored.durable_frames, restored.finalizes) == (7, (4,))


async def test_an_adopted_session_appends_after_its_durable_audio(root: Path) -> None:
    first, second = random_chunks(2, 20), random_chunks(3, 20)
    journal = started(root)
    journal.open_session(meta(), lambda _: None, lambda _: None)
    for chunk in first:
        journal.append_audio("s-1", chunk)
    await journal.close()

    journal = LiveJournal(root, commit_interval_s=INTERVAL_S)
    (restored,) = journal.load_unfinished()
    journal.start(asyncio.get_running_loop())
    calls = Calls()
    calls.adopt(journal, restored)
    assert journal.durable_frames("s-1") == restored.durable_frames
    for chunk in second:
        journal.append_audio("s-1", chunk)
    await journal.close()
    audio = b"".join(first + second)
    assert calls.durable[-1] == len(audio) // FRAME_BYTES
    (again,) = reload(root).values()
    assert again.audio_path.read_bytes() == audio


async def test_finished_and_discarded_sessions_are_not_restored(root: Path) -> None:
    """An ended session leaves nothing in the journal (its prompt and hotwords included: its
    transcript is the transcript store's); a discarded one's audio goes before its commit."""
    journal = started(root)
    calls = {sid: Calls() for sid in ("done", "dropped", "open")}
    for sid, c in calls.items():
        c.open(journal, meta(sid))
        journal.append_audio(sid, bytes(10 * FRAME_BYTES))
        journal.add_final(sid, final(1))
    await wait_until(lambda: all(c.durable for c in calls.values()))
    journal.finish("done")
    journal.discard("dropped")
    await journal.close()
    audio = root / "audio"
    assert sorted(p.name for p in audio.iterdir()) == [audio_name("open")]
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        ids = [row[0] for row in db.execute("SELECT session_id FROM sessions").fetchall()]
        (finals,) = db.execute("SELECT COUNT(*) FROM finals").fetchone()
    assert ids == ["open"]
    assert finals == 1  # an ended session's finals live in its stored transcript
    stray = audio / audio_name("crashed before its file was deleted")
    stray.write_bytes(b"xx")
    assert list(reload(root)) == ["open"]
    assert not stray.exists()


async def test_an_end_is_restored_with_the_session(root: Path) -> None:
    """mark_ended: a session whose `end` reached the backend comes back ended (a crash between
    the client's end and its final must not leave it waiting for a second end)."""
    journal = started(root)
    for sid in ("ending", "streaming"):
        Calls().open(journal, meta(sid))
        journal.append_audio(sid, bytes(FRAME_BYTES))
    journal.mark_ended("ending")
    await journal.close()
    restored = reload(root)
    assert restored["ending"].ended and not restored["streaming"].ended


async def test_a_discard_frees_the_disk_even_when_its_commit_fails(root: Path) -> None:
    """A full disk fails the commit that would drop a discarded session's rows; its audio
    file must be gone all the same (kept, it held the space every later session needed)."""
    journal = started(root)
    calls = Calls()
    calls.open(journal, meta())
    journal.append_audio("s-1", bytes(100 * FRAME_BYTES))
    await wait_until(lambda: calls.durable == [100])
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        db.execute("DROP TABLE finals")  # the discard's DELETE fails: the commit fails
    journal.discard("s-1")
    await journal.close()
    assert not (root / "audio" / audio_name("s-1")).exists()
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        assert db.execute("SELECT session_id FROM sessions").fetchall() == [("s-1",)]


async def test_a_discards_future_is_done_once_its_rows_are_gone_or_could_not_go(
    root: Path,
) -> None:
    """`discard` returns a future done once the commit that drops the session's rows is done
    (a session ended for its storage tells its client so only then: until that commit a
    crash left it for the next start to rebuild), and at once when that commit fails too,
    without waiting out the commit interval."""
    journal = started(root, interval_s=30.0)  # a commit the discard hurries
    for sid in ("s-1", "s-2"):
        Calls().open(journal, meta(sid))
        journal.append_audio(sid, bytes(10 * FRAME_BYTES))
    journal.add_final("s-1", final(1))  # hurried: the group that records both sessions
    await wait_until(lambda: journal.durable_frames("s-2") == 10)
    done = journal.discard("s-1")
    await asyncio.wait_for(done, 5)
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        assert db.execute("SELECT session_id FROM sessions").fetchall() == [("s-2",)]
        db.execute("DROP TABLE finals")  # the next discard's DELETE fails: its commit fails
    failed = journal.discard("s-2")
    await asyncio.wait_for(failed, 5)
    assert not (root / "audio" / audio_name("s-2")).exists()  # its audio went all the same
    await journal.close()


async def test_an_ended_id_can_be_opened_again(root: Path, journal: LiveJournal) -> None:
    """A backend may reuse ids (the fake's restart at fake-0): the new session starts empty,
    and the old one's deletion (in the same group commit here) spares the new file."""
    journal.open_session(meta("x"), lambda _: None, lambda _: None)
    journal.append_audio("x", b"old!" * 10)
    journal.add_final("x", final(1))
    journal.finish("x")
    calls = Calls()
    calls.open(journal, meta("x"))
    journal.append_audio("x", b"new!" * 3)
    await wait_until(lambda: calls.durable == [3])
    await journal.close()
    (restored,) = reload(root).values()
    assert restored.audio_path.read_bytes() == b"new!" * 3 and restored.finals == ()


async def test_opening_an_unfinished_id_anew_replaces_it(root: Path) -> None:
    """A restored session not adopted but opened as new starts empty (its stale file cut)."""
    journal = started(root)
    journal.open_session(meta("x"), lambda _: None, lambda _: None)
    journal.append_audio("x", b"old!" * 10)
    journal.add_final("x", final(1))
    journal.add_finalize("x", 10)
    await journal.close()
    journal = LiveJournal(root, commit_interval_s=INTERVAL_S)
    assert list(journal.load_unfinished()) != []
    journal.start(asyncio.get_running_loop())
    journal.open_session(meta("x"), lambda _: None, lambda _: None)
    journal.append_audio("x", b"new!" * 3)
    await journal.close()
    (restored,) = reload(root).values()
    assert restored.audio_path.read_bytes() == b"new!" * 3 and restored.finals == ()
    assert restored.finalizes == ()


CRASH_WRITER = """
import asyncio, sys
from pathlib import Path
from livemeet.gateway.live_journal import JournalSession, LiveJournal

async def main():
    journal = LiveJournal(Path(sys.argv[1]), commit_interval_s=0.005)
    journal.start(asyncio.get_running_loop())
    meta = JournalSession("crash", "r" * 64, "c" * 64, 16_000, 2, 0.0)
    report = lambda frames: print(frames, flush=True)
    journal.open_session(meta, report, lambda e: print(e, file=sys.stderr, flush=True))
    stream = bytes(i % 251 for i in range(int(sys.argv[2])))
    for i in range(0, len(stream), 64):
        journal.append_audio("crash", stream[i : i + 64])
        await asyncio.sleep(0.001)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_a_killed_writer_keeps_everything_it_reported_durable(root: Path) -> None:
    """SIGKILL mid-stream: every frame reported durable is back, byte-exact; nothing past the
    record (written, not yet recorded) is."""
    stream_bytes = 160_000  # ~2,500 appends of 16 frames: still streaming when killed
    stream = bytes(i % 251 for i in range(stream_bytes))  # period 251: a shifted byte shows
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(root), str(stream_bytes)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},  # this tree's livemeet
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reported: list[int] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        while len(reported) < 5:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            reported.append(int(line))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    (restored,) = reload(root).values()
    assert reported[-1] <= restored.durable_frames < stream_bytes // FRAME_BYTES
    assert restored.audio_path.read_bytes() == stream[: restored.durable_frames * FRAME_BYTES]


async def test_load_cuts_a_file_longer_than_its_record(root: Path, journal: LiveJournal) -> None:
    audio = b"".join(random_chunks(4, 10))
    journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.append_audio("s-1", audio)
    await journal.close()
    path = root / "audio" / audio_name("s-1")
    with path.open("ab") as f:
        f.write(b"never acknowledged" + b"!")  # an unrecorded tail, not whole frames
    (restored,) = reload(root).values()
    assert restored.durable_frames == len(audio) // FRAME_BYTES
    assert path.read_bytes() == audio


async def test_load_restores_what_a_short_or_missing_file_holds(
    root: Path, journal: LiveJournal, caplog: pytest.LogCaptureFixture
) -> None:
    for sid in ("short", "missing"):
        journal.open_session(meta(sid), lambda _: None, lambda _: None)
        journal.append_audio(sid, b"".join(random_chunks(5, 10)))
    await journal.close()
    short = root / "audio" / audio_name("short")
    kept = short.read_bytes()[: 10 * FRAME_BYTES + 1]  # 10 frames and a byte of the 11th
    short.write_bytes(kept)
    (root / "audio" / audio_name("missing")).unlink()
    with caplog.at_level(logging.WARNING, "livemeet.gateway.live_journal"):
        restored = reload(root)
    assert restored["short"].durable_frames == 10
    assert restored["short"].audio_path.read_bytes() == kept[:-1]
    assert restored["missing"].durable_frames == 0
    assert restored["missing"].audio_path.read_bytes() == b""
    assert len(caplog.records) == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING, "livemeet.gateway.live_journal"):
        assert {s: r.durable_frames for s, r in reload(root).items()} == {"short": 10, "missing": 0}
    assert caplog.records == []  # the records were lowered: logged once


@pytest.mark.parametrize("how", ["emptied", "removed"])
async def test_the_audio_beside_a_lost_database_is_set_aside_not_deleted(
    root: Path, journal: LiveJournal, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """A database cut to nothing (a full disk, a hand) or gone became a new one at the next
    start, and the audio files of the meetings it held were deleted as orphans, logged at
    INFO. They are moved to `dropped/<time>/` and said so at ERROR; the journal works on."""
    journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.append_audio("s-1", bytes(10 * FRAME_BYTES))
    await journal.close()
    db = root / "sessions.sqlite3"
    for path in root.glob("sessions.sqlite3*"):
        path.unlink()
    if how == "emptied":
        db.touch()
    with caplog.at_level(logging.ERROR, "livemeet.gateway.live_journal"):
        assert reload(root) == {}
    (dropped,) = (root / "dropped").iterdir()
    assert [p.name for p in dropped.iterdir()] == [audio_name("s-1")]
    assert (dropped / audio_name("s-1")).stat().st_size == 10 * FRAME_BYTES
    (record,) = caplog.records
    assert "1 audio files" in record.getMessage() and str(dropped) in record.getMessage()
    assert reload(root) == {}  # the next start finds a journal, and nothing to set aside
    assert len(list((root / "dropped").iterdir())) == 1


async def test_a_damaged_database_is_set_aside_and_the_journal_starts_empty(
    root: Path, journal: LiveJournal, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal database that is no database any more (cut short here) made every start
    fail with a traceback (a crash trial). It is moved, with the audio files of its sessions,
    to `dropped/<time>/`, said so in the log, and the journal starts empty and works."""
    journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.append_audio("s-1", bytes(10 * FRAME_BYTES))
    await journal.close()
    db = root / "sessions.sqlite3"
    os.truncate(db, 1000)
    with caplog.at_level(logging.ERROR, "livemeet.gateway.live_journal"):
        assert reload(root) == {}
    (dropped,) = (root / "dropped").iterdir()
    assert sorted(p.name for p in dropped.iterdir()) == [audio_name("s-1"), "sessions.sqlite3"]
    assert (dropped / audio_name("s-1")).stat().st_size == 10 * FRAME_BYTES
    (record,) = caplog.records
    assert "cannot be read (database disk image is malformed)" in record.getMessage()
    assert str(dropped) in record.getMessage() and "1 audio files" in record.getMessage()
    again = started(root)  # a new database: sessions are journalled again
    calls = Calls()
    calls.open(again, meta("s-2"))
    again.append_audio("s-2", bytes(FRAME_BYTES))
    await wait_until(lambda: calls.durable == [1])
    await again.close()
    assert list(reload(root)) == ["s-2"]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("names", "[1]"),  # TypeError unpacking it
        ("options", "not json"),
        ("channels", 0),  # ZeroDivisionError on its frame size
        ("durable_frames", -5),
        ("labels", '["S01", 2]'),
    ],
)
async def test_a_malformed_record_drops_its_session_alone(
    root: Path,
    journal: LiveJournal,
    caplog: pytest.LogCaptureFixture,
    column: str,
    value: object,
) -> None:
    """A session whose record cannot be read back failed every start with a traceback (a
    crash trial), the sessions beside it lost with it. It is dropped alone: its rows go, its
    audio file is moved to `dropped/<time>/`, the log names it; the others are restored."""
    for sid in ("bad", "good"):
        journal.open_session(meta(sid), lambda _: None, lambda _: None)
        journal.append_audio(sid, bytes(10 * FRAME_BYTES))
        journal.add_final(sid, final(1))
    await journal.close()
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        db.execute(f"UPDATE sessions SET {column} = ? WHERE session_id = 'bad'", (value,))
    with caplog.at_level(logging.ERROR, "livemeet.gateway.live_journal"):
        restored = reload(root)
    assert list(restored) == ["good"] and restored["good"].finals == (final(1),)
    (dropped,) = (root / "dropped").iterdir()
    assert [p.name for p in dropped.iterdir()] == [audio_name("bad")]
    (record,) = caplog.records
    assert "live session 'bad' cannot be read" in record.getMessage()
    caplog.clear()
    assert list(reload(root)) == ["good"]  # its rows went: named once
    assert caplog.records == []


async def test_a_bad_final_record_drops_its_session_alone(root: Path, journal: LiveJournal) -> None:
    journal.open_session(meta("bad"), lambda _: None, lambda _: None)
    journal.add_final("bad", final(1))
    journal.open_session(meta("good"), lambda _: None, lambda _: None)
    await journal.close()
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        db.execute("UPDATE finals SET segment = '{\"id\": 1' WHERE session_id = 'bad'")
    assert list(reload(root)) == ["good"]


async def test_a_failing_sync_fails_its_session_and_the_journal_serves_others(
    root: Path, journal: LiveJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fdatasync = os.fdatasync
    failures = [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))]

    def fdatasync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    full, fine = Calls(), Calls()
    full.open(journal, meta("full"))
    journal.append_audio("full", bytes(8 * FRAME_BYTES))
    await wait_until(lambda: bool(full.failed))
    (error,) = full.failed
    assert isinstance(error, StorageFailed) and "No space left on device" in error.message
    journal.append_audio("full", bytes(8 * FRAME_BYTES))  # dropped: the session failed
    journal.add_final("full", final(1))
    fine.open(journal, meta("fine"))
    journal.append_audio("fine", bytes(8 * FRAME_BYTES))
    await wait_until(lambda: fine.durable == [8])
    assert full.durable == [] and journal.durable_frames("full") == 0 and fine.failed == []
    await journal.close()
    restored = reload(root)
    assert (restored["full"].durable_frames, restored["full"].finals) == (0, ())
    assert restored["full"].audio_path.read_bytes() == b""  # the unsynced write was cut off
    assert restored["fine"].durable_frames == 8


async def test_a_groups_syncs_run_at_once_and_one_failing_fails_its_session_alone(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's fdatasyncs ran one after another, each waiting for the disk (a group's
    commit grew with the sessions streaming): they run on the sync threads now, and one that
    fails still fails its own session alone."""
    real_fdatasync = os.fdatasync
    threads: list[str] = []

    def fdatasync(fd: int) -> None:
        threads.append(threading.current_thread().name)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(audio_name("bad")):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    journal = started(root, interval_s=0.2)
    ids = ["bad", *(f"s-{i}" for i in range(5))]
    calls = {sid: Calls() for sid in ids}
    for sid in ids:  # all in one group
        calls[sid].open(journal, meta(sid))
        journal.append_audio(sid, bytes(4 * FRAME_BYTES))
    await wait_until(lambda: all(calls[sid].durable == [4] for sid in ids[1:]))
    await journal.close()
    assert calls["bad"].durable == [] and "Input/output error" in calls["bad"].failed[0].message
    assert all(calls[sid].failed == [] for sid in ids[1:])
    assert any(name.startswith("live-journal-sync") for name in threads), threads
    restored = reload(root)
    assert {sid: r.durable_frames for sid, r in restored.items()} == {
        sid: 0 if sid == "bad" else 4 for sid in ids
    }


async def test_an_audio_file_that_cannot_be_opened_fails_its_session(
    root: Path, journal: LiveJournal
) -> None:
    (root / "audio" / audio_name("blocked")).mkdir()  # a directory where its file would go
    blocked, fine = Calls(), Calls()
    blocked.open(journal, meta("blocked"))
    fine.open(journal, meta("fine"))
    journal.append_audio("blocked", bytes(FRAME_BYTES))
    journal.append_audio("fine", bytes(FRAME_BYTES))
    await wait_until(lambda: bool(blocked.failed) and fine.durable == [1])
    assert blocked.failed[0].code == "storage_failed" and blocked.durable == []


async def test_a_statement_that_fails_fails_its_session_alone(
    root: Path, journal: LiveJournal
) -> None:
    """A session whose row cannot be stored (here its table is gone) fails, its record left
    where it was; the others in the same group commit go on (they all failed: a security
    review)."""
    a, b = Calls(), Calls()
    a.open(journal, meta("a"))
    b.open(journal, meta("b"))
    journal.append_audio("a", bytes(FRAME_BYTES))
    journal.append_audio("b", bytes(FRAME_BYTES))
    await wait_until(lambda: a.durable == [1] and b.durable == [1])
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        db.execute("DROP TABLE finals")  # the next commit's INSERT fails
    journal.add_final("a", final(1))
    journal.append_audio("a", bytes(FRAME_BYTES))
    journal.append_audio("b", bytes(FRAME_BYTES))
    await wait_until(lambda: bool(a.failed) and b.durable == [1, 2])
    assert a.durable == [1] and journal.durable_frames("a") == 1
    assert isinstance(a.failed[0], StorageFailed) and len(a.failed) == 1 and b.failed == []
    journal.append_audio("b", bytes(FRAME_BYTES))
    await wait_until(lambda: b.durable == [1, 2, 3])
    await journal.close()
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        rows = dict(db.execute("SELECT session_id, durable_frames FROM sessions"))
    assert rows == {"a": 1, "b": 3}


async def test_a_final_sqlite_cannot_encode_fails_its_session_alone(
    root: Path, journal: LiveJournal
) -> None:
    """A lone surrogate in a row (a str SQLite cannot encode as UTF-8) raised out of the
    group commit and failed every live session on the server (a security review); the
    protocol now refuses one in a client's text, and the journal fails only its session."""
    a, b = Calls(), Calls()
    a.open(journal, meta("a"))
    b.open(journal, meta("b"))
    journal.add_final("a", dataclasses.replace(final(1), text="x\ud800"))
    journal.append_audio("b", bytes(FRAME_BYTES))
    await wait_until(lambda: bool(a.failed) and b.durable == [1])
    assert b.failed == []
    journal.add_final("b", final(2))
    journal.append_audio("b", bytes(FRAME_BYTES))
    await wait_until(lambda: b.durable == [1, 2])
    await journal.close()
    assert [f.text for f in reload(root)["b"].finals] == [final(2).text]


async def test_a_journal_of_a_newer_schema_is_refused(root: Path) -> None:
    root.mkdir()
    with sqlite3.connect(root / "sessions.sqlite3") as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match="schema version"):
        LiveJournal(root).load_unfinished()
    journal = LiveJournal(root)
    with pytest.raises(ConfigError, match="schema version"):
        journal.start(asyncio.get_running_loop())
    await journal.close()


async def test_a_lock_file_that_cannot_be_opened_is_a_config_error(root: Path) -> None:
    """A lock path the server cannot open (here a directory; another user's file alike) was
    a raw OSError: a traceback from `livemeet serve` and `--check-config`. It is the data
    dir's problem, named with the path."""
    (root / LOCK_NAME).mkdir(parents=True)
    with pytest.raises(ConfigError, match="cannot open the live journal's lock file"):
        journal_holder(root)
    journal = LiveJournal(root)
    with pytest.raises(ConfigError, match=str(root / LOCK_NAME)):
        journal.load_unfinished()
    await journal.close()


async def test_a_sessions_audio_another_users_run_left_is_named_with_its_owner(
    root: Path, journal: LiveJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server run as root on the service user's data dir kept a session whose audio file
    is root's: the service user's next start said only "Permission denied" on that file (the
    container trial); whose it is, and how to hand it over, now too."""
    import builtins

    from livemeet.gateway import live_journal

    journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.append_audio("s-1", bytes(FRAME_BYTES))
    await journal.close()
    (audio,) = (root / "audio").iterdir()

    def refused(file: Any, *args: Any, **kwargs: Any) -> Any:  # as the OS refuses another's
        if Path(file) == audio:
            raise PermissionError(13, "Permission denied", str(file))
        return builtins.open(file, *args, **kwargs)

    monkeypatch.setattr(live_journal, "open", refused, raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # the service user, no passwd entry
    with pytest.raises(StorageFailed, match="could not be loaded") as failed:
        LiveJournal(root).load_unfinished()
    assert f"{audio} is " in failed.value.message
    assert (
        "and livemeet runs as uid 4242: another user's run made it? "
        f"as root, `chown -R 4242 {root.parent}`" in failed.value.message
    )


async def test_audio_that_is_not_whole_frames_is_refused_even_under_python_o(
    journal: LiveJournal,
) -> None:
    """An `assert` guarded it, which `python -O` strips: a part frame would shift every
    later sample of the session's stored audio by a byte."""
    journal.open_session(meta("s1"), lambda _: None, lambda _: None)
    with pytest.raises(InternalError, match="not whole"):
        journal.append_audio("s1", b"\x00" * (FRAME_BYTES + 1))


async def test_a_second_server_on_the_same_journal_is_refused(root: Path) -> None:
    """Two servers on one data dir would both rebuild and append to the same sessions: the
    second one's journal is refused while the first holds it, and taken once it is closed."""
    first = LiveJournal(root)
    assert first.load_unfinished() == []
    first.start(asyncio.get_running_loop())
    second = LiveJournal(root)
    with pytest.raises(ConfigError, match="in use by another livemeet server"):
        second.load_unfinished()
    await first.close()
    assert second.load_unfinished() == []
    await second.close()


def test_the_refusal_names_the_server_holding_the_journal(root: Path) -> None:
    """The holder's pid goes into the lock file as it takes the lock, so a second server's
    refusal says which process to stop (before, only "another livemeet server")."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_JOURNAL, str(root)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=rf"another livemeet server \(pid {holder.pid};"):
            LiveJournal(root).load_unfinished()
    finally:
        holder.kill()
        holder.wait()
    assert LiveJournal(root).load_unfinished() == []  # its death let the lock go


HOLD_THE_JOURNAL = """
import sys, time
from pathlib import Path
from livemeet.gateway.live_journal import LiveJournal
journal = LiveJournal(Path(sys.argv[1]))
journal.load_unfinished()  # takes the lock, held while `journal` lives
print("held", flush=True)
time.sleep(60)
"""


async def test_misuse_raises_internal_error(root: Path) -> None:
    journal = started(root)
    with pytest.raises(InternalError):
        journal.start(asyncio.get_running_loop())
    with pytest.raises(InternalError):
        journal.load_unfinished()  # the writer owns the files now
    for call in (
        lambda: journal.append_audio("nope", b""),
        lambda: journal.add_final("nope", final(1)),
        lambda: journal.set_names("nope", []),
        lambda: journal.finish("nope"),
        lambda: journal.discard("nope"),
        lambda: journal.durable_frames("nope"),
    ):
        with pytest.raises(InternalError, match="not open"):
            call()
    journal.open_session(meta(), lambda _: None, lambda _: None)
    with pytest.raises(InternalError, match="already"):
        journal.open_session(meta(), lambda _: None, lambda _: None)
    journal.finish("s-1")
    with pytest.raises(InternalError, match="not open"):
        journal.append_audio("s-1", b"")
    await journal.close()
    await journal.close()  # idempotent
    for call in (
        lambda: journal.open_session(meta("t"), lambda _: None, lambda _: None),
        lambda: journal.durable_frames("s-1"),
        journal.load_unfinished,
    ):
        with pytest.raises(InternalError, match="closed"):
            call()
    with pytest.raises(ValueError):
        LiveJournal(root, commit_interval_s=-1)


def test_storage_failed_has_its_codes() -> None:
    assert (StorageFailed.code, StorageFailed.http_status, StorageFailed.close_code) == (
        "storage_failed",
        507,
        4507,
    )
    assert StorageFailed.retryable and StorageFailed in ERROR_CLASSES
    assert type(error_for_code("storage_failed", "disk full")) is StorageFailed
