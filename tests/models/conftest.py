"""Session fixtures for model tests: tiny checkpoints in both dialects, both models, clips."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from livemeet.models.audio_llm import MossTDModel
from livemeet.models.loader import load_model
from tests.models import tiny

# Clip durations of the parity tests (s): < 1 window, 1 window, 2 windows, 3 windows, 4.
CLIP_SECONDS = (1.0, 11.0, 40.0, 71.3, 100.0)


@pytest.fixture(scope="session")
def tiny_weights() -> dict[str, torch.Tensor]:
    return tiny.random_weights()


@pytest.fixture(scope="session")
def upstream_dir(tmp_path_factory: pytest.TempPathFactory, tiny_weights: Any) -> Path:
    return tiny.write_upstream(tmp_path_factory.mktemp("tiny_upstream"), tiny_weights)


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory, tiny_weights: Any) -> Path:
    return tiny.write_hf_native(tmp_path_factory.mktemp("tiny_hf"), tiny_weights)


@pytest.fixture(scope="session")
def our_model(upstream_dir: Path) -> MossTDModel:
    torch.set_num_threads(2)
    model, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    return model


@pytest.fixture(scope="session")
def ref_model(hf_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    model, info = transformers.MossTranscribeDiarizeForConditionalGeneration.from_pretrained(
        str(hf_dir), dtype=torch.float32, output_loading_info=True
    )
    # A silently re-initialised tensor would make every parity check meaningless.
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


@pytest.fixture(scope="session")
def long_speech(shared_data: Path) -> np.ndarray:
    """All real speech in the shared data, concatenated (about 138 s, 16 kHz mono)."""
    parts = [tiny.decode_16k_mono(p) for p in tiny.speech_files(shared_data)]
    return np.concatenate(parts)


@pytest.fixture(scope="session")
def clips(long_speech: np.ndarray) -> dict[float, np.ndarray]:
    """Real-speech clips of CLIP_SECONDS, cut from the concatenation at 16 kHz."""
    assert len(long_speech) >= int(max(CLIP_SECONDS) * 16_000)
    return {s: long_speech[: int(round(s * 16_000))] for s in CLIP_SECONDS}
