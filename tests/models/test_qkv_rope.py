"""The qkv projection with the q/k rotation and K/V store as its epilogue
(livemeet.layers.qkv_rope) against the two-kernel path it replaces, bit for bit.

On a CPU-only machine the kernels run under the Triton interpreter in float32 on small shapes;
the `gpu`-marked test repeats the comparison in bf16 (bf16 and e4m3 caches) at the real
decoder's shapes, many times over, for the semaphore's ordering.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from livemeet.errors import InternalError
from livemeet.layers import fused, linear, paged_attention, qkv_rope, split_k
from livemeet.layers.rotary import RotaryEmbedding
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.loader import load_model
from tests.kernels import interpreted, kernel_marks

qkv_rope = interpreted(qkv_rope, "_norm_qkv_rope_kernel")
needs_interpreter, needs_cuda = kernel_marks(qkv_rope)

THETA = 1_000_000.0  # Qwen3's rope_theta (MODEL.md section 4)
EPS = 1e-6


def _case(
    m: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    device: str,
    with_residual: bool = True,
) -> dict:
    """Random inputs of one call: rows, weights, positions, and caches full of stale values
    (a slot written by mistake shows); rows 1, 4, 7, ... are padding (slot -1)."""
    n = (heads + 2 * kv_heads) * head_dim

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, device=device)).to(dtype)

    num_blocks = m // block_size + 3
    slots = torch.randperm(num_blocks * block_size, device=device)[:m]
    slots[1::3] = -1
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return {
        "x": rand(m, hidden),
        "residual": rand(m, hidden) if with_residual else None,
        "norm_w": (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype),
        "w": rand(n, hidden, scale=hidden**-0.5),
        "qw": (3 + 0.3 * torch.randn(head_dim, device=device)).to(dtype),
        "kw": (3 + 0.3 * torch.randn(head_dim, device=device)).to(dtype),
        "pos": torch.randint(0, 100_000, (m,), device=device),
        "freq": RotaryEmbedding(head_dim, THETA).inv_freq.to(device),
        "slots": slots,
        "k_cache": torch.randn(shape, device=device).to(cache_dtype),
        "v_cache": torch.randn(shape, device=device).to(cache_dtype),
        "scale": 0.5 if cache_dtype == torch.float8_e4m3fn else 1.0,
        "heads": heads,
    }


def _fused(c: dict, config: linear.GemmConfig) -> tuple:
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    sink = paged_attention.KVSink(kc, vc, c["slots"], c["scale"])
    done = qkv_rope.norm_qkv_rope_store_kv(
        c["x"], c["residual"], c["norm_w"], EPS, c["w"], config, c["qw"], c["kw"], EPS,
        c["pos"], c["freq"], sink, num_heads=c["heads"], impl="triton",
    )  # fmt: skip
    assert done is not None, "the fused kernel applies to this call"
    return done[0], done[1], kc, vc


def _two_kernels(c: dict, config: linear.GemmConfig) -> tuple:
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    sink = paged_attention.KVSink(kc, vc, c["slots"], c["scale"])
    qkv, new_residual = linear.skinny_norm_linear(
        c["x"], c["residual"], c["norm_w"], EPS, c["w"], config, impl="triton"
    )
    m, d, heads = qkv.shape[0], c["qw"].shape[0], c["heads"]
    kv_heads = (qkv.shape[1] // d - heads) // 2
    q = qkv[:, : heads * d].view(m, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(m, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(m, kv_heads, d)
    q = fused.qk_norm_rope_store_kv(
        q, k, v, c["qw"], c["kw"], EPS, c["pos"], c["freq"], sink, impl="triton"
    )
    return q, new_residual, kc, vc


def _assert_same(got: tuple, want: tuple) -> None:
    for ours, ref in zip(got, want, strict=True):
        assert ours.shape == ref.shape and ours.dtype == ref.dtype
        assert torch.equal(ours.view(torch.uint8), ref.view(torch.uint8))


@needs_interpreter
@pytest.mark.parametrize("block_n", [4, 8, 16])  # 4, 2 and 1 programs per head of 16
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("m,with_residual", [(1, True), (1, False), (4, True)])
def test_epilogue_equals_the_two_kernel_path(
    block_n: int, cache_dtype: torch.dtype, m: int, with_residual: bool
) -> None:
    """q, the new residual and both caches byte for byte (padding rows store nothing, other
    slots keep their stale values), and every semaphore re-armed for the next call."""
    torch.manual_seed(block_n * 10 + m)
    c = _case(m, 40, 4, 2, 16, 16, torch.float32, cache_dtype, "cpu", with_residual)
    config = linear.GemmConfig(block_n, 16)  # K = 40: two whole chunks and a partial one
    got = _fused(c, config)
    _assert_same(got, _two_kernels(c, config))
    assert not torch.equal(got[2].view(torch.uint8), c["k_cache"].view(torch.uint8))
    counters = split_k.counters(torch.device("cpu"), 1)
    assert counters is not None and int(counters.abs().sum()) == 0


@needs_interpreter
def test_epilogue_stores_what_the_references_compute() -> None:
    """Against the torch references (norm, F.linear, q/k norm + RoPE, store), not only the
    Triton two-kernel path: a bug shared by both kernels' helpers shows here."""
    from livemeet.layers.fused import ref_fused_add_rms_norm, ref_qk_norm_rope

    torch.manual_seed(5)
    c = _case(2, 32, 4, 2, 16, 16, torch.float32, torch.float32, "cpu")
    c["slots"] = torch.tensor([5, 20])
    q, residual, kc, vc = _fused(c, linear.GemmConfig(8, 32))
    normed, want_residual = ref_fused_add_rms_norm(c["x"], c["residual"], c["norm_w"], EPS)
    qkv = torch.nn.functional.linear(normed, c["w"])
    want_q, want_k = ref_qk_norm_rope(
        qkv[:, :64].view(2, 4, 16), qkv[:, 64:96].view(2, 2, 16), c["qw"], c["kw"], EPS,
        c["pos"], c["freq"],
    )  # fmt: skip
    torch.testing.assert_close(q, want_q, atol=2e-5, rtol=1e-4)
    assert torch.equal(residual, want_residual)
    for row, slot in enumerate((5, 20)):
        block, offset = divmod(slot, 16)
        torch.testing.assert_close(kc[block, offset], want_k[row], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(
            vc[block, offset], qkv[row, 96:].view(2, 16), atol=2e-5, rtol=1e-4
        )


def test_does_not_apply_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """None (and nothing done) for a slab wider than or not dividing the head, for the torch
    impl, when switched off, and without counters; shapes that do not fit raise."""
    c = _case(1, 32, 4, 2, 16, 16, torch.float32, torch.float32, "cpu")
    sink = paged_attention.KVSink(c["k_cache"], c["v_cache"], c["slots"], 1.0)
    args = (c["x"], c["residual"], c["norm_w"], EPS, c["w"])
    rest = (c["qw"], c["kw"], EPS, c["pos"], c["freq"], sink)

    def call(config: linear.GemmConfig, impl: str = "triton", **kw: object) -> object:
        return qkv_rope.norm_qkv_rope_store_kv(
            *args,
            config,
            *rest,
            num_heads=4,
            impl=impl,
            **kw,  # type: ignore[arg-type]
        )

    before = c["k_cache"].clone()
    assert call(linear.GemmConfig(32, 32)) is None  # wider than a head
    assert call(linear.GemmConfig(8, 32), impl="torch") is None
    monkeypatch.setattr(qkv_rope, "_enabled", False)
    assert call(linear.GemmConfig(8, 32)) is None
    monkeypatch.setattr(qkv_rope, "_enabled", True)
    monkeypatch.setattr(split_k, "counters", lambda *a: None)
    assert call(linear.GemmConfig(8, 32)) is None
    assert torch.equal(c["k_cache"], before)
    with pytest.raises(InternalError, match="rows"):
        qkv_rope.norm_qkv_rope_store_kv(
            *args, linear.GemmConfig(8, 32), *rest, num_heads=3, impl="triton"
        )
    bad = paged_attention.KVSink(c["k_cache"], c["v_cache"], c["slots"].int(), 1.0)
    with pytest.raises(InternalError, match="int64"):
        qkv_rope.norm_qkv_rope_store_kv(
            *args, linear.GemmConfig(8, 32), *rest[:-1], bad, num_heads=4, impl="triton"
        )


@pytest.fixture(scope="module")
def tiny_model(upstream_dir: Path) -> MossTDModel:
    """A private copy of the tiny model (the test flips its `fused` flag and plan)."""
    model, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    model.prepare_for_serving()
    return model


@needs_interpreter
@torch.no_grad()
def test_tiny_decoder_decodes_the_same_through_the_epilogue(
    tiny_model: MossTDModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny decoder on paged KV with a one-row qkv choice: its decode steps take the
    epilogue kernel once per layer, and every hidden state and cache equals the run with
    the epilogue off (the two-kernel path)."""
    from tests.models.test_fused import _paged_steps

    lm = tiny_model.language_model
    qkv = lm._typed_layers[0].self_attn.qkv_weight
    assert qkv is not None
    plan = linear.LinearPlan(impl="triton")
    plan.set_choice(tuple(qkv.shape), qkv.dtype, 1, linear.GemmConfig(8, 32),
                    prologue="add_rms_norm")  # fmt: skip
    calls: list[int] = []
    real = qkv_rope.norm_qkv_rope_store_kv

    def spy(x: torch.Tensor, *args: object, **kwargs: object) -> object:
        done = real(x, *args, **kwargs)  # type: ignore[arg-type]
        calls.append(x.shape[0] if done is not None else -1)
        return done

    prompt = torch.tensor([151644, 872, 198, 58, 15, 13, 15, 15, 60, 42474, 16, 60, 220])
    saved = lm.linear_plan
    try:
        lm.fused, lm.linear_plan = True, plan
        monkeypatch.setattr(qkv_rope, "_enabled", False)
        want, want_caches = _paged_steps(tiny_model, prompt, 3)
        monkeypatch.setattr(qkv_rope, "_enabled", True)
        monkeypatch.setattr(qkv_rope, "norm_qkv_rope_store_kv", spy)
        got, got_caches = _paged_steps(tiny_model, prompt, 3)
    finally:
        lm.fused, lm.linear_plan = None, saved
    assert calls == [1] * (3 * 3)  # 3 layers x 3 one-row decode steps (the prompt: no choice)
    for ours, ref in zip(got + got_caches, want + want_caches, strict=True):
        assert torch.equal(ours, ref)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("block_n", [4, 8, 16])
def test_epilogue_equals_the_two_kernel_path_cuda(cache_dtype: torch.dtype, block_n: int) -> None:
    """MOSS-TD's shapes in bf16 (hidden 1024, 16 + 2 x 8 heads of 128), one row, 200 calls
    with fresh inputs against the two kernels, byte for byte: a reader that saw a head before
    its last slab landed would differ somewhere."""
    torch.manual_seed(block_n)
    config = linear.GemmConfig(block_n, 1024)
    for i in range(200):
        c = _case(1, 1024, 16, 8, 128, 16, torch.bfloat16, cache_dtype, "cuda")
        if i % 2:
            c["slots"] = torch.tensor([-1], device="cuda")  # a padding row stores nothing
        _assert_same(_fused(c, config), _two_kernels(c, config))
    counters = split_k.counters(torch.device("cuda"), 1)
    assert counters is not None and int(counters.abs().sum()) == 0
