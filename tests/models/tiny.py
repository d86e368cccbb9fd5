"""Tiny random MOSS-TD checkpoints in both on-disk dialects, for CPU tests.

Geometry per the model brief: audio width (64) != text width (48); GQA (4 heads, 2 kv heads);
heads * head_dim (4 * 16 = 64) != hidden (48); 3 layers in each tower; the real vocab (151936),
80 mel bins and 1500 source positions (the reference insists on 3000-frame windows).

Random weights make greedy decoding repeat one token: the residual stream stays close to the
last token's embedding and the tied head then scores that token highest. Large, sign-mixed
final-norm weights and strong layer outputs break that symmetry (asserted in the tests).
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
    if name.endswith("norm.weight") or "layer_norm.weight" in name:
        return 1.0
    if "embed_tokens" in name:
        return 1.0
    if "embed_positions" in name:
        return 0.5
    return 1.5


def random_weights(cfg: MossTDConfig = TINY, seed: int = SEED) -> dict[str, torch.Tensor]:
    """Seeded float32 weights keyed by our canonical names (shapes from MossTDModel)."""
    shapes = {n: t.shape for n, t in MossTDModel(cfg).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in sorted(shapes.items()):
        noise = torch.randn(shape, generator=gen)
        if len(shape) == 1 and name.endswith("weight"):
            # Norm weights: around 1, except the final norm which mixes signs (see module doc).
            base = noise * _scale(name) if name == "language_model.norm.weight" else 1 + 0.1 * noise
            weights[name] = base
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
