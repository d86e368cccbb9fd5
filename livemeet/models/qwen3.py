"""The Qwen3 text decoder of MOSS-TD (MODEL.md section 4), driven through an attention backend.

Shapes are flat and ragged: a forward takes the new tokens of all requests concatenated,
`input_embeds` [N, hidden] and `positions` [N], plus an `AttentionBackend`
(livemeet.layers.attention) that owns the KV cache and the per-request boundaries. It returns
the final-normed hidden states [N, hidden]; `compute_logits` applies the tied LM head only to
the rows the caller needs (usually each request's last token).

Per layer: x + o_proj(attn(RoPE(q_norm(q)), RoPE(k_norm(k)), v)), then x + SwiGLU(norm(x)).
q/k RMSNorms run over head_dim per head, before RoPE. Parameter names match the checkpoint's
`language_model.` subtree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livemeet.layers.attention import AttentionBackend
from livemeet.layers.norm import RMSNorm
from livemeet.layers.rotary import RotaryEmbedding, apply_rotary
from livemeet.models.config import TextConfig


class Qwen3Attention(nn.Module):
    """GQA self-attention with per-head q/k RMSNorm; no biases."""

    def __init__(self, cfg: TextConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(n, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = attn.attend(self.layer, q, k, v, self.scale)  # [N, heads, head_dim]
        return self.o_proj(out.reshape(n, self.heads * self.head_dim))


class Qwen3MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3Layer(nn.Module):
    def __init__(self, cfg: TextConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(cfg, layer)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    """Embeddings, decoder layers, final norm and the tied LM head (`compute_logits`)."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Qwen3Layer(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token ids [N] -> embeddings [N, hidden]."""
        return self.embed_tokens(token_ids)

    def forward(
        self, input_embeds: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """input_embeds [N, hidden], positions [N] (absolute, per request) -> hidden [N, hidden].

        `attn` stores this step's K/V and knows which rows belong to which request.
        """
        if input_embeds.ndim != 2 or positions.shape != input_embeds.shape[:1]:
            raise ValueError(
                f"need input_embeds [N, hidden] and positions [N], got "
                f"{tuple(input_embeds.shape)} and {tuple(positions.shape)}"
            )
        cos, sin = self.rotary.cos_sin(positions, input_embeds.dtype)
        x = input_embeds
        for layer in self.layers:
            x = layer(x, cos, sin, attn)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden] -> logits [M, vocab] through the tied embedding matrix."""
        return F.linear(hidden, self.embed_tokens.weight)
