"""`python -m livemeet` / `livemeet`: serve | transcribe | stream | eval.

Each subcommand lives in its own module with `register(subparsers)`, which adds its parser and
sets `func(args) -> int` as the parser default.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = (
    "livemeet.cli.serve",
    "livemeet.cli.transcribe",
    "livemeet.cli.stream",
    "livemeet.eval.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="livemeet", description=__doc__)
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
