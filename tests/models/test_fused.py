"""Fused decoder kernels (livemeet.layers.fused) against their torch references, and the tiny
decoder's fused path against its reference path.

On a CPU-only machine the kernels run under the Triton interpreter in float32 on small shapes;
`gpu`-marked tests repeat the comparisons in bf16 on CUDA at the real decoder's shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from livemeet.errors import ConfigError, InternalError
from livemeet.layers import fused, paged_attention_kernels
from livemeet.layers import paged_attention as pa
from livemeet.layers.attention import DenseAttention
from livemeet.layers.paged_attention_ref import ref_store_kv
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.loader import load_model
from livemeet.models.qwen3 import Qwen3Model
from tests.kernels import interpreted, kernel_marks

fused = interpreted(fused, "_silu_and_mul_kernel")
paged_attention_kernels = interpreted(paged_attention_kernels, "_store_kv_kernel")
needs_interpreter, needs_cuda = kernel_marks(fused)
gpu = pytest.mark.gpu

THETA = 1_000_000.0  # Qwen3's rope_theta (MODEL.md section 4)


def inv_freq(head_dim: int, device: str = "cpu") -> torch.Tensor:
    from livemeet.layers.rotary import RotaryEmbedding

    return RotaryEmbedding(head_dim, THETA).inv_freq.to(device)


def check_add_rms_norm(n: int, dim: int, dtype: torch.dtype, device: str, atol: float) -> None:
    x = torch.randn(n, dim, device=device).to(dtype)
    res = torch.randn(n, dim, device=device).to(dtype)
    w = (1 + 0.1 * torch.randn(dim, device=device)).to(dtype)
    for r in (None, res):
        out, new_r = fused.fused_add_rms_norm(x, r, w, 1e-6, impl="triton")
        ref, ref_r = fused.ref_fused_add_rms_norm(x, r, w, 1e-6)
        assert out.dtype == ref.dtype and new_r.dtype == ref_r.dtype
        if device == "cuda" or dtype == torch.float32:
            assert torch.equal(new_r, ref_r)  # one rounded add: exact
        else:  # the interpreter truncates fp32 -> bf16 instead of rounding to nearest
            torch.testing.assert_close(new_r.float(), ref_r.float(), atol=atol, rtol=atol)
        torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)


def check_qk_norm_rope(
    n: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    max_pos: int,
    dtype: torch.dtype,
    device: str,
    atol: float,
) -> None:
    # q and k as strided slices of one fused qkv row, like the decoder's fast path
    qkv = torch.randn(n, (heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
    q = qkv[:, : heads * head_dim].view(n, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(n, kv_heads, head_dim)
    qw = (3 + 0.3 * torch.randn(head_dim, device=device)).to(dtype)
    kw = (3 + 0.3 * torch.randn(head_dim, device=device)).to(dtype)
    pos = torch.randint(0, max_pos, (n,), device=device)
    pos[0] = max_pos - 1
    freq = inv_freq(head_dim, device)
    out_q, out_k = fused.qk_norm_rope(q, k, qw, kw, 1e-6, pos, freq, impl="triton")
    ref_q, ref_k = fused.ref_qk_norm_rope(q, k, qw, kw, 1e-6, pos, freq)
    assert out_q.shape == q.shape and out_k.shape == k.shape
    rtol = min(atol, 1.6e-2)  # bf16: one ulp relative; atol covers one-ulp flips of the
    # ~3x-weighted products before they cancel in x*cos - y*sin
    torch.testing.assert_close(out_q.float(), ref_q.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(out_k.float(), ref_k.float(), atol=atol, rtol=rtol)


def check_qk_norm_rope_store_kv(
    n: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    device: str,
) -> None:
    """The one-launch rotate-and-store against `qk_norm_rope` then `store_kv` (both Triton):
    the same q, and caches equal byte for byte, padding rows (slot -1) and every other slot
    untouched; for an fp32 cache also against the torch references."""
    qkv = (2 * torch.randn(n, (heads + 2 * kv_heads) * head_dim, device=device)).to(dtype)
    q = qkv[:, : heads * head_dim].view(n, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(n, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].view(n, kv_heads, head_dim)
    qw = (3 + 0.3 * torch.randn(head_dim, device=device)).to(dtype)
    kw = (3 + 0.3 * torch.randn(head_dim, device=device)).to(dtype)
    pos = torch.randint(0, 100_000, (n,), device=device)
    freq = inv_freq(head_dim, device)
    num_blocks = n // block_size + 3
    slots = torch.randperm(num_blocks * block_size, device=device)[:n]
    slots[::3] = -1  # padding rows
    # stale values everywhere: a slot written by mistake shows
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, device=device).to(cache_dtype)
    v_cache = torch.randn(shape, device=device).to(cache_dtype)
    scale = 0.5 if cache_dtype == torch.float8_e4m3fn else 1.0
    got_k, got_v = k_cache.clone(), v_cache.clone()
    sink = pa.KVSink(got_k, got_v, slots, scale)
    got_q = fused.qk_norm_rope_store_kv(q, k, v, qw, kw, 1e-6, pos, freq, sink, impl="triton")
    want_q, want_k = fused.qk_norm_rope(q, k, qw, kw, 1e-6, pos, freq, impl="triton")
    two_k, two_v = k_cache.clone(), v_cache.clone()
    pa.store_kv(want_k, v, two_k, two_v, slots, k_scale=scale, v_scale=scale, impl="triton")
    assert torch.equal(got_q, want_q)
    for got, want in ((got_k, two_k), (got_v, two_v)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    if cache_dtype == torch.float32:
        ref_q, ref_k = fused.ref_qk_norm_rope(q, k, qw, kw, 1e-6, pos, freq)
        ref_kc, ref_vc = k_cache.clone(), v_cache.clone()
        ref_store_kv(ref_k, v, ref_kc, ref_vc, slots)
        atol = 2e-6 if dtype == torch.float32 else 0.125
        torch.testing.assert_close(got_q.float(), ref_q.float(), atol=atol, rtol=1.6e-2)
        torch.testing.assert_close(got_k, ref_kc, atol=atol, rtol=1.6e-2)
        assert torch.equal(got_v, ref_vc)  # v is only copied


def check_silu_and_mul(n: int, inter: int, dtype: torch.dtype, device: str, atol: float) -> None:
    gate_up = (3 * torch.randn(n, 2 * inter, device=device)).to(dtype)
    out = fused.silu_and_mul(gate_up, impl="triton")
    ref = fused.ref_silu_and_mul(gate_up)
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)


# ---------------------------------------------------------------------------------------------
# references agree with the modules they replace (CPU, always)
# ---------------------------------------------------------------------------------------------


def test_references_match_norm_and_rotary_modules() -> None:
    from livemeet.layers.norm import RMSNorm
    from livemeet.layers.rotary import RotaryEmbedding, apply_rotary

    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        norm = RMSNorm(16, 1e-6).to(dtype)
        with torch.no_grad():
            norm.weight.normal_()
        x = torch.randn(5, 3, 16).to(dtype)
        k = torch.randn(5, 2, 16).to(dtype)
        pos = torch.tensor([0, 7, 99_999, 4096, 31])
        rot = RotaryEmbedding(16, THETA)
        cos, sin = rot.cos_sin(pos, dtype)
        q_ref, k_ref = fused.ref_qk_norm_rope(
            x, k, norm.weight.data, norm.weight.data, 1e-6, pos, rot.inv_freq
        )
        with torch.no_grad():
            assert torch.equal(q_ref, apply_rotary(norm(x), cos, sin))
            assert torch.equal(k_ref, apply_rotary(norm(k), cos, sin))
            r = torch.randn(5, 16).to(dtype)
            out, new_r = fused.ref_fused_add_rms_norm(x[:, 0], r, norm.weight.data, 1e-6)
            assert torch.equal(new_r, x[:, 0] + r) and torch.equal(out, norm(x[:, 0] + r))


def test_bad_shapes_are_internal_errors() -> None:
    x = torch.randn(3, 8)
    with pytest.raises(InternalError, match="weight"):
        fused.fused_add_rms_norm(x, None, torch.ones(4), 1e-6)
    with pytest.raises(InternalError, match="residual"):
        fused.fused_add_rms_norm(x, torch.randn(2, 8), torch.ones(8), 1e-6)
    q, k = torch.randn(3, 4, 8), torch.randn(3, 2, 8)
    with pytest.raises(InternalError, match="inv_freq"):
        fused.qk_norm_rope(q, k, torch.ones(8), torch.ones(8), 1e-6, torch.arange(3), x[0])
    with pytest.raises(InternalError, match="dtype"):
        fused.qk_norm_rope(q, k, torch.ones(8).double(), torch.ones(8), 1e-6, torch.arange(3),
                           torch.ones(4))  # fmt: skip
    with pytest.raises(InternalError, match="2I"):
        fused.silu_and_mul(torch.randn(3, 7))


def test_triton_impl_without_triton_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "HAS_TRITON", False)
    with pytest.raises(ConfigError, match="triton"):
        fused.silu_and_mul(torch.randn(2, 8), impl="triton")


# ---------------------------------------------------------------------------------------------
# Triton kernels under the interpreter (CPU, small shapes)
# ---------------------------------------------------------------------------------------------


@needs_interpreter
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 1.6e-2)])
def test_add_rms_norm_interpreted(dtype: torch.dtype, atol: float) -> None:
    torch.manual_seed(1)
    check_add_rms_norm(5, 48, dtype, "cpu", atol)  # odd N, non-power-of-two width
    check_add_rms_norm(0, 48, dtype, "cpu", atol)


# both forms of the qk kernel: per (row, head) below QK_ROWS_KERNEL_MIN_ROWS rows, per row from
# it (a threshold of 1 runs the small tests on the row form)
KERNEL_FORMS = pytest.mark.parametrize("min_rows", [fused.QK_ROWS_KERNEL_MIN_ROWS, 1])


@needs_interpreter
@KERNEL_FORMS
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 1), (2, 2)])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 0.125)])
def test_qk_norm_rope_interpreted(
    heads: int,
    kv_heads: int,
    dtype: torch.dtype,
    atol: float,
    min_rows: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fused, "QK_ROWS_KERNEL_MIN_ROWS", min_rows)
    torch.manual_seed(2)
    check_qk_norm_rope(3, heads, kv_heads, 16, 100_000, dtype, "cpu", atol)


@needs_interpreter
@KERNEL_FORMS
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.float32, torch.float32), (torch.float32, torch.float8_e4m3fn)],
)
def test_qk_norm_rope_store_kv_interpreted(
    block_size: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    min_rows: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fused, "QK_ROWS_KERNEL_MIN_ROWS", min_rows)
    torch.manual_seed(3)
    check_qk_norm_rope_store_kv(7, 4, 2, 16, block_size, dtype, cache_dtype, "cpu")
    # head counts that are not powers of two: the row form masks the padded heads' stores
    check_qk_norm_rope_store_kv(5, 6, 3, 16, block_size, dtype, cache_dtype, "cpu")
    check_qk_norm_rope_store_kv(5, 3, 1, 16, block_size, dtype, cache_dtype, "cpu")


@needs_interpreter
def test_qk_kernel_forms_store_the_same_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row form against the (row, head) form over one step of fp32 tensors, padding rows
    included: q and the caches agree within the fp32 reduction order (a head's sum of squares
    is reduced in another order), v exactly, and slots no row owns keep their stale values."""
    torch.manual_seed(4)
    n, heads, kv_heads, dim, block = 9, 4, 2, 16, 16
    qkv = (2 * torch.randn(n, (heads + 2 * kv_heads) * dim)).to(torch.float32)
    q = qkv[:, : heads * dim].view(n, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(n, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(n, kv_heads, dim)
    qw, kw = (3 + 0.3 * torch.randn(dim) for _ in "qk")
    pos = torch.randint(0, 100_000, (n,))
    slots = torch.randperm(4 * block)[:n]
    slots[::4] = -1
    outs = []
    for min_rows in (n + 1, 1):  # the (row, head) form, then the row form
        monkeypatch.setattr(fused, "QK_ROWS_KERNEL_MIN_ROWS", min_rows)
        caches = [torch.full((4, block, kv_heads, dim), 7.0) for _ in "kv"]
        sink = pa.KVSink(caches[0], caches[1], slots, 1.0)
        q_out = fused.qk_norm_rope_store_kv(
            q, k, v, qw, kw, 1e-6, pos, inv_freq(dim, "cpu"), sink, impl="triton"
        )
        outs.append((q_out, *caches))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-6)
    assert torch.equal(outs[0][2], outs[1][2])  # v is copied: exact
    written = torch.zeros(4 * block, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    for _, k_cache, v_cache in outs:
        for cache in (k_cache, v_cache):
            rows = cache.view(4 * block, -1)
            assert bool((rows[~written] == 7.0).all())  # never written: stale
            assert not bool((rows[written] == 7.0).any())  # every owned slot written


def test_qk_kernel_form_by_rows() -> None:
    assert fused.qk_rows_kernel(fused.QK_ROWS_KERNEL_MIN_ROWS)
    assert not fused.qk_rows_kernel(fused.QK_ROWS_KERNEL_MIN_ROWS - 1)
    assert fused.qk_rows_kernel(3072) and not fused.qk_rows_kernel(1)


def test_qk_norm_rope_store_kv_checks_its_sink() -> None:
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    cache = torch.zeros(2, 16, 2, 16)
    args = (torch.ones(16), torch.ones(16), 1e-6, torch.arange(3), inv_freq(16))
    with pytest.raises(InternalError, match="slots"):
        sink = pa.KVSink(cache, cache.clone(), torch.arange(2))
        fused.qk_norm_rope_store_kv(q, k, k, *args, sink)
    with pytest.raises(InternalError, match="v must match"):
        sink = pa.KVSink(cache, cache.clone(), torch.arange(3))
        fused.qk_norm_rope_store_kv(q, k, k[:, :1], *args, sink)
    with pytest.raises(InternalError, match="do not fit"):
        sink = pa.KVSink(torch.zeros(2, 16, 1, 16), torch.zeros(2, 16, 1, 16), torch.arange(3))
        fused.qk_norm_rope_store_kv(q, k, k, *args, sink)
    for impl in ("torch", "triton"):  # as store_kv: the kernel's slot * stride needs int64
        with pytest.raises(InternalError, match="int64"):
            sink = pa.KVSink(cache, cache.clone(), torch.arange(3, dtype=torch.int32))
            fused.qk_norm_rope_store_kv(q, k, k, *args, sink, impl=impl)  # type: ignore[arg-type]


@needs_interpreter
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 1.6e-2)])
def test_silu_and_mul_interpreted(dtype: torch.dtype, atol: float) -> None:
    torch.manual_seed(3)
    check_silu_and_mul(3, 40, dtype, "cpu", atol)
    check_silu_and_mul(1, 8, dtype, "cpu", atol)


# ---------------------------------------------------------------------------------------------
# the tiny decoder: fused path (forced, interpreter) against the reference path
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(upstream_dir: Path) -> MossTDModel:
    """A private copy of the tiny model (the tests flip its `fused` flag)."""
    model, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    model.prepare_for_serving()
    return model


def _greedy(model: MossTDModel, prompt: torch.Tensor, steps: int) -> tuple[list[int], list]:
    """Greedy decode on a dense cache; returns the tokens and each step's logits."""
    lm, dev = model.language_model, prompt.device
    attn = DenseAttention([model.new_kv_cache()], [len(prompt)])
    hidden = model(lm.embed(prompt), torch.arange(len(prompt), device=dev), attn)
    logits = [model.compute_logits(hidden[-1:])]
    tokens = [int(logits[-1].argmax())]
    for i in range(steps - 1):
        attn = DenseAttention(attn.caches, [1])
        pos = torch.tensor([len(prompt) + i], device=dev)
        hidden = model(lm.embed(torch.tensor(tokens[-1:], device=dev)), pos, attn)
        logits.append(model.compute_logits(hidden))
        tokens.append(int(logits[-1].argmax()))
    return tokens, logits


@needs_interpreter
@torch.no_grad()
def test_tiny_decoder_fused_matches_reference(
    tiny_model: MossTDModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = tiny_model.language_model
    calls = []
    real = fused.silu_and_mul
    monkeypatch.setattr(fused, "silu_and_mul", lambda *a, **k: calls.append(k) or real(*a, **k))
    prompt = torch.tensor([151644, 872, 198, 58, 15, 13, 15, 15, 60, 42474, 16, 60, 220])
    try:
        lm.fused = False
        ref_tokens, ref_logits = _greedy(tiny_model, prompt, 6)
        lm.fused = True
        tokens, logits = _greedy(tiny_model, prompt, 6)
    finally:
        lm.fused = None
    # the forced run took the fused path: one Triton silu_and_mul per layer and step
    assert calls == [{"impl": "triton"}] * (3 * 6)
    assert tokens == ref_tokens
    for ours, ref in zip(logits, ref_logits, strict=True):
        scale = float(ref.abs().max())
        assert float((ours - ref).abs().max()) <= 1e-5 * scale


def _paged_steps(model: MossTDModel, prompt: torch.Tensor, steps: int, block_size: int = 16):
    """Prefill `prompt`, then `steps` one-token steps, on a fresh paged KV pool (block table
    0, 1, 2, ...); returns each forward's hidden states and the pool's caches."""
    from livemeet.engine.paged_backend import PagedAttentionBackend, StepMetadata

    lm, cfg = model.language_model, model.language_model.cfg
    shape = (4, block_size, cfg.kv_heads, cfg.head_dim)
    k_caches = [torch.zeros(shape) for _ in range(cfg.layers)]
    v_caches = [torch.zeros(shape) for _ in range(cfg.layers)]
    table = torch.arange(4, dtype=torch.int32)[None]
    ids, start, outputs = prompt, 0, []
    for _ in range(steps + 1):
        n = len(ids)
        meta = StepMetadata(
            slot_mapping=torch.arange(start, start + n),
            block_tables=table,
            seq_lens=torch.tensor([start + n], dtype=torch.int32),
            cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
            max_seqlen_q=n,
            max_seq_len=start + n,
            decode_only=n == 1,
        )
        attn = PagedAttentionBackend(k_caches, v_caches, meta)
        hidden = lm(lm.embed(ids), torch.arange(start, start + n), attn)
        outputs.append(hidden)
        ids, start = model.compute_logits(hidden[-1:]).argmax(-1), start + n
    return outputs, k_caches + v_caches


@needs_interpreter
@torch.no_grad()
def test_tiny_decoder_stores_kv_through_the_sink(
    tiny_model: MossTDModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused path on paged KV: with the sink the rotation kernel stores K/V (store_kv
    never runs) and every output and cache equals the run where attention stores them."""
    from livemeet.engine import paged_backend

    lm = tiny_model.language_model
    prompt = torch.tensor([151644, 872, 198, 58, 15, 13, 15, 15, 60, 42474, 16, 60, 220])
    stores: list[int] = []
    real_store = paged_backend.store_kv

    def counted_store(k: torch.Tensor, *args: object, **kwargs: object) -> None:
        stores.append(k.shape[0])
        real_store(k, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(paged_backend, "store_kv", counted_store)
    try:
        lm.fused = True
        monkeypatch.setattr(paged_backend, "_fused_store", False)
        want, want_caches = _paged_steps(tiny_model, prompt, 3)
        assert stores == [13] * 3 + [1] * (3 * 3)  # 3 layers: prefill, then 3 decode steps
        monkeypatch.setattr(paged_backend, "_fused_store", True)
        stores.clear()
        got, got_caches = _paged_steps(tiny_model, prompt, 3)
    finally:
        lm.fused = None
    assert stores == []
    for ours, ref in zip(got + got_caches, want + want_caches, strict=True):
        assert torch.equal(ours, ref)
    assert all(float(c[0, :13].abs().sum()) > 0 for c in got_caches)  # the prompt was stored


@needs_interpreter
@torch.no_grad()
def test_tiny_decoder_on_skinny_kernels_matches_reference(
    tiny_model: MossTDModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every projection on the Triton skinny kernels (13-row prompt: the tl.dot kernel; 1-row
    decode: the row kernel, with SiLU*mul fused into the down projection and the residual
    add + RMSNorm into qkv and gate_up), the LM head too: greedy tokens and logits of the
    reference path."""
    from livemeet.layers import linear

    norm_fused: list[int] = []
    real_norm_linear = linear.skinny_norm_linear
    monkeypatch.setattr(
        linear,
        "skinny_norm_linear",
        lambda x, *a, **k: norm_fused.append(x.shape[0]) or real_norm_linear(x, *a, **k),
    )
    head_rows: list[int] = []
    real_linear = linear.skinny_linear
    head = tiny_model.language_model.embed_tokens.weight

    def counted(x: torch.Tensor, w: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        if w is head:
            head_rows.append(x.shape[0])
        return real_linear(x, w, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(linear, "skinny_linear", counted)

    lm = tiny_model.language_model
    plan = linear.LinearPlan(impl="triton")
    first = lm._typed_layers[0]
    for w in (
        first.self_attn.qkv_weight,
        first.self_attn.o_proj.weight,
        first.mlp.gate_up_weight,
        first.mlp.down_proj.weight,
    ):
        assert w is not None
        for rows in (1, linear.SKINNY_MAX_M):
            plan.set_choice((w.shape[0], w.shape[1]), w.dtype, rows, linear.GemmConfig(16, 32))
    down = first.mlp.down_proj.weight
    plan.set_choice((down.shape[0], down.shape[1]), down.dtype, 1, linear.GemmConfig(16, 32),
                    prologue="silu_mul")  # fmt: skip
    for w in (first.self_attn.qkv_weight, first.mlp.gate_up_weight):  # norm folded in
        assert w is not None
        plan.set_choice((w.shape[0], w.shape[1]), w.dtype, 1, linear.GemmConfig(8, 32),
                        prologue="add_rms_norm")  # fmt: skip
    # the head [vocab, hidden]: wide slabs keep the interpreter's program count down
    plan.set_choice(tuple(head.shape), head.dtype, 1, linear.GemmConfig(1024, 32))
    prompt = torch.tensor([151644, 872, 198, 58, 15, 13, 15, 15, 60, 42474, 16, 60, 220])
    saved = lm.linear_plan
    try:
        lm.fused = False
        ref_tokens, ref_logits = _greedy(tiny_model, prompt, 6)
        lm.fused, lm.linear_plan = True, plan
        tokens, logits = _greedy(tiny_model, prompt, 6)
    finally:
        lm.fused, lm.linear_plan = None, saved
    assert tokens == ref_tokens
    for ours, ref in zip(logits, ref_logits, strict=True):
        assert float((ours - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    layers = len(lm._typed_layers)
    assert norm_fused == [1] * (2 * layers * 5)  # 5 one-row decode steps, 2 norms per layer
    assert head_rows == [1] * 6  # the prompt's last row, then each decode step's


def test_auto_mode_keeps_the_cpu_on_the_reference_path(tiny_model: MossTDModel) -> None:
    lm = tiny_model.language_model
    assert lm.fused is None and not lm.use_fused(torch.zeros(1))


def test_forced_fused_needs_prepared_weights() -> None:
    from tests.models.tiny import TINY

    lm = Qwen3Model(TINY.text)
    lm.fused = True
    attn = DenseAttention([MossTDModel(TINY).new_kv_cache()], [2])
    with pytest.raises(InternalError, match="prepare_for_serving"):
        lm(torch.zeros(2, TINY.text.hidden), torch.arange(2), attn)


def test_prepared_weights_are_views_of_the_fused_tensors(tiny_model: MossTDModel) -> None:
    layer = tiny_model.language_model.layers[0]
    att, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = att.qkv_weight, mlp.gate_up_weight
    assert qkv is not None and gate_up is not None
    for p in (att.q_proj.weight, att.k_proj.weight, att.v_proj.weight):
        assert p.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert torch.equal(qkv, torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]))
    assert torch.equal(gate_up, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    # state_dict (what the loader checks against) is unchanged
    names = set(tiny_model.state_dict())
    assert not any("qkv" in n or "gate_up" in n for n in names)
    tiny_model.prepare_for_serving()  # idempotent
    assert att.qkv_weight is qkv


# ---------------------------------------------------------------------------------------------
# CUDA (bf16, the real decoder's shapes: hidden 1024, 16/8 heads of 128, intermediate 3072)
# ---------------------------------------------------------------------------------------------


@gpu
@needs_cuda
def test_kernels_cuda_bf16() -> None:
    torch.manual_seed(20)
    for n in (1, 7, 300):
        check_add_rms_norm(n, 1024, torch.bfloat16, "cuda", 1.6e-2)
        check_qk_norm_rope(n, 16, 8, 128, 100_000, torch.bfloat16, "cuda", 0.125)
        check_silu_and_mul(n, 3072, torch.bfloat16, "cuda", 1.6e-2)
        for block_size in (16, 64):
            for cache_dtype in (torch.bfloat16, torch.float8_e4m3fn):
                check_qk_norm_rope_store_kv(
                    n, 16, 8, 128, block_size, torch.bfloat16, cache_dtype, "cuda"
                )
    check_qk_norm_rope(5, 16, 8, 128, 100_000, torch.float32, "cuda", 2e-5)
    check_qk_norm_rope_store_kv(5, 16, 8, 128, 16, torch.float32, torch.float32, "cuda")


@gpu
@needs_cuda
@torch.no_grad()
def test_tiny_decoder_fused_cuda_bf16(upstream_dir: Path) -> None:
    model, _ = load_model(str(upstream_dir), device="cuda", dtype="bfloat16")
    model.prepare_for_serving()
    lm = model.language_model
    assert lm.use_fused(lm.embed_tokens.weight)
    prompt = torch.tensor([151644, 872, 198, 58, 15, 13, 15, 15, 60, 42474, 16, 60, 220]).cuda()
    try:
        lm.fused = False
        ref_tokens, ref_logits = _greedy(model, prompt, 4)
        lm.fused = None
        tokens, logits = _greedy(model, prompt, 4)
    finally:
        lm.fused = None
    # bf16: the two paths round identically except for reduction order, so logits stay close
    for ours, ref in zip(logits, ref_logits, strict=True):
        scale = float(ref.float().abs().max())
        assert float((ours.float() - ref.float()).abs().max()) <= 5e-2 * scale
    first = ref_logits[0][0].float()
    # the first greedy token agrees unless the reference's top two are within the tolerance
    gap = float(first[ref_tokens[0]] - first[tokens[0]])
    assert tokens[0] == ref_tokens[0] or gap <= 5e-2 * float(first.abs().max())


@gpu
@needs_cuda
@torch.no_grad()
def test_fused_decode_step_kernel_count_cuda(upstream_dir: Path) -> None:
    """One paged decode step of the fused decoder launches ~10 kernels per layer."""
    from torch.profiler import ProfilerActivity, profile

    from livemeet.engine.model_runner import ModelRunner, _StepRows

    model, _ = load_model(str(upstream_dir), device="cuda", dtype="bfloat16")
    runner = ModelRunner(model, model.cfg, block_size=16, num_kv_blocks=64)
    assert model.language_model.prepared  # the runner prepares the fused weights on CUDA
    rows = _StepRows()
    rows.token_ids, rows.positions, rows.slots = [5], [40], [40]
    rows.seq_lens, rows.block_tables, rows.q_lens = [41], [[0, 1, 2]], [1]
    ids = torch.tensor([5], device="cuda")
    with runner.staging.step():
        meta = runner._metadata(rows)
    positions = torch.tensor([40], device="cuda")
    runner._forward(ids, positions, meta)  # compile outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner._forward(ids, positions, meta)
        torch.cuda.synchronize()
    kernels = [
        e
        for e in prof.events()
        if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset"))
    ]
    layers = model.cfg.text.layers
    # per layer: 2 add+norm, 4 GEMMs (cuBLAS may split one), q/k norm+RoPE storing K/V (the
    # paged backend's kv_sink), SiLU*mul, decode (+ merge); per step: embedding, final norm
    names = [e.name for e in kernels]
    assert len(kernels) <= 11 * layers + 4, names
    assert not any("_store_kv_kernel" in name for name in names), names
    assert sum("_qk_norm_rope_kernel" in name for name in names) == layers, names


def test_paged_attend_without_k_v_needs_a_sink_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """attend(q, None, None) means "the sink stored them": refused when no sink could have
    been handed out (the fused store switched off), and with only one of k and v."""
    from livemeet.engine import paged_backend

    cache = torch.zeros(2, 16, 2, 16)
    meta = paged_backend.StepMetadata(
        slot_mapping=torch.arange(1), block_tables=torch.zeros(1, 2, dtype=torch.int32),
        seq_lens=torch.ones(1, dtype=torch.int32), cu_seqlens_q=torch.tensor([0, 1]),
        max_seqlen_q=1, max_seq_len=1, decode_only=True,
    )  # fmt: skip
    attn = paged_backend.PagedAttentionBackend([cache], [cache.clone()], meta)
    q, k = torch.randn(1, 4, 16), torch.randn(1, 2, 16)
    with pytest.raises(InternalError, match="both k and v"):
        attn.attend(0, q, k, None, 0.25)
    monkeypatch.setattr(paged_backend, "_fused_store", False)
    assert attn.kv_sink(0) is None
    with pytest.raises(InternalError, match="both k and v"):
        attn.attend(0, q, None, None, 0.25)
    monkeypatch.setattr(paged_backend, "_fused_store", True)
    assert attn.kv_sink(0) is not None
    assert attn.attend(0, q, None, None, 0.25).shape == q.shape
