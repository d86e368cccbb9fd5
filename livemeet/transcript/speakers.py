"""Stable session speaker labels across live hypotheses (DESIGN.md section 5.6).

Each decode of the open window numbers its speakers afresh ("S01" is whoever it heard first),
so a hypothesis's labels are mapped onto session labels by time overlap with segments the
client has already seen (committed finals and the previous partial, both in session labels).
A session label once shown is never renumbered. A hypothesis speaker with no overlap (a speaker
returning after others talked) takes the session label it was mapped to for the most speech in
earlier hypotheses, else the lowest free session label. A mapper restored from a session's
stored finals (a restarted server, DESIGN 5.9) knows their labels as handed out, and counts
each final as speech its label was mapped to by that same label. A revision of the whole
meeting after its end (DESIGN 5.7) is mapped onto the finals' labels by overlap alone
(`map_revision`).

Merges (docs/protocol.md, `speaker.merge`): a client that sees one person split into two
labels says so ("S03 is S01"); `SpeakerMerges` keeps those merges and resolves a label to the
one it shows as, transitively. From a merge on, no new segment carries the merged-away label:
a hypothesis speaker that would be mapped to S03 gets S01, and a seen segment labelled S03
counts as evidence for S01. A merged group offers one slot per label in it, so the two
hypothesis speakers the model keeps apart may both map onto S01 (a decode that tells them
apart again does not push one of them onto a fresh label). Finals already sent keep their
labels (ids and labels never change). A merged-away label is never handed out again. Merges
are made only when a client asks: none are made automatically, since the published model
gives no evidence of a split speaker that can be validated without its real weights
(DESIGN 9).

Plain Python: no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace

from livemeet.audio.constants import MAX_MERGED_SPEAKERS
from livemeet.transcript.segments import Segment

# s of speech a restored merge's label counts as, mapped to itself: less than any final's, so
# it only decides where nothing else does
MERGED_LABEL_VOTE_S = 1e-3


def session_label(number: int) -> str:
    """ "S01", "S02", ... (the form MOSS-TD writes, MODEL.md section 6)."""
    return f"S{number:02d}"


def overlap_s(a: Segment, b: Segment) -> float:
    """Seconds during which `a` and `b` both run (0.0 if disjoint)."""
    return max(0.0, min(a.end_s, b.end_s) - max(a.start_s, b.start_s))


class SpeakerMerges:
    """A session's client-requested merges (module docstring): merged-away label -> the label
    it was merged into, in merge order. Acyclic: `add` refuses a merge that would close a
    cycle, and records the target resolved (S04 into S03 after S03 into S01 is S04 -> S01);
    a chain still forms when a target is merged away later (S04 -> S03, then S03 -> S01), and
    `resolve` follows it. `merges`: (label, into) pairs to `add` in order; raises ValueError
    as `add`."""

    def __init__(self, merges: Iterable[tuple[str, str]] = ()) -> None:
        self._into: dict[str, str] = {}
        for speaker, into in merges:
            self.add(speaker, into)

    def __contains__(self, label: object) -> bool:
        """Whether `label` is merged away."""
        return label in self._into

    def __len__(self) -> int:
        return len(self._into)

    def items(self) -> tuple[tuple[str, str], ...]:
        """(merged-away label, label it was merged into), in merge order, as recorded."""
        return tuple(self._into.items())

    def labels(self) -> frozenset[str]:
        """Every label a merge names, either side."""
        return frozenset(self._into) | frozenset(self._into.values())

    def resolve(self, label: str) -> str:
        """The label `label` shows as: itself unless merged away, else its merge's target's."""
        while label in self._into:
            label = self._into[label]
        return label

    def resolved(self) -> tuple[tuple[str, str], ...]:
        """(merged-away label, the label it shows as), in merge order: one look-up each."""
        return tuple((label, self.resolve(label)) for label in self._into)

    def slots(self, label: str) -> list[str]:
        """The labels that show as `label` (resolved first): it, then those merged into it."""
        target = self.resolve(label)
        return [target, *(m for m in self._into if self.resolve(m) == target)]

    def check(
        self, speaker: str, into: str, shown: Collection[str], limit: int = MAX_MERGED_SPEAKERS
    ) -> str:
        """A client's merge of `speaker` into `into`, checked against the labels the session
        has `shown` and its merges; returns the label `into` shows as (the merge's target).
        Raises ValueError, saying why, for a label merged into itself (after resolving `into`:
        a cycle), a label merged already, a label never shown, or a merge past `limit`."""
        if speaker == into:
            raise ValueError(f"cannot merge {speaker} into itself")
        if speaker in self._into:
            raise ValueError(
                f"{speaker} is merged into {self.resolve(speaker)} already: a merge is final"
            )
        for label in (speaker, into):
            if label not in shown and label not in self.labels():
                raise ValueError(f"{label} is not a label this session has shown")
        target = self.resolve(into)
        if target == speaker:
            raise ValueError(
                f"{into} is merged into {speaker} already: merging {speaker} into it is a cycle"
            )
        if len(self._into) >= limit:
            raise ValueError(f"a session merges at most {limit} labels")
        return target

    def add(self, speaker: str, into: str) -> None:
        """Record that `speaker` shows as `into` (resolved) from now on; a repeat of a merge
        made already is a no-op (a rebuilt session is restored with it). Raises ValueError for
        a label merged into another target already, or a cycle."""
        target = self.resolve(into)
        if speaker in self._into:
            if self.resolve(speaker) != target:
                raise ValueError(f"{speaker} is merged into {self.resolve(speaker)}, not {into}")
            return
        if target == speaker:
            raise ValueError(f"merging {speaker} into {into} is a cycle: {into} shows as {speaker}")
        self._into[speaker] = target


def assign_by_overlap(
    hypothesis: Sequence[Segment],
    seen: Iterable[Segment],
    mapping: dict[str, str],
    taken: set[str],
    merges: SpeakerMerges | None = None,
) -> None:
    """Extend `mapping` (hypothesis label -> session label) by overlap: each pair (hypothesis
    label, session label of `seen`, resolved through `merges`) scores the seconds their
    segments overlap; pairs are assigned greedily by score (ties by label), each hypothesis
    label onto a session label with a slot (`SpeakerMerges.slots`: one without merges) not in
    `taken` (updated with the slot used). Labels already in `mapping` keep theirs and score
    nothing."""
    merges = merges if merges is not None else SpeakerMerges()
    scores: dict[tuple[str, str], float] = defaultdict(float)
    seen_list = list(seen)
    for h in hypothesis:
        if h.speaker in mapping:
            continue
        for s in seen_list:
            ov = overlap_s(h, s)
            if ov > 0:
                scores[(h.speaker, merges.resolve(s.speaker))] += ov
    for (hyp_label, sess_label), _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0])):
        slot = _free_slot(sess_label, taken, merges)
        if hyp_label not in mapping and slot is not None:
            mapping[hyp_label] = sess_label
            taken.add(slot)


def _free_slot(label: str, taken: set[str], merges: SpeakerMerges) -> str | None:
    """A slot of `label`'s merged group not in `taken`, or None."""
    return next((slot for slot in merges.slots(label) if slot not in taken), None)


def map_revision(
    revised: Sequence[Segment],
    finals: Sequence[Segment],
    used: Collection[str] = (),
    merges: Iterable[tuple[str, str]] = (),
) -> tuple[Segment, ...]:
    """`revised` (a re-decode of a whole meeting, in its own labels) relabelled onto the
    session's labels (DESIGN 5.7): by overlap with the session's `finals` (`assign_by_overlap`,
    through the session's `merges`: a final of a merged-away label counts for its target, and
    none is written); a revised speaker that overlaps none of them (or whose best label went
    to another) is one the live session never had: it gets the lowest label neither the
    finals, `used` (every label the session ever showed, partials' included) nor a merge
    hold, so no label changes meaning."""
    merged = SpeakerMerges(merges)
    mapping: dict[str, str] = {}
    taken: set[str] = set()
    assign_by_overlap(revised, finals, mapping, taken, merged)
    blocked = taken | set(used) | {f.speaker for f in finals} | merged.labels()
    for seg in revised:
        if seg.speaker not in mapping:
            n = 1
            while session_label(n) in blocked:
                n += 1
            mapping[seg.speaker] = session_label(n)
            blocked.add(session_label(n))
    return tuple(replace(seg, speaker=mapping[seg.speaker]) for seg in revised)


class SpeakerMapper:
    """Maps hypothesis labels to session labels; remembers every label it has handed out.

    `restored`: the session's finals from before a restart, in session labels. Their labels
    are handed out already (a new speaker gets another), and each final votes for its own
    label by its duration (s): the votes of the hypotheses that made them are lost with the
    old process, and a backend writes a returning speaker with the label its decodes gave
    that speaker (the forced transcript prefix shows them session labels; the demo has only
    S01), so with no overlap to go on it keeps the label it had. `merges`: the session's
    merges so far ((label, target) pairs, `SpeakerMerges`); their labels are handed out too.
    Raises ValueError for `merges` that `SpeakerMerges` refuses.
    """

    def __init__(
        self, restored: Iterable[Segment] = (), merges: Iterable[tuple[str, str]] = ()
    ) -> None:
        self._seen: set[str] = set()
        # (hypothesis label, session label) -> s of speech mapped so, over all hypotheses
        self._votes: dict[tuple[str, str], float] = defaultdict(float)
        self._merges = SpeakerMerges(merges)
        self._seen.update(self._merges.labels())
        # a restored merged-away label may have been shown in partials only, which a restart
        # loses: a backend writing a returning speaker with it (as with a final's label, above)
        # means that label's speaker, so it votes for itself a little (resolved: its target)
        # rather than the speaker taking a fresh label (a trial saw S04, merged into S02,
        # come back as S05 after a restart)
        for label, _ in self._merges.items():
            self._votes[(label, label)] += MERGED_LABEL_VOTE_S
        for seg in restored:
            self._seen.add(seg.speaker)
            self._votes[(seg.speaker, seg.speaker)] += seg.end_s - seg.start_s

    @property
    def seen(self) -> frozenset[str]:
        """Every session label used so far (restored finals' and merges' labels included)."""
        return frozenset(self._seen)

    @property
    def merges(self) -> tuple[tuple[str, str], ...]:
        """The session's merges, as `SpeakerMerges.items`."""
        return self._merges.items()

    def merge(self, speaker: str, into: str) -> None:
        """From now on `speaker` maps to `into`'s target (module docstring); neither is ever
        handed out as a fresh label. A repeat is a no-op. Raises ValueError as
        `SpeakerMerges.add`."""
        self._merges.add(speaker, into)
        self._seen.update((speaker, into))

    def resolve(self, label: str) -> str:
        """The session label `label` shows as (`SpeakerMerges.resolve`)."""
        return self._merges.resolve(label)

    def map(
        self,
        hypothesis: Sequence[Segment],
        seen: Iterable[Segment],
        session_labels: Collection[str] = (),
    ) -> tuple[Segment, ...]:
        """`hypothesis` relabelled into session labels, none of them merged away.

        `seen`: segments already shown to the client, in session labels. Each pair (hypothesis
        label, session label) scores the total overlap of their segments; pairs are assigned
        greedily by score, one slot of a session label per hypothesis label (one per label in
        its merged group: `SpeakerMerges.slots`). `session_labels`: labels the decode already
        writes in session terms (a forced transcript prefix carried them); they keep their
        meaning (a merged-away one its target's) and cast no votes.
        """
        mapping = {label: self.resolve(label) for label in session_labels}
        taken = set(session_labels)  # slots, not targets: S01 and S03 may both be S01
        assign_by_overlap(hypothesis, seen, mapping, taken, self._merges)
        for h in hypothesis:
            if h.speaker in mapping:
                continue
            slot = self._remembered(h.speaker, taken) or self._next_free(taken)
            mapping[h.speaker] = self.resolve(slot)
            taken.add(slot)
        self._seen.update(mapping[h.speaker] for h in hypothesis)
        for h in hypothesis:
            if h.speaker not in session_labels:
                self._votes[(h.speaker, mapping[h.speaker])] += h.end_s - h.start_s
        return tuple(replace(h, speaker=mapping[h.speaker]) for h in hypothesis)

    def _remembered(self, hyp_label: str, taken: set[str]) -> str | None:
        """A free slot of the session label `hyp_label` was mapped to for the most speech
        (votes for a merged-away label count for its target), or None."""
        votes: dict[str, float] = defaultdict(float)
        for (h, s), v in self._votes.items():
            if h == hyp_label:
                votes[self.resolve(s)] += v
        for label, _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0])):
            slot = _free_slot(label, taken, self._merges)
            if slot is not None:
                return slot
        return None

    def _next_free(self, taken: set[str]) -> str:
        # `_seen` holds every merged label: one is never a fresh speaker's
        n = 1
        while session_label(n) in self._seen or session_label(n) in taken:
            n += 1
        return session_label(n)
