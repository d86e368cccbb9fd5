"""scripts/gpu_next.sh picks the next device session's run by the card the call got."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# a gpu_bench.sh stand-in: prints its phase and the settings that tell the runs apart
BENCH = """#!/usr/bin/env bash
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  # gpu_ab.sh prints an arm's "passed" lines: the settings that tell its runs apart
  echo "stand-in $1: 1 passed ${BENCH_S:-}/${BENCH_WORKLOADS:-}/${LONG_C:-}/${FP8_POINTS:-}/\
${ASSUMED_RATE:-}" > "$OUT/$1.log"
  # a profile's decode row, which gpu_ab.sh prints too, with the step limits that shape it
  if [ "$1" = profile ]; then
    echo "batch  16 context  36000: limits ${PROFILE_S:-}/${PROFILE_FP8_S:-}/${BENCH_S:-}" \
      >> "$OUT/$1.log"
  fi
fi
if [ -n "${STANDIN_BUDGET:-}" ]; then
  echo "$1 ${BENCH_S:-} ${LONG_C:-} ${FP8_POINTS:-} ${ASSUMED_RATE:-}"
  exit 0
fi
echo "phase=$1 sessions=${LIVE_SESSIONS:-} uploads=${LIVE_UPLOADS:-} \
duration=${LIVE_DURATION_S:-} http=${HTTP_SHORT_C:-}/${HTTP_LONG_C:-} fp8=${FP8_POINTS:-}\
 pause=${LIVE_HEAD_PAUSE_S:-} extra=${SERVE_EXTRA:-}"
echo "$1 fused_qk=${LIVEMEET_FUSED_QK:-default}" >&2
if [ "$1" = profile ]; then echo "=== pytest-gpu: rc=${STANDIN_PYTEST_RC:-0} at t=1 s"; fi
"""
LONG_AUDIO_S = 2240.0  # loadtest/workloads.py: a long meeting; a point at c runs c of them
BENCH_MARGIN_S = 30  # gpu_bench.sh gives bench_engine --max-seconds BENCH_S - 30


def run(tmp_path: Path, card: str, call: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/usr/bin/env bash\necho '{card}'\n")
    bench = tmp_path / "bench.sh"
    bench.write_text(BENCH)
    for f in (smi, bench):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    # the caller's gpu_bench.sh settings would pass through to the stand-in: not ours to test
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LIVE_", "HTTP_", "FP8_", "SERVE_EXTRA"))
    }
    env = {
        k: v
        for k, v in env.items()
        if k not in ("BENCH_S", "LONG_C", "ASSUMED_RATE", "LIVEMEET_FUSED_QK")
    }
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", GPU_BENCH=str(bench), **extra_env)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_next.sh"), call],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("card", "call", "expected"),
    [
        (
            "NVIDIA H200",
            "1",
            "phase=live sessions=32 uploads=0 duration=1800 http=/ fp8= pause=75 extra=",
        ),
        (
            "NVIDIA H200",
            "2",
            "phase=http sessions= uploads= duration= http=/1 fp8= pause= extra=",
        ),
        (
            "NVIDIA H200",
            "3",
            "phase=live sessions=100 uploads=0 duration=600 http=/ fp8= pause= extra=",
        ),
        (
            "NVIDIA H100 80GB HBM3",
            "1",
            "phase=http sessions= uploads= duration= http=1,4,64/4 fp8= pause= extra=",
        ),
        (
            "NVIDIA H100 80GB HBM3",
            "2",
            "phase=live sessions=64 uploads=2 duration=600 http=/ fp8= pause= "
            "extra=--upload-min-share 0.1",
        ),
        (
            "NVIDIA H100 80GB HBM3",
            "3",
            "phase=engine sessions= uploads= duration= http=/ fp8=long:1 pause= extra=",
        ),
    ],
)
def test_each_card_gets_its_run(tmp_path: Path, card: str, call: str, expected: str) -> None:
    done = run(tmp_path, card, call)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == expected
    assert card in done.stdout.splitlines()[0]


def test_the_h200_throughput_call_runs_the_engine_then_http(tmp_path: Path) -> None:
    lines = run(tmp_path, "NVIDIA H200", "2").stdout.splitlines()
    assert lines[1:] == [
        "phase=engine sessions= uploads= duration= http=/ fp8=long:16 pause= extra=",
        "phase=http sessions= uploads= duration= http=/1 fp8= pause= extra=",
    ]


@pytest.mark.parametrize(
    ("card", "throughput"),
    [("NVIDIA H200", ["engine", "http"]), ("NVIDIA H100 80GB HBM3", ["engine"])],
)
@pytest.mark.parametrize(("tests_rc", "fused"), [("0", "default"), ("1", "0")])
def test_call_4_runs_the_throughput_call_with_the_fused_prologue_off_only_if_its_tests_fail(
    tmp_path: Path, card: str, throughput: list[str], tests_rc: str, fused: str
) -> None:
    out = tmp_path / "out"
    done = run(tmp_path, card, "4", OUT=str(out), STANDIN_PYTEST_RC=tests_rc)
    assert done.returncode == 0, done.stderr
    assert "profile fused_qk=default" in done.stdout  # the tests, teed, with the default
    assert [line for line in done.stderr.splitlines() if "fused_qk=" in line] == [
        f"{phase} fused_qk={fused}" for phase in throughput
    ]
    shown = "auto" if fused == "default" else "0"
    assert f"=== LIVEMEET_FUSED_QK={shown} for the throughput run" in done.stdout
    assert (out / "tests" / "gpu_tests.log").is_file()


@pytest.mark.parametrize("card", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_call_5_runs_the_head_tests_then_the_arms(tmp_path: Path, card: str) -> None:
    out = tmp_path / "out"
    done = run(tmp_path, card, "5", OUT=str(out), AB_ARMS="new new")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # the tests' run first (its output tailed), then one engine run per arm into its folder
    assert lines[1] == "phase=engine sessions= uploads= duration= http=/ fp8= pause= extra="
    assert [line for line in lines if line.startswith("=== arm")] == [
        f"=== arm {i}: new ({label})" for i, label in ((1, _label()), (2, _label()))
    ]
    assert (out / "tests" / "engine.log").is_file()
    assert (out / "1_new" / "engine.log").is_file() and (out / "2_new" / "engine.log").is_file()


def run_with_old_tree(
    tmp_path: Path, call: str, out: Path, card: str = "NVIDIA H200"
) -> subprocess.CompletedProcess[str]:
    """gpu_next.sh `call` on `card` with its results under `out`, the old arm's tree
    (AB_OLD abc1234) an empty stand-in folder; asserts that it succeeded."""
    old = tmp_path / "old"
    (old / "scripts").mkdir(parents=True)
    done = run(tmp_path, card, call, OUT=str(out), AB_OLD="abc1234", AB_OLD_DIR=str(old))
    assert done.returncode == 0, done.stderr
    return done


def test_call_6_runs_the_engine_then_the_old_arm_on_an_h200(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_with_old_tree(tmp_path, "6", out)
    lines = done.stdout.splitlines()
    assert lines[1] == "phase=engine sessions= uploads= duration= http=/ fp8=long:16 pause= extra="
    assert "=== arm 1: old (abc1234)" in lines
    assert (out / "1_old" / "engine.log").is_file()  # the stand-in ran in the old tree's arm
    assert lines[-2:] == [  # then the decode step's kernels, into a folder of their own
        "phase=profile sessions= uploads= duration= http=/ fp8= pause= extra=",
        "=== pytest-gpu: rc=0 at t=1 s",
    ]
    assert (out / "profile" / "profile.log").is_file()


@pytest.mark.parametrize(
    ("card", "budget_s", "rate"), [("NVIDIA H200", 330, 250), ("NVIDIA H100 80GB HBM3", 400, 200)]
)
def test_call_7_runs_fp8_long_c16_on_the_old_tree_then_the_new(
    tmp_path: Path, card: str, budget_s: int, rate: int
) -> None:
    out = tmp_path / "out"
    done = run_with_old_tree(tmp_path, "7", out, card)
    lines = done.stdout.splitlines()
    arms = [line for line in lines if line.startswith("=== arm ")]
    assert arms == ["=== arm 1: old (abc1234)", f"=== arm 2: new ({_label()})"]
    # each arm runs FP8 long c16 alone, its 16 meetings within half the budget at the rate
    assert [line for line in lines if "passed" in line] == [
        f"stand-in engine: 1 passed {budget_s}/ / /long:16/{rate}"
    ] * 2
    assert 16 * LONG_AUDIO_S / rate <= (budget_s - BENCH_MARGIN_S) / 2
    assert (out / "1_old" / "engine.log").is_file() and (out / "2_new" / "engine.log").is_file()


@pytest.mark.parametrize("card", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_call_8_profiles_the_fp8_16x36k_step_on_both_trees_twice(tmp_path: Path, card: str) -> None:
    """Call 7's question (the head's 16-row path, or the loan) for a fraction of its device
    time: the FP8 decode step alone, alternating trees; each arm's decode row is printed."""
    out = tmp_path / "out"
    done = run_with_old_tree(tmp_path, "8", out, card)
    lines = done.stdout.splitlines()
    new = f"new ({_label()})"
    assert [line for line in lines if line.startswith("=== arm ")] == [
        f"=== arm {i}: {arm}" for i, arm in enumerate(["old (abc1234)", new] * 2, start=1)
    ]
    # the FP8 step's profile alone: no bf16 profile, no engine run, no GPU tests
    assert [line for line in lines if line.startswith("batch ")] == [
        "batch  16 context  36000: limits 0/80/0"
    ] * 4
    for arm in ("1_old", "2_new", "3_old", "4_new"):
        assert (out / arm / "profile.log").is_file()


def _label() -> str:
    """gpu_ab.sh's label for the working tree's arm."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT).returncode
    return f"{head} with local changes" if dirty else head


def test_no_run_for_another_card_or_call_or_no_card(tmp_path: Path) -> None:
    for card, call in (
        ("NVIDIA A100-SXM4-80GB", "1"),
        ("NVIDIA H200", "9"),
        ("NVIDIA H100 80GB HBM3", "9"),
        ("NVIDIA H100 80GB HBM3", "6"),
    ):
        done = run(tmp_path, card, call)
        assert done.returncode == 2 and "no run planned" in done.stderr
    done = run(tmp_path, "", "1")
    assert done.returncode == 2 and "found no GPU" in done.stderr


@pytest.mark.parametrize("card", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
@pytest.mark.parametrize("call", ["1", "2", "3", "6"])
def test_every_planned_engine_point_fits_its_budget_at_the_assumed_rate(
    tmp_path: Path, card: str, call: str
) -> None:
    """bench_engine skips a long point its budget estimates past --max-seconds, at
    ASSUMED_RATE for a point not measured yet: at the default 100 audio-s/s session 33's FP8
    long c16 (16 meetings) was estimated at 358 s of 300 and never ran. Each planned long
    point must fit in half its run's budget at the rate the run assumes (the rest is the
    decode table, short points and start-up)."""
    out = str(tmp_path / "out")  # call 6's profile writes under OUT (default: the checkout)
    for line in run(tmp_path, card, call, STANDIN_BUDGET="1", OUT=out).stdout.splitlines()[1:]:
        phase, *fields = line.split(" ")
        if phase != "engine":
            continue
        bench_s, long_c, fp8, rate = fields
        concurrencies = [int(c) for c in long_c.split(",") if c]
        concurrencies += [int(p.split(":")[1]) for p in fp8.split(",") if p.startswith("long:")]
        for c in concurrencies:
            estimate_s = c * LONG_AUDIO_S / float(rate or 100)
            assert estimate_s <= (int(bench_s) - BENCH_MARGIN_S) / 2, (card, call, c, rate)
