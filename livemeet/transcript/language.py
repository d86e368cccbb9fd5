"""The `language` a request names (an upload's form field, a live `start`'s field): a valid
BCP 47 language tag (ISO 639-1 codes such as "en", which OpenAI's API asks for, are such
tags), checked with the `langcodes` package against the IANA language subtag registry, and
one the backend transcribes. OpenAI's API refuses a code it does not know with a 400; the
English-only demo used to echo `language=zh` back over an English transcript."""

from __future__ import annotations

import langcodes

from livemeet.errors import InvalidRequest


def reported_language(given: str | None, backend_language: str | None) -> str | None:
    """The language a transcript reports (`verbose_json`): the one its request gave, else the
    one language its backend transcribes (the demo's "english", as OpenAI names a detected
    one), else None ("unknown"). One rule for uploads and live sessions (a trial saw the same
    audio say "unknown" live and "english" uploaded)."""
    return given or backend_language


def check_language_tag(tag: str | None) -> None:
    """Raise InvalidRequest (param "language") unless `tag` is None or a valid language tag
    (what a client may send whatever the backend)."""
    if tag is not None and not langcodes.tag_is_valid(tag):
        raise InvalidRequest(
            f"language {tag!r} is not a language code (ISO 639-1, e.g. 'en', or a BCP 47 tag)",
            param="language",
        )


def check_language(tag: str | None, backend_code: str | None, backend: str) -> None:
    """Raise InvalidRequest (param "language") unless `tag` is None or a valid language tag
    (`check_language_tag`) whose language is `backend_code` (the backend's one language as an
    ISO 639-1 code; None: a backend that takes any). `backend` names the backend in the
    message."""
    check_language_tag(tag)
    if tag is None:
        return
    if backend_code is not None and langcodes.Language.get(tag).language != backend_code:
        raise InvalidRequest(
            f"the {backend} backend transcribes {backend_code!r} only, not {tag!r}",
            param="language",
        )
