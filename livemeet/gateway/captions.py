"""The fan-out policy of captions subscriptions (docs/protocol.md, "Captions"), Sans-I/O.

A live session's events go to its own client and to any number of read-only subscribers
(caption overlays). The session's pump hands every event to each subscriber's
`CaptionsOutbox` synchronously and never waits for a subscriber's socket: each subscriber
has its own sender (gateway/ws_captions.py) that drains its outbox. The outbox is bounded, so
a slow subscriber costs a bounded amount of memory and nobody else's time:

- a `segment.partial` replaces the one not yet sent (each is the whole open tail), wherever
  it sits in the queue (the newer one goes last: finals queued before it came first);
- a `speaker.renamed` replaces an unsent one for the same label (each is the label's whole
  name), so renames queue at most one per label; a client may rename (or unname) any number
  of labels, so past `max_renames` unsent ones the subscriber is closed as for finals;
- a `speaker.merged` queues in order, never replaced (each merges another label for good); a
  session makes at most MAX_MERGED_SPEAKERS, and past `max_merges` unsent ones (which its
  snapshot and live merges together cannot reach) the subscriber is closed as for finals;
- finals queue in order; a subscriber with more than `max_finals` of them unsent has fallen
  too far behind to be worth catching up: its queue is dropped and replaced by a
  `queue_full` error (it reconnects for a fresh snapshot);
- the terminal event (`transcript.final`, or the session's `error`) always queues, last;
  nothing is queued after it. Where the final promises a revision (DESIGN 5.7), the
  revision (`transcript.revised`, or its `revision_failed` error) is the terminal one, queued
  after the final.

No sockets, no asyncio; the transport calls `push()` and `pop()`.
"""

from __future__ import annotations

from collections import deque

from livemeet.audio.constants import MAX_MERGED_SPEAKERS, MAX_NAMED_SPEAKERS
from livemeet.errors import LivemeetError, QueueFull
from livemeet.gateway.live_protocol import SpeakerMerged, SpeakerRenamed
from livemeet.gateway.live_replay import SessionEvent
from livemeet.transcriber import (
    Error,
    SegmentFinal,
    SegmentPartial,
    TranscriptFinal,
    TranscriptRevised,
)
from livemeet.transcriber import is_terminal as ends_stream

# what an outbox holds: a session event (the backend's, a rename or a merge), or the error
# the subscriber is closed with
Outgoing = SessionEvent | LivemeetError


class CaptionsOutbox:
    """One subscriber's unsent events. `num_finals` counts the finals queued now."""

    def __init__(
        self,
        max_finals: int,
        max_renames: int = MAX_NAMED_SPEAKERS,
        max_merges: int = MAX_MERGED_SPEAKERS,
    ) -> None:
        if max_finals < 1:
            raise ValueError(f"max_finals must be >= 1, not {max_finals}")
        self.max_finals = max_finals
        self.max_renames = max_renames
        self.max_merges = max_merges
        self.num_finals = 0
        self.num_renames = 0
        self.num_merges = 0
        self._queue: deque[Outgoing] = deque()
        self._closed = False  # a terminal item is queued (or was sent): nothing goes after it

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, event: SessionEvent) -> None:
        """Queue a session event (synchronous, never blocks). Events the captions do not carry
        (upload text deltas) are dropped. A final that promises a revision keeps the queue
        open for it (`transcript.revised`, or its `revision_failed` error)."""
        if self._closed:
            return
        if isinstance(event, SegmentPartial):
            self._drop_partial()
            self._queue.append(event)
        elif isinstance(event, SpeakerRenamed):
            if not self._drop_rename(event.speaker) and self.num_renames >= self.max_renames:
                self._fell_behind(self.max_renames, "speaker renames")
                return
            self._queue.append(event)
            self.num_renames += 1
        elif isinstance(event, SpeakerMerged):
            if self.num_merges >= self.max_merges:
                self._fell_behind(self.max_merges, "speaker merges")
                return
            self._queue.append(event)
            self.num_merges += 1
        elif isinstance(event, SegmentFinal):
            if self.num_finals >= self.max_finals:
                self._fell_behind(self.max_finals, "finals")
                return
            self._queue.append(event)
            self.num_finals += 1
        elif isinstance(event, TranscriptFinal | TranscriptRevised | Error):
            self._queue.append(event)
            self._closed = ends_stream(event)

    def _fell_behind(self, limit: int, what: str) -> None:
        self.fail(
            QueueFull(
                f"this captions subscriber fell more than {limit} {what} behind the session: "
                "reconnect for a fresh snapshot"
            )
        )

    def fail(self, error: LivemeetError) -> None:
        """Close the subscription with `error`: what is still queued is dropped (it is sent
        no more), the error is the last item."""
        if self._closed:
            return
        self._queue.clear()
        self.num_finals = 0
        self.num_renames = 0
        self.num_merges = 0
        self._queue.append(error)
        self._closed = True

    def pop(self) -> Outgoing | None:
        """The next item to send, or None when the queue is empty."""
        if not self._queue:
            return None
        item = self._queue.popleft()
        if isinstance(item, SegmentFinal):
            self.num_finals -= 1
        elif isinstance(item, SpeakerRenamed):
            self.num_renames -= 1
        elif isinstance(item, SpeakerMerged):
            self.num_merges -= 1
        return item

    def _drop_partial(self) -> None:
        # at most one partial is ever queued, so one scan finds it
        for i, item in enumerate(self._queue):
            if isinstance(item, SegmentPartial):
                del self._queue[i]
                return

    def _drop_rename(self, speaker: str) -> bool:
        # at most one rename per label is ever queued
        for i, item in enumerate(self._queue):
            if isinstance(item, SpeakerRenamed) and item.speaker == speaker:
                del self._queue[i]
                self.num_renames -= 1
                return True
        return False


def is_terminal(item: Outgoing) -> bool:
    """Whether the subscription closes after sending `item`."""
    return isinstance(item, LivemeetError) or ends_stream(item)
