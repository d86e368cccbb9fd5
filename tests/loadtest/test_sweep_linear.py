"""loadtest.sweep_linear: its grid of projection configurations and its summary (CPU)."""

from __future__ import annotations

import pytest

from livemeet.layers.linear import DOT_CANDIDATES, dot_candidates, full_wave
from loadtest.sweep_linear import MAX_TILE_PER_THREAD, SHAPES, Row, candidates, summary


@pytest.mark.parametrize("name", list(SHAPES))
def test_grid_holds_the_tuners_candidates_and_only_launchable_ones(name: str) -> None:
    """Every configuration the tuner times on an H100's 132 SMs is in the grid (so the sweep
    compares against the tuner's pick), and every one in it fills the SMs, gives each K split
    a block, and keeps the weight tile within MAX_TILE_PER_THREAD elements a thread."""
    n, k = SHAPES[name]
    grid = candidates(n, k, 132)
    assert set(dot_candidates(n, 132)) <= set(grid)
    assert len(grid) > len(DOT_CANDIDATES)
    assert len(set(grid)) == len(grid)
    for c in set(grid) - set(dot_candidates(n, 132)):
        assert full_wave(c, n, 132) and c.block_n <= n
        assert c.split_k == 1 or k // c.split_k >= c.block_k
        assert c.block_n * c.block_k <= MAX_TILE_PER_THREAD * 32 * c.num_warps


def test_summary_ranks_configurations_beside_cublas_and_the_tuners_pick() -> None:
    def row(us: float, block_n: int | None, tuner: bool = False) -> Row:
        config = None if block_n is None else {"block_n": block_n, "block_k": 256}
        return Row("qkv", 4096, 1024, 16, config, us, 2.5 / us, tuner)

    rows = [row(5.7, None), row(6.0, 16, tuner=True), row(4.0, 32), row(5.5, 64, tuner=True)]
    lines = summary(rows)
    assert lines[0] == "qkv 4096x1024 at 16 rows:"
    assert lines[1].startswith("  cuBLAS 5.70 us (0.44")
    assert lines[2].startswith("  tuner's pick 5.50 us") and "'block_n': 64" in lines[2]
    timed = lines[3:]
    assert [line.split(" us")[0].strip() for line in timed] == ["4.00", "5.50", "6.00"]
    assert timed[1].endswith("(a tuner candidate)") and not timed[0].endswith("candidate)")
