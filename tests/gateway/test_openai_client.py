"""The official `openai` client, unchanged, against the gateway (fake transcriber)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest
from aiohttp.test_utils import TestClient
from openai.types.audio import TranscriptionTextDoneEvent

from tests.gateway.conftest import wav_bytes
from tests.gateway.fakes import expected_upload_text


@pytest.fixture
def audio_path(tmp_path: Path) -> Path:
    path = tmp_path / "clip.wav"
    path.write_bytes(wav_bytes(5.0))
    return path


def make_openai(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0)


async def test_create_json_text_srt(client: TestClient, audio_path: Path) -> None:
    oa = make_openai(client)

    def run() -> tuple[object, object, object]:
        with audio_path.open("rb") as f:
            as_json = oa.audio.transcriptions.create(model="whisper-1", file=f)
        with audio_path.open("rb") as f:
            as_text = oa.audio.transcriptions.create(
                model="whisper-1", file=f, response_format="text"
            )
        with audio_path.open("rb") as f:
            as_verbose = oa.audio.transcriptions.create(
                model="whisper-1",
                file=f,
                response_format="verbose_json",
                language="en",
                timestamp_granularities=["segment"],
                temperature=0.0,
            )
        return as_json, as_text, as_verbose

    as_json, as_text, as_verbose = await asyncio.to_thread(run)
    expected = expected_upload_text(5.0)
    assert as_json.text == expected  # type: ignore[attr-defined]
    assert as_json.usage.type == "duration" and as_json.usage.seconds == 5.0  # type: ignore
    assert as_text.strip() == expected  # type: ignore[union-attr]
    assert as_verbose.language == "en" and len(as_verbose.segments) == 3  # type: ignore


async def test_stream_true(client: TestClient, audio_path: Path) -> None:
    oa = make_openai(client)

    def run() -> list[object]:
        with audio_path.open("rb") as f:
            stream = oa.audio.transcriptions.create(
                model="whisper-1", file=f, stream=True, response_format="json"
            )
            return list(stream)

    events = await asyncio.to_thread(run)
    types = [e.type for e in events]  # type: ignore[attr-defined]
    assert types[-1] == "transcript.text.done"
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")  # type: ignore
    assert deltas == events[-1].text == expected_upload_text(5.0)  # type: ignore[attr-defined]
    assert types.count("transcript.text.segment") == 3
    # the done event passes the SDK's own schema (a trial: our duration `usage` in it broke
    # its token-only Usage type)
    done = TranscriptionTextDoneEvent.model_validate(events[-1].to_dict())  # type: ignore
    assert done.usage is None


async def test_error_is_an_openai_api_error(client: TestClient, tmp_path: Path) -> None:
    oa = make_openai(client)
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio" * 50)

    def run() -> None:
        with bad.open("rb") as f:
            oa.audio.transcriptions.create(model="whisper-1", file=f)

    with pytest.raises(openai.BadRequestError) as info:
        await asyncio.to_thread(run)
    assert info.value.code == "bad_audio"


async def test_models_list_and_retrieve(client: TestClient) -> None:
    """`models.retrieve` got 404 "no route" (found by a trial): GET /v1/models/{id} serves
    the one model; another id is a NotFoundError."""
    oa = make_openai(client)

    def run() -> tuple[list[str], str]:
        listed = [m.id for m in oa.models.list()]
        return listed, oa.models.retrieve(listed[0]).id

    listed, retrieved = await asyncio.to_thread(run)
    assert listed == ["fake-model"] and retrieved == "fake-model"
    with pytest.raises(openai.NotFoundError) as info:
        await asyncio.to_thread(oa.models.retrieve, "whisper-1")
    assert info.value.code == "not_found"
