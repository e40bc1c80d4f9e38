"""The rubric judge: a vision-language model on any OpenAI-compatible endpoint decides an episode's reward.

The steps follow the original WebGym judge, made deterministic (temperature 0, a fixed seed) and cached:

0. **keypoint filter**: one call per screenshot (concurrently) asking whether it shows information relevant
   to the task. The final screenshot is always kept and is not asked about. At most ``max_images`` are
   kept; when more are relevant the *last* ones are kept (the end of an episode holds the result).
1. **blocking check**: one call with up to ``blocking_samples`` screenshots sampled evenly from *all* of
   them (a CAPTCHA page is irrelevant to the task, so the keypoint filter would drop it). Blocked: no reward
   value at all (``Reward.blocked``; the episode's status is ``blocked``, never a failure to train on).
2. **anti-hallucination**: is the final answer supported by the kept screenshots? No answer at all gives 0
   before any call is made.
3. **facts**: one call per rubric item (:meth:`engine.tasks.schema.Task.rubric_items` order), sequential, stopping
   at the first failure.
4. **reference**: when the task has a definite answer, does the agent's answer agree with it (text only)?

The reward is 1 only when every check passes. Every call asks for a final line ``VERDICT: YES`` or
``VERDICT: NO``; a reply without one is asked again once, the reminder (:data:`REMINDER_PROMPT`) appended to the
conversation, then :class:`JudgeError` (the episode stays ``judge_pending`` with the error): a verdict is never
guessed from the reply's other words.

Cache: with ``cache_dir`` set, every verdict is one small JSON file ``cache_dir/<k[:2]>/<k>.json`` where
``k`` is the sha256 of (:data:`PROMPT_VERSION`, the judge model's name, the exact messages with every image
replaced by the sha256 of its bytes, the sampling parameters including the seed). Image REFs never enter
the prompt text, so the same screenshots under another run directory hit the cache. Files are written
atomically (temporary file, then rename), and only parsed verdicts are stored (a call that failed, or got no
verdict even after the reminder, stores nothing and is asked again next time): a second identical run
makes no calls. Identical calls in flight at the same time (rollouts of one task often share their first
screenshot) are made once and shared.

Every :class:`engine.rewards.programmatic.Reward` carries ``evidence``: the kept images and each keypoint verdict, the
blocking sample and verdict, the answer, fact and reference verdicts, and for every call its prompt
(images written ``<image REF>``), reply, verdict, cache key and whether it came from the cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import json_input
from engine.agent.model_api import ChatRequest, LanguageModel, SamplingParams
from engine.agent.policy_api import PolicyError
from engine.rewards.judge_prompts import (
    BLOCKING_PROMPT,
    FACT_PROMPT,
    HALLUCINATION_PROMPT,
    KEYPOINT_PROMPT,
    PROMPT_VERSION,
    REFERENCE_PROMPT,
    REMINDER_PROMPT,
    even_sample,
    parse_verdict,
    quoted,
    render_prompt,
    short_reason,
    user_message,
)
from engine.rewards.programmatic import FactVerdict, Reward
from engine.tasks.schema import Task

log = logging.getLogger(__name__)

_NO_STEPS = "(not recorded)"


class JudgeError(RuntimeError):
    """The judge could not reach a verdict: the endpoint stayed down after retries, or the model's
    replies could not be parsed even after a reminder."""


@dataclass
class JudgeConfig:
    """Settings of :class:`RubricJudge`. ``concurrency`` caps the judge's calls in flight across all episodes."""

    base_url: str | None = None
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    max_images: int = 48
    blocking_samples: int = 20
    concurrency: int = 16  # calls in flight
    timeout_s: float = 120.0
    retries: int = 4
    seed: int = 0
    max_tokens: int = 512
    cache_dir: str | None = None  # None: no cache
    backoff_s: float = 0.5  # first retry delay of the default OpenAI client (doubles per retry)
    backoff_max_s: float = 8.0


# -- one call ----------------------------------------------------------------------------------------------

@dataclass(slots=True)
class _Outcome:
    """A verdict as cached and shared: the final reply, the reply it replaced after a reminder, if any."""

    verdict: bool
    reply: str
    first_reply: str | None = None

    def to_cache(self, key: str, model: str) -> dict[str, Any]:
        return {"key": key, "version": PROMPT_VERSION, "model": model, "verdict": self.verdict,
                "reply": self.reply, "first_reply": self.first_reply}


@dataclass(slots=True)
class _Call:
    """One question to the judge model, before it is asked."""

    step: str
    messages: list[dict[str, Any]]
    images: dict[str, bytes]


class _Episode:
    """The evidence and counters of one judge() call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.counts = {"calls": 0, "cache_hits": 0, "shared": 0}


class RubricJudge:
    """The rubric judge (module docstring). ``judge()`` may be called concurrently for many episodes; one
    semaphore of ``cfg.concurrency`` bounds the model calls of all of them.

    The judge owns the model it is given (any :class:`LanguageModel`; the command line gives it
    :class:`policy.openai_backend.OpenAIModel` on ``cfg.base_url``): :meth:`start` starts it and :meth:`close`
    closes it.
    """

    def __init__(self, cfg: JudgeConfig, model: LanguageModel) -> None:
        if cfg.max_images < 1:
            raise ValueError("max_images must be >= 1")
        if cfg.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.cfg = cfg
        self.model = model
        self.model_name = model.model_name or cfg.model or model.name
        # Deterministic: greedy decoding and a fixed seed (for servers that sample anyway); no logprobs needed.
        self.sampling = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=cfg.max_tokens, seed=cfg.seed,
                                       logprobs=False)
        self.cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else None
        self._semaphore = asyncio.Semaphore(cfg.concurrency)
        self._inflight: dict[str, asyncio.Future[_Outcome]] = {}
        self._requests = 0

    async def start(self) -> None:
        """Start the model client (and create the cache directory)."""
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        await self.model.start()

    async def close(self) -> None:
        """Close the model client; judge() calls still in flight fail with JudgeError."""
        await self.model.close()

    # -- the judge ---------------------------------------------------------------------------------------

    async def judge(self, task: Task, answer: str | None, screenshots: list[tuple[str, bytes]],
                    steps: list[str] | None = None) -> Reward:
        """The reward of one episode (steps in the module docstring).

        ``screenshots`` are (REF, JPEG bytes) in step order, the final screenshot last; ``steps`` optional
        one-line descriptions of the actions. Raises :class:`JudgeError` when no verdict can be had.
        """
        items = [(g.id, fact) for g in task.evaluator_reference for fact in g.facts]
        rubric = task.rubric_items()
        reference = (task.definite_answer or "").strip()
        ep = _Episode()
        evidence: dict[str, Any] = {
            "judge": {"model": self.model_name, "prompt_version": PROMPT_VERSION,
                      "sampling": self.sampling.to_dict()},
            "screenshots": [ref for ref, _ in screenshots],
            "answer": answer, "keypoint": None, "blocking": None, "hallucination": None, "facts": [],
            "reference": None, "calls": ep.calls, "counts": ep.counts,
        }

        def reward(value: float | None, reason: str, facts: list[FactVerdict] | None = None) -> Reward:
            return Reward(value, "judge" if value is not None else "none", reason, facts or [], evidence)

        if not items and not reference:
            return reward(None, "the task has no rubric and no reference answer")
        if answer is None or not answer.strip():
            return reward(0.0, "no answer")
        if not screenshots:
            return reward(0.0, "no screenshots")
        task_text = task.task_name
        steps_text = quoted("\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))) if steps else _NO_STEPS
        answer_text = quoted(answer)
        images = dict(screenshots)

        # 0. keypoint filter (the final screenshot is kept without asking)
        kept, evidence["keypoint"] = await self._keypoints(ep, task_text, screenshots)
        kept_parts = [(pos + 1, screenshots[pos][0]) for pos in kept]
        kept_images = {screenshots[pos][0]: screenshots[pos][1] for pos in kept}

        # 1. blocking, on screenshots sampled from all of them
        sample = even_sample(len(screenshots), self.cfg.blocking_samples)
        if sample:
            parts = [(pos + 1, screenshots[pos][0]) for pos in sample]
            call = _Call("blocking", user_message(BLOCKING_PROMPT.format(task=task_text, count=len(sample)), parts),
                         {ref: images[ref] for _, ref in parts})
            blocked, rec = await self._ask(ep, call)
            evidence["blocking"] = {"sampled": [ref for _, ref in parts], "blocked": blocked,
                                    "reason": rec["reason"], "call": rec["index"]}
            if blocked:  # no reward value: the site, not the agent, ended the episode
                return Reward(None, "judge", f"blocked: {rec['reason']}" if rec["reason"] else "blocked", [],
                              evidence, blocked=True)

        # 2. anti-hallucination
        call = _Call("hallucination", user_message(
            HALLUCINATION_PROMPT.format(task=task_text, steps=steps_text, answer=answer_text), kept_parts), kept_images)
        supported, rec = await self._ask(ep, call)
        evidence["hallucination"] = {"supported": supported, "reason": rec["reason"], "call": rec["index"]}
        if not supported:
            return reward(0.0, "answer not supported by the screenshots")

        # 3. facts, in rubric order, up to the first failure
        facts: list[FactVerdict] = []
        for (group, fact), item in zip(items, rubric, strict=True):
            call = _Call("fact", user_message(
                FACT_PROMPT.format(task=task_text, steps=steps_text, answer=answer_text, fact=item), kept_parts),
                kept_images)
            passed, rec = await self._ask(ep, call)
            facts.append(FactVerdict(group, fact, "judge", passed, rec["reason"]))
            evidence["facts"].append({"group": group, "fact": fact, "item": item, "passed": passed,
                                      "reason": rec["reason"], "call": rec["index"]})
            if not passed:
                return reward(0.0, f"fact {len(facts)} of {len(items)} not met: {fact}", facts)

        # 4. reference answer (text only: both answers are text)
        if reference:
            call = _Call("reference", user_message(
                REFERENCE_PROMPT.format(task=task_text, reference=reference, answer=answer_text), []), {})
            agrees, rec = await self._ask(ep, call)
            evidence["reference"] = {"reference": reference, "agrees": agrees, "reason": rec["reason"],
                                     "call": rec["index"]}
            if not agrees:
                return reward(0.0, "answer does not match the reference answer", facts)
        checked = f"all {len(facts)} facts met" if facts else "no rubric facts"
        return reward(1.0, checked + (" and the reference answer matches" if reference else ""), facts)

    async def _keypoints(self, ep: _Episode, task_text: str, screenshots: list[tuple[str, bytes]]
                         ) -> tuple[list[int], dict[str, Any]]:
        """Positions of the kept screenshots (step order) and the keypoint evidence."""
        last = len(screenshots) - 1
        prompt = KEYPOINT_PROMPT.format(task=task_text)
        calls = [_Call("keypoint", [{"role": "user", "content": [{"type": "text", "text": prompt},
                                                                  {"type": "image", "image": ref}]}], {ref: jpeg})
                 for ref, jpeg in screenshots[:last]]
        # Records are appended to the evidence in screenshot order, whatever order the replies come in.
        results = await self._gather([self._ask(ep, c, record=False) for c in calls])
        verdicts = []
        for pos, (relevant, rec) in enumerate(results):
            rec["index"] = len(ep.calls)
            ep.calls.append(rec)
            verdicts.append({"ref": screenshots[pos][0], "relevant": relevant, "reason": rec["reason"],
                             "call": rec["index"]})
        verdicts.append({"ref": screenshots[last][0], "relevant": None, "reason": "final screenshot: always kept",
                         "call": None})
        relevant = [pos for pos, (ok, _) in enumerate(results) if ok] + [last]
        kept = relevant[-self.cfg.max_images:]  # over the cap: the last ones (the result is at the end)
        dropped = relevant[:-self.cfg.max_images] if len(relevant) > self.cfg.max_images else []
        return kept, {"kept": [screenshots[p][0] for p in kept],
                      "over_cap": [screenshots[p][0] for p in dropped], "verdicts": verdicts}

    @staticmethod
    async def _gather(coros: list[Any]) -> list[Any]:
        """Run ``coros`` concurrently; on the first error cancel the rest and raise that error."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    # -- calls, cache and sharing ----------------------------------------------------------------------

    def cache_key(self, messages: list[dict[str, Any]], images: dict[str, bytes]) -> str:
        """sha256 of the prompt version, model name, messages (images by the sha256 of their bytes) and sampling."""
        def part(p: dict[str, Any]) -> dict[str, Any]:
            if p.get("type") == "image":
                return {"type": "image", "sha256": hashlib.sha256(images[p["image"]]).hexdigest()}
            return p

        canon = [{**m, "content": [part(p) for p in m["content"]]} if isinstance(m.get("content"), list) else m
                 for m in messages]
        blob = json.dumps({"version": PROMPT_VERSION, "model": self.model_name, "messages": canon,
                           "sampling": self.sampling.to_dict()}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    async def _ask(self, ep: _Episode, call: _Call, record: bool = True) -> tuple[bool, dict[str, Any]]:
        """The verdict of one call and its evidence record (appended to ``ep.calls`` when ``record``)."""
        key = self.cache_key(call.messages, call.images)
        outcome = self._cache_get(key)
        source = "cache"
        if outcome is None:
            outcome, source = await self._shared(key, call, ep)
        if source != "call":  # the model calls themselves are counted where they are made
            ep.counts["cache_hits" if source == "cache" else "shared"] += 1
        rec: dict[str, Any] = {"step": call.step, "key": key, "prompt": render_prompt(call.messages),
                               "reply": outcome.reply, "verdict": outcome.verdict,
                               "reason": short_reason(outcome.reply), "cached": source == "cache",
                               "source": source}
        if outcome.first_reply is not None:
            rec["unparsed_reply"] = outcome.first_reply  # the reply that needed the reminder
        if record:
            rec["index"] = len(ep.calls)
            ep.calls.append(rec)
        return outcome.verdict, rec

    async def _shared(self, key: str, call: _Call, ep: _Episode) -> tuple[_Outcome, str]:
        """Ask the model, unless the same call is already in flight: then wait for its verdict."""
        while (fut := self._inflight.get(key)) is not None:
            try:
                return await asyncio.shield(fut), "shared"
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not fut.cancelled() or (task is not None and task.cancelling()):
                    raise
                # The episode that made the call was cancelled, not us: ask ourselves.
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved" warnings
        self._inflight[key] = fut
        try:
            outcome = await self._call(call, ep)
            self._cache_put(key, outcome)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        else:
            fut.set_result(outcome)
        finally:
            del self._inflight[key]
        return outcome, "call"

    async def _call(self, call: _Call, ep: _Episode) -> _Outcome:
        """Ask the model; a reply without a verdict is asked again once with a reminder."""
        reply = await self._generate(call, call.messages, ep)
        verdict = parse_verdict(reply)
        if verdict is not None:
            return _Outcome(verdict, reply)
        retry = [*call.messages, {"role": "assistant", "content": reply},
                 {"role": "user", "content": [{"type": "text", "text": REMINDER_PROMPT}]}]
        second = await self._generate(call, retry, ep)
        verdict = parse_verdict(second)
        if verdict is None:
            raise JudgeError(f"{call.step} check: no verdict in the judge's reply, even after a reminder: "
                             f"{second[:200]!r} (first reply: {reply[:200]!r})")
        return _Outcome(verdict, second, first_reply=reply)

    async def _generate(self, call: _Call, messages: list[dict[str, Any]], ep: _Episode) -> str:
        self._requests += 1
        request = ChatRequest(f"judge-{call.step}-{self._requests}", messages, call.images, self.sampling)
        ep.counts["calls"] += 1
        try:
            async with self._semaphore:
                gen = await self.model.generate(request)
        except PolicyError as exc:
            raise JudgeError(f"{call.step} check: {exc}") from exc
        return gen.text

    def _cache_path(self, key: str) -> Path | None:
        return self.cache_dir / key[:2] / f"{key}.json" if self.cache_dir is not None else None

    def _cache_get(self, key: str) -> _Outcome | None:
        path = self._cache_path(key)
        if path is None:
            return None
        try:
            data = json_input.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # missing, or unreadable (then it is overwritten by the new verdict)
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("verdict"), bool):
            return None
        return _Outcome(data["verdict"], str(data.get("reply", "")), data.get("first_reply"))

    def _cache_put(self, key: str, outcome: _Outcome) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        # Atomic: readers (other episodes, other processes) see the whole file or none.
        tmp = path.with_name(f".{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(outcome.to_cache(key, self.model_name)), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:  # a full disk costs a later repeat call, not this verdict
            log.warning("judge cache: cannot write %s: %s", path, exc)
            tmp.unlink(missing_ok=True)
