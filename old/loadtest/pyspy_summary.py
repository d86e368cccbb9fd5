"""Where the wall time of a py-spy profile went: inclusive samples per function.

Reads py-spy's collapsed-stack output (`py-spy record --format raw`: one line per distinct
stack, frames root-first separated by ";", then a space and the sample count; with
`--subprocesses` the first frames name the processes, `process PID:"cmdline"`). Keeps the
stacks that contain every `--contains` substring, and prints, per function (name and file,
line numbers dropped), the share of those samples whose stack passes through it (inclusive)
and the share where it is the innermost frame (self), largest first. With `--idle` the
waiting threads are sampled too, so shares are of wall time per thread, not of CPU time.

Usage:
  python -m loadtest.pyspy_summary pyspy_http.txt --contains "Worker.serve" --top 40
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_LINE_NUMBER = re.compile(r":\d+\)$")  # "f (file.py:12)" -> "f (file.py)"


@dataclass(frozen=True)
class FrameShare:
    """One function's samples among the kept stacks."""

    frame: str
    inclusive: int
    self_samples: int


def parse_line(line: str) -> tuple[list[str], int] | None:
    """One collapsed-stack line -> (frames root-first, samples); None for a line that is not
    one (py-spy's messages, blank lines)."""
    stack, sep, count = line.rstrip("\n").rpartition(" ")
    if not sep or not count.isdigit() or not stack:
        return None
    return stack.split(";"), int(count)


def function_of(frame: str) -> str:
    """A frame without its line number, so one function's lines add up."""
    return _LINE_NUMBER.sub(")", frame)


def summarise(lines: Iterable[str], contains: Sequence[str] = ()) -> tuple[int, list[FrameShare]]:
    """(kept samples, per-function shares largest-inclusive first) over the stacks whose
    joined text contains every string of `contains`."""
    total = 0
    inclusive: Counter[str] = Counter()
    self_samples: Counter[str] = Counter()
    for line in lines:
        parsed = parse_line(line)
        if parsed is None:
            continue
        frames, n = parsed
        joined = ";".join(frames)
        if not all(c in joined for c in contains):
            continue
        total += n
        for name in {function_of(f) for f in frames}:
            inclusive[name] += n
        self_samples[function_of(frames[-1])] += n
    shares = [FrameShare(f, n, self_samples[f]) for f, n in inclusive.items()]
    shares.sort(key=lambda s: (-s.inclusive, s.frame))
    return total, shares


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile", type=Path, help="py-spy --format raw output")
    p.add_argument("--contains", action="append", default=[], help="keep stacks with this")
    p.add_argument("--top", type=int, default=40, help="functions to print")
    p.add_argument("--width", type=int, default=110, help="characters per function name")
    args = p.parse_args(argv)
    with args.profile.open(encoding="utf-8", errors="replace") as f:
        total, shares = summarise(f, args.contains)
    print(f"{total} samples kept (filter: {args.contains or 'none'})")
    if not total:
        return
    print(f"{'incl %':>7} {'self %':>7}  function")
    for s in shares[: args.top]:
        name = s.frame if len(s.frame) <= args.width else s.frame[: args.width - 3] + "..."
        print(f"{100 * s.inclusive / total:7.1f} {100 * s.self_samples / total:7.1f}  {name}")


if __name__ == "__main__":
    main()
