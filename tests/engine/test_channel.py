"""The command channel (livemeet/engine/channel.py): batches, order, and both ends' lifetimes."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.engine.channel import CommandReceiver, CommandSender
from livemeet.engine.messages import AppendAudio, EndSession, Shutdown

FRAME = np.arange(SAMPLE_RATE // 10, dtype=np.float32)  # 100 ms: 6.4 KB, ~10 fill a 64 KiB pipe


@pytest.fixture
def channel() -> Iterator[tuple[CommandSender, CommandReceiver]]:
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = CommandSender(writer)
    yield sender, CommandReceiver(reader)
    sender.close()
    sender.join_thread(5.0)
    reader.close()


def receive(receiver: CommandReceiver, n: int) -> list[object]:
    return [receiver.get(timeout=5.0) for _ in range(n)]


def test_a_busy_reader_gets_every_command_in_order_in_few_messages(
    channel: tuple[CommandSender, CommandReceiver],
) -> None:
    """A worker in a long step reads nothing: 1,000 frames (a second of 100 live sessions,
    6.4 MB, a hundred times what the pipe holds) pile up on the sender's side, and cross as a
    handful of messages once it reads, in order. One message per command (a multiprocessing
    queue) would need the reader back ~100 times to move them."""
    sender, receiver = channel
    for i in range(1_000):
        sender.put_nowait(AppendAudio(f"s{i % 100}", FRAME + i, sent_s=float(i)))
    sender.put_nowait(EndSession("s0"))
    got = receive(receiver, 1_001)
    assert [c.sent_s for c in got[:-1]] == [float(i) for i in range(1_000)]  # type: ignore[attr-defined]
    assert all(c.samples[0] == i for i, c in enumerate(got[:-1]))  # type: ignore[attr-defined]
    assert got[-1] == EndSession("s0")
    assert sender.num_batches <= 30  # the pipe's ~10 single frames, then the rest as batches
    with pytest.raises(queue.Empty):
        receiver.get(block=False)


def test_non_blocking_get_returns_what_has_arrived_or_empty(
    channel: tuple[CommandSender, CommandReceiver],
) -> None:
    sender, receiver = channel
    with pytest.raises(queue.Empty):
        receiver.get(block=False)
    with pytest.raises(queue.Empty):
        receiver.get(timeout=0.05)
    sender.put_nowait(EndSession("a"))
    assert receiver.get(timeout=5.0) == EndSession("a")


def test_closing_the_sender_flushes_then_the_receiver_reads_shutdown() -> None:
    """The gateway closed (or died): what it sent arrives, then `Shutdown`, every time."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender, receiver = CommandSender(writer), CommandReceiver(reader)
    sender.put_nowait(EndSession("a"))
    sender.put_nowait(EndSession("b"))
    sender.close()
    with pytest.raises(ValueError, match="closed"):
        sender.put_nowait(EndSession("c"))
    sender.join_thread(5.0)
    assert receive(receiver, 4) == [EndSession("a"), EndSession("b"), Shutdown(), Shutdown()]
    reader.close()


def test_a_vanished_reader_never_blocks_or_raises_on_the_sender() -> None:
    """The worker died (its end of the pipe closed): writes fail, the sender drops what it
    holds, puts still return at once, and close ends the thread."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = CommandSender(writer)
    reader.close()
    for i in range(50):  # more than the pipe holds: a blocked write would hang here
        sender.put_nowait(AppendAudio("s", FRAME, sent_s=float(i)))
    sender.close()
    sender.join_thread(5.0)
    assert not sender._thread.is_alive()


def test_after_cancel_nothing_more_is_written() -> None:
    """`cancel_join_thread` (the worker died without reading): what is pending then and put
    after is dropped, not written into a pipe no one reads."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender, receiver = CommandSender(writer), CommandReceiver(reader)
    sender.put_nowait(EndSession("a"))
    assert receiver.get(timeout=5.0) == EndSession("a")
    sender.cancel_join_thread()
    sender.put_nowait(EndSession("b"))
    sender.close()
    sender.join_thread(5.0)
    assert not sender._thread.is_alive()
    assert receiver.get(timeout=5.0) == Shutdown()  # the pipe's end, with no "b" before it
    reader.close()


def test_a_read_stops_at_the_fill_limit_and_the_rest_waits_in_the_pipe() -> None:
    """A read takes whole batches while more are there, until it holds `fill_limit` commands;
    later gets take the rest, in order."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender, receiver = CommandSender(writer), CommandReceiver(reader, fill_limit=2)
    sender.put_nowait(EndSession("a"))
    assert receiver.get(timeout=5.0) == EndSession("a")  # the thread is idle again
    for name in "bcde":  # one write each: the thread writes as soon as each is put
        sender.put_nowait(EndSession(name))
        deadline = time.monotonic() + 5.0
        while sender.num_batches < 2 + "bcde".index(name) and time.monotonic() < deadline:
            time.sleep(0.001)
    assert sender.num_batches == 5
    assert receiver.get(timeout=5.0) == EndSession("b")
    assert len(receiver._ready) == 1  # "c": the limit of 2 reached, "d" and "e" still queued
    assert reader.poll(0)
    assert receive(receiver, 3) == [EndSession(n) for n in "cde"]
    sender.close()
    sender.join_thread(5.0)
    reader.close()


class BusyCore:
    """A core always at work whose every step takes `step_s` (sleeping): its worker reads
    the inbox only between steps, as an engine's does."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.num_appends = 0

    def append(self, session_id: str, samples: object) -> None:
        self.num_appends += 1

    def has_work(self) -> bool:
        return True

    def is_holding(self) -> bool:
        return False

    def step(self) -> list[tuple[str, object]]:
        time.sleep(self.step_s)
        return []

    def stats(self) -> None:
        return None


def test_live_frames_reach_a_worker_busy_in_long_steps_without_falling_behind() -> None:
    """Session 16's divergence, in small: 40 live sessions send 100-ms frames (400 a second)
    in real time to a worker whose steps take 100 ms. A multiprocessing queue, one message per
    frame, let ~10 frames cross per step, so their wait grew by about a second every second
    (2.6 s at most over this test's 2.5 s, on a 2-core CPU); through the channel each frame
    waits about one step (at most 1 s asserted: a loaded CI host)."""
    from livemeet.engine.worker import Worker

    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = CommandSender(writer)
    core = BusyCore(step_s=0.1)
    outbox: queue.Queue[object] = queue.Queue()
    worker = Worker(core, outbox)  # type: ignore[arg-type]
    thread = threading.Thread(target=worker.serve, args=(CommandReceiver(reader),), daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        for k in range(25):  # 2.5 s of audio
            for s in range(40):
                sender.put_nowait(AppendAudio(f"s{s}", FRAME, sent_s=time.monotonic()))
            time.sleep(max(0.0, t0 + (k + 1) * 0.1 - time.monotonic()))
        sender.put_nowait(Shutdown())
        thread.join(10.0)
    finally:
        sender.close()
        sender.join_thread(5.0)
        reader.close()
    assert not thread.is_alive()
    assert worker.num_audio_commands == core.num_appends == 1_000
    assert worker.audio_command_lag_max_s < 1.0  # ~0.1-0.2 s; margin for a loaded host
