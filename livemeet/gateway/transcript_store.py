"""Finished transcripts: the newest in memory, every one as a JSON file under the data dir.

Two kinds share the store: uploads (`tr_<hex>`, read by `GET /v1/transcriptions/{id}`: the
random id is the capability) and live sessions (`ls_<hex>`, read by `GET
/v1/sessions/{id}/transcript`: the session's captions token is the capability, kept as its
SHA-256 so a leaked data dir does not leak working tokens). A live session's revised
transcript (DESIGN 5.7) is a third kind (`lr_<hex>`, the same hash), read as its final is.
Files let transcripts outlive a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from livemeet.audio.constants import TRANSCRIPT_CACHE_ENTRIES, TRANSCRIPT_CACHE_SEGMENTS
from livemeet.errors import NotFound
from livemeet.gateway.disk import make_private_dir, remove_older_than, sync_directory
from livemeet.transcript.segments import FinishReason, Segment, SegmentFlag, Transcript

log = logging.getLogger(__name__)

TRANSCRIPTION_ID = re.compile(r"^tr_[0-9a-f]{32}$")
LIVE_TRANSCRIPT_ID = re.compile(r"^ls_[0-9a-f]{32}$")


def new_transcription_id() -> str:
    """A new upload id: `tr_` and 32 random hex digits (a UUID4; matches TRANSCRIPTION_ID)."""
    return f"tr_{uuid.uuid4().hex}"


def live_transcript_id(session_id: str, *, revised: bool = False) -> str:
    """The store id of a live session's transcript (`revised`: of its revision). Session ids
    come from the backend (any string), so the file name is a hash of one, never the id
    itself."""
    prefix = "lr" if revised else "ls"
    return f"{prefix}_{hashlib.sha256(session_id.encode()).hexdigest()[:32]}"


def remove_partial_writes(directory: Path) -> int:
    """Delete the half-written transcript files in `directory` (at start-up: a run killed in
    the middle of a write left them, and nothing else ever removes one). Returns how many."""
    removed = 0
    for path in directory.glob(".*.json.tmp"):  # `_write_file`'s temporary name
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def token_digest(token: str) -> str:
    """What the store keeps of a capability token (hex SHA-256)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class StoredTranscript:
    """A transcript and, for a live session's, the SHA-256 of the token that may read it.

    `revision_failed`: in a live session's revision record only, why its revision failed;
    `transcript` is then its final one, which stands (the record says the revision will not
    come: `X-Livemeet-Revision: failed` outlives the session, where it read `none`).
    `revision_promised`: in a live session's final record only, its `transcript.final` said a
    revision follows; with no revision record once the server let the session go, the
    revision was lost (the server stopped before it came or failed)."""

    transcript: Transcript
    access_sha256: str | None = None
    revision_failed: str | None = None
    revision_promised: bool = False


def transcript_to_json(t: Transcript) -> dict[str, Any]:
    """The stored record of `t` (its JSON file's object): duration (s), finish_reason, language,
    segments (`Segment.to_wire`), speakers, merged."""
    return {
        "duration": t.duration_s,
        "finish_reason": t.finish_reason.value,
        "language": t.language,
        "segments": [s.to_wire() for s in t.segments],
        # {label: name} a live client gave (insertion order kept: first named first)
        "speakers": dict(t.speaker_names),
        # {label: target} of the labels a live client merged away (in merge order)
        "merged": dict(t.speaker_merges),
    }


def transcript_from_json(d: dict[str, Any]) -> Transcript:
    """The Transcript of a record `transcript_to_json` wrote (every segment final; `speakers` and
    `merged` optional, for older files). A malformed record raises what its bad field causes
    (KeyError, ValueError, TypeError)."""
    segments = tuple(
        Segment(
            start_s=float(s["start"]),
            end_s=float(s["end"]),
            speaker=str(s["speaker"]),
            text=str(s["text"]),
            id=str(s["id"]),
            is_final=True,
            flags=tuple(SegmentFlag(f) for f in s.get("flags", ())),
        )
        for s in d["segments"]
    )
    return Transcript(
        segments=segments,
        duration_s=float(d["duration"]),
        finish_reason=FinishReason(d["finish_reason"]),
        language=d.get("language"),
        # files written before names existed have no "speakers"
        speaker_names=tuple((str(k), str(v)) for k, v in d.get("speakers", {}).items()),
        # nor "merged", before merges
        speaker_merges=tuple((str(k), str(v)) for k, v in d.get("merged", {}).items()),
    )


class TranscriptStore:
    """id -> StoredTranscript: the newest `max_cached` in memory, holding at most
    `max_cached_segments` segments together (the newest one is kept whatever its size),
    every one as `<directory>/<id>.json`.

    `put` keeps the transcript in memory at once and writes its file in the background, so an
    upload's response never waits for the disk; `get` finds it in memory meanwhile (entries
    whose file is not written yet are never evicted). A failed write is logged, and the
    transcript stays readable until it leaves the cache. `flush()` waits for every write
    (shutdown, tests). The cache exceeds its bounds only by the unwritten entries.
    """

    def __init__(
        self,
        directory: Path,
        max_cached: int = TRANSCRIPT_CACHE_ENTRIES,
        max_cached_segments: int = TRANSCRIPT_CACHE_SEGMENTS,
    ) -> None:
        if max_cached < 1 or max_cached_segments < 1:
            raise ValueError(
                f"max_cached and max_cached_segments must be >= 1, not {max_cached}, "
                f"{max_cached_segments}"
            )
        self.directory = directory
        self.max_cached = max_cached
        self.max_cached_segments = max_cached_segments
        self._memory: OrderedDict[str, StoredTranscript] = OrderedDict()  # oldest first
        self._num_segments = 0  # in self._memory
        self._writing: dict[str, asyncio.Task[bool]] = {}

    async def put(self, transcription_id: str, transcript: Transcript) -> None:
        """Store an upload's transcript."""
        assert TRANSCRIPTION_ID.match(transcription_id), transcription_id
        self._put(transcription_id, StoredTranscript(transcript))

    def put_live(self, session_id: str, transcript: Transcript, token: str) -> asyncio.Task[bool]:
        """Store a live session's final transcript, readable with `token` (never blocks: the
        file is written in the background, as `put`'s)."""
        return self.put_live_digest(session_id, transcript, token_digest(token))

    def put_live_digest(
        self,
        session_id: str,
        transcript: Transcript,
        access_sha256: str,
        *,
        revised: bool = False,
        revision_promised: bool = False,
    ) -> asyncio.Task[bool]:
        """`put_live` given the token's SHA-256 (hex) instead of the token; `revised`: the
        session's revised transcript, kept beside its final one; `revision_promised`: the
        final one's `transcript.final` said a revision follows (`StoredTranscript`). The task
        returned says whether the file was written (a failure is logged)."""
        return self._put(
            live_transcript_id(session_id, revised=revised),
            StoredTranscript(transcript, access_sha256, revision_promised=revision_promised),
        )

    def put_live_revision_failed(
        self, session_id: str, final: Transcript, access_sha256: str, reason: str
    ) -> asyncio.Task[bool]:
        """Record that a live session's revision failed (`reason`), in the place of its revised
        transcript: `get_live(revised=True)` then returns `final` with `revision_failed`."""
        return self._put(
            live_transcript_id(session_id, revised=True),
            StoredTranscript(final, access_sha256, revision_failed=reason),
        )

    async def get(self, transcription_id: str) -> Transcript:
        """An upload's transcript. Raises NotFound for unknown or malformed ids (a live
        session's store id included: those are read with their token, `get_live`)."""
        if not TRANSCRIPTION_ID.match(transcription_id):
            raise NotFound(f"no transcription {transcription_id!r}")
        # a well-formed id may be an upload still running (a trial read "no transcription" as
        # lost): say when one is stored
        why = "one is stored once its upload has completed, not while it runs or if it failed"
        return (
            await self._get(transcription_id, f"no transcription {transcription_id!r}: {why}")
        ).transcript

    async def get_live(self, session_id: str, *, revised: bool = False) -> StoredTranscript:
        """A live session's stored transcript (`revised`: its revision); the caller checks the
        token against `access_sha256`. Raises NotFound."""
        key = live_transcript_id(session_id, revised=revised)
        what = "revised transcript" if revised else "transcript"
        return await self._get(key, f"no {what} of session {session_id!r}")

    def _put(self, key: str, stored: StoredTranscript) -> asyncio.Task[bool]:
        record = transcript_to_json(stored.transcript)
        if stored.access_sha256 is not None:
            record["access_sha256"] = stored.access_sha256
        if stored.revision_failed is not None:
            record["revision_failed"] = stored.revision_failed
        if stored.revision_promised:
            record["revision_promised"] = True
        body = json.dumps(record, ensure_ascii=False)
        task = asyncio.get_running_loop().create_task(self._write(key, body))
        self._writing[key] = task  # before _remember: it must not evict this one
        task.add_done_callback(lambda _: self._written(key))
        self._remember(key, stored)
        return task

    async def _get(self, key: str, not_found: str) -> StoredTranscript:
        cached = self._memory.get(key)
        if cached is not None:
            self._memory.move_to_end(key)
            return cached
        path = self.directory / f"{key}.json"
        try:
            text = await asyncio.get_running_loop().run_in_executor(
                None, partial(path.read_text, encoding="utf-8")
            )
        except FileNotFoundError:
            raise NotFound(not_found) from None
        record = json.loads(text)
        stored = StoredTranscript(
            transcript_from_json(record),
            record.get("access_sha256"),
            record.get("revision_failed"),  # absent from every record but a failed revision's
            record.get("revision_promised", False),  # absent but where a revision was promised
        )
        self._remember(key, stored)
        return stored

    async def sweep(self, max_age_s: float) -> int:
        """Delete stored transcripts last written more than `max_age_s` ago (retention), from
        disk and memory; returns how many."""
        loop = asyncio.get_running_loop()
        removed = await loop.run_in_executor(None, remove_older_than, self.directory, max_age_s)
        for path in removed:
            self._forget(path.name.removesuffix(".json"))
        return len(removed)

    async def flush(self) -> None:
        """Wait until every transcript put so far is on disk (or its write failed)."""
        while self._writing:
            await asyncio.gather(*self._writing.values(), return_exceptions=True)

    @property
    def num_cached(self) -> int:
        """Transcripts held in memory now (<= max_cached plus the unwritten ones)."""
        return len(self._memory)

    def _remember(self, transcription_id: str, stored: StoredTranscript) -> None:
        self._forget(transcription_id)
        self._memory[transcription_id] = stored
        self._num_segments += len(stored.transcript.segments)
        self._trim()

    def _forget(self, transcription_id: str) -> None:
        stored = self._memory.pop(transcription_id, None)
        if stored is not None:
            self._num_segments -= len(stored.transcript.segments)

    def _written(self, transcription_id: str) -> None:
        self._writing.pop(transcription_id, None)
        self._trim()  # entries held back while unwritten may go now

    def _trim(self) -> None:
        """Evict the oldest written entries until both bounds hold (or none is left to evict
        but the newest)."""
        entries, segments = len(self._memory), self._num_segments
        victims: list[str] = []
        for old, stored in list(self._memory.items())[:-1]:  # oldest first, not the newest
            if entries <= self.max_cached and segments <= self.max_cached_segments:
                break
            if old not in self._writing:  # unwritten ones stay: get() has no file to read yet
                victims.append(old)
                entries -= 1
                segments -= len(stored.transcript.segments)
        for old in victims:
            self._forget(old)

    async def _write(self, transcription_id: str, body: str) -> bool:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._write_file, transcription_id, body)
        except OSError as exc:  # the disk's (full, read-only, failing), not a bug: one line
            log.error("transcript %s was not saved: %s", transcription_id, exc)
            return False
        except Exception:  # no one awaits this task: every failure is logged here
            log.exception("transcript %s was not saved", transcription_id)
            return False
        return True

    def _write_file(self, transcription_id: str, body: str) -> None:
        """Write the file durably: its bytes synced before the atomic rename (never half a
        file), the directory synced after it (the new name). A live session's audio is
        deleted from the journal once its transcript is written: an unsynced transcript
        lost to a power cut took the meeting with it."""
        make_private_dir(self.directory)
        tmp = self.directory / f".{transcription_id}.json.tmp"
        try:
            with tmp.open("w", encoding="utf-8") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.directory / f"{transcription_id}.json")
        except BaseException:
            # a full disk left the half-written file behind, for good: nothing else reads it
            # (a start removes those of a killed run: `remove_partial_writes`)
            with contextlib.suppress(OSError):  # a read-only disk: the write's error stands
                tmp.unlink(missing_ok=True)
            raise
        sync_directory(self.directory)
