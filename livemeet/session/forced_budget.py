"""How much committed transcript a live hop forces, adapted to load (DESIGN 5.1 and 5.3).

A hop prefills the whole audio span and then the committed transcript as forced assistant
tokens (at most `ModelConfig.live_forced_transcript_tokens`, 2,048 by default). The audio
span's KV is reused, but the forced transcript follows it, so it is prefilled again by every
hop: at 100 live sessions that is ~2,300 tokens per hop late in a meeting over contexts of
~8-10k tokens, ~6 TFLOP, and 100 such hops a second would need ~650 TFLOP/s, more than an
H200 sustains in prefill (docs/benchmarks.md, session 17: the engine held ~80k prefill tokens
per second and partial latency grew with the meeting to 6.6 s p95 at 7.5 minutes).

DESIGN 5.1 lets the hop grow when the GPU is behind; that alone keeps the work per hop and
lets latency grow. `ForcedBudget` also shrinks what each hop forces. A session's load is its
hops' duration over the hop interval, smoothed (an exponentially weighted mean, the newest hop
weighing `smoothing`): after a hop slower than `slow_fraction` while the load is over it too,
the session's budget halves (down to `min_tokens`); while the load is below `fast_fraction` it
grows by `step_tokens` (up to the cap), so the sessions
together settle near what the GPU can prefill (additive increase, multiplicative decrease:
they converge to a fair share, as TCP's congestion windows do). The smoothing is there
because single hops say little: on an overloaded GPU a hop that lands in a gap between
batches is fast while its neighbours queue, and a rule on single hops grew the budget on those
and hovered at ~720 tokens over a 512 floor (100 sessions, docs/benchmarks.md, session 18).
Fewer forced tokens keep the newest segments only; what the model loses is older context, an
unvalidated trade until real weights are available (DESIGN section 9), made only under load.

Plain Python: no clock, no I/O; the backend passes each hop's duration.
"""

from __future__ import annotations

from dataclasses import dataclass

from livemeet.audio.constants import (
    LIVE_FORCED_BUDGET_FAST_FRACTION,
    LIVE_FORCED_BUDGET_GROW_SHARE,
    LIVE_FORCED_BUDGET_SLOW_FRACTION,
    LIVE_FORCED_BUDGET_SMOOTHING,
    LIVE_FORCED_BUDGET_STEP_TOKENS,
)
from livemeet.errors import ConfigError


@dataclass(frozen=True)
class BudgetState:
    """A session's budget: `tokens` the next hop may force, `load` its hops' smoothed
    duration over the hop interval (0 before the first hop)."""

    tokens: int
    load: float = 0.0


@dataclass(frozen=True)
class ForcedBudget:
    """The per-session forced-transcript budget's rule (module docstring).

    `max_tokens`: the cap (0: hops force nothing and re-decode the meeting); `min_tokens`:
    the floor under load (>= max_tokens: a fixed budget, never adapted); `slow_fraction`,
    `fast_fraction`: loads (hop durations as fractions of the hop interval, smoothed with
    weight `smoothing` on the newest) above which the budget halves and below which it grows
    by `step_tokens`. Raises ConfigError on negative token counts, a step < 1, an adaptive
    floor below the step, fractions not in 0 < fast <= slow, or smoothing not in (0, 1].
    """

    max_tokens: int
    min_tokens: int
    slow_fraction: float = LIVE_FORCED_BUDGET_SLOW_FRACTION
    fast_fraction: float = LIVE_FORCED_BUDGET_FAST_FRACTION
    step_tokens: int = LIVE_FORCED_BUDGET_STEP_TOKENS
    smoothing: float = LIVE_FORCED_BUDGET_SMOOTHING

    @classmethod
    def for_hop_load(cls, max_tokens: int, min_tokens: int, hop_load: float) -> ForcedBudget:
        """The rule that halves above `hop_load` (a fraction of the hop interval, the slow
        fraction) and grows below LIVE_FORCED_BUDGET_GROW_SHARE of it, the other settings at
        their defaults (`serve --live-hop-load`). Raises ConfigError as the constructor does."""
        return cls(
            max_tokens,
            min_tokens,
            slow_fraction=hop_load,
            fast_fraction=hop_load * LIVE_FORCED_BUDGET_GROW_SHARE,
        )

    def __post_init__(self) -> None:
        if self.max_tokens < 0 or self.min_tokens < 0:
            raise ConfigError(
                f"forced transcript tokens must be >= 0, not {self.max_tokens} / {self.min_tokens}"
            )
        if self.step_tokens < 1:
            raise ConfigError(f"step_tokens must be >= 1, not {self.step_tokens}")
        if self.adaptive and self.min_tokens < self.step_tokens:
            # a budget that holds no whole segment forces nothing: the hop would re-decode
            # the whole meeting, the most costly hop there is
            raise ConfigError(
                f"an adaptive budget's floor must be >= {self.step_tokens} tokens, not "
                f"{self.min_tokens} (or >= the cap, {self.max_tokens}, for a fixed budget)"
            )
        if not 0.0 < self.fast_fraction <= self.slow_fraction:
            raise ConfigError(
                f"need 0 < fast_fraction <= slow_fraction, not {self.fast_fraction} / "
                f"{self.slow_fraction}"
            )
        if not 0.0 < self.smoothing <= 1.0:
            raise ConfigError(f"smoothing must be in (0, 1], not {self.smoothing}")

    @property
    def adaptive(self) -> bool:
        return self.min_tokens < self.max_tokens

    @property
    def floor(self) -> int:
        return min(self.min_tokens, self.max_tokens)

    def start(self) -> BudgetState:
        """A new session's budget: the cap (a meeting starts with little to force)."""
        return BudgetState(self.max_tokens)

    def after_hop(self, state: BudgetState, hop_duration_s: float, hop_s: float) -> BudgetState:
        """The budget for the next hop, given this hop's `state`, its duration (submission to
        finish, s) and the session's hop interval (s); its tokens always within [floor, cap].
        A slow load halves the budget even when the forced transcript was shorter than the
        budget (early in a meeting): whatever made hops slow (uploads, the encoder), fewer
        forced tokens are less prefill for the shared GPU, and fast hops give them back."""
        if not self.adaptive:
            return BudgetState(self.max_tokens)
        ratio = hop_duration_s / hop_s
        load = state.load + self.smoothing * (ratio - state.load)
        tokens = min(max(state.tokens, self.floor), self.max_tokens)
        if load > self.slow_fraction and ratio > self.slow_fraction:
            # halving on the fast hops that follow a spike too would cut once per hop while
            # the smoothed load decays: one spike would take the budget to the floor
            tokens = max(self.floor, tokens // 2)
        elif load < self.fast_fraction:
            tokens = min(self.max_tokens, tokens + self.step_tokens)
        return BudgetState(tokens, load)
