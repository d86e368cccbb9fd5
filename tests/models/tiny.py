"""Tiny random MOSS-TD checkpoints in both on-disk dialects, for CPU tests.

Geometry per the model brief: audio width (64) != text width (48); GQA (4 heads, 2 kv heads);
heads * head_dim (4 * 16 = 64) != hidden (48); 3 layers in each tower; the real vocab (151936),
80 mel bins and 1500 source positions (the reference insists on 3000-frame windows).

Random weights make greedy decoding repeat one token: the residual stream stays close to the
last token's embedding (the tied head then scores that token highest), or, over long prompts,
close to a context average that barely moves per step. Sign-mixed final-norm weights, strong
MLPs and sharp attention (q/k norm weights ~3) break both (>= 16 distinct tokens in 64 is
asserted in the tests).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import AudioConfig, MossTDConfig, TextConfig

TINY = MossTDConfig(
    audio=AudioConfig(d_model=64, layers=3, heads=4, ffn=128),
    text=TextConfig(hidden=48, intermediate=96, layers=3, heads=4, kv_heads=2, head_dim=16),
)
SEED = 1234

# canonical prefix -> (upstream prefix, HF-native prefix); MODEL.md section 8.1
_DIALECTS = (
    ("audio_encoder.", "model.whisper_encoder.", "model.audio_tower."),
    ("adaptor.linear_1.", "model.vq_adaptor.layers.0.", "model.multi_modal_projector.linear_1."),
    ("adaptor.linear_2.", "model.vq_adaptor.layers.2.", "model.multi_modal_projector.linear_2."),
    ("adaptor.norm.", "model.vq_adaptor.layers.3.", "model.multi_modal_projector.norm."),
    ("language_model.", "model.language_model.", "model.language_model."),
)


def checkpoint_key(name: str, dialect: str) -> str:
    """Our canonical parameter name -> the key in an "upstream" or "hf" checkpoint."""
    for ours, upstream, native in _DIALECTS:
        if name.startswith(ours):
            return (upstream if dialect == "upstream" else native) + name[len(ours) :]
    raise KeyError(name)


def _scale(name: str) -> float:
    if name.endswith("bias"):
        return 0.1
    if name == "language_model.norm.weight":
        return 4.0
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return 3.0
    if name.endswith("norm.weight") or "layer_norm.weight" in name:
        return 1.0
    if "embed_tokens" in name or name.endswith("o_proj.weight"):
        return 1.0
    if "embed_positions" in name:
        return 0.5
    return 3.0


def random_weights(cfg: MossTDConfig = TINY, seed: int = SEED) -> dict[str, torch.Tensor]:
    """Seeded float32 weights keyed by our canonical names (shapes from MossTDModel)."""
    shapes = {n: t.shape for n, t in MossTDModel(cfg).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in sorted(shapes.items()):
        noise = torch.randn(shape, generator=gen)
        if len(shape) == 1 and name.endswith("weight"):
            # Norm weights: around 1, except the final norm which mixes signs (see module doc).
            if name == "language_model.norm.weight":
                weights[name] = noise * _scale(name)
            else:
                weights[name] = (1 + 0.1 * noise) * _scale(name)
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
            weights[name] = noise * _scale(name) / math.sqrt(fan_in if "embed" not in name else 1)
    return weights


def upstream_config_dict(cfg: MossTDConfig) -> dict[str, Any]:
    """config.json in the original OpenMOSS dialect (Whisper field names, adaptor_input_dim)."""
    a, t = cfg.audio, cfg.text
    return {
        "architectures": ["MossTranscribeDiarizeForConditionalGeneration"],
        "model_type": "moss_transcribe_diarize",
        "dtype": "float32",
        "audio_token_id": cfg.audio_token_id,
        "audio_merge_size": cfg.merge_size,
        "adaptor_input_dim": cfg.adaptor_input_dim,
        "tie_word_embeddings": True,
        "audio_config": {
            "model_type": "whisper",
            "num_mel_bins": a.num_mel_bins,
            "d_model": a.d_model,
            "encoder_layers": a.layers,
            "encoder_attention_heads": a.heads,
            "encoder_ffn_dim": a.ffn,
            "max_source_positions": a.max_source_positions,
            "activation_function": "gelu",
            "scale_embedding": False,
        },
        "text_config": {
            "model_type": "qwen3",
            "vocab_size": t.vocab,
            "hidden_size": t.hidden,
            "intermediate_size": t.intermediate,
            "num_hidden_layers": t.layers,
            "num_attention_heads": t.heads,
            "num_key_value_heads": t.kv_heads,
            "head_dim": t.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": t.max_position_embeddings,
            "rms_norm_eps": t.rms_eps,
            "rope_theta": t.rope_theta,
            "attention_bias": False,
            "tie_word_embeddings": True,
        },
    }


def hf_config(cfg: MossTDConfig) -> Any:
    """The transformers-native MossTranscribeDiarizeConfig for `cfg`."""
    from transformers import MossTranscribeDiarizeConfig

    a, t = cfg.audio, cfg.text
    return MossTranscribeDiarizeConfig(
        audio_config={
            "hidden_size": a.d_model,
            "num_hidden_layers": a.layers,
            "num_attention_heads": a.heads,
            "intermediate_size": a.ffn,
            "num_mel_bins": a.num_mel_bins,
            "max_source_positions": a.max_source_positions,
        },
        text_config={
            "vocab_size": t.vocab,
            "hidden_size": t.hidden,
            "intermediate_size": t.intermediate,
            "num_hidden_layers": t.layers,
            "num_attention_heads": t.heads,
            "num_key_value_heads": t.kv_heads,
            "head_dim": t.head_dim,
            "rms_norm_eps": t.rms_eps,
            "max_position_embeddings": t.max_position_embeddings,
            "rope_parameters": {"rope_theta": t.rope_theta, "rope_type": "default"},
        },
        audio_token_id=cfg.audio_token_id,
        audio_merge_size=cfg.merge_size,
    )


def write_upstream(root: Path, weights: dict[str, torch.Tensor], cfg: MossTDConfig = TINY) -> Path:
    """Original-format checkpoint in two shards with model.safetensors.index.json."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(upstream_config_dict(cfg), indent=2))
    names = sorted(weights)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file, shard_names in shards.items():
        tensors = {checkpoint_key(n, "upstream"): weights[n].contiguous() for n in shard_names}
        save_file(tensors, str(root / file))
        weight_map.update(dict.fromkeys(tensors, file))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def write_hf_native(root: Path, weights: dict[str, torch.Tensor], cfg: MossTDConfig = TINY) -> Path:
    """HF-native checkpoint: transformers' own config.json and one model.safetensors."""
    root.mkdir(parents=True, exist_ok=True)
    hf_config(cfg).save_pretrained(str(root))
    tensors = {checkpoint_key(n, "hf"): t.contiguous() for n, t in weights.items()}
    save_file(tensors, str(root / "model.safetensors"))
    return root


# ---------------------------------------------------------------- audio and prompt helpers

SPEECH_SUFFIXES = (".wav", ".flac")
AUDIO_PAD, AUDIO_START, AUDIO_END, IM_END, PAD_ID = 151671, 151669, 151670, 151645, 151643
DIGIT_0 = 15  # token id of "0"; "0".."9" are 15..24 (MODEL.md 5.3)
# Chat header up to <|audio_start|> and the suffix after <|audio_end|> (MODEL.md 5.1). The
# instruction in the middle of the suffix is a stand-in until the real tokenizer is wired in.
HEADER = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198]
SUFFIX = [AUDIO_END, 198, 3167, 3114, 279, 7699, 13, 151645, 198, 151644, 77091, 198]


def decode_16k_mono(path: Path) -> Any:
    """A speech file as float32 mono 16 kHz (soundfile decode, channel mean, soxr resample)."""
    import numpy as np
    import soundfile
    import soxr

    samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    if rate != 16_000:
        mono = soxr.resample(mono, rate, 16_000)
    return np.ascontiguousarray(mono, dtype=np.float32)


def speech_files(data_dir: Path) -> list[Path]:
    """Every real speech recording in the shared data folder, sorted."""
    return sorted(p for p in data_dir.rglob("*") if p.suffix in SPEECH_SUFFIXES)


def span_ids(num_tokens: int, every_s: int = 5, late_pads: int = 0) -> list[int]:
    """Audio span per MODEL.md 5.3: a marker after pad 62k for each k <= T / 62.5.

    `every_s` and `late_pads` exist only to build the wrong spans of the mutation tests.
    """
    per_marker = int(12.5 * every_s)
    num_markers = int(num_tokens / 12.5) // every_s
    span: list[int] = []
    placed = 0
    for k in range(1, num_markers + 1):
        target = min(num_tokens, per_marker * k + late_pads)
        span += [AUDIO_PAD] * (target - placed)
        placed = target
        span += [DIGIT_0 + int(d) for d in str(every_s * k)]
    return span + [AUDIO_PAD] * (num_tokens - placed)


def prompt_ids(num_tokens: int, **span_kwargs: int) -> list[int]:
    """Whole prompt: header, <|audio_start|>, span, suffix."""
    return HEADER + [AUDIO_START] + span_ids(num_tokens, **span_kwargs) + SUFFIX


# ---------------------------------------------------------------- the two pipelines


def reference_audio_inputs(clips: list[Any]) -> tuple[Any, Any, list[int]]:
    """transformers' feature extractor on `clips` -> (input_features, input_features_mask,
    audio tokens per clip computed by the reference processor's own formula)."""
    from transformers.models.moss_transcribe_diarize import (
        MossTranscribeDiarizeFeatureExtractor,
        MossTranscribeDiarizeProcessor,
    )

    extractor = MossTranscribeDiarizeFeatureExtractor()
    out = extractor(clips, sampling_rate=16_000, return_tensors="pt")
    lengths = out["padding_mask"].sum(-1)
    windows = ((lengths + extractor.n_samples - 1) // extractor.n_samples).clamp(min=1)
    mapping = torch.repeat_interleave(torch.arange(len(clips)), windows)
    fake_processor = _FakeProcessor()
    tokens = MossTranscribeDiarizeProcessor._get_audio_token_length(
        fake_processor, out["input_features_mask"].sum(-1), mapping
    )
    return out["input_features"], out["input_features_mask"], [int(t) for t in tokens]


class _FakeProcessor:
    """The attributes the reference processor's span and count methods read (shipped config)."""

    audio_token = "<|audio_pad|>"
    audio_tokens_per_second = 12.5
    audio_merge_size = 4
    time_marker_every_seconds = 5


def reference_prompt_ids(num_tokens: int) -> list[int]:
    """The prompt with the span rendered by the reference processor's `replace_audio_token`."""
    import re

    from transformers.models.moss_transcribe_diarize import MossTranscribeDiarizeProcessor

    text = MossTranscribeDiarizeProcessor.replace_audio_token(
        _FakeProcessor(), {"num_audio_tokens": [num_tokens]}, audio_idx=0
    )
    pieces = re.findall(r"<\|audio_pad\|>|\d", text)
    assert "".join(pieces) == text, "unexpected text in the reference span"
    span = [AUDIO_PAD if p.startswith("<") else DIGIT_0 + int(p) for p in pieces]
    return HEADER + [AUDIO_START] + span + SUFFIX


def our_hidden(model: MossTDModel, clip: Any, ids: list[int]) -> torch.Tensor:
    """Our pipeline, one prefill: split_windows -> log_mel -> encode -> splice -> decoder."""
    from livemeet.audio.features import log_mel, split_windows
    from livemeet.layers.attention import DenseAttention

    windows, counts = split_windows(clip)
    with torch.no_grad():
        audio = model.encode_audio(log_mel(windows), counts)
        embeds = model.embed_prompt(torch.tensor(ids), audio)
        attn = DenseAttention([model.new_kv_cache()], [len(ids)])
        return model(embeds, torch.arange(len(ids)), attn)


def reference_hidden(ref: Any, clip: Any) -> tuple[torch.Tensor, list[int]]:
    """Reference pipeline: extractor + reference span + transformers model (final hidden)."""
    features, mask, tokens = reference_audio_inputs([clip])
    ids = reference_prompt_ids(tokens[0])
    with torch.no_grad():
        out = ref.model(
            input_ids=torch.tensor([ids]), input_features=features, input_features_mask=mask
        )
    return out.last_hidden_state[0], ids


def max_logit_gap(
    model: MossTDModel, hidden: torch.Tensor, ref: Any, ref_hidden: torch.Tensor
) -> float:
    """Max |logit difference| over every position and vocab entry, computed in row chunks
    (full [L, 151936] logits would take gigabytes). inf when the lengths differ."""
    if hidden.shape != ref_hidden.shape:
        return float("inf")
    gap = 0.0
    with torch.no_grad():
        for start in range(0, hidden.shape[0], 256):
            ours = model.compute_logits(hidden[start : start + 256])
            theirs = ref.lm_head(ref_hidden[start : start + 256])
            gap = max(gap, float((ours - theirs).abs().max()))
    return gap
