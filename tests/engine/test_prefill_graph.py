"""Piecewise prefill graphs (livemeet.engine.prefill_graph): buckets on the CPU; the piece
decomposition against the decoder's own forward (eagerly, under the Triton interpreter, with
stale junk in the padding rows); graph replay against the eager pieces on a GPU."""

from __future__ import annotations

import pytest
import torch

from livemeet.engine.prefill_graph import PREFILL_BUCKETS, PiecewiseRunner, prefill_buckets
from livemeet.errors import ConfigError, InternalError
from livemeet.layers.attention import DenseAttention
from livemeet.models.audio_llm import MossTDModel
from livemeet.models.loader import load_model

HAS_CUDA = torch.cuda.is_available()


def test_buckets_cover_the_token_limit() -> None:
    assert prefill_buckets(8192) == PREFILL_BUCKETS
    assert prefill_buckets(100) == (16, 32, 64, 128)
    assert prefill_buckets(2100) == (*prefill_buckets(2048), 2560)
    assert prefill_buckets(1) == (16,)
    assert prefill_buckets(20_000)[-3:] == (8192, 16384, 32768)
    with pytest.raises(ConfigError):
        prefill_buckets(0)


def test_buckets_pad_a_large_step_by_at_most_a_third() -> None:
    """Above 512 rows no step runs in a bucket more than 1.5x its rows: the projections run
    over the whole bucket (~2,500-row live steps ran in 4,096 with powers of two)."""
    buckets = prefill_buckets(8192)
    assert list(buckets) == sorted(set(buckets))
    for n in range(513, 8193):
        bucket = next(b for b in buckets if b >= n)
        assert bucket <= 1.5 * n, (n, bucket)


@pytest.fixture(scope="module")
def model(upstream_dir: object) -> MossTDModel:
    """A private fp32 copy of the tiny model, prepared for the fused path."""
    m, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    m.prepare_for_serving()
    return m


def _reference(model: MossTDModel, embeds: torch.Tensor, positions: torch.Tensor, lens: list[int]):
    lm = model.language_model
    lm.fused = True
    try:
        attn = DenseAttention([model.new_kv_cache() for _ in lens], lens)
        return lm(embeds, positions, attn)
    finally:
        lm.fused = None


@pytest.mark.skipif(HAS_CUDA, reason="interpreter test (CPU-only machines)")
@torch.no_grad()
def test_eager_pieces_equal_the_fused_forward_with_junk_in_padding(model: MossTDModel) -> None:
    lm = model.language_model
    runner = PiecewiseRunner(lm, device=torch.device("cpu"), max_tokens=64, use_graphs=False)
    assert runner.buckets == (16, 32, 64)
    gen = torch.Generator().manual_seed(0)
    for buf in (runner.embeds, runner.q, runner.k, runner.v, runner.residual, runner.attn_out):
        buf.copy_(torch.randn(buf.shape, generator=gen) * 1e3)  # stale rows from other steps
    for lens in ([5], [3, 9], [23], [16]):
        n = sum(lens)
        embeds = torch.randn(n, lm.cfg.hidden, generator=gen)
        positions = torch.cat([torch.arange(k) + 11 * j for j, k in enumerate(lens)])
        attn = DenseAttention([model.new_kv_cache() for _ in lens], lens)
        got = runner.run(embeds, positions, attn).clone()
        want = _reference(model, embeds, positions, lens)
        assert got.shape == (n, lm.cfg.hidden)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert runner.num_eager_runs == 4 and runner.num_replays == 0
    with pytest.raises(InternalError, match="bucket"):
        runner.run(torch.zeros(65, lm.cfg.hidden), torch.zeros(65, dtype=torch.long), attn)


def test_graphs_need_cuda_and_prepared_weights(upstream_dir: object) -> None:
    m, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    with pytest.raises(InternalError, match="prepare_for_serving"):
        PiecewiseRunner(
            m.language_model, device=torch.device("cpu"), max_tokens=16, use_graphs=False
        )
    m.prepare_for_serving()
    if not HAS_CUDA:
        with pytest.raises(ConfigError, match="CUDA"):
            PiecewiseRunner(m.language_model, device=torch.device("cpu"), max_tokens=16)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@torch.no_grad()
def test_graph_replay_equals_eager_pieces_cuda(upstream_dir: object) -> None:
    m, _ = load_model(str(upstream_dir), device="cuda", dtype="float32")
    m.prepare_for_serving()
    lm = m.language_model
    graphs = PiecewiseRunner(lm, device=torch.device("cuda"), max_tokens=128)
    eager = PiecewiseRunner(lm, device=torch.device("cuda"), max_tokens=128, use_graphs=False)
    assert len(graphs.graphs) == len(graphs.buckets) * (lm.cfg.layers + 1)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for lens in ([5], [3, 9], [70], [16, 16, 1]):
        n = sum(lens)
        embeds = torch.randn(n, lm.cfg.hidden, generator=gen, device="cuda")
        positions = torch.cat([torch.arange(k, device="cuda") + 7 * j for j, k in enumerate(lens)])
        outs = []
        for runner in (graphs, eager):
            attn = DenseAttention([m.new_kv_cache() for _ in lens], lens)
            outs.append(runner.run(embeds, positions, attn).clone())
        torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    assert graphs.num_replays == 4


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_engine_with_prefill_graphs_streams_the_eager_tokens_cuda() -> None:
    """Staggered requests (prefill chunks mixed with decode rows) on an engine with piecewise
    prefill graphs give the token streams of the eager engine; every prefill step replayed."""
    import numpy as np

    from livemeet.engine.engine import Engine, EngineConfig
    from livemeet.engine.scheduler import SchedulerConfig
    from tests.engine.fakes import SteppingClock
    from tests.engine.test_cuda_graph import _tiny_model_on_gpu

    model = _tiny_model_on_gpu()
    rng = np.random.default_rng(1)
    clips = [0.1 * rng.standard_normal(int(s * 16_000)).astype(np.float32) for s in (1, 4, 9)]
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=32, chunked_prefill_size=64)
    results = []
    for piecewise in (False, True):
        config = EngineConfig(num_kv_blocks=2048, scheduler=sched, prefill_graphs=piecewise)
        engine = Engine(config, model=(model, model.cfg), clock=SteppingClock())
        streams: dict[str, list[int]] = {}
        for step in range(400):
            if step % 7 == 0 and step // 7 < len(clips):  # arrivals while others decode
                i = step // 7
                engine.add_request(f"r{i}", clips[i], max_new_tokens=20, ignore_eos=True)
            if not engine.has_work() and step // 7 >= len(clips):
                break
            for rid, token in engine.step().new_tokens:
                streams.setdefault(rid, []).append(token)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        if piecewise:
            pw = engine.runner.piecewise
            assert pw is not None and pw.num_replays > 3 and pw.num_eager_runs == 0
        results.append(streams)
    assert results[0] == results[1] and all(len(s) == 20 for s in results[0].values())


@pytest.mark.skipif(HAS_CUDA, reason="interpreter test (CPU-only machines)")
@pytest.mark.parametrize("pieces_store_kv", [False, True])
def test_model_runner_routes_steps_through_the_pieces(
    upstream_dir: object, pieces_store_kv: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner holding a PiecewiseRunner sends its eager steps (prefill and decode) through
    it; the token streams equal the reference forward's (fused kernels match it to ~1e-6).
    Given the pool, the pieces store K/V themselves: attention never calls `store_kv`, and
    padding rows store nothing even where the static slots held stale ones."""
    import numpy as np

    from livemeet.engine import paged_backend
    from livemeet.engine.engine import Engine, EngineConfig
    from livemeet.engine.scheduler import SchedulerConfig
    from tests.engine.fakes import SteppingClock

    monkeypatch.setattr(paged_backend, "_fused_store", True)
    stores: list[int] = []
    real_store = paged_backend.store_kv
    monkeypatch.setattr(
        paged_backend,
        "store_kv",
        lambda k, *a, **kw: stores.append(k.shape[0]) or real_store(k, *a, **kw),
    )

    m, _ = load_model(str(upstream_dir), device="cpu", dtype="float32")
    m.prepare_for_serving()
    rng = np.random.default_rng(2)
    clips = [0.1 * rng.standard_normal(int(s * 16_000)).astype(np.float32) for s in (1, 1.5)]
    sched = SchedulerConfig(max_model_len=1024, max_num_batched_tokens=64, chunked_prefill_size=64)
    results = []
    for piecewise in (False, True):
        engine = Engine(
            EngineConfig(num_kv_blocks=256, scheduler=sched),
            model=(m, m.cfg),
            clock=SteppingClock(),
        )
        runner = engine.runner
        spare: list[torch.Tensor] = []
        if piecewise:
            pool = (runner.k_caches, runner.v_caches, runner.kv_scale)
            runner.piecewise = PiecewiseRunner(
                m.language_model,
                device=torch.device("cpu"),
                max_tokens=64,
                use_graphs=False,
                kv_caches=pool if pieces_store_kv else None,
            )
            assert runner.piecewise.stores_kv is pieces_store_kv
            # stale slots from "earlier steps" in every row, pointing at the last 4 blocks,
            # which no request of this test reaches
            num_blocks, block_size = runner.k_caches[0].shape[:2]
            runner.piecewise.slots.copy_(torch.arange(64) + (num_blocks - 4) * block_size)
            spare = [c[-4:].clone() for c in (*runner.k_caches, *runner.v_caches)]
            stores.clear()
        for i, clip in enumerate(clips):
            engine.add_request(f"r{i}", clip, max_new_tokens=4, ignore_eos=True)
        done = engine.run_to_completion()
        results.append({rid: r.output_token_ids for rid, r in done.items()})
        if piecewise:
            assert runner.piecewise is not None
            assert runner.piecewise.num_eager_runs > 4  # prefill chunks and decodes
            assert bool(stores) is not pieces_store_kv, stores
            after = [c[-4:] for c in (*runner.k_caches, *runner.v_caches)]
            assert all(torch.equal(a, b) for a, b in zip(spare, after, strict=True))
    assert results[0] == results[1]
