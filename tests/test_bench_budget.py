"""The benchmark suites' time budgets: ``bench all --quick`` keeps to the time its --help states on 2 cores, as
computed from each suite's configuration (its windows, warm-ups, ramps and batches, priced by the time model in
``bench/suites/common.py``), not from a timed run."""

from __future__ import annotations

import copy

import pytest

from bench import suites
from bench.suite import QUICK_LIMIT_S, SCALES


def test_the_quick_scale_fits_the_limit_its_help_states() -> None:
    budgets = {name: suites.budget_s(name, "quick") for name in suites.SUITES}
    assert sum(budgets.values()) <= QUICK_LIMIT_S, budgets


@pytest.mark.parametrize("name", [n for n in suites.SUITES if n != "policy"])
def test_each_budget_is_computed_from_its_configuration(name: str) -> None:
    cfg = suites.config_for(name, "quick")
    base = suites._MODULES[name].budget_s(cfg)
    assert base > 0
    # More repeats of the same measurements cost more.
    more = copy.deepcopy(cfg)
    more["repeats"] += 1
    assert suites._MODULES[name].budget_s(more) > base
    # Each scale up costs more: tiny < quick < full.
    assert [suites.budget_s(name, scale) for scale in ("tiny", "quick", "full")] == sorted(
        suites.budget_s(name, scale) for scale in SCALES)
    assert suites.budget_s(name, "tiny") < base < suites.budget_s(name, "full")


@pytest.mark.parametrize("name,key", [("ceiling", "seconds"), ("scaling", "seconds"), ("overhead", "seconds"),
                                      ("async", "episodes_per_slot"), ("async_live", "episodes_per_slot"),
                                      ("codec", "reps")])
def test_a_longer_window_or_batch_costs_more(name: str, key: str) -> None:
    cfg = suites.config_for(name, "quick")
    longer = copy.deepcopy(cfg)
    longer[key] *= 2
    assert suites._MODULES[name].budget_s(longer) > suites._MODULES[name].budget_s(cfg)
