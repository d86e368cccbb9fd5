"""Shared helpers for the loadtest smoke tests: run a loadtest module as the GPU box would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """`python -m module args` from the repo root on CPU; fails the test with its output."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    env.setdefault("TRITON_INTERPRET", "1")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"{module} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc
