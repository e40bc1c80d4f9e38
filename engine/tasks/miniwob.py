"""MiniWoB++ as a task source: the ``miniwob`` package's own HTML tasks, served by the engine's site server.

``--tasks miniwob`` runs every MiniWoB++ task, ``--tasks miniwob:click-button,enter-text`` the named ones.
Each task page generates its problem in JavaScript and computes its own reward; the engine only drives it:

* **Serving.** The package's ``html`` directory (found with importlib.resources) is mounted on the
  SiteServer under ``/miniwob`` (:func:`miniwob_mount`); a task's website is
  ``<base>/miniwob/miniwob/<name>.html``, so the pages' relative links (``../core/core.js``) resolve.
The page's part is the task's :class:`engine.tasks.schema.PageHooks` (:data:`PAGE_HOOKS`):

* **Episode start** (``PageHooks.setup``, run by the worker after the first load, before the first
  screenshot). A page's ``onload`` only shows MiniWoB's "START" cover; the setup seeds the page's random
  generator with ``Math.seedrandom(<episode id>)`` (the rollout defines ``window.WEBGYM_EPISODE`` =
  ``{episode_id, task_id, sample}`` before the script, so an episode's problem is the same in every run
  and differs between samples), then calls ``core.startEpisodeReal()`` (what the package's own Selenium
  environment calls) and waits for ``WOB_TASK_READY``.
* **Time limit.** MiniWoB ends an episode after ``core.EPISODE_MAX_TIME`` (7 to 30 s, set by each page)
  with reward -1, a budget meant for a human or a fast scripted agent; an engine step (screenshot, model
  call, settle) takes far longer. The setup raises the limit to 24 hours, which in practice disables it
  (the step cap ends episodes instead) and makes the time-scaled reward equal to the raw one, and stops
  the countdown display, whose repaint every second would otherwise change every screenshot.
* **Probe, done, reward** (``PageHooks.probe``, evaluated by the worker after every observation's
  settle): ``{done, reward, raw_reward, reason, utterance}`` from ``WOB_DONE_GLOBAL``,
  ``WOB_REWARD_GLOBAL``, ``WOB_RAW_REWARD_GLOBAL``, ``WOB_REWARD_REASON`` and ``core.getUtterance()``.
  The first observation's utterance becomes the task text the policy sees (the instruction exists only
  once the episode has started); the rollout ends the episode as soon as ``done`` is true, and
  ``PageHooks.reward_from_page`` makes the reward the page's own: 1 when the raw reward is
  positive, else 0 (the raw value is kept in the reward's detail).
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

from engine.tasks.schema import SITES_PLACEHOLDER, PageHooks, Task

MOUNT_PREFIX = "/miniwob"
SPEC_PREFIX = "miniwob"
BENCHMARK = "miniwob"
EPISODE_MAX_TIME_MS = 24 * 3600 * 1000  # below setTimeout's 2**31-1 ms, beyond which it fires at once

# Runs after the first load. Awaited by the worker (an async function returns a promise).
SETUP_JS = """(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  // window.onload calls core.startEpisode(), which creates the START cover: wait for it.
  for (let i = 0; i < 100 && !(window.core && core.cover_div); i++) await sleep(20);
  if (!(window.core && core.startEpisodeReal)) throw new Error('not a MiniWoB page (no core.startEpisodeReal)');
  const ep = window.WEBGYM_EPISODE || {};
  Math.seedrandom(String(ep.episode_id === undefined ? 'webgym' : ep.episode_id));
  core.EPISODE_MAX_TIME = @MAX_TIME@;
  core.startEpisodeReal();
  clearInterval(core.CD_TIMER);
  const cd = document.getElementById('timer-countdown');
  if (cd) cd.textContent = 'off';
  for (let i = 0; i < 100 && !WOB_TASK_READY; i++) await sleep(20);
  return true;
})()""".replace("@MAX_TIME@", str(EPISODE_MAX_TIME_MS))

# Evaluated after every observation; never throws (an exception comes back as {error}).
PROBE_JS = """(() => {
  try {
    let u = core.getUtterance();
    if (u && typeof u === 'object') u = u.utterance;
    return {done: !!WOB_DONE_GLOBAL, reward: Number(WOB_REWARD_GLOBAL), raw_reward: Number(WOB_RAW_REWARD_GLOBAL),
            reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON), utterance: String(u || '')};
  } catch (e) {
    return {error: String(e)};
  }
})()"""
PAGE_HOOKS = PageHooks(setup=SETUP_JS, probe=PROBE_JS, reward_from_page=True)


def miniwob_html_dir() -> Path:
    """The ``html`` directory of the installed ``miniwob`` package (core JS/CSS and the task pages)."""
    try:
        root = importlib.resources.files("miniwob") / "html"
    except ModuleNotFoundError as exc:
        raise RuntimeError("MiniWoB++ tasks need the 'miniwob' package: pip install 'miniwob>=1.1'") from exc
    path = Path(str(root))
    if not (path / "miniwob").is_dir():
        raise RuntimeError(f"the miniwob package has no task pages under {path}")
    return path


def miniwob_mount() -> dict[str, Path]:
    """The SiteServer mount that serves the MiniWoB++ pages: ``SiteServer(mounts=miniwob_mount())``."""
    return {MOUNT_PREFIX: miniwob_html_dir()}


def task_names() -> list[str]:
    """Every MiniWoB++ task the package ships, sorted."""
    return sorted(p.stem for p in (miniwob_html_dir() / "miniwob").glob("*.html"))


def is_miniwob_spec(spec: str) -> bool:
    """True for ``miniwob`` and ``miniwob:name,...`` (a task file path is anything else)."""
    return spec == SPEC_PREFIX or spec.startswith(SPEC_PREFIX + ":")


def parse_spec(spec: str) -> list[str]:
    """The task names a spec selects, in the given order; ValueError for unknown names or a bad spec."""
    if not is_miniwob_spec(spec):
        raise ValueError(f"not a MiniWoB++ task spec: {spec!r} (expected 'miniwob' or 'miniwob:name,...')")
    known = task_names()
    if spec == SPEC_PREFIX:
        return known
    names = [n.strip().removesuffix(".html") for n in spec.split(":", 1)[1].split(",") if n.strip()]
    if not names:
        raise ValueError(f"{spec!r} names no MiniWoB++ task")
    unknown = [n for n in names if n not in set(known)]
    if unknown:
        raise ValueError(f"unknown MiniWoB++ task(s): {', '.join(unknown)}")
    return list(dict.fromkeys(names))  # duplicates once, order kept


def task_record(name: str, base_url: str = SITES_PLACEHOLDER, max_steps: int | None = None) -> dict[str, Any]:
    """One task in the WebGym schema (this engine's extras included); ``{SITES}`` by default, so that
    records can be written to a task file and loaded with :func:`engine.tasks.loading.load_tasks`."""
    rec: dict[str, Any] = {
        "task_id": f"miniwob.{name}",
        # The real instruction is generated when the episode starts and replaces this text (see above).
        "task_name": f"MiniWoB++ task {name}",
        "website": f"{base_url}{MOUNT_PREFIX}/miniwob/{name}.html",
        "benchmark_name": BENCHMARK,
        "domain": BENCHMARK,
        "subdomain": name,
        **PAGE_HOOKS.to_record(),
    }
    if max_steps is not None:
        rec["max_steps"] = max_steps
    return rec


def load_miniwob_tasks(spec: str, base_url: str, max_steps: int | None = None) -> list[Task]:
    """Tasks for ``spec`` (``miniwob`` or ``miniwob:name,...``) whose pages live on the site server at
    ``base_url``, which must mount :func:`miniwob_mount`. ValueError for a bad spec."""
    out = []
    for name in parse_spec(spec):
        rec = task_record(name, base_url.rstrip("/"), max_steps)
        out.append(Task(task_id=rec["task_id"], task_name=rec["task_name"], website=rec["website"],
                        benchmark_name=BENCHMARK, domain=BENCHMARK, subdomain=name, max_steps=max_steps,
                        page=PAGE_HOOKS))
    return out


def write_miniwob_tasks(path: str | Path, spec: str, max_steps: int | None = None) -> Path:
    """Write the tasks of ``spec`` as a JSONL task file (website ``{SITES}/miniwob/...``), for a run that
    takes a task file; its site server must mount :func:`miniwob_mount`."""
    path = Path(path)
    lines = [json.dumps(task_record(n, max_steps=max_steps)) for n in parse_spec(spec)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
