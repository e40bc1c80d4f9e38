"""The benchmark suites of ``webgym-engine bench``, one module each (its docstring says what it measures and how).

Every suite repeats its measurements ``repeats`` times (interleaving the configurations it compares, so
that a slow moment of a shared machine hits both sides), and reports each figure as the median with
min and max. Scales: ``full`` (the published figures; about 80 minutes on 2 cores), ``quick`` (all suites together in
under 10 minutes on a 2-core machine: ``bench.suite.QUICK_LIMIT_S``, which the suites' budgets are held to),
``tiny`` (seconds; the tests run it so that no suite rots).

Page profiles: ``light`` is the bundled sites (a few hundred DOM nodes, a handful of images); ``heavy``
is ``engine/sites/www/heavy/`` (a shop of 300 products and a news front page of 150 articles, rendered by
script from JSON: 3k-6k DOM nodes, 150-330 images per page), so that no figure holds only for toy pages.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.suite import SCALES, SuiteResult
from bench.suites import async_live, async_sync, ceiling, codec, overhead, policy, scaling
from bench.suites.common import CORES

SuiteFn = Callable[[SuiteResult, dict[str, Any], str, Path], Awaitable[None]]
_MODULES: dict[str, ModuleType] = {"ceiling": ceiling, "async": async_sync, "async_live": async_live,
                                   "scaling": scaling, "overhead": overhead, "codec": codec, "policy": policy}
SUITES: dict[str, SuiteFn] = {name: mod.measure for name, mod in _MODULES.items()}
assert all(set(mod.CONFIG) == set(SCALES) for mod in _MODULES.values())


def config_for(suite: str, scale: str, repeats: int | None = None) -> dict[str, Any]:
    """The configuration of ``suite`` at ``scale``, with ``repeats`` overridden when given."""
    cfg = json.loads(json.dumps(_MODULES[suite].CONFIG[scale]))  # a deep copy
    cfg.setdefault("workers", CORES)
    if repeats is not None:
        cfg["repeats"] = repeats
    return cfg


def budget_s(suite: str, scale: str) -> float:
    """What ``suite`` at ``scale`` takes at most on this machine, from its configuration's windows and ramps
    (``budget_s`` of its module, priced by ``bench.suites.common``'s time model); 0 for a suite skipped here."""
    return float(_MODULES[suite].budget_s(config_for(suite, scale)))


async def run_suite(name: str, scale: str, out: Path, base: str, repeats: int | None = None) -> SuiteResult:
    """Run one suite at ``scale``; an exception inside it is recorded in the result (``error``), not raised."""
    cfg = config_for(name, scale, repeats)
    res = SuiteResult(name, scale, cfg["repeats"], config=dict(cfg))
    t0 = time.monotonic()
    try:
        await SUITES[name](res, cfg, base, out)
    except Exception as exc:  # noqa: BLE001 - one broken suite must not lose the others' results
        res.config["error"] = f"{type(exc).__name__}: {exc}"
        res.notes.append(f"the suite failed: {type(exc).__name__}: {exc}")
        print(f"  {name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
    res.duration_s = time.monotonic() - t0
    res.config["budget_s"] = round(budget_s(name, scale), 1)
    return res
