"""Evaluation: CER/WER, cpCER/cpWER, delta CER, orcWER and speaker-timestamp DER (DESIGN 8).

Readers live in `io`, tokenisation in `text`; `livemeet eval` is in `cli`. The names below are
imported on first use (PEP 562), so registering the CLI does not load scipy or rapidfuzz: a
server box without the evaluation dependencies still runs `livemeet serve`.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "CpResult": "cp",
    "DeltaResult": "cp",
    "cp_error_rate": "cp",
    "delta_error_rate": "cp",
    "orc_error_rate": "cp",
    "DerResult": "der",
    "diarization_error_rate": "der",
    "Normalization": "text",
    "TokenUnit": "text",
    "tokenize": "text",
    "ErrorCounts": "wer",
    "ErrorRateResult": "wer",
    "count_errors": "wer",
    "error_rate": "wer",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'livemeet.eval' has no attribute {name!r}")
    return getattr(importlib.import_module(f"livemeet.eval.{home}"), name)


__all__ = [
    "CpResult",
    "DeltaResult",
    "DerResult",
    "ErrorCounts",
    "ErrorRateResult",
    "Normalization",
    "TokenUnit",
    "count_errors",
    "cp_error_rate",
    "delta_error_rate",
    "diarization_error_rate",
    "error_rate",
    "orc_error_rate",
    "tokenize",
]
