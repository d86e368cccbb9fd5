"""Running the pages' node harnesses (tests/web/*_harness.js) from the tests: each loads web/
files into a stub browser and prints one JSON object, the last line of its stdout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from livemeet.gateway.app import WEB_DIR

WEB = WEB_DIR  # the pages the gateway serves
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="needs node")
HARNESS_TIMEOUT_S = 30


def run_harness(harness: str, *args: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run tests/web/`harness` under node with `args` (and the environment plus `env`); the
    object its last stdout line holds. Raises subprocess.CalledProcessError on a non-zero
    exit, TimeoutExpired past HARNESS_TIMEOUT_S."""
    assert NODE is not None
    out = subprocess.run(
        [NODE, str(Path(__file__).with_name(harness)), *args],
        capture_output=True, text=True, timeout=HARNESS_TIMEOUT_S, check=True,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
