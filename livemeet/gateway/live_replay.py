"""What a live session tells a socket that joins it late (docs/protocol.md, "Resume" and
"Captions"): `ReplayState` keeps, as the session's pump records its events, every final, the
latest partial, the speakers' names and merges (those the journal holds apart: only they are
told), the terminal event and the revision; `snapshot` is what a resume or a new captions
subscriber is sent first, `speaker_maps` the names and merges its ready message carries.
Plain Python: the holder (gateway/live_holder.py) owns one per session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from livemeet.gateway.live_protocol import SpeakerMerged, SpeakerRenamed
from livemeet.transcriber import (
    Error,
    Event,
    SegmentFinal,
    SegmentPartial,
    TranscriptFinal,
    TranscriptRevised,
)
from livemeet.transcript.segments import Segment
from livemeet.transcript.speakers import SpeakerMerges

Terminal = TranscriptFinal | Error
# what a session's sockets are handed: the backend's events and the gateway's own renames
# and merges
SessionEvent = Event | SpeakerRenamed | SpeakerMerged


@dataclass
class ReplayState:
    """What a resume is sent: every final so far in order, the speakers' names and merges,
        the latest partial, the session's outcome (`terminal`: its final transcript or its
        error) once it came, and after a final that promised one, its revision
        (`TranscriptRevised`, or the `revision_failed` error). Finals are immutable with stable
        ids, so a client that saw some of them dedupes by id; a name replaces the label's earlier
        one. `labels_shown`: every label a segment sent so far carried (a merge names two; a session
    rebuilt after a restart starts with those its journal kept).
        `names` and `merges` are the session's as soon as a client makes them; `told_names` and
        `told_merges` those answered (`told`: the journal holds them), which a snapshot tells."""

    finals: list[SegmentFinal] = field(default_factory=list)
    partial: SegmentPartial | None = None
    terminal: Terminal | None = None
    names: dict[str, str] = field(default_factory=dict)  # label -> name, first named first
    merges: SpeakerMerges = field(default_factory=SpeakerMerges)
    labels_shown: set[str] = field(default_factory=set)
    revision: TranscriptRevised | Error | None = None
    # a name or merge whose journal commit is under way is not told yet: a resume's
    # session.ready that told it, then a crash, took it back from the client (a stress trial)
    told_names: dict[str, str] = field(default_factory=dict)
    told_merges: SpeakerMerges = field(default_factory=SpeakerMerges)

    @property
    def revision_pending(self) -> bool:
        """The final promised a revision that has not come (nor failed) yet."""
        terminal = self.terminal
        return isinstance(terminal, TranscriptFinal) and terminal.revision and not self.revision

    def record(self, event: SessionEvent) -> None:
        """Keep what a resume will need of `event`: a final, the latest partial, a name (a
        null name removes the label's), a merge, the terminal event."""
        if isinstance(event, SpeakerRenamed):
            if event.name is None:
                self.names.pop(event.speaker, None)
            else:
                self.names[event.speaker] = event.name
        elif isinstance(event, SpeakerMerged):
            self.merges.add(event.speaker, event.into)
        elif isinstance(event, SegmentFinal):
            self.finals.append(event)
            self.labels_shown.add(event.segment.speaker)
        elif isinstance(event, SegmentPartial):
            self.partial = event
            self.labels_shown.update(seg.speaker for seg in event.segments)
        elif self.revision_pending and isinstance(event, TranscriptRevised | Error):
            self.revision = event
        elif isinstance(event, TranscriptFinal | Error):
            self.terminal = event

    def told(self, event: SpeakerRenamed | SpeakerMerged) -> None:
        """`event`, a rename or merge `record`ed before, is answered (the journal holds it, or
        there is no journal): snapshots tell it from now on."""
        if isinstance(event, SpeakerMerged):
            self.told_merges.add(event.speaker, event.into)
        elif event.name is None:
            self.told_names.pop(event.speaker, None)
        else:
            self.told_names[event.speaker] = event.name

    def restore_speakers(
        self, names: Sequence[tuple[str, str]], merges: Sequence[tuple[str, str]]
    ) -> None:
        """A session rebuilt from the journal: its names and merges, all held there (told).
        Raises ValueError as `SpeakerMerges` for merges it refuses."""
        self.names, self.told_names = dict(names), dict(names)
        self.merges, self.told_merges = SpeakerMerges(merges), SpeakerMerges(merges)

    def as_shown(self, event: SessionEvent) -> SessionEvent:
        """`event` as the session shows it once merges were made: a segment the client has not
        seen carries no merged-away label (the backend may have decoded it before the merge
        reached it), the final transcript holds each final with the label it was sent with,
        and it and a revision carry the merges (`merged`). Other events as they are."""
        merges = self.merges
        if not len(merges):
            return event
        if isinstance(event, SegmentPartial):
            return replace(event, segments=self._resolved(event.segments))
        if isinstance(event, SegmentFinal):
            return SegmentFinal(self._resolved((event.segment,))[0])
        if isinstance(event, TranscriptRevised):
            segments = self._resolved(event.segments)
            return replace(event, segments=segments, merged=merges.resolved())
        if isinstance(event, TranscriptFinal):
            sent = {f.segment.id: f.segment for f in self.finals}
            segments = tuple(
                sent.get(seg.id) or self._resolved((seg,))[0] for seg in event.segments
            )
            return replace(event, segments=segments, merged=merges.resolved())
        return event

    def _resolved(self, segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
        return tuple(replace(s, speaker=self.merges.resolve(s.speaker)) for s in segments)

    def snapshot(self, max_finals: int | None = None) -> list[SessionEvent]:
        """The events to replay, in order: the finals (the last `max_finals` of them, if
        given), a `speaker.renamed` per named label, a `speaker.merged` per merge (in merge
        order), those answered so far (`told`: one still waiting for the journal is answered
        when it is held), then the terminal event, or else the partial (the final transcript
        holds every segment)."""
        finals = self.finals if max_finals is None else self.finals[-max_finals:]
        events: list[SessionEvent] = list(finals) if max_finals != 0 else []
        events.extend(SpeakerRenamed(label, name) for label, name in self.told_names.items())
        events.extend(SpeakerMerged(label, into) for label, into in self.told_merges.items())
        if self.terminal is not None:
            events.append(self.terminal)
            if self.revision is not None:
                events.append(self.revision)
        elif self.partial is not None:  # decoded before a later merge, maybe: as shown now
            events.append(self.as_shown(self.partial))
        return events


def speaker_maps(snapshot: list[SessionEvent]) -> dict[str, dict[str, str]]:
    """The names (`speakers`, {label: name}) and merges (`merged`, {label: into}) that a
    snapshot's `speaker.renamed` and `speaker.merged` events give: a resume's
    `session.ready` and a subscriber's `captions.ready` carry them, so a client replaces its
    own at once rather than waiting for the snapshot's frames (docs/protocol.md)."""
    return {
        "speakers": {
            e.speaker: e.name
            for e in snapshot
            if isinstance(e, SpeakerRenamed) and e.name is not None  # a snapshot has no null
        },
        "merged": {e.speaker: e.into for e in snapshot if isinstance(e, SpeakerMerged)},
    }
