"""The Whisper encoder's serving path (livemeet.models.whisper_encoder: one qkv projection with
the attention scale folded in, residual adds fused with the next LayerNorm) against its
reference path, and `add_layer_norm` against its torch reference.

On a CPU-only machine the kernel runs under the Triton interpreter in float32 (and bf16) on
small shapes; `gpu`-marked tests repeat the comparisons in bf16 on CUDA at real size.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from livemeet.errors import InternalError
from livemeet.layers import fused
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import AudioConfig
from livemeet.models.loader import load_model
from livemeet.models.whisper_encoder import EncoderAttention, WhisperEncoder
from tests.kernels import interpreted, kernel_marks

fused = interpreted(fused, "_add_layer_norm_kernel")
needs_interpreter, needs_cuda = kernel_marks(fused)
gpu = pytest.mark.gpu
EPS = 1e-5  # the encoder's LayerNorm eps (MODEL.md section 2)


def check_add_layer_norm(n: int, dim: int, dtype: torch.dtype, device: str, atol: float) -> None:
    x = torch.randn(n, dim, device=device).to(dtype)
    delta = (3 * torch.randn(n, dim, device=device) + 1).to(dtype)  # a mean to take out
    w = (1 + 0.1 * torch.randn(dim, device=device)).to(dtype)
    b = (0.1 * torch.randn(dim, device=device)).to(dtype)
    for d in (None, delta):
        out, h = fused.add_layer_norm(x, d, w, b, EPS, impl="triton")
        ref, ref_h = fused.ref_add_layer_norm(x, d, w, b, EPS)
        assert out.dtype == ref.dtype == dtype and h.dtype == dtype
        if d is None:
            assert h is x  # nothing added: the input is the residual
        if device == "cuda" or dtype == torch.float32:
            assert torch.equal(h, ref_h)  # one rounded add: exact
        else:  # the interpreter truncates fp32 -> bf16 instead of rounding to nearest
            torch.testing.assert_close(h.float(), ref_h.float(), atol=atol, rtol=atol)
        torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)


@needs_interpreter
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-5), (torch.bfloat16, 3.2e-2)])
def test_add_layer_norm_interpreted(dtype: torch.dtype, atol: float) -> None:
    torch.manual_seed(3)
    check_add_layer_norm(5, 48, dtype, "cpu", atol)  # odd N, non-power-of-two width
    check_add_layer_norm(3, 64, dtype, "cpu", atol)
    check_add_layer_norm(0, 48, dtype, "cpu", atol)


def test_add_layer_norm_bad_shapes_are_internal_errors() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(InternalError, match="weight and bias"):
        fused.add_layer_norm(x, None, torch.ones(8), torch.zeros(4), EPS)
    with pytest.raises(InternalError, match="does not match"):
        fused.add_layer_norm(x, torch.randn(2, 8, dtype=torch.float64), torch.ones(8),
                             torch.zeros(8), EPS)  # fmt: skip
    with pytest.raises(InternalError, match="need x"):
        fused.add_layer_norm(x[None], None, torch.ones(8), torch.zeros(8), EPS)


# ---------------------------------------------------------------------------------------------
# the tiny encoder
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(upstream_dir: Path) -> MossTDModel:
    """A private copy of the tiny model (the tests flip its encoder's `fused` flag)."""
    model, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    model.prepare_for_serving()
    return model


def test_prepared_qkv_folds_the_scale_and_shares_k_v(tiny_model: MossTDModel) -> None:
    att: EncoderAttention = tiny_model.audio_encoder.layers[0].self_attn
    qkv, bias = att.qkv_weight, att.qkv_bias
    assert qkv is not None and bias is not None
    d = att.q_proj.weight.shape[0]
    for p in (att.k_proj.weight, att.v_proj.weight, att.v_proj.bias):
        assert p.untyped_storage().data_ptr() in (
            qkv.untyped_storage().data_ptr(),
            bias.untyped_storage().data_ptr(),
        )
    assert torch.equal(bias[d : 2 * d], torch.zeros(d))  # k has no bias
    # q through the fused rows is the reference's (x W_q^T + b_q) * scale, bit for bit: the
    # scale is a power of two (same GEMM shape on both sides, so the same summation order)
    x = torch.randn(7, d)
    q_fused = torch.nn.functional.linear(x, qkv[:d], bias[:d])
    assert torch.equal(q_fused, att.q_proj(x) * att.scale)
    assert not any("qkv" in n for n in tiny_model.state_dict())  # the loader's view unchanged
    tiny_model.prepare_for_serving()  # idempotent
    assert att.qkv_weight is qkv


def test_a_scale_that_is_not_a_power_of_two_is_refused() -> None:
    att = EncoderAttention(48, 4)  # head_dim 12: 12**-0.5 is not exact under scaling
    with pytest.raises(InternalError, match="power of two"):
        att.fuse_weights()


def test_auto_mode_keeps_the_cpu_encoder_on_the_reference_path(tiny_model: MossTDModel) -> None:
    enc = tiny_model.audio_encoder
    assert enc.prepared and enc.fused is None and not enc.use_fused(torch.zeros(1))


def test_forced_fused_encoder_needs_prepared_weights() -> None:
    enc = WhisperEncoder(AudioConfig(d_model=64, layers=1, heads=4, ffn=128))
    enc.fused = True
    with pytest.raises(InternalError, match="prepare_for_serving"):
        enc(torch.zeros(1, 80, 3000))


@needs_interpreter
@torch.no_grad()
def test_tiny_encoder_fused_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # the tiny checkpoint's geometry with 60 frames a window instead of 1,500: the interpreter
    # runs a program per row (~50 s at full length), and nothing here depends on the length
    torch.manual_seed(4)
    enc = WhisperEncoder(AudioConfig(d_model=64, layers=3, heads=4, ffn=128,
                                     max_source_positions=60))  # fmt: skip
    for p in enc.parameters():
        p.normal_(0.0, 0.3)
    enc.prepare_for_serving()
    calls = []
    real = fused.add_layer_norm
    monkeypatch.setattr(fused, "add_layer_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    features = torch.randn(2, 80, 120)
    enc.fused = False
    ref = enc(features)
    enc.fused = True
    ours = enc(features)
    assert len(calls) == 1 + 2 * len(enc.layers)  # the forced run took the fused path
    assert ours.shape == ref.shape == (2, 60, 64)
    scale = float(ref.abs().max())
    assert float((ours - ref).abs().max()) <= 1e-5 * scale


# ---------------------------------------------------------------------------------------------
# CUDA (bf16, the real encoder's width)
# ---------------------------------------------------------------------------------------------


@gpu
@needs_cuda
def test_add_layer_norm_cuda_bf16() -> None:
    torch.manual_seed(21)
    for n in (1, 7, 1500, 3000):
        check_add_layer_norm(n, 1024, torch.bfloat16, "cuda", 3.2e-2)
    check_add_layer_norm(5, 1024, torch.float32, "cuda", 2e-5)


@gpu
@needs_cuda
@torch.no_grad()
def test_real_size_encoder_fused_cuda_bf16() -> None:
    """Real-size random weights (Whisper-medium: 24 layers of 1024): the fused path against the
    reference path on two windows, bf16, as the engine's graphs run it."""
    torch.manual_seed(22)
    enc = WhisperEncoder(AudioConfig(d_model=1024, layers=24, heads=16, ffn=4096))
    enc = enc.to("cuda", torch.bfloat16)
    for p in enc.parameters():
        p.normal_(0.0, 0.02)
    enc.prepare_for_serving()
    assert enc.use_fused(torch.zeros(1, device="cuda"))
    features = torch.randn(2, 80, 3000, device="cuda")
    enc.fused = False
    ref = enc(features).float()
    enc.fused = None
    ours = enc(features).float()
    err = (ours - ref).abs()
    # bf16: the two paths round the same values in other orders (Welford against two-pass
    # statistics, one GEMM against three); a few ulps of the output's scale
    assert float(err.max()) <= 0.05 * float(ref.abs().max())
    assert float(err.mean()) <= 0.01 * float(ref.abs().mean())
