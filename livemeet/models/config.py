"""MOSS-TD geometry, parsed from either config.json dialect (MODEL.md section 8.2).

Two dialects exist for the same model:
- upstream (OpenMOSS-Team/MOSS-Transcribe-Diarize): `audio_config` uses WhisperConfig names
  (`d_model`, `encoder_layers`, `encoder_attention_heads`, `encoder_ffn_dim`), the top level has
  `adaptor_input_dim`, `text_config` may carry `rope_theta` directly;
- HF-native (transformers >= 5.24): `audio_config` uses `hidden_size`, `num_hidden_layers`,
  `num_attention_heads`, `intermediate_size`; RoPE lives in `text_config.rope_parameters`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from livemeet.audio.constants import ENCODER_FRAMES, MERGE_SIZE, N_MELS
from livemeet.errors import ConfigError

log = logging.getLogger(__name__)

MODEL_TYPE = "moss_transcribe_diarize"
_AUDIO_MODEL_TYPES = ("whisper", "moss_transcribe_diarize_audio")
_TEXT_MODEL_TYPES = ("qwen3",)
# What transformers' Qwen3Config takes when config.json leaves a field out (the oracle's
# defaults, 4.x and 5.24 alike): the published checkpoint states both (MODEL.md 8.2).
QWEN3_DEFAULT_ROPE_THETA = 10_000.0
QWEN3_DEFAULT_HEAD_DIM = 128
QWEN3_DEFAULT_KV_HEADS = 32  # a null value means as many as the query heads
QWEN3_DEFAULT_MAX_POSITIONS = 32_768
QWEN3_DEFAULT_SLIDING_WINDOW = 4096  # tokens; used only with use_sliding_window
QWEN3_DEFAULT_MAX_WINDOW_LAYERS = 28  # the first layer that use_sliding_window makes sliding
# <|audio_pad|>'s id in the MOSS-TD tokenizer (MODEL.md 5.4): livemeet.models.tokenizer refuses
# a tokenizer that puts it elsewhere and livemeet.models.prompt builds every prompt with it, so a
# config.json naming another audio_token_id cannot be served (the reference would splice the
# audio at that id's tokens, or fail on the count).
AUDIO_TOKEN_ID = 151_671
# The front end's fixed geometry (MODEL.md 2, 3; livemeet/audio/constants.py): 80 mel bins,
# 1500 encoder frames per 30 s window, 4 frames merged per audio token. Other values would
# need another front end, so they are refused, not run wrongly.
FRONT_END_GEOMETRY = {
    "num_mel_bins": N_MELS,
    "max_source_positions": ENCODER_FRAMES,
    "audio_merge_size": MERGE_SIZE,
}

# (our field, upstream Whisper name, HF-native name)
_AUDIO_FIELDS = (
    ("d_model", "d_model", "hidden_size"),
    ("layers", "encoder_layers", "num_hidden_layers"),
    ("heads", "encoder_attention_heads", "num_attention_heads"),
    ("ffn", "encoder_ffn_dim", "intermediate_size"),
)


@dataclass(frozen=True)
class AudioConfig:
    """Whisper encoder geometry (MODEL.md section 2)."""

    d_model: int
    layers: int
    heads: int
    ffn: int
    num_mel_bins: int = 80
    max_source_positions: int = 1500  # encoder frames per 30 s window

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


@dataclass(frozen=True)
class TextConfig:
    """Qwen3 decoder geometry (MODEL.md section 4)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int = 151_936
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    max_position_embeddings: int = 131_072
    tie_word_embeddings: bool = True


@dataclass(frozen=True)
class MossTDConfig:
    """The whole model: encoder, 4x merge + adaptor, decoder, and the audio placeholder id."""

    audio: AudioConfig
    text: TextConfig
    audio_token_id: int = AUDIO_TOKEN_ID
    merge_size: int = 4

    @property
    def adaptor_input_dim(self) -> int:
        return self.audio.d_model * self.merge_size

    @staticmethod
    def real_size() -> MossTDConfig:
        """The published MOSS-TD 0.9B geometry (MODEL.md sections 0, 2, 4)."""
        return MossTDConfig(
            audio=AudioConfig(d_model=1024, layers=24, heads=16, ffn=4096),
            text=TextConfig(
                hidden=1024, intermediate=3072, layers=28, heads=16, kv_heads=8, head_dim=128
            ),
        )

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> MossTDConfig:
        """Parse a config.json mapping of either dialect. Raises ConfigError with the bad field."""
        if raw.get("model_type") != MODEL_TYPE:
            raise ConfigError(
                f"config model_type is {raw.get('model_type')!r}, expected {MODEL_TYPE!r} "
                "(is this a MOSS-Transcribe-Diarize checkpoint?)"
            )
        act = raw.get("projector_hidden_act", "silu")
        if act != "silu":  # transformers' default, and the published value (MODEL.md 3)
            raise ConfigError(f"projector_hidden_act {act!r} unsupported (expected 'silu')")
        if not _bool(raw, "projector_bias", True):
            raise ConfigError("projector_bias false is unsupported (MOSS-TD's adaptor has biases)")
        cfg = MossTDConfig(
            audio=_parse_audio(_section(raw, "audio_config")),
            text=_parse_text(_section(raw, "text_config"), raw),
            audio_token_id=_int(raw, "audio_token_id", AUDIO_TOKEN_ID),
            merge_size=_int(raw, "audio_merge_size", 4),
        )
        declared = raw.get("adaptor_input_dim")
        if declared is not None and declared != cfg.adaptor_input_dim:
            raise ConfigError(
                f"adaptor_input_dim {declared} != audio d_model {cfg.audio.d_model} "
                f"x audio_merge_size {cfg.merge_size}"
            )
        cfg.validate()
        return cfg

    @staticmethod
    def from_file(path: str | Path) -> MossTDConfig:
        """Read and parse a config.json. Raises ConfigError if unreadable or invalid."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read model config {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"model config {path} is not a JSON object")
        return MossTDConfig.from_dict(raw)

    def validate(self) -> None:
        """Raise ConfigError for geometry the model code cannot run."""
        a, t = self.audio, self.text
        sizes = {
            "audio d_model": a.d_model,
            "audio heads": a.heads,
            "audio ffn": a.ffn,
            "text hidden": t.hidden,
            "text intermediate": t.intermediate,
            "text heads": t.heads,
            "text kv_heads": t.kv_heads,
            "text head_dim": t.head_dim,
            "text vocab": t.vocab,
        }
        for name, size in sizes.items():
            if size < 1:
                raise ConfigError(f"unsupported model config: {name} {size} must be >= 1")
        geometry = {
            "num_mel_bins": a.num_mel_bins,
            "max_source_positions": a.max_source_positions,
            "audio_merge_size": self.merge_size,
        }
        for name, value in geometry.items():
            if value != FRONT_END_GEOMETRY[name]:
                raise ConfigError(
                    f"unsupported model config: {name} {value} (livemeet's audio front end "
                    f"runs MOSS-TD's {FRONT_END_GEOMETRY[name]} only)"
                )
        checks = [
            (
                a.d_model % a.heads == 0,
                f"audio d_model {a.d_model} not divisible by {a.heads} heads",
            ),
            (
                a.layers >= 1 and t.layers >= 1,
                f"need >= 1 layer: {a.layers} audio, {t.layers} text",
            ),
            (
                t.heads % t.kv_heads == 0,
                f"text heads {t.heads} not a multiple of {t.kv_heads} kv heads "
                f"(num_key_value_heads; Qwen3Config's default {QWEN3_DEFAULT_KV_HEADS} where left "
                "out)",
            ),
            (t.head_dim % 2 == 0, f"text head_dim {t.head_dim} must be even for RoPE"),
            (
                0 <= self.audio_token_id < t.vocab,
                f"audio_token_id {self.audio_token_id} not in vocab",
            ),
            (
                self.audio_token_id == AUDIO_TOKEN_ID,
                f"audio_token_id {self.audio_token_id} is not the id of the tokenizer's "
                f"<|audio_pad|> ({AUDIO_TOKEN_ID}), where livemeet's prompts put the audio",
            ),
            (t.tie_word_embeddings, "untied LM heads are not supported (MOSS-TD ties them)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"unsupported model config: {message}")


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    section = raw.get(name)
    if not isinstance(section, dict):
        raise ConfigError(f"model config has no {name!r} object")
    return section


def _int(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"model config field {key!r} must be an integer, got {value!r}")
    return value


def _bool(raw: dict[str, Any], key: str, default: bool) -> bool:
    # bool("false") is True and bool(None) False: a string or null was read as the opposite of
    # what it says, or refused as an untied head (transformers refuses both as not a bool)
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"model config field {key!r} must be true or false, got {value!r}")
    return value


def _parse_audio(raw: dict[str, Any]) -> AudioConfig:
    model_type = raw.get("model_type", "whisper")
    if model_type not in _AUDIO_MODEL_TYPES:
        raise ConfigError(
            f"audio_config model_type {model_type!r} is not one of {_AUDIO_MODEL_TYPES}"
        )
    act = raw.get("activation_function", "gelu")
    if act != "gelu":
        raise ConfigError(f"audio activation_function {act!r} unsupported (expected 'gelu')")
    values: dict[str, int] = {}
    for ours, upstream, native in _AUDIO_FIELDS:
        key = upstream if upstream in raw else native
        if key not in raw:
            raise ConfigError(f"audio_config needs {upstream!r} or {native!r}")
        values[ours] = _int(raw, key)
    return AudioConfig(
        **values,
        num_mel_bins=_int(raw, "num_mel_bins", 80),
        max_source_positions=_int(raw, "max_source_positions", 1500),
    )


def _rope_theta(raw: dict[str, Any]) -> float:
    params = raw.get("rope_parameters") or raw.get("rope_scaling")
    if isinstance(params, dict):
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"RoPE type {rope_type!r} unsupported (MOSS-TD uses 'default')")
        if "rope_theta" in params:
            return _float(params, "rope_theta")
    if "rope_theta" in raw:
        return _float(raw, "rope_theta")
    log.warning(
        "config.json gives no RoPE theta; using transformers' Qwen3 default %g (MOSS-TD's is "
        "1e6: check the checkpoint)",
        QWEN3_DEFAULT_ROPE_THETA,
    )
    return QWEN3_DEFAULT_ROPE_THETA


def _kv_heads(raw: dict[str, Any], heads: int) -> int:
    """As Qwen3Config: QWEN3_DEFAULT_KV_HEADS when left out, `heads` when null."""
    if "num_key_value_heads" in raw and raw["num_key_value_heads"] is None:
        return heads
    return _int(raw, "num_key_value_heads", QWEN3_DEFAULT_KV_HEADS)


def _float(raw: dict[str, Any], key: str) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"model config field {key!r} must be a number > 0, got {value!r}")
    return float(value)


def _check_layer_types(layer_types: Any, layers: int) -> None:
    """`layer_types`, when given, must name every layer "full_attention" (MODEL.md 8.2): the
    decoder runs nothing else, and transformers refuses a list of another length."""
    if layer_types is None:
        return
    if not isinstance(layer_types, list):
        raise ConfigError(f"text_config layer_types must be a list, got {layer_types!r}")
    if len(layer_types) != layers:
        raise ConfigError(
            f"text_config layer_types lists {len(layer_types)} layers, num_hidden_layers {layers}"
        )
    others = sorted({str(t) for t in layer_types} - {"full_attention"})
    if others:
        raise ConfigError(f"text_config layer_types {others} unsupported (only 'full_attention')")


def _check_implied_layer_types(raw: dict[str, Any], layers: int) -> None:
    """With no `layer_types`, Qwen3Config makes layers `max_window_layers` (default 28) and up
    sliding-window layers, only when `use_sliding_window` is true and `sliding_window` (default
    4096) is set: `use_sliding_window` alone leaves a decoder of fewer layers all full attention
    (and transformers' save_pretrained writes that list, which `_check_layer_types` reads).
    Raises ConfigError when a layer would be sliding."""
    if not raw.get("use_sliding_window", False):
        return
    if raw.get("sliding_window", QWEN3_DEFAULT_SLIDING_WINDOW) is None:
        return
    first = _int(raw, "max_window_layers", QWEN3_DEFAULT_MAX_WINDOW_LAYERS)
    if first < layers:
        raise ConfigError(
            f"text_config use_sliding_window makes layers {max(first, 0)}..{layers - 1} "
            f"sliding-window attention (max_window_layers {first} < num_hidden_layers {layers}): "
            "unsupported (MOSS-TD's decoder is full attention throughout)"
        )


def _parse_text(raw: dict[str, Any], top: dict[str, Any]) -> TextConfig:
    model_type = raw.get("model_type", "qwen3")
    if model_type not in _TEXT_MODEL_TYPES:
        raise ConfigError(f"text_config model_type {model_type!r} is not 'qwen3'")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(
            f"text hidden_act {raw.get('hidden_act')!r} unsupported (expected 'silu')"
        )
    if raw.get("attention_bias", False):
        raise ConfigError(
            "text_config attention_bias true is unsupported (MOSS-TD's decoder projections have "
            "no biases)"
        )
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [key for key in required if key not in raw]
    if missing:  # no default: transformers would take Qwen3Config's (32 layers), not MOSS-TD's
        raise ConfigError(f"text_config needs {', '.join(map(repr, missing))}")
    heads = _int(raw, "num_attention_heads")
    hidden = _int(raw, "hidden_size")
    layers = _int(raw, "num_hidden_layers")
    layer_types = raw.get("layer_types")
    if layer_types is None:
        _check_implied_layer_types(raw, layers)
    else:
        _check_layer_types(layer_types, layers)
    return TextConfig(
        hidden=hidden,
        intermediate=_int(raw, "intermediate_size"),
        layers=layers,
        heads=heads,
        kv_heads=_kv_heads(raw, heads),
        head_dim=_int(raw, "head_dim", QWEN3_DEFAULT_HEAD_DIM),
        vocab=_int(raw, "vocab_size", 151_936),
        rope_theta=_rope_theta(raw),
        rms_eps=_float(raw, "rms_norm_eps") if "rms_norm_eps" in raw else 1e-6,
        max_position_embeddings=_int(raw, "max_position_embeddings", QWEN3_DEFAULT_MAX_POSITIONS),
        tie_word_embeddings=_bool(top, "tie_word_embeddings", True),
    )
