from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from livemeet.engine import shared_audio
from livemeet.engine.shared_audio import (
    BLOCK_PREFIX,
    SHM_DIR,
    SharedAudioBlock,
    read_shared_audio,
    shared_audio_supported,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not shared_audio_supported(), reason=f"no {SHM_DIR}")


def blocks() -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(BLOCK_PREFIX)}


@pytest.fixture(autouse=True)
def no_block_left() -> Iterator[None]:
    before = blocks()
    yield
    assert blocks() == before


@pytest.fixture
def tracker_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    calls: list[tuple[str, str, str]] = []
    tracker = shared_audio.resource_tracker
    monkeypatch.setattr(tracker, "register", lambda n, t: calls.append(("register", n, t)))
    monkeypatch.setattr(tracker, "unregister", lambda n, t: calls.append(("unregister", n, t)))
    return calls


def test_round_trip_and_one_register_one_unregister(
    tracker_calls: list[tuple[str, str, str]],
) -> None:
    samples = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    block = SharedAudioBlock(samples[::-1])  # not contiguous: written in sample order anyway
    assert block.name in blocks() and block.num_samples == samples.size
    out = read_shared_audio(block.name, block.num_samples, block.dtype)
    assert out.dtype == np.float32 and np.array_equal(out, samples[::-1])
    out[:] = 0  # a private copy
    assert np.array_equal(read_shared_audio(block.name, samples.size, "<f4"), samples[::-1])
    block.release()
    assert block.name not in blocks()
    name = "/" + block.name  # the form shm_unlink, the tracker's cleanup, takes
    assert tracker_calls == [
        ("register", name, "shared_memory"),
        ("unregister", name, "shared_memory"),
    ]
    with pytest.raises(AssertionError, match="released twice"):
        block.release()


def test_read_errors_are_typed() -> None:
    with pytest.raises(FileNotFoundError):
        read_shared_audio(BLOCK_PREFIX + "missing", 10, "<f4")
    block = SharedAudioBlock(np.ones(10, np.float32))
    try:
        with pytest.raises(ValueError, match="40 of 44 bytes"):
            read_shared_audio(block.name, 11, "<f4")
    finally:
        block.release()


def test_release_of_a_block_someone_else_removed(
    tracker_calls: list[tuple[str, str, str]],
) -> None:
    """Nothing raised (EngineClient.close releases every block in one loop) and the tracker
    still forgets it."""
    block = SharedAudioBlock(np.ones(10, np.float32))
    os.unlink(os.path.join(SHM_DIR, block.name))
    block.release()
    assert [call[0] for call in tracker_calls] == ["register", "unregister"]


def test_full_shm_raises_enospc_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tracker_calls: list[tuple[str, str, str]]
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError) as info:
        SharedAudioBlock(np.ones(1000, np.float32))
    assert info.value.errno == errno.ENOSPC
    assert [call[0] for call in tracker_calls] == ["register", "unregister"]


def test_a_dead_owner_s_block_is_unlinked_by_the_resource_tracker() -> None:
    """The gateway dies holding a block: multiprocessing's resource tracker unlinks it (with a
    warning), so the block is registered under the name its cleanup takes."""
    code = textwrap.dedent(
        """
        import os, numpy as np
        from livemeet.engine.shared_audio import SharedAudioBlock
        block = SharedAudioBlock(np.ones(1000, np.float32))
        print(block.name, flush=True)
        os._exit(1)  # no release, no cleanup
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO_ROOT,
    )
    name = done.stdout.strip()
    assert name.startswith(BLOCK_PREFIX), done.stderr
    assert not os.path.exists(os.path.join(SHM_DIR, name))  # the tracker exits after the child
    assert "leaked shared_memory" in done.stderr
