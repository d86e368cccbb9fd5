"""The Qwen3 text decoder of MOSS-TD (MODEL.md section 4), driven through an attention backend.

Shapes are flat and ragged: a forward takes the new tokens of all requests concatenated,
`input_embeds` [N, hidden] and `positions` [N], plus an `AttentionBackend`
(livemeet.layers.attention) that owns the KV cache and the per-request boundaries. It returns
the final-normed hidden states [N, hidden]; `compute_logits` applies the tied LM head only to
the rows the caller needs (usually each request's last token).

Per layer: x + o_proj(attn(RoPE(q_norm(q)), RoPE(k_norm(k)), v)), then x + SwiGLU(norm(x)).
q/k RMSNorms run over head_dim per head, before RoPE. Parameter names match the checkpoint's
`language_model.` subtree.

Two paths compute the same function. The reference path (the CPU default) is the plain module
code above. The fused path (the CUDA default once `prepare_for_serving` ran; livemeet.layers.fused)
carries (hidden, residual) between layers so that each residual add folds into the next RMSNorm,
and runs per layer: add+norm, qkv GEMM, q/k norm+RoPE (which also stores K/V when the backend
hands out a `kv_sink`; else attention stores them, one kernel more), attention (the CUDA
decode kernel merges its own splits; the Triton one adds a merge kernel for bf16), o_proj,
add+norm, gate_up GEMM, SiLU*mul, down_proj: ~9 kernels instead of ~55. At one row (decode
at batch 1) `LinearPlan` may fold each add+norm into the GEMM after it and SiLU*mul into
down_proj (livemeet.layers.linear), leaving 6; in a decode step on the CUDA decode kernel the
q/k norm+RoPE and K/V store move into that kernel's prologue (`AttentionBackend.attend_fused`),
one fewer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from livemeet.errors import InternalError
from livemeet.layers import fused as fk
from livemeet.layers.attention import AttentionBackend, QKNorms
from livemeet.layers.linear import LinearPlan, fuse_linears
from livemeet.layers.norm import RMSNorm
from livemeet.layers.paged_attention import KVSink
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
        # [(heads + 2 * kv_heads) * head_dim, hidden]; q/k/v_proj weights become views of it
        self.qkv_weight: torch.Tensor | None
        self.register_buffer("qkv_weight", None, persistent=False)

    @torch.no_grad()
    def fuse_weights(self) -> None:
        """Concatenate q/k/v_proj into `qkv_weight` and re-point them at its slices (one copy
        in memory; the checkpoint names and the reference path are unchanged). Idempotent."""
        if self.qkv_weight is not None:
            return
        projs = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight, _ = fuse_linears(projs)

    def split_qkv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        sink: KVSink | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """qkv [N, (heads + 2 kv_heads) * D] -> q [N, heads, D], k and v [N, kv_heads, D]:
        q/k RMSNorm and RoPE. With a `sink` the same kernel writes k and v into its caches
        and returns (q, None, None)."""
        q, k, v = self.qkv_views(qkv)
        qw, kw, eps = self.q_norm.weight, self.k_norm.weight, self.q_norm.eps
        if sink is not None:
            q = fk.qk_norm_rope_store_kv(
                q, k, v, qw, kw, eps, positions, inv_freq, sink, impl="triton"
            )
            return q, None, None
        q, k = fk.qk_norm_rope(q, k, qw, kw, eps, positions, inv_freq, impl="triton")
        return q, k, v

    def qkv_views(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [N, (heads + 2 kv_heads) * D] -> q [N, heads, D], k and v [N, kv_heads, D]:
        strided views into qkv (the kernels read them in place, no copies)."""
        n, d = qkv.shape[0], self.head_dim
        q_end, k_end = self.heads * d, (self.heads + self.kv_heads) * d
        q = qkv[:, :q_end].view(n, self.heads, d)
        k = qkv[:, q_end:k_end].view(n, self.kv_heads, d)
        v = qkv[:, k_end:].view(n, self.kv_heads, d)
        return q, k, v

    def attend_fused(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        attn: AttentionBackend,
    ) -> torch.Tensor | None:
        """Attention straight from the qkv projection [N, (heads + 2 kv_heads) * D], the
        backend doing the q/k RMSNorm, RoPE and K/V store (`AttentionBackend.attend_fused`: a
        decode step's kernel prologue); None where it cannot (then `split_qkv`, `attend`)."""
        q, k, v = self.qkv_views(qkv)
        norms = QKNorms(self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        return attn.attend_fused(self.layer, q, k, v, norms, positions, inv_freq, self.scale)

    def project_out(self, attn_out: torch.Tensor, plan: LinearPlan) -> torch.Tensor:
        """Attention output [N, heads, D] (or [N, heads * D]) -> o_proj output [N, hidden]."""
        n = attn_out.shape[0]
        return plan.linear(attn_out.reshape(n, self.heads * self.head_dim), self.o_proj.weight)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
    ) -> torch.Tensor:
        """The reference path: x [N, hidden] (N tokens of the flat batch), cos/sin [N, head_dim]
        -> [N, hidden]; `attn` stores the new K/V and attends."""
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
        # [2 * intermediate, hidden]: gate rows, then up rows; gate/up_proj become views of it
        self.gate_up_weight: torch.Tensor | None
        self.register_buffer("gate_up_weight", None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, hidden]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    @torch.no_grad()
    def fuse_weights(self) -> None:
        """Concatenate gate/up_proj into `gate_up_weight` (see Qwen3Attention.fuse_weights)."""
        if self.gate_up_weight is None:
            self.gate_up_weight, _ = fuse_linears((self.gate_proj, self.up_proj))


class Qwen3Layer(nn.Module):
    """One pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, cfg: TextConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(cfg, layer)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """The reference path: x [N, hidden], cos/sin [N, head_dim] -> [N, hidden]."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        attn: AttentionBackend,
        plan: LinearPlan,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) -> (mlp output, residual before it); the layer's output is their
        sum, which the next layer's (or the final) norm computes. residual None: first layer."""
        sa = self.self_attn
        qkv, residual = self._qkv(hidden, residual, plan)
        out = sa.attend_fused(qkv, positions, inv_freq, attn)  # a decode step: one kernel less
        if out is None:
            q, k, v = sa.split_qkv(qkv, positions, inv_freq, attn.kv_sink(sa.layer))
            out = attn.attend(sa.layer, q, k, v, sa.scale)
        return self.post_attention(out, residual, plan)

    def _qkv(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, plan: LinearPlan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual add + RMSNorm + qkv projection (one kernel at one row when tuned so):
        (qkv [N, (heads + 2 kv_heads) * D], the residual)."""
        norm, attn = self.input_layernorm, self.self_attn
        assert attn.qkv_weight is not None
        return plan.norm_linear(hidden, residual, norm.weight, norm.eps, attn.qkv_weight)

    def pre_attention(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        plan: LinearPlan,
        sink: KVSink | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The per-token work before attention: (hidden, residual) -> (q, k, v, residual);
        k = v = None when `sink` took them (`split_qkv`). With `post_attention` it is
        `forward_fused` cut at the attention call, which is where per-token work (capturable
        for any row count) meets per-sequence work."""
        qkv, residual = self._qkv(hidden, residual, plan)
        q, k, v = self.self_attn.split_qkv(qkv, positions, inv_freq, sink)
        return q, k, v, residual

    def post_attention(
        self, attn_out: torch.Tensor, residual: torch.Tensor, plan: LinearPlan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-token work after attention: (attention output, residual) -> (mlp output,
        residual before the MLP)."""
        h = self.self_attn.project_out(attn_out, plan)
        norm, mlp = self.post_attention_layernorm, self.mlp
        assert mlp.gate_up_weight is not None
        gate_up, residual = plan.norm_linear(h, residual, norm.weight, norm.eps, mlp.gate_up_weight)
        return plan.silu_mul_linear(gate_up, mlp.down_proj.weight), residual


class Qwen3Model(nn.Module):
    """Embeddings, decoder layers, final norm and the tied LM head (`compute_logits`)."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Qwen3Layer(cfg, i) for i in range(cfg.layers))
        self._typed_layers: list[Qwen3Layer] = list(self.layers)  # type: ignore[arg-type]
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        # True: fused path (Triton kernels; forced on CPU it runs them in the interpreter);
        # False: reference path; None: fused on CUDA with Triton once prepared, else reference.
        self.fused: bool | None = None
        # the fused path's projections: cuBLAS or skinny Triton kernels (tune_linears)
        self.linear_plan = LinearPlan()

    @property
    def prepared(self) -> bool:
        """Whether `prepare_for_serving` built the fused projection weights."""
        return all(layer.self_attn.qkv_weight is not None for layer in self._typed_layers)

    def prepare_for_serving(self) -> None:
        """Build the fused qkv and gate_up weights (after loading; idempotent). The separate
        projection parameters become views into them, so memory does not grow."""
        for layer in self._typed_layers:
            layer.self_attn.fuse_weights()
            layer.mlp.fuse_weights()

    def tune_linears(self) -> None:
        """Time cuBLAS against the skinny decode kernels for each projection shape (every
        layer has the same four, then the LM head) and let the fused path and
        `compute_logits` use the faster (CUDA; needs `prepare_for_serving`; a few seconds)."""
        if not self.prepared:
            raise InternalError("tune_linears needs prepare_for_serving() first")
        first = self._typed_layers[0]
        weights = (
            first.self_attn.qkv_weight,
            first.self_attn.o_proj.weight,
            first.mlp.gate_up_weight,
            first.mlp.down_proj.weight,
            # the tied LM head [vocab, hidden]: ~311 MB of bf16 read once a step, where cuBLAS
            # ran at ~0.7x the read bandwidth for one row (docs/benchmarks.md, session 46)
            self.embed_tokens.weight,
        )
        # at one row down_proj runs with SiLU*mul fused in, qkv and gate_up with the residual
        # add + RMSNorm before them: each also tuned as that kernel
        qkv, gate_up, down = weights[0], weights[2], weights[3]
        self.linear_plan.tune(
            (w for w in weights if w is not None),
            silu_weights=(down,),
            norm_weights=[w for w in (qkv, gate_up) if w is not None],
        )

    def use_fused(self, x: torch.Tensor) -> bool:
        """Whether a forward on `x` takes the fused path (see `fused`)."""
        if self.fused is None:
            return x.is_cuda and fk.HAS_TRITON and self.prepared
        return self.fused

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
        if self.use_fused(input_embeds):
            return self._forward_fused(input_embeds, positions, attn)
        cos, sin = self.rotary.cos_sin(positions, input_embeds.dtype)
        x = input_embeds
        for layer in self.layers:
            x = layer(x, cos, sin, attn)
        return self.norm(x)

    def _forward_fused(
        self, input_embeds: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        if not self.prepared:
            raise InternalError("the fused decoder path needs prepare_for_serving() first")
        inv_freq: torch.Tensor = self.rotary.inv_freq  # type: ignore[assignment]
        hidden, residual = input_embeds, None
        for layer in self._typed_layers:
            hidden, residual = layer.forward_fused(
                hidden, residual, positions, inv_freq, attn, self.linear_plan
            )
        return self.final_norm(hidden, residual)

    def final_norm(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The last layer's (mlp output, residual) -> normed hidden states [N, hidden]."""
        out, _ = fk.fused_add_rms_norm(
            hidden, residual, self.norm.weight, self.norm.eps, impl="triton"
        )
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden] -> logits [M, vocab] through the tied embedding matrix: the
        tuned skinny kernel for decode rows where `tune_linears` chose one, else F.linear
        (an untuned plan, the CPU)."""
        return self.linear_plan.linear(hidden, self.embed_tokens.weight)
