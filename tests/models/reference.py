"""Test helper: the transformers 5.24 MOSS-TD processor as an oracle, built fully offline.

The hub's `chat_template.jinja` is not available here, so `CHAT_TEMPLATE` is our reconstruction
(MODEL.md 5.1): it renders
`<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n`
`<|audio_start|><|audio_pad|><|audio_end|>\\n{instruction}<|im_end|>\\n<|im_start|>assistant\\n`
where the instruction is the text item, or the default instruction when there is none, and
keywords are appended in the upstream README form `热词提示：w1, w2` (the hub template's own
`热词列表：` line is not reproduced). It matches the HF golden prompt ids for the default case.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from livemeet.models.prompt import DEFAULT_INSTRUCTION, HOTWORDS_JOIN, HOTWORDS_PREFIX_ZH
from livemeet.models.tokenizer import load_tokenizer

CHAT_TEMPLATE = (
    "{%- set default_instruction = '" + DEFAULT_INSTRUCTION + "' -%}"
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- set ns = namespace(text='', has_audio=false, keywords=[]) -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'audio' -%}"
    "{{ '<|audio_start|><|audio_pad|><|audio_end|>\\n' }}"
    "{%- set ns.has_audio = true -%}"
    "{%- elif item['type'] == 'text' -%}"
    "{%- set ns.text = ns.text + item['text'] -%}"
    "{%- elif item['type'] == 'keywords' -%}"
    "{%- set ns.keywords = item['keywords'] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if ns.has_audio and ns.text | trim == '' -%}"
    "{%- set ns.text = default_instruction -%}"
    "{%- endif -%}"
    "{{ ns.text }}"
    "{%- if ns.keywords -%}"
    "{{ '" + HOTWORDS_PREFIX_ZH + "' + ns.keywords | join('" + HOTWORDS_JOIN + "') }}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- endif -%}"
)


@cache
def make_reference_tokenizer() -> Any:
    """`Qwen2TokenizerFast` wrapping livemeet's offline tokenizer (MODEL.md 5.4 recipe)."""
    from transformers import Qwen2TokenizerFast

    return Qwen2TokenizerFast(
        tokenizer_object=load_tokenizer(None),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
    )


@cache
def make_reference_processor(time_marker_every_seconds: int = 5) -> Any:
    """The transformers 5.24 `MossTranscribeDiarizeProcessor` with the shipped marker spacing.

    Call `proc.apply_transcription_request(wave, return_tensors="pt")` (wave: float32 mono
    16 kHz numpy array); `padding=True` for batches.
    """
    from transformers.models.moss_transcribe_diarize import (
        MossTranscribeDiarizeFeatureExtractor,
        MossTranscribeDiarizeProcessor,
    )

    return MossTranscribeDiarizeProcessor(
        feature_extractor=MossTranscribeDiarizeFeatureExtractor(),
        tokenizer=make_reference_tokenizer(),
        chat_template=CHAT_TEMPLATE,
        time_marker_every_seconds=time_marker_every_seconds,
    )
