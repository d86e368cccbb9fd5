"""Programmatic dependent launch (PDL) for the decode step's Triton kernels.

A one-row decode step is a chain of ~8 kernels per layer of 2-45 us each, and each kernel
spends its first microsecond or so waiting for its first HBM reads while the SMs drain the
kernel before it. With PDL (Hopper, sm_90 and later; the PTX ISA's `griddepcontrol`) a
kernel launched with Triton's `launch_pdl` option may be scheduled while its predecessor is
still running: its programs first issue the loads that no earlier kernel writes (projection
weights), then block in `gdc_wait` until the predecessor has finished and its writes are
visible. Every kernel here also calls `gdc_launch_dependents` at once, so its successor is
scheduled as soon as SM room frees up.

Hazards, for every kernel launched with PDL:
- it runs `gdc_wait` (through `dependency_sync`) before it reads anything an earlier kernel
  writes and before it writes anything: a successor's early start is safe only because each
  kernel waited for its own predecessor (completion is transitive through the wait alone);
- the loads it issues before the wait touch only memory that no kernel in flight writes.
A kernel launched without PDL (cuBLAS, torch ops) simply starts after its predecessor ends.

`LIVEMEET_PDL=0` in the environment turns PDL off (for side-by-side benchmarks); it is read
when this module is imported. CUDA graphs keep whatever was captured.
"""

from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU-only install path
    HAS_TRITON = False
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # no Triton, or one without grid dependency control
    HAS_GDC = False

PDL_ENV = "LIVEMEET_PDL"
PDL_MIN_CAPABILITY = (9, 0)  # griddepcontrol needs sm_90
_enabled = os.environ.get(PDL_ENV, "1") != "0"


def set_enabled(on: bool) -> None:
    """Turn PDL on or off for later launches (graphs captured before keep their launches)."""
    global _enabled
    _enabled = on


def is_enabled() -> bool:
    """Whether later launches on a capable GPU use PDL."""
    return _enabled


def is_interpreted(kernel: object) -> bool:
    """Whether `kernel` runs under the Triton interpreter (TRITON_INTERPRET=1: the CPU tests),
    which has no grid dependency control and no libdevice."""
    return type(kernel).__name__ == "InterpretedFunction"


@functools.cache
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= PDL_MIN_CAPABILITY


def launch_options(t: torch.Tensor, kernel: object) -> dict[str, bool]:
    """Keyword arguments for launching `kernel` (a Triton kernel taking a `PDL` constexpr) on
    `t`'s device: PDL=True and launch_pdl=True on a capable GPU with PDL enabled, else
    PDL=False (the CPU interpreter, older GPUs, Triton without grid dependency control)."""
    if not (_enabled and HAS_GDC and t.is_cuda and not is_interpreted(kernel)):
        return {"PDL": False}
    if not _capable(t.device.index if t.device.index is not None else 0):
        return {"PDL": False}
    return {"PDL": True, "launch_pdl": True}


if HAS_TRITON:

    @triton.jit
    def dependency_sync(PDL: tl.constexpr):
        """Let the next kernel be scheduled, then wait until the previous one has finished and
        its writes are visible. Nothing when PDL is off (never on without HAS_GDC, so the
        untaken branch never needs the gdc names)."""
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
