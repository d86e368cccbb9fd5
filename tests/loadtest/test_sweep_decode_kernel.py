"""The decode-kernel sweep's candidate list (the timing itself needs a GPU)."""

from __future__ import annotations

import dataclasses

from livemeet.layers import paged_attention as pa
from loadtest.sweep_decode_kernel import candidates, split_candidates


def test_defaults_come_first_and_nothing_repeats() -> None:
    for full in (False, True):
        for fp8 in (False, True):
            got = candidates(full, fp8)
            assert got[0] == pa.default_decode_config(fp8)  # the CUDA kernel where it runs
            triton = [dataclasses.replace(c, backend="triton") for c in got[:1]]
            assert set(triton) <= set(got[1:])  # next to the same form in Triton
            assert len(set(got)) == len(got)
            triton_forms = [c for c in got if c.backend == "triton"]
            merges = {c.merge_in_kernel for c in triton_forms[:4]}
            assert merges == {True, False}  # both merges of the Triton defaults, side by side
            cuda_forms = [c for c in got if c.backend == "cuda"]
            assert {c.cuda_early_loads for c in cuda_forms} == {True, False}
            assert {c.cuda_merge_in_kernel for c in cuda_forms} == {True, False}
            other_order = [c for c in cuda_forms if c.cuda_heads_inner]
            assert {c.cuda_merge_in_kernel for c in other_order} == {True, False}
            assert len({c.cuda_stages for c in cuda_forms if c.cuda_stages}) == (3 if fp8 else 1)
            assert any(c.fp8_qk for c in got) is fp8
    grid = set(candidates(True)) - set(candidates(False))
    assert {(c.block_n, c.num_warps) for c in grid} >= {(64, 8), (128, 4)}


def test_grid_merges_as_the_dtype_default() -> None:
    """The tile/warp/stage grid is timed with the point's default merge: bf16 merges in a
    second kernel since session 4, and a grid of in-kernel merges would both trail the bf16
    default by the merge's cost and, if one still won, flip the merge with the tiles."""
    for fp8 in (False, True):
        grid = set(candidates(True, fp8)) - set(candidates(False, fp8))
        assert grid and all(
            c.merge_in_kernel is pa.default_decode_config(fp8).merge_in_kernel for c in grid
        )


def test_fp8_form_varies_only_the_fp8_default() -> None:
    forms = [c for c in candidates(False, True) if c.fp8_qk]
    expected = dataclasses.replace(pa.default_decode_config(True), fp8_qk=True, backend="triton")
    assert forms == [expected]


def test_the_approximate_form_is_never_the_best() -> None:
    from loadtest.sweep_decode_kernel import SweepRow, exact

    fast = SweepRow("fp8_e4m3", 1, 36_000, 64, forms_config(), 10.0, 7.0, 1.6, 0.1)
    slow = SweepRow("fp8_e4m3", 1, 36_000, 64, pa.default_decode_config(True), 40.0, 1.8, 0.4, 0)
    assert exact([fast, slow]) == [slow]


def forms_config() -> pa.DecodeKernelConfig:
    return dataclasses.replace(pa.default_decode_config(True), fp8_qk=True)


def test_split_candidates_cover_powers_of_two_and_full_waves() -> None:
    """At 1 x 36k on 132 SMs (8 KV heads) the default (64) sits among the powers of two around
    it and the counts whose 8 x n programs fill the SMs 1..6 times (16, 33, 49, 66, 82, 99)."""
    got = split_candidates(1, 36000, 132)
    assert got == sorted(set(got))
    default = pa.choose_num_splits(1, 36000, 8, 132)
    assert {default // 2, default, default * 2} <= set(got)
    assert {33, 49, 66, 99} <= set(got)
    # a short context caps the count at 16 keys per split; a big batch leaves few waves
    assert max(split_candidates(1, 256, 132)) <= 16
    assert split_candidates(16, 36000, 132)[:3] == [1, 2, 3]


def test_rows_are_grouped_per_layout() -> None:
    from loadtest.sweep_decode_kernel import HEAD_PER_SEQUENCE, TOKEN_MAJOR, SweepRow, point_key

    cfg = pa.default_decode_config(True)
    rows = [SweepRow("fp8_e4m3", 16, 36_000, 3, cfg, 1.0, 1.0, 1.0, 0.0, layout)
            for layout in (TOKEN_MAJOR, HEAD_PER_SEQUENCE)]  # fmt: skip
    assert point_key(rows[0]) != point_key(rows[1])
