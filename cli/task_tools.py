"""Tools over task sets: statistics, deterministic sampling and decomposition into sub-tasks.

Decomposition (the WebGym recipe: a task with at least 2 fact groups, at least one of them "large",
i.e. with 3 or more facts, yields easier sub-tasks whose rubric is a proper, non-empty subset of its
groups). All proper subsets would be ``2**k - 2`` per task, too many for big rubrics, so the rule is:

* every single group ``{i}``, then
* every "all groups but one" subset ``{1..k} - {i}`` (only new ones: for ``k = 2`` these are the singles),

in that order, so a task with ``k`` groups gives ``k`` sub-tasks for ``k = 2`` and ``2k`` for ``k >= 3``.
A sub-task record (WebGym schema, loadable by :func:`engine.tasks.loading.load_tasks`):

* ``task_id``: ``{parent_id}::sub-{i-j-...}``, the kept groups' 1-based positions in the parent's
  ``evaluator_reference`` (positions, not group ids: ids need not be unique or free of ``-``);
* ``task_name``: :data:`SUBTASK_TEMPLATE` filled with the parent's text and the kept groups' descriptions
  (a group without a description stands in with its facts), or a model's rewrite of that text;
* ``evaluator_reference``: the kept groups unchanged (ids, descriptions, facts, programmatic ``checks``);
* ``difficulty``: the number of facts kept; ``attempt_level``: the parent's + 1;
* ``definite_answer``: None. A parent's answer usually covers all its groups, and the schema does not say
  which groups it depends on, so no sub-task claims it;
* ``website, benchmark_name, domain, subdomain, max_steps``, the parent's unknown fields (e.g. ``split``)
  and its ``reference_solution`` are kept (the parent's solution satisfies every parent fact, hence every
  subset; it is not minimal);
* added: ``parent_task_id``, ``sub_groups`` (the positions), ``task_name_source`` (``template`` or
  ``rewrite``) and, when a rewrite failed, ``rewrite_error`` (the template text is kept then).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import statistics
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from engine.tasks.schema import BUCKETS, SITES_PLACEHOLDER, Task

NONE_LABEL = "(none)"  # stands for an empty domain, subdomain, benchmark or host in the counts
SUBTASK_TEMPLATE = "{task} (Only this part is checked: {parts}.)"
REWRITE_SYSTEM_PROMPT = (
    "You rewrite instructions for a web-browsing agent. The user message is a task followed by a note, in "
    "parentheses, saying which part of it is checked. Write one self-contained instruction that asks for "
    "exactly that part and nothing else. Keep every name, number, date and website exactly as given. "
    "Reply with the instruction only, without quotes or explanations.")

Rewrite = Callable[[str], Awaitable[str]]
_NETLOC_END = re.compile(r"[/?#]")


# -- statistics ------------------------------------------------------------------------------------------

def website_host(website: str) -> str:
    """The host of a task's website (lower case); for a ``{SITES}/site/...`` URL, ``{SITES}/site``."""
    if website.startswith(SITES_PLACEHOLDER):
        first = website[len(SITES_PLACEHOLDER):].strip("/").split("/")[0]
        return f"{SITES_PLACEHOLDER}/{first}" if first else SITES_PLACEHOLDER
    if website.startswith("about:"):
        return website
    # By hand rather than urlparse: stats over 300k tasks spent most of their time there.
    rest = website.split("://", 1)[1] if "://" in website else website
    netloc = _NETLOC_END.split(rest, 1)[0].rpartition("@")[2]
    host = urlparse("//" + netloc).hostname if netloc.startswith("[") else netloc.split(":", 1)[0].lower()
    return host or website or NONE_LABEL


def task_split(task: Task, default: str | None = None) -> str:
    """A task's split: its own ``split`` field if it has one, else ``default``, else ``(none)``."""
    own = task.extra.get("split")
    return str(own) if own not in (None, "") else (default or NONE_LABEL)


def decomposable(task: Task) -> bool:
    """Whether :func:`decompose` derives sub-tasks from ``task`` (2+ groups, one of them with 3+ facts)."""
    groups = task.evaluator_reference
    return len(groups) >= 2 and any(len(g.facts) >= 3 for g in groups)


def _counts(values: Iterable[Any]) -> dict[Any, int]:
    """Counts, most frequent first (ties by value), with empty values as ``(none)``."""
    c = Counter(NONE_LABEL if v in (None, "") else v for v in values)
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], str(kv[0]))))


def _spread(values: list[int]) -> dict[str, float | int | None]:
    if not values:
        return {"min": None, "median": None, "max": None, "mean": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "mean": round(statistics.fmean(values), 3)}


def stats(tasks: Sequence[Task], split: str | None = None) -> dict[str, Any]:
    """Counts over a task set (JSON-able, except that ``by_difficulty``/``by_facts`` keys are ints).

    ``split`` is the split of records without a ``split`` field of their own (WebGym files are one file per
    split). Keys: ``total``, ``by_split``, ``by_bucket`` (always easy, medium, hard), ``by_difficulty``
    and ``by_facts`` (ascending), ``by_domain``, ``by_subdomain``, ``by_host``, ``by_benchmark``,
    ``by_attempt_level`` (most frequent first; empty values count as ``(none)``), ``facts_per_task``
    and ``groups_per_task`` (min, median, max, mean), ``with_definite_answer``, ``with_checks``,
    ``with_reference_solution``, ``decomposable``.
    """
    facts = [t.n_facts for t in tasks]
    buckets = Counter(t.bucket for t in tasks)
    return {
        "total": len(tasks),
        "by_split": _counts(task_split(t, split) for t in tasks),
        "by_bucket": {b: buckets.get(b, 0) for b in BUCKETS},
        "by_difficulty": dict(sorted(Counter(t.difficulty for t in tasks).items())),
        "by_facts": dict(sorted(Counter(facts).items())),
        "by_domain": _counts(t.domain for t in tasks),
        "by_subdomain": _counts(t.subdomain for t in tasks),
        "by_host": _counts(website_host(t.website) for t in tasks),
        "by_benchmark": _counts(t.benchmark_name for t in tasks),
        "by_attempt_level": dict(sorted(Counter(t.attempt_level for t in tasks).items())),
        "facts_per_task": _spread(facts),
        "groups_per_task": _spread([len(t.evaluator_reference) for t in tasks]),
        "with_definite_answer": sum(t.definite_answer is not None for t in tasks),
        "with_checks": sum(t.has_checks for t in tasks),
        "with_reference_solution": sum(bool(t.reference_solution) for t in tasks),
        "decomposable": sum(decomposable(t) for t in tasks),
    }


# -- sampling --------------------------------------------------------------------------------------------

STRATA: dict[str, Callable[[Task], Any]] = {
    "bucket": lambda t: t.bucket,
    "difficulty": lambda t: t.difficulty,
    "domain": lambda t: t.domain,
    "subdomain": lambda t: t.subdomain,
    "benchmark_name": lambda t: t.benchmark_name,
    "host": lambda t: website_host(t.website),
    "split": lambda t: task_split(t),
}


def sample(tasks: Sequence[Task], n: int, seed: int = 0, stratify_by: str | None = None) -> list[Task]:
    """``n`` tasks drawn without replacement, the same for the same input, ``n`` and ``seed``.

    With ``stratify_by`` (a key of :data:`STRATA`, e.g. ``"bucket"``) each stratum gets its proportional
    share, rounded by largest remainder (ties: the stratum that sorts first), and is sampled on its own
    (the draw in a stratum does not depend on the others). The result keeps the input order; ``n`` at
    least ``len(tasks)`` gives every task.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if stratify_by is not None and stratify_by not in STRATA:
        raise ValueError(f"unknown stratum {stratify_by!r} (known: {', '.join(STRATA)})")
    if n >= len(tasks):
        return list(tasks)
    if stratify_by is None:
        picked = random.Random(f"sample:{seed}").sample(range(len(tasks)), n)
        return [tasks[i] for i in sorted(picked)]
    key = STRATA[stratify_by]
    strata: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        strata.setdefault(str(key(t)), []).append(i)
    names = sorted(strata)
    exact = {s: n * len(strata[s]) / len(tasks) for s in names}
    quota = {s: int(exact[s]) for s in names}
    # Largest remainder: the seats left go to the largest fractional parts (each <= 1 extra, so a
    # stratum never gets more than it has since n < len(tasks)).
    for s in sorted(names, key=lambda s: (-(exact[s] - quota[s]), s))[:n - sum(quota.values())]:
        quota[s] += 1
    picked = []
    for s in names:
        # A string seed is hashed deterministically (sha512), unlike hash() of a str.
        picked += random.Random(f"sample:{seed}:{stratify_by}:{s}").sample(strata[s], quota[s])
    return [tasks[i] for i in sorted(picked)]


# -- decomposition ---------------------------------------------------------------------------------------

def subsets(n_groups: int) -> list[tuple[int, ...]]:
    """The group positions (0-based) of each sub-task of a decomposable task with ``n_groups`` groups."""
    singles = [(i,) for i in range(n_groups)]
    all_but_one = [tuple(j for j in range(n_groups) if j != i) for i in range(n_groups)]
    return list(dict.fromkeys(s for s in singles + all_but_one if 0 < len(s) < n_groups))


def _part(group: Any) -> str:
    text = group.description.strip() or ", ".join(group.facts)
    return text.rstrip(" .;")


def subtask_text(task: Task, keep: Sequence[int]) -> str:
    """The template instruction of the sub-task of ``task`` keeping groups ``keep`` (0-based)."""
    parts = "; ".join(_part(task.evaluator_reference[i]) for i in keep)
    return SUBTASK_TEMPLATE.format(task=task.task_name.strip(), parts=parts)


def subtask_records(task: Task) -> list[dict[str, Any]]:
    """The sub-task records of one task (empty if it is not :func:`decomposable`); see the module docstring."""
    if not decomposable(task):
        return []
    records = []
    base = task.to_record()
    for keep in subsets(len(task.evaluator_reference)):
        groups = [task.evaluator_reference[i] for i in keep]
        positions = [i + 1 for i in keep]
        rec = {**base}
        rec.update({
            "task_id": f"{task.task_id}::sub-{'-'.join(map(str, positions))}",
            "task_name": subtask_text(task, keep),
            "definite_answer": None,
            "difficulty": sum(len(g.facts) for g in groups),
            "attempt_level": task.attempt_level + 1,
            "evaluator_reference": [g.to_dict() for g in groups],
            "parent_task_id": task.task_id,
            "sub_groups": positions,
            "task_name_source": "template",
        })
        rec.pop("rewrite_error", None)  # a parent that was itself a failed rewrite: not this record's error
        records.append(rec)
    return records


def decompose(tasks: Iterable[Task], rewrite: Rewrite | None = None, *, concurrency: int = 8) -> list[dict[str, Any]]:
    """Sub-task records of every decomposable task, in input order (see the module docstring).

    ``rewrite`` (an async ``str -> str``, e.g. from :func:`model_rewriter`) rewrites each template text;
    with it, this runs its own event loop (use :func:`decompose_async` inside one).
    """
    if rewrite is None:
        return [rec for t in tasks for rec in subtask_records(t)]
    return asyncio.run(decompose_async(tasks, rewrite, concurrency=concurrency))


async def decompose_async(tasks: Iterable[Task], rewrite: Rewrite | None = None, *,
                          concurrency: int = 8) -> list[dict[str, Any]]:
    """:func:`decompose` in a running event loop: up to ``concurrency`` rewrites at once.

    A rewrite that raises, or returns empty text, keeps the template text; the record then says why in
    ``rewrite_error``.
    """
    records = [rec for t in tasks for rec in subtask_records(t)]
    if rewrite is None or not records:
        return records
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(rec: dict[str, Any]) -> None:
        async with gate:
            try:
                text = _clean_rewrite(await rewrite(rec["task_name"]))
            except Exception as exc:  # any failure of the model (HTTP, timeout, empty reply) keeps the template
                rec["rewrite_error"] = f"{type(exc).__name__}: {exc}"
                return
        rec["task_name"] = text
        rec["task_name_source"] = "rewrite"

    await asyncio.gather(*(one(r) for r in records))
    return records


def _clean_rewrite(text: str) -> str:
    """The instruction from a model's reply: no reasoning block, no surrounding quotes; empty is an error."""
    text = re.sub(r"^\s*<think>.*?</think>", "", text, flags=re.DOTALL).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    if not text:
        raise ValueError("the model returned an empty rewrite")
    return text


def model_rewriter(model: Any, max_tokens: int = 256) -> Rewrite:
    """A :data:`Rewrite` that asks a started :class:`engine.agent.model_api.LanguageModel` (e.g. ``OpenAIModel``)
    with :data:`REWRITE_SYSTEM_PROMPT`, at temperature 0 (the same text gives the same rewrite)."""
    from engine.agent.model_api import ChatRequest, SamplingParams

    ids = itertools.count(1)
    sampling = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens, logprobs=False)

    async def rewrite(text: str) -> str:
        request = ChatRequest(
            request_id=f"rewrite-{next(ids)}",
            messages=[{"role": "system", "content": REWRITE_SYSTEM_PROMPT},
                      {"role": "user", "content": [{"type": "text", "text": text}]}],
            images={}, sampling=sampling)
        return (await model.generate(request)).text

    return rewrite


def write_jsonl(records: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write records one per line (UTF-8, non-ASCII kept); returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n
