"""CUDA graphs for decode-only steps at padded batch buckets.

A decode step of a small model is launch-bound: ~28 layers x ~15 kernels, each a few
microseconds of host work, against ~1-3 ms of GPU work at batch 1 (DESIGN.md section 10). The
`GraphRunner` captures the whole decoder forward once per (bucket, num_splits) and replays it.

Static inputs, shared by every graph (a graph of bucket B reads rows [:B]):
token ids int64 [max_bucket], positions int64 [max_bucket], slot_mapping int64 [max_bucket],
block_tables int32 [max_bucket, max_blocks_per_seq], seq_lens int32 [max_bucket]. A batch of
n rows runs in the smallest bucket B >= n; rows [n, B) are padding (seq_len 0: the decode
kernel writes zeros; slot -1: the K/V store skips them), and their outputs are dropped.
Positions, slots and sequence lengths are views of one packed int64 buffer (`packed_views`),
so a step uploads them in one host-to-device copy (`pack_step_inputs`) rather than three:
on the device each copy between kernels is an engine switch of a few microseconds, ~2 % of
a 1.6-ms batch-1 step for the five copies a step made (docs/benchmarks.md, session 10's
engine profile).

The split-K decode kernel's grid is fixed by (B, num_splits) while lengths are read on the
device (livemeet.layers.paged_attention), so each bucket is captured once for every split
count `choose_num_splits` can pick for it up to max_model_len; `run` picks the graph for the
actual longest context. Graphs are captured largest first into one shared memory pool, so the
smaller ones reuse its memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from livemeet.engine.paged_backend import StepMetadata
from livemeet.engine.staging import HostStaging
from livemeet.errors import ConfigError, InternalError
from livemeet.layers.paged_attention import (
    DECODE_PROGRAMS_PER_SM,
    MIN_TOKENS_PER_SPLIT,
    choose_num_splits,
)

# Padded batch sizes (rows). Dense at the small end where padding costs most relative to the
# step; every 16 rows past 32. Scheduler's default max_num_seqs is 128 (DESIGN.md section 4).
DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128)
BUCKET_STEP_PAST_DEFAULTS = 16  # rows between buckets when max_num_seqs > 128

# hidden = forward(token_ids [B], positions [B], metadata) -> [B, hidden]
DecodeForward = Callable[[torch.Tensor, torch.Tensor, StepMetadata], torch.Tensor]


def decode_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The buckets to capture so that every batch of 1..max_num_seqs rows has one.

    DECODE_BUCKETS up to the first that covers max_num_seqs, continued in steps of 16 rows
    past 128. Raises ConfigError when max_num_seqs < 1.
    """
    if max_num_seqs < 1:
        raise ConfigError(f"max_num_seqs must be >= 1, not {max_num_seqs}")
    out: list[int] = []
    for b in DECODE_BUCKETS:
        out.append(b)
        if b >= max_num_seqs:
            return tuple(out)
    while out[-1] < max_num_seqs:
        out.append(out[-1] + BUCKET_STEP_PAST_DEFAULTS)
    return tuple(out)


def choose_bucket(num_rows: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= num_rows (buckets ascending), or None when none fits or rows < 1."""
    if num_rows < 1:
        return None
    for b in buckets:
        if b >= num_rows:
            return b
    return None


def split_variants(
    bucket: int,
    max_seq_len: int,
    num_kv_heads: int,
    num_sms: int,
    programs_per_sm: int = DECODE_PROGRAMS_PER_SM,
) -> tuple[int, ...]:
    """Every split count `choose_num_splits(bucket, L, ...)` returns for 1 <= L <= max_seq_len,
    ascending. It only grows with L and changes at multiples of MIN_TOKENS_PER_SPLIT times a
    power of two, so those lengths (and max_seq_len) cover all values."""
    lengths = {max_seq_len}
    n = MIN_TOKENS_PER_SPLIT
    while n < max_seq_len:
        lengths.add(n)
        n *= 2
    picked = {
        choose_num_splits(bucket, n, num_kv_heads, num_sms, programs_per_sm=programs_per_sm)
        for n in lengths
    }
    return tuple(sorted(picked))


PAD_POSITION, PAD_SLOT, PAD_SEQ_LEN = 0, -1, 0  # slot -1: store_kv skips; length 0: output 0


def packed_views(packed: torch.Tensor, rows: int) -> tuple[torch.Tensor, ...]:
    """(positions int64 [rows], slot_mapping int64 [rows], seq_lens int32 [rows]): views of
    `packed`, int64 [3 * rows], laid out as `pack_step_inputs` writes it. Raises InternalError
    for another shape or dtype."""
    if packed.dtype != torch.int64 or packed.shape != (3 * rows,):
        raise InternalError(f"packed inputs must be int64 [{3 * rows}], got {packed.dtype} "
                            f"{tuple(packed.shape)}")  # fmt: skip
    seq_lens = packed[2 * rows :].view(torch.int32)[:rows]
    return packed[:rows], packed[rows : 2 * rows], seq_lens


def pack_step_inputs(
    positions: Sequence[int], slots: Sequence[int], seq_lens: Sequence[int], rows: int
) -> np.ndarray:
    """The prefix of the packed buffer (`packed_views`) a step of len(positions) padded rows
    needs, int64 [2 * rows + ceil(len / 2)]: positions and slots each in a region of `rows`
    entries (past the step's rows: padding no graph of this size reads), then the int32
    sequence lengths two per int64. Raises InternalError when the lists differ in length or
    exceed `rows`."""
    n = len(positions)
    if not (n == len(slots) == len(seq_lens)) or n > rows:
        raise InternalError(f"cannot pack {n} rows into a buffer of {rows}")
    out = np.zeros(2 * rows + -(-n // 2), dtype=np.int64)
    out[:n] = positions
    out[rows : rows + n] = slots
    out[rows + n : 2 * rows] = PAD_SLOT
    out[2 * rows :].view(np.int32)[:n] = seq_lens
    return out


def pad_rows(
    positions: Sequence[int], slots: Sequence[int], seq_lens: Sequence[int], bucket: int
) -> tuple[list[int], list[int], list[int]]:
    """Positions, slots and sequence lengths of n decode rows padded to `bucket` rows with
    inert rows (PAD_*; a padded row's block-table row is never read). Raises InternalError
    when the lists disagree in length, n is 0 or n > bucket."""
    n = len(positions)
    if not (n == len(slots) == len(seq_lens)) or not 0 < n <= bucket:
        raise InternalError(f"cannot pad {n} decode rows to a bucket of {bucket}")
    pad = bucket - n
    return (
        [*positions, *([PAD_POSITION] * pad)],
        [*slots, *([PAD_SLOT] * pad)],
        [*seq_lens, *([PAD_SEQ_LEN] * pad)],
    )


class GraphRunner:
    """Captured decoder forwards for decode-only steps (see module docstring).

    `forward` runs the decoder (embedding to final norm) over the given static tensors; it must
    not synchronise with the host. `max_model_len` bounds contexts (tokens) and so the
    block-table width. Counters for benchmarks: `num_replays`, `num_eager_fallbacks` (decode
    steps the caller ran eagerly because `can_run` said no).
    """

    def __init__(
        self,
        forward: DecodeForward,
        *,
        device: torch.device,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        num_kv_heads: int,
        staging: HostStaging | None = None,
        programs_per_sm: int = DECODE_PROGRAMS_PER_SM,
    ) -> None:
        if device.type != "cuda":
            raise ConfigError(f"CUDA graphs need a CUDA device, not {device}")
        self.forward = forward
        self.device = device
        self.staging = staging or HostStaging(device)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.buckets = decode_buckets(max_num_seqs)
        self.num_kv_heads = num_kv_heads
        self.programs_per_sm = programs_per_sm  # the decode kernel's (choose_num_splits)
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        rows = self.buckets[-1]
        i64, i32 = torch.int64, torch.int32
        self.token_ids = torch.zeros(rows, dtype=i64, device=device)
        self.packed = torch.zeros(3 * rows, dtype=i64, device=device)  # see packed_views
        self.positions, self.slot_mapping, self.seq_lens = packed_views(self.packed, rows)
        self.slot_mapping.fill_(PAD_SLOT)
        self.block_tables = torch.zeros((rows, self.max_blocks_per_seq), dtype=i32, device=device)
        self.cu_seqlens_q = torch.arange(rows + 1, dtype=i32, device=device)  # one query per row
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.num_replays = 0
        self.num_eager_fallbacks = 0

    def _meta(self, bucket: int, num_splits: int) -> StepMetadata:
        return StepMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            block_tables=self.block_tables[:bucket],
            seq_lens=self.seq_lens[:bucket],
            cu_seqlens_q=self.cu_seqlens_q[: bucket + 1],
            max_seqlen_q=1,
            max_seq_len=self.max_model_len,
            decode_only=True,
            num_splits=num_splits,
        )

    def _run_forward(self, bucket: int, num_splits: int) -> torch.Tensor:
        meta = self._meta(bucket, num_splits)
        return self.forward(self.token_ids[:bucket], self.positions[:bucket], meta)

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every (bucket, num_splits), largest bucket first, into one pool.

        The static inputs hold padding only (seq_len 0, slot -1), so capture touches no KV.
        """
        keys = [
            (b, s)
            for b in self.buckets
            for s in split_variants(
                b, self.max_model_len, self.num_kv_heads, self.num_sms, self.programs_per_sm
            )
        ]
        keys.sort(reverse=True)
        pool = None
        for key in keys:
            self._run_forward(*key)  # warm-up: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[key] = self._run_forward(*key)
            pool = graph.pool() if pool is None else pool
            self.graphs[key] = graph
        torch.cuda.synchronize(self.device)

    def can_run(self, num_rows: int, max_blocks: int) -> bool:
        """True when a decode batch of `num_rows` rows whose widest block table has
        `max_blocks` blocks can replay a captured graph."""
        return (
            bool(self.graphs)
            and choose_bucket(num_rows, self.buckets) is not None
            and max_blocks <= self.max_blocks_per_seq
        )

    def run(
        self,
        token_ids: torch.Tensor,
        positions: Sequence[int],
        slots: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
    ) -> torch.Tensor:
        """Replay the graph for these n decode rows; returns hidden [n, hidden] (a view of the
        graph's output: use it before the next replay).

        token_ids: int64 [n] on the device (may be the previous step's sampled ids); the rest
        are host lists, one entry per row. Raises InternalError when `can_run` is false.
        """
        n = token_ids.shape[0]
        width = max(len(t) for t in block_tables) if block_tables else 0
        if not self.can_run(n, width):
            raise InternalError(f"no CUDA graph for {n} decode rows of {width} blocks")
        bucket = choose_bucket(n, self.buckets)
        assert bucket is not None
        if len(block_tables) != n:
            raise InternalError(f"{len(block_tables)} block tables for {n} decode rows")
        splits = choose_num_splits(
            bucket,
            max(seq_lens),
            self.num_kv_heads,
            self.num_sms,
            programs_per_sm=self.programs_per_sm,
        )
        packed = pack_step_inputs(*pad_rows(positions, slots, seq_lens, bucket), self.buckets[-1])
        # Staged in a pinned arena and copied non_blocking: the host does not wait for the GPU
        # (livemeet.engine.staging; inside ModelRunner.launch this bracket is the launch's).
        stage = self.staging
        with stage.step():
            self.token_ids[:n].copy_(token_ids, non_blocking=True)
            if n < bucket:
                self.token_ids[n:bucket].zero_()
            host = stage.stage(packed, torch.int64)
            self.packed[: packed.size].copy_(host, non_blocking=True)
            tables = stage.stage_rows(block_tables, width, torch.int32)
            self.block_tables[:n, :width].copy_(tables, non_blocking=True)
        self.graphs[(bucket, splits)].replay()
        self.num_replays += 1
        return self.outputs[(bucket, splits)][:n]
