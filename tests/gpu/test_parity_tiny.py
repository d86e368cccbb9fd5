"""The bf16 GPU parity proof's comparison, run on the CPU in fp32 on the tiny checkpoint.

Same function, same clips (40 s and 100 s of real speech), small prefill chunks so the prompt
spans several chunks. In fp32 on the CPU both of our paths must match the reference: top-1 agreement
1.0, identical greedy tokens, and max |delta| below 1e-5 of the largest reference logit.

Why relative: the tiny model's logits reach ~180 (its sharp norms keep random greedy decoding
from degenerating, tests/models/tiny.py), and the paged CPU fallback (gather + SDPA) sums in
another order than the reference's dense SDPA: measured 5.9e-4 at 182 (3e-6 relative, tens of
fp32 ulps), while a 1% change of one norm weight moves the logits by > 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from livemeet.models.audio_llm import MossTDModel
from livemeet.models.tokenizer import load_tokenizer
from tests.gpu import parity

CLIP_SECONDS = (40.0, 100.0)
RELATIVE_TOLERANCE = 1e-5  # max |logit delta| / max |reference logit|, fp32


@pytest.fixture(scope="module")
def report(
    our_model: MossTDModel, long_speech: np.ndarray, shared_data: Path
) -> parity.ParityReport:
    ref = parity.reference_from_ours(our_model, "cpu", torch.float32)
    clips = {s: long_speech[: int(s * 16_000)] for s in CLIP_SECONDS}
    forced = parity.forced_transcript(
        load_tokenizer(None), parity.reference_texts(shared_data), parity.FORCED_TOKENS
    )
    setup = parity.ParitySetup(chunk_size=200, greedy_steps=parity.GREEDY_STEPS)
    return parity.run_parity(our_model, ref, clips, forced, setup)


def test_tiny_fp32_paths_match_reference_exactly(report: parity.ParityReport) -> None:
    print(report.summary())
    assert [c.seconds for c in report.clips] == list(CLIP_SECONDS)
    for clip in report.clips:
        assert clip.prompt_ids_match_reference
        assert [p.path for p in clip.logits] == ["direct", "engine"]
        for path in clip.logits:
            assert path.error is None, path.error
            assert path.num_positions == parity.FORCED_TOKENS
            assert path.num_confident >= parity.FORCED_TOKENS // 2
            assert path.top1_agreement == 1.0
            assert path.max_abs_delta < RELATIVE_TOLERANCE * path.reference_scale
        assert clip.greedy_first_divergence is None
        assert len(clip.greedy_ours) == parity.GREEDY_STEPS
        assert len(set(clip.greedy_ours)) >= 8  # not a degenerate repeat


def test_report_json_round_trips(report: parity.ParityReport) -> None:
    body = json.loads(report.to_json())
    assert body["device"] == "cpu" and body["dtype"] == "float32"
    assert len(body["clips"]) == len(CLIP_SECONDS)
    assert body["clips"][0]["logits"][0]["path"] == "direct"


def test_comparison_detects_a_perturbed_model(
    our_model: MossTDModel, long_speech: np.ndarray, shared_data: Path
) -> None:
    # The reference gets a slightly different final norm: the numbers must show it.
    state = dict(our_model.state_dict())
    state["language_model.norm.weight"] = state["language_model.norm.weight"] * 1.01
    ref = parity.reference_from_state(state, our_model.cfg, "cpu", torch.float32)
    forced = parity.forced_transcript(load_tokenizer(None), parity.reference_texts(shared_data), 16)
    _, embeds = parity._reference_prompt(ref, long_speech[:16_000])
    ref_logits = parity._reference_logits(ref, embeds, forced)
    from livemeet.engine.encoder_runner import EncoderRunner
    from livemeet.models.prompt import build_prompt

    audio = EncoderRunner(our_model, cache_windows=0).encode([long_speech[:16_000]])[0]
    prompt = build_prompt(load_tokenizer(None), audio.shape[0]).ids
    ours = parity.ours_direct_logits(our_model, prompt, audio, forced, 64)
    result = parity.compare_logits("direct", ours, ref_logits, parity.MARGIN)
    assert result.max_abs_delta > 100 * RELATIVE_TOLERANCE * result.reference_scale


def test_reference_load_rejects_missing_tensors(our_model: MossTDModel) -> None:
    state = dict(our_model.state_dict())
    del state["adaptor.norm.weight"]
    with pytest.raises(parity.ParityError, match="multi_modal_projector.norm.weight"):
        parity.reference_from_state(state, our_model.cfg, "cpu", torch.float32)


def test_compare_logits_margin_and_divergence() -> None:
    ref = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.99, 0.0], [0.0, 2.0, 0.0]])
    ours = torch.tensor([[0.9, 0.0, 0.0], [0.98, 1.0, 0.0], [0.0, 0.0, 3.0]])
    result = parity.compare_logits("x", ours, ref, 0.05)
    # Row 1 (margin 0.01) is not confident; of rows 0 and 2, only row 0 agrees.
    assert result.num_confident == 2 and result.top1_agreement == 0.5
    assert result.max_abs_delta == pytest.approx(3.0)
    assert parity.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert parity.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert parity.first_divergence([1, 2], [1, 2, 3]) == 2
