"""`livemeet transcribe AUDIO...`: transcribe files locally (no server), any backend."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from livemeet.audio.constants import MAX_AUDIO_S, MAX_UPLOAD_BYTES, SAMPLE_RATE
from livemeet.cli.request_text import add_request_text_flags, check_request_text
from livemeet.cli.serve import add_backend_flag, add_model_flags, model_config_from_args
from livemeet.cli.stream import (  # as `stream` exits after Ctrl-C, and reads its audio
    INTERRUPTED_STATUS,
    STDIN,
    check_not_a_directory,
    is_stream,
)
from livemeet.errors import (
    BadAudio,
    InternalError,
    InvalidRequest,
    LivemeetError,
    PayloadTooLarge,
    TooLong,
    error_for_code,
)
from livemeet.transcriber import (
    Error,
    SegmentFinal,
    SessionOptions,
    Transcriber,
    TranscriptFinal,
)
from livemeet.transcript import formats
from livemeet.transcript.formats import ResponseFormat
from livemeet.transcript.language import check_language, reported_language
from livemeet.transcript.segments import Transcript

log = logging.getLogger(__name__)

PROGRESS_MIN_S = 60.0  # s; files at least this long get a progress bar
APPEND_CHUNK_S = 30.0  # s of audio per append() call
EXTENSIONS = {
    ResponseFormat.JSON: ".json",
    ResponseFormat.TEXT: ".txt",
    ResponseFormat.VERBOSE_JSON: ".verbose.json",
    ResponseFormat.SRT: ".srt",
    ResponseFormat.VTT: ".vtt",
    ResponseFormat.DIARIZED_JSON: ".diarized.json",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "transcribe", help="transcribe audio files locally", description=__doc__
    )
    p.add_argument(
        "audio",
        nargs="+",
        type=Path,
        help="audio files (any format FFmpeg reads); - reads one from standard input",
    )
    p.add_argument(
        "--model",
        default=None,
        help="MOSS-TD checkpoint directory or hub id (default: none, the demo backend)",
    )
    add_backend_flag(p)
    p.add_argument(
        "--format",
        default=None,
        choices=[f.value for f in ResponseFormat],
        help="output format; omitted: from the --output file's name (.srt, .vtt, .json, "
        ".verbose.json, .diarized.json, .txt), else text",
    )
    p.add_argument(
        "--output",
        type=str,  # not Path: a trailing / (a directory to make) would be lost
        default=None,
        help="output file (one input) or directory (several inputs, or a name ending in /, "
        "made if missing); - is standard output (default: standard output)",
    )
    add_request_text_flags(p, language_help="echoed in verbose_json (MOSS-TD does not use it)")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help=f"never show a progress bar (default: one on stderr, where it is a terminal, "
        f"for files of {PROGRESS_MIN_S:g} s or more)",
    )
    p.add_argument(
        "--max-audio-s",
        type=float,
        default=MAX_AUDIO_S,
        help=f"longest audio per file in seconds (default {MAX_AUDIO_S:,}, as `serve`'s; "
        "longer files fail with audio_too_long); MOSS-TD's context holds ~2.8 h",
    )
    add_model_flags(p, prefill_graphs=False)  # includes --max-new-tokens
    p.set_defaults(func=run)


@dataclass(frozen=True)
class FileResult:
    """One input file's outcome: its `transcript`, or the `error` that stopped it."""

    path: Path
    transcript: Transcript | None
    error: LivemeetError | None


def read_source(path: Path) -> Path | bytes:
    """What `decode_file` reads for one audio argument: a regular file's path, or the bytes
    of standard input (`-`) or of a pipe or device (`/dev/stdin`, a FIFO), which have no size
    to probe. Blocks until the writer closes: call it where Ctrl-C can interrupt it (the main
    thread). Raises BadAudio for a directory, an unreadable stream or `-` at a terminal,
    PayloadTooLarge past MAX_UPLOAD_BYTES."""
    check_not_a_directory(path)
    if not is_stream(path):
        return path
    if path == STDIN and sys.stdin.isatty():
        raise BadAudio("- reads audio from standard input, which is a terminal: pipe a file in")
    try:
        with open(sys.stdin.fileno() if path == STDIN else path, "rb", closefd=path != STDIN) as f:
            data = f.read(MAX_UPLOAD_BYTES + 1)
    except OSError as exc:  # e.g. a socket path, a device that refuses reads
        raise BadAudio(f"cannot read it: {exc.strerror}") from exc
    if len(data) > MAX_UPLOAD_BYTES:
        raise PayloadTooLarge(f"more than {MAX_UPLOAD_BYTES} bytes of audio")
    return data


def read_streams(paths: Sequence[Path]) -> dict[Path, bytes | LivemeetError]:
    """The bytes (or the error) of every stream argument (`is_stream`), read in the calling
    thread before any model loads, so Ctrl-C stops a read that waits on a silent pipe."""
    out: dict[Path, bytes | LivemeetError] = {}
    for path in paths:
        if is_stream(path):
            try:
                data = read_source(path)
                assert isinstance(data, bytes)
                out[path] = data
            except LivemeetError as exc:
                out[path] = exc
    return out


async def transcribe_file(
    transcriber: Transcriber,
    path: Path,
    *,
    source: Path | bytes | None = None,
    prompt: str | None = None,
    hotwords: Sequence[str] = (),
    language: str | None = None,
    progress: bool = True,
    max_new_tokens: int | None = None,
    max_audio_s: float = MAX_AUDIO_S,
) -> Transcript:
    """Decode `path` and transcribe it as one upload session; audio longer than
    `max_audio_s` (s) is refused; a cut WAV, transcribed as far as it goes, gets a warning on
    stderr. Raises BadAudio, TooLong and whatever the backend reports (as its typed error)."""
    from livemeet.audio.decode import decode_file_with_info

    if source is None:
        source = await asyncio.to_thread(read_source, path)
    decoded = await asyncio.to_thread(decode_file_with_info, source, max_audio_s=max_audio_s)
    if (cut := decoded.info.cut_note) is not None:
        print(f"warning: {path}: {cut}", file=sys.stderr)
    samples = decoded.samples
    duration_s = len(samples) / SAMPLE_RATE
    session = await transcriber.open_session(
        SessionOptions(
            live=False,
            prompt=prompt,
            hotwords=tuple(hotwords),
            language=language,
            max_new_tokens=max_new_tokens,
        )
    )
    bar = tqdm(
        total=round(duration_s, 1),
        unit="s",
        desc=path.name,
        file=sys.stderr,
        # a bar's \r frames are noise in a log or a pipe: drawn for a terminal only
        disable=not progress or duration_s < PROGRESS_MIN_S or not sys.stderr.isatty(),
        leave=False,
    )
    try:
        chunk = int(APPEND_CHUNK_S * SAMPLE_RATE)
        for i in range(0, len(samples), chunk):
            await session.append(samples[i : i + chunk])
        await session.end()
        async for event in session.events():
            if isinstance(event, SegmentFinal):
                bar.update(max(0.0, round(event.segment.end_s, 1) - bar.n))
            elif isinstance(event, TranscriptFinal):
                bar.update(bar.total - bar.n)
                return Transcript(event.segments, event.duration_s, event.finish_reason, language)
            elif isinstance(event, Error):
                raise error_for_code(event.code, event.message)
        raise error_for_code("engine_unavailable", "the backend ended without a transcript")
    finally:
        bar.close()
        await session.abort()


async def transcribe_files(
    transcriber: Transcriber,
    paths: Sequence[Path],
    *,
    prompt: str | None = None,
    hotwords: Sequence[str] = (),
    language: str | None = None,
    progress: bool = True,
    max_new_tokens: int | None = None,
    streams: Mapping[Path, bytes | LivemeetError] | None = None,
    max_audio_s: float = MAX_AUDIO_S,
) -> list[FileResult]:
    """Transcribe each file in turn; a bad file is reported and the others still run.
    `streams`: stream arguments already read (`read_streams`), by path."""
    results = []
    for path in paths:
        try:
            source = (streams or {}).get(path)
            if isinstance(source, LivemeetError):
                raise source
            t = await transcribe_file(
                transcriber,
                path,
                source=source,
                prompt=prompt,
                hotwords=hotwords,
                language=language,
                progress=progress,
                max_new_tokens=max_new_tokens,
                max_audio_s=max_audio_s,
            )
            results.append(FileResult(path, t, None))
        except LivemeetError as exc:
            results.append(FileResult(path, None, exc))
        except Exception as exc:  # a bug met by one file must not lose the others' output
            log.exception("transcribing %s failed", path)
            results.append(FileResult(path, None, InternalError(f"{type(exc).__name__}: {exc}")))
    return results


def format_for(requested: str | None, output: Path | None) -> ResponseFormat:
    """`--format` when given; else the format whose extension (EXTENSIONS) ends the name of
    `output`, an output file (the longest match: "x.diarized.json" is diarized_json); else
    text. Raises InvalidRequest for an unknown `requested`."""
    if requested is not None:
        return formats.parse_response_format(requested)
    if output is not None and not output.is_dir():
        by_length = sorted(EXTENSIONS.items(), key=lambda item: -len(item[1]))
        for fmt, ext in by_length:
            if output.name.lower().endswith(ext):
                return fmt
    return ResponseFormat.TEXT


def output_path(output: Path | None, source: Path, fmt: ResponseFormat, many: bool) -> Path | None:
    """Where to write one result: None for stdout; inside `output` when it is a directory or
    several inputs were given; `output` itself otherwise."""
    if output is None:
        return None
    if many or output.is_dir():
        return output / (("stdin" if source == STDIN else source.stem) + EXTENSIONS[fmt])
    return output


def make_output_dir(output: Path) -> None:
    """Create the `--output` directory now, before any work. Raises InvalidRequest."""
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidRequest(f"--output {output}: cannot create it: {exc.strerror}") from exc


def check_outputs(
    paths: Sequence[Path], fmt: ResponseFormat, output: Path | None, directory: bool = False
) -> None:
    """Refuse, before any work, outputs that could not all be written: two inputs whose
    outputs would share a name (same stem: "a.flac" and "a.mp3" both give "a.srt"), several
    inputs (or `directory`: `--output` named with a trailing /) with `output` an existing file
    or a directory that cannot be created (it is created here, once all else is checked), a
    new `output` named as a file of some format (`notes.srt`) for several inputs, or an output
    file in a missing directory. Raises InvalidRequest."""
    if output is None:
        return
    many = len(paths) > 1 or directory
    if many and output.exists() and not output.is_dir():
        need = "a directory" if directory else "several inputs need a directory"
        raise InvalidRequest(f"--output {output} is a file; {need}")
    named = format_for(None, output)
    by_name = not directory and not output.exists()  # a slash said directory, whatever the name
    if many and by_name and output.name.lower().endswith(EXTENSIONS[named]):
        # `--output notes.srt` for two inputs made a directory notes.srt of .txt files; the
        # --format hint only where the name's format is not the one that would be written
        # (it said "and --format text" for single.txt: a trial)
        hint = "" if named is fmt else f", and --format {named.value} for {named.value} files"
        raise InvalidRequest(
            f"--output {output} names a {named.value} file, but several inputs need --output "
            f"to be a directory (each one's transcript is written into it as its own file): "
            f"pass a directory{hint}"
        )
    if not many and not output.is_dir() and not output.parent.is_dir():
        raise InvalidRequest(f"--output {output}: directory {output.parent} does not exist")
    sources: dict[Path, Path] = {}
    for path in paths:
        target = output_path(output, path, fmt, many)
        assert target is not None
        if target in sources:
            raise InvalidRequest(
                f"{sources[target]} and {path} would both be written to {target}: "
                "rename one, or transcribe them in separate runs"
            )
        sources[target] = path
    if many:  # now, not after the work: a parent that is a file fails here
        make_output_dir(output)


def write_results(
    results: Sequence[FileResult], fmt: ResponseFormat, output: Path | None, language: str | None
) -> int:
    """Write or print each transcript; errors go to stderr. Returns the exit status."""
    status = 0
    many = len(results) > 1
    if output is not None and many:
        with contextlib.suppress(OSError):  # then each write below reports its own failure
            output.mkdir(parents=True, exist_ok=True)
    for result in results:
        if result.transcript is None:
            assert result.error is not None
            # the limit is this command's own: say how to raise it (a new user's trial)
            hint = " (--max-audio-s raises it)" if isinstance(result.error, TooLong) else ""
            error = result.error
            print(f"{result.path}: {error.code}: {error.message}{hint}", file=sys.stderr)
            status = 1
            continue
        body, _ = formats.render(result.transcript, fmt, language=language)
        target = output_path(output, result.path, fmt, many)
        if target is None:
            if many:
                print(f"==> {result.path} <==")
            sys.stdout.write(body if body.endswith("\n") else body + "\n")
        else:
            try:
                target.write_text(body, encoding="utf-8")
            except OSError as exc:  # e.g. permissions, a full disk: the others still go out
                print(f"{result.path}: cannot write {target}: {exc.strerror}", file=sys.stderr)
                status = 1
    return status


async def _run(
    args: argparse.Namespace,
    fmt: ResponseFormat,
    streams: Mapping[Path, bytes | LivemeetError],
    output: Path | None,
) -> int:
    from livemeet.gateway.engine_client import EngineClient

    model = model_config_from_args(args)
    model.validate()
    transcriber = EngineClient(model, in_process=True)
    await transcriber.start()
    try:
        info = transcriber.info
        check_language(args.language, info.language_code, info.name)
        # The demo backend announces itself when it loads (a WARNING on stderr): no second note.
        results = await transcribe_files(
            transcriber,
            args.audio,
            prompt=args.prompt,
            hotwords=args.hotwords,
            language=args.language,
            progress=not args.no_progress,
            max_new_tokens=args.max_new_tokens,
            streams=streams,
            max_audio_s=args.max_audio_s,
        )
    finally:
        await transcriber.close()
    # verbose_json's language as an upload's says it: the request's, else the backend's one
    return write_results(results, fmt, output, reported_language(args.language, info.language))


def run(args: argparse.Namespace) -> int:
    """`livemeet transcribe`: transcribe the files offline and write each transcript. Returns the
    exit status: 2 for a bad argument or output (printed as `error: code: message`),
    INTERRUPTED_STATUS (130) for Ctrl-C (nothing written), else `write_results`' (1 when any
    file failed or could not be written)."""
    raw_output: str | None = None if args.output == "-" else args.output  # -: standard output
    output = None if raw_output is None else Path(raw_output)
    # a trailing / says directory: a file of its name was written (found by a trial)
    directory = raw_output is not None and raw_output.endswith(("/", os.sep))
    try:
        check_request_text(args.language, args.prompt, args.hotwords)
        if args.audio.count(STDIN) > 1:
            raise InvalidRequest("- (standard input) can be given once")
        if not (math.isfinite(args.max_audio_s) and args.max_audio_s > 0):
            raise InvalidRequest(f"--max-audio-s must be a positive number, not {args.max_audio_s}")
        single_file = len(args.audio) == 1 and not directory
        fmt = format_for(args.format, output if single_file else None)
        check_outputs(args.audio, fmt, output, directory)
        streams = read_streams(args.audio)
        return asyncio.run(_run(args, fmt, streams, output))
    except LivemeetError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # transcripts are written once all are done: none half-written
        print("error: stopped by Ctrl-C: no transcript written", file=sys.stderr)
        return INTERRUPTED_STATUS
