"""Per-session state of the MOSS-TD backend (`moss.MossCore`), and the cut of a live hop's
hypothesis: plain data and policy, no engine calls.

`UploadState` is an upload (or a live session's revision, `Revising`); `LiveState` a live
session with its hop in flight (`HopState`) and the KV kept from its last (`RetainedKV`).
`keep_after_cut` decides what a hop's hypothesis adds after the committed transcript.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from livemeet.audio.constants import LIVE_FORCED_TRANSCRIPT_TOKENS, SAMPLE_RATE
from livemeet.backends.forced_transcript import forced_piece, forced_prefix
from livemeet.backends.segment_stream import SegmentStream, UploadTranscript
from livemeet.engine.encoder_runner import full_window_keys
from livemeet.session.forced_budget import BudgetState
from livemeet.session.live import LiveSession
from livemeet.transcriber import SessionOptions, TranscriptFinal
from livemeet.transcript.overlap import text_after_overlap
from livemeet.transcript.pieces import Pieces
from livemeet.transcript.segments import FinishReason, Segment, SegmentFlag, join_texts

LIVE_BUFFER_STEP_S = 600  # s of audio a live session's sample buffer grows by at most


@dataclass
class UploadState:
    """An upload (or a live session's revision): its audio until `end`, then its request and
    the transcript its tokens build."""

    options: SessionOptions
    chunks: list[np.ndarray] = field(default_factory=list)
    ended: bool = False
    request_id: str | None = None
    stream: SegmentStream | None = None
    transcript: UploadTranscript | None = None
    samples: np.ndarray | None = None  # the whole audio, kept for continuations (DESIGN 5.8)
    due_s: float | None = None  # engine clock when step() first found it due for submission
    continuations: int = 0
    num_generated: int = 0  # tokens its requests generated (a cap spans the continuations)
    cut_s: float = -1.0  # the request's segments count past it (by midpoint): a continuation's
    # forced segments come out again before its new ones
    revise: Revising | None = None  # a live session's revision (module docstring)


@dataclass(frozen=True)
class Revising:
    """What a live session's revision maps its segments onto: the final it supersedes, every
    label the session showed (a new speaker takes none of them) and its speaker merges."""

    final: TranscriptFinal
    labels_seen: frozenset[str]
    merges: tuple[tuple[str, str], ...] = ()


@dataclass
class HopState:
    """A live session's hop in flight: one LIVE request decoding the audio up to its edge."""

    request_id: str
    edge_samples: int  # audio edge the hop decodes up to
    offset_s: float  # end of the committed speech when the hop started (marker time)
    stream: SegmentStream
    session_labels: frozenset[str]  # speakers of the forced transcript prefix
    submitted_s: float  # engine clock at submission
    due_s: float  # engine clock when it was found due (<= submitted_s: it waited its turn)
    prefix_ids: list[int]  # its forced transcript
    segments: list[Segment] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)  # what it decoded
    first_token_s: float | None = None  # engine clock at its first sampled id (prefill done)


@dataclass
class RetainedKV:
    """The finished hop whose KV the engine keeps (`retain_kv`) for the next hop to fork."""

    request_id: str
    num_audio_tokens: int
    num_complete_windows: int


@dataclass
class LiveState:
    """A live session: its audio, commit policy (`LiveSession`), forced transcript, hop in
    flight and the KV retained from the last one."""

    options: SessionOptions
    live: LiveSession
    chunks: list[np.ndarray] = field(default_factory=list)
    # append-only samples: `buffer[:length]`, grown by doubling (no copy of the whole
    # meeting per hop)
    buffer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    length: int = 0
    window_keys: list[bytes] = field(default_factory=list)  # of full windows, hashed once
    # forced transcript (DESIGN 5.3): ids of each committed segment (tokenized once), and the
    # last prefix built: its ids, the committed segments it holds, and how many were committed
    segment_pieces: list[Pieces | None] = field(default_factory=list)  # None: special text
    prefix_ids: list[int] = field(default_factory=list)
    prefix_segments: tuple[Segment, ...] = ()
    prefix_num_committed: int = 0
    prefix_limits: tuple[int, int] = (0, 0)  # the (budget, cap) the last prefix was built for
    # tokens the next hop may force and the hops' smoothed load (ForcedBudget: the cap,
    # halved while hops are slow; MossCore sets it from its config when it opens the session)
    forced_budget: BudgetState = BudgetState(LIVE_FORCED_TRANSCRIPT_TOKENS)
    hop: HopState | None = None
    # the last whole hop's forced transcript and decode (less the stop token), and the length
    # of the former: the next hop's draft (livemeet/session/draft.py)
    assistant_ids: list[int] = field(default_factory=list)
    assistant_prefix_len: int = 0
    retained: RetainedKV | None = None
    num_hops: int = 0
    num_reused_tokens: int = 0
    last_reason: FinishReason = FinishReason.STOP
    due_s: float | None = None  # engine clock when step() first found a hop or flush due

    def audio_to(self, edge: int) -> np.ndarray:
        """The first `edge` samples heard (a view: valid until the next append)."""
        incoming = sum(c.size for c in self.chunks)
        if self.length + incoming > self.buffer.size:
            # doubling, but by at most LIVE_BUFFER_STEP_S at a time (long meetings)
            step = min(self.buffer.size, LIVE_BUFFER_STEP_S * SAMPLE_RATE)
            grown = np.zeros(max(self.buffer.size + step, self.length + incoming), np.float32)
            grown[: self.length] = self.buffer[: self.length]
            self.buffer = grown
        for chunk in self.chunks:
            self.buffer[self.length : self.length + chunk.size] = chunk
            self.length += chunk.size
        self.chunks = []
        return self.buffer[: min(edge, self.length)]

    def forced_transcript_ids(
        self,
        encode: Callable[[str], list[int]],
        max_tokens: int,
        exact: bool = True,
        added_ids: Collection[int] = frozenset(),
        cap: int | None = None,
    ) -> list[int]:
        """The committed transcript to prefill as forced assistant tokens (DESIGN 5.3): its
        most recent whole segments in the output grammar, at most `max_tokens` ids, less the
        last segment's closing `]`. Mid-transcript the model writes an end stamp's `]` merged
        with the next segment's `[` (one `][` token; a lone `]` there precedes only the end of
        the output), so the ids stop before it and the decode starts with `][` or `]` (token
        healing; the parser skips text before a segment's `[`). A segment whose text holds
        special-token text would encode as that token (`<|...|>`, or any of `added_ids`,
        the tokenizer's added tokens, such as `</think>`): it and older ones stay out.
        Rebuilt only when a segment commits (the committed list only grows) or the budget
        changes (`ForcedBudget`), from each
        segment's ids tokenized once (livemeet/transcript/pieces.py); `exact=False` (a
        tokenizer whose pieces do not join: `splits_after_digits`) tokenizes the joined text.
        `cap` (default `max_tokens`): the newest segment alone is taken even past `max_tokens`
        while it fits `cap`. A budget cut under load (`ForcedBudget`) must not leave a long
        last turn out: a hop that forces nothing re-decodes the whole meeting, the costliest
        hop there is."""
        committed = self.live.committed
        if max_tokens <= 0:
            return []
        cap = max_tokens if cap is None else max(cap, max_tokens)
        limits = (max_tokens, cap)
        if len(committed) == self.prefix_num_committed and limits == self.prefix_limits:
            return self.prefix_ids
        for seg in committed[len(self.segment_pieces) :]:
            self.segment_pieces.append(forced_piece(seg, encode, added_ids))
        first, ids = forced_prefix(committed, self.segment_pieces, encode, max_tokens, cap, exact)
        self.prefix_segments = committed[first:] if ids else ()
        self.prefix_ids, self.prefix_num_committed = ids, len(committed)
        self.prefix_limits = limits
        return ids

    def full_window_keys(self, audio: np.ndarray) -> list[bytes]:
        """Encoder-cache keys of `audio`'s full windows; each window is hashed once per
        session (the audio only grows, so a full window never changes)."""
        self.window_keys = full_window_keys(audio, self.window_keys)
        return self.window_keys


SessionState = UploadState | LiveState


def is_open(seg: Segment) -> bool:
    """Whether the decode ended inside `seg` (no end stamp: its end is the audio's)."""
    return SegmentFlag.MISSING_END in seg.flags


def past_cut(seg: Segment, cut_s: float) -> bool:
    """Whether a hop keeps `seg`: its midpoint lies past the hop's cut (the committed end)."""
    return (seg.start_s + seg.end_s) / 2 > cut_s


def keep_after_cut(
    segments: Sequence[Segment], cut_s: float, committed: Sequence[Segment]
) -> list[Segment]:
    """What a hop's hypothesis adds after its cut (the committed end, `cut_s`): segments past
    it (by midpoint, `past_cut`), and of a segment that straddles it (starts before it, ends
    after it) what follows the committed text (`text_after_overlap`), from the cut. A hop
    without the newest committed turn forced as its prefix (`--live-forced-transcript-tokens`
    0, or a turn longer than it) writes such a turn again whole: kept whole, its committed
    words came twice; dropped whole (midpoint before the cut), its words after the cut never
    came (found by a trial). The committed text is that of the `committed` segments ending
    after the straddler's start; where its end is not found in the straddler (the model
    wrote it otherwise), the midpoint decides, as for the rest."""
    out = []
    for seg in segments:
        if not seg.start_s < cut_s < seg.end_s:
            if past_cut(seg, cut_s):
                out.append(seg)
            continue
        said = join_texts(c.text for c in committed if c.end_s > seg.start_s)
        rest = text_after_overlap(said, seg.text)
        if rest is None:
            if past_cut(seg, cut_s):
                out.append(seg)
        elif rest:
            out.append(replace(seg, start_s=cut_s, text=rest))
    return out
