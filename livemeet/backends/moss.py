"""The MOSS-TD backend: `MossCore`, a `BackendCore` over livemeet's paged `Engine`.

Uploads (`SessionOptions.live` False) buffer their audio; `end()` queues one UPLOAD request.
The scheduler's upload hold is told how many uploads are on their way to it: the gateway's
(`set_incoming_uploads`: receiving or decoding) plus this core's not yet queued (opened, or
ended and waiting for a submit slot), so an upload counts from the gateway's accept until the
scheduler has it, and an upload whose `EndSession` is still in the pipe is not forgotten.
Every engine step feeds the new tokens through an incremental detokenizer, the transcript
parser and the repetition guard, so each confirmed segment is sent at once as a `TextDelta`
(then its `SegmentFinal`, so the gateway's SSE tracker does not derive the text twice); the
deltas concatenate to the final text (`join_texts`). The last event is `TranscriptFinal`.
A decode that ends well before the audio's end (the model tends to stop near ~16k output
tokens, DESIGN 5.8) is continued by a request whose forced prefix is the transcript's most
recent segments (`MossCore._continue_upload`), so a long upload loses nothing to it.

Live sessions prefill ALL audio so far every hop (MODEL.md section 10: the instruction follows
the audio, so generation restarts each hop), then the committed transcript as forced assistant
tokens, and decode only the new tail (DESIGN 5.3: the most recent whole segments within
`ModelConfig.live_forced_transcript_tokens`, 2,048 by default; our technique, not the
reference's, unvalidated on real weights). Each session's budget adapts to load: it halves,
down to `live_forced_transcript_min_tokens`, while its hops take more than `live_hop_load`
of a hop interval (smoothed over hops) and grows back while they are fast
(livemeet/session/forced_budget.py).
With 0 tokens a hop re-decodes the whole meeting (cumulative re-decode, as SGLang-Omni
does), whose decode grows ~330 tokens per meeting minute.
A hop is a LIVE request with a deadline one hop ahead; it keeps its KV after finishing
(`retain_kv`) and the next hop forks the stable prefix of it (header plus the span over audio
whose embeddings were final and whose markers were placed, `stable_prefix_len`). While a hop is
in flight no other starts for that session, so the hop grows with load. `LiveSession` owns the
commit policy and speaker labels: each hop's hypothesis is cut to the speech after the last
final, mapped and committed there. A live session re-opened after a restart
(`SessionOptions.restore`, DESIGN 5.9) starts its `LiveSession` from the stored finals, so its
first hop forces them as the committed transcript, and prefills all the audio sent again.

Revision (DESIGN 5.7, `SessionOptions.revise`): a live session's `TranscriptFinal` says
`revision`, and the session becomes an upload of the whole meeting (`_start_revision`): one
UPLOAD request (upload priority and preemption: it never delays a live hop) over header, all
the audio and suffix, no forced transcript, decoded freely (greedy), whose first prompt tokens
fork the KV of the session's last hop (its stable prefix, as a next hop would: only the rest
is prefilled again); the session's encoder-window holds stay until it ends. It is continued
as an upload is when it stops early (DESIGN 5.8), sends no deltas or finals, and ends with
one `TranscriptRevised`: its segments mapped onto the session's labels by overlap with the
finals (`map_revision`), fresh ids, superseding every final. A failure is the session's
`Error` after its final (the final stands); `abort` cancels it.

Benchmarks (backends/forced_output.py): `ModelConfig.forced_output` names a reference
transcript (`[0.00][S01]text[1.20]...`) whose tokens replace the sampled ones (DESIGN section 4);
a live hop forces what a perfect model writes for its audio (`forced_hop_parts`): the words
spoken by its edge, a turn in progress left open. Token ids become segments through
backends/segment_stream.py; the forced transcript's ids come from backends/forced_transcript.py.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from livemeet.audio.constants import (
    SAMPLE_RATE,
    UPLOAD_CONTINUE_FORCED_TOKENS,
    UPLOAD_CONTINUE_GAP_S,
    UPLOAD_MAX_CONTINUATIONS,
    WINDOW_SAMPLES,
    num_audio_tokens,
)
from livemeet.backends.base import restored_finals, restored_merges
from livemeet.backends.forced_output import forced_hop_parts, forced_skip_keys, read_forced_output
from livemeet.backends.forced_transcript import forced_piece, forced_prefix
from livemeet.backends.moss_state import (
    HopState,
    LiveState,
    RetainedKV,
    Revising,
    SessionState,
    UploadState,
    is_open,
    keep_after_cut,
    past_cut,
)
from livemeet.backends.segment_stream import SegmentStream, UploadTranscript
from livemeet.config import ModelConfig, parse_upload_hold
from livemeet.engine.engine import Engine, EngineConfig, output_budget
from livemeet.engine.messages import EngineStats
from livemeet.engine.request import Request, RequestClass
from livemeet.engine.scheduler import SchedulerConfig
from livemeet.errors import (
    InternalError,
    InvalidRequest,
    LivemeetError,
    NotFound,
    ProtocolError,
    unexpected_text,
)
from livemeet.models.prompt import EOS, stable_prefix_len
from livemeet.session.draft import hop_draft
from livemeet.session.forced_budget import ForcedBudget
from livemeet.session.live import LiveOptions, LiveSession, Window
from livemeet.session.vad import Endpointer, LiveVad, live_classifier
from livemeet.transcriber import (
    BackendInfo,
    Error,
    Event,
    Samples,
    SegmentFinal,
    SessionOptions,
    TextDelta,
    TranscriptFinal,
    TranscriptRevised,
)
from livemeet.transcript.commit import revision_segments
from livemeet.transcript.detok import IncrementalDetokenizer
from livemeet.transcript.parser import (
    render_segment,
)
from livemeet.transcript.pieces import (
    Pieces,
    segment_pieces,
    splits_after_digits,
)
from livemeet.transcript.segments import (
    FinishReason,
    Segment,
)
from livemeet.transcript.speakers import map_revision

log = logging.getLogger(__name__)

# requests queued per step(), the longest-due first: each costs ~1 ms of host time (prompt,
# forced ids, hashes of new full windows; the encoder runs in the engine's step), so a burst
# of due sessions (a restart, many joining at once) cannot hold one step long. At 4 per step,
# 100 live sessions late in a meeting, whose steps ran ~20 a second, could queue at most ~80
# hops a second for the ~100 due (72 finished): a wait before submission that neither the
# forced budget nor live_hop_s saw (docs/benchmarks.md, session 18)
MAX_SUBMITS_PER_STEP = 16
MAX_UPLOAD_SUBMITS_PER_STEP = 4  # of them uploads (the bound all requests had until then)
DUMMY_MODEL_ID = "moss-td-dummy"


class MossCore:
    """MOSS-TD behind the `BackendCore` protocol (see the module docstring).

    `engine`: a ready Engine (tests); otherwise `load()` builds one from `config`.
    """

    def __init__(self, config: ModelConfig, *, engine: Engine | None = None) -> None:
        self.config = config
        self.engine: Engine | None = engine
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()
        self._owner: dict[str, str] = {}  # engine request id -> session id
        self._forced: list[Segment] | None = None
        self._forced_text: str | None = None
        self._forced_pieces: list[Pieces] = []  # each forced segment's ids (transcript/pieces.py)
        self._forced_skip_keys: list[float] = []  # forced_skip_keys(self._forced)
        self._close_ids: list[int] = []  # the ids of "]"
        self._exact_pieces: bool | None = None  # splits_after_digits of the engine's tokenizer
        self._added: frozenset[int] | None = None  # the tokenizer's added-token ids
        self.num_reused_tokens = 0  # prompt tokens whose KV live hops took from the last hop
        self.num_live_hops = 0  # live decodes finished, and their summed time (EngineStats)
        self.num_live_endpoint_hops = 0  # hops due early: speech ended (LiveSession)
        self.live_hop_s = 0.0
        self.live_forced_tokens = 0  # forced-transcript tokens of the hops submitted, summed
        self.live_hop_wait_s = 0.0  # s the hops waited from due to submission, summed
        # s from submission to the first sampled id (encode, queue, prefill), summed: the rest
        # of live_hop_s is the hops' decoding
        self.live_hop_first_token_s = 0.0
        self.num_upload_continuations = 0  # uploads continued after an early stop (DESIGN 5.8)
        self.num_revisions = 0  # live sessions' revisions started (DESIGN 5.7)
        # each live session's forced-transcript budget adapts to load (DESIGN 5.1, 5.3)
        self.forced_budget = ForcedBudget.for_hop_load(
            config.live_forced_transcript_tokens,
            config.live_forced_transcript_min_tokens,
            config.live_hop_load,
        )
        self._gateway_incoming_uploads = 0  # set_incoming_uploads: not yet sent to this core

    # -- BackendCore: lifecycle --------------------------------------------------------------

    @property
    def info(self) -> BackendInfo:
        model_id = Path(self.config.model).name if self.config.model else DUMMY_MODEL_ID
        return BackendInfo(
            name="moss", model_id=model_id, demo=False, diarization=True, revise=True
        )

    def load(self) -> None:
        """Build the engine (checkpoint dir or hub id; `load_format` "dummy" for real-size
        random weights), read the forced-output file and load the live VAD. Raises
        ConfigError (for Silero without the demo extra, too)."""
        self.config.validate()
        if self.engine is None:
            self.engine = Engine(engine_config(self.config))
        if self.config.forced_output:
            self._load_forced(Path(self.config.forced_output))
        if self.config.live_vad is not None:
            live_classifier(LiveVad(self.config.live_vad))  # a missing extra fails here, once
        self._tell_incoming_uploads()  # a count sent before the engine existed
        log.info("MOSS-TD backend ready (%s)", self.info.model_id)

    def close(self) -> None:
        for sid in list(self._sessions):
            self.abort(sid)
        self.engine = None

    # -- BackendCore: commands ---------------------------------------------------------------

    def open(self, session_id: str, options: SessionOptions) -> None:
        """Open a live session (a LiveSession with this backend's hop and VAD) or an upload
        (BackendCore). Raises InvalidRequest for an id already open, a sample rate other than
        SAMPLE_RATE (16 kHz), `max_new_tokens` < 1, bad live settings, or a bad restore
        (`restored_finals`)."""
        if session_id in self._sessions:
            raise InvalidRequest(f"session {session_id!r} is already open")
        if options.sample_rate != SAMPLE_RATE:
            raise InvalidRequest(f"sample_rate must be {SAMPLE_RATE}, not {options.sample_rate}")
        if options.max_new_tokens is not None and options.max_new_tokens < 1:
            raise InvalidRequest(f"max_new_tokens must be >= 1, not {options.max_new_tokens}")
        restored = restored_finals(options)
        if options.live:
            vad = self.config.live_vad
            endpointer = None if vad is None else Endpointer(live_classifier(LiveVad(vad)))
            try:
                live = LiveSession(
                    LiveOptions(hop_s=options.hop_s, time_scale=self._time_scale()),
                    endpointer,
                    restored,
                    restored_merges(options),
                )
            except ValueError as exc:
                raise InvalidRequest(f"bad live settings: {exc}") from exc
            self._sessions[session_id] = LiveState(
                options, live, forced_budget=self.forced_budget.start()
            )
        else:
            self._sessions[session_id] = UploadState(options)
            self._tell_incoming_uploads()

    def append(self, session_id: str, samples: Samples) -> None:
        """Queue [n] float32 16 kHz samples. Raises NotFound for an unknown session, ProtocolError
        for audio after end, and for a live session BadAudio as `LiveSession.receive_audio`."""
        sess = self._get(session_id)
        if isinstance(sess, LiveState):
            sess.live.receive_audio(samples)  # raises ProtocolError after end, BadAudio if not 1-D
            sess.chunks.append(np.asarray(samples, dtype=np.float32).reshape(-1))
            return
        if sess.ended:
            raise ProtocolError("audio after end")
        sess.chunks.append(np.asarray(samples, dtype=np.float32).reshape(-1))

    def finalize(self, session_id: str) -> None:
        """A live session's `finalize` (`LiveSession.finalize`); nothing for an upload. Raises
        NotFound for an unknown session, ProtocolError for a live session's finalize after its
        end (applied or not: `LiveSession.finalize`)."""
        sess = self._get(session_id)
        if isinstance(sess, LiveState):
            sess.live.finalize()

    def merge_speakers(self, session_id: str, speaker: str, into: str) -> None:
        """A live session's merge (BackendCore): its hops write `into` for `speaker` from now
        on. Ignored once the session is its revision's upload (the gateway relabels that).
        Raises NotFound for an unknown session, ValueError as `SpeakerMerges.add`."""
        sess = self._get(session_id)
        if isinstance(sess, LiveState):
            sess.live.merge_speakers(speaker, into)

    def end(self, session_id: str) -> None:
        """No more audio: an upload becomes due for submission; a live session ends
        (`LiveSession.end`) and its hop in flight loses its slack (deadline moved to its due time).
        Raises NotFound for an unknown session, ProtocolError for an end after end
        (a live session's as `LiveSession.end`)."""
        sess = self._get(session_id)
        if isinstance(sess, LiveState):
            sess.live.end()
            if sess.hop is not None and self.engine is not None:
                # the client now waits on this hop (and the last one, after it): it loses its
                # hop of slack, as the last one has none (`_submit_hop`)
                self.engine.advance_deadline(sess.hop.request_id, sess.hop.due_s)
            return
        if sess.ended:
            raise ProtocolError("end after end")
        sess.ended = True

    def abort(self, session_id: str) -> None:
        """Free the session and every engine request it holds (each exactly once)."""
        sess = self._get(session_id)
        self._drop(session_id, sess)

    # -- BackendCore: work -------------------------------------------------------------------

    def has_work(self) -> bool:
        """Something to submit, or an engine step that would do something: False while the
        engine only holds uploads for incoming ones (the worker then waits on its inbox)."""
        if any(self._needs_submit(s) for s in self._sessions.values()):
            return True
        if self.engine is None:
            return False
        return self.engine.has_work() and not self.engine.is_holding()

    def is_holding(self) -> bool:
        """True when the engine holds uploads for incoming ones and has nothing else to do."""
        return self.engine is not None and self.engine.is_holding()

    def set_incoming_uploads(self, count: int) -> None:
        """How many uploads the gateway is still receiving or decoding (module docstring).
        Raises InternalError for a negative count (a gateway bug)."""
        if count < 0:
            raise InternalError(f"incoming upload count must be >= 0, not {count}")
        self._gateway_incoming_uploads = count
        self._tell_incoming_uploads()

    def stats(self) -> EngineStats | None:
        """The engine's cumulative step counters with this core's live hops; None before
        `load()`."""
        if self.engine is None:
            return None
        return replace(
            self.engine.stats(),
            num_live_hops=self.num_live_hops,
            live_hop_s=self.live_hop_s,
            live_forced_tokens=self.live_forced_tokens,
            live_hop_wait_s=self.live_hop_wait_s,
            live_hop_first_token_s=self.live_hop_first_token_s,
            num_upload_continuations=self.num_upload_continuations,
            num_live_endpoint_hops=self.num_live_endpoint_hops,
        )

    def step(self) -> list[tuple[str, Event]]:
        """Submit what is due (a failed submission becomes that session's Error event, and the
        session is dropped), then, when the engine has work, run one step and turn its tokens and
        finished requests into events. A failure of the engine step itself propagates."""
        engine = self._engine()
        out: list[tuple[str, Event]] = []
        for sid, sess in self._submits_now(engine.clock()):
            try:
                events = self._submit(sid, sess)
            except LivemeetError as exc:
                self._drop(sid, sess)
                events = [Error(exc.code, exc.message, exc.retryable)]
            out.extend((sid, e) for e in events)
        self._tell_incoming_uploads()
        engine.set_live_sessions(sum(isinstance(s, LiveState) for s in self._sessions.values()))
        if engine.has_work():
            result = engine.step()  # a failure here cannot be pinned on a session: it propagates
            for rid, token_id in result.new_tokens:
                out.extend(self._isolated(rid, partial(self._on_token, rid, token_id)))
            for request in result.finished:
                rid, reason = request.request_id, request.finish_reason or FinishReason.STOP
                out.extend(self._isolated(rid, partial(self._on_finished, rid, reason)))
        return out

    def _isolated(
        self, rid: str, handler: Callable[[], list[tuple[str, Event]]]
    ) -> list[tuple[str, Event]]:
        """Run one request's output handler; if it raises (detokenizer, parser, transcript),
        only that request's session fails: its engine requests are aborted (KV freed once) and
        it gets an `internal_error`, while every other session goes on."""
        sid = self._owner.get(rid)
        try:
            return handler()
        except Exception as exc:
            log.exception("output of request %s failed", rid)
            sess = self._sessions.get(sid) if sid is not None else None
            if sid is None or sess is None:
                return []
            self._drop(sid, sess)
            return [
                (
                    sid,
                    Error("internal_error", f"transcript assembly failed: {unexpected_text(exc)}"),
                )
            ]

    # -- sessions ----------------------------------------------------------------------------

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("MossCore used before load()")
        return self.engine

    def _get(self, session_id: str) -> SessionState:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise NotFound(f"unknown session {session_id!r}") from None

    def _drop(self, sid: str, sess: SessionState) -> None:
        self._sessions.pop(sid, None)
        if isinstance(sess, UploadState) and sess.request_id is None:
            self._tell_incoming_uploads()
        rids: list[str] = []
        if isinstance(sess, UploadState) and sess.request_id:
            rids.append(sess.request_id)
        if isinstance(sess, LiveState):
            if sess.hop is not None:
                rids.append(sess.hop.request_id)
            if sess.retained is not None:
                rids.append(sess.retained.request_id)
            sess.hop = sess.retained = None
        for rid in rids:
            self._owner.pop(rid, None)
            if self.engine is not None:
                self.engine.abort(rid)
        revising = isinstance(sess, UploadState) and sess.revise is not None
        if (isinstance(sess, LiveState) or revising) and self.engine is not None:
            self.engine.release_windows(sid)  # the holds of _submit_hop (a revision keeps them)

    def _tell_incoming_uploads(self) -> None:
        """Give the scheduler the gateway's count plus this core's uploads not yet queued; run
        wherever either changes (set_incoming_uploads, open, submit, drop)."""
        if self.engine is None:
            return
        unqueued = sum(
            1
            for s in self._sessions.values()
            if isinstance(s, UploadState) and s.request_id is None
        )
        self.engine.set_incoming_uploads(self._gateway_incoming_uploads + unqueued)

    def _due_sessions(self, now: float) -> list[tuple[str, SessionState]]:
        """Sessions with a request to submit, the longest-due first (each is stamped the
        first time it is found due, so a session waits at most its turn, whatever its place
        among the sessions)."""
        due: list[tuple[str, SessionState]] = []
        for sid, sess in self._sessions.items():
            if self._needs_submit(sess):
                if sess.due_s is None:
                    sess.due_s = now
                due.append((sid, sess))
        due.sort(key=lambda item: item[1].due_s or 0.0)
        return due

    def _submits_now(self, now: float) -> list[tuple[str, SessionState]]:
        """The due sessions this step submits: the longest-due first, at most
        MAX_SUBMITS_PER_STEP, of them at most MAX_UPLOAD_SUBMITS_PER_STEP uploads (an upload's
        submit joins and scans its whole audio: ~0.1 s for 90 minutes)."""
        chosen: list[tuple[str, SessionState]] = []
        uploads = 0
        for sid, sess in self._due_sessions(now):
            if len(chosen) == MAX_SUBMITS_PER_STEP:
                break
            if isinstance(sess, UploadState):
                if uploads == MAX_UPLOAD_SUBMITS_PER_STEP:
                    continue
                uploads += 1
            chosen.append((sid, sess))
        return chosen

    def _needs_submit(self, sess: SessionState) -> bool:
        if isinstance(sess, UploadState):
            return sess.ended and sess.request_id is None
        if sess.hop is not None:
            return False  # adaptive hop: one decode in flight per session
        return sess.live.hop_due() or sess.live.flush_due()

    def _submit(self, sid: str, sess: SessionState) -> list[Event]:
        due_s, sess.due_s = sess.due_s, None
        if isinstance(sess, UploadState):
            return self._submit_upload(sid, sess)
        if sess.live.hop_due():
            early = sess.live.hop_due_early()
            self._submit_hop(sid, sess, due_s)
            self.num_live_endpoint_hops += early  # submitted: a refused hop raised
            return []
        events = sess.live.flush()
        return self._after_live_events(sid, sess, events)

    # -- uploads -----------------------------------------------------------------------------

    def _submit_upload(self, sid: str, sess: UploadState) -> list[Event]:
        samples = np.concatenate(sess.chunks) if sess.chunks else np.zeros(0, np.float32)
        sess.chunks = []
        duration_s = samples.size / SAMPLE_RATE
        # the model's stamps are marker time: the audio ends at this stamp, not at duration_s
        max_stamp_s = duration_s * self._time_scale()
        sess.transcript = UploadTranscript(duration_s, max_stamp_s)
        if max_stamp_s >= UPLOAD_CONTINUE_GAP_S:  # long enough to stop early (DESIGN 5.8)
            sess.samples = samples
        if samples.size == 0:
            self._sessions.pop(sid, None)
            return [sess.transcript.final(FinishReason.STOP)]
        self._queue_upload_request(
            sid, sess, samples, self._max_new_tokens(sess.options), self._forced_ids(None)
        )
        return []

    def _queue_upload_request(
        self,
        sid: str,
        sess: UploadState,
        samples: np.ndarray,
        max_new_tokens: int | None,
        forced_output_ids: Sequence[int] | None,
        prefix: Sequence[Segment] = (),
        prefix_ids: Sequence[int] = (),
        fork_from: str | None = None,
        num_fork_tokens: int = 0,
        window_keys: Sequence[bytes] = (),
    ) -> None:
        """Queue the upload's next request (its first, or a continuation forcing `prefix`'s
        segments as `prefix_ids`) over `samples` and make it the session's: its id, owner and
        output stream. A revision's first request forks `num_fork_tokens` of `fork_from`'s KV
        and names its full windows' cache keys (`Engine.add_request`). Raises as
        `Engine.add_request`."""
        assert sess.transcript is not None
        engine = self._engine()
        kind = "upload" if sess.revise is None else "revise"
        rid = f"{sid}/{kind}{sess.continuations or ''}"
        request = engine.add_request(
            rid,
            samples,
            prompt=sess.options.prompt,
            hotwords=sess.options.hotwords,
            max_new_tokens=max_new_tokens,
            forced_output_ids=forced_output_ids,
            prefix_token_ids=prefix_ids,
            fork_from=fork_from,
            num_fork_tokens=num_fork_tokens,
            window_keys=window_keys,
            # a continuation's audio was checked before, a live session's as it came
            samples_checked=bool(prefix_ids) or sess.revise is not None,
        )
        _log_request(request, samples.size)
        sess.request_id, self._owner[rid] = rid, sid
        sess.stream = SegmentStream(
            IncrementalDetokenizer(engine.tokenizer),
            sess.transcript.max_stamp_s,
            prefix,
        )

    def _upload_events(self, sess: UploadState, segments: Sequence[Segment]) -> list[Event]:
        assert sess.transcript is not None
        events: list[Event] = []
        for seg in segments:
            if not past_cut(seg, sess.cut_s):
                continue  # a continuation's forced segment, written again
            added = sess.transcript.add(seg)
            if added is not None and sess.revise is None:  # a revision sends its whole at once
                final, delta = added
                events.append(TextDelta(delta))
                events.append(SegmentFinal(final))
        return events

    def _continue_upload(self, sid: str, sess: UploadState, reason: FinishReason) -> bool:
        """Continue an upload whose decode ended (EOS) UPLOAD_CONTINUE_GAP_S or more before its
        audio's end, with segments added since the last continuation (DESIGN 5.8): a new
        request over the same audio (its full windows hit the encoder cache) whose forced
        prefix is the transcript's most recent whole segments within
        UPLOAD_CONTINUE_FORCED_TOKENS (DESIGN 5.3, as a live hop's), so the model goes on
        after them; a `max_new_tokens` cap spans all of the upload's requests. Returns whether
        it was submitted; a request the engine refuses (no room in the context) ends the
        upload as it stands."""
        transcript, samples = sess.transcript, sess.samples
        assert transcript is not None
        segments = transcript.segments
        if reason is not FinishReason.STOP or not segments or samples is None:
            return False
        cut_s = segments[-1].end_s
        if sess.continuations >= UPLOAD_MAX_CONTINUATIONS or cut_s <= sess.cut_s:
            return False
        if transcript.max_stamp_s - cut_s < UPLOAD_CONTINUE_GAP_S:
            return False
        if self._forced is not None and not any(past_cut(s, cut_s) for s in self._forced):
            return False  # benchmarks: the reference has nothing after the cut to force
        budget = self._max_new_tokens(sess.options)
        if budget is not None:
            budget -= sess.num_generated
            if budget <= 0:
                return False
        cap = UPLOAD_CONTINUE_FORCED_TOKENS
        # a rendered segment is >= 4 ids (each stamp digit is one): no more can fit the cap
        tail = segments[-(cap // 4 + 1) :]
        pieces = [forced_piece(seg, self._encode, self._added_ids()) for seg in tail]
        first, prefix = forced_prefix(tail, pieces, self._encode, cap, cap, self._pieces_join())
        if not prefix:
            return False  # nothing to force: the same decode would stop in the same place
        sess.continuations += 1
        try:
            self._queue_upload_request(
                sid, sess, samples, budget, self._forced_ids(math.inf, cut_s), tail[first:], prefix
            )
        except LivemeetError as exc:
            sess.continuations -= 1
            log.warning("upload %s stopped at %.1f s and cannot continue: %s", sid, cut_s, exc)
            return False
        log.info(
            "upload %s stopped at %.1f s of %.1f: continuing with %d forced ids (%d of %d)",
            sid, cut_s, transcript.max_stamp_s, len(prefix), sess.continuations,
            UPLOAD_MAX_CONTINUATIONS,
        )  # fmt: skip
        sess.cut_s = cut_s
        if sess.continuations >= UPLOAD_MAX_CONTINUATIONS:
            sess.samples = None  # no further continuation: the engine holds what it needs
        self.num_upload_continuations += 1
        return True

    # -- live --------------------------------------------------------------------------------

    def _submit_hop(self, sid: str, sess: LiveState, due_s: float | None = None) -> None:
        engine = self._engine()
        window = sess.live.window()  # fixes the hop's audio edge and the committed end
        edge = round(window.end_s * SAMPLE_RATE)
        audio = sess.audio_to(edge)
        rid = f"{sid}/hop{sess.num_hops:06d}"
        sess.num_hops += 1
        fork_from, num_fork = None, 0
        prev = sess.retained
        if prev is not None:
            # Stable with respect to the previous hop's audio: its pads over windows that were
            # complete then (final embeddings) and the markers it had already placed.
            num_fork = stable_prefix_len(
                prev.num_audio_tokens, prev.num_complete_windows, config=engine.prompt_config
            )
            fork_from = prev.request_id
        prefix = sess.forced_transcript_ids(
            self._encode,
            sess.forced_budget.tokens,
            self._pieces_join(),
            self._added_ids(),
            cap=self.config.live_forced_transcript_tokens,
        )
        draft = []
        if self.config.live_draft:
            draft = hop_draft(sess.assistant_ids, sess.assistant_prefix_len, prefix)
        window_keys = sess.full_window_keys(audio)
        engine.hold_windows(sid, window_keys)  # encoded once for the session (released: _drop)
        # the model writes marker time (LiveOptions.time_scale): so do the hop's cut and edge.
        # The cut is never below the committed end itself: the window start is that end
        # rounded to a sample, and a committed zero-length segment would pass it again.
        live = sess.live
        offset_s = max(live.stamp_s(window.offset_s), live.committed_end_s)
        edge_s = live.stamp_s(window.end_s)
        tail_from_s = offset_s if prefix else None
        slack_s = 0.0 if live.end_pending else sess.options.hop_s
        try:
            request = engine.add_request(
                rid,
                audio,
                prompt=sess.options.prompt,
                hotwords=sess.options.hotwords,
                request_class=RequestClass.LIVE,
                max_new_tokens=self._hop_max_new_tokens(sess.options, window, prefix),
                # from when it was due: a hop that waited its turn to be submitted goes first;
                # a session's last hop, after `end`, has no hop of slack (its client waits for
                # transcript.final: DESIGN 5.7, within ~2 s of `end`; once per session, unlike
                # `finalize`, which a client could send with every frame to go first)
                deadline_s=(engine.clock() if due_s is None else due_s) + slack_s,
                forced_output_ids=self._forced_ids(edge_s, tail_from_s),
                prefix_token_ids=prefix,
                draft_token_ids=draft,
                retain_kv=True,
                fork_from=fork_from,
                num_fork_tokens=num_fork,
                window_keys=window_keys,
                samples_checked=True,  # LiveSession.receive_audio checked every chunk
            )
        finally:
            if prev is not None:  # a fork released it already; else free it now
                self._owner.pop(prev.request_id, None)
                engine.abort(prev.request_id)
                sess.retained = None
        _log_request(request, audio.size)
        sess.num_reused_tokens += request.num_cached_tokens
        self.num_reused_tokens += request.num_cached_tokens
        self.live_forced_tokens += len(prefix)
        forced = sess.prefix_segments if prefix else ()
        now = engine.clock()
        sess.hop = HopState(
            rid,
            edge,
            offset_s,
            SegmentStream(
                IncrementalDetokenizer(engine.tokenizer),
                edge_s,
                forced,
            ),
            frozenset(s.speaker for s in forced),
            now,
            now if due_s is None else min(due_s, now),
            list(prefix),
        )
        self.live_hop_wait_s += now - sess.hop.due_s
        self._owner[rid] = sid

    def _finish_hop(self, sid: str, sess: LiveState, reason: FinishReason) -> list[Event]:
        hop = sess.hop
        assert hop is not None
        sess.hop = None
        self.num_live_hops += 1
        now = self._engine().clock()
        self.live_hop_s += now - hop.submitted_s
        first = now if hop.first_token_s is None else hop.first_token_s
        self.live_hop_first_token_s += first - hop.submitted_s
        hop.segments.extend(hop.stream.close())
        if hop.stream.looping:
            reason = FinishReason.REPETITION
            # a loop seen only at close: the engine finished the hop normally and kept its KV
            # for a next hop that will not fork it (a no-op when _on_token aborted it)
            self._engine().abort(hop.request_id)
        else:
            sess.retained = RetainedKV(
                hop.request_id,
                num_audio_tokens(hop.edge_samples),
                hop.edge_samples // WINDOW_SAMPLES,
            )
        sess.last_reason = reason
        sess.assistant_ids, sess.assistant_prefix_len = [], 0
        if reason is FinishReason.STOP:  # a whole hop (not a loop, not cut): the next's draft
            decoded = hop.output_ids[:-1] if hop.output_ids[-1:] == [EOS] else hop.output_ids
            sess.assistant_ids = hop.prefix_ids + decoded
            sess.assistant_prefix_len = len(hop.prefix_ids)
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            # a hop cut short (a loop) would look fast: only whole hops say how loaded the GPU is
            # from when the hop was due: a wait for submission is load the GPU did not take
            sess.forced_budget = self.forced_budget.after_hop(
                sess.forced_budget, now - hop.due_s, sess.options.hop_s
            )
        # The hypothesis covers all audio; keep what lies after the last final.
        new = keep_after_cut(hop.segments, hop.offset_s, sess.live.committed)
        events = sess.live.apply_hypothesis(new, hop.session_labels)
        return self._after_live_events(sid, sess, events)

    def _after_live_events(self, sid: str, sess: LiveState, events: list[Event]) -> list[Event]:
        if sess.live.ended:
            revise = sess.options.revise and (sess.length + len(sess.chunks)) > 0
            final = sess.live.finish(sess.last_reason, revision=revise)
            events.append(final)
            if revise:
                events += self._start_revision(sid, sess, final)
            else:
                self._drop(sid, sess)
        return events

    # -- engine output -----------------------------------------------------------------------

    def _on_token(self, rid: str, token_id: int) -> list[tuple[str, Event]]:
        sid = self._owner.get(rid)
        if sid is None:
            return []
        sess = self._sessions[sid]
        if isinstance(sess, UploadState):
            assert sess.stream is not None
            sess.num_generated += 1
            events = self._upload_events(sess, sess.stream.push(token_id))
            if sess.stream.looping:
                self._engine().abort(rid)
                events += self._finish_upload(sid, sess, FinishReason.REPETITION)
            return [(sid, e) for e in events]
        hop = sess.hop
        assert hop is not None and hop.request_id == rid
        if hop.first_token_s is None:
            hop.first_token_s = self._engine().clock()
        hop.output_ids.append(token_id)
        released = hop.stream.push(token_id)
        hop.segments.extend(released)
        if hop.stream.looping:
            self._owner.pop(rid, None)
            self._engine().abort(rid)
            return [(sid, e) for e in self._finish_hop(sid, sess, FinishReason.REPETITION)]
        if not released or not hop.session_labels:  # no preview without forced labels
            return []
        # a segment closed mid-hop goes out now, not when the hop ends (LiveSession.preview)
        new = keep_after_cut(hop.segments, hop.offset_s, sess.live.committed)
        return [(sid, e) for e in sess.live.preview(new, hop.session_labels)]

    def _on_finished(self, rid: str, reason: FinishReason) -> list[tuple[str, Event]]:
        sid = self._owner.pop(rid, None)
        if sid is None:
            return []
        sess = self._sessions[sid]
        if isinstance(sess, UploadState):
            events = self._finish_upload(sid, sess, reason)
        else:
            events = self._finish_hop(sid, sess, reason)
        return [(sid, e) for e in events]

    def _finish_upload(self, sid: str, sess: UploadState, reason: FinishReason) -> list[Event]:
        assert sess.stream is not None and sess.transcript is not None
        segments = sess.stream.close()
        # a segment the decode left open (EOS before its end stamp) is given the audio's end:
        # it must not hide an early stop, so the decision is taken on the closed ones, and a
        # continuation decodes it again
        open_tail = segments[-1:] if segments and is_open(segments[-1]) else []
        events = self._upload_events(sess, segments[: len(segments) - len(open_tail)])
        if sess.stream.looping:
            reason = FinishReason.REPETITION
        if self._continue_upload(sid, sess, reason):
            return events
        events += self._upload_events(sess, open_tail)
        if sess.revise is None:
            events.append(sess.transcript.final(reason))
        else:
            events.append(self._revised(sess.revise, sess.transcript.segments, reason))
        self._drop(sid, sess)
        return events

    # -- revision (DESIGN 5.7) -----------------------------------------------------------------

    def _start_revision(self, sid: str, sess: LiveState, final: TranscriptFinal) -> list[Event]:
        """Make the ended live session `sid` the upload of its revision (module docstring):
        its request forks the last hop's retained KV, which is then released. Returns [] , or
        the revision's `Error` where the engine refuses the request (the session is gone)."""
        engine = self._engine()
        audio = sess.audio_to(sess.length + sum(c.size for c in sess.chunks))
        revision = UploadState(
            replace(sess.options, live=False),
            ended=True,
            revise=Revising(final, sess.live.labels_seen, sess.live.merges),
        )
        duration_s = audio.size / SAMPLE_RATE
        revision.transcript = UploadTranscript(duration_s, duration_s * self._time_scale())
        if revision.transcript.max_stamp_s >= UPLOAD_CONTINUE_GAP_S:
            revision.samples = audio  # for a continuation (DESIGN 5.8)
        prev, sess.retained = sess.retained, None
        fork_from, num_fork = None, 0
        if prev is not None:
            # as a next hop would: the last hop's audio is all of it, its stable prefix holds
            num_fork = stable_prefix_len(
                prev.num_audio_tokens, prev.num_complete_windows, config=engine.prompt_config
            )
            fork_from = prev.request_id
        self._sessions[sid] = revision
        try:
            self._queue_upload_request(
                sid, revision, audio, self._max_new_tokens(sess.options), self._forced_ids(None),
                fork_from=fork_from, num_fork_tokens=num_fork,
                window_keys=sess.full_window_keys(audio),
            )  # fmt: skip
        except LivemeetError as exc:
            log.warning("live session %s: revision not started: %s", sid, exc)
            self._drop(sid, revision)
            return [Error(exc.code, f"revision not started: {exc.message}", exc.retryable)]
        finally:
            if prev is not None:  # forked (or refused): the hop's KV goes
                self._owner.pop(prev.request_id, None)
                engine.abort(prev.request_id)
        self.num_revisions += 1
        return []

    def _revised(
        self, revising: Revising, segments: Sequence[Segment], reason: FinishReason
    ) -> TranscriptRevised:
        """The revision's event: `segments` in session labels and with fresh ids, superseding
        every final."""
        finals = revising.final.segments
        mapped = map_revision(segments, finals, revising.labels_seen, revising.merges)
        return TranscriptRevised(
            revision_segments(mapped, finals), tuple(seg.id for seg in finals), reason
        )

    # -- forced output (benchmarks) ----------------------------------------------------------

    def _load_forced(self, path: Path) -> None:
        text, segments = read_forced_output(path)
        self._forced_text = text
        self._forced = segments
        self._forced_skip_keys = forced_skip_keys(segments)
        self._forced_pieces = [segment_pieces(self._encode, render_segment(s)) for s in segments]
        self._close_ids = self._encode("]")  # a hop's forced ids end with it

    def _max_new_tokens(self, options: SessionOptions) -> int | None:
        """The session's budget, capped by the server's `--max-new-tokens`; None lets the
        engine scale it with the audio duration."""
        wanted = [n for n in (options.max_new_tokens, self.config.max_new_tokens) if n]
        return min(wanted) if wanted else None

    def _hop_max_new_tokens(
        self, options: SessionOptions, window: Window, prefix: Sequence[int]
    ) -> int | None:
        """A hop that decodes only the tail after a forced transcript gets the budget of the
        open window's audio (`output_budget`), not the whole meeting's."""
        budget = self._max_new_tokens(options)
        if not prefix:
            return budget
        max_model_len = self._engine().scheduler.config.max_model_len
        tail = output_budget(window.end_s - window.offset_s, 0, max_model_len)
        return min(budget, tail) if budget else tail

    def _time_scale(self) -> float:
        """Seconds of the model's timestamps per second of audio: marker time
        (`PromptConfig.marker_time_scale`), or 1.0 with a forced output, whose reference
        transcript is in audio time (benchmarks measure latency from its ends, so a segment
        must never be forced before it is heard)."""
        if self._forced is not None:
            return 1.0
        return self._engine().prompt_config.marker_time_scale

    def _encode(self, text: str) -> list[int]:
        return list(self._engine().tokenizer.encode(text, add_special_tokens=False).ids)

    def _forced_ids(
        self, edge_s: float | None, tail_from_s: float | None = None
    ) -> list[int] | None:
        """Token ids to force: the whole file (uploads), or what a perfect model writes for the
        audio up to `edge_s` (a live hop, `forced_hop_parts`): the words spoken by the edge,
        after `tail_from_s` when the hop follows a forced transcript (which ends before its last
        `]`: the ids then start with it). A segment still being spoken ends with its last word
        spoken, no end stamp: EOS follows and the parser keeps it open (MISSING_END), as a
        model's turn in progress. Whole segments' ids come from each one's, tokenized once at
        load; a part of a segment is tokenized per hop."""
        if self._forced is None or self._forced_text is None:
            return None
        if edge_s is None:
            return self._encode(self._forced_text)
        after = -1.0 if tail_from_s is None else tail_from_s
        parts = forced_hop_parts(self._forced, edge_s, after, self._forced_skip_keys)
        close = tail_from_s is not None  # the forced transcript's last `]` is still to come
        if not self._pieces_join():
            text = "".join(part.rendered for part in parts)
            return self._encode("]" * close + text)
        ids: list[int] = []
        for k, part in enumerate(parts):
            after_close = k > 0 or close
            if part.index is not None:  # a whole segment
                piece = self._forced_pieces[part.index]
                ids += piece.cont if after_close else piece.lead
            else:
                body = part.rendered[:-1] if part.closed else part.rendered
                ids += self._encode("]" * after_close + body)
        if not parts:
            return list(self._close_ids) if close else []
        return ids + self._close_ids if parts[-1].closed else ids

    def _added_ids(self) -> frozenset[int]:
        """Ids of the tokenizer's added (special) tokens, read once."""
        if self._added is None:
            self._added = frozenset(self._engine().tokenizer.get_added_tokens_decoder())
        return self._added

    def _pieces_join(self) -> bool:
        """Whether the engine's tokenizer joins per-segment ids exactly (`splits_after_digits`,
        checked once)."""
        if self._exact_pieces is None:
            self._exact_pieces = splits_after_digits(self._encode)
            if not self._exact_pieces:
                log.warning("the tokenizer does not split after digits: forced ids are re-encoded")
        return self._exact_pieces


def engine_config(cfg: ModelConfig) -> EngineConfig:
    """The Engine's configuration for a backend's ModelConfig (its flags, scheduler included;
    ms flags become seconds). Raises ConfigError for an unknown `upload_hold`; the rest is
    validated by `ModelConfig.validate` and the Engine's own configs."""
    return EngineConfig(
        model=cfg.model,
        load_format=cfg.load_format,
        device=cfg.device,
        dtype=cfg.dtype,
        num_kv_blocks=cfg.num_kv_blocks,
        kv_cache_dtype=cfg.kv_cache_dtype,
        block_size=cfg.kv_block_size,
        prefill_graphs=cfg.prefill_graphs,
        mem_fraction=cfg.mem_fraction,
        scheduler=SchedulerConfig(
            chunked_prefill_size=cfg.chunked_prefill_size,
            upload_batch_wait_s=cfg.upload_batch_wait_ms / 1000.0,
            upload_hold=parse_upload_hold(cfg.upload_hold),
            upload_step_budget_s=cfg.upload_step_budget_ms / 1000.0,
            upload_min_share=cfg.upload_min_share,
            step_budget_s=cfg.live_step_budget_ms / 1000.0,
            live_decode_steps=cfg.live_decode_steps,
            max_num_batched_tokens=max(
                SchedulerConfig.max_num_batched_tokens, cfg.chunked_prefill_size
            ),
        ),
    )


def _log_request(request: Request, num_samples: int) -> None:
    log.info(
        "request %s: %d audio tokens, %d prompt tokens, %d reused, budget %d",
        request.request_id,
        len(request.audio_positions),
        request.num_prompt_tokens,
        request.num_cached_tokens,
        request.max_new_tokens,
        extra={
            "num_audio_tokens": len(request.audio_positions),
            "num_prompt_tokens": request.num_prompt_tokens,
            "num_samples": num_samples,
        },
    )


def create_moss(config: ModelConfig) -> MossCore:
    """Registry factory."""
    return MossCore(config)
