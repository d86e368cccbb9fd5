"""http_sweep end to end against a real `livemeet serve` (scripted backend, CPU)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from loadtest import http_sweep
from loadtest.http_sweep import (
    EngineCounters,
    Server,
    engine_fields,
    parse_engine_counters,
    requests_for,
    settled_metrics,
)
from tests.loadtest.conftest import run_module


@pytest.mark.slow
def test_sweep_through_real_server(tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    run_module(
        "loadtest.http_sweep",
        "--workloads",
        "short,long",
        "--short-concurrency",
        "1,4",
        "--long-concurrency",
        "2,100000",
        "--long-audio-s",
        "20",
        "--short-min-requests",
        "2",
        "--long-min-requests",
        "2",
        "--serve-args",
        "--backend scripted --log-level debug",
        "--max-seconds",
        "60",
        "--assumed-audio-s-per-s",
        "50",
        "--out",
        str(out),
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ready = [r for r in lines if r.get("event") == "server_ready"]
    assert [r["workload"] for r in ready] == ["short", "long"]
    assert ready[0]["forced_tokens"] == 64 and ready[1]["forced_tokens"] == 110
    points = {(r["workload"], r["concurrency"]): r for r in lines if "event" not in r}
    assert points[("short", 4)]["num_requests"] == 8  # max(2, 2c)
    assert points[("long", 2)]["num_requests"] == 2
    # 100,000 meetings x 20 s cannot fit in 60 s at any measured rate: reported, not run
    assert "skipped" in points[("long", 100_000)]
    for key in (("short", 1), ("short", 4), ("long", 2)):
        r = points[key]
        assert r["num_errors"] == 0, r["first_error"]
        assert r["audio_s_per_s"] == pytest.approx(
            r["num_requests"] * r["audio_s"] / r["makespan_s"]
        )
        assert r["latency_mean_s"] <= r["latency_p95_s"] + 1e-9 or r["num_requests"] == 1
        assert "engine_steps" not in r  # the scripted backend has no step engine to count
        phases = r["upload_phase_mean_s"]  # the server's per-phase histogram, differenced
        assert set(phases) == {"receive", "decode", "transcribe", "respond"}
        assert all(v >= 0 for v in phases.values())
        assert sum(phases.values()) <= r["latency_mean_s"]  # the client also waits on the wire
    log_text = (tmp_path / "server-short.log").read_text()
    assert "upload phases: receive" in log_text and "respond" in log_text  # --log-level debug


def test_server_that_exits_is_reported(tmp_path: Path) -> None:
    with open(tmp_path / "log", "wb") as log:
        server = Server(["--no-such-flag"], tmp_path / "data", log)
        try:
            with pytest.raises(RuntimeError, match="exited"):
                asyncio.run(server.wait_ready(60))
        finally:
            server.stop()
    assert b"--no-such-flag" in (tmp_path / "log").read_bytes()


def test_requests_per_point() -> None:
    assert requests_for("long", 1, 4, 16) == 4
    assert requests_for("long", 16, 4, 16) == 16
    assert requests_for("short", 4, 4, 16) == 16
    assert requests_for("short", 64, 4, 16) == 128


def metrics_text(
    steps: tuple[int, int, int, int],
    tokens: tuple[int, int],
    fallbacks: int = 0,
    step_s: dict[str, float] | None = None,
    slow_steps: int = 0,
) -> str:
    """A /metrics body as the gateway writes it: (decode graph, decode eager, prefill graph,
    prefill eager) steps, (prefill, decode) tokens, and an unrelated gateway counter; with
    `step_s`, the host seconds by part and the slow steps (servers that time their steps)."""
    lines = [
        "# HELP livemeet_requests_total HTTP requests by endpoint and status",
        "# TYPE livemeet_requests_total counter",
        'livemeet_requests_total{endpoint="transcriptions",status="200"} 32.0',
        "# HELP livemeet_engine_steps_total Engine steps by kind (cumulative)",
        "# TYPE livemeet_engine_steps_total counter",
        *(
            f'livemeet_engine_steps_total{{kind="{kind}"}} {n}.0'
            for kind, n in zip(http_sweep.STEP_KINDS, steps, strict=True)
        ),
        "# HELP livemeet_engine_tokens_total Tokens computed by the engine, by phase",
        "# TYPE livemeet_engine_tokens_total counter",
        f'livemeet_engine_tokens_total{{phase="prefill"}} {tokens[0]}.0',
        f'livemeet_engine_tokens_total{{phase="decode"}} {tokens[1]}.0',
        "# HELP livemeet_engine_decode_graph_fallbacks_total Decode steps run eagerly",
        "# TYPE livemeet_engine_decode_graph_fallbacks_total counter",
        f"livemeet_engine_decode_graph_fallbacks_total {fallbacks}.0",
    ]
    if step_s is not None:
        lines += [
            "# TYPE livemeet_engine_step_seconds_total counter",
            *(f'livemeet_engine_step_seconds_total{{part="{p}"}} {v}' for p, v in step_s.items()),
            "# TYPE livemeet_engine_slow_steps_total counter",
            f"livemeet_engine_slow_steps_total {slow_steps}.0",
        ]
    return "\n".join(lines) + "\n"


def test_engine_counters_parsed_and_differenced() -> None:
    before = parse_engine_counters(metrics_text((100, 2, 10, 1), (40_000, 3_000), 2))
    after = parse_engine_counters(metrics_text((1_340, 5, 26, 1), (71_000, 15_500), 5))
    assert before == EngineCounters(
        steps={"decode_graph": 100, "decode_eager": 2, "prefill_graph": 10, "prefill_eager": 1},
        decode_graph_fallbacks=2,
        prefill_tokens=40_000,
        decode_tokens=3_000,
    )
    assert engine_fields(before, after) == {
        "engine_steps": {
            "decode_graph": 1_240,
            "decode_eager": 3,
            "prefill_graph": 16,
            "prefill_eager": 0,
        },
        "decode_graph_fallbacks": 3,
        "prefill_tokens": 31_000,
        "decode_tokens": 12_500,
    }


def test_step_seconds_parsed_and_differenced() -> None:
    """Where a point's engine time went: host seconds by part and slow steps, differenced."""
    parts = ("schedule", "encode", "launch", "wait", "other")
    seconds_before = dict(zip(parts, (0.5, 1.0, 2.0, 3.0, 0.25), strict=True))
    seconds_after = dict(zip(parts, (0.75, 3.5, 2.5, 3.5, 0.5), strict=True))
    before = parse_engine_counters(
        metrics_text((100, 0, 10, 0), (9_000, 600), step_s=seconds_before, slow_steps=1)
    )
    after = parse_engine_counters(
        metrics_text((436, 0, 22, 0), (12_744, 1_624), step_s=seconds_after, slow_steps=3)
    )
    fields = engine_fields(before, after)
    assert fields["engine_step_s"] == {
        "schedule": 0.25,
        "encode": 2.5,
        "launch": 0.5,
        "wait": 0.5,
        "other": 0.25,
    }
    assert fields["slow_steps"] == 2
    # a server that does not time its steps: the point has no such fields
    untimed = engine_fields(
        parse_engine_counters(metrics_text((1, 0, 1, 0), (10, 1))),
        parse_engine_counters(metrics_text((2, 0, 1, 0), (10, 2))),
    )
    assert "engine_step_s" not in untimed and "slow_steps" not in untimed
    assert untimed["engine_steps"]["decode_graph"] == 1


def with_samples(*samples: tuple[str, str, float]) -> str:
    """A small engine exposition plus one sample per (name, type, value), each under its own
    `# TYPE` line (the name as exposed: `_total` for a counter)."""
    lines = [f"# TYPE {name} {kind}\n{name} {float(value)}" for name, kind, value in samples]
    return metrics_text((10, 0, 5, 0), (900, 60)) + "\n".join(lines) + "\n"


def test_encoder_windows_and_live_hops_parsed_and_differenced() -> None:
    """The encoder's windows and the live hops (count, summed time) of a point: its mean hop
    time says how far behind live serving ran."""

    def text(windows: int, hops: int, hop_s: float, forced: int, wait_s: float) -> str:
        return with_samples(
            ("livemeet_engine_encoded_windows_total", "counter", windows),
            ("livemeet_live_hops_total", "counter", hops),
            ("livemeet_live_hop_seconds_total", "counter", hop_s),
            ("livemeet_live_forced_tokens_total", "counter", forced),
            ("livemeet_live_hop_wait_seconds_total", "counter", wait_s),
            ("livemeet_live_hop_first_token_seconds_total", "counter", hop_s / 4),
        )

    fields = engine_fields(
        parse_engine_counters(text(40, 100, 30.0, 5_000, 1.0)),
        parse_engine_counters(text(52, 300, 130.0, 105_000, 21.0)),
    )
    assert fields["live_hop_first_token_mean_s"] == 0.125  # (32.5 - 7.5) s over 200 hops
    assert fields["encoded_windows"] == 12
    assert fields["live_hops"] == 200 and fields["live_hop_mean_s"] == 0.5
    assert fields["live_forced_mean_tokens"] == 500.0  # the hops' forced transcript
    assert fields["live_hop_wait_mean_s"] == 0.1  # their wait before submission
    assert "audio_commands" not in fields  # a server before session 16: no such fields


def test_draft_tokens_parsed_and_differenced() -> None:
    """The draft ids a point's requests carried and those accepted (each a decode step saved);
    none from a server without drafts."""

    def text(proposed: int, accepted: int) -> str:
        family = "livemeet_engine_draft_tokens_total"
        return metrics_text((10, 0, 5, 0), (900, 60)) + (
            f"# TYPE {family} counter\n"
            f'{family}{{outcome="proposed"}} {float(proposed)}\n'
            f'{family}{{outcome="accepted"}} {float(accepted)}\n'
        )

    fields = engine_fields(
        parse_engine_counters(text(100, 80)), parse_engine_counters(text(700, 530))
    )
    assert fields["draft_tokens"] == 600 and fields["accepted_draft_tokens"] == 450
    plain = engine_fields(parse_engine_counters(text(0, 0)), parse_engine_counters(text(0, 0)))
    assert "draft_tokens" not in plain


def test_audio_command_lag_parsed_and_differenced() -> None:
    """How long a point's audio appends waited for the engine worker: the mean over the point
    (differenced sums) and the longest since the worker started (a gauge, taken as it is)."""

    def text(commands: int, lag_s: float, lag_max_s: float) -> str:
        return with_samples(
            ("livemeet_engine_audio_commands_total", "counter", commands),
            ("livemeet_engine_audio_command_lag_seconds_total", "counter", lag_s),
            ("livemeet_engine_audio_command_lag_max_seconds", "gauge", lag_max_s),
        )

    fields = engine_fields(
        parse_engine_counters(text(1_000, 5.0, 0.5)), parse_engine_counters(text(5_000, 25.0, 0.75))
    )
    assert fields["audio_commands"] == 4_000
    assert fields["audio_lag_mean_s"] == 20.0 / 4_000
    assert fields["audio_lag_max_since_start_s"] == 0.75  # the gauge, not per point


def test_gc_pauses_and_endpoint_hops_parsed_and_differenced() -> None:
    """The engine process's garbage collections over a point: full ones and the time in all
    (differenced), the longest since the worker started (a gauge); the live hops due early at
    speech ends; none of them from older servers."""

    def text(young: int, full: int, pause_s: float, max_s: float) -> str:
        family = "livemeet_engine_gc_collections_total"
        return with_samples(
            ("livemeet_live_endpoint_hops_total", "counter", young // 10),
            ("livemeet_engine_gc_pause_seconds_total", "counter", pause_s),
            ("livemeet_engine_gc_pause_max_seconds", "gauge", max_s),
        ) + (
            f"# TYPE {family} counter\n"
            f'{family}{{generation="young"}} {float(young)}\n'
            f'{family}{{generation="full"}} {float(full)}\n'
        )

    fields = engine_fields(
        parse_engine_counters(text(100, 1, 0.25, 0.125)),
        parse_engine_counters(text(400, 4, 1.0, 0.25)),
    )
    assert fields["gc_full_collections"] == 3
    assert fields["live_endpoint_hops"] == 30  # hops due early at speech ends (VAD)
    assert fields["gc_pause_s"] == 0.75
    assert fields["gc_pause_max_since_start_s"] == 0.25
    older = engine_fields(parse_engine_counters(text(0, 0, 0.0, 0.0)),
                          parse_engine_counters(text(0, 0, 0.0, 0.0)))  # fmt: skip
    assert "gc_pause_s" not in older and "live_endpoint_hops" not in older


def test_no_engine_fields_without_counters_or_after_a_reset() -> None:
    gateway_only = "\n".join(metrics_text((0, 0, 0, 0), (0, 0)).splitlines()[:3]) + "\n"
    assert parse_engine_counters(gateway_only) is None
    counters = parse_engine_counters(metrics_text((50, 0, 5, 0), (9_000, 600)))
    assert engine_fields(None, counters) == engine_fields(counters, None) == {}
    restarted = parse_engine_counters(metrics_text((3, 0, 1, 0), (700, 40)))
    assert engine_fields(counters, restarted) == {}  # totals went down: a restarted worker


async def test_settled_counters_wait_until_two_scrapes_agree(
    aiohttp_server: Callable[[web.Application], Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    scrapes = [(1, 0, 1, 0), (4, 0, 1, 0), (9, 0, 1, 0), (9, 0, 1, 0), (12, 0, 1, 0)]
    served: list[int] = []

    async def metrics(request: web.Request) -> web.Response:
        steps = scrapes[min(len(served), len(scrapes) - 1)]
        served.append(1)
        return web.Response(text=metrics_text(steps, (0, 0)))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    monkeypatch.setattr(http_sweep, "STATS_POLL_S", 0.01)
    async with aiohttp.ClientSession() as session:
        url = str(server.make_url("")).rstrip("/")
        text = await settled_metrics(session, url, timeout_s=5.0)
        settled = None if text is None else parse_engine_counters(text)
        assert settled is not None and settled.steps["decode_graph"] == 9
        assert len(served) == 4  # stopped at the first repeat
        text = await settled_metrics(session, url, timeout_s=0.0)
        capped = None if text is None else parse_engine_counters(text)
        assert capped is not None and capped.steps["decode_graph"] == 12  # one scrape, no wait


def phase_text(sums: dict[str, float], counts: dict[str, int]) -> str:
    lines = ["# TYPE livemeet_upload_phase_seconds histogram"]
    for phase, total in sums.items():
        lines.append(f'livemeet_upload_phase_seconds_sum{{phase="{phase}"}} {total}')
        lines.append(f'livemeet_upload_phase_seconds_count{{phase="{phase}"}} {counts[phase]}.0')
    return "\n".join(lines) + "\n"


def test_upload_phase_means_over_a_point() -> None:
    from loadtest.http_sweep import parse_phases, phase_fields

    before = parse_phases(phase_text({"receive": 1.0, "transcribe": 4.0},
                                            {"receive": 10, "transcribe": 10}))  # fmt: skip
    after = parse_phases(phase_text({"receive": 1.5, "transcribe": 24.0},
                                           {"receive": 20, "transcribe": 20}))  # fmt: skip
    fields = phase_fields(before, after)
    assert fields == {"upload_phase_mean_s": {"receive": 0.05, "transcribe": 2.0}}
    assert parse_phases("# nothing here\n") is None
    assert phase_fields(None, after) == phase_fields(before, None) == {}
    assert phase_fields(after, after) == {}  # no request finished a phase


async def test_uploads_send_the_api_key_from_the_environment_where_set(
    aiohttp_server: Callable[[web.Application], Awaitable[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a server with API keys (`serve --auth keys`) every upload needs one."""
    seen: list[str | None] = []

    async def transcribe(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        await request.read()
        return web.json_response({"text": ""})

    app = web.Application()
    app.router.add_post(http_sweep.ENDPOINT, transcribe)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).rstrip("/")
    workload = http_sweep.wl.Workload("short", 1.0, 8)
    monkeypatch.setenv(http_sweep.API_KEY_ENV, "lm_test")
    result = await http_sweep.run_point(url, workload, 1, [b"RIFF"])
    monkeypatch.setenv(http_sweep.API_KEY_ENV, "")  # set but empty: none, as unset
    await http_sweep.run_point(url, workload, 1, [b"RIFF"])
    assert result.num_errors == 0 and seen == ["Bearer lm_test", None]
    monkeypatch.delenv(http_sweep.API_KEY_ENV)
    assert http_sweep.auth_headers() == {}
