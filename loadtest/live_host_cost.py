"""Host time of live hops on the engine thread, by part, on a small random model (CPU).

A live hop's host work does not depend on the model's size: the prompt (header, the meeting's
audio pads and time markers, suffix, forced transcript, draft), the request and its fork of
the previous hop's KV, the scheduler's and the model runner's per-step bookkeeping, and the
tokens' way through the detokenizer, parser and commit policy are the same for the real
model. So a small random MOSS-TD (loadtest.bench_engine.TINY_CONFIG, dummy weights) with
forced output shows where the engine thread's own time goes at a given point of a meeting:
at 100 live sessions on an H200 it was ~28 % of the wall time outside engine steps
(docs/benchmarks.md, session 19).

One session streams `--minute` minutes of the long workload's meeting (its first part at
once, then `--hops` one-second chunks, stepping to idle after each) with a fixed forced budget;
each part is timed over the last `--hops` hops with `time.perf_counter` wrappers (no profiler:
cProfile inflates Python-heavy parts several times). Prints one JSON line: ms per hop for
hop-level parts (submission and its pieces, tokens, the end of the hop) and ms per engine
step for step-level parts (schedule, the runner's rows and metadata, postprocess), with the
steps per hop. The model's own forward and encoder time are left out (`encode` and
`launch` are the device's; `wait` is nothing on the CPU).

`--stream` times only the tokens' path (`stream_us_per_token`), without a model.

`--prompt` times only a hop's prompt build and Request at `--minute` (`prompt_us`).

Usage: python -m loadtest.live_host_cost [--minute 10] [--hops 20] [--forced 512]
    [--no-draft] [--stream | --prompt]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
import timeit
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from livemeet.audio.constants import KV_BLOCK_SIZE, SAMPLE_RATE, num_audio_tokens
from livemeet.backends.moss import MossCore
from livemeet.backends.segment_stream import SegmentStream
from livemeet.config import ModelConfig
from livemeet.engine.engine import Engine, EngineConfig
from livemeet.models.loader import load_model
from livemeet.models.tokenizer import load_tokenizer
from livemeet.transcriber import SessionOptions
from livemeet.transcript.detok import IncrementalDetokenizer
from livemeet.transcript.segments import Segment
from loadtest.bench_engine import TINY_CONFIG
from loadtest.workloads import Workload, make_forced

HOP_PARTS = ("submit_hop", "add_request", "on_token", "finish_hop")
STEP_PARTS = ("schedule", "rows", "metadata", "postprocess")
# 64k tokens of the small model's KV: two hops of a 30-minute meeting
KV_BLOCKS = 65_536 // KV_BLOCK_SIZE


class PartTimer:
    """Seconds and calls per named part, gathered by wrapping methods in place."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def wrap(self, obj: Any, method: str, part: str) -> None:
        """Replace `obj.method` by a wrapper that adds its seconds and calls to `part`."""
        inner: Callable[..., Any] = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
                self.calls[part] += 1

        setattr(obj, method, timed)

    def reset(self) -> None:
        """Forget what was timed so far (the warm-up hops)."""
        self.seconds.clear()
        self.calls.clear()


def build_core(meeting_s: float, forced_tokens: int, draft: bool, root: Path) -> tuple[Any, ...]:
    """A MossCore over the small model forcing the long workload's transcript of
    `meeting_s`; returns (core, engine, audio)."""
    (root / "config.json").write_text(json.dumps(TINY_CONFIG))
    model = load_model(str(root), load_format="dummy", device="cpu", dtype="float32")
    workload = Workload("live", meeting_s, round(330 * meeting_s / 60))
    audio, forced = make_forced(load_tokenizer(None), workload)
    forced_path = root / "forced.txt"
    forced_path.write_text(forced.text)
    engine = Engine(EngineConfig(device="cpu", num_kv_blocks=KV_BLOCKS), model=model)
    config = ModelConfig(
        forced_output=str(forced_path),
        live_forced_transcript_tokens=forced_tokens,
        live_forced_transcript_min_tokens=forced_tokens,
        live_draft=draft,
    )
    core = MossCore(config, engine=engine)
    core.load()
    return core, engine, audio


def measure(minute: float, hops: int, forced_tokens: int, draft: bool) -> dict[str, Any]:
    """Stream one session to `minute` and time the last `hops` hops' host parts."""
    torch.set_num_threads(1)  # the small model is launch-bound
    with tempfile.TemporaryDirectory() as tmp:
        meeting_s = 60.0 * minute
        core, engine, audio = build_core(meeting_s + 1.0, forced_tokens, draft, Path(tmp))
        timer = PartTimer()
        timer.wrap(core, "_submit_hop", "submit_hop")
        timer.wrap(core, "_on_token", "on_token")
        timer.wrap(core, "_finish_hop", "finish_hop")
        timer.wrap(engine, "add_request", "add_request")
        timer.wrap(engine.scheduler, "schedule", "schedule")
        timer.wrap(engine.scheduler, "postprocess", "postprocess")
        timer.wrap(engine.runner, "_rows", "rows")
        timer.wrap(engine.runner, "_metadata", "metadata")
        core.open("L", SessionOptions(live=True, hop_s=1.0))
        second = SAMPLE_RATE
        head = round(meeting_s - hops - 2) * second
        core.append("L", audio[:head])
        _run_to_idle(core)
        for i in range(hops + 2):  # two warm hops, then the timed ones
            if i == 2:
                timer.reset()
            core.append("L", audio[head + i * second : head + (i + 1) * second])
            _run_to_idle(core)
        core.abort("L")
    steps = timer.calls["schedule"]
    record: dict[str, Any] = {
        "minute": minute,
        "hops": hops,
        "forced_tokens": forced_tokens,
        "draft": draft,
        "steps_per_hop": round(steps / hops, 2),
        "tokens_per_hop": round(timer.calls["on_token"] / hops, 2),
        "ms_per_hop": {p: round(1e3 * timer.seconds[p] / hops, 3) for p in HOP_PARTS},
        "ms_per_step": {p: round(1e3 * timer.seconds[p] / max(1, steps), 3) for p in STEP_PARTS},
    }
    return record


def stream_us_per_token(ids_per_hop: int = 14, repeats: int = 5) -> float:
    """Microseconds per token through a hop's SegmentStream (detokenizer, parser, repetition
    guard), a fresh stream per `ids_per_hop` ids of the long workload's 10-minute transcript
    as live hops have, seeded with 20 forced segments; the best of `repeats` passes."""
    tokenizer = load_tokenizer(None)
    _, forced = make_forced(tokenizer, Workload("live", 600.0, 3_300))
    ids = list(forced.token_ids)
    history = [Segment(float(i), i + 1.0, "S01", "hello there") for i in range(20)]
    best_s = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for k in range(0, len(ids), ids_per_hop):
            stream = SegmentStream(IncrementalDetokenizer(tokenizer), 600.0, history)
            for token_id in ids[k : k + ids_per_hop]:
                stream.push(token_id)
            stream.close()
        best_s = min(best_s, time.perf_counter() - start)
    return 1e6 * best_s / len(ids)


def prompt_us(minute: float, forced_tokens: int, repeats: int = 200) -> float:
    """Microseconds to build one live hop's prompt at `minute` and queue it as a Request (the
    part of `add_request` that grows with the meeting: the span of pads and time markers, the
    forced ids appended, the audio positions checked), without a model; the best of 5 runs of
    `repeats`."""
    from livemeet.engine.request import Request
    from livemeet.models.prompt import PromptBuilder

    builder = PromptBuilder(load_tokenizer(None))
    num_tokens = num_audio_tokens(round(60.0 * minute * SAMPLE_RATE))
    forced = list(range(1_000, 1_000 + forced_tokens))
    builder.build(num_tokens)  # the template, grown once as in a session

    def one_hop() -> None:
        built = builder.build(num_tokens)
        built.ids.extend(forced)
        Request("hop", built.ids, audio_positions=built.audio_positions)

    best_s = min(timeit.repeat(one_hop, number=repeats, repeat=5))
    return 1e6 * best_s / repeats


def _run_to_idle(core: MossCore) -> None:
    while core.has_work():
        core.step()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minute", type=float, default=10.0, help="meeting minute of the hops")
    p.add_argument("--hops", type=int, default=20, help="hops timed")
    p.add_argument("--forced", type=int, default=512, help="forced transcript tokens (fixed)")
    p.add_argument("--no-draft", action="store_true", help="hops without drafts")
    p.add_argument(
        "--stream", action="store_true", help="only the token path: us per token (no model)"
    )
    p.add_argument(
        "--prompt",
        action="store_true",
        help="only a hop's prompt build and Request at --minute: us per hop (no model)",
    )
    args = p.parse_args(argv)
    if args.minute * 60 < args.hops + 10 or args.hops < 1:
        p.error("need --hops >= 1 and a meeting at least 10 s longer than the hops")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.stream:
        print(json.dumps({"stream_us_per_token": round(stream_us_per_token(), 2)}))
        return
    if args.prompt:
        us = prompt_us(args.minute, args.forced)
        print(json.dumps({"minute": args.minute, "prompt_us_per_hop": round(us, 1)}))
        return
    print(json.dumps(measure(args.minute, args.hops, args.forced, not args.no_draft)))


if __name__ == "__main__":
    main()
