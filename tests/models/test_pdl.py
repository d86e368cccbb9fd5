"""Programmatic dependent launch: when it is used, and (GPU) that a chain of dependent decode
kernels launched with it computes exactly what it computes without it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from livemeet.layers import linear, pdl
from livemeet.layers import paged_attention as pa
from loadtest.check_pdl import (
    CHAIN_SPLITS,
    KV_DTYPES,
    STAGES,
    ChainState,
    check,
    decoder_chain,
    first_difference,
)
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


@pytest.mark.parametrize("kv_dtype", [dtype for _, dtype in KV_DTYPES])
def test_decoder_chain_runs_on_the_cpu_references(
    kv_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain's shapes and bookkeeping (on a GPU, `check` runs it with and without PDL),
    over each KV cache dtype, with every decode attention split so that its partials are
    merged (one split, the default at these contexts, would launch no merge of either kind)."""
    splits: list[int | None] = []
    real = pa.paged_decode_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        splits.append(kwargs.get("num_splits"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pa, "paged_decode_attention", spy)
    s = ChainState(20, "cpu", kv_dtype)
    before = [c.clone() for c in s.k_caches]
    out = decoder_chain(s, torch.randn(1, 1024, dtype=torch.bfloat16))
    assert len(out) == 20 * len(STAGES) and out[-1].shape == (1, 1024)
    assert all(torch.isfinite(t.float()).all() for t in out)
    for i, (old, new) in enumerate(zip(before, s.k_caches, strict=True)):
        changed = (old.float() != new.float()).flatten(2).any(-1).flatten()  # per slot
        assert changed.nonzero().flatten().tolist() == [s.slots[i].item()]  # its own token only
        assert new.dtype == kv_dtype
    assert splits == [CHAIN_SPLITS] * 20 and CHAIN_SPLITS > 1
    assert first_difference(out, out) is None
    other = [t.clone() for t in out]
    other[len(STAGES) + STAGES.index("o")] += 1  # layer 1, "o"
    assert (first_difference(other, out) or "").startswith("layer 1 o: max |diff| 1")


@gpu
@needs_cuda
def test_pdl_chain_equals_plain_launches_cuda(restore_pdl: None) -> None:
    report = check(100)
    assert report == dict.fromkeys(report, "equal")


def test_pdl_study_mode_selects_kernels_and_restores(
    monkeypatch: pytest.MonkeyPatch, restore_pdl: None
) -> None:
    """loadtest.pdl_study's modes: PDL for the named Triton kernels only, the CUDA decode
    kernel's flag through `pdl.is_enabled`, and both restored afterwards."""
    from loadtest.pdl_study import MODES, pdl_mode

    monkeypatch.setattr(pdl, "HAS_GDC", True)
    monkeypatch.setattr(pdl, "_capable", lambda index: True)

    def kernel(name: str) -> object:  # a compiled kernel: its `fn` carries the name
        return SimpleNamespace(fn=type(name, (), {}))

    full, enabled = pdl.launch_options, pdl.is_enabled
    cuda = fake_tensor(True)
    on = {"PDL": True, "launch_pdl": True}
    with pdl_mode(*MODES["dot off"]):
        assert pdl.is_enabled()
        assert pdl.launch_options(cuda, kernel("_skinny_dot_kernel")) == {"PDL": False}  # type: ignore[arg-type]
        assert pdl.launch_options(cuda, kernel("_skinny_rows_kernel")) == on  # type: ignore[arg-type]
    with pdl_mode(*MODES["attention off"]):
        assert not pdl.is_enabled()
        assert pdl.launch_options(cuda, kernel("_decode_merge_kernel")) == {"PDL": False}  # type: ignore[arg-type]
    assert pdl.launch_options is full and pdl.is_enabled is enabled


def test_pdl_study_modes_apply_at_every_batch(restore_pdl: None) -> None:
    """The engine launches decode attention with PDL at batch 1 only (pdl_max_rows); the
    study's modes choose for every batch it times, and the limit returns afterwards."""
    from loadtest.pdl_study import MODES, pdl_mode

    pdl.set_enabled(False)
    defaults = [pa.default_decode_config(fp8) for fp8 in (False, True)]
    assert all(c.pdl_max_rows == pa.DECODE_PDL_MAX_ROWS for c in defaults)
    for mode in ("all", "attention only", "dot off"):
        with pdl_mode(*MODES[mode]):
            for fp8, default in zip((False, True), defaults, strict=True):
                cfg = pa.default_decode_config(fp8)
                assert cfg.pdl_max_rows >= 1024, mode
                assert cfg == dataclasses.replace(default, pdl_max_rows=cfg.pdl_max_rows)
    assert [pa.default_decode_config(fp8) for fp8 in (False, True)] == defaults
    assert not pdl.is_enabled()  # set_enabled(True) inside the mode is undone
