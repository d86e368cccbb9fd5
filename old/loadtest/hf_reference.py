"""The transformers reference, measured and then PROJECTED to the full workloads.

`MossTranscribeDiarizeForConditionalGeneration` (transformers >= 5.24) in bf16 on the same
dummy weights as livemeet's engine (our canonical names renamed to the HF-native checkpoint
names, MODEL.md 8.1). A full run of the long workload (12.3k decode steps over a 30k-42k
context) takes many minutes with the HF cache, so this script measures and projects:
- decode ms/step at batch x context (a few steps after a prefill, the HF DynamicCache grown
  in place as `generate` does), and a straight line ms(context) per batch through them;
- prefill time of each workload's prompt (logits for the last position only);
- encoder time per 30 s window (the audio tower on a batch of windows).
Projected run time = encoder windows x ms/window + prefill + sum over the N output steps of
ms(prompt + i); reported as audio-s/s. Every figure it prints is labelled "projected".

Usage: python -m loadtest.hf_reference --json hf.json [--config tiny] [--contexts 1024,36000]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from livemeet.audio.constants import N_FRAMES, N_MELS, SAMPLE_RATE, num_audio_tokens
from livemeet.models.config import MossTDConfig
from livemeet.models.dialects import checkpoint_key, hf_config
from livemeet.models.loader import load_model, resolve_device
from livemeet.models.prompt import build_prompt
from livemeet.models.tokenizer import load_tokenizer
from loadtest import workloads as wl
from loadtest.bench_engine import TINY_CONFIG, StepTimer, parse_ints

ENCODER_BATCH = 8  # windows per timed audio-tower call
SHORT_BATCH = 16  # the DESIGN table's transformers short figure is at batch 16


@dataclass(frozen=True)
class HFDecode:
    batch: int
    context: int
    steps: int
    ms_per_step: float


@dataclass(frozen=True)
class Projection:
    """A projected (not measured) full run of `batch` requests of one workload."""

    workload: str
    batch: int
    audio_s: float
    prompt_tokens: int
    output_tokens: int
    encoder_s: float
    prefill_s: float
    decode_s: float
    total_s: float
    audio_s_per_s: float  # batch x audio_s / total_s
    projected: bool = True


def hf_name(name: str) -> str:
    """Our canonical parameter name -> the HF-native checkpoint key (MODEL.md 8.1)."""
    return checkpoint_key(name, "hf")


def load_reference(config_name: str, device: str, dtype: str) -> tuple[Any, MossTDConfig]:
    """The HF model holding livemeet's dummy weights (same seed, renamed). Raises RuntimeError
    when a tensor other than the tied lm_head is missing or unexpected."""
    from transformers import MossTranscribeDiarizeForConditionalGeneration

    if config_name == "tiny":
        torch.set_num_threads(1)  # launch-bound tiny model on shared CI cores
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(TINY_CONFIG))
            ours, cfg = load_model(tmp, load_format="dummy", device=device, dtype=dtype)
    else:
        ours, cfg = load_model(None, load_format="dummy", device=device, dtype=dtype)
    weights = {hf_name(k): v for k, v in ours.state_dict().items() if "rotary" not in k}
    first = next(iter(weights.values()))
    with torch.device(first.device):
        ref = MossTranscribeDiarizeForConditionalGeneration(hf_config(cfg)).to(first.dtype)
    missing, unexpected = ref.load_state_dict(weights, strict=False)
    if set(missing) - {"lm_head.weight"} or unexpected:
        raise RuntimeError(f"weights do not map: missing {missing}, unexpected {unexpected}")
    ref.lm_head.weight = ref.model.language_model.embed_tokens.weight
    del ours, weights
    return ref.eval(), cfg


def _cache_kwarg(ref: Any) -> str:
    return "cache" if "cache" in inspect.signature(ref.forward).parameters else "past_key_values"


def _cache_of(out: Any) -> Any:
    return getattr(out, "cache", None) or out.past_key_values


@torch.inference_mode()
def prefill(ref: Any, ids: torch.Tensor) -> tuple[Any, torch.Tensor, float]:
    """One prefill of ids [B, L]; returns (cache, next tokens [B, 1], seconds)."""
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = ref(input_ids=ids, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1:].argmax(-1)
    sync()
    return _cache_of(out), nxt, time.perf_counter() - t0


@torch.inference_mode()
def decode_steps(ref: Any, cache: Any, nxt: torch.Tensor, steps: int, warmup: int) -> list[float]:
    """ms of each of `steps` greedy decode steps (after `warmup`), growing `cache` in place."""
    timer = StepTimer(nxt.device)
    key = _cache_kwarg(ref)
    ms: list[float] = []
    for i in range(warmup + steps):
        sink: list[float] = [] if i < warmup else ms
        with timer.time(sink):
            out = ref(input_ids=nxt, use_cache=True, logits_to_keep=1, **{key: cache})
            nxt = out.logits[:, -1:].argmax(-1)
    return ms


def bench_context(
    ref: Any, context: int, batches: list[int], steps: int, warmup: int
) -> list[HFDecode]:
    """Prefill one row of `context` tokens, time batch 1, then the cache repeated to each
    larger batch (batch_repeat_interleave), as generate's batched cache would hold it."""
    dev = ref.lm_head.weight.device
    gen = torch.Generator(device="cpu").manual_seed(context)
    ids = torch.randint(100, 150_000, (1, context), generator=gen).to(dev)
    cache, nxt, _ = prefill(ref, ids)
    rows, have = [], 1
    for batch in sorted(batches):
        if batch != have:
            cache.batch_repeat_interleave(batch // have)
            nxt = nxt.repeat_interleave(batch // have, dim=0)
            have = batch
        seq = cache.get_seq_length()
        ms = decode_steps(ref, cache, nxt, steps, warmup)
        rows.append(HFDecode(batch, int(seq) + warmup, steps, statistics.fmean(ms)))
    del cache
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rows


@torch.inference_mode()
def encoder_ms_per_window(ref: Any, cfg: MossTDConfig) -> float:
    """Audio tower time per 30 s window, from batches of ENCODER_BATCH random windows."""
    dev, dt = ref.lm_head.weight.device, ref.lm_head.weight.dtype
    feats = torch.randn(ENCODER_BATCH, N_MELS, N_FRAMES, device=dev, dtype=dt)
    timer = StepTimer(dev)
    ms: list[float] = []
    for i in range(3):
        sink: list[float] = [] if i == 0 else ms
        with timer.time(sink):
            ref.model.audio_tower(feats)
    return statistics.fmean(ms) / ENCODER_BATCH


def line_fit(rows: list[HFDecode]) -> tuple[float, float]:
    """(intercept ms, slope ms per context token) through the rows of one batch size."""
    if len(rows) == 1:
        return rows[0].ms_per_step, 0.0
    slope, intercept = np.polyfit([r.context for r in rows], [r.ms_per_step for r in rows], 1)
    return float(intercept), float(max(slope, 0.0))


def project(
    ref: Any,
    cfg: MossTDConfig,
    workload: wl.Workload,
    batch: int,
    fit: tuple[float, float],
    enc_ms: float,
) -> Projection:
    """Measured prefill of the workload's prompt (random ids of its exact length, x batch),
    plus the projected decode and encoder time."""
    tokenizer = load_tokenizer(None)
    num_tokens = num_audio_tokens(int(round(workload.audio_s * SAMPLE_RATE)))
    prompt_len = len(build_prompt(tokenizer, num_tokens).ids)
    dev = ref.lm_head.weight.device
    ids = torch.randint(100, 150_000, (batch, prompt_len), device=dev)
    prefill(ref, ids[:, :64])  # warm-up
    cache, _, prefill_s = prefill(ref, ids)
    del cache
    n = workload.num_output_tokens
    intercept, slope = fit
    # sum over i < n of intercept + slope * (prompt_len + i)
    decode_ms = n * intercept + slope * (n * prompt_len + n * (n - 1) / 2)
    windows = batch * math.ceil(workload.audio_s / 30.0)
    encoder_s = windows * enc_ms / 1e3
    total = encoder_s + prefill_s + decode_ms / 1e3
    return Projection(
        workload.name,
        batch,
        workload.audio_s,
        prompt_len,
        n,
        encoder_s,
        prefill_s,
        decode_ms / 1e3,
        total,
        batch * workload.audio_s / total,
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"transformers reference on {report['device']} ({report['dtype']}), HF DynamicCache",
        "",
        "| batch | context | ms/step (measured) |",
        "|---|---|---|",
    ]
    lines += [
        f"| {d['batch']} | {d['context']} | {d['ms_per_step']:.2f} |" for d in report["decode"]
    ]
    lines += [
        "",
        f"encoder: {report['encoder_ms_per_window']:.1f} ms per 30 s window (measured)",
        "",
        "| workload | batch | prompt | output | encoder s | prefill s (measured) | decode s "
        "| total s | audio-s/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["projections"]:
        lines.append(
            f"| {p['workload']} | {p['batch']} | {p['prompt_tokens']} | {p['output_tokens']} | "
            f"{p['encoder_s']:.2f} | {p['prefill_s']:.2f} | {p['decode_s']:.1f} (projected) | "
            f"{p['total_s']:.1f} (projected) | {p['audio_s_per_s']:.2f} (projected) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=("real", "tiny"), default="real")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--contexts", type=parse_ints, default=[1024, 36_000])
    p.add_argument("--batches", type=parse_ints, default=[1, SHORT_BATCH])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--short-audio-s", type=float, default=None)
    p.add_argument("--long-audio-s", type=float, default=None)
    p.add_argument("--json", default="hf_reference.json")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    ref, cfg = load_reference(args.config, str(device), args.dtype)
    rows: list[HFDecode] = []
    for context in args.contexts:
        rows += bench_context(ref, context, args.batches, args.steps, args.warmup)
        print(
            f"hf decode ctx={context}: {[round(r.ms_per_step, 2) for r in rows[-2:]]}", flush=True
        )
    enc_ms = encoder_ms_per_window(ref, cfg)
    fits = {b: line_fit([r for r in rows if r.batch == b]) for b in args.batches}
    long_batch, short_batch = min(args.batches), max(args.batches)
    projections = [
        project(
            ref,
            cfg,
            wl.get_workload("long", args.long_audio_s),
            long_batch,
            fits[long_batch],
            enc_ms,
        ),
        project(
            ref,
            cfg,
            wl.get_workload("short", args.short_audio_s),
            short_batch,
            fits[short_batch],
            enc_ms,
        ),
    ]
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(ref.lm_head.weight.dtype).removeprefix("torch."),
        "decode": [asdict(r) for r in rows],
        "encoder_ms_per_window": enc_ms,
        "fits": {
            str(b): {"intercept_ms": f[0], "slope_ms_per_token": f[1]} for b, f in fits.items()
        },
        "projections": [asdict(x) for x in projections],
        "note": "projected: prefill and encoder measured, decode = sum of fitted ms/step",
    }
    print(markdown(report), flush=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
