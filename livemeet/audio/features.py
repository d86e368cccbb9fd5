"""Whisper-style log-mel features in torch (batched, any device), as MOSS-TD expects them.

Contract: MODEL.md sections 1.2, 1.3 and 1.5 (identical to transformers'
`MossTranscribeDiarizeFeatureExtractor`, which is Whisper's extractor applied to consecutive 30 s
windows). The Slaney mel filterbank is computed here from the Slaney formulas (Auditory Toolbox,
M. Slaney 1998: linear below 1 kHz at 200/3 Hz per mel, logarithmic above, area-normalised
triangles), and cached per device and dtype.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from livemeet.audio.constants import (
    HOP_LENGTH,
    LOG_MEL_MIN,
    MEL_FLOOR_DB,
    MEL_FMAX_HZ,
    MEL_FMIN_HZ,
    N_FFT,
    N_MELS,
    SAMPLE_RATE,
    WINDOW_SAMPLES,
    num_audio_tokens,
)
from livemeet.audio.pcm import check_finite
from livemeet.errors import BadAudio

# Slaney mel scale: 200/3 Hz per mel up to 1 kHz (= 15 mel), then 27 mel per factor 6.4.
_SLANEY_HZ_PER_MEL = 200.0 / 3.0
_SLANEY_BREAK_HZ = 1000.0
_SLANEY_BREAK_MEL = _SLANEY_BREAK_HZ / _SLANEY_HZ_PER_MEL
_SLANEY_LOG_STEP = math.log(6.4) / 27.0

_filterbank_cache: dict[tuple[str, torch.dtype], torch.Tensor] = {}
_window_cache: dict[tuple[str, torch.dtype], torch.Tensor] = {}


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    mel = hz / _SLANEY_HZ_PER_MEL
    high = hz >= _SLANEY_BREAK_HZ
    mel[high] = _SLANEY_BREAK_MEL + np.log(hz[high] / _SLANEY_BREAK_HZ) / _SLANEY_LOG_STEP
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = mel * _SLANEY_HZ_PER_MEL
    high = mel >= _SLANEY_BREAK_MEL
    hz[high] = _SLANEY_BREAK_HZ * np.exp(_SLANEY_LOG_STEP * (mel[high] - _SLANEY_BREAK_MEL))
    return hz


def slaney_mel_filterbank() -> np.ndarray:
    """The [201, 80] float64 mel filterbank: Slaney scale and area normalisation, 0-8 kHz.

    Row f is FFT bin f (f * 16000 / 400 Hz); column m is the m-th triangular filter, scaled by
    2 / (upper edge - lower edge) so that every filter has the same area.
    """
    n_bins = N_FFT // 2 + 1
    fft_hz = np.linspace(0.0, SAMPLE_RATE / 2, n_bins)
    mel_edges = np.linspace(
        _hz_to_mel(np.array([MEL_FMIN_HZ]))[0], _hz_to_mel(np.array([MEL_FMAX_HZ]))[0], N_MELS + 2
    )
    edges_hz = _mel_to_hz(mel_edges)  # [82]
    widths = np.diff(edges_hz)  # [81]
    offsets = edges_hz[None, :] - fft_hz[:, None]  # [201, 82]
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    triangles = np.maximum(0.0, np.minimum(rising, falling))  # [201, 80]
    return triangles * (2.0 / (edges_hz[2:] - edges_hz[:-2]))[None, :]


def _filterbank(device: torch.device) -> torch.Tensor:
    key = (str(device), torch.float32)
    if key not in _filterbank_cache:
        bank = torch.from_numpy(slaney_mel_filterbank()).to(torch.float32)
        _filterbank_cache[key] = bank.T.contiguous().to(device)  # [80, 201]
    return _filterbank_cache[key]


def _hann(device: torch.device) -> torch.Tensor:
    key = (str(device), torch.float32)
    if key not in _window_cache:
        _window_cache[key] = torch.hann_window(N_FFT, periodic=True, device=device)
    return _window_cache[key]


def _drop_last_frame(spec: torch.Tensor) -> torch.Tensor:
    # center=True gives 480000 // 160 + 1 = 3001 frames; the reference keeps the first 3000.
    return spec[..., :-1]


def _floor_and_scale(log_spec: torch.Tensor) -> torch.Tensor:
    # log_spec: [n_win, 80, 3000]; the floor is relative to each window's own maximum.
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    return (torch.maximum(log_spec, peak - MEL_FLOOR_DB) + 4.0) / 4.0


@torch.no_grad()
def log_mel(windows: torch.Tensor) -> torch.Tensor:
    """Log-mel features of zero-padded 30 s windows (MODEL.md section 1.3).

    `windows`: [n_win, 480000] float samples at 16 kHz in [-1, 1], on any device. Computed in
    float32 whatever the input dtype. Returns [n_win, 80, 3000] float32 on the same device.
    Raises ValueError when the shape is not [n_win, 480000].
    """
    if windows.ndim != 2 or windows.shape[1] != WINDOW_SAMPLES:
        raise ValueError(f"windows must be [n_win, {WINDOW_SAMPLES}], got {tuple(windows.shape)}")
    samples = windows.to(torch.float32)
    stft = torch.stft(
        samples,
        N_FFT,
        HOP_LENGTH,
        window=_hann(samples.device),
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )  # [n_win, 201, 3001]
    power = _drop_last_frame(stft).abs().square().contiguous()  # [n_win, 201, 3000]
    mel = _filterbank(samples.device) @ power  # [n_win, 80, 3000]
    return _floor_and_scale(torch.clamp(mel, min=LOG_MEL_MIN).log10())


def window_token_counts(num_samples: int) -> list[int]:
    """Audio tokens contributed by each 30 s window of `num_samples` samples (MODEL.md 1.5).

    A full window gives 375; the last gives ceil(N_w / 1280). Empty audio gives one window of 0.
    """
    n_win = max(1, -(-num_samples // WINDOW_SAMPLES))
    counts = []
    for i in range(n_win):
        n_w = min(WINDOW_SAMPLES, num_samples - i * WINDOW_SAMPLES)
        counts.append(num_audio_tokens(max(0, n_w)))
    return counts


def check_samples(samples: np.ndarray, *, finite: bool = True) -> np.ndarray:
    """`samples` as a 1-D float array, or BadAudio for non-1-D, empty, integer or (`finite`)
    non-finite input (what the encoder cannot take). finite=False skips the O(n) scan for a
    caller that checked the samples already (a live hop at minute 10 would rescan 9.6M)."""
    audio = np.asarray(samples)
    if audio.ndim != 1:
        raise BadAudio(f"audio must be mono (1-D), got shape {audio.shape}")
    if audio.size == 0:
        raise BadAudio("audio is empty")
    if not np.issubdtype(audio.dtype, np.floating):
        raise BadAudio(f"audio must be float samples in [-1, 1], got dtype {audio.dtype}")
    if finite:
        check_finite(audio)
    return audio


def split_windows(samples: np.ndarray) -> tuple[torch.Tensor, list[int]]:
    """Cut mono 16 kHz audio into consecutive zero-padded 30 s windows (MODEL.md 1.2, 1.5).

    `samples`: 1-D float array in [-1, 1]. Returns (windows [n_win, 480000] float32 on CPU,
    tokens_per_window) where n_win = max(1, ceil(S / 480000)) and tokens_per_window[i] is the
    number of audio tokens window i contributes (sum = ceil(S / 1280)).
    Raises BadAudio for empty, non-1-D or non-finite input.
    """
    audio = check_samples(samples)
    counts = window_token_counts(audio.size)
    windows = torch.zeros(len(counts), WINDOW_SAMPLES, dtype=torch.float32)
    flat = torch.from_numpy(audio.astype(np.float32, copy=False))
    windows.view(-1)[: audio.size] = flat
    return windows, counts
