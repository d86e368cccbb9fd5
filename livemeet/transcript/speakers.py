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

Plain Python: no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace

from livemeet.transcript.segments import Segment


def session_label(number: int) -> str:
    """ "S01", "S02", ... (the form MOSS-TD writes, MODEL.md section 6)."""
    return f"S{number:02d}"


def overlap_s(a: Segment, b: Segment) -> float:
    """Seconds during which `a` and `b` both run (0.0 if disjoint)."""
    return max(0.0, min(a.end_s, b.end_s) - max(a.start_s, b.start_s))


def assign_by_overlap(
    hypothesis: Sequence[Segment],
    seen: Iterable[Segment],
    mapping: dict[str, str],
    taken: set[str],
) -> None:
    """Extend `mapping` (hypothesis label -> session label) by overlap: each pair (hypothesis
    label, session label of `seen`) scores the seconds their segments overlap; pairs are
    assigned greedily by score (ties by label), one session label per hypothesis label, never
    a label in `taken` (updated). Labels already in `mapping` keep theirs and score nothing."""
    scores: dict[tuple[str, str], float] = defaultdict(float)
    seen_list = list(seen)
    for h in hypothesis:
        if h.speaker in mapping:
            continue
        for s in seen_list:
            ov = overlap_s(h, s)
            if ov > 0:
                scores[(h.speaker, s.speaker)] += ov
    for (hyp_label, sess_label), _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0])):
        if hyp_label not in mapping and sess_label not in taken:
            mapping[hyp_label] = sess_label
            taken.add(sess_label)


def map_revision(
    revised: Sequence[Segment], finals: Sequence[Segment], used: Collection[str] = ()
) -> tuple[Segment, ...]:
    """`revised` (a re-decode of a whole meeting, in its own labels) relabelled onto the
    session's labels (DESIGN 5.7): by overlap with the session's `finals` (`assign_by_overlap`);
    a revised speaker that overlaps none of them (or whose best label went to another) is one
    the live session never had: it gets the lowest label neither the finals nor `used` (every
    label the session ever showed, partials' included) hold, so no label changes meaning."""
    mapping: dict[str, str] = {}
    taken: set[str] = set()
    assign_by_overlap(revised, finals, mapping, taken)
    blocked = taken | set(used) | {f.speaker for f in finals}
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
    S01), so with no overlap to go on it keeps the label it had.
    """

    def __init__(self, restored: Iterable[Segment] = ()) -> None:
        self._seen: set[str] = set()
        # (hypothesis label, session label) -> s of speech mapped so, over all hypotheses
        self._votes: dict[tuple[str, str], float] = defaultdict(float)
        for seg in restored:
            self._seen.add(seg.speaker)
            self._votes[(seg.speaker, seg.speaker)] += seg.end_s - seg.start_s

    @property
    def seen(self) -> frozenset[str]:
        return frozenset(self._seen)

    def map(
        self,
        hypothesis: Sequence[Segment],
        seen: Iterable[Segment],
        session_labels: Collection[str] = (),
    ) -> tuple[Segment, ...]:
        """`hypothesis` relabelled into session labels.

        `seen`: segments already shown to the client, in session labels. Each pair (hypothesis
        label, session label) scores the total overlap of their segments; pairs are assigned
        greedily by score, one session label per hypothesis label. `session_labels`: labels
        the decode already writes in session terms (a forced transcript prefix carried them);
        they keep their meaning and cast no votes.
        """
        mapping = {label: label for label in session_labels}
        taken = set(mapping.values())
        assign_by_overlap(hypothesis, seen, mapping, taken)
        for h in hypothesis:
            if h.speaker in mapping:
                continue
            label = self._remembered(h.speaker, taken) or self._next_free(taken)
            mapping[h.speaker] = label
            taken.add(label)
        self._seen.update(mapping[h.speaker] for h in hypothesis)
        for h in hypothesis:
            if h.speaker not in session_labels:
                self._votes[(h.speaker, mapping[h.speaker])] += h.end_s - h.start_s
        return tuple(replace(h, speaker=mapping[h.speaker]) for h in hypothesis)

    def _remembered(self, hyp_label: str, taken: set[str]) -> str | None:
        best: tuple[float, str] | None = None
        for (h, s), votes in self._votes.items():
            if h == hyp_label and s not in taken and (best is None or votes > best[0]):
                best = (votes, s)
        return best[1] if best else None

    def _next_free(self, taken: set[str]) -> str:
        n = 1
        while session_label(n) in self._seen or session_label(n) in taken:
            n += 1
        return session_label(n)
