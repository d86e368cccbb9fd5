"""Rotary position embedding, default (rotate-half / NeoX) layout, no scaling (MODEL.md section 4).

inv_freq[i] = theta^(-2i / head_dim) for i < head_dim / 2; angles are computed in float32 for the
given absolute positions, so ragged batches need no position tables.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """cos/sin for absolute positions and their application to q and k."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
        inv_freq = 1.0 / (theta**exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """positions [N] int -> (cos, sin), each [N, head_dim] in `dtype`."""
        return rope_cos_sin(positions, self.inv_freq, dtype)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [N] int, inv_freq [head_dim / 2] float32 -> (cos, sin), each [N, head_dim] in
    `dtype`; angles in float32."""
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, head_dim], cos/sin [N, head_dim] -> rotated x, same shape and dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
