"""4x frame merge and the adaptor MLP ("VQAdaptor" upstream, "multi_modal_projector" in HF).

MODEL.md section 3: keep 4*T_w encoder frames of each window, merge them row-major into
[T_w, 4*d] (token i = frames 4i..4i+3 side by side), then LayerNorm(W2 silu(W1 m + b1) + b2)
with eps = text rms_norm_eps (1e-6, not the torch default).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from livemeet.models.config import MossTDConfig


def merge_frames(
    encoder_out: torch.Tensor, tokens_per_window: Sequence[int], merge_size: int
) -> torch.Tensor:
    """[n_win, frames, d] encoder output -> [sum(tokens), merge_size * d], windows in order.

    Window i keeps its first merge_size * tokens_per_window[i] frames. Raises ValueError when
    the counts do not match the windows or ask for more frames than a window has.
    """
    n_win, frames, width = encoder_out.shape
    if len(tokens_per_window) != n_win:
        raise ValueError(f"{len(tokens_per_window)} token counts for {n_win} windows")
    pieces = []
    for window, tokens in zip(encoder_out, tokens_per_window, strict=True):
        kept = merge_size * tokens
        if not 0 <= kept <= frames:
            raise ValueError(f"{tokens} tokens need {kept} frames, a window has {frames}")
        pieces.append(window[:kept].reshape(tokens, merge_size * width))
    return torch.cat(pieces, dim=0)


class Adaptor(nn.Module):
    """[T, merge_size * d_audio] -> [T, hidden]: Linear, SiLU, Linear, LayerNorm."""

    def __init__(self, cfg: MossTDConfig) -> None:
        super().__init__()
        hidden = cfg.text.hidden
        self.linear_1 = nn.Linear(cfg.adaptor_input_dim, hidden)
        self.linear_2 = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=cfg.text.rms_eps)

    def forward(self, merged: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear_2(F.silu(self.linear_1(merged))))
