"""The decode thread's C heap is trimmed after a long or failed upload decode (gateway/heap.py)."""

from __future__ import annotations

import platform
import subprocess
import sys
import threading

import pytest
from aiohttp.test_utils import TestClient

from livemeet.gateway import heap, openai_api
from tests.gateway.conftest import truncated_flac, wav_bytes
from tests.gateway.test_openai_api import form

# One thread fills its arena with 64-KB blocks (below glibc's mmap threshold, so they come from
# the arena), pins the arena's top with one block still held, frees the rest; RSS in MB after
# each stage, printed as "full freed trimmed".
_RETAINED_THEN_TRIMMED = """
import threading, numpy as np
from livemeet.gateway.heap import trim_heap
def rss_mb():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
out = []
def work():
    blocks = [np.ones(16_000, np.float32) for _ in range(3_000)]
    out.append(np.ones(16_000, np.float32))
    out.append(rss_mb())
    del blocks
    out.append(rss_mb())
    out.append(trim_heap())
    out.append(rss_mb())
t = threading.Thread(target=work)
t.start()
t.join()
print(out[1], out[2], out[3], out[4])
"""


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's"
)
def test_trim_heap_gives_a_threads_freed_arena_back() -> None:
    """The premise and the cure, in a fresh interpreter: ~190 MB freed on a thread stay
    resident until `trim_heap`."""
    done = subprocess.run(
        [sys.executable, "-c", _RETAINED_THEN_TRIMMED],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    full, freed, released, trimmed = done.stdout.split()
    assert float(freed) > float(full) - 20, "freed blocks were returned without a trim"
    assert released == "True"
    assert float(trimmed) < float(freed) - 150


def test_trim_heap_without_malloc_trim_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.trim_heap() is False


@pytest.mark.parametrize(
    ("audio", "status", "trims"),
    [
        (wav_bytes(2.0), 200, 1),
        (wav_bytes(0.5), 200, 0),
        (truncated_flac(), 400, 1),  # fails after ~2 s have decoded, past the probe
        (b"not audio at all" * 64, 400, 1),
    ],
    ids=["long", "short", "failed-mid-decode", "failed-at-probe"],
)
async def test_an_upload_decode_trims_after_a_long_or_failed_decode(
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
    audio: bytes,
    status: int,
    trims: int,
) -> None:
    """With the threshold at 1 s: a 2-s decode and failed ones trim, on the decode's own
    thread; a 0.5-s decode does not."""
    threads: list[threading.Thread] = []
    monkeypatch.setattr(openai_api, "HEAP_TRIM_AFTER_AUDIO_S", 1.0)
    monkeypatch.setattr(openai_api, "trim_heap", lambda: threads.append(threading.current_thread()))
    resp = await client.post("/v1/audio/transcriptions", data=form(audio))
    assert resp.status == status, await resp.text()
    assert len(threads) == trims
    assert all(t is not threading.main_thread() for t in threads)
