"""The MOSS-TD backend's revision of a live session (DESIGN 5.7) on the tiny random checkpoint:
after the final, one upload-priority request over the whole meeting that forks the last hop's
KV, mapped onto the session's labels."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends.moss import MossCore
from livemeet.engine.request import Request, RequestClass
from livemeet.models.audio_llm import MossTDModel
from livemeet.transcriber import (
    Error,
    Event,
    SegmentFinal,
    SessionOptions,
    TranscriptFinal,
    TranscriptRevised,
)
from livemeet.transcript.parser import parse_transcript
from tests.backends.helpers import run_to_idle
from tests.backends.test_moss import LIVE_REFERENCE, assert_pool_clean, make_core

HOP_S = 2.0


class Added(NamedTuple):
    """A request as the engine took it: its KV reuse is counted then."""

    request: Request
    num_cached_tokens: int
    num_prompt_tokens: int


def spy_requests(core: MossCore) -> list[Added]:
    """Record every request the core adds to its engine."""
    assert core.engine is not None
    engine = core.engine
    added: list[Added] = []
    inner = engine.add_request

    def add_request(*args: object, **kwargs: object) -> Request:
        request = inner(*args, **kwargs)  # type: ignore[arg-type]
        added.append(Added(request, request.num_cached_tokens, request.num_prompt_tokens))
        return request

    engine.add_request = add_request  # type: ignore[method-assign]
    return added


def live_meeting(
    core: MossCore, audio: np.ndarray, *, revise: bool = True, sid: str = "L"
) -> list[tuple[str, Event]]:
    """Stream `audio` in hop-sized chunks with revise asked for, end, and step until idle."""
    core.open(sid, SessionOptions(live=True, hop_s=HOP_S, revise=revise))
    out: list[tuple[str, Event]] = []
    step = round(HOP_S * SAMPLE_RATE)
    for i in range(0, len(audio), step):
        core.append(sid, audio[i : i + step])
        run_to_idle(core, out)
    core.end(sid)
    run_to_idle(core, out)
    return out


@pytest.mark.slow
def test_a_live_sessions_final_is_followed_by_its_revision_forking_the_live_kv(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)
    requests = spy_requests(core)
    events = [e for _, e in live_meeting(core, clips[11.0])]
    final_at = next(i for i, e in enumerate(events) if isinstance(e, TranscriptFinal))
    final = events[final_at]
    assert isinstance(final, TranscriptFinal) and final.revision
    assert len(events) == final_at + 2  # the revision alone follows, and ends the stream
    revised = events[-1]
    assert isinstance(revised, TranscriptRevised)
    # forced output: the revision is the whole reference, in the session's labels
    want = parse_transcript(LIVE_REFERENCE)
    assert [(s.start_s, s.end_s, s.speaker, s.text) for s in revised.segments] == [
        (s.start_s, s.end_s, s.speaker, s.text) for s in want
    ]
    assert revised.supersedes == tuple(s.id for s in final.segments)
    assert len(revised.supersedes) == len(want)
    assert [s.id for s in revised.segments] == [f"rev-{i + 1:04d}" for i in range(len(want))]
    assert all(s.is_final for s in revised.segments)
    # one upload-class request over the meeting that forked the last hop's stable prefix
    (revise,) = [a for a in requests if a.request.request_id.startswith("L/revise")]
    assert revise.request.request_class is RequestClass.UPLOAD
    assert 0 < revise.num_cached_tokens < revise.num_prompt_tokens
    assert core.num_revisions == 1
    assert_pool_clean(core)


@pytest.mark.slow
def test_without_revise_the_final_ends_the_session_as_before(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)
    requests = spy_requests(core)
    events = [e for _, e in live_meeting(core, clips[11.0], revise=False)]
    assert isinstance(events[-1], TranscriptFinal) and not events[-1].revision
    assert not any(isinstance(e, TranscriptRevised) for e in events)
    assert not any("revise" in a.request.request_id for a in requests)
    assert_pool_clean(core)


@pytest.mark.slow
def test_a_failing_revision_sends_an_error_after_an_intact_final(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)

    def broken(*args: object) -> TranscriptRevised:
        raise RuntimeError("revision assembly broke")

    core._revised = broken  # type: ignore[method-assign]
    events = [e for _, e in live_meeting(core, clips[11.0])]
    final, error = events[-2:]
    assert isinstance(final, TranscriptFinal) and final.revision
    finals = tuple(e.segment for e in events if isinstance(e, SegmentFinal))
    assert final.segments == finals and len(finals) == len(parse_transcript(LIVE_REFERENCE))
    assert isinstance(error, Error) and "assembly failed: RuntimeError" in error.message
    assert "revision assembly broke" not in error.message  # the exception's text: the log's
    assert_pool_clean(core)


@pytest.mark.slow
def test_an_abort_after_the_final_cancels_the_revision_and_frees_its_kv(
    our_model: MossTDModel, clips: dict[float, np.ndarray], tmp_path: Path
) -> None:
    core = make_core(our_model, tmp_path, forced=LIVE_REFERENCE)
    audio = clips[11.0]
    core.open("L", SessionOptions(live=True, hop_s=HOP_S, revise=True))
    out: list[tuple[str, Event]] = []
    core.append("L", audio)
    run_to_idle(core, out)
    core.end("L")
    while not any(isinstance(e, TranscriptFinal) for _, e in out):
        out.extend(core.step())
    assert core.engine is not None and core.engine.has_work()  # the revision runs
    core.abort("L")
    run_to_idle(core, out)
    assert not any(isinstance(e, TranscriptRevised | Error) for _, e in out)
    assert_pool_clean(core)
