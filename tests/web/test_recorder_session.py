"""The recorder page (livemeet/web/recorder.js) around a meeting's transcript downloads and
across page reloads, run under node in a stub browser (tests/web/session_harness.js)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.web.node_harness import WEB, needs_node, run_harness

pytestmark = needs_node
URL = "https://meet.example:8000/v1/sessions/s-1/transcript?token=c%2Ft%2Bk%3D&response_format="


@functools.cache
def run(
    scenario: str,
    page: str = "https://meet.example:8000/",
    transcript_status: str = "final",
    flush: str = "0",
    context_rate: str = "48000",
    clipboard: str = "ok",
    exec_copy: str = "no",
    finish: str = "stop",
    duration: str = "3",
    last: str = "final",
    sequence: str = "",
    revision: str = "",
    backend: str = "moss",
) -> dict[str, Any]:
    return run_harness(
        "session_harness.js", str(WEB / "recorder.js"), scenario,
        # the file names carry the meeting's local time
        env={"TZ": "UTC", "PAGE_HREF": page, "TRANSCRIPT_STATUS": transcript_status,
             "FLUSH": flush, "CTX_RATE": context_rate, "CLIPBOARD": clipboard,
             "EXEC_COPY": exec_copy, "FINISH": finish, "DURATION": duration, "LAST": last,
             "TRANSCRIPT_SEQUENCE": sequence, "REVISION": revision, "BACKEND": backend},
    )  # fmt: skip


def test_the_demo_banner_names_the_demo_backend_that_serves() -> None:
    """The banner's text (index.html) names Whisper tiny.en; the scripted test backend also
    reports `demo: true` and got that text (session 38's notes). The Whisper demo keeps it;
    another demo backend is named by readyz's model instead; a real model shows none."""
    assert run("export", backend="moss")["banner"]["display"] == "none"
    whisper = run("export", backend="demo")["banner"]
    assert whisper == {"display": "block", "text": ""}  # the stub page: index.html's text kept
    scripted = run("export", backend="scripted")["banner"]
    assert scripted["display"] == "block"
    assert "scripted (tests)" in scripted["text"] and "Whisper" not in scripted["text"]
    assert "--model" in scripted["text"]


def test_the_page_links_the_transcript_downloads_during_and_after_the_meeting() -> None:
    """JSON, SRT, VTT and text from the server's transcript resource (one set of writers),
    read with the session's captions_token (encoded), named by the meeting's start; after
    transcript.final and the socket's close the links stay (the server keeps the final)."""
    result = run("export")
    assert result["before"]["hidden"] is True  # no session yet
    expected = {
        "json": (URL + "diarized_json", "meeting-2026-12-05-143015.json"),
        "srt": (URL + "srt", "meeting-2026-12-05-143015.srt"),
        "vtt": (URL + "vtt", "meeting-2026-12-05-143015.vtt"),
        "text": (URL + "text", "meeting-2026-12-05-143015.txt"),
    }
    for when in ("during", "after"):
        links = result[when]
        assert links["hidden"] is False
        assert {k: (links[k]["href"], links[k]["download"]) for k in expected} == expected
    assert "so far" in result["during"]["note"]
    assert result["after"]["note"] == "(final)"
    assert result["status"].startswith("done:")
    assert result["revision_hidden"] is True  # no revision promised: none is mentioned


def test_the_page_stores_its_live_session_and_clears_it_on_a_normal_end() -> None:
    """sessionStorage holds what a reloaded page needs to resume (and nothing after the end)."""
    result = run("export")
    stored = result["storedDuring"]
    assert stored is not None
    assert {k: stored[k] for k in ("session_id", "resume_token", "captions_token")} == {
        "session_id": "s-1", "resume_token": "tok", "captions_token": "c/t+k="}  # fmt: skip
    assert (stored["sample_rate"], stored["channels"], stored["resume_window_s"]) == (16000, 1, 60)
    assert stored["started_at"] == stored["alive_at"] == 1796481015000  # the harness's clock
    assert result["storage"] == {}  # transcript.final came: nothing to resume


def test_a_reloaded_page_resumes_its_stored_session_from_the_servers_offset() -> None:
    """A reload lost the meeting: the new page knew nothing of it. It now offers Resume
    meeting (a click: the microphone needs a gesture), resumes with the stored id and token,
    sends the new microphone audio on from the server's offset (and again from the next
    resume's offset after a drop), shows each final once and says what was not captured."""
    result = run("reload")
    offered = result["offered"]
    assert offered["resume_hidden"] is False
    assert "Resume meeting" in offered["status"] and "not captured" in offered["status"]
    assert offered["links"]["srt"]["href"] == URL + "srt"  # the finals so far, before a click
    assert offered["links"]["srt"]["download"] == "meeting-2026-12-05-142815.srt"
    first, second = result["first"], result["second"]
    for socket in (first, second):
        assert socket[0]["resume"] == {"session_id": "s-1", "resume_token": "tok"}
        assert (socket[0]["sample_rate"], socket[0]["channels"]) == (16000, 1)
    assert [m.get("frame") for m in first[1:]] == [0, 1, 2, 3]  # all new: from offset 32000
    # the second resume's offset (32000 + 3200) says frames 0-1 arrived: 2-3 again
    assert [m.get("frame") for m in second[1:]] == [2, 3]
    assert result["finals"] == 3  # seg-0000 and seg-0001 replayed twice, shown once
    assert "not captured" in result["statusResumed"]
    # said once: it stuck to every later status, a later resume's included (a trial)
    assert result["status"].startswith("resumed (session s-1")
    assert "not captured" not in result["status"]
    assert result["storedLive"]["session_id"] == "s-1"  # still stored while live


def test_a_stored_session_the_server_no_longer_has_is_cleared() -> None:
    """not_found (4404) on the resume: the storage is cleared, the page says the meeting had
    ended and, the server having its final transcript, offers the downloads."""
    result = run("gone")
    assert result["storage"] == {}
    assert "the meeting had ended" in result["status"]
    assert result["links"]["hidden"] is False and result["links"]["note"] == "(final)"
    assert URL + "text" in result["fetched"]
    assert result["resume_hidden"] is True and result["start_disabled"] is False


def test_a_stored_session_past_its_resume_window_is_not_offered() -> None:
    result = run("expired")
    assert result.get("resume_hidden") is not False  # never shown
    assert result["storage"] == {}
    assert "ended while this page was away" in result["status"]
    assert result["links"]["note"] == "(final)"


def test_downloads_stay_under_the_path_a_proxy_serves_the_page_at() -> None:
    """Behind a proxy serving livemeet at https://host/meet/, the links are the proxy's
    (they went to the host's root, outside it, as the live socket did: session 32)."""
    got = run("export", "https://proxy.example/meet/")["after"]
    for fmt in ("json", "srt", "vtt", "text"):
        assert got[fmt]["href"].startswith("https://proxy.example/meet/v1/sessions/s-1/transcript?")


def test_a_click_on_a_speaker_sends_its_rename_and_the_servers_answer_names_it() -> None:
    """A click on a caption line's speaker (or in the speakers list) asks for a name and sends
    `speaker.rename` (stripped; empty: null); the page shows a name only once the server's
    `speaker.renamed` says so, wherever the label shows, in the label's colour; null shows
    the label again; a name the server would refuse (closing the socket) is not sent."""
    result = run("names")
    assert result["initial"] == ["S01", "S02"]
    assert result["list"] == [["S01", False], ["S02", False]]
    assert result["prompt"][0].startswith("Name for S01")
    assert result["first"] == [
        {"type": "speaker.rename", "speaker": "S01", "name": "Alice"},
        {"type": "speaker.rename", "speaker": "S02", "name": "Bob"},
        {"type": "speaker.rename", "speaker": "S01", "name": None},
    ]  # the 65-character name and the cancelled prompt sent nothing
    assert result["beforeAnswer"] == ["S01", "S02"]  # the server is the source of truth
    assert result["named"] == ["Alice", "S02"]
    assert result["namedColours"] == result["colours"]  # the colour stays the label's
    assert result["namedList"] == [["Alice (S01)", False], ["S02", False]]
    assert result["both"] == ["Alice", "Bob"]
    assert result["cleared"] == ["S01", "Bob"]
    assert result["clearedList"] == [["S01", False], ["Bob (S02)", False]]
    assert "at most 64" in result["tooLongStatus"]


def test_names_are_disabled_offline_and_taken_from_the_resumes_ready_frame() -> None:
    """While the socket is down the speakers list is disabled and a click asks nothing; the
    resume's `session.ready` names (`speakers`) are what the page shows at once (a name the
    server no longer holds is dropped), also through a stall of more than 2 s before the
    replay's frames (the page ended the replay on a quiet spell and dropped every name it had
    not given yet: session 40's trial), and renames work again."""
    result = run("names")
    assert result["atReady"] == ["S01", "Robert"]
    assert result["afterStall"] == ["S01", "Robert"]
    assert result["offlineList"] == [["Ann (S01)", True], ["Bob (S02)", True]]
    assert result["offlineCaptionButtons"] == [True, True]  # they looked live (a trial)
    # the heading said "click one to name them" beside the disabled buttons (a trial)
    # no longer than the live one, which a longer one wrapped onto a second line at each drop
    # (a Chromium trial); the why in its tooltip
    assert result["offlineHint"] == [
        "Speakers (naming paused):",
        "naming comes back once the page reconnects",
    ]
    # the retry reached the server: its "next try in 0.3 s" stayed through a slow
    # session.ready (a Chromium trial)
    assert result["openedDetail"] == "(reached the server: waiting for it to answer…)"
    assert result["offlinePrompts"] == 0
    assert result["replayed"] == ["S01", "Robert"]
    assert result["replayedList"] == [["S01", False], ["Robert (S02)", False]]
    assert result["second"] == [{"type": "speaker.rename", "speaker": "S01", "name": "Carol"}]


def test_a_reloaded_page_shows_the_finals_so_far_before_the_resume() -> None:
    """Reloaded mid-meeting, the page offered Resume beside a "(the finals so far)" download
    and showed no captions (a trial): it shows the server's finals so far, named as the
    server names them, keeps them on show through the click on Resume (no blank page until
    the replay), and the replay adds only the final they lack, its speaker listed with
    theirs."""
    result = run("reloadfinals")
    offered = result["offered"]
    assert offered["speakers"] == ["S01", "Bob"] and offered["texts"] == ["seg-0000", "seg-0001"]
    assert offered["title"] == "S02: naming comes back once the meeting is resumed"
    # the speakers list shows them too, disabled until the resume (it stayed hidden beside
    # named captions: session 40's trial)
    assert offered["listShown"] is True
    assert offered["list"] == [["S01", True], ["Bob (S02)", True]]
    assert offered["listTitle"] == offered["title"]
    assert offered["hint"] == "Speakers (naming paused):"
    assert offered["hintTitle"] == "naming comes back once the meeting is resumed"
    # its captions overlay too (the session serves it while the server keeps it): it
    # appeared only at the resume's session.ready, pushing the captions down (a trial)
    assert offered["overlayShown"] is True
    assert "captions.html" in offered["overlayUrl"] and "s-1" in offered["overlayUrl"]
    # the click on Resume keeps the list and the downloads until session.ready (they went,
    # and the captions jumped up and back: a Chromium trial); naming waits for the server
    connecting = result["connecting"]
    assert connecting["listShown"] is True and connecting["exportShown"] is True
    assert connecting["overlayShown"] is True
    assert connecting["list"] == [["S01", True], ["Bob (S02)", True]]
    assert connecting["hint"] == "Speakers (naming paused):"
    assert result["hint"] == "Speakers (click one to name them):"
    assert result["onClick"] == 2
    # the names stay through the resume, as its ready frame says them: they were reset, and
    # the kept lines showed bare labels until the replay named them (a Chromium trial)
    assert result["afterReady"] == ["S01", "Bob"]
    assert result["afterReplay"] == ["S01", "Bob", "S03"]
    assert [label for label, _ in result["list"]] == ["S01", "Bob (S02)", "S03"]


def test_a_reloaded_page_shows_the_names_the_resume_replays() -> None:
    assert run("reload")["namesAfterReload"] == ["Alice", "Alice", "Alice"]


def test_the_page_sends_its_api_key_in_start_and_on_every_resume() -> None:
    """A page cannot set a WebSocket's headers: the key typed in its API key field goes in
    `start` (docs/protocol.md, "API keys"), on the resume after a drop too; the tab keeps it
    for a reload (the resume after one needs it as well)."""
    result = run("apikey")
    assert result["shown"] == "lm_kept"  # kept by this tab before the reload
    assert result["stored"] == "lm_typed"
    first, second = result["sockets"][0][0], result["sockets"][1][0]
    assert first["type"] == second["type"] == "start"
    assert first["api_key"] == second["api_key"] == "lm_typed"
    assert "resume" not in first and second["resume"]["session_id"] == "s-1"


def test_a_page_refused_for_its_key_says_to_enter_one() -> None:
    result = run("refused")
    assert "api_key" not in result["sockets"][0][0]  # none typed: none sent
    assert result["status"].startswith("error unauthorized: this server needs an API key")
    assert result["status"].endswith("enter the server's API key above, then Start")
    assert result["start_disabled"] is False and result["stored"] is None


def test_a_revision_replaces_the_finals_shown_and_keeps_the_speakers_names() -> None:
    """After a final that session.ready promised a revision for, the page says one is
    coming; a drop before it is resumed for it; `transcript.revised` then replaces the
    superseded finals (in time order, names kept on their labels, a new label shown as it
    is), says the transcript is revised, and the downloads say they hold the revision."""
    result = run("revised")
    assert result["before"][0] is True
    hidden, waiting = result["waiting"]
    assert hidden is False and waiting.startswith("revising")
    assert result["waitingStatus"].startswith("done:")
    assert result["resumed"] is True
    assert result["resumeStart"]["resume"] == {"session_id": "s-1", "resume_token": "tok"}
    assert result["replayed"] == [["Alice", "seg-0000"], ["S02", "seg-0001"]]
    assert result["captions"] == [["Alice", "good morning"], ["S02", "thanks"], ["S03", "hello"]]
    hidden, revised = result["revised"]
    assert hidden is False and revised.startswith("revised:") and "3 segments" in revised
    assert result["links"]["note"] == "(revised)"
    assert result["links"]["srt"]["href"] == URL + "srt"  # the resource serves the newest
    assert result["status"].startswith("done:")  # a 1000 close after it adds nothing
    assert ["S03", True] in result["list"]


def test_a_failed_revision_says_the_final_stands() -> None:
    """The line said "not revised (the revision failed (internal_error): decode failed:
    RuntimeError(…); transcript.final stands): the final transcript below stands" (a trial):
    technical, and the final's standing twice. It now says it plainly; the server's reason is
    the line's tooltip."""
    result = run("unrevised")
    hidden, text = result["revision"]
    assert hidden is False
    assert text == (
        "not revised: the pass over the whole meeting did not succeed; the final transcript "
        "below stands"
    )
    assert result["detail"].startswith("the revision failed (internal_error)")
    assert result["captions"] == [["S01", "seg-0000"]]
    assert result["links"]["note"] == "(final)"
    assert result["status"].startswith("done:")  # not an error of the session


def test_a_session_gone_from_the_page_offers_its_revised_transcript_as_such() -> None:
    assert run("expired", transcript_status="revised")["links"]["note"] == "(revised)"


def test_two_speakers_are_merged_through_the_page_and_shown_as_one() -> None:
    """ "Merge two…" asks for the labels (e.g. "S03 S01"), refuses what the server would
    (closing the socket) without sending it, and sends `speaker.merge`; once the server's
    `speaker.merged` says so, the merged label shows as its target everywhere, in its
    target's colour, and the speakers list shows the two as one; a click on the merged label
    names its target (the server refuses a rename of it)."""
    result = run("merges")
    assert result["initial"] == ["S01", "S02", "S03"]
    assert result["buttonDisabled"] is False
    for refused, why in [("itself", "into itself"), ("unseen", "shown"), ("garbled", "two")]:
        assert result[refused]["sent"] == [] and why in result[refused]["status"], refused
    assert result["cancelled"]["sent"] == []
    assert result["merge"]["sent"] == [{"type": "speaker.merge", "speaker": "S03", "into": "S01"}]
    assert result["mergePrompt"].startswith("Merge two speakers")
    assert result["beforeAnswer"] == ["S01", "S02", "S03"]  # the server is the source of truth
    assert result["merged"] == ["S01", "S02", "S01"]
    assert result["mergedColours"] == [result["colours"][i] for i in (0, 1, 0)]
    assert result["mergedList"] == [["S01 + S03", False], ["S02", False]]
    for refused in ("cycle", "again"):  # S01 into S03 (a cycle), S03 merged already
        assert result[refused]["sent"] == [] and "shows as S01" in result[refused]["status"]
    assert result["renames"] == [{"type": "speaker.rename", "speaker": "S01", "name": "Alice"}]
    assert result["named"] == ["Alice", "S02", "Alice"]
    assert result["namedList"] == [["Alice (S01 + S03)", False], ["S02", False]]


def test_merges_are_disabled_offline_replayed_on_the_resume_and_taken_from_the_final() -> None:
    """Offline the merge button is disabled; a resume's replay of `speaker.merged` is what
    the page shows after; a merge into a merged label is sent as asked (the server resolves
    it) and followed through; the final's `merged` adds any the page missed."""
    result = run("merges")
    assert result["offlineDisabled"] is True
    # kept through the replay (dropped at the resume, a merged S03 came back as its own
    # button until the replay: every resume flickered, a trial)
    assert result["beforeReplay"] == ["Alice", "S02", "Alice"]
    assert result["beforeReplayList"] == [["Alice (S01 + S03)", False], ["S02", False]]
    assert result["replayed"] == ["Alice", "S02", "Alice"]
    assert result["chain"]["sent"] == [{"type": "speaker.merge", "speaker": "S02", "into": "S03"}]
    assert result["chained"] == ["Alice", "Alice", "Alice"]
    assert result["chainedList"] == [["Alice (S01 + S02 + S03)", False]]
    assert result["final"] == ["Alice"] * 4


def test_the_page_refuses_the_names_the_server_refuses_and_sends_what_it_keeps() -> None:
    """A name with bidi isolate marks (pasted from a chat) or with nothing visible (a zero-width
    space) passed the page's check, and the server's refusal closed the socket and ended the
    recording (a trial). The page applies the server's rules (live_protocol.py): it says why
    and sends nothing; it strips a name as the server does, so what it sends is kept as is."""
    result = run("badnames")
    assert result["sentForBad"] == []
    bidi, override, embedding, zwsp, marks, spaces = result["refused"]
    for status in (bidi, override, embedding):
        assert "S01 not renamed" in status and "bidirectional" in status
    for status in (zwsp, marks, spaces):
        assert "S01 not renamed" in status and "visible character" in status
    assert result["sentForGood"] == ["Zed", "\u200bAl", "\U0001f600", "Ann", "O'Neil-Ng"]
    # the last refusal's reason stays until a rename goes through, then the status is back
    # (it stayed for the rest of the meeting: a trial)
    assert "not renamed" in result["statusBeforeAnswer"]
    assert result["statusAfterAnswer"].startswith("recording (session s-1")
    # with no rename after it, the reason hid the recording status for the rest of the
    # meeting (a trial): it shows 8 s, then the recording status is back; a merge's too
    shown, at7s, merge, at8s = result["noted"]
    assert shown.startswith("S01 not renamed") and at7s == shown
    assert merge.startswith("S09 not merged") and at8s.startswith("recording (session s-1")


def test_the_status_names_a_long_session_id_by_its_first_characters() -> None:
    """A server's session id is 32 hex digits: in the status it took the line to 3-5 lines on
    a 375-px phone, and each change of line count moved the captions under it (a trial). The
    statuses show its first 8 characters (as the recent meetings' list does), the whole id in
    the status line's tooltip; a resume still sends the whole id."""
    result = run("longid")
    whole = "0123456789abcdef0123456789abcdef"
    assert result["recording"].startswith("recording (session 01234567, model m)")
    assert result["resumed"].startswith("resumed (session 01234567, model m)")
    for status in (result["recording"], result["resumed"]):
        assert whole not in status
    assert result["title"] == f"session {whole}"
    assert result["resumedWith"][0]["resume"]["session_id"] == whole


def test_a_refused_message_is_resumed_as_the_server_keeps_the_meeting() -> None:
    """The server closes a client's violation (4400, 4402, 4415) with the session kept for a
    resume (docs/protocol.md, "Closing"); the page took the close as final and forgot the
    session, ending the recording. It now says so and resumes (audio from the offset), at
    most 3 times a meeting (the 4th such close ends the meeting: below)."""
    result = run("violation")
    assert len(result["resumes"]) == 3
    for sent in result["resumes"]:
        assert sent[0]["resume"] == {"session_id": "s-1", "resume_token": "tok"}
        assert [m.get("frame") for m in sent[1:]] == [1]  # the unacknowledged frame again
    first = result["statuses"][0]
    assert "refused" in first and "invalid_request: refused #0" in first
    assert "kept the meeting" in first and "reconnecting" in first
    # and once resumed, still (the resume's status came 0.3 s later: a trial)
    resumed = result["resumedStatuses"][0]
    assert resumed.startswith("resumed (session s-1")
    assert "refused a message of this page (invalid_request: refused #0)" in resumed


@pytest.mark.parametrize("last", ["final", "empty"])
def test_the_fourth_refused_message_ends_the_meeting_with_its_final(last: str) -> None:
    """After the 4th refused message the page gave up, and the meeting's transcript completed
    only once the server's resume window (60 s) ran out (a trial). The page now stops the
    recording and resumes once more only to send `end` (no audio: what was refused may be in
    it; a moment of silence where the session holds none, as `end` needs some), shows the
    final and says why the meeting ended and what was not sent."""
    result = run("violation", last=last)
    assert len(result["resumes"]) == 3
    giving_up = result["statuses"][3]
    assert "refused a message of this page 4 times" in giving_up
    assert "(the last: invalid_request: refused #3)" in giving_up
    assert "recording stopped; ending the meeting: reconnecting" in giving_up
    assert result["windUp"] == {"stopDisabled": True, "micReleased": True,
                                "asksBeforeClosing": False}  # fmt: skip
    assert result["lastResume"] is True
    start, *sent = result["lastSent"]
    assert start["resume"] == {"session_id": "s-1", "resume_token": "tok"}
    if last == "final":
        assert sent == [{"type": "end"}]
    else:
        assert sent == [{"frame": 0, "frames": 320}, {"type": "end"}]
    assert result["endingStatus"].startswith("ending the meeting (the server refused")
    unsent = "0.1" if last == "final" else "0.2"  # frame 1, or frames 0 and 1
    assert result["status"] == (
        "done: 3.0 s of audio transcribed; the page ended the meeting after the server "
        "refused a message of it 4 times (the last: invalid_request: refused #3): its last "
        f"{unsent} s of audio were not sent"
    )
    assert result["start_disabled"] is False
    assert len(result["sockets"]) == 5


def test_a_meeting_the_page_cannot_end_after_refusals_says_so() -> None:
    """The last resume refused as well: the page does not try again, and says the server ends
    the meeting within its window and keeps the transcript."""
    result = run("violation", last="refused")
    assert "could not end the meeting" in result["status"]
    assert "the server ends it within 60 s and keeps its transcript" in result["status"]
    assert "closed 4402" in result["status"] and result["start_disabled"] is False
    assert len(result["sockets"]) == 5


def test_a_socket_the_server_stopped_answering_is_dropped_and_the_session_resumed() -> None:
    """A dead network path (packets dropped, no close): the page said "recording" while its
    resend buffer filled, then dropped audio, and Stop showed "finishing…" forever (a trial).
    Audio sent and no answer for 15 s (ACK_TIMEOUT_MS; acks come every 0.25 s) now drops the
    socket and resumes as a drop does; a retry whose handshake does not complete is dropped
    too; after Stop, 30 s without the final (FINAL_QUIET_MS) reconnects for it."""
    result = run("deadpath")
    assert result["socketsAt14s"] == 1 and result["statusAt14s"].startswith("recording")
    assert result["closedByPage"] is True
    assert "no answer from the server for 16 s" in result["statusDead"]
    assert "reconnecting" in result["statusDead"]
    assert result["socketsAfterDead"] == 2
    assert result["connectClosed"] is True and result["socketCount"] == 3
    assert result["resumeStart"]["resume"] == {"session_id": "s-1", "resume_token": "tok"}
    assert result["resent"] == [1, 2, 3]  # everything after the last ack
    assert result["endSent"] == {"type": "end"}
    assert result["socketsAt29s"] == 3
    assert result["finishingSockets"] == 4
    assert result["lastSent"][-1] == {"type": "end"}  # again: the server ignores a second
    assert "finishing" in result["statusFinishing"]
    assert result["status"].startswith("done:")


@pytest.mark.parametrize("kept", ["running", "final"])
def test_after_stop_a_silent_socket_is_judged_by_the_transcript_resource(kept: str) -> None:
    """After `end` the server may be silent while it decodes (75 s in a trial), and a dead
    path after the last ack left the page "finishing…" for 11 minutes (the ack had disarmed
    the watchdog). Every 30 s of silence the page asks the transcript resource: running,
    it waits on the same socket; stored final, it drops the socket and resumes for it."""
    result = run("slowfinal", transcript_status=kept)
    assert result["askedAt29s"] == 0 and result["askedAt31s"] == 1
    if kept == "running":
        assert result["askedAt62s"] == 2 and result["socketsAt62s"] == 1
        assert result["closedByPage"] is False
    else:
        assert result["socketsAt31s"] == 2 and result["closedByPage"] is True
    assert result["status"].startswith("done:")


def test_a_final_that_never_comes_is_given_up_after_eleven_minutes() -> None:
    result = run("nofinal")
    assert "no final transcript 11 minutes after Stop" in result["status"]
    assert result["start_disabled"] is False
    assert result["closedByPage"] is True and result["count"] == 1


def test_stop_right_after_start_sends_the_audio_it_has_before_end() -> None:
    """Stop before the first 100-ms frame sent `end` before any audio: protocol_error (4402),
    and the session, left without `end`, held a server slot for its resume window (a trial).
    Stop now asks the worklet for the samples it holds and sends them before `end`."""
    result = run("quickstop", flush="400")
    assert result["posted"] == ["flush"]
    assert result["sent"][1:] == [{"frame": 0, "frames": 400}, {"type": "end"}]
    assert result["status"].startswith("done:")


@pytest.mark.parametrize("flush", ["0", "none"])
def test_stop_before_any_audio_ends_the_session_with_a_moment_of_silence(flush: str) -> None:
    """No audio at all (the worklet holds none, or does not answer): 20 ms of silence, then
    `end`, which the server takes, ending the session (and freeing its slot) at once."""
    result = run("quickstop", flush=flush)
    assert result["sent"][1:] == [{"frame": 0, "frames": 320}, {"type": "end"}]
    assert result["status"] == "stopped before the microphone gave any audio: nothing recorded"


@pytest.mark.parametrize(
    ("context_rate", "declared"),
    [("8000", 8000), ("11025", 11025), ("16000", 16000), ("44100", 16000), ("48000", 16000),
     ("96000", 16000), ("3000", 8000)],
)  # fmt: skip
def test_the_page_declares_the_rate_its_worklet_sends_at(context_rate: str, declared: int) -> None:
    """An AudioContext at 8 kHz (a Bluetooth headset) sent 8-kHz audio declared as 16 kHz:
    sped up twice (a trial). A context under 16 kHz now sends and declares its own rate (the
    server resamples it), a faster one 16 kHz as before, never under the server's 8 kHz."""
    result = run("ctxrate", context_rate=context_rate)
    assert result["start"]["sample_rate"] == declared
    assert result["options"] == {"processorOptions": {"outputRate": declared}}
    assert result["storedRate"] == declared  # a reload resumes at it


def test_a_session_stored_at_8_khz_is_resumed_at_8_khz_on_a_faster_context() -> None:
    result = run("reload8k")
    assert result["offered"] is True
    assert result["start"]["sample_rate"] == 8000 and "resume" in result["start"]
    assert result["options"] == {"processorOptions": {"outputRate": 8000}}


def test_a_microphone_that_goes_away_stops_the_audio_and_the_page_asks() -> None:
    """The microphone's track ending (a headset unplugged) went unnoticed: the page sent
    silence and said "recording" (a trial). It now stops the audio, keeps the session, says
    what happened and offers Resume meeting (a microphone again, into the same session) or
    Stop (the meeting finishes as ever)."""
    result = run("micgone")
    assert "microphone stopped" in result["status"] and "Resume meeting" in result["status"]
    assert result["resumeHidden"] is False and result["stopDisabled"] is False
    assert result["released"] is True
    assert result["sentWhileGone"] == [0, 1]
    assert result["microphones"] == 2
    assert "recording again" in result["statusBack"] and result["resumeHiddenBack"] is True
    assert result["sentBack"] == [0, 1, 2]  # the same session, the same socket
    assert result["lastSent"] == {"type": "end"}
    assert result["resumeHiddenStopped"] is True
    assert len(result["sockets"]) == 1


def test_a_new_tab_lists_the_meetings_this_browser_recorded_with_their_transcripts() -> None:
    """A tab closed mid-meeting took its sessionStorage along: a new tab knew nothing of the
    meeting, whose transcript the server kept (a trial). The page now keeps the last 5
    meetings (session id, captions token, start) in localStorage and lists those the server
    still has with their downloads; one it no longer has leaves the list; "Forget them"
    clears it."""
    result = run("recent")
    assert result["hidden"] is False
    listed = result["listed"]
    # r-1, down, a: at most 5 read (b and c are the 6th and 7th), gone (404), e-1 (no audio
    # but Stop's silence) and the one without a token left out; each with its start in local
    # time (its format the locale's)
    assert [len(links) for _, links in listed] == [4] * 3
    assert listed[0][0].endswith(" (still running):") and "2026" in listed[0][0]
    assert listed[1][0].endswith(" (the server did not answer):")
    assert "(" not in listed[2][0]
    assert listed[2][1][1] == [
        "SRT", "https://meet.example:8000/v1/sessions/a/transcript?token=t-a&response_format=srt"
    ]  # fmt: skip
    assert result["stored"] == ["r-1", "down", "a"]
    assert result["storedLive"] == ["s-1", "r-1", "down", "a"]
    assert result["storedLater"] == ["s-4", "s-3", "s-1", "r-1", "down"]  # 5 at most
    # no resume token: it stays with the tab
    assert result["storedEntry"] == {
        "session_id": "s-4",
        "captions_token": "c/t+k=",
        "started_at": 1796481015000,
    }
    assert result["forgotten"] == {"stored": None, "hidden": True}


def test_the_recent_meetings_hold_audio_and_tell_apart_two_of_the_same_minute() -> None:
    """The list showed a meeting's start to the minute only, so two that started in the same
    minute read the same, and it listed meetings that never had any audio (Start, then the tab
    closed, or Stop): nothing to download (a trial). A meeting now joins the list once the
    server acknowledged some of its audio (not Stop's moment of silence), one an older page
    kept that holds none leaves it, and each shows its start to the second, its length as
    the server has it, and its session id's first characters."""
    result = run("recent")
    assert result["storedReady"] == ["r-1", "down", "a"]  # s-1 has no audio yet
    assert result["storedEmpty"] == ["s-1", "r-1", "down", "a"]  # s-2 stopped before any
    running, down, final = (text for text, _ in result["listed"])
    # 14:30:15 UTC: r-1 an hour ago, down 4 h and 10 s ago, a 4 h ago (TZ=UTC)
    assert "1:30:15" in running and "5.3 s of audio" in running and "session r-1" in running
    assert "10:30:05" in down and "of audio" not in down and "session down" in down
    assert "10:30:15" in final and "12:34 of audio" in final and "session a:" in final
    # the checks ask for the length (diarized_json's duration): e-1's is 0.02, Stop's silence alone
    asked = [url for url in result["fetched"] if "/transcript" in url]
    assert all(url.endswith("response_format=diarized_json") for url in asked)
    assert any("/sessions/e-1/" in url for url in asked)


def test_closing_the_tab_mid_meeting_asks_first() -> None:
    """No "leave site?" prompt came while recording (a trial): beforeunload now asks while
    a meeting records, not before one nor after Stop (the final is on its way and kept)."""
    result = run("recent")
    assert (result["idle"], result["recording"], result["stopping"]) == (False, True, False)


@pytest.mark.parametrize("scenario", ["stale", "lateclick"])
def test_an_offer_to_resume_is_taken_back_once_its_window_has_passed(scenario: str) -> None:
    """After a reload, "press Resume meeting" stayed on past the session's window (a trial):
    the server had ended the meeting. The offer is now taken back when the window ends (and a
    click after it rechecks): the page says the meeting ended and offers its transcript."""
    result = run(scenario)
    assert result["offered"] is True
    assert result["resume_hidden"] is True
    # the page showed the offer all along: not "while this page was away" (a trial)
    assert "was not resumed within its window: the server has ended it" in result["status"]
    assert result["status"].endswith("download its transcript below")
    assert result["links"]["hidden"] is False and result["links"]["note"] == "(final)"
    assert result["storage"] == {}
    assert result.get("sockets_opened", 0) == 0


def test_a_transcript_offered_for_a_meeting_gone_from_the_page_says_where_it_is() -> None:
    """ "its transcript is below" pointed at nothing but the download links: it says so. A
    page back after the window shows the meeting's captions as the server stored them (it
    showed none, while a page that had watched the offer run out kept its own: a trial)."""
    result = run("expired")
    assert result["status"].endswith(
        "ended while this page was away: download its transcript below"
    )
    assert result["lines"] == ["S01", "Bob"]


def test_new_captions_are_followed_at_the_bottom_and_not_while_reading_back() -> None:
    """The newest captions went out of view below the page's end (a trial): at the bottom
    the page now follows them (finals and partials); scrolled up, it stays where the user
    reads, and follows again once they are back at the bottom."""
    result = run("scroll")
    assert result["followed"] == [200, 700]  # 10 lines past the fold: shown to the last
    assert result["partial"] == [230, 730]
    assert result["readingBack"] == 50
    top, bottom = result["backAtBottom"]
    assert top == bottom


def test_a_disabled_speaker_button_does_not_offer_a_click() -> None:
    """Speaker buttons disabled by a drop or the final still said "click to name this
    speaker" (session 38's third trial). Offline they say naming comes back once the page
    reconnects, after the final only the label; resumed, the click is offered again."""
    result = run("a11y")
    waiting = "naming comes back once the page reconnects"
    assert result["offline"] == {
        "listed": [[f"S01: {waiting}", True], [f"S02: {waiting}", True]],
        "captions": [[f"S01: {waiting}", True], [f"S02: {waiting}", True]],
    }
    for title, disabled in result["online"]["listed"] + result["online"]["captions"]:
        assert disabled is False and "click to" in title
    assert result["finished"] == {
        "listed": [["S01", True], ["S02", True]],
        "captions": [["S01", True], ["S02", True]],
    }


def test_a_caption_lines_speaker_is_a_button_named_as_the_speaker() -> None:
    """A caption line's speaker took a mouse click only (a span): no keyboard. It is a button
    (Tab, then Enter or Space). Its aria-label "S01: name this speaker" was what a screen
    reader read of every new caption line (a trial): its name is now what it shows, the
    speaker, and what a click does is its description (title), as in the speakers list."""
    result = run("a11y")
    assert result["speakers"] == [
        {"tag": "BUTTON", "type": "button", "label": None, "text": "Alice",
         "title": "S01: click to rename this speaker"},
        {"tag": "BUTTON", "type": "button", "label": None, "text": "S02",
         "title": "S02: click to name this speaker"},
    ]  # fmt: skip
    assert result["listed"] == [["Alice (S01)", "S01: click to rename this speaker"],
                                ["S02", "S02: click to name this speaker"]]  # fmt: skip


@pytest.mark.parametrize(
    ("clipboard", "exec_copy", "copied", "note"),
    [("ok", "no", ["https://meet.example:8000/captions.html?session=s-1&token=c%2Ft%2Bk%3D"],
      "copied"),
     ("none", "ok", ["overlay-url"], "copied"),
     ("refused", "ok", ["overlay-url"], "copied"),
     ("none", "no", [], "not copied"),
     ("refused", "no", [], "not copied")],
)  # fmt: skip
def test_copy_says_whether_the_overlay_url_was_copied(
    clipboard: str, exec_copy: str, copied: list[str], note: str
) -> None:
    """Copy did nothing visible, and nothing at all on a plain http page (no clipboard API):
    it now says "copied", or, the clipboard API missing or refused, selects the link and
    copies it the old way (execCommand) or says to copy it by hand."""
    result = run("a11y", clipboard=clipboard, exec_copy=exec_copy)
    assert result["copied"] == copied
    assert result["note"].startswith(note)
    if clipboard != "ok":
        assert result["selected"] == ["overlay-url"]  # left selected for a copy by hand


def test_caption_times_are_minutes_and_seconds() -> None:
    """ "3725.9–3726.9" on a caption line is now "1:02:05–1:02:06": m:ss, h:mm:ss past an hour."""
    assert run("times")["times"] == [
        "0:00–0:01", "1:15–1:16", "9:59–10:00", "1:02:05–1:02:06"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("finish", "duration", "status"),
    [("stop", "7.64", "done: 7.6 s of audio transcribed"),
     ("stop", "725", "done: 12:05 of audio transcribed"),
     ("length", "3", "done: 3.0 s of audio transcribed (the model reached its output limit: "
                     "the end of the meeting may be missing)"),
     ("repetition", "3", "done: 3.0 s of audio transcribed (the model repeated itself and was "
                         "cut off there: some of it may be missing)"),
     ("abort", "3", "done: 3.0 s of audio transcribed (the transcription was cut short)")],
)  # fmt: skip
def test_the_final_status_says_what_its_finish_reason_means(
    finish: str, duration: str, status: str
) -> None:
    """ "done: 7.6 s, stop" showed the protocol's finish_reason: the status now says what it
    means, and nothing for a normal end."""
    assert run("times", finish=finish, duration=duration)["status"] == status


def test_names_merges_the_final_and_a_revision_change_the_captions_in_place() -> None:
    """A rename, a merge, transcript.final and transcript.revised rebuilt the whole list of
    finals (a live region): a screen reader could read every final again, and the focus left
    the speaker a keyboard user had just named (a trial). Each now changes only the lines and
    buttons it concerns: the focus stays, the renamed speaker's labels are the only text
    written, and the lines put in are only the new ones. A merge that leaves one speaker
    disables "Merge two…" under the focus: that speaker's button takes it (Chromium: the
    body did)."""
    result = run("inplace")
    renamed = result["renamed"]
    assert renamed["focusKept"] is True and renamed["sameLines"] is True
    assert renamed["live"] == {"added": 0, "texts": ["Alice", "Alice"]}  # S01's two lines
    assert renamed["shown"] == ["Alice", "S02", "Alice"] and renamed["partial"] == "Alice"
    listed = result["listRenamed"]
    assert listed["focusKept"] is True and listed["sameButton"] is True
    assert listed["list"] == [["Alice (S01)", False], ["Bob (S02)", False]]
    assert listed["live"] == {"added": 0, "texts": ["Bob"]}
    merged = result["merged"]
    assert merged["focus"] is True and merged["mergeDisabled"] is True
    assert merged["sameLines"] is True
    assert merged["live"] == {"added": 0, "texts": ["Alice"]}  # S02's line
    assert merged["list"] == [["Alice (S01 + S02)", False]]
    final = result["final"]
    assert final["sameLines"] is True
    assert final["live"] == {"added": 1, "texts": []}  # the partial's line, now a final
    assert final["captions"][-1] == ["Alice", "and"] and final["partialLines"] == 0
    assert final["disabled"] is True  # renames end with the final
    revised = result["revised"]
    assert revised["kept"] == [True, True]
    assert revised["live"] == {"added": 1, "texts": []}
    assert revised["captions"] == [["Alice", "seg-0000"], ["Alice", "hello and"],
                                   ["Alice", "seg-0002"]]  # fmt: skip


def test_what_the_browser_scrolls_into_view_lands_below_the_sticky_controls() -> None:
    """With the controls stuck to the window's top, Shift+Tab back through the captions put
    the focused speaker under them (Chromium at 375 px, a trial): the page keeps the bar's
    height, as it changes, as --controls-height, the scroll-margin-top of what is under the
    bar (index.html). The document's scroll-padding-top it set before scrolled the page up
    when the focus went into the bar itself (Shift+Tab onto Stop, a trial): it stays unset."""
    result = run("controls")
    assert result["heights"] == ["58px", "162px"]
    assert result["padding"] == [None, None]


@pytest.mark.parametrize("kept", ["revised", "final"])
def test_a_silent_socket_while_the_revision_is_due_is_judged_and_the_wait_bounded(
    kept: str,
) -> None:
    """After a final that promised a revision, a dead network path (no close, no message)
    left the page "revising…" for ever (a trial): the watchdog stopped at the final. Every
    30 s of silence the page now asks the transcript resource, as after `end`: a stored
    revision means the socket is dead (it drops it and resumes; the resume replays the
    final and the revision); the final alone means still revising, and the page waits on, for
    at most 11 minutes after the final (the server's bound is 10), then says the final stands
    and lets go of the socket."""
    result = run("deadrevision", transcript_status=kept)
    assert result["askedAt29s"] == 0 and result["askedAt31s"] == 1
    if kept == "revised":
        assert result["socketsAt31s"] == 2 and result["closedByPage"] is True
        assert result["resumeStart"]["resume"] == {"session_id": "s-1", "resume_token": "tok"}
        assert result["captions"] == [["S01", "good morning"]]
        assert result["revision"][1].startswith("revised:")
    else:
        assert result["socketsAt31s"] == 1 and result["closedByPage"] is False
        assert result["askedAt62s"] == 2 and result["socketsAt62s"] == 1
        assert result["revisionWaiting"][1].startswith("revising")
        assert result["socketsAtEnd"] == 1 and result["closedByPageAtEnd"] is True
        assert result["revision"][1].startswith("no revision 11 minutes after the final")
        assert "the final transcript below stands" in result["revision"][1]
        assert result["captions"] == [["S01", "seg-0000"]]
        assert result["start_disabled"] is False
    assert result["status"].startswith("done:")


@pytest.mark.parametrize(("revision", "resumes"), [("pending", False), ("failed", True),
                                                   ("none", True)])  # fmt: skip
def test_a_quiet_socket_after_the_final_is_dropped_once_no_revision_is_coming(
    revision: str, resumes: bool
) -> None:
    """The resource said "final" both while the revision ran and once it had failed unheard:
    the page waited out its 11-minute bound on "revising…". X-Livemeet-Revision tells them
    apart: "pending" keeps the socket (it may be alive); "failed" or "none" means the
    revision's end was said on a dead socket, so the page drops it at once and resumes."""
    result = run("deadrevision", transcript_status="final", revision=revision)
    assert result["askedAt31s"] == 1
    assert result["socketsAt31s"] == (2 if resumes else 1)
    assert result["closedByPage"] is resumes


def test_a_refused_message_after_the_final_is_not_a_meeting_left_open() -> None:
    """After the final (a revision due) the meeting is over: a 4th refusal then is a plain
    close, not "the page could not end the meeting", and no last resume is made for it."""
    result = run("violation", last="afterfinal")
    assert result["lastResume"] is False and len(result["sockets"]) == 4
    assert "could not end the meeting" not in result["status"]
    assert result["status"].endswith("(closed 4400)")


@pytest.mark.parametrize(("scenario", "kept"), [("silentrev", "revised"), ("silentfinal", "final")])
def test_a_resume_refused_for_a_finished_meeting_shows_the_stored_transcript(
    scenario: str, kept: str
) -> None:
    """The socket's path died after the final (silentrev: its revision lost) or after `end`
    (silentfinal: the final lost); the page asked the transcript resource, resumed, and the
    resume got not_found (4404): the server had finished the meeting and let it go. The page
    said "the meeting had ended", kept the captions it had (unrevised, or without the final)
    and "revising…" for ever (a trial). It now shows the transcript the server stored, with
    its names and merges, says the meeting is done, and says whether it was revised."""
    result = run(scenario, transcript_status=kept)
    assert result["socketCount"] == 2  # the resume after the resource was asked
    assert result["captions"] == (
        [["Alice", "good morning"], ["Bob", "hello"], ["Bob", "bye"]]
        if kept == "revised"
        else [["Alice", "seg-0000"], ["Bob", "seg-0001"], ["Alice", "seg-0002"], ["Bob", "bye"]]
    )
    assert result["status"].startswith("done: 4.3 s of audio transcribed")
    assert "transcript it stored" in result["status"]
    assert result["links"]["note"] == f"({kept})"
    assert result["list"] == [["Alice (S01 + S03)", True], ["Bob (S02)", True]]
    assert URL + "diarized_json" in result["fetched"]
    hidden, line = result["revision"]
    if kept == "revised":
        assert result["revisionBefore"][1].startswith("revising")
        assert hidden is False and line.startswith("revised:") and "3 segments" in line
    else:
        assert hidden is not False  # no revision was promised: none is mentioned
    assert result["start_disabled"] is False


@pytest.mark.parametrize(("scenario", "kept"), [("silentrev", "revised"), ("silentfinal", "final")])
def test_while_a_gone_meetings_transcript_is_fetched_the_page_offers_no_new_one(
    scenario: str, kept: str
) -> None:
    """After a refused resume (4404) the page asks for the stored transcript saying
    "finishing… (the server has let the session go …)", and Start was enabled meanwhile
    (session 39's trial): it stays disabled until the transcript is shown. A page that had
    the final keeps its "done: …" throughout (it said "finishing…" again) and says the
    connection was lost after the final."""
    result = run(scenario, transcript_status=kept)
    assert result["startAtFetch"] == [True]
    assert result["start_disabled"] is False  # once the stored transcript is shown
    statuses = result["statuses"]
    if scenario == "silentrev":  # the final came before the path died
        done = next(i for i, s in enumerate(statuses) if s.startswith("done:"))
        assert all(s.startswith("done:") for s in statuses[done:]), statuses[done:]
        # neutral on the revision: it may have failed as well as been lost (a trial)
        assert (
            "the connection was lost after the final: below is the transcript it"
            in (result["status"])
        )
    else:
        assert any(s.startswith("finishing… (the server has let the session go") for s in statuses)
        assert "the connection lost the server's last messages" in result["status"]


def test_a_stored_transcript_cut_short_says_so_as_its_final_would() -> None:
    """A transcript recovered from the resource after a 4404 says why its decode stopped
    (X-Livemeet-Finish-Reason), as the final's status does: no rendered format carries it,
    and the recovered transcript said nothing of a model that reached its output limit."""
    result = run("silentfinal", transcript_status="final", finish="length")
    assert result["status"].startswith("done: 4.3 s of audio transcribed")
    assert "the model reached its output limit" in result["status"]
    assert "output limit" not in run("silentfinal", transcript_status="final")["status"]


@pytest.mark.parametrize("scenario", ["reload", "expired", "reloadending"])
def test_earlier_meetings_leave_out_the_meeting_stored_before_the_reload(scenario: str) -> None:
    """The list of earlier meetings said "(revised)" of the meeting the status line was still
    asking the transcript of (a trial): a reloaded page's own meeting (offered for a resume,
    ended while the page was away, or finishing) is the status line's and the downloads
    above, not an earlier one; the others are listed as before."""
    result = run(scenario)
    assert result["recentListed"] == ["session r-1"]


def test_a_stored_meeting_holds_the_status_from_the_pages_first_frame() -> None:
    """A page reloaded while finishing showed "idle" with Start enabled for the time readyz
    took to answer (0.1-0.4 s), then "finishing…" (session 38's third trial): the page asked
    readyz before it looked at the stored meeting. It looks first now, and readyz's answer
    (the demo banner) no longer replaces what the stored meeting's steps say; a page with
    nothing stored still reports the server."""
    ending = run("reloadending")
    assert ending["atLoad"]["status"].startswith("finishing…")
    assert ending["atLoad"]["startDisabled"] is True
    assert ending["statusFinishing"].startswith("finishing…")  # after readyz answered
    offered = run("reload")["atLoad"]
    assert (
        offered["resumeHidden"] is False and "still open: press Resume meeting" in offered["status"]
    )
    expired = run("expired")
    assert expired["atLoad"]["status"].startswith("the meeting started at")
    assert "ready (model" not in expired["status"]
    # nothing stored: Start (index.html ships it disabled) enabled at once, beside "idle"
    # (it sat beside index.html's "loading…" until readyz answered: a Chromium trial)
    fresh = run("export")["atLoad"]
    assert fresh["startDisabled"] is False and fresh["status"] == "idle"


@pytest.mark.parametrize("last", ["final", "gone"])
def test_a_page_reloaded_while_finishing_fetches_the_final_without_a_microphone(last: str) -> None:
    """Reloaded after Stop, before the final: the page offered "Resume meeting" as if still
    recording; its click opened the microphone, the resume got 4404 and showed 0 lines (a
    trial). The stored session now says it was stopped: the reloaded page offers nothing,
    asks for no microphone, resumes at once sending only `end` (no audio), and shows the
    final the server sends; or, the server having finished and let the session go (4404),
    the transcript it stored, whose promised revision did not come."""
    stopped = run("slowfinal")["storedStopped"]  # Stop stores that it was pressed
    assert stopped["session_id"] == "s-1" and stopped["ending"] is True
    result = run("reloadending", last=last)
    assert result["resumeOffered"] is False
    assert result["statusFinishing"].startswith("finishing…")
    assert "stopped before this page was reloaded" in result["statusFinishing"]
    assert result["socketCount"] == 1
    start, *sent = result["sent"]
    assert start["resume"] == {"session_id": "s-1", "resume_token": "tok"}
    assert result["microphones"] == 0
    assert result["captions"] == [["S01", "seg-0000"], ["Bob", "seg-0001"]]
    assert result["status"].startswith("done: 2.5 s" if last == "gone" else "done: 3.0 s")
    assert result["storage"] == {}  # the meeting is over
    assert result["stopDisabled"] is True
    hidden, line = result["revision"]
    if last == "final":
        assert sent == [{"type": "end"}]  # the server holds audio: no silence first
        assert result["statusResumed"].startswith("finishing…")
        assert hidden is False and line.startswith("revising")
    else:
        assert sent == []
        assert hidden is False and line.startswith("not revised")
        assert "the final transcript below stands" in line
        assert result["links"]["note"] == "(final)"


def test_a_refused_resume_is_not_read_out_as_an_error_before_its_transcript() -> None:
    """A resume refused with not_found (the server had finished the meeting) first put
    "error not_found: no live session …" in the status, a live region, for a moment before
    the 4404 close's "finishing… (the server has let the session go …" (session 39's trial):
    the close says what happened, the error frame alone writes nothing."""
    statuses = run("reloadending", last="gone")["statuses"]
    assert not [s for s in statuses if "not_found" in s or s.startswith("error")], statuses
    assert any("the server has let the session go" in s for s in statuses)


def test_a_drop_after_the_final_keeps_its_done_status() -> None:
    """After the final, a dead socket's drop (the revision still due) replaced "done: …" with
    "stopped: the meeting ends once the page reaches the server again (reconnecting for the
    revision…)" (session 39's trial): the meeting had ended. The status keeps "done: …"; the
    reconnect goes beside it, and the revision line says "revising…"."""
    result = run("deadrevision", transcript_status="revised")
    statuses = result["statuses"]
    done = next(i for i, s in enumerate(statuses) if s.startswith("done:"))
    assert not [s for s in statuses[done:] if not s.startswith("done:")], statuses[done:]
    assert result["revision"][1].startswith("revised:")


def test_a_meeting_the_server_ends_for_its_storage_keeps_its_final_and_says_why() -> None:
    """The server's disk filled mid-meeting: it ends the meeting itself (no Stop), sends its
    transcript.final, then storage_failed and closes 4507. The page keeps the final (its
    captions, the downloads of the final transcript), stops recording, does not resume (the
    session cannot be), and says both: how much audio the final covers and the error (its
    status said only the error, the final's "done: 2.5 s of audio transcribed" replaced)."""
    result = run("storagefull")
    assert result["captions"] == [["S01", "seg-0000"], ["S02", "seg-0001"]]
    assert result["links"]["hidden"] is False and result["links"]["note"] == "(final)"
    status = result["status"]
    assert status.startswith("done: 2.5 s of audio transcribed; then error storage_failed: ")
    assert "was sent and is stored" in status and status.endswith("(closed 4507)")
    assert result["numSockets"] == 1  # no resume
    assert result["micStopped"] is True
    assert result["storage"] == {}  # nothing for a reload to resume
    assert result["startDisabled"] is False and result["stopDisabled"] is True


def test_the_status_line_takes_the_focus_from_a_button_the_page_disables() -> None:
    """A disabled button drops the keyboard focus to the page's body (Chromium): Enter on
    Stop, a speaker in the list when the connection dropped, a caption's speaker at the final
    left a keyboard user nowhere and a screen reader silent (a trial). The status line
    (focusable by script) takes it first and is read out; after a resume the button gets it
    back, so the user's place is kept through a drop."""
    result = run("focus")
    assert result["dropped"] == {"focus": "status", "disabled": True}
    assert result["resumed"] == {"focusBack": True, "disabled": False}
    assert result["stopped"] == {"focus": "status", "disabled": True}
    assert result["final"] == {"focus": "status", "disabled": True}


def test_stop_while_the_server_is_down_says_the_meeting_ends_once_reconnected() -> None:
    """Stop pressed while the server was down was not acknowledged: the status kept
    "connection lost: reconnecting in 4.0 s…" (a trial). It now says the meeting ends once
    the page reaches the server again, and the retries keep saying so (a retry's
    "connection lost: reconnecting to end the meeting…" replaced it and was read out again:
    session 38's third trial); the resume then sends `end` and the final comes."""
    result = run("stopoffline")
    assert result["dropped"] == "connection lost: reconnecting…"
    assert result["stopped"].startswith("stopped: the meeting ends once the page reaches")
    assert result["retried"] == result["stopped"]
    assert result["retried"].endswith("(reconnecting to end the meeting…)")
    assert result["sent"] == [{"type": "end"}]
    assert result["status"].startswith("done:")


def test_an_offer_withdrawn_whose_transcript_the_server_loses_says_only_that() -> None:
    """Withdrawn at the window's end while the server was ending the meeting, then no
    transcript at the next ask (a 404): the status says the server has none, without
    claiming it is ending the meeting."""
    result = run("staleending", sequence="running,running,none")
    assert result["status"] == (
        "the meeting started at 02:28 PM was not resumed within its window: the server has no "
        "transcript of it"
    )


def test_an_offer_withdrawn_as_the_server_ends_the_meeting_follows_it_to_its_final() -> None:
    """The offer to resume, withdrawn at the window's end, asked the transcript resource just
    as the server was ending the meeting ("running") and said "(the finals so far)" for good
    (a trial). It now says the server is ending the meeting and asks again until the final
    is stored."""
    # the first ask: the offer's finals so far, at load (the meeting still running)
    result = run("staleending", sequence="running,running,final")
    assert result["first"] == "(the finals so far: the server is ending the meeting)"
    # the status beside it says so too ("has ended" clashed with the note for ~3 s: a trial)
    assert result["firstStatus"].endswith(
        "was not resumed within its window: the server is ending it: download its transcript below"
    )
    assert result["later"] == "(final)"
    assert result["status"].endswith(
        "was not resumed within its window: the server has ended it: download its transcript below"
    )
    # the captions follow the server's (they stayed as the offer had fetched them: a trial),
    # and the speakers can no longer be named
    assert result["offeredLines"] == ["S01", "Bob"]
    assert result["withdrawnLines"] == ["S01", "Bob", "S03"]
    assert result["withdrawnList"] == [["S01", True], ["Bob (S02)", True], ["S03", True]]
    assert result["withdrawnHint"] == "Speakers:"  # naming will not come back
    assert result["overlayShown"] is False  # the session is over: nothing to show there
    assert result["title"] == "S01"
    assert result["asked"] == 3 and result["askedAfter"] == 3  # final: no more asks
