"""The decode-kernel sweep's candidate list (the timing itself needs a GPU)."""

from __future__ import annotations

import dataclasses

from livemeet.layers import paged_attention as pa
from loadtest.sweep_decode_kernel import candidates


def test_defaults_come_first_and_nothing_repeats() -> None:
    for full in (False, True):
        for fp8 in (False, True):
            got = candidates(full, fp8)
            assert got[:2] == [pa.default_decode_config(False), pa.default_decode_config(True)]
            assert len(set(got)) == len(got)
            assert any(not c.merge_in_kernel for c in got)  # the merge kernel, side by side
            assert any(c.fp8_qk for c in got) is fp8
    grid = set(candidates(True)) - set(candidates(False))
    assert {(c.block_n, c.num_warps) for c in grid} >= {(64, 8), (128, 4)}


def test_fp8_forms_vary_only_the_fp8_default() -> None:
    fp8_default = pa.default_decode_config(True)
    forms = [c for c in candidates(False, True) if c.fp8_qk]
    assert [dataclasses.replace(c, fp8_qk=False, fp8_pv=False) for c in forms] == [fp8_default] * 2
    assert [c.fp8_pv for c in forms] == [False, True]
