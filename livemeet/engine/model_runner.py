"""The model runner: the one owner of the device. Holds the weights and the paged KV pool,
turns a `ScheduledBatch` into one flat ragged forward, and returns the sampled token ids.

KV pool: per decoder layer a `k_cache` and a `v_cache` of [num_blocks, block_size, kv_heads,
head_dim] (the layout of livemeet.layers.paged_attention). Its size comes from the free device
memory times `mem_fraction` (CUDA) or from `num_kv_blocks` (given, or a CPU default).

Per step: block copies (copy-on-write), then the inputs of every prefill chunk and decode row
are concatenated into [N] token ids / positions / slots; audio embeddings replace the rows at
`<|audio_pad|>` positions; the decoder runs once; logits are computed for the sampled rows
only (the last row of each sampling prefill chunk, the rows before it that verify a draft,
then every decode row, in `ScheduledBatch.sampled_requests` order).

Decode-only steps replay a CUDA graph (livemeet.engine.cuda_graph) when one fits; prefill and
mixed steps, and the CPU, run eagerly. `launch` leaves the sampled ids on the device
(`DeviceTokens`) so that async decode can feed them to the next step without a host round trip:
a decode row whose request ends in `PENDING_TOKEN_ID` reads its input id from the previous
step's `DeviceTokens`. `TokenTransfer` brings sampled ids to the host through two buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from livemeet.audio.constants import MAX_CONTEXT_TOKENS
from livemeet.engine.cuda_graph import GraphRunner
from livemeet.engine.paged_backend import PagedAttentionBackend, StepMetadata
from livemeet.engine.prefill_graph import PiecewiseRunner
from livemeet.engine.request import PENDING_TOKEN_ID, Request
from livemeet.engine.sampler import SamplingParams, sample
from livemeet.engine.scheduler import ScheduledBatch
from livemeet.engine.staging import HostStaging
from livemeet.errors import ConfigError, InternalError
from livemeet.layers.paged_attention import (
    DECODE_PROGRAMS_PER_SM,
    EXTEND_ROWS,
    EXTEND_ROWS_SMALL,
    H200_NUM_SMS,
    check_cache,
    choose_num_splits,
    decode_programs_per_sm,
    extend_tile_rows,
)
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.config import MossTDConfig

CPU_DEFAULT_KV_TOKENS = 1 << 18  # tokens of KV on the CPU path when no size is given
# Row counts per sequence of the warm-up steps: Triton specialises integer arguments equal to 1
# and divisible by 16, separately for one and for several sequences. `warm_up_batches` adds wide
# batches for the extend kernel's large-tile variant.
WARM_UP_BATCHES = ((16,), (17,), (1,), (16, 16), (5, 27), (1, 1))
# Mixed steps (sequence lengths, how many at the end are decode rows): a 16-token chunk, then
# one or two decode rows of 300 tokens, so the decode kernel runs in an eager step split (>= 2
# x MIN_TOKENS_PER_SPLIT keys) and merged, with PDL (one row) and without (two rows)
WARM_UP_MIXED = (((16, 300), 1), ((16, 300, 300), 2))
# Columns the block tables of eager steps are padded to a multiple of. Their row stride is an
# int argument of the attention kernels, which Triton specialises (1, a multiple of 16, the
# rest: one compiled variant each); the width is the step's longest table, so unpadded, the
# first step whose longest table reached 16, 32, ... blocks compiled a variant warm-up never
# had, mid-serving (a JIT compile costs ~2 s on an H200 host: the likely cause of the HTTP
# short c4/c8 stalls, docs/benchmarks.md). Padded, every eager step has warm-up's variant.
BLOCK_TABLE_WIDTH_MULTIPLE = 16
# tokens of a prefill chunk from which its positions and slots are computed with numpy (below
# it the per-token loop is as fast: a decode row is one token)
VECTOR_ROWS_MIN = 32


@dataclass(frozen=True)
class DeviceTokens:
    """A launched step's sampled ids, still on the device: `token_ids` int64 [M], from entry
    `rows[request_id]` on for each sampled request (ScheduledBatch.sampled_requests order;
    `sample_counts` entries each)."""

    token_ids: torch.Tensor
    rows: Mapping[str, int]


def kv_bytes_per_token(cfg: MossTDConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V for one token over all layers (112 KiB at real size in bf16)."""
    t = cfg.text
    return t.layers * 2 * t.kv_heads * t.head_dim * torch.finfo(dtype).bits // 8


class ModelRunner:
    """Owns the model and the KV pool (see module docstring).

    `kv_dtype`: None uses the model dtype; torch.float8_e4m3fn stores KV in FP8 with a fixed
    per-tensor scale `kv_scale`. `cuda_graphs` (CUDA only): capture decode graphs for batches
    of up to `max_num_seqs` rows and contexts of up to `max_model_len` tokens (`self.graphs`,
    None otherwise). `prefill_graphs` (CUDA only): steps that prefill run as piecewise graphs
    (livemeet.engine.prefill_graph) for up to `max_num_batched_tokens` tokens (`self.piecewise`,
    None otherwise). `warm_up_at_start` (default: on CUDA) runs `warm_up` before any capture.
    Raises ConfigError when the pool would be empty.
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
        cuda_graphs: bool = False,
        max_model_len: int = MAX_CONTEXT_TOKENS,
        max_num_seqs: int = 128,
        prefill_graphs: bool = False,
        max_num_batched_tokens: int = 8192,
        warm_up_at_start: bool | None = None,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.block_size = block_size
        weight = model.language_model.embed_tokens.weight
        self.device = weight.device
        self.dtype = weight.dtype
        self.kv_dtype = kv_dtype or self.dtype
        self.kv_scale = kv_scale
        self.staging = HostStaging(self.device)
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
        check_cache(self.k_caches[0], self.v_caches[0])  # a geometry the kernels refuse: now
        # the decode kernel's resident programs per SM, which sizes its split count
        self.decode_programs_per_sm = DECODE_PROGRAMS_PER_SM
        self.num_sms = H200_NUM_SMS
        if self.device.type == "cuda":
            self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            self.decode_programs_per_sm = decode_programs_per_sm(
                self.dtype, self.k_caches[0], t.heads // t.kv_heads
            )
        # set before warm_up, which routes through them (a GPU start once failed on this)
        self.graphs: GraphRunner | None = None
        self.piecewise: PiecewiseRunner | None = None
        if self.device.type == "cuda":
            model.prepare_for_serving()  # fused decoder path: 7-10 kernels per layer, not ~55
            model.language_model.tune_linears()  # cuBLAS or skinny kernels per projection
        if self.device.type == "cuda" if warm_up_at_start is None else warm_up_at_start:
            self.warm_up()
        if cuda_graphs and self.device.type == "cuda":
            self.graphs = GraphRunner(
                self._forward,
                device=self.device,
                block_size=block_size,
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                num_kv_heads=t.kv_heads,
                staging=self.staging,
                programs_per_sm=self.decode_programs_per_sm,
            )
            self.graphs.capture()
        if prefill_graphs and model.language_model.use_fused(weight):
            self.piecewise = PiecewiseRunner(
                model.language_model,
                device=self.device,
                max_tokens=max_num_batched_tokens,
                kv_caches=(self.k_caches, self.v_caches, self.kv_scale),
            )

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Run the eager forward once for each shape class the Triton kernels specialise on
        (a row count of 1, a multiple of 16, anything else; one or several sequences), so no
        request pays the JIT: on an H200 the first 16-request burst of short clips spent ~2 s
        of its 2.1 s latency in prefill, against 0.5 s once warm. Writes scratch KV into the
        first blocks of the pool, which nothing reads before a request's own store-KV
        overwrites them."""
        num_sms = H200_NUM_SMS  # the CPU path (tests) runs the same batches
        if self.device.type == "cuda":
            num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        t = self.cfg.text
        for lengths in warm_up_batches(t.kv_heads, t.heads // t.kv_heads, num_sms):
            self._warm_up_step(lengths)
        for lengths, num_decode in WARM_UP_MIXED:
            self._warm_up_step(lengths, num_decode=num_decode)

    def _warm_up_step(self, lengths: tuple[int, ...], num_decode: int = 0) -> None:
        """One eager step over scratch sequences of `lengths` tokens: each prefilled whole,
        except the last `num_decode`, which are decode rows (one new token after the rest)."""
        rows = _StepRows()
        first = 0  # each scratch sequence on its own blocks
        for i, n in enumerate(lengths):
            blocks = -(-(n + 1) // self.block_size)
            scratch = Request(f"warm-up-{i}", [0] * n)
            scratch.block_table = list(range(first, first + blocks))
            first += blocks
            start = n - 1 if i >= len(lengths) - num_decode else 0
            rows.add_sequence(scratch, start, [0] * (n - start), self.block_size)
            rows.sample_rows.append(len(rows.token_ids) - 1)
        rows.num_decode_seqs = num_decode
        if first > self.num_kv_blocks:
            return  # a pool this small only happens in tests
        self.staging.begin_step()
        try:
            hidden = self._forward_eager(rows, self._upload(rows.token_ids, torch.long))
            picked = hidden[self._upload(rows.sample_rows, torch.long)]
            sample(self.model.compute_logits(picked), [SamplingParams()] * len(lengths))
        finally:
            self.staging.end_step()

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

    def run(
        self,
        batch: ScheduledBatch,
        audio_embeds: Mapping[str, torch.Tensor],
        sampling: Callable[[Request], SamplingParams],
        forced: Sequence[int | None] = (),
    ) -> list[int]:
        """`launch`, then wait for the sampled ids on the host (the synchronous path)."""
        tokens = self.launch(batch, audio_embeds, sampling, forced=forced)
        return [] if tokens is None else tokens.token_ids.tolist()

    @torch.inference_mode()
    def launch(
        self,
        batch: ScheduledBatch,
        audio_embeds: Mapping[str, torch.Tensor],
        sampling: Callable[[Request], SamplingParams],
        *,
        forced: Sequence[int | None] = (),
        previous: DeviceTokens | None = None,
    ) -> DeviceTokens | None:
        """Enqueue one forward over `batch` and the sampling of its sampled rows; returns the
        sampled ids on the device (None when nothing is sampled). Does not wait for the GPU
        (greedy sampling; the sampler's non-greedy path uploads parameters synchronously).

        `audio_embeds[request_id]`: [num audio positions, hidden], row k for the request's k-th
        audio position. `sampling(request)` gives each sampled row's parameters. `forced[i]`,
        when given and not None, replaces the i-th sampled id (benchmarks' forced output).
        `previous`: the last launched step's ids, read by decode rows whose last token is
        PENDING_TOKEN_ID. Raises InternalError when such a row has no entry in `previous`, or a
        prefill chunk contains a pending token.
        """
        self.copy_blocks([(c.src, c.dst, c.num_tokens) for c in batch.block_copies])
        rows = self._rows(batch, audio_embeds, previous)
        if not rows.token_ids:
            return None
        self.staging.begin_step()
        try:
            return self._launch_rows(batch, rows, sampling, forced, previous)
        finally:
            self.staging.end_step()

    def _launch_rows(
        self,
        batch: ScheduledBatch,
        rows: _StepRows,
        sampling: Callable[[Request], SamplingParams],
        forced: Sequence[int | None],
        previous: DeviceTokens | None,
    ) -> DeviceTokens | None:
        ids = self._input_ids(rows, previous)
        hidden = self._decode_with_graph(rows, ids)
        if hidden is None:
            hidden = self._forward_eager(rows, ids)
        if not rows.sample_rows:  # only non-final prefill chunks: KV written, nothing sampled
            return None
        # sample rows are increasing row indices: as many as rows means every row (decode)
        every_row = len(rows.sample_rows) == len(rows.token_ids)
        picked = hidden if every_row else hidden[self._upload(rows.sample_rows, torch.long)]
        logits = self.model.compute_logits(picked)
        counts = batch.sample_counts
        params = [
            p
            for r, n in zip(batch.sampled_requests, counts, strict=True)
            for p in [sampling(r)] * n
        ]
        sampled = sample(logits, params)
        overrides = [(i, t) for i, t in enumerate(forced) if t is not None]
        if overrides and len(overrides) == len(params):  # every row forced (benchmarks)
            sampled = self._upload([t for _, t in overrides], torch.long)
        elif overrides:
            where = self._upload([i for i, _ in overrides], torch.long)
            sampled[where] = self._upload([t for _, t in overrides], torch.long)
        # a request's first row (a verifying chunk's later rows follow it; it decodes only
        # once its draft is accepted, so no decode row reads them)
        firsts = np.cumsum((0, *counts[:-1])).tolist()
        order = {r.request_id: i for r, i in zip(batch.sampled_requests, firsts, strict=True)}
        return DeviceTokens(sampled, order)

    def _input_ids(self, rows: _StepRows, previous: DeviceTokens | None) -> torch.Tensor:
        """The step's input ids [N] on the device; rows whose id is the previous step's
        still-pending sample read it from `previous` on the device."""
        deferred = rows.deferred_rows
        if not deferred:
            return self._upload(rows.token_ids, torch.long)
        assert previous is not None
        n = len(rows.token_ids)
        if deferred == rows.deferred_sources and len(deferred) == n:
            # steady-state decode: row i reads the previous step's i-th sample (no uploads)
            return previous.token_ids[:n]
        ids = self._upload(rows.token_ids, torch.long)
        src = previous.token_ids[self._upload(rows.deferred_sources, torch.long)]
        ids[self._upload(deferred, torch.long)] = src
        return ids

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, meta: StepMetadata
    ) -> torch.Tensor:
        """The decoder over flat rows (no audio): what the CUDA graphs capture."""
        embeds = self.model.language_model.embed(ids)
        attn = PagedAttentionBackend(self.k_caches, self.v_caches, meta, kv_scale=self.kv_scale)
        return self.model(embeds, positions, attn)

    def _decode_with_graph(self, rows: _StepRows, ids: torch.Tensor) -> torch.Tensor | None:
        graphs = self.graphs
        # one new token per sequence, none of them audio: a 1-token prefill chunk (e.g. a live
        # hop that adds one audio token) would otherwise replay with the placeholder's embedding
        if graphs is None or rows.audio_rows or any(n != 1 for n in rows.q_lens):
            return None
        width = max(len(t) for t in rows.block_tables)
        if not graphs.can_run(len(rows.q_lens), width):
            graphs.num_eager_fallbacks += 1
            return None
        return graphs.run(ids, rows.positions, rows.slots, rows.seq_lens, rows.block_tables)

    def _forward_eager(self, rows: _StepRows, ids: torch.Tensor) -> torch.Tensor:
        embeds = self.model.language_model.embed(ids)
        if rows.audio_rows:
            index = self._upload(rows.audio_rows, torch.long)
            embeds[index] = torch.cat(rows.audio_values).to(embeds.dtype)
        meta = self._metadata(rows)
        attn = PagedAttentionBackend(self.k_caches, self.v_caches, meta, kv_scale=self.kv_scale)
        positions = self._upload(rows.positions, torch.long)
        if self.piecewise is not None and self.piecewise.fits(len(rows.token_ids)):
            return self.piecewise.run(embeds, positions, attn, meta.slot_mapping)
        return self.model(embeds, positions, attn)

    def _upload(self, values: list[int], dtype: torch.dtype) -> torch.Tensor:
        """Host values -> a device tensor without making the host wait for the GPU (staged in
        a pinned arena, non_blocking copy; see livemeet.engine.staging)."""
        return self.staging.upload(values, dtype)

    def _rows(
        self,
        batch: ScheduledBatch,
        audio_embeds: Mapping[str, torch.Tensor],
        previous: DeviceTokens | None,
    ) -> _StepRows:
        rows = _StepRows()
        for chunk in batch.prefills:
            req = chunk.request
            end = chunk.start + chunk.num_tokens
            ids = req.token_ids(chunk.start, end)
            if PENDING_TOKEN_ID in ids:
                raise InternalError(f"prefill of {req.request_id!r} reads a pending token")
            rows.add_sequence(req, chunk.start, ids, self.block_size)
            lo, hi = req.audio_span_in(chunk.start, end)
            if hi > lo:
                rows.audio_rows.extend(map(rows.row_of, req.audio_positions[lo:hi].tolist()))
                rows.audio_values.append(audio_embeds[req.request_id][lo:hi])
            if chunk.samples:  # the last row; verifying a draft, the rows before it too
                last = len(rows.token_ids) - 1
                rows.sample_rows.extend(range(last - chunk.num_verify, last + 1))
        for req in batch.decodes:
            start = req.num_tokens - 1
            token = req.last_token_id
            if token == PENDING_TOKEN_ID:
                source = None if previous is None else previous.rows.get(req.request_id)
                if source is None:
                    raise InternalError(f"{req.request_id!r} decodes a token nobody sampled")
                rows.deferred_rows.append(len(rows.token_ids))
                rows.deferred_sources.append(source)
                token = 0  # overwritten on the device
            rows.add_sequence(req, start, [token], self.block_size)
            rows.sample_rows.append(len(rows.token_ids) - 1)
        rows.num_decode_seqs = len(batch.decodes)
        return rows

    def _metadata(self, rows: _StepRows) -> StepMetadata:
        dev = self.device
        longest = max(len(t) for t in rows.block_tables)
        # padded entries are never read: kernels stop at each sequence's length
        width = -(-longest // BLOCK_TABLE_WIDTH_MULTIPLE) * BLOCK_TABLE_WIDTH_MULTIPLE
        tables = self.staging.stage_rows(rows.block_tables, width, torch.int32)
        q_lens = rows.q_lens
        cu = [0]
        for n in q_lens:
            cu.append(cu[-1] + n)
        decode_only = all(n == 1 for n in q_lens)
        max_seq = max(rows.seq_lens)
        # decode rows follow the prefill chunks (_rows); in a mixed step the decode kernel
        # takes them (PagedAttentionBackend)
        num_decode = 0 if decode_only else rows.num_decode_seqs
        splits = None
        if (decode_only or num_decode) and dev.type == "cuda":
            splits = decode_kernel_splits(
                rows.seq_lens,
                len(q_lens) if decode_only else num_decode,
                self.cfg.text.kv_heads,
                self.num_sms,
                self.decode_programs_per_sm,
            )
        return StepMetadata(
            slot_mapping=self._upload(rows.slots, torch.long),
            block_tables=tables.to(dev, non_blocking=True),
            seq_lens=self._upload(rows.seq_lens, torch.int32),
            cu_seqlens_q=self._upload(cu, torch.int32),
            max_seqlen_q=max(q_lens),
            max_seq_len=max_seq,
            decode_only=decode_only,
            num_splits=splits,
            num_decode_seqs=num_decode,
        )


def decode_kernel_splits(
    seq_lens: Sequence[int],
    num_decode: int,
    num_kv_heads: int,
    num_sms: int,
    programs_per_sm: int,
) -> int:
    """The decode kernel's split count for the last `num_decode` of a step's sequences (its
    decode rows: all of a decode-only step, the tail of a mixed one), sized by their own
    count and longest context, not the prefill chunks' (`choose_num_splits`)."""
    if not 0 < num_decode <= len(seq_lens):
        raise InternalError(f"{num_decode} decode rows in a step of {len(seq_lens)} sequences")
    lens = seq_lens[len(seq_lens) - num_decode :]
    return choose_num_splits(
        num_decode, max(lens), num_kv_heads, num_sms, programs_per_sm=programs_per_sm
    )


def warm_up_batches(num_kv_heads: int, group: int, num_sms: int) -> list[tuple[int, ...]]:
    """Sequence lengths of the warm-up steps: WARM_UP_BATCHES, then the same shape classes
    over enough sequences that the extend kernel takes its large-tile variant (every
    `extend_tile_rows` value gets compiled at start, not by the first burst of requests)."""
    batches = list(WARM_UP_BATCHES)
    seen = {extend_tile_rows(len(b), num_kv_heads, max(b), group, num_sms) for b in batches}
    wide = -(-num_sms // num_kv_heads)  # sequences for >= num_sms programs of one tile each
    for lengths in ((16,), (17,), (1,)):
        batch = lengths * wide
        seen.add(extend_tile_rows(len(batch), num_kv_heads, max(batch), group, num_sms))
        batches.append(batch)
    if seen != {EXTEND_ROWS, EXTEND_ROWS_SMALL}:
        raise InternalError(f"warm-up batches reach extend tiles {sorted(seen)} only")
    return batches


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
        self.deferred_rows: list[int] = []  # rows whose input id is on the device
        self.deferred_sources: list[int] = []  # their index in the previous DeviceTokens
        self.num_decode_seqs = 0  # the last sequences: decode rows (one token each)
        self._seq_start_row = 0
        self._seq_start_pos = 0

    def add_sequence(self, req: Request, start: int, ids: list[int], block_size: int) -> None:
        self._seq_start_row = len(self.token_ids)
        self._seq_start_pos = start
        table = req.block_table
        self.token_ids.extend(ids)
        if len(ids) < VECTOR_ROWS_MIN:
            for pos in range(start, start + len(ids)):
                self.positions.append(pos)
                self.slots.append(table[pos // block_size] * block_size + pos % block_size)
        else:
            # a chunk's positions and slots with numpy: per token in Python this was ~0.3 ms
            # per 1,000 tokens of host time in every prefill step (a live hop's ~700-2,300)
            pos = np.arange(start, start + len(ids), dtype=np.int64)
            first = start // block_size
            blocks = np.array(table[first : (pos[-1] // block_size) + 1], dtype=np.int64)
            slots = blocks[pos // block_size - first] * block_size + pos % block_size
            self.positions.extend(pos.tolist())
            self.slots.extend(slots.tolist())
        self.block_tables.append(table)  # not copied: read within this step's launch
        self.seq_lens.append(start + len(ids))
        self.q_lens.append(len(ids))

    def row_of(self, position: int) -> int:
        return self._seq_start_row + position - self._seq_start_pos


class TokenTransfer:
    """Sampled ids to the host through two buffers (async decode's one-step lookahead).

    `start(tokens)` enqueues the copy of a step's ids into the free buffer and returns a
    ticket; `wait(ticket)` blocks until that copy is done and returns the ids, freeing the
    buffer. Two buffers suffice: step N+1 is started before step N is waited for, and step N+2
    only after. On CUDA the buffers are pinned, the copy is non_blocking and a CUDA event marks
    its completion; on the CPU the copy is immediate (the fake device of the tests).
    `capacity`: the most ids one step samples (one per decode row and sampling chunk, and a
    verifying chunk's rows: the engine gives max(max_num_seqs, max_num_batched_tokens)). Raises
    InternalError when a step samples more, when both buffers are busy, or on a wrong ticket.
    """

    NUM_BUFFERS = 2

    def __init__(self, device: torch.device, capacity: int) -> None:
        cuda = device.type == "cuda"
        self.buffers = [
            torch.zeros(capacity, dtype=torch.int64, pin_memory=cuda)
            for _ in range(self.NUM_BUFFERS)
        ]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(self.NUM_BUFFERS)]
        self._sizes: list[int | None] = [None] * self.NUM_BUFFERS  # ids held; None when free
        self._next = 0

    @property
    def num_busy(self) -> int:
        return sum(n is not None for n in self._sizes)

    def start(self, tokens: torch.Tensor) -> int:
        """Enqueue the copy of int64 [n] `tokens` to the host; returns the ticket for `wait`."""
        slot = self._next
        n = tokens.shape[0]
        if self._sizes[slot] is not None:
            raise InternalError("both host token buffers are busy: wait for a step first")
        if n > self.buffers[slot].shape[0]:
            raise InternalError(f"{n} sampled ids exceed the host buffer of {len(self.buffers[0])}")
        self.buffers[slot][:n].copy_(tokens, non_blocking=True)
        event = self.events[slot]
        if event is not None:
            event.record(torch.cuda.current_stream(tokens.device))  # the copy's stream
        self._sizes[slot] = n
        self._next = (slot + 1) % self.NUM_BUFFERS
        return slot

    def wait(self, ticket: int) -> list[int]:
        """The ids of `ticket`, once its copy has completed; frees its buffer."""
        n = self._sizes[ticket] if 0 <= ticket < self.NUM_BUFFERS else None
        if n is None:
            raise InternalError(f"token ticket {ticket} is not in flight")
        event = self.events[ticket]
        if event is not None:
            event.synchronize()
        values = self.buffers[ticket][:n].tolist()
        self._sizes[ticket] = None
        return values
