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
from livemeet.models.dialects import checkpoint_key, hf_config  # noqa: F401 (re-exported)

TINY = MossTDConfig(
    audio=AudioConfig(d_model=64, layers=3, heads=4, ffn=128),
    text=TextConfig(hidden=48, intermediate=96, layers=3, heads=4, kv_heads=2, head_dim=16),
)
SEED = 1234


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
IM_END, PAD_ID = 151645, 151643


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


def our_prompt_ids(num_tokens: int, config: Any = None) -> list[int]:
    """livemeet's prompt (real tokenizer, default instruction) for `num_tokens` audio tokens."""
    from livemeet.models.prompt import PromptConfig, build_prompt
    from livemeet.models.tokenizer import load_tokenizer

    return build_prompt(load_tokenizer(None), num_tokens, config=config or PromptConfig()).ids


# ---------------------------------------------------------------- the two pipelines


def reference_inputs(clips: list[Any], side: str = "left") -> Any:
    """The reference processor's model inputs for a batch of clips (padding on `side`)."""
    from tests.models.reference import make_reference_processor

    processor = make_reference_processor()
    inputs = processor.apply_transcription_request(clips, return_tensors="pt", padding=True)
    if side == "right":  # move each row's left pads to its end
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        for row in range(ids.shape[0]):
            keep = mask[row].bool()
            n = int(keep.sum())
            ids[row] = torch.cat([ids[row][keep], ids[row][~keep]])
            mask[row] = torch.cat([torch.ones(n), torch.zeros(ids.shape[1] - n)]).to(mask.dtype)
    return inputs


def reference_greedy(
    ref: Any, inputs: Any, num_tokens: int, prefix: list[int] | None = None
) -> list[list[int]]:
    """The transformers reference's greedy tokens for each row of `inputs` (`reference_inputs`),
    exactly `num_tokens` per row (EOS does not stop it); `prefix`: ids appended to every row's
    prompt (forced assistant tokens, DESIGN 5.3)."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    if prefix:
        extra = torch.tensor([prefix] * ids.shape[0], dtype=ids.dtype)
        ids = torch.cat([ids, extra], dim=1)
        mask = torch.cat([mask, torch.ones_like(extra, dtype=mask.dtype)], dim=1)
    with torch.no_grad():
        out = ref.generate(
            input_ids=ids,
            attention_mask=mask,
            input_features=inputs["input_features"],
            input_features_mask=inputs["input_features_mask"],
            do_sample=False,
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            eos_token_id=IM_END,
            pad_token_id=PAD_ID,
        )
    return [row[ids.shape[1] :].tolist() for row in out]


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
    """Reference pipeline: processor (features, span, prompt) + transformers model (final
    hidden states [L, hidden]) and the prompt ids it used."""
    inputs = reference_inputs([clip])
    with torch.no_grad():
        out = ref.model(
            input_ids=inputs["input_ids"],
            input_features=inputs["input_features"],
            input_features_mask=inputs["input_features_mask"],
        )
    return out.last_hidden_state[0], inputs["input_ids"][0].tolist()


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
