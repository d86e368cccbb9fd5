"""Evaluation: CER/WER, cpCER/cpWER, delta CER, orcWER and speaker-timestamp DER (DESIGN 8).

Readers live in `io`, tokenisation in `text`; `livemeet eval` is in `cli`.
"""

from livemeet.eval.cp import CpResult, DeltaResult, cp_error_rate, delta_error_rate, orc_error_rate
from livemeet.eval.der import DerResult, diarization_error_rate
from livemeet.eval.text import Normalization, TokenUnit, tokenize
from livemeet.eval.wer import ErrorCounts, ErrorRateResult, count_errors, error_rate

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
