"""The upload endpoint's multipart/form-data body, parsed as it streams in.

`FormReader` is fed the body's chunks as they arrive (`feed`) and gives the parsed form at
`finish()`; `openai_api.read_upload_form` only moves bytes from the socket to it. Parsing is
python-multipart's streaming parser, which replaced aiohttp's `BodyPartReader`: that one parsed
every part's headers through the `email` package and cost ~1 ms of event-loop time per
11.6-s upload, which serialises across a burst of uploads (docs/benchmarks.md, session 6).

The `file` part is held in memory while it fits both `memory_bytes` (UPLOAD_MEMORY_BYTES) and
a `ByteBudget` shared by all uploads (UPLOAD_MEMORY_TOTAL_BYTES), and spilled to a file in
the data dir's tmp folder past that, so short clips never touch the disk; the spill is this
module's only I/O. Spill files of all uploads together hold at most a second `ByteBudget`
(UPLOAD_SPILL_TOTAL_BYTES). Text fields the endpoint does not read are dropped as they stream
by.

Errors, each raised as soon as it is detected: PayloadTooLarge once the body passes its byte
limit; QueueFull once the spill would pass the disk budget (retryable); StorageFailed where
the spill file cannot be made or written (a full or failing disk; retryable); InvalidRequest for an
unreadable Content-Type, a malformed body (no opening boundary within MAX_PREAMBLE_BYTES
included), more than MAX_FORM_PARTS parts, a nested multipart part, a second `file`, a file (a
part with a filename) under another field name, a kept text field over MAX_FIELD_BYTES or not
UTF-8, a body that ends before its closing boundary, and a body without a `file` part. After an
error, `discard()` frees what was kept (the caller's job, as for a finished form's audio:
`UploadAudio.discard`).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from livemeet.audio.decode import AudioSource
from livemeet.errors import InvalidRequest, PayloadTooLarge, QueueFull, StorageFailed
from livemeet.gateway.disk import make_private_dir

log = logging.getLogger(__name__)

MAX_FIELD_BYTES = 1 << 16  # bytes; longest non-file form field (prompt etc.)
MAX_FORM_PARTS = 64  # parts per body; OpenAI's form has a dozen fields at most
MAX_PREAMBLE_BYTES = 1 << 16  # bytes before the first boundary (RFC 2046 allows a preamble)
FILE_FIELD = "file"
SPILL_PREFIX = "upload-"  # spill file names: SPILL_PREFIX + 32 hex digits


def remove_spill_files(directory: Path) -> int:
    """Delete every spill file in `directory` (at start-up: those of a run that crashed; a data
    dir serves one server). Returns how many were removed."""
    removed = 0
    for path in directory.glob(f"{SPILL_PREFIX}*"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


class ByteBudget:
    """Bytes of upload files that may be held at once across requests: in memory (what does
    not fit is spilled to disk) or on disk (what does not fit is refused for now). Plain
    bookkeeping: `take` reserves, `give` returns."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, not {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.in_use = 0

    def take(self, num_bytes: int) -> bool:
        """Reserve `num_bytes` if they fit; False (nothing reserved) if not."""
        if self.in_use + num_bytes > self.limit_bytes:
            return False
        self.in_use += num_bytes
        return True

    def give(self, num_bytes: int) -> None:
        """Return `num_bytes` taken earlier (more than is in use is a bug: AssertionError)."""
        assert 0 <= num_bytes <= self.in_use, (num_bytes, self.in_use)
        self.in_use -= num_bytes


@dataclass
class UploadAudio:
    """The `file` part: its bytes (in memory) or the path of its spill file, until `discard()`.

    `num_bytes`: the part's size; `filename`: as the client named it ("audio" if it did not);
    `named`: whether it did (a part without a filename is a form's text field: curl's
    `-F file=PATH`, the `@` forgotten). Bytes in memory are reserved in `budget` until
    `discard()`.
    """

    source: AudioSource
    filename: str
    num_bytes: int
    budget: ByteBudget
    disk_budget: ByteBudget
    disk_bytes: int = 0  # of a spill file: reserved in `disk_budget` until `discard()`
    named: bool = True

    def discard(self) -> None:
        """Free the audio: drop the bytes (and their share of the budget), delete the spill
        file (and its share of the disk budget). Idempotent."""
        if isinstance(self.source, Path):
            self.source.unlink(missing_ok=True)
        else:
            self.budget.give(len(self.source))
        self.disk_budget.give(self.disk_bytes)
        self.source, self.disk_bytes = b"", 0


class _FileSink:
    """The `file` part's bytes: a bytearray while it fits both `memory_bytes` and `budget`,
    else a file under `directory` (created at the first spill) with everything written so far."""

    def __init__(
        self, directory: Path, memory_bytes: int, budget: ByteBudget, disk_budget: ByteBudget
    ) -> None:
        self.directory = directory
        self.memory_bytes = memory_bytes
        self.budget = budget
        self.disk_budget = disk_budget
        self.disk_bytes = 0  # written to the spill file, reserved in `disk_budget`
        self.num_bytes = 0
        self._buffer = bytearray()  # reserved in the budget, byte for byte
        self._path: Path | None = None
        self._file: BinaryIO | None = None

    def write(self, data: bytes | memoryview) -> None:
        """Keep `data`. Raises QueueFull (the disk budget), StorageFailed (the spill file)."""
        self.num_bytes += len(data)
        if self._file is None:
            if self.num_bytes <= self.memory_bytes and self.budget.take(len(data)):
                self._buffer += data
                return
            self._spill()
        assert self._file is not None
        self._take_disk(len(data))
        with _storing():
            self._file.write(data)

    def _take_disk(self, num_bytes: int) -> None:
        """Reserve `num_bytes` of spill; QueueFull when all uploads together hold the limit
        (gzip bodies made 3 GB of spill files from 3 MB on the wire: a trial)."""
        if not self.disk_budget.take(num_bytes):
            raise QueueFull(
                f"uploads in progress hold {self.disk_budget.in_use >> 20} MiB on disk, "
                "the server's limit; retry later"
            )
        self.disk_bytes += num_bytes

    def _spill(self) -> None:
        self._take_disk(len(self._buffer))
        with _storing():
            make_private_dir(self.directory)
            self._path = self.directory / f"{SPILL_PREFIX}{uuid.uuid4().hex}"
            self._file = self._path.open("wb")
            self._file.write(self._buffer)
        self._release_buffer()

    def _release_buffer(self) -> None:
        self.budget.give(len(self._buffer))
        self._buffer = bytearray()

    def close(self) -> AudioSource:
        """The bytes written (their reservation passes to the caller's UploadAudio), or the
        closed spill file's path."""
        if self._file is None:
            data = bytes(self._buffer)  # a copy: AudioSource is bytes; the buffer goes now
            self._buffer = bytearray()
            return data
        with _storing():
            self._file.close()  # flushes: a full disk may say so only now
        assert self._path is not None
        return self._path

    def discard(self) -> None:
        self._release_buffer()
        if self._file is not None:
            # a failed write left bytes buffered, which the close fails to write again: its
            # OSError replaced the upload's storage_failed with a 500
            with contextlib.suppress(OSError):
                self._file.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self.disk_budget.give(self.disk_bytes)
        self.disk_bytes = 0


@dataclass
class _Part:
    """The part being read: its headers (lower-case names), then where its bytes go."""

    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str = ""
    sink: _FileSink | None = None  # the `file` part
    text: bytearray | None = None  # any other part


class FormReader:
    """Streams one multipart/form-data body (module docstring).

    `content_type`: the request's Content-Type header value (it carries the boundary);
    `max_body_bytes`: the whole body's limit; `spill_dir`, `memory_bytes`, `budget`: where the
    `file` part goes once it passes `memory_bytes` or the shared in-memory budget;
    `disk_budget`: the spill bytes all uploads may hold (QueueFull past it); `keep_fields`:
    the text fields to keep (others are read and dropped, as OpenAI tolerates unknown fields).
    Raises InvalidRequest for a Content-Type without a usable multipart boundary.
    """

    def __init__(
        self,
        content_type: str,
        *,
        max_body_bytes: int,
        spill_dir: Path,
        memory_bytes: int,
        budget: ByteBudget,
        disk_budget: ByteBudget,
        keep_fields: frozenset[str],
    ) -> None:
        try:
            kind, params = parse_options_header(content_type)
        except (UnicodeError, ValueError):  # non-latin-1 text in the header
            raise InvalidRequest("unreadable Content-Type header") from None
        boundary = params.get(b"boundary", b"")
        if not kind.lower().startswith(b"multipart/") or not boundary:
            raise InvalidRequest(
                "expected a multipart/form-data body with a 'file' field", param=FILE_FIELD
            )
        self.max_body_bytes = max_body_bytes
        self.spill_dir = spill_dir
        self.memory_bytes = memory_bytes
        self.budget = budget
        self.disk_budget = disk_budget
        self.keep_fields = keep_fields
        self.fields: dict[str, str] = {}
        self._files_elsewhere: list[str] = []  # names of file parts the endpoint does not read
        self._delimiter = b"--" + boundary
        self._preamble: bytearray | None = bytearray()  # None once the first boundary is found
        self._received = 0
        self._num_parts = 0
        self._ended = False
        self._part: _Part | None = None
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._file: UploadAudio | None = None
        callbacks = {
            "on_part_begin": self._on_part_begin,
            "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value,
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
            "on_end": self._on_end,
        }
        try:
            self._parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
        except FormParserError as exc:
            raise InvalidRequest(f"bad multipart boundary: {exc}") from None

    def feed(self, chunk: bytes) -> None:
        """Parse the next bytes of the body."""
        self._received += len(chunk)
        if self._received > self.max_body_bytes:
            raise PayloadTooLarge(
                f"upload exceeds the limit of {self.max_body_bytes} bytes", param="file"
            )
        if self._preamble is not None:
            chunk = self._skip_preamble(chunk)
            if not chunk:
                return
        try:
            self._parser.write(chunk)
        except FormParserError as exc:
            raise InvalidRequest(f"malformed multipart body: {exc}") from None

    def _skip_preamble(self, chunk: bytes) -> bytes:
        """Text before the first delimiter line (RFC 2046 5.1.1) is dropped; the parser wants
        the body to open with it. Returns what to parse: b"" until the delimiter is found."""
        assert self._preamble is not None
        self._preamble += chunk
        buf = self._preamble
        if buf.startswith(self._delimiter):
            at = 0
        else:
            at = buf.find(b"\n" + self._delimiter) + 1  # the line after it; 0: not found
            if at == 0:
                if len(buf) > MAX_PREAMBLE_BYTES:
                    raise InvalidRequest("malformed multipart body: no opening boundary")
                return b""
        self._preamble = None
        return bytes(buf[at:])

    def finish(self) -> UploadAudio:
        """After the last chunk: the `file` part (the kept text fields are in `fields`)."""
        if self._preamble is not None:
            raise InvalidRequest("malformed multipart body: no opening boundary")
        if not self._ended:
            raise InvalidRequest("the multipart body ended before its closing boundary")
        if self._file is None:
            if self._files_elsewhere:  # say where the audio belongs
                raise InvalidRequest(
                    "the audio goes in the 'file' field; got a file in "
                    + ", ".join(repr(name) for name in self._files_elsewhere),
                    param=FILE_FIELD,
                )
            seen = ", ".join(repr(name) for name in self.fields) or "none"
            raise InvalidRequest(
                f"the multipart body has no 'file' field (fields: {seen})", param=FILE_FIELD
            )
        return self._file

    def discard(self) -> None:
        """Free the `file` part, finished or not (after an error)."""
        if self._part is not None and self._part.sink is not None:  # cut off mid-file
            self._part.sink.discard()
        if self._file is not None:
            self._file.discard()

    # -- parser callbacks ----------------------------------------------------------------------

    def _on_part_begin(self) -> None:
        self._num_parts += 1
        if self._num_parts > MAX_FORM_PARTS:
            raise InvalidRequest(f"the multipart body has more than {MAX_FORM_PARTS} parts")
        self._part = _Part()

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        assert self._part is not None
        name = bytes(self._header_name).strip().lower()
        self._part.headers[name] = bytes(self._header_value).strip()
        self._header_name.clear()
        self._header_value.clear()

    def _on_headers_finished(self) -> None:
        part = self._part
        assert part is not None
        kind, _ = parse_options_header(part.headers.get(b"content-type"))
        if kind.lower().startswith(b"multipart/"):
            raise InvalidRequest("nested multipart bodies are not supported")
        _, params = parse_options_header(part.headers.get(b"content-disposition"))
        part.name = _header_text(params.get(b"name", b""))
        if part.name != FILE_FIELD:
            if b"filename" in params and part.name in self.keep_fields:
                # a text field the endpoint reads, sent as a file: that field is at fault
                raise InvalidRequest(
                    f"{part.name!r} is a text field; got a file in it", param=part.name
                )
            if b"filename" in params:
                # a file under a name the endpoint does not read is dropped as that field's
                # text is (OpenAI tolerates extra fields; a trial's file in
                # `timestamp_granularities[]` was refused), and named if no `file` comes
                self._files_elsewhere.append(part.name)
            if part.name in self.fields:
                # two values of a field the endpoint reads: which one the client meant is not
                # the server's guess (the last one was taken), as for a second `file`
                raise InvalidRequest(f"more than one {part.name!r} field", param=part.name)
            part.text = bytearray() if part.name in self.keep_fields else None
            return
        if self._file is not None:
            raise InvalidRequest("more than one 'file' field", param=FILE_FIELD)
        part.sink = _FileSink(self.spill_dir, self.memory_bytes, self.budget, self.disk_budget)
        filename = _header_text(params.get(b"filename", b"")) or "audio"
        named = b"filename" in params
        self._file = UploadAudio(b"", filename, 0, self.budget, self.disk_budget, named=named)

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self._part
        assert part is not None
        if part.sink is not None:
            part.sink.write(memoryview(data)[start:end])
            return
        if part.text is None:
            return  # a field the endpoint does not read
        part.text += memoryview(data)[start:end]
        if len(part.text) > MAX_FIELD_BYTES:
            raise InvalidRequest(
                f"form field {part.name!r} exceeds {MAX_FIELD_BYTES} bytes", param=part.name
            )

    def _on_part_end(self) -> None:
        part = self._part
        assert part is not None
        if part.sink is not None:
            assert self._file is not None
            self._file.source = part.sink.close()
            self._file.num_bytes = part.sink.num_bytes
            self._file.disk_bytes = part.sink.disk_bytes  # the reservation passes on
        self._part = None  # after close(): until then discard() frees the sink
        if part.text is None:
            return
        try:
            self.fields[part.name] = part.text.decode()
        except UnicodeDecodeError:
            raise InvalidRequest(
                f"form field {part.name!r} is not UTF-8 text", param=part.name
            ) from None

    def _on_end(self) -> None:
        self._ended = True


@contextlib.contextmanager
def _storing() -> Iterator[None]:
    """The spill file's OSErrors (a full, read-only or failing disk, a data dir changed under
    the server) as StorageFailed: they were 500 internal_errors with a traceback. The message
    names no path (it goes to the client)."""
    try:
        yield
    except OSError as exc:
        log.warning("an upload's spill file failed: %s", exc)
        reason = exc.strerror or type(exc).__name__
        raise StorageFailed(
            f"the server could not store the upload's audio ({reason}); retry later"
        ) from exc


def _header_text(value: bytes) -> str:
    """A header parameter as text: python-multipart passes the header bytes through latin-1;
    browsers send UTF-8 there, so decode them as such when they are."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")
