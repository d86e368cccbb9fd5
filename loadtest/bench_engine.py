"""Offline engine throughput (DESIGN.md section 10), in the manner of nano-vllm's bench.py.

Real-size dummy weights (bf16 on CUDA), synthetic meetings with forced transcripts
(loadtest/workloads.py), so every kernel runs and the output stream carries real segments.

1. Copy bandwidth: a large device-to-device copy, (bytes read + written) / time, plus a
   read-only estimate (a reduction), measured in this run (loadtest/bench_attention.py).
2. Decode ms/step at each batch x context (default 1 and 16 x 1k and 36k): requests whose
   prompts have that length are prefilled, then pure decode steps are timed with CUDA events,
   against the floor = (decoder + head weight bytes + batch x context x KV bytes per token) /
   copy bandwidth (and / read-only bandwidth).
3. Workloads: for each concurrency c, c requests are submitted at once and run to completion;
   reported: req/s, audio-s/s, RTF mean, latency mean/p95, the time in encode, prefill (steps
   holding a prefill chunk) and decode-only steps, and CUDA-graph replays vs eager fallbacks.
4. Optionally the same points again with an FP8 (e4m3) KV cache (`--fp8 long:1,short:16`).

Writes JSON (`--json`) and prints markdown tables. `--config tiny` runs a small random model on
the CPU in seconds (the smoke test). Usage:
  python -m loadtest.bench_engine --workloads short,long --short-concurrency 1,16,64 \
      --long-concurrency 1,4 --fp8 long:1 --json engine.json --max-seconds 200
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from livemeet.audio.constants import KV_BLOCK_SIZE, KV_BLOCK_SIZES, SAMPLES_PER_TOKEN
from livemeet.engine.engine import Engine, EngineConfig
from livemeet.engine.model_runner import kv_bytes_per_token
from livemeet.engine.scheduler import ScheduledBatch
from livemeet.layers.linear import describe
from livemeet.models.loader import load_model
from loadtest import workloads as wl

CPU_COPY_BYTES = 64 << 20  # bytes per CPU bandwidth sample (the tiny smoke run)
ASSUMED_AUDIO_S_PER_S = 100.0  # audio-s/s used to estimate a run before any was measured
TINY_CONFIG = {  # a small MOSS-TD in the upstream config.json dialect (MODEL.md 8.2)
    "model_type": "moss_transcribe_diarize",
    "audio_token_id": 151_671,
    "audio_merge_size": 4,
    "adaptor_input_dim": 256,
    "audio_config": {
        "model_type": "whisper",
        "num_mel_bins": 80,
        "d_model": 64,
        "encoder_layers": 2,
        "encoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "max_source_positions": 1500,
        "activation_function": "gelu",
    },
    "text_config": {
        "model_type": "qwen3",
        "vocab_size": 151_936,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "attention_bias": False,
    },
}


@dataclass(frozen=True)
class Bandwidth:
    """Measured memory bandwidth, 1e12 bytes per s: `copy` = (read + written) / time of a
    device-to-device copy (the DESIGN floor); `read` = bytes read / time of a reduction."""

    copy_tb_per_s: float
    read_tb_per_s: float


@dataclass(frozen=True)
class DecodeResult:
    """Pure decode steps at `batch` rows of `context` tokens (context at the first timed step)."""

    kv_cache_dtype: str
    batch: int
    context: int
    steps: int
    ms_per_step: float  # mean over the timed steps (CUDA events on GPU)
    ms_per_step_median: float
    floor_ms: float  # bytes / copy bandwidth
    floor_read_ms: float  # bytes / read-only bandwidth
    x_floor: float  # floor_read_ms / ms_per_step (1.0 = at the read-only floor)
    weight_bytes: int
    kv_bytes: int


@dataclass(frozen=True)
class RunResult:
    """One workload point: `num_requests` requests submitted at once, run to completion."""

    workload: str
    concurrency: int
    num_requests: int
    kv_cache_dtype: str
    audio_s: float  # per request
    prompt_tokens: int  # per request
    output_tokens: int  # per request, EOS included (mean)
    makespan_s: float
    req_per_s: float
    audio_s_per_s: float
    rtf_mean: float  # latency / audio duration
    latency_mean_s: float
    latency_p95_s: float
    encode_s: float  # host s in add_request and in the steps' encoder calls (EncodeTimer)
    prefill_s: float  # steps that held a prefill chunk (mixed steps included), less encode_s
    decode_s: float  # decode-only steps
    num_steps: int
    num_decode_steps: int
    decode_ms_per_step: float
    graph_replays: int | None  # None: the engine has no CUDA-graph runner
    graph_eager_fallbacks: int | None
    prefill_graph_replays: int | None = None  # steps run on piecewise prefill graphs
    encoder_device_s: float | None = None  # device s of the encoder calls (CUDA events)


@dataclass(frozen=True)
class Skipped:
    workload: str
    concurrency: int
    kv_cache_dtype: str
    reason: str


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_points(text: str) -> list[tuple[str, int]]:
    """ "long:1,short:16" -> [("long", 1), ("short", 16)]."""
    points = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, c = item.partition(":")
        if name not in wl.WORKLOADS or not c.isdigit():
            raise argparse.ArgumentTypeError(f"bad point {item!r}: use workload:concurrency")
        points.append((name, int(c)))
    return points


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank-free linear-interpolated percentile (numpy's default), q in [0, 100]."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


# ---------------------------------------------------------------- device timing


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device) -> Bandwidth:
    """Copy and read-only bandwidth on `device` (bench_attention's on CUDA; a timed copy and
    sum of 64 MiB on the CPU)."""
    if device.type == "cuda":
        from loadtest.bench_attention import copy_bandwidth_tb_per_s, read_bandwidth_tb_per_s

        return Bandwidth(copy_bandwidth_tb_per_s(), read_bandwidth_tb_per_s())
    src = torch.ones(CPU_COPY_BYTES // 4)
    dst = torch.empty_like(src)
    copy = min(_timed(lambda: dst.copy_(src)) for _ in range(3))
    read = min(_timed(lambda: src.sum()) for _ in range(3))
    return Bandwidth(2 * CPU_COPY_BYTES / copy / 1e12, CPU_COPY_BYTES / read / 1e12)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class StepTimer:
    """Times single engine steps: CUDA events on GPU (ms between two records on the stream),
    perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    @contextmanager
    def time(self, out: list[float]) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            yield
            out.append((time.perf_counter() - t0) * 1e3)


# ---------------------------------------------------------------- engine set-up and probes


def build_engine(
    config_name: str,
    *,
    device: str,
    dtype: str,
    kv_cache_dtype: str,
    eager: bool,
    model: Any = None,
    num_kv_blocks: int | None = None,
    prefill_graphs: bool = True,
    block_size: int = KV_BLOCK_SIZE,
) -> Engine:
    """An Engine on dummy weights: real size, or the small `TINY_CONFIG` (smoke tests).
    `model`: a (MossTDModel, MossTDConfig) to reuse (e.g. for the FP8-KV pass); `block_size`:
    tokens per KV block."""
    kwargs: dict[str, Any] = {
        "load_format": "dummy",
        "device": device,
        "dtype": dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "num_kv_blocks": num_kv_blocks,
        "prefill_graphs": prefill_graphs,
        "block_size": block_size,
    }
    if "cuda_graphs" in {f.name for f in dataclasses.fields(EngineConfig)}:
        kwargs["cuda_graphs"] = not eager
    config = EngineConfig(**kwargs)
    if model is None and config_name == "tiny":
        # The tiny model is launch-bound: one thread avoids oversubscribing shared CI cores.
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(TINY_CONFIG))
            model = load_model(tmp, load_format="dummy", device=device, dtype=dtype)
    return Engine(config, model=model)


def graph_counters(engine: Engine) -> tuple[int | None, int | None]:
    """(num_replays, num_eager_fallbacks) of the engine's decode CUDA graphs; (None, None)
    when it has none (CPU, --eager)."""
    graphs = engine.runner.graphs
    if graphs is None:
        return None, None
    return graphs.num_replays, graphs.num_eager_fallbacks


def weight_bytes_per_step(engine: Engine) -> int:
    """Bytes of decoder weights read per decode step: every decoder parameter once, the tied
    embedding counted once (as the LM head; the embedding lookup itself reads a few rows)."""
    lm = engine.model.language_model
    return sum(p.numel() * p.element_size() for p in lm.parameters())


class BatchLog:
    """Records every ScheduledBatch the engine's scheduler hands out (wraps `schedule`)."""

    def __init__(self, engine: Engine) -> None:
        self.batches: list[ScheduledBatch] = []
        inner = engine.scheduler.schedule

        def schedule(now_s: float) -> ScheduledBatch:
            batch = inner(now_s)
            self.batches.append(batch)
            return batch

        engine.scheduler.schedule = schedule  # type: ignore[method-assign]

    @property
    def last(self) -> ScheduledBatch:
        return self.batches[-1]


def audio_tokens_for_prompt(engine: Engine, context: int) -> int:
    """The audio tokens T whose default prompt is closest to `context` ids (binary search)."""
    lo, hi = 1, max(2, context)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(engine.build_prompt(mid).ids) < context:
            lo = mid + 1
        else:
            hi = mid
    return lo


def noise(num_samples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(num_samples, dtype=np.float32) * np.float32(0.05)


# ---------------------------------------------------------------- decode ms/step


def bench_decode(
    engine: Engine,
    log: BatchLog,
    bandwidth: Bandwidth,
    kv_name: str,
    context: int,
    batches: list[int],
    steps: int,
    warmup: int,
) -> list[DecodeResult]:
    """Prefill max(batches) requests of `context` prompt tokens, then for each batch size
    (largest first, aborting the extra requests) time `steps` decode-only steps."""
    timer = StepTimer(engine.runner.device)
    weights = weight_bytes_per_step(engine)
    per_token = kv_bytes_per_token(engine.model_config, engine.runner.kv_dtype)
    decode_steps = (warmup + steps + 1) * len(batches) + 4
    ids = add_noise_requests(engine, f"decode-{context}", max(batches), context, decode_steps)
    results = []
    try:
        for batch in sorted(batches, reverse=True):
            for rid in ids[batch:]:
                engine.abort(rid)
            step_until_decoding(engine, log, batch)
            for _ in range(warmup):
                engine.step()
            ms: list[float] = []
            for _ in range(steps):
                with timer.time(ms):
                    engine.step()
                assert not log.last.prefills and len(log.last.decodes) == batch
            seq = log.last.decodes[0].num_tokens - steps
            kv = batch * seq * per_token
            floor = (weights + kv) / (bandwidth.copy_tb_per_s * 1e12) * 1e3
            floor_read = (weights + kv) / (bandwidth.read_tb_per_s * 1e12) * 1e3
            mean = statistics.fmean(ms)
            row = (kv_name, batch, seq, steps, mean, statistics.median(ms), floor, floor_read)
            results.append(DecodeResult(*row, floor_read / mean, weights, kv))
    finally:
        for rid in ids:
            engine.abort(rid)
    return results


def add_noise_requests(
    engine: Engine, prefix: str, count: int, context: int, decode_steps: int
) -> list[str]:
    """Add `count` requests (ids `prefix`-i) whose prompts are ~`context` ids of noise audio,
    each rotated, that ignore EOS; returns their ids. Their token budget is `decode_steps`
    plus the steps the prefill of all of them can take: requests that finish prefill early
    decode while the others still prefill (a 36k prompt is ~10 steps of <= 4k tokens each,
    times the count), and must not finish before all `count` decode together."""
    num_tokens = audio_tokens_for_prompt(engine, context)
    samples = noise(num_tokens * SAMPLES_PER_TOKEN, seed=context)
    budget = decode_steps + count * (context // 1024 + 1)
    ids = [f"{prefix}-{i}" for i in range(count)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, wl.vary(samples, i), max_new_tokens=budget, ignore_eos=True)
    return ids


def step_until_decoding(engine: Engine, log: BatchLog, batch: int) -> None:
    """Step until a step decodes exactly `batch` requests and prefills nothing. Raises
    RuntimeError when the engine runs out of work first (requests finished early)."""
    while True:
        if not engine.has_work():
            raise RuntimeError(f"the requests finished before {batch} decoded together")
        engine.step()
        if log.batches and not log.last.prefills and len(log.last.decodes) == batch:
            return


# ---------------------------------------------------------------- workload runs


class WorkloadCache:
    """One base meeting and forced transcript per workload, made once."""

    def __init__(self, engine: Engine, audio_s: dict[str, float | None]) -> None:
        self.engine = engine
        self.audio_s = audio_s
        self._made: dict[str, tuple[wl.Workload, np.ndarray, wl.ForcedTranscript]] = {}

    def get(self, name: str) -> tuple[wl.Workload, np.ndarray, wl.ForcedTranscript]:
        if name not in self._made:
            workload = wl.get_workload(name, self.audio_s.get(name))
            samples, forced = wl.make_forced(self.engine.tokenizer, workload, seed=1)
            self._made[name] = (workload, samples, forced)
        return self._made[name]


class EncodeTimer:
    """Stands in for an encoder's `encode` and times each call without changing the run: host
    seconds inside the call, and on CUDA the device time between events recorded on the stream
    around it (`device_s`, read once the device is idle). The engine's one-step lookahead still
    overlaps the encoder with the step queued before it. `sync=True` synchronises around each
    call instead (the form before session 11: the encoder's own time, bought by serialising it
    with the neighbouring steps). Limits: the events bracket the whole call, so device time
    includes GPU idle gaps inside it (host work before the first launch), and host time
    includes any wait inside `encode` for the step queued before it."""

    def __init__(self, encode: Callable[..., Any], device: torch.device, sync: bool = False):
        self.encode = encode
        self.device = device
        self.sync = sync
        self.host_s: list[float] = []
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.sync:
            synchronize(self.device)
        events = None
        if self.device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        start = time.perf_counter()
        out = self.encode(*args, **kwargs)
        if events is not None:
            events[1].record()
            self._events.append(events)
        if self.sync:
            synchronize(self.device)
        self.host_s.append(time.perf_counter() - start)
        return out

    def device_s(self) -> float | None:
        """Device seconds of every call so far (None off CUDA); synchronises first."""
        if self.device.type != "cuda":
            return None
        synchronize(self.device)
        return sum(a.elapsed_time(b) for a, b in self._events) / 1e3


def _step_to_idle(
    engine: Engine, t0: float
) -> tuple[list[float], list[float], list[int], list[int]]:
    """Step until the engine is idle: (wall s per step, latency from t0 and output and prompt
    tokens per finished request)."""
    latencies: list[float] = []
    outputs: list[int] = []
    prompts: list[int] = []
    step_s: list[float] = []
    while engine.has_work():
        ts = time.perf_counter()
        out = engine.step()
        now = time.perf_counter()
        step_s.append(now - ts)
        for request in out.finished:
            latencies.append(now - t0)
            outputs.append(request.num_output_tokens)
            prompts.append(request.num_prompt_tokens)
    return step_s, latencies, outputs, prompts


def run_point(
    engine: Engine,
    log: BatchLog,
    cache: WorkloadCache,
    name: str,
    concurrency: int,
    kv: str,
    sync_encoder: bool = False,
) -> RunResult:
    """Submit `concurrency` requests of workload `name` at once; step until all finish.
    `sync_encoder`: time the encoder calls by synchronising around them (EncodeTimer)."""
    workload, samples, forced = cache.get(name)
    device = engine.runner.device
    replays0, eager0 = graph_counters(engine)
    piecewise = engine.runner.piecewise
    pieces0 = None if piecewise is None else piecewise.num_replays
    first_batch = len(log.batches)
    synchronize(device)
    t0 = time.perf_counter()
    for i in range(concurrency):
        engine.add_request(
            f"{name}-{concurrency}-{i}",
            wl.vary(samples, i),
            forced_output_ids=forced.token_ids,
            max_new_tokens=workload.num_output_tokens + 16,
        )
    add_s = time.perf_counter() - t0
    timer = EncodeTimer(engine.encoder.encode, device, sync=sync_encoder)
    engine.encoder.encode = timer  # type: ignore[method-assign]
    try:
        step_s, latencies, outputs, prompts = _step_to_idle(engine, t0)
    finally:
        engine.encoder.encode = timer.encode  # type: ignore[method-assign]
    synchronize(device)
    makespan = time.perf_counter() - t0
    encode_s = add_s + sum(timer.host_s)
    batches = log.batches[first_batch:]
    assert len(batches) == len(step_s), "one scheduled batch per engine step"
    is_prefill = [bool(b.prefills) for b in batches]
    decode_steps = [s for s, p in zip(step_s, is_prefill, strict=True) if not p]
    replays1, eager1 = graph_counters(engine)
    return RunResult(
        workload=name,
        concurrency=concurrency,
        num_requests=concurrency,
        kv_cache_dtype=kv,
        audio_s=workload.audio_s,
        prompt_tokens=max(prompts),
        output_tokens=round(statistics.fmean(outputs)),
        makespan_s=makespan,
        req_per_s=concurrency / makespan,
        audio_s_per_s=concurrency * workload.audio_s / makespan,
        rtf_mean=statistics.fmean(latencies) / workload.audio_s,
        latency_mean_s=statistics.fmean(latencies),
        latency_p95_s=percentile(latencies, 95),
        encode_s=encode_s,
        prefill_s=sum(s for s, p in zip(step_s, is_prefill, strict=True) if p) - sum(timer.host_s),
        decode_s=sum(decode_steps),
        num_steps=len(step_s),
        num_decode_steps=len(decode_steps),
        decode_ms_per_step=1e3 * statistics.fmean(decode_steps) if decode_steps else 0.0,
        graph_replays=None if replays0 is None else replays1 - replays0,  # type: ignore[operator]
        graph_eager_fallbacks=None if eager0 is None else eager1 - eager0,  # type: ignore[operator]
        prefill_graph_replays=(
            None if piecewise is None or pieces0 is None else piecewise.num_replays - pieces0
        ),
        encoder_device_s=timer.device_s(),
    )


class Budget:
    """Skips runs that would not finish inside `max_seconds` of the script's start.

    A run of `key` (a workload, or a workload and KV dtype: an FP8 point is never estimated
    from a bf16 rate) at concurrency c is estimated from the best audio-s/s measured at c, else
    from `assumed_rate` (ASSUMED_AUDIO_S_PER_S by default) raised to the best rate measured at
    a lower concurrency: throughput grows with concurrency, so a lower one's rate is a floor,
    and a higher one's would under-estimate the run.
    """

    def __init__(
        self,
        max_seconds: float | None,
        clock: Callable[[], float] = time.monotonic,
        assumed_rate: float = ASSUMED_AUDIO_S_PER_S,
    ) -> None:
        self.deadline = None if max_seconds is None else clock() + max_seconds
        self.clock = clock
        self.assumed_rate = assumed_rate
        self.rates: dict[tuple[str, int], float] = {}  # (key, concurrency) -> best audio-s/s

    def fits(self, key: str, audio_s: float, concurrency: int = 1) -> bool:
        if self.deadline is None:
            return True
        return self.clock() + self.estimate_s(key, audio_s, concurrency) <= self.deadline

    def rate(self, key: str, concurrency: int = 1) -> tuple[float, str]:
        """(audio-s/s, where it comes from) for a run of `key` at `concurrency`."""
        measured = self.rates.get((key, concurrency))
        if measured is not None:
            return measured, "measured"
        floors = [r for (k, c), r in self.rates.items() if k == key and c < concurrency]
        if floors and max(floors) > self.assumed_rate:
            return max(floors), "lower-concurrency"
        return self.assumed_rate, "assumed"

    def estimate_s(self, key: str, audio_s: float, concurrency: int = 1) -> float:
        """Seconds `audio_s` of audio should take at the rate `fits` uses."""
        return audio_s / self.rate(key, concurrency)[0]

    def observe(self, key: str, audio_s_per_s: float, concurrency: int = 1) -> None:
        best = max(self.rates.get((key, concurrency), 0.0), audio_s_per_s)
        self.rates[(key, concurrency)] = best

    def why_skipped(self, key: str, audio_s: float, concurrency: int = 1) -> str:
        """The reason a run `fits` refused: its estimate, the rate's origin, the time left
        (so a benchmark script's budget can be set from the log)."""
        rate, origin = self.rate(key, concurrency)
        left = float("inf") if self.deadline is None else self.deadline - self.clock()
        return (
            f"over --max-seconds: ~{audio_s / rate:.0f} s at the {origin} "
            f"{rate:.0f} audio-s/s, {left:.0f} s left"
        )


# ---------------------------------------------------------------- report


def markdown(report: dict[str, Any]) -> str:
    bw = report["bandwidth"]
    lines = [
        f"device: {report['device']}; copy {bw['copy_tb_per_s']:.2f} TB/s (read + write), "
        f"read-only {bw['read_tb_per_s']:.2f} TB/s; decoder+head weights "
        f"{report['weight_bytes'] / 1e9:.3f} GB; KV {report['kv_bytes_per_token']} bytes/token",
    ]
    if report["decode"]:
        lines += [
            "",
            "| KV | batch | context | ms/step | median | floor ms (copy) | floor ms (read) "
            "| x floor |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for d in report["decode"]:
            lines.append(
                f"| {d['kv_cache_dtype']} | {d['batch']} | {d['context']} | "
                f"{d['ms_per_step']:.2f} | {d['ms_per_step_median']:.2f} | {d['floor_ms']:.2f} | "
                f"{d['floor_read_ms']:.2f} | {d['x_floor']:.2f} |"
            )
    lines += [
        "",
        "| workload | KV | c | req/s | audio-s/s | RTF mean | latency mean s | p95 s | encode s "
        "| prefill s | decode s | decode ms/step | graph replays / eager |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        replays, eager = r["graph_replays"], r["graph_eager_fallbacks"]
        graphs = "-" if replays is None else f"{replays}/{eager}"
        if r.get("prefill_graph_replays") is not None:
            graphs += f" (+{r['prefill_graph_replays']} prefill)"
        lines.append(
            f"| {r['workload']} | {r['kv_cache_dtype']} | {r['concurrency']} | "
            f"{r['req_per_s']:.3f} | {r['audio_s_per_s']:.1f} | {r['rtf_mean']:.4f} | "
            f"{r['latency_mean_s']:.2f} | {r['latency_p95_s']:.2f} | {r['encode_s']:.2f} | "
            f"{r['prefill_s']:.2f} | {r['decode_s']:.2f} | {r['decode_ms_per_step']:.2f} | "
            f"{graphs} |"
        )
    for s in report["skipped"]:
        lines.append(
            f"skipped {s['workload']} c={s['concurrency']} ({s['kv_cache_dtype']}): {s['reason']}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=("real", "tiny"), default="real")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8_e4m3"))
    p.add_argument("--kv-block-size", type=int, default=KV_BLOCK_SIZE, choices=KV_BLOCK_SIZES)
    p.add_argument("--eager", action="store_true", help="disable CUDA graphs when supported")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="fixed KV pool (tests)")
    p.add_argument("--workloads", default="short,long")
    p.add_argument("--short-concurrency", type=parse_ints, default=[1, 16, 64])
    p.add_argument("--long-concurrency", type=parse_ints, default=[1, 4])
    p.add_argument(
        "--prefill-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="piecewise CUDA graphs for steps that prefill (the engine's default)",
    )
    p.add_argument(
        "--assumed-audio-s-per-s",
        type=float,
        default=ASSUMED_AUDIO_S_PER_S,
        help="rate that sizes a workload's first run against --max-seconds",
    )
    p.add_argument("--short-audio-s", type=float, default=None, help="override 11.6 s")
    p.add_argument("--long-audio-s", type=float, default=None, help="override 2,240 s")
    p.add_argument("--decode-batches", type=parse_ints, default=[1, 16])
    p.add_argument("--decode-contexts", type=parse_ints, default=[1024, 36_000])
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--decode-warmup", type=int, default=4)
    p.add_argument("--no-decode", action="store_true", help="skip the decode ms/step probe")
    p.add_argument(
        "--fp8",
        type=parse_points,
        default=[],
        help="points to rerun with an fp8_e4m3 KV cache, e.g. long:1,short:16",
    )
    p.add_argument("--max-seconds", type=float, default=None, help="skip runs past this budget")
    p.add_argument(
        "--sync-encoder",
        action="store_true",
        help="time encoder calls by synchronising around them (serialises them: EncodeTimer)",
    )
    p.add_argument("--json", default="bench_engine.json")
    return p.parse_args(argv)


def run_points(
    engine: Engine,
    log: BatchLog,
    cache: WorkloadCache,
    points: list[tuple[str, int]],
    kv: str,
    budget: Budget,
    report: dict[str, Any],
    sync_encoder: bool = False,
) -> None:
    for name, c in points:
        workload = wl.get_workload(name, cache.audio_s.get(name))
        key = f"{name}/{kv}"
        if not budget.fits(key, c * workload.audio_s, c):
            skip = Skipped(name, c, kv, budget.why_skipped(key, c * workload.audio_s, c))
            report["skipped"].append(asdict(skip))
            print(f"skip {name} c={c} {kv}: {skip.reason}", flush=True)
            continue
        result = run_point(engine, log, cache, name, c, kv, sync_encoder)
        budget.observe(key, result.audio_s_per_s, c)
        report["runs"].append(asdict(result))
        print(
            f"{name} c={c} {kv}: {result.audio_s_per_s:.1f} audio-s/s, "
            f"p95 {result.latency_p95_s:.2f} s",
            flush=True,
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    budget = Budget(args.max_seconds, assumed_rate=args.assumed_audio_s_per_s)
    t0 = time.perf_counter()
    engine = build_engine(
        args.config,
        device=args.device,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        eager=args.eager,
        num_kv_blocks=args.num_kv_blocks,
        prefill_graphs=args.prefill_graphs,
        block_size=args.kv_block_size,
    )
    device = engine.runner.device
    print(f"engine ready in {time.perf_counter() - t0:.1f} s on {device}", flush=True)
    for line in describe(engine.model.language_model.linear_plan.results):
        print(line, flush=True)
    bandwidth = measure_bandwidth(device)
    kv_name = "bf16" if args.kv_cache_dtype == "auto" else args.kv_cache_dtype
    if args.kv_cache_dtype == "auto" and engine.runner.kv_dtype == torch.float32:
        kv_name = "fp32"
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "config": args.config,
        "argv": sys.argv[1:] if argv is None else argv,
        "bandwidth": asdict(bandwidth),
        "weight_bytes": weight_bytes_per_step(engine),
        "kv_bytes_per_token": kv_bytes_per_token(engine.model_config, engine.runner.kv_dtype),
        "decode": [],
        "runs": [],
        "skipped": [],
    }
    log = BatchLog(engine)
    if not args.no_decode:
        for context in args.decode_contexts:
            rows = bench_decode(
                engine,
                log,
                bandwidth,
                kv_name,
                context,
                args.decode_batches,
                args.decode_steps,
                args.decode_warmup,
            )
            report["decode"] += [asdict(r) for r in rows]
            for r in rows:
                print(
                    f"decode b={r.batch} ctx={r.context}: {r.ms_per_step:.2f} ms/step "
                    f"(floor {r.floor_ms:.2f})",
                    flush=True,
                )
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    points = [(n, c) for n in names for c in getattr(args, f"{n}_concurrency")]
    cache = WorkloadCache(engine, {"short": args.short_audio_s, "long": args.long_audio_s})
    run_points(engine, log, cache, points, kv_name, budget, report, args.sync_encoder)
    if args.fp8:
        model = (engine.model, engine.model_config)
        del engine, log
        cache.engine = None  # type: ignore[assignment]
        _free(device)
        engine = build_engine(
            args.config,
            device=args.device,
            dtype=args.dtype,
            kv_cache_dtype="fp8_e4m3",
            eager=args.eager,
            model=model,
            num_kv_blocks=args.num_kv_blocks,
            prefill_graphs=args.prefill_graphs,
            block_size=args.kv_block_size,
        )
        cache.engine = engine
        fp8_log = BatchLog(engine)
        run_points(engine, fp8_log, cache, args.fp8, "fp8_e4m3", budget, report, args.sync_encoder)
    report["elapsed_s"] = time.perf_counter() - t0
    print(markdown(report), flush=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    return report


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
