"""The recorder's AudioWorklet (web/pcm-worklet.js), under node (tests/web/worklet_harness.js)."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node")


@functools.cache
def worklet_run() -> dict[str, Any]:
    assert NODE is not None
    out = subprocess.run(
        [NODE, str(Path(__file__).with_name("worklet_harness.js")),
         str(ROOT / "web" / "pcm-worklet.js")],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_flush_posts_the_samples_of_the_frame_being_filled() -> None:
    """Stop right after Start had no whole 100-ms frame to send before `end` (protocol_error):
    the worklet now answers a "flush" with the samples it holds, and starts a new frame."""
    run = worklet_run()
    assert run["beforeFlush"] == 0  # 1,024 samples: under a frame
    assert run["flushed"] == 1024 and run["flushedValue"] == int(0.5 * 0x7FFF)
    assert run["afterFlush"] == [1600]
    assert run["flushedAgain"] == 64
