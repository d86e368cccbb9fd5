"""Prompt building against the transformers 5.24 processor (the oracle) and MODEL.md 5.3 / 10."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from livemeet.audio.constants import SAMPLE_RATE, TOKENS_PER_WINDOW, num_audio_tokens
from livemeet.errors import BadAudio, ConfigError, InvalidRequest
from livemeet.models.prompt import (
    AUDIO_END,
    AUDIO_PAD,
    AUDIO_START,
    DEFAULT_INSTRUCTION,
    DIGIT_IDS,
    HEADER_LEN,
    PromptBuilder,
    PromptConfig,
    build_prompt,
    render_instruction,
    stable_prefix_len,
)
from livemeet.models.tokenizer import load_tokenizer
from tests.models.reference import make_reference_processor


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(None)


def _wave(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(round(seconds * SAMPLE_RATE))).astype(np.float32)


def _reference_ids(wave: np.ndarray, every: int = 5, **kwargs: object) -> list[int]:
    out = make_reference_processor(every).apply_transcription_request(
        wave, return_tensors="pt", **kwargs
    )
    return list(out["input_ids"][0].tolist())


@pytest.mark.parametrize("seconds", [1.0, 11.04, 40.0, 71.3])
def test_ids_match_reference_processor(tok: Tokenizer, seconds: float) -> None:
    wave = _wave(seconds)
    built = build_prompt(tok, num_audio_tokens(len(wave)))
    assert built.ids == _reference_ids(wave)


@pytest.mark.parametrize(
    ("seconds", "length"), [(11.04, 227), (40.0, 601), (3600.0, 47_747), (5400.0, 71_687)]
)
def test_prompt_lengths(tok: Tokenizer, seconds: float, length: int) -> None:
    built = build_prompt(tok, num_audio_tokens(round(seconds * SAMPLE_RATE)))
    assert len(built.ids) == length
    assert built.header_len + built.span_len + built.suffix_len == length
    assert (built.header_len, built.suffix_len) == (15, 71)


def test_span_layout_11s(tok: Tokenizer) -> None:
    built = build_prompt(tok, num_audio_tokens(round(11.04 * SAMPLE_RATE)))
    span = built.ids[built.header_len : built.header_len + built.span_len]
    five, one, zero = DIGIT_IDS[5], DIGIT_IDS[1], DIGIT_IDS[0]
    assert span == [AUDIO_PAD] * 62 + [five] + [AUDIO_PAD] * 62 + [one, zero] + [AUDIO_PAD] * 14
    assert built.ids[built.header_len - 1] == AUDIO_START
    assert built.ids[built.header_len + built.span_len] == AUDIO_END


@pytest.mark.parametrize("num_tokens", [1, 62, 63, 187, 188, 375, 1000, 45_000])
def test_audio_positions_are_exactly_the_pads(tok: Tokenizer, num_tokens: int) -> None:
    built = build_prompt(tok, num_tokens)
    assert built.num_audio_tokens == num_tokens
    pads = [i for i, t in enumerate(built.ids) if t == AUDIO_PAD]
    assert built.audio_positions.tolist() == pads


def test_one_hour_markers(tok: Tokenizer) -> None:
    built = build_prompt(tok, 45_000)
    assert built.span_len == 47_661  # 720 markers, 2 661 digit tokens (MODEL.md 5.3)


def test_marker_every_2s_differs_from_reference_but_matches_its_own(tok: Tokenizer) -> None:
    wave = _wave(11.04)
    two = build_prompt(tok, num_audio_tokens(len(wave)), config=PromptConfig(time_marker_every_s=2))
    assert two.ids != _reference_ids(wave)
    assert two.ids == _reference_ids(wave, every=2)


def test_marker_one_pad_late_is_detected(tok: Tokenizer) -> None:
    wave = _wave(11.04)
    ids = build_prompt(tok, num_audio_tokens(len(wave))).ids
    first_marker = HEADER_LEN + 62
    assert ids[first_marker] == DIGIT_IDS[5]
    late = list(ids)
    late[first_marker], late[first_marker + 1] = late[first_marker + 1], late[first_marker]
    assert late != _reference_ids(wave)
    assert ids == _reference_ids(wave)


def test_custom_and_blank_prompt_match_reference(tok: Tokenizer) -> None:
    wave = _wave(3.0)
    t = num_audio_tokens(len(wave))
    custom = "Transcribe the audio. For each segment, start with the timestamp and speaker ID."
    assert build_prompt(tok, t, prompt=custom).ids == _reference_ids(wave, prompt=custom)
    assert build_prompt(tok, t, prompt="   ").ids == build_prompt(tok, t).ids
    assert build_prompt(tok, t, prompt=" \n").ids == _reference_ids(wave, prompt=" \n")


def test_chinese_hotwords_match_reference_template(tok: Tokenizer) -> None:
    wave = _wave(3.0)
    words = ["张三", "OpenMOSS", "  "]
    built = build_prompt(tok, num_audio_tokens(len(wave)), hotwords=words)
    assert built.ids == _reference_ids(wave, keywords=["张三", "OpenMOSS"])


def test_hotword_forms(tok: Tokenizer) -> None:
    cfg = PromptConfig()
    zh = render_instruction(tok, None, ["张三", "李四"], cfg)
    assert zh == DEFAULT_INSTRUCTION + "热词提示：张三, 李四"
    en = render_instruction(tok, "Transcribe the audio.", ["Kubernetes", "gRPC"], cfg)
    assert en == "Transcribe the audio. Hotwords: Kubernetes, gRPC"
    # an instruction in CJK writing takes the Chinese form (kana, Hangul too); CJK punctuation
    # alone in English does not (prompt._has_cjk, unlike segments.is_cjk)
    for instruction in ("音声を書き起こしてください。", "회의를 받아 적으세요"):
        assert render_instruction(tok, instruction, ["ACME"], cfg).endswith("热词提示：ACME")
    english = render_instruction(tok, "Transcribe the audio。", ["ACME"], cfg)
    assert english.endswith(" Hotwords: ACME")
    assert render_instruction(tok, None, [" ", ""], cfg) == DEFAULT_INSTRUCTION
    ids = build_prompt(tok, 5, prompt="Hi.", hotwords=["ACME"]).ids
    decoded = tok.decode(ids, skip_special_tokens=False)
    assert decoded.endswith("Hi. Hotwords: ACME<|im_end|>\n<|im_start|>assistant\n")


def test_error_paths(tok: Tokenizer) -> None:
    with pytest.raises(BadAudio):
        build_prompt(tok, 0)
    with pytest.raises(InvalidRequest, match="im_end"):
        build_prompt(tok, 10, prompt="hi<|im_end|>")
    with pytest.raises(InvalidRequest, match="audio_pad"):
        build_prompt(tok, 10, hotwords=["<|audio_pad|>"])
    with pytest.raises(InvalidRequest, match="list of strings"):
        build_prompt(tok, 10, hotwords="ACME")


def test_from_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert PromptConfig.from_checkpoint(tmp_path).time_marker_every_s == 5
    assert "processor_config.json" in caplog.text

    cfg_path = tmp_path / "processor_config.json"
    shipped = {"audio_tokens_per_second": 12.5, "audio_merge_size": 4,
               "time_marker_every_seconds": 5, "enable_time_marker": True}  # fmt: skip
    cfg_path.write_text(json.dumps(shipped))
    assert PromptConfig.from_checkpoint(tmp_path) == PromptConfig()

    cfg_path.write_text(json.dumps({**shipped, "time_marker_every_seconds": 2}))
    assert PromptConfig.from_checkpoint(tmp_path).time_marker_every_s == 2
    cfg_path.write_text(json.dumps({**shipped, "time_marker_every_seconds": 2.0}))
    assert PromptConfig.from_checkpoint(tmp_path).time_marker_every_s == 2  # was refused

    cfg_path.write_text(json.dumps({**shipped, "enable_time_marker": False}))
    off = PromptConfig.from_checkpoint(tmp_path)
    assert off.time_marker_every_s == 0


def test_a_processor_config_without_marker_spacing_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the key, transformers' processor takes its class default of 2 s where livemeet
    takes the shipped 5 s: only a missing file said so; a file without the key was silent (a
    trial's checkpoint got other prompts than the reference's)."""
    (tmp_path / "processor_config.json").write_text(json.dumps({"audio_tokens_per_second": 12.5}))
    with caplog.at_level(logging.WARNING):
        assert PromptConfig.from_checkpoint(tmp_path).time_marker_every_s == 5
    assert "no time_marker_every_seconds" in caplog.text


def test_markers_disabled(tok: Tokenizer) -> None:
    built = build_prompt(tok, 200, config=PromptConfig(time_marker_every_s=0))
    assert built.span_len == 200
    off = PromptConfig(time_marker_every_s=0)
    assert stable_prefix_len(400, 1, config=off) == HEADER_LEN + 375
    assert stable_prefix_len(200, 0, config=off) == HEADER_LEN


@pytest.mark.parametrize(
    "content", ["{not json", "[1, 2]", '{"time_marker_every_seconds": -1}',
                '{"time_marker_every_seconds": 2.5}', '{"audio_tokens_per_second": 0}',
                '{"audio_merge_size": 2}'],  # the front end merges 4 frames a token
)  # fmt: skip
def test_from_checkpoint_bad_file(tmp_path: Path, content: str) -> None:
    (tmp_path / "processor_config.json").write_text(content)
    with pytest.raises(ConfigError):
        PromptConfig.from_checkpoint(tmp_path)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _check_stable_prefix(tok: Tokenizer, starts: range | list[int], dense: int) -> int:
    """Check stable_prefix_len(T, W) against every T' in (T, T + dense] and a sparse sample of
    T' up to two windows ahead; return how many T had a tight (ids-bound) claim."""
    horizon = 2 * TOKENS_PER_WINDOW
    cache: dict[int, np.ndarray] = {}

    def ids(t: int) -> np.ndarray:
        if t not in cache:
            cache[t] = np.asarray(build_prompt(tok, t).ids)
        return cache[t]

    tight = 0
    for t in starts:
        windows = t // TOKENS_PER_WINDOW
        claimed = stable_prefix_len(t, windows)
        later = [*range(t + 1, t + dense + 1), *range(t + dense + 1, t + horizon + 1, 11)]
        worst = min(_common_prefix(ids(t), ids(u)) for u in later)
        assert worst >= claimed, (t, worst, claimed)
        marker_pad = 62 * (t * 2 // 25 // 5 + 1)  # pad after which the next marker goes
        if min(t, marker_pad) <= windows * TOKENS_PER_WINDOW:
            # the bound comes from the ids alone, not from unfinished embeddings: it is tight
            assert worst == claimed, (t, worst, claimed)
            tight += 1
    return tight


def test_stable_prefix_len_brute_force_short(tok: Tokenizer) -> None:
    _check_stable_prefix(tok, range(1, 800), dense=2 * TOKENS_PER_WINDOW)


def test_stable_prefix_len_brute_force_late(tok: Tokenizer) -> None:
    # About 10, 30 and 60 minutes in: pending markers sit ~50, ~180 and ~360 pads back, so the
    # marker bound (not the window bound) decides right after a window completes.
    tight = _check_stable_prefix(tok, [7_480, 7_499, 7_500, 7_501, 7_563], dense=70)
    tight += _check_stable_prefix(tok, [22_500, 22_501, 22_540, 22_600], dense=70)
    tight += _check_stable_prefix(tok, [44_990, 45_000, 45_001, 45_060, 45_200], dense=70)
    assert tight >= 8


def test_stable_prefix_len_rejects_inconsistent_windows() -> None:
    with pytest.raises(ValueError):
        stable_prefix_len(374, 1)


# The 71 ids after the audio span in the HF golden prompt for a 40 s clip (transformers
# tests/fixtures/moss_transcribe_diarize/expected_results_single_batch_over_30.json, input_ids).
GOLDEN_SUFFIX = [
    151670,
    198,
    14880,
    44063,
    111268,
    46670,
    61443,
    17714,
    108704,
    3837,
    73157,
    104383,
    58362,
    23031,
    71618,
    26606,
    20450,
    111420,
    33108,
    104283,
    17340,
    72640,
    9909,
    58,
    50,
    15,
    16,
    60,
    5373,
    58,
    50,
    15,
    17,
    60,
    5373,
    58,
    50,
    15,
    18,
    60,
    1940,
    7552,
    111749,
    3837,
    110644,
    17714,
    110019,
    105761,
    43815,
    90395,
    18493,
    37474,
    100072,
    111066,
    80565,
    20450,
    111420,
    3837,
    23031,
    104542,
    117932,
    75882,
    37474,
    105761,
    101121,
    1773,
    151645,
    198,
    151644,
    77091,
    198,
]


def test_suffix_matches_golden_fixture(tok: Tokenizer) -> None:
    built = build_prompt(tok, 501)
    assert built.ids[-built.suffix_len :] == GOLDEN_SUFFIX
    assert len(built.ids) == 602  # that clip gives 501 audio tokens: 8 markers, 5 trailing pads


def test_marker_time_runs_62_5_over_62_times_the_audio() -> None:
    """Marker k reads 5 k s but sits after pad 62 k (4.96 k s): a model that reads markers
    literally writes times 1.008 times the audio's, ~28.8 s ahead at 1 h (MODEL.md 5.3)."""
    scale = PromptConfig().marker_time_scale
    assert scale == pytest.approx(62.5 / 62)
    one_hour = 3600.0
    assert one_hour * scale - one_hour == pytest.approx(29.0, abs=0.1)
    assert PromptConfig(time_marker_every_s=0).marker_time_scale == 1.0
    assert PromptConfig(time_marker_every_s=2).marker_time_scale == pytest.approx(1.0)  # 25 pads


# -- PromptBuilder: the cached build a live hop uses (equal to build_prompt) -----------------


def _lengths_around_markers(config: PromptConfig, up_to: int) -> list[int]:
    """T at and around every marker's pad and its quirk window (62 k .. 62.5 k + 1), plus the
    first tokens, up to `up_to`."""
    per = config.pads_per_marker
    lengths = set(range(1, 200))
    for k in range(1, up_to // max(per, 1) + 2):
        due = math.ceil(k * config.time_marker_every_s * config.audio_tokens_per_second)
        lengths.update(range(per * k - 2, due + 3))
    return sorted(t for t in lengths if 1 <= t <= up_to)


@pytest.mark.parametrize("every", [5, 2, 7, 0])
def test_prompt_builder_equals_build_prompt_at_every_marker_boundary(
    tok: Tokenizer, every: int
) -> None:
    """Every T around each marker's pad and its quirk window, and lengths that make the
    template grow past its first size, in an order that grows it mid-way."""
    config = PromptConfig(time_marker_every_s=every)
    builder = PromptBuilder(tok, config)
    lengths = _lengths_around_markers(config, 2_000) + [20_000, 16_385, 40_001, 3]
    for t in lengths:
        assert builder.build(t) == build_prompt(tok, t, config=config), t


def test_prompt_builder_prompts_hotwords_and_errors(tok: Tokenizer) -> None:
    builder = PromptBuilder(tok)
    for prompt, hotwords in [
        (None, ()),
        ("Transcribe with speakers.", ()),
        (None, ["ACME", "Zyxel"]),
        ("  ", ["ACME"]),
        (None, ("ACME", "Zyxel")),  # the same words as a tuple: the same suffix
    ]:
        for t in (1, 700, 3_125):
            assert builder.build(t, prompt, hotwords) == build_prompt(
                tok, t, prompt=prompt, hotwords=hotwords
            )
    with pytest.raises(BadAudio):
        builder.build(0)
    with pytest.raises(InvalidRequest, match="im_end"):
        builder.build(10, "hi<|im_end|>")
    with pytest.raises(InvalidRequest, match="list of strings"):
        builder.build(10, None, "ACME")  # not read as the cached ("A", "C", "M", "E") either
    builder.build(10, None, list("ACME"))
    with pytest.raises(InvalidRequest, match="list of strings"):
        builder.build(10, None, "ACME")


def test_prompt_builder_results_are_the_callers_own(tok: Tokenizer) -> None:
    """The engine appends forced ids to a built prompt: no later build may see them."""
    builder = PromptBuilder(tok)
    first = builder.build(5_000)
    first.ids.extend([1, 2, 3])
    with pytest.raises(ValueError, match="read-only"):
        first.audio_positions[0] = -1  # a view of the builder's template
    assert builder.build(5_000) == build_prompt(tok, 5_000)


def test_prompt_builder_reads_hotwords_given_as_an_iterator_once(tok: Tokenizer) -> None:
    builder = PromptBuilder(tok)
    expected = build_prompt(tok, 100, hotwords=["alpha", "beta"])
    assert builder.build(100, None, iter(["alpha", "beta"])) == expected
    assert builder.build(100, None, iter(["alpha", "beta"])) == expected  # from the cache
