"""MOSS-TD prompt building: the chat-template rendering with the audio span expanded in place.

Layout (MODEL.md 5.1 and 5.3), for T audio tokens:

    header (15 ids)  <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n
                     <|im_start|>user\\n<|audio_start|>
    span             T x <|audio_pad|>, with decimal time markers "5", "10", ... interleaved
    suffix           <|audio_end|>\\n{instruction}<|im_end|>\\n<|im_start|>assistant\\n

The ids equal those of the transformers 5.24 `MossTranscribeDiarizeProcessor` built with the
shipped `time_marker_every_seconds=5` (tests/models/test_prompt.py checks this).
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from tokenizers import Tokenizer

from livemeet.audio.constants import (
    AUDIO_TOKENS_PER_SECOND,
    MERGE_SIZE,
    TIME_MARKER_EVERY_S,
    TOKENS_PER_WINDOW,
)
from livemeet.errors import BadAudio, ConfigError, InvalidRequest
from livemeet.models.config import AUDIO_TOKEN_ID

log = logging.getLogger(__name__)

# Special ids of the MOSS-TD vocabulary (MODEL.md 0 and 5.4).
special_tokens = SimpleNamespace(
    ENDOFTEXT=151_643,  # <|endoftext|>, the pad id of batched generation
    IM_START=151_644,  # <|im_start|>
    IM_END=151_645,  # <|im_end|>, EOS
    AUDIO_START=151_669,  # <|audio_start|>
    AUDIO_END=151_670,  # <|audio_end|>
    AUDIO_PAD=AUDIO_TOKEN_ID,  # <|audio_pad|> = config.audio_token_id; one audio embedding each
    DIGIT_0=15,  # "0"; digits "0".."9" are ids 15..24, one token each
)
IM_START = special_tokens.IM_START
IM_END = special_tokens.IM_END
EOS = IM_END
ENDOFTEXT = special_tokens.ENDOFTEXT
AUDIO_START = special_tokens.AUDIO_START
AUDIO_END = special_tokens.AUDIO_END
AUDIO_PAD = special_tokens.AUDIO_PAD
DIGIT_IDS = tuple(range(special_tokens.DIGIT_0, special_tokens.DIGIT_0 + 10))

SYSTEM_PROMPT = "You are a helpful assistant."
# The model authors' default instruction (upstream processor; MODEL.md 5.2): 64 tokens.
DEFAULT_INSTRUCTION = (
    "请将音频转写为文本，每一段需以起始时间戳和说话人编号（[S01]、[S02]、[S03]…）开头，"
    "正文为对应的语音内容，并在段末标注结束时间戳，以清晰标明该段语音范围。"
)
# Hotword suffixes in the upstream README form (MODEL.md 5.2), appended with no separator.
HOTWORDS_PREFIX_ZH = "热词提示："
HOTWORDS_PREFIX_EN = " Hotwords: "
HOTWORDS_JOIN = ", "

HEADER_TEXT = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n<|audio_start|>"
HEADER_LEN = 15  # ids in HEADER_TEXT with the Qwen tokenizer (MODEL.md 5.1)
_SUFFIX_TEMPLATE = "<|audio_end|>\n{instruction}<|im_end|>\n<|im_start|>assistant\n"

PROCESSOR_CONFIG_FILE = "processor_config.json"


@dataclass(frozen=True)
class PromptConfig:
    """How the prompt is laid out.

    `time_marker_every_s`: seconds between time markers in the audio span (0 disables them);
    the shipped processor_config.json says 5, the transformers/upstream class default of 2 is
    wrong for this checkpoint (MODEL.md 9, surprise 1).
    `audio_tokens_per_second`: 12.5 (one token per 80 ms).
    `instruction`: the text after the audio when the request gives no prompt.
    """

    time_marker_every_s: int = TIME_MARKER_EVERY_S
    audio_tokens_per_second: float = AUDIO_TOKENS_PER_SECOND
    instruction: str = DEFAULT_INSTRUCTION

    @property
    def pads_per_marker(self) -> int:
        """Pads between markers: int(12.5 * 5) = 62, not 62.5 (MODEL.md 5.3); 0 = no markers."""
        return int(self.audio_tokens_per_second * self.time_marker_every_s)

    @property
    def marker_time_scale(self) -> float:
        """Seconds of marker time per second of audio: marker k reads 5 k s but sits after pad
        62 k, at 4.96 k s (MODEL.md 5.3), so a model that reads markers literally writes times
        62.5 / 62 = 1.008 times the audio's (29 s ahead at 1 h); 1.0 without markers."""
        per = self.pads_per_marker
        if per <= 0:
            return 1.0
        return self.time_marker_every_s * self.audio_tokens_per_second / per

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: Path) -> PromptConfig:
        """Read `processor_config.json` (keys `time_marker_every_seconds`,
        `audio_tokens_per_second`, `enable_time_marker`) from a checkpoint directory.

        A missing file, or a file without `time_marker_every_seconds`, gives the shipped 5 s with
        a warning. Raises ConfigError for an unreadable file or bad values.
        """
        path = Path(checkpoint_dir) / PROCESSOR_CONFIG_FILE
        if not path.is_file():
            log.warning(
                "%s not found; using time markers every %d s (the shipped value)",
                path,
                TIME_MARKER_EVERY_S,
            )
            return cls()
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} must hold a JSON object")
        if "time_marker_every_seconds" not in raw and raw.get("enable_time_marker") is not False:
            # transformers' and upstream's processor classes take 2 s here (MODEL.md 9, surprise
            # 1): the reference's prompts then differ from ours, so say which value runs
            log.warning(
                "%s gives no time_marker_every_seconds; using %d s (the shipped value; the "
                "processor classes' default is 2)",
                path,
                TIME_MARKER_EVERY_S,
            )
        every = raw.get("time_marker_every_seconds", TIME_MARKER_EVERY_S)
        rate = raw.get("audio_tokens_per_second", AUDIO_TOKENS_PER_SECOND)
        # 5.0 read as the 5 it means (transformers 5.24's processor fails on it: range() of a
        # float); 2.5 is refused below, as there
        if isinstance(every, float) and every.is_integer():
            every = int(every)
        if not isinstance(every, int) or every < 0:
            raise ConfigError(
                f"{path}: time_marker_every_seconds must be an int >= 0, not {every!r}"
            )
        if not isinstance(rate, int | float) or rate <= 0:
            raise ConfigError(f"{path}: audio_tokens_per_second must be > 0, not {rate!r}")
        merge = raw.get("audio_merge_size", MERGE_SIZE)
        if merge != MERGE_SIZE:  # the front end's pads per second assume 4 (MODEL.md 3)
            raise ConfigError(f"{path}: audio_merge_size {merge!r} unsupported (expected 4)")
        if raw.get("enable_time_marker", True) is False:
            every = 0
        return cls(time_marker_every_s=every, audio_tokens_per_second=float(rate))


@dataclass(frozen=True, eq=False)
class PromptIds:
    """A built prompt.

    `ids`: all prompt token ids, length header_len + span_len + suffix_len; the caller's own
    list (the engine appends forced ids to it).
    `audio_positions`: int64 [T], read-only: indices into `ids` of the T `<|audio_pad|>`
    tokens, ascending; audio embedding i goes to `ids[audio_positions[i]]`. An array, not a
    list: a PromptBuilder hands out a view of its template (a fresh array only in the quirk
    window, where a marker is due but not yet present), and the engine checks it in C (a
    30-minute meeting has ~22,500 positions, rebuilt every live hop).
    `header_len`: ids before the span (ending with `<|audio_start|>`); `span_len`: pads plus
    marker digits; `suffix_len`: ids from `<|audio_end|>` to the end.
    """

    ids: list[int]
    audio_positions: np.ndarray
    header_len: int
    span_len: int
    suffix_len: int

    @property
    def num_audio_tokens(self) -> int:
        return len(self.audio_positions)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PromptIds):
            return NotImplemented
        return (
            self.ids == other.ids
            and np.array_equal(self.audio_positions, other.audio_positions)
            and (self.header_len, self.span_len, self.suffix_len)
            == (other.header_len, other.span_len, other.suffix_len)
        )


def build_prompt(
    tokenizer: Tokenizer,
    num_audio_tokens: int,
    *,
    prompt: str | None = None,
    hotwords: Sequence[str] = (),
    config: PromptConfig = PromptConfig(),  # noqa: B008  (frozen, so a shared default is safe)
) -> PromptIds:
    """Build the prompt ids for `num_audio_tokens` (T >= 1) audio tokens.

    `prompt` replaces the instruction after the audio; None or blank uses `config.instruction`.
    `hotwords` (blank entries dropped) are appended to the instruction in the upstream README form:
    `热词提示：w1, w2` when the instruction contains CJK text (the default does), else
    ` Hotwords: w1, w2`. This is a choice: the transformers hub template uses a different
    `热词列表：` line, but the upstream form is the model authors' (MODEL.md 5.2).
    Raises BadAudio for T < 1 and InvalidRequest when the prompt or a hotword contains the text of
    a special token (it would be encoded as that token and break the chat structure).
    """
    if num_audio_tokens < 1:
        raise BadAudio(f"audio gives {num_audio_tokens} audio tokens; at least 1 is needed")
    instruction = render_instruction(tokenizer, prompt, hotwords, config)
    header = _encode(tokenizer, HEADER_TEXT)
    span, pad_offsets = audio_span(num_audio_tokens, config)
    suffix = _encode(tokenizer, _SUFFIX_TEMPLATE.format(instruction=instruction))
    return PromptIds(
        ids=header + span + suffix,
        audio_positions=_read_only(np.asarray(pad_offsets, dtype=np.int64) + len(header)),
        header_len=len(header),
        span_len=len(span),
        suffix_len=len(suffix),
    )


PROMPT_SUFFIX_CACHE_SIZE = 256  # (prompt, hotwords) pairs a PromptBuilder keeps tokenized
SPAN_TEMPLATE_MIN_PADS = 8_192  # pads of a PromptBuilder's first span template (~11 minutes)


class PromptBuilder:
    """`build_prompt` for one tokenizer and config, with O(1) Python work per call in the
    number of audio tokens: the header and each instruction's suffix are tokenized once, and
    the span is a slice of a template that holds every marker (grown by doubling), patched in
    the quirk window where a marker's pad is past but the marker is not yet present
    (`audio_span`). Why: a live session builds its whole prompt every hop, and the direct
    build took ~0.7 ms at 7.5 minutes of audio; a 100-session H200 run spent 6.5 % of its
    worker's time there (docs/benchmarks.md, session 16). Equal to `build_prompt` for every T,
    prompt and hotwords (tests/models/test_prompt.py). `build` raises as `build_prompt` does:
    BadAudio for T < 1, InvalidRequest for special-token text in the prompt or a hotword, or
    hotwords given as one string."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: PromptConfig = PromptConfig(),  # noqa: B008  (frozen: a shared default is safe)
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self._header = _encode(tokenizer, HEADER_TEXT)
        self._suffixes: OrderedDict[tuple[str | None, tuple[str, ...]], list[int]] = OrderedDict()
        self._span: list[int] = []  # template: pads, with marker k after pad per * k
        # ids index of each template pad (header included); read-only, as results are views
        self._positions = _read_only(np.zeros(0, dtype=np.int64))
        self._digits_through: list[int] = [0]  # [k]: digit ids of markers 1..k

    def build(
        self, num_audio_tokens: int, prompt: str | None = None, hotwords: Sequence[str] = ()
    ) -> PromptIds:
        """As `build_prompt(tokenizer, num_audio_tokens, prompt=..., hotwords=..., config=...)`."""
        if num_audio_tokens < 1:
            raise BadAudio(f"audio gives {num_audio_tokens} audio tokens; at least 1 is needed")
        suffix = self._suffix(prompt, hotwords)
        span, positions = self._audio_span(num_audio_tokens)
        return PromptIds(
            ids=self._header + span + suffix,
            audio_positions=positions,
            header_len=len(self._header),
            span_len=len(span),
            suffix_len=len(suffix),
        )

    def _suffix(self, prompt: str | None, hotwords: Sequence[str]) -> list[int]:
        if isinstance(hotwords, str):  # before the key: tuple("ab") would look like a list
            raise InvalidRequest("hotwords must be a list of strings, not one string")
        words = tuple(hotwords)  # read once: an iterator would be empty the second time
        key = (prompt, words)
        suffix = self._suffixes.get(key)
        if suffix is None:
            instruction = render_instruction(self.tokenizer, prompt, words, self.config)
            suffix = _encode(self.tokenizer, _SUFFIX_TEMPLATE.format(instruction=instruction))
            self._suffixes[key] = suffix
            if len(self._suffixes) > PROMPT_SUFFIX_CACHE_SIZE:
                self._suffixes.popitem(last=False)
        else:
            self._suffixes.move_to_end(key)
        return suffix

    def _audio_span(self, num_audio_tokens: int) -> tuple[list[int], np.ndarray]:
        """The span ids and the ids indices of its pads (header included) for T tokens."""
        per, base = self.config.pads_per_marker, len(self._header)
        if per <= 0:
            positions = np.arange(base, base + num_audio_tokens, dtype=np.int64)
            return [AUDIO_PAD] * num_audio_tokens, _read_only(positions)
        if len(self._positions) < num_audio_tokens:
            self._grow(max(num_audio_tokens, 2 * len(self._positions), SPAN_TEMPLATE_MIN_PADS))
        present = num_markers(num_audio_tokens, self.config)
        split = per * (present + 1)  # marker `present + 1` sits after this pad, once present
        if num_audio_tokens <= split:
            end = num_audio_tokens + self._digits_through[present]
            return self._span[:end], self._positions[:num_audio_tokens]
        # the quirk window: pads past `split` come before marker `present + 1` is due
        end = split + self._digits_through[present]
        extra = num_audio_tokens - split
        span = self._span[:end] + [AUDIO_PAD] * extra
        tail = np.arange(base + end, base + end + extra, dtype=np.int64)
        return span, _read_only(np.concatenate((self._positions[:split], tail)))

    def _grow(self, num_pads: int) -> None:
        """Rebuild the template for `num_pads` pads (and every marker whose pad they reach)."""
        per, every, base = (
            self.config.pads_per_marker,
            self.config.time_marker_every_s,
            len(self._header),
        )
        span: list[int] = []
        positions: list[int] = []
        digits_through = [0]
        for k in range(1, num_pads // per + 1):
            positions.extend(range(base + len(span), base + len(span) + per))
            span.extend([AUDIO_PAD] * per)
            marker = [DIGIT_IDS[int(d)] for d in str(k * every)]
            span.extend(marker)
            digits_through.append(digits_through[-1] + len(marker))
        rest = num_pads - len(positions)
        positions.extend(range(base + len(span), base + len(span) + rest))
        span.extend([AUDIO_PAD] * rest)
        self._span, self._digits_through = span, digits_through
        self._positions = _read_only(np.asarray(positions, dtype=np.int64))


def render_instruction(
    tokenizer: Tokenizer,
    prompt: str | None,
    hotwords: Sequence[str],
    config: PromptConfig,
) -> str:
    """The instruction text after the audio (see `build_prompt` for the rules)."""
    if isinstance(hotwords, str):
        raise InvalidRequest("hotwords must be a list of strings, not one string")
    instruction = prompt if prompt is not None and prompt.strip() else config.instruction
    words = [w.strip() for w in hotwords if w.strip()]
    for text in (instruction, *words):
        _reject_special_text(tokenizer, text)
    if words:
        prefix = HOTWORDS_PREFIX_ZH if _has_cjk(instruction) else HOTWORDS_PREFIX_EN
        instruction = instruction + prefix + HOTWORDS_JOIN.join(words)
    return instruction


def audio_span(num_audio_tokens: int, config: PromptConfig) -> tuple[list[int], list[int]]:
    """The audio span ids and the offsets of its pads within it.

    Marker k (k = 1..K) is the decimal string of k * every seconds, one id per digit, placed
    after pad `pads_per_marker * k`; K = int(int(T / rate) / every), so a marker appears only
    once T >= 62.5 k although it sits after pad 62 k (MODEL.md 5.3, quirks 1 and 2).
    """
    per = config.pads_per_marker
    span: list[int] = []
    pad_offsets: list[int] = []
    pads = 0

    def add_pads(n: int) -> None:
        nonlocal pads
        pad_offsets.extend(range(len(span), len(span) + n))
        span.extend([AUDIO_PAD] * n)
        pads += n

    for k in range(1, num_markers(num_audio_tokens, config) + 1):
        add_pads(per * k - pads)
        span.extend(DIGIT_IDS[int(d)] for d in str(k * config.time_marker_every_s))
    add_pads(num_audio_tokens - pads)
    return span, pad_offsets


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def num_markers(num_audio_tokens: int, config: PromptConfig) -> int:
    """Time markers in the span for T audio tokens: int(int(T / rate) / every); 0 if disabled."""
    if config.pads_per_marker <= 0:
        return 0
    whole_seconds = int(num_audio_tokens / config.audio_tokens_per_second)
    return whole_seconds // config.time_marker_every_s


def stable_prefix_len(
    num_audio_tokens_now: int,
    num_complete_windows: int,
    *,
    config: PromptConfig = PromptConfig(),  # noqa: B008
    header_len: int = HEADER_LEN,
) -> int:
    """Leading prompt ids (header plus span prefix) that stay the same, with final audio
    embeddings at their pads, however the audio grows (MODEL.md 10, item 2).

    With T = `num_audio_tokens_now` and W = `num_complete_windows` (30 s windows already
    encoded for good), the stable pads are min(T, 375 W, 62 (K + 1)), K = markers present now:
    marker K + 1 will be inserted after pad 62 (K + 1) once T reaches 62.5 (K + 1). The digits of
    markers placed at or before that pad count too. The KV cache of these ids can be reused.
    Raises ValueError if 375 W > T (more complete windows than audio).
    """
    if num_complete_windows * TOKENS_PER_WINDOW > num_audio_tokens_now or num_complete_windows < 0:
        raise ValueError(
            f"{num_complete_windows} complete windows need at least "
            f"{num_complete_windows * TOKENS_PER_WINDOW} audio tokens, have {num_audio_tokens_now}"
        )
    per = config.pads_per_marker
    present = num_markers(num_audio_tokens_now, config)
    next_marker_pad = per * (present + 1) if per > 0 else math.inf
    stable_pads = int(
        min(num_audio_tokens_now, num_complete_windows * TOKENS_PER_WINDOW, next_marker_pad)
    )
    digits = 0
    for k in range(1, present + 1):
        if per * k > stable_pads:
            break
        digits += len(str(k * config.time_marker_every_s))
    return header_len + stable_pads + digits


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def _reject_special_text(tokenizer: Tokenizer, text: str) -> None:
    for token in tokenizer.get_added_tokens_decoder().values():
        if token.content in text:
            raise InvalidRequest(f"prompt and hotwords must not contain {token.content!r}")


def _has_cjk(text: str) -> bool:
    """Whether `text` holds CJK writing: unified ideographs and ext A, kana, Hangul syllables,
    full-width forms. Not `segments.is_cjk`, which also counts CJK punctuation (U+3000-303F)
    because it decides where texts join without a space: an English instruction ending in
    "。" is still English here."""
    return any(
        0x3040 <= ord(c) <= 0x30FF
        or 0x3400 <= ord(c) <= 0x9FFF
        or 0xAC00 <= ord(c) <= 0xD7AF
        or 0xFF00 <= ord(c) <= 0xFFEF
        for c in text
    )
