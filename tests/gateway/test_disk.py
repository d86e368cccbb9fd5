"""The data directory's disk budget and retention (livemeet/gateway/disk.py): new sessions
refused before the disk is full, old transcripts swept."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from livemeet.config import GatewayConfig, ServerConfig
from livemeet.errors import StorageFailed
from livemeet.gateway import disk
from livemeet.gateway.app import create_app
from livemeet.gateway.disk import MIB, DiskGuard
from livemeet.gateway.keys import STORE_KEY
from livemeet.gateway.transcript_store import TranscriptStore, new_transcription_id
from livemeet.transcript.segments import FinishReason, Segment, Transcript
from tests.gateway.conftest import ClientFactory, wav_bytes
from tests.gateway.fakes import FakeTranscriber
from tests.gateway.test_openai_api import form
from tests.gateway.test_ws_live import START, wait_until

Usage = namedtuple("Usage", "total used free")


def test_the_guard_refuses_under_its_floor_and_looks_up_at_most_once_a_second() -> None:
    now, free, lookups = [0.0], [600 * MIB], []

    def usage(path: Path) -> int:
        lookups.append(path)
        return free[0]

    guard = DiskGuard(Path("/data"), 512 * MIB, clock=lambda: now[0], usage=usage)
    guard.check("live sessions")  # 600 MiB free: fine
    free[0] = 100 * MIB
    assert not guard.low  # the last lookup still holds
    now[0] = 1.0
    assert guard.low and len(lookups) == 2
    with pytest.raises(StorageFailed, match=r"100 MiB free under its --min-free-disk-mb 512"):
        guard.check("uploads")
    assert not DiskGuard(Path("/data"), 0, usage=usage).low  # no floor

    def unreadable(path: Path) -> int:
        raise FileNotFoundError(path)

    assert not DiskGuard(Path("/gone"), 512 * MIB, usage=unreadable).low  # writes will tell


def test_under_the_floor_the_guard_stays_low_until_the_margin_above_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hysteresis: free space hovering at the floor (the server's own spill files and journal
    writes come and go) flipped readiness and refusals with each look. Once under the floor,
    new work waits until the floor plus the margin are free; each change is logged once."""
    caplog.set_level(logging.INFO, logger="livemeet.gateway.disk")
    now, free = [0.0], [600 * MIB]
    guard = DiskGuard(
        Path("/data"), 512 * MIB, margin_bytes=256 * MIB, clock=lambda: now[0],
        usage=lambda p: free[0],
    )  # fmt: skip

    def low_at(free_mib: int) -> bool:
        now[0] += 1.0
        free[0] = free_mib * MIB
        return guard.low

    assert not low_at(600)  # above the floor from the start: no need for the margin
    assert low_at(500)
    assert low_at(600) and low_at(767)  # above the floor, under floor + margin
    with pytest.raises(StorageFailed) as refused:
        guard.check("uploads")
    assert "767 MiB free since it fell under its --min-free-disk-mb 512" in refused.value.message
    assert "no new uploads until 768 MiB are free" in refused.value.message
    assert not low_at(768)
    assert not low_at(600)  # back under the margin, above the floor: still taken
    assert low_at(511)
    changes = [r.getMessage() for r in caplog.records]
    assert changes == [
        "the data dir's disk has 500 MiB free, under --min-free-disk-mb 512: new live sessions "
        "and uploads are refused until 768 MiB are free",
        "the data dir's disk has 768 MiB free again: new live sessions and uploads are taken",
        "the data dir's disk has 511 MiB free, under --min-free-disk-mb 512: new live sessions "
        "and uploads are refused until 768 MiB are free",
    ]


def test_a_low_guard_whose_disk_cannot_be_read_does_not_log_it_free_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Low, then statvfs failing (the data dir gone, a permission changed): the guard takes
    new work, as it does where the space is unknown, but the log said "the data dir's disk
    has 0 MiB free again", as if 0 MiB were above the floor."""
    caplog.set_level(logging.INFO, logger="livemeet.gateway.disk")
    now: list[float] = [0.0]
    free: list[int | None] = [100 * MIB]

    def usage(path: Path) -> int:
        if free[0] is None:
            raise PermissionError(13, "Permission denied")
        return free[0]

    guard = DiskGuard(Path("/data"), 512 * MIB, clock=lambda: now[0], usage=usage)
    assert guard.low
    now[0], free[0] = 2.0, None
    assert not guard.low
    (change,) = [r.getMessage() for r in caplog.records]
    assert change == (
        "the data dir's free space cannot be read (/data): new live sessions and uploads are taken"
    )


async def test_readyz_is_ready_again_only_above_the_floor_and_its_margin(
    aiohttp_client: ClientFactory, server_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/readyz and the refusals follow the guard's hysteresis (default margin 256 MiB over
    the default floor of 512), and /readyz says where it is ready again."""
    free = [50 * MIB]
    monkeypatch.setattr(disk, "DISK_CHECK_INTERVAL_S", 0.0)  # a fresh look each time
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: Usage(10**12, 0, free[0]))
    client = await aiohttp_client(create_app(server_config, FakeTranscriber()))
    ready = await client.get("/readyz")
    assert ready.status == 503 and (await ready.json())["disk_ready_mb"] == 768
    free[0] = 600 * MIB  # above the floor, not the margin: a spill file deleted
    ready = await client.get("/readyz")
    assert ready.status == 503 and (await ready.json())["disk_low"] is True
    response = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    assert response.status == 507
    free[0] = 800 * MIB
    assert (await client.get("/readyz")).status == 200
    response = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    assert response.status == 200


async def low_disk_client(
    aiohttp_client: ClientFactory, server_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> TestClient:
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: Usage(10**12, 10**12, 50 * MIB))
    return await aiohttp_client(create_app(server_config, FakeTranscriber()))


async def test_a_nearly_full_disk_refuses_new_sessions_and_uploads_and_readiness(
    aiohttp_client: ClientFactory,
    server_config: ServerConfig,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under --min-free-disk-mb (default 512) a new live session or upload is refused at once
    with storage_failed (a trial: a full disk failed a session mid-meeting), and /readyz says
    why; /healthz stays ok (the process is fine)."""
    caplog.set_level(logging.INFO, logger="livemeet.gateway")
    client = await low_disk_client(aiohttp_client, server_config, monkeypatch)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(START)
        error: dict[str, Any] = await ws.receive_json()
        await ws.receive()
    assert error["code"] == "storage_failed" and "50 MiB free" in error["message"]
    assert ws.close_code == 4507
    response = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    assert response.status == 507
    assert (await response.json())["error"]["code"] == "storage_failed"
    assert response.headers["Retry-After"] == "60"  # space is freed by hand: not "1"
    ready = await client.get("/readyz")
    body = await ready.json()
    assert ready.status == 503 and body["disk_low"] is True and body["disk_free_mb"] == 50
    assert (await client.get("/healthz")).status == 200
    text = await (await client.get("/metrics")).text()
    (line,) = [x for x in text.splitlines() if x.startswith("livemeet_disk_free_bytes ")]
    assert float(line.split()[-1]) == 50 * MIB
    # a trial: the start said nothing, and the live refusal's log line gave no reason
    assert "50 MiB free, under --min-free-disk-mb 512" in caplog.text
    await wait_until(lambda: "ended: storage_failed (the server's disk is nearly" in caplog.text)


async def test_free_space_that_cannot_be_read_is_nan_not_a_full_disk(
    aiohttp_client: ClientFactory, server_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gauge read 0 where the data dir's free space was unknown, as of a full disk (an
    operations trial): an alert on it fired for nothing. NaN is Prometheus's unknown."""

    def unreadable(path: object) -> Usage:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(disk.shutil, "disk_usage", unreadable)
    client = await aiohttp_client(create_app(server_config, FakeTranscriber()))
    text = await (await client.get("/metrics")).text()
    (line,) = [x for x in text.splitlines() if x.startswith("livemeet_disk_free_bytes ")]
    assert math.isnan(float(line.split()[-1]))
    body = await (await client.get("/readyz")).json()
    assert body["disk_free_mb"] is None


async def test_the_start_names_the_floor_as_given(
    aiohttp_client: ClientFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`serve --min-free-disk-mb 100000000` logged "under --min-free-disk-mb 1e+08" (a
    trial): the flag's value as the operator wrote it."""
    caplog.set_level(logging.INFO, logger="livemeet.gateway")
    config = ServerConfig(
        data_dir=tmp_path / "data", gateway=GatewayConfig(min_free_disk_mb=100_000_000)
    )
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: Usage(10**12, 0, 50 * MIB))
    await aiohttp_client(create_app(config, FakeTranscriber()))
    assert "50 MiB free, under --min-free-disk-mb 100000000: new live" in caplog.text


async def test_retention_deletes_old_transcripts_at_start_from_disk_and_memory(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    """--retention-days: transcripts last written longer ago are deleted at the start (and
    hourly); newer ones stay."""
    config = ServerConfig(data_dir=tmp_path / "data", gateway=GatewayConfig(retention_days=7))
    store = TranscriptStore(config.data_dir / "transcriptions")
    transcript = Transcript((Segment(0.0, 1.0, "S01", "hi", id="seg-0000"),), 1.0,
                            FinishReason.STOP)  # fmt: skip
    old_id, new_id = new_transcription_id(), new_transcription_id()
    await store.put(old_id, transcript)
    await store.put(new_id, transcript)
    await store.flush()
    eight_days_ago = time.time() - 8 * 86_400
    os.utime(store.directory / f"{old_id}.json", (eight_days_ago, eight_days_ago))
    client = await aiohttp_client(create_app(config, FakeTranscriber()))
    for _ in range(100):  # the sweep runs beside the start
        if not (store.directory / f"{old_id}.json").exists():
            break
        await asyncio.sleep(0.01)
    assert (await client.get(f"/v1/transcriptions/{old_id}")).status == 404
    assert (await client.get(f"/v1/transcriptions/{new_id}")).status == 200


@pytest.mark.parametrize(
    ("days", "num_old", "line"),
    [
        (1, 2, "retention: 2 stored transcripts older than 1 day deleted"),
        (0.5, 1, "retention: 1 stored transcript older than 0.5 days deleted"),
        (7, 2, "retention: 2 stored transcripts older than 7 days deleted"),
    ],
)
async def test_the_retention_log_says_day_and_days(
    aiohttp_client: ClientFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    days: float,
    num_old: int,
    line: str,
) -> None:
    """It logged "20 stored transcripts older than 1 days deleted" (a trial)."""
    caplog.set_level(logging.INFO, logger="livemeet.gateway")
    config = ServerConfig(data_dir=tmp_path / "data", gateway=GatewayConfig(retention_days=days))
    store = TranscriptStore(config.data_dir / "transcriptions")
    transcript = Transcript((), 0.0, FinishReason.STOP)
    long_ago = time.time() - (days + 1) * 86_400
    for _ in range(num_old):
        tid = new_transcription_id()
        await store.put(tid, transcript)
        await store.flush()
        os.utime(store.directory / f"{tid}.json", (long_ago, long_ago))
    await aiohttp_client(create_app(config, FakeTranscriber()))
    await wait_until(lambda: "retention: " in caplog.text)  # the sweep runs beside the start
    assert line + "\n" in caplog.text


async def test_a_sweep_forgets_what_it_deleted(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    transcript = Transcript((), 0.0, FinishReason.STOP)
    tid = new_transcription_id()
    await store.put(tid, transcript)
    await store.flush()
    assert await store.sweep(-1.0) == 1  # everything is older than "a second from now"
    assert store.num_cached == 0 and not list(tmp_path.iterdir())


@pytest.fixture
def umask_022() -> Any:
    """The usual umask, whatever the test runner's: what makes a plain mkdir 0755."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_private_dir_and_the_parents_it_makes_are_the_owners_alone(
    tmp_path: Path, umask_022: None
) -> None:
    (tmp_path / "there").mkdir(mode=0o755)
    disk.make_private_dir(tmp_path / "there" / "new" / "deeper")
    assert mode(tmp_path / "there") == 0o755  # not made here: left as it is
    assert mode(tmp_path / "there" / "new") == mode(tmp_path / "there" / "new" / "deeper")
    assert mode(tmp_path / "there" / "new") == disk.PRIVATE_DIR_MODE == 0o700
    disk.make_private_dir(tmp_path / "there")  # there already: nothing changes
    assert mode(tmp_path / "there") == 0o755
    assert disk.exposed_dirs([tmp_path / "there", tmp_path / "there" / "new"]) == [
        f"{tmp_path / 'there'} (mode 0755)"
    ]
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(FileExistsError):
        disk.make_private_dir(tmp_path / "file")


async def test_the_data_dir_the_server_makes_is_its_own_alone(
    aiohttp_client: ClientFactory, tmp_path: Path, umask_022: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Meetings' audio, transcripts and upload spills were under directories of mode 0755
    (the umask's): every user of the machine could read them (a security review). What the
    server makes is 0700: the data dir, its tmp, transcriptions and live journal."""
    from livemeet.gateway import openai_api

    monkeypatch.setattr(openai_api, "UPLOAD_MEMORY_BYTES", 1000)  # the upload spills
    data_dir = tmp_path / "new" / "data"
    client = await aiohttp_client(create_app(ServerConfig(data_dir=data_dir), FakeTranscriber()))
    response = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(1.0)))
    assert response.status == 200, await response.text()
    await client.app[STORE_KEY].flush()
    made = [data_dir.parent, data_dir, *(p for p in data_dir.rglob("*") if p.is_dir())]
    assert {p.name for p in made} >= {"new", "data", "tmp", "transcriptions", "live", "audio"}
    assert {p.name: mode(p) for p in made} == {p.name: 0o700 for p in made}


@pytest.mark.parametrize(
    ("owner", "runs_as", "advice"),
    [
        (0, 12345, "as root, `chown -R 12345 DATA`; or run livemeet as root"),
        (12345, 12345, None),  # its own: the refusal is about something else
        (12345, 0, None),  # root refused (NFS root squash): no chown to root
    ],
)
def test_a_permission_hint_advises_a_chown_only_for_another_users_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner: int, runs_as: int, advice: str | None
) -> None:
    """The hint names the owner and mode of the nearest directory it can look at; only where
    that is the data dir (or under it), another user's, and livemeet is not root, does it
    say how to hand it over (a review: the advice was given for the user's own directory
    too, and to root)."""
    from livemeet.gateway import disk

    data = tmp_path / "data"
    data.mkdir()
    real_stat = Path.stat

    def stat_as_owned(self: Path, **kwargs: Any) -> os.stat_result:
        st = real_stat(self, **kwargs)
        fields = list(st)
        fields[4] = owner  # st_uid
        return os.stat_result(fields)

    monkeypatch.setattr(Path, "stat", stat_as_owned)
    monkeypatch.setattr(disk.os, "geteuid", lambda: runs_as)
    hint = disk.permission_hint(data / "live" / "lock", data)
    assert f"({data} is " in hint and ", mode 0" in hint  # the nearest that exists
    if advice is None:
        assert "chown" not in hint
    else:
        assert advice.replace("DATA", str(data)) in hint
