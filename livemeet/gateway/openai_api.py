"""OpenAI-compatible upload API: `POST /v1/audio/transcriptions`, `GET /v1/models`,
`GET /v1/transcriptions/{id}`.

Request and response shapes follow OpenAI's audio transcription API (multipart form; JSON,
text, verbose_json, srt, vtt, diarized_json bodies; SSE events `transcript.text.delta`,
`transcript.text.segment`, `transcript.text.done`; `usage: {type: "duration", seconds}` in
JSON bodies), so the official `openai` client works unchanged. The transcription id of each
upload is returned in the `X-Livemeet-Transcription-Id` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import Histogram

from livemeet.audio import decode
from livemeet.audio.constants import (
    HEAP_TRIM_AFTER_AUDIO_S,
    MAX_LANGUAGE_CHARS,
    MAX_PROMPT_CHARS,
    SAMPLE_RATE,
    UPLOAD_MEMORY_BYTES,
)
from livemeet.config import ServerConfig
from livemeet.errors import (
    BadAudio,
    ClientTimeout,
    EngineUnavailable,
    InvalidRequest,
    LivemeetError,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    TooLong,
    error_for_code,
)
from livemeet.gateway.auth_http import key_note
from livemeet.gateway.drain import UploadCutoff, shutting_down
from livemeet.gateway.errors_http import error_body
from livemeet.gateway.heap import trim_heap
from livemeet.gateway.keys import (
    CONFIG_KEY,
    DISK_KEY,
    LIFECYCLE_KEY,
    METRICS_KEY,
    STORE_KEY,
    TRANSCRIBER_KEY,
    tmp_dir,
)
from livemeet.gateway.origin_http import check_browser_origin
from livemeet.gateway.sse import DeltaFlusher, TextTracker, encode_event
from livemeet.gateway.transcript_store import new_transcription_id
from livemeet.gateway.upload_form import FormReader, UploadAudio
from livemeet.transcriber import (
    Error,
    Event,
    RestartingTranscriber,
    SegmentFinal,
    SessionOptions,
    SlottedTranscriber,
    TextDelta,
    Transcriber,
    TranscriberSession,
    TranscriptFinal,
)
from livemeet.transcript import formats
from livemeet.transcript.formats import ResponseFormat
from livemeet.transcript.language import check_language, reported_language
from livemeet.transcript.segments import FinishReason, Segment, Transcript

log = logging.getLogger(__name__)

ID_HEADER = "X-Livemeet-Transcription-Id"
# the form fields the endpoint reads besides `file` (`temperature` is checked, not used: the
# decoding is greedy); others (include[], timestamp_granularities[], ...) are accepted and
# dropped, as OpenAI's API tolerates them
FORM_FIELDS = frozenset({"model", "response_format", "prompt", "language", "stream", "temperature"})
# OpenAI's documented range of the sampling temperature (audio transcription API reference)
MAX_TEMPERATURE = 1.0
# formats whose content the SSE events carry (text deltas, speaker segments); the others
# (srt, vtt, verbose_json) are refused with stream=true
STREAM_FORMATS = frozenset({ResponseFormat.JSON, ResponseFormat.TEXT, ResponseFormat.DIARIZED_JSON})
# the Content-Encodings aiohttp's parser inflates (aiohttp/http_parser.py, lower-cased, one
# coding alone); it passes a body of any other on as it came
INFLATED_CODINGS = frozenset({"gzip", "deflate", "br", "zstd"})


@dataclass(frozen=True)
class UploadForm:
    """A parsed multipart upload's fields; its audio is the `UploadAudio` beside it."""

    model: str | None
    response_format: ResponseFormat
    prompt: str | None
    language: str | None
    stream: bool


def _served_model(request: web.Request) -> dict[str, object]:
    info = request.app[TRANSCRIBER_KEY].info
    return {
        "id": info.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "livemeet",
        "backend": info.name,
        "demo": info.demo,
    }


async def list_models(request: web.Request) -> web.Response:
    """`GET /v1/models`: the one model served, as OpenAI's list-models response
    (`{"object": "list", "data": [model]}`; docs/protocol.md, Other endpoints)."""
    return web.json_response({"object": "list", "data": [_served_model(request)]})


async def retrieve_model(request: web.Request) -> web.Response:
    """`GET /v1/models/{model}` (the openai client's `models.retrieve`). Raises NotFound for
    a model other than the one served."""
    model = _served_model(request)
    if request.match_info["model"] != model["id"]:
        raise NotFound(f"model {request.match_info['model']!r} is not served here")
    return web.json_response(model)


async def get_transcription(request: web.Request) -> web.Response:
    """`GET /v1/transcriptions/{id}?response_format=...`: a finished upload's transcript,
    rendered by the upload's writers (json when absent or empty). Raises NotFound for an unknown,
    malformed or unfinished id, InvalidRequest for an unknown response_format."""
    transcript = await request.app[STORE_KEY].get(request.match_info["id"])
    # empty as absent, as the upload form's field is
    fmt = formats.parse_response_format(request.query.get("response_format") or "json")
    return _render(transcript, fmt, transcript.language)


def _not_ready(transcriber: Transcriber) -> EngineUnavailable:
    """The refusal of an upload while the backend is not ready: its
    Retry-After is the time until the engine's next restart attempt where one is under way
    (up to ENGINE_RESTART_MAX_DELAY_S), else the default 1 s."""
    retry_after_s = None
    if isinstance(transcriber, RestartingTranscriber):
        retry_after_s = transcriber.restart_in_s
    return EngineUnavailable("the model is not ready; retry shortly", retry_after_s=retry_after_s)


def check_upload_origin(request: web.Request) -> None:
    """Refuse an upload from a browser page of another origin than the server's own or an
    `--allowed-origin` (RequestRejected, 400), as a live socket's is refused: a form on any
    site could post a file to a server that asks for no key (a plain multipart POST needs no
    CORS preflight), and the server transcribed it, for nobody to read (a security
    review). Clients that are not browsers send no Origin and are not checked."""
    check_browser_origin(request, "upload")


async def create_transcription(request: web.Request) -> web.StreamResponse:
    """The upload endpoint. Raises LivemeetError subclasses, rendered by the error middleware.

    From its accept until its engine session is open, the upload counts as incoming
    (livemeet.gateway.incoming); from then on the backend counts it until it is queued, so it
    is never counted on both sides. Released on every error path too. Once a shutdown began,
    it has `--upload-drain-s` to finish (gateway/drain.py), else EngineUnavailable."""
    app = request.app
    check_upload_origin(request)
    check_admission(app)
    lifecycle = app[LIFECYCLE_KEY]
    lifecycle.num_uploads_in_flight += 1
    try:
        return await _create_transcription(request)
    finally:
        lifecycle.num_uploads_in_flight -= 1


async def _create_transcription(request: web.Request) -> web.StreamResponse:
    app = request.app
    started = time.monotonic()
    phases = _PhaseClock(app[METRICS_KEY].upload_phase_s, started)
    # a shutdown's upload drain cuts the long waits: the body, the decode, the transcript
    cutoff = app[LIFECYCLE_KEY].upload_cutoff
    with app[LIFECYCLE_KEY].incoming_uploads.track() as incoming:
        async with cutoff.bound():
            form, audio = await read_upload_form(request, app[CONFIG_KEY])
        phases.done("receive")
        try:
            info = app[TRANSCRIBER_KEY].info
            check_language(form.language, info.language_code, info.name)
            async with cutoff.bound():
                decoded = await _decode_upload(app, audio.source)
        except (BadAudio, TooLong) as exc:
            exc.param = exc.param or "file"  # the part at fault, for OpenAI's error body
            if isinstance(exc, BadAudio) and not audio.named:
                # `curl -F file=meeting.wav` (no @) sends the path as text: "not an audio
                # file" alone sent a new user to look at a file that was fine (a trial)
                exc.message += (
                    " (the 'file' field came without a filename, as a form's text field does: "
                    "curl sends a file with -F file=@PATH)"
                )
            raise
        finally:
            audio.discard()
        phases.done("decode")
        samples = decoded.samples
        duration_s = len(samples) / SAMPLE_RATE
        options = SessionOptions(live=False, prompt=form.prompt, language=form.language)
        session = await app[TRANSCRIBER_KEY].open_session(options)
        if (cut := decoded.info.cut_note) is not None:
            # accepted as it is (docs/protocol.md), but nothing in the response says so
            log.warning("upload %s: %s%s", session.id, cut, key_note(request))
        # counted once taken: a refused upload's audio is not audio in (a client's retries
        # would count it again)
        app[METRICS_KEY].audio_received_seconds.labels("upload").inc(duration_s)
        # the backend counts its open, unqueued uploads itself from here on; the lower count
        # goes out ahead of the next command (append), so no upload is counted on both sides
        incoming.release()
        sessions = app[METRICS_KEY].sessions.labels("upload", "transcribing")
        sessions.inc()
        outcome = "disconnected"  # the client left: the handler is cancelled
        # named up front, so the end's log line gives the id its transcript is stored under
        transcription_id = new_transcription_id()
        try:
            await session.append(samples)
            del samples
            await session.end()
            response, outcome = await _transcribe(request, session, form, phases, transcription_id)
            app[METRICS_KEY].upload_latency_s.observe(time.monotonic() - started)
            return response
        except LivemeetError as exc:
            outcome = exc.code
            raise
        except ConnectionError:  # a write to a client that left (a stream it stopped reading)
            raise
        except Exception:
            outcome = "internal_error"
            raise
        finally:
            sessions.dec()
            app[METRICS_KEY].sessions_ended.labels("upload", outcome).inc()
            await session.abort()  # idempotent; frees the backend session on every path
            stored = f"transcription {transcription_id}" if outcome == "completed" else None
            log.info(
                "upload %s ended: %s, %.1f s of audio in %.2f s (%s%s)",
                session.id,
                outcome,
                duration_s,
                time.monotonic() - started,
                stored or "no transcript stored",
                key_note(request),
            )


def check_admission(app: web.Application) -> None:
    """Refuse an upload the server cannot take now, before any of its body is read (also from
    `Expect: 100-continue`): EngineUnavailable while the backend is not ready or the server
    drains, StorageFailed while the data dir is short of disk (an upload spills to it and
    stores its transcript there), QueueFull while every session slot is in use or held for an
    upload already on its way (`SlottedTranscriber`; held against other uploads only: a live
    `start` meanwhile may take it, and the upload then gets its 429 at its open). A full
    server used to answer 429 only after receiving and decoding the whole file, which a
    client's retries then sent again."""
    transcriber = app[TRANSCRIBER_KEY]
    if app[LIFECYCLE_KEY].draining:
        raise shutting_down("the server is shutting down; send the upload again once it is back")
    if not transcriber.ready:
        raise _not_ready(transcriber)
    app[DISK_KEY].check("uploads")
    if isinstance(transcriber, SlottedTranscriber):
        incoming = app[LIFECYCLE_KEY].incoming_uploads.count
        if transcriber.free_slots <= incoming:
            held = f", {incoming} of them held for uploads on their way" if incoming else ""
            raise QueueFull(
                f"every session slot (--max-sessions {app[CONFIG_KEY].gateway.max_sessions}) "
                f"is in use{held}; retry later"
            )


async def _transcribe(
    request: web.Request,
    session: TranscriberSession,
    form: UploadForm,
    phases: _PhaseClock,
    transcription_id: str,
) -> tuple[web.StreamResponse, str]:
    """The ended session's transcript as the response (SSE, or a body in the form's format),
    stored under `transcription_id`, and the session's outcome: "completed", or the code of
    the error an SSE stream ended with (other errors raise)."""
    if form.stream:
        response, outcome = await _stream_sse(request, session, form, transcription_id)
        phases.done("transcribe", last=True)
        return response, outcome
    async with request.app[LIFECYCLE_KEY].upload_cutoff.bound():
        final = await _collect_final(session)
    phases.done("transcribe")
    language = _language(request, form)
    transcript = _to_transcript(final, language)
    await request.app[STORE_KEY].put(transcription_id, transcript)
    rendered = _render(transcript, form.response_format, language)
    rendered.headers[ID_HEADER] = transcription_id
    phases.done("respond", last=True)
    return rendered, "completed"


class _PhaseClock:
    """Observes the time since the previous phase ended into `histogram` (seconds, labelled by
    phase) and logs the request's phases at DEBUG when it responds: where an upload's latency
    goes (livemeet_upload_phase_seconds)."""

    def __init__(self, histogram: Histogram, started_s: float) -> None:
        self.histogram = histogram
        self.last_s = started_s
        self.spent: list[str] = []

    def done(self, phase: str, *, last: bool = False) -> None:
        now = time.monotonic()
        self.histogram.labels(phase).observe(now - self.last_s)
        self.spent.append(f"{phase} {1e3 * (now - self.last_s):.1f} ms")
        self.last_s = now
        if last and log.isEnabledFor(logging.DEBUG):
            log.debug("upload phases: %s", ", ".join(self.spent))


def check_content_encoding(request: web.Request) -> None:
    """Raise InvalidRequest unless the body's Content-Encoding is one aiohttp's parser inflates
    (`INFLATED_CODINGS`; br and zstd only where their packages are installed, else the parser
    refuses them: http_protocol.refusal_error) or identity. The parser passes a body of any
    other coding (x-gzip, compress, stacked codings such as `gzip, gzip`) on as it came, which
    was then read as multipart; refused before any of the body is read (also from
    `Expect: 100-continue`)."""
    coding = ", ".join(request.headers.getall(hdrs.CONTENT_ENCODING, ())).strip()
    if coding.lower() in INFLATED_CODINGS | {"", "identity"}:
        return
    raise InvalidRequest(
        f"the body's Content-Encoding {coding!r} is not one the server decodes: "
        "send the body as it is, or gzip or deflate it"
    )


def check_declared_size(request: web.Request, limit: int) -> None:
    """Raise PayloadTooLarge when the request's Content-Length (bytes) passes `limit` (bytes):
    refused before any of the body is read (also from `Expect: 100-continue`)."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"body of {request.content_length} bytes exceeds {limit} bytes", param="file"
        )


async def read_upload_form(
    request: web.Request, config: ServerConfig
) -> tuple[UploadForm, UploadAudio]:
    """Stream the multipart body through a `FormReader` (livemeet.gateway.upload_form): the
    `file` part stays in memory up to UPLOAD_MEMORY_BYTES and spills to the data dir's tmp
    folder past that (the caller discards it).

    The byte limit is enforced up front from Content-Length and while reading (PayloadTooLarge
    as soon as it is passed). Raises InvalidRequest for a missing `file` or a bad field, and
    ClientTimeout when no body bytes arrive for the gateway's idle timeout (a stalled client
    would otherwise count as an incoming upload, which the engine's upload hold waits for).
    """
    limit = config.gateway.max_upload_bytes
    check_content_encoding(request)
    check_declared_size(request, limit)
    reader = FormReader(
        request.headers.get("Content-Type", ""),
        max_body_bytes=limit,
        spill_dir=tmp_dir(config),
        memory_bytes=UPLOAD_MEMORY_BYTES,
        budget=request.app[LIFECYCLE_KEY].upload_memory,
        disk_budget=request.app[LIFECYCLE_KEY].upload_disk,
        keep_fields=FORM_FIELDS,
    )
    idle_s = config.gateway.idle_timeout_s
    try:
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    chunk = await request.content.readany()
            except TimeoutError:
                raise ClientTimeout(f"no upload data for {idle_s:g} s") from None
            if not chunk:
                break
            reader.feed(chunk)
        audio = reader.finish()
        return _form_fields(reader.fields), audio
    except BaseException:
        reader.discard()
        raise


def _form_fields(fields: dict[str, str]) -> UploadForm:
    """The fields the endpoint reads (others are tolerated and ignored, as OpenAI does)."""
    prompt = _capped_field(fields, "prompt", MAX_PROMPT_CHARS)
    language = _capped_field(fields, "language", MAX_LANGUAGE_CHARS)
    response_format = formats.parse_response_format(fields.get("response_format") or "json")
    stream = _parse_bool(fields.get("stream", "false"), "stream")
    _check_temperature(fields.get("temperature") or "0")
    if stream and response_format not in STREAM_FORMATS:
        # the stream's events are JSON (text deltas, segments, done): a subtitle or verbose
        # body cannot be streamed, and silently sending something else misleads the client
        raise InvalidRequest(
            f"stream=true sends JSON events; response_format {response_format.value!r} cannot "
            "be streamed (use json, text or diarized_json, or stream=false)",
            param="response_format",
        )
    return UploadForm(
        model=fields.get("model") or None,
        response_format=response_format,
        prompt=prompt,
        language=language,
        stream=stream,
    )


def _capped_field(fields: dict[str, str], name: str, max_chars: int) -> str | None:
    """Form field `name` (None when absent or empty), capped at `max_chars` characters as in a
    live `start`. Raises InvalidRequest (param `name`) past the cap."""
    value = fields.get(name) or None
    if value is not None and len(value) > max_chars:
        raise InvalidRequest(f"'{name}' must be at most {max_chars} characters", param=name)
    return value


def _check_temperature(value: str) -> None:
    """Raise InvalidRequest (param "temperature") unless `value` is a number in 0 ..
    MAX_TEMPERATURE, as OpenAI's API checks it; the value itself is not used (greedy)."""
    try:
        temperature = float(value)
    except ValueError:
        temperature = math.nan
    if not 0.0 <= temperature <= MAX_TEMPERATURE:  # NaN fails both
        raise InvalidRequest(
            f"temperature must be a number from 0 to {MAX_TEMPERATURE:g}, not {value!r}",
            param="temperature",
        )


def _parse_bool(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0", ""):
        return False
    raise InvalidRequest(f"{name} must be true or false, not {value!r}", param=name)


async def _decode_upload(app: web.Application, source: decode.AudioSource) -> decode.Decoded:
    """Decode under the app's decode semaphore; a spilled (large) upload is probed first, so
    one that is too long is refused without waiting for a slot. An upload held in memory is
    small (UPLOAD_MEMORY_BYTES): `decode_file` checks its declared duration before decoding,
    which saves a thread hop per upload.

    Returns the samples ([n] float32 16 kHz) with the probe's AudioInfo. Raises BadAudio,
    TooLong.
    """
    max_audio_s = app[CONFIG_KEY].gateway.max_audio_s
    loop = asyncio.get_running_loop()
    if isinstance(source, Path):
        info = await loop.run_in_executor(None, decode.probe, source)
        decode.check_length(info.duration_s, max_audio_s, info.length_verb)
    cancel = threading.Event()
    async with app[LIFECYCLE_KEY].decode_slots:
        work = loop.run_in_executor(None, partial(_decode_then_trim, source, max_audio_s, cancel))
        try:
            decoded = await asyncio.shield(work)
        except asyncio.CancelledError:
            # the client left: stop the thread, and hold the slot until it has stopped (it
            # checks `cancel` every block), or abandoned decodes would run past the slots
            cancel.set()
            await _settle(work)
            raise
    if len(decoded.samples) == 0:
        raise BadAudio("the audio has no samples")
    return decoded


def _decode_then_trim(
    source: decode.AudioSource, max_audio_s: float, cancel: threading.Event
) -> decode.Decoded:
    """`decode_file_with_info` on an executor thread, then `trim_heap` on the same thread after
    a long decode (HEAP_TRIM_AFTER_AUDIO_S) or a failed one, which may have decoded much before
    it failed: the thread's arena would otherwise keep the decode's pages (gateway/heap.py)."""
    try:
        decoded = decode.decode_file_with_info(source, max_audio_s=max_audio_s, cancel=cancel)
    except BaseException:
        trim_heap()
        raise
    if decoded.samples.size >= HEAP_TRIM_AFTER_AUDIO_S * SAMPLE_RATE:
        trim_heap()
    return decoded


async def _settle(work: asyncio.Future[Any]) -> None:
    """Wait for `work` to end, whatever it ends with, through any further cancellation."""
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            continue  # cancelled again while waiting: the thread still holds the slot
        except Exception:
            break  # DecodeCancelled, or any error: the caller is leaving anyway
    if not work.cancelled():
        work.exception()  # retrieved, so asyncio does not log it as never retrieved


async def _collect_final(session: TranscriberSession) -> TranscriptFinal:
    async for event in session.events():
        if isinstance(event, TranscriptFinal):
            return event
        if isinstance(event, Error):
            raise error_for_code(event.code, event.message)
    raise EngineUnavailable("the backend session ended without a transcript")


def _language(request: web.Request, form: UploadForm) -> str | None:
    return reported_language(form.language, request.app[TRANSCRIBER_KEY].info.language)


def _to_transcript(final: TranscriptFinal, language: str | None) -> Transcript:
    """The upload's transcript; a decode that did not end at the model's own stop (its output
    budget ran out, or the repetition guard cut a loop) is logged as a warning, since the
    OpenAI response has no field to say so and its transcript may stop short of the audio."""
    if final.finish_reason is not FinishReason.STOP:
        log.warning(
            "upload transcript cut short: finish_reason %s, %d segments covering %.0f%% of %.1f s",
            final.finish_reason.value,
            len(final.segments),
            100 * final.coverage,
            final.duration_s,
        )
    return Transcript(final.segments, final.duration_s, final.finish_reason, language)


def _render(transcript: Transcript, fmt: ResponseFormat, language: str | None) -> web.Response:
    body, content_type = formats.render(transcript, fmt, language=language)
    return web.Response(text=body, content_type=content_type, charset="utf-8")


async def _stream_sse(
    request: web.Request, session: TranscriberSession, form: UploadForm, transcription_id: str
) -> tuple[web.StreamResponse, str]:
    """Send the session's events as SSE; store the transcript when it is complete. Returns
    the response and the outcome ("completed", or the code of the error event it ended
    with)."""
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            ID_HEADER: transcription_id,
        }
    )
    await response.prepare(request)
    flusher = DeltaFlusher(request.app[CONFIG_KEY].gateway.flush_interval_s)
    outcome = "completed"
    # a shutdown's upload drain cuts the wait for the transcript: its error event ends the stream
    events = _timed_events(session, flusher, request.app[LIFECYCLE_KEY].upload_cutoff)
    try:
        async with contextlib.aclosing(events) as items:
            await _write_stream(request, response, items, flusher, form, transcription_id)
    except LivemeetError as exc:
        request.app[METRICS_KEY].errors.labels(exc.code).inc()
        await response.write(encode_event(error_body(exc)))
        outcome = exc.code
    await response.write_eof()
    return response, outcome


async def _write_stream(
    request: web.Request,
    response: web.StreamResponse,
    items: AsyncIterator[Event | None],
    flusher: DeltaFlusher,
    form: UploadForm,
    transcription_id: str,
) -> None:
    tracker = TextTracker()
    num_segments_sent = 0
    async for item in items:
        now = time.monotonic()
        if item is None:  # the flush timer fired
            await _send_delta(response, flusher.poll(now))
        elif isinstance(item, TextDelta):
            await _send_delta(response, flusher.push(tracker.on_backend_delta(item.text), now))
        elif isinstance(item, SegmentFinal):
            # what the push hands back (held text overdue by now) goes too, then the rest
            held = flusher.push(tracker.on_final_segment(item.segment.text), now)
            await _send_delta(response, held + flusher.finish())
            await response.write(encode_event(_segment_event(item.segment)))
            num_segments_sent += 1
        elif isinstance(item, TranscriptFinal):
            transcript = _to_transcript(item, _language(request, form))
            held = flusher.push(tracker.final_tail(transcript.text), now)
            await _send_delta(response, held + flusher.finish())
            # Backends that commit only at the end send no SegmentFinal: send the rest here.
            for segment in item.segments[num_segments_sent:]:
                await response.write(encode_event(_segment_event(segment)))
            await request.app[STORE_KEY].put(transcription_id, transcript)
            # OpenAI's done event carries token usage only (its `usage` has no duration
            # variant: the SDK built a broken object from ours); the audio's duration goes in
            # a field of livemeet's own
            done = {
                "type": "transcript.text.done",
                "text": transcript.text,
                "duration": round(transcript.duration_s, 3),  # as the JSON bodies give it
            }
            await response.write(encode_event(done))
            break
        elif isinstance(item, Error):
            raise error_for_code(item.code, item.message)
    else:
        raise EngineUnavailable("the backend session ended without a transcript")


async def _send_delta(response: web.StreamResponse, text: str) -> None:
    if text:
        await response.write(encode_event({"type": "transcript.text.delta", "delta": text}))


def _segment_event(segment: Segment) -> dict[str, object]:
    """The segment as every wire carries it (Segment.to_wire, flags included where it has
    any: a streamed segment dropped the `end_clamped` that diarized_json kept, a trial)."""
    return {"type": "transcript.text.segment", **segment.to_wire()}


async def _timed_events(
    session: TranscriberSession, flusher: DeltaFlusher, cutoff: UploadCutoff
) -> AsyncGenerator[Event | None, None]:
    """The session's events, with None yielded whenever held text is due to be flushed.
    Raises EngineUnavailable where `cutoff` (a shutdown's upload drain) passes while an event
    is awaited, and only then: a stream whose transcript came is not cut while it is written
    out or closed (bounded whole, it sent an error event after `transcript.text.done`)."""
    queue: asyncio.Queue[Event | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for event in session.events():
                queue.put_nowait(event)
        finally:
            queue.put_nowait(None)

    task = asyncio.create_task(pump())
    try:
        while True:
            due = flusher.due_in(time.monotonic())
            try:
                async with cutoff.bound():
                    event = await asyncio.wait_for(queue.get(), timeout=due)
            except TimeoutError:
                yield None
                continue
            if event is None:
                await task  # re-raises a failure of the event stream
                return
            yield event
    finally:
        task.cancel()
        # not `await task` under suppress(CancelledError): that swallowed a cancel of this
        # task too (its client left, the shutdown's) where it came during the pump's close
        await asyncio.wait({task})
        if not task.cancelled():
            task.result()  # a failure of the event stream
