"""A live session survives a crash of the server (DESIGN 5.9: "Claim: survives a process
crash"): the real `python -m livemeet serve` (scripted backend, engine in its own process) is
killed with SIGKILL mid-meeting and started again on the same data dir; the client resumes
with its session id and token, sends on from the server's offset, and gets the transcript an
uninterrupted meeting gets, its earlier finals unchanged. A graceful restart (SIGTERM) keeps
it the same way, with the real `livemeet stream` as the client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.conftest import pcm16
from tests.gateway.test_e2e import free_port
from tests.gateway.test_live_resume import read_to_close, read_until, resume_start
from tests.gateway.test_ws_live import START

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0
RATE = 16_000
FRAME_S = 0.25
BEFORE_S = 6.0  # of a 12-s meeting (the scripted backend's DEFAULT_SCRIPT runs to 11 s)
MEETING_S = 12.0
SPEED = 5.0  # times real time the client sends at


@contextmanager
def serve(
    data_dir: Path, log_name: str, port: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A running `serve --backend scripted` on `data_dir` (on `port`, else a free one): its
    ws base URL and process."""
    port = port or free_port()
    cmd = [
        sys.executable, "-m", "livemeet", "serve", "--backend", "scripted",
        "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
        "--no-live-vad",  # a hop every second of the quiet sine, speech or not
        "--no-revise",  # the final is the last event: these tests are about it
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with (data_dir.parent / log_name).open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(port, proc, data_dir.parent / log_name)
            yield f"ws://127.0.0.1:{port}", proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "server did not become ready: " + log.read_text()
        time.sleep(0.2)


def frames(from_s: float, to_s: float) -> list[bytes]:
    # the same audio wherever it is cut: the quiet sine of pcm16, FRAME_S at a time
    whole = pcm16(MEETING_S)
    step = round(FRAME_S * RATE) * 2
    return [
        whole[i : i + step] for i in range(round(from_s * RATE) * 2, round(to_s * RATE) * 2, step)
    ]


async def send_paced(ws: aiohttp.ClientWebSocketResponse, chunks: list[bytes]) -> None:
    # at SPEED times real time: a hop a second of audio, as a meeting's (all at once, hops
    # coalesce and two hypotheses rarely agree before the audio stops)
    for chunk in chunks:
        await ws.send_bytes(chunk)
        await asyncio.sleep(FRAME_S / SPEED)


async def stream_until_acked(ws: aiohttp.ClientWebSocketResponse, to_s: float) -> list[Any]:
    """Send the meeting's first `to_s` s; read until all of it is acknowledged."""
    await send_paced(ws, frames(0.0, to_s))
    events = await read_until(ws, "audio.ack")
    while events[-1]["type"] != "audio.ack" or events[-1]["offset"] < to_s * RATE:
        events += await read_until(ws, "audio.ack")
    return events


async def uninterrupted(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{url}/v1/live") as ws:
        await ws.send_json(START)
        await ws.receive_json()
        await stream_until_acked(ws, MEETING_S)
        await ws.send_json({"type": "end"})
        events = await read_to_close(ws)
    return events[-1]


def labelled(final: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(s["start"], s["end"], s["speaker"], s["text"]) for s in final["segments"]]


@pytest.mark.slow
async def test_a_killed_server_loses_no_acknowledged_audio_and_no_final(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with serve(data_dir, "first.log") as (url, proc):
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{url}/v1/live")
            await ws.send_json(START)
            ready = await ws.receive_json()
            before = await stream_until_acked(ws, BEFORE_S)
            if not any(e["type"] == "segment.final" for e in before):
                before += await read_until(ws, "segment.final")  # the engine catches up
            proc.send_signal(signal.SIGKILL)  # no drain, no shutdown: a crash
            proc.wait(timeout=10)
            await ws.close()
    finals_before = [e for e in before if e["type"] == "segment.final"]
    assert finals_before, "the scripted meeting commits within its first 6 s"

    with serve(data_dir, "second.log") as (url, _):
        async with aiohttp.ClientSession() as http, http.ws_connect(f"{url}/v1/live") as ws:
            await ws.send_json(resume_start(ready))
            resumed = await ws.receive_json()
            assert resumed["type"] == "session.ready" and resumed["resumed"] is True, resumed
            assert resumed["offset"] == BEFORE_S * RATE  # everything acknowledged before
            assert resumed["captions_token"] == ready["captions_token"]
            await send_paced(ws, frames(resumed["offset"] / RATE, MEETING_S))
            await ws.send_json({"type": "end"})
            after = await asyncio.wait_for(read_to_close(ws), 30)
        final = after[-1]
        reference = await uninterrupted(url)
    assert final["type"] == "transcript.final" and ws.close_code == 1000, after[-3:]
    assert final["duration"] == MEETING_S
    by_id = {s["id"]: s for s in final["segments"]}
    for seg in finals_before:  # finals are immutable: the same id, text, times and label
        assert by_id[seg["id"]] == {k: v for k, v in seg.items() if k != "type"}
    assert labelled(final) == labelled(reference)


@pytest.mark.slow
async def test_a_killed_engine_worker_costs_a_pause_not_the_session(tmp_path: Path) -> None:
    """The engine worker alone is killed (SIGKILL, as an out-of-memory kill): the server
    starts another, rebuilds the live session in it from its finals and journalled audio and
    keeps the client's socket: no error, the finals seen keep their ids, and the transcript is
    the uninterrupted one's."""
    data_dir = tmp_path / "data"
    with serve(data_dir, "serve.log") as (url, _):
        async with aiohttp.ClientSession() as http, http.ws_connect(f"{url}/v1/live") as ws:
            await ws.send_json(START)
            await ws.receive_json()
            before = await stream_until_acked(ws, BEFORE_S)
            if not any(e["type"] == "segment.final" for e in before):
                before += await read_until(ws, "segment.final")
            os.kill(worker_pid(tmp_path / "serve.log"), signal.SIGKILL)
            await send_paced(ws, frames(BEFORE_S, MEETING_S))
            await ws.send_json({"type": "end"})
            after = await asyncio.wait_for(read_to_close(ws), 60)
        reference = await uninterrupted(url)
    assert not [e for e in after if e["type"] == "error"], after[-3:]
    final = after[-1]
    assert final["type"] == "transcript.final" and ws.close_code == 1000
    assert final["duration"] == MEETING_S
    by_id = {s["id"]: s for s in final["segments"]}
    for seg in (e for e in before if e["type"] == "segment.final"):
        assert by_id[seg["id"]] == {k: v for k, v in seg.items() if k != "type"}
    assert labelled(final) == labelled(reference)
    assert "rebuilt after the engine's loss" in (tmp_path / "serve.log").read_text()


def worker_pid(log: Path) -> int:
    """The engine worker's pid, from the server's log line that announces it."""
    pids = re.findall(r"engine worker ready: .*\(pid (\d+)\)", log.read_text())
    assert pids, log.read_text()
    return int(pids[-1])


@pytest.mark.slow
def test_a_hang_up_stops_the_server_as_sigterm_does(tmp_path: Path) -> None:
    """SIGHUP (the terminal or SSH session that started `serve` closed) killed the server
    with nothing drained (an operations trial): it now stops as SIGTERM does, exit 0."""
    with serve(tmp_path / "data", "serve.log") as (_, proc):
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=30) == 0
    assert "livemeet stopped" in (tmp_path / "serve.log").read_text()


@pytest.mark.slow
async def test_a_sigterm_restart_is_resumed_by_livemeet_stream(tmp_path: Path) -> None:
    """A graceful restart (SIGTERM, as `systemctl restart` sends) ended the meeting: its final
    of part of the file, a 1001 close, and `livemeet stream` exiting 1 "resend from ..." (a
    user trial), while a kill -9 and a restart lost nothing. The server now keeps the session
    (server_restarting, 1012); `stream` waits for the server started again on the same port
    and data dir, resumes, and exits 0 with a final of the whole file, each final id printed
    once, none missing, and the uninterrupted meeting's transcript."""
    data_dir = tmp_path / "data"
    audio = tmp_path / "meeting.wav"
    with wave.open(str(audio), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm16(MEETING_S))
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/live"
    out = tmp_path / "stream.jsonl"
    with serve(data_dir, "first.log", port) as (_, proc):
        with out.open("w") as stdout, (tmp_path / "stream.err").open("w") as stderr:
            cmd = [sys.executable, "-m", "livemeet", "stream", str(audio), "--url", url,
                   "--speed", "3", "--json"]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
            client = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=stdout, stderr=stderr)
        try:
            deadline = time.monotonic() + 20
            while '"segment.final"' not in out.read_text():  # mid-meeting, a final out
                assert client.poll() is None and time.monotonic() < deadline, out.read_text()
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        except BaseException:
            client.kill()
            raise
    with serve(data_dir, "second.log", port) as (base, _):
        status = await asyncio.to_thread(client.wait, 60)
        reference = await uninterrupted(base)
    err = (tmp_path / "stream.err").read_text()
    assert status == 0, err
    assert "the server is restarting" in err
    events = [json.loads(line) for line in out.read_text().splitlines()]
    finals = [e for e in events if e["type"] == "segment.final"]
    final = next(e for e in events if e["type"] == "transcript.final")
    assert final["duration"] == MEETING_S
    ids = [f["id"] for f in finals]
    assert len(ids) == len(set(ids))  # each final once, though the resume replays them
    assert ids == [s["id"] for s in final["segments"]]  # and none missing
    assert labelled(final) == labelled(reference)
    assert not [e for e in events if e["type"] == "error"]
    first_log = (tmp_path / "first.log").read_text()
    assert "kept in the journal for the next start" in first_log, first_log
