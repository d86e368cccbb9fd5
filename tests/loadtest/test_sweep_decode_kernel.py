"""The decode-kernel sweep's candidate list (the timing itself needs a GPU)."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

import loadtest.sweep_decode_kernel as sweep
from livemeet.layers import cuda_decode
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


@pytest.mark.parametrize("fp8", [False, True])
def test_the_prefetch_sweep_brackets_its_forms_with_the_default_off(fp8: bool) -> None:
    plan = sweep.prefetch_candidates(fp8)
    off = dataclasses.replace(pa.default_decode_config(fp8), cuda_prefetch=0)
    assert plan[0] == plan[-1] == off
    forms = [(c.cuda_prefetch, c.cuda_prefetch_bulk) for c in plan[1:-1]]
    assert forms == list(sweep.PREFETCH_FORMS) and len(set(forms)) == len(forms)
    # only the prefetch differs from the default: the rows time that and nothing else
    assert all(
        dataclasses.replace(c, cuda_prefetch_bulk=False, cuda_prefetch=0) == off for c in plan
    )
    assert all(0 < n <= cuda_decode.MAX_PREFETCH_TILES for n, _ in forms)


def prefetch_row(
    us: float, prefetch: int, bulk: bool = False, point=("bf16", 1, 36000), err: float = 0.0
) -> dict:
    cfg = dataclasses.replace(
        pa.default_decode_config(point[0] != "bf16"),
        cuda_prefetch=prefetch,
        cuda_prefetch_bulk=bulk,
    )
    row = sweep.SweepRow(*point, 33, cfg, us, 3.7, 0.86, err)
    return dataclasses.asdict(row)


def test_the_picked_prefetch_must_beat_the_off_rows_by_one_percent() -> None:
    off = [prefetch_row(40.0, 0), prefetch_row(40.4, 0)]  # mean 40.2
    assert sweep.prefetch_setting([*off, prefetch_row(39.9, 2)], "bf16", 1, 36000) == "0"
    rows = [*off, prefetch_row(39.9, 2), prefetch_row(38.0, 4, True), prefetch_row(38.5, 3)]
    assert sweep.prefetch_setting(rows, "bf16", 1, 36000) == "4b"
    # another point's or dtype's rows do not count
    other = [prefetch_row(10.0, 6, point=("fp8_e4m3", 1, 36000)), *off]
    assert sweep.prefetch_setting(other, "bf16", 1, 36000) == "0"
    assert sweep.prefetch_setting(rows, "bf16", 16, 36000) == "0"


def test_pick_prefetch_prints_the_setting_from_the_json(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "sweep.json"
    rows = [prefetch_row(40.0, 0), prefetch_row(37.0, 2), prefetch_row(40.1, 0)]
    path.write_text(json.dumps({"rows": rows}))
    argv = ["sweep", "--pick-prefetch", str(path), "--points", "1x36000", "--dtypes", "bf16"]
    monkeypatch.setattr(sys, "argv", argv)
    sweep.main()
    assert capsys.readouterr().out.strip() == "2"


def test_a_prefetch_form_with_a_larger_error_is_never_picked() -> None:
    off = [prefetch_row(40.0, 0, err=2e-3), prefetch_row(40.0, 0, err=1e-3)]
    wrong = prefetch_row(30.0, 2, err=0.5)  # fast because it read the wrong bytes
    assert sweep.prefetch_setting([*off, wrong], "bf16", 1, 36000) == "0"
    rows = [*off, wrong, prefetch_row(38.0, 3, err=2e-3)]
    assert sweep.prefetch_setting(rows, "bf16", 1, 36000) == "3"
