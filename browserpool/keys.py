"""Key definitions for CDP ``Input.dispatchKeyEvent`` (US layout), so typed text produces real
keydown/keypress/keyup events the way a person's keyboard does."""

from __future__ import annotations

from dataclasses import dataclass

MODIFIER_BITS = {"Alt": 1, "Control": 2, "Ctrl": 2, "Meta": 4, "Shift": 8}

_NAMED: dict[str, tuple[str, int, str | None]] = {
    # name: (code, windowsVirtualKeyCode, text)
    "Enter": ("Enter", 13, "\r"),
    "Tab": ("Tab", 9, None),
    "Backspace": ("Backspace", 8, None),
    "Delete": ("Delete", 46, None),
    "Escape": ("Escape", 27, None),
    "Space": ("Space", 32, " "),
    "ArrowUp": ("ArrowUp", 38, None),
    "ArrowDown": ("ArrowDown", 40, None),
    "ArrowLeft": ("ArrowLeft", 37, None),
    "ArrowRight": ("ArrowRight", 39, None),
    "PageUp": ("PageUp", 33, None),
    "PageDown": ("PageDown", 34, None),
    "Home": ("Home", 36, None),
    "End": ("End", 35, None),
}
_ALIASES = {"Return": "Enter", "Esc": "Escape", "Up": "ArrowUp", "Down": "ArrowDown",
            "Left": "ArrowLeft", "Right": "ArrowRight", " ": "Space"}
_SHIFTED_PUNCT = '~!@#$%^&*()_+{}|:"<>?'
_PUNCT_CODES = {
    "-": ("Minus", 189), "=": ("Equal", 187), "[": ("BracketLeft", 219), "]": ("BracketRight", 221),
    "\\": ("Backslash", 220), ";": ("Semicolon", 186), "'": ("Quote", 222), ",": ("Comma", 188),
    ".": ("Period", 190), "/": ("Slash", 191), "`": ("Backquote", 192),
}


@dataclass(frozen=True, slots=True)
class KeyDef:
    key: str
    code: str
    vk: int
    text: str | None


def key_for_char(ch: str) -> KeyDef | None:
    """The key that types ``ch`` on a US keyboard, or None (then the text is inserted directly)."""
    if ch == " ":
        return KeyDef(" ", "Space", 32, " ")
    if ch == "\n":
        return KeyDef("Enter", "Enter", 13, "\r")
    if ch.isascii() and ch.isalpha():
        return KeyDef(ch, f"Key{ch.upper()}", ord(ch.upper()), ch)
    if ch.isascii() and ch.isdigit():
        return KeyDef(ch, f"Digit{ch}", ord(ch), ch)
    if ch in _PUNCT_CODES:
        code, vk = _PUNCT_CODES[ch]
        return KeyDef(ch, code, vk, ch)
    if ch in _SHIFTED_PUNCT:
        return KeyDef(ch, "", 0, ch)
    return None


def key_for_name(name: str) -> KeyDef:
    """A named key ("Enter", "ArrowDown") or a single character; ValueError for unknown names."""
    name = _ALIASES.get(name, name)
    if name in _NAMED:
        code, vk, text = _NAMED[name]
        return KeyDef(" " if name == "Space" else name, code, vk, text)
    if len(name) == 1 and (kd := key_for_char(name)):
        return kd
    if name in {f"F{i}" for i in range(1, 13)}:
        return KeyDef(name, name, 111 + int(name[1:]), None)
    raise ValueError(f"unknown key {name!r}")


# Every key and modifier name parse_combo knows, by its lowercase spelling (aliases to their key).
_BY_LOWER = {**{n.lower(): n for n in [*_NAMED, *MODIFIER_BITS, *(f"F{i}" for i in range(1, 13))]},
             **{a.lower(): key for a, key in _ALIASES.items()}}


def canonical_key_name(name: str) -> str:
    """A key or modifier name as :func:`parse_combo` spells it, matched case-insensitively ("enter", "ESC",
    "ctrl", "arrowdown"); any other name (a character, an unknown key) as given."""
    return _BY_LOWER.get(name.lower()) or _BY_LOWER.get(name.strip().lower()) or name


def parse_combo(combo: str) -> tuple[int, KeyDef]:
    """Parse "Control+A" / "Shift+Tab" into (modifier bits, key)."""
    parts = [p for p in combo.split("+") if p] if combo != "+" else ["+"]
    if not parts:
        raise ValueError("empty key combination")
    mods = 0
    for p in parts[:-1]:
        if p not in MODIFIER_BITS:
            raise ValueError(f"unknown modifier {p!r} in {combo!r}")
        mods |= MODIFIER_BITS[p]
    kd = key_for_name(parts[-1])
    if mods and not mods & MODIFIER_BITS["Shift"] and len(kd.key) == 1 and kd.key.isupper():
        kd = KeyDef(kd.key.lower(), kd.code, kd.vk, kd.text)  # Control+A sends key "a", as a keyboard does
    return mods, kd


# Characters typed key by key at each end of a long text; its middle is inserted at once (typing_plan).
TYPE_KEYED_EDGE = 64
# Newlines in the middle of a long text pressed as Enter, at most; later ones are inserted with the text around them.
TYPE_MIDDLE_ENTERS = 64
# Line breaks one type action may hold. Chromium's editing inserts a line break in time that grows with the lines
# already there (a textarea took 0.6 s for 1,000, 8.7 s for 4,000): a text of many thousands would hang its page.
TYPE_MAX_LINE_BREAKS = 1000


def typing_plan(text: str, edge: int = TYPE_KEYED_EDGE,
                middle_enters: int = TYPE_MIDDLE_ENTERS) -> list[tuple[KeyDef | None, str]]:
    """How ``text`` is typed, in order: ``(key, character)`` for each key press, ``(None, run)`` for a run
    inserted at once (``Input.insertText``: an ``input`` event, no key events).

    Every character that has a key is pressed, except in the middle of a text longer than twice ``edge``: there,
    runs of characters other than newlines are inserted. A key press (two CDP key events) costs ~1.5 ms, most of it
    outside Python, so a text of a few thousand characters typed key by key would run past an action's cap; a
    page still sees its first and last ``edge`` characters as keys (what an autocomplete or a key handler reacts
    to), and the middle's first ``middle_enters`` newlines as Enter. The middle's later newlines are inserted too
    (a textarea gets the same text): 20,000 newlines pressed one by one kept a worker too busy to heartbeat, and
    the engine dropped it with every episode it served. Characters without a key (most non-ASCII ones) are always
    inserted, as a run."""
    middle = range(edge, len(text) - edge) if len(text) > 2 * edge else range(0)
    plan: list[tuple[KeyDef | None, str]] = []
    run: list[str] = []
    enters = 0
    for i, ch in enumerate(text):
        keyed = i not in middle
        if not keyed and ch == "\n" and enters < middle_enters:
            keyed, enters = True, enters + 1
        kd = key_for_char(ch) if keyed else None
        if kd is not None:
            if run:
                plan.append((None, "".join(run)))
                run = []
            plan.append((kd, ch))
        else:
            run.append(ch)
    if run:
        plan.append((None, "".join(run)))
    return plan
