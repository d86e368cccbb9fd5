import pytest

from livemeet.audio import constants as c


@pytest.mark.parametrize(
    ("seconds", "tokens"),
    [(1, 13), (10, 125), (11, 138), (29.99, 375), (30.01, 376), (40, 500), (3600, 45_000)],
)
def test_num_audio_tokens_matches_model_contract(seconds: float, tokens: int) -> None:
    assert c.num_audio_tokens(round(seconds * c.SAMPLE_RATE)) == tokens


def test_derived_constants() -> None:
    assert c.WINDOW_SAMPLES == 480_000
    assert c.N_FRAMES == 3_000
    assert c.TOKENS_PER_WINDOW == 375
    assert c.AUDIO_TOKENS_PER_SECOND == 12.5


def test_negative_count_rejected() -> None:
    with pytest.raises(ValueError):
        c.num_audio_tokens(-1)


def test_the_upload_hold_has_one_default_for_the_cli_and_the_scheduler() -> None:
    from livemeet.config import ModelConfig
    from livemeet.engine.scheduler import SchedulerConfig

    assert ModelConfig().upload_batch_wait_ms == 1000.0 * c.UPLOAD_BATCH_WAIT_S
    assert ModelConfig().upload_step_budget_ms == 1000.0 * c.UPLOAD_STEP_BUDGET_S
    assert SchedulerConfig().upload_batch_wait_s == c.UPLOAD_BATCH_WAIT_S


def test_an_engine_worker_thread_leaves_the_gil_switch_interval_alone() -> None:
    """The interval is process-wide: run_worker sets it only in its own process (the engine
    child), never in a host process that runs it as a thread (tests, in-process engine)."""
    import queue
    import sys

    from livemeet.config import ModelConfig
    from livemeet.engine.messages import WorkerFailed
    from livemeet.engine.worker import run_worker

    before = sys.getswitchinterval()
    outbox: queue.Queue[object] = queue.Queue()
    run_worker(ModelConfig(backend="no-such-backend"), queue.Queue(), outbox)
    assert isinstance(outbox.get_nowait(), WorkerFailed)
    assert sys.getswitchinterval() == before


def test_the_journal_commits_more_often_than_acks_go_out() -> None:
    """An ack waits for its audio's group commit (livemeet/gateway/live_journal.py), so a
    commit interval at or past the ack interval would delay acks beyond it."""
    assert 0 < c.JOURNAL_COMMIT_INTERVAL_S < c.ACK_INTERVAL_S
