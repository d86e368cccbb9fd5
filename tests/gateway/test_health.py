"""/healthz, /readyz, /metrics and the static page."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from livemeet.backends import BACKENDS
from livemeet.backends.scripted import ScriptedCore
from livemeet.config import ModelConfig, ServerConfig
from livemeet.engine.messages import EngineStats
from livemeet.gateway.app import create_app
from livemeet.gateway.engine_client import EngineClient
from livemeet.gateway.keys import LIFECYCLE_KEY
from livemeet.transcriber import Event
from tests.gateway.conftest import ClientFactory, pcm16, wav_bytes
from tests.gateway.fakes import FakeTranscriber, SlottedFake
from tests.gateway.test_live_resume import detached_session, resume_start
from tests.gateway.test_openai_api import form
from tests.gateway.test_ws_live import receive_all, start_session


async def test_health_and_ready(client: TestClient) -> None:
    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    assert ready.status == 200
    body = await ready.json()
    assert body["status"] == "ready" and body["demo"] is True
    client.app[LIFECYCLE_KEY].draining = True
    assert (await client.get("/readyz")).status == 503


async def test_a_full_server_is_ready_unless_the_probe_asks_for_capacity(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """Every --max-sessions slot in use: /readyz stays 200 (the server still serves its
    meetings' resumes, captions and transcripts, which a load balancer would send elsewhere)
    and says it is full; `?capacity=1`, for a dispatcher of new sessions, is then 503."""
    fake = SlottedFake(free_slots=0)
    client = await aiohttp_client(create_app(server_config, fake))
    ready = await client.get("/readyz")
    body = await ready.json()
    assert ready.status == 200 and body["status"] == "ready"
    assert body["full"] is True and body["free_slots"] == 0
    assert body["max_sessions"] == server_config.gateway.max_sessions
    strict = await client.get("/readyz?capacity=1")
    assert strict.status == 503 and (await strict.json())["status"] == "unavailable"
    fake.free_slots = 1
    strict = await client.get("/readyz?capacity=1")
    assert strict.status == 200 and (await strict.json())["full"] is False
    assert (await client.get("/readyz?capacity=0")).status == 200
    refused = await client.get("/readyz?capacity=yes")
    assert refused.status == 400
    assert (await refused.json())["error"]["param"] == "capacity"


async def test_healthz_fails_once_the_engine_is_gone_for_good(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    """/healthz said 200 forever after the engine died (found by a trial): a supervisor never
    replaced the process. While the engine restarts it is only not ready."""
    fake = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, fake))
    fake._ready = False  # restarting
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 503
    fake.gone_for_good = True
    health = await client.get("/healthz")
    assert health.status == 503
    assert await health.json() == {"status": "failed", "reason": "engine_failed"}


async def test_transcriber_started_and_closed(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    fake = FakeTranscriber()
    client = await aiohttp_client(create_app(server_config, fake))
    assert fake.num_started == 1 and fake.num_closed == 0
    await client.close()
    assert fake.num_closed == 1


async def test_metrics_count_requests_errors_audio_and_demo(client: TestClient) -> None:
    await client.post("/v1/audio/transcriptions", data=form(wav_bytes(2.0)))
    await client.post("/v1/audio/transcriptions", data=form(b"garbage" * 100))
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_str("{bad")
        async for _ in ws:
            pass
    text = await (await client.get("/metrics")).text()
    assert 'livemeet_requests_total{endpoint="transcriptions",status="200"} 1.0' in text
    assert 'livemeet_requests_total{endpoint="transcriptions",status="400"} 1.0' in text
    assert 'livemeet_errors_total{code="bad_audio"} 1.0' in text
    assert 'livemeet_errors_total{code="invalid_request"} 1.0' in text
    assert 'livemeet_audio_received_seconds_total{kind="upload"} 2.0' in text
    assert "livemeet_demo_backend 1.0" in text
    assert 'livemeet_sessions_ended_total{kind="live",outcome="invalid_request"} 1.0' in text
    # an upload ends as a session once it has one: the garbage never got that far
    assert 'livemeet_sessions_ended_total{kind="upload",outcome="completed"} 1.0' in text
    assert 'kind="upload",outcome="bad_audio"' not in text
    # the good upload went through every phase once; the garbage one stopped at decode
    for phase, n in (("receive", 2), ("decode", 1), ("transcribe", 1), ("respond", 1)):
        assert f'livemeet_upload_phase_seconds_count{{phase="{phase}"}} {n}.0' in text


async def test_the_exposition_parses_and_keeps_prometheus_naming_after_a_scripted_load(
    client: TestClient, fake: FakeTranscriber
) -> None:
    """/metrics as Prometheus reads it (prometheus_client's own parser), after uploads that
    pass and fail, a live session that completes, one that drops and is resumed, and a
    refused resume: counters end in _total, times in _seconds, sizes in _bytes, every family
    has help, labels are from bounded sets (no session id), every error code is exported
    from the start (a rate() needs the series), and the gateway process's own metrics are
    there (process_start_time_seconds: a restart; the registry is the app's, so they were
    missing)."""
    before = _samples(await (await client.get("/metrics")).text())
    for code in ("storage_failed", "engine_unavailable", "bad_audio", "internal_error"):
        assert before[("livemeet_errors_total", (("code", code),))] == 0
    assert before[("process_start_time_seconds", ())] > 0
    assert ("process_resident_memory_bytes", ()) in before
    await client.post("/v1/audio/transcriptions", data=form(wav_bytes(2.0)))
    await client.post("/v1/audio/transcriptions", data=form(b"garbage" * 100))
    async with client.ws_connect("/v1/live") as ws:
        await start_session(ws)
        await ws.send_bytes(pcm16(1.0))
        await ws.send_json({"type": "end"})
        await receive_all(ws)
    ready, _ = await detached_session(client, fake, 1.0)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start(ready))
        assert (await ws.receive_json())["resumed"] is True
        await ws.send_json({"type": "end"})
        await receive_all(ws)
    async with client.ws_connect("/v1/live") as ws:
        await ws.send_json(resume_start({**ready, "session_id": "gone"}))
        await receive_all(ws)
    text = await (await client.get("/metrics")).text()
    after = _samples(text)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("livemeet_sessions_ended_total", kind="upload", outcome="completed") == 1
    assert moved("livemeet_errors_total", code="bad_audio") == 1
    assert moved("livemeet_audio_received_seconds_total", kind="live") == 2.0
    assert moved("livemeet_sessions_ended_total", kind="live", outcome="completed") == 2
    assert moved("livemeet_sessions_ended_total", kind="live", outcome="detached") == 1
    assert moved("livemeet_live_resumes_total", result="resumed") == 1
    assert moved("livemeet_live_resumes_total", result="not_found") == 1
    assert moved("livemeet_errors_total", code="not_found") == 1
    assert after[("livemeet_live_sessions_detached", ())] == 0
    for state in ("connecting", "streaming", "ending"):
        assert after[("livemeet_sessions", (("kind", "live"), ("state", state)))] == 0
    for family in text_string_to_metric_families(text):
        assert family.documentation, family.name
        unit_words = family.name.split("_")
        assert not {"ms", "milliseconds", "mb", "mib", "kb"} & set(unit_words), family.name
        # the unit ends the name, before a counter's _total (livemeet_audio_seconds_in_total
        # did not: a review)
        for unit in {"seconds", "bytes"} & set(unit_words):
            assert family.name.endswith(f"_{unit}"), family.name
        for sample in family.samples:
            # no creation-time samples: they doubled every counter's lines (a review)
            assert not sample.name.endswith("_created"), sample.name
            if family.type == "counter":
                assert sample.name.endswith("_total"), sample.name
            for label, value in sample.labels.items():
                assert label not in ("session_id", "id", "session", "path"), sample
                assert ready["session_id"] not in value, sample


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_two_apps_have_separate_registries(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    a = await aiohttp_client(create_app(server_config, FakeTranscriber(demo=False)))
    other_dir = replace(server_config, data_dir=server_config.data_dir / "b")  # one per dir
    b = await aiohttp_client(create_app(other_dir, FakeTranscriber()))
    assert "livemeet_demo_backend 0.0" in await (await a.get("/metrics")).text()
    assert "livemeet_demo_backend 1.0" in await (await b.get("/metrics")).text()


async def test_web_page_is_served(client: TestClient) -> None:
    page = await client.get("/")
    assert page.status == 200 and page.content_type == "text/html"
    assert "recorder.js" in await page.text()
    for name in ("recorder.js", "pcm-worklet.js"):
        resp = await client.get(f"/{name}")
        assert resp.status == 200 and "javascript" in resp.content_type


class StatsTranscriber(FakeTranscriber):
    """A FakeTranscriber that reports engine counters, as EngineClient does."""

    def __init__(self, stats: EngineStats | None) -> None:
        super().__init__(demo=False)
        self.engine_stats = stats


async def test_metrics_export_the_engine_counters(
    aiohttp_client: ClientFactory, server_config: ServerConfig
) -> None:
    fake = StatsTranscriber(None)
    client = await aiohttp_client(create_app(server_config, fake))
    assert "livemeet_engine" not in await (await client.get("/metrics")).text()  # no report yet
    fake.engine_stats = EngineStats(
        num_decode_graph_steps=900,
        num_decode_eager_steps=12,
        num_prefill_graph_steps=40,
        num_prefill_eager_steps=3,
        num_decode_graph_fallbacks=12,
        num_prefill_tokens=51_200,
        num_decode_tokens=7_000,
        num_slow_steps=2,
        schedule_s=0.5,
        encode_s=2.25,
        launch_s=1.5,
        wait_s=4.0,
        other_s=0.75,
        num_encoded_windows=77,
        num_live_hops=30,
        live_hop_s=12.5,
        live_forced_tokens=9_000,
        num_upload_continuations=3,
        live_hop_wait_s=4.5,
        live_hop_first_token_s=3.25,
        num_audio_commands=4_000,
        audio_command_lag_s=20.5,
        audio_command_lag_max_s=0.25,
        num_draft_tokens=600,
        num_accepted_draft_tokens=450,
        num_live_endpoint_hops=7,
        num_gc_collections=40,
        num_gc_full_collections=3,
        gc_pause_s=0.5,
        gc_pause_max_s=0.125,
        num_preemptions=5,
        num_retained_evictions=2,
        kv_blocks_total=1_000,
        kv_blocks_used=640,
        num_running_requests=17,
        num_waiting_requests=4,
        num_retained_requests=9,
    )
    text = await (await client.get("/metrics")).text()
    assert "# TYPE livemeet_engine_steps_total counter" in text
    assert 'livemeet_engine_steps_total{kind="decode_graph"} 900.0' in text
    assert 'livemeet_engine_steps_total{kind="decode_eager"} 12.0' in text
    assert 'livemeet_engine_steps_total{kind="prefill_graph"} 40.0' in text
    assert 'livemeet_engine_steps_total{kind="prefill_eager"} 3.0' in text
    assert 'livemeet_engine_tokens_total{phase="prefill"} 51200.0' in text
    assert 'livemeet_engine_tokens_total{phase="decode"} 7000.0' in text
    assert "livemeet_engine_decode_graph_fallbacks_total 12.0" in text
    assert "# TYPE livemeet_engine_step_seconds_total counter" in text
    for part, value in (
        ("schedule", 0.5),
        ("encode", 2.25),
        ("launch", 1.5),
        ("wait", 4.0),
        ("other", 0.75),
    ):
        assert f'livemeet_engine_step_seconds_total{{part="{part}"}} {value}' in text
    assert "livemeet_engine_slow_steps_total 2.0" in text
    assert "livemeet_engine_encoded_windows_total 77.0" in text
    assert "livemeet_live_hops_total 30.0" in text
    assert "livemeet_live_hop_seconds_total 12.5" in text
    assert "livemeet_live_forced_tokens_total 9000.0" in text
    assert "livemeet_upload_continuations_total 3.0" in text
    assert 'livemeet_engine_draft_tokens_total{outcome="proposed"} 600.0' in text
    assert 'livemeet_engine_draft_tokens_total{outcome="accepted"} 450.0' in text
    assert "livemeet_live_hop_wait_seconds_total 4.5" in text
    assert "livemeet_live_hop_first_token_seconds_total 3.25" in text
    assert "livemeet_engine_audio_commands_total 4000.0" in text
    assert "livemeet_engine_audio_command_lag_seconds_total 20.5" in text
    assert "# TYPE livemeet_engine_audio_command_lag_max_seconds gauge" in text
    assert "livemeet_engine_audio_command_lag_max_seconds 0.25" in text
    assert "livemeet_live_endpoint_hops_total 7.0" in text
    assert 'livemeet_engine_gc_collections_total{generation="young"} 37.0' in text
    assert 'livemeet_engine_gc_collections_total{generation="full"} 3.0' in text
    assert "livemeet_engine_gc_pause_seconds_total 0.5" in text
    assert "# TYPE livemeet_engine_gc_pause_max_seconds gauge" in text
    assert "livemeet_engine_gc_pause_max_seconds 0.125" in text
    assert "livemeet_engine_preemptions_total 5.0" in text
    assert "livemeet_engine_retained_evictions_total 2.0" in text
    assert "# TYPE livemeet_engine_kv_blocks gauge" in text
    assert 'livemeet_engine_kv_blocks{state="used"} 640.0' in text
    assert 'livemeet_engine_kv_blocks{state="free"} 360.0' in text
    assert "# TYPE livemeet_engine_requests gauge" in text
    for state, value in (("running", 17), ("waiting", 4), ("retained", 9)):
        assert f'livemeet_engine_requests{{state="{state}"}} {value:.1f}' in text
    # every exported metric is in protocol.md (three were not: a trial)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    exported = set(re.findall(r"^# TYPE (livemeet_\w+) (\w+)", text, re.M))
    assert len(exported) >= 25
    for name, kind in exported:
        counted = kind == "counter" and not name.endswith("_total")
        shown = f"{name}_total" if counted else name
        assert shown in doc, shown


async def test_transcriber_without_engine_counters_exports_none(client: TestClient) -> None:
    text = await (await client.get("/metrics")).text()
    assert "livemeet_requests" in text and "livemeet_engine" not in text


class SteppedCore(ScriptedCore):
    """The scripted backend reporting each of its steps as an eager decode step of 2 tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.num_steps = 0

    def step(self) -> list[tuple[str, Event]]:
        self.num_steps += 1
        return super().step()

    def stats(self) -> EngineStats | None:
        return EngineStats(
            num_decode_eager_steps=self.num_steps, num_decode_tokens=2 * self.num_steps
        )


async def metrics_line_until(client: TestClient, line: str, timeout_s: float = 10.0) -> str:
    """The /metrics text once it contains `line` (the worker reports asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = await (await client.get("/metrics")).text()
        if line in text or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.02)


async def test_worker_counters_reach_metrics_through_the_engine_client(
    aiohttp_client: ClientFactory, server_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores: list[SteppedCore] = []

    def factory(config: ModelConfig) -> SteppedCore:
        cores.append(SteppedCore())
        return cores[-1]

    monkeypatch.setitem(BACKENDS, "stepped", factory)
    engine = EngineClient(ModelConfig(backend="stepped"), in_process=True)
    client = await aiohttp_client(create_app(server_config, engine))
    zero = 'livemeet_engine_steps_total{kind="decode_eager"} 0.0'
    assert zero in await metrics_line_until(client, zero)  # posted once idle at start
    resp = await client.post("/v1/audio/transcriptions", data=form(wav_bytes(3.0)))
    assert resp.status == 200
    steps = cores[0].num_steps
    assert steps > 0
    # the worker went idle after the upload's last step: its exact totals follow
    text = await metrics_line_until(
        client, f'livemeet_engine_steps_total{{kind="decode_eager"}} {steps:.1f}'
    )
    assert f'livemeet_engine_steps_total{{kind="decode_eager"}} {steps:.1f}' in text
    assert f'livemeet_engine_tokens_total{{phase="decode"}} {2 * steps:.1f}' in text
    stats = engine.engine_stats
    assert stats is not None
    # the upload's one append carried its send time: the worker timed its wait in the queue
    assert stats.num_audio_commands == 1
    assert 0 <= stats.audio_command_lag_s == stats.audio_command_lag_max_s < 60
    # the worker (a thread here) times the process's garbage collections, whatever ran them
    assert 0 <= stats.num_gc_full_collections <= stats.num_gc_collections
    assert stats.gc_pause_max_s <= stats.gc_pause_s
    assert stats == EngineStats(
        num_decode_eager_steps=steps,
        num_decode_tokens=2 * steps,
        num_audio_commands=1,
        audio_command_lag_s=stats.audio_command_lag_s,
        audio_command_lag_max_s=stats.audio_command_lag_max_s,
        num_gc_collections=stats.num_gc_collections,
        num_gc_full_collections=stats.num_gc_full_collections,
        gc_pause_s=stats.gc_pause_s,
        gc_pause_max_s=stats.gc_pause_max_s,
    )
    assert "livemeet_engine_audio_commands_total 1.0" in text


async def test_the_pages_files_are_counted_by_name(client: TestClient) -> None:
    """The recorder's scripts are counted under the page's endpoint label, not "unmatched"
    (found by a user trial), which stays for paths no route serves. The label is not taken
    from the file name: a stray file (an editor's backup) must not stop the server starting."""
    assert (await client.get("/recorder.js")).status == 200
    assert (await client.get("/nowhere")).status == 404
    text = await (await client.get("/metrics")).text()
    assert 'livemeet_requests_total{endpoint="web",status="200"} 1.0' in text
    assert 'livemeet_requests_total{endpoint="unmatched",status="404"} 1.0' in text
