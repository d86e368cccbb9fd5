"""Known-wrong variants of our pipeline must FAIL parity: proof the parity checks can fail.

Each test applies one plausible mistake (the ones MODEL.md warns about) and asserts that the
same comparison test_parity.py makes (prompt ids equal and logits within 1e-4, or greedy tokens
equal) no longer holds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from livemeet.audio import features
from livemeet.errors import ConfigError
from livemeet.models import whisper_encoder
from livemeet.models.audio_llm import MossTDModel, generate_batch
from livemeet.models.loader import load_model
from livemeet.models.prompt import AUDIO_PAD, DIGIT_IDS, PromptConfig
from tests.models import tiny
from tests.models.test_parity import NEW_TOKENS, TOLERANCE, _our_audio, _reference_generate

CLIP_S = 11.0  # long enough for two markers, short enough to be quick


def _parity_holds(
    clip: np.ndarray,
    model: MossTDModel,
    ref: Any,
    mutate_ids: Callable[[list[int]], list[int]] = lambda ids: ids,
    prompt_config: PromptConfig | None = None,
) -> bool:
    ref_hidden, ref_ids = tiny.reference_hidden(ref, clip)
    _, num_tokens = _our_audio(model, clip)
    ids = mutate_ids(tiny.our_prompt_ids(num_tokens, prompt_config))
    if ids != ref_ids:
        return False
    hidden = tiny.our_hidden(model, clip, ids)
    return tiny.max_logit_gap(model, hidden, ref, ref_hidden) <= TOLERANCE


def test_unmutated_pipeline_passes(clips: dict, our_model: MossTDModel, ref_model: Any) -> None:
    assert _parity_holds(clips[CLIP_S], our_model, ref_model)


def test_markers_every_2_s_fail(clips: dict, our_model: MossTDModel, ref_model: Any) -> None:
    every_2_s = PromptConfig(time_marker_every_s=2)
    assert not _parity_holds(clips[CLIP_S], our_model, ref_model, prompt_config=every_2_s)


def test_marker_one_pad_late_fails(clips: dict, our_model: MossTDModel, ref_model: Any) -> None:
    def first_marker_late(ids: list[int]) -> list[int]:
        # The first marker digit trades places with the pad after it: marker after pad 63.
        i = next(i for i, t in enumerate(ids) if t in DIGIT_IDS and ids[i - 1] == AUDIO_PAD)
        assert ids[i + 1] == AUDIO_PAD
        return ids[:i] + [ids[i + 1], ids[i]] + ids[i + 2 :]

    assert not _parity_holds(clips[CLIP_S], our_model, ref_model, mutate_ids=first_marker_late)


def test_mel_floor_per_frame_fails(
    clips: dict, our_model: MossTDModel, ref_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def per_frame(log_spec: torch.Tensor) -> torch.Tensor:
        peak = log_spec.amax(dim=1, keepdim=True)  # wrong: max of each frame, not the window
        return (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0

    monkeypatch.setattr(features, "_floor_and_scale", per_frame)
    assert not _parity_holds(clips[CLIP_S], our_model, ref_model)


def test_keeping_frame_3001_fails(
    clips: dict, our_model: MossTDModel, ref_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Keep the 3,001st frame (and drop the first, so the encoder still gets 3000).
    monkeypatch.setattr(features, "_drop_last_frame", lambda spec: spec[..., 1:])
    assert not _parity_holds(clips[CLIP_S], our_model, ref_model)


class _BiasedAttention(whisper_encoder.EncoderAttention):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__(d_model, heads)
        self.k_proj = nn.Linear(d_model, d_model, bias=True)


def test_encoder_k_proj_bias_fails(
    upstream_dir: Path, hf_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A k bias shifts every score of a query equally, so softmax hides it numerically; what
    catches it is the checkpoint contract: neither dialect has such a tensor."""
    monkeypatch.setattr(whisper_encoder, "EncoderAttention", _BiasedAttention)
    for root in (upstream_dir, hf_dir):
        with pytest.raises(ConfigError, match=r"missing tensors: .*self_attn\.k_proj\.bias"):
            load_model(str(root), device="cpu", dtype="float32")


def test_right_padding_in_batch_fails(clips: dict, our_model: MossTDModel, ref_model: Any) -> None:
    batch = [clips[1.0], clips[CLIP_S]]
    prompts, audios = [], []
    for clip in batch:
        audio, num_tokens = _our_audio(our_model, clip)
        prompts.append(torch.tensor(tiny.our_prompt_ids(num_tokens)))
        audios.append(audio)
    ours = generate_batch(our_model, prompts, audios, NEW_TOKENS, [])
    assert ours != _reference_generate(ref_model, batch, side="right")
