"""Mixed-script tokenisation and normalisation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from livemeet.eval.text import (
    NO_NORMALIZATION,
    Normalization,
    TokenUnit,
    is_cjk,
    normalize,
    split_mixed,
    tokenize,
)


def test_mixed_sentence_from_the_design() -> None:
    assert tokenize("我们用 Python 写") == ["我", "们", "用", "python", "写"]
    assert tokenize("我们用Python写") == ["我", "们", "用", "python", "写"]


def test_word_unit_keeps_cjk_runs_whole() -> None:
    assert tokenize("我们用 Python 写", TokenUnit.WORD) == ["我们用", "python", "写"]


def test_punctuation_removed_by_deletion() -> None:
    assert tokenize("你好，世界。Let's go—all-hands!") == [
        "你",
        "好",
        "世",
        "界",
        "lets",
        "goallhands",
    ]
    assert tokenize("Hello , world .") == ["hello", "world"]


def test_no_normalization_keeps_text_as_written() -> None:
    assert tokenize("Hello, World", options=NO_NORMALIZATION) == ["Hello,", "World"]


def test_nfkc_folds_fullwidth_and_casefold() -> None:
    assert normalize("ＡＢＣ１ Straße") == "abc1 strasse"
    assert normalize("ＡＢ", Normalization(nfkc=False, case_fold=False)) == "ＡＢ"


def test_japanese_per_character_and_hangul_per_word() -> None:
    assert tokenize("カタカナとひらがな") == list("カタカナとひらがな")
    assert tokenize("안녕하세요 세계") == ["안녕하세요", "세계"]
    assert is_cjk("𠀀") and is_cjk("㐀") and not is_cjk("a") and not is_cjk("。")


def test_aishell_reference_tokens_ignore_kaldi_spaces() -> None:
    assert tokenize("甚至  出现  交易") == list("甚至出现交易")


@given(st.text(alphabet="ab 中文,.", max_size=30))
def test_mixed_tokens_never_hold_spaces_or_cjk_next_to_others(text: str) -> None:
    for token in split_mixed(text):
        assert token and not any(c.isspace() for c in token)
        assert len(token) == 1 or not any(is_cjk(c) for c in token)
    assert "".join(split_mixed(text)) == "".join(text.split())
