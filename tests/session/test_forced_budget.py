"""ForcedBudget: a session's forced-transcript budget halves after slow hops down to its floor,
grows by a step after fast ones up to the cap, holds in between, and never moves when fixed;
the sessions of an overloaded GPU settle near what it can prefill."""

from __future__ import annotations

import pytest

from livemeet.errors import ConfigError
from livemeet.session.forced_budget import ForcedBudget


def test_slow_hops_halve_the_budget_down_to_the_floor() -> None:
    rule = ForcedBudget(2_048, 512)
    budgets = [rule.start()]
    for _ in range(4):
        budgets.append(rule.after_hop(budgets[-1], hop_duration_s=0.8, hop_s=1.0))
    assert budgets == [2_048, 1_024, 512, 512, 512]


def test_fast_hops_grow_it_back_by_steps_up_to_the_cap() -> None:
    rule = ForcedBudget(2_048, 512, step_tokens=256)
    budget, seen = 512, []
    for _ in range(8):
        budget = rule.after_hop(budget, hop_duration_s=0.1, hop_s=1.0)
        seen.append(budget)
    assert seen == [768, 1_024, 1_280, 1_536, 1_792, 2_048, 2_048, 2_048]


def test_the_budget_stays_within_floor_and_cap_from_any_start() -> None:
    rule = ForcedBudget(2_048, 512)
    assert rule.after_hop(0, hop_duration_s=0.1, hop_s=1.0) == 512  # fast: at least the floor
    assert rule.after_hop(100, hop_duration_s=0.9, hop_s=1.0) == 512
    assert rule.after_hop(9_999, hop_duration_s=0.3, hop_s=1.0) == 2_048
    assert rule.after_hop(9_999, hop_duration_s=0.1, hop_s=1.0) == 2_048


def test_hops_between_the_thresholds_keep_the_budget() -> None:
    rule = ForcedBudget(2_048, 512)  # slow above 0.5 hop, fast below 0.25
    assert rule.after_hop(1_000, hop_duration_s=0.3, hop_s=1.0) == 1_000
    assert rule.after_hop(1_000, hop_duration_s=0.5, hop_s=1.0) == 1_000  # not above
    assert rule.after_hop(1_000, hop_duration_s=0.6, hop_s=1.2) == 1_000  # scales with the hop
    assert rule.after_hop(1_000, hop_duration_s=0.61, hop_s=1.2) == 512


@pytest.mark.parametrize(("cap", "floor"), [(2_048, 2_048), (512, 4_096), (0, 512), (0, 0)])
def test_a_fixed_budget_never_moves(cap: int, floor: int) -> None:
    rule = ForcedBudget(cap, floor)
    assert not rule.adaptive and rule.start() == cap
    for duration in (0.0, 0.4, 5.0):
        assert rule.after_hop(cap, hop_duration_s=duration, hop_s=1.0) == cap


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": -1, "min_tokens": 0},
        {"max_tokens": 2_048, "min_tokens": -5},
        {"max_tokens": 2_048, "min_tokens": 100},  # adaptive floor below the step
        {"max_tokens": 2_048, "min_tokens": 512, "step_tokens": 0},
        {"max_tokens": 2_048, "min_tokens": 512, "fast_fraction": 0.0},
        {"max_tokens": 2_048, "min_tokens": 512, "fast_fraction": 0.6, "slow_fraction": 0.5},
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        ForcedBudget(**kwargs)  # type: ignore[arg-type]


def test_overloaded_sessions_settle_near_what_the_gpu_prefills() -> None:
    """A toy shared GPU: every hop takes (sessions x budget) / capacity seconds. 100 sessions
    that would need 2,048 forced tokens each (4x what it prefills per hop interval) shrink
    their budgets until hops take about half an interval, and no further than the floor; when
    the load goes, the budgets grow back to the cap."""
    rule = ForcedBudget(2_048, 256, step_tokens=128)
    capacity = 51_200  # forced tokens per second
    budgets = [rule.start()] * 100
    durations = []
    for _ in range(60):
        duration = sum(budgets) / capacity
        durations.append(duration)
        budgets = [rule.after_hop(b, duration, hop_s=1.0) for b in budgets]
    late = durations[-20:]
    assert durations[0] == pytest.approx(4.0)
    assert max(late) <= 0.5 + 100 * 128 / capacity and min(late) >= 0.25 - 1e-9
    assert all(256 <= b <= 2_048 for b in budgets)
    for _ in range(20):  # one session left
        budgets[0] = rule.after_hop(budgets[0], budgets[0] / capacity, hop_s=1.0)
    assert budgets[0] == 2_048
