"""scripts/gpu_bench.sh's engine bench arguments, with a stand-in `python3` that records them
(no GPU, no torch: the script only builds command lines)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# each call's arguments, each ended by a unit separator, the call by a record separator (the
# preflight's `python3 -c` script spans lines and quotes)
STANDIN = """#!/usr/bin/env bash
{ printf '%s\\037' "$@"; printf '\\036'; } >> "$CALLS"
"""


def bench_engine_args(tmp_path: Path, phase: str, **env: str) -> list[str]:
    """The argv the phase's engine bench ran with (every other step skipped)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"
    python3.write_text(STANDIN)
    python3.chmod(0o755)
    calls = tmp_path / "calls.txt"
    limits = dict.fromkeys(("PYTEST_S", "ATTN_S", "HF_S", "PROFILE_S"), "0")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_bench.sh"), phase],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
             "OUT": str(tmp_path / "out"), **limits, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = [record.split("\x1f")[:-1] for record in calls.read_text().split("\x1e")[:-1]]
    return next(argv for argv in runs if argv[:2] == ["-m", "loadtest.bench_engine"])


@pytest.mark.parametrize("phase", ["engine", "http", "live"])
def test_a_failed_preflight_stops_the_run(tmp_path: Path, phase: str) -> None:
    """A module every phase imports missing (session 43: langcodes not in .whl) failed every
    step alike, and the call's time went on them: the run stops after the preflight."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"
    # the preflight (`python3 -c`) fails as a missing import does; any later call is recorded
    python3.write_text(STANDIN + '[ "$1" = -c ] && exit 1\nexit 0\n')
    python3.chmod(0o755)
    calls = tmp_path / "calls.txt"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_bench.sh"), phase],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
             "OUT": str(tmp_path / "out")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "preflight failed" in done.stdout
    runs = [record.split("\x1f")[:-1] for record in calls.read_text().split("\x1e")[:-1]]
    # (a `-m pip install` of a checkout's .whl may come first)
    assert [argv[0] for argv in runs if argv[:2] != ["-m", "pip"]] == ["-c"]


@pytest.mark.parametrize("phase", ["engine", "profile"])
def test_bench_workloads_picks_the_engine_benchs_workloads_in_both_phases(
    tmp_path: Path, phase: str
) -> None:
    """The engine phase ran short and long whatever BENCH_WORKLOADS said (session 38's call 9
    asked for the FP8 point alone and ran every bf16 point first)."""
    argv = bench_engine_args(tmp_path, phase, BENCH_WORKLOADS=" ", FP8_POINTS="long:16")
    assert argv[argv.index("--workloads") + 1] == " "
    assert argv[argv.index("--fp8") + 1] == "long:16"


def test_unset_the_engine_phase_runs_short_and_long(tmp_path: Path) -> None:
    argv = bench_engine_args(tmp_path, "engine")
    assert argv[argv.index("--workloads") + 1] == "short,long"
