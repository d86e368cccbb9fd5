"""`LiveSession`: the Sans-I/O state machine of one live transcription (DESIGN.md section 5).

The owner feeds audio (`receive_audio`), asks whether a hop is due (`hop_due`), decodes the open
window (`window()`: audio from the end of the last final to the audio edge) with any backend,
and hands the hypothesis back (`apply_hypothesis`), which returns the events to send:
`SegmentFinal` for each newly committed segment, then a `SegmentPartial` when the open tail
changed (`preview` sends the segments a decode has closed so far while it still runs).
`finalize()` and `end()` fix the audio received by then as a cut: the next windows end there,
and the `apply_hypothesis` of the one that reaches it (or `flush()` when that audio is decoded
already) commits everything up to it, however much audio arrives meanwhile, with the shown
segments that decode left out (`cut_segments`); the next window starts at the cut, so no later
final starts before it (speech across a cut is split there; docs/protocol.md `finalize`).
`finish()` then gives the `TranscriptFinal` after `end()`. A cut made while another is pending
waits for it, and later ones replace it: with finalizes coming faster than decodes, each decode
still reaches the cut it was given (one that moved with every finalize was never reached).

Speaker merges (DESIGN 5.6, `merge_speakers`): a client that merged a label into another gets
no new segment with it: the mapper writes the target (livemeet/transcript/speakers.py), and
the open tail, shown but not final, is relabelled. Finals keep their labels.

A session can start from finals it committed before a restart (`restored`, DESIGN 5.9): the
owner then appends the session's audio again from its start. The session goes on as if it had
committed those finals itself: they are `committed` and in `finish()`, never sent again, and the
open window starts at the last one's end; the audio before that is received (a backend may
decode the whole meeting every hop) but counts as decoded, so no hop is due until a hop of audio
past it has come.

No I/O, no asyncio, no clock: time is audio time (samples received at 16 kHz).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from livemeet.audio.constants import (
    LIVE_HOP_S,
    LIVE_MAX_WINDOW_S,
    LIVE_PROMPT_CHARS,
    LIVE_SILENCE_HOP_S,
    LOOP_MAX_REPEATS,
    SAMPLE_RATE,
    STAMP_RESOLUTION_S,
)
from livemeet.audio.pcm import check_finite
from livemeet.errors import BadAudio, ProtocolError
from livemeet.session.vad import Endpointer
from livemeet.transcriber import Event, Samples, SegmentFinal, SegmentPartial, TranscriptFinal
from livemeet.transcript.commit import (
    CommitBuffer,
    CommitOptions,
    CommitUpdate,
    as_partial,
    normalise_text,
)
from livemeet.transcript.segments import (
    FinishReason,
    Segment,
    SegmentFlag,
    Transcript,
    join_texts,
)
from livemeet.transcript.speakers import SpeakerMapper


@dataclass(frozen=True)
class LiveOptions:
    """`hop_s`: s of new audio between decodes. `max_window_s`: s of open window beyond which
    the tail is force-committed. `prompt_chars`: characters of committed text in `Window.prompt`.
    `time_scale`: seconds of the backend's timestamps per second of audio. MOSS-TD writes
    marker time (`PromptConfig.marker_time_scale`, 62.5 / 62), so hypotheses are clipped and
    committed against the audio edge in marker time (DESIGN 5.5); 1.0 for backends that write
    audio time. Segments keep the backend's times (as offline transcripts do).
    """

    hop_s: float = LIVE_HOP_S
    max_window_s: float = LIVE_MAX_WINDOW_S
    prompt_chars: int = LIVE_PROMPT_CHARS
    commit: CommitOptions = field(default_factory=CommitOptions)
    time_scale: float = 1.0


class Window(NamedTuple):
    """The open window to decode: `samples` [n] float32 16 kHz starting at `offset_s` (s from the
    session start); `prompt` is the most recent committed text (None before any final)."""

    samples: Samples
    offset_s: float
    prompt: str | None

    @property
    def end_s(self) -> float:
        """Where the window ends, s from the session start (`offset_s` + n / SAMPLE_RATE)."""
        return self.offset_s + len(self.samples) / SAMPLE_RATE


class LiveSession:
    """One live session's audio, commit state and speaker labels. Single-threaded.

    `endpointer` (optional, livemeet/session/vad.py) hears the audio as it is received (DESIGN
    5.4: VAD moves hops, it never removes audio): a speech end it finds past the decoded audio
    makes a hop due at once (`hop_due`), instead of after a whole hop of new audio; and a hop
    of new audio in which it heard no speech is skipped while the open tail is empty (nothing
    left to commit), up to LIVE_SILENCE_HOP_S of it. The window still holds that audio: the
    next hop decodes it.

    `restored`: the session's finals from before a restart (module docstring), in order, in
    session labels and the backend's timestamps (`LiveOptions.time_scale`), with their ids:
    new finals' ids follow theirs (`CommitBuffer`), their labels stay taken (`SpeakerMapper`).
    `merges`: the session's speaker merges from before a restart, (label, target) pairs.
    Raises ValueError for bad options, `restored` that `check_restored_finals` refuses, or
    `merges` that `SpeakerMerges` refuses."""

    def __init__(
        self,
        options: LiveOptions | None = None,
        endpointer: Endpointer | None = None,
        restored: Sequence[Segment] = (),
        merges: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.options = options or LiveOptions()
        self.endpointer = endpointer
        if self.options.hop_s <= 0 or self.options.max_window_s <= self.options.hop_s:
            raise ValueError(f"need 0 < hop_s < max_window_s, got {self.options}")
        if not 0.5 <= self.options.time_scale <= 2.0:
            raise ValueError(f"time_scale must be in [0.5, 2], got {self.options.time_scale}")
        self._commit = CommitBuffer(self.options.commit, restored)
        self._speakers = SpeakerMapper(restored, merges)
        self._chunks: list[Samples] = []
        self._buffer_start = 0  # sample index of _chunks[0][0]
        self._num_samples = 0  # samples received in total (the audio edge)
        # sample index where the open window starts: past restored finals, where they end
        self._window_start = self._stamp_sample(self._commit.committed_end_s)
        # audio edge of the last applied hypothesis; restored finals decoded up to their end
        self._decoded_edge = self._window_start
        self._window_edge: int | None = None  # edge of the window handed out, not yet applied
        # audio edges of pending finalize/end cuts, at most two: the one the windows end at,
        # then the latest one made since (module docstring)
        self._cuts: list[int] = []
        self._end_pending = False
        self._ended = False
        self._rev = 0
        self._sent_tail: tuple[Segment, ...] = ()
        # Uncommitted segments the client has seen, in session labels: the last partial plus
        # older partial segments lying beyond it (retracted by a shorter hypothesis, e.g. an
        # early EOS). Speaker-mapping evidence, so a label once shown keeps its speech.
        self._shown: tuple[Segment, ...] = ()

    # -- input -------------------------------------------------------------------------------

    def receive_audio(self, samples: Samples) -> None:
        """Append [n] float32 samples at 16 kHz. Raises ProtocolError after `end()`, BadAudio for
        a non-1-D array or a NaN or infinite sample (each chunk is checked once, here: decodes
        take the session's audio as checked)."""
        if self._end_pending or self._ended:
            raise ProtocolError("audio after end")
        arr = np.asarray(samples, dtype=np.float32)
        if arr.ndim != 1:
            raise BadAudio(f"expected 1-D mono samples, got shape {arr.shape}")
        check_finite(arr)
        if arr.size:
            self._chunks.append(arr)
            self._num_samples += arr.size
            if self.endpointer is not None:
                self.endpointer.feed(arr)
            # a restored session's audio before its window comes again, all of it at once:
            # never kept (a 90-minute meeting is 345 MB)
            self._drop_chunks_before_window()

    def finalize(self) -> None:
        """Commit everything heard so far (and only that: audio received later is decoded
        after the commit) at the decode that reaches it, or at a flush. A finalize made while
        one is pending is applied after it (several meanwhile: the last; module docstring).
        Raises ProtocolError after `end()`, applied or not (the end commits everything)."""
        if self._end_pending or self._ended:
            raise ProtocolError("finalize after end")
        if self._num_samples <= self._committed_end_sample():
            # everything up to here is final already (a rebuild feeding a session's journaled
            # finalizes again, the early ones behind its restored finals): nothing to cut, and
            # taking one of the two cut slots would let a later one replace a cut still owed
            return
        self._cut()

    def end(self) -> None:
        """No more audio; the next decode or flush commits everything and ends the session.
        Raises ProtocolError for a second end, at once: while the first waits for its decode
        as after it is applied."""
        if self._end_pending or self._ended:
            raise ProtocolError("end after end")
        self._cut()
        self._end_pending = True

    def merge_speakers(self, speaker: str, into: str) -> None:
        """The client merged `speaker` into `into` (docs/protocol.md `speaker.merge`; the
        gateway checked it): no segment committed or sent from now on carries `speaker` (the
        mapper writes `into`'s target), and the open tail is relabelled so that the next
        hypothesis agrees with it; finals keep their labels. In any state (after `end` the
        last decode and a revision still map labels). A repeat is a no-op. Raises ValueError
        for a merge `SpeakerMerges.add` refuses."""
        self._speakers.merge(speaker, into)
        self._commit.relabel(self._speakers.resolve)

    @property
    def merges(self) -> tuple[tuple[str, str], ...]:
        """The session's speaker merges, (label, target) pairs in merge order."""
        return self._speakers.merges

    def _cut(self) -> None:
        edge = self._num_samples
        if not self._cuts or (len(self._cuts) == 1 and edge > self._cuts[0]):
            self._cuts.append(edge)
        elif len(self._cuts) == 2:
            self._cuts[1] = edge

    # -- state -------------------------------------------------------------------------------

    @property
    def edge_s(self) -> float:
        """Audio received so far, in s."""
        return self._num_samples / SAMPLE_RATE

    @property
    def committed_end_s(self) -> float:
        """End of the committed speech, in the backend's timestamps (0.0 before any final)."""
        return self._commit.committed_end_s

    def stamp_s(self, audio_s: float) -> float:
        """Seconds of audio -> the backend's timestamps (`LiveOptions.time_scale`)."""
        return audio_s * self.options.time_scale

    def _stamp_sample(self, stamp_s: float) -> int:
        """The backend's timestamp -> the sample index it stands for."""
        return round(stamp_s / self.options.time_scale * SAMPLE_RATE)

    @property
    def ended(self) -> bool:
        """True once `end()` has been applied (all audio committed)."""
        return self._ended

    @property
    def end_pending(self) -> bool:
        """True from `end()` until the decode (or `flush()`) that ends the session: the client
        waits on the next hop for its transcript."""
        return self._end_pending and not self._ended

    @property
    def committed(self) -> tuple[Segment, ...]:
        return self._commit.committed

    @property
    def new_samples(self) -> int:
        """Samples received since the last applied hypothesis (0 while a restored session's
        audio has not reached the end of its restored finals)."""
        return max(0, self._num_samples - self._decoded_edge)

    def hop_due(self) -> bool:
        """True when the open window should be decoded now: a hop of new audio arrived, a
        speech end past the decoded audio (`speech_end_due`), or a finalize/end waits on audio
        not yet decoded."""
        if self._ended:
            return False
        if self._cuts:
            return self._decoded_edge < self._cuts[0]
        if self.speech_end_due():
            return True
        if self.new_samples < round(self.options.hop_s * SAMPLE_RATE):
            return False
        return not self.silence_skipped()

    def silence_skipped(self) -> bool:
        """True when a hop of new audio is not decoded because it is silence: the last hop
        decoded at least an end's silence (VAD_END_SILENCE_S) past the last speech the
        endpointer heard (a word cut at its edge is decoded again), no uncommitted segment
        waits for a hop to commit it, it is less than LIVE_SILENCE_HOP_S of audio, and the
        open window stays within max_window_s with one more hop (whose forced commit skipping
        would otherwise postpone)."""
        ep = self.endpointer
        if ep is None or self._sent_tail or self._commit.tail:
            return False
        heard = ep.last_speech_end > 0  # speech at all (a session may open in silence)
        if heard and ep.last_speech_end + ep.end_silence_samples > self._decoded_edge:
            return False
        window_s = (self._num_samples - self._committed_end_sample()) / SAMPLE_RATE
        if window_s + self.options.hop_s > self.options.max_window_s:
            return False
        return self.new_samples < round(LIVE_SILENCE_HOP_S * SAMPLE_RATE)

    def hop_due_early(self) -> bool:
        """True when a hop is due only because speech ended: less than a hop of new audio,
        no finalize or end waiting (what the backend counts as an endpoint hop)."""
        hop = round(self.options.hop_s * SAMPLE_RATE)
        early = not self._cuts and self.new_samples < hop
        return early and not self._ended and self.speech_end_due()

    def speech_end_due(self) -> bool:
        """True when the endpointer found speech ending after the audio the last hypothesis
        decoded (its words are not decoded yet)."""
        ep = self.endpointer
        return ep is not None and ep.last_end is not None and ep.last_end > self._decoded_edge

    def flush_due(self) -> bool:
        """True when a finalize/end can be applied without decoding (its audio is decoded)."""
        return not self._ended and bool(self._cuts) and self._decoded_edge >= self._cuts[0]

    def window(self) -> Window:
        """The open window to decode now: from the end of the last final to the audio edge, or
        to a pending finalize's cut (`finalize`). Raises RuntimeError while that edge lies
        before the window's start (a restored session whose audio has not reached its
        restored finals' end: `hop_due` is False until a hop past it)."""
        edge = self._cuts[0] if self._cuts else self._num_samples
        if edge < self._window_start:
            raise RuntimeError(
                f"no open window yet: the audio ends at sample {edge}, before the restored "
                f"finals' end at {self._window_start}"
            )
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        audio = audio[self._window_start - self._buffer_start :]
        self._buffer_start = self._window_start
        self._chunks = [audio] if audio.size else []
        audio = audio[: edge - self._window_start]
        self._window_edge = edge
        recent = join_texts(s.text for s in self._commit.committed[-20:])
        prompt = recent[-self.options.prompt_chars :] if recent else None
        return Window(audio, self._window_start / SAMPLE_RATE, prompt)

    # -- decode results ----------------------------------------------------------------------

    def apply_hypothesis(
        self, segments: Sequence[Segment], session_labels: Collection[str] = ()
    ) -> list[Event]:
        """Apply the decode of the last `window()`: `segments` in absolute times (s from session
        start) and the backend's own labels, except `session_labels`, which the decode already
        wrote in session terms (the committed transcript forced as its prefix carried them).
        Returns SegmentFinal events, then a SegmentPartial if the open tail changed."""
        if self._window_edge is None:
            raise RuntimeError("apply_hypothesis without a window()")
        edge_samples, self._window_edge = self._window_edge, None
        edge_s = self.stamp_s(edge_samples / SAMPLE_RATE)  # in the hypothesis's times
        history = [s.text for s in self._commit.committed[-LOOP_MAX_REPEATS:]]
        start_s = self.stamp_s(self._window_start / SAMPLE_RATE)
        # the last decode (after `end`, of all the audio) keeps a start stamp rounded up past
        # the edge: no later hop writes it again (a forced remainder after an off-grid cut
        # starts at the edge's stamp). Not before: the next hop writes it from more audio.
        last = self._end_pending and edge_samples == self._num_samples
        tolerance_s = STAMP_RESOLUTION_S if last else 0.0
        hyp = clean_hypothesis(segments, start_s, edge_s, history, start_tolerance_s=tolerance_s)
        seen = self._commit.committed[-50:] + self._shown
        mapped = self._speakers.map(hyp, seen, session_labels)
        finals = list(self._commit.update(mapped, edge_s).finals)
        window_s = (edge_samples - self._committed_end_sample()) / SAMPLE_RATE
        if window_s + self.options.hop_s > self.options.max_window_s:
            finals += self._force_window_commit(edge_samples)
        self._decoded_edge = edge_samples
        return self._events(finals, edge_samples)

    def preview(
        self, segments: Sequence[Segment], session_labels: Collection[str] = ()
    ) -> list[Event]:
        """A SegmentPartial for the decode of the last `window()` while it still runs:
        `segments` are its segments closed so far (as for `apply_hypothesis`), shown as the
        open tail as soon as one ends past everything the client was last sent, so a segment
        the decode has closed is not held back while the decode goes on (a real model goes on
        to the words still being spoken). Nothing is committed; `apply_hypothesis` follows as
        usual and sends a partial only if its tail differs. Returns [] (wait for the whole
        decode) without a pending window, when nothing reaches past the sent tail (an earlier
        part of the decode would retract segments still shown), or when a speaker is not in
        `session_labels` (mapping the others casts votes and may take labels: only the whole
        decode does that). A merged-away label shows as its target (`merge_speakers`)."""
        if self._window_edge is None or self._ended:
            return []
        edge_s = self.stamp_s(self._window_edge / SAMPLE_RATE)
        history = [s.text for s in self._commit.committed[-LOOP_MAX_REPEATS:]]
        start_s = self.stamp_s(self._window_start / SAMPLE_RATE)
        hyp = clean_hypothesis(segments, start_s, edge_s, history)
        if not hyp or any(seg.speaker not in session_labels for seg in hyp):
            return []
        hyp = tuple(replace(seg, speaker=self._speakers.resolve(seg.speaker)) for seg in hyp)
        shown_to = max((seg.end_s for seg in self._sent_tail), default=self._commit.committed_end_s)
        if hyp[-1].end_s <= shown_to:
            return []
        # `_shown` stays as it is: the same decode's `apply_hypothesis` maps its other
        # speakers against it, and the preview's tail would drop the retracted segments the
        # client saw (an earlier hop's, cut short) from that evidence
        return self._send_tail(tuple(as_partial(seg) for seg in hyp))

    def flush(self) -> list[Event]:
        """Apply a pending finalize/end without a new decode (the last tail is current)."""
        if not self.flush_due():
            return []
        return self._events([], self._cuts[0])

    @property
    def labels_seen(self) -> frozenset[str]:
        """Every session label handed out so far (finals' and partials'): a revision's new
        speaker takes none of them (`map_revision`)."""
        return self._speakers.seen

    def finish(
        self, finish_reason: FinishReason = FinishReason.STOP, *, revision: bool = False
    ) -> TranscriptFinal:
        """The final transcript: every committed segment (restored ones first). Call after
        `ended`. `revision`: the backend's revision follows it (`TranscriptFinal.revision`)."""
        transcript = Transcript(self._commit.committed, self.edge_s, finish_reason)
        return TranscriptFinal(
            segments=transcript.segments,
            finish_reason=finish_reason,
            coverage=transcript.coverage,
            duration_s=transcript.duration_s,
            revision=revision,
        )

    # -- internals ---------------------------------------------------------------------------

    def _committed_end_sample(self) -> int:
        return max(self._window_start, self._stamp_sample(self._commit.committed_end_s))

    def _force_window_commit(self, edge_samples: int) -> list[Segment]:
        """The window is full: commit all but the last tail segment (it may be cut mid-word), or
        everything if that would still leave the window full; with no segments, drop silence."""
        edge_s = self.stamp_s(edge_samples / SAMPLE_RATE)
        tail = self._commit.tail
        keep_last = len(tail) >= 2 and edge_s - tail[-1].start_s + self.options.hop_s <= (
            self.stamp_s(self.options.max_window_s)
        )
        update: CommitUpdate = self._commit.force_commit(len(tail) - 1 if keep_last else None)
        if not tail:
            horizon = round(self.options.commit.horizon_s * SAMPLE_RATE)
            self._window_start = max(self._window_start, edge_samples - horizon)
        return list(update.finals)

    def _events(self, finals: list[Segment], edge_samples: int) -> list[Event]:
        if self._cuts and edge_samples == self._cuts[0]:
            finals += self._commit_cut(self._cuts.pop(0))
            if self._end_pending and not self._cuts:
                self._ended = True
        self._advance_window()
        events: list[Event] = [SegmentFinal(s) for s in finals]
        events += self._send_tail(self._commit.tail)
        self._shown = shown_segments(self._shown, self._commit.tail, self._commit.committed_end_s)
        return events

    def _commit_cut(self, cut: int) -> list[Segment]:
        """Apply the finalize/end cut at sample `cut`, which the last decode reached: commit
        the open tail and the shown segments it left out (`cut_segments`), and start the next
        window at the cut, so that no later final starts before it (the audio before it is
        never decoded again, even where the decode that reached it wrote none of it)."""
        shown = [replace(s, speaker=self._speakers.resolve(s.speaker)) for s in self._shown]
        tail = cut_segments(
            self._commit.tail,
            shown,
            self._commit.committed_end_s,
            self.options.commit.time_tolerance_s,
        )
        finals = self._commit.force_commit(tail=tail).finals
        self._window_start = max(self._window_start, cut)
        self._shown = ()  # committed, or before the cut: no later decode writes them
        return list(finals)

    def _send_tail(self, tail: tuple[Segment, ...]) -> list[Event]:
        """The partial for `tail` if it differs from the last one sent ([] otherwise)."""
        if tail == self._sent_tail:
            return []
        self._rev += 1
        self._sent_tail = tail
        return [SegmentPartial(self._rev, tail)]

    def _advance_window(self) -> None:
        start = min(self._committed_end_sample(), self._num_samples)
        self._window_start = max(self._window_start, start)
        self._drop_chunks_before_window()

    def _drop_chunks_before_window(self) -> None:
        """Drop whole chunks before the window: they will never be decoded again."""
        while self._chunks and self._buffer_start + self._chunks[0].size <= self._window_start:
            self._buffer_start += self._chunks.pop(0).size


def shown_segments(
    shown: Sequence[Segment], tail: Sequence[Segment], committed_end_s: float
) -> tuple[Segment, ...]:
    """Uncommitted segments the client has seen once `tail` is the partial: `tail`, then the
    earlier `shown` segments that start after it ends (not yet re-decoded)."""
    covered_to = max(tail[-1].end_s if tail else 0.0, committed_end_s)
    beyond = [s for s in shown if s.start_s >= covered_to]
    return (*tail, *beyond)


def cut_segments(
    tail: Sequence[Segment],
    shown: Sequence[Segment],
    committed_end_s: float,
    time_tolerance_s: float,
) -> tuple[Segment, ...]:
    """What a finalize's or an end's cut commits: the open `tail` (what the decode that reached
    the cut wrote past the finals), then the segments the client was shown (`shown`, in session
    labels) that lie past all of that, flagged FROM_PARTIAL. That decode sometimes stops early
    (Whisper at the end of its input, or before a word the cut splits; MOSS-TD's early EOS):
    trials saw the last ~9 s of a meeting, and a phrase shown just before a finalize, missing
    from the finals. No later decode reads audio before the cut, so the finals keep at least
    what the partials showed.

    A shown segment that a tail segment reaches into is the decode's to write (nothing twice),
    unless that tail segment is one the partials showed ending earlier (same speaker and text,
    start within `time_tolerance_s`): Whisper stretches a window's last segment over words it
    leaves out ("to myself." 21.86-24.94 s over "And Mr. John Dash" before a finalize at 25 s),
    so it covers only up to its shown end, and ends where the first kept segment starts.
    `committed_end_s`: the end of the finals (the decode's agreed segments among them)."""

    def covered_to(seg: Segment) -> float:
        end = seg.end_s
        for s in shown:
            same = s.speaker == seg.speaker and normalise_text(s.text) == normalise_text(seg.text)
            if same and abs(s.start_s - seg.start_s) <= time_tolerance_s:
                end = min(end, s.end_s)
        return end

    covered = max([committed_end_s, *(covered_to(seg) for seg in tail)])
    kept = sorted(
        (
            replace(s, flags=(*s.flags, SegmentFlag.FROM_PARTIAL))
            for s in shown
            if s.start_s >= covered and SegmentFlag.FROM_PARTIAL not in s.flags
        ),
        key=lambda s: s.start_s,
    )
    if not kept:
        return tuple(tail)
    stop_s = kept[0].start_s
    trimmed = (replace(s, end_s=max(s.start_s, stop_s)) if s.end_s > stop_s else s for s in tail)
    return (*trimmed, *kept)


def clean_hypothesis(
    segments: Sequence[Segment],
    window_start_s: float,
    edge_s: float,
    history: Sequence[str] = (),
    *,
    start_tolerance_s: float = 0.0,
) -> tuple[Segment, ...]:
    """Hypothesis segments clipped to the window [window_start_s, edge_s]: empty texts and
    segments starting at or past the edge dropped, starts made non-decreasing, ends past the
    edge clamped (flagged END_CLAMPED), and runs of more than LOOP_MAX_REPEATS identical
    consecutive texts (a decode loop) cut, counting the committed texts just before the window
    (`history`, oldest first) into a run they start. With `start_tolerance_s` (s) a segment
    starting less than that past the edge is kept, its start clamped to the edge: a stamp
    rounded up past the edge may be speech before it; for a session's last decode, after
    which nothing writes it again."""
    out: list[Segment] = []
    last = normalise_text(history[-1]) if history else None
    run = -1  # copies of `last` beyond the first so far
    for text in reversed(history):
        if normalise_text(text) != last:
            break
        run += 1
    for seg in segments:
        norm = normalise_text(seg.text)
        # (1 - 1e-6): a start a whole tolerance past the edge is dropped despite float noise
        if not norm or seg.start_s >= edge_s + start_tolerance_s * (1 - 1e-6):
            continue
        if norm == (normalise_text(out[-1].text) if out else last):
            run += 1
            if run >= LOOP_MAX_REPEATS:
                continue
        else:
            run = 0
        start = min(max(seg.start_s, window_start_s, out[-1].start_s if out else 0.0), edge_s)
        end, flags = seg.end_s, seg.flags
        if end > edge_s:
            end = edge_s
            flags = (*flags, SegmentFlag.END_CLAMPED)
        text = seg.text.strip()
        out.append(replace(seg, start_s=start, end_s=max(start, end), flags=flags, text=text))
    return tuple(out)
