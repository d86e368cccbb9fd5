"""The captions overlay's script (livemeet/web/captions.js), run under node in a stub browser."""

from __future__ import annotations

import functools
from typing import Any

from tests.web.node_harness import WEB, needs_node, run_harness

pytestmark = needs_node


@functools.cache
def overlay_run() -> dict[str, Any]:
    """One run of tests/web/captions_harness.js (every scenario: ~2 s of node timers)."""
    return run_harness("captions_harness.js", str(WEB / "captions.js"), str(WEB / "recorder.js"))


def test_the_snapshot_then_live_events_show_the_last_lines_each_final_once() -> None:
    """The snapshot's finals and partial, then live events: the last 3 lines; a repeated
    final shows once; the part of a partial a final has committed is not shown twice."""
    run = overlay_run()
    assert run["url"] == "wss://meet.example:8000/v1/sessions/s%201/captions?token=t%2Bk%2F"
    assert run["snapshot"] == ["S01: one", "S02: two", "S01: thr ~"]
    assert run["live"] == ["S02: two", "S01: three", "S03: fo ~"]
    assert run["ended"] == ["S02: two", "S01: three", "S03: four"]  # the final: no partial


def test_behind_a_proxy_under_a_path_the_subscription_uses_that_path() -> None:
    """captions.html at http://meet.example/meet/ subscribed at ws://meet.example/v1/...,
    outside the proxy's path (a trial)."""
    assert overlay_run()["prefixedUrl"] == "ws://meet.example/meet/v1/sessions/s/captions?token=t"


def test_a_dropped_connection_is_reconnected_and_its_snapshot_merged() -> None:
    run = overlay_run()
    assert run["socketsAfterDrop"] == 2
    assert run["afterReconnect"] == ["S02: two", "S01: three", "S03: four ~"]  # no repeats
    assert run["socketsAfterEnd"] == 2  # a normal close after the final: done
    assert run["socketsAfterQueueFull"] == 2  # too slow: a fresh snapshot


def test_refusals_that_a_retry_cannot_fix_are_shown_and_not_retried() -> None:
    run = overlay_run()
    assert run["refused"] == {"sockets": 1, "status": "captions: wrong token"}
    assert run["bare"]["sockets"] == 0 and "?session=" in run["bare"]["status"]


def test_speakers_have_the_recorders_colours() -> None:
    run = overlay_run()
    assert run["colours"]["captions"] == run["colours"]["recorder"]
    assert len(set(run["colours"]["captions"][:3])) == 3
    assert run["liveColours"] == run["colours"]["captions"][1::-1] + [run["colours"]["captions"][2]]


def test_named_speakers_show_by_name_from_the_snapshot_and_live_events() -> None:
    """`speaker.renamed` in the snapshot and live: the name where the label was, in the
    label's colour; null shows the label again; a reconnect's snapshot is the names' truth
    (one removed meanwhile is not in it)."""
    run = overlay_run()
    assert run["namesSnapshot"] == ["Alice: one", "S02: two", "Alice: thr ~"]
    assert run["namesSnapshotColours"] == [run["colours"]["captions"][i] for i in (0, 1, 0)]
    assert run["namesLive"] == ["Alice: one", "Bob: two", "Alice: thr ~"]
    assert run["namesCleared"] == ["S01: one", "Bob: two", "S01: thr ~"]
    assert run["namedSockets"] == 2
    assert run["namesAfterReconnect"] == ["S01: one", "Robert: two"]


def test_merged_speakers_show_as_their_target_from_the_snapshot_live_and_the_final() -> None:
    """`speaker.merged`: a merged label's lines show its target (its name, its colour),
    through a chain (S03 into S02, then S02 into S01); a reconnect's snapshot replays them;
    a final's `merged` alone is enough."""
    run = overlay_run()
    assert run["mergesSnapshot"] == ["Alice: one", "S02: two", "S02: four", "S02: fi ~"]
    assert run["mergesLive"] == ["Alice: one", "Alice: two", "Alice: four", "Alice: fi ~"]
    assert run["mergesLiveColours"] == [run["colours"]["captions"][0]] * 4
    assert run["mergesAfterReconnect"] == run["mergesLive"]
    assert run["mergesFromTheFinal"] == ["S01: one", "S01: four"]


def test_a_reconnect_keeps_the_names_and_merges_its_ready_frame_carries() -> None:
    """`captions.ready` carries the snapshot's names and merges (`speakers`, `merged`): the
    overlay takes them at once, so a reconnect shows no bare labels before the snapshot's
    frames come (it cleared them at every reconnect: a flicker). A ready frame without them
    (an older server) still clears them; each ready replaces them whole."""
    run = overlay_run()
    # no maps: cleared (the partial "fi" stays until a new one comes)
    assert run["mergesDropped"] == ["S01: one", "S02: two", "S03: four", "S03: fi ~"]
    assert run["mergesAtReadyWithMaps"] == run["mergesLive"]  # at once, before the snapshot
    assert run["mergesAfterMapsSnapshot"] == run["mergesLive"]
    assert run["mapsReplaced"] == ["S01: one", "Bob: two", "S03: four", "S03: fi ~"]


def test_a_session_that_is_gone_leaves_the_overlay_empty_unless_debugging() -> None:
    """4404 (the meeting ended and OBS reloaded the source, or the session was dropped) drew
    "captions: no such session ..." over the video: now nothing shows (no status, no stale
    lines) and nothing retries; with debug=1 the status shows."""
    run = overlay_run()
    assert run["gone"] == {"sockets": 1, "lines": [], "status": ""}
    assert run["goneDebug"]["status"].startswith("captions: no such session")


def test_lines_shown_before_the_session_went_linger_then_go() -> None:
    """After a server restart the overlay reconnected only once the meeting had ended: 4404,
    and its lines went at once, the end of the meeting never seen (a trial). Lines it had
    shown of the meeting now stay 10 s (FINAL_LINGER_MS) as after a final, then go."""
    run = overlay_run()
    assert run["droppedAtClose"] == {"sockets": 2, "lines": ["S01: one"], "status": ""}
    assert run["droppedGone"] == {"sockets": 2, "lines": [], "status": ""}


def test_a_revision_replaces_the_finals_it_supersedes() -> None:
    """`transcript.revised` was ignored: the overlay kept showing the superseded finals (a
    trial). Its segments take their place, names kept on their labels; a reconnect's snapshot
    (the superseded finals again, then the revision) shows the revision once."""
    run = overlay_run()
    assert run["revisedBefore"] == ["Alice: one", "S02: two", "Alice: three"]
    assert run["revised"] == ["Alice: one, two", "S02: and three"]
    assert run["revisedAfterReconnect"] == run["revised"]


def test_the_last_lines_linger_after_the_meeting_ended_then_go() -> None:
    """After the normal close (1000) that follows the final, the last lines stayed over the
    video for good (a trial): they now stay 10 s (FINAL_LINGER_MS), for the end to be read,
    then the overlay is empty (debug=1 says why); nothing reconnects."""
    run = overlay_run()
    assert run["endedAtClose"] == {"lines": ["S01: one", "S02: two"], "status": ""}
    assert run["endedAfter5s"] == run["endedAtClose"]
    assert run["endedAfter15s"] == {"sockets": 1, "lines": [],
                                    "status": "captions: the meeting ended"}  # fmt: skip
