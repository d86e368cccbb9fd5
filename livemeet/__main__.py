"""`python -m livemeet` / `livemeet`: serve | transcribe | stream | eval | keys.

Each subcommand lives in its own module with `register(subparsers)`, which adds its parser and
sets `func(args) -> int` as the parser default.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from importlib.metadata import PackageNotFoundError, version

SUBCOMMAND_MODULES = (
    "livemeet.cli.serve",
    "livemeet.cli.transcribe",
    "livemeet.cli.stream",
    "livemeet.eval.cli",
    "livemeet.cli.keys",
)


DESCRIPTION = (
    "livemeet: speaker-labelled, timestamped meeting transcripts. `serve` runs the "
    "OpenAI-compatible upload API and the live WebSocket; `transcribe` works offline on files; "
    "`stream` sends a file to a running server as a live session; `eval` scores a transcript; "
    "`keys` makes and revokes the server's API keys."
)


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, by pip); a source tree run
    without installing it has none."""
    try:
        return version("livemeet")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="livemeet", description=DESCRIPTION)
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help="print livemeet's version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # subcommand not built yet
        module.register(sub)
    return parser


BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE, what a shell reports for a writer cut off by `head`


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand `argv` names (default: sys.argv[1:]); returns its exit status, or
    BROKEN_PIPE_STATUS (141) when stdout's reader went away. Bad arguments raise SystemExit
    (status 2, argparse's)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly. stdout is pointed at devnull so the
        # interpreter's final flush does not raise the same error again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_STATUS


if __name__ == "__main__":
    sys.exit(main())
