"""loadtest.sweep_extend_kernel: its candidates, FLOP count and choice of the best (CPU)."""

from __future__ import annotations

from livemeet.layers import paged_attention as pa
from loadtest.sweep_extend_kernel import SHAPES, Row, best, candidates, pair_flop


def test_candidates_start_with_the_default_and_are_distinct() -> None:
    cands = candidates()
    assert cands[0] == pa.ExtendKernelConfig()
    assert len(set(cands)) == len(cands) > 10
    # the default's large tiles are not timed twice under another name
    assert pa.ExtendKernelConfig(rows=pa.EXTEND_ROWS) not in cands


def test_pair_flop_counts_causal_pairs() -> None:
    # 2 new tokens after 3 cached: 2 x 3 + (1 + 2) = 9 pairs, 4 FLOP x 16 heads x 128 each
    assert pair_flop([(3, 2)]) == 9 * 4 * 16 * 128
    assert pair_flop([(3, 2), (0, 1)]) == 10 * 4 * 16 * 128


def test_best_takes_the_least_total_time_over_complete_shapes() -> None:
    fast, slow, partial = (pa.ExtendKernelConfig(block_n=n) for n in (64, 128, 32))
    rows = [Row("bf16", s, slow, 2.0, 0.0, 0.0) for s in SHAPES]
    rows += [Row("bf16", s, fast, 1.0, 0.0, 0.0) for s in SHAPES]
    rows += [Row("bf16", next(iter(SHAPES)), partial, 0.1, 0.0, 0.0)]  # one shape only
    rows += [Row("fp8_e4m3", s, slow, 3.0, 0.0, 0.0) for s in SHAPES]
    chosen = best(rows)
    assert chosen["bf16"] == (fast, len(SHAPES) * 1.0)
    assert chosen["fp8_e4m3"][0] == slow


def test_best_never_picks_a_configuration_with_wrong_output() -> None:
    right, wrong = (pa.ExtendKernelConfig(block_n=n) for n in (128, 64))
    rows = [Row("bf16", s, right, 2.0, 0.0, 0.0) for s in SHAPES]
    # faster everywhere, but one shape's output is off
    rows += [Row("bf16", s, wrong, 1.0, 0.0, 0.5 if i == 1 else 0.0) for i, s in enumerate(SHAPES)]
    assert best(rows)["bf16"][0] == right
