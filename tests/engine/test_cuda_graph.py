"""Decode CUDA graphs: bucket and padding logic on the CPU; replay vs eager on a GPU.

GPU tests (tiny MOSS-TD geometry, fp32, random KV): for every bucket, a graph replay of n rows
with random context lengths gives the logits of the eager forward over the same unpadded rows,
and an engine with graphs + async decode streams the same tokens as an eager synchronous one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from livemeet.engine.cuda_graph import (
    DECODE_BUCKETS,
    PAD_SLOT,
    GraphRunner,
    choose_bucket,
    decode_buckets,
    pack_step_inputs,
    packed_views,
    pad_rows,
    split_variants,
)
from livemeet.errors import ConfigError, InternalError
from livemeet.layers.paged_attention import H200_NUM_SMS, choose_num_splits

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def test_decode_buckets_cover_every_batch_size() -> None:
    assert decode_buckets(128) == DECODE_BUCKETS
    assert DECODE_BUCKETS[-1] >= 128
    assert decode_buckets(1) == (1,)
    assert decode_buckets(20) == (1, 2, 4, 8, 16, 24)
    assert decode_buckets(150) == (*DECODE_BUCKETS, 144, 160)
    for max_num_seqs in (1, 7, 33, 128, 200):
        buckets = decode_buckets(max_num_seqs)
        assert list(buckets) == sorted(set(buckets))
        for n in range(1, max_num_seqs + 1):
            b = choose_bucket(n, buckets)
            assert b is not None and b >= n
            assert all(x < n for x in buckets if x < b)  # the smallest that fits
    with pytest.raises(ConfigError):
        decode_buckets(0)


def test_choose_bucket_edges() -> None:
    assert choose_bucket(0, DECODE_BUCKETS) is None
    assert choose_bucket(129, DECODE_BUCKETS) is None
    assert choose_bucket(25, DECODE_BUCKETS) == 32
    assert choose_bucket(128, DECODE_BUCKETS) == 128


@pytest.mark.parametrize("kv_heads", [2, 8])
@pytest.mark.parametrize("per_sm", [2, 3, 4])
def test_split_variants_hold_every_split_count_the_runtime_picks(kv_heads: int, per_sm: int):
    rng = random.Random(0)
    max_len = 40_960
    for bucket in DECODE_BUCKETS:
        variants = split_variants(bucket, max_len, kv_heads, H200_NUM_SMS, per_sm)
        assert list(variants) == sorted(set(variants))
        lengths = [1, 63, 64, 65, max_len] + [rng.randint(1, max_len) for _ in range(200)]
        picked = {
            choose_num_splits(bucket, n, kv_heads, H200_NUM_SMS, programs_per_sm=per_sm)
            for n in lengths
        }
        assert picked <= set(variants), (bucket, picked, variants)
    assert split_variants(1, max_len, 8, H200_NUM_SMS) == (1, 2, 4, 8, 16, 32, 64)
    assert split_variants(128, max_len, 8, H200_NUM_SMS) == (1,)


@pytest.mark.parametrize("n", [1, 2, 3, 16, 128])
def test_packed_step_inputs_land_in_the_graphs_static_views(n: int) -> None:
    """One copy of `pack_step_inputs`' prefix into the packed buffer sets exactly the first n
    positions, slots and (int32) sequence lengths the graphs read, over a buffer holding an
    earlier, larger step's values (the padding slots past n stay inert)."""
    rows = 128
    rng = np.random.default_rng(n)

    def draw(count: int, low: int, high: int) -> list[int]:
        return [int(x) for x in rng.integers(low, high, count)]

    packed = torch.zeros(3 * rows, dtype=torch.int64)
    positions, slots, seq_lens = packed_views(packed, rows)
    assert (positions.dtype, slots.dtype, seq_lens.dtype) == (torch.int64, torch.int64, torch.int32)
    assert {t.shape for t in (positions, slots, seq_lens)} == {(rows,)}
    earlier = pack_step_inputs(draw(rows, 1, 2**40), draw(rows, 1, 2**40), draw(rows, 1, 2**31),
                               rows)  # fmt: skip
    packed.copy_(torch.from_numpy(np.concatenate([earlier, earlier[: 3 * rows - earlier.size]])))
    pos, slot, lens = draw(n, 0, 2**40), draw(n, -1, 2**40), draw(n, 0, 2**31 - 1)
    values = pack_step_inputs(pos, slot, lens, rows)
    assert values.shape == (2 * rows + (n + 1) // 2,)
    packed[: values.size].copy_(torch.from_numpy(values))
    assert positions[:n].tolist() == pos
    assert slots[:n].tolist() == slot
    assert seq_lens[:n].tolist() == lens
    assert (slots[n:] == PAD_SLOT).all()  # never a stale slot a wider graph could store to


def test_pack_step_inputs_rejects_bad_rows() -> None:
    with pytest.raises(InternalError):
        pack_step_inputs([1, 2], [3], [4, 5], rows=4)
    with pytest.raises(InternalError):
        pack_step_inputs([1] * 5, [1] * 5, [1] * 5, rows=4)
    with pytest.raises(InternalError):
        packed_views(torch.zeros(11, dtype=torch.int64), rows=4)
    with pytest.raises(InternalError):
        packed_views(torch.zeros(12, dtype=torch.int32), rows=4)


def test_pad_rows_pads_with_inert_rows() -> None:
    positions, slots, seq_lens = pad_rows([40, 5], [5 * 16 + 8, 7 * 16 + 5], [41, 6], bucket=4)
    assert positions == [40, 5, 0, 0]
    assert slots == [88, 117, -1, -1]  # -1: store_kv skips the row
    assert seq_lens == [41, 6, 0, 0]  # 0: attention writes zeros
    assert pad_rows([0], [16], [1], bucket=1) == ([0], [16], [1])


@pytest.mark.parametrize(
    ("bucket", "lens"),
    [(4, (0, 0, 0)), (2, (3, 3, 3)), (4, (2, 1, 2))],  # no rows, too many, ragged
)
def test_pad_rows_rejects_bad_rows(bucket: int, lens: tuple[int, ...]) -> None:
    positions, slots, seq_lens = ([0] * k for k in lens)
    with pytest.raises(InternalError):
        pad_rows(positions, slots, seq_lens, bucket)


def test_graph_runner_needs_cuda() -> None:
    with pytest.raises(ConfigError, match="CUDA"):
        GraphRunner(
            lambda ids, pos, meta: ids,
            device=torch.device("cpu"),
            block_size=16,
            max_model_len=1024,
            max_num_seqs=8,
            num_kv_heads=2,
        )


# -- GPU ----------------------------------------------------------------------------------------

MAX_MODEL_LEN = 4_096
BLOCK_SIZE = 16


def _tiny_model_on_gpu() -> torch.nn.Module:
    from livemeet.models.audio_llm import MossTDModel
    from tests.models import tiny

    model = MossTDModel(tiny.TINY)
    model.load_state_dict(tiny.random_weights())
    return model.to("cuda").eval()


def _random_rows(
    n: int, num_blocks: int, rng: random.Random
) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """n decode rows with random contexts over distinct shuffled blocks: positions, slots,
    seq_lens, block tables."""
    lens = [rng.randint(1, MAX_MODEL_LEN // 8) for _ in range(n)]
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables, positions, slots = [], [], []
    for length in lens:
        need = -(-length // BLOCK_SIZE)
        table, free = free[:need], free[need:]
        pos = length - 1
        tables.append(table)
        positions.append(pos)
        slots.append(table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
    return positions, slots, lens, tables


@pytest.mark.gpu
@needs_cuda
def test_graph_replay_matches_eager_for_every_bucket() -> None:
    from livemeet.engine.model_runner import ModelRunner, _StepRows

    model = _tiny_model_on_gpu()
    rows_max = DECODE_BUCKETS[-1]
    num_blocks = rows_max * (MAX_MODEL_LEN // 8 // BLOCK_SIZE + 1)
    runner = ModelRunner(
        model,
        model.cfg,
        block_size=BLOCK_SIZE,
        num_kv_blocks=num_blocks,
        cuda_graphs=True,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=rows_max,
    )
    graphs = runner.graphs
    assert graphs is not None and graphs.buckets == DECODE_BUCKETS
    gen = torch.Generator(device="cuda").manual_seed(0)
    for kc, vc in zip(runner.k_caches, runner.v_caches, strict=True):
        kc.copy_(torch.randn(kc.shape, generator=gen, device="cuda"))
        vc.copy_(torch.randn(vc.shape, generator=gen, device="cuda"))
    rng = random.Random(0)
    sizes = sorted({*DECODE_BUCKETS, *(b - 1 for b in DECODE_BUCKETS if b > 1), 3, 100})
    for n in sizes:
        positions, slots, lens, tables = _random_rows(n, num_blocks, rng)
        ids = torch.randint(0, model.cfg.text.vocab, (n,), device="cuda")
        rows = _StepRows()
        rows.token_ids, rows.positions, rows.slots = ids.tolist(), positions, slots
        rows.seq_lens, rows.block_tables, rows.q_lens = lens, tables, [1] * n
        with torch.inference_mode():
            replays = graphs.num_replays
            graph_logits = model.compute_logits(graphs.run(ids, positions, slots, lens, tables))
            assert graphs.num_replays == replays + 1
            with runner.staging.step():  # what launch() brackets the eager forward with
                eager_logits = model.compute_logits(runner._forward_eager(rows, ids))
        assert graph_logits.shape == eager_logits.shape == (n, model.cfg.text.vocab)
        torch.testing.assert_close(graph_logits, eager_logits, atol=2e-3, rtol=2e-3)
        assert torch.equal(graph_logits.argmax(-1), eager_logits.argmax(-1)), n
    assert not graphs.can_run(rows_max + 1, 1)
    assert not graphs.can_run(1, graphs.max_blocks_per_seq + 1)


@pytest.mark.gpu
@needs_cuda
def test_engine_with_graphs_and_async_matches_eager_sync() -> None:
    from livemeet.engine.engine import Engine, EngineConfig
    from livemeet.engine.scheduler import SchedulerConfig
    from tests.engine.fakes import SteppingClock
    from tests.engine.test_async_decode import FORCED

    model = _tiny_model_on_gpu()
    rng = np.random.default_rng(0)  # noise: the GPU machine may not have the shared speech
    clips = [0.1 * rng.standard_normal(int(s * 16_000)).astype(np.float32) for s in (1, 3, 5, 8)]
    sched = SchedulerConfig(max_model_len=MAX_MODEL_LEN, max_num_seqs=32)
    results = []
    for fast in (False, True):
        config = EngineConfig(
            num_kv_blocks=2048, scheduler=sched, cuda_graphs=fast, async_decode=fast
        )
        engine = Engine(config, model=(model, model.cfg), clock=SteppingClock())
        assert (engine.transfer is not None) is fast
        for i, clip in enumerate(clips):
            engine.add_request(f"r{i}", clip, max_new_tokens=24, forced_output_ids=FORCED.get(i))
        streams: dict[str, list[int]] = {}
        while engine.has_work():
            out = engine.step()
            engine.block_manager.audit(engine.scheduler.live_requests())
            for rid, token in out.new_tokens:
                streams.setdefault(rid, []).append(token)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        if fast:
            assert engine.runner.graphs is not None and engine.runner.graphs.num_replays > 10
            assert engine.runner.graphs.num_eager_fallbacks == 0
        results.append(streams)
    assert results[0] == results[1]


class _GraphsThatMustNotRun:
    """A decode-graph runner stand-in for the CPU: every shape fits, replaying is an error."""

    num_eager_fallbacks = 0

    def can_run(self, num_rows: int, max_blocks: int) -> bool:
        return True

    def run(self, *args: object) -> torch.Tensor:
        raise AssertionError("a step with audio rows replayed the decode graph")


def test_one_token_audio_chunk_never_replays_the_decode_graph(upstream_dir: object) -> None:
    """One new token per sequence looks like decode, but when that token is an audio
    position its embedding must be spliced in, which the captured graphs cannot do."""
    from livemeet.engine.model_runner import ModelRunner, _StepRows
    from livemeet.models.loader import load_model

    model, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    runner = ModelRunner(model, model.cfg, block_size=BLOCK_SIZE, num_kv_blocks=8)
    runner.graphs = _GraphsThatMustNotRun()  # type: ignore[assignment]
    rows = _StepRows()
    rows.token_ids, rows.positions, rows.slots = [7], [0], [0]
    rows.seq_lens, rows.block_tables, rows.q_lens = [1], [[0]], [1]
    rows.audio_rows, rows.audio_values = [0], [torch.ones(1, model.cfg.text.hidden)]
    assert runner._decode_with_graph(rows, torch.tensor([7])) is None
    rows.audio_rows, rows.audio_values = [], []
    with pytest.raises(AssertionError, match="replayed"):
        runner._decode_with_graph(rows, torch.tensor([7]))
