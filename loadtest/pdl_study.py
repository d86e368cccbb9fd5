"""Which decode-step kernels gain from programmatic dependent launch, and at which batch sizes.

For each PDL mode (`MODES`: which kernel families are launched with PDL), builds a
`ModelRunner` whose CUDA graphs are captured under that mode, and times the bare graph replay
(CUDA events) at each (batch, context) point, contexts on distinct KV blocks as in
`bench_decode_step`. Prints one line per (mode, point); `--json` writes them. Usage:
    python -m loadtest.pdl_study --kv-cache-dtype fp8_e4m3 --points 1x36000 16x36000

Session 8 found that PDL on every kernel made the FP8 step at 16 x 36k 1.76 ms slower than
PDL off (10.94 vs 9.18 ms), while at 1 x 36k it made it 0.2 ms faster (H200).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from livemeet.engine.model_runner import ModelRunner
from livemeet.engine.request import Request
from livemeet.engine.sampler import SamplingParams
from livemeet.layers import paged_attention as pa
from livemeet.layers import pdl
from livemeet.models.loader import load_model
from loadtest.bench_decode_step import _batch, device_ms, make_runner, step_graph

ATTENTION = {"_decode_split_kernel", "_decode_merge_kernel"}  # and the CUDA decode kernel
DOT = {"_skinny_dot_kernel"}
ANY_BATCH = 1 << 30  # rows: a pdl_max_rows no decode batch reaches
# mode -> (Triton kernel names launched with PDL, or None for all; CUDA decode kernel with PDL)
MODES: dict[str, tuple[set[str] | None, bool]] = {
    "all": (None, True),
    "none": (set(), False),
    "attention off": (
        {
            "_skinny_rows_kernel",
            "_skinny_dot_kernel",
            "_qk_norm_rope_kernel",
            "_qk_norm_rope_rows_kernel",
            "_add_rms_norm_kernel",
            "_silu_and_mul_kernel",
        },
        False,
    ),  # fmt: skip
    "attention only": (ATTENTION, True),
    "dot off": (
        {
            "_skinny_rows_kernel",
            "_qk_norm_rope_kernel",
            "_qk_norm_rope_rows_kernel",
            "_add_rms_norm_kernel",
            "_silu_and_mul_kernel",
            *ATTENTION,
        },
        True,
    ),  # fmt: skip
}


@contextmanager
def pdl_mode(kernels: set[str] | None, attention: bool) -> Iterator[None]:
    """PDL on for the named Triton kernels (None: all) and, when `attention`, the CUDA decode
    kernel (which follows `pdl.is_enabled()` at launch), at every batch: the decode configs'
    `pdl_max_rows` (pa.DECODE_PDL_MAX_ROWS) is lifted meanwhile, else attention would launch
    with PDL at batch 1 only whatever the mode."""
    full, enabled, was_on = pdl.launch_options, pdl.is_enabled, pdl.is_enabled()
    configs = pa.DECODE_CONFIG_BF16, pa.DECODE_CONFIG_FP8

    def some(t: torch.Tensor, kernel: object) -> dict[str, bool]:
        name = getattr(getattr(kernel, "fn", kernel), "__name__", "")
        return full(t, kernel) if kernels is None or name in kernels else {"PDL": False}

    pdl.set_enabled(True)
    pdl.launch_options = some  # type: ignore[assignment]
    pdl.is_enabled = lambda: attention  # type: ignore[assignment]
    pa.DECODE_CONFIG_BF16, pa.DECODE_CONFIG_FP8 = (
        dataclasses.replace(c, pdl_max_rows=ANY_BATCH) for c in configs
    )
    try:
        yield
    finally:
        pdl.launch_options = full  # type: ignore[assignment]
        pdl.is_enabled = enabled  # type: ignore[assignment]
        pdl.set_enabled(was_on)
        pa.DECODE_CONFIG_BF16, pa.DECODE_CONFIG_FP8 = configs


def replay_ms(runner: ModelRunner, batch: int, context: int, iters: int) -> float:
    """Device ms of one bare replay of the graph a decode step of `batch` rows at `context`
    tokens uses (its static inputs set by one launch)."""
    sb = _batch(batch, context)
    greedy = SamplingParams()
    sampling: Callable[[Request], SamplingParams] = lambda _: greedy  # noqa: E731
    runner.launch(sb, {}, sampling)
    graph = step_graph(runner, sb)
    for _ in range(3):
        graph.replay()
    return device_ms(graph.replay, iters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", nargs="+", default=["1x36000", "16x36000"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8_e4m3"))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", help="append the rows here (JSON lines)")
    args = parser.parse_args()
    points = [tuple(int(v) for v in p.split("x")) for p in args.points]
    model, cfg = load_model(None, load_format="dummy", device="cuda", dtype="bfloat16")
    max_ctx = max(c for _, c in points)
    max_batch = max(b for b, _ in points)
    for mode in args.modes:
        with pdl_mode(*MODES[mode]):
            runner = make_runner(model, cfg, max_batch, max_ctx, args.kv_cache_dtype == "fp8_e4m3")
        for batch, context in points:
            ms = replay_ms(runner, batch, context, args.iters)
            row = {"kv": args.kv_cache_dtype, "mode": mode, "batch": batch, "context": context,
                   "replay_ms": ms}  # fmt: skip
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
        del runner
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
