"""The recorder page's timers (livemeet/web/recorder.js) while the wall clock steps, run under
node in a stub browser (tests/web/session_harness.js, its "step*" scenarios): an NTP
correction, the user setting the time or a VM resumed moves Date.now() by minutes while the
monotonic clock (performance.now()) runs on. The timers within the page count the time that
really passed; the times saved for a reload (alive_at, started_at, stopped_at) stay the wall
clock's."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.web.node_harness import WEB, needs_node, run_harness

pytestmark = needs_node
MINUTE_MS = 60_000
# each scenario's step of the wall clock: minutes back, or forward
BACK = -5 * MINUTE_MS
FORWARD = 5 * MINUTE_MS
STEPS = pytest.mark.parametrize("step", [BACK, FORWARD], ids=["back", "forward"])


@functools.cache
def run(scenario: str, step: int, transcript_status: str = "final", **env: str) -> dict[str, Any]:
    """The session harness's `scenario` with the wall clock stepped by `step` ms."""
    return run_harness(
        "session_harness.js", str(WEB / "recorder.js"), scenario,
        env={"TZ": "UTC", "STEP": str(step), "TRANSCRIPT_STATUS": transcript_status, **env},
    )  # fmt: skip


@STEPS
def test_a_silent_socket_is_dropped_after_15_s_of_real_time_whatever_the_wall_clock(
    step: int,
) -> None:
    """A dead network path sends no close: the page drops a socket that owes an ack and says
    nothing for 15 s, and resumes. Timed on the wall clock, a step back by 5 minutes kept a
    dead socket for 5 minutes more (the meeting's audio filling the resend buffer), and a step
    forward dropped a live one at the next tick."""
    result = run("stepdead", step)
    assert result["socketsAt14s"] == 1 and result["closedAt14s"] is False
    assert result["statusAt14s"].startswith("recording")
    assert result["closedByPage"] is True
    assert "no answer from the server for 16 s" in result["statusDead"]
    assert result["resumeStart"]["resume"] == {"session_id": "s-1", "resume_token": "tok"}
    assert result["resent"] == [1]  # the unacknowledged frame
    assert result["status"].startswith("resumed")


def test_a_healthy_socket_stays_when_the_wall_clock_jumps_forward() -> None:
    """The server acknowledges every frame within a second; the wall clock jumps 5 minutes
    forward between a send and its ack (then back): the page took the socket for silent for 5
    minutes and dropped it. It stays, and the meeting ends on it."""
    result = run("stephealthy", FORWARD)
    assert result["closedByPage"] is False and result["socketCount"] == 1
    assert len(result["statuses"]) == 2
    assert all(status.startswith("recording") for status in result["statuses"])
    assert result["status"].startswith("done:")


@STEPS
def test_after_stop_the_transcript_resource_is_asked_after_30_s_of_real_silence(
    step: int,
) -> None:
    """After Stop, 30 s without a word from the server: the page asks the transcript resource
    whether the final is stored (the socket then is dead: it resumes for it). Stepped forward,
    it asked at once; back, a dead socket's final waited 5 minutes more."""
    result = run("stepquiet", step)
    assert result["askedAt29s"] == 0 and result["askedAt31s"] == 1
    assert result["closedByPage"] is True and result["socketsAt31s"] == 2


@STEPS
def test_the_resume_window_after_a_drop_counts_real_time(step: int) -> None:
    """A drop, then a retry that reaches the server and drops again: the page retries while
    the session's window (60 s) lasts. Stepped forward by 5 minutes a moment after the drop,
    it gave up on a meeting the server still kept ("connection lost for longer than the
    server keeps the session"); stepped back, it retried for minutes past the window."""
    result = run("stepwindow", step)
    if step == FORWARD:
        assert result["status"] == "connection lost: reconnecting…"
        assert result["socketCount"] == 3 and result["start_disabled"] is True
    else:
        assert result["status"].startswith(
            "connection lost for longer than the server keeps the session: press Start"
        )
        assert result["socketCount"] == 2 and result["start_disabled"] is False


@STEPS
def test_the_offer_to_resume_after_a_reload_counts_real_time_once_loaded(step: int) -> None:
    """A reloaded page offers to resume its meeting for the rest of the session's window,
    counted from when the page last had it (alive_at: the wall clock is the only measure
    across the reload), and after the load on its own clock. A click 5 s after the load with
    the wall clock 5 minutes ahead was refused as past the window (the meeting lost); one 61 s
    after alive_at with it 5 minutes behind resumed a session the server had ended."""
    result = run("stepoffer", step)
    assert result["offered"] is True
    if step == FORWARD:
        assert result["socketCount"] == 1
        assert result["resumeStart"]["resume"] == {"session_id": "s-1", "resume_token": "tok"}
    else:
        assert result["socketCount"] == 0 and result["resume_hidden"] is True
        assert "was not resumed within its window" in result["status"]
        assert result["storage"] == {}


@pytest.mark.parametrize("step", [BACK, 11 * MINUTE_MS], ids=["back", "forward"])
@pytest.mark.parametrize("revise", [False, True], ids=["final", "revision"])
def test_the_give_ups_after_stop_and_after_the_final_count_real_time(
    revise: bool, step: int
) -> None:
    """The page stops waiting for the final 11 minutes after Stop (FINAL_GIVE_UP_MS), and for
    a revision 11 minutes after the final (REVISION_GIVE_UP_MS). Stepped 11 minutes forward a
    second after, it gave up at once on a final (or revision) still on its way; stepped 5
    minutes back, it waited 16 minutes."""
    result = (
        run("steprevision", step, transcript_status="final", REVISION="pending")
        if revise
        else run("stepfinal", step, transcript_status="running")
    )  # fmt: skip
    if step > 0:  # a second after: waiting, and what comes is shown
        assert result["closedByPage"] is False and result["start_disabled"] is True
        if revise:
            assert result["revision"][1].startswith("revising")
            assert result["then"]["revision"][1].startswith("revised:")
        else:
            assert result["status"].startswith("finishing")
            assert result["then"]["status"].startswith("done:")
    else:  # 11 minutes and a second after: given up
        assert result["closedByPage"] is True and result["start_disabled"] is False
        if revise:
            assert result["revision"][1].startswith("no revision 11 minutes after the final")
        else:
            assert result["status"].startswith("no final transcript 11 minutes after Stop")


@STEPS
def test_a_meeting_stopped_before_a_reload_is_given_up_11_minutes_after_its_stop(
    step: int,
) -> None:
    """Reloaded 10 minutes after Stop (stopped_at: saved on the wall clock, the only measure
    across the reload), the page finishes the meeting and gives up 11 minutes after that
    Stop, counting the time since the load on its own clock: a step forward made it give up
    at once, one back made it wait 5 minutes more."""
    result = run("stepreloadending", step, transcript_status="running")
    if step == FORWARD:
        assert result["closedByPage"] is False and result["status"].startswith("finishing")
        assert result["then"].startswith("done:")
    else:
        assert result["closedByPage"] is True and result["start_disabled"] is False
        assert result["status"].startswith("no final transcript 11 minutes after Stop")


def test_a_socket_opened_as_the_monotonic_clock_reads_0_is_given_up_on() -> None:
    """A reloaded page that finishes its meeting opens its socket as it loads, where a
    browser that coarsens performance.now() (Firefox resisting fingerprinting: 100 ms steps)
    may read 0, the page's "none": the socket, which owed its open, was taken for owing
    nothing, and one that never opened (a dead path: no close) was never given up on (the
    15 s of CONNECT_TIMEOUT_MS). It is, and the page reconnects."""
    result = run("coarseload", 0, transcript_status="running", MONOTONIC_AT_LOAD="0")
    assert result["closedByPage"] is True and "reconnecting" in result["status"]


@STEPS
def test_a_passing_note_shows_for_8_s_of_real_time(step: int) -> None:
    """Why a name was not sent shows in the status line for 8 s, then the recording status
    comes back: stepped forward, the reason went before it could be read; back, it stayed
    for minutes."""
    noted = run("stepnote", step)["noted"]
    assert noted[0].startswith("S01 not renamed: a name needs a visible character")
    assert noted[1] == noted[0]  # 7 s on
    assert noted[2].startswith("recording")  # 8 s on


@STEPS
def test_a_meeting_the_server_is_ending_is_asked_about_for_3_minutes_of_real_time(
    step: int,
) -> None:
    """A meeting gone from the page whose transcript the server is still ending ("running")
    is asked about every 3 s for at most 3 minutes. Stepped forward as the first answer came,
    the page asked no more (its downloads said "the finals so far" for good); stepped back
    3 minutes on, it asked on for 5 minutes more."""
    result = run("steppoll", step, TRANSCRIPT_SEQUENCE="running,running,running")
    assert result["askedFirst"] == 1
    assert result["askedAfter"] == (2 if step == FORWARD else 1)


def test_the_times_saved_for_a_reload_stay_the_wall_clocks() -> None:
    """alive_at (when the page last had the session: a reload offers to resume it for the
    rest of the window from then), started_at and stopped_at are the wall clock's, stepped
    or not; alive_at is refreshed on acks once a second of real time. Stepped back 5 minutes,
    the page refreshed it no more until the wall clock passed the last value, and a reload
    then counted the window from a time the page had long left."""
    result = run("stepsaved", BACK)
    start_ms = result["atStart"]["started_at"]
    assert result["atStart"]["alive_at"] == start_ms  # the harness's clock at Start
    assert result["afterStep"]["alive_at"] == result["wallAfterStep"] == start_ms + BACK + 1500
    stopped = result["stopped"]
    assert stopped["ending"] is True and stopped["started_at"] == start_ms
    assert stopped["stopped_at"] == stopped["alive_at"] == result["wallAtStop"]
