"""A written cost model of live sessions: GPU time per hop, the load of N sessions, and the
sessions one GPU holds (DESIGN.md section 10: partial latency is reported for hops of 0.5, 1
and 2 s against a written cost model).

A hop of a session whose meeting has run `t` s re-encodes the open 30-s window and prefills
everything after the stable prefix of the previous hop's prompt (whose KV it forks): the
open window's pads and time markers, the suffix (`<|audio_end|>`, instruction, assistant
turn: SUFFIX_TOKENS) and the forced committed transcript (F ids, at most what the meeting has
produced), then decodes the open tail (D ids: the prefill samples the first). With a draft
(the previous hop's tail, livemeet/session/draft.py) the prefill also verifies A ids of it,
which then need no decode row. With the engine's step cost model
(livemeet.engine.cost_model.StepCostModel, H200 coefficients):

    hop(t) = encode                                     the open window, ENCODER_WINDOW_S
           + hop / 30 s * encode                        full windows, once each
           + prefill_cost_s(stable, n)                  n = span after stable + suffix + F + A
           + sum over D - A - 1 rows of decode_cost_s   each row reads the whole context's KV

and N sessions with hop interval `hop` keep the GPU busy a fraction

    load = N * hop(t) / hop                  (>= 1: hops queue, latency grows without bound)

A segment's partial latency is at least the wait for the first hop whose audio edge passes its
end (uniform over one hop interval), plus the frame that carries its last audio, plus the hop
itself: `latency_floor_p95` = 0.95 hop + FRAME_S + hop(t) + the fixed cost of the hop's D
steps (alone on the GPU; under load steps are shared). Queueing adds to it as the load
nears 1. The step cost model prices what the GPU must do, not the engine thread's host time:
early in a meeting, when hops are small, the host is the limit (docs/benchmarks.md, session
17), so the model under-states the time there.

Prompt lengths are exact (livemeet.models.prompt: markers every 5 s, pads per marker 62); the
open window is averaged over the window's phase (a hop at every `hop` seconds of a 30-s
window). Usage: python -m loadtest.live_cost [--forced 2048,512] [--hops 0.5,1,2]
    [--minutes 1,5,10,30] [--sessions 100] [--record bench_live.jsonl] [--no-draft]
(`--record`: set the model beside a bench_live point's engine_by_time, bucket by bucket).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from livemeet.audio.constants import (
    SAMPLE_RATE,
    TOKENS_PER_WINDOW,
    WINDOW_S,
    num_audio_tokens,
)
from livemeet.engine.cost_model import StepCostModel
from livemeet.models.prompt import HEADER_LEN, PromptConfig, audio_span, stable_prefix_len
from loadtest.bench_live import HEAD_SPEED, meeting_s

# ids from <|audio_end|> to the assistant turn with the default (Chinese) instruction and the
# Qwen tokenizer (livemeet.models.prompt.build_prompt: 71; a test checks it)
SUFFIX_TOKENS = 71
# GPU s to encode one 30-s window in a live hop's micro-batch: the 8-window encoder graph runs
# 2.49 ms per window and one window alone 4.0 ms on an H200 (docs/benchmarks.md, session 11);
# 100 live sessions encoded ~2.3 windows per prefill step (session 18, call 1)
ENCODER_WINDOW_S = 3.0e-3
# ids a hop decodes after its forced transcript: the open tail (segments not yet committed,
# with the words of the turn going on) and the end token; 100 sessions over minutes 7.5-10 of
# 10-minute meetings: 25.6 per hop, 17.7 of them accepted draft (docs/benchmarks.md session
# 24, since forced hops write a turn's words as it goes; 13.6 before, session 18)
DECODE_TOKENS_PER_HOP = 26
# output ids per second of meeting: the long workload's 330 per minute, the reference model's
# rate on dense meetings (DESIGN 10); a hop forces no more than the meeting has produced
OUTPUT_TOKENS_PER_S = 330 / 60
FRAME_S = 0.1  # s of audio per client frame (loadtest.bench_live sends 100-ms frames)
# of those, ids a hop's draft gets accepted: the same point accepted 17.7 per hop (99.3 % of the
# drafts) and decoded 7.8 more (session 24, call 3; 7.0 and 6.9 in session 19)
ACCEPTED_DRAFT_PER_HOP = 18


@dataclass(frozen=True)
class LiveCostModel:
    """The live hop's cost (module docstring). `forced_tokens`: F; `decode_tokens`: D;
    `accepted_draft_tokens`: A (0: no drafts, `--no-live-draft`)."""

    step: StepCostModel = field(default_factory=StepCostModel)
    encoder_window_s: float = ENCODER_WINDOW_S
    suffix_tokens: int = SUFFIX_TOKENS
    decode_tokens: int = DECODE_TOKENS_PER_HOP
    accepted_draft_tokens: int = ACCEPTED_DRAFT_PER_HOP
    prompt: PromptConfig = field(default_factory=PromptConfig)

    def hop_s(self, meeting_s: float, hop_s: float, forced_tokens: int) -> float:
        """GPU seconds of one hop at `meeting_s` (s of audio so far), averaged over the open
        window's phase: hops at every `hop_s` of the 30-s window that holds meeting_s. The
        forced transcript is at most what the meeting has produced (OUTPUT_TOKENS_PER_S).
        Raises ValueError for meeting_s <= 0, hop_s not in (0, 30] or forced_tokens < 0."""
        if meeting_s <= 0 or not 0 < hop_s <= WINDOW_S or forced_tokens < 0:
            raise ValueError(
                f"need meeting_s > 0, 0 < hop_s <= 30, forced >= 0: {meeting_s, hop_s}"
            )
        edges = list(_window_edges(meeting_s, hop_s))
        prefill = sum(self._prefill_s(e, hop_s, forced_tokens) for e in edges) / len(edges)
        encode = self.encoder_window_s * (1 + hop_s / WINDOW_S)
        return encode + prefill

    def _prefill_s(self, edge_s: float, hop_s: float, forced_tokens: int) -> float:
        """The prefill and decode of one hop whose audio edge is `edge_s`, after a hop at
        edge_s - hop_s whose KV it forks (MossCore: the stable prefix of the previous hop's
        audio); the prefill samples the first output id and verifies A draft ids, so D ids
        take D - A - 1 decode rows (rejected draft rows, ~3 %, are left out)."""
        tokens = num_audio_tokens(round(edge_s * SAMPLE_RATE))
        prev = num_audio_tokens(round(max(0.0, edge_s - hop_s) * SAMPLE_RATE))
        span, _ = audio_span(tokens, self.prompt)
        stable = stable_prefix_len(prev, prev // TOKENS_PER_WINDOW, config=self.prompt)
        forced = min(forced_tokens, math.floor(OUTPUT_TOKENS_PER_S * edge_s))
        accepted = self._accepted()
        context = HEADER_LEN + len(span) + self.suffix_tokens + forced + accepted
        cost = self.step.prefill_cost_s(stable, context - stable)
        rows = range(context + 1, context + self.decode_tokens - accepted)
        return cost + sum(self.step.decode_cost_s(c) for c in rows)

    def _accepted(self) -> int:
        """A, at most the D - 1 ids after the prefill's own sample."""
        return min(self.accepted_draft_tokens, max(0, self.decode_tokens - 1))

    def load(self, sessions: int, meeting_s: float, hop_s: float, forced_tokens: int) -> float:
        """Fraction of the GPU's time `sessions` sessions at `meeting_s` keep it busy."""
        return sessions * self.hop_s(meeting_s, hop_s, forced_tokens) / hop_s

    def capacity(
        self, meeting_s: float, hop_s: float, forced_tokens: int, load: float = 1.0
    ) -> int:
        """Sessions at `meeting_s` that keep the GPU at most `load` busy."""
        return math.floor(load * hop_s / self.hop_s(meeting_s, hop_s, forced_tokens))

    def latency_floor_p95(self, meeting_s: float, hop_s: float, forced_tokens: int) -> float:
        """p95 partial latency of an idle GPU (s): 0.95 of the wait for the next hop, the last
        frame, and the hop itself with its steps' fixed cost (a prefill step and D - A - 1
        decode steps, which under load the hops share); queueing under load comes on top."""
        steps_s = (self.decode_tokens - self._accepted()) * self.step.fixed_s
        return 0.95 * hop_s + FRAME_S + self.hop_s(meeting_s, hop_s, forced_tokens) + steps_s


def _window_edges(meeting_s: float, hop_s: float) -> Iterator[float]:
    """Audio edges of the hops of the 30-s window that holds `meeting_s`, every hop_s in it
    (at a window's first hop_s, the window before it: the new one holds no hop yet)."""
    start = math.floor(meeting_s / WINDOW_S) * WINDOW_S
    if meeting_s - start < hop_s:
        start = max(0.0, start - WINDOW_S)
    k = 1
    while start + k * hop_s <= start + WINDOW_S + 1e-9:
        yield start + k * hop_s
        k += 1


def table(
    model: LiveCostModel,
    minutes: Sequence[float],
    hops: Sequence[float],
    forced: Sequence[int],
    sessions: int,
) -> list[dict[str, Any]]:
    """One row per (forced, hop, meeting minute): GPU ms per hop, the load of `sessions`
    sessions, the sessions at load 1 and 0.8, and the idle GPU's p95 latency floor."""
    rows = []
    for f in forced:
        for h in hops:
            for m in minutes:
                t = 60.0 * m
                rows.append(
                    {
                        "forced": f,
                        "hop_s": h,
                        "minute": m,
                        "hop_ms": round(1e3 * model.hop_s(t, h, f), 2),
                        f"load_at_{sessions}": round(model.load(sessions, t, h, f), 2),
                        "sessions_at_load_1": model.capacity(t, h, f, 1.0),
                        "sessions_at_load_0.8": model.capacity(t, h, f, 0.8),
                        "latency_floor_p95_s": round(model.latency_floor_p95(t, h, f), 2),
                    }
                )
    return rows


def against_record(
    model: LiveCostModel, record: dict[str, Any], hop_s: float
) -> list[dict[str, Any]]:
    """Per `engine_by_time` bucket of a bench_live point: the hops and forced tokens it ran,
    the model's GPU seconds for them (at the bucket's middle in meeting time: a head start
    streams faster, `loadtest.bench_live.meeting_s`), and the engine thread's seconds in
    steps (launch + wait + encode: the GPU's time where it was the limit)."""
    head_s = record.get("head_start_s", 0.0)
    head_speed = record.get("head_speed", HEAD_SPEED)
    head_pause_s = record.get("head_pause_s", 0.0)
    rows = []
    for name, b in record.get("engine_by_time", {}).items():
        lo, hi = (float(x) for x in name.split("-"))
        hops = b.get("live_hops", 0)
        if not hops or hi - lo < 10:
            continue
        steps = b.get("engine_step_s", {})
        forced = round(b.get("live_forced_mean_tokens", 0.0))
        at_s = meeting_s((lo + hi) / 2, head_s, head_speed, head_pause_s)
        # the bucket's own accepted drafts per hop (none from servers before session 19)
        accepted = round(b.get("accepted_draft_tokens", 0) / hops)
        priced = replace(model, accepted_draft_tokens=accepted)
        rows.append(
            {
                "bucket": name,
                "hops": hops,
                "forced": forced,
                "accepted_draft": accepted,
                "model_gpu_s": round(hops * priced.hop_s(at_s, hop_s, forced), 2),
                "engine_s": round(sum(steps.get(k, 0.0) for k in ("launch", "wait", "encode")), 2),
                "seconds": hi - lo,
            }
        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--forced", default="2048,512", help="forced tokens per hop, comma-separated")
    p.add_argument("--hops", default="0.5,1,2", help="hop intervals (s), comma-separated")
    p.add_argument("--minutes", default="1,5,10,30", help="meeting minutes, comma-separated")
    p.add_argument("--sessions", type=int, default=100, help="sessions whose load to report")
    p.add_argument("--record", type=Path, default=None, help="a bench_live JSONL to set beside")
    p.add_argument("--record-hop-s", type=float, default=1.0, help="that record's hop (s)")
    p.add_argument(
        "--no-draft", action="store_true", help="price hops without drafts (--no-live-draft)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = LiveCostModel(accepted_draft_tokens=0 if args.no_draft else ACCEPTED_DRAFT_PER_HOP)
    rows = table(
        model,
        [float(x) for x in args.minutes.split(",")],
        [float(x) for x in args.hops.split(",")],
        [int(x) for x in args.forced.split(",")],
        args.sessions,
    )
    for row in rows:
        print(json.dumps(row))
    if args.record is not None:
        for line in args.record.read_text().splitlines():
            record = json.loads(line)
            if "engine_by_time" in record:
                for row in against_record(model, record, args.record_hop_s):
                    print(json.dumps({"sessions": record.get("sessions"), **row}))


if __name__ == "__main__":
    main()
