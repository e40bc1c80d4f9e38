"""The agent protocol without a browser: system prompt, templates, context window, AgentPolicy."""

from __future__ import annotations

import importlib.util
import json
import re
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.agent.actions import AgentAction
from engine.agent.context import build_messages
from engine.agent.model_api import ChatRequest, Generation, LanguageModel, SamplingParams, image_refs
from engine.agent.policy_api import PolicyRequest, StepView
from engine.agent.prompts import AgentConfig, PromptTemplates, fill, fill_rows, system_prompt
from engine.tasks.schema import Task
from policy.agent_policy import AgentPolicy
from policy.registry import BackendConfig, make_policy

TASK = Task("t1", "Find the price of the blue mug", "http://shop.test/")
ELEMENTS = [[1, "a", "Home", 10, 10, 40, 20], [2, "input", "Search", 100, 50, 200, 30],
            [3, "select", "Sort by", 400, 50, 100, 30]]


def tools_of(system: str) -> dict:
    return json.loads(re.search(r"<tools>\n(.*)\n</tools>", system, re.DOTALL).group(1))


def view(i: int, reply: str | None = None, changed: bool | None = True, elements: list | None = None) -> StepView:
    v = StepView(f"http://shop.test/p{i}", f"Page {i}", f"jpeg-{i}".encode(), 1280, 768, True,
                 frame=f"frames/ep/{i:03d}.jpg", elements=elements)
    v.reply, v.page_changed = reply, changed
    v.action = AgentAction("left_click", x=i, y=i)
    v.action_text = f"click thing {i}" if i % 2 == 0 else None
    return v


def test_system_prompt_coordinates_grid_complete() -> None:
    cfg = AgentConfig()
    system = system_prompt(cfg, PromptTemplates(), 1000, 1000)
    tool = tools_of(system)
    assert tool["function"]["name"] == "computer_use"
    props = tool["function"]["parameters"]["properties"]
    assert props["action"]["enum"] == ["left_click", "type", "scroll", "wait", "go_back", "navigate", "answer"]
    assert "element_id" not in props
    assert "0 to 1000" in tool["function"]["description"]
    assert "<tool_call>" in system and "Memory:" in system and "Progress:" in system and "Intention:" in system


def test_system_prompt_pixels_vanilla_and_som() -> None:
    pixels = system_prompt(AgentConfig(coords="pixels", response_format="vanilla"), PromptTemplates(), 1288, 756)
    assert "1288x756" in tools_of(pixels)["function"]["description"]
    assert "Memory:" not in pixels and "Action:" in pixels
    som = tools_of(system_prompt(AgentConfig(interaction="som"), PromptTemplates(), 1000, 1000))
    props = som["function"]["parameters"]["properties"]
    assert "element_id" in props and {"hover", "select"} <= set(props["action"]["enum"])


def test_template_override_from_text_and_json(tmp_path: Path) -> None:
    text = tmp_path / "system.txt"
    text.write_text("Custom agent. Tools: ${tools}\n${response_format}\nJSON stays: {\"a\": 1}")
    system = system_prompt(AgentConfig(), PromptTemplates.from_file(text), 1000, 1000)
    assert system.startswith("Custom agent. Tools: {") and '{"a": 1}' in system
    js = tmp_path / "t.json"
    js.write_text(json.dumps({"first_user": "Goal: $task (start at $website)", "vanilla_format": "Just act."}))
    templates = PromptTemplates.from_file(js)
    assert templates.first_user.startswith("Goal:") and templates.system == PromptTemplates().system
    messages, _ = build_messages(AgentConfig(template_file=str(js)), templates, "S", TASK, [], view(0))
    assert messages[1]["content"][0]["text"] == "Goal: Find the price of the blue mug (start at http://shop.test/)"


@pytest.mark.parametrize("content, message", [
    ('{"nonsense": "x"}', "unknown template 'nonsense'"),
    ('{"first_user": 3}', "must be a string"),
    ('{"first_user": "Task: $tsak"}', "unknown placeholder $tsak"),
    ("[1, 2]", "expected a JSON object"),
    ("{broken", "invalid JSON"),
])
def test_broken_template_files_give_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        PromptTemplates.from_file(path)


def test_first_step_has_task_and_one_screenshot() -> None:
    messages, images = build_messages(AgentConfig(), PromptTemplates(), "SYS", TASK, [], view(0))
    assert [m["role"] for m in messages] == ["system", "user"]
    text, image = messages[1]["content"]
    assert text["text"] == "Task: Find the price of the blue mug\nInitial website: http://shop.test/"
    assert image == {"type": "image", "image": "frames/ep/000.jpg"} and images == {"frames/ep/000.jpg": b"jpeg-0"}


def test_window_of_four_rounds_and_summaries_for_older_steps() -> None:
    history = [view(i, reply=f"<think>secret {i}</think>Action: do {i}\n<tool_call>{{}}</tool_call>",
                    changed=(i != 1)) for i in range(7)]
    history[5].reply = "plan without opening tag</think>Action: do 5\n<tool_call>{}</tool_call>"
    messages, images = build_messages(AgentConfig(), PromptTemplates(), "SYS", TASK, history, view(7))
    roles = [m["role"] for m in messages]
    assert roles == ["system"] + ["user", "assistant"] * 4 + ["user"]
    refs = image_refs(messages)
    assert refs == [f"frames/ep/{i:03d}.jpg" for i in (3, 4, 5, 6, 7)] and set(images) == set(refs)
    first = messages[1]["content"][0]["text"]
    assert first.splitlines()[3:] == [
        "Previous actions:",
        "Step 0 on [Page 0]: click thing 0 -> page changed",
        "Step 1 on [Page 1]: left_click at (1, 1) -> page unchanged",
        "Step 2 on [Page 2]: click thing 2 -> page changed",
    ]
    assistants = [m["content"] for m in messages if m["role"] == "assistant"]
    assert assistants[0] == "Action: do 3\n<tool_call>{}</tool_call>"
    assert all("secret" not in a and "think" not in a and "plan without" not in a for a in assistants)


@pytest.mark.parametrize("window, images", [(0, 1), (2, 3), (10, 4)])
def test_window_size_is_configurable(window: int, images: int) -> None:
    history = [view(i, reply="Action: x") for i in range(3)]
    messages, _ = build_messages(AgentConfig(window=window), PromptTemplates(), "S", TASK, history, view(3))
    assert len(image_refs(messages)) == images
    summaries = [line for line in messages[1]["content"][0]["text"].splitlines() if line.startswith("Step ")]
    assert len(summaries) == 3 - (images - 1)


def test_som_messages_list_elements() -> None:
    messages, _ = build_messages(AgentConfig(interaction="som"), PromptTemplates(), "S", TASK, [],
                                 view(0, elements=ELEMENTS))
    listing = messages[1]["content"][-1]["text"]
    assert listing.splitlines() == ["Interactive elements on the screenshot:", "id: 1, text: Home, tag: a",
                                    "id: 2, text: Search, tag: input", "id: 3, text: Sort by, tag: select"]


class RecordingModel(LanguageModel):
    """Test stand-in for a model: returns canned replies and keeps the requests it got."""

    name = "canned"

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.requests: list[ChatRequest] = []

    async def generate(self, request: ChatRequest) -> Generation:
        self.requests.append(request)
        return Generation(self.replies.pop(0), token_ids=[1, 2], logprobs=[-0.5, -0.1], finish_reason="stop")


def call(args: dict) -> str:
    return f"Action: act\n<tool_call>{json.dumps({'name': 'computer_use', 'arguments': args})}</tool_call>"


async def test_agent_policy_maps_grid_coordinates_and_records() -> None:
    model = RecordingModel([call({"action": "left_click", "coordinate": [500, 250]})])
    policy = AgentPolicy(model, AgentConfig())
    reply = await policy.act(PolicyRequest("ep", TASK, 0, view(0)))
    assert (reply.action.name, reply.action.x, reply.action.y) == ("left_click", 640, 192)
    assert reply.parse_error is None and reply.token_ids == [1, 2] and reply.logprobs == [-0.5, -0.1]
    assert reply.details["frames"]["css_px"] == [640, 192] and reply.details["action_text"] == "act"
    assert reply.messages == model.requests[0].messages and reply.messages[0]["role"] == "system"
    assert model.requests[0].images == {"frames/ep/000.jpg": b"jpeg-0"}


async def test_a_seeded_policy_gives_each_request_its_own_reproducible_seed() -> None:
    """vLLM and SGLang seed each request on its own: one seed for all would draw every episode's sample alike."""
    replies = [call({"action": "left_click", "coordinate": [1, 1]})] * 8
    seeds = []
    for _run in range(2):
        model = RecordingModel(list(replies))
        policy = AgentPolicy(model, AgentConfig(), SamplingParams(temperature=1.0, seed=7))
        for episode, step in [("t1#0", 0), ("t1#0", 1), ("t1#1", 0), ("t2#0", 0)]:
            await policy.act(PolicyRequest(episode, TASK, step, view(step)))
        seeds.append([r.sampling.seed for r in model.requests])
    assert seeds[0] == seeds[1]  # reproducible
    assert len(set(seeds[0])) == 4 and all(isinstance(s, int) and 0 <= s < 2**31 for s in seeds[0])
    assert policy.describe()["sampling"]["seed"] == 7  # the run's record keeps the seed it was given
    unseeded = RecordingModel(list(replies))
    await AgentPolicy(unseeded, AgentConfig()).act(PolicyRequest("t1#0", TASK, 0, view(0)))
    assert unseeded.requests[0].sampling.seed is None


async def test_agent_policy_som_element_ids_and_bad_replies() -> None:
    model = RecordingModel([call({"action": "select", "element_id": 3, "text": "Price"}),
                            call({"action": "left_click", "element_id": 9}),
                            "I am not sure what to do.",
                            call({"action": "type", "element_id": "2", "text": "mug"})])
    policy = AgentPolicy(model, AgentConfig(interaction="som"))
    assert policy.som
    obs = view(0, elements=ELEMENTS)
    select = (await policy.act(PolicyRequest("ep", TASK, 0, obs))).action
    assert (select.name, select.x, select.y, select.text, select.element_id) == ("select", 450, 65, "Price", 3)
    missing = await policy.act(PolicyRequest("ep", TASK, 1, obs))
    assert missing.action.name == "wait" and "no element 9" in missing.parse_error
    prose = await policy.act(PolicyRequest("ep", TASK, 2, obs))
    assert prose.action.name == "wait" and prose.parse_error == "no <tool_call> in reply"
    typed = (await policy.act(PolicyRequest("ep", TASK, 3, obs))).action
    assert (typed.name, typed.x, typed.y, typed.text) == ("type", 200, 65, "mug")
    assert typed.describe() == "type 'mug' on element 2 + Enter"


def test_registry_checks_backend_options() -> None:
    with pytest.raises(ValueError, match="needs BackendConfig.model"):
        make_policy("hf")
    with pytest.raises(ValueError, match="needs BackendConfig.base_url"):
        make_policy("openai", backend=BackendConfig(model="qwen"))
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("gpt")


def test_vllm_backend_is_import_guarded() -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match=r"pip install 'webgym-engine\[vllm\]'"):
        make_policy("vllm", backend=BackendConfig(model="/models/qwen"))


@given(st.lists(st.sampled_from(["$task", "${task}", "$$", "$", "{", "}", "{x}", "$missing", "${missing}", "text ",
                                 "$task2", "\n", "é"]), max_size=12).map("".join))
def test_fill_follows_string_template(template: str) -> None:
    values = {"task": "find {it}", "task2": "$x"}
    assert fill(template, **values) == string.Template(template).safe_substitute(values)


@given(st.lists(st.sampled_from(["$id", "${id}", "$$", "$", "{", "}", "$text", "${tag}", "$missing", " "]),
                max_size=10).map("".join))
def test_fill_rows_matches_fill(template: str) -> None:
    rows = [{"id": 7, "text": "Buy {now}", "tag": "button"}, {"id": 12, "text": "$5 off", "tag": "a"}]
    assert fill_rows(template, rows) == [fill(template, **row) for row in rows]
