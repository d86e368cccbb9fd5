"""MOSS-TD as one module: audio encoding, splicing audio embeddings into the prompt, the decoder.

Pipeline (MODEL.md sections 1-4): windows -> log-mel [n_win, 80, 3000] -> Whisper encoder
[n_win, 1500, d_audio] -> keep 4*T_w frames per window, merge 4 -> adaptor [T, hidden] -> these
rows replace, in order, the embeddings of the `<|audio_pad|>` ids of the prompt -> Qwen3.

`generate`/`generate_batch` are the simple greedy engine for offline jobs and tests, on
`DenseKVCache`; the serving engine drives `forward` with its own paged backend instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from livemeet.errors import InvalidRequest
from livemeet.layers.attention import AttentionBackend, DenseAttention, DenseKVCache
from livemeet.models.adaptor import Adaptor, merge_frames
from livemeet.models.config import MossTDConfig
from livemeet.models.qwen3 import Qwen3Model
from livemeet.models.whisper_encoder import WhisperEncoder


class MossTDModel(nn.Module):
    """Encoder + adaptor + decoder. Submodule names are the loader's canonical names:
    `audio_encoder.*`, `adaptor.{linear_1,linear_2,norm}.*`, `language_model.*`."""

    def __init__(self, cfg: MossTDConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.audio_encoder = WhisperEncoder(cfg.audio)
        self.adaptor = Adaptor(cfg)
        self.language_model = Qwen3Model(cfg.text)

    def encode_audio(
        self, features: torch.Tensor, tokens_per_window: Sequence[int]
    ) -> torch.Tensor:
        """features [n_win, 80, 3000] -> audio embeddings [sum(tokens_per_window), hidden].

        `tokens_per_window` comes from `split_windows` (375 per full window, ceil(N_w/1280) for
        the last). Windows are independent, so any subset can be encoded on its own.
        """
        frames = self.audio_encoder(features)
        merged = merge_frames(frames, tokens_per_window, self.cfg.merge_size)
        return self.adaptor(merged.to(self.adaptor.linear_1.weight.dtype))

    def embed_prompt(self, prompt_ids: torch.Tensor, audio_embeds: torch.Tensor) -> torch.Tensor:
        """prompt ids [L] -> embeddings [L, hidden], the k-th `<|audio_pad|>` row replaced by
        audio_embeds[k]. Raises InvalidRequest when the pad count differs from len(audio_embeds).
        """
        embeds = self.language_model.embed(prompt_ids)
        is_audio = prompt_ids == self.cfg.audio_token_id
        num_pads = int(is_audio.sum())
        if num_pads != audio_embeds.shape[0]:
            raise InvalidRequest(
                f"prompt has {num_pads} audio placeholders but the audio gives "
                f"{audio_embeds.shape[0]} embeddings"
            )
        embeds[is_audio] = audio_embeds.to(embeds.dtype)
        return embeds

    def forward(
        self, input_embeds: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """Decoder forward on a flat ragged batch; see `Qwen3Model.forward`."""
        return self.language_model(input_embeds, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden] -> logits [M, vocab]."""
        return self.language_model.compute_logits(hidden)

    def prepare_for_serving(self) -> None:
        """Build the decoder's and the encoder's fused projection weights
        (Qwen3Model.prepare_for_serving, WhisperEncoder.prepare_for_serving); call once after
        loading. On CUDA with Triton both then take their fused paths."""
        self.language_model.prepare_for_serving()
        self.audio_encoder.prepare_for_serving()

    def new_kv_cache(self) -> DenseKVCache:
        """An empty dense KV cache for one request, on the model's device and dtype."""
        weight = self.language_model.embed_tokens.weight
        t = self.cfg.text
        return DenseKVCache(
            t.layers, t.kv_heads, t.head_dim, dtype=weight.dtype, device=weight.device
        )


@torch.inference_mode()
def generate_batch(
    model: MossTDModel,
    prompt_ids: Sequence[torch.Tensor],
    audio_embeddings: Sequence[torch.Tensor],
    max_new_tokens: int,
    eos: int | Sequence[int],
) -> list[list[int]]:
    """Greedy decoding of several requests at once (ragged, no padding), dense KV cache.

    prompt_ids[i]: [L_i] int64; audio_embeddings[i]: [T_i, hidden]. Returns, per request, the
    new token ids, ending with the first EOS (included) or after max_new_tokens.
    Raises ValueError when max_new_tokens < 1, InvalidRequest on a placeholder count mismatch.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    eos_ids = {eos} if isinstance(eos, int) else set(eos)
    device = model.language_model.embed_tokens.weight.device
    prompts = [ids.to(device) for ids in prompt_ids]
    embeds = [
        model.embed_prompt(ids, a.to(device))
        for ids, a in zip(prompts, audio_embeddings, strict=True)
    ]
    caches = [model.new_kv_cache() for _ in prompts]
    positions = torch.cat([torch.arange(len(ids), device=device) for ids in prompts])
    lengths = [len(ids) for ids in prompts]
    attn = DenseAttention(caches, lengths)
    hidden = model(torch.cat(embeds), positions, attn)
    last_rows = attn.cu_seqlens_q[1:].to(device) - 1
    next_ids = model.compute_logits(hidden[last_rows]).argmax(-1).tolist()

    outputs: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    while True:
        still = []
        for i, token in zip(active, next_ids, strict=True):
            outputs[i].append(token)
            if token not in eos_ids and len(outputs[i]) < max_new_tokens:
                still.append(i)
        active = still
        if not active:
            return outputs
        tokens = torch.tensor([outputs[i][-1] for i in active], device=device)
        positions = torch.tensor([lengths[i] + len(outputs[i]) - 1 for i in active], device=device)
        attn = DenseAttention([caches[i] for i in active], [1] * len(active))
        hidden = model(model.language_model.embed(tokens), positions, attn)
        next_ids = model.compute_logits(hidden).argmax(-1).tolist()


def generate(
    model: MossTDModel,
    prompt_ids: torch.Tensor,
    audio_embeddings: torch.Tensor,
    max_new_tokens: int,
    eos: int | Sequence[int],
) -> list[int]:
    """Greedy decoding of one request; see `generate_batch`."""
    return generate_batch(model, [prompt_ids], [audio_embeddings], max_new_tokens, eos)[0]
