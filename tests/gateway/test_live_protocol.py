"""The live protocol state machine: order rules, payload validation, typed errors."""

from __future__ import annotations

import json
import unicodedata

import pytest

from livemeet.audio.constants import MAX_SPEAKER_NAME_CHARS
from livemeet.errors import BadAudio, InvalidRequest, ProtocolError
from livemeet.gateway.live_protocol import (
    AckPolicy,
    AppendAudio,
    AudioFormat,
    EndStream,
    Finalize,
    Ignored,
    KeepAlive,
    LiveProtocol,
    ResumeRequest,
    SpeakerMerge,
    SpeakerMerged,
    SpeakerRename,
    StartSession,
    State,
    require_same_format,
    shows,
)

START = json.dumps(
    {
        "type": "start",
        "sample_rate": 16000,
        "channels": 1,
        "encoding": "pcm_s16le",
        "language": "en",
        "hotwords": ["MOSS"],
    }
)


def streaming(channels: int = 1) -> LiveProtocol:
    p = LiveProtocol()
    p.receive_text(json.dumps({"type": "start", "sample_rate": 48000, "channels": channels}))
    return p


def test_happy_path_states_and_actions() -> None:
    p = LiveProtocol()
    assert p.state is State.AWAITING_START
    start = p.receive_text(START)
    assert start == StartSession(16000, 1, "pcm_s16le", "en", None, ("MOSS",))
    assert p.state is State.STREAMING
    assert p.receive_binary(b"\x01\x00" * 160) == AppendAudio(b"\x01\x00" * 160)
    assert p.receive_text('{"type": "finalize"}') == Finalize()
    assert p.receive_text('{"type": "keepalive"}') == KeepAlive()
    assert p.receive_text('{"type": "end"}') == EndStream()
    assert p.state is State.ENDING
    assert p.receive_text('{"type": "keepalive"}') == Ignored()  # allowed; nothing to keep
    assert p.num_audio_frames == 160
    p.close()
    assert p.state is State.CLOSED


def test_stereo_frames_count_per_sample_frame() -> None:
    p = streaming(channels=2)
    p.receive_binary(bytes(400))
    assert p.num_audio_frames == 100
    with pytest.raises(ProtocolError, match="4-byte"):
        p.receive_binary(bytes(6))  # 3 samples: not whole stereo frames


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{not json", InvalidRequest),
        ("[1, 2]", InvalidRequest),
        ('{"sample_rate": 16000}', InvalidRequest),
        ('{"type": "start"}', InvalidRequest),
        ('{"type": "start", "sample_rate": "16000"}', InvalidRequest),
        ('{"type": "start", "sample_rate": true}', InvalidRequest),
        ('{"type": "start", "sample_rate": 100}', BadAudio),
        ('{"type": "start", "sample_rate": 16000, "channels": 0}', BadAudio),
        ('{"type": "start", "sample_rate": 16000, "encoding": "opus"}', InvalidRequest),
        ('{"type": "start", "sample_rate": 16000, "hotwords": "a,b"}', InvalidRequest),
        ('{"type": "start", "sample_rate": 16000, "prompt": 5}', InvalidRequest),
        (
            '{"type": "start", "sample_rate": 16000, "hotwords": ["' + "w" * 129 + '"]}',
            InvalidRequest,
        ),
        # a RecursionError and a ValueError from json.loads were internal errors (a trial)
        ("[" * 100_000, InvalidRequest),
        ('{"type": "start", "sample_rate": 1' + "0" * 5_000 + "}", InvalidRequest),
        ('{"type": "finalize"}', ProtocolError),
        ('{"type": "end"}', ProtocolError),
        ('{"type": "dance"}', ProtocolError),
    ],
)
def test_bad_messages_before_start(text: str, error: type[Exception]) -> None:
    p = LiveProtocol()
    with pytest.raises(error):
        p.receive_text(text)
    assert p.state is State.AWAITING_START


def test_unparseable_json_says_where_in_the_frame() -> None:
    """A bare offset ("Expecting ':' delimiter at 33") left a new user guessing what it
    counted: the message says it is the character (from 0), and its line and column."""
    with pytest.raises(InvalidRequest) as caught:
        LiveProtocol().receive_text('{"type": "start",\n "sample_rate" 16000}')
    assert caught.value.message == (
        "text frame is not valid JSON: Expecting ':' delimiter at character 33 (line 2, column 16)"
    )


def test_a_json_number_too_long_to_read_is_named_without_python_internals() -> None:
    """A trial: the message told the client to call sys.set_int_max_str_digits()."""
    with pytest.raises(InvalidRequest, match="JSON number too long") as caught:
        LiveProtocol().receive_text('{"type": "start", "sample_rate": 1' + "0" * 5_000 + "}")
    assert "sys." not in caught.value.message


@pytest.mark.parametrize(
    "field",
    [
        '"prompt": "a\\ud800b"',
        '"hotwords": ["\\udfff"]',
        '"api_key": "\\uDC80"',  # hex digits in either case
        '"resume": {"session_id": "s", "resume_token": "\\ud83d"}',  # the pair's half alone
        '"x": {"\\ud800": 1}',  # a key of a field no one reads
    ],
)
def test_a_start_with_a_lone_surrogate_anywhere_is_an_invalid_request(field: str) -> None:
    """JSON's `\\ud800` escape decodes to a lone surrogate, which no UTF-8 writer takes (the
    journal's SQLite, a transcript file): one in a prompt failed the journal's group commit,
    and every live session on the server with it (a security review)."""
    with pytest.raises(InvalidRequest, match="lone UTF-16 surrogate"):
        LiveProtocol().receive_text('{"type": "start", "sample_rate": 16000, ' + field + "}")


def test_a_surrogate_pair_escape_is_one_character_and_taken() -> None:
    start = LiveProtocol().receive_text(
        '{"type": "start", "sample_rate": 16000, "prompt": "\\ud83d\\ude00 \\u00e9"}'
    )
    assert isinstance(start, StartSession) and start.prompt == "\U0001f600 \u00e9"


@pytest.mark.parametrize(("language", "ok"), [("en", True), ("zh-Hant", True), ("english", False)])
def test_start_takes_a_language_tag_as_an_upload_does(language: str, ok: bool) -> None:
    text = json.dumps({"type": "start", "sample_rate": 16_000, "language": language})
    if ok:
        assert isinstance(LiveProtocol().receive_text(text), StartSession)
    else:
        with pytest.raises(InvalidRequest, match="not a language code"):
            LiveProtocol().receive_text(text)


def test_null_optional_fields_take_their_defaults() -> None:
    """`"channels": null` was refused as "'start' needs the field 'channels'" while a null
    language or prompt was taken as absent (a trial): every optional field reads null as
    absent; the required sample_rate still may not be null."""
    nulls = {"channels": None, "encoding": None, "language": None, "prompt": None}
    start = LiveProtocol().receive_text(
        json.dumps({"type": "start", "sample_rate": 16000, "hotwords": None, **nulls})
    )
    assert start == StartSession(16000, 1, "pcm_s16le", None, None, ())
    with pytest.raises(InvalidRequest, match="needs the field 'sample_rate'"):
        LiveProtocol().receive_text('{"type": "start", "sample_rate": null}')


def test_audio_before_start() -> None:
    with pytest.raises(ProtocolError, match="before 'start'"):
        LiveProtocol().receive_binary(b"\x00\x00")


def test_second_start() -> None:
    p = streaming()
    with pytest.raises(ProtocolError, match="second 'start'"):
        p.receive_text(START)


def test_odd_byte_count() -> None:
    p = streaming()
    with pytest.raises(ProtocolError, match="not a whole number"):
        p.receive_binary(b"\x00\x00\x00")
    assert p.num_audio_bytes == 0


def test_end_before_audio() -> None:
    p = streaming()
    with pytest.raises(ProtocolError, match="before any audio"):
        p.receive_text('{"type": "end"}')


def test_whatever_follows_end_is_ignored() -> None:
    """A second `end` (a double-clicked stop) or an audio buffer that raced the `end` was a
    protocol_error, which closed the socket before `transcript.final`: the whole meeting's
    transcript was lost. After `end` the server owes the final; later frames are ignored."""
    p = streaming()
    p.receive_binary(b"\x00\x00")
    assert p.receive_text('{"type": "end"}') == EndStream()
    assert p.receive_binary(b"\x00\x00" * 3) == Ignored(6)
    for kind in ("end", "finalize", "keepalive", "start"):
        assert p.receive_text(json.dumps({"type": kind})) == Ignored()
    assert p.receive_text("not json") == Ignored()
    assert p.state is State.ENDING and p.num_audio_frames == 1


def test_a_type_that_is_no_string_after_end_is_ignored_too() -> None:
    """After `end` a frame whose `type` is a list or an object raised TypeError (it was
    looked up in a dict of the speaker messages): the socket closed with internal_error and
    the session was dropped, its final with it (the model-based test found it)."""
    p = streaming()
    p.receive_binary(b"\x00\x00")
    p.receive_text('{"type": "end"}')
    for kind in (["end"], {"speaker.rename": 1}, 5, None):
        assert p.receive_text(json.dumps({"type": kind, "speaker": "S01"})) == Ignored()
    drained = streaming()
    drained.receive_binary(b"\x00\x00")
    assert drained.server_end()
    assert drained.receive_text('{"type": ["speaker.rename"]}') == Ignored()
    assert p.state is State.ENDING and drained.state is State.DRAINING


def test_closed_rejects_everything() -> None:
    p = streaming()
    p.close()
    with pytest.raises(ProtocolError):
        p.receive_binary(b"\x00\x00")
    with pytest.raises(ProtocolError):
        p.receive_text('{"type": "keepalive"}')


def test_server_end_drains_a_streaming_session_and_ignores_the_rest() -> None:
    """Shutdown ends a session with audio as the client's `end` would; what the client still
    sends (it has not heard yet) is ignored, not a protocol error that would close the socket
    before its final transcript."""
    p = streaming()
    p.receive_binary(b"\x00\x00" * 4)
    assert p.server_end() and p.state is State.DRAINING
    assert p.receive_binary(b"\x01\x00" * 3) == Ignored(6)
    for kind in ("end", "finalize", "keepalive"):
        assert p.receive_text(json.dumps({"type": kind})) == Ignored()
    assert p.receive_text("not json") == Ignored()
    assert p.num_audio_frames == 4  # ignored audio is not counted as received
    assert not p.server_end()  # once
    p.close()
    with pytest.raises(ProtocolError):
        p.receive_binary(b"\x00\x00")


def test_server_end_leaves_other_states_alone() -> None:
    waiting = LiveProtocol()
    silent = streaming()  # started, no audio: nothing to transcribe
    ending = streaming()
    ending.receive_binary(b"\x00\x00")
    ending.receive_text('{"type": "end"}')
    for p, state in ((waiting, State.AWAITING_START), (silent, State.STREAMING),
                     (ending, State.ENDING)):  # fmt: skip
        assert not p.server_end() and p.state is state


RESUME = {"session_id": "s-1", "resume_token": "t0k3n"}


def test_a_start_with_resume_is_a_resume_and_says_what_it_asks_for() -> None:
    p = LiveProtocol()
    start = p.receive_text(json.dumps({"type": "start", "sample_rate": 48000, "resume": RESUME}))
    assert isinstance(start, StartSession)
    assert start.resume == ResumeRequest("s-1", "t0k3n")
    assert start.audio_format == AudioFormat(48000, 1, "pcm_s16le")
    assert p.state is State.STREAMING
    plain = LiveProtocol().receive_text(START)
    assert isinstance(plain, StartSession) and plain.resume is None


def test_a_resume_does_not_read_or_check_the_new_sessions_text() -> None:
    """`language`, `prompt` and `hotwords` are the session's own on a resume (docs/protocol.md,
    Resume): a client resending its first `start`, which an older server took, resumes (a
    trial: `"language": "english"` got 4400 across today's upgrade and lost the meeting)."""
    text = {"language": "english", "prompt": "x" * 5_000, "hotwords": "not a list"}
    start = LiveProtocol().receive_text(
        json.dumps({"type": "start", "sample_rate": 16000, "resume": RESUME, **text})
    )
    assert isinstance(start, StartSession) and start.resume == ResumeRequest("s-1", "t0k3n")
    assert (start.language, start.prompt, start.hotwords) == (None, None, ())


def test_an_empty_language_is_absent_as_in_an_upload() -> None:
    start = LiveProtocol().receive_text(
        json.dumps({"type": "start", "sample_rate": 16000, "language": ""})
    )
    assert isinstance(start, StartSession) and start.language is None


@pytest.mark.parametrize(
    "resume",
    [
        "s-1",
        {"session_id": "s-1"},
        {"resume_token": "t"},
        {"session_id": 1, "resume_token": "t"},
        {"session_id": "s-1", "resume_token": ""},
        {"session_id": "s" * 129, "resume_token": "t"},
    ],
)
def test_a_malformed_resume_is_an_invalid_request(resume: object) -> None:
    p = LiveProtocol()
    with pytest.raises(InvalidRequest, match="resume"):
        p.receive_text(json.dumps({"type": "start", "sample_rate": 16000, "resume": resume}))
    assert p.state is State.AWAITING_START


def test_a_resume_must_declare_the_sessions_audio_format() -> None:
    held = AudioFormat(48000, 2, "pcm_s16le")
    require_same_format(held, AudioFormat(48000, 2, "pcm_s16le"))
    with pytest.raises(InvalidRequest, match=r"sample_rate 16000 \(the session's is 48000\)"):
        require_same_format(held, AudioFormat(16000, 2, "pcm_s16le"))
    with pytest.raises(InvalidRequest, match=r"channels 1 \(the session's is 2\)"):
        require_same_format(held, AudioFormat(48000, 1, "pcm_s16le"))


def test_a_resumed_session_counts_its_held_audio_for_end() -> None:
    """A resume that sends no new audio may still `end` (the session holds audio); a session
    that was ended while detached resumes ENDING: the client's frames are then ignored."""
    p = streaming()
    p.resumed(4800, ended=False)
    assert p.has_audio and p.state is State.STREAMING
    assert p.receive_text('{"type": "end"}') == EndStream()
    ended = streaming()
    ended.resumed(4800, ended=True)
    assert ended.state is State.ENDING
    assert ended.receive_binary(b"\x00\x00") == Ignored(2)
    empty = streaming()
    empty.resumed(0, ended=False)
    with pytest.raises(ProtocolError, match="before any audio"):
        empty.receive_text('{"type": "end"}')


@pytest.mark.parametrize(
    ("setup", "kept"),
    [
        ("streaming", True),  # a network blip: kept for a resume
        ("ending", True),  # `end` sent, the final not yet out: kept, so the final is not lost
        # the server ended it (shutdown, idle client): its final is coming, kept for it
        ("draining", True),
        ("failed", False),  # the server sent an error (a protocol error, ...)
        ("awaiting", False),  # never started
    ],
)
def test_which_closes_keep_the_session_for_a_resume(setup: str, kept: bool) -> None:
    p = streaming() if setup != "awaiting" else LiveProtocol()
    if setup != "awaiting":
        p.receive_binary(b"\x00\x00")
    if setup == "ending":
        p.receive_text('{"type": "end"}')
    elif setup == "draining":
        assert p.server_end()
    elif setup == "failed":
        p.fail()
    assert p.close() is kept
    assert p.state is State.CLOSED
    assert p.close() is False  # once


@pytest.mark.parametrize(
    ("audio", "held", "kept"),
    [(False, 0, False), (True, 0, True), (False, 16_000, True)],
)
def test_a_client_that_left_keeps_its_session_only_where_it_holds_audio(
    audio: bool, held: int, kept: bool
) -> None:
    """`close(client_left=True)` (the client's own 1000): a session with no audio goes; one
    with audio on this connection, or held from before a resume, stays for a resume."""
    p = streaming()
    if held:
        p.resumed(held, ended=False)
    if audio:
        p.receive_binary(b"\x00\x00")
    assert p.close(client_left=True) is kept


def test_acks_are_coalesced_monotone_and_only_for_new_audio() -> None:
    """At most one ack per interval however many frames come, none while nothing is new,
    offsets only grow; `session.ready`'s offset counts as acknowledged."""
    acks = AckPolicy(0.25, acked=100)
    assert acks.audio_accepted(10.0) == 10.25  # the first frame arms the timer
    for now in (10.01, 10.1, 10.2):
        assert acks.audio_accepted(now) is None  # armed already: coalesced
    assert acks.take(400) == 400
    assert acks.take(400) is None  # nothing new
    assert acks.audio_accepted(10.3) == 10.55
    assert acks.take(90) is None  # never backwards
    assert acks.acked == 400
    assert acks.take(401) == 401


def rename(speaker: object = "S01", **fields: object) -> str:
    return json.dumps({"type": "speaker.rename", "speaker": speaker, **fields})


def test_speaker_rename_names_a_label_strips_the_name_and_null_removes_it() -> None:
    p = streaming()
    assert p.receive_text(rename(name="  Alice ")) == SpeakerRename("S01", "Alice")
    assert p.receive_text(rename("S12", name="Zoë Ñ 王")) == SpeakerRename("S12", "Zoë Ñ 王")
    assert p.receive_text(rename(name=None)) == SpeakerRename("S01", None)
    longest = "x" * MAX_SPEAKER_NAME_CHARS
    assert p.receive_text(rename(name=longest)) == SpeakerRename("S01", longest)
    # a zero-width non-joiner inside a Persian name, an emoji sequence joined by ZWJ: kept
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"
    assert p.receive_text(rename(name=persian)) == SpeakerRename("S01", persian)
    assert p.receive_text(rename(name="\U0001f469\u200d\U0001f4bb")).name is not None
    assert p.state is State.STREAMING  # a rename is no audio and changes no state


@pytest.mark.parametrize(
    "text",
    [
        rename("Alice", name="Bob"),  # not a label
        rename("S", name="Bob"),
        rename("s01", name="Bob"),
        rename("S0１", name="Bob"),  # a full-width digit
        rename("S" + "1" * 16, name="Bob"),  # 17 characters: longer than the model writes
        rename(1, name="Bob"),
        rename(None, name="Bob"),
        rename(),  # no name: null must be explicit to remove one
        rename(name=""),
        rename(name="   "),
        rename(name=7),
        rename(name=["Alice"]),
        rename(name="x" * (MAX_SPEAKER_NAME_CHARS + 1)),
        rename(name="Alice\nBob"),
        rename(name="Al\u0000ice"),
        rename(name="Al\u2028ice"),  # a line separator
        rename(name="Al\ud800ice"),  # a lone surrogate: not writable as UTF-8
        # a trial: these were named; the overlay, SRT and VTT showed a blank speaker, or the
        # rest of the caption line reversed
        rename(name="\u200b"),  # a zero-width space alone: nothing to show
        rename(name="\u200b\u200d\u0301"),  # format characters and a lone mark
        rename(name="a\u202eb"),  # right-to-left override
        rename(name="\u2067Bob"),  # right-to-left isolate
        rename(name="\ufdd0"),  # noncharacters: never assigned, nothing to show
        rename(name="\U0010ffff \ufffe"),
    ],
)
def test_a_malformed_speaker_rename_is_an_invalid_request(text: str) -> None:
    with pytest.raises(InvalidRequest):
        streaming().receive_text(text)


def test_a_name_of_characters_newer_than_the_servers_unicode_is_accepted() -> None:
    """A code point this Python's Unicode database has not assigned (Cn) is taken as
    visible: the browser's Unicode is newer (17 against 14 in a trial), and a name of only
    emoji assigned since was refused mid-meeting. The probe is the first Cn code point of
    Symbols and Pictographs Extended-A (U+1FA70-1FAFF, which keeps growing), or plane 4's first
    once that block is full, so the test holds on any Python; a noncharacter is still refused
    (above)."""
    block = (chr(c) for c in range(0x1FA70, 0x1FB00))
    newer = next((ch for ch in block if unicodedata.category(ch) == "Cn"), "\U00040000")
    assert streaming().receive_text(rename(name=newer)) == SpeakerRename("S01", newer)
    assert shows(newer) and shows("a") and not shows("\u200b") and not shows("\ufffe")


def test_speaker_rename_before_start_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        LiveProtocol().receive_text(rename(name="Alice"))


def test_speaker_rename_still_applies_after_end_and_a_bad_one_is_ignored() -> None:
    """After `end` the final is on its way: a rename still names (the stored transcript
    carries it), and a malformed one is ignored rather than closing before the final."""
    p = streaming()
    p.receive_binary(b"\x00\x00")
    p.receive_text('{"type": "end"}')
    assert p.receive_text(rename(name="Alice")) == SpeakerRename("S01", "Alice")
    ignored = p.receive_text(rename("nope", name="Alice"))
    assert isinstance(ignored, Ignored) and "speaker" in ignored.reason
    assert p.state is State.ENDING
    drained = streaming()
    drained.receive_binary(b"\x00\x00")
    assert drained.server_end()
    assert drained.receive_text(rename(name=None)) == SpeakerRename("S01", None)


def merge(speaker: object = "S03", **fields: object) -> str:
    return json.dumps({"type": "speaker.merge", "speaker": speaker, **fields})


def test_speaker_merge_names_two_labels_and_changes_no_state() -> None:
    p = streaming()
    assert p.receive_text(merge(into="S01")) == SpeakerMerge("S03", "S01")
    assert p.receive_text(merge("S1234", into="S7")) == SpeakerMerge("S1234", "S7")
    # whether the session can make it (shown labels, no cycle) is the session's to say
    assert p.receive_text(merge("S01", into="S01")) == SpeakerMerge("S01", "S01")
    assert p.state is State.STREAMING


@pytest.mark.parametrize(
    "text",
    [
        merge("Alice", into="S01"),
        merge("s03", into="S01"),
        merge("S" + "1" * 16, into="S01"),
        merge(3, into="S01"),
        merge(into="Bob"),
        merge(into=1),
        merge(into=None),
        merge(),  # no `into`
        json.dumps({"type": "speaker.merge", "into": "S01"}),  # no `speaker`
    ],
)
def test_a_malformed_speaker_merge_is_an_invalid_request(text: str) -> None:
    with pytest.raises(InvalidRequest, match="'speaker.merge' needs '(speaker|into)'"):
        streaming().receive_text(text)


def test_speaker_merge_before_start_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="'speaker.merge' is not allowed"):
        LiveProtocol().receive_text(merge(into="S01"))


def test_speaker_merge_still_applies_after_end_and_a_bad_one_is_ignored() -> None:
    p = streaming()
    p.receive_binary(b"\x00\x00")
    p.receive_text('{"type": "end"}')
    assert p.receive_text(merge(into="S01")) == SpeakerMerge("S03", "S01")
    ignored = p.receive_text(merge(into="nope"))
    assert isinstance(ignored, Ignored) and ignored.reason.startswith("speaker.merge: ")
    drained = streaming()
    drained.receive_binary(b"\x00\x00")
    assert drained.server_end()
    assert drained.receive_text(merge(into="S02")) == SpeakerMerge("S03", "S02")


def test_speaker_merged_on_the_wire() -> None:
    assert SpeakerMerged("S03", "S01").to_wire() == {
        "type": "speaker.merged",
        "speaker": "S03",
        "into": "S01",
    }


def test_a_resume_tokens_repr_never_shows_it() -> None:
    """The api_key was kept out of StartSession's repr, and the resume token, which takes
    the session over, was in it (a security review)."""
    token = "r" * 43
    start = LiveProtocol().receive_text(
        json.dumps({**json.loads(START), "resume": {"session_id": "s-1", "resume_token": token}})
    )
    assert isinstance(start, StartSession) and start.resume is not None
    assert start.resume.resume_token == token and "s-1" in repr(start)
    assert token not in repr(start) and token not in repr(start.resume)


def test_start_may_carry_the_api_key_which_its_repr_never_shows() -> None:
    key = "lm_0123456789ab_" + "s" * 43
    start = LiveProtocol().receive_text(json.dumps({**json.loads(START), "api_key": f" {key} "}))
    assert isinstance(start, StartSession) and start.api_key == key
    assert key not in repr(start) and "s" * 43 not in repr(start)
    for absent in (None, "", "  "):
        message = {**json.loads(START), "api_key": absent}
        start = LiveProtocol().receive_text(json.dumps(message))
        assert isinstance(start, StartSession) and start.api_key is None
    with pytest.raises(InvalidRequest, match="'api_key' must be a string"):
        LiveProtocol().receive_text(json.dumps({**json.loads(START), "api_key": 12}))
