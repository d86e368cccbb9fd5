"""The text a transcription request carries (`--language`, `--prompt`, `--hotword`), shared by
`transcribe` and `stream`, and its limits, checked before any work with the constants the
gateway enforces: a bad argument exits 2 with one line, not 1 after the server refuses it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

# the hotword limits are a live `start`'s (uploads take none; `transcribe` applies the same)
from livemeet.audio.constants import (
    MAX_HOTWORD_CHARS,
    MAX_HOTWORDS,
    MAX_LANGUAGE_CHARS,
    MAX_PROMPT_CHARS,
)
from livemeet.errors import InvalidRequest
from livemeet.transcript.language import check_language_tag


def add_request_text_flags(p: argparse.ArgumentParser, *, language_help: str) -> None:
    """`--language`, `--prompt` and `--hotword` (repeatable, into `args.hotwords`)."""
    p.add_argument(
        "--language",
        default=None,
        help=f"a language tag ('en', 'en-GB'), {language_help}; the demo backend refuses "
        f"any but English; at most {MAX_LANGUAGE_CHARS} characters (default: none)",
    )
    p.add_argument(
        "--prompt",
        default=None,
        help=f"replaces MOSS-TD's default instruction (the demo backend ignores it); at most "
        f"{MAX_PROMPT_CHARS:,} characters (default: the model's own)",
    )
    p.add_argument(
        "--hotword",
        action="append",
        default=[],
        dest="hotwords",
        metavar="WORD",
        help="a name or phrase to expect, appended to MOSS-TD's instruction (the demo backend "
        "ignores it); repeatable, at most "
        f"{MAX_HOTWORDS} of at most {MAX_HOTWORD_CHARS} characters each (default: none)",
    )


def check_request_text(language: str | None, prompt: str | None, hotwords: Sequence[str]) -> None:
    """Raise InvalidRequest, naming the flag, for text past the limits an upload's form and a
    live `start` have, or a `--language` that is no language tag."""
    _check_chars("--language", language, MAX_LANGUAGE_CHARS)
    check_language_tag(language)  # a language tag at all (the server checks it too)
    _check_chars("--prompt", prompt, MAX_PROMPT_CHARS)
    if len(hotwords) > MAX_HOTWORDS:
        raise InvalidRequest(f"at most {MAX_HOTWORDS} --hotword values, not {len(hotwords)}")
    for word in hotwords:
        _check_chars("--hotword", word, MAX_HOTWORD_CHARS)


def _check_chars(flag: str, value: str | None, max_chars: int) -> None:
    if value is not None and len(value) > max_chars:
        raise InvalidRequest(f"{flag} must be at most {max_chars:,} characters, not {len(value):,}")
