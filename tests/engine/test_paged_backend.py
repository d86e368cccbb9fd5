"""PagedAttentionBackend: a mixed step (prefill chunks, then decode rows) runs the extend kernel
over the chunks and the decode kernel over the decode rows, into one output equal to the
extend reference over every row; the decode kernel's split count comes from the decode rows
alone. (That the model runner marks the scheduled decode rows is checked by the fp32 parity
test of mixed batches, tests/engine/test_engine.py.)"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from livemeet.engine import paged_backend
from livemeet.engine.paged_backend import PagedAttentionBackend, StepMetadata
from livemeet.errors import InternalError
from livemeet.layers import paged_attention as pa
from livemeet.layers import paged_attention_kernels as kernels
from livemeet.layers.paged_attention_ref import ref_paged_extend_attention
from tests.engine.test_paged_attention import make_block_tables, poisoned_caches
from tests.kernels import interpreted, kernel_marks

kernels = interpreted(kernels, "_decode_split_kernel")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
needs_interpreter, needs_cuda = kernel_marks(kernels)

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 16, 16


def _step(
    prefix_and_new: list[tuple[int, int]], num_decode: int, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, StepMetadata]:
    """(q, k_cache, v_cache, metadata) of one step; the last `num_decode` sequences have one
    new token each (decode rows)."""
    lens = [p + n for p, n in prefix_and_new]
    num_blocks = sum(math.ceil(n / BLOCK) for n in lens) + 2
    shape = (num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    kc, vc = (torch.randn(shape, device=device).to(dtype) for _ in "kv")
    tables = make_block_tables(lens, BLOCK, num_blocks).to(device)
    q_lens = [n for _, n in prefix_and_new]
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    meta = StepMetadata(
        slot_mapping=torch.full((sum(q_lens),), -1, dtype=torch.long, device=device),
        block_tables=tables,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        cu_seqlens_q=cu,
        max_seqlen_q=max(q_lens),
        max_seq_len=max(lens),
        decode_only=False,
        num_decode_seqs=num_decode,
    )
    q = torch.randn(sum(q_lens), HEADS, HEAD_DIM, device=device).to(dtype)
    return q, kc, vc, meta


def _reference(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, m: StepMetadata):
    return ref_paged_extend_attention(
        q, kc, vc, m.block_tables, m.cu_seqlens_q, m.seq_lens, HEAD_DIM**-0.5
    )


def _spy_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, ...], int]]:
    """Record each ExtendLaunch / DecodeLaunch the backend makes: (class, q shape, rows of
    seq_lens)."""
    made: list[tuple[str, tuple[int, ...], int]] = []
    # seq_lens is the 6th argument of the extend launch, the 5th of the decode launch
    for name, lens_arg in (("ExtendLaunch", 4), ("DecodeLaunch", 3)):
        real = getattr(paged_backend, name)

        def spy(q: torch.Tensor, *args, _real=real, _name=name, _i=lens_arg, **kwargs):  # type: ignore[no-untyped-def]
            made.append((_name, tuple(q.shape), args[_i].shape[0]))
            return _real(q, *args, **kwargs)

        monkeypatch.setattr(paged_backend, name, spy)
    monkeypatch.setattr(paged_backend, "_fused_store", True)
    return made


def test_mixed_step_sends_decode_rows_to_the_decode_kernel(monkeypatch: pytest.MonkeyPatch):
    torch.manual_seed(3)
    # two prefill chunks (one after a prefix), then three decode rows with long contexts
    q, kc, vc, meta = _step([(0, 7), (40, 9), (90, 1), (33, 1), (200, 1)], 3, "cpu", torch.float32)
    made = _spy_launches(monkeypatch)
    out = PagedAttentionBackend([kc], [vc], meta).attend(0, q, None, None, HEAD_DIM**-0.5)
    assert made == [
        ("ExtendLaunch", (16, HEADS, HEAD_DIM), 2),
        ("DecodeLaunch", (3, HEADS, HEAD_DIM), 3),
    ]
    torch.testing.assert_close(out, _reference(q, kc, vc, meta), atol=1e-6, rtol=0)


def test_step_without_decode_rows_runs_the_extend_kernel_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q, kc, vc, meta = _step([(0, 7), (90, 1)], 0, "cpu", torch.float32)
    made = _spy_launches(monkeypatch)
    out = PagedAttentionBackend([kc], [vc], meta).attend(0, q, None, None, HEAD_DIM**-0.5)
    assert [m[0] for m in made] == ["ExtendLaunch"]
    torch.testing.assert_close(out, _reference(q, kc, vc, meta), atol=1e-6, rtol=0)


def _layers(kc: torch.Tensor, vc: torch.Tensor, n: int) -> tuple[list[torch.Tensor], ...]:
    """n layers' caches of kc's geometry with other contents (layer 0 is kc, vc)."""
    ks, vs = [kc], [vc]
    for i in range(1, n):
        ks.append(torch.randn_like(kc) * (i + 1))
        vs.append(torch.randn_like(vc) - i)
    return ks, vs


@pytest.mark.parametrize("num_decode", [0, 2])
def test_launches_are_resolved_once_per_step_and_run_per_layer(
    monkeypatch: pytest.MonkeyPatch, num_decode: int
) -> None:
    """Every layer attends over its own caches through the step's one set of launches, into
    the `out` it passes (the piecewise runner's static buffer), and equals its reference."""
    torch.manual_seed(5)
    q, kc, vc, meta = _step([(0, 7), (40, 9), (90, 1), (33, 1)], num_decode, "cpu", torch.float32)
    ks, vs = _layers(kc, vc, 3)
    made = _spy_launches(monkeypatch)
    backend = PagedAttentionBackend(ks, vs, meta)
    out = torch.full_like(q, float("nan"))
    for layer in (0, 1, 2, 1):
        got = backend.attend(layer, q, None, None, HEAD_DIM**-0.5, out)
        assert got.data_ptr() == out.data_ptr()
        want = _reference(q, ks[layer], vs[layer], meta)
        torch.testing.assert_close(out, want, atol=1e-6, rtol=0)
    assert len(made) == (2 if num_decode else 1)


def test_layers_may_pass_other_query_and_output_tensors(monkeypatch: pytest.MonkeyPatch):
    """The model's own forward hands each layer a new q (and no out): a mixed step's views
    of q and out are taken again, never reused from another layer's tensors."""
    torch.manual_seed(9)
    q, kc, vc, meta = _step([(0, 7), (40, 9), (90, 1), (33, 1)], 2, "cpu", torch.float32)
    ks, vs = _layers(kc, vc, 2)
    monkeypatch.setattr(paged_backend, "_fused_store", True)
    backend = PagedAttentionBackend(ks, vs, meta)
    for layer, query in ((0, q), (1, torch.randn_like(q)), (0, q * 2.0)):
        got = backend.attend(layer, query, None, None, HEAD_DIM**-0.5)
        want = _reference(query, ks[layer], vs[layer], meta)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    out = torch.empty_like(q)
    for query in (q, q + 1.0):  # the same out, another q: the views follow q
        backend.attend(1, query, None, None, HEAD_DIM**-0.5, out)
        torch.testing.assert_close(out, _reference(query, ks[1], vs[1], meta), atol=1e-6, rtol=0)


def test_a_layer_of_another_geometry_or_scale_is_refused(monkeypatch: pytest.MonkeyPatch):
    q, kc, vc, meta = _step([(0, 7), (90, 1)], 1, "cpu", torch.float32)
    monkeypatch.setattr(paged_backend, "_fused_store", True)
    other = torch.zeros(kc.shape[0] + 1, *kc.shape[1:])
    backend = PagedAttentionBackend([kc, other, kc], [vc, other, vc.double()], meta)
    backend.attend(0, q, None, None, HEAD_DIM**-0.5)
    with pytest.raises(InternalError, match="prepared"):
        backend.attend(1, q, None, None, HEAD_DIM**-0.5)
    with pytest.raises(InternalError, match="prepared"):
        backend.attend(2, q, None, None, HEAD_DIM**-0.5)
    with pytest.raises(InternalError, match="scale"):
        backend.attend(0, q, None, None, 0.5)


def test_launch_refuses_a_query_of_another_shape() -> None:
    q, kc, vc, meta = _step([(0, 7), (90, 1)], 0, "cpu", torch.float32)
    launch = pa.ExtendLaunch(
        q, kc, vc, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, HEAD_DIM**-0.5
    )
    with pytest.raises(InternalError, match="q must be"):
        launch(q[:-1], kc, vc)
    decode = pa.DecodeLaunch(q[:2], kc, vc, meta.block_tables, meta.seq_lens, HEAD_DIM**-0.5)
    with pytest.raises(InternalError, match="q must be"):
        decode(q[:2].double(), kc, vc)


@needs_interpreter
@pytest.mark.parametrize("merge_in_kernel", [False, True])
def test_one_decode_launch_over_many_layers_interpreted(merge_in_kernel: bool) -> None:
    """The Triton kernels through one DecodeLaunch / ExtendLaunch per step: the partial
    buffers and counters the layers share carry nothing from one layer to the next."""
    torch.manual_seed(7)
    q, kc, vc, meta = _step([(30, 1), (70, 1), (5, 1)], 0, "cpu", torch.float32)
    ks, vs = _layers(kc, vc, 2)
    cfg = pa.DecodeKernelConfig(merge_in_kernel=merge_in_kernel, backend="triton")
    decode = pa.DecodeLaunch(
        q, kc, vc, meta.block_tables, meta.seq_lens, HEAD_DIM**-0.5, num_splits=4,
        impl="triton", kernel=cfg,
    )  # fmt: skip
    extend = pa.ExtendLaunch(
        q, kc, vc, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, HEAD_DIM**-0.5,
        impl="triton",
    )  # fmt: skip
    for layer in (0, 1, 0):
        want = _reference(q, ks[layer], vs[layer], meta)
        torch.testing.assert_close(decode(q, ks[layer], vs[layer]), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(extend(q, ks[layer], vs[layer]), want, atol=1e-5, rtol=0)


def test_mixed_step_that_is_only_decode_rows_is_refused(monkeypatch: pytest.MonkeyPatch):
    q, kc, vc, meta = _step([(9, 1), (4, 1)], 2, "cpu", torch.float32)
    monkeypatch.setattr(paged_backend, "_fused_store", True)
    with pytest.raises(InternalError, match="mixed step"):
        PagedAttentionBackend([kc], [vc], meta).attend(0, q, None, None, HEAD_DIM**-0.5)


def _bad_outs(q: torch.Tensor) -> list[torch.Tensor]:
    """Outputs the kernels cannot write: a row too many, another dtype, head_dim strided."""
    n, h, d = q.shape
    return [
        torch.empty(n + 1, h, d),
        torch.empty(n, h, d, dtype=torch.float64),
        torch.empty(n, h, 2 * d)[:, :, ::2],
    ]


@pytest.mark.parametrize("fn", ["decode", "extend"])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_out_must_match_the_query(fn: str, which: int) -> None:
    q, kc, vc, meta = _step([(9, 1), (4, 1)], 0, "cpu", torch.float32)
    bad = _bad_outs(q)[which]
    with pytest.raises(InternalError, match="out must be"):
        if fn == "decode":
            pa.paged_decode_attention(q, kc, vc, meta.block_tables, meta.seq_lens, 0.25, out=bad)
        else:
            pa.paged_extend_attention(
                q, kc, vc, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, 0.25, out=bad
            )


def test_the_fused_qk_prologue_is_taken_by_default_for_a_bf16_cache_only() -> None:
    """LIVEMEET_FUSED_QK unset: the prologue where it measured faster, a bf16 cache (long c1
    +2.6 % on an H200); not with FP8 KV, whose 16 x 36k graph it slowed by 1.2 % (FP8 long
    c16 273.8 against 277.2 audio-s/s; docs/benchmarks.md session 38). "1" and "0" force it."""
    fuses = paged_backend.fuses_qk
    assert fuses(torch.bfloat16, "auto") and not fuses(torch.float8_e4m3fn, "auto")
    assert fuses(torch.bfloat16, "") and not fuses(torch.float8_e4m3fn, "")
    assert fuses(torch.float8_e4m3fn, "1") and fuses(torch.bfloat16, "1")
    assert not fuses(torch.bfloat16, "0") and not fuses(torch.float8_e4m3fn, "0")


def test_decode_splits_come_from_the_decode_rows_alone() -> None:
    """A mixed step's decode rows (100 tokens) beside a 30k-token chunk are split for their own
    length: sized by the chunk they would get as many splits as a 30k decode."""
    from livemeet.engine.model_runner import decode_kernel_splits

    lens = [30_000, 100, 90]
    got = decode_kernel_splits(lens, 2, 8, 132, 2)
    assert got == pa.choose_num_splits(2, 100, 8, 132, programs_per_sm=2) == 1
    assert pa.choose_num_splits(2, 30_000, 8, 132, programs_per_sm=2) > 1
    assert decode_kernel_splits([300, 300], 2, 8, 132, 2) == pa.choose_num_splits(
        2, 300, 8, 132, programs_per_sm=2
    )
    with pytest.raises(InternalError):
        decode_kernel_splits(lens, 0, 8, 132, 2)


@needs_interpreter
def test_kernels_write_only_their_slice_of_out_interpreted() -> None:
    """The Triton kernels (interpreted) write into row slices of one output and nothing else."""
    torch.manual_seed(5)
    q, kc, vc, m = _step([(0, 20), (37, 5), (70, 1), (18, 1)], 2, "cpu", torch.float32)
    out = torch.full_like(q, 7.0)
    t, p = q.shape[0] - 2, 2
    scale = HEAD_DIM**-0.5
    extend_out = pa.paged_extend_attention(
        q[:t], kc, vc, m.block_tables[:p], m.cu_seqlens_q[: p + 1], m.seq_lens[:p], scale,
        impl="triton", out=out[:t],
    )  # fmt: skip
    assert extend_out.data_ptr() == out.data_ptr()
    assert (out[t:] == 7.0).all()  # the decode rows' slice is untouched
    pa.paged_decode_attention(
        q[t:], kc, vc, m.block_tables[p:], m.seq_lens[p:], scale, num_splits=2, impl="triton",
        out=out[t:],
    )  # fmt: skip
    torch.testing.assert_close(out, _reference(q, kc, vc, m), atol=1e-5, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fp8", [False, True])
def test_mixed_step_cuda(fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real shapes (16 heads, 8 KV heads, head_dim 128), bf16 queries over a bf16 or e4m3
    cache with NaN in every unused slot: two chunks, then decode rows of long contexts."""
    torch.manual_seed(21)
    chunks, decodes = [(0, 300), (2000, 513)], [3001, 64, 1]
    lens = [p + n for p, n in chunks] + decodes
    kc, vc, tables, scale_kv = poisoned_caches(lens, 16, fp8=fp8)
    q_lens = [n for _, n in chunks] + [1] * len(decodes)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device="cuda")
    meta = StepMetadata(
        slot_mapping=torch.full((sum(q_lens),), -1, dtype=torch.long, device="cuda"),
        block_tables=tables,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device="cuda"),
        cu_seqlens_q=cu,
        max_seqlen_q=max(q_lens),
        max_seq_len=max(lens),
        decode_only=False,
        num_splits=8,
        num_decode_seqs=len(decodes),
    )
    q = torch.randn(sum(q_lens), 16, 128, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(paged_backend, "_fused_store", True)
    # a second layer: the same geometry, other values (NaN stays NaN in the unused slots)
    ks = [kc, (kc.float() * -0.5).to(kc.dtype)]
    vs = [vc, (vc.float() * 2.0).to(vc.dtype)]
    backend = PagedAttentionBackend(ks, vs, meta, kv_scale=scale_kv)
    out = torch.empty_like(q)
    for layer in (0, 1, 0):  # one set of launches for the step, the partials shared
        backend.attend(layer, q, None, None, 0.088, out)
        ref = ref_paged_extend_attention(
            q.float(), ks[layer], vs[layer], tables, cu, meta.seq_lens, 0.088,
            k_scale=scale_kv, v_scale=scale_kv,
        )  # fmt: skip
        assert out.dtype == torch.bfloat16 and not out.isnan().any()
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
