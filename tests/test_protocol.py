"""The engine <-> worker wire protocol: every message round-trips, and bad bytes are rejected."""

from __future__ import annotations

import dataclasses

import msgpack
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
              [3, "input", "", 10, 20, 30, 40]])
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
    P.Request(1, "open", "ep-1", {"url": "http://127.0.0.1:8000/"}),
    P.Request(2, "act", "ep-1", {"action": P.BrowserAction("click", x=10.5, y=20.0).to_wire()},
              [[0, 1], [5, 9]]),
    P.Request(3, "evaluate", "ep-1", {"exprs": ["document.title", "1 + 1"]}),
    P.Request(4, "close", "ep-1"),
    P.Request(5, "open", "ep-2", {"url": "http://127.0.0.1:8000/m.html", "setup_js": "core.startEpisodeReal();",
                                  "probe_js": "WOB_DONE_GLOBAL"}),
    P.Reply(6, True, OBS_PROBE.to_wire()),
    P.Reply(2, True, OBS_INLINE.to_wire()),  # (tuples come back as lists: see the Observation test)
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


def test_wire_form_is_tag_then_fields_in_order() -> None:
    msg = P.Request(9, "locate", "ep-2", {"selector": "#btn"}, [[1, 1]])
    wire = msgpack.unpackb(P.encode(msg), raw=False)
    assert wire == ["req", 9, "locate", "ep-2", {"selector": "#btn"}, [[1, 1]]]
    assert msgpack.unpackb(P.encode(P.Shutdown()), raw=False) == ["shutdown"]


def test_hello_defaults_to_current_protocol_version() -> None:
    hello = P.decode(P.encode(P.Hello("w0", 1, "h", 2, "v", None, 1, 1)))
    assert isinstance(hello, P.Hello)
    assert hello.protocol == P.PROTOCOL_VERSION


@pytest.mark.parametrize("obs", [OBS_SHM, OBS_INLINE, OBS_SOM, OBS_PROBE], ids=["shm", "inline", "som", "probe"])
def test_observation_wire_round_trip_through_a_reply(obs: P.Observation) -> None:
    reply = P.decode(P.encode(P.Reply(1, True, obs.to_wire())))
    assert isinstance(reply, P.Reply)
    back = P.Observation.from_wire(reply.body)
    assert back == obs
    assert back.frame is None or isinstance(back.frame, P.FrameRef)
    assert back.point is None or isinstance(back.point, tuple)
    assert type(back.frame_bytes) is type(obs.frame_bytes)


def test_observation_wire_layout() -> None:
    w = OBS_SHM.to_wire()
    assert len(w) == len(dataclasses.fields(P.Observation))
    assert w[6] == [3, 7, 12345]  # a FrameRef travels as [slot, generation, nbytes]
    assert w[7] is None
    assert OBS_INLINE.to_wire()[6] is None
    assert OBS_INLINE.to_wire()[7] == OBS_INLINE.frame_bytes
    assert w[11] is None  # elements: None outside Set-of-Marks mode
    assert OBS_SOM.to_wire()[11] == OBS_SOM.elements
    assert w[12] is None  # probe: last, None when the episode has no probe expression
    assert OBS_PROBE.to_wire()[12] == OBS_PROBE.probe


def test_observation_without_the_elements_field_still_reads() -> None:
    """An observation from before ``elements`` (11 fields) reads as one without elements."""
    old = OBS_SHM.to_wire()[:11]
    back = P.Observation.from_wire(P.decode(P.encode(P.Reply(1, True, old))).body)
    assert back == OBS_SHM
    assert back.elements is None


def test_observation_without_the_probe_field_still_reads() -> None:
    """An observation from before ``probe`` (12 fields) reads as one without a probe result."""
    old = OBS_SOM.to_wire()[:12]
    back = P.Observation.from_wire(P.decode(P.encode(P.Reply(1, True, old))).body)
    assert back == OBS_SOM
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
    req = P.decode(P.encode(P.Request(1, "act", "ep", {"action": wire})))
    assert isinstance(req, P.Request)
    assert P.BrowserAction.from_wire(req.args["action"]) == action


def test_browser_action_wire_omits_unset_fields() -> None:
    wire = P.BrowserAction("navigate", url="http://a.test/").to_wire()
    assert wire["url"] == "http://a.test/"
    for name in ("x", "y", "selector", "text", "keys", "direction", "amount", "seconds"):
        assert name not in wire
    assert P.BrowserAction("type", text="x", clear=False, enter=False).to_wire()["clear"] is False


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
    msgpack.packb(["shutdown", 1]),
    P.encode(P.Welcome(True)) + b"\x00",  # trailing bytes
], ids=lambda d: d[:12].hex() or "empty")
def test_bad_bytes_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(P.ProtocolError):
        P.decode(data)


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
    try:
        msg = P.decode(msgpack.packb([tag, *values], use_bin_type=True))
    except P.ProtocolError:
        assert tag not in P._TYPES or not _arity_ok(P._TYPES[tag], len(values))
        return
    assert type(msg) is P._TYPES[tag]
    assert _arity_ok(type(msg), len(values))


def _arity_ok(cls: type, n: int) -> bool:
    fs = dataclasses.fields(cls)
    required = sum(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING for f in fs)
    return required <= n <= len(fs)
