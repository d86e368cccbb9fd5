"""`python -m livemeet` / `livemeet`: serve | transcribe | stream | eval | keys.

Each subcommand lives in its own module with `register(subparsers)`, which adds its parser and
sets `func(args) -> int` as the parser default.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from livemeet.cli.stop_signal import INTERRUPTED_STATUS, stop_signal_interrupts

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


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, except that an unknown option is reported by the subcommand
    that was given it, with its usage and the option it may have meant: argparse's own
    message came from the top-level parser (`livemeet: error: unrecognized arguments: --prot
    18401` under livemeet's usage, not serve's: a user trial). Exits 2 as argparse does."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = chosen_parser(parser, args)
        message = f"unrecognized arguments: {' '.join(unknown)}"
        options = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
        for arg in unknown:
            near = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.6)
            if arg.startswith("-") and near:
                message += f" (did you mean {near[0]}?)"
                break
        command.error(message)
    return args


def chosen_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The parser of the innermost subcommand `args` chose (`keys create`'s for `livemeet keys
    create ...`), else `parser` itself."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if not subs or chosen not in subs[0].choices:
            return parser
        parser = subs[0].choices[chosen]


BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE, what a shell reports for a writer cut off by `head`


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand `argv` names (default: sys.argv[1:]); returns its exit status,
    BROKEN_PIPE_STATUS (141) when stdout's reader went away, or INTERRUPTED_STATUS (130) for
    SIGTERM or SIGINT before the subcommand began. Bad arguments raise SystemExit (status 2,
    argparse's)."""
    try:
        with stop_signal_interrupts():  # the subcommands' imports: ~0.5 s of `serve`'s start
            args = parse_args(build_parser(), argv)
    except KeyboardInterrupt:
        print("livemeet: stopped by a signal before it began", file=sys.stderr)
        return INTERRUPTED_STATUS
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly. stdout is pointed at devnull so the
        # interpreter's final flush does not raise the same error again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_STATUS


if __name__ == "__main__":
    sys.exit(main())
