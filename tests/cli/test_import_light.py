"""`livemeet serve` must start on a box without the evaluation dependencies (scipy,
rapidfuzz): registering the CLI may not import them. Regression: the GPU benchmark's server
exited at start-up because `livemeet eval` registration imported rapidfuzz."""

from __future__ import annotations

import subprocess
import sys


def test_cli_registration_does_not_import_eval_dependencies() -> None:
    code = (
        "import sys\n"
        "from livemeet.__main__ import build_parser\n"
        "build_parser()\n"
        "heavy = [m for m in ('rapidfuzz', 'scipy', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
