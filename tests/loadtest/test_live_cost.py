"""The live cost model (loadtest/live_cost.py): prompt geometry, monotonic costs, capacity."""

from __future__ import annotations

import json

import pytest

from livemeet.audio.constants import SAMPLE_RATE, num_audio_tokens
from livemeet.engine.cost_model import StepCostModel
from livemeet.models.prompt import build_prompt, stable_prefix_len
from livemeet.models.tokenizer import load_tokenizer
from loadtest import live_cost as lc
from tests.loadtest.conftest import run_module


def test_suffix_tokens_is_the_default_prompts_suffix() -> None:
    assert build_prompt(load_tokenizer(None), 375).suffix_len == lc.SUFFIX_TOKENS


def test_window_edges_cover_one_window_at_every_hop() -> None:
    assert list(lc._window_edges(45.0, 1.0)) == [float(s) for s in range(31, 61)]
    assert list(lc._window_edges(30.4, 1.0))[-1] == 30.0  # a new window: the one before it
    assert list(lc._window_edges(60.0, 2.0)) == [float(s) for s in range(32, 62, 2)]
    assert list(lc._window_edges(0.3, 1.0)) == [float(s) for s in range(1, 31)]


def test_a_hops_prefill_is_what_follows_the_previous_hops_stable_prefix() -> None:
    """With the encoder, attention and decode priced at zero and 1 s per token, a hop costs
    exactly its prefill token count: the real prompt after the stable prefix of the hop one
    interval before (whose KV it forks, as MossCore does) plus F. Across a window boundary
    that is the whole window just completed; F is at most what the meeting produced."""
    step = StepCostModel(
        weights_read_s=0, step_overhead_s=0, per_token_s=1.0, attention_s_per_pair=0,
        kv_read_s_per_token=0,
    )  # fmt: skip
    model = lc.LiveCostModel(
        step=step, encoder_window_s=0.0, decode_tokens=0, accepted_draft_tokens=0
    )
    tokenizer = load_tokenizer(None)
    for edge_s, forced in ((47.0, 300), (60.5, 300), (10.0, 2_048)):
        tokens = num_audio_tokens(round(edge_s * SAMPLE_RATE))
        prev = num_audio_tokens(round((edge_s - 1.0) * SAMPLE_RATE))
        prompt = build_prompt(tokenizer, tokens)
        stable = stable_prefix_len(prev, prev // 375)
        kept = min(forced, int(lc.OUTPUT_TOKENS_PER_S * edge_s))
        assert model._prefill_s(edge_s, 1.0, forced) == len(prompt.ids) - stable + kept
    # 60.5 s: the previous hop (59.5 s) had one complete window; its stable prefix ends there
    assert model._prefill_s(60.5, 1.0, 0) > model._prefill_s(47.0, 1.0, 0)


def test_costs_grow_with_the_meeting_the_forced_transcript_and_the_hop_rate() -> None:
    model = lc.LiveCostModel()
    early, late = model.hop_s(60, 1.0, 512), model.hop_s(600, 1.0, 512)
    assert 0 < early < late < model.hop_s(600, 1.0, 2048)
    assert model.load(100, 600, 1.0, 512) == pytest.approx(100 * late)
    # half the hop interval: about twice the load (the same window, more hops)
    ratio = model.load(10, 600, 0.5, 512) / model.load(10, 600, 1.0, 512)
    assert 1.8 < ratio < 2.2
    for meeting_s in (60, 600, 1800):
        n = model.capacity(meeting_s, 1.0, 512)
        assert model.load(n, meeting_s, 1.0, 512) <= 1.0 < model.load(n + 1, meeting_s, 1.0, 512)
    assert model.latency_floor_p95(600, 2.0, 512) > 0.95 * 2.0 + lc.FRAME_S
    with pytest.raises(ValueError):
        model.hop_s(0, 1.0, 512)
    with pytest.raises(ValueError):
        model.hop_s(60, 1.0, -1)
    with pytest.raises(ValueError):
        model.hop_s(60, 31.0, 512)


def test_against_record_prices_each_bucket_of_a_bench_live_point() -> None:
    bucket = {
        "live_hops": 100,
        "live_forced_mean_tokens": 600.4,
        "engine_step_s": {"launch": 1.0, "wait": 2.0, "encode": 0.5, "schedule": 9.0},
    }
    drafted = {**bucket, "accepted_draft_tokens": 500}  # 5 per hop
    record = {
        "engine_by_time": {
            "60-90": bucket,
            "90-93": bucket,
            "93-123": {"live_hops": 0},
            "123-153": drafted,
        }
    }
    model = lc.LiveCostModel()
    row, later = lc.against_record(model, record, hop_s=1.0)
    assert row["bucket"] == "60-90" and row["forced"] == 600 and row["engine_s"] == 3.5
    plain = lc.LiveCostModel(accepted_draft_tokens=0)  # the bucket had no drafts
    assert row["accepted_draft"] == 0
    assert row["model_gpu_s"] == pytest.approx(100 * plain.hop_s(75.0, 1.0, 600), abs=0.01)
    five = lc.LiveCostModel(accepted_draft_tokens=5)
    assert later["accepted_draft"] == 5
    assert later["model_gpu_s"] == pytest.approx(100 * five.hop_s(138.0, 1.0, 600), abs=0.01)
    # a head start (bench_live --head-start-s 300 at 4x): the buckets are priced in meeting
    # time, 4x faster through the head's 75 s, then real time
    fast = {"head_start_s": 300.0, "head_speed": 4.0, "engine_by_time": {"0-30": bucket}}
    late = {**fast, "engine_by_time": {"75-105": bucket}}
    (head,) = lc.against_record(model, fast, hop_s=1.0)
    (after,) = lc.against_record(model, late, hop_s=1.0)
    assert head["model_gpu_s"] == pytest.approx(100 * plain.hop_s(60.0, 1.0, 600), abs=0.01)
    assert after["model_gpu_s"] == pytest.approx(100 * plain.hop_s(315.0, 1.0, 600), abs=0.01)


def test_cli_prints_the_table_and_a_records_buckets(tmp_path) -> None:  # noqa: ANN001
    record = tmp_path / "live.jsonl"
    bucket = {"live_hops": 10, "live_forced_mean_tokens": 100, "engine_step_s": {"wait": 1.0}}
    lines = [{"event": "server_ready"}, {"sessions": 4, "engine_by_time": {"0-30": bucket}}]
    record.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    proc = run_module(
        "loadtest.live_cost", "--forced", "512", "--hops", "0.5,1", "--minutes", "10",
        "--sessions", "64", "--record", str(record),
    )  # fmt: skip
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["hop_s"], r["minute"]) for r in rows[:2]] == [(0.5, 10.0), (1.0, 10.0)]
    assert rows[0]["load_at_64"] > rows[1]["load_at_64"] > 0
    assert rows[2]["sessions"] == 4 and rows[2]["bucket"] == "0-30" and rows[2]["engine_s"] == 1.0


def test_an_accepted_draft_trades_decode_rows_for_prefill_rows() -> None:
    """A ids of a hop's D verified in its prefill: A fewer decode rows (each reading the whole
    context's KV) and A more prefill rows, cheaper at 10 minutes; none accepted is the plain
    hop."""
    plain = lc.LiveCostModel(accepted_draft_tokens=0)
    drafted = lc.LiveCostModel(accepted_draft_tokens=7)
    assert drafted.hop_s(600, 1.0, 512) < plain.hop_s(600, 1.0, 512)
    step = plain.step
    rows_saved = 7 * step.decode_cost_s(8_000)
    saved = plain.hop_s(600, 1.0, 512) - drafted.hop_s(600, 1.0, 512)
    assert 0.5 * rows_saved < saved < rows_saved
    # never more accepted than the hop decodes after its first sample
    assert lc.LiveCostModel(accepted_draft_tokens=99).hop_s(600, 1.0, 512) == pytest.approx(
        lc.LiveCostModel(accepted_draft_tokens=lc.DECODE_TOKENS_PER_HOP - 1).hop_s(600, 1.0, 512)
    )
