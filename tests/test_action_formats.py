"""The action formats (engine/agent/formats/): a corpus of realistic replies per format read as the expected actions,
hostile ones read quickly and safely (code is parsed, never run), and the system prompts that teach each grammar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from browserpool.pool import BrowserPool
from engine.agent.actions import AgentAction
from engine.agent.coords import CoordFrame
from engine.agent.formats import FORMATS, action_format
from engine.agent.model_api import ChatRequest, Generation, LanguageModel, SamplingParams
from engine.agent.prompts import AgentConfig, PromptTemplates
from engine.clients.runner import run
from engine.clients.service import RolloutService
from engine.core.config import RunConfig
from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from engine.tasks.schema import StepCaps
from policy.agent_policy import AgentPolicy
from policy.registry import BackendConfig, make_policy
from tests.conftest import fastest, subset

PIXELS = CoordFrame.pixels(1280, 768, factor=28, min_pixels=3136, max_pixels=12845056)  # 1288x756 image
GRID = CoordFrame.grid(1280, 768)


def read(fmt: str, text: str, frame: CoordFrame = PIXELS) -> tuple[AgentAction, dict[str, Any]]:
    return action_format(fmt).read(text, frame)


def act(name: str, **kw: Any) -> AgentAction:
    return AgentAction(name, **kw)


# (reply, expected action, what the reading must also say): points are in the 1288x756 image, CSS = x * 1280 / 1288
UITARS_CORPUS = [
    ("Thought: The search box is at the top.\nAction: click(start_box='<|box_start|>(644,378)<|box_end|>')",
     act("left_click", x=640, y=384), {"thought": "The search box is at the top."}),
    ("Action: click(start_box='(644,378)')", act("left_click", x=640, y=384), {"thought": None}),  # no thought
    ("Thought: a box\nAction: click(start_box='(600,300,688,456)')", act("left_click", x=640, y=384),
     {"warnings": ["box coordinate mapped to its centre"]}),
    ("Thought: newer point syntax\nAction: click(point='<point>644 378</point>')", act("left_click", x=640, y=384), {}),
    ("Thought: off the screen\nAction: click(start_box='(5000,-20)')", act("left_click", x=1279, y=0),
     {"warning": "coordinate clamped"}),
    ("Thought: type and submit\nAction: type(content='wireless mouse\\n')",
     act("type", text="wireless mouse", clear=False, enter=True), {}),
    ("Thought: type without submitting\nAction: type(content='it\\'s')", act("type", text="it's", clear=False,
                                                                              enter=False), {}),
    ("Thought: down\nAction: scroll(start_box='(644,378)', direction='down')",
     act("scroll", x=640, y=384, direction="down"), {}),
    ("Thought: copy\nAction: hotkey(key='ctrl c')", act("keypress", keys="ctrl+c"), {}),
    ("Thought: done\nAction: finished(content='The cheapest is $12.')", act("answer", text="The cheapest is $12."), {}),
    ("Thought: wait\nAction: wait()", act("wait"), {"error": None}),
    ("Thought: go\nAction: navigate(url='www.example.com/shop')", act("navigate", url="https://www.example.com/shop"),
     {}),
    # Several actions: the first that is one of this browser's is used, the others are listed with why.
    ("Thought: drag then click\nAction: drag(start_box='(1,2)', end_box='(3,4)')\n\nclick(start_box='(644,378)')",
     act("left_click", x=640, y=384), {"skipped": ["call 0: drag() is not an action"]}),
    ("Thought: double\nAction: left_double(start_box='(644,378)')", act("left_click", x=640, y=384),
     {"warnings": ["a double click is done as one click"]}),
    # Truncated mid-call, and no action at all: a recorded wait.
    ("Thought: cut short\nAction: click(start_box='(644,", act("wait"), {"error": "call 0: not a call"}),
    ("Thought: I am not sure what to do.", act("wait"), {"error": "no Action: in reply"}),
    ("Thought: sideways\nAction: scroll(start_box='(1,1)', direction='left')", act("wait"),
     {"error": "direction must be up or down"}),
]

PYAUTOGUI_CORPUS = [
    ("The search box is at the top.\n```python\npyautogui.click(644, 378)\n```", act("left_click", x=640, y=384),
     {"thought": "The search box is at the top."}),
    ("```python\npyautogui.click(x=644, y=378)\n```", act("left_click", x=640, y=384), {"thought": None}),
    ("pyautogui.click(644, 378)", act("left_click", x=640, y=384), {}),  # no fence
    ("```python\npyautogui.moveTo(644, 378)\n```", act("hover", x=640, y=384), {}),
    ("```python\npyautogui.click(0.5, 0.5)\n```", act("left_click", x=640, y=384),
     {"warnings": ["coordinates within 0..1 read as fractions of the screen"]}),
    ("```python\npyautogui.click(9999, 378)\n```", act("left_click", x=1279, y=384), {"warning": "clamped"}),
    ("```python\npyautogui.write('wireless mouse\\n')\n```", act("type", text="wireless mouse", clear=False,
                                                                  enter=True), {}),
    ("```python\npyautogui.hotkey('ctrl', 'l')\n```", act("keypress", keys="ctrl+l"), {}),
    ("```python\npyautogui.press('enter')\n```", act("keypress", keys="enter"), {}),
    ("```python\npyautogui.scroll(-5)\n```", act("scroll", direction="down"), {}),
    ("```python\nnavigate('example.com')\n```", act("navigate", url="https://example.com"), {}),
    ("```python\nanswer('Paris')\n```", act("answer", text="Paris"), {}),
    ("DONE", act("answer", text=""), {}),
    ("WAIT", act("wait"), {"error": None}),
    # Code that is not a call of a literal is never run: skipped with why, and the next call is used.
    ("```python\nimport os\nos.system('touch /tmp/pwned')\nx = 1\npyautogui.click(644, 378)\n```",
     act("left_click", x=640, y=384), {"skipped": ["call 0: not a call", "call 1: os.system() is not an action",
                                                   "call 2: not a call"]}),
    ("```python\npyautogui.click(644, 378)\npyautogui.write('a')\n```", act("left_click", x=640, y=384), {}),
    ("```python\npyautogui.click(__import__('os').getpid(), 1)\n```", act("wait"),
     {"error": "arguments must be literals"}),
    ("```python\npyautogui.click(644,", act("wait"), {"error": "call 0: not a call"}),  # truncated
    ("I cannot find it.", act("wait"), {"error": "no pyautogui code in reply"}),
]


def check(action: AgentAction, info: dict[str, Any], expected: AgentAction, also: dict[str, Any]) -> None:
    assert action == expected, (action, info)
    if "thought" in also:
        assert info["reply"].thought == also["thought"]
    if "warnings" in also:
        assert info["warnings"] == also["warnings"]
    if "warning" in also:
        assert any(also["warning"] in w for w in info["warnings"]), info["warnings"]
    if "skipped" in also:
        assert len(info["skipped"]) == len(also["skipped"])
        for got, want in zip(info["skipped"], also["skipped"], strict=True):
            assert got.startswith(want), (got, want)
    if "error" in also:
        if also["error"] is None:
            assert info["error"] is None
        else:
            assert info["error"] is not None and also["error"] in info["error"], info["error"]
    if action.name != "wait" or also.get("error", "") is None:
        assert info["error"] is None and info["call"] is not None  # the parsed call is kept for the record


@pytest.mark.parametrize(("text", "expected", "also"), UITARS_CORPUS, ids=[t[:40] for t, _, _ in UITARS_CORPUS])
def test_uitars_replies(text: str, expected: AgentAction, also: dict[str, Any]) -> None:
    check(*read("uitars", text), expected, also)


@pytest.mark.parametrize(("text", "expected", "also"), PYAUTOGUI_CORPUS,
                         ids=[t[:40] for t, _, _ in PYAUTOGUI_CORPUS])
def test_pyautogui_replies(text: str, expected: AgentAction, also: dict[str, Any]) -> None:
    check(*read("pyautogui", text), expected, also)


def test_grid_coordinates_are_read_in_thousandths() -> None:
    action, info = read("uitars", "Action: click(start_box='(500,500)')", GRID)
    assert (action.x, action.y) == (640, 384) and info["frames"]["mode"] == "grid"
    action, _ = read("pyautogui", "pyautogui.click(500, 500)", GRID)
    assert (action.x, action.y) == (640, 384)


HOSTILE = {
    "a huge number": "Action: click(start_box=(" + "9" * 5000 + ", 1))",
    "a long line of parentheses": "Action: click(" + "(" * 60_000,
    "many action lines": "Action: " + "wait()\n" * 9_000,
    "a megabyte of code": "```python\n" + "pyautogui.click(1, 1)\n" * 60_000 + "```",
    "deeply nested literals": "pyautogui.click(" + "[" * 5_000 + "])",
}


@pytest.mark.wallclock
@pytest.mark.parametrize("fmt", ["uitars", "pyautogui"])
@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_replies_are_read_quickly_and_never_raise(fmt: str, text: str) -> None:
    best, (action, info) = fastest(lambda: read(fmt, text))
    assert best < 0.05, f"{best * 1000:.0f} ms"
    assert isinstance(action, AgentAction) and (info["error"] is None or action.name == "wait")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "browsergym"])  # it names elements, not points
@pytest.mark.parametrize("coords", ["grid", "pixels"])
def test_each_format_teaches_its_grammar_and_its_coordinates(fmt: str, coords: str) -> None:
    prompt = action_format(fmt).system_prompt(AgentConfig(coords=coords), PromptTemplates(), 1288, 756)
    marker = {"qwen": "<tool_call>", "uitars": "Action: ...", "pyautogui": "pyautogui.click(x, y)"}[fmt]
    assert marker in prompt
    assert ("1288x756" in prompt) == (coords == "pixels") and ("1000" in prompt) == (coords == "grid")
    assert "$" not in prompt.replace("$12", "")  # every placeholder filled


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown action format"):
        action_format("xml")


# --- the formats in the engine: stand-in models that answer in each grammar, and the tiny hf model -------------------
STAND_IN_REPLIES = {  # per step: a scroll, a click, typing, then the answer (points in the 1288x756 image)
    "uitars": ["Thought: see more\nAction: scroll(start_box='(644,378)', direction='down')",
               "Thought: the first link\nAction: click(start_box='<|box_start|>(200,150)<|box_end|>')",
               "Action: type(content='kettle\\n')",
               "Thought: done\nAction: finished(content='I looked.')"],
    "pyautogui": ["See more.\n```python\npyautogui.scroll(-5)\n```",
                  "The first link.\n```python\npyautogui.click(200, 150)\n```",
                  "```python\npyautogui.write('kettle\\n')\n```",
                  "Done.\n```python\nanswer('I looked.')\n```"],
}


class FormatStandInModel(LanguageModel):
    """A stand-in for a model of another family (named as such): it answers a fixed script in one format's grammar,
    step by step (its step is the number of its earlier replies in the chat)."""

    name = "format-stand-in"

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.resize = {"factor": 28, "min_pixels": 3136, "max_pixels": 12845056}

    async def generate(self, request: ChatRequest) -> Generation:
        step = sum(1 for m in request.messages if m["role"] == "assistant")
        return Generation(self.replies[min(step, len(self.replies) - 1)], finish_reason="stop")


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("fmt", list(STAND_IN_REPLIES))
async def test_a_run_of_a_stand_in_model_in_each_format(
        tmp_path: Path, sites: str, fmt: str, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = len(tasks.read_text().splitlines())
    agent = AgentConfig(action_format=fmt, coords="pixels", window=4)
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=4, workers=1, telemetry=None)
    _, run_dir = await run(cfg, AgentPolicy(FormatStandInModel(STAND_IN_REPLIES[fmt]), agent), sites, pool=pool)
    records = read_records(run_dir)
    assert len(records) == n and not [r for r in records if r["status"] == "error"]
    for r in records:
        actions = [s["action"]["name"] for s in r["steps"]]
        assert actions == ["scroll", "left_click", "type", "answer"], actions
        assert r["answer"] == "I looked." and not any(s["parse_error"] for s in r["steps"])
        click = r["steps"][1]
        assert click["parsed"]["frames"]["css_px"] == [199, 152]  # (200, 150) in the 1288x756 image
        assert click["parsed"]["tool_call"]["name"] in ("click", "pyautogui.click")
        assert click["reply"] == STAND_IN_REPLIES[fmt][1]  # the raw reply, as the model gave it
        # What the viewer and the monitor show: the action itself, the same whatever the format.
        assert click["action_text"] == AgentAction("left_click", x=199, y=152).describe()
        assert {"uitars": "Action: ...", "pyautogui": "pyautogui.click(x, y)"}[fmt] in r["system_prompt"]


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("fmt", ["uitars", "pyautogui"])
async def test_the_tiny_hf_model_under_each_format_and_its_samples_rebuild(
        tmp_path: Path, sites: str, fmt: str, tiny_model: Path, pool: BrowserPool) -> None:
    from train.samples import Processing, build_samples

    tasks = load_tasks(subset(tmp_path, per_site=1), sites, step_caps=StepCaps(train=(2, 2, 2)))[:2]
    agent = AgentConfig(action_format=fmt, coords="pixels", window=1)
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    policy = make_policy("hf", agent=agent, sampling=SamplingParams(max_tokens=8, seed=0),
                         backend=BackendConfig(model=str(tiny_model), device="cpu", max_batch=2))
    async with RolloutService(cfg, base_url=sites, pool=pool) as service:
        records = await service.gather(service.submit(tasks, policy))
        assert service.run_dir is not None
        run_dir = service.run_dir
    assert len(records) == 2 and not [r for r in records if r["status"] == "error"]
    steps = [s for r in records for s in r["steps"]]
    assert steps and all(s["parse_error"] or s["parsed"]["tool_call"] for s in steps)  # random text: mostly waits
    assert all({"uitars": "Action: ...", "pyautogui": "pyautogui"}[fmt] in r["system_prompt"] for r in records)
    # The trainer rebuilds every step's exact prompt (its sha256 equals the recorded one) under this format.
    result = build_samples([run_dir], Processing.load(tiny_model), on_mismatch="raise")
    assert len(result) == len(steps) == result.prompts_checked


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from policy.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "qwen2_5_vl", "qwen2_5_vl")
