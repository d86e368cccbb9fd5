"""Shared set-up of the Triton kernel tests (paged attention, fused decoder kernels, skinny
GEMMs): on a CPU-only machine the kernels must run under the Triton interpreter, which reads
TRITON_INTERPRET when a kernel is decorated, i.e. when its module is first imported."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"


def interpreted(module: ModuleType, kernel: str) -> ModuleType:
    """`module`, reloaded when it was imported (its `kernel` decorated) before the interpreter
    flag was set on a CPU-only machine; unchanged otherwise."""
    if (
        not HAS_CUDA
        and module.HAS_TRITON
        and type(getattr(module, kernel)).__name__ != "InterpretedFunction"
    ):
        return importlib.reload(module)
    return module


def kernel_marks(module: ModuleType) -> tuple[pytest.MarkDecorator, pytest.MarkDecorator]:
    """(needs_interpreter, needs_cuda) skip marks for the kernels of `module`."""
    needs_interpreter = pytest.mark.skipif(
        HAS_CUDA or not module.HAS_TRITON,
        reason="Triton interpreter tests run on CPU-only machines",
    )
    needs_cuda = pytest.mark.skipif(
        not (HAS_CUDA and module.HAS_TRITON), reason="needs CUDA and Triton"
    )
    return needs_interpreter, needs_cuda
