"""The one mechanism every configuration of the project is read and checked by.

Configs are dataclasses with typed fields (choices as ``Literal``s). Two checks serve them all:

- :func:`config_from` builds one from plain data (a TOML/YAML/JSON file, a worker's ``--config``, a stored
  manifest): unknown keys refused with a "did you mean", each value checked against its field's type by
  ``msgspec.convert`` (nested configs included), and every refusal a :class:`ConfigError` naming the source and
  the key (``train.toml: batch_size: expected an integer, got 1.5``);
- :func:`check_choices`, called by each config's ``__post_init__``, refuses a ``Literal`` field that holds none of
  its choices, so a config built in code is held to the same choices as one read from a file.

It lives in the bottom layer so that every layer above (the worker's config here, the engine's, the trainer's)
uses the same one.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
import typing
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the source and the key."""


def choices_of(hint: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` type hint (or a union holding one) allows; () when it has none."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(c for arg in typing.get_args(hint) for c in choices_of(arg))
    return ()


def _allows(hint: Any, value: Any) -> bool:
    """Whether ``value`` fits the non-``Literal`` members of a union hint (e.g. ``bool`` in ``bool | "auto"``)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for arg in args:
        if arg is type(None) and value is None:
            return True
        if arg in (bool, int, float, str) and type(value) is arg:
            return True
    return False


def _listed(hint: Any) -> str:
    """A field's choices as a message lists them ("true, false, vision" for ``bool | Literal["vision"]``)."""
    flags = ["true", "false"] if bool in typing.get_args(hint) else []
    return ", ".join([*flags, *map(str, choices_of(hint))])


@functools.cache
def _choice_fields(cls: Any) -> tuple[tuple[str, Any, tuple[Any, ...]], ...]:
    """The fields of ``cls`` that have choices: (name, type hint, choices), read once per class."""
    return tuple((name, hint, allowed) for name, hint in typing.get_type_hints(cls).items()
                 if (allowed := choices_of(hint)))


def check_choices(obj: Any, source: str = "") -> None:
    """Raise :class:`ConfigError` for a ``Literal`` field of the dataclass ``obj`` that holds none of its choices."""
    for name, hint, allowed in _choice_fields(obj.__class__):
        value = getattr(obj, name, None)
        if value not in allowed and not _allows(hint, value):
            prefix = f"{source}: " if source else ""
            raise ConfigError(f"{prefix}{name}: must be one of {_listed(hint)}, got {value!r}")


def config_from(cls: type[T], data: Any, source: str = "config", *, strict: bool = True) -> T:
    """The dataclass ``cls`` built from plain ``data``, every key and value checked (see the module's docstring).

    TOML has no null: ``false`` for an optional field that is not itself a flag means "none" (``dual_clip = false``).
    ``strict`` False also reads numbers written as strings, for files people write (YAML 1.1 reads ``1e-6`` as one).
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table of settings, got {type(data).__name__}")
    data = _prepared(cls, data, source, "")
    try:
        return msgspec.convert(data, cls, strict=strict)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_readable(str(exc), cls, data)}") from None


def _prepared(cls: type, data: dict[str, Any], source: str, where: str) -> dict[str, Any]:
    """``data`` with unknown keys refused and ``false`` read as none where a field is optional; nested configs too."""
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            squeezed = str(key).replace("_", "").replace("-", "")
            close = [k for k in known if k.replace("_", "") == squeezed] or difflib.get_close_matches(key, known, 1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown key {where + str(key)!r}{hint}; "
                              f"known keys: {', '.join(sorted(known))}")
        field_type = hints[key]
        nested = _dataclass_in(field_type)
        if nested is not None and isinstance(value, dict):
            value = _prepared(nested, value, source, f"{where}{key}.")
        elif value is False and _optional_not_flag(field_type):
            value = None
        out[key] = value
    return out


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field's hint names (alone or in an optional), if any."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    found = [a for a in args if dataclasses.is_dataclass(a)]
    return found[0] if len(found) == 1 and isinstance(found[0], type) else None


def _optional_not_flag(hint: Any) -> bool:
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return False
    args = typing.get_args(hint)
    return type(None) in args and bool not in args


_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
          "array": "a list", "object": "a table", "null": "nothing"}
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")


def _readable(message: str, cls: type, data: dict[str, Any]) -> str:
    """msgspec's ``Expected `int`, got `float` - at `$.batch_size``` as ``batch_size: expected an integer, got 1.5``."""
    at = _AT.search(message)
    path = at.group("path") if at else ""
    body = message[: at.start()] if at else message
    steps = [(m.group(1), m.group(2)) for m in _STEP.finditer(path)]
    key = ".".join(name if name is not None else f"[{index}]" for name, index in steps).replace(".[", "[")
    value, hint = _lookup(cls, data, steps)
    if body.startswith("Invalid enum value") and choices_of(hint):
        body = f"must be one of {_listed(hint)}"
    elif m := re.fullmatch(r"Expected `array` of length (\d+), got \d+", body):
        body = f"expected a list of {m.group(1)} values"
    elif m := re.fullmatch(r"Expected `([^`]+)`, got `[^`]+`", body):
        body = "expected " + " or ".join(_WORDS.get(w.strip(), w.strip()) for w in m.group(1).split("|"))
    else:  # a check in a config's __post_init__: its own message says what is wrong
        if key and re.match(r"\w+: ", body):  # "lr: must be > 0" in [train]: "train.lr: must be > 0"
            return f"{key}.{body}"
        return f"{key}: {body}" if key else body
    shown = f", got {value!r}" if value is not _MISSING else ""
    return f"{key}: {body}{shown}"


_MISSING = object()


def _lookup(cls: Any, data: Any, steps: list[tuple[str | None, str | None]]) -> tuple[Any, Any]:
    """The value at a msgspec error path in ``data``, and the type hint it was checked against."""
    value: Any = data
    hint: Any = cls
    for name, index in steps:
        nested = _dataclass_in(hint)
        if name is not None:
            hint = typing.get_type_hints(nested).get(name) if nested is not None else None
            value = value.get(name, _MISSING) if isinstance(value, dict) else _MISSING
        else:
            args = typing.get_args(hint)
            hint = args[0] if args else None
            position = int(index or 0)
            value = value[position] if isinstance(value, list | tuple) and position < len(value) else _MISSING
    return value, hint
