"""The episode and step records of a run directory, typed in one place.

``RUN_DIR/episodes.jsonl`` holds one :class:`EpisodeRecord` per line (written by
:meth:`engine.episode.rollout.Rollout._write`), each with its :class:`StepRecord` list; ``RUN_DIR/judgements.jsonl``
one :class:`Judgement` per line (written by :mod:`engine.rewards.judge_queue`). At run time records stay plain dicts
(what ``json`` gives); the classes here are :class:`typing.TypedDict` types, so that the rollout, the store's
reader, train, the viewer and the judge name the same keys, and so that :func:`decode_record` can validate a
line with msgspec before anything reads it.

Every record carries ``format_version``; :data:`FORMAT_VERSION` is the one this code writes. Records of
:data:`READABLE_VERSIONS` are read, an older one mapped to the current format as it is decoded
(:func:`upgrade_record`); any other version is refused with a :class:`RecordFormatError` that says whether the
run directory is newer or older than the code and what to do; so is a complete line that is not a record (not
JSON, or a value of the wrong type: the message names the file, the line and the field).

How an episode ended (``status``, :data:`RecordStatus`), and what says why:

==================  ======================================================================================
``success``         rewarded 1: ``reward`` says by what (``program``, ``page``, ``judge``)
``failure``         rewarded 0: the task's checks, the page or the judge said no
``unrewarded``      nothing could score it (no programmatic checks, no page reward, no judge, or a judge with
                    nothing to check): ``reward`` is ``{"value": null, "source": "none", "reason": why}``
``blocked``         the site refused the agent: ``error`` is ``{"kind", "message"}``, its kind one of
                    :data:`BLOCKED_KINDS` (``blocked``: a block page; ``blocked_domain``: the site was on the
                    blocklist, never loaded; ``judge_blocked``: the judge's blocked verdict, whose ``reward``
                    keeps value null, ``blocked`` true and the judge's evidence); ``reward`` otherwise null
``error``           stopped by an error: ``error`` is ``{"kind", "message"}``, its kind one of
                    :class:`RecordErrorKind` (worker_lost, browser_hung, policy, episode_timeout, straggler,
                    internal, ...); ``reward`` null
``judge_pending``   waiting for the judge's verdict (``judgements.jsonl`` settles it), or the judge failed
                    (the reader merges in ``judge_error``)
==================  ======================================================================================

A ``blocked`` or ``unrewarded`` record never carries a reward value: nothing scored the agent, so nothing may
train on it as a failure.

Which keys must be present: the engine writes every key its classes list, except those marked *optional*
(written only when there is something to say) and the reader's own (``judged_at``, ``judge_error``). The
reader itself requires only what identifies an episode (``task``, ``task.task_id``, ``status``; per step
``step`` and ``action``), so that records written by hand (tests, tools) with fewer keys still read; every key
that is there must have its type. A record without ``format_version`` (no engine writes one) is read as the
current format.

This module deliberately does not use ``from __future__ import annotations``: ``TypedDict`` only sees
``Required`` in real (not string) annotations on Python 3.11.
"""

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Required, TypedDict

import msgspec

from browserpool.protocol import ErrorKind
from engine import json_input

#: The record format this code writes (also in ``manifest.json``). Bump it when a key changes meaning or type,
#: or a key readers need is added; keys only added as optional need no bump. 2: the statuses ``unrewarded`` and
#: ``blocked`` (version 1 wrote ``failure`` with no reward value, ``failure`` with the judge's 0.0 for a blocked
#: verdict, and ``error`` for block pages and blocklisted sites).
FORMAT_VERSION = 2
#: The record formats this code reads: version 1 is mapped to version 2 as it is read (:func:`upgrade_record`).
READABLE_VERSIONS = (1, 2)

#: How an episode ended (the table in the module docstring).
RecordStatus = Literal["success", "failure", "unrewarded", "blocked", "error", "judge_pending"]
#: Every status, in the order summaries show them.
STATUSES: tuple[RecordStatus, ...] = ("success", "failure", "unrewarded", "blocked", "error", "judge_pending")


class RecordErrorKind(StrEnum):
    """What ended an episode of status ``error`` or ``blocked`` (``RecordError.kind`` as the engine writes it)."""

    WORKER_LOST = "worker_lost"  # the browser worker went away (or missed its deadlines) past --retry-lost
    # A browser operation failed on the worker: browser_ + browserpool.protocol.ErrorKind.
    BROWSER_REFUSED = "browser_refused"
    BROWSER_HUNG = "browser_hung"
    BROWSER_NO_EPISODE = "browser_no_episode"
    BROWSER_BROWSER = "browser_browser"
    BROWSER_TOO_LARGE = "browser_too_large"
    BROWSER_CAPTURE = "browser_capture"  # Chromium refused the screenshot on every try
    BROWSER_INTERNAL = "browser_internal"
    # The page's renderer grew past the worker's page_memory_mib while the episode ran, and was ended.
    PAGE_MEMORY = "page_memory"
    NO_SCREENSHOT = "no_screenshot"  # the worker returned an observation without its frame
    POLICY = "policy"  # the policy raised (or did not start)
    POLICY_TIMEOUT = "policy_timeout"  # one policy call ran past policy_step_timeout_s
    EPISODE_TIMEOUT = "episode_timeout"  # the episode ran past episode_timeout_s
    STRAGGLER = "straggler"  # cut at the run's end (RunConfig.straggler_fraction)
    ABANDONED = "abandoned"  # a step-level environment closed with its episode open
    CLIENT_GONE = "client_gone"  # a remote environment's client went away with its episode open
    CLIENT_IDLE = "client_idle"  # ... or sent nothing for longer than the server waits
    INTERNAL = "internal"  # a bug of the engine's: the record keeps the exception
    BLOCKED = "blocked"  # status blocked: a block page
    BLOCKED_DOMAIN = "blocked_domain"  # status blocked: the site was on the blocklist, never loaded
    JUDGE_BLOCKED = "judge_blocked"  # status blocked: the judge's verdict
    TRAFFIC_MISSING = "traffic_missing"  # a replay found no recorded traffic for the task

    @classmethod
    def of_browser(cls, kind: ErrorKind) -> "RecordErrorKind":
        """The record's kind for a browser operation that failed with ``kind`` (``page_memory`` is the page's
        doing, not the browser's: it keeps its name)."""
        if kind is ErrorKind.PAGE_MEMORY:
            return cls.PAGE_MEMORY
        return cls(f"browser_{kind.value}")


#: The error kinds of a ``blocked`` record: a block page, a site on the blocklist, the judge's verdict.
BLOCKED_KINDS = (RecordErrorKind.BLOCKED, RecordErrorKind.BLOCKED_DOMAIN, RecordErrorKind.JUDGE_BLOCKED)


# --- the parts -----------------------------------------------------------------------------------

class RubricGroupRecord(TypedDict, total=False):
    """One fact group of a task's rubric (:meth:`engine.tasks.schema.RubricGroup.to_dict`)."""

    id: str
    description: str
    facts: list[str]
    checks: list[dict[str, Any]]  # optional: one programmatic check per fact


class TaskRecord(TypedDict, total=False):
    """The task an episode ran (:meth:`engine.tasks.schema.Task.to_dict`; WebGym's field names). ``task_name`` is the
    instruction the policy saw (MiniWoB's comes from the page); ``website`` has its credentials masked."""

    task_id: Required[str]
    task_name: str
    website: str
    benchmark_name: str
    domain: str
    subdomain: str
    definite_answer: str | None
    difficulty: int
    attempt_level: int
    evaluator_reference: list[RubricGroupRecord]


class ActionRecord(TypedDict, total=False):
    """The action a policy chose (:meth:`engine.agent.actions.AgentAction.to_dict`): ``name`` plus only the fields
    that differ from their defaults. Coordinates in CSS pixels of the viewport."""

    name: Required[str]
    x: float | None
    y: float | None
    text: str | None
    direction: str | None
    url: str | None
    keys: str | None
    clear: bool
    enter: bool
    seconds: float | None
    element_id: int | None  # Set-of-Marks: the element the model named
    node: int | None  # the accessibility tree's element the model named (its id in the tree)


class PageEvent(TypedDict):
    """Something the page did besides the action (:class:`browserpool.protocol.PageEvent`): ``kind`` one of
    refused, popup, download, filechooser, dialog, permission, closed."""

    kind: str
    url: str
    detail: str


class StepTraffic(TypedDict, total=False):
    """What an observation's loads did to an episode's recorded or replayed traffic (docs/repeatable.md)."""

    recorded: Required[int]  # responses kept (recording)
    served: Required[int]  # requests answered from the archive (replay)
    misses: Required[int]  # requests the archive lacked (replay)
    miss_urls: list[str]  # the first of their URLs, masked


class EpisodeTraffic(TypedDict, total=False):
    """How an episode's traffic was kept or served (:mod:`engine.episode.traffic_plan`): its mode, the archive it
    wrote or read (relative to the run directory when it is in it), the start snapshot of its GRPO group, why it
    ran live, and what its start page's loads did."""

    mode: Required[Literal["record", "replay", "live"]]
    archive: str
    group_start: str
    why: str
    open: StepTraffic


class RecordError(TypedDict):
    """What ended an episode of status ``error`` or ``blocked`` (``error``), or one of its earlier attempts
    (``previous_errors``): an error kind and its message (capped, credentials masked). Status ``error``:
    one of :class:`RecordErrorKind`; status ``blocked``: one of :data:`BLOCKED_KINDS`. Read as ``str``: records
    of other versions may carry kinds this one does not write."""

    kind: str
    message: str


class StepResult(TypedDict, total=False):
    """The page after a step's action (``StepRecord.result``)."""

    url: str
    title: str
    settle: str  # quiet | busy | timeout | hung | skipped
    screenshot: str | None  # the new screenshot, relative to the run directory
    truncated: list[str]  # optional: what the caps cut from that page's texts


class FinalPage(TypedDict, total=False):
    """The page an episode ended on (``EpisodeRecord.final``)."""

    url: str
    title: str
    settled: bool
    screenshot: str | None
    truncated: list[str]  # optional


class FactRecord(TypedDict):
    """One rubric fact's verdict (:class:`engine.rewards.programmatic.FactVerdict`)."""

    group: str
    fact: str
    check: str  # how it was checked: url | answer | text | js | page | judge ...
    passed: bool
    detail: str


class RewardRecord(TypedDict, total=False):
    """An episode's reward (:meth:`engine.rewards.programmatic.Reward.to_dict`)."""

    value: Required[float | None]  # 1.0 or 0.0; None: unrewarded, or the judge's blocked verdict
    source: str  # program | page | judge | none
    reason: str
    blocked: bool  # optional: the judge saw the site block the agent (value None; the record is ``blocked``)
    facts: list[FactRecord]
    evidence: dict[str, Any] | None  # what the judge decided on (its calls, kept screenshots...); JSON-able


class StepRecord(TypedDict, total=False):
    """One step of an episode (:meth:`engine.episode.rollout.Rollout._step`): the page the policy saw, its reply and
    action, and what the action did.

    Always written: ``step`` ... ``policy_version`` and ``timings_ms``. Written when the action ran (not for
    ``answer``, nor a refused action): ``point``, ``note``, ``page_changed``, ``result`` (and ``events``,
    ``probe`` when the page had them). The others only when there is something to say."""

    step: Required[int]  # 0-based
    url: str  # the page the policy saw (credentials masked, capped)
    title: str
    screenshot: str | None  # what the policy saw, relative to the run directory
    settled: bool
    http_status: int  # the page's main document's HTTP status, when it had one
    load: dict[str, Any]  # the page did not load as it should (engine.episode.load_outcome): kind, error, status
    action: Required[ActionRecord]
    action_text: str  # the action in one line (AgentAction.describe)
    reply: str  # the raw model output, or a description for non-model policies
    thought: str | None
    parse_error: str | None
    policy_version: int | None  # the weights' version that produced the reply
    timings_ms: dict[str, float]  # policy_ms, the worker's phases, step_ms; pace_ms and store_wait_ms when it waited
    # Optional, from the observation and the reply:
    elements: list[list[int | float | str]]  # Set-of-Marks: [id, tag, text, x, y, w, h] of the numbered boxes
    axtree: str  # the accessibility tree the step acted on, as the prompt shows it (episodes that observe it)
    # The DOM snapshot the step saw (episodes that observe it): one row per element, browserpool.protocol.DOMNode's
    # fields in order (id, parent, tag, x, y, w, h, visibility, clickable).
    dom: list[list[int | float | str | bool]]
    # Episodes that record or replay their traffic: what the action's loads did (responses recorded, requests
    # answered from the archive, requests it lacked and the first of their URLs).
    traffic: StepTraffic
    truncated: list[str]  # what the caps cut from the page the step acted on
    parsed: dict[str, Any]  # the policy's parsed fields, coordinate frames, generation facts (prompt_sha256...)
    messages: list[dict[str, Any]]  # the chat the model was given, without the episode's system message
    token_ids: list[int]  # the generated tokens (model policies that return them) ...
    logprobs: list[float] | None  # ... and their log-probabilities
    # What the action did:
    point: list[float] | None  # where a click or type landed (CSS px)
    note: str | None  # a non-fatal problem with the action
    events: list[PageEvent]
    page_changed: bool | None  # None when the worker could not compare the screenshots
    result: StepResult
    probe: Any  # the page's own state (the task's probe expression), or {"error": message}
    error: str  # the action was refused: the page is unchanged
    # Demonstrations only (train.demos; never in episodes.jsonl):
    demo_warnings: list[str]


class EpisodeRecord(TypedDict, total=False):
    """One episode: one line of ``episodes.jsonl`` (:meth:`engine.episode.rollout.Rollout._write`).

    The engine writes every key but ``open_events`` (only when the start page did something), ``traffic`` (only
    for an episode that records or replays it) and the two the reader merges in from ``judgements.jsonl``
    (:func:`engine.store.run_dir.merge_judgement`)."""

    format_version: int
    episode_id: str  # "<task_id>#<sample>"
    sample: int
    task: Required[TaskRecord]
    policy: str  # the policy's name
    system_prompt: str | list[dict[str, Any]] | None  # stored once per episode, not in each step's messages
    mode: str  # async | sync
    worker: str | None  # the browser worker of the last attempt
    status: Required[RecordStatus]
    reward: RewardRecord | None
    answer: str | None  # the ``answer`` action's text
    error: RecordError | None  # what ended the episode (status ``error``) or blocked it (status ``blocked``)
    attempts: int
    previous_errors: list[RecordError]  # attempts lost with their worker, retried
    open_events: list[PageEvent]  # optional: what the start page did as it loaded
    traffic: EpisodeTraffic  # optional: how its traffic was recorded or replayed
    steps: list[StepRecord]
    final: FinalPage | None  # None when the episode never saw a page
    started_at: float  # wall clock (time.time())
    duration_s: float
    timings_ms: dict[str, float]  # wait_browser_ms, navigate_ms; pace_ms and store_wait_ms when the open waited
    # Merged in by the reader from judgements.jsonl (never in episodes.jsonl):
    judged_at: float | None
    judge_error: str | None  # the judge failed: the episode stays judge_pending


class Judgement(TypedDict, total=False):
    """One judge verdict: a line of ``judgements.jsonl``
    (:meth:`engine.rewards.judge_queue.JudgeQueue.judge_record`); the latest per episode counts. ``reward`` None: the
    judge failed with ``error`` and the episode stays pending; otherwise :func:`reward_status` says what the verdict
    makes of the episode. The engine writes every key."""

    episode_id: Required[str]
    reward: RewardRecord | None
    error: str | None
    judged_at: float
    judge_ms: float


# --- decoding ------------------------------------------------------------------------------------

class RecordFormatError(ValueError):
    """A complete line of a run directory's JSONL files that this code cannot read: another record format, not
    JSON, or not a record of the expected shape. ``malformed``: the line is not JSON at all (the one case a
    reader may skip: the file's unterminated last line, torn by a killed writer)."""

    def __init__(self, message: str, *, malformed: bool = False) -> None:
        super().__init__(message)
        self.malformed = malformed


_PLAIN = msgspec.json.Decoder()


def _where(path: str | Path | None, line_no: int | None) -> str:
    if path is None:
        return "a record" if line_no is None else f"record line {line_no}"
    return f"{path}" if line_no is None else f"{path} line {line_no}"


def _reason(exc: msgspec.ValidationError) -> str:
    """msgspec's message with the field first: ``$.steps[0].step: Expected `int`, got `str```."""
    message, sep, at = str(exc).rpartition(" - at `")
    return f"{at.rstrip('`')}: {message}" if sep else f"$: {exc}"


def check_version(version: int | None, where: str = "a record") -> None:
    """Refuse a record format this code does not read (:data:`READABLE_VERSIONS`) with a message that says what
    to do."""
    if version is None or version in READABLE_VERSIONS:
        return
    if version > FORMAT_VERSION:
        raise RecordFormatError(
            f"{where} was written by a newer webgym-engine (record format {version}; this code reads "
            f"{_readable()}): upgrade webgym-engine to read this run directory")
    raise RecordFormatError(
        f"{where} was written by an older webgym-engine (record format {version}; this code reads "
        f"{_readable()}): read this run directory with the webgym-engine release that wrote it (its "
        f"manifest.json's code_version names it), or run its tasks again into a new run directory")


def _readable() -> str:
    """The readable versions as messages name them: ``1 and 2``."""
    *first, last = (str(v) for v in READABLE_VERSIONS)
    return f"{', '.join(first)} and {last}" if first else last


# --- statuses ------------------------------------------------------------------------------------

def reward_status(reward: RewardRecord) -> RecordStatus:
    """The status a reward gives its episode: ``success`` (value 1), ``failure`` (another value), ``blocked``
    (the judge's blocked verdict: value None, ``blocked`` true) or ``unrewarded`` (value None: nothing scored
    it)."""
    value = reward.get("value")
    if value is None:
        return "blocked" if reward.get("blocked") else "unrewarded"
    return "success" if value == 1.0 else "failure"


def reward_value(record: EpisodeRecord) -> float | None:
    """The record's reward value: None when it has no reward, or a reward without a value."""
    reward = record.get("reward")
    return reward.get("value") if reward else None


def judge_blocked_error(reward: RewardRecord) -> RecordError:
    """The ``error`` of a record the judge's blocked verdict ended: what the judge saw."""
    reason = reward.get("reason") or "the judge's verdict: blocked"
    return {"kind": RecordErrorKind.JUDGE_BLOCKED, "message": str(reason)}


def upgrade_reward(reward: RewardRecord) -> RewardRecord:
    """A reward as this format writes it: version 1's blocked verdict (the judge's 0.0, reason ``blocked``)
    becomes value None with ``blocked`` true. Any other reward is returned as it is (this format never writes a
    judge's 0.0 of reason ``blocked``, so the mapping is certain whatever wrote it)."""
    if reward.get("source") == "judge" and reward.get("reason") == "blocked" and reward.get("value") == 0.0 \
            and "blocked" not in reward:
        return {**reward, "value": None, "blocked": True, "reason": "the judge's verdict: blocked"}
    return reward


def upgrade_record(record: EpisodeRecord) -> EpisodeRecord:
    """A record of format 1 mapped to this format, where the mapping is certain (in place; also returned):
    ``failure`` with no reward value is ``unrewarded``; ``failure`` by the judge's blocked verdict and ``error``
    of kind ``blocked`` or ``blocked_domain`` are ``blocked`` (the judge's reward value becomes None). Every
    other status stays as it was."""
    status, reward, error = record["status"], record.get("reward"), record.get("error")
    if reward is not None:
        reward = record["reward"] = upgrade_reward(reward)
    if status == "failure":
        if reward is None:
            reward = record["reward"] = {"value": None, "source": "none", "reason": "no reward was recorded"}
        elif reward.get("source") == "none":
            reward = record["reward"] = {**reward, "value": None}
        if reward.get("value") is None:
            record["status"] = reward_status(reward)
            if record["status"] == "blocked":
                record["error"] = judge_blocked_error(reward)
    elif status == "error" and error is not None and error.get("kind") in ("blocked", "blocked_domain"):
        record["status"] = "blocked"
    record["format_version"] = FORMAT_VERSION
    return record


def _parse(line: bytes, where: str) -> Any:
    """The line as Python objects (msgspec's parser; ``json`` for what msgspec refuses but ``json.dumps``
    writes: NaN, Infinity, e.g. a -inf log-probability)."""
    try:
        return _PLAIN.decode(line)
    except msgspec.DecodeError:
        pass
    except RecursionError:  # nested too deep for either parser
        raise RecordFormatError(f"{where} is not JSON: arrays or objects nested too deep", malformed=True) from None
    try:
        return json_input.loads(line)
    except ValueError as exc:
        raise RecordFormatError(f"{where} is not JSON: {exc}", malformed=True) from None


def decode_record(line: bytes, *, path: str | Path | None = None, line_no: int | None = None) -> EpisodeRecord:
    """One line of ``episodes.jsonl`` as a validated record (a plain dict, exactly as written; a record of an
    older readable format mapped to this one by :func:`upgrade_record`).

    The line is parsed once; its format version is checked first (a record of another format may have another
    shape), then the whole record. Raises :class:`RecordFormatError` (naming ``path`` and ``line_no`` when
    given) for a format this code does not read, a line that is not JSON (``malformed``), or a record of the
    wrong shape.
    """
    where = _where(path, line_no)
    obj = _parse(line, where)
    version = obj.get("format_version") if isinstance(obj, dict) else None
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise RecordFormatError(f"{where} is not an episode record: $.format_version: Expected `int | null`, "
                                f"got `{type(version).__name__}`")
    check_version(version, where)
    _convert(obj, EpisodeRecord, where, "episode record")
    if version is not None and version < FORMAT_VERSION:
        upgrade_record(obj)
    return obj


def decode_judgement(line: bytes, *, path: str | Path | None = None, line_no: int | None = None) -> Judgement:
    """One line of ``judgements.jsonl`` as a validated verdict (a plain dict; format 1's blocked verdict mapped by
    :func:`upgrade_reward`: judgements carry no format version); errors as :func:`decode_record`."""
    where = _where(path, line_no)
    obj = _parse(line, where)
    _convert(obj, Judgement, where, "judgement")
    if obj.get("reward") is not None:
        obj["reward"] = upgrade_reward(obj["reward"])
    return obj


def _convert(obj: Any, typ: Any, where: str, what: str) -> None:
    """Validate ``obj`` (already parsed) as ``typ``."""
    try:
        msgspec.convert(obj, typ)
    except msgspec.ValidationError as exc:
        raise RecordFormatError(f"{where} is not a valid {what}: {_reason(exc)}") from None
