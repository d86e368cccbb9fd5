"""The Whisper encoder's serving path (livemeet.models.whisper_encoder: one qkv projection, the
attention scale applied to the scores, residual adds fused with the next LayerNorm) against
its reference path, and `add_layer_norm` against its torch reference.

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


def check_add_layer_norm(
    n: int, dim: int, dtype: torch.dtype, device: str, atol: float, eps: float = EPS
) -> None:
    # rows of a wider buffer: a row stride that is not the width
    x = torch.randn(n, dim + 16, device=device).to(dtype)[:, :dim]
    delta = (3 * torch.randn(n, dim, device=device) + 1).to(dtype)  # a mean to take out
    w = (1 + 0.1 * torch.randn(dim, device=device)).to(dtype)
    b = (0.1 * torch.randn(dim, device=device)).to(dtype)
    for d in (None, delta):
        out, h = fused.add_layer_norm(x, d, w, b, eps, impl="triton")
        ref, ref_h = fused.ref_add_layer_norm(x, d, w, b, eps)
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
    check_add_layer_norm(3, 64, dtype, "cpu", atol, eps=0.5)  # the eps passed is the one used
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
    if fused.HAS_TRITON:
        with pytest.raises(InternalError, match="contiguous"):
            fused.add_layer_norm(x, None, torch.ones(16)[::2], torch.zeros(8), EPS, impl="triton")


# ---------------------------------------------------------------------------------------------
# the tiny encoder
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(upstream_dir: Path) -> MossTDModel:
    """A private copy of the tiny model (the tests flip its encoder's `fused` flag)."""
    model, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    model.prepare_for_serving()
    return model


def test_prepared_projections_are_views_of_the_fused_qkv(tiny_model: MossTDModel) -> None:
    att: EncoderAttention = tiny_model.audio_encoder.layers[0].self_attn
    qkv, bias = att.qkv_weight, att.qkv_bias
    assert qkv is not None and bias is not None
    d = att.q_proj.weight.shape[0]
    storage = {qkv.untyped_storage().data_ptr(), bias.untyped_storage().data_ptr()}
    for p in (att.q_proj.weight, att.k_proj.weight, att.v_proj.weight):
        assert p.untyped_storage().data_ptr() in storage
    for p in (att.q_proj.bias, att.v_proj.bias):
        assert p is not None and p.untyped_storage().data_ptr() in storage
    assert torch.equal(qkv, torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]))
    assert torch.equal(bias[d : 2 * d], torch.zeros(d))  # k has no bias
    assert not any("qkv" in n for n in tiny_model.state_dict())  # the loader's view unchanged
    tiny_model.prepare_for_serving()  # idempotent
    assert att.qkv_weight is qkv


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


def _real_size_encoder() -> WhisperEncoder:
    """Whisper-medium's geometry with random weights that make attention matter: LayerNorm
    weights near 1, linear weights of std fan_in**-0.5 (scores of std ~1), small biases."""
    torch.manual_seed(22)
    enc = WhisperEncoder(AudioConfig(d_model=1024, layers=24, heads=16, ffn=4096))
    for name, p in enc.named_parameters():
        if "layer_norm" in name and name.endswith("weight"):
            p.data = 1 + 0.1 * torch.randn_like(p)
        elif name.endswith("bias"):
            p.data.normal_(0.0, 0.02)
        elif p.dim() >= 2:  # linears [out, in], convs [out, in, k]
            p.data.normal_(0.0, (p[0].numel()) ** -0.5)
        else:
            p.data.normal_(0.0, 0.02)
    return enc


@gpu
@needs_cuda
@torch.no_grad()
def test_real_size_encoder_fused_cuda_bf16() -> None:
    """The fused path in bf16 is as close to the fp32 reference as the bf16 reference path is
    (two windows; a bug in q, k or the norms would move it far more than rounding does)."""
    enc = _real_size_encoder().to("cuda")
    features = torch.randn(2, 80, 3000, device="cuda")
    exact = enc(features)  # fp32, reference path (not prepared yet)
    enc = enc.to(torch.bfloat16)
    enc.prepare_for_serving()
    assert enc.use_fused(features)
    enc.fused = False
    ref = enc(features).float()
    enc.fused = None
    ours = enc(features).float()
    ref_err, err = (ref - exact).abs(), (ours - exact).abs()
    assert float(ref_err.mean()) > 0  # bf16 rounds: the bound below is not vacuous
    assert float(err.mean()) <= 1.5 * float(ref_err.mean())
    assert float(err.max()) <= 2.0 * float(ref_err.max())
