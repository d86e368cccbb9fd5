"""Token sampling on the device: greedy, or temperature + top-p (nucleus) sampling.

All rows are sampled in one batched call without host synchronisation; the caller copies the
result to the host once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from livemeet.errors import InvalidRequest
from livemeet.layers.argmax import greedy_argmax


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. `temperature` 0 means greedy (the reference default, MODEL.md 5.5).

    `top_p` in (0, 1] keeps the smallest set of tokens whose probability reaches it.
    Raises InvalidRequest for a negative temperature or top_p outside (0, 1].
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InvalidRequest(f"temperature must be >= 0, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], not {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits [M, vocab] (any float dtype) -> token ids [M] int64 on the same device.

    Greedy rows take argmax (ties: lowest id, as torch.argmax; on CUDA one Triton kernel,
    livemeet.layers.argmax); other rows sample from softmax(logits / temperature) restricted
    to the top-p nucleus.
    """
    greedy_ids = greedy_argmax(logits)
    if all(p.greedy for p in params):
        return greedy_ids
    temps = torch.tensor(
        [max(p.temperature, 1e-6) for p in params], device=logits.device, dtype=torch.float32
    )
    top_p = torch.tensor([p.top_p for p in params], device=logits.device, dtype=torch.float32)
    probs = torch.softmax(logits.float() / temps[:, None], dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Drop tokens whose preceding cumulative mass already reaches top_p (the top one survives).
    outside = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p[:, None]
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    picked = torch.multinomial(sorted_probs, 1, generator=generator).squeeze(-1)
    sampled_ids = order.gather(-1, picked[:, None]).squeeze(-1)
    is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
    return torch.where(is_greedy, greedy_ids, sampled_ids)
