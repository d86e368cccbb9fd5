"""Finished upload transcripts: kept in memory and as one JSON file each under the data dir.

`GET /v1/transcriptions/{id}` reads from here; files let transcripts outlive a restart.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

from livemeet.errors import NotFound
from livemeet.transcript.segments import FinishReason, Segment, SegmentFlag, Transcript

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
    """id -> Transcript, in memory, backed by `<directory>/<id>.json`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._memory: dict[str, Transcript] = {}

    async def put(self, transcription_id: str, transcript: Transcript) -> None:
        assert TRANSCRIPTION_ID.match(transcription_id), transcription_id
        self._memory[transcription_id] = transcript
        body = json.dumps(transcript_to_json(transcript), ensure_ascii=False)
        await asyncio.get_running_loop().run_in_executor(None, self._write, transcription_id, body)

    async def get(self, transcription_id: str) -> Transcript:
        """Raises NotFound for unknown or malformed ids."""
        if not TRANSCRIPTION_ID.match(transcription_id):
            raise NotFound(f"no transcription {transcription_id!r}")
        cached = self._memory.get(transcription_id)
        if cached is not None:
            return cached
        path = self.directory / f"{transcription_id}.json"
        try:
            text = await asyncio.get_running_loop().run_in_executor(None, path.read_text)
        except FileNotFoundError:
            raise NotFound(f"no transcription {transcription_id!r}") from None
        transcript = transcript_from_json(json.loads(text))
        self._memory[transcription_id] = transcript
        return transcript

    def _write(self, transcription_id: str, body: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{transcription_id}.json.tmp"
        tmp.write_text(body)
        tmp.replace(self.directory / f"{transcription_id}.json")  # atomic: never half a file
