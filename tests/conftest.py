"""Shared test set-up: the Triton interpreter on CPU-only machines, and the path to the real
speech in ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when kernels are decorated (at import of
    # livemeet.layers.paged_attention_kernels, which many test modules import indirectly):
    # without a GPU the kernels can only be exercised by the interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
# LIVEMEET_SHARED_DATA: a copy of the data where ../shared is absent (a GPU box).
SHARED_DATA = Path(os.environ.get("LIVEMEET_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared evaluation data folder (real speech with references); skips if absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
