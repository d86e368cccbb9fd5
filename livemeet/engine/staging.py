"""Host-to-device uploads of a step's small inputs without per-step allocations or host waits.

Every step uploads a few small integer arrays (token ids, positions, slots, sequence lengths,
block tables, row indices). Building each with `torch.tensor(list)` and `pin_memory()` cost
~0.4 ms of host time per decode step at batch 1 and ~7 ms at batch 16 with 36k-token contexts
on an H200 host (loadtest/bench_decode_step.py --profile), which caps a batch-1 decode loop
once the GPU step is ~1.5 ms. `HostStaging` instead writes the values with numpy into one of
two pinned arenas and issues non_blocking copies from there.

Hazard: a pinned buffer must not be rewritten while a copy from it may still be pending. The
arenas alternate by step and each records a CUDA event after its step's copies; `begin_step`
waits on the event of the arena it is about to reuse (the step before last, whose sampled ids
the engine has already read, so the wait is normally free). On the CPU there is nothing to
pin or to overlap: `upload` returns a fresh tensor and nothing is reused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from livemeet.errors import InternalError

ARENA_BYTES = 1 << 20  # initial size of each arena; grows (doubling) for large prefill steps
ALIGN_BYTES = 64  # start of every staged array (cache line; no two copies share one)
NUMPY_DTYPES = {torch.int64: np.int64, torch.int32: np.int32}


class HostStaging:
    """Two pinned arenas used alternately by steps (see module docstring). Call `begin_step`
    before staging a step's inputs and `end_step` after enqueueing its copies, or use
    `with staging.step():`. Brackets nest: only the outermost one switches arenas."""

    def __init__(self, device: torch.device, arena_bytes: int = ARENA_BYTES) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._arenas = [_Arena(arena_bytes, self.cuda, device) for _ in range(2)]
        self._current = 0
        self._depth = 0  # open begin_step brackets

    @property
    def _in_step(self) -> bool:
        return self._depth > 0

    def begin_step(self) -> None:
        """Open a step's bracket; the outermost switches to the other arena and, on CUDA, waits
        until the copies of the step that last used it are done."""
        self._depth += 1
        if self._depth == 1:
            self._current ^= 1
            self._arenas[self._current].reset()

    def end_step(self) -> None:
        """Close a bracket; the outermost records a CUDA event after the step's copies on the
        device's current stream. Raises InternalError without an open `begin_step`."""
        if self._depth == 0:
            raise InternalError("HostStaging.end_step without begin_step")
        self._depth -= 1
        if self._depth == 0:
            self._arenas[self._current].fence()

    @contextmanager
    def step(self) -> Iterator[None]:
        """`begin_step` ... `end_step` around a block (also when it raises)."""
        self.begin_step()
        try:
            yield
        finally:
            self.end_step()

    def stage(
        self, values: Sequence[int] | np.ndarray, dtype: torch.dtype, shape: tuple[int, ...] = ()
    ) -> torch.Tensor:
        """A host tensor of `values` (pinned, inside the current arena on CUDA), `shape` if
        given (values are then its row-major contents). Raises InternalError outside a step,
        or for a dtype other than int32/int64."""
        np_dtype = self._check(dtype)
        if not self.cuda:
            array: np.ndarray = np.asarray(values, dtype=np_dtype)
            return torch.from_numpy(array.reshape(shape or array.shape).copy())
        count = len(values) if not shape else int(np.prod(shape))
        out = self._arenas[self._current].take(count, np_dtype, shape or (count,))
        out.numpy()[...] = np.asarray(values, dtype=np_dtype).reshape(out.shape)
        return out

    def stage_rows(
        self, rows: Sequence[Sequence[int]], width: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """[len(rows), width] with row i starting with rows[i]; entries past a row's length are
        left as they were (callers bound reads by sequence length: block tables)."""
        np_dtype = self._check(dtype)
        shape = (len(rows), width)
        if self.cuda:
            out = self._arenas[self._current].take(shape[0] * width, np_dtype, shape)
        else:
            out = torch.zeros(shape, dtype=dtype)
        view = out.numpy()
        for i, row in enumerate(rows):
            view[i, : len(row)] = row
        return out

    def _check(self, dtype: torch.dtype) -> type:
        """The numpy dtype for `dtype`; raises InternalError for other dtypes or when no step
        is open (enforced on the CPU too, so CPU tests catch a missing bracket)."""
        np_dtype = NUMPY_DTYPES.get(dtype)
        if np_dtype is None:
            raise InternalError(f"HostStaging stages int32/int64 only, not {dtype}")
        if not self._in_step:
            raise InternalError("HostStaging used outside begin_step/end_step")
        return np_dtype

    def upload(
        self, values: Sequence[int] | np.ndarray, dtype: torch.dtype, shape: tuple[int, ...] = ()
    ) -> torch.Tensor:
        """`stage`, then a non_blocking copy to the device (the host does not wait)."""
        host = self.stage(values, dtype, shape)
        return host.to(self.device, non_blocking=True) if self.cuda else host


class _Arena:
    """One pinned byte buffer handed out front to back within a step."""

    def __init__(self, nbytes: int, pinned: bool, device: torch.device | None = None) -> None:
        self.pinned = pinned
        self.device = device
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        self.offset = 0
        # one event per arena, re-recorded every step it serves (no per-step creation)
        self.event: torch.cuda.Event | None = None
        if pinned:
            self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.recorded = False

    def reset(self) -> None:
        if self.event is not None and self.recorded:
            self.event.synchronize()  # copies of the step before last are done
        self.offset = 0

    def fence(self) -> None:
        if self.event is not None:
            # the stream of the device the copies went to (not the current device's)
            self.event.record(torch.cuda.current_stream(self.device))
            self.recorded = True

    def take(self, count: int, np_dtype: type, shape: tuple[int, ...]) -> torch.Tensor:
        itemsize = np.dtype(np_dtype).itemsize
        start = -(-self.offset // ALIGN_BYTES) * ALIGN_BYTES
        end = start + count * itemsize
        if end > self.buffer.numel():
            # Grow: copies already enqueued from the old buffer keep it alive (the caching
            # host allocator records their stream use), so it can simply be dropped.
            self.buffer = torch.empty(
                max(2 * self.buffer.numel(), end), dtype=torch.uint8, pin_memory=self.pinned
            )
            start, end = 0, count * itemsize
        self.offset = end
        torch_dtype = torch.int64 if np_dtype is np.int64 else torch.int32
        return self.buffer[start:end].view(torch_dtype).view(shape)
