"""The recorder page's script (livemeet/web/recorder.js), run under node in a stub browser."""

from __future__ import annotations

from typing import Any

from tests.web.node_harness import WEB, needs_node, run_harness


def click_start(context: str) -> dict[str, object]:
    """The status line and the Start button's state after a click on Start."""
    return run_harness("recorder_harness.js", str(WEB / "recorder.js"), context)


@needs_node
def test_an_insecure_page_says_the_microphone_needs_https() -> None:
    """Opened over http from another machine, the page said "cannot start: Cannot read
    properties of undefined (reading 'getUserMedia')" (a trial): browsers give no
    navigator.mediaDevices to insecure pages. It now says what to do."""
    result = click_start("insecure")
    assert "needs https or localhost" in str(result["status"])
    assert "https://10.0.0.5:8000/" in str(result["status"])
    assert result["start_disabled"] is False  # the user can try again


@needs_node
def test_a_secure_page_asks_for_the_microphone() -> None:
    result = click_start("secure")
    assert result["status"] == "cannot start: denied"  # getUserMedia was reached


def run_resume(scenario: str, *page_url: str) -> dict[str, Any]:
    """`page_url`: where the page was opened (default https://meet.example:8000/)."""
    return run_harness("resume_harness.js", str(WEB / "recorder.js"), scenario, *page_url)


@needs_node
def test_a_dropped_connection_is_resumed_from_the_servers_offset() -> None:
    """A 1006 close mid-recording lost the meeting (the page only said "closed 1006"). The
    page now reconnects with the session's id and token, sends again what the server lacks
    (from the resumed `session.ready`'s offset: the audio kept since the last ack, plus what
    the microphone gave while offline), shows each final once, and `end`s on the new socket."""
    result = run_resume("resume")
    assert result["sockets"] == 2
    first, second = result["first"], result["second"]
    assert "resume" not in first[0]
    assert [m.get("frame") for m in first[1:]] == [0, 1, 2, 3, 4]  # held until ready, in order
    assert second[0]["resume"] == {"session_id": "s-1", "resume_token": "tok"}
    assert second[0]["sample_rate"] == 16000 and second[0]["channels"] == 1
    # the server held frames 0-2 (offset 4800): 3-4 again, 5-6 from offline, 7 live
    assert [m.get("frame") for m in second[1:-1]] == [3, 4, 5, 6, 7]
    assert second[-1] == {"type": "end"}
    assert result["finals"] == 2  # seg-0000 replayed, shown once
    assert "reconnecting" in result["statusOffline"]


@needs_node
def test_the_resume_buffer_keeps_what_is_unacknowledged_and_refuses_past_its_bound() -> None:
    """Past its bound (MAX_UNACKED_S of audio) new audio is dropped and counted, so the
    session's audio stays contiguous; an ack frees room; a resend starts mid-frame."""
    buffer = run_resume("resume")["buffer"]
    assert buffer["pushed"] == [True, True, True, False]
    assert buffer["lost"] == 1600
    assert buffer["from"] == [[1, 800], [2, 1600]]
    assert buffer["after"] is True and buffer["next"] == 4 * 1600


@needs_node
def test_the_page_gives_up_once_the_resume_window_has_passed() -> None:
    result = run_resume("expire")
    assert result["sockets"] == 2  # one retry within the window, none after it
    assert "press Start for a new one" in result["status"]
    assert result["start_disabled"] is False


@needs_node
def test_the_page_waits_for_a_server_that_is_restarting() -> None:
    """No server answers after the drop (a trial killed it; a restart takes its model's load
    time): the page gave up a window after the drop, while the restarted server kept the
    session a window from its own start. Each retry that finds no server moves the deadline
    a window past it: the page resumes once the server answers, past the first window."""
    result = run_resume("outage")
    assert result["sockets"] == 4
    assert "reconnecting" in result["statusDuring"]
    assert result["resumed"] == {"session_id": "s-1", "resume_token": "tok"}


@needs_node
def test_the_page_resumes_a_session_across_a_graceful_restart() -> None:
    """A restart (SIGTERM, `serve --shutdown-live keep`) sends `server_restarting` and closes
    1012, keeping the session for its next start: the page took that close as the server's
    end of the meeting and gave up. It now says the server is restarting and retries as for
    a server that cannot be reached (past the session's window), then resumes."""
    result = run_resume("restart")
    assert "restarting" in result["statusRestarting"]
    assert "restarting" in result["statusClosed"] and "reconnecting" in result["statusClosed"]
    # the retries that find no server meanwhile said "connection lost": the restart goes on.
    # The status line (a live region) says so once: each retry's wait ("reconnecting in
    # 0.3 s… 0.5… 1.0…", read out at every retry: a trial) goes beside it, not read out
    assert result["statusRetries"] == [result["statusClosed"]] * 2
    assert result["statusClosed"] == "the server is restarting: reconnecting…"
    assert result["detailRetries"] == ["(next try in 0.5 s)", "(next try in 1.0 s)"]
    assert result["sockets"] == 4
    assert result["resumed"] == {"session_id": "s-1", "resume_token": "tok"}


@needs_node
def test_the_page_shows_the_captions_overlay_url_of_its_session() -> None:
    """The read-only overlay URL (captions_token, not the resume token) for OBS."""
    overlay = run_resume("resume")["overlay"]
    assert overlay["hidden"] is False
    assert overlay["url"] == "https://meet.example:8000/captions.html?session=s-1&token=c%2Ftok"


@needs_node
def test_behind_a_proxy_under_a_path_the_page_uses_that_path() -> None:
    """Served by a proxy at https://meet.example/meet/ (as `livemeet stream --url` allows),
    the page loaded (its scripts and readyz are relative) but opened wss://meet.example/v1/live
    and showed https://meet.example/captions.html (a trial): both outside the proxy's path."""
    result = run_resume("resume", "https://meet.example/meet/")
    assert result["liveUrl"] == "wss://meet.example/meet/v1/live"
    assert result["overlay"]["url"] == (
        "https://meet.example/meet/captions.html?session=s-1&token=c%2Ftok"
    )
    assert run_resume("resume")["liveUrl"] == "wss://meet.example:8000/v1/live"
