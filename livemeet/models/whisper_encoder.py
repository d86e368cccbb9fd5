"""The Whisper-medium encoder MOSS-TD uses as its audio tower (MODEL.md section 2).

Conv stem (k3 s1, then k3 s2, exact GELU after each), a learned position table, pre-LN layers
with bidirectional multi-head attention (k_proj has no bias; q is scaled before the product)
and an exact-GELU MLP, then a final LayerNorm. No attention mask: zero padding is attended.
Parameter names match the checkpoint's `whisper_encoder.` subtree.

The serving path (CUDA with Triton, once `prepare_for_serving` ran; `fused` below) computes
the same ops with fewer passes over the activations: q, k and v come from one projection (the
separate weights become views of it), the attention kernel applies the scale to the scores
instead of a kernel scaling q first, and each residual add runs in one kernel with the
LayerNorm after it (livemeet.layers.fused.add_layer_norm). Whisper's scale is 64**-0.5 =
1/8, a power of two, so scaling the fp32 scores gives the reference's scores of the
pre-scaled q bit for bit (flash and cuDNN attention multiply the fp32 scores by it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livemeet.errors import InternalError
from livemeet.layers import fused as fk
from livemeet.layers.linear import fuse_linears
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
        # [3 d, d] and [3 d]: the q, k and v rows (q/k/v_proj weights and biases become views;
        # k has no bias: zeros)
        self.qkv_weight: torch.Tensor | None
        self.qkv_bias: torch.Tensor | None
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)

    @torch.no_grad()
    def fuse_weights(self) -> None:
        """Build `qkv_weight`/`qkv_bias` and re-point q/k/v_proj's weights and q/v's biases at
        their slices (one copy in memory; the checkpoint names and the reference path are
        unchanged). Idempotent."""
        if self.qkv_weight is not None:
            return
        self.qkv_weight, self.qkv_bias = fuse_linears((self.q_proj, self.k_proj, self.v_proj))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reference path: x [n_win, frames, d] -> [n_win, frames, d]."""
        batch, frames, _ = x.shape  # [n_win, 1500, d]

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, frames, self.heads, -1).transpose(1, 2)  # [n_win, H, 1500, hd]

        # Scaling q before the product (not inside softmax) is the reference's rounding order.
        q = split(self.q_proj(x) * self.scale)
        k, v = split(self.k_proj(x)), split(self.v_proj(x))
        return self._attend(q, k, v)

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` with the one qkv projection (needs `fuse_weights`)."""
        if self.qkv_weight is None:
            raise InternalError("the fused encoder path needs prepare_for_serving() first")
        batch, frames, _ = x.shape
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)  # [n_win, 1500, 3 d]
        # strided views [n_win, H, 1500, hd] of it, last dim contiguous (what SDPA needs)
        q, k, v = qkv.view(batch, frames, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return self._attend(q, k, v, self.scale)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float = 1.0
    ) -> torch.Tensor:
        batch, _, frames, _ = q.shape
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
        return self.out_proj(out.transpose(1, 2).reshape(batch, frames, -1))


class EncoderLayer(nn.Module):
    """Pre-LN transformer layer: x + attn(LN(x)), then x + fc2(gelu(fc1(LN(x))))."""

    def __init__(self, cfg: AudioConfig) -> None:
        super().__init__()
        self.self_attn = EncoderAttention(cfg.d_model, cfg.heads)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn)
        self.fc2 = nn.Linear(cfg.ffn, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP branch on normed input: fc2(gelu(fc1(x)))."""
        return self.fc2(F.gelu(self.fc1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.mlp(self.final_layer_norm(x))


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
        self._typed_layers: list[EncoderLayer] = list(self.layers)  # type: ignore[arg-type]
        self.layer_norm = nn.LayerNorm(cfg.d_model)
        # True: fused path (Triton kernels; forced on CPU it runs them in the interpreter);
        # False: reference path; None: fused on CUDA with Triton once prepared, else reference.
        self.fused: bool | None = None

    @property
    def prepared(self) -> bool:
        """Whether `prepare_for_serving` built the fused qkv weights."""
        return all(layer.self_attn.qkv_weight is not None for layer in self._typed_layers)

    def prepare_for_serving(self) -> None:
        """Build every layer's fused qkv projection (after loading; idempotent). Before any
        CUDA graph of the encoder is captured (EncoderRunner does it first): q/k/v_proj are
        re-pointed at the fused weights, and a graph captured earlier would read their freed
        originals."""
        for layer in self._typed_layers:
            layer.self_attn.fuse_weights()

    def use_fused(self, x: torch.Tensor) -> bool:
        """Whether a forward on `x` takes the fused path (see `fused`)."""
        if self.fused is None:
            return x.is_cuda and fk.HAS_TRITON and self.prepared
        return self.fused

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
        if self.use_fused(x):
            return self._forward_fused(x)
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)

    def _forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        """The layers as (residual add + next LayerNorm) kernels around the two branches:
        LN1 of layer i+1 (or the final LN) follows layer i's MLP add."""
        if not self.prepared:
            raise InternalError("the fused encoder path needs prepare_for_serving() first")
        shape, width = x.shape, x.shape[-1]
        norms = [layer.self_attn_layer_norm for layer in self._typed_layers]
        normed, h = self._add_norm(x.view(-1, width), None, norms[0])
        for i, layer in enumerate(self._typed_layers):
            attn = layer.self_attn.forward_fused(normed.view(shape))
            normed, h = self._add_norm(h, attn.view(-1, width), layer.final_layer_norm)
            after = norms[i + 1] if i + 1 < len(norms) else self.layer_norm
            normed, h = self._add_norm(h, layer.mlp(normed), after)
        return normed.view(shape)

    def _add_norm(
        self, h: torch.Tensor, delta: torch.Tensor | None, norm: nn.LayerNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert norm.bias is not None  # Whisper's LayerNorms are affine with a bias
        return fk.add_layer_norm(h, delta, norm.weight, norm.bias, norm.eps, impl="triton")
