"""Draft verification on the GPU at real size (dummy bf16 weights): with CUDA graphs, piecewise
prefill graphs and async decode, a batch of requests carrying drafts (right then wrong, wrong
at once, right past the length limit) gets exactly the greedy outputs it gets without drafts,
with a bf16 and an FP8 KV cache. The CPU twin on the tiny checkpoint:
tests/engine/test_draft_engine.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CLIP_SECONDS = (12.0, 31.0, 47.0, 64.0)
MAX_NEW = 24


def _outputs(engine, clips, drafts=None):  # type: ignore[no-untyped-def]
    for i, clip in enumerate(clips):
        draft = drafts[i] if drafts else ()
        engine.add_request(f"r{i}", clip, max_new_tokens=MAX_NEW, draft_token_ids=draft)
    done = engine.run_to_completion()
    return [done[f"r{i}"] for i in range(len(clips))]


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_drafts_give_the_greedy_outputs_on_cuda(kv_cache_dtype: str) -> None:
    from livemeet.engine.engine import Engine, EngineConfig
    from livemeet.models.loader import load_model
    from loadtest.workloads import synthetic_audio

    model = load_model(None, load_format="dummy", device="cuda", dtype="bfloat16")
    config = EngineConfig(num_kv_blocks=2_048, kv_cache_dtype=kv_cache_dtype)
    engine = Engine(config, model=model)
    clips = [synthetic_audio(s, seed=i) for i, s in enumerate(CLIP_SECONDS)]
    greedy = [r.output_token_ids for r in _outputs(engine, clips)]
    assert all(len(g) >= 10 for g in greedy), "a dummy model stopped early: no draft to test"
    vocab = model[1].text.vocab
    wrong = [(g[0] + 1) % vocab for g in greedy]
    drafts = [
        greedy[0][:9] + [(greedy[0][9] + 1) % vocab] * 4,
        [wrong[1]] * 6,
        greedy[2] + [wrong[2]] * 3,
        greedy[3][: MAX_NEW - 1],
    ]
    got = _outputs(engine, clips, drafts)
    for i, r in enumerate(got):
        assert r.output_token_ids == greedy[i], i
    accepted = [r.num_accepted_draft_tokens for r in got]
    assert accepted[:2] == [9, 0] and accepted[3] == MAX_NEW - 1, accepted
    assert accepted[2] == len(greedy[2]) - 1, accepted  # all of it, cut by the limit
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
