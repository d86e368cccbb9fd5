"""The two published checkpoint dialects of MOSS-TD and livemeet's canonical parameter names.

MODEL.md section 8.1: the OpenMOSS ("upstream") checkpoint names the encoder
`model.whisper_encoder.*` and the adaptor `model.vq_adaptor.layers.{0,2,3}.*`; transformers'
native classes ("hf") name them `model.audio_tower.*` and
`model.multi_modal_projector.{linear_1,linear_2,norm}.*`; the language model is
`model.language_model.*` in both. Our modules use `audio_encoder.*`, `adaptor.{linear_1,
linear_2,norm}.*` and `language_model.*`. One table serves the loader (checkpoint -> ours) and
the tools that hand our weights to the transformers reference (ours -> checkpoint).
"""

from __future__ import annotations

from typing import Any, Literal

from livemeet.models.config import MossTDConfig

Dialect = Literal["upstream", "hf"]

# (our canonical prefix, upstream prefix, HF-native prefix)
PREFIXES = (
    ("audio_encoder.", "model.whisper_encoder.", "model.audio_tower."),
    ("adaptor.linear_1.", "model.vq_adaptor.layers.0.", "model.multi_modal_projector.linear_1."),
    ("adaptor.linear_2.", "model.vq_adaptor.layers.2.", "model.multi_modal_projector.linear_2."),
    ("adaptor.norm.", "model.vq_adaptor.layers.3.", "model.multi_modal_projector.norm."),
    ("language_model.", "model.language_model.", "model.language_model."),
)


def canonical_name(checkpoint_key: str) -> str | None:
    """Our parameter name for a key of either dialect, or None for an unknown prefix."""
    for ours, upstream, native in PREFIXES:
        for prefix in (upstream, native):
            if checkpoint_key.startswith(prefix):
                return ours + checkpoint_key[len(prefix) :]
    return None


def checkpoint_key(name: str, dialect: Dialect) -> str:
    """Our canonical parameter name -> its key in an "upstream" or "hf" checkpoint.

    Raises KeyError for a name outside the three towers (e.g. a rotary buffer).
    """
    for ours, upstream, native in PREFIXES:
        if name.startswith(ours):
            return (upstream if dialect == "upstream" else native) + name[len(ours) :]
    raise KeyError(name)


def hf_config(cfg: MossTDConfig) -> Any:
    """The transformers-native `MossTranscribeDiarizeConfig` with `cfg`'s geometry (needs
    transformers >= 5.24; imported here only)."""
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
