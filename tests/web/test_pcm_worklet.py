"""The recorder's AudioWorklet (livemeet/web/pcm-worklet.js), under node
(tests/web/worklet_harness.js)."""

from __future__ import annotations

import functools
from typing import Any

from tests.web.node_harness import WEB, needs_node, run_harness

pytestmark = needs_node


@functools.cache
def worklet_run() -> dict[str, Any]:
    return run_harness("worklet_harness.js", str(WEB / "pcm-worklet.js"))


def test_a_flush_posts_the_samples_of_the_frame_being_filled() -> None:
    """Stop right after Start had no whole 100-ms frame to send before `end` (protocol_error):
    the worklet now answers a "flush" with the samples it holds, and starts a new frame."""
    run = worklet_run()
    assert run["beforeFlush"] == 0  # 1,024 samples: under a frame
    assert run["flushed"] == 1024 and run["flushedValue"] == int(0.5 * 0x7FFF)
    assert run["afterFlush"] == [1600]
    assert run["flushedAgain"] == 64


def test_the_worklet_posts_the_output_rate_it_is_asked_for_from_any_context_rate() -> None:
    """1 s of a 440-Hz tone comes out as 1 s at the output rate (the rate the page declares),
    the tone still at 440 Hz: downsampled from a faster context, upsampled from a slower one
    (8 kHz into a session declared at 16 kHz). The worklet made one sample per input sample
    below 16 kHz: 8-kHz audio came out at half the samples, the tone at twice its pitch."""
    for case in worklet_run()["rates"]:
        out_rate = case["outputRate"] or 16000
        assert abs(case["samples"] - out_rate) <= 1, case
        assert abs(case["crossings"] - 440) <= 1, case
        assert case["frame"] == int(out_rate / 10 + 0.5), case  # 100-ms frames, rounded
