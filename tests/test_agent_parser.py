"""Tests for the Qwen-VL web agent reply parser and coordinate mapping."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine._imgcodec import QWEN2_VL, smart_resize
from engine.agent import CoordFrame, describe_frames, parse_action, parse_reply, strip_think, to_action
from engine.agent.coords import element_centres
from engine.agent.parser import MAX_REPLY_CHARS
from tests.conftest import fastest

GRID = CoordFrame("grid", 1280, 768)
PIXELS = CoordFrame.pixels(1280, 768)

COMPLETE = """Memory: {"search_term": "wireless mouse", "results_seen": 0}
Progress: {"open site": "done", "search": "in progress", "pick cheapest": "todo"}
Intention: Type the product name into the search box.
Action: Click the search box and type "wireless mouse".
<tool_call>
{"name": "computer_use", "arguments": {"action": "type", "coordinate": [412, 88], "text": "wireless mouse"}}
</tool_call>"""

VANILLA = """Action: Scroll down to see more results.
<tool_call>{"name": "computer_use", "arguments": {"action": "scroll", "direction": "down"}}</tool_call>"""


def test_pixels_frame_is_smart_resized() -> None:
    assert smart_resize(768, 1280) == (756, 1288)
    assert (PIXELS.resized_width, PIXELS.resized_height) == (1288, 756)


def test_complete_format() -> None:
    r = parse_reply(COMPLETE)
    assert r.error is None
    assert r.memory == '{"search_term": "wireless mouse", "results_seen": 0}'
    assert r.progress.startswith('{"open site"')
    assert r.intention == "Type the product name into the search box."
    assert r.action_text == 'Click the search box and type "wireless mouse".'
    assert r.thought is None
    assert r.raw == COMPLETE
    assert r.tool_calls == [{"name": "computer_use",
                             "arguments": {"action": "type", "coordinate": [412, 88], "text": "wireless mouse"}}]
    act, info = parse_action(COMPLETE, GRID)
    assert info["error"] is None
    assert (act.name, act.text, act.x, act.y) == ("type", "wireless mouse", round(1280 * 0.412), round(768 * 0.088))


def test_vanilla_format_missing_thought_and_memory() -> None:
    r = parse_reply(VANILLA)
    assert r.thought is None and r.memory is None and r.progress is None
    assert r.action_text == "Scroll down to see more results."
    act, info = parse_action(VANILLA, GRID)
    assert (act.name, act.direction, act.x) == ("scroll", "down", None)
    assert info["error"] is None


def test_thought_and_memory_updated_fields() -> None:
    text = ("Thought: The login page is open.\nMemory_Updated: {\"user\": \"alice\"}\n"
            "Action: Click login.\n<tool_call>\n{\"name\": \"computer_use\", \"arguments\": "
            "{\"action\": \"left_click\", \"coordinate\": [500, 500]}}\n</tool_call>")
    r = parse_reply(text)
    assert r.thought == "The login page is open."
    assert r.memory == '{"user": "alice"}'
    act, _ = parse_action(text, GRID)
    assert (act.name, act.x, act.y) == ("left_click", 640, 384)


@pytest.mark.parametrize("body", [
    '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 500],},}',
    "{'name': 'computer_use', 'arguments': {'action': 'left_click', 'coordinate': [500, 500]}}",
    "{'name': 'computer_use', 'arguments': {'action': 'left_click', 'coordinate': [500, 500], 'x': None,}}",
    '```json\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 500]}}\n```',
])
def test_broken_json_repaired(body: str) -> None:
    r = parse_reply(f"Action: click the centre\n<tool_call>\n{body}\n</tool_call>")
    assert r.error is None, r.error
    assert r.tool_calls[0]["arguments"]["coordinate"] == [500, 500]
    act, info = parse_action(f"<tool_call>{body}</tool_call>", GRID)
    assert (act.name, act.x, act.y) == ("left_click", 640, 384)
    assert info["error"] is None


def test_python_literals_repaired() -> None:
    r = parse_reply("<tool_call>{'name': 'computer_use', 'arguments': {'action': 'type', 'text': 'hi', "
                    "'clear': True, 'enter': False}}</tool_call>")
    assert r.tool_calls[0]["arguments"]["clear"] is True
    assert r.tool_calls[0]["arguments"]["enter"] is False


@pytest.mark.parametrize("body", [
    '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 500]',
    '{"name": "computer_use" "arguments": {"action": "left_click"}}',
    "{'name': 'computer_use', 'arguments': {'action': 'type', 'text': 'it's'}}",
    "click at 500, 500",
])
def test_broken_beyond_repair_becomes_wait(body: str) -> None:
    text = f"Action: click\n<tool_call>\n{body}\n</tool_call>"
    r = parse_reply(text)
    assert r.tool_calls == []
    assert r.error and "tool_call 0" in r.error
    act, info = parse_action(text, GRID)
    assert act.name == "wait"
    assert info["error"]


def test_think_block_removed_and_kept_as_thought() -> None:
    text = "<think>\nThe search box is at the top.\n</think>\n" + VANILLA
    r = parse_reply(text)
    assert r.thought == "The search box is at the top."
    assert strip_think(text) == VANILLA
    assert parse_action(text, GRID)[0].name == "scroll"


def test_think_without_opening_tag() -> None:
    text = "I should scroll first, the Action: list is below.\n</think>\n\n" + VANILLA
    r = parse_reply(text)
    assert r.thought == "I should scroll first, the Action: list is below."
    assert r.action_text == "Scroll down to see more results."
    assert strip_think(text) == VANILLA


def test_explicit_thought_wins_over_think() -> None:
    r = parse_reply("<think>hidden</think>Thought: visible\n" + VANILLA)
    assert r.thought == "visible"


def test_box_coordinate_maps_to_centre() -> None:
    call = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [400, 400, 600, 600]}}
    act, warnings = to_action(call, GRID)
    assert (act.x, act.y) == (640, 384)
    assert any("box" in w for w in warnings)


@pytest.mark.parametrize(("coord", "expected"), [
    ([1500, 500], (1279, 384)),
    ([-20, 2000], (0, 767)),
])
def test_out_of_range_clamped_and_flagged(coord: list[int], expected: tuple[int, int]) -> None:
    act, warnings = to_action({"name": "computer_use", "arguments": {"action": "hover", "coordinate": coord}}, GRID)
    assert (act.name, act.x, act.y) == ("hover", *expected)
    assert any("clamped" in w for w in warnings)
    text = f'<tool_call>{{"name": "computer_use", "arguments": {{"action": "left_click", "coordinate": {coord}}}}}'
    act, info = parse_action(text, GRID)
    assert (act.x, act.y) == expected and any("clamped" in w for w in info["warnings"])


def test_in_range_not_flagged() -> None:
    _, warnings = to_action({"name": "computer_use", "arguments": {"action": "left_click",
                                                                   "coordinate": [0, 1000]}}, GRID)
    assert warnings == []


def test_several_tool_calls_first_valid_used() -> None:
    text = ("Action: go back\n<tool_call>{not json at all</tool_call>\n"
            '<tool_call>{"name": "computer_use", "arguments": {"action": "fly"}}</tool_call>\n'
            '<tool_call>{"name": "computer_use", "arguments": {"action": "go_back"}}</tool_call>\n'
            '<tool_call>{"name": "computer_use", "arguments": {"action": "wait", "time": 2}}</tool_call>')
    r = parse_reply(text)
    assert len(r.tool_calls) == 3 and r.error and "tool_call 0" in r.error
    act, info = parse_action(text, GRID)
    assert act.name == "go_back"
    # Every skipped call, by its place in the reply, with why: one that is not JSON, one that is no action.
    assert [s.split(":")[0] for s in info["skipped"]] == ["tool_call 0", "tool_call 1"]
    assert "fly" in info["skipped"][1]


def test_unterminated_last_tool_call() -> None:
    text = ('<tool_call>{"name": "computer_use", "arguments": {"action": "wait", "time": 1}}</tool_call>'
            '<tool_call>{"name": "computer_use", "arguments": {"action": "navigate", "url": "https://a.b"}}')
    r = parse_reply(text)
    assert [c["arguments"]["action"] for c in r.tool_calls] == ["wait", "navigate"]
    act, _ = parse_action('<tool_call>\n{"name": "computer_use", "arguments": {"action": "answer", "text": "42"}}',
                          GRID)
    assert (act.name, act.text, act.ends_episode) == ("answer", "42", True)


@pytest.mark.parametrize("text", ["", "   \n", "I am not sure what to do.", "Action: click the button"])
def test_empty_or_no_call_becomes_wait(text: str) -> None:
    act, info = parse_action(text, GRID)
    assert act.name == "wait" and info["error"]


def test_grid_vs_pixels_exact_values() -> None:
    click = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 500]}}
    act, _ = to_action(click, GRID)
    assert (act.x, act.y) == (640, 384)
    # pixels: 1288x756 image for a 1280x768 viewport
    click["arguments"]["coordinate"] = [644, 378]
    act, warnings = to_action(click, PIXELS)
    assert (act.x, act.y) == (640, 384) and warnings == []
    click["arguments"]["coordinate"] = [100, 700]
    act, _ = to_action(click, PIXELS)
    assert (act.x, act.y) == (round(100 * 1280 / 1288), round(700 * 768 / 756)) == (99, 711)
    frames = describe_frames([100, 700], PIXELS)
    assert frames["model"] == [100, 700] and frames["screenshot_px"] == [100, 700]
    assert frames["css_px"] == [99, 711]
    frames = describe_frames([500, 500], CoordFrame.grid(1280, 768, **QWEN2_VL))
    assert frames["screenshot_px"] == [644, 378] and frames["css_px"] == [640, 384]
    qwen3 = CoordFrame.grid(1280, 768)  # Qwen3-VL's smart_resize keeps 1280x768 (factor 32)
    assert (qwen3.resized_width, qwen3.resized_height) == (1280, 768)
    assert describe_frames([250, 750], qwen3) == {"model": [250, 750], "mode": "grid", "screenshot_px": [320, 576],
                                                  "css_px": [320, 576]}
    # pixel coordinate beyond the resized image is clamped
    act, warnings = to_action({"name": "computer_use", "arguments": {"action": "left_click",
                                                                     "coordinate": [1300, 10]}}, PIXELS)
    assert act.x == 1279 and any("clamped" in w for w in warnings)


@pytest.mark.parametrize(("args", "expected"), [
    ({"action": "type", "coordinate": [500, 100], "text": "hello"}, {"name": "type", "x": 640, "y": 77,
                                                                     "text": "hello"}),
    ({"action": "scroll", "direction": "up"}, {"name": "scroll", "direction": "up"}),
    ({"action": "wait", "time": 3}, {"name": "wait", "seconds": 3.0}),
    ({"action": "wait"}, {"name": "wait"}),
    ({"action": "go_back"}, {"name": "go_back"}),
    ({"action": "navigate", "url": "https://example.com"}, {"name": "navigate", "url": "https://example.com"}),
    ({"action": "answer", "text": "$19.99"}, {"name": "answer", "text": "$19.99"}),
    ({"action": "key", "keys": ["ctrl", "a"]}, {"name": "keypress", "keys": "ctrl+a"}),
    ({"action": "keypress", "keys": "Enter"}, {"name": "keypress", "keys": "Enter"}),
    ({"action": "hover", "coordinate": "(250, 250)"}, {"name": "hover", "x": 320, "y": 192}),
])
def test_action_values(args: dict, expected: dict) -> None:
    act, _ = to_action({"name": "computer_use", "arguments": args}, GRID)
    assert act.to_dict() == expected


@pytest.mark.parametrize("args", [
    {"action": "left_click"},
    {"action": "left_click", "coordinate": [1, 2, 3]},
    {"action": "left_click", "coordinate": ["a", "b"]},
    {"action": "left_click", "coordinate": [True, 5]},
    {"action": "scroll", "direction": "left"},
    {"action": "navigate"},
    {"action": "answer"},
    {"action": "wait", "time": "soon"},
    {"action": "keypress"},
    {"action": "teleport"},
    {},
])
def test_invalid_arguments_raise_value_error(args: dict) -> None:
    with pytest.raises(ValueError):
        to_action({"name": "computer_use", "arguments": args}, GRID)
    import json
    act, info = parse_action(f"<tool_call>{json.dumps({'name': 'computer_use', 'arguments': args})}</tool_call>",
                             GRID)
    assert act.name == "wait" and info["error"]


def test_wrong_tool_or_shape_raises() -> None:
    with pytest.raises(ValueError, match="unknown tool"):
        to_action({"name": "browser", "arguments": {"action": "go_back"}}, GRID)
    with pytest.raises(ValueError, match="arguments"):
        to_action({"name": "computer_use", "arguments": [1]}, GRID)
    with pytest.raises(ValueError):
        CoordFrame("pixels", 1280, 768)


_FRAGMENTS = st.sampled_from([
    "<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", "[", "]", '"', "'", ",", ":", "\n",
    '"name"', '"computer_use"', '"arguments"', '"action"', '"left_click"', '"coordinate"', "[500, 500]",
    "True", "None", "Thought:", "Action:", "Memory:", "Progress:", "Intention:", "1e999", "-1", "\\", "NaN",
    '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [',
])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), st.lists(st.one_of(_FRAGMENTS, st.text(max_size=5)), max_size=30).map("".join)))
def test_never_raises(text: str) -> None:
    r = parse_reply(text)
    assert r.raw == text
    assert isinstance(strip_think(text), str)
    for frame in (GRID, PIXELS):
        act, info = parse_action(text, frame)
        assert act.name in ("wait",) or info["error"] is None


def test_non_string_input_never_raises() -> None:
    assert parse_reply(None).error  # type: ignore[arg-type]
    assert parse_action(b"<tool_call>", GRID)[0].name == "wait"  # type: ignore[arg-type]
    assert parse_action("<tool_call>" + "[" * 100000 + "</tool_call>", GRID)[0].name == "wait"


def _call(args: dict) -> str:
    return f"Action: x\n<tool_call>{json.dumps({'name': 'computer_use', 'arguments': args})}</tool_call>"


SOM_ELEMENTS = element_centres([[1, "a", "Home", 10, 10, 40, 20], [7, "button", "Buy", 101, 200, 60, 31]])


@pytest.mark.parametrize("element_id", [7, "7", "#7", "[7]", 7.0])
def test_element_id_maps_to_box_centre(element_id: object) -> None:
    act, info = parse_action(_call({"action": "left_click", "element_id": element_id}), GRID, SOM_ELEMENTS)
    assert (act.name, act.x, act.y, act.element_id) == ("left_click", 131, 216, 7)
    assert info["frames"] == {"mode": "som", "element_id": 7, "css_px": [131, 216]}


@pytest.mark.parametrize("element_id, error", [(9, "no element 9"), (True, "must be an integer"),
                                               ("seven", "must be an integer"), (2.5, "must be an integer")])
def test_bad_element_ids_become_wait(element_id: object, error: str) -> None:
    act, info = parse_action(_call({"action": "left_click", "element_id": element_id}), GRID, SOM_ELEMENTS)
    assert act.name == "wait" and error in info["error"]


def test_element_centres_agree_however_they_are_found() -> None:
    # Ids 1..N in list order are found by position; any other list through the whole map, where an id listed
    # twice names its first element either way.
    in_order = element_centres([[1, "a", "x", 0, 0, 10, 10], [2, "a", "y", 100, 50, 20, 10]])
    assert in_order[2] == (110, 55) and dict(in_order) == {1: (5, 5), 2: (110, 55)}
    shuffled = element_centres([[2, "a", "y", 100, 50, 20, 10], [1, "a", "x", 0, 0, 10, 10], [1, "b", "z", 9, 9, 2, 2]])
    assert shuffled[1] == (5, 5) and shuffled[2] == (110, 55) and 3 not in shuffled
    twice = [[1, "a", "x", 0, 0, 10, 10], [1, "b", "z", 9, 9, 2, 2]]
    assert element_centres(twice)[1] == dict(element_centres(twice))[1] == (5, 5)


def test_element_id_needs_som_mode() -> None:
    act, info = parse_action(_call({"action": "left_click", "element_id": 1}), GRID)
    assert act.name == "wait" and "needs a 'coordinate'" in info["error"]


def test_select_by_element() -> None:
    act, _ = parse_action(_call({"action": "select", "element_id": 1, "text": "Price: low"}), GRID, SOM_ELEMENTS)
    assert (act.name, act.x, act.y, act.text) == ("select", 30, 20, "Price: low")
    assert act.to_browser().kind == "select"


# --- hostile replies: linear time, one broken call never loses the next, URLs without a scheme ---------------------
CALL = '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [10, 20]}}'
ADVERSARIAL = {
    "spaces before the closing fence": "<tool_call>```json\n" + CALL + " " * 16_000 + "```</tool_call>",
    "unclosed think tags": "<think>x" * 8_000,
    "lone closing think tags": "</think>" * 20_000,
    "an unclosed tool call of spaces": "<tool_call>" + " " * 60_000,
    "nested braces": "<tool_call>" + "{" * 60_000 + "</tool_call>",
    "nested brackets": '<tool_call>{"name": "computer_use", "arguments": ' + "[" * 50_000 + "</tool_call>",
    "a very long number": '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", '
                          '"coordinate": [' + "9" * 4_000 + ", 1]}}</tool_call>",
    "field words after long runs of spaces": ("\n" + " " * 5_000 + "Thought") * 12,
    "many tool call tags": "<tool_call>" * 5_000,
    "single-quoted escapes": "<tool_call>{'" + "\\'" * 30_000,
    "megabytes of text": "Thought: " + "a" * 5_000_000,
}


@pytest.mark.wallclock
@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_hostile_replies_parse_quickly(text: str) -> None:
    # A generous bound for a shared machine (the best of three): parsing runs on the engine's event loop, where
    # the quadratic patterns this replaced took 0.7 s and 6 s on the first two inputs.
    best, (action, info) = fastest(lambda: parse_action(text, GRID))
    assert best < 0.05, f"{best * 1000:.0f} ms"
    assert action.name in ("left_click", "wait") and (action.name == "left_click") == (info["error"] is None)


def test_a_reply_past_the_cap_is_cut_and_flagged() -> None:
    text = VANILLA + "\n" + "x" * MAX_REPLY_CHARS
    reply = parse_reply(text)
    assert reply.truncated and len(reply.raw) == MAX_REPLY_CHARS and reply.tool_calls  # what came first is read
    assert not parse_reply(VANILLA).truncated


def test_a_call_that_fails_any_way_is_skipped_and_the_next_one_used() -> None:
    huge = '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [' + "9" * 400 + ", 1]}}"
    action, info = parse_action(f"<tool_call>{huge}</tool_call>\n<tool_call>{CALL}</tool_call>", PIXELS)
    assert action.name == "left_click" and info["error"] is None
    assert info["skipped"] == ["tool_call 0: OverflowError: int too large to convert to float"]


def test_navigate_without_a_scheme_goes_to_https() -> None:
    def target(url: str) -> tuple[str | None, str | None]:
        call = {"name": "computer_use", "arguments": {"action": "navigate", "url": url}}
        action, info = parse_action(f"<tool_call>{json.dumps(call)}</tool_call>", GRID)
        return action.url, info["error"]

    assert target("www.example.com/shop") == ("https://www.example.com/shop", None)
    assert target("shop.example.co.uk:8443/cart?id=1") == ("https://shop.example.co.uk:8443/cart?id=1", None)
    assert target(" http://example.com/a ") == ("http://example.com/a", None)
    assert target("about:blank") == ("about:blank", None)
    for bad in ("/cart", "the cart page", "cart"):  # a parse problem in the record, not a browser error
        url, error = target(bad)
        assert url is None and error is not None and "absolute URL or a host name" in error, bad
