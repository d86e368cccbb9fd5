"""loadtest.probe_prefill_sdpa: the gather and the LSE-merged cuDNN forms' arithmetic (CPU).

cuDNN's op runs on a GPU only; here a plain fp32 attention with its signature (output and
log-sum-exp, `is_causal` aligned top-left as cuDNN's) stands in, so what is checked is the
probe's own part: splitting the chunk's keys at its prefix, folding query heads into the
query length, and merging the two halves by their log-sum-exps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from loadtest import probe_prefill_sdpa as probe


def _attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: None,
    lse: bool,
    dropout: float,
    is_causal: bool,
    debug: bool,
    *,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, H, n, D] x [B, H, L, D]: output and log-sum-exp [B, H, n]; the causal mask top-left."""
    assert bias is None and lse and dropout == 0.0 and not debug
    assert q.shape[1] == k.shape[1], "cuDNN's op is called with as many KV heads as query heads"
    s = q.float() @ k.float().transpose(-1, -2) * scale
    if is_causal:
        n, length = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, length, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.float(), torch.logsumexp(s, -1)


@pytest.mark.parametrize("form", [probe.cudnn_two_part, probe.cudnn_folded])
@pytest.mark.parametrize("prefix", [0, 1, 37])
def test_the_cudnn_forms_equal_attention_aligned_to_the_last_keys(
    monkeypatch: pytest.MonkeyPatch, form: object, prefix: int
) -> None:
    monkeypatch.setattr(probe, "_cudnn", _attention_with_lse)
    torch.manual_seed(prefix)
    n, heads, kv_heads, d = 9, 4, 2, 8
    q = torch.randn(1, heads, n, d)
    k, v = (torch.randn(1, kv_heads, prefix + n, d) for _ in "kv")
    expected = F.scaled_dot_product_attention(
        q,
        k.repeat_interleave(2, 1),
        v.repeat_interleave(2, 1),
        attn_mask=causal_lower_right(n, prefix + n),
        scale=0.3,
    )
    assert callable(form)
    got = form(q, k, v, 0.3)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_gather_lays_out_the_sequence_from_its_blocks_and_scales_fp8() -> None:
    block, kv_heads, d = 4, 2, 8
    seq_len = 10  # three blocks, the last one partly used
    table = torch.tensor([[5, 0, 3, 0]], dtype=torch.int32)
    for dtype, scale in ((torch.bfloat16, 1.0), (torch.float8_e4m3fn, 0.5)):
        k_cache = torch.randn(6, block, kv_heads, d).to(dtype)
        v_cache = torch.randn(6, block, kv_heads, d).to(dtype)
        step = {
            "k_cache": k_cache,
            "v_cache": v_cache,
            "block_tables": table,
            "seq_lens": torch.tensor([seq_len], dtype=torch.int32),
            "k_scale": scale,
            "v_scale": scale,
        }
        k, v = probe.gather(step)
        assert k.shape == v.shape == (1, kv_heads, seq_len, d) and k.dtype == torch.bfloat16
        for out, cache in ((k, k_cache), (v, v_cache)):
            for t in range(seq_len):
                row = cache[table[0, t // block], t % block].float() * scale  # [kv_heads, D]
                torch.testing.assert_close(out[0, :, t].float(), row.to(torch.bfloat16).float())
