"""GPU proof of the serving engine's parity (the serving-engine issue; DESIGN.md section 8).

Real-size dummy weights in bf16 on the GPU (our loader), the same tensors copied into the
transformers 5.24 reference, 40 s and 100 s of real speech with encoder windows run one at a
time on both sides; teacher-forced logits over a 64-token forced transcript through our paged
kernels (direct) and through the Engine (with CUDA graphs and async decode when EngineConfig
offers them), then 32 greedy steps. Prints max |delta| and top-1 agreement where the
reference's top-1 margin exceeds 0.05 (copied into docs/benchmarks.md) and writes them to
$LIVEMEET_BENCH_OUT/parity.json when set. The same comparison runs on the CPU in fp32 on the
tiny checkpoint in test_parity_tiny.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CLIP_SECONDS = (40.0, 100.0)
MIN_AGREEMENT = 0.99  # top-1 agreement where the reference margin > 0.05 (the issue)
CHUNK_SIZE = 512  # prefill chunk: the 100 s prompt (~1.4k tokens) takes three


def test_bf16_teacher_forced_parity_real_size(long_speech: np.ndarray, shared_data: Path) -> None:
    from livemeet.models.loader import load_model
    from livemeet.models.tokenizer import load_tokenizer
    from tests.gpu import parity

    model, _ = load_model(None, load_format="dummy", device="cuda", dtype="bfloat16")
    ref = parity.reference_from_ours(model, "cuda", torch.bfloat16)
    clips = {s: long_speech[: int(s * 16_000)] for s in CLIP_SECONDS}
    forced = parity.forced_transcript(
        load_tokenizer(None), parity.reference_texts(shared_data), parity.FORCED_TOKENS
    )
    report = parity.run_parity(model, ref, clips, forced, parity.ParitySetup(CHUNK_SIZE))
    print(report.summary())
    # The optional FP8 KV cache: its effect on the same logits (the "engine" path uses it; the
    # "direct" path keeps bf16 KV). Reported, not asserted: FP8 is a documented trade-off.
    fp8_options = {**parity.FAST_DECODE_OPTIONS, "kv_cache_dtype": "fp8_e4m3"}
    fp8 = parity.run_parity(
        model, ref, clips, forced, parity.ParitySetup(CHUNK_SIZE, engine_options=fp8_options)
    )
    print("FP8 KV cache:\n" + fp8.summary())
    out = os.environ.get("LIVEMEET_BENCH_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "parity.json").write_text(report.to_json())
        (Path(out) / "parity_fp8.json").write_text(fp8.to_json())
    for clip in report.clips:
        assert clip.prompt_ids_match_reference
        for path in clip.logits:
            assert path.error is None, path.error
            assert path.num_confident > 0
            assert path.top1_agreement >= MIN_AGREEMENT, (clip.seconds, path)
