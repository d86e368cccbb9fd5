"""scripts/gpu_ab.sh labels each arm with the tree it ran."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a gpu_bench.sh stand-in: one log line per phase where gpu_ab.sh greps it
BENCH = '#!/usr/bin/env bash\necho "=== $1: rc=0 at t=1 s" > "$OUT/$1.log"\n'


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def _arm_line(repo: Path) -> str:
    done = subprocess.run(
        ["bash", "scripts/gpu_ab.sh", "profile"],
        cwd=repo,
        env={
            "PATH": "/usr/bin:/bin",
            "AB_ARMS": "new",
            "OUT": str(repo / "out"),
            "GPU_BENCH": str(repo / "bench.sh"),
        },  # fmt: skip
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return next(line for line in done.stdout.splitlines() if line.startswith("=== arm"))


def test_an_arm_on_files_that_differ_from_the_commit_says_so(tmp_path: Path) -> None:
    """A device copy may carry an older .git than its files (session 37's arms were labelled
    with the session's first commit): the label must not pass them off as that commit."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_ab.sh", repo / "scripts" / "gpu_ab.sh")
    bench = repo / "bench.sh"
    bench.write_text(BENCH)
    bench.chmod(bench.stat().st_mode | stat.S_IEXEC)
    (repo / ".gitignore").write_text("out/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    clean = _arm_line(repo)
    assert clean.startswith("=== arm 1: new (") and "local changes" not in clean
    (repo / "bench.sh").write_text(BENCH + "# changed\n")
    assert "with local changes" in _arm_line(repo)
