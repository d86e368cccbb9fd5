"""Text normalisation and tokenisation for error rates.

Mixed-script rule (DESIGN section 8): a CJK character is one token; a run of any other
non-space characters is one token (a word). The same rule runs on both sides, so
"我们用 Python 写" -> ["我", "们", "用", "python", "写"] and "用Python写" gives the same tokens.

CJK here means the scripts written without spaces: Han ideographs (CJK Unified Ideographs and
extensions A-F, compatibility ideographs), Hiragana, Katakana (with the phonetic extensions and
halfwidth forms) and the ideographic iteration mark. Hangul is written with spaces between
words and is scored per word.

`Normalization` options, applied in this order before tokenising:
- `nfkc`: Unicode NFKC, so fullwidth "ＡＢ１" reads as "AB1" and compatibility forms fold.
- `case_fold`: `str.casefold()` ("Straße" -> "strasse").
- `remove_punctuation`: delete every Unicode punctuation character (categories P*), e.g.
  "，。！、" and ".,?!'-". Deleting instead of spacing keeps "let's" and "all-hands" one word
  each, so word counts match an unnormalised scorer on clean references.
`NO_NORMALIZATION` scores the text as written, as meeteval and jiwer do by default.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from enum import StrEnum


class TokenUnit(StrEnum):
    """How text is cut into scored tokens."""

    MIXED = "mixed"  # CJK per character, other scripts per word (used for CER)
    WORD = "word"  # whitespace-separated words only (used for WER)


@dataclass(frozen=True)
class Normalization:
    """Which normalisations run before tokenising (see the module docstring for each)."""

    nfkc: bool = True
    case_fold: bool = True
    remove_punctuation: bool = True


DEFAULT_NORMALIZATION = Normalization()
NO_NORMALIZATION = Normalization(nfkc=False, case_fold=False, remove_punctuation=False)

# (first, last) code points, inclusive; from the Unicode 15 block charts.
_CJK_RANGES = (
    (0x3005, 0x3007),  # ideographic iteration mark, closing mark, number zero
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK Unified Ideographs extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0xFF66, 0xFF9F),  # halfwidth Katakana
    (0x20000, 0x2FA1F),  # extensions B-F and compatibility supplement (SIP)
    (0x30000, 0x323AF),  # extensions G-H (TIP)
)


def is_cjk(char: str) -> bool:
    """Whether one character is scored on its own (see the module docstring)."""
    code = ord(char)
    return any(first <= code <= last for first, last in _CJK_RANGES)


def normalize(text: str, options: Normalization = DEFAULT_NORMALIZATION) -> str:
    """`text` with the normalisations chosen in `options` applied."""
    if options.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if options.case_fold:
        text = text.casefold()
    if options.remove_punctuation:
        text = "".join(c for c in text if not unicodedata.category(c).startswith("P"))
    return text


def split_mixed(text: str) -> list[str]:
    """Tokens of already-normalised text under the mixed-script rule (no normalisation)."""
    tokens: list[str] = []
    for word in text.split():
        run_start = 0
        for index, char in enumerate(word):
            if is_cjk(char):
                if run_start < index:
                    tokens.append(word[run_start:index])
                tokens.append(char)
                run_start = index + 1
        if run_start < len(word):
            tokens.append(word[run_start:])
    return tokens


def tokenize(
    text: str,
    unit: TokenUnit = TokenUnit.MIXED,
    options: Normalization = DEFAULT_NORMALIZATION,
) -> list[str]:
    """Normalise `text` with `options`, then cut it into tokens of `unit`."""
    text = normalize(text, options)
    if unit is TokenUnit.WORD:
        return text.split()
    return split_mixed(text)
