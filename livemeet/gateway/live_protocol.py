"""The live WebSocket protocol v0 (docs/protocol.md) as a Sans-I/O state machine.

No sockets, no asyncio: the transport (ws_live.py) feeds each received frame to
`receive_text()` / `receive_binary()` and acts on the typed action returned. Violations raise
`ProtocolError` (message out of order, unknown type, misaligned PCM) or `InvalidRequest`
(bad JSON, bad field types), changing nothing (a frame is refused whole); the transport
renders them and closes the socket, keeping the session as after a dropped one.

States: AWAITING_START -> (start) -> STREAMING -> (end) -> ENDING -> CLOSED; a server that
shuts down ends a STREAMING session itself (`server_end`) -> DRAINING. Once a session is ended
either way, what the client still sends is ignored (`Ignored`), not an error that would close
the socket before the final transcript: a double-clicked stop sends `end` twice, and a
recorder's last audio buffer can race its `end`. The final says how much audio it covers.
Two messages stay meaningful after `end`: `speaker.rename` and `speaker.merge` (a user names
or merges the speakers while the final is on its way, and the stored transcript carries
them), so a valid one is a `SpeakerRename` or `SpeakerMerge` until the socket closes; a
malformed one is then `Ignored` as the rest is, since closing with an error would lose the
final.

Speakers: `speaker.rename` names a label (`S01`) for display; labels are never renumbered
(DESIGN 5.6), so segments keep their label and a name is a layer over it. The server answers
every rename with `speaker.renamed` (`SpeakerRenamed`), to the session's client and its
captions subscribers. `speaker.merge` says two labels are one speaker ("S03 is S01"): the
session writes no new segment with the merged-away label, and answers `speaker.merged`
(`SpeakerMerged`) the same way. Whether a merge is one the session can make (labels it has
shown, no cycle) is the session's to say (gateway/live_sessions.py); here only its form.

Resume (docs/protocol.md, "Resume"): a `start` carrying `resume` asks for a session that an
earlier socket left (`ResumeRequest`); the transport looks it up, then tells the protocol what
the session holds (`resumed`). A socket that goes away keeps its session for a resume only
from STREAMING, ENDING or DRAINING (`close()` says so), and not after an error that ends the
session (`fail`; a client's violation is not one: its session is kept). `AckPolicy` decides when
`audio.ack` is due.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from livemeet.audio.constants import (
    MAX_HOTWORD_CHARS,
    MAX_HOTWORDS,
    MAX_LANGUAGE_CHARS,
    MAX_PCM_CHANNELS,
    MAX_PCM_SAMPLE_RATE,
    MAX_PROMPT_CHARS,
    MAX_RESUME_FIELD_CHARS,
    MAX_SPEAKER_NAME_CHARS,
    MIN_PCM_SAMPLE_RATE,
    PCM_S16LE_BYTES,
)
from livemeet.errors import BadAudio, InvalidRequest, LivemeetError, ProtocolError
from livemeet.transcript.language import check_language_tag
from livemeet.transcript.parser import MAX_SPEAKER_CHARS, is_speaker_label

PROTOCOL_VERSION = 0
LIVE_PATH = "/v1/live"  # the protocol's endpoint (docs/protocol.md): the gateway's route
NORMAL_CLOSE = 1000  # RFC 6455 section 7.4.1: after `transcript.final`
GOING_AWAY = 1001  # RFC 6455 section 7.4.1: after a final the server's shutdown drained
# a client's own close frame with either code says it left on purpose (1001: a browser tab
# closed or navigated away); a session with no audio then goes at once (`close`)
CLIENT_LEFT_CLOSES = (NORMAL_CLOSE, GOING_AWAY)
# IANA's registry ("Service Restart"): the server stops to start again and keeps the session
# for a resume there (errors.ServerRestarting)
SERVICE_RESTART = 1012
PCM_ENCODING = "pcm_s16le"
BYTES_PER_SAMPLE = PCM_S16LE_BYTES
MIN_SAMPLE_RATE = MIN_PCM_SAMPLE_RATE
MAX_SAMPLE_RATE = MAX_PCM_SAMPLE_RATE
MAX_CHANNELS = MAX_PCM_CHANNELS
# Unicode categories a speaker name (and an API key's name) may not hold: controls (a newline
# would end an SRT cue), line and paragraph separators (the same, to a subtitle player), and
# lone surrogates (JSON's "\ud800" decodes to one, and it cannot be written back as UTF-8)
NAME_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
# bidirectional embeddings, overrides and isolates (Unicode UAX #9, section 2.1-2.4): one left
# open in a name reorders the rest of the line it is shown on (U+202E turns a caption around)
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# Unicode general categories that show as something: letters, digits and other numbers,
# punctuation, symbols (a name of only spaces, marks or format characters, U+200B say, shows
# as nothing)
VISIBLE_CATEGORY_CLASSES = frozenset("LNPS")
# a lone UTF-16 surrogate: what JSON's `\ud800` escape decodes to when no pair follows. A text
# frame is valid UTF-8 (the WebSocket layer checks), so only such an escape brings one in
_SURROGATE = re.compile("[\ud800-\udfff]")


def shows(ch: str) -> bool:
    """Whether the code point `ch` shows as something: its category is one of
    VISIBLE_CATEGORY_CLASSES, or it is unassigned in this Python's Unicode database (Cn) and
    not a noncharacter. A browser knows a later Unicode than the server's Python (17 against
    3.11's 14 in a trial): an emoji assigned since, a name the page let through, is Cn here,
    and a name of only such emoji was refused mid-meeting. Noncharacters (U+FDD0-FDEF and the
    last two of every plane) are never assigned."""
    category = unicodedata.category(ch)
    if category[0] in VISIBLE_CATEGORY_CLASSES:
        return True
    code = ord(ch)
    noncharacter = 0xFDD0 <= code <= 0xFDEF or code & 0xFFFE == 0xFFFE
    return category == "Cn" and not noncharacter


def name_problem(name: str) -> str | None:
    """What `name` (a speaker's or an API key's, stripped) holds that a display must not
    show, as the end of "may not hold ..."; None when it holds nothing such."""
    if any(unicodedata.category(ch) in NAME_FORBIDDEN_CATEGORIES for ch in name):
        return "control characters or line breaks"
    if any(ch in BIDI_CONTROLS for ch in name):
        return "bidirectional embedding, override or isolate characters (U+202A-202E, U+2066-2069)"
    return None


class State(StrEnum):
    """Where a connection is in protocol v0 (`LiveProtocol.state`): AWAITING_START until
    `start`, STREAMING until `end` (ENDING) or a server-side end (DRAINING), CLOSED at last."""

    AWAITING_START = "awaiting_start"
    STREAMING = "streaming"
    ENDING = "ending"
    # ended by the server (shutdown, or an idle client: ws_live): the client's frames are ignored
    DRAINING = "draining"
    CLOSED = "closed"


# ended by the client (`end`) or the server (shutdown): the final transcript is on its way
_ENDED = (State.ENDING, State.DRAINING)


@dataclass(frozen=True)
class ResumeRequest:
    """`start`'s `resume`: take up the session `session_id` again, proven by its token."""

    session_id: str
    # kept out of repr, as `start`'s api_key: it takes the session over, so never into a log
    resume_token: str = field(repr=False)


@dataclass(frozen=True)
class AudioFormat:
    """What a session's binary frames hold; a resume must declare the session's own."""

    sample_rate: int
    channels: int
    encoding: str

    @property
    def frame_bytes(self) -> int:
        """Bytes per sample frame: a PCM16 sample of every channel."""
        return self.channels * BYTES_PER_SAMPLE


@dataclass(frozen=True)
class StartSession:
    """`start`: open a session for audio at `sample_rate` Hz with `channels` interleaved, or,
    with `resume`, take up an earlier socket's session (its options are the session's own:
    the new `start`'s language, prompt and hotwords are not used)."""

    sample_rate: int
    channels: int
    encoding: str
    language: str | None
    prompt: str | None
    hotwords: tuple[str, ...]
    resume: ResumeRequest | None = None
    # the session's API key, for a client that cannot set the upgrade's headers (a browser);
    # kept out of repr: a key must never reach a log
    api_key: str | None = field(default=None, repr=False)

    @property
    def audio_format(self) -> AudioFormat:
        return AudioFormat(self.sample_rate, self.channels, self.encoding)


def require_same_format(held: AudioFormat, declared: AudioFormat) -> None:
    """A resume's `start` must declare the session's audio format: the offsets (sample frames
    at the client's rate) and the session's resampler are the original's. Raises
    InvalidRequest naming each field that differs."""
    diffs = [
        f"{name} {getattr(declared, name)!r} (the session's is {getattr(held, name)!r})"
        for name in ("sample_rate", "channels", "encoding")
        if getattr(declared, name) != getattr(held, name)
    ]
    if diffs:
        raise InvalidRequest(
            "a resume must declare the session's audio format: " + ", ".join(diffs)
        )


@dataclass(frozen=True)
class AppendAudio:
    """A binary frame: PCM16 LE, whole sample frames (`len(pcm) % (2 * channels) == 0`)."""

    pcm: bytes


@dataclass(frozen=True)
class Finalize:
    """`finalize`: commit everything heard so far; the session stays open."""


@dataclass(frozen=True)
class EndStream:
    """`end`: no more audio; the server answers with `transcript.final`, then closes."""


@dataclass(frozen=True)
class KeepAlive:
    """`keepalive`: resets the idle timer; no other effect."""


@dataclass(frozen=True)
class SpeakerRename:
    """`speaker.rename`: show `speaker` (a label such as "S01") as `name` from now on; `name`
    None removes the label's name. `name` is stripped, 1..MAX_SPEAKER_NAME_CHARS characters."""

    speaker: str
    name: str | None


@dataclass(frozen=True)
class SpeakerRenamed:
    """The server's `speaker.renamed`: `speaker` is shown as `name` (None: as its label).
    Not a backend event: the gateway makes it from a client's `SpeakerRename`."""

    speaker: str
    name: str | None

    def to_wire(self) -> dict[str, object]:
        """The JSON object of the frame (docs/protocol.md, Server to client)."""
        return {"type": "speaker.renamed", "speaker": self.speaker, "name": self.name}


@dataclass(frozen=True)
class SpeakerMerge:
    """`speaker.merge`: the label `speaker` is the same person as the label `into`; segments
    from now on show `into` (resolved: a label merged away already stands for its target)."""

    speaker: str
    into: str


@dataclass(frozen=True)
class SpeakerMerged:
    """The server's `speaker.merged`: `speaker` shows as `into` (a label not merged away
    when this was sent; merging `into` later moves `speaker` with it). Not a backend event:
    the gateway makes it from a client's `SpeakerMerge`."""

    speaker: str
    into: str

    def to_wire(self) -> dict[str, object]:
        """The JSON object of the frame (docs/protocol.md, Server to client)."""
        return {"type": "speaker.merged", "speaker": self.speaker, "into": self.into}


@dataclass(frozen=True)
class Ignored:
    """A frame that arrived after the session was ended (ENDING, DRAINING): no effect;
    `audio_bytes` of PCM it held are not transcribed; `reason`, where there is one worth a
    log line (a malformed `speaker.rename` or `speaker.merge`)."""

    audio_bytes: int = 0
    reason: str = ""


Action = (
    StartSession
    | AppendAudio
    | Finalize
    | EndStream
    | KeepAlive
    | SpeakerRename
    | SpeakerMerge
    | Ignored
)


class LiveProtocol:
    """The client side of protocol v0 as seen by the server: validates order and payloads.

    Counters: `num_audio_bytes` (PCM bytes accepted on this connection), `num_audio_frames`
    (sample frames), `num_held_frames` (sample frames a resumed session held before it).
    """

    def __init__(self) -> None:
        self.state = State.AWAITING_START
        self.channels = 1
        self.sample_rate = 0
        self.num_audio_bytes = 0
        self.num_held_frames = 0
        self._failed = False

    @property
    def has_audio(self) -> bool:
        """Whether the session has any audio (this connection's, or a resumed session's)."""
        return self.num_audio_bytes > 0 or self.num_held_frames > 0

    @property
    def num_audio_frames(self) -> int:
        return self.num_audio_bytes // (BYTES_PER_SAMPLE * self.channels)

    def audio_seconds(self, num_bytes: int) -> float:
        """Seconds of audio in `num_bytes` of this session's PCM (0 before `start`)."""
        if not self.sample_rate:
            return 0.0
        return num_bytes / (BYTES_PER_SAMPLE * self.channels * self.sample_rate)

    def receive_text(self, text: str) -> Action:
        """Parse one JSON text frame. Raises InvalidRequest (bad JSON/fields), ProtocolError."""
        self._check_open()
        if self.state in _ENDED:
            return _receive_after_end(text)
        message = _parse_json_object(text)
        kind = message.get("type")
        if not isinstance(kind, str):
            raise InvalidRequest("every message needs a string 'type' field")
        if kind == "keepalive":
            return KeepAlive()
        if kind in _SPEAKER_PARSERS:
            self._require(State.STREAMING, kind)
            return _SPEAKER_PARSERS[kind](message)
        if kind == "start":
            return self._receive_start(message)
        if kind == "finalize":
            self._require(State.STREAMING, "finalize")
            return Finalize()
        if kind == "end":
            self._require(State.STREAMING, "end")
            if not self.has_audio:
                raise ProtocolError("'end' before any audio: send audio frames first")
            self.state = State.ENDING
            return EndStream()
        raise ProtocolError(f"unknown message type {kind!r}")

    def receive_binary(self, data: bytes) -> AppendAudio | Ignored:
        """Accept one PCM16 LE frame. Raises ProtocolError out of order or misaligned, having
        taken none of it."""
        self._check_open()
        if self.state in _ENDED:
            return Ignored(len(data))
        if self.state is State.AWAITING_START:
            raise ProtocolError("audio before 'start': send a start message first")
        frame_bytes = BYTES_PER_SAMPLE * self.channels
        if len(data) % frame_bytes:
            raise ProtocolError(
                f"binary frame of {len(data)} bytes is not a whole number of "
                f"{frame_bytes}-byte PCM16 sample frames"
            )
        self.num_audio_bytes += len(data)
        return AppendAudio(bytes(data))

    def server_end(self) -> bool:
        """The server ends the session (shutting down, or the client went idle): end a
        STREAMING session that has audio as the client's `end` would (-> DRAINING; True: the
        transport ends the backend session). In
        any other state nothing changes (False): ENDING already ends, and a session without
        audio has nothing to transcribe."""
        if self.state is not State.STREAMING or not self.has_audio:
            return False
        self.state = State.DRAINING
        return True

    def resumed(self, held_frames: int, *, ended: bool) -> None:
        """The `start` was a resume and the session was found: it holds `held_frames` sample
        frames (they count as audio for `end`); `ended`: the session was ended already (its
        `end` came, or its resume window ran out), so it is ENDING and the client's frames
        are ignored."""
        assert self.state is State.STREAMING, "resumed() follows a resume's start"
        self.num_held_frames = held_frames
        if ended:
            self.state = State.ENDING

    def fail(self) -> None:
        """The server sent an error that ends the session and closes: the session is not kept
        for a resume."""
        self._failed = True
        self.state = State.CLOSED

    def close(self, *, client_left: bool = False) -> bool:
        """The connection is gone (either side); every later frame is a ProtocolError.
        Returns whether the session is kept for a resume: the socket went while the client
        streamed or waited for its final, with no error sent: STREAMING, ENDING, and DRAINING
        (the server ended it: a shutdown, which waits for its final, or an idle client, whose
        socket typically dies before the final is out: a laptop lid closed); a session never
        started is not, nor one with no audio that the client closed itself (`client_left`: its
        close frame was one of CLIENT_LEFT_CLOSES): nothing to resume, and it held a
        --max-sessions slot for the resume window (a client stopped before its first frame, a
        tab closed before the microphone gave audio: session 37's trials)."""
        keep = self.state in (State.STREAMING, State.ENDING, State.DRAINING) and not self._failed
        if client_left and self.state is State.STREAMING and not self.has_audio:
            keep = False
        self.state = State.CLOSED
        return keep

    def _receive_start(self, message: dict[str, Any]) -> StartSession:
        if self.state is not State.AWAITING_START:
            raise ProtocolError("a second 'start' on one connection")
        start = _parse_start(message)
        self.state = State.STREAMING
        self.channels = start.channels
        self.sample_rate = start.sample_rate
        return start

    def _require(self, state: State, what: str) -> None:
        if self.state is not state:
            raise ProtocolError(f"{what!r} is not allowed in state {self.state.value}")

    def _check_open(self) -> None:
        if self.state is State.CLOSED:
            raise ProtocolError("the connection is closed")


@dataclass
class AckPolicy:
    """When a connection sends `audio.ack {offset}` (docs/protocol.md): coalesced, at most
    one per `interval_s`, and at most `interval_s` after audio was accepted; offsets only
    grow. Times are the caller's monotonic clock (s).

    The transport calls `audio_accepted(now_s)` after each frame the session took: it returns
    the time an ack is due when a timer must be armed (None: one is armed already). When the
    timer fires, and before `transcript.final`, `take(held_frames)` returns the offset to
    send, or None when the client was told as much already.
    """

    interval_s: float
    acked: int = 0  # sample frames the client was last told (`session.ready`'s offset first)
    due_at_s: float | None = None  # when the armed ack fires; None: none armed

    def audio_accepted(self, now_s: float) -> float | None:
        """Audio was accepted at `now_s` (s): the time an ack is due, when a timer must be
        armed for it; None while one is armed already."""
        if self.due_at_s is not None:
            return None
        self.due_at_s = now_s + self.interval_s
        return self.due_at_s

    def take(self, held_frames: int) -> int | None:
        """The ack's offset for a session holding `held_frames` sample frames, or None when
        the client was told that already; disarms the timer."""
        self.due_at_s = None
        if held_frames <= self.acked:
            return None
        self.acked = held_frames
        return held_frames


def _receive_after_end(text: str) -> SpeakerRename | SpeakerMerge | Ignored:
    """A text frame after the session was ended: a valid `speaker.rename` or `speaker.merge`
    still applies (the names and merges go into the final transcript); anything else, a
    malformed one included, is ignored: an error would close the socket before the final."""
    try:
        message = _parse_json_object(text)
    except InvalidRequest:
        return Ignored()
    kind = message.get("type")
    # a `type` that is not a string (a list, an object) cannot be looked up: a TypeError here
    # closed the socket with internal_error and dropped the session, its final with it
    if not isinstance(kind, str) or kind not in _SPEAKER_PARSERS:
        return Ignored()
    try:
        return _SPEAKER_PARSERS[kind](message)
    except LivemeetError as exc:
        return Ignored(reason=f"{kind}: {exc.message}")


def _label_field(m: dict[str, Any], field_name: str) -> str:
    """`m[field_name]`, a speaker label as segments carry it. Raises InvalidRequest."""
    label = m.get(field_name)
    if not isinstance(label, str) or not is_speaker_label(label):
        raise InvalidRequest(
            f"'{m['type']}' needs '{field_name}', a label as segments carry it: \"S\" and "
            f'digits, at most {MAX_SPEAKER_CHARS} characters ("S01"), not {label!r}'
        )
    return label


def _parse_merge(m: dict[str, Any]) -> SpeakerMerge:
    return SpeakerMerge(_label_field(m, "speaker"), _label_field(m, "into"))


def _parse_rename(m: dict[str, Any]) -> SpeakerRename:
    speaker = _label_field(m, "speaker")
    if "name" not in m:
        raise InvalidRequest("'speaker.rename' needs 'name': a string, or null to remove it")
    name = m["name"]
    if name is None:
        return SpeakerRename(speaker, None)
    if not isinstance(name, str):
        raise InvalidRequest(f"'name' must be a string or null, not {name!r}")
    name = name.strip()
    if not 0 < len(name) <= MAX_SPEAKER_NAME_CHARS:
        raise InvalidRequest(
            f"'name' must hold 1..{MAX_SPEAKER_NAME_CHARS} characters once stripped "
            "(null removes a name)"
        )
    if (problem := name_problem(name)) is not None:
        raise InvalidRequest(f"'name' may not hold {problem}")
    if not any(shows(ch) for ch in name):
        raise InvalidRequest(
            "'name' must hold a visible character (a letter, digit, punctuation or symbol)"
        )
    return SpeakerRename(speaker, name)


# the speaker messages, valid while STREAMING and after `end` (module docstring)
_SPEAKER_PARSERS: dict[str, Callable[[dict[str, Any]], SpeakerRename | SpeakerMerge]] = {
    "speaker.rename": _parse_rename,
    "speaker.merge": _parse_merge,
}


def _parse_json_object(text: str) -> dict[str, Any]:
    try:
        message = json.loads(text)
    except json.JSONDecodeError as exc:
        # exc.pos alone ("at 31") read as nothing a client could find; say what it counts
        raise InvalidRequest(
            f"text frame is not valid JSON: {exc.msg} at character {exc.pos} "
            f"(line {exc.lineno}, column {exc.colno})"
        ) from exc
    except RecursionError as exc:  # e.g. "[[[[..." thousands deep
        raise InvalidRequest("text frame nests JSON too deeply") from exc
    except ValueError as exc:  # an integer of over 4,300 digits (int's str limit)
        # not str(exc): it tells the client to call sys.set_int_max_str_digits() (a trial)
        raise InvalidRequest("text frame holds a JSON number too long to read") from exc
    if not isinstance(message, dict):
        raise InvalidRequest("a text frame must be a JSON object")
    if "\\u" in text and _holds_lone_surrogate(message):
        # no UTF-8 writer takes one: a prompt holding one failed the live journal's group
        # commit, and with it every live session on the server (a security review)
        raise InvalidRequest(
            "text frame holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape): "
            "not Unicode text"
        )
    return message


def _holds_lone_surrogate(value: object) -> bool:
    """Whether a parsed JSON value holds a lone surrogate in any string, keys included
    (iterative: the value may nest as deep as the JSON parser went)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list):
            pending += item
    return False


def _parse_resume(m: dict[str, Any]) -> ResumeRequest | None:
    resume = m.get("resume")
    if resume is None:
        return None
    if not isinstance(resume, dict):
        raise InvalidRequest("'resume' must be an object with 'session_id' and 'resume_token'")
    session_id, token = resume.get("session_id"), resume.get("resume_token")
    for value in (session_id, token):
        if not isinstance(value, str) or not 0 < len(value) <= MAX_RESUME_FIELD_CHARS:
            raise InvalidRequest(
                "'resume' needs the strings 'session_id' and 'resume_token' (1.."
                f"{MAX_RESUME_FIELD_CHARS} characters each), as `session.ready` gave them"
            )
    assert isinstance(session_id, str) and isinstance(token, str)
    return ResumeRequest(session_id, token)


def _parse_start(m: dict[str, Any]) -> StartSession:
    sample_rate = _int_field(m, "sample_rate", None)
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise BadAudio(
            f"sample_rate {sample_rate} Hz outside {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz"
        )
    channels = _int_field(m, "channels", 1)
    if not 1 <= channels <= MAX_CHANNELS:
        raise BadAudio(f"channels must be in 1..{MAX_CHANNELS}, not {channels}")
    encoding = m.get("encoding")
    encoding = PCM_ENCODING if encoding is None else encoding
    if encoding != PCM_ENCODING:
        raise InvalidRequest(f"encoding must be {PCM_ENCODING!r}, not {encoding!r}")
    resume = _parse_resume(m)
    # a resume's are not read (the session's own are kept), so not checked either: a client
    # resending its first `start` across an upgrade that tightened a rule, as `livemeet
    # stream` does, lost its meeting to a 4400 (a trial)
    text = _parse_request_text(m) if resume is None else (None, None, [])
    language, prompt, hotwords = text
    return StartSession(
        sample_rate,
        channels,
        encoding,
        language,
        prompt,
        tuple(hotwords),
        resume,
        _parse_api_key(m),
    )


def _parse_request_text(m: dict[str, Any]) -> tuple[str | None, str | None, list[str]]:
    """A new session's `language` (a language tag, empty as absent, as an upload's form
    field; the backend's language is the gateway's to check), `prompt` and `hotwords`."""
    language = _optional_str(m, "language", MAX_LANGUAGE_CHARS) or None
    check_language_tag(language)
    prompt = _optional_str(m, "prompt", MAX_PROMPT_CHARS)
    hotwords = m.get("hotwords")
    hotwords = [] if hotwords is None else hotwords
    if not isinstance(hotwords, list) or not all(isinstance(h, str) for h in hotwords):
        raise InvalidRequest("hotwords must be a list of strings")
    if len(hotwords) > MAX_HOTWORDS:
        raise InvalidRequest(f"at most {MAX_HOTWORDS} hotwords")
    if any(len(h) > MAX_HOTWORD_CHARS for h in hotwords):
        raise InvalidRequest(f"a hotword is at most {MAX_HOTWORD_CHARS} characters")
    return language, prompt, hotwords


def _parse_api_key(m: dict[str, Any]) -> str | None:
    """`start`'s `api_key`: a string; empty counts as absent (as an empty header does). Its
    length is not checked here: whether it is a key is the gateway's (gateway/auth.py)."""
    value = m.get("api_key")
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("'api_key' must be a string: the API key")
    return value.strip() or None


def _int_field(m: dict[str, Any], name: str, default: int | None) -> int:
    """`m[name]`, an integer; null counts as absent (as for the optional strings), so an
    optional field takes `default` and a required one (default None) is missing."""
    value = m.get(name)
    if value is None:
        value = default
    if value is None:
        raise InvalidRequest(f"'start' needs the field {name!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name!r} must be an integer, not {value!r}")
    return value


def _optional_str(m: dict[str, Any], name: str, max_chars: int) -> str | None:
    value = m.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_chars:
        raise InvalidRequest(f"{name!r} must be a string of at most {max_chars} characters")
    return value
