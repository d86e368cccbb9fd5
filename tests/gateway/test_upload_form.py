"""livemeet.gateway.upload_form: the streaming multipart reader, fed bytes directly."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from livemeet.errors import InvalidRequest, PayloadTooLarge, QueueFull, StorageFailed
from livemeet.gateway.upload_form import (
    MAX_FIELD_BYTES,
    MAX_FORM_PARTS,
    ByteBudget,
    FormReader,
)

BOUNDARY = "b0undary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def part(name: str, value: bytes, headers: str = "") -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"{headers}\r\n\r\n'.encode()
        + value
        + b"\r\n"
    )


def body(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


KEEP = frozenset({"model", "prompt", "response_format"})


def reader(
    tmp_path: Path,
    *,
    memory_bytes: int = 1 << 20,
    limit: int = 1 << 24,
    budget: ByteBudget | None = None,
    disk_budget: ByteBudget | None = None,
    content_type: str = CONTENT_TYPE,
) -> FormReader:
    return FormReader(
        content_type,
        max_body_bytes=limit,
        spill_dir=tmp_path / "tmp",
        memory_bytes=memory_bytes,
        budget=budget or ByteBudget(1 << 30),
        disk_budget=disk_budget or ByteBudget(1 << 30),
        keep_fields=KEEP,
    )


def feed(r: FormReader, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        r.feed(data[i : i + step])


AUDIO = bytes(range(256)) * 300  # 76.8 kB with every byte value, "\r\n--" included


@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 20])
def test_any_chunking_gives_the_same_form(tmp_path: Path, step: int) -> None:
    data = body(
        part("model", b"moss"),
        part("file", AUDIO, '; filename="m\u00e9eting.wav"\r\nContent-Type: audio/wav'),
        part("prompt", "caf\u00e9 names".encode()),
        part("temperature", b"0.2"),  # not read by the endpoint: dropped
    )
    r = reader(tmp_path)
    feed(r, data, step)
    audio = r.finish()
    assert audio.source == AUDIO and audio.num_bytes == len(AUDIO)
    assert audio.filename == "m\u00e9eting.wav"
    assert r.fields == {"model": "moss", "prompt": "caf\u00e9 names"}
    assert not (tmp_path / "tmp").exists()  # held in memory: nothing touched the disk


def test_the_file_part_spills_to_disk_past_the_memory_limit(tmp_path: Path) -> None:
    r = reader(tmp_path, memory_bytes=1000)
    feed(r, body(part("file", AUDIO)), 333)
    audio = r.finish()
    assert isinstance(audio.source, Path) and audio.source.read_bytes() == AUDIO
    assert audio.filename == "audio"  # none given
    audio.discard()
    assert list((tmp_path / "tmp").iterdir()) == [] and audio.source == b""
    audio.discard()  # idempotent


def test_an_oversized_body_is_cut_while_streaming_and_its_spill_removed(tmp_path: Path) -> None:
    r = reader(tmp_path, memory_bytes=1000, limit=len(AUDIO) // 2)
    with pytest.raises(PayloadTooLarge):
        feed(r, body(part("file", AUDIO)), 4096)
    assert len(list((tmp_path / "tmp").iterdir())) == 1  # spilled before the limit was hit
    r.discard()
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (body(part("model", b"x")), r"no 'file' field \(fields: 'model'\)"),
        (
            body(part("audio", AUDIO, '; filename="a.wav"')),
            "goes in the 'file' field; got a file in 'audio'",
        ),
        (body(part("file", b"a"), part("file", b"b")), "more than one 'file'"),
        (body(part("file", b"a"), part("prompt", b"x" * (MAX_FIELD_BYTES + 1))), "exceeds"),
        (body(part("file", b"a"), part("prompt", b"\xff\xfe")), "not UTF-8"),
        (body(part("file", b"a", "\r\nContent-Type: multipart/mixed")), "nested multipart"),
        (body(part("file", AUDIO))[:-30], "ended before its closing boundary"),
        (b"--wrong\r\n\r\n", "no opening boundary"),
        (f"--{BOUNDARY}\r\nnot a header\r\n\r\n".encode(), "malformed multipart body"),
    ],
)
def test_bad_bodies_are_invalid_requests(tmp_path: Path, data: bytes, message: str) -> None:
    r = reader(tmp_path, memory_bytes=100)
    with pytest.raises(InvalidRequest, match=message):
        feed(r, data, 1000)
        r.finish()
    r.discard()
    assert not (tmp_path / "tmp").exists() or list((tmp_path / "tmp").iterdir()) == []


def test_a_field_the_endpoint_reads_sent_twice_is_refused_naming_it(tmp_path: Path) -> None:
    """`response_format=srt` then `response_format=json` was answered in JSON, the last value
    taken without a word (a probe of the protocol), while a second `file` is refused: which
    one the client meant is not the server's guess. A field the endpoint does not read may
    repeat (`timestamp_granularities[]`, an array in OpenAI's form)."""
    r = reader(tmp_path)
    data = body(
        part("file", b"a"),
        part("timestamp_granularities[]", b"word"),
        part("timestamp_granularities[]", b"segment"),
        part("response_format", b"srt"),
        part("response_format", b"json"),
    )
    with pytest.raises(InvalidRequest, match="more than one 'response_format' field") as caught:
        feed(r, data, 1000)
    assert caught.value.param == "response_format"
    r.discard()


@pytest.mark.parametrize(
    ("name", "param", "message"),
    [
        ("audio", "file", "the audio goes in the 'file' field; got a file in 'audio'"),
        # a field the endpoint reads, sent as a file: that field is at fault (a trial)
        ("prompt", "prompt", "'prompt' is a text field; got a file in it"),
    ],
)
def test_a_file_under_another_name_names_the_field_at_fault(
    tmp_path: Path, name: str, param: str, message: str
) -> None:
    r = reader(tmp_path)
    with pytest.raises(InvalidRequest, match=message) as caught:
        feed(r, body(part(name, b"x", '; filename="p.txt"')), 1000)
        r.finish()
    r.discard()
    assert caught.value.param == param


def test_a_file_in_a_field_the_endpoint_does_not_read_is_dropped(tmp_path: Path) -> None:
    """Beside the `file`, as a text field there would be (a trial: a file sent in
    `timestamp_granularities[]`, a field OpenAI's API tolerates, was a 400)."""
    r = reader(tmp_path)
    extra = part("timestamp_granularities[]", b"word", '; filename="g.txt"')
    feed(r, body(extra, part("file", AUDIO)), 1000)
    assert r.finish().num_bytes == len(AUDIO) and "timestamp_granularities[]" not in r.fields
    r.discard()


@pytest.mark.parametrize(
    "content_type", ["application/json", "multipart/form-data", "multipart/form-data; boundary="]
)
def test_a_content_type_without_a_boundary_is_refused(tmp_path: Path, content_type: str) -> None:
    with pytest.raises(InvalidRequest, match="multipart/form-data"):
        reader(tmp_path, content_type=content_type)


def test_a_content_type_that_is_not_latin_1_is_an_invalid_request(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="Content-Type"):
        reader(tmp_path, content_type=CONTENT_TYPE + "; x=\u20ac")


def test_media_type_case_and_a_preamble_are_accepted(tmp_path: Path) -> None:
    """RFC 2045: media types are case-insensitive; RFC 2046 5.1.1: text before the first
    delimiter line is a preamble to ignore (aiohttp's reader accepted both)."""
    r = reader(tmp_path, content_type=f"Multipart/Form-Data; boundary={BOUNDARY}")
    feed(r, b"This is a preamble.\r\n" + body(part("file", AUDIO)), 5)
    assert r.finish().source == AUDIO


def test_an_endless_preamble_is_refused(tmp_path: Path) -> None:
    r = reader(tmp_path)
    with pytest.raises(InvalidRequest, match="no opening boundary"):
        feed(r, b"x" * (1 << 17), 4096)


def test_fields_the_endpoint_does_not_read_are_dropped_and_parts_are_counted(
    tmp_path: Path,
) -> None:
    """An unknown field's bytes are not kept (a body of many 60 KB fields held them all), and
    the number of parts is capped."""
    r = reader(tmp_path)
    feed(r, body(*(part(f"x{i}", b"y" * 60_000) for i in range(20)), part("file", b"a")), 4096)
    assert r.fields == {} and r.finish().source == b"a"
    r = reader(tmp_path)
    with pytest.raises(InvalidRequest, match=f"more than {MAX_FORM_PARTS} parts"):
        feed(r, body(*(part("x", b"") for _ in range(MAX_FORM_PARTS + 1))), 4096)


def test_the_shared_memory_budget_spills_and_is_returned(tmp_path: Path) -> None:
    """Files share one in-memory budget: one that does not fit goes to disk; each file's
    share comes back when it is discarded, and after an error too."""
    budget = ByteBudget(len(AUDIO) + 100)
    first, second = reader(tmp_path, budget=budget), reader(tmp_path, budget=budget)
    feed(first, body(part("file", AUDIO)), 4096)
    feed(second, body(part("file", AUDIO)), 4096)
    a, b = first.finish(), second.finish()
    assert a.source == AUDIO and isinstance(b.source, Path) and b.source.read_bytes() == AUDIO
    assert budget.in_use == len(AUDIO)
    a.discard()
    b.discard()
    assert budget.in_use == 0 and list((tmp_path / "tmp").iterdir()) == []
    failed = reader(tmp_path, budget=budget, limit=len(AUDIO) // 2)
    with pytest.raises(PayloadTooLarge):
        feed(failed, body(part("file", AUDIO)), 4096)
    assert budget.in_use > 0
    failed.discard()
    assert budget.in_use == 0


def test_spill_files_of_all_uploads_share_a_disk_budget(tmp_path: Path) -> None:
    """A gzip body is counted inflated: three ~1 MB requests made 3 GB of spill files (a
    trial). Past the disk budget an upload gets queue_full (retry later); every reservation,
    finished or cut off, comes back when its upload is discarded."""
    disk = ByteBudget(len(AUDIO) + 100)
    small = ByteBudget(0)  # nothing stays in memory: every file spills

    def spilling() -> FormReader:
        return reader(tmp_path, budget=small, disk_budget=disk, memory_bytes=0)

    first = spilling()
    feed(first, body(part("file", AUDIO)), 4096)
    kept = first.finish()
    assert isinstance(kept.source, Path) and disk.in_use == len(AUDIO)
    refused = spilling()
    with pytest.raises(QueueFull, match="retry later"):
        feed(refused, body(part("file", AUDIO)), 4096)
    refused.discard()
    assert disk.in_use == len(AUDIO)
    kept.discard()
    assert disk.in_use == 0 and list((tmp_path / "tmp").iterdir()) == []
    again = spilling()  # room again
    feed(again, body(part("file", AUDIO)), 4096)
    again.finish().discard()
    assert disk.in_use == 0


def test_a_spill_file_that_cannot_be_written_is_storage_failed(tmp_path: Path) -> None:
    """A spill the disk refuses (here its directory is a file: as a full or read-only disk,
    an OSError) was a 500 internal_error; it is the server's storage, so storage_failed
    (507, retryable), naming no path, and discard() still gives back every reservation."""
    (tmp_path / "tmp").write_bytes(b"")  # where the spill directory should be
    budget, disk = ByteBudget(1 << 30), ByteBudget(1 << 30)
    r = reader(tmp_path, memory_bytes=1000, budget=budget, disk_budget=disk)
    with pytest.raises(StorageFailed) as failed:
        feed(r, body(part("file", AUDIO)), 4096)
    assert str(tmp_path) not in failed.value.message and failed.value.retryable
    r.discard()
    assert budget.in_use == 0 and disk.in_use == 0


@pytest.mark.parametrize("size", [100, len(AUDIO)])  # its close fails, or a write does
def test_a_spill_on_a_full_disk_is_storage_failed_and_discarded_without_a_second_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A spill file on a full disk (its writes go to /dev/full: ENOSPC, raised by a write or
    only by the close's flush). A write that failed leaves bytes in the file's buffer, and
    discard()'s close failed to flush them again: that OSError replaced storage_failed with
    a 500 internal_error (read_upload_form discards on any error; a trial's 8-MiB tmpfs)."""
    spill_dir = tmp_path / "tmp"
    real_open = Path.open

    def full_disk(path: Path, *args: Any, **kwargs: Any) -> Any:
        target = Path("/dev/full") if path.parent == spill_dir else path
        return real_open(target, *args, **kwargs)

    r = reader(tmp_path, memory_bytes=0)
    monkeypatch.setattr(Path, "open", full_disk)
    with pytest.raises(StorageFailed, match="No space left on device"):
        feed(r, body(part("file", AUDIO[:size])), 4096)
    r.discard()
    assert r.disk_budget.in_use == 0


def test_what_aiohttp_clients_send_parses(tmp_path: Path) -> None:
    """The body an aiohttp (or openai) client builds, with its own boundary and headers."""
    form = aiohttp.FormData()
    form.add_field("file", AUDIO, filename="a.wav", content_type="audio/wav")
    form.add_field("response_format", "srt")
    payload = form()

    class Sink:
        def __init__(self) -> None:
            self.data = bytearray()

        async def write(self, chunk: bytes) -> None:
            self.data += chunk

    sink = Sink()
    asyncio.run(payload.write(sink))  # type: ignore[arg-type]
    r = reader(tmp_path, content_type=payload.content_type)
    feed(r, bytes(sink.data), 65536)
    assert r.finish().source == AUDIO and r.fields == {"response_format": "srt"}
