"""Parity of livemeet's MOSS-TD against transformers 5.24 on the same tiny random weights.

Ours: split_windows + log_mel + build_prompt (real tokenizer) + MossTDModel, loaded from the
upstream-format checkpoint. Reference: MossTranscribeDiarizeProcessor (its feature extractor,
span and chat template, tests/models/reference.py) + MossTranscribeDiarizeForConditionalGeneration
loaded from the HF-native checkpoint with the same weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from livemeet.audio.features import log_mel, split_windows
from livemeet.layers.attention import DenseAttention
from livemeet.models.audio_llm import MossTDModel, generate, generate_batch
from tests.models import tiny
from tests.models.conftest import CLIP_SECONDS

TOLERANCE = 1e-4  # max |logit| difference, fp32 CPU
NEW_TOKENS = 64


def _our_audio(model: MossTDModel, clip: np.ndarray) -> tuple[torch.Tensor, int]:
    windows, counts = split_windows(clip)
    with torch.no_grad():
        return model.encode_audio(log_mel(windows), counts), sum(counts)


@pytest.mark.parametrize("seconds", CLIP_SECONDS)
def test_teacher_forced_logits_match_reference(
    seconds: float, clips: dict[float, np.ndarray], our_model: MossTDModel, ref_model: Any
) -> None:
    clip = clips[seconds]
    ref_hidden, ref_ids = tiny.reference_hidden(ref_model, clip)
    _, num_tokens = _our_audio(our_model, clip)
    ids = tiny.our_prompt_ids(num_tokens)
    assert ids == ref_ids
    gap = tiny.max_logit_gap(
        our_model, tiny.our_hidden(our_model, clip, ids), ref_model, ref_hidden
    )
    assert gap <= TOLERANCE


def _reference_generate(ref: Any, clips: list[np.ndarray], side: str = "left") -> list[list[int]]:
    return tiny.reference_greedy(ref, tiny.reference_inputs(clips, side=side), NEW_TOKENS)


def test_greedy_batch_1_matches_reference_and_is_diverse(
    clips: dict[float, np.ndarray], our_model: MossTDModel, ref_model: Any
) -> None:
    clip = clips[11.0]
    audio, num_tokens = _our_audio(our_model, clip)
    ours = generate(our_model, torch.tensor(tiny.our_prompt_ids(num_tokens)), audio, NEW_TOKENS, [])
    assert ours == _reference_generate(ref_model, [clip])[0]
    # A degenerate random model (one repeated token) would make this comparison vacuous.
    assert len(set(ours)) >= 16


def test_greedy_batched_matches_reference_left_padded(
    clips: dict[float, np.ndarray], our_model: MossTDModel, ref_model: Any
) -> None:
    batch = [clips[1.0], clips[40.0], clips[11.0]]
    prompts, audios = [], []
    for clip in batch:
        audio, num_tokens = _our_audio(our_model, clip)
        prompts.append(torch.tensor(tiny.our_prompt_ids(num_tokens)))
        audios.append(audio)
    ours = generate_batch(our_model, prompts, audios, NEW_TOKENS, [])
    assert ours == _reference_generate(ref_model, batch, side="left")
    assert all(len(set(row)) >= 16 for row in ours)


def test_generate_stops_at_eos(clips: dict[float, np.ndarray], our_model: MossTDModel) -> None:
    audio, num_tokens = _our_audio(our_model, clips[1.0])
    ids = torch.tensor(tiny.our_prompt_ids(num_tokens))
    free = generate(our_model, ids, audio, 20, [])
    stop = free[5]
    assert generate(our_model, ids, audio, 20, stop) == free[: free.index(stop) + 1]
    with pytest.raises(ValueError):
        generate(our_model, ids, audio, 0, stop)


def test_chunked_prefill_and_truncate_match_single_prefill(
    clips: dict[float, np.ndarray], our_model: MossTDModel
) -> None:
    audio, num_tokens = _our_audio(our_model, clips[11.0])
    ids = torch.tensor(tiny.our_prompt_ids(num_tokens))
    with torch.no_grad():
        embeds = our_model.embed_prompt(ids, audio)
        whole = our_model(
            embeds, torch.arange(len(ids)), DenseAttention([our_model.new_kv_cache()], [len(ids)])
        )
        cache = our_model.new_kv_cache()
        parts = []
        for start, end in ((0, 100), (100, 101), (101, len(ids))):
            attn = DenseAttention([cache], [end - start])
            parts.append(our_model(embeds[start:end], torch.arange(start, end), attn))
        assert cache.num_tokens == len(ids)
        torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-5, atol=1e-4)
        cache.truncate(90)
        tail = our_model(
            embeds[90:], torch.arange(90, len(ids)), DenseAttention([cache], [len(ids) - 90])
        )
        torch.testing.assert_close(tail, whole[90:], rtol=1e-5, atol=1e-4)


def test_ragged_batch_equals_separate_forwards(
    clips: dict[float, np.ndarray], our_model: MossTDModel
) -> None:
    embeds, lengths = [], []
    for seconds in (1.0, 11.0):
        audio, num_tokens = _our_audio(our_model, clips[seconds])
        ids = torch.tensor(tiny.our_prompt_ids(num_tokens))
        embeds.append(our_model.embed_prompt(ids, audio))
        lengths.append(len(ids))
    with torch.no_grad():
        alone = [
            our_model(e, torch.arange(n), DenseAttention([our_model.new_kv_cache()], [n]))
            for e, n in zip(embeds, lengths, strict=True)
        ]
        caches = [our_model.new_kv_cache(), our_model.new_kv_cache()]
        positions = torch.cat([torch.arange(n) for n in lengths])
        together = our_model(torch.cat(embeds), positions, DenseAttention(caches, lengths))
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-5, atol=1e-4)


def test_audio_placeholder_count_mismatch_is_rejected(
    clips: dict[float, np.ndarray], our_model: MossTDModel
) -> None:
    from livemeet.errors import InvalidRequest

    audio, num_tokens = _our_audio(our_model, clips[1.0])
    with pytest.raises(InvalidRequest, match="placeholders"):
        our_model.embed_prompt(torch.tensor(tiny.our_prompt_ids(num_tokens + 1)), audio)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_runs_in_bf16(
    upstream_dir: Any, clips: dict[float, np.ndarray], dtype: torch.dtype
) -> None:
    from livemeet.models.loader import load_model

    model, _ = load_model(str(upstream_dir), device="cpu", dtype=dtype)
    audio, num_tokens = _our_audio(model, clips[1.0])
    assert audio.dtype == dtype
    tokens = generate(model, torch.tensor(tiny.our_prompt_ids(num_tokens)), audio, 8, [])
    assert len(tokens) == 8


def test_encoder_layers_run_on_contiguous_frames(our_model: MossTDModel) -> None:
    """The position add after the conv stem must not hand the layers a transposed layout: every
    LayerNorm would copy it and every residual add run strided (a third of the encoder's time
    on an H200, docs/benchmarks.md session 9). Values are the same in either layout."""
    encoder = our_model.audio_encoder
    seen: list[bool] = []
    hooks = [
        layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0].is_contiguous()))
        for layer in encoder.layers
    ]
    features = torch.randn(2, encoder.cfg.num_mel_bins, 2 * encoder.cfg.max_source_positions)
    try:
        with torch.no_grad():
            out = encoder(features)
    finally:
        for hook in hooks:
            hook.remove()
    assert seen == [True] * len(encoder.layers)
    with torch.no_grad():  # the same encoder with the strided layout kept (the old form)
        x = F.gelu(encoder.conv2(F.gelu(encoder.conv1(features))))
        x = x.transpose(1, 2) + encoder.embed_positions.weight
        assert not x.is_contiguous()
        for layer in encoder.layers:
            x = layer(x)
        strided = encoder.layer_norm(x)
    torch.testing.assert_close(out, strided, atol=1e-6, rtol=0)
