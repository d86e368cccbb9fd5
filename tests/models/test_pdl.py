"""Programmatic dependent launch: when it is used, and (GPU) that a chain of dependent decode
kernels launched with it computes exactly what it computes without it."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from livemeet.layers import linear, pdl
from livemeet.layers import paged_attention as pa
from tests.engine.test_paged_attention import make_block_tables
from tests.kernels import kernel_marks

_, needs_cuda = kernel_marks(linear)
gpu = pytest.mark.gpu


@pytest.fixture
def restore_pdl() -> Iterator[None]:
    before = pdl.is_enabled()
    yield
    pdl.set_enabled(before)


def fake_tensor(is_cuda: bool) -> SimpleNamespace:
    return SimpleNamespace(is_cuda=is_cuda, device=SimpleNamespace(index=0))


def compiled_kernel() -> object:
    return object()  # not an InterpretedFunction


def test_pdl_only_for_compiled_kernels_on_capable_gpus(
    monkeypatch: pytest.MonkeyPatch, restore_pdl: None
) -> None:
    monkeypatch.setattr(pdl, "HAS_GDC", True)
    monkeypatch.setattr(pdl, "_capable", lambda index: index == 0)
    pdl.set_enabled(True)
    on = {"PDL": True, "launch_pdl": True}
    assert pdl.launch_options(fake_tensor(True), compiled_kernel()) == on  # type: ignore[arg-type]
    assert pdl.launch_options(fake_tensor(False), compiled_kernel()) == {"PDL": False}  # type: ignore[arg-type]

    class InterpretedFunction:  # the Triton interpreter's kernel type, by name
        pass

    assert pdl.launch_options(fake_tensor(True), InterpretedFunction()) == {"PDL": False}  # type: ignore[arg-type]
    monkeypatch.setattr(pdl, "_capable", lambda index: False)  # e.g. an A100
    assert pdl.launch_options(fake_tensor(True), compiled_kernel()) == {"PDL": False}  # type: ignore[arg-type]


def test_pdl_off_by_switch_or_without_grid_dependency_control(
    monkeypatch: pytest.MonkeyPatch, restore_pdl: None
) -> None:
    monkeypatch.setattr(pdl, "_capable", lambda index: True)
    monkeypatch.setattr(pdl, "HAS_GDC", True)
    pdl.set_enabled(False)
    assert pdl.launch_options(fake_tensor(True), compiled_kernel()) == {"PDL": False}  # type: ignore[arg-type]
    pdl.set_enabled(True)
    monkeypatch.setattr(pdl, "HAS_GDC", False)
    assert pdl.launch_options(fake_tensor(True), compiled_kernel()) == {"PDL": False}  # type: ignore[arg-type]


class ChainState:
    """Weights, KV caches and per-step index tensors of `decoder_chain`, made before any capture
    (nothing is allocated or drawn at random inside the chain)."""

    hidden, heads, kv_heads, dim, inter = 1024, 16, 8, 128, 3072

    def __init__(self, steps: int, device: str) -> None:
        g = torch.Generator(device=device).manual_seed(3)
        bf16 = torch.bfloat16

        def weight(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, generator=g, device=device) / k**0.5).to(bf16)

        self.steps = steps
        self.w_qkv = weight((self.heads + 2 * self.kv_heads) * self.dim, self.hidden)
        self.w_o = weight(self.hidden, self.heads * self.dim)
        self.w_up = weight(2 * self.inter, self.hidden)
        self.w_down = weight(self.hidden, self.inter)
        self.norm_w = torch.ones(self.hidden, device=device, dtype=bf16)
        shape = (8, 16, self.kv_heads, self.dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=bf16)
        self.v_cache = torch.zeros(shape, device=device, dtype=bf16)
        self.table = make_block_tables([steps], 16, 8).to(device)
        at = {"device": device}
        self.slots = [torch.full((1,), i, dtype=torch.int64, **at) for i in range(steps)]
        self.lens = [torch.full((1,), i + 1, dtype=torch.int32, **at) for i in range(steps)]


def decoder_chain(s: ChainState, x: torch.Tensor) -> torch.Tensor:
    """`s.steps` one-row mini decoder layers in which every kernel reads the one before it:
    norm+qkv GEMV, store-KV of the new token, decode attention over every token so far (the
    one just stored included), o GEMV, norm+gate_up GEMV, SiLU*mul+down GEMV. A kernel that
    read its input before its predecessor finished would change the result. Each step
    stores the slot it then reads, so the caches' earlier contents never matter."""
    narrow, wide = linear.GemmConfig(8, 512), linear.GemmConfig(4, 2048)
    groups = [s.heads, s.kv_heads, s.kv_heads]
    residual = None
    for i in range(s.steps):
        qkv, residual = linear.skinny_norm_linear(x, residual, s.norm_w, 1e-6, s.w_qkv, narrow)
        q, k, v = qkv.view(1, sum(groups), s.dim).split(groups, 1)
        pa.store_kv(k, v, s.k_cache, s.v_cache, s.slots[i])
        attn = pa.paged_decode_attention(q, s.k_cache, s.v_cache, s.table, s.lens[i], 0.088)
        x = linear.skinny_linear(attn.view(1, -1), s.w_o, wide)
        up, residual = linear.skinny_norm_linear(x, residual, s.norm_w, 1e-6, s.w_up, narrow)
        x = linear.skinny_silu_linear(up, s.w_down, wide)
    return torch.cat([x, residual], 1)


def test_decoder_chain_runs_on_the_cpu_references() -> None:
    """The chain's shapes (the GPU test below is its only other caller)."""
    s = ChainState(20, "cpu")
    out = decoder_chain(s, torch.randn(1, 1024, dtype=torch.bfloat16))
    assert out.shape == (1, 2048) and torch.isfinite(out.float()).all()
    assert s.k_cache.abs().sum() > 0  # the tokens were stored


@gpu
@needs_cuda
def test_pdl_chain_equals_plain_launches_cuda(restore_pdl: None) -> None:
    torch.manual_seed(21)
    x0 = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    s = ChainState(100, "cuda")
    pdl.set_enabled(False)
    want = decoder_chain(s, x0)
    pdl.set_enabled(True)
    assert pdl.launch_options(x0, object())["PDL"], "the test GPU must support PDL"
    eager = decoder_chain(s, x0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = decoder_chain(s, x0)
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, want)
    assert torch.equal(eager, want)
