"""Decode-step time on a GPU: eager vs CUDA graphs, real-size random weights.

For each (batch, context): a ScheduledBatch of `batch` decode rows whose contexts are
`context` tokens on distinct KV blocks (zeros), launched back to back (`launch`: the async
engine's rate, host and GPU overlapped) and one at a time with the ids read back (`run`: the
synchronous engine). Prints ms per step. Usage:
    python loadtest/bench_decode_step.py --batches 1 16 --contexts 1024 32768

Measured on one H200 (bf16, 30 iterations, ms per step, launch / run):
    batch 1, 1k: eager 33.3 / 32.7, graphs 4.0 / 4.4;  batch 1, 32k: eager 33.9 / 34.2,
    graphs 5.0 / 5.6;  batch 16, 1k: eager 33.8 / 33.5, graphs 4.7 / 5.4;  batch 16, 32k: eager
    41.2 / 38.4, graphs 17.8 / 22.2 (floor ~15.0). Capture: 25 graphs in 6.7 s. The ~4 ms left at
    batch 1 is host work per step (input building, uploads, sampling), not GPU time.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import torch

from livemeet.audio.constants import KV_BLOCK_SIZE
from livemeet.engine.cuda_graph import choose_bucket
from livemeet.engine.model_runner import ModelRunner
from livemeet.engine.request import Request, Status
from livemeet.engine.sampler import SamplingParams
from livemeet.engine.scheduler import ScheduledBatch
from livemeet.layers.linear import describe
from livemeet.layers.paged_attention import choose_num_splits
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import MossTDConfig
from livemeet.models.loader import load_model

BLOCK_SIZE = KV_BLOCK_SIZE  # the engine's default KV block


def _batch(batch: int, context: int) -> ScheduledBatch:
    per = -(-(context + 1) // BLOCK_SIZE)
    requests = []
    for b in range(batch):
        req = Request(f"b{b}", [1] * context, max_new_tokens=8)
        req.output_token_ids.append(2)  # decode row at position `context`
        req.status = Status.RUNNING
        req.num_computed_tokens = context
        req.block_table = list(range(b * per, (b + 1) * per))
        requests.append(req)
    return ScheduledBatch(now_s=0.0, decodes=tuple(requests))


def make_runner(
    model: MossTDModel, cfg: MossTDConfig, max_batch: int, max_context: int, fp8: bool
) -> ModelRunner:
    """A runner with CUDA graphs and a KV pool for `max_batch` rows of `max_context` tokens
    each on distinct blocks (bf16 KV, or e4m3 when `fp8`)."""
    max_ctx = max_context + BLOCK_SIZE
    return ModelRunner(
        model,
        cfg,
        block_size=BLOCK_SIZE,
        num_kv_blocks=max_batch * (-(-max_ctx // BLOCK_SIZE)),
        cuda_graphs=True,
        max_model_len=max_ctx,
        max_num_seqs=max_batch,
        kv_dtype=torch.float8_e4m3fn if fp8 else None,
    )


def step_graph(runner: ModelRunner, sb: ScheduledBatch) -> torch.cuda.CUDAGraph:
    """The captured decode graph a launch of `sb` replays (its bucket and split count)."""
    graphs = runner.graphs
    assert graphs is not None
    bucket = choose_bucket(len(sb.decodes), graphs.buckets)
    assert bucket is not None
    longest = max(r.num_tokens for r in sb.decodes)
    splits = choose_num_splits(
        bucket, longest, graphs.num_kv_heads, graphs.num_sms, programs_per_sm=graphs.programs_per_sm
    )
    return graphs.graphs[(bucket, splits)]


def device_ms(fn: Callable[[], object], iters: int) -> float:
    """Mean device ms of `fn` over `iters` back-to-back calls, by CUDA events around them."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def time_ms(fn: Callable[[], object], iters: int, warmup: int = 3) -> float:
    """Mean wall-clock ms of `fn` over `iters` calls after `warmup` calls, with the GPU
    synchronised before and after (so queued device work is included)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 32768])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument(
        "--profile", action="store_true", help="also print the kernels of one graph replay"
    )
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8_e4m3"))
    args = parser.parse_args()
    model, cfg = load_model(None, load_format="dummy", device="cuda", dtype="bfloat16")
    start = time.perf_counter()
    runner = make_runner(
        model, cfg, max(args.batches), max(args.contexts), args.kv_cache_dtype == "fp8_e4m3"
    )
    graphs = runner.graphs
    assert graphs is not None
    print(f"capture: {len(graphs.graphs)} graphs in {time.perf_counter() - start:.1f} s")
    for line in describe(model.language_model.linear_plan.results):
        print(line, flush=True)
    greedy = SamplingParams()

    def sampling(_: Request) -> SamplingParams:
        return greedy

    for batch in args.batches:
        for context in args.contexts:
            sb = _batch(batch, context)
            row = []
            for mode in ("eager", "graphs"):
                runner.graphs = graphs if mode == "graphs" else None
                launch = time_ms(functools.partial(runner.launch, sb, {}, sampling), args.iters)
                run = time_ms(functools.partial(runner.run, sb, {}, sampling), args.iters)
                row.append(f"{mode}: launch {launch:.3f} ms, run {run:.3f} ms")
            print(f"batch {batch:3d} context {context:6d}: " + " | ".join(row), flush=True)
            runner.graphs = graphs
            _split_host_and_device(runner, sb, sampling, args.iters, args.profile)
    runner.graphs = graphs
    print(f"replays {graphs.num_replays}, eager fallbacks {graphs.num_eager_fallbacks}")


def _split_host_and_device(
    runner: ModelRunner,
    sb: ScheduledBatch,
    sampling: Callable[[Request], SamplingParams],
    iters: int,
    profile: bool,
) -> None:
    """Where a graph step's time goes: host time of one `launch` (inputs, uploads, replay,
    logits, sampling: CPU only, the GPU left running), device time of the bare graph replay
    (CUDA events, static inputs as the last launch left them), and device time of one whole
    `launch` (graph + head + sampling)."""
    graphs = runner.graphs
    assert graphs is not None
    launch = functools.partial(runner.launch, sb, {}, sampling)
    launch()
    torch.cuda.synchronize()
    host = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        launch()
        host.append(time.perf_counter() - t0)
    replay_ms = device_ms(step_graph(runner, sb).replay, iters)  # the graph launch() replayed
    whole_ms = device_ms(launch, iters)
    host_ms = 1e3 * sorted(host)[len(host) // 2]
    print(
        f"    host per launch {host_ms:.3f} ms (median) | graph replay {replay_ms:.3f} ms | "
        f"whole launch on device {whole_ms:.3f} ms",
        flush=True,
    )
    if not profile:
        return
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            launch()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30), flush=True)


if __name__ == "__main__":
    main()
