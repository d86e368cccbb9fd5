"""The live hops' host-time tool (loadtest/live_host_cost.py) on a short meeting: every part
is timed over the hops asked for, drafts show in the steps per hop, and bad arguments are
refused."""

from __future__ import annotations

import json

import pytest

from loadtest import live_host_cost as lhc
from tests.loadtest.conftest import run_module


def test_every_part_is_timed_per_hop_and_per_step() -> None:
    drafted = lhc.measure(minute=0.75, hops=3, forced_tokens=512, draft=True)
    plain = lhc.measure(minute=0.75, hops=3, forced_tokens=512, draft=False)
    for record in (drafted, plain):
        assert set(record["ms_per_hop"]) == set(lhc.HOP_PARTS)
        assert set(record["ms_per_step"]) == set(lhc.STEP_PARTS)
        assert all(v > 0 for v in record["ms_per_hop"].values()), record
        assert all(v > 0 for v in record["ms_per_step"].values()), record
        assert record["tokens_per_hop"] >= 1
    # the same tokens come out; with drafts most of the open tail takes no decode step
    assert drafted["tokens_per_hop"] == plain["tokens_per_hop"]
    assert drafted["steps_per_hop"] < plain["steps_per_hop"]


def test_cli_prints_one_record_and_refuses_a_meeting_shorter_than_its_hops() -> None:
    proc = run_module("loadtest.live_host_cost", "--minute", "0.5", "--hops", "2")
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["hops"] == 2 and record["draft"] is True
    with pytest.raises(SystemExit):
        lhc.parse_args(["--minute", "0.1", "--hops", "20"])


def test_the_token_path_alone_is_timed_per_token() -> None:
    us = lhc.stream_us_per_token(repeats=1)
    assert 0 < us < 1_000


def test_the_prompt_alone_is_timed_per_hop_and_grows_with_the_meeting() -> None:
    """`--prompt`: a 30-minute hop's prompt holds 3x the pads of a 10-minute one."""
    early, late = lhc.prompt_us(1.0, 16, repeats=20), lhc.prompt_us(30.0, 16, repeats=20)
    assert 0 < early < late
    proc = run_module("loadtest.live_host_cost", "--prompt", "--minute", "2")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["prompt_us_per_hop"] > 0
