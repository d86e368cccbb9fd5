"""The upload hold in a closed loop: a discrete-event model of HTTP upload clients, the gateway's
receive and decode stages, and engine steps around the real Scheduler (no model, no GPU).

A model, not a benchmark. Step costs are rough H200 figures from docs/benchmarks.md (session 4,
short uploads: a step with a prefill ~22 ms plus the encoder's ~3.3 ms per new upload, a decode
step ~1 ms); the gateway is a receive delay, then `decode_slots` first-come-first-served
decoders; a client sends its next upload `respond_s` after its transcript is done. What it is
for: checking claims about the hold policies that the unit tests cannot, e.g. that PIPELINE
prefills a wave in one step, and why it keeps the ARRIVALS rule when nothing is incoming.

`python -m tests.engine.test_upload_hold_sim` prints throughput and prefill steps per
concurrency for each policy.
"""

from __future__ import annotations

import heapq
import random
import statistics
from dataclasses import dataclass, replace
from typing import NamedTuple

from livemeet.config import UploadHold
from livemeet.engine.block_manager import BlockManager
from livemeet.engine.request import Request, RequestClass, Status
from livemeet.engine.scheduler import Scheduler, SchedulerConfig

CLIP_S = 11.6  # s of audio per upload (the benchmark's short clip)


@dataclass(frozen=True)
class Loop:
    """One closed-loop setting: `clients` each send an upload, wait for it, send the next."""

    clients: int
    rounds: int | None = None  # uploads per client; None: until `duration_s`
    duration_s: float = 4.0  # s simulated (with rounds=None)
    warm_up_s: float = 1.0  # s whose completions are not counted (with rounds=None)
    receive_s: float = 0.005  # s to receive a body
    decode_s: float = 0.0085  # s one decode slot spends on an upload
    decode_slots: int = 2
    respond_s: float = 0.004  # s from a done transcript to the client's next upload
    prompt_tokens: int = 234
    output_tokens: int = 64
    jitter: float = 0.0  # uploads' output tokens and decode times vary by +-this fraction
    prefill_step_s: float = 0.022
    encode_s: float = 0.0033  # per upload prefilled for the first time
    decode_step_s: float = 0.0008
    decode_row_s: float = 0.00002
    seed: int = 1


class Outcome(NamedTuple):
    audio_s_per_s: float
    mean_latency_s: float
    num_prefill_steps: int


class HoldOnlyForIncoming(Scheduler):
    """The counterfactual PIPELINE without the ARRIVALS rule: hold new uploads only while
    some are incoming (still bounded by the wait; preempted uploads never held)."""

    def _hold_uploads(self, now_s: float) -> bool:
        waiting = [
            r
            for r in self._requests.values()
            if r.request_class is RequestClass.UPLOAD and r.status is not Status.RUNNING
        ]
        wait_s = self.config.upload_batch_wait_s
        return (
            bool(waiting)
            and self.num_incoming_uploads > 0
            and all(r.status is Status.WAITING and now_s - r.arrival_s < wait_s for r in waiting)
        )


def make_scheduler(hold: UploadHold, wait_s: float = 0.05) -> Scheduler:
    config = SchedulerConfig(upload_batch_wait_s=wait_s, upload_hold=hold)
    return Scheduler(BlockManager(8192), config)


def simulate(loop: Loop, sched: Scheduler) -> Outcome:
    """Run the closed loop against `sched`; the engine applies what arrived, tells the
    scheduler how many uploads are between the gateway's accept and the engine, and steps."""
    rng = random.Random(loop.seed)
    events: list[tuple[float, int, str, int]] = []  # (time s, order, kind, client)
    order = 0

    def push(time_s: float, kind: str, client: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (time_s, order, kind, client))

    def vary(value: float) -> float:
        return value * (1 + loop.jitter * (2 * rng.random() - 1))

    slots_free_s = [0.0] * loop.decode_slots
    incoming = 0
    sent_s: dict[int, float] = {}
    owner: dict[str, int] = {}
    left = dict.fromkeys(range(loop.clients), loop.rounds or 0)
    done_s: list[float] = []
    latencies: list[float] = []
    num_prefill_steps = 0
    end_s = loop.duration_s if loop.rounds is None else float("inf")
    for client in range(loop.clients):
        push(0.0, "send", client)
    now_s = 0.0
    while now_s < end_s and (events or sched.has_work()):
        while events and events[0][0] <= now_s:
            time_s, _, kind, client = heapq.heappop(events)
            if kind == "send":  # the gateway accepts it
                incoming += 1
                sent_s[client] = time_s
                slot = min(range(loop.decode_slots), key=slots_free_s.__getitem__)
                start_s = max(time_s + loop.receive_s, slots_free_s[slot])
                slots_free_s[slot] = start_s + vary(loop.decode_s)
                push(slots_free_s[slot], "arrive", client)
            else:  # the engine has it
                incoming -= 1
                rid = f"u{order}-{client}"
                owner[rid] = client
                tokens = max(1, round(vary(loop.output_tokens)))
                prompt = list(range(loop.prompt_tokens))
                sched.add(Request(rid, prompt, max_new_tokens=tokens, arrival_s=time_s))
        sched.set_incoming_uploads(incoming)
        if not sched.has_work() or sched.is_holding(now_s):
            wake_s = events[0][0] if events else end_s
            if sched.has_work():  # held: until the oldest has waited long enough
                oldest_s = min(r.arrival_s for r in sched.waiting)
                wake_s = min(wake_s, oldest_s + sched.config.upload_batch_wait_s)
            now_s = max(now_s, wake_s) + 1e-9
            continue
        batch = sched.schedule(now_s)
        if batch.prefills:
            num_prefill_steps += 1
            first_chunks = sum(1 for c in batch.prefills if c.start == 0)
            now_s += loop.prefill_step_s + loop.encode_s * first_chunks
        else:
            now_s += loop.decode_step_s + loop.decode_row_s * len(batch.decodes)
        out = sched.postprocess(batch, [7] * len(batch.sampled_requests))
        for request in out.finished:
            client = owner.pop(request.request_id)
            if loop.rounds is not None or now_s >= loop.warm_up_s:
                done_s.append(now_s)
                latencies.append(now_s - sent_s[client])
            left[client] -= 1
            if loop.rounds is None or left[client] > 0:
                push(now_s + loop.respond_s, "send", client)
    span_s = max(done_s) if loop.rounds is not None else loop.duration_s - loop.warm_up_s
    return Outcome(len(done_s) * CLIP_S / span_s, statistics.mean(latencies), num_prefill_steps)


def test_a_wave_reaching_an_idle_engine_is_prefilled_in_one_step() -> None:
    """16 clients start together; their uploads reach the engine two decode slots at a time,
    spread over ~40 ms. ARRIVALS starts the first alone (nothing decodes yet) and the wave
    splits into several prefill steps; PIPELINE waits for the rest, which the gateway counts."""
    wave = Loop(clients=16, rounds=1, decode_s=0.005)
    pipeline = simulate(wave, make_scheduler(UploadHold.PIPELINE))
    arrivals = simulate(wave, make_scheduler(UploadHold.ARRIVALS))
    assert pipeline.num_prefill_steps == 1
    assert arrivals.num_prefill_steps >= 3
    assert pipeline.audio_s_per_s > arrivals.audio_s_per_s, (pipeline, arrivals)


def test_pipeline_keeps_holding_for_running_clients_when_nothing_is_incoming() -> None:
    """c4, uploads of varied lengths: with 1 waiting, 3 decoding and nothing incoming, the
    ARRIVALS rule still holds, and it pays: a running request soon finishes, its client's
    next upload crosses the gateway (~20 ms) within the wait, and both share one prefill
    step. Dropping the rule when nothing is incoming gives fewer audio-s/s (and in a closed
    loop of fixed size, a longer mean cycle: Little's law) from more prefill steps.
    """
    gains = []
    for seed in (1, 2, 3, 4):
        loop = Loop(clients=4, jitter=0.5, duration_s=8.0, seed=seed)
        kept = simulate(loop, make_scheduler(UploadHold.PIPELINE))
        dropped = simulate(loop, HoldOnlyForIncoming(BlockManager(8192), SchedulerConfig()))
        assert kept.num_prefill_steps < dropped.num_prefill_steps, (seed, kept, dropped)
        gains.append(kept.audio_s_per_s / dropped.audio_s_per_s)
    assert min(gains) > 1.0 and statistics.mean(gains) > 1.02, gains  # seeds 1-4: 1.5-6 %


def test_simulation_is_deterministic() -> None:
    loop = Loop(clients=8, jitter=0.5, duration_s=2.0)
    first = simulate(loop, make_scheduler(UploadHold.PIPELINE))
    assert first == simulate(loop, make_scheduler(UploadHold.PIPELINE))
    assert first.num_prefill_steps > 0


def main() -> None:
    """Print a table: audio-s/s (prefill steps) per policy and concurrency."""
    base = Loop(clients=1, duration_s=10.0, warm_up_s=2.0, jitter=0.5)
    policies: dict[str, tuple[UploadHold | None, float]] = {
        "no hold": (UploadHold.ARRIVALS, 0.0),
        "arrivals": (UploadHold.ARRIVALS, 0.05),
        "pipeline": (UploadHold.PIPELINE, 0.05),
        "incoming only": (None, 0.05),
    }
    print("audio-s/s (prefill steps), jitter 0.5, 2 decode slots")
    for clients in (1, 2, 4, 8, 16, 32):
        loop = replace(base, clients=clients)
        cells = []
        for name, (hold, wait_s) in policies.items():
            sched = (
                make_scheduler(hold, wait_s)
                if hold is not None
                else HoldOnlyForIncoming(BlockManager(8192), SchedulerConfig())
            )
            out = simulate(loop, sched)
            cells.append(f"{name} {out.audio_s_per_s:7.1f} ({out.num_prefill_steps})")
        print(f"c{clients:<3} " + " | ".join(cells))


if __name__ == "__main__":
    main()
