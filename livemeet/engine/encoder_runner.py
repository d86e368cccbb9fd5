"""Encoder runner: audio samples -> audio embeddings [T, hidden], window by window.

30 s windows are independent (MODEL.md section 2), so windows from any number of requests are
encoded together in micro-batches of at most `max_windows_per_batch`. Outputs of FULL windows
are kept in a bounded LRU cache keyed by a hash of the window's samples: a live session's
complete windows are encoded once, and a repeated upload is free. A partial (last) window is
never cached: its embeddings change as audio arrives (its mel floor, padding and attention all
move; MODEL.md section 2).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from livemeet.audio.constants import TOKENS_PER_WINDOW
from livemeet.audio.features import log_mel, split_windows
from livemeet.models.audio_llm import MossTDModel


class EncoderRunner:
    """Batches encoder + adaptor forwards and caches full-window outputs (see module doc).

    `cache_windows`: LRU capacity in windows (each ~0.77 MB in bf16 at real size: 375 x 1024).
    """

    def __init__(
        self,
        model: MossTDModel,
        *,
        cache_windows: int = 256,
        max_windows_per_batch: int = 8,
    ) -> None:
        self.model = model
        self.cache_windows = cache_windows
        self.max_windows_per_batch = max_windows_per_batch
        self._cache: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.num_encoded_windows = 0
        self.num_cache_hits = 0

    @property
    def device(self) -> torch.device:
        return self.model.language_model.embed_tokens.weight.device

    @torch.inference_mode()
    def encode(self, audios: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Each mono 16 kHz float32 audio -> embeddings [ceil(S/1280), hidden] on the device.

        Raises BadAudio for empty or non-finite audio (from split_windows).
        """
        jobs: list[tuple[int, int, torch.Tensor, int, bytes | None]] = []
        per_audio: list[list[torch.Tensor | None]] = []
        for a, samples in enumerate(audios):
            windows, counts = split_windows(samples)
            slots: list[torch.Tensor | None] = []
            for w, count in enumerate(counts):
                key = self._key(windows[w]) if count == TOKENS_PER_WINDOW else None
                hit = self._lookup(key)
                slots.append(hit)
                if hit is None:
                    jobs.append((a, w, windows[w], count, key))
            per_audio.append(slots)
        for start in range(0, len(jobs), self.max_windows_per_batch):
            self._run(jobs[start : start + self.max_windows_per_batch], per_audio)
        return [torch.cat([s for s in slots if s is not None]) for slots in per_audio]

    def _run(
        self,
        jobs: list[tuple[int, int, torch.Tensor, int, bytes | None]],
        per_audio: list[list[torch.Tensor | None]],
    ) -> None:
        windows = torch.stack([j[2] for j in jobs]).to(self.device)  # [n, 480000]
        feats = log_mel(windows).to(self.model.adaptor.linear_1.weight.dtype)  # [n, 80, 3000]
        counts = [j[3] for j in jobs]
        embeds = self.model.encode_audio(feats, counts)  # [sum(counts), hidden]
        self.num_encoded_windows += len(jobs)
        for (a, w, _, _, key), chunk in zip(jobs, embeds.split(counts), strict=True):
            per_audio[a][w] = chunk
            if key is not None:
                self._store(key, chunk)

    @staticmethod
    def _key(window: torch.Tensor) -> bytes:
        return hashlib.blake2b(window.numpy().tobytes(), digest_size=16).digest()

    def _lookup(self, key: bytes | None) -> torch.Tensor | None:
        if key is None or key not in self._cache:
            return None
        self._cache.move_to_end(key)
        self.num_cache_hits += 1
        return self._cache[key]

    def _store(self, key: bytes, value: torch.Tensor) -> None:
        if self.cache_windows <= 0:
            return
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_windows:
            self._cache.popitem(last=False)
