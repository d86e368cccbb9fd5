"""The live protocol's Sans-I/O machine (`LiveProtocol`) driven by random sequences of client
frames and server events, against a reference model written from docs/protocol.md alone
("Client to server", the states under it, "Closing", "Resume", "Speaker names", "Speaker
merges"), before the machine's code was read.

The model: 5 states (AWAITING_START, STREAMING, ENDING, DRAINING, CLOSED) x 26 inputs:
17 client inputs (a new `start`, a resume's `start`, a `start` with a bad field
(invalid_request), a `start` with an unusable rate or channel count (bad_audio); binary
frames of whole sample frames, empty, misaligned, over 1 MiB; `finalize`, `end`,
`keepalive`; a valid and a malformed `speaker.rename` and `speaker.merge`; an unknown
`type`; a frame that is no JSON object with a string `type`) and 9 server-side ones (the
final transcript; a draining shutdown; a restart; the idle timeout; no final in time; the
storage failing; the engine failing; a take-over; the socket dropped or closed by its
client). Per the doc:

| input | AWAITING_START | STREAMING | ENDING, DRAINING |
|---|---|---|---|
| start | parsed; a faulty field's class (4400 / 4415) | protocol_error | ignored |
| binary, whole frames (empty too) | protocol_error | audio | ignored |
| binary, misaligned | protocol_error | protocol_error | ignored |
| binary over 1 MiB | 1009, no error frame, session kept (the WebSocket layer's) | same | same |
| finalize | protocol_error | finalize | ignored |
| end | protocol_error | end -> ENDING (audio held, a resume's too), else protocol_error | ignored |
| keepalive | keepalive | keepalive | ignored (nothing to reset) |
| speaker.rename / merge, valid | protocol_error | forwarded | forwarded |
| speaker.rename / merge, malformed | protocol_error | invalid_request | ignored |
| unknown type | protocol_error | protocol_error | ignored |
| no JSON object with a string type, a lone surrogate | invalid_request | same | ignored |

A refused frame changes nothing (it is refused whole). A client's violation (invalid_request,
protocol_error, bad_audio) closes the socket with its code and keeps a started session for a
resume; other errors drop it, except `server_restarting` (kept for the next start) and
`session_taken_over` (another socket has it). CLOSED is absorbing: the transport feeds no more
frames, and the machine refuses any (ProtocolError). One error frame at most per connection,
closed with the doc table's close code for its class; a final closes with 1000 (or, where the
server ended the session for idleness or storage, with that error after the final).

Where the doc was silent or loose, this model found the code's reading and the doc now says
it ("Client to server", "Resume"): an empty binary frame is taken but is no audio for `end`;
unknown fields are ignored and an optional field sent as null is absent; `api_key` is
stripped, blank as absent; a resume's unusable rate is bad_audio, as any start's; only a
session still streaming without audio goes at once when its client closes with 1000/1001 (a
resumed one that ended while detached is kept for its final). Left as the code reads them,
consistent with the doc's words: a second `start` is a protocol_error whatever its fields
hold; a rename or merge before `start` is a protocol_error even if malformed; `type` missing
or not a string is an invalid_request (a field of the wrong type); a name is stripped of
Python's white space (control characters among it go with it) before it is checked;
`keepalive` after `end` is ignored (no idle timer runs then); where a `start` has several bad
fields, any of their classes may be the one reported.

Below the machine, the payload rules get more examples than a run of it spends on them: every
row of the `start` field tables and every edge-case name, each alone on a fresh machine, and
random `start`s, renames, merges and text frames one at a time.

`finalize`'s `finalize_offset` rule (a repeat does nothing) is the session holder's, not this
machine's (it returns `Finalize` for every `finalize` while STREAMING):
`FinalizeResumeMachine` at the end drives the two together.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import re
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from livemeet.audio.constants import MAX_FRAME_BYTES
from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.errors import (
    BadAudio,
    ClientTimeout,
    EngineUnavailable,
    InternalError,
    InvalidRequest,
    LivemeetError,
    NotFound,
    ProtocolError,
    QueueFull,
    ServerRestarting,
    SessionTakenOver,
    StorageFailed,
    TooManySessions,
    Unauthorized,
)
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.gateway.live_journal import LiveJournal
from livemeet.gateway.live_protocol import (
    AppendAudio,
    AudioFormat,
    EndStream,
    Finalize,
    Ignored,
    KeepAlive,
    LiveProtocol,
    ResumeRequest,
    SpeakerMerge,
    SpeakerRename,
    StartSession,
    State,
    require_same_format,
)
from livemeet.gateway.session_tokens import SessionTokens
from livemeet.transcriber import Event, Samples, TranscriberSession

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
# the doc's error table: code -> WebSocket close code (the oracle for every close here)
DOC_CLOSE_CODES = {
    code: int(close)
    for code, close in re.findall(r"^\| `(\w+)` \| \d+ \| (\d+) \|", DOC.read_text(), re.M)
}
NORMAL_CLOSE = 1000  # after transcript.final
MESSAGE_TOO_BIG = 1009  # RFC 6455: the WebSocket layer's close for a frame over 1 MiB
# the doc's limits ("Client to server")
MIN_RATE, MAX_RATE, MAX_CHANNELS = 8000, 192000, 8
MAX_LANGUAGE, MAX_PROMPT, MAX_HOTWORDS, MAX_HOTWORD = 32, 4096, 256, 128
MAX_RESUME_FIELD, MAX_LABEL, MAX_NAME = 128, 16, 64
CLIENT_VIOLATIONS = (InvalidRequest, ProtocolError, BadAudio)
ENDED = ("ENDING", "DRAINING")
ABSENT = object()  # a field left out of the message


@dataclass(frozen=True, repr=False)
class Text:
    """A text frame and what the doc says it is: `kind` (its `type`, "unknown" for one the
    protocol lacks, "garbage" for a frame that is no JSON object with a string `type`, or
    holds a lone surrogate), `faults` (the error classes its fields call for; empty: well
    formed), and `parsed`, the action a well-formed start, rename or merge is."""

    kind: str
    wire: str
    faults: frozenset[type[LivemeetError]] = frozenset()
    parsed: object = None

    def __repr__(self) -> str:
        wire = (
            self.wire if len(self.wire) <= 200 else f"{self.wire[:80]}...({len(self.wire)} chars)"
        )
        faults = sorted(f.__name__ for f in self.faults)
        return f"Text({self.kind!r}, {wire!r}, faults={faults}, parsed={self.parsed!r})"


def _wire(message: dict[str, Any], ascii_only: bool) -> str:
    return json.dumps(message, ensure_ascii=ascii_only)


# -- start ---------------------------------------------------------------------------------

# (value, the error class it calls for or None, the value the session takes)
Choice = tuple[Any, type[LivemeetError] | None, Any]
SAMPLE_RATES: list[Choice] = [
    (16000, None, 16000),
    (MIN_RATE, None, MIN_RATE),
    (MAX_RATE, None, MAX_RATE),
    (48000, None, 48000),
    (MIN_RATE - 1, BadAudio, None),
    (MAX_RATE + 1, BadAudio, None),
    (0, BadAudio, None),
    (-16000, BadAudio, None),
    (10**12, BadAudio, None),
    (ABSENT, InvalidRequest, None),
    (None, InvalidRequest, None),
    (16000.0, InvalidRequest, None),
    ("16000", InvalidRequest, None),
    (True, InvalidRequest, None),
    ([16000], InvalidRequest, None),
]
CHANNELS: list[Choice] = [
    *[(n, None, n) for n in range(1, MAX_CHANNELS + 1)],
    (ABSENT, None, 1),
    (None, None, 1),
    (0, BadAudio, None),
    (MAX_CHANNELS + 1, BadAudio, None),
    (-1, BadAudio, None),
    ("2", InvalidRequest, None),
    (2.0, InvalidRequest, None),
    (True, InvalidRequest, None),
]
ENCODINGS: list[Choice] = [
    (ABSENT, None, "pcm_s16le"),
    (None, None, "pcm_s16le"),
    ("pcm_s16le", None, "pcm_s16le"),
    ("pcm_f32le", InvalidRequest, None),
    ("PCM_S16LE", InvalidRequest, None),
    ("", InvalidRequest, None),
    (16, InvalidRequest, None),
]
LONG_TAG = "en-Latn-GB-oxendict-x-priv12-abc"  # a valid tag at the limit
assert len(LONG_TAG) == MAX_LANGUAGE
LANGUAGES: list[Choice] = [
    (ABSENT, None, None),
    (None, None, None),
    ("", None, None),  # empty as absent
    ("en", None, "en"),
    ("zh", None, "zh"),  # a tag: whether the backend takes it is the gateway's
    ("en-US", None, "en-US"),
    (LONG_TAG, None, LONG_TAG),
    (LONG_TAG + "d", InvalidRequest, None),
    ("en-US-u-ca-gregory-nu-latn-co-phonebk", InvalidRequest, None),  # a tag, 37 chars
    ("english!", InvalidRequest, None),
    (" ", InvalidRequest, None),
    (5, InvalidRequest, None),
    (["en"], InvalidRequest, None),
]
PROMPTS: list[Choice] = [
    (ABSENT, None, None),
    (None, None, None),
    ("", None, ""),
    ("Alice, Bob and MOSS", None, "Alice, Bob and MOSS"),
    ("p" * MAX_PROMPT, None, "p" * MAX_PROMPT),
    ("p" * (MAX_PROMPT + 1), InvalidRequest, None),
    (5, InvalidRequest, None),
]
HOTWORDS: list[Choice] = [
    (ABSENT, None, ()),
    (None, None, ()),
    ([], None, ()),
    (["MOSS", ""], None, ("MOSS", "")),
    (["h"] * MAX_HOTWORDS, None, ("h",) * MAX_HOTWORDS),
    (["h"] * (MAX_HOTWORDS + 1), InvalidRequest, None),
    (["x" * MAX_HOTWORD], None, ("x" * MAX_HOTWORD,)),
    (["x" * (MAX_HOTWORD + 1)], InvalidRequest, None),
    ("MOSS", InvalidRequest, None),
    ([1], InvalidRequest, None),
    (["a", None], InvalidRequest, None),
]
API_KEYS: list[Choice] = [
    (ABSENT, None, None),
    (None, None, None),
    ("lm_0123456789ab_secret", None, "lm_0123456789ab_secret"),
    (" lm_0123456789ab_secret\n", None, "lm_0123456789ab_secret"),  # white space dropped
    ("  ", None, None),  # empty as absent
    ("", None, None),
    (5, InvalidRequest, None),
    (["k"], InvalidRequest, None),
]
RESUME_FIELD = "r" * MAX_RESUME_FIELD
RESUMES: list[Choice] = [
    (ABSENT, None, None),
    (None, None, None),
    ({"session_id": "s-x", "resume_token": "t"}, None, ResumeRequest("s-x", "t")),
    (
        {"session_id": RESUME_FIELD, "resume_token": RESUME_FIELD},
        None,
        ResumeRequest(RESUME_FIELD, RESUME_FIELD),
    ),
    ({"session_id": RESUME_FIELD + "r", "resume_token": "t"}, InvalidRequest, None),
    ({"session_id": "s-x", "resume_token": RESUME_FIELD + "r"}, InvalidRequest, None),
    ({"session_id": "", "resume_token": "t"}, InvalidRequest, None),
    ({"session_id": "s-x"}, InvalidRequest, None),
    ({"session_id": 5, "resume_token": "t"}, InvalidRequest, None),
    ({}, InvalidRequest, None),
    ("s-x", InvalidRequest, None),
    ([], InvalidRequest, None),
    (False, InvalidRequest, None),
]
# fields the protocol does not have: the doc does not say; ignored
EXTRA_FIELDS = st.dictionaries(
    st.sampled_from(["model", "revise", "Type", "sampleRate", "x"]),
    st.one_of(st.none(), st.integers(), st.text(max_size=5)),
    max_size=2,
)


START_FIELDS: dict[str, list[Choice]] = {
    "sample_rate": SAMPLE_RATES,
    "channels": CHANNELS,
    "encoding": ENCODINGS,
    "language": LANGUAGES,
    "prompt": PROMPTS,
    "hotwords": HOTWORDS,
    "api_key": API_KEYS,
    "resume": RESUMES,
}


def start_text(
    drawn: dict[str, Choice],
    extra: dict[str, Any] | None = None,
    *,
    surrogate: bool = False,
    ascii_only: bool = True,
) -> Text:
    """The `start` of the chosen rows of START_FIELDS (`extra`: fields the protocol does not
    have; `surrogate`: a lone surrogate in one of them), judged as the doc says."""
    resuming = drawn["resume"][2] is not None
    message: dict[str, Any] = {"type": "start"}
    faults: set[type[LivemeetError]] = set()
    for name, (value, fault, _) in drawn.items():
        if value is not ABSENT:
            message[name] = value
        # a resume's language, prompt and hotwords are the session's own: not read
        if fault is not None and not (resuming and name in ("language", "prompt", "hotwords")):
            faults.add(fault)
    for key, value in (extra or {}).items():
        message.setdefault(key, value)
    if surrogate:  # "\ud800" anywhere, even in an unknown field: not Unicode text
        message["x-note"] = "a\ud800b"
        faults.add(InvalidRequest)
    parsed = None
    if not faults:
        taken = {name: value for name, (_, _, value) in drawn.items()}
        if resuming:
            taken.update(language=None, prompt=None, hotwords=())
        parsed = StartSession(
            taken["sample_rate"],
            taken["channels"],
            taken["encoding"],
            taken["language"],
            taken["prompt"],
            taken["hotwords"],
            taken["resume"],
            taken["api_key"],
        )
    return Text("start", _wire(message, ascii_only or surrogate), frozenset(faults), parsed)


@st.composite
def start_messages(draw: st.DrawFn, resume: object = ABSENT) -> Text:
    """A `start`, each field valid, at a limit, past it, of the wrong type or left out;
    `resume` (a resume's block) fixed where given, else drawn."""
    # mostly one bad field at a time, so that each must be the one reported
    num_bad = draw(st.sampled_from([0, 0, 1, 1, 1, 2]))
    bad = set(draw(st.permutations(list(START_FIELDS)))[:num_bad])
    drawn = {}
    for name, choices in START_FIELDS.items():
        pool = [c for c in choices if (c[1] is not None) == (name in bad)]
        drawn[name] = draw(st.sampled_from(pool))
    if resume is not ABSENT:
        assert isinstance(resume, dict)
        request = ResumeRequest(resume["session_id"], resume["resume_token"])
        drawn["resume"] = (resume, None, request)
    return start_text(
        drawn,
        draw(EXTRA_FIELDS),
        surrogate=draw(st.integers(0, 9)) == 0,
        ascii_only=draw(st.booleans()),
    )


def new_start(sample_rate: int, channels: int) -> Text:
    """A well-formed `start` of a new session."""
    message = {"type": "start", "sample_rate": sample_rate, "channels": channels}
    parsed = StartSession(sample_rate, channels, "pcm_s16le", None, None, ())
    return Text("start", json.dumps(message), frozenset(), parsed)


# -- speaker.rename / speaker.merge ------------------------------------------------------

VALID_LABELS = st.one_of(
    st.sampled_from(["S01", "S02", "S1", "S" + "9" * (MAX_LABEL - 1)]),
    st.from_regex(r"S[0-9]{1,15}", fullmatch=True),
)
BAD_LABELS = st.sampled_from(
    ["S", "s01", "S" + "0" * MAX_LABEL, "A01", "S01 ", " S01", "S\u0661", "S0.1", "", 1, None]
)
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
EDGE_NAMES = [
    "Alice",
    "  Bob ",
    "a" * MAX_NAME,
    " " + "a" * MAX_NAME + " ",
    "a" * (MAX_NAME + 1),
    "",
    "   ",
    "\u200b",  # a zero-width space alone shows nothing
    "Al\u200bice",
    "a\nb",
    "Bob\n",  # stripped: the line break goes with the spaces
    "a\u2028b",
    "\u202eecilA",
    "Al\u2066ice\u2069",
    "\x07bell",
    "\u0378",  # unassigned in this Python's Unicode: a browser's newer character, shown
    "\ufdd0",  # a noncharacter: never shown
    "\uffff",  # the last two code points of every plane are noncharacters too
    "\U0001fffe",
    "a\u2029b",  # a paragraph separator: a line break
    "\u00a0Bob\u00a0",  # no-break spaces are stripped too
    "\U000e0041",  # a tag character (a format character) alone
    "\ue000",  # private use: no letter, digit, punctuation or symbol
    "\u0301",  # a combining mark alone
    "李雷",
    "🙂",
]


def doc_name(raw: str) -> str | None:
    """A rename's `name` as the doc takes it ("Client to server", `speaker.rename`): stripped,
    1..64 characters, no control character, line break or bidirectional control, at least one
    visible character (a letter, digit, punctuation or symbol; a code point this Unicode
    database does not know, other than a noncharacter, counts as visible). None: refused."""
    name = raw.strip()
    if not 1 <= len(name) <= MAX_NAME:
        return None
    for ch in name:
        category = unicodedata.category(ch)
        if category == "Cc" or category in ("Zl", "Zp") or ch in BIDI:
            return None
    return name if any(_visible(ch) for ch in name) else None


def _visible(ch: str) -> bool:
    category = unicodedata.category(ch)
    code = ord(ch)
    noncharacter = 0xFDD0 <= code <= 0xFDEF or code % 0x10000 in (0xFFFE, 0xFFFF)
    return category[0] in "LNPS" or (category == "Cn" and not noncharacter)


NAME_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"]), max_size=MAX_NAME + 4
).filter(lambda s: len(s.strip()) <= MAX_NAME + 2)


# names the doc takes (some padded: stripped), for a client that means well
VALID_NAMES = st.one_of(
    st.sampled_from([n for n in EDGE_NAMES if doc_name(n) is not None]),
    st.text(
        alphabet=st.characters(whitelist_categories=("L", "N", "P", "S", "Zs")),
        min_size=1,
        max_size=MAX_NAME,
    ).filter(lambda s: doc_name(s) is not None),
    st.none(),
)


def rename_text(speaker: object, name: object, *, ascii_only: bool = True) -> Text:
    """A `speaker.rename` of `speaker` to `name` (ABSENT: left out), judged as the doc says."""
    message: dict[str, Any] = {"type": "speaker.rename"}
    faults: set[type[LivemeetError]] = set()
    if speaker is not ABSENT:
        message["speaker"] = speaker
    if not (isinstance(speaker, str) and re.fullmatch(r"S[0-9]{1,15}", speaker)):
        faults.add(InvalidRequest)
    taken: str | None = None
    if name is ABSENT or not (name is None or isinstance(name, str)):
        faults.add(InvalidRequest)
    elif isinstance(name, str):
        taken = doc_name(name)
        if taken is None:
            faults.add(InvalidRequest)
    if name is not ABSENT:
        message["name"] = name
    parsed = None if faults else SpeakerRename(cast(str, speaker), taken)
    return Text("speaker.rename", _wire(message, ascii_only), frozenset(faults), parsed)


@st.composite
def rename_messages(draw: st.DrawFn, valid: bool = False) -> Text:
    """A `speaker.rename`, its label and name any (`valid`: ones the doc takes)."""
    labels = (
        VALID_LABELS
        if valid
        else st.one_of(VALID_LABELS, VALID_LABELS, BAD_LABELS, st.just(ABSENT))
    )
    names = (
        VALID_NAMES
        if valid
        else st.one_of(
            st.sampled_from(EDGE_NAMES),
            st.sampled_from(EDGE_NAMES),
            NAME_TEXT,
            st.sampled_from([None, ABSENT, 5, ["x"]]),
        )
    )
    return rename_text(draw(labels), draw(names), ascii_only=draw(st.booleans()))


@st.composite
def merge_messages(draw: st.DrawFn, valid: bool = False) -> Text:
    """A `speaker.merge`, its labels any (`valid`: labels)."""
    message: dict[str, Any] = {"type": "speaker.merge"}
    faults: set[type[LivemeetError]] = set()
    labels: list[Any] = []
    any_label = VALID_LABELS if valid else st.one_of(VALID_LABELS, BAD_LABELS, st.just(ABSENT))
    for name in ("speaker", "into"):
        label = draw(any_label)
        if label is not ABSENT:
            message[name] = label
        if not (isinstance(label, str) and re.fullmatch(r"S[0-9]{1,15}", label)):
            faults.add(InvalidRequest)
        labels.append(label)
    # a label into itself, one not shown, a cycle: the session's to refuse, not the form's
    parsed = None if faults else SpeakerMerge(*labels)
    return Text("speaker.merge", json.dumps(message), frozenset(faults), parsed)


# -- the other messages ----------------------------------------------------------------------


@st.composite
def plain_messages(draw: st.DrawFn, kind: str) -> Text:
    """`finalize`, `end` or `keepalive`, with fields the protocol does not have now and then."""
    message: dict[str, Any] = {"type": kind, **draw(EXTRA_FIELDS)}
    message["type"] = kind
    return Text(kind, json.dumps(message))


UNKNOWN_TYPES = st.one_of(
    st.sampled_from(["START", "", "session.ready", "audio", "finalise", "stop", "ping", "End"]),
    st.text(max_size=12).filter(
        lambda t: (
            t not in ("start", "finalize", "end", "keepalive", "speaker.rename", "speaker.merge")
        )
    ),
)
# built once, named in the strategy (a failing run prints the strategy's repr)
BIG_TEXTS = {
    "BIG_INT": '{"type": "start", "sample_rate": 1' + "0" * 5000 + "}",  # past int's digits
    "DEEP": "[" * 100_000,  # nests past the parser's recursion
}
GARBAGE = st.one_of(
    st.sampled_from(
        [
            "",
            "{not json",
            "start",
            '{"type": "end"',
            "[1, 2]",
            '"end"',
            "null",
            "42",
            "{}",
            '{"type": 5}',
            '{"type": null}',
            '{"type": ["end"]}',
            '{"Type": "end"}',
            '{"type": "keepalive", "note": "\\ud800"}',  # a lone surrogate, escaped
            '{"type": "end", "\\udfff": 1}',  # in a key
            '{"type": "speaker.rename", "speaker": "S01", "name": "A\\udc00"}',
            "BIG_INT",
            "DEEP",
        ]
    ).map(lambda t: BIG_TEXTS.get(t, t)),
    st.text(max_size=30).filter(lambda t: not _json_object_with_type(t)),
    # a `type` of another JSON type, the rest of the message as a real one's
    st.builds(
        lambda kind, rest: json.dumps({**rest, "type": kind}),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False),
            lambda inner: (
                st.lists(inner, max_size=2)
                | st.dictionaries(st.sampled_from(["end", "speaker.rename"]), inner, max_size=2)
            ),
            max_leaves=3,
        ),
        st.sampled_from([{}, {"speaker": "S01", "name": "Alice"}, {"sample_rate": 16000}]),
    ),
)


def _json_object_with_type(text: str) -> bool:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and isinstance(value.get("type"), str)


TEXTS = st.one_of(
    start_messages(),
    plain_messages("finalize"),
    plain_messages("end"),
    plain_messages("keepalive"),
    rename_messages(),
    merge_messages(),
    UNKNOWN_TYPES.map(lambda t: Text("unknown", json.dumps({"type": t}))),
    GARBAGE.map(lambda t: Text("garbage", t, frozenset({InvalidRequest}))),
)


# -- the reference model -------------------------------------------------------------------


@dataclass
class SessionModel:
    """A session as the server holds it: `frames` of audio it took in (sample frames), its
    format and resume token; `ended` (its `end` came, or the server's); `finished` (its
    final came: a resume gets not_found); `attached` (a socket carries it)."""

    session_id: str
    fmt: AudioFormat
    token: str
    frames: int = 0
    ended: bool = False
    finished: bool = False
    attached: bool = True


@dataclass
class ConnectionModel:
    """One socket as the doc has it."""

    state: str = "AWAITING_START"
    frame_bytes: int = 2
    bytes_taken: int = 0  # PCM bytes this socket's frames gave the session
    held_frames: int = 0  # what a resumed session held before it
    session: SessionModel | None = None
    failed: bool = False  # an error that drops (or hands on) the session was sent
    errors: list[LivemeetError] = field(default_factory=list)
    close_code: int | None = None  # the server's close; None: open, or closed by the client
    owed_error: LivemeetError | None = None  # what follows the final (idle, storage)

    @property
    def has_audio(self) -> bool:
        return self.bytes_taken > 0 or self.held_frames > 0


def expected_text(conn: ConnectionModel, text: Text) -> object:
    """What the doc says the machine does with `text`: the action it returns, or the set of
    error classes one of which it raises (a frozenset)."""
    if conn.state in ENDED:
        if text.kind in ("speaker.rename", "speaker.merge") and not text.faults:
            return text.parsed
        return Ignored
    if text.kind == "garbage":
        return text.faults
    if InvalidRequest in text.faults and _holds_surrogate(text.wire):
        return frozenset({InvalidRequest})  # not Unicode text, whatever its type
    if text.kind == "keepalive":
        return KeepAlive()
    if conn.state == "AWAITING_START":
        if text.kind != "start":
            return frozenset({ProtocolError})
        return text.faults or text.parsed
    # STREAMING
    if text.kind == "start":
        return frozenset({ProtocolError})  # a second start
    if text.kind == "finalize":
        return Finalize()
    if text.kind == "end":
        return EndStream() if conn.has_audio else frozenset({ProtocolError})
    if text.kind in ("speaker.rename", "speaker.merge"):
        return text.faults or text.parsed
    return frozenset({ProtocolError})  # unknown type


def _holds_surrogate(wire: str) -> bool:
    try:
        value = json.loads(wire)
    except (ValueError, RecursionError):
        return False
    return bool(re.search("[\ud800-\udfff]", json.dumps(value, ensure_ascii=False)))


def kept_on_close(conn: ConnectionModel, *, client_left: bool) -> bool:
    """Whether the socket's going keeps its session for a resume ("Resume"): it went while
    streaming or waiting for the final, no error that drops the session was sent, and it is
    not a session still streaming without audio whose client closed with 1000/1001."""
    if conn.failed or conn.state not in ("STREAMING", *ENDED):
        return False
    return not (client_left and conn.state == "STREAMING" and not conn.has_audio)


REFUSALS = st.sampled_from(
    [
        *[None] * 12,
        QueueFull("at capacity"),
        TooManySessions("32 sessions"),
        StorageFailed("disk low"),
        EngineUnavailable("model not ready"),
        Unauthorized("no key"),
    ]
)
BINARY_SIZES = st.one_of(
    st.integers(0, 64),
    st.integers(0, 4000),
    st.sampled_from([0, 1, 3, 640, MAX_FRAME_BYTES - 1, MAX_FRAME_BYTES, MAX_FRAME_BYTES + 1]),
    st.sampled_from([MAX_FRAME_BYTES + 2, MAX_FRAME_BYTES + 16, 2 * MAX_FRAME_BYTES]),
)


class LiveProtocolMachine(RuleBasedStateMachine):
    """One socket at a time over a server that holds its sessions: a thin transport (what
    ws_live does with each action and error) around the real `LiveProtocol`, checked against
    the model after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: dict[str, SessionModel] = {}
        self.num_sessions = 0
        self._connect()

    def _connect(self) -> None:
        self.proto = LiveProtocol()
        self.conn = ConnectionModel()
        self.last_bytes = 0

    # -- the transport ------------------------------------------------------------------

    def _fail(self, error: LivemeetError, *, keep: bool = False) -> None:
        """Send `error` and close with its code; `keep`: the session is kept all the same
        (a client's violation once it exists, a restart); else the machine is told it
        failed."""
        conn = self.conn
        assert conn.close_code is None and not conn.errors, "one error per connection"
        assert error.close_code == DOC_CLOSE_CODES[error.code], error.code
        conn.errors.append(error)
        if not keep:
            self.proto.fail()
            conn.failed = True
        expected_keep = kept_on_close(conn, client_left=False)
        assert self.proto.close() is expected_keep
        self._closed(error.close_code, kept=expected_keep)

    def _closed(self, close_code: int | None, *, kept: bool) -> None:
        conn = self.conn
        conn.state = "CLOSED"
        conn.close_code = close_code
        session = conn.session
        if session is not None and session.attached:
            session.attached = False
            if (
                not kept
                and not session.finished
                and not isinstance(conn.errors[-1] if conn.errors else None, SessionTakenOver)
            ):
                del self.sessions[session.session_id]  # dropped: a resume gets not_found

    def _on_start(self, start: StartSession, refusal: LivemeetError | None) -> None:
        conn = self.conn
        fmt = start.audio_format
        conn.frame_bytes = fmt.frame_bytes
        if start.resume is None:
            if refusal is not None:  # the server's admission refused it: no session
                self._fail(refusal)
                return
            self.num_sessions += 1
            session = SessionModel(f"s-{self.num_sessions}", fmt, f"t-{self.num_sessions}")
            self.sessions[session.session_id] = session
            conn.session = session
            return
        held = self.sessions.get(start.resume.session_id)
        if held is None or held.finished:
            self._fail(NotFound(f"no live session {start.resume.session_id!r}"))
            return
        if start.resume.resume_token != held.token:
            self._fail(Unauthorized("wrong resume_token"))  # the session stays resumable
            return
        if held.fmt != fmt:
            try:
                require_same_format(held.fmt, fmt)
            except InvalidRequest as exc:
                self._fail(exc)  # no session on this socket yet: nothing to keep
                return
            raise AssertionError("require_same_format took another format")
        held.attached = True  # a socket still carrying it would be taken over
        conn.session = held
        conn.held_frames = held.frames
        self.proto.resumed(held.frames, ended=held.ended)
        if held.ended:
            conn.state = "ENDING"

    def _act(self, action: object, refusal: LivemeetError | None = None) -> None:
        conn = self.conn
        if isinstance(action, StartSession):
            conn.state = "STREAMING"
            self._on_start(action, refusal)
        elif isinstance(action, AppendAudio):
            conn.bytes_taken += len(action.pcm)
            assert conn.session is not None
            conn.session.frames += len(action.pcm) // conn.frame_bytes
        elif isinstance(action, EndStream):
            conn.state = "ENDING"
            assert conn.session is not None
            conn.session.ended = True

    def _feed(self, call: Any, expected: object, refusal: LivemeetError | None = None) -> None:
        """Call the machine (`call()`), compare with `expected` (an action, the class Ignored,
        or a set of error classes), then do what the transport does."""
        before = (self.proto.state, self.proto.num_audio_bytes, self.proto.has_audio)
        try:
            action = call()
        except LivemeetError as exc:
            assert isinstance(expected, frozenset), (expected, exc)
            assert type(exc) in expected, (expected, exc)
            # refused whole: nothing changed
            assert (self.proto.state, self.proto.num_audio_bytes, self.proto.has_audio) == before
            self._fail(
                exc, keep=self.conn.session is not None and isinstance(exc, CLIENT_VIOLATIONS)
            )
            return
        assert not isinstance(expected, frozenset), (expected, action)
        if expected is Ignored:
            assert isinstance(action, Ignored), action
        else:
            assert action == expected, (action, expected)
        self._act(action, refusal)

    # -- the rules: while a socket is open, one weighted step (a well-behaved client most of
    # the time, so that sessions get deep; a bad frame or a server event now and then) ---

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One rule (hypothesis draws a rule, then filters by precondition: two with
        exclusive preconditions gave up on a fifth of the runs), weighted by hand."""
        state = self.conn.state
        if state == "CLOSED":
            moves = [self._connect_again] * 6 + [self._window_passes, self._poke_closed]
        elif state == "AWAITING_START":
            moves = [self._start] * 3 + [self._valid_message, self._any_text, self._any_binary]
            if self.sessions:
                moves += [self._resume] * 3
            moves += [self._server_event, self._probe, self._probe]
        else:
            moves = [self._audio] * 3 + [self._valid_message] * 3
            moves += [self._any_text, self._any_speaker_message, self._any_binary]
            moves += [self._server_event, self._probe, self._probe, self._probe]
        data.draw(st.sampled_from(moves))(data)

    def _probe(self, data: st.DataObject) -> None:
        """Any frame or server event, on a copy of the machine, the model and the server's
        sessions: checked as any step is, then the run goes on from before it. So a state
        that bad frames would end at once is tried with many of them."""
        kept = (self.proto, self.conn, self.sessions, self.num_sessions, self.last_bytes)
        self.proto, self.conn, self.sessions = copy.deepcopy(kept[:3])
        try:
            move = data.draw(
                st.sampled_from(
                    [
                        self._any_text,
                        self._any_speaker_message,
                        self._any_binary,
                        self._server_event,
                    ]
                )
            )
            move(data)
            self.check_model()
            self.one_error_at_most_and_its_close_code()
        finally:
            self.proto, self.conn, self.sessions, self.num_sessions, self.last_bytes = kept

    # -- the client ------------------------------------------------------------------------

    def _start(self, data: st.DataObject) -> None:
        """A new session's `start` (valid mostly: its refusals are `_any_text`'s), which the
        server's admission may refuse."""
        if data.draw(st.integers(0, 3)):
            rate = data.draw(st.sampled_from([16000, 48000, 44100, MIN_RATE]))
            text = new_start(rate, data.draw(st.sampled_from([1, 2, 8])))
        else:
            text = data.draw(start_messages())
        self._feed(lambda: self.proto.receive_text(text.wire), expected_text(self.conn, text),
                   data.draw(REFUSALS))  # fmt: skip

    def _resume(self, data: st.DataObject) -> None:
        """A resume's `start`: of a session the server holds (or held), with its token or
        another, mostly in its format, with the first `start`'s text fields or any."""
        by_id = sorted(self.sessions.values(), key=lambda s: s.session_id)
        held = data.draw(st.sampled_from(by_id))
        token = data.draw(st.sampled_from([held.token, held.token, held.token, "t-wrong"]))
        text: Text = data.draw(
            start_messages(resume={"session_id": held.session_id, "resume_token": token})
        )
        if data.draw(st.integers(0, 3)):  # the session's own format, as a client resends it
            message = json.loads(text.wire)
            message.update(sample_rate=held.fmt.sample_rate, channels=held.fmt.channels)
            message["encoding"] = "pcm_s16le"
            message.pop("x-note", None)
            api_key = message.get("api_key")
            if api_key is not None and not isinstance(api_key, str):
                message["api_key"] = api_key = "lm_0123456789ab_secret"
            if api_key is not None:  # white space around it dropped, empty as absent
                api_key = api_key.strip() or None
            parsed = StartSession(
                held.fmt.sample_rate, held.fmt.channels, "pcm_s16le", None, None, (),
                ResumeRequest(held.session_id, token), api_key,
            )  # fmt: skip
            text = Text("start", json.dumps(message), frozenset(), parsed)
        self._feed(lambda: self.proto.receive_text(text.wire), expected_text(self.conn, text))

    def _valid_message(self, data: st.DataObject) -> None:
        """What a well-behaved client sends in its state (after `end`: what a double click or
        a late speaker name sends)."""
        kinds = {
            "AWAITING_START": ["keepalive"],
            "STREAMING": ["finalize", "keepalive", "end", "speaker.rename", "speaker.merge"],
        }.get(self.conn.state, ["end", "finalize", "keepalive", "speaker.rename", "speaker.merge"])
        kind = data.draw(st.sampled_from(kinds))
        strategy = {
            "speaker.rename": rename_messages(valid=True),
            "speaker.merge": merge_messages(valid=True),
        }.get(kind, plain_messages(kind))
        text = data.draw(strategy)
        assert not text.faults
        self._feed(lambda: self.proto.receive_text(text.wire), expected_text(self.conn, text))

    def _audio(self, data: st.DataObject) -> None:
        """Whole sample frames of the declared format."""
        pcm = bytes(data.draw(st.integers(1, 800)) * self.conn.frame_bytes)
        expected = Ignored(len(pcm)) if self.conn.state in ENDED else AppendAudio(pcm)
        self._feed(lambda: self.proto.receive_binary(pcm), expected)

    def _any_text(self, data: st.DataObject) -> None:
        text = data.draw(TEXTS)
        self._feed(lambda: self.proto.receive_text(text.wire), expected_text(self.conn, text))

    def _any_speaker_message(self, data: st.DataObject) -> None:
        text = data.draw(st.one_of(rename_messages(), merge_messages()))
        self._feed(lambda: self.proto.receive_text(text.wire), expected_text(self.conn, text))

    def _any_binary(self, data: st.DataObject) -> None:
        size = data.draw(BINARY_SIZES)
        pcm = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
        conn = self.conn
        if size > MAX_FRAME_BYTES:
            # the WebSocket layer refuses it (1009), with no error frame: a dropped socket's
            expected_keep = kept_on_close(conn, client_left=False)
            assert self.proto.close() is expected_keep
            self._closed(MESSAGE_TOO_BIG, kept=expected_keep)
            return
        expected: object
        if conn.state in ENDED:
            expected = Ignored(size)  # not transcribed
        elif conn.state == "AWAITING_START" or size % conn.frame_bytes:
            expected = frozenset({ProtocolError})
        else:
            expected = AppendAudio(pcm)
        self._feed(lambda: self.proto.receive_binary(pcm), expected)

    def _connect_again(self, data: st.DataObject) -> None:
        self._connect()

    def _poke_closed(self, data: st.DataObject) -> None:
        """The transport feeds nothing after the close; were it to, nothing comes out."""
        text = data.draw(TEXTS)
        size = data.draw(st.integers(0, 64))
        calls: list[Callable[[], object]] = [
            lambda: self.proto.receive_text(text.wire),
            lambda: self.proto.receive_binary(bytes(size)),
        ]
        for call in calls:
            try:
                action = call()
            except ProtocolError:
                pass
            else:
                raise AssertionError(f"a closed machine returned {action!r}")
            assert self.proto.state is State.CLOSED
        assert self.proto.server_end() is False
        assert self.proto.state is State.CLOSED

    def _window_passes(self, data: st.DataObject) -> None:
        """A detached session not resumed in its window is ended as by `end`: a resume finds it
        ENDING (its final then comes)."""
        waiting = [s for s in self.sessions.values() if not s.attached and not s.ended]
        if waiting:
            data.draw(st.sampled_from(sorted(waiting, key=lambda s: s.session_id))).ended = True

    # -- the server ------------------------------------------------------------------------

    def _server_event(self, data: st.DataObject) -> None:
        conn = self.conn
        events = [self._drain, self._restart, self._fails, self._socket_goes, self._socket_goes]
        if conn.state in ENDED:
            events += [self._final, self._final, self._no_final_in_time]
        else:
            events.append(self._idle)
        if conn.session is not None:
            events += [self._storage_fails, self._taken_over]
        data.draw(st.sampled_from(events))(data)

    def _final(self, data: st.DataObject) -> None:
        """The backend's transcript.final: sent, then the close (1000, or the error owed)."""
        conn = self.conn
        assert conn.session is not None
        conn.session.finished = True
        owed = conn.owed_error
        if owed is not None:
            assert owed.close_code == DOC_CLOSE_CODES[owed.code]
            conn.errors.append(owed)
        self.proto.close()  # its final is out: nothing to keep, whatever close says
        self._closed(owed.close_code if owed is not None else NORMAL_CLOSE, kept=False)

    def _drain(self, data: st.DataObject) -> None:
        """A shutdown that drains (`--shutdown-live end`): a streaming session with audio is
        ended as by `end`; one without, or a socket with no session, gets engine_unavailable;
        an ending one is left to finish."""
        conn = self.conn
        ended = self.proto.server_end()
        assert ended is (conn.state == "STREAMING" and conn.has_audio)
        if ended:
            self._server_ends()
        elif conn.state not in ENDED:
            self._fail(EngineUnavailable("the server is shutting down"))

    def _server_ends(self) -> None:
        conn = self.conn
        conn.state = "DRAINING"
        assert conn.session is not None
        conn.session.ended = True

    def _restart(self, data: st.DataObject) -> None:
        """A restart (`--shutdown-live keep`): a streaming session, audio or not, is kept for
        the next start; a socket with no session is told to come back; an ending one gets
        its final."""
        conn = self.conn
        if conn.state == "STREAMING" and conn.session is not None:
            self._fail(ServerRestarting("restarting"), keep=True)
        elif conn.state in ("AWAITING_START", "STREAMING"):
            self._fail(ServerRestarting("restarting"))

    def _idle(self, data: st.DataObject) -> None:
        """No client message within the idle timeout (or no start): a session with audio is
        ended as by `end` and its final comes before client_timeout; else client_timeout."""
        conn = self.conn
        ended = self.proto.server_end()
        assert ended is (conn.state == "STREAMING" and conn.has_audio)
        if ended:
            self._server_ends()
            conn.owed_error = ClientTimeout("idle")
        else:
            self._fail(ClientTimeout("idle"))

    def _no_final_in_time(self, data: st.DataObject) -> None:
        self._fail(EngineUnavailable("no final transcript within 600 s of the session's end"))

    def _storage_fails(self, data: st.DataObject) -> None:
        """The journal cannot keep the session: the server ends it as by `end` (its final,
        then storage_failed); one with no audio fails at once."""
        conn = self.conn
        if conn.state == "STREAMING":
            ended = self.proto.server_end()
            assert ended is conn.has_audio
            if not ended:
                self._fail(StorageFailed("no audio to end"))
                return
            self._server_ends()
        conn.owed_error = StorageFailed("the session ended early")

    def _fails(self, data: st.DataObject) -> None:
        error = data.draw(
            st.sampled_from([EngineUnavailable("engine failed"), InternalError("bug")])
        )
        self._fail(error)

    def _taken_over(self, data: st.DataObject) -> None:
        """Another socket resumed the session: this one is told and closed (4409)."""
        self._fail(SessionTakenOver("resumed on another connection"))

    def _socket_goes(self, data: st.DataObject) -> None:
        """The socket drops (`client_left` False) or its client closes it with 1000/1001."""
        client_left = data.draw(st.booleans())
        expected_keep = kept_on_close(self.conn, client_left=client_left)
        assert self.proto.close(client_left=client_left) is expected_keep
        self._closed(None, kept=expected_keep)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def machine_matches_model(self) -> None:
        self.check_model()

    def check_model(self) -> None:
        conn = self.conn
        assert self.proto.state is State[conn.state], (self.proto.state, conn.state)
        if conn.state != "CLOSED":
            assert self.proto.has_audio is conn.has_audio
            assert self.proto.num_audio_bytes == conn.bytes_taken
            assert self.proto.num_held_frames == conn.held_frames
        assert self.proto.num_audio_bytes >= self.last_bytes, "offsets only grow"
        self.last_bytes = self.proto.num_audio_bytes

    @invariant()
    def a_close_or_a_server_end_now_does_what_the_doc_says(self) -> None:
        """Tried on copies at every step: whether a close would keep the session (a drop, or
        the client's own 1000/1001), and whether the server can end it."""
        if self.conn.state == "CLOSED":
            return
        for client_left in (False, True):
            kept = copy.deepcopy(self.proto).close(client_left=client_left)
            assert kept is kept_on_close(self.conn, client_left=client_left), client_left
        can_end = self.conn.state == "STREAMING" and self.conn.has_audio
        assert copy.deepcopy(self.proto).server_end() is can_end

    @invariant()
    def one_error_at_most_and_its_close_code(self) -> None:
        conn = self.conn
        assert len(conn.errors) <= 1
        if conn.errors:
            assert conn.state == "CLOSED"
            assert conn.close_code == conn.errors[0].close_code


TestLiveProtocolMachine = LiveProtocolMachine.TestCase
TestLiveProtocolMachine.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, derandomize=True, database=None
)


# -- one frame on a fresh machine: the payload rules, with many more examples than the
# machine above spends on them ------------------------------------------------------------

FIELD_SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None)


def _one_frame(state: str, text: Text) -> None:
    """Feed `text` to a machine in `state` (a mono 16-kHz session with audio where started)
    and compare with the model."""
    proto = LiveProtocol()
    conn = ConnectionModel()
    if state != "AWAITING_START":
        proto.receive_text(new_start(16000, 1).wire)
        proto.receive_binary(bytes(640))
        conn.state, conn.bytes_taken = "STREAMING", 640
    if state == "ENDING":
        proto.receive_text('{"type": "end"}')
        conn.state = "ENDING"
    expected = expected_text(conn, text)
    try:
        action = proto.receive_text(text.wire)
    except LivemeetError as exc:
        assert isinstance(expected, frozenset) and type(exc) in expected, (text, exc)
        assert exc.close_code == DOC_CLOSE_CODES[exc.code]
        assert proto.state is State[state]  # refused whole
        return
    assert not isinstance(expected, frozenset), (text, action)
    if expected is Ignored:
        assert isinstance(action, Ignored), action
    else:
        assert action == expected, (action, expected)


@pytest.mark.parametrize(
    ("field_name", "row"),
    [(name, row) for name, rows in START_FIELDS.items() for row in rows],
    ids=lambda v: v if isinstance(v, str) else repr(v[0])[:40],
)
def test_each_start_field_value_is_taken_or_refused_as_the_doc_says(
    field_name: str, row: Choice
) -> None:
    """Every row of the tables, the other fields valid: a fault no other field masks."""
    valid = {name: rows[0] for name, rows in START_FIELDS.items()}
    _one_frame("AWAITING_START", start_text({**valid, field_name: row}))


@pytest.mark.parametrize("name", EDGE_NAMES, ids=ascii)
@pytest.mark.parametrize("state", ["STREAMING", "ENDING"])
def test_each_edge_name_is_taken_or_refused_as_the_doc_says(state: str, name: str) -> None:
    _one_frame(state, rename_text("S01", name))


@FIELD_SETTINGS
@given(text=start_messages())
def test_a_start_is_taken_or_refused_for_its_fields_as_the_doc_says(text: Text) -> None:
    _one_frame("AWAITING_START", text)


@FIELD_SETTINGS
@given(
    state=st.sampled_from(["AWAITING_START", "STREAMING", "ENDING"]),
    text=st.one_of(rename_messages(), merge_messages()),
)
def test_a_speaker_message_is_taken_or_refused_as_the_doc_says(state: str, text: Text) -> None:
    _one_frame(state, text)


@FIELD_SETTINGS
@given(state=st.sampled_from(["AWAITING_START", "STREAMING", "ENDING"]), text=TEXTS)
def test_any_text_frame_is_taken_or_refused_as_the_doc_says(state: str, text: Text) -> None:
    _one_frame(state, text)


# -- finalize's place and resume's offset: the protocol machine over a real session holder --
#
# The doc's client ("Resume"): it keeps the audio since its last `audio.ack` and the place of
# every `finalize` it sent (the sample frames sent before it) until a `session.ready` says the
# session holds it (at or before `finalize_offset`); on a resume it sends its audio on from
# `offset` and each kept finalize again at its place (at once where that is `offset`). The
# server: a `finalize` at or before the last place the session holds is a repeat that does
# nothing; its journal holds audio and finalizes only once a commit reports them; a crash
# loses the rest and the restart rebuilds the session from what the journal held. Checked:
# the backend gets each frame once, in order, and cuts exactly at the places the server was
# sent (repeats and resends cut nothing twice), no place lies between `finalize_offset` and
# `offset` (where the client could not send it again at its place), acknowledged offsets only
# grow, and once the client has sent everything, the cuts are the client's places, none lost.
# (The journal is a stand-in that commits when told; the restart repeats what
# LiveSessions._rebuild does with a journal's session. No crash after `end`: the rebuild would
# end the session again, which this backend does not model.)

RATE = 16000  # no resampler: the backend's samples are the client's frames, one to one
FRAME_VALUES = 32749  # frame i holds the value i % FRAME_VALUES in every channel


def timeline(start: int, end: int, channels: int) -> bytes:
    """The client's frames [start, end), PCM16 LE."""
    values = np.repeat(np.arange(start, end) % FRAME_VALUES, channels).astype("<i2")
    return values.tobytes()


class RecordingSession:
    """A backend session that records what it is given: the samples (as PCM16 values) and the
    sample count at each finalize. It writes no events."""

    def __init__(self, session_id: str) -> None:
        self._id = session_id
        self.values: list[int] = []
        self.cuts: list[int] = []
        self.num_ends = 0

    @property
    def id(self) -> str:
        return self._id

    async def append(self, samples: Samples) -> None:
        self.values += np.rint(samples * 32768).astype(int).tolist()

    async def finalize(self) -> None:
        self.cuts.append(len(self.values))

    async def end(self) -> None:
        self.num_ends += 1

    async def merge_speakers(self, speaker: str, into: str) -> None:
        raise AssertionError("not used")

    async def abort(self) -> None:
        pass

    async def events(self) -> AsyncIterator[Event]:
        await asyncio.Event().wait()  # none, ever: the pump waits until it is cancelled
        yield  # type: ignore[misc]  # an async generator


@dataclass
class Disk:
    """What the journal holds on disk for the session: its audio and its finalizes' places."""

    pcm: bytearray = field(default_factory=bytearray)
    frames: int = 0
    finalizes: list[int] = field(default_factory=list)


class ControlledJournal:
    """The live journal as the session holder uses it, committing only when told (`commit`):
    what is queued and not committed is what a crash loses."""

    def __init__(self, disk: Disk, frame_bytes: int) -> None:
        self.disk = disk
        self.frame_bytes = frame_bytes
        self.queued_frames = disk.frames
        self.queue: collections.deque[tuple[str, Any, Any]] = collections.deque()

    def append_audio(self, session_id: str, pcm: bytes) -> None:
        self.queued_frames += len(pcm) // self.frame_bytes
        self.queue.append(("audio", bytes(pcm), self.queued_frames))

    def add_finalize(self, session_id: str, frames: int) -> asyncio.Future[None]:
        assert frames == self.queued_frames, "a finalize is queued after the audio before it"
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.append(("finalize", frames, done))
        return done

    def mark_ended(self, session_id: str) -> None:
        pass

    def commit(self, num_entries: int, holder: LiveSessionHolder) -> None:
        """The writer's next group commit holds the first `num_entries` queued entries; it
        reports the audio durable, then the finalizes held."""
        done = []
        for _ in range(min(num_entries, len(self.queue))):
            kind, value, extra = self.queue.popleft()
            if kind == "audio":
                self.disk.pcm += value
                self.disk.frames = extra
            else:
                if not self.disk.finalizes or self.disk.finalizes[-1] != value:
                    self.disk.finalizes.append(value)
                done.append(extra)
        holder.durable(self.disk.frames)
        for future in done:
            future.set_result(None)


class Socket:
    """The transport's side the holder calls (live_holder.EventSink): nothing to send here."""

    def attached(self, holder: LiveSessionHolder, replay: list[Any], resumed: bool) -> None:
        pass

    def deliver(self, event: Any) -> None:
        pass

    def take_over(self) -> asyncio.Task[None]:
        raise AssertionError("one socket at a time")

    def audio_durable(self) -> None:
        pass

    def storage_failed(self, error: StorageFailed) -> bool:
        raise AssertionError("the journal does not fail here")


@dataclass(frozen=True)
class Sent:
    """A client message on its way: audio frames [start, end), or a `finalize` at `start`, or
    `end`."""

    kind: str
    start: int = 0
    end: int = 0


class FinalizeResumeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.holders: list[LiveSessionHolder] = []

    def teardown(self) -> None:
        for holder in self.holders:
            holder.pump.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    def run(self, work: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(work)

    @initialize(channels=st.sampled_from([1, 2]))
    def open_session(self, channels: int) -> None:
        self.fmt = AudioFormat(RATE, channels, "pcm_s16le")
        self.disk = Disk()
        self._new_holder()
        # the client
        self.total = 0  # frames it has made
        self.sent = 0  # the place: frames sent on the current path
        self.acked = 0  # the last offset it was told is held (an ack, a session.ready)
        self.kept: list[int] = []  # places of finalizes it sent, not yet known held
        self.resend: list[int] = []  # of those, places still to send again (after a resume)
        self.places: list[int] = []  # every place it sent a finalize at
        self.wire: collections.deque[Sent] = collections.deque()
        self.end_sent = False
        self.socket: Socket | None = None
        self._connect(resume=False)
        # the server, as the model has it: the cuts of the current backend session
        self.cuts: list[int] = []
        self.durable_seen = 0

    def _new_holder(self) -> None:
        session = RecordingSession(f"s-{len(self.holders)}")
        self.journal = ControlledJournal(self.disk, self.fmt.frame_bytes)

        async def make() -> LiveSessionHolder:
            return LiveSessionHolder(
                cast(TranscriberSession, session),
                PcmStreamDecoder(RATE, self.fmt.channels),
                self.fmt,
                SessionTokens.new(),
                lambda _: None,
                session_id="s-1",
                journal=cast(LiveJournal, self.journal),
            )

        self.holder = self.run(make())
        self.backend = session
        self.holders.append(self.holder)

    def _connect(self, *, resume: bool) -> None:
        self.proto = LiveProtocol()
        message: dict[str, Any] = {"type": "start", "sample_rate": RATE}
        message["channels"] = self.fmt.channels
        if resume:
            message["resume"] = {"session_id": "s-1", "resume_token": "t"}
        assert isinstance(self.proto.receive_text(json.dumps(message)), StartSession)
        socket = Socket()
        holder = self.holder

        async def attach() -> None:
            async with holder.lock:
                holder.attach(socket, resumed=resume)

        self.run(attach())
        self.socket = socket
        offset, finalize_offset = holder.client_offset, holder.finalize_offset
        if resume:
            self.proto.resumed(holder.num_frames_accepted, ended=holder.ended)
            assert self.proto.state is (State.ENDING if holder.ended else State.STREAMING)
            # an `end` lost with the socket is sent again, once the audio before it is
            self.end_sent = holder.ended
        # the client reads session.ready
        assert self.acked <= offset <= self.total, (self.acked, offset, self.total)
        held = -1 if finalize_offset is None else finalize_offset
        between = [p for p in self.kept if held < p < offset]
        assert not between, f"finalizes at {between}: after finalize_offset {held}, before {offset}"
        self.kept = [p for p in self.kept if p > held]
        self.resend = list(self.kept)
        self.acked = self.sent = offset
        self._send_due_finalizes()

    def _send_due_finalizes(self) -> None:
        while self.resend and self.resend[0] == self.sent:
            self.wire.append(Sent("finalize", self.resend.pop(0)))

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One rule, weighted by hand: the client streams, finalizes and is read far more
        often than sockets drop or the server crashes."""
        moves = []
        if self.journal.queue:
            moves += [self._commit] * 2
        if self.socket is None:
            moves += [self._resume] * 4
        else:
            moves += [self._ack, self._drop] + [self._read] * 4
            if not self.end_sent and self.disk.frames > 0:
                moves.append(self._crash)  # (after `end` the rebuild would end it again)
            if not self.end_sent:
                moves += [self._audio] * 4
                if self.sent == self.total and not self.resend:
                    moves += [self._finalize] * 3
            if self.sent == self.total > 0 and not self.resend:
                if self.proto.state is State.STREAMING and not self.end_sent:
                    moves.append(self._end)
        data.draw(st.sampled_from(moves))(data)

    # -- the client ----------------------------------------------------------------------

    def _audio(self, data: st.DataObject) -> None:
        """Its backlog first (up to the next finalize to send again), then new audio."""
        num_frames = data.draw(st.integers(1, 400))
        if self.sent < self.total:
            stop = min(self.sent + num_frames, self.total, *self.resend[:1])
        else:
            stop = self.total = self.sent + num_frames
        self.wire.append(Sent("audio", self.sent, stop))
        self.sent = stop
        self._send_due_finalizes()

    def _finalize(self, data: st.DataObject) -> None:
        """A push-to-talk release, say: at the place it has reached."""
        self.wire.append(Sent("finalize", self.sent))
        self.places.append(self.sent)
        if not self.kept or self.kept[-1] != self.sent:
            self.kept.append(self.sent)

    def _end(self, data: st.DataObject) -> None:
        self.wire.append(Sent("end"))
        self.end_sent = True

    def _read(self, data: st.DataObject) -> None:
        num_messages = data.draw(st.integers(1, 4))
        for _ in range(min(num_messages, len(self.wire))):
            self._deliver(self.wire.popleft())

    def _deliver(self, message: Sent) -> None:
        holder, socket = self.holder, self.socket
        assert socket is not None
        action: object
        if message.kind == "audio":
            pcm = timeline(message.start, message.end, self.fmt.channels)
            action = self.proto.receive_binary(pcm)
            if self.proto.state is State.STREAMING:
                assert action == AppendAudio(pcm)
                assert holder.client_offset == message.start
                self.run(holder.append(socket, pcm))
            else:
                assert action == Ignored(len(pcm))
        elif message.kind == "finalize":
            action = self.proto.receive_text('{"type": "finalize"}')
            if self.proto.state is State.STREAMING:
                assert action == Finalize()
                assert holder.client_offset == message.start
                self.run(holder.finalize(socket))
                if not self.cuts or message.start > self.cuts[-1]:
                    self.cuts.append(message.start)  # else a repeat: the same cut
            else:
                assert isinstance(action, Ignored)
        else:
            action = self.proto.receive_text('{"type": "end"}')
            if self.proto.state is State.ENDING and isinstance(action, EndStream):
                self.run(holder.end(socket))
            else:
                assert isinstance(action, Ignored)

    # -- the server ------------------------------------------------------------------------

    def _commit(self, data: st.DataObject) -> None:
        self.journal.commit(data.draw(st.integers(1, 6)), self.holder)
        self.run(asyncio.sleep(0))  # the finalizes' done callbacks

    def _ack(self, data: st.DataObject) -> None:
        """An `audio.ack`: what the journal reported durable, of what the client sent."""
        self.acked = max(self.acked, self.holder.num_frames_durable)

    def _drop(self, data: st.DataObject) -> None:
        """What was on its way is lost; the session is kept for a resume."""
        self.wire.clear()
        assert self.proto.close() is True
        self.holder.sink = None  # LiveSessions.disconnect
        self.socket = None

    def _crash(self, data: st.DataObject) -> None:
        """A kill: what the journal did not commit is lost. The restart rebuilds the session
        from the journal as LiveSessions._rebuild does: its finalizes' places, then its audio
        fed with a cut at each."""
        self.wire.clear()
        self.socket = None
        old = self.holder
        old.pump.cancel()
        self._new_holder()
        holder = self.holder
        holder.finalizes = list(self.disk.finalizes)
        holder.finalize_durable = self.disk.finalizes[-1] if self.disk.finalizes else None
        chunk = 4096 // self.fmt.frame_bytes * self.fmt.frame_bytes

        async def stored() -> AsyncIterator[bytes]:
            for i in range(0, len(self.disk.pcm), chunk):
                yield bytes(self.disk.pcm[i : i + chunk])

        self.run(holder.replay_audio(stored()))
        self.cuts = list(self.disk.finalizes)

    def _resume(self, data: st.DataObject) -> None:
        self._connect(resume=True)

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def the_backend_has_each_frame_once_and_cuts_at_the_places(self) -> None:
        holder, backend = self.holder, self.backend
        accepted = holder.num_frames_accepted
        assert backend.values == (np.arange(accepted) % FRAME_VALUES).tolist()
        assert backend.cuts == self.cuts
        assert holder.finalizes == self.cuts
        assert backend.num_ends == holder.ended  # one `end` however often the client sent it

    @invariant()
    def offsets_only_grow(self) -> None:
        durable = self.holder.num_frames_durable
        assert durable >= self.durable_seen
        self.durable_seen = durable
        assert self.acked <= durable <= self.holder.num_frames_accepted
        # `finalize_offset`: where the last finalize the session holds on disk came
        offset = self.holder.finalize_offset
        assert offset is None or offset in self.disk.finalizes, (offset, self.disk.finalizes)

    @invariant()
    def once_all_is_sent_no_finalize_is_lost(self) -> None:
        if self.socket is None or self.wire or self.sent < self.total or self.resend:
            return
        assert self.cuts == sorted(set(self.places))


TestFinalizeResumeMachine = FinalizeResumeMachine.TestCase
TestFinalizeResumeMachine.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None, derandomize=True, database=None
)
