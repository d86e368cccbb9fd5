"""`--forced-output` hop parts (backends/forced_output.py): what a perfect model writes for a
live hop's audio."""

from __future__ import annotations

import math

import numpy as np

from livemeet.backends.forced_output import forced_hop_parts, forced_skip_keys
from livemeet.transcript.parser import parse_transcript
from livemeet.transcript.segments import Segment


def test_a_cut_at_a_hops_edge_leaves_each_word_to_exactly_one_of_the_two_hops() -> None:
    """The hop after a commit at the previous hop's edge (`finalize`, a full window) writes
    exactly the words that hop did not, for every edge: words ending a hair past the edge
    (w2 at 1.321 s), a zero-length segment at the edge, a one-word turn."""
    reference = parse_transcript(
        "[1.00][S01] w0 w1 w2 w3 w4 w5 w6 w7 w8 w9[2.07][3.00][S02] hi[3.00]"
        "[3.50][S01] one two three[5.00][5.20][S02] solo[6.00]"
    )

    def words(edge_s: float, after_s: float) -> list[str]:
        text = "".join(p.rendered for p in forced_hop_parts(reference, edge_s, after_s))
        return " ".join(s.text for s in parse_transcript(text)).split()

    every = " ".join(s.text for s in reference).split()
    for edge_s in [*np.arange(0.0, 7.0, 0.02), 1.321, 1.3205, 3.0, 4.0, 5.0]:
        first = words(float(edge_s), -1.0)
        assert first + words(math.inf, float(edge_s)) == every, edge_s
        assert first == every[: len(first)]  # in order, none skipped
    for part in forced_hop_parts(reference, 6.0, 1.3205):  # a remainder starts past the cut
        assert parse_transcript(part.rendered)[0].start_s >= 1.3205


def test_skipping_passed_segments_gives_the_same_hop_parts() -> None:
    """`forced_skip_keys` lets each hop bisect past the reference's written segments (a
    30-minute meeting's hops looked at ~2,300 each): the parts are the same as a scan from
    the first segment, for any cut and edge, on references with overlapping turns, segments
    without words, zero-length and reversed ones (which a scan must not skip past wrongly)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        reference, t = [], 0.0
        for _ in range(int(rng.integers(1, 12))):
            t = max(0.0, t + float(rng.choice([-0.5, 0.0, 0.3, 1.0, 2.5])))
            end = t + float(rng.choice([-0.2, 0.0, 0.7, 1.9]))
            text = " ".join("w" for _ in range(int(rng.integers(0, 4))))
            reference.append(Segment(round(t, 2), round(end, 2), "S01", text))
        keys = forced_skip_keys(reference)
        assert keys == sorted(keys)
        for _ in range(20):
            edge_s = float(rng.uniform(-0.5, t + 3.0))
            after_s = float(rng.choice([-1.0, rng.uniform(-0.5, t + 3.0), edge_s]))
            expected = forced_hop_parts(reference, edge_s, after_s)
            assert forced_hop_parts(reference, edge_s, after_s, keys) == expected
