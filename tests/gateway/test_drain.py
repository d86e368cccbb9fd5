"""livemeet.gateway.drain: `UploadCutoff.bound` turns the shutdown's cancel, and only that
one, into EngineUnavailable, and leaves its task as it found it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from livemeet.errors import EngineUnavailable
from livemeet.gateway.drain import UploadCutoff

CUTOFF_S = 0.01  # s: each test's drain


async def _cut(cutoff: UploadCutoff, entered: asyncio.Event) -> None:
    """Start the drain once the block is entered, so the cutoff lands inside it."""
    await entered.wait()
    cutoff.start(CUTOFF_S)


async def test_a_block_running_at_the_cutoff_raises_engine_unavailable() -> None:
    cutoff, entered = UploadCutoff(), asyncio.Event()
    cutter = asyncio.create_task(_cut(cutoff, entered))
    with pytest.raises(EngineUnavailable, match="--upload-drain-s"):
        async with cutoff.bound():
            entered.set()
            await asyncio.sleep(10)
    await cutter
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # no cancel left to land elsewhere
    with pytest.raises(EngineUnavailable):  # the cutoff has passed: at once
        async with cutoff.bound():
            pass


async def test_a_block_that_turns_the_cancel_into_an_error_raises_engine_unavailable() -> None:
    cutoff, entered = UploadCutoff(), asyncio.Event()
    cutter = asyncio.create_task(_cut(cutoff, entered))
    with pytest.raises(EngineUnavailable) as caught:
        async with cutoff.bound():
            entered.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise ConnectionError("cut") from None
    await cutter
    assert isinstance(caught.value.__cause__, ConnectionError)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_block_that_swallows_the_cancel_raises_engine_unavailable_at_its_end() -> None:
    cutoff, entered = UploadCutoff(), asyncio.Event()
    cutter = asyncio.create_task(_cut(cutoff, entered))
    with pytest.raises(EngineUnavailable):
        async with cutoff.bound():
            entered.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
    await cutter
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_client_that_left_before_the_cutoff_is_still_a_cancel() -> None:
    """A cancel of its own (the client left: aiohttp cancels the handler) is not the
    cutoff's to answer, though the cutoff comes while the block cleans up (as a decode
    waits for its thread): the handler ends cancelled, unanswered."""
    cutoff, entered, cleaning = UploadCutoff(), asyncio.Event(), asyncio.Event()

    async def upload() -> None:
        async with cutoff.bound():
            entered.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cleaning.set()
                with contextlib.suppress(asyncio.CancelledError):  # on through the cutoff's
                    await asyncio.sleep(10)
                raise

    task = asyncio.create_task(upload())
    await entered.wait()
    task.cancel()
    await cleaning.wait()
    cutoff.start(0)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cutoff.passed


async def test_a_block_that_ended_before_the_cutoff_is_left_alone() -> None:
    cutoff = UploadCutoff()
    async with cutoff.bound():
        await asyncio.sleep(0)
    cutoff.start(0)
    await asyncio.sleep(CUTOFF_S)  # the cutoff passes with no block running
    assert cutoff.passed
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_stopped_cutoff_never_fires() -> None:
    cutoff = UploadCutoff()
    cutoff.start(CUTOFF_S)
    cutoff.stop()
    async with cutoff.bound():
        await asyncio.sleep(3 * CUTOFF_S)
    assert not cutoff.passed
