"""Finished upload transcripts: the newest in memory, every one as a JSON file under the data dir.

`GET /v1/transcriptions/{id}` reads from here; files let transcripts outlive a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any

from livemeet.audio.constants import TRANSCRIPT_CACHE_ENTRIES
from livemeet.errors import NotFound
from livemeet.transcript.segments import FinishReason, Segment, SegmentFlag, Transcript

log = logging.getLogger(__name__)

TRANSCRIPTION_ID = re.compile(r"^tr_[0-9a-f]{32}$")


def new_transcription_id() -> str:
    return f"tr_{uuid.uuid4().hex}"


def transcript_to_json(t: Transcript) -> dict[str, Any]:
    return {
        "duration": t.duration_s,
        "finish_reason": t.finish_reason.value,
        "language": t.language,
        "segments": [s.to_wire() for s in t.segments],
    }


def transcript_from_json(d: dict[str, Any]) -> Transcript:
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
    )


class TranscriptStore:
    """id -> Transcript: the newest `max_cached` in memory, every one as
    `<directory>/<id>.json`.

    `put` keeps the transcript in memory at once and writes its file in the background, so an
    upload's response never waits for the disk; `get` finds it in memory meanwhile (entries
    whose file is not written yet are never evicted). A failed write is logged, and the
    transcript stays readable until it leaves the cache. `flush()` waits for every write
    (shutdown, tests). The cache exceeds `max_cached` only by the unwritten entries.
    """

    def __init__(self, directory: Path, max_cached: int = TRANSCRIPT_CACHE_ENTRIES) -> None:
        if max_cached < 1:
            raise ValueError(f"max_cached must be >= 1, not {max_cached}")
        self.directory = directory
        self.max_cached = max_cached
        self._memory: OrderedDict[str, Transcript] = OrderedDict()  # oldest first
        self._writing: dict[str, asyncio.Task[None]] = {}

    async def put(self, transcription_id: str, transcript: Transcript) -> None:
        assert TRANSCRIPTION_ID.match(transcription_id), transcription_id
        body = json.dumps(transcript_to_json(transcript), ensure_ascii=False)
        task = asyncio.get_running_loop().create_task(self._write(transcription_id, body))
        self._writing[transcription_id] = task  # before _remember: it must not evict this one
        task.add_done_callback(lambda _: self._written(transcription_id))
        self._remember(transcription_id, transcript)

    async def get(self, transcription_id: str) -> Transcript:
        """Raises NotFound for unknown or malformed ids."""
        if not TRANSCRIPTION_ID.match(transcription_id):
            raise NotFound(f"no transcription {transcription_id!r}")
        cached = self._memory.get(transcription_id)
        if cached is not None:
            self._memory.move_to_end(transcription_id)
            return cached
        path = self.directory / f"{transcription_id}.json"
        try:
            text = await asyncio.get_running_loop().run_in_executor(
                None, partial(path.read_text, encoding="utf-8")
            )
        except FileNotFoundError:
            raise NotFound(f"no transcription {transcription_id!r}") from None
        transcript = transcript_from_json(json.loads(text))
        self._remember(transcription_id, transcript)
        return transcript

    async def flush(self) -> None:
        """Wait until every transcript put so far is on disk (or its write failed)."""
        while self._writing:
            await asyncio.gather(*self._writing.values(), return_exceptions=True)

    @property
    def num_cached(self) -> int:
        """Transcripts held in memory now (<= max_cached plus the unwritten ones)."""
        return len(self._memory)

    def _remember(self, transcription_id: str, transcript: Transcript) -> None:
        self._memory[transcription_id] = transcript
        self._memory.move_to_end(transcription_id)
        self._trim()

    def _written(self, transcription_id: str) -> None:
        self._writing.pop(transcription_id, None)
        self._trim()  # entries held back while unwritten may go now

    def _trim(self) -> None:
        excess = len(self._memory) - self.max_cached
        if excess <= 0:
            return
        victims: list[str] = []
        for old in self._memory:  # oldest first; stops once enough are found
            if len(victims) == excess:
                break
            if old not in self._writing:  # unwritten ones stay: get() has no file to read yet
                victims.append(old)
        for old in victims:
            del self._memory[old]

    async def _write(self, transcription_id: str, body: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._write_file, transcription_id, body)
        except Exception:  # no one awaits this task: every failure is logged here
            log.exception("transcript %s was not saved", transcription_id)

    def _write_file(self, transcription_id: str, body: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{transcription_id}.json.tmp"
        tmp.write_text(body, encoding="utf-8")
        tmp.replace(self.directory / f"{transcription_id}.json")  # atomic: never half a file
