"""RMSNorm as Qwen3 computes it (MODEL.md section 4): statistics in float32, weight applied last."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised over the last dim of size `dim`.

    The normalisation runs in float32 and is cast back to the input dtype before the weight is
    applied, which is the order the reference uses (it matters in bf16).
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim] -> weight * (x / sqrt(mean(x^2) + eps)): statistics in float32, cast back to
    x's dtype before the weight multiplies (the reference order)."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)
