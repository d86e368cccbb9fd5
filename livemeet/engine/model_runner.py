"""The model runner: the one owner of the device. Holds the weights and the paged KV pool,
turns a `ScheduledBatch` into one flat ragged forward, and returns the sampled token ids.

KV pool: per decoder layer a `k_cache` and a `v_cache` of [num_blocks, block_size, kv_heads,
head_dim] (the layout of livemeet.layers.paged_attention). Its size comes from the free device
memory times `mem_fraction` (CUDA) or from `num_kv_blocks` (given, or a CPU default).

Per step: block copies (copy-on-write), then the inputs of every prefill chunk and decode row
are concatenated into [N] token ids / positions / slots; audio embeddings replace the rows at
`<|audio_pad|>` positions; the decoder runs once; logits are computed for the sampled rows
only (the last row of each sampling prefill chunk, then every decode row, in
`ScheduledBatch.sampled_requests` order).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping

import torch

from livemeet.engine.paged_backend import PagedAttentionBackend, StepMetadata
from livemeet.engine.request import Request
from livemeet.engine.sampler import SamplingParams, sample
from livemeet.engine.scheduler import ScheduledBatch
from livemeet.errors import ConfigError
from livemeet.layers.paged_attention import choose_num_splits
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import MossTDConfig

CPU_DEFAULT_KV_TOKENS = 1 << 18  # tokens of KV on the CPU path when no size is given


def kv_bytes_per_token(cfg: MossTDConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V for one token over all layers (112 KiB at real size in bf16)."""
    t = cfg.text
    return t.layers * 2 * t.kv_heads * t.head_dim * torch.finfo(dtype).bits // 8


class ModelRunner:
    """Owns the model and the KV pool (see module docstring).

    `kv_dtype`: None uses the model dtype; torch.float8_e4m3fn stores KV in FP8 with a fixed
    per-tensor scale `kv_scale`. Raises ConfigError when the pool would be empty.
    """

    def __init__(
        self,
        model: MossTDModel,
        cfg: MossTDConfig,
        *,
        block_size: int,
        num_kv_blocks: int | None = None,
        mem_fraction: float = 0.85,
        kv_dtype: torch.dtype | None = None,
        kv_scale: float = 1.0,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.block_size = block_size
        weight = model.language_model.embed_tokens.weight
        self.device = weight.device
        self.dtype = weight.dtype
        self.kv_dtype = kv_dtype or self.dtype
        self.kv_scale = kv_scale
        self.num_kv_blocks = num_kv_blocks or self._blocks_from_memory(mem_fraction)
        if self.num_kv_blocks < 1:
            raise ConfigError("the KV pool has no room: lower the model size or raise memory")
        t = cfg.text
        shape = (self.num_kv_blocks, block_size, t.kv_heads, t.head_dim)
        self.k_caches = [
            torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in range(t.layers)
        ]
        self.v_caches = [
            torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in range(t.layers)
        ]

    def _blocks_from_memory(self, mem_fraction: float) -> int:
        per_block = kv_bytes_per_token(self.cfg, self.kv_dtype) * self.block_size
        if self.device.type != "cuda":
            return CPU_DEFAULT_KV_TOKENS // self.block_size
        free, total = torch.cuda.mem_get_info(self.device)
        # Leave (1 - mem_fraction) of the whole card for activations, graphs and the encoder.
        budget = free - (1.0 - mem_fraction) * total
        return int(budget // per_block)

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int, int]]) -> None:
        """Copy-on-write: for each (src, dst, num_tokens), copy the first tokens of block src."""
        for src, dst, n in copies:
            for kc, vc in zip(self.k_caches, self.v_caches, strict=True):
                kc[dst, :n] = kc[src, :n]
                vc[dst, :n] = vc[src, :n]

    @torch.inference_mode()
    def run(
        self,
        batch: ScheduledBatch,
        audio_embeds: Mapping[str, torch.Tensor],
        sampling: Callable[[Request], SamplingParams],
    ) -> list[int]:
        """One forward over `batch`; returns one sampled token id per sampled row.

        `audio_embeds[request_id]`: [num audio positions, hidden], row k for the request's k-th
        audio position. `sampling(request)` gives each sampled row's parameters.
        """
        self.copy_blocks([(c.src, c.dst, c.num_tokens) for c in batch.block_copies])
        rows = self._rows(batch, audio_embeds)
        if not rows.token_ids:
            return []
        dev = self.device
        ids = torch.tensor(rows.token_ids, dtype=torch.long, device=dev)
        embeds = self.model.language_model.embed(ids)
        if rows.audio_rows:
            index = torch.tensor(rows.audio_rows, dtype=torch.long, device=dev)
            embeds[index] = torch.cat(rows.audio_values).to(embeds.dtype)
        meta = self._metadata(rows)
        attn = PagedAttentionBackend(self.k_caches, self.v_caches, meta, kv_scale=self.kv_scale)
        positions = torch.tensor(rows.positions, dtype=torch.long, device=dev)
        hidden = self.model(embeds, positions, attn)
        if not rows.sample_rows:  # only non-final prefill chunks: KV written, nothing sampled
            return []
        picked = hidden[torch.tensor(rows.sample_rows, dtype=torch.long, device=dev)]
        logits = self.model.compute_logits(picked)
        params = [sampling(r) for r in batch.sampled_requests]
        return sample(logits, params).tolist()

    def _rows(self, batch: ScheduledBatch, audio_embeds: Mapping[str, torch.Tensor]) -> _StepRows:
        rows = _StepRows()
        for chunk in batch.prefills:
            req = chunk.request
            end = chunk.start + chunk.num_tokens
            rows.add_sequence(req, chunk.start, req.token_ids(chunk.start, end), self.block_size)
            positions = req.audio_positions_in(chunk.start, end)
            if positions:
                first = bisect.bisect_left(req.audio_positions, positions[0])
                rows.audio_rows.extend(rows.row_of(p) for p in positions)
                rows.audio_values.append(
                    audio_embeds[req.request_id][first : first + len(positions)]
                )
            if chunk.samples:
                rows.sample_rows.append(len(rows.token_ids) - 1)
        for req in batch.decodes:
            start = req.num_tokens - 1
            rows.add_sequence(req, start, [req.last_token_id], self.block_size)
            rows.sample_rows.append(len(rows.token_ids) - 1)
        return rows

    def _metadata(self, rows: _StepRows) -> StepMetadata:
        dev = self.device
        width = max(len(t) for t in rows.block_tables)
        tables = torch.zeros((len(rows.block_tables), width), dtype=torch.int32)
        for i, t in enumerate(rows.block_tables):
            tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        q_lens = rows.q_lens
        cu = [0]
        for n in q_lens:
            cu.append(cu[-1] + n)
        decode_only = all(n == 1 for n in q_lens)
        max_seq = max(rows.seq_lens)
        splits = None
        if decode_only and dev.type == "cuda":
            splits = choose_num_splits(len(q_lens), max_seq, self.cfg.text.kv_heads)
        return StepMetadata(
            slot_mapping=torch.tensor(rows.slots, dtype=torch.long, device=dev),
            block_tables=tables.to(dev),
            seq_lens=torch.tensor(rows.seq_lens, dtype=torch.int32, device=dev),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
            max_seqlen_q=max(q_lens),
            max_seq_len=max_seq,
            decode_only=decode_only,
            num_splits=splits,
        )


class _StepRows:
    """Host-side lists describing one flat ragged step (built per step, then tensorised)."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.positions: list[int] = []
        self.slots: list[int] = []
        self.block_tables: list[list[int]] = []
        self.seq_lens: list[int] = []
        self.q_lens: list[int] = []
        self.sample_rows: list[int] = []
        self.audio_rows: list[int] = []
        self.audio_values: list[torch.Tensor] = []
        self._seq_start_row = 0
        self._seq_start_pos = 0

    def add_sequence(self, req: Request, start: int, ids: list[int], block_size: int) -> None:
        self._seq_start_row = len(self.token_ids)
        self._seq_start_pos = start
        table = req.block_table
        for i, token in enumerate(ids):
            pos = start + i
            self.token_ids.append(token)
            self.positions.append(pos)
            self.slots.append(table[pos // block_size] * block_size + pos % block_size)
        self.block_tables.append(list(table))
        self.seq_lens.append(start + len(ids))
        self.q_lens.append(len(ids))

    def row_of(self, position: int) -> int:
        return self._seq_start_row + position - self._seq_start_pos
