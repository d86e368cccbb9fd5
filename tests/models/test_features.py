"""log_mel / split_windows against transformers' MossTranscribeDiarizeFeatureExtractor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from livemeet.audio.features import log_mel, slaney_mel_filterbank, split_windows
from livemeet.errors import BadAudio
from tests.models import tiny

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def extractor():  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    return transformers.MossTranscribeDiarizeFeatureExtractor()


def test_every_real_speech_file_matches_reference(shared_data: Path, extractor) -> None:  # type: ignore[no-untyped-def]
    files = tiny.speech_files(shared_data)
    assert len(files) >= 8
    for path in files:
        audio = tiny.decode_16k_mono(path)
        windows, counts = split_windows(audio)
        ours = log_mel(windows)
        ref = extractor(audio, sampling_rate=16_000, return_tensors="pt")
        assert ours.shape == ref["input_features"].shape, path
        assert float((ours - ref["input_features"]).abs().max()) <= TOLERANCE, path
        # Token counts from the reference's frame mask: ceil(ceil(ceil(N/160)/2)/4) per window.
        mel_valid = ref["input_features_mask"].sum(-1)
        expected = (((mel_valid - 1) // 2 + 1) + 3) // 4
        assert counts == expected.tolist(), path


def test_filterbank_matches_transformers() -> None:
    from transformers.audio_utils import mel_filter_bank

    ref = mel_filter_bank(
        num_frequency_bins=201,
        num_mel_filters=80,
        min_frequency=0.0,
        max_frequency=8000.0,
        sampling_rate=16000,
        norm="slaney",
        mel_scale="slaney",
    )
    np.testing.assert_allclose(slaney_mel_filterbank(), ref, rtol=1e-10, atol=1e-12)


def test_windows_are_independent_of_batching(shared_data: Path) -> None:
    audio = tiny.decode_16k_mono(shared_data / "ami-pyannote-debug" / "dev00.wav")
    windows, _ = split_windows(np.concatenate([audio, audio[:100_000]]))
    together = log_mel(windows)
    alone = torch.cat([log_mel(windows[i : i + 1]) for i in range(windows.shape[0])])
    assert torch.equal(together, alone)


@pytest.mark.parametrize(
    ("num_samples", "counts"),
    [
        (1, [1]),
        (16_000, [13]),
        (479_999, [375]),
        (480_000, [375]),
        (480_001, [375, 1]),
        (int(71.3 * 16_000), [375, 375, 142]),
    ],
)
def test_split_windows_counts_and_padding(num_samples: int, counts: list[int]) -> None:
    audio = np.full(num_samples, 0.5, dtype=np.float32)
    windows, got = split_windows(audio)
    assert got == counts
    assert windows.shape == (len(counts), 480_000)
    flat = windows.reshape(-1)
    assert bool((flat[:num_samples] == 0.5).all()) and bool((flat[num_samples:] == 0).all())


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(0, dtype=np.float32),
        np.zeros((2, 100), dtype=np.float32),
        np.array([0.0, np.nan], dtype=np.float32),
        np.zeros(100, dtype=np.int16),
    ],
)
def test_split_windows_rejects_bad_audio(bad: np.ndarray) -> None:
    with pytest.raises(BadAudio):
        split_windows(bad)


def test_log_mel_rejects_wrong_shape() -> None:
    with pytest.raises(ValueError, match="480000"):
        log_mel(torch.zeros(1, 16_000))
