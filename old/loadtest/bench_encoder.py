"""Where the audio encoder's time goes on a GPU: real-size random weights, bf16.

Prints, per step of `EncoderRunner.encode`: host-side window cutting and hashing, log-mel, the
Whisper encoder (graph replay per window bucket; eager for comparison), and the whole call for
bursts of short clips and one long meeting; then the kernel table of one 8-window encode.
Usage:
    python -m loadtest.bench_encoder [--profile]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch

from livemeet.audio.constants import N_FRAMES, N_MELS, SAMPLE_RATE
from livemeet.audio.features import log_mel, split_windows
from livemeet.engine.encoder_runner import ENCODER_GRAPH_BUCKETS, EncoderRunner, full_window_keys
from livemeet.models.loader import load_model
from loadtest.bench_decode_step import time_ms

SHORT_S = 11.6  # the short workload's clip (loadtest/workloads.py)
LONG_S = 2240.0  # the long workload's meeting


def _ms(fn: Callable[[], object], iters: int = 5) -> float:
    return time_ms(fn, iters, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    model, _ = load_model(None, load_format="dummy", device="cuda", dtype="bfloat16")
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
        for bucket in ENCODER_GRAPH_BUCKETS:
            graph = runner._graphs[bucket][0]
            print(f"encoder graph, {bucket} windows: {_ms(graph.replay, 10):.2f} ms")
        eager = _ms(lambda: model.audio_encoder(feats))
        print(f"encoder eager, 8 windows: {eager:.2f} ms")
    for n in (1, 8, 16, 64):
        ms = _ms(lambda n=n: runner.encode([short] * n), 3)
        print(f"encode {n} x {SHORT_S} s clips: {ms:.1f} ms ({ms / n:.2f} ms per window)")
    ms = _ms(lambda: runner.encode([long]), 2)
    print(f"encode one {LONG_S:.0f} s meeting (75 windows): {ms:.1f} ms")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            runner.encode([short] * 8)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)


if __name__ == "__main__":
    main()
