"""HostStaging: per-step uploads from pinned arenas (livemeet.engine.staging).

CPU: values, shapes and dtypes; nothing is shared between uploads. GPU: the arenas alternate by
step, a reused arena waits for its copies, growth keeps earlier copies intact, and misuse raises.
"""

from __future__ import annotations

import pytest
import torch

from livemeet.engine.staging import HostStaging
from livemeet.errors import InternalError

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def test_cpu_uploads_are_fresh_tensors() -> None:
    staging = HostStaging(torch.device("cpu"))
    staging.begin_step()
    a = staging.upload([1, 2, 3], torch.int64)
    b = staging.upload([4, 5, 6], torch.int64)
    assert a.tolist() == [1, 2, 3] and b.tolist() == [4, 5, 6]  # b did not overwrite a
    assert a.dtype == torch.int64
    m = staging.upload(list(range(6)), torch.int32, shape=(2, 3))
    assert m.tolist() == [[0, 1, 2], [3, 4, 5]] and m.dtype == torch.int32
    staging.end_step()


def test_cpu_stage_rows_zero_fills() -> None:
    staging = HostStaging(torch.device("cpu"))
    with staging.step():
        rows = staging.stage_rows([[3, 4, 5], [7]], 4, torch.int32)
    assert rows.tolist() == [[3, 4, 5, 0], [7, 0, 0, 0]] and rows.dtype == torch.int32


def test_only_integer_dtypes_and_only_inside_a_step() -> None:
    staging = HostStaging(torch.device("cpu"))
    with pytest.raises(InternalError, match="outside"):
        staging.upload([1], torch.int64)
    with pytest.raises(InternalError, match="outside"):
        staging.stage_rows([[1]], 1, torch.int32)
    staging.begin_step()
    with pytest.raises(InternalError, match="int32/int64"):
        staging.upload([1.0], torch.float32)
    with pytest.raises(InternalError, match="int32/int64"):
        staging.stage_rows([[1]], 1, torch.float16)
    staging.end_step()


def test_step_brackets_nest_and_must_pair() -> None:
    staging = HostStaging(torch.device("cpu"))
    with pytest.raises(InternalError, match="without begin_step"):
        staging.end_step()
    with staging.step():
        arena = staging._current
        with staging.step():  # e.g. GraphRunner.run inside ModelRunner.launch
            assert staging._current == arena  # the inner bracket does not switch arenas
        assert staging._in_step
    assert not staging._in_step
    with staging.step():
        assert staging._current != arena  # the next step uses the other arena
    with pytest.raises(RuntimeError), staging.step():
        raise RuntimeError("a failing step still closes its bracket")
    assert not staging._in_step


@needs_cuda
@pytest.mark.gpu
def test_cuda_arenas_alternate_and_grow() -> None:
    device = torch.device("cuda")
    staging = HostStaging(device, arena_bytes=256)
    with pytest.raises(InternalError, match="outside"):
        staging.stage([1], torch.int64)
    outs = []
    for step in range(6):
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time: the copies below stay pending
        staging.begin_step()
        values = [step * 1000 + i for i in range(100)]  # 800 bytes: grows the 256-byte arena
        host = staging.stage(values, torch.int64)
        assert host.is_pinned()
        outs.append((values, host.to(device, non_blocking=True)))
        small = staging.upload([step, -step], torch.int32)
        tables = staging.stage_rows([[step] * 5, [step + 1] * 3], 5, torch.int32)
        assert tables[0].tolist() == [step] * 5 and tables[1, :3].tolist() == [step + 1] * 3
        staging.end_step()
        assert small.tolist() == [step, -step]
    torch.cuda.synchronize()
    for values, device_copy in outs:
        assert device_copy.tolist() == values  # no later step overwrote a pending copy


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("start", "length"), [(0, 31), (0, 32), (5, 300), (37, 1_000), (511, 33)])
def test_step_rows_positions_and_slots_of_a_chunk(block_size: int, start: int, length: int):
    """A chunk's rows (numpy from VECTOR_ROWS_MIN tokens, a loop below it) hold each token's
    position and slot = its block's id * block_size + offset, through a shuffled table."""
    import random

    from livemeet.engine.model_runner import VECTOR_ROWS_MIN, _StepRows
    from livemeet.engine.request import Request

    assert VECTOR_ROWS_MIN == 32  # so (0, 31) and (0, 32) take the two paths
    rng = random.Random(start * 7 + length)
    req = Request("r", list(range(start + length)))
    req.block_table = rng.sample(range(10_000), -(-(start + length) // block_size))
    rows = _StepRows()
    rows.add_sequence(req, 0, [1], block_size)  # a decode-like row first: offsets carry on
    rows.add_sequence(req, start, req.token_ids(start, start + length), block_size)
    positions = list(range(start, start + length))
    assert rows.token_ids == [1, *req.token_ids(start, start + length)]
    assert rows.positions == [0, *positions]
    table = req.block_table
    want = [table[p // block_size] * block_size + p % block_size for p in positions]
    assert rows.slots == [table[0] * block_size, *want]
    assert all(type(s) is int for s in rows.slots)  # plain ints: the uploads stage them
    assert rows.row_of(start + 3) == 4 and rows.block_tables[-1] is table
