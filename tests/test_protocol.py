"""The engine <-> worker wire protocol: every message round-trips, and bad bytes, wrong shapes and wrong
types are rejected with ProtocolError (the typed decoders are the engine's first line against a hostile peer)."""

from __future__ import annotations

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from browserpool import protocol as P

OBS_SHM = P.Observation(
    url="http://127.0.0.1:8000/fixtures/click.html", title="click", settled=True, settle="quiet",
    width=1280, height=768, frame=P.FrameRef(3, 7, 12345), frame_bytes=None,
    timings_ms={"action_ms": 1.5, "settle_ms": 40.25, "screenshot_ms": 12.0}, point=(200.0, 130.5), note=None)
OBS_INLINE = P.Observation(
    url="about:blank", title="", settled=False, settle="timeout", width=1280, height=768, frame=None,
    frame_bytes=b"\xff\xd8\xff\xe0" + bytes(range(256)) + b"\xff\xd9", timings_ms={}, point=None,
    note="no slot was free")
OBS_SOM = P.Observation(
    url="http://127.0.0.1:8000/fixtures/som_marks.html", title="som marks", settled=True, settle="quiet",
    width=1280, height=768, frame=P.FrameRef(0, 1, 999), frame_bytes=None,
    timings_ms={"settle_ms": 40.0, "som_ms": 1.2, "screenshot_ms": 20.0, "draw_ms": 5.1}, point=None, note=None,
    elements=[[1, "button", "first", 100, 100, 200, 60], [2, "a", "Caf\u00e9 \u2026", 0, 0, 1280, 1],
              [3, "input", "", 10, 20, 30, 40]], elements_cut="count")
OBS_PROBE = P.Observation(
    url="http://127.0.0.1:8000/miniwob/miniwob/click-button.html", title="Click Button Task", settled=True,
    settle="quiet", width=1280, height=768, frame=P.FrameRef(1, 2, 3), frame_bytes=None, timings_ms={},
    point=None, note=None, elements=None,
    probe={"done": True, "reward": 0.93, "raw_reward": 1, "reason": None, "utterance": "Click on the \"ok\" button."})

MESSAGES: list[P.Message] = [
    P.Hello("w0", 1234, "host-a", 5678, "131.0.6778.204", "wg-1234-abcd", 64, 1 << 20),
    P.Hello("w7", 1, "remote", 0, "", None, 0, 0, protocol=P.PROTOCOL_VERSION),
    P.Welcome(True),
    P.Welcome(False),
    P.Heartbeat("w0", 3, 2),
    P.Request(1, "ep-1", P.Open(url="http://127.0.0.1:8000/")),
    P.Request(2, "ep-1", P.Act(action=P.BrowserAction("click", x=10.5, y=20.0)), [(0, 1), (5, 9)]),
    P.Request(3, "ep-1", P.Evaluate(exprs=["document.title", "1 + 1"])),
    P.Request(4, "ep-1", P.Close()),
    P.Request(5, "ep-2", P.Open(url="http://127.0.0.1:8000/m.html", setup_js="core.startEpisodeReal();",
                                probe_js="WOB_DONE_GLOBAL")),
    P.Request(6, "ep-2", P.Observe(som=True, format="png")),
    P.Reply(6, True, msgspec.to_builtins(OBS_PROBE)),
    P.Reply(2, True, msgspec.to_builtins(OBS_INLINE)),  # (tuples come back as lists: see the Observation test)
    P.Reply(3, True, ["click", 2, None, {"nested": [1, 2.5, "x"]}]),
    P.Reply(4, False, None, "navigation to file: URL refused", P.ERR_REFUSED),
    P.Reply(5, False, None, "page hung", P.ERR_HUNG),
    P.Shutdown(),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: f"{m.TAG}")
def test_every_message_round_trips(msg: P.Message) -> None:
    data = P.encode(msg)
    assert isinstance(data, bytes)
    back = P.decode(data)
    assert type(back) is type(msg)
    assert back == msg
    assert P.decode(memoryview(data)) == msg  # the pool decodes zero-copy frames


def test_every_message_type_is_covered() -> None:
    assert {m.TAG for m in MESSAGES} == set(P._TYPES)
    assert len(set(P._TYPES)) == len(P._TYPES.values())  # tags are unique


@pytest.mark.parametrize("msg", [m for m in MESSAGES if isinstance(m, P.Hello | P.Heartbeat | P.Reply)],
                         ids=lambda m: m.TAG)
def test_the_engine_decodes_what_workers_send_with_raw_bodies(msg: P.Message) -> None:
    back = P.decode_from_worker(P.encode(msg))
    assert type(back) is type(msg)
    if isinstance(msg, P.Reply):
        assert isinstance(back.body, msgspec.Raw)
        assert P.decode_body(back.body) == msg.body
    else:
        assert back == msg


@pytest.mark.parametrize("msg", [P.Welcome(True), P.Request(1, "e", P.Open(url="x")), P.Shutdown()],
                         ids=lambda m: m.TAG)
def test_each_side_refuses_the_other_sides_messages(msg: P.Message) -> None:
    assert P.decode_from_engine(P.encode(msg)) == msg
    with pytest.raises(P.ProtocolError):
        P.decode_from_worker(P.encode(msg))  # a worker can never pose as the engine
    with pytest.raises(P.ProtocolError):
        P.decode_from_engine(P.encode(P.Heartbeat("w0", 1, 1)))


@pytest.mark.parametrize("wire", [
    ["hello", "a/b", 1, "h", 2, "v", None, 1, 1],  # a worker id with a path separator
    ["hello", "", 1, "h", 2, "v", None, 1, 1],  # an empty worker id
    ["hello", "w0", "1", "h", 2, "v", None, 1, 1],  # pid as a string
    ["hello", "w0", -5, "h", 2, "v", None, 1, 1],  # a negative pid
    ["hello", "w0", 1, "h", 2, "v", "wg-x", 1, 2**40],  # a slot size beyond the message cap
    ["hello", "w0", 1, "h" * 300, 2, "v", None, 1, 1],  # an oversized host name
    ["heartbeat", "w0", "many", 0],
    ["rep", "1", True, None, None, None],  # req_id as a string
    ["rep", 1, "yes", None, None, None],
    ["rep", 1, False, None, 42, None],  # error as a number
    ["rep", 1, False, None, "x" * 5000, None],  # an oversized error text
    ["rep", 1, False, None, "boom", "exploded"],  # an error kind the protocol does not have
], ids=lambda w: f"{w[0]}-{str(w[1])[:8]}-{len(w)}-{str(w[-1])[:8]}")
def test_wrongly_typed_fields_from_a_worker_are_refused(wire: list) -> None:
    with pytest.raises(P.ProtocolError):
        P.decode_from_worker(msgpack.packb(wire, use_bin_type=True))


@pytest.mark.parametrize("body", [
    ["u", "t", True, "quiet", 1280],  # too short
    ["u", "t", True, "quiet", 1280, 768, [1, 2]],  # a frame reference of two numbers
    ["u", "t", True, "quiet", 1280, 768, [-1, 2, 3]],  # a negative slot
    ["u", "t", True, "quiet", 1280, 768, None, "not bytes"],
    ["u", "t", True, "quiet", 1280, 768, None, None, {"a": "slow"}],  # a timing that is not a number
    ["u", "t", True, "quiet", 1280, 768, None, None, {}, None, None, [[1, "a"]]],  # an element of two fields
    ["u", "t", True, "quiet", 1280, 768, None, None, {}, None, None, None, None, None, [["refused", 5]]],
    {"url": "u"},
], ids=lambda b: str(b)[-24:])
def test_malformed_observations_are_refused(body: object) -> None:
    raw = P.decode_from_worker(P.encode(P.Reply(1, True, body))).body
    with pytest.raises(P.ProtocolError):
        P.decode_observation(raw)


def test_wire_form_is_tag_then_fields_in_order() -> None:
    msg = P.Request(9, "ep-2", P.Locate(selector="#btn"), [(1, 1)])
    wire = msgpack.unpackb(P.encode(msg), raw=False)
    assert wire == ["req", 9, "ep-2", ["locate", "#btn"], [[1, 1]]]
    assert msgpack.unpackb(P.encode(P.Shutdown()), raw=False) == ["shutdown"]


@pytest.mark.parametrize("operation", [
    ["teleport", "x"],  # no such op
    ["open"],  # its url missing
    ["open", 5],  # a url that is not a string
    ["observe", None, "gif"],  # a format that is neither jpeg nor png
    ["open", "http://x", False, -1],  # a negative element cap
    ["act", {"kind": "click", "x": "left"}],  # an action of the wrong types
    ["evaluate", "document.title"],  # exprs not a list
    ["close", "extra"],  # a field that no close has
], ids=repr)
def test_each_operation_is_typed_on_the_wire(operation: list) -> None:
    with pytest.raises(P.ProtocolError):
        P.decode_from_engine(msgpack.packb(["req", 1, "ep", operation, []]))
    good = P.decode_from_engine(msgpack.packb(["req", 1, "ep", ["observe", True, "png"], []]))
    assert isinstance(good, P.Request) and good.operation == P.Observe(som=True, format="png")


def test_hello_defaults_to_current_protocol_version() -> None:
    hello = P.decode(P.encode(P.Hello("w0", 1, "h", 2, "v", None, 1, 1)))
    assert isinstance(hello, P.Hello)
    assert hello.protocol == P.PROTOCOL_VERSION


OBS_EVENTS = P.Observation(
    url="http://127.0.0.1:8000/", title="t", settled=True, settle="quiet", width=1280, height=768,
    events=[P.PageEvent("refused", "http://169.254.169.254/", "link-local"), P.PageEvent("popup", "x", "closed")])


def _wire(obs: P.Observation) -> list:
    return msgpack.unpackb(P.encode(P.Reply(1, True, obs)), raw=False)[3]


@pytest.mark.parametrize("obs", [OBS_SHM, OBS_INLINE, OBS_SOM, OBS_PROBE, OBS_EVENTS],
                         ids=["shm", "inline", "som", "probe", "events"])
def test_observation_wire_round_trip_through_a_reply(obs: P.Observation) -> None:
    reply = P.decode_from_worker(P.encode(P.Reply(1, True, obs)))
    assert isinstance(reply, P.Reply)
    back = P.decode_observation(reply.body)
    assert back == obs
    assert back.frame is None or isinstance(back.frame, P.FrameRef)
    assert back.point is None or isinstance(back.point, tuple)
    assert type(back.frame_bytes) is type(obs.frame_bytes)


def test_a_page_text_with_a_lone_surrogate_travels_as_a_replacement_character() -> None:
    # JavaScript strings may hold lone UTF-16 surrogates (a page's title, an element's name, a probe's value);
    # UTF-8 cannot, so the message is sent with U+FFFD in their place and otherwise unchanged.
    obs = msgspec.structs.replace(OBS_INLINE, title="a\ud800b", probe={"k\udc00": ["\udbff", 1.5, None]},
                                  events=[P.PageEvent("dialog", "x", "m\ud800")])
    back = P.decode_observation(P.decode_from_worker(P.encode(P.Reply(7, True, obs))).body)
    assert back == msgspec.structs.replace(obs, title="a\ufffdb", probe={"k\ufffd": ["\ufffd", 1.5, None]},
                                           events=[P.PageEvent("dialog", "x", "m\ufffd")])
    assert back.frame_bytes == OBS_INLINE.frame_bytes  # bytes stay bytes
    assert P.decode(P.encode(P.Reply(8, True, ["\udfff"]))) == P.Reply(8, True, ["\ufffd"])


def test_observation_wire_layout() -> None:
    w = _wire(OBS_SHM)
    assert len(w) == len(P.Observation.__struct_fields__)
    assert w[6] == [3, 7, 12345]  # a FrameRef travels as [slot, generation, nbytes]
    assert w[7] is None
    assert _wire(OBS_INLINE)[6] is None
    assert _wire(OBS_INLINE)[7] == OBS_INLINE.frame_bytes
    assert w[11] is None  # elements: None outside Set-of-Marks mode
    assert _wire(OBS_SOM)[11] == OBS_SOM.elements
    assert _wire(OBS_SOM)[-6] == "count" and w[-6] is None  # elements_cut: why a Set-of-Marks pass stopped early
    assert w[-5:-3] == [None, False]  # axtree (None: the episode does not observe it) and axtree_cut
    assert w[-3:-1] == [None, False]  # dom and dom_cut, likewise
    assert w[-1] is None  # traffic: None when the episode's traffic is neither recorded nor replayed
    tree = msgspec.structs.replace(OBS_SHM, axtree=[P.AXNode(5, 1, "button", "Go", states=["focused"])],
                                   dom=[P.DOMNode(5, 2, "button", 1.5, 2, 30, 20, 1.0, True)],
                                   traffic=P.TrafficStats(served=3, misses=1, miss_urls=["http://x/"]))
    assert _wire(tree)[-5] == [[5, 1, "button", "Go", "", ["focused"]]]  # a node travels as an array
    assert _wire(tree)[-3] == [[5, 2, "button", 1.5, 2.0, 30.0, 20.0, 1.0, True]]
    assert _wire(tree)[-1] == [0, 3, 1, ["http://x/"]]
    assert P.decode_observation(P.decode_from_worker(P.encode(P.Reply(1, True, _wire(tree)))).body) == tree
    assert w[12] is None  # probe: None when the episode has no probe expression
    assert _wire(OBS_PROBE)[12] == OBS_PROBE.probe
    assert _wire(OBS_EVENTS)[14] == [["refused", "http://169.254.169.254/", "link-local"], ["popup", "x", "closed"]]


def test_observation_without_the_elements_field_still_reads() -> None:
    """An observation from before ``elements`` (11 fields) reads as one without elements."""
    old = _wire(OBS_SHM)[:11]
    back = P.decode_observation(P.decode_from_worker(P.encode(P.Reply(1, True, old))).body)
    assert back == OBS_SHM
    assert back.elements is None


def test_observation_without_the_probe_field_still_reads() -> None:
    """An observation from before ``probe`` (12 fields) reads as one without a probe result."""
    old = _wire(OBS_SOM)[:12]
    back = P.decode_observation(P.decode_from_worker(P.encode(P.Reply(1, True, old))).body)
    assert back == msgspec.structs.replace(OBS_SOM, elements_cut=None)
    assert back.probe is None


ACTIONS = [
    P.BrowserAction("click", x=10.0, y=20.5),
    P.BrowserAction("click", selector="#btn"),
    P.BrowserAction("hover", x=0, y=0),
    P.BrowserAction("type", x=5, y=6, text="hello wörld\n", clear=False, enter=False),
    P.BrowserAction("key", keys="Control+A Tab"),
    P.BrowserAction("scroll", x=100, y=200, direction="down", amount=300),
    P.BrowserAction("wait", seconds=1.5),
    P.BrowserAction("go_back"),
    P.BrowserAction("navigate", url="http://example.test/?q=1"),
    P.BrowserAction("select", x=417.0, y=137.5, text="Cherry"),
]


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.kind)
def test_browser_action_wire_round_trip(action: P.BrowserAction) -> None:
    wire = action.to_wire()
    assert all(v is not None for v in wire.values())  # unset fields do not travel
    assert wire["kind"] == action.kind
    # Through a whole Request, as the pool sends it.
    req = P.decode_from_engine(P.encode(P.Request(1, "ep", P.Act(action=action))))
    assert isinstance(req, P.Request) and isinstance(req.operation, P.Act) and req.op is P.Op.ACT
    assert req.operation.action == action


@pytest.mark.parametrize("wire", [{"x": 1}, {"kind": 5}, {"kind": "click", "x": "left"}, "click", None])
def test_malformed_actions_are_refused(wire: object) -> None:
    with pytest.raises(P.ProtocolError):
        P.BrowserAction.from_wire(wire)


def test_browser_action_wire_omits_unset_fields() -> None:
    wire = P.BrowserAction("navigate", url="http://a.test/").to_wire()
    assert wire["url"] == "http://a.test/"
    for name in ("x", "y", "selector", "text", "keys", "direction", "amount", "seconds"):
        assert name not in wire
    assert P.BrowserAction("type", text="x", clear=False, enter=False).to_wire()["clear"] is False


# ["rep", req_id, ok, body, None, None] with a body of arrays nested 100,000 deep
REPLY_NESTED_TOO_DEEP = b"\x96\xa3rep\x01\xc3" + b"\x91" * 100_000 + b"\xc0" + b"\xc0\xc0"


@pytest.mark.parametrize("data", [
    b"",
    b"\xc1",  # a byte msgpack never uses
    b"\x92\xa4req",  # an array announced with 2 items, cut short
    b"not msgpack at all \xff\xfe",
    msgpack.packb(42),
    msgpack.packb("hello"),
    msgpack.packb([]),
    msgpack.packb({"tag": "req"}),
    msgpack.packb(["nope", 1, 2]),  # unknown tag
    msgpack.packb([["req"], 1]),  # unhashable tag
    msgpack.packb(["welcome"]),  # missing field
    msgpack.packb(["welcome", True, "extra"]),  # too many fields
    msgpack.packb(["welcome", "yes"]),  # a wrong type
    msgpack.packb(["shutdown", 1]),
    P.encode(P.Welcome(True)) + b"\x00",  # trailing bytes
    b"\x91\xa8\x00\x00\x00\x00\x00\x00\x00\x80",  # a tag that is not UTF-8
    b"\x91" * 100_000 + b"\xc0",  # arrays nested 100,000 deep
    REPLY_NESTED_TOO_DEEP,
], ids=lambda d: d[:12].hex() or "empty")
def test_bad_bytes_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(P.ProtocolError):
        P.decode(data)


def test_values_nested_too_deep_are_protocol_errors_wherever_they_are_read() -> None:
    # Before, each of these raised RecursionError, which the engine's receive loop took for an unexpected error and
    # a worker's own loop (decoding the engine's messages the same way) did not catch at all.
    deep = b"\x91" * 100_000 + b"\xc0"
    with pytest.raises(P.ProtocolError):
        P.decode_from_worker(REPLY_NESTED_TOO_DEEP)  # the body is Raw, but walked to be skipped
    with pytest.raises(P.ProtocolError):
        P.decode_body(msgspec.Raw(deep))  # an evaluate's result
    obs = list(msgspec.msgpack.decode(msgspec.msgpack.encode(P.Observation("u", "t", True, "quiet", 1, 1))))
    probe = [f.name for f in msgspec.structs.fields(P.Observation)].index("probe")
    obs += [None] * (probe + 1 - len(obs))
    parts = [msgspec.msgpack.encode(v) for v in obs]
    parts[probe] = deep
    with pytest.raises(P.ProtocolError):  # a probe's value
        P.decode_observation(msgspec.Raw(b"\xdc" + len(obs).to_bytes(2, "big") + b"".join(parts)))


def test_protocol_error_is_a_value_error() -> None:
    assert issubclass(P.ProtocolError, ValueError)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_protocol_error(data: bytes) -> None:
    try:
        msg = P.decode(data)
    except P.ProtocolError:
        return
    assert isinstance(msg, P.Message)


_leaves = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) \
    | st.binary(max_size=8)
_values = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=6)


@settings(max_examples=100, deadline=None)
@given(st.lists(_values, max_size=10), st.sampled_from([*P._TYPES, "", "REQ", "bogus"]))
def test_random_well_formed_arrays_decode_or_raise_protocol_error(values: list, tag: str) -> None:
    """Random values: a message of the wrong arity or an unknown tag never decodes; one that decodes has
    the tag's type (wrong field types raise too, so not every well-sized array decodes)."""
    try:
        msg = P.decode(msgpack.packb([tag, *values], use_bin_type=True))
    except P.ProtocolError:
        return
    assert type(msg) is P._TYPES[tag]
    assert _arity_ok(type(msg), len(values))


def _arity_ok(cls: type[msgspec.Struct], n: int) -> bool:
    fields = msgspec.structs.fields(cls)
    required = sum(f.required for f in fields)
    return required <= n <= len(fields)


def test_a_reply_error_is_cut_to_what_the_engine_decodes() -> None:
    long = "unknown modifier 'XXX" + "X" * 6000 + "'"
    with pytest.raises(P.ProtocolError, match="length <= 4096"):
        P.decode_from_worker(P.encode(P.Reply(7, False, None, long, P.ERR_REFUSED)))
    cut = P.error_text(long)
    assert len(cut) == P.MAX_ERROR_CHARS and cut.startswith(long[:100]) and cut.endswith("\u2026")
    assert P.error_text("short") == "short"
    reply = P.decode_from_worker(P.encode(P.Reply(7, False, None, cut, P.ERR_REFUSED)))
    assert isinstance(reply, P.Reply) and reply.error == cut


def test_a_reply_carries_its_error_kind_as_the_enum() -> None:
    reply = P.decode_from_worker(P.encode(P.Reply(3, False, None, "gone", P.ERR_BROWSER)))
    assert isinstance(reply, P.Reply) and reply.error_kind is P.ErrorKind.BROWSER and reply.error_kind == "browser"
