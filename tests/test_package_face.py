"""The package face: ``from engine import X`` for what a library user needs, loaded only when first used."""

from __future__ import annotations

import subprocess
import sys

import engine


def test_every_exported_name_resolves_to_its_defining_module() -> None:
    names = [n for n in engine.__all__ if n != "__version__"]
    assert sorted(names) == sorted(engine._EXPORTS)
    for name in names:
        obj = getattr(engine, name)
        assert obj.__module__ == engine._EXPORTS[name], name


def test_importing_the_package_loads_no_room() -> None:
    code = "import sys, engine; print(sorted(m for m in sys.modules if m.startswith('engine.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['engine._version']"


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import() -> None:
    try:
        engine.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")
    from engine import json_input
    assert json_input.__name__ == "engine.json_input"
