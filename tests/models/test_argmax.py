"""Greedy sampling's argmax kernel (livemeet.layers.argmax) against torch.argmax: ties, -inf
rows, NaN, chunking past MAX_CHUNKS, the split-K counters left re-armed, and the sampler's use
of it. CPU-only machines run the kernel under the Triton interpreter; the `gpu` tests run it
on the real vocabulary in bf16, eagerly and in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from livemeet.errors import InternalError
from livemeet.layers import argmax, split_k
from tests.kernels import interpreted, kernel_marks

argmax = interpreted(argmax, "_argmax_kernel")
needs_interpreter, needs_cuda = kernel_marks(argmax)
VOCAB = 151_936  # the real LM head's rows (MODEL.md section 4)


def _check(logits: torch.Tensor) -> torch.Tensor:
    got = argmax.greedy_argmax(logits, impl="triton")
    assert got.dtype == torch.int64 and got.shape == logits.shape[:1]
    assert torch.equal(got, logits.argmax(dim=-1)), (got, logits.argmax(dim=-1))
    counters = split_k.counters(logits.device, logits.shape[0])
    assert counters is not None and not counters[: logits.shape[0]].any()  # re-armed
    return got


@needs_interpreter
@pytest.mark.parametrize(
    ("rows", "vocab", "dtype"),
    [
        (1, VOCAB, torch.bfloat16),  # one row of the real vocabulary: 149 chunks
        (3, 1000, torch.float32),  # a ragged last chunk
        (2, 5, torch.bfloat16),  # one partial load
        (1, argmax.CHUNK_BLOCK * argmax.MAX_CHUNKS + 3, torch.bfloat16),  # two loads a chunk
    ],
)
def test_matches_torch_argmax(rows: int, vocab: int, dtype: torch.dtype) -> None:
    torch.manual_seed(rows * 7 + vocab)
    logits = torch.randn(rows, vocab).to(dtype)
    _check(logits)
    _check(torch.randn(rows, vocab).to(dtype))  # again: the counters were re-armed


@needs_interpreter
def test_ties_go_to_the_lowest_index_within_and_across_chunks() -> None:
    vocab = argmax.CHUNK_BLOCK * argmax.MAX_CHUNKS * 2  # two loads per chunk: lanes revisit
    logits = torch.zeros(4, vocab, dtype=torch.bfloat16)
    logits[0, [3000, 1500]] = 1.0  # different chunks
    logits[1, [11, 10]] = 1.0  # neighbouring lanes of one load
    logits[2, [7 + argmax.CHUNK_BLOCK, 7]] = 1.0  # one lane, consecutive loads of a chunk
    logits[3] = 2.0  # all equal
    assert _check(logits).tolist() == [1500, 10, 7, 0]


@needs_interpreter
def test_infinities_and_nan() -> None:
    logits = torch.full((4, 3000), float("-inf"))
    logits[1, 2999] = -1e30  # the last element, in the ragged last chunk
    logits[2, 1234] = float("nan")  # NaN wins, as in torch.argmax
    logits[3, 2048] = float("inf")
    assert _check(logits).tolist() == [0, 2999, 1234, 2048]


def test_cpu_tensors_and_torch_impl_use_torch_argmax() -> None:
    logits = torch.randn(2, 50)
    logits[:, 10] = logits[:, 30] = 10.0
    assert argmax.greedy_argmax(logits).tolist() == [10, 10]
    assert argmax.greedy_argmax(logits, impl="torch").tolist() == [10, 10]


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(2, 0), torch.zeros(2, 3, 4)])
def test_rejects_other_shapes(bad: torch.Tensor) -> None:
    with pytest.raises(InternalError, match="logits"):
        argmax.greedy_argmax(bad)


@needs_interpreter
def test_rejects_rows_not_contiguous() -> None:
    with pytest.raises(InternalError, match="contiguous"):
        argmax.greedy_argmax(torch.zeros(8, 4).t(), impl="triton")


def test_chunking() -> None:
    assert argmax.chunking(VOCAB) == (149, 1)
    assert argmax.chunking(1) == (1, 1)
    limit = argmax.CHUNK_BLOCK * argmax.MAX_CHUNKS
    assert argmax.chunking(limit) == (argmax.MAX_CHUNKS, 1)
    chunks, iters = argmax.chunking(limit + 1)
    assert iters == 2 and chunks <= argmax.MAX_CHUNKS and chunks * iters * 1024 >= limit + 1


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 128])
def test_real_vocabulary_on_the_gpu(rows: int) -> None:
    torch.manual_seed(rows)
    logits = torch.randn(rows, VOCAB, device="cuda").to(torch.bfloat16)
    logits[0, [77_000, 150_000]] = 100.0  # a tie far apart
    _check(logits)
    assert int(argmax.greedy_argmax(logits, impl="triton")[0]) == 77_000


@needs_cuda
@pytest.mark.gpu
def test_in_a_cuda_graph() -> None:
    logits = torch.randn(16, VOCAB, device="cuda").to(torch.bfloat16)
    argmax.greedy_argmax(logits, impl="triton")  # the counters exist before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax.greedy_argmax(logits, impl="triton")
    for seed in range(3):
        torch.manual_seed(seed)
        logits.copy_(torch.randn_like(logits, dtype=torch.float32).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, logits.argmax(dim=-1))
