"""The Whisper-medium encoder MOSS-TD uses as its audio tower (MODEL.md section 2).

Conv stem (k3 s1, then k3 s2, exact GELU after each), a learned position table, pre-LN layers
with bidirectional multi-head attention (k_proj has no bias; q is scaled before the product)
and an exact-GELU MLP, then a final LayerNorm. No attention mask: zero padding is attended.
Parameter names match the checkpoint's `whisper_encoder.` subtree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livemeet.models.config import AudioConfig


class EncoderAttention(nn.Module):
    """Bidirectional multi-head self-attention over one window's frames."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (d_model // heads) ** -0.5
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, frames, width = x.shape  # [n_win, 1500, d]

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, frames, self.heads, -1).transpose(1, 2)  # [n_win, H, 1500, hd]

        # Scaling q before the product (not inside softmax) is the reference's rounding order.
        q = split(self.q_proj(x) * self.scale)
        k, v = split(self.k_proj(x)), split(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        return self.out_proj(out.transpose(1, 2).reshape(batch, frames, width))


class EncoderLayer(nn.Module):
    """Pre-LN transformer layer: x + attn(LN(x)), then x + fc2(gelu(fc1(LN(x))))."""

    def __init__(self, cfg: AudioConfig) -> None:
        super().__init__()
        self.self_attn = EncoderAttention(cfg.d_model, cfg.heads)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn)
        self.fc2 = nn.Linear(cfg.ffn, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperEncoder(nn.Module):
    """Log-mel windows [n_win, 80, 3000] -> encoder frames [n_win, 1500, d_model].

    Runs in the dtype of its weights (features are cast). Raises ValueError for any other
    input shape: the position table fixes the window at 2 * max_source_positions mel frames.
    """

    def __init__(self, cfg: AudioConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, cfg.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, cfg.d_model)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        expected = (self.cfg.num_mel_bins, 2 * self.cfg.max_source_positions)
        if features.ndim != 3 or tuple(features.shape[1:]) != expected:
            raise ValueError(
                f"features must be [n_win, {expected[0]}, {expected[1]}], "
                f"got {tuple(features.shape)}"
            )
        x = features.to(dtype=self.conv1.weight.dtype, device=self.conv1.weight.device)
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))  # [n_win, d, 1500]
        # .contiguous(): the sum would keep the transposed layout of its first operand, and
        # every layer's LayerNorm would then copy x and every residual add run strided (a
        # third of an 8-window encode on an H200 went to those; same values either way)
        x = (x.transpose(1, 2) + self.embed_positions.weight).contiguous()
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)
