"""livemeet.gateway.transcript_store: a bounded memory cache over one JSON file per id."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from livemeet.errors import NotFound
from livemeet.gateway.transcript_store import (
    TranscriptStore,
    live_transcript_id,
    new_transcription_id,
    token_digest,
)
from livemeet.transcript.segments import FinishReason, Segment, Transcript


def transcript(text: str) -> Transcript:
    seg = Segment(0.0, 1.0, "S01", text, id="seg-0001", is_final=True)
    return Transcript((seg,), 1.0, FinishReason.STOP)


async def test_the_cache_is_bounded_and_evicted_ones_are_read_back(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path, max_cached=2)
    ids = [new_transcription_id() for _ in range(5)]
    for i, tid in enumerate(ids):
        await store.put(tid, transcript(f"t{i}"))
    await store.flush()
    assert store.num_cached == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{t}.json" for t in ids)
    for i, tid in enumerate(ids):
        assert (await store.get(tid)).segments[0].text == f"t{i}"
        assert store.num_cached <= 2
    with pytest.raises(NotFound):
        await store.get(new_transcription_id())


def long_transcript(n: int) -> Transcript:
    segs = tuple(
        Segment(float(i), i + 1.0, "S01", f"w{i}", id=f"seg-{i:04d}", is_final=True)
        for i in range(n)
    )
    return Transcript(segs, float(n), FinishReason.STOP)


async def test_the_cache_is_bounded_by_segments_too(tmp_path: Path) -> None:
    """The soak trial: bounded by count alone, the cache of 1,024 transcripts could hold ~0.5
    GB of long meetings (~400 B a segment). The oldest go until the segments fit too; the
    newest stays whatever its size; every one is read back from its file."""
    store = TranscriptStore(tmp_path, max_cached=100, max_cached_segments=50)
    ids = [new_transcription_id() for _ in range(4)]
    for tid in ids:
        await store.put(tid, long_transcript(20))
    await store.flush()
    assert store.num_cached == 2  # 40 segments; a third would make 60
    await store.put(big := new_transcription_id(), long_transcript(80))
    await store.flush()
    assert store.num_cached == 1  # the newest alone, over the budget by itself
    for tid in ids:
        assert len((await store.get(tid)).segments) == 20
    assert store.num_cached == 2  # the last read, and the 80-segment one is evicted
    assert len((await store.get(big)).segments) == 80
    assert store.num_cached == 1
    with pytest.raises(ValueError):
        TranscriptStore(tmp_path, max_cached_segments=0)


async def test_an_unwritten_transcript_is_never_evicted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While its file is being written, a transcript stays in memory past the bound, so a GET
    right after the response cannot miss it."""
    store = TranscriptStore(tmp_path, max_cached=1)
    gate = asyncio.Event()
    real = store._write

    async def slow_write(tid: str, body: str) -> None:
        await gate.wait()
        await real(tid, body)

    monkeypatch.setattr(store, "_write", slow_write)
    ids = [new_transcription_id() for _ in range(3)]
    for i, tid in enumerate(ids):
        await store.put(tid, transcript(f"t{i}"))
    assert store.num_cached == 3 and list(tmp_path.iterdir()) == []
    assert [(await store.get(t)).segments[0].text for t in ids] == ["t0", "t1", "t2"]
    gate.set()
    await store.flush()  # each finished write trims the cache back to its bound
    assert store.num_cached == 1 and len(list(tmp_path.iterdir())) == 3


async def test_a_failed_write_is_logged_and_the_transcript_stays_readable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the directory should be")
    store = TranscriptStore(blocker / "transcripts")
    tid = new_transcription_id()
    await store.put(tid, transcript("kept"))
    await store.flush()
    assert "was not saved" in caplog.text
    assert (await store.get(tid)).segments[0].text == "kept"


async def test_a_write_the_disk_fails_leaves_no_half_file_and_logs_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that failed on the disk (its fsync: ENOSPC) left `.tr_<id>.json.tmp` behind for
    good, with a traceback in the log for what is no bug."""

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full_disk)
    store = TranscriptStore(tmp_path)
    tid = new_transcription_id()
    await store.put(tid, transcript("kept"))
    await store.flush()
    assert list(tmp_path.iterdir()) == []
    [record] = [r for r in caplog.records if "was not saved" in r.getMessage()]
    assert record.exc_info is None and "No space left on device" in record.getMessage()
    assert (await store.get(tid)).segments[0].text == "kept"


def test_the_bound_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        TranscriptStore(tmp_path, max_cached=0)


async def test_a_live_sessions_transcript_is_kept_with_its_tokens_digest(tmp_path: Path) -> None:
    """Stored under a hash of the session id (any string a backend chose), with the SHA-256 of
    its captions token, never the token; read back by a new store; not an upload's."""
    store = TranscriptStore(tmp_path)
    store.put_live("../odd id/", transcript("live"), "s3cret")
    await store.flush()
    (path,) = tmp_path.iterdir()
    assert path.name == f"{live_transcript_id('../odd id/')}.json"
    assert "s3cret" not in path.read_text()
    stored = await TranscriptStore(tmp_path).get_live("../odd id/")
    assert stored.transcript.segments[0].text == "live"
    assert stored.access_sha256 == token_digest("s3cret")
    with pytest.raises(NotFound):
        await store.get(path.stem)  # the upload route's lookup refuses a live id
    with pytest.raises(NotFound):
        await store.get_live("another")


async def test_a_failed_revision_is_kept_in_the_revisions_place(tmp_path: Path) -> None:
    """Once the server let a session go, its failed revision read as none coming: the store
    kept finals and revisions, not failures. The failure is kept where the revision would be,
    with the final that stands; a revised transcript's record has none."""
    store = TranscriptStore(tmp_path)
    store.put_live("s-1", transcript("final"), "t")
    sha = token_digest("t")
    store.put_live_revision_failed("s-1", transcript("final"), sha, "decode failed")
    store.put_live_digest("s-2", transcript("revised"), sha, revised=True)
    await store.flush()
    fresh = TranscriptStore(tmp_path)
    failed = await fresh.get_live("s-1", revised=True)
    assert failed.revision_failed == "decode failed" and failed.access_sha256 == sha
    assert failed.transcript.segments[0].text == "final"
    assert (await fresh.get_live("s-1")).revision_failed is None
    assert (await fresh.get_live("s-2", revised=True)).revision_failed is None


async def test_a_final_that_promised_a_revision_says_so_after_a_restart(tmp_path: Path) -> None:
    """A final whose revision was lost to a stop read as one never to be revised: the final
    record keeps the promise, and records without it read as none promised."""
    store = TranscriptStore(tmp_path)
    sha = token_digest("t")
    store.put_live_digest("s-1", transcript("final"), sha, revision_promised=True)
    store.put_live_digest("s-2", transcript("final"), sha)
    await store.flush()
    fresh = TranscriptStore(tmp_path)
    assert (await fresh.get_live("s-1")).revision_promised is True
    assert (await fresh.get_live("s-2")).revision_promised is False
    plain = tmp_path / f"{live_transcript_id('s-2')}.json"
    assert "revision_promised" not in plain.read_text()  # older records read the same


async def test_speaker_names_are_kept_and_old_files_without_them_read(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    named = replace(transcript("live"), speaker_names=(("S02", "Bob"), ("S01", "Zoë")))
    store.put_live("s-1", named, "t")
    store.put_live("s-2", transcript("no names"), "t")
    await store.flush()
    fresh = TranscriptStore(tmp_path)
    assert (await fresh.get_live("s-1")).transcript.speaker_names == named.speaker_names
    assert (await fresh.get_live("s-2")).transcript.speaker_names == ()
    path = tmp_path / f"{live_transcript_id('s-2')}.json"
    record = json.loads(path.read_text())
    del record["speakers"]  # as written before names existed
    path.write_text(json.dumps(record))
    assert (await TranscriptStore(tmp_path).get_live("s-2")).transcript.speaker_names == ()


async def test_speaker_merges_are_kept_and_old_files_without_them_read(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    merged = replace(transcript("live"), speaker_merges=(("S03", "S01"), ("S02", "S01")))
    store.put_live("s-1", merged, "t")
    await store.flush()
    assert (await TranscriptStore(tmp_path).get_live("s-1")).transcript == merged
    path = tmp_path / f"{live_transcript_id('s-1')}.json"
    record = json.loads(path.read_text())
    del record["merged"]  # as written before merges existed
    path.write_text(json.dumps(record))
    assert (await TranscriptStore(tmp_path).get_live("s-1")).transcript.speaker_merges == ()


async def test_a_file_is_synced_before_its_rename_and_its_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live session's audio is deleted once its transcript is written: the transcript must
    be on disk by then, not in the page cache (before, no fsync at all)."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, Path.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        real_fsync(fd)

    def rename(self: Path, target: Path) -> Path:
        events.append("rename")
        return real_replace(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "replace", rename)
    store, tid = TranscriptStore(tmp_path), new_transcription_id()
    await store.put(tid, transcript("hello"))
    await store.flush()
    assert events == ["fsync file", "rename", "fsync dir"]
    assert json.loads((tmp_path / f"{tid}.json").read_text())["segments"][0]["text"] == "hello"
