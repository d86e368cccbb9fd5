"""Where the audio encoder's time goes on a GPU: real-size random weights, bf16.

Prints, per step of `EncoderRunner.encode`: host-side window cutting and hashing, log-mel, the
Whisper encoder (graph replay per window bucket, on the serving (fused) path and on the
reference path side by side, arms alternating, with the largest difference between their
outputs; eager for comparison), and the whole call for bursts of short clips and one long
meeting; then the kernel table of one 8-window encode.

`--blocking` asks whether `encode` waits for the GPU, which would stall the engine's one-step
lookahead: the host time of one meeting's encode with the GPU idle and with ~BUSY_MS of work
queued ahead of it (a non-blocking encode takes the same host time either way), the syncs
torch's sync-debug mode reports inside it, and the CUDA runtime calls that took longest on
the host (cudaFree, cudaHostAlloc and synchronising copies block).
Usage:
    python -m loadtest.bench_encoder [--profile] [--blocking]
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from livemeet.audio.constants import N_FRAMES, N_MELS, SAMPLE_RATE
from livemeet.audio.features import log_mel, split_windows
from livemeet.engine.encoder_runner import ENCODER_GRAPH_BUCKETS, EncoderRunner, full_window_keys
from livemeet.models.loader import load_model
from loadtest.bench_decode_step import time_ms

SHORT_S = 11.6  # the short workload's clip (loadtest/workloads.py)
BUSY_MS = 300.0  # GPU work queued ahead of the encode in --blocking
LONG_S = 2240.0  # the long workload's meeting


def _ms(fn: Callable[[], object], iters: int = 5) -> float:
    return time_ms(fn, iters, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--blocking", action="store_true", help="does encode wait for the GPU?")
    args = parser.parse_args()
    model, _ = load_model(None, load_format="dummy", device="cuda", dtype="bfloat16")
    model.audio_encoder.fused = False  # (EncoderRunner prepares the encoder before capturing)
    reference = EncoderRunner(model, cache_windows=0, cuda_graphs=True)
    model.audio_encoder.fused = None
    runner = EncoderRunner(model, cache_windows=0, cuda_graphs=True)
    rng = np.random.default_rng(0)
    short = (0.1 * rng.standard_normal(int(SHORT_S * SAMPLE_RATE))).astype(np.float32)
    long = (0.1 * rng.standard_normal(int(LONG_S * SAMPLE_RATE))).astype(np.float32)
    dtype = model.adaptor.linear_1.weight.dtype
    feats = torch.zeros(8, N_MELS, N_FRAMES, dtype=dtype, device="cuda")
    windows = torch.zeros(8, 480_000, device="cuda")
    print(f"split_windows (long, host): {_ms(lambda: split_windows(long)):.1f} ms")
    print(f"hash 74 full windows (host): {_ms(lambda: full_window_keys(long)):.1f} ms")
    print(f"log_mel 8 windows: {_ms(lambda: log_mel(windows)):.2f} ms")
    with torch.inference_mode():
        compare_paths(reference, runner)
        eager = _ms(lambda: model.audio_encoder(feats))
        print(f"encoder eager, 8 windows: {eager:.2f} ms")
    for n in (1, 8, 16, 64):
        ms = _ms(lambda n=n: runner.encode([short] * n), 3)
        print(f"encode {n} x {SHORT_S} s clips: {ms:.1f} ms ({ms / n:.2f} ms per window)")
    ms = _ms(lambda: runner.encode([long]), 2)
    print(f"encode one {LONG_S:.0f} s meeting (75 windows): {ms:.1f} ms")
    if args.profile:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            runner.encode([short] * 8)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
    if args.blocking:
        blocking_report(runner, long)


def compare_paths(reference: EncoderRunner, fused: EncoderRunner) -> None:
    """Graph replay ms per bucket on both paths (best of two rounds, arms alternating) and the
    largest |difference| between their outputs on the same random features."""
    torch.manual_seed(0)
    for bucket in ENCODER_GRAPH_BUCKETS:
        (ref_graph, ref_in, ref_out), (graph, static_in, out) = (
            reference._graphs[bucket],
            fused._graphs[bucket],
        )
        feats = torch.randn(ref_in.shape, device="cuda").to(ref_in.dtype)
        ref_in.copy_(feats)
        static_in.copy_(feats)
        times: dict[str, list[float]] = {"reference": [], "fused": []}
        for _ in range(2):
            times["reference"].append(_ms(ref_graph.replay, 10))
            times["fused"].append(_ms(graph.replay, 10))
        ref_ms, ms = min(times["reference"]), min(times["fused"])
        diff = float((out.float() - ref_out.float()).abs().max())
        scale = float(ref_out.float().abs().max())
        print(f"encoder graph, {bucket} windows: fused {ms:.2f} ms, reference {ref_ms:.2f} ms "
              f"({ms / ref_ms:.3f}x); max |diff| {diff:.3g} of max |out| {scale:.3g}")  # fmt: skip


def blocking_report(runner: EncoderRunner, audio: np.ndarray) -> None:
    """See the module docstring (`--blocking`)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    one = _ms(lambda: a @ a, 5)
    reps = max(1, int(BUSY_MS / one))

    def busy() -> None:
        for _ in range(reps):
            a @ a

    def host_ms(queue_work: bool) -> float:
        torch.cuda.synchronize()
        if queue_work:
            busy()
        start = time.perf_counter()
        runner.encode([audio])
        host = (time.perf_counter() - start) * 1e3
        torch.cuda.synchronize()
        return host

    host_ms(False)  # warm
    idle = [host_ms(False) for _ in range(3)]
    queued = [host_ms(True) for _ in range(3)]
    print(f"encode one meeting, host ms: GPU idle {min(idle):.1f}, with {reps * one:.0f} ms of "
          f"GPU work queued ahead {min(queued):.1f} (equal: encode does not wait)")  # fmt: skip
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            busy()
            runner.encode([audio])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    for message in sorted({str(w.message)[:200] for w in caught}):
        print(f"  sync-debug: {message}")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        busy()
        runner.encode([audio])
    torch.cuda.synchronize()
    calls = [e for e in prof.key_averages() if e.key.startswith("cuda")]
    for e in sorted(calls, key=lambda e: e.cpu_time_total, reverse=True)[:12]:
        print(f"  {e.key}: {e.count} calls, {e.cpu_time_total / 1e3:.1f} ms on the host")


if __name__ == "__main__":
    main()
