"""The trainer frameworks' versions: one tested version per adapter, pinned where it is installed, checked at import.

Each adapter names the version its tests run against (``FrameworkVersion.tested``); ``pyproject.toml``'s extra for
the framework pins that version, and the environment ``make test`` builds for it installs it
(``tests/frameworks/``). :meth:`FrameworkVersion.check` runs on the real installed distributions here.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
import warnings
from pathlib import Path

import pytest

from train.adapters import FrameworkVersion
from train.adapters.areal import AREAL
from train.adapters.trl import TRL
from train.adapters.verl import VERL

ROOT = Path(__file__).resolve().parents[1]


def pinned(requirement: str) -> tuple[str, str]:
    """``("verl", "0.9.1")`` for ``"verl[verl-core]==0.9.1"``."""
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;\s]+)", requirement.strip())
    assert match, f"not an exact pin: {requirement!r}"
    return match.group(1), match.group(2)


def test_each_framework_extra_pins_the_version_its_adapter_was_tested_with() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for framework in (TRL, VERL, AREAL):
        [requirement] = extras[framework.distribution]
        assert pinned(requirement) == (framework.distribution, framework.tested), framework
    # AReaL's environment installs it without its dependencies, from its own file: the same pin.
    lines = [line for line in (ROOT / "tests/frameworks/areal.nodeps.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert [pinned(line) for line in lines] == [("areal", AREAL.tested)]


def test_trl_is_installed_here_at_the_tested_version() -> None:
    assert TRL.check() == TRL.tested == importlib.metadata.version("trl")


def test_check_refuses_an_older_version_warns_of_a_newer_one_and_ignores_a_missing_one() -> None:
    installed = importlib.metadata.version("msgspec")  # a real distribution of this environment
    major, minor = (int(n) for n in installed.split(".")[:2])
    assert FrameworkVersion("msgspec", "msgspec", tested=installed, minimum=installed).check() == installed
    with pytest.raises(ImportError, match=rf"needs msgspec >= {major + 1}\.0\.0, found {re.escape(installed)}"):
        FrameworkVersion("msgspec", "msgspec", tested=f"{major + 1}.0.0", minimum=f"{major + 1}.0.0").check()
    older = f"{major}.{minor - 1}.0" if minor else f"{major - 1}.99.0"
    with pytest.warns(UserWarning, match="newer than the msgspec adapter was tested with"):
        assert FrameworkVersion("msgspec", "msgspec", tested=older, minimum=older).check() == installed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FrameworkVersion("none", "no-such-distribution-here", tested="1.0", minimum="1.0").check() is None
