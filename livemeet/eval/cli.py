"""`livemeet eval`: score a hypothesis transcript against a reference.

    livemeet eval --ref REF --hyp HYP [--ref-format F] [--hyp-format F] [--uem UEM]
                  [--collar 0.25] [--skip-overlap]
                  [--metric cer|wer|cpcer|cpwer|delta|der|orccer|orcwer|all]
                  [--normalize default|none] [--json]

Formats: STM, RTTM, CTM, SegLST (JSON), a Kaldi `text` file (`utterance-id word...`: untimed,
no speakers, text metrics only), livemeet's JSON transcripts (json, verbose_json,
diarized_json), SRT and WebVTT captions (speakers from `<v S01>` or an `S01: ` prefix, as
livemeet writes them) and its text output (.txt). Each file's is detected from its
extension (.stm .rttm .ctm .srt .vtt), a Kaldi name (`text`, `text.ref`, `text_ref`,
`ref.text`) or its content (JSON, captions, and a first line that reads as STM, RTTM or CTM),
unless --ref-format or --hyp-format names it: a Kaldi text under another name needs `kaldi`
(its lines read as plain text too, the ids as words). `all` computes the text metrics when
both files carry text (CER/WER only when one is untimed) and DER when both are timed.

Sessions pair by id (a file without ids, such as livemeet's transcript JSON, with the other
side's only session). Files with no session id in common are refused (scored, all would be
deletions and insertions, whatever the hypothesis says); the ids of one side only are scored
(all deletions, or all insertions) and named on stderr as a warning (meeteval scores a missing
hypothesis session as silence, up to 10% of them, and refuses hypothesis-only ones; md-eval
ignores hypothesis-only files). Exit status: 0 on success, 2 on bad input (the message names
the file and line), a format that cannot be told or no session in common.

Conventions, and where the reference tools differ:
- Text is NFKC-folded, case-folded and stripped of punctuation before scoring (--normalize
  default); meeteval, sclite and jiwer score it as written: --normalize none.
- CER counts a CJK character or a word of any other script as one unit (DESIGN section 8), so
  on English text it equals WER. cpWER/cpCER are meeteval's cpWER: per speaker, segments in
  start-time order, speakers paired for the fewest errors; orcWER is meeteval's orcWER. The
  S/D/I split is that of one minimal alignment (rapidfuzz's, as jiwer); meeteval's
  (kaldialign's) may split the same errors otherwise ("a b" vs "b c": 2 S here, 1 D + 1 I
  there). An empty reference scores 0.0 without errors, else inf (null in --json; meeteval
  reports no rate).
- DER: a collar of --collar seconds on each side of every reference turn boundary (0.25 s:
  md-eval -c 0.25, dscore --collar 0.25, pyannote collar=0.5; each tool's own default is 0);
  overlapping speech is scored unless --skip-overlap; without --uem the scored region is
  [first start, last end] of both files (pyannote, dscore; md-eval alone uses the reference's);
  a speaker's overlapping turns count once (dscore merges them, md-eval refuses them).
  Speakers are mapped one to one for the most overlap in the scored time, as pyannote.metrics
  does; md-eval and dscore map before removing the collars and overlap, so their DER can be
  higher where the best mappings differ (livemeet/eval/der.py says when): --der-mapping
  md-eval maps as they do.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from livemeet.audio.constants import DER_COLLAR_S, DER_MAPPINGS
from livemeet.errors import InvalidRequest, LivemeetError
from livemeet.eval.io import (
    FORMATS,
    has_text,
    has_times,
    load_segments,
    load_turns,
    load_uem,
)
from livemeet.eval.text import DEFAULT_NORMALIZATION, NO_NORMALIZATION, TokenUnit

if TYPE_CHECKING:
    from livemeet.eval.cp import CpResult
    from livemeet.eval.der import DerResult
    from livemeet.eval.wer import ErrorCounts, ErrorRateResult, SessionMatch

MAX_LISTED_SESSIONS = 5  # session ids a warning or an error names; past that, how many more
METRICS = ("cer", "wer", "cpcer", "cpwer", "delta", "der")  # what "all" computes
EXTRA_METRICS = ("orccer", "orcwer")  # exponential in hypothesis speakers: on request only
NORMALIZATIONS = {"default": DEFAULT_NORMALIZATION, "none": NO_NORMALIZATION}
AUTO_FORMAT = "auto"  # --ref-format/--hyp-format: from the name or the content


@dataclass(frozen=True)
class MetricRow:
    """One scored metric: its value, a one-line breakdown, and its JSON form."""

    name: str
    value: float
    breakdown: str
    details: dict[str, object]


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _counts_dict(counts: ErrorCounts) -> dict[str, object]:
    return {
        "rate": _json_float(counts.rate),
        "errors": counts.errors,
        "substitutions": counts.substitutions,
        "deletions": counts.deletions,
        "insertions": counts.insertions,
        "ref_length": counts.ref_length,
        "hyp_length": counts.hyp_length,
    }


def _counts_text(counts: ErrorCounts) -> str:
    return (
        f"S={counts.substitutions} D={counts.deletions} I={counts.insertions} N={counts.ref_length}"
    )


def _rate_row(name: str, result: ErrorRateResult) -> MetricRow:
    details = _counts_dict(result.counts)
    details["sessions"] = {s.session: _counts_dict(s.counts) for s in result.sessions}
    return MetricRow(name, result.rate, _counts_text(result.counts), details)


def _cp_row(name: str, result: CpResult) -> MetricRow:
    details = _counts_dict(result.counts)
    details["sessions"] = {
        s.session: {**_counts_dict(s.counts), "assignment": s.assignment} for s in result.sessions
    }
    prefix = len(result.sessions) > 1
    mapping = " ".join(
        f"{s.session + ':' if prefix else ''}{r}->{h}"
        for s in result.sessions
        for r, h in sorted(s.assignment.items())
    )
    return MetricRow(name, result.rate, f"{_counts_text(result.counts)}  {mapping}", details)


def _der_row(result: DerResult, args: argparse.Namespace) -> MetricRow:
    c = result.components
    details: dict[str, object] = {
        "total_s": c.total_s,
        "missed_s": c.missed_s,
        "false_alarm_s": c.false_alarm_s,
        "confusion_s": c.confusion_s,
        "collar_s": args.collar,
        "skip_overlap": args.skip_overlap,
        "der_mapping": args.der_mapping,
        "mapping": {s.session: dict(s.mapping) for s in result.sessions},
    }
    breakdown = (
        f"miss={c.missed_s:.3f}s fa={c.false_alarm_s:.3f}s conf={c.confusion_s:.3f}s "
        f"total={c.total_s:.3f}s"
    )
    return MetricRow("der", c.der, breakdown, details)


def _listed(ids: tuple[str, ...]) -> str:
    """Session ids for a message, at most MAX_LISTED_SESSIONS of them (a Kaldi text has one
    per utterance: thousands)."""
    shown = ", ".join(repr(i) for i in ids[:MAX_LISTED_SESSIONS])
    more = len(ids) - MAX_LISTED_SESSIONS
    return f"{shown} and {more} more" if more > 0 else shown


def check_sessions(match: SessionMatch, warn: Callable[[str], None]) -> None:
    """Refuse sides whose session ids have none in common, and `warn` of the ids that are on
    one side only. Disjoint sides would score every reference word as a deletion and every
    hypothesis word as an insertion (DER: all missed, all false alarm), whatever the
    hypothesis says: a figure about the ids, not the transcript, so it is an error, not a
    warning (a wrong file, or ids spelled otherwise). A partial match is scored, as meeteval
    and md-eval do (a session a system lost counts against it), and the lone ids are named.
    Raises InvalidRequest."""
    if match.disjoint:
        raise InvalidRequest(
            f"no session id of the reference ({_listed(match.ref_only)}) is in the hypothesis "
            f"({_listed(match.hyp_only)}): scored, all of the reference would be deletions and "
            "all of the hypothesis insertions. Check the files, or the ids on one side (a "
            "file without ids, such as livemeet's transcript JSON, pairs with a reference of "
            "one session)"
        )
    for side, lone, other, scored in (
        ("reference", match.ref_only, "hypothesis", "deletions / missed speech"),
        ("hypothesis", match.hyp_only, "reference", "insertions / false alarm"),
    ):
        if lone:
            warn(
                f"{side} sessions not in the {other} ({len(lone)} of "
                f"{len(lone) + len(match.matched)}; they count as all {scored}): {_listed(lone)}"
            )


def _stderr_warning(message: str) -> None:
    print(f"livemeet eval: warning: {message}", file=sys.stderr)


def compute(
    args: argparse.Namespace, warn: Callable[[str], None] = _stderr_warning
) -> list[MetricRow]:
    """The rows `args.metric` asks for; `warn` gets each warning (`check_sessions`). Raises
    LivemeetError for bad input, and for sides without a session id in common."""
    # Scoring needs scipy and rapidfuzz: imported here, not when the CLI is registered.
    from livemeet.eval.cp import cp_error_rate, delta_error_rate, orc_error_rate
    from livemeet.eval.der import diarization_error_rate
    from livemeet.eval.wer import error_rate, match_sessions

    ref_path, hyp_path = Path(args.ref), Path(args.hyp)
    ref_fmt, hyp_fmt = _format(args.ref_format), _format(args.hyp_format)
    wanted: tuple[str, ...] = METRICS if args.metric == "all" else (args.metric,)
    if args.metric == "all" and not (has_text(ref_path, ref_fmt) and has_text(hyp_path, hyp_fmt)):
        wanted = ("der",)
    elif args.metric == "all" and not (
        has_times(ref_path, ref_fmt) and has_times(hyp_path, hyp_fmt)
    ):
        # a Kaldi text has neither times nor speakers: no DER, and a cp metric would score
        # every hypothesis speaker but one against nothing
        wanted = ("cer", "wer")
    options = NORMALIZATIONS[args.normalize]
    rows: list[MetricRow] = []
    checked = False  # the files' sessions (text segments and turns have the same)
    if set(wanted) & {"cer", "wer", "cpcer", "cpwer", "delta", *EXTRA_METRICS}:
        ref, hyp = load_segments(ref_path, ref_fmt), load_segments(hyp_path, hyp_fmt)
        check_sessions(match_sessions(ref, hyp), warn)
        checked = True
        mixed, word = TokenUnit.MIXED, TokenUnit.WORD
        if "cer" in wanted:
            rows.append(_rate_row("cer", error_rate(ref, hyp, mixed, options)))
        if "wer" in wanted:
            rows.append(_rate_row("wer", error_rate(ref, hyp, word, options)))
        if "cpcer" in wanted:
            rows.append(_cp_row("cpcer", cp_error_rate(ref, hyp, mixed, options)))
        if "cpwer" in wanted:
            rows.append(_cp_row("cpwer", cp_error_rate(ref, hyp, word, options)))
        if "delta" in wanted:
            delta = delta_error_rate(ref, hyp, mixed, options)
            text = f"cpCER={delta.cp.rate:.6f} - CER={delta.agnostic.rate:.6f}"
            rows.append(MetricRow("delta_cer", delta.delta, text, {}))
        for name in set(wanted) & set(EXTRA_METRICS):
            unit = mixed if name == "orccer" else word
            orc = orc_error_rate(ref, hyp, unit, options)
            text = f"errors={orc.errors} N={orc.ref_length}"
            rows.append(MetricRow(name, orc.rate, text, {"errors": orc.errors}))
    if "der" in wanted:
        uem = load_uem(Path(args.uem)) if args.uem else None
        ref_turns, hyp_turns = load_turns(ref_path, ref_fmt), load_turns(hyp_path, hyp_fmt)
        if not checked:
            check_sessions(match_sessions(ref_turns, hyp_turns), warn)
        result = diarization_error_rate(
            ref_turns, hyp_turns, uem, args.collar, args.skip_overlap, args.der_mapping
        )
        rows.append(_der_row(result, args))
    return rows


def _format(choice: str) -> str | None:
    """--ref-format/--hyp-format as `livemeet.eval.io` takes it: None to detect."""
    return None if choice == AUTO_FORMAT else choice


def format_table(rows: list[MetricRow]) -> str:
    """A plain-text table: metric, value (6 decimals), breakdown."""
    lines = [f"{'metric':<10} {'value':>10}  breakdown"]
    lines += [f"{r.name:<10} {r.value:>10.6f}  {r.breakdown}" for r in rows]
    return "\n".join(lines)


def format_json(rows: list[MetricRow]) -> str:
    """`{metric: {"value": ..., **details}}` as indented JSON (non-finite values as null)."""
    body = {r.name: {"value": _json_float(r.value), **r.details} for r in rows}
    return json.dumps(body, indent=2, ensure_ascii=False)


def run(args: argparse.Namespace) -> int:
    """The `eval` subcommand: print the table (or JSON); 2 with a message on bad input."""
    try:
        if not (math.isfinite(args.collar) and args.collar >= 0):
            raise InvalidRequest(f"--collar must be a number >= 0 s, got {args.collar}")
        rows = compute(args)
    except LivemeetError as exc:
        print(f"livemeet eval: error: {exc.message}", file=sys.stderr)
        return 2
    print(format_json(rows) if args.json else format_table(rows))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `eval` subcommand to the `livemeet` parser."""
    parser = subparsers.add_parser(
        "eval",
        help="score a transcript: CER/WER, cpCER/cpWER, delta CER, DER",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--ref",
        required=True,
        help="reference: STM, RTTM, CTM, SegLST, Kaldi text, livemeet JSON, SRT, WebVTT or text "
        "(required)",
    )
    parser.add_argument("--hyp", required=True, help="hypothesis, in the same formats (required)")
    for side in ("ref", "hyp"):
        parser.add_argument(
            f"--{side}-format",
            choices=(AUTO_FORMAT, *FORMATS),
            default=AUTO_FORMAT,
            help=f"the --{side} file's format; auto: from its extension, a Kaldi name (`text`, "
            "`text_*`, `*.text`...) or its content (default %(default)s)",
        )
    parser.add_argument(
        "--uem",
        help="UEM file: DER scores only the time inside it (default: from the first start to "
        "the last end of both files, per session, as pyannote and dscore do)",
    )
    parser.add_argument(
        "--collar",
        type=float,
        default=DER_COLLAR_S,
        help="DER collar in seconds PER SIDE of each reference boundary (default %(default)s, "
        "the NIST RT setting: md-eval -c 0.25 = dscore --collar 0.25 = pyannote collar=0.5; "
        "the tools' own default, and DIHARD's, is 0, which scores every frame)",
    )
    parser.add_argument(
        "--skip-overlap",
        action="store_true",
        help="DER: do not score reference overlap (md-eval -1, pyannote skip_overlap=True; "
        "default: overlap scored)",
    )
    parser.add_argument(
        "--der-mapping",
        choices=DER_MAPPINGS,
        default=DER_MAPPINGS[0],
        help="DER: where the speaker mapping's overlap is counted: pyannote, in the scored "
        "time (pyannote.metrics); md-eval, in the whole region before collars and overlap "
        "are removed (md-eval, dscore) (default %(default)s)",
    )
    parser.add_argument(
        "--metric",
        choices=(*METRICS, *EXTRA_METRICS, "all"),
        default="all",
        help=f"what to score; all: {', '.join(METRICS)} as the files allow (orccer and orcwer, "
        "exponential in hypothesis speakers, only by name; default %(default)s)",
    )
    parser.add_argument(
        "--normalize",
        choices=tuple(NORMALIZATIONS),
        default="default",
        help="default: NFKC, case fold, punctuation removed; none: text as written, as "
        "meeteval, sclite and jiwer score it (default: %(default)s)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON instead of a table (default: a table)"
    )
    parser.set_defaults(func=run)
