"""The published HTTP sweep: uploads through the real server at increasing concurrency.

For each workload a `livemeet serve` subprocess is started on a free port with dummy real-size
weights and that workload's forced transcript (`--load-format dummy --forced-output FILE`), and
the sweep waits for /readyz. Each point keeps `c` uploads in flight (closed loop) until its
requests are done: short at c = 1, 2, 4, 8, 16, 32, 64 (max(16, 2c) clips per point); long at
c = 1, 2, 4, 8, 16 (max(4, c) meetings per point). Uploads are multipart POSTs to
/v1/audio/transcriptions with in-memory 16 kHz PCM16 WAV bodies (aiohttp).

Forced output is server-side and per server, so every request of one workload has the same
duration and its transcript matches it (330 tokens per audio minute for long, 64 for short);
that is why each workload gets its own server. Each meeting's audio is rotated by a different
offset, so the encoder's window cache never hits.

Per point one JSON line: req/s, audio-s/s, RTF mean, latency mean and p95, errors; points whose
estimated time would pass `--max-seconds` are written as skipped. When the server exports the
engine's counters (`livemeet_engine_*` on /metrics: the MOSS-TD backend), the point also gets
their increase over it: `engine_steps` (by kind: decode_graph, decode_eager, prefill_graph,
prefill_eager), `decode_graph_fallbacks`, `prefill_tokens` and `decode_tokens`; from servers
that time their steps also `engine_step_s` (host seconds inside steps by part: schedule,
encode, launch, wait, other) and `slow_steps` (steps of ENGINE_SLOW_STEP_S or more, each in
the server log with its shape), which say whether a slow point's time went into steps and
into which part. /metrics is
scraped before the point and after it until two scrapes agree (the idle worker posts exact
totals), at most STATS_SETTLE_S. With `--url`, other traffic on that server is counted too.
The point also gets `upload_phase_mean_s`: the mean seconds per upload phase (receive, decode,
transcribe, respond) from the server's `livemeet_upload_phase_seconds` histogram.

A server with API keys (README, "API keys"; `--url` to one started with `serve --auth keys`)
gets $LIVEMEET_API_KEY, where set, as `Authorization: Bearer` on every upload (`auth_headers`;
bench_live's live sessions too). /metrics and /readyz need none.
Usage:
  python -m loadtest.http_sweep --out sweep.jsonl --long-concurrency 1,16 --max-seconds 420
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from livemeet.audio.constants import ENGINE_STATS_INTERVAL_S
from livemeet.engine.messages import STEP_PARTS
from livemeet.gateway.metrics import UPLOAD_PHASES
from loadtest import workloads as wl
from loadtest.bench_engine import ASSUMED_AUDIO_S_PER_S, Budget, parse_ints, percentile

DEFAULT_SERVE_ARGS = "--load-format dummy --forced-output {forced}"
READY_POLL_S = 0.5  # s between /readyz polls
STOP_TIMEOUT_S = 20.0  # s to wait for the server to exit after SIGTERM before SIGKILL
ENDPOINT = "/v1/audio/transcriptions"
STEP_KINDS = ("decode_graph", "decode_eager", "prefill_graph", "prefill_eager")
STATS_SETTLE_S = 3.0 * ENGINE_STATS_INTERVAL_S  # s; longest wait for a point's final stats
# s between /metrics scrapes while settling: longer than the interval at which a stepping
# worker posts, so two equal scrapes mean it stopped stepping (shorter, two scrapes within
# one interval of a busy worker would agree)
STATS_POLL_S = 1.2 * ENGINE_STATS_INTERVAL_S
API_KEY_ENV = "LIVEMEET_API_KEY"  # the key load clients send, where set (as `livemeet stream`)


def auth_headers() -> dict[str, str]:
    """The load clients' request headers: `Authorization: Bearer $LIVEMEET_API_KEY` where it is
    set and not empty (a server with API keys refuses uploads and live sessions without one:
    401, 4401), else none."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass(frozen=True)
class PointResult:
    """One sweep point."""

    workload: str
    concurrency: int
    num_requests: int
    num_errors: int
    audio_s: float  # per request
    makespan_s: float
    req_per_s: float
    audio_s_per_s: float
    rtf_mean: float
    latency_mean_s: float
    latency_p95_s: float
    upload_mb: float  # WAV body size per request
    first_error: str = ""


@dataclass(frozen=True)
class EngineCounters:
    """The `livemeet_engine_*` counters of one /metrics scrape: cumulative since the engine
    worker started (a restart starts them again from zero), or the increase between two."""

    steps: dict[str, int]  # steps by kind (STEP_KINDS)
    decode_graph_fallbacks: int  # steps; decode steps run eagerly although graphs exist
    prefill_tokens: int  # tokens computed by prefill chunks
    decode_tokens: int  # tokens computed by decode rows
    # s; host seconds inside steps by part (STEP_PARTS); empty from servers that do not time
    step_s: dict[str, float] = field(default_factory=dict)
    slow_steps: int = 0  # steps of ENGINE_SLOW_STEP_S or more
    encoded_windows: int = 0  # 30-s windows the encoder computed (cache hits excluded)
    live_hops: int = 0  # live decodes finished
    live_hop_s: float = 0.0  # s; their summed time from submission to end
    live_forced_tokens: int = 0  # forced-transcript tokens of the hops submitted, summed
    live_hop_wait_s: float = 0.0  # s; the hops' summed wait from due to submission
    live_hop_first_token_s: float = 0.0  # s; their summed time to the first sampled id
    draft_tokens: int = 0  # draft ids the requests carried
    accepted_draft_tokens: int = 0  # of them, accepted by their verifying prefill
    audio_commands: int = 0  # audio appends the worker applied with a send time
    audio_lag_s: float = 0.0  # s; their summed wait from the gateway's queue to the worker
    audio_lag_max_s: float = 0.0  # s; the longest such wait since the worker started (a gauge)
    live_endpoint_hops: int = 0  # live hops due early: their session's speech ended (VAD)
    gc_full_collections: int = 0  # the engine process's full garbage collections
    gc_pause_s: float = 0.0  # s; its time in collections of any generation
    gc_pause_max_s: float = 0.0  # s; its longest collection since the worker started (a gauge)

    def minus(self, before: EngineCounters) -> EngineCounters:
        return EngineCounters(
            steps={k: v - before.steps.get(k, 0) for k, v in self.steps.items()},
            decode_graph_fallbacks=self.decode_graph_fallbacks - before.decode_graph_fallbacks,
            prefill_tokens=self.prefill_tokens - before.prefill_tokens,
            decode_tokens=self.decode_tokens - before.decode_tokens,
            step_s={k: v - before.step_s.get(k, 0.0) for k, v in self.step_s.items()},
            slow_steps=self.slow_steps - before.slow_steps,
            encoded_windows=self.encoded_windows - before.encoded_windows,
            live_hops=self.live_hops - before.live_hops,
            live_hop_s=self.live_hop_s - before.live_hop_s,
            live_forced_tokens=self.live_forced_tokens - before.live_forced_tokens,
            live_hop_wait_s=self.live_hop_wait_s - before.live_hop_wait_s,
            live_hop_first_token_s=self.live_hop_first_token_s - before.live_hop_first_token_s,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_draft_tokens=self.accepted_draft_tokens - before.accepted_draft_tokens,
            audio_commands=self.audio_commands - before.audio_commands,
            audio_lag_s=self.audio_lag_s - before.audio_lag_s,
            audio_lag_max_s=self.audio_lag_max_s,  # not a counter: since the worker started
            live_endpoint_hops=self.live_endpoint_hops - before.live_endpoint_hops,
            gc_full_collections=self.gc_full_collections - before.gc_full_collections,
            gc_pause_s=self.gc_pause_s - before.gc_pause_s,
            gc_pause_max_s=self.gc_pause_max_s,  # not a counter either
        )

    def record(self) -> dict[str, Any]:
        """The fields a point's JSON record gets."""
        record: dict[str, Any] = {
            "engine_steps": dict(self.steps),
            "decode_graph_fallbacks": self.decode_graph_fallbacks,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
        }
        if self.step_s:
            record["engine_step_s"] = dict(self.step_s)
            record["slow_steps"] = self.slow_steps
        if self.encoded_windows:  # servers before session 15 do not count them
            record["encoded_windows"] = self.encoded_windows
        if self.live_hops:
            record["live_hops"] = self.live_hops
            record["live_hop_mean_s"] = self.live_hop_s / self.live_hops
        if self.live_hops and self.live_forced_tokens:  # servers before session 17: none
            # per hop finished: a hop submitted but not finished counts in the sum only
            record["live_forced_mean_tokens"] = self.live_forced_tokens / self.live_hops
        if self.live_hops and self.live_hop_wait_s:  # servers before session 18: none
            # the wait before submission, which live_hop_mean_s does not hold
            record["live_hop_wait_mean_s"] = self.live_hop_wait_s / self.live_hops
        if self.live_hops and self.live_hop_first_token_s:  # servers before session 22: none
            # submission to the first sampled id; the rest of live_hop_mean_s is decoding
            record["live_hop_first_token_mean_s"] = self.live_hop_first_token_s / self.live_hops
        if self.draft_tokens:  # servers before session 19: none
            record["draft_tokens"] = self.draft_tokens
            record["accepted_draft_tokens"] = self.accepted_draft_tokens
        if self.audio_commands:  # servers before session 16 do not time them
            record["audio_commands"] = self.audio_commands
            record["audio_lag_mean_s"] = self.audio_lag_s / self.audio_commands
            record["audio_lag_max_since_start_s"] = self.audio_lag_max_s
        if self.live_endpoint_hops:  # servers before session 20 (or without VAD): none
            record["live_endpoint_hops"] = self.live_endpoint_hops
        if self.gc_pause_s or self.gc_pause_max_s:  # servers before session 20: none
            record["gc_full_collections"] = self.gc_full_collections
            record["gc_pause_s"] = self.gc_pause_s
            record["gc_pause_max_since_start_s"] = self.gc_pause_max_s
        return record


def parse_engine_counters(text: str) -> EngineCounters | None:
    """The engine counters in a Prometheus text exposition; None when it has none (a backend
    without a step engine, or a server older than them)."""
    steps: dict[str, int] = {}
    values: dict[str, int] = {}
    step_s: dict[str, float] = {}
    hop_s = 0.0  # livemeet_live_hop_seconds: absent from servers before session 15
    hop_wait_s = 0.0  # livemeet_live_hop_wait_seconds: absent before session 18
    first_token_s = 0.0  # livemeet_live_hop_first_token_seconds: absent before session 22
    lag_s = lag_max_s = 0.0  # the audio-command waits: absent from servers before session 16
    gc_s = gc_max_s = 0.0  # the engine's garbage collections: absent before session 20
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "livemeet_engine_steps_total":
                steps[sample.labels["kind"]] = int(sample.value)
            elif sample.name == "livemeet_engine_tokens_total":
                values[sample.labels["phase"]] = int(sample.value)
            elif sample.name == "livemeet_engine_decode_graph_fallbacks_total":
                values["fallbacks"] = int(sample.value)
            elif sample.name == "livemeet_engine_step_seconds_total":
                step_s[sample.labels["part"]] = sample.value
            elif sample.name == "livemeet_engine_slow_steps_total":
                values["slow"] = int(sample.value)
            elif sample.name == "livemeet_engine_encoded_windows_total":
                values["windows"] = int(sample.value)
            elif sample.name == "livemeet_live_hops_total":
                values["hops"] = int(sample.value)
            elif sample.name == "livemeet_live_hop_seconds_total":
                hop_s = sample.value
            elif sample.name == "livemeet_live_hop_wait_seconds_total":
                hop_wait_s = sample.value
            elif sample.name == "livemeet_live_hop_first_token_seconds_total":
                first_token_s = sample.value
            elif sample.name == "livemeet_live_forced_tokens_total":
                values["forced"] = int(sample.value)
            elif sample.name == "livemeet_engine_draft_tokens_total":
                values[f"draft_{sample.labels['outcome']}"] = int(sample.value)
            elif sample.name == "livemeet_engine_audio_commands_total":
                values["audio_commands"] = int(sample.value)
            elif sample.name == "livemeet_engine_audio_command_lag_seconds_total":
                lag_s = sample.value
            elif sample.name == "livemeet_engine_audio_command_lag_max_seconds":
                lag_max_s = sample.value
            elif sample.name == "livemeet_live_endpoint_hops_total":
                values["endpoint_hops"] = int(sample.value)
            elif sample.name == "livemeet_engine_gc_collections_total":
                values[f"gc_{sample.labels['generation']}"] = int(sample.value)
            elif sample.name == "livemeet_engine_gc_pause_seconds_total":
                gc_s = sample.value
            elif sample.name == "livemeet_engine_gc_pause_max_seconds":
                gc_max_s = sample.value
    if not steps:
        return None
    return EngineCounters(
        steps={kind: steps.get(kind, 0) for kind in STEP_KINDS},
        decode_graph_fallbacks=values.get("fallbacks", 0),
        prefill_tokens=values.get("prefill", 0),
        decode_tokens=values.get("decode", 0),
        step_s={part: step_s[part] for part in STEP_PARTS if part in step_s},
        slow_steps=values.get("slow", 0),
        encoded_windows=values.get("windows", 0),
        live_hops=values.get("hops", 0),
        live_hop_s=hop_s,
        live_forced_tokens=values.get("forced", 0),
        live_hop_wait_s=hop_wait_s,
        live_hop_first_token_s=first_token_s,
        draft_tokens=values.get("draft_proposed", 0),
        accepted_draft_tokens=values.get("draft_accepted", 0),
        audio_commands=values.get("audio_commands", 0),
        audio_lag_s=lag_s,
        audio_lag_max_s=lag_max_s,
        live_endpoint_hops=values.get("endpoint_hops", 0),
        gc_full_collections=values.get("gc_full", 0),
        gc_pause_s=gc_s,
        gc_pause_max_s=gc_max_s,
    )


UPLOAD_PHASE_HISTOGRAM = "livemeet_upload_phase_seconds"


@dataclass(frozen=True)
class PhaseTotals:
    """A histogram by phase of one /metrics scrape (`livemeet_upload_phase_seconds` unless
    named): per phase, the seconds summed over what was timed and how many were."""

    sums: dict[str, float]  # s
    counts: dict[str, int]  # requests (uploads), or live sessions' finals


def parse_phases(text: str, histogram: str = UPLOAD_PHASE_HISTOGRAM) -> PhaseTotals | None:
    """The sums and counts of `histogram` (labelled by `phase`); None when /metrics has none
    (an older server)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == histogram + "_sum":
                sums[sample.labels["phase"]] = sample.value
            elif sample.name == histogram + "_count":
                counts[sample.labels["phase"]] = int(sample.value)
    return PhaseTotals(sums, counts) if counts else None


def phase_fields(
    before: PhaseTotals | None,
    after: PhaseTotals | None,
    phases: tuple[str, ...] = UPLOAD_PHASES,
    key: str = "upload_phase_mean_s",
) -> dict[str, Any]:
    """A point's `key` (`upload_phase_mean_s`): per phase, the mean seconds of what finished
    it during the point (where an upload's latency went: receive, decode, transcribe,
    respond); none when either scrape had no histogram."""
    if before is None or after is None:
        return {}
    means = {}
    for phase in phases:
        n = after.counts.get(phase, 0) - before.counts.get(phase, 0)
        if n > 0:
            means[phase] = (after.sums.get(phase, 0.0) - before.sums.get(phase, 0.0)) / n
    return {key: means} if means else {}


def engine_fields(before: EngineCounters | None, after: EngineCounters | None) -> dict[str, Any]:
    """A point's engine fields: the counters' increase over it; none when either scrape had no
    counters or they went down (the engine worker restarted during the point)."""
    if before is None or after is None:
        return {}
    delta = after.minus(before)
    counts = [*delta.steps.values(), delta.prefill_tokens, delta.decode_tokens, delta.slow_steps]
    counts += [delta.decode_graph_fallbacks, *delta.step_s.values()]
    counts += [delta.encoded_windows, delta.live_hops, delta.live_hop_s, delta.live_forced_tokens]
    counts += [delta.audio_commands, delta.audio_lag_s, delta.draft_tokens]
    if min(counts) < 0:
        return {}
    return delta.record()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def requests_for(workload: str, concurrency: int, min_long: int, min_short: int) -> int:
    """Requests per point: long max(min_long, c); short max(min_short, 2c)."""
    if workload == "long":
        return max(min_long, concurrency)
    return max(min_short, 2 * concurrency)


# ---------------------------------------------------------------- the server


class Server:
    """A `livemeet serve` child process on a free port; `stop()` ends it (SIGTERM, then kill)."""

    def __init__(self, serve_args: Sequence[str], data_dir: Path, log: IO[bytes]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "livemeet", "serve", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--data-dir", str(data_dir), *serve_args]
        self.cmd = cmd
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Its own process group, so stop() also reaches the engine worker it spawns.
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    async def wait_ready(self, timeout_s: float) -> float:
        """Seconds until /readyz answered 200. Raises RuntimeError if the process exits or the
        timeout passes."""
        start = time.monotonic()
        async with aiohttp.ClientSession() as session:
            while time.monotonic() - start < timeout_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}: {self.cmd}")
                try:
                    async with session.get(self.url + "/readyz") as r:
                        if r.status == 200:
                            return time.monotonic() - start
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(READY_POLL_S)
        raise RuntimeError(f"server not ready after {timeout_s:.0f} s: {self.cmd}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- the client


async def upload(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, str]:
    """POST one WAV; returns (latency s, "" or an error description)."""
    form = aiohttp.FormData()
    form.add_field("file", body, filename="meeting.wav", content_type="audio/wav")
    form.add_field("model", "moss-transcribe-diarize")
    form.add_field("response_format", "json")
    start = time.perf_counter()
    try:
        async with session.post(url + ENDPOINT, data=form) as r:
            payload = await r.read()
            latency = time.perf_counter() - start
            if r.status != 200:
                return latency, f"HTTP {r.status}: {payload[:200]!r}"
            if "text" not in json.loads(payload):
                return latency, f"no text in response: {payload[:200]!r}"
            return latency, ""
    except aiohttp.ClientError as exc:
        return time.perf_counter() - start, f"{type(exc).__name__}: {exc}"


async def scrape_metrics(session: aiohttp.ClientSession, url: str) -> str | None:
    """The server's /metrics text now; None when the request fails."""
    try:
        async with session.get(url + "/metrics") as r:
            return await r.text() if r.status == 200 else None
    except aiohttp.ClientError:
        return None


def engine_counters(text: str | None) -> EngineCounters | None:
    """The engine counters of a /metrics scrape (`scrape_metrics`); None when the scrape failed
    or had none."""
    return None if text is None else parse_engine_counters(text)


def _upload_phases(text: str | None) -> PhaseTotals | None:
    return None if text is None else parse_phases(text)


async def settled_metrics(
    session: aiohttp.ClientSession, url: str, timeout_s: float = STATS_SETTLE_S
) -> str | None:
    """Scrape /metrics every STATS_POLL_S until two scrapes' engine counters agree (the worker
    went idle and posted its exact totals) or `timeout_s` (s) passed; returns the last text."""
    deadline = time.monotonic() + timeout_s
    last = await scrape_metrics(session, url)
    while time.monotonic() < deadline:
        await asyncio.sleep(STATS_POLL_S)
        now = await scrape_metrics(session, url)
        if engine_counters(now) == engine_counters(last):
            return now
        last = now
    return last


async def run_point(
    url: str, workload: wl.Workload, concurrency: int, bodies: list[bytes]
) -> PointResult:
    """Keep `concurrency` uploads in flight until every body has been sent."""
    latencies: list[float] = []
    errors: list[str] = []
    queue = list(range(len(bodies)))
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = auth_headers()
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, headers=headers
    ) as session:

        async def worker() -> None:
            while queue:
                latency, error = await upload(session, url, bodies[queue.pop()])
                latencies.append(latency)
                if error:
                    errors.append(error)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        makespan = time.perf_counter() - start
    n = len(bodies)
    ok = n - len(errors)
    mean = statistics.fmean(latencies)
    return PointResult(
        workload=workload.name,
        concurrency=concurrency,
        num_requests=n,
        num_errors=len(errors),
        audio_s=workload.audio_s,
        makespan_s=makespan,
        req_per_s=ok / makespan,
        audio_s_per_s=ok * workload.audio_s / makespan,
        rtf_mean=mean / workload.audio_s,
        latency_mean_s=mean,
        latency_p95_s=percentile(latencies, 95),
        upload_mb=len(bodies[0]) / 1e6,
        first_error=errors[0] if errors else "",
    )


# ---------------------------------------------------------------- the sweep


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="short,long")
    p.add_argument("--short-concurrency", type=parse_ints, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--long-concurrency", type=parse_ints, default=[1, 2, 4, 8, 16])
    p.add_argument("--long-min-requests", type=int, default=4, help="meetings per long point")
    p.add_argument("--short-min-requests", type=int, default=16, help="clips per short point")
    p.add_argument("--short-audio-s", type=float, default=None, help="override 11.6 s")
    p.add_argument("--long-audio-s", type=float, default=None, help="override 2,240 s")
    p.add_argument("--serve-args", default=DEFAULT_SERVE_ARGS, help="{forced}: transcript path")
    p.add_argument("--url", default=None, help="use this running server (one workload only)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--max-seconds", type=float, default=None, help="skip points past this")
    p.add_argument(
        "--assumed-audio-s-per-s",
        type=float,
        default=ASSUMED_AUDIO_S_PER_S,
        help="rate used to estimate a workload's first point under --max-seconds",
    )
    p.add_argument("--out", default="http_sweep.jsonl", help="JSON lines output")
    p.add_argument("--log-dir", default=None, help="server logs (default: next to --out)")
    return p.parse_args(argv)


def write_line(out: IO[str], record: dict[str, Any]) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()
    print(json.dumps(record), flush=True)


async def sweep_workload(
    args: argparse.Namespace, name: str, budget: Budget, out: IO[str], work_dir: Path
) -> None:
    from livemeet.models.tokenizer import load_tokenizer

    workload = wl.get_workload(name, getattr(args, f"{name}_audio_s"))
    samples, forced = wl.make_forced(load_tokenizer(None), workload, seed=1)
    forced_path = work_dir / f"forced-{name}.txt"
    forced_path.write_text(forced.text, encoding="utf-8")
    (work_dir / f"forced-{name}.json").write_text(json.dumps(list(forced.token_ids)))
    server = None
    log_dir = Path(args.log_dir) if args.log_dir else Path(args.out).resolve().parent
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"server-{name}.log", "wb") as log:
        try:
            url = args.url
            if url is None:
                serve_args = shlex.split(args.serve_args.format(forced=forced_path))
                server = Server(serve_args, work_dir / f"data-{name}", log)
                ready_s = await server.wait_ready(args.startup_timeout)
                write_line(
                    out,
                    {
                        "event": "server_ready",
                        "workload": name,
                        "ready_s": ready_s,
                        "cmd": server.cmd,
                        "forced_tokens": len(forced.token_ids) + 1,
                    },
                )
                url = server.url
            await sweep_points(args, workload, samples, url, budget, out)
        finally:
            if server is not None:
                server.stop()


async def sweep_points(
    args: argparse.Namespace,
    workload: wl.Workload,
    samples: np.ndarray,
    url: str,
    budget: Budget,
    out: IO[str],
) -> None:
    for c in getattr(args, f"{workload.name}_concurrency"):
        n = requests_for(workload.name, c, args.long_min_requests, args.short_min_requests)
        if not budget.fits(workload.name, n * workload.audio_s, c):
            write_line(
                out,
                {
                    "workload": workload.name,
                    "concurrency": c,
                    "num_requests": n,
                    "skipped": budget.why_skipped(workload.name, n * workload.audio_s, c),
                },
            )
            continue
        bodies = [wl.wav_bytes(wl.vary(samples, i)) for i in range(n)]
        async with aiohttp.ClientSession() as scraper:
            before = await scrape_metrics(scraper, url)
            result = await run_point(url, workload, c, bodies)
            after = None if before is None else await settled_metrics(scraper, url)
        del bodies
        if result.num_errors < result.num_requests:
            budget.observe(workload.name, result.audio_s_per_s, c)
        record = {
            **asdict(result),
            **engine_fields(engine_counters(before), engine_counters(after)),
        }
        write_line(out, {**record, **phase_fields(_upload_phases(before), _upload_phases(after))})


async def amain(args: argparse.Namespace) -> None:
    budget = Budget(args.max_seconds, assumed_rate=args.assumed_audio_s_per_s)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    with open(args.out, "a", encoding="utf-8") as out, tempfile.TemporaryDirectory() as tmp:
        for name in names:
            await sweep_workload(args, name, budget, out, Path(tmp))


def main(argv: list[str] | None = None) -> None:
    asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    main()
