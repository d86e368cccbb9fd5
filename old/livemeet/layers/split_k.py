"""Split-K semaphores: the last program to finish a tile reduces every program's partial.

A kernel that cuts a reduction (attention's keys, a projection's K) across programs writes
one partial per program; instead of a second kernel that sums them, each program counts
itself done on a per-tile int32 counter, and the one that sees the count reach the number of
parts reduces the partials in a fixed order (so results are deterministic) and re-arms the
counter to 0 for the next call or graph replay. The pattern: a CTA barrier so every thread's
partial stores precede the release, one acq_rel atomic per program, the reducer reading the
partials through L2 (".cg" loads; L1 is not coherent across SMs).

Hazard: one zeroed counter buffer per device is shared by every such kernel (decode
attention, the skinny projections) and by every captured graph. That is safe only while
these kernels run one after another on one stream, as the engine's steps and graph replays
do; two overlapping launches (a second stream) would corrupt each other's counts. Under
programmatic dependent launch each kernel touches the counters only after its
`pdl.dependency_sync`, which keeps them apart.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU-only install path
    HAS_TRITON = False

NUM_COUNTERS = 1 << 16  # tiles one device's counter buffer covers

_buffers: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device, needed: int) -> torch.Tensor | None:
    """The device's zeroed int32 counters (NUM_COUNTERS of them), or None when `needed`
    exceeds NUM_COUNTERS or when the buffer does not exist yet and a graph capture is in
    progress (a graph-pool tensor must not outlive its graph); callers then reduce another
    way. Made by the first call outside a capture (the engine's warm-up), so every captured
    graph shares it."""
    if needed > NUM_COUNTERS:
        return None
    buf = _buffers.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _buffers[device] = torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=device)
    return buf


if HAS_TRITON:

    @triton.jit
    def arrive_last(counter, num_parts):
        """Count this program's part of the tile done (after its partial stores); True in the
        program that completes the count, which then reduces and calls `rearm`."""
        tl.debug_barrier()  # every thread's partial stores precede the release below
        done = tl.atomic_add(counter, 1, sem="acq_rel")
        return done == num_parts - 1

    @triton.jit
    def rearm(counter):
        """Reset the tile's counter for the next call (and graph replay)."""
        tl.atomic_xchg(counter, 0)
