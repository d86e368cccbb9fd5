"""Gateway fixtures: an app around a FakeTranscriber, and small audio files."""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from aiohttp.test_utils import TestClient

from livemeet.config import GatewayConfig, ServerConfig
from livemeet.gateway.app import create_app
from tests.gateway.fakes import FakeTranscriber

MAX_UPLOAD_BYTES = 2_000_000  # bytes; small so the 413 path is cheap to test
MAX_AUDIO_S = 60.0  # s; small so the too-long path is cheap to test

ClientFactory = Callable[..., Awaitable[TestClient]]


@pytest.fixture
def fake() -> FakeTranscriber:
    return FakeTranscriber()


@pytest.fixture
def server_config(tmp_path: Path) -> ServerConfig:
    return ServerConfig(
        port=0,
        data_dir=tmp_path / "data",
        gateway=GatewayConfig(max_upload_bytes=MAX_UPLOAD_BYTES, max_audio_s=MAX_AUDIO_S),
    )


@pytest.fixture
async def client(
    aiohttp_client: ClientFactory, server_config: ServerConfig, fake: FakeTranscriber
) -> TestClient:
    return await aiohttp_client(create_app(server_config, fake))


def wav_bytes(
    duration_s: float,
    rate: int = 16_000,
    channels: int = 1,
    fmt: str = "WAV",
    subtype: str = "PCM_16",
) -> bytes:
    """A quiet sine (440 Hz) of `duration_s` seconds, encoded in memory."""
    t = np.arange(int(duration_s * rate)) / rate
    mono = (0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    data = np.repeat(mono[:, None], channels, axis=1) if channels > 1 else mono
    buf = io.BytesIO()
    sf.write(buf, data, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def truncated_flac(duration_s: float = 4.0) -> bytes:
    """A FLAC of `duration_s` cut in half: it probes as whole and fails mid-decode ("truncated")."""
    data = wav_bytes(duration_s, fmt="FLAC", subtype="PCM_16")
    return data[: len(data) // 2]


def pcm16(duration_s: float, rate: int = 16_000, channels: int = 1) -> bytes:
    """Interleaved PCM16 LE of a quiet sine."""
    n = int(duration_s * rate)
    t = np.arange(n) / rate
    mono = (3000 * np.sin(2 * np.pi * 300 * t)).astype("<i2")
    return np.repeat(mono[:, None], channels, axis=1).tobytes()
