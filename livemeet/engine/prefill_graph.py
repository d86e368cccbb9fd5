"""Piecewise CUDA graphs for steps that prefill.

A step with prefill chunks cannot replay a decode graph: its attention is ragged per sequence.
Run eagerly, the fused decoder launches ~10 kernels per layer from Python, ~15-20 ms per step
on an H200 host whatever the token count (loadtest/bench_decode_step.py, "eager"), which caps
bursts of short uploads and live hops (every hop is a prefill). Everything but attention is
per-token, so the decoder is cut at each attention call into L + 1 pieces (vLLM's "piecewise"
graphs follow the same idea):
- piece 0: layer 0's pre-attention (`Qwen3Layer.pre_attention`);
- piece i, 0 < i < L: layer i-1's post-attention, then layer i's pre-attention;
- piece L: the last layer's post-attention and the final norm.
Each piece is captured once per token bucket (PREFILL_BUCKETS up to the step's token limit); a
step of n tokens runs in the smallest bucket >= n, and between pieces the attention (store-KV
and the paged kernels, reading the step's own metadata) runs eagerly on the first n rows.

Rows [n, bucket) hold stale values from earlier steps. Every op inside a piece is
row-independent (norms, GEMMs, RoPE, SiLU), so they cannot reach the real rows, and attention
only ever reads the first n rows. Static buffers (largest bucket, sliced per graph): embeds
[T, hidden] and positions int64 [T] (inputs); q [T, heads, D], k and v [T, kv_heads, D],
residual [T, hidden] (pre-attention outputs); attn_out [T, heads, D] (attention output);
out [T, hidden] (the final hidden states).

With `use_graphs=False` the same pieces run eagerly over the same buffers (the CPU tests check
the decomposition against the model's own forward).

Given the KV pool (`kv_caches`, the engine's path), each piece's q/k rotation kernel also writes
the layer's K and V into the paged caches through a `KVSink` over a static slot buffer (int64
[T]; the step's slots in its first n rows, -1, never stored, in the rest), so the eager part
between pieces is the attention kernels alone: one kernel launch per layer fewer on the host,
whose Python time bounds live-heavy serving (docs/benchmarks.md, session 13's py-spy: 11 % of
the engine loop in `store_kv` at ~100 live sessions), and no k, v copies into static buffers.
`LIVEMEET_FUSED_KV_STORE=0` turns it off with the decoder's other sinks.

On by default (ModelConfig.prefill_graphs; `--no-prefill-graphs`). Measured on an H200
(docs/benchmarks.md, session 3): the (L + 1) x buckets captures (then 29 x 10 for MOSS-TD
at the default 8,192-token step limit; 29 x 16 since session 20) added ~15 s to start-up;
in the HTTP sweeps every prefill step replayed them (no eager step), short c64 moved from 864
to 825-963 audio-s/s and long c16 from 163.1 to 164.0. Per layer one copy each of q and
residual (and of k and v when the pieces do not store them) goes into the static buffers
(kernels writing into them directly would remove it); attention writes its output into the
static buffer itself.

The attention between pieces is resolved once per step for all layers
(`livemeet.engine.paged_backend.StepAttention`): at 100 live sessions, checks, configuration
and allocations repeated per layer were ~316 us of host time per layer, 31 % of the engine
worker (py-spy, docs/benchmarks.md session 16).
"""

from __future__ import annotations

import torch

from livemeet.engine import paged_backend
from livemeet.engine.cuda_graph import choose_bucket
from livemeet.errors import ConfigError, InternalError
from livemeet.layers.attention import AttentionBackend
from livemeet.layers.paged_attention import KVSink
from livemeet.models.qwen3 import Qwen3Model

# Tokens per step. A step runs every per-token op (the projections: ~1.5-2 us a row on an H200,
# livemeet.engine.cost_model) over its whole bucket, so above 512 the buckets grow by at most
# 1.5x: with powers of two, 100 live sessions' prefill steps (~2,400-2,900 rows in real time)
# all ran in the 4,096 bucket; with these they took ~1 % less engine time per hop
# (docs/benchmarks.md, session 20). The extra captures did not move a cold server's start
# (45-52 s to ready in sessions 19 and 20, most of it Triton compiles).
PREFILL_BUCKETS = (
    *(16, 32, 64, 128, 256, 512),
    *(768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192),
)


def prefill_buckets(max_tokens: int) -> tuple[int, ...]:
    """PREFILL_BUCKETS up to the first that holds `max_tokens` (the scheduler's token limit
    per step), continued by doubling past 8192. Raises ConfigError when max_tokens < 1."""
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, not {max_tokens}")
    out: list[int] = []
    for b in PREFILL_BUCKETS:
        out.append(b)
        if b >= max_tokens:
            return tuple(out)
    while out[-1] < max_tokens:
        out.append(out[-1] * 2)
    return tuple(out)


class PiecewiseRunner:
    """The decoder forward of prefill/mixed steps as L + 1 captured pieces (module docstring).

    `lm` must be prepared for serving (fused weights). `kv_caches`: the paged KV pool's
    per-layer (k caches, v caches) and its e4m3 scale (1.0 otherwise), for the pieces to store
    K/V themselves (module docstring); `run` then needs the step's slots. Counters:
    `num_replays` (steps run on graphs), `num_eager_runs` (steps run piece by piece without
    graphs).
    """

    def __init__(
        self,
        lm: Qwen3Model,
        *,
        device: torch.device,
        max_tokens: int,
        use_graphs: bool = True,
        kv_caches: tuple[list[torch.Tensor], list[torch.Tensor], float] | None = None,
    ) -> None:
        if use_graphs and device.type != "cuda":
            raise ConfigError(f"prefill CUDA graphs need a CUDA device, not {device}")
        if not lm.prepared:
            raise InternalError("PiecewiseRunner needs prepare_for_serving() first")
        cfg = lm.cfg
        self.lm = lm
        self.layers = lm._typed_layers
        self.buckets = prefill_buckets(max_tokens)
        rows = self.buckets[-1]
        dtype = lm.embed_tokens.weight.dtype
        self.embeds = torch.zeros(rows, cfg.hidden, dtype=dtype, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.q = torch.zeros(rows, cfg.heads, cfg.head_dim, dtype=dtype, device=device)
        self.k = torch.zeros(rows, cfg.kv_heads, cfg.head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.residual = torch.zeros_like(self.embeds)
        self.attn_out = torch.zeros_like(self.q)
        self.out = torch.zeros_like(self.embeds)
        # the pool's caches when the pieces store K/V (module docstring), and the static slots
        self.kv_caches = kv_caches if kv_caches and paged_backend.fused_store_enabled() else None
        self.slots = torch.full((rows,), -1, dtype=torch.int64, device=device)
        if self.kv_caches is not None and len(self.kv_caches[0]) != len(self.layers):
            raise InternalError(f"{len(self.kv_caches[0])} KV caches for {len(self.layers)} layers")
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.num_replays = 0
        self.num_eager_runs = 0
        if use_graphs:
            self.capture()

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def fits(self, num_tokens: int) -> bool:
        """True when a chunk of `num_tokens` query tokens has a captured bucket (1..max_tokens)."""
        return 0 < num_tokens <= self.max_tokens

    @property
    def stores_kv(self) -> bool:
        """Whether the pieces write K/V into the pool themselves (module docstring)."""
        return self.kv_caches is not None

    @torch.inference_mode()
    def run(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        slot_mapping: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """embeds [n, hidden] and positions int64 [n] (on the device) of one flat ragged step;
        `attn` holds the step's metadata for its n rows; `slot_mapping` int64 [n] (each row's
        KV slot, -1 for none) is required when the pieces store K/V (`stores_kv`). Returns
        hidden [n, hidden], a view of `out` (use it before the next step). Raises
        InternalError when n does not fit or the slots are missing or of another length."""
        n = embeds.shape[0]
        bucket = choose_bucket(n, self.buckets)
        if bucket is None or positions.shape != (n,):
            raise InternalError(f"no prefill graph bucket for {n} rows (largest {self.max_tokens})")
        self.embeds[:n].copy_(embeds)
        self.positions[:n].copy_(positions)
        if self.stores_kv:
            if slot_mapping is None or slot_mapping.shape != (n,):
                raise InternalError(f"pieces that store K/V need the step's {n} slots")
            self.slots[:n].copy_(slot_mapping)
            self.slots[n:bucket].fill_(-1)  # padding rows: stale slots would overwrite live KV
        use_graphs = bool(self.graphs)
        # one view of each static buffer for every layer: the step's attention keeps its
        # slices of them (PagedAttentionBackend) and writes the output in place
        q, attn_out = self.q[:n], self.attn_out[:n]
        k, v = (None, None) if self.stores_kv else (self.k[:n], self.v[:n])
        for i in range(len(self.layers) + 1):
            if use_graphs:
                self.graphs[(bucket, i)].replay()
            else:
                self._piece(i, bucket)
            if i < len(self.layers):
                out = attn.attend(i, q, k, v, self.layers[i].self_attn.scale, attn_out)
                if out.data_ptr() != attn_out.data_ptr():  # a backend that ignored `out`
                    attn_out.copy_(out.reshape(attn_out.shape))
        if use_graphs:
            self.num_replays += 1
        else:
            self.num_eager_runs += 1
        return self.out[:n]

    def _piece(self, i: int, bucket: int) -> None:
        """Piece i over the first `bucket` rows of the static buffers (see module docstring)."""
        plan = self.lm.linear_plan
        inv_freq: torch.Tensor = self.lm.rotary.inv_freq  # type: ignore[assignment]
        residual: torch.Tensor | None
        if i == 0:
            hidden, residual = self.embeds[:bucket], None
        else:
            prev = self.layers[i - 1]
            hidden, residual = prev.post_attention(
                self.attn_out[:bucket], self.residual[:bucket], plan
            )
        if i == len(self.layers):
            self.out[:bucket].copy_(self.lm.final_norm(hidden, residual))
            return
        q, k, v, residual = self.layers[i].pre_attention(
            hidden, residual, self.positions[:bucket], inv_freq, plan, self._sink(i, bucket)
        )
        # all reads of the static residual are done: the copies may overwrite it
        self.q[:bucket].copy_(q)
        if k is not None and v is not None:  # no sink: attention stores them between pieces
            self.k[:bucket].copy_(k)
            self.v[:bucket].copy_(v)
        self.residual[:bucket].copy_(residual)

    def _sink(self, layer: int, bucket: int) -> KVSink | None:
        """Layer `layer`'s caches over the first `bucket` static slots, or None."""
        if self.kv_caches is None:
            return None
        k_caches, v_caches, scale = self.kv_caches
        return KVSink(k_caches[layer], v_caches[layer], self.slots[:bucket], scale)

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every (bucket, piece), largest bucket first, into one memory
        pool: the pieces never run concurrently, and their outputs live in the static buffers
        (outside the pool), so their intermediates can share memory."""
        device = self.embeds.device
        pool = None
        for bucket in sorted(self.buckets, reverse=True):
            for i in range(len(self.layers) + 1):
                self._piece(i, bucket)  # warm-up: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize(device)
            for i in range(len(self.layers) + 1):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._piece(i, bucket)
                pool = graph.pool() if pool is None else pool
                self.graphs[(bucket, i)] = graph
        torch.cuda.synchronize(device)
