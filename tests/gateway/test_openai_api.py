"""`POST /v1/audio/transcriptions` and friends, against the fake transcriber."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import numpy as np
import pytest
import soundfile as sf
from aiohttp.test_utils import TestClient

from livemeet.config import ServerConfig
from livemeet.errors import (
    BadAudio,
    EngineUnavailable,
    InvalidRequest,
    LivemeetError,
    NotFound,
    PayloadTooLarge,
    StorageFailed,
    TooLong,
)
from livemeet.gateway import openai_api
from livemeet.gateway.app import create_app
from livemeet.gateway.drain import UploadCutoff
from livemeet.gateway.keys import LIFECYCLE_KEY, STORE_KEY
from livemeet.gateway.sse import DeltaFlusher
from livemeet.transcriber import Event, TextDelta, TranscriberSession
from tests.audio.conftest import id3v2_tag, with_flac_total_samples
from tests.gateway.conftest import (
    MAX_AUDIO_S,
    MAX_UPLOAD_BYTES,
    ClientFactory,
    truncated_flac,
    wav_bytes,
)
from tests.gateway.fakes import FakeTranscriber, expected_upload_text


def form(audio: bytes | None, **fields: str) -> aiohttp.FormData:
    data = aiohttp.FormData()
    if audio is not None:
        data.add_field("file", audio, filename="a.wav", content_type="audio/wav")
    data.add_field("model", fields.pop("model", "whisper-1"))
    for name, value in fields.items():
        data.add_field(name, value)
    return data


async def assert_error(resp: aiohttp.ClientResponse, error: type[LivemeetError]) -> dict:
    body = await resp.json()
    assert resp.status == error.http_status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == error.code and body["error"]["message"]
    expected_type = "server_error" if error.http_status >= 500 else "invalid_request_error"
    assert body["error"]["type"] == expected_type
    return body


def spooled_files(config: ServerConfig) -> list[Path]:
    return list((config.data_dir / "tmp").iterdir())


async def test_json_upload_and_stored_transcript(
    client: TestClient, fake: FakeTranscriber, server_config: ServerConfig
) -> None:
    resp = await client.post(
        "/v1/audio/transcriptions",
        data=form(
            wav_bytes(5.0),
            prompt="Hi",
            language="fr",
            temperature="0.2",
            **{"timestamp_granularities[]": "word", "include[]": "logprobs"},
        ),
    )
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["text"] == expected_upload_text(5.0)
    assert body["usage"] == {"type": "duration", "seconds": 5}
    assert type(body["usage"]["seconds"]) is int
    options = fake.sessions[0].log.options
    assert not options.live and options.prompt == "Hi" and options.language == "fr"
    assert fake.sessions[0].log.num_samples == 5 * 16000 and fake.sessions[0].log.aborted
    assert spooled_files(server_config) == []

    tid = resp.headers[openai_api.ID_HEADER]
    got = await client.get(f"/v1/transcriptions/{tid}", params={"response_format": "srt"})
    assert got.status == 200 and got.content_type == "application/x-subrip"
    assert "S01: segment 2 café" in await got.text()
    await client.app[STORE_KEY].flush()  # written in the background, after the response
    assert (server_config.data_dir / "transcriptions" / f"{tid}.json").is_file()
    verbose = await (
        await client.get(f"/v1/transcriptions/{tid}", params={"response_format": "verbose_json"})
    ).json()
    assert verbose["language"] == "fr" and verbose["duration"] == 5.0
    # an empty response_format is json here as in the upload form (it was 400: a trial)
    blank = await client.get(f"/v1/transcriptions/{tid}", params={"response_format": ""})
    assert blank.status == 200 and (await blank.json())["text"] == body["text"]


async def test_stored_transcript_survives_restart(
    aiohttp_client: ClientFactory, server_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is written after the response; a shutdown waits for it (a slow disk here)."""
    import time

    from livemeet.gateway.transcript_store import TranscriptStore

    real_write = TranscriptStore._write_file

    def slow_write(self: TranscriptStore, transcription_id: str, body: str) -> None:
        time.sleep(0.3)
        real_write(self, transcription_id, body)

    monkeypatch.setattr(TranscriptStore, "_write_file", slow_write)
    first = await aiohttp_client(create_app(server_config, FakeTranscriber()))
    resp = await first.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    tid = resp.headers[openai_api.ID_HEADER]
    await first.close()  # a shutdown waits for the transcript files
    second = await aiohttp_client(create_app(server_config, FakeTranscriber()))
    got = await second.get(f"/v1/transcriptions/{tid}", params={"response_format": "text"})
    assert await got.text() == expected_upload_text(1.0) + "\n"


async def test_a_hung_disk_does_not_hang_the_shutdown(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import time

    from livemeet.gateway import app as app_module
    from livemeet.gateway.transcript_store import TranscriptStore

    monkeypatch.setattr(app_module, "TRANSCRIPT_FLUSH_TIMEOUT_S", 0.1)
    monkeypatch.setattr(TranscriptStore, "_write_file", lambda *a: time.sleep(1.0))
    client = await aiohttp_client(create_app(server_config, FakeTranscriber()))
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    assert resp.status == 200
    started = time.monotonic()
    await client.close()
    assert time.monotonic() - started < 0.8
    assert "transcript files not written" in caplog.text


@pytest.mark.parametrize(
    ("fmt", "content_type"),
    [
        ("json", "application/json"),
        ("text", "text/plain"),
        ("verbose_json", "application/json"),
        ("srt", "application/x-subrip"),
        ("vtt", "text/vtt"),
        ("diarized_json", "application/json"),
    ],
)
async def test_response_formats(client: TestClient, fmt: str, content_type: str) -> None:
    resp = await client.post(
        "/v1/audio/transcriptions", data=form(wav_bytes(3.0), response_format=fmt)
    )
    assert resp.status == 200 and resp.content_type == content_type
    text = await resp.text()
    assert "segment 1 café" in text
    if content_type == "application/json":
        assert json.loads(text)["usage"]["seconds"] == 3.0


def parse_sse(raw: str) -> list[dict[str, Any]]:
    events = []
    for block in raw.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(json.loads(block[len("data: ") :]))
    return events


async def test_stream_sse_events(client: TestClient) -> None:
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(5.0), stream="true"))
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    events = parse_sse(await resp.text())
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "transcript.text.done" and kinds.count("transcript.text.done") == 1
    assert kinds[0] == "transcript.text.delta"
    deltas = "".join(e["delta"] for e in events if e["type"] == "transcript.text.delta")
    assert deltas == events[-1]["text"] == expected_upload_text(5.0)
    # no `usage`: OpenAI's done event has token usage only; the duration is livemeet's field
    assert "usage" not in events[-1] and events[-1]["duration"] == 5.0
    segments = [e for e in events if e["type"] == "transcript.text.segment"]
    assert [s["id"] for s in segments] == ["seg-0000", "seg-0001", "seg-0002"]
    assert set(segments[0]) == {"type", "id", "start", "end", "speaker", "text"}
    # each segment's text was fully sent as deltas before its segment event
    for i, kind in enumerate(kinds):
        if kind == "transcript.text.segment":
            sent = "".join(e["delta"] for e in events[:i] if e["type"] == "transcript.text.delta")
            assert sent.endswith(events[i]["text"])


async def test_the_done_events_duration_is_the_bodies_duration_in_whole_ms(
    client: TestClient,
) -> None:
    """Times are floats of 3 decimals (docs/protocol.md): a file of 5 s and one sample gave
    `duration` 5.0000625 in `transcript.text.done`, 5.0 in verbose_json (a trial)."""
    audio = wav_bytes(5.0 + 1 / 16_000)
    resp = await client.post("/v1/audio/transcriptions", data=form(audio, stream="true"))
    done = parse_sse(await resp.text())[-1]
    resp = await client.post(
        "/v1/audio/transcriptions", data=form(audio, response_format="verbose_json")
    )
    assert done["duration"] == (await resp.json())["duration"] == 5.0


@pytest.mark.parametrize("tick_s", [0.005, 0.013, 0.015, 0.02, 0.03])
async def test_a_delta_held_past_its_flush_time_is_sent_before_the_segment_event(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, tick_s: float
) -> None:
    """A delta held for the flush window and overdue when a segment event (or the final)
    came was taken out of the flusher by that event's push and dropped: the deltas lacked a
    segment's words (a trial: 10,000 segments, a busy loop). A clock that moves `tick_s` a
    read makes held text overdue at a segment's push, as a busy loop does."""
    clock = iter(range(10**6))
    monkeypatch.setattr(openai_api, "time", SimpleNamespace(monotonic=lambda: next(clock) * tick_s))
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(5.0), stream="true"))
    events = parse_sse(await resp.text())
    deltas = "".join(e["delta"] for e in events if e["type"] == "transcript.text.delta")
    assert deltas == events[-1]["text"] == expected_upload_text(5.0)


async def test_stream_sends_segments_when_backend_commits_only_at_end(
    client: TestClient, fake: FakeTranscriber
) -> None:
    fake.upload_segment_events = False
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(3.0), stream="true"))
    events = parse_sse(await resp.text())
    kinds = [e["type"] for e in events]
    assert kinds[-3:] == [
        "transcript.text.segment",
        "transcript.text.segment",
        "transcript.text.done",
    ]
    assert [e["id"] for e in events if e["type"] == "transcript.text.segment"] == [
        "seg-0000",
        "seg-0001",
    ]


async def test_a_streamed_upload_whose_client_leaves_ends_disconnected(
    client: TestClient, fake: FakeTranscriber, caplog: pytest.LogCaptureFixture
) -> None:
    """The client stops reading the SSE stream and closes: the next write fails, and the
    upload ends `disconnected` (a trial: it was counted and logged as `internal_error`, the
    outcome of a bug, naming a transcription id that was never stored)."""
    caplog.set_level(logging.INFO, logger="livemeet.gateway.openai_api")
    fake.end_gate = asyncio.Event()
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0), stream="true"))
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    resp.close()  # the client is gone before the transcript
    fake.end_gate.set()
    ended = 'livemeet_sessions_ended_total{kind="upload",outcome="disconnected"} 1.0'
    for _ in range(100):
        if ended in (text := await (await client.get("/metrics")).text()):
            break
        await asyncio.sleep(0.02)
    assert ended in text and 'outcome="internal_error"' not in text
    [line] = [r.getMessage() for r in caplog.records if " ended: " in r.getMessage()]
    assert "disconnected" in line and "no transcript stored" in line


async def test_a_transcription_still_running_is_not_found_and_says_why(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A stream's id header comes first; read while its upload runs, the id is 404 with a
    message saying a transcription is stored once complete (a trial took it for lost)."""
    fake.end_gate = asyncio.Event()
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0), stream="true"))
    tid = resp.headers["X-Livemeet-Transcription-Id"]
    body = await assert_error(await client.get(f"/v1/transcriptions/{tid}"), NotFound)
    assert "stored once its upload has completed" in body["error"]["message"]
    fake.end_gate.set()
    await resp.read()
    assert (await client.get(f"/v1/transcriptions/{tid}")).status == 200


async def test_stream_backend_error_becomes_error_event(
    client: TestClient, fake: FakeTranscriber
) -> None:
    fake.end_gate = asyncio.Event()
    post = asyncio.create_task(
        client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0), stream="true"))
    )
    while not fake.sessions:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    fake.sessions[0].fail(EngineUnavailable("engine died"))
    resp = await post
    events = parse_sse(await resp.text())
    assert events[-1]["error"]["code"] == EngineUnavailable.code
    # the session ended with that error, although the response itself is a 200 stream
    text = await (await client.get("/metrics")).text()
    assert 'livemeet_sessions_ended_total{kind="upload",outcome="engine_unavailable"} 1.0' in text


async def test_a_failed_upload_session_ends_with_its_error_code(
    client: TestClient, fake: FakeTranscriber
) -> None:
    fake.end_gate = asyncio.Event()
    post = asyncio.create_task(client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0))))
    while not fake.sessions:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    fake.sessions[0].fail(EngineUnavailable("engine died"))
    resp = await post
    assert resp.status == 503
    text = await (await client.get("/metrics")).text()
    assert 'livemeet_sessions_ended_total{kind="upload",outcome="engine_unavailable"} 1.0' in text


async def test_a_file_field_sent_as_text_says_to_send_the_file(client: TestClient) -> None:
    """`curl -F file=meeting.wav` (the `@` forgotten) sends the path as a text field: the
    answer said only "not an audio file ..." (a new user's trial). A file part without a
    filename now says how curl sends a file; one with a filename is answered as before."""
    text_field = aiohttp.FormData(default_to_multipart=True)  # as curl -F sends it
    text_field.add_field("file", "../shared/data/jfk/jfk.flac")
    text_field.add_field("model", "whisper-1")
    resp = await client.post("/v1/audio/transcriptions", data=text_field)
    message = (await assert_error(resp, BadAudio))["error"]["message"]
    assert message.startswith("not an audio file")
    assert message.endswith(
        "(the 'file' field came without a filename, as a form's text field does: curl sends "
        "a file with -F file=@PATH)"
    )
    resp = await client.post("/v1/audio/transcriptions", data=form(b"not audio" * 10))
    assert "without a filename" not in (await assert_error(resp, BadAudio))["error"]["message"]


@pytest.mark.parametrize(
    ("audio", "fields", "error"),
    [
        (None, {}, InvalidRequest),  # missing file field
        (b"this is not audio at all" * 100, {}, BadAudio),
        (b"", {}, BadAudio),  # zero-length upload
        (wav_bytes(0.0), {}, BadAudio),  # a valid header, no samples
        (wav_bytes(1.0), {"response_format": "mp3"}, InvalidRequest),
        (wav_bytes(1.0), {"stream": "maybe"}, InvalidRequest),
        (wav_bytes(1.0), {"stream": "true", "response_format": "srt"}, InvalidRequest),
        (wav_bytes(1.0), {"stream": "true", "response_format": "verbose_json"}, InvalidRequest),
        (wav_bytes(MAX_AUDIO_S + 1, rate=8000), {}, TooLong),
    ],
)
async def test_bad_uploads(
    client: TestClient,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    audio: bytes | None,
    fields: dict[str, str],
    error: type[LivemeetError],
) -> None:
    resp = await client.post("/v1/audio/transcriptions", data=form(audio, **fields))
    body = await assert_error(resp, error)
    # OpenAI's `param` names the field at fault: the audio, or the last form field given
    assert body["error"]["param"] == (list(fields)[-1] if fields else "file")
    assert spooled_files(server_config) == []
    assert fake.sessions == []


@pytest.mark.parametrize("memory_bytes", [1 << 20, 1000])
async def test_uploads_are_decoded_from_memory_or_their_spill_file(
    client: TestClient,
    server_config: ServerConfig,
    fake: FakeTranscriber,
    monkeypatch: pytest.MonkeyPatch,
    memory_bytes: int,
) -> None:
    """A file part up to UPLOAD_MEMORY_BYTES is decoded from memory and never touches the
    disk; a larger one is spilled, decoded from its file, and the file removed."""
    from livemeet.audio import decode

    monkeypatch.setattr(openai_api, "UPLOAD_MEMORY_BYTES", memory_bytes)
    sources: list[decode.AudioSource] = []
    real = decode.decode_file_with_info

    def spy(source: decode.AudioSource, *, max_audio_s: float, cancel: Any = None) -> Any:
        sources.append(source)
        if isinstance(source, Path):
            assert source.parent == server_config.data_dir / "tmp" and source.exists()
        return real(source, max_audio_s=max_audio_s, cancel=cancel)

    monkeypatch.setattr(decode, "decode_file_with_info", spy)
    audio = wav_bytes(1.0)
    resp = await client.post("/v1/audio/transcriptions", data=form(audio))
    assert resp.status == 200, await resp.text()
    assert fake.sessions[0].log.num_samples == 16000
    if len(audio) <= memory_bytes:
        assert sources == [audio]
    else:
        assert len(sources) == 1 and isinstance(sources[0], Path)
    tmp = server_config.data_dir / "tmp"
    assert not tmp.exists() or spooled_files(server_config) == []


async def test_an_upload_whose_spill_fails_is_storage_failed_not_a_500(
    client: TestClient,
    server_config: ServerConfig,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The data dir's tmp gone from under the server (a full or read-only disk reads the
    same): the spill's OSError was a 500 internal_error with a traceback. It is 507
    storage_failed, retryable, and the message names no path of the server's."""
    monkeypatch.setattr(openai_api, "UPLOAD_MEMORY_BYTES", 1000)
    tmp = server_config.data_dir / "tmp"
    tmp.rmdir()
    tmp.write_bytes(b"")
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    body = await assert_error(resp, StorageFailed)
    assert str(server_config.data_dir) not in body["error"]["message"]
    assert resp.headers["Retry-After"] == "1"
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_spilled_upload_too_long_is_refused_before_decoding(
    client: TestClient, server_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spilled uploads are probed first: too long, they never take a decode slot."""
    from livemeet.audio import decode

    monkeypatch.setattr(openai_api, "UPLOAD_MEMORY_BYTES", 1000)
    decoded: list[object] = []
    monkeypatch.setattr(decode, "decode_file_with_info", lambda *a, **k: decoded.append(a))
    resp = await client.post(
        "/v1/audio/transcriptions", data=form(wav_bytes(MAX_AUDIO_S + 1, rate=8000))
    )
    await assert_error(resp, TooLong)
    assert decoded == [] and spooled_files(server_config) == []


async def test_spill_files_of_a_crashed_run_are_removed_at_start(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    tmp = server_config.data_dir / "tmp"
    tmp.mkdir(parents=True)
    (tmp / ("upload-" + "0" * 32)).write_bytes(b"half an upload")
    (tmp / "keep.txt").write_text("not ours")
    await aiohttp_client(create_app(server_config, FakeTranscriber()))
    assert [p.name for p in tmp.iterdir()] == ["keep.txt"]


async def test_half_written_transcripts_of_a_killed_run_are_removed_at_start(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """A run killed while it wrote a transcript (its temporary file, before the rename) left
    that file for good: nothing removed it (a crash trial). A start removes such files."""
    stored = server_config.data_dir / "transcriptions"
    stored.mkdir(parents=True)
    (stored / (".tr_" + "0" * 32 + ".json.tmp")).write_text('{"text": "half a tr')
    (stored / ("tr_" + "1" * 32 + ".json")).write_text("{}")
    await aiohttp_client(create_app(server_config, FakeTranscriber()))
    assert [p.name for p in stored.iterdir()] == ["tr_" + "1" * 32 + ".json"]


async def test_a_cut_wav_is_transcribed_and_the_log_says_how_much_was_missing(
    client: TestClient, fake: FakeTranscriber, caplog: pytest.LogCaptureFixture
) -> None:
    """A cut WAV is accepted and its intact prefix transcribed (docs/protocol.md), and was so
    in silence (a trial): a WARNING now names the declared and the present durations."""
    whole = wav_bytes(2.0)
    with caplog.at_level(logging.WARNING, logger=openai_api.log.name):
        resp = await client.post("/v1/audio/transcriptions", data=form(whole[: 44 + 16_000]))
        assert resp.status == 200, await resp.text()
    assert fake.sessions[0].log.num_samples == 8_000
    (line,) = [r.getMessage() for r in caplog.records if "cut" in r.getMessage()]
    assert line.endswith(
        "the audio is cut: its header declares 2.00 s, the file holds 0.50 s (1.50 s missing); "
        "the part it holds is transcribed"
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=openai_api.log.name):
        resp = await client.post("/v1/audio/transcriptions", data=form(whole))
        assert resp.status == 200, await resp.text()
    assert not [r for r in caplog.records if "cut" in r.getMessage()]


async def test_truncated_flac(client: TestClient) -> None:
    resp = await client.post("/v1/audio/transcriptions", data=form(truncated_flac()))
    await assert_error(resp, BadAudio)


async def test_a_flac_is_transcribed_whole_whatever_its_header_says(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """A FLAC whose STREAMINFO declares 1 s holds 3 s, and two FLACs joined with cat: every
    second is transcribed (libsndfile stopped at the header's count: 1 s, with a 200)."""
    understated = with_flac_total_samples(wav_bytes(3.0, fmt="FLAC"), 16_000)
    joined = wav_bytes(1.0, fmt="FLAC") + wav_bytes(2.0, fmt="FLAC")
    for data in (understated, joined):
        resp = await client.post("/v1/audio/transcriptions", data=form(data))
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["usage"] == {"type": "duration", "seconds": 3}
    assert [s.log.num_samples for s in fake.sessions] == [3 * 16_000, 3 * 16_000]


def spy_on_decoding(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The list returned gets what each upload's decode (`decode_file_with_info`) returns:
    its samples and its probe's info."""
    from livemeet.audio import decode

    decoded: list[decode.Decoded] = []
    real = decode.decode_file_with_info

    def spy(source: decode.AudioSource, *, max_audio_s: float, cancel: Any = None) -> Any:
        decoded.append(real(source, max_audio_s=max_audio_s, cancel=cancel))
        return decoded[-1]

    monkeypatch.setattr(decode, "decode_file_with_info", spy)
    return decoded


@pytest.mark.parametrize("memory_bytes", [4 << 20, 1000])
async def test_a_flac_behind_cover_art_is_transcribed_as_without_it(
    client: TestClient,
    fake: FakeTranscriber,
    monkeypatch: pytest.MonkeyPatch,
    memory_bytes: int,
) -> None:
    """A FLAC behind an ID3v2 tag of more than 1 MiB (cover art) was refused as bad_audio
    ("not an audio file"); decoded from memory or from its spill file, it is now transcribed
    from the samples of the FLAC without its tag."""
    from livemeet.audio import decode

    monkeypatch.setattr(openai_api, "UPLOAD_MEMORY_BYTES", memory_bytes)
    decoded = spy_on_decoding(monkeypatch)
    flac = wav_bytes(1.0, 44_100, 2, fmt="FLAC")
    resp = await client.post(
        "/v1/audio/transcriptions", data=form(id3v2_tag((1 << 20) + 300_000) + flac)
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["usage"] == {"type": "duration", "seconds": 1}
    np.testing.assert_array_equal(decoded[0].samples, decode.decode_file(flac))
    assert decoded[0].info == decode.probe(flac)
    assert fake.sessions[0].log.num_samples == 16_000


@pytest.mark.parametrize("memory_bytes", [4 << 20, 1000])
async def test_a_wav_behind_cover_art_is_transcribed_whole(
    client: TestClient,
    fake: FakeTranscriber,
    monkeypatch: pytest.MonkeyPatch,
    memory_bytes: int,
) -> None:
    """A 5-s WAV behind 100 kB of cover art (an ID3v2 tag) held in memory was transcribed
    as 1.9 s, without an error: libsndfile, reading the bytes, sized the data from the
    whole upload, tag included, and lost the tag's length of audio at the end. From memory
    it is now the WAV's 5 s, sample for sample; from its spill file it was already (a
    guard: libsndfile passes a tag in a file it opens by name)."""
    from livemeet.audio import decode

    monkeypatch.setattr(openai_api, "UPLOAD_MEMORY_BYTES", memory_bytes)
    decoded = spy_on_decoding(monkeypatch)
    wav = wav_bytes(5.0)
    resp = await client.post("/v1/audio/transcriptions", data=form(id3v2_tag(100_000) + wav))
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["usage"] == {"type": "duration", "seconds": 5}
    np.testing.assert_array_equal(decoded[0].samples, decode.decode_file(wav))
    assert decoded[0].info == decode.probe(wav)
    assert fake.sessions[0].log.num_samples == 5 * 16_000


async def test_oversized_upload_with_content_length(
    client: TestClient, server_config: ServerConfig
) -> None:
    resp = await client.post("/v1/audio/transcriptions", data=form(bytes(MAX_UPLOAD_BYTES + 1)))
    body = await assert_error(resp, PayloadTooLarge)
    assert body["error"]["param"] == "file"  # was null (an independent trial)
    assert spooled_files(server_config) == []


async def test_oversized_upload_is_stopped_while_streaming(
    client: TestClient, server_config: ServerConfig
) -> None:
    """No Content-Length (chunked): the limit must cut the body while it streams in."""
    sent = 0

    async def body() -> Any:
        nonlocal sent
        boundary = b"--xyz\r\n"
        yield boundary + b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        chunk = bytes(1 << 16)
        while sent < 4 * MAX_UPLOAD_BYTES:
            sent += len(chunk)
            yield chunk
        yield b"\r\n--xyz--\r\n"

    headers = {"Content-Type": "multipart/form-data; boundary=xyz"}
    try:
        resp = await client.post("/v1/audio/transcriptions", data=body(), headers=headers)
        assert (await assert_error(resp, PayloadTooLarge))["error"]["param"] == "file"
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
        pass  # the server may cut the connection before the client reads the 413
    assert sent < 4 * MAX_UPLOAD_BYTES  # the server stopped reading long before the end
    assert spooled_files(server_config) == []


async def test_not_ready_is_503(aiohttp_client: ClientFactory, server_config: ServerConfig) -> None:
    client = await aiohttp_client(create_app(server_config, FakeTranscriber(start_ready=False)))
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    await assert_error(resp, EngineUnavailable)
    assert resp.headers["Retry-After"] == "1"
    ready = await client.get("/readyz")
    assert ready.status == 503


async def test_an_upload_while_the_server_drains_is_told_to_wait_for_its_restart(
    client: TestClient,
) -> None:
    """An upload on a connection still open once a shutdown began was told "the model is not
    ready" and to retry in 1 s, when the server was going away: it waits a restart's time."""
    client.app[LIFECYCLE_KEY].draining = True
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    body = await assert_error(resp, EngineUnavailable)
    assert "shutting down" in body["error"]["message"]
    assert resp.headers["Retry-After"] == "30"  # SHUTDOWN_RETRY_AFTER_S


class RestartingFake(FakeTranscriber):
    """A backend whose engine worker was lost: its next start is 12.3 s away (the restart's
    backoff doubles up to 30 s)."""

    restart_in_s = 12.3


async def test_while_the_engine_restarts_retry_after_is_the_time_to_its_next_start(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """Retry-After said 1 whatever the restart's backoff: a client obeying it retried up to
    30 times for nothing. It is the time until the next attempt, rounded up."""
    fake = RestartingFake(start_ready=False)
    client = await aiohttp_client(create_app(server_config, fake))
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    await assert_error(resp, EngineUnavailable)
    assert resp.headers["Retry-After"] == "13"
    fake.restart_in_s = 0.0  # a new worker is loading: its time is not known
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    assert resp.status == 503 and resp.headers["Retry-After"] == "1"


async def test_unknown_transcription_and_route(client: TestClient) -> None:
    await assert_error(await client.get("/v1/transcriptions/tr_" + "0" * 32), NotFound)
    await assert_error(await client.get("/v1/transcriptions/..%2Fetc"), NotFound)
    await assert_error(await client.get("/v1/nothing"), NotFound)


async def test_wrong_method_is_a_client_error(client: TestClient) -> None:
    """405 with its own code (the error table maps invalid_request to 400), and Allow."""
    resp = await client.get("/v1/audio/transcriptions")
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "method_not_allowed"
    assert "POST" in error["message"]


async def test_models(client: TestClient) -> None:
    body = await (await client.get("/v1/models")).json()
    assert body["object"] == "list" and body["data"][0]["id"] == "fake-model"
    one = await client.get("/v1/models/fake-model")
    assert one.status == 200 and await one.json() == body["data"][0]
    assert (await client.get("/v1/models/owner/other")).status == 404  # hub ids hold a slash


async def test_decodes_are_bounded(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from livemeet.audio import decode

    running, peak = 0, 0
    real = decode.decode_file_with_info

    def slow_decode(path: Path, *, max_audio_s: float, cancel: Any = None) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            import time

            time.sleep(0.1)
            return real(path, max_audio_s=max_audio_s, cancel=cancel)
        finally:
            running -= 1

    monkeypatch.setattr(decode, "decode_file_with_info", slow_decode)
    audio = wav_bytes(1.0)
    resps = await asyncio.gather(
        *(client.post("/v1/audio/transcriptions", data=form(audio)) for _ in range(5))
    )
    assert [r.status for r in resps] == [200] * 5
    assert peak == client.app[openai_api.CONFIG_KEY].gateway.max_concurrent_decodes == 2


async def test_upload_prompt_has_the_live_prompt_limit(client: TestClient) -> None:
    """An upload's prompt is capped like a live session's (MAX_PROMPT_CHARS), not only by the
    64 KiB form-field limit; at the limit it is accepted."""
    from livemeet.audio.constants import MAX_PROMPT_CHARS

    url = "/v1/audio/transcriptions"
    over = form(wav_bytes(1.0), prompt="x" * (MAX_PROMPT_CHARS + 1))
    await assert_error(await client.post(url, data=over), InvalidRequest)
    resp = await client.post(url, data=form(wav_bytes(1.0), prompt="x" * MAX_PROMPT_CHARS))
    assert resp.status == 200, await resp.text()


async def test_upload_language_has_the_live_language_limit(client: TestClient) -> None:
    """`language` is capped as in a live `start` (MAX_LANGUAGE_CHARS; found by a user trial:
    an upload echoed 5,000 characters where `start` refused 40); a valid tag within it is echoed."""
    from livemeet.audio.constants import MAX_LANGUAGE_CHARS

    url = "/v1/audio/transcriptions"
    over = form(wav_bytes(1.0), language="x" * (MAX_LANGUAGE_CHARS + 1))
    await assert_error(await client.post(url, data=over), InvalidRequest)
    at = "en-x-" + "-".join(["abcdefgh"] * 3)  # a valid tag (private use), 31 characters
    assert len(at) == MAX_LANGUAGE_CHARS - 1
    resp = await client.post(
        url, data=form(wav_bytes(1.0), language=at, response_format="verbose_json")
    )
    assert resp.status == 200 and (await resp.json())["language"] == at


async def test_a_file_declaring_a_1_hz_rate_is_bad_audio_not_too_long(client: TestClient) -> None:
    """32 KB of samples under a damaged header's 1 Hz read as 16,000 s: 413 audio_too_long,
    the wrong error (found by a user trial); it is 400 bad_audio, as on the live socket."""
    buf = io.BytesIO()
    sf.write(buf, np.zeros(16_000, np.int16), 1, format="WAV", subtype="PCM_16")
    resp = await client.post("/v1/audio/transcriptions", data=form(buf.getvalue()))
    await assert_error(resp, BadAudio)


async def test_a_client_gone_mid_decode_stops_it_and_frees_its_slot_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that left mid-decode released its decode slot at once while the thread decoded
    on, so abandoned 90-minute decodes ran beside the slots' new ones (a trial). Now the
    decode is told to stop, and the slot is held until its thread has returned."""
    import threading
    import time

    from aiohttp import web

    from livemeet.audio import decode
    from livemeet.gateway.keys import CONFIG_KEY, LIFECYCLE_KEY, Lifecycle

    started, saw_cancel, release = threading.Event(), threading.Event(), threading.Event()

    def slow_decode(source: object, *, max_audio_s: float, cancel: threading.Event) -> None:
        started.set()
        while not cancel.is_set():
            time.sleep(0.005)
        saw_cancel.set()
        release.wait(5)  # the thread finishes its block a moment later
        raise decode.DecodeCancelled("cancelled")

    monkeypatch.setattr(decode, "decode_file_with_info", slow_decode)
    app = web.Application()
    app[CONFIG_KEY] = ServerConfig()
    app[LIFECYCLE_KEY] = lifecycle = Lifecycle()
    task = asyncio.create_task(openai_api._decode_upload(app, b"audio bytes"))
    assert await asyncio.to_thread(started.wait, 5), task
    task.cancel()
    await asyncio.sleep(0.1)
    assert saw_cancel.is_set() and not task.done()
    assert lifecycle.decode_slots.locked()  # still the thread's
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not lifecycle.decode_slots.locked()


def test_a_streamed_segment_keeps_its_flags() -> None:
    """A streamed upload's segment event dropped `flags` (`end_clamped`), which diarized_json
    kept for the same segment (a trial): both carry Segment.to_wire now."""
    from livemeet.gateway.openai_api import _segment_event
    from livemeet.transcript.segments import Segment, SegmentFlag

    clamped = Segment(7.5, 11.0, "S01", "ask", id="seg-0002", flags=(SegmentFlag.END_CLAMPED,))
    assert _segment_event(clamped) == {
        "type": "transcript.text.segment",
        "id": "seg-0002",
        "start": 7.5,
        "end": 11.0,
        "speaker": "S01",
        "text": "ask",
        "flags": ["end_clamped"],
    }
    plain = _segment_event(Segment(0.0, 7.5, "S01", "so", id="seg-0001"))
    assert "flags" not in plain


async def test_an_uploads_log_line_names_its_stored_transcription(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The end line logged the backend's session id only, so an operator could not get from
    it to the stored transcript the client was given (a trial)."""
    caplog.set_level("INFO", logger="livemeet.gateway.openai_api")
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    assert resp.status == 200
    tid = resp.headers[openai_api.ID_HEADER]
    assert f"(transcription {tid})" in caplog.text


async def test_verbose_json_names_the_backends_one_language_when_none_was_given(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """The demo transcribes English only (Whisper tiny.en), so its `verbose_json` says
    "english" as OpenAI names a detected language (a trial: always "unknown"); the request's
    own `language` still wins, and a backend of any language says "unknown"."""
    url = "/v1/audio/transcriptions"
    unknown = await client.post(url, data=form(wav_bytes(1.0), response_format="verbose_json"))
    assert (await unknown.json())["language"] == "unknown"
    fake._info = replace(fake._info, language="english")
    english = await client.post(url, data=form(wav_bytes(1.0), response_format="verbose_json"))
    assert (await english.json())["language"] == "english"
    given = form(wav_bytes(1.0), response_format="verbose_json", language="de")
    assert (await (await client.post(url, data=given)).json())["language"] == "de"


def test_the_demo_backend_says_it_transcribes_english() -> None:
    from livemeet.backends.demo import DemoCore

    info = DemoCore.__new__(DemoCore).info  # no model loaded for this
    assert info.language == "english" and info.language_code == "en"


@pytest.mark.parametrize(
    ("language", "code", "accepted"),
    [
        ("en", None, True),
        ("zh-Hant-TW", None, True),
        ("zz", None, False),  # not a language (a trial: echoed back)
        ("english", None, False),  # a name, not a code: OpenAI's API refuses it too
        ("en", "en", True),
        ("en-GB", "en", True),
        ("zh", "en", False),  # the English-only demo wrote English under "zh" (a trial)
    ],
)
async def test_the_language_must_be_a_code_the_backend_transcribes(
    client: TestClient, fake: FakeTranscriber, language: str, code: str | None, accepted: bool
) -> None:
    fake._info = replace(fake._info, language_code=code)
    data = form(wav_bytes(1.0), language=language, response_format="verbose_json")
    resp = await client.post("/v1/audio/transcriptions", data=data)
    if accepted:
        assert resp.status == 200 and (await resp.json())["language"] == language
    else:
        body = await assert_error(resp, InvalidRequest)
        assert body["error"]["param"] == "language"
    assert len(fake.sessions) == accepted  # refused before its session opened


@pytest.mark.parametrize(
    ("temperature", "accepted"),
    [
        ("0", True),
        ("0.2", True),
        ("1", True),
        ("", True),
        ("5", False),
        ("abc", False),
        ("nan", False),
    ],
)
async def test_the_temperature_is_checked_as_openai_checks_it(
    client: TestClient, temperature: str, accepted: bool
) -> None:
    """A number from 0 to 1 (OpenAI's range; a trial found `abc` and `5` accepted); the
    decoding stays greedy whatever it says."""
    data = form(wav_bytes(1.0), temperature=temperature)
    resp = await client.post("/v1/audio/transcriptions", data=data)
    if accepted:
        assert resp.status == 200, await resp.text()
    else:
        body = await assert_error(resp, InvalidRequest)
        assert body["error"]["param"] == "temperature"


class _SlowToCloseSession:
    """An upload session whose event stream yields one delta, then waits, and takes a while
    to close (a backend's, winding down)."""

    def __init__(self) -> None:
        self.closing = asyncio.Event()

    async def events(self) -> AsyncIterator[Event]:
        try:
            yield TextDelta("hi")
            await asyncio.Event().wait()
        finally:
            self.closing.set()
            await asyncio.sleep(10)


async def test_a_cancel_while_the_event_stream_closes_is_not_swallowed() -> None:
    """A streamed upload's handler cancelled (its client left, the shutdown's cut) while its
    event stream closes is cancelled: the close's wait for the stream's pump swallowed the
    cancel, and the handler ran on as if nothing had come."""
    session = _SlowToCloseSession()
    events = openai_api._timed_events(
        cast(TranscriberSession, session), DeltaFlusher(0.05), UploadCutoff()
    )

    async def read_one() -> str:
        async with contextlib.aclosing(events) as items:
            async for item in items:
                if item is not None:
                    break
        return "closed"

    reader = asyncio.create_task(read_one())
    await session.closing.wait()
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
