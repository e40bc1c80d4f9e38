"""Tasks in the WebGym task schema (fact-group rubrics): the typed task, its rubric, step caps and page hooks.

A record has the fields of the original task files (``benchmark_name, task_name, domain, subdomain,
website, definite_answer, task_id, difficulty, evaluator_reference, attempt_level``) and may carry
this engine's extras: ``max_steps``, a ``reference_solution`` for the scripted policy, in each fact group
``checks`` (one programmatic check per fact), and for a page that runs its own episode (MiniWoB++) the
:class:`PageHooks` fields ``setup_js``, ``probe_js`` and ``reward_source``. ``{SITES}`` in any string stands for the
base URL of the bundled-site server.

Task files are read by :mod:`engine.tasks.loading`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from engine.store.records import RubricGroupRecord, TaskRecord

SITES_PLACEHOLDER = "{SITES}"
BUNDLED_TASKS = Path(__file__).parent.parent / "sites" / "tasks.jsonl"

# Step caps by difficulty bucket (easy 1-3 facts, medium 4-6, hard 7+), as in the original.
STEP_CAPS = {"train": (10, 20, 30), "test": (30, 50, 70)}
BUCKETS = ("easy", "medium", "hard")
CHECK_KINDS = {"url", "text", "js", "answer"}
SOLUTION_ACTIONS = {"click", "type", "key", "scroll", "go_back", "navigate", "wait", "answer", "hover"}
# The most characters each text field may hold, and the most facts a rubric may list. A task's text is in every
# prompt of its episode and in every step's record (the prompt as sent), and each fact costs a judge call: a
# runaway field (a whole page pasted into a task name) is an error here, not megabytes a step later. Far above
# what a real task needs.
TEXT_CHARS = {"task_id": 1024, "task_name": 32_768, "website": 8192, "benchmark_name": 1024, "domain": 1024,
              "subdomain": 1024, "definite_answer": 32_768}
RUBRIC_TEXT_CHARS = 32_768  # each fact, and each fact group's description
MAX_FACTS = 1000
PAGE_FIELDS = ("setup_js", "probe_js", "reward_source")  # a task file's PageHooks
KNOWN_FIELDS = frozenset({"task_id", "task_name", "website", "benchmark_name", "domain", "subdomain",
                          "definite_answer", "difficulty", "attempt_level", "evaluator_reference", "max_steps",
                          "reference_solution", *PAGE_FIELDS})
PAGE_SCRIPT_CHARS = 1 << 20  # a setup script or probe expression; MiniWoB++'s are a few hundred characters


class TaskFileError(ValueError):
    """A task file that cannot be used; the message names the file, line and field."""


def difficulty_bucket(difficulty: int) -> str:
    """``easy`` for 1-3 facts, ``medium`` for 4-6, ``hard`` for 7 or more (the original's buckets)."""
    return "easy" if difficulty <= 3 else "medium" if difficulty <= 6 else "hard"


@dataclass(frozen=True, slots=True)
class StepCaps:
    """Steps allowed per split and difficulty bucket: ``(easy, medium, hard)`` for each split."""

    train: tuple[int, int, int] = STEP_CAPS["train"]
    test: tuple[int, int, int] = STEP_CAPS["test"]

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            caps = tuple(getattr(self, split))
            if len(caps) != 3 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in caps):
                raise ValueError(f"step caps for {split!r} must be three positive integers (easy, medium, hard), "
                                 f"got {getattr(self, split)!r}")
            object.__setattr__(self, split, caps)  # lists from JSON/CLI become tuples (hashable, frozen)

    @classmethod
    def from_mapping(cls, caps: Mapping[str, Any]) -> StepCaps:
        """From ``{"train": (e, m, h), "test": (e, m, h)}``; a split left out keeps the default."""
        unknown = set(caps) - {"train", "test"}
        if unknown:
            raise ValueError(f"unknown split(s) in step caps: {sorted(unknown)} (known: train, test)")
        return cls(**{k: tuple(v) for k, v in caps.items()})

    def cap(self, difficulty: int, split: str = "train") -> int:
        """The cap for a task of ``difficulty`` facts in ``split``."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r} (known: train, test)")
        easy, medium, hard = getattr(self, split)
        return {"easy": easy, "medium": medium, "hard": hard}[difficulty_bucket(difficulty)]


DEFAULT_STEP_CAPS = StepCaps()


def as_step_caps(caps: StepCaps | Mapping[str, Any] | None) -> StepCaps:
    """Step caps from a caller: the defaults for None, a mapping read as a task file's ``step_caps``."""
    if caps is None:
        return DEFAULT_STEP_CAPS
    return caps if isinstance(caps, StepCaps) else StepCaps.from_mapping(caps)


@dataclass(frozen=True, slots=True)
class RubricGroup:
    """One fact group of the rubric; ``checks[i]`` (when present) verifies ``facts[i]``."""

    id: str
    description: str
    facts: tuple[str, ...]
    checks: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> RubricGroupRecord:
        """The group in the WebGym shape (``checks`` only when present)."""
        return {"id": self.id, "description": self.description, "facts": list(self.facts),
                **({"checks": list(self.checks)} if self.checks else {})}


class PageOpenArgs(TypedDict, total=False):
    """The page hooks' arguments of the worker's ``open`` (:meth:`PageHooks.open_args`)."""

    setup_js: str
    probe_js: str


@dataclass(frozen=True, slots=True)
class PageHooks:
    """What a task whose page runs its own episode (MiniWoB++, the colour board) does in the page, typed and in one
    place, as BrowserGym's task interface keeps setup and validation together.

    ``setup``: a script the worker runs once after the first load (a returned promise is awaited), with the
    episode's identity in ``window.WEBGYM_EPISODE``; ``probe``: an expression the worker evaluates after every
    observation's settle, whose JSON value is the page's state (``done``, ``raw_reward``, ``reward``, ``reason``,
    ``utterance``: the instruction the page generated); ``reward_from_page``: that state gives the episode's
    reward (:func:`engine.rewards.programmatic.page_reward`), no rubric or judge.
    In a task file: ``setup_js``, ``probe_js`` and
    ``reward_source: "page"``."""

    setup: str | None = None
    probe: str | None = None
    reward_from_page: bool = False

    def open_args(self, episode: Mapping[str, Any]) -> PageOpenArgs:
        """The worker's ``open`` arguments for one episode (``episode``: its id, task id and sample, given to the
        setup script so that it sets the same problem in every run)."""
        args: PageOpenArgs = {} if self.probe is None else {"probe_js": self.probe}
        if self.setup is not None:
            args["setup_js"] = f"window.WEBGYM_EPISODE = {json.dumps(dict(episode))};\n{self.setup}"
        return args

    def to_record(self) -> dict[str, Any]:
        """The task-file fields (see the class docstring)."""
        rec: dict[str, Any] = {}
        if self.setup is not None:
            rec["setup_js"] = self.setup
        if self.probe is not None:
            rec["probe_js"] = self.probe
        if self.reward_from_page:
            rec["reward_source"] = "page"
        return rec


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    task_name: str  # the instruction shown to the agent
    website: str
    benchmark_name: str = ""
    domain: str = ""
    subdomain: str = ""
    definite_answer: str | None = None
    difficulty: int = 1
    attempt_level: int = 0
    evaluator_reference: tuple[RubricGroup, ...] = ()
    max_steps: int | None = None
    reference_solution: tuple[dict[str, Any], ...] = ()
    page: PageHooks | None = None  # a page that runs its own episode
    extra: dict[str, Any] = field(default_factory=dict)
    # The caps the task was loaded with (load_tasks(step_caps=...)); None means the original's.
    step_caps: StepCaps | None = field(default=None, compare=False, repr=False)

    @property
    def bucket(self) -> str:
        """``easy`` (1-3 facts), ``medium`` (4-6) or ``hard`` (7+), by ``difficulty``."""
        return difficulty_bucket(self.difficulty)

    @property
    def n_facts(self) -> int:
        """Facts in the rubric (the original sets ``difficulty`` to this; older shapes may differ)."""
        return sum(len(g.facts) for g in self.evaluator_reference)

    def step_cap(self, split: str = "train", caps: StepCaps | None = None) -> int:
        """Steps allowed: the cap by difficulty bucket (``caps``, the run's, win over the task file's), or the task's
        own max_steps if larger."""
        return max((caps or self.step_caps or DEFAULT_STEP_CAPS).cap(self.difficulty, split), self.max_steps or 0)

    @property
    def has_checks(self) -> bool:
        return any(g.checks for g in self.evaluator_reference)

    @property
    def reward_from_page(self) -> bool:
        """The page's own state gives the reward (:class:`PageHooks`)."""
        return self.page is not None and self.page.reward_from_page

    def rubric_items(self) -> list[str]:
        """Facts flattened for a judge: ``[Group <id>: <description>] <fact>``."""
        return [f"[Group {g.id}: {g.description}] {fact}" for g in self.evaluator_reference for fact in g.facts]

    def to_dict(self) -> TaskRecord:
        """The record as stored in trajectories (WebGym field names)."""
        return {
            "task_id": self.task_id, "task_name": self.task_name, "website": self.website,
            "benchmark_name": self.benchmark_name, "domain": self.domain, "subdomain": self.subdomain,
            "definite_answer": self.definite_answer, "difficulty": self.difficulty,
            "attempt_level": self.attempt_level,
            "evaluator_reference": [g.to_dict() for g in self.evaluator_reference],
        }

    def to_record(self) -> dict[str, Any]:
        """The full record for a task file: :meth:`to_dict` plus this engine's extras and unknown fields,
        so that ``load_tasks`` of a written record gives the same task back."""
        rec: dict[str, Any] = dict(self.to_dict())
        if self.max_steps is not None:
            rec["max_steps"] = self.max_steps
        if self.reference_solution:
            rec["reference_solution"] = list(self.reference_solution)
        if self.page is not None:
            rec.update(self.page.to_record())
        rec.update({k: v for k, v in self.extra.items() if k not in rec})
        return rec
