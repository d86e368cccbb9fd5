"""An analytic estimate of one engine step's GPU time, used by the scheduler's time budget.

A step runs the decoder once over a ragged batch: some prefill chunks (many query tokens each)
and some decode rows (one query token each). Its time is modelled as

    step = weights_read + overhead                       once per step
         + per_token * (all query tokens in the step)    linear layers (compute-bound)
         + attention_pair * (query, key) pairs           prefill attention (compute-bound)
         + kv_read_per_token * context of each decode    decode attention (bandwidth-bound)

The quadratic term is why a late 4,096-token chunk of a 90-minute prompt (~71k tokens of
context) costs ~230 ms in bf16 (~280 ms over an FP8 cache) while the first chunk of the same
prompt costs ~15 ms (DESIGN.md section 4 says ~150-200 ms, for faster attention than the
extend kernel measures).

Default coefficients (a bf16 KV cache), derived from the H200 figures of DESIGN.md section 10,
the kernels as measured on an H200 (docs/benchmarks.md) and the decoder shape of MODEL.md
section 3 (28 layers, 16 query heads, 8 KV heads, head_dim 128, ~0.44 B non-embedding
parameters):
- `weights_read_s` = 1.19 GB / 4.1 TB/s (measured copy bandwidth) = 0.29 ms.
- `step_overhead_s` = 0.4 ms: batch 16 at 36k context measured 16.8 ms against a 16.4 ms floor.
  (Batch 1 at 36k measured 3.44 ms with SDPA against a 1.30 ms floor; the split-K decode kernel
  is meant to close that gap, so the model assumes the floor and under-estimates until then.)
- `per_token_s` = 2 x 0.44e9 FLOP / ~450 TFLOP/s (about half of the H200's dense bf16 peak)
  ~ 2.0 us per query token.
- `attention_s_per_pair` = 28 x 16 x 128 x 4 FLOP (QK^T and PV, multiply-add) = 229,376 FLOP
  per (query, key) pair, at the extend kernel's ~300 TFLOP/s ~ 0.76 ns. (300: the kernel on a
  late 2,500-token chunk over ~30k tokens of context, the shape the budget cuts; 278-370 over
  four shapes; loadtest/sweep_extend_kernel.py, docs/benchmarks.md session 10.)
- `kv_read_s_per_token` = 112 KiB / 4.1 TB/s ~ 28 ns per context token per decode row.

- `encode_s_per_window` = 2.5 ms: the audio encoder (log-mel, Whisper encoder, merge and
  adaptor) for one 30-s window in a batch of 8-64 on an H200 (the encoder graphs ran 2.43-2.49
  ms a window, docs/benchmarks.md session 11; one window alone 4.0 ms). Charged (by the
  Scheduler) for an upload's windows that its chunks reach while live sessions run (not for
  those the encoder's cache holds: `Request.cached_audio_windows`), because encoded all at
  once a 37-minute upload's 75 windows held every live hop for one ~0.2-s step (~0.27 s on
  an H100, session 47).

`for_kv_cache("fp8_e4m3")` keeps the rest and takes the FP8 kernels' rates: the extend kernel
converts every e4m3 tile to fp16 and runs ~240 TFLOP/s on the late chunk (229-297 over the
four shapes) ~ 0.96 ns per pair; decode reads 56 KiB per token at 0.92 x 4.32 TB/s (16 x 36k,
session 10) ~ 14 ns. With the bf16 figures an FP8 step planned for 50 ms ran 70-95 ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from livemeet.audio.constants import KV_BYTES_PER_TOKEN, KV_CACHE_DTYPES
from livemeet.errors import ConfigError

H200_COPY_BANDWIDTH_B_PER_S = 4.1e12  # bytes/s, measured (DESIGN.md section 10)
DECODER_WEIGHT_BYTES = 1.19e9  # bytes read per decode step (DESIGN.md section 10)
ATTENTION_FLOP_PER_PAIR = 28 * 16 * 128 * 4  # layers x heads x head_dim x (QK^T, PV) x 2
EXTEND_FLOP_PER_S_BF16 = 300e12  # the extend kernel on a late chunk, bf16 cache (H200)
EXTEND_FLOP_PER_S_FP8 = 240e12  # the same over an FP8 cache (docs/benchmarks.md, session 10)
DECODE_READ_B_PER_S_FP8 = 0.92 * 4.32e12  # FP8 decode attention at 16 x 36k (session 10)
ENCODE_S_PER_WINDOW = 2.5e-3  # s per 30-s window, batches of 8-64 on an H200 (session 11)


@dataclass(frozen=True)
class StepCostModel:
    """Coefficients of the step-time model (seconds); see the module docstring for each one."""

    weights_read_s: float = DECODER_WEIGHT_BYTES / H200_COPY_BANDWIDTH_B_PER_S
    step_overhead_s: float = 0.4e-3
    per_token_s: float = 2.0e-6
    attention_s_per_pair: float = ATTENTION_FLOP_PER_PAIR / EXTEND_FLOP_PER_S_BF16
    kv_read_s_per_token: float = KV_BYTES_PER_TOKEN / H200_COPY_BANDWIDTH_B_PER_S
    encode_s_per_window: float = ENCODE_S_PER_WINDOW

    @classmethod
    def for_kv_cache(cls, kv_cache_dtype: str) -> StepCostModel:
        """The model for a KV cache of `kv_cache_dtype` ("auto": the model's 16-bit dtype, the
        defaults; "fp8_e4m3": the FP8 kernels' rates, see the module docstring). Raises
        ConfigError for any other name."""
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"no step cost model for a {kv_cache_dtype!r} KV cache")
        if kv_cache_dtype == "auto":
            return cls()
        return cls(
            attention_s_per_pair=ATTENTION_FLOP_PER_PAIR / EXTEND_FLOP_PER_S_FP8,
            kv_read_s_per_token=KV_BYTES_PER_TOKEN / 2 / DECODE_READ_B_PER_S_FP8,
        )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"StepCostModel.{f.name} must be finite and >= 0, not {value}")

    @property
    def fixed_s(self) -> float:
        """Cost paid once by every non-empty step (seconds)."""
        return self.weights_read_s + self.step_overhead_s

    def prefill_cost_s(self, start: int, num_tokens: int) -> float:
        """Seconds to prefill tokens [start, start + num_tokens) with causal attention.

        Query token i (0-based within the chunk) attends to start + i + 1 keys, so the chunk
        has num_tokens * start + num_tokens * (num_tokens + 1) / 2 (query, key) pairs.
        """
        assert start >= 0 and num_tokens >= 0
        pairs = num_tokens * start + num_tokens * (num_tokens + 1) / 2
        return self.per_token_s * num_tokens + self.attention_s_per_pair * pairs

    def decode_cost_s(self, context_tokens: int) -> float:
        """Seconds for one decode row whose attention reads `context_tokens` tokens of KV."""
        assert context_tokens >= 1
        return self.per_token_s + self.kv_read_s_per_token * context_tokens

    def encode_cost_s(self, num_windows: int) -> float:
        """Seconds to encode `num_windows` 30-s audio windows."""
        assert num_windows >= 0
        return self.encode_s_per_window * num_windows

    def max_prefill_tokens(self, start: int, budget_s: float, limit: int) -> int:
        """Largest n <= limit with prefill_cost_s(start, n) <= budget_s (0 when none fits)."""
        if limit <= 0 or budget_s <= 0:
            return 0
        # cost(n) = a n^2 + b n with a = pair/2, b = per_token + pair * (start + 1/2)
        a = self.attention_s_per_pair / 2
        b = self.per_token_s + self.attention_s_per_pair * (start + 0.5)
        if a == 0:
            n = limit if b == 0 else int(budget_s / b)
        else:
            n = int((-b + math.sqrt(b * b + 4 * a * budget_s)) / (2 * a))
        n = min(n, limit)
        # float rounding can put the closed form one off either way
        while n > 0 and self.prefill_cost_s(start, n) > budget_s:
            n -= 1
        while n < limit and self.prefill_cost_s(start, n + 1) <= budget_s:
            n += 1
        return n
