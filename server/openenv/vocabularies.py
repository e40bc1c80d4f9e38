"""The two vocabularies a session speaks: OpenEnv's BrowserGym environment's models, and the engine's own.

- ``browsergym``: the models of OpenEnv's BrowserGym environment (``envs/browsergym_env/models.py``), so that its
  client (``BrowserGymEnv``) runs unchanged: the action ``{"action_str": "click('13')", "metadata": {}}`` (a
  BrowserGym action on the accessibility tree's element ids, read by the engine's ``browsergym`` action format);
  the observation's ``text``, ``url``, ``screenshot``, ``goal``, ``axtree_txt``, ``pruned_html``, ``error`` and
  ``last_action_error``; the state's ``episode_id``, ``step_count``, ``benchmark``, ``task_name``, ``task_id``,
  ``goal``, ``current_url``, ``max_steps`` and ``cum_reward``. Its ``screenshot`` is typed as rows of pixels of
  integers, which its client validates: that form (``screenshot = "array"``, 2.8 million integers for a 1280 x
  720 viewport) for compatibility, or the JPEG in ``metadata["screenshot_jpeg"]`` (base64) with the field null
  (``"jpeg"``), or no image at all (``"none"``).
- ``engine``: the model's reply text as the engine reads it (``{"reply": ...}``: Qwen ``computer_use`` calls,
  UI-TARS, pyautogui or BrowserGym id actions, by the session's ``action_format``) or an action dict of the agent
  protocol (``{"action": {...}}``); observations with the screenshot as base64 JPEG, the accessibility tree's text,
  the URL, the step's outcome and the reward.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import msgspec

from engine import _imgcodec as codec
from engine.agent.prompts import ACTION_FORMATS, OBSERVE_KINDS, ActionFormat, AgentConfig
from server.openenv.wire import invalid

VocabularyName = Literal["browsergym", "engine"]
VOCABULARIES: tuple[VocabularyName, ...] = get_args(VocabularyName)
ScreenshotForm = Literal["array", "jpeg", "none"]
SCREENSHOT_FORMS: tuple[ScreenshotForm, ...] = get_args(ScreenshotForm)


# --- OpenEnv's BrowserGym models (their fields, their order, their defaults) -----------------------------------
class BrowserGymAction(msgspec.Struct, forbid_unknown_fields=True):
    action_str: str
    metadata: dict[str, Any] = {}


class BrowserGymObservation(msgspec.Struct):
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = {}
    text: str = ""
    url: str = ""
    screenshot: list[list[list[int]]] | None = None
    goal: str = ""
    axtree_txt: str = ""
    pruned_html: str = ""
    error: str = ""
    last_action_error: bool = False


class BrowserGymState(msgspec.Struct):
    episode_id: str | None = None
    step_count: int = 0
    benchmark: str = ""
    task_name: str = ""
    task_id: str | None = None
    goal: str = ""
    current_url: str = ""
    max_steps: int | None = None
    cum_reward: float = 0.0


# --- the engine's own ------------------------------------------------------------------------------------------
class EngineAction(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly one of ``reply`` (the model's text) and ``action`` (an agent-protocol action dict)."""

    reply: str | None = None
    action: dict[str, Any] | None = None
    metadata: dict[str, Any] = {}


class StepOutcome(msgspec.Struct):
    """What the last step did: the action the engine read, why a reply could not be read, and at the episode's end
    its record's status and error kind."""

    action: dict[str, Any] | None = None
    parse_error: str | None = None
    status: str | None = None
    error: str | None = None


class EngineObservation(msgspec.Struct):
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = {}
    screenshot_jpeg: str = ""  # base64
    width: int = 0
    height: int = 0
    url: str = ""
    title: str = ""
    goal: str = ""
    axtree: str | None = None
    step: int = 0
    outcome: StepOutcome = msgspec.field(default_factory=StepOutcome)


class EngineState(msgspec.Struct):
    episode_id: str | None = None
    step_count: int = 0
    task_id: str | None = None
    goal: str = ""
    current_url: str = ""
    max_steps: int | None = None
    cum_reward: float = 0.0
    status: str | None = None  # the record's status once the episode has ended


class ResetOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The reset keys this server reads (OpenEnv passes a reset's data as keyword arguments; others are dropped,
    as OpenEnv's server drops the ones its environment does not take, and listed in the observation's metadata)."""

    seed: int | None = None
    episode_id: str | None = None
    task_id: str | None = None
    task_index: int | None = None
    task_name: str | None = None  # BrowserGym's: a task id, or a MiniWoB++ task's name
    vocabulary: VocabularyName | None = None
    screenshot: ScreenshotForm | None = None
    action_format: ActionFormat | None = None
    observe: list[str] | None = None


def read_options(data: dict[str, Any] | None) -> tuple[ResetOptions, list[str]]:
    """The reset's options and the keys it dropped; :class:`WireError` for a known key of the wrong type."""
    data = data or {}
    known = {k: v for k, v in data.items() if k in ResetOptions.__struct_fields__}
    return convert(known, ResetOptions), sorted(k for k in data if k not in ResetOptions.__struct_fields__)


def convert(data: Any, model: type[Any]) -> Any:
    """``data`` as ``model``; a :class:`WireError` (``VALIDATION_ERROR``) in OpenEnv's shape when it is not one."""
    try:
        return msgspec.convert(data, model)
    except msgspec.ValidationError as exc:
        text = str(exc)
        path = re.search(r" - at `\$(.*)`$", text)
        loc: list[str | int] = [p for p in re.split(r"[.\[\]]", path.group(1)) if p] if path else []
        missing = re.search(r"missing required field `(.+?)`", text)
        unknown = re.search(r"unknown field `(.+?)`", text)
        if missing:
            raise invalid([*loc, missing.group(1)], "Field required", "missing") from None
        if unknown:
            raise invalid([*loc, unknown.group(1)], "Extra inputs are not permitted", "extra_forbidden") from None
        raise invalid(loc, text.split(" - at ")[0], "type_error") from None


@dataclass
class Turn:
    """What a reset or a step left: the engine's observation dict (:meth:`AsyncWebEnv.reset` / ``step``), the goal,
    the reward so far, whether the episode ended, and the outcome of the step."""

    obs: dict[str, Any]
    goal: str
    reward: float
    done: bool
    outcome: StepOutcome
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class SessionState:
    """A session's counters, for the state reply."""

    episode_id: str | None = None
    task_id: str | None = None
    benchmark: str = ""
    goal: str = ""
    url: str = ""
    step_count: int = 0
    max_steps: int | None = None
    cum_reward: float = 0.0
    status: str | None = None


class Vocabulary:
    """How a session reads actions and writes observations and state (module docstring)."""

    name: ClassVar[VocabularyName]
    action_model: ClassVar[type[Any]]
    observation_model: ClassVar[type[Any]]
    state_model: ClassVar[type[Any]]

    def agent(self) -> AgentConfig:
        """The agent protocol the session's episodes run with (what is observed, how replies are read)."""
        raise NotImplementedError

    def action(self, data: dict[str, Any]) -> str | dict[str, Any]:
        """The step's action for :meth:`AsyncWebEnv.step`: reply text or an action dict."""
        raise NotImplementedError

    def observation(self, turn: Turn) -> dict[str, Any]:
        raise NotImplementedError

    def state(self, state: SessionState) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def schemas(cls) -> dict[str, Any]:
        """OpenEnv's ``/schema`` reply: the JSON schemas of the action, the observation (after a step and after a
        reset) and the state."""
        observation = msgspec.json.schema(cls.observation_model)
        return {"action": msgspec.json.schema(cls.action_model), "observation": observation,
                "state": msgspec.json.schema(cls.state_model), "reset_observation": observation}


def _jpeg_b64(obs: dict[str, Any]) -> str:
    return base64.b64encode(obs.get("screenshot") or b"").decode("ascii")


@dataclass
class BrowserGymVocabulary(Vocabulary):
    """OpenEnv's BrowserGym environment's models."""

    name: ClassVar[VocabularyName] = "browsergym"
    action_model: ClassVar[type[Any]] = BrowserGymAction
    observation_model: ClassVar[type[Any]] = BrowserGymObservation
    state_model: ClassVar[type[Any]] = BrowserGymState
    screenshot: ScreenshotForm = "array"

    def agent(self) -> AgentConfig:
        return AgentConfig(observe=("screenshot", "axtree"), action_format="browsergym")

    def action(self, data: dict[str, Any]) -> str:
        return str(convert(data, BrowserGymAction).action_str)

    def observation(self, turn: Turn) -> dict[str, Any]:
        obs, metadata = turn.obs, dict(turn.metadata)
        image = None
        if self.screenshot == "array" and obs.get("screenshot"):
            image = codec.decode(obs["screenshot"]).tolist()  # (height, width, RGB), as BrowserGym's
        elif self.screenshot == "jpeg":
            metadata["screenshot_jpeg"] = _jpeg_b64(obs)
        tree = obs.get("axtree") or ""
        error = turn.outcome.parse_error or (f"the episode ended: {turn.outcome.error}" if turn.outcome.error else "")
        fields = BrowserGymObservation(metadata=metadata, text=tree, url=obs.get("url") or "", screenshot=image,
                                       goal=turn.goal, axtree_txt=tree, error=error,
                                       last_action_error=turn.outcome.parse_error is not None)
        return {k: v for k, v in msgspec.structs.asdict(fields).items() if k not in ("done", "reward")}

    def state(self, state: SessionState) -> dict[str, Any]:
        name = (state.task_id or "").removeprefix("miniwob.") if state.benchmark == "miniwob" else state.task_id
        return msgspec.structs.asdict(BrowserGymState(
            episode_id=state.episode_id, step_count=state.step_count, benchmark=state.benchmark,
            task_name=name or "", task_id=state.task_id, goal=state.goal, current_url=state.url,
            max_steps=state.max_steps, cum_reward=state.cum_reward))


@dataclass
class EngineVocabulary(Vocabulary):
    """The engine's own actions and observations."""

    name: ClassVar[VocabularyName] = "engine"
    action_model: ClassVar[type[Any]] = EngineAction
    observation_model: ClassVar[type[Any]] = EngineObservation
    state_model: ClassVar[type[Any]] = EngineState
    action_format: ActionFormat = "qwen"
    observe: tuple[str, ...] = ("screenshot", "axtree")

    def agent(self) -> AgentConfig:
        try:
            return AgentConfig(observe=self.observe, action_format=self.action_format)  # type: ignore[arg-type]
        except ValueError as exc:  # a combination the protocol cannot read (an id format without the tree)
            raise invalid(["observe"], str(exc)) from None

    def action(self, data: dict[str, Any]) -> str | dict[str, Any]:
        action = convert(data, EngineAction)
        if (action.reply is None) == (action.action is None):
            raise invalid([], "give exactly one of reply (the model's text) and action (an action dict)")
        return action.reply if action.reply is not None else action.action

    def observation(self, turn: Turn) -> dict[str, Any]:
        obs = turn.obs
        fields = EngineObservation(metadata=turn.metadata, screenshot_jpeg=_jpeg_b64(obs),
                                   width=int(obs.get("width") or 0), height=int(obs.get("height") or 0),
                                   url=obs.get("url") or "", title=obs.get("title") or "", goal=turn.goal,
                                   axtree=obs.get("axtree"), step=int(obs.get("step") or 0), outcome=turn.outcome)
        return {k: v for k, v in msgspec.to_builtins(fields).items() if k not in ("done", "reward")}

    def state(self, state: SessionState) -> dict[str, Any]:
        return msgspec.structs.asdict(EngineState(
            episode_id=state.episode_id, step_count=state.step_count, task_id=state.task_id, goal=state.goal,
            current_url=state.url, max_steps=state.max_steps, cum_reward=state.cum_reward, status=state.status))


def vocabulary(options: ResetOptions, default: VocabularyName, screenshot: ScreenshotForm) -> Vocabulary:
    """The vocabulary a reset asks for (else the server's), with its options."""
    name = options.vocabulary or default
    if name == "browsergym":
        return BrowserGymVocabulary(screenshot=options.screenshot or screenshot)
    observe = tuple(options.observe) if options.observe is not None else ("screenshot", "axtree")
    unknown = [k for k in observe if k not in OBSERVE_KINDS]
    if unknown or not observe:
        raise invalid(["observe"], f"choose from {', '.join(OBSERVE_KINDS)}")
    fmt = options.action_format or "qwen"
    assert fmt in ACTION_FORMATS
    return EngineVocabulary(action_format=fmt, observe=observe)
