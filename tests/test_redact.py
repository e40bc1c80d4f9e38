"""Credential masking (engine/web/redact.py) and the page-text caps (engine/web/bounds.py), as pure functions."""

from __future__ import annotations

import time

import pytest

from browserpool.protocol import DOMNode, Observation, PageEvent
from engine.web.bounds import ELLIPSIS, PageLimits, bound_observation, cap_text, cap_value
from engine.web.redact import MASK, is_secret_name, mask_text, mask_url, redact_tree


@pytest.mark.parametrize(("url", "masked"), [
    ("https://user:pw@example.test/a?b=1", "https://***@example.test/a?b=1"),
    ("https://ghp_TOKEN@github.test/org/repo.git", "https://***@github.test/org/repo.git"),
    ("http://127.0.0.1:8000/x?token=abc&page=2", "http://127.0.0.1:8000/x?token=***&page=2"),
    ("http://h/?q=shoes&api_key=k1&apiKey=k2&API-KEY=k3", "http://h/?q=shoes&api_key=***&apiKey=***&API-KEY=***"),
    ("http://h/?access_token=a&refresh_token=b&id_token=c", "http://h/?access_token=***&refresh_token=***&id_token=***"),
    ("http://h/?client_secret=s&password=p&passwd=q&pwd=r", "http://h/?client_secret=***&password=***&passwd=***&pwd=***"),
    ("http://h/?sig=s&signature=t&X-Amz-Signature=u&X-Amz-Credential=v&auth=w",
     "http://h/?sig=***&signature=***&X-Amz-Signature=***&X-Amz-Credential=***&auth=***"),
    ("http://h/?Token=A&KEY=B&Credential=C", "http://h/?Token=***&KEY=***&Credential=***"),
    ("http://h/cb#access_token=xyz&state=s", "http://h/cb#access_token=***&state=s"),
    ("http://h/app;jsessionid=ABC?x=1", "http://h/app;jsessionid=***?x=1"),
    ("http://u:p@h/?token=t", "http://***@h/?token=***"),
])
def test_mask_url_masks_userinfo_and_secret_parameters(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert mask_url(masked) == masked  # idempotent


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/shop/item?id=3&sort=price",
    "http://h/search?keyword=monkey&author=me&tokens=3&max_tokens=5&passenger=2&bypass=1",
    "mailto:someone@example.test",  # an address, not userinfo of a URL with an authority
    "http://h/path/with@sign",  # "@" in the path is not userinfo
    "about:blank",
    "",
])
def test_mask_url_leaves_ordinary_urls_alone(url: str) -> None:
    assert mask_url(url) == url


def test_secret_names() -> None:
    for name in ["key", "api_key", "apikey", "accessToken", "X-Goog-Signature", "client-secret", "sid",
                 "my_key", "AUTH", "credentials", "jwt", "private_key"]:
        assert is_secret_name(name), name
    for name in ["keyword", "monkey", "author", "page", "id", "q", "tokens", "passenger", "signal", "keys"]:
        assert not is_secret_name(name), name


def test_mask_text_finds_urls_and_query_strings_in_free_text() -> None:
    text = ("GET http://bob:hunter2@10.0.0.1:8080/v1/chat?api_key=sk-123 failed: 401; retry "
            "/callback?code=1&token=zzz later")
    out = mask_text(text)
    assert "hunter2" not in out and "bob" not in out and "sk-123" not in out and "zzz" not in out
    assert "http://***@10.0.0.1:8080/v1/chat?api_key=***" in out and "code=1&token=***" in out
    assert out.endswith("later")
    assert mask_text("no urls here, x=1 and a@b") == "no urls here, x=1 and a@b"


def test_redact_tree_masks_urls_and_secret_keys_but_not_env_var_names() -> None:
    config = {
        "backend": {"base_url": "http://u:pw@127.0.0.1:8000/v1?key=K", "api_key_env": "OPENAI_API_KEY",
                    "token_ids": True, "max_tokens": 512},
        "judge": {"base_url": None, "api_key": "sk-live-1"},
        "tasks": ["http://h/?token=abc", 3],
        "password": "p4ss", "server_key": "/keys/engine.key_secret", "token": "",
    }
    out = redact_tree(config)
    assert out["backend"] == {"base_url": "http://***@127.0.0.1:8000/v1?key=***", "api_key_env": "OPENAI_API_KEY",
                              "token_ids": True, "max_tokens": 512}
    assert out["judge"] == {"base_url": None, "api_key": MASK}
    assert out["tasks"] == ["http://h/?token=***", 3]
    assert out["password"] == MASK and out["server_key"] == "/keys/engine.key_secret" and out["token"] == ""
    assert config["backend"]["base_url"].startswith("http://u:pw@")  # the input is not changed


@pytest.mark.wallclock
def test_mask_url_is_cheap() -> None:
    plain = "http://127.0.0.1:8123/shop/category/3?page=2&sort=price"
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        mask_url(plain)
    per_call_us = (time.perf_counter() - t0) / n * 1e6
    # ~1-3 us on this machine; generous bound for a loaded 2-core box.
    assert per_call_us < 50, per_call_us


def _obs(**kw) -> Observation:
    base = dict(url="http://h/", title="t", settled=True, settle="quiet", width=1280, height=768)
    return Observation(**{**base, **kw})


def test_bound_observation_caps_and_flags() -> None:
    limits = PageLimits(url_chars=64, title_chars=10, elements=3, element_text_chars=5, text_chars=20,
                        probe_items=2)
    elements = [[i, "a", f"link number {i}", 0, 0, 5, 5] for i in range(1, 8)]
    obs = _obs(url="http://h/?token=secret&" + "x" * 200, title="T" * 100, note="n" * 50, elements=elements,
               probe={"utterance": "u" * 50, "list": list(range(10))})
    cut = bound_observation(obs, limits)
    assert cut == ["element_text", "elements", "note", "probe", "title", "url"]
    assert len(obs.url) == 64 and obs.url.endswith(ELLIPSIS) and "secret" not in obs.url and obs.url.startswith("http://h/?token=***&")
    assert obs.title == "T" * 9 + ELLIPSIS
    assert len(obs.note) == 20
    assert [e[0] for e in obs.elements] == [1, 2, 3] and obs.elements[0][2] == "link" + ELLIPSIS
    assert elements[0][2] == "link number 1"  # the caller's lists are not changed in place
    assert obs.probe == {"utterance": "u" * 19 + ELLIPSIS, "list": [0, 1]}


def test_bound_observation_masks_and_caps_page_events() -> None:
    limits = PageLimits(url_chars=40, text_chars=30, events=2)
    events = [PageEvent("refused", "http://u:p@169.254.169.254/?token=t&" + "y" * 100, "rule: link-local " + "z" * 50),
              PageEvent("popup", "http://h/?sig=abc", "closed"), PageEvent("download", "http://h/f", "refused")]
    obs = _obs(events=events)
    assert bound_observation(obs, limits) == ["events"]
    assert [e.kind for e in obs.events] == ["refused", "popup"]
    first, second = obs.events
    assert first.url.startswith("http://***@169.254.169.254/?token=***&") and len(first.url) == 40
    assert len(first.detail) == 30 and second.url == "http://h/?sig=***" and second.detail == "closed"


def test_bound_observation_caps_a_dom_snapshot() -> None:
    # A worker's snapshot past the engine's cap, a long tag, a box that is no finite number (a record is JSON).
    dom = [DOMNode(i, 0, "div", 0, 10 * i, 5, 5, 1.0) for i in range(1, 6)]
    dom[0].tag, dom[1].x, dom[2].visibility = "x" * 100, float("nan"), float("inf")
    obs = _obs(dom=dom)
    assert bound_observation(obs, PageLimits(dom_nodes=3, element_tag_chars=8)) == ["dom"]
    assert [n.id for n in obs.dom] == [1, 2, 3] and obs.dom[0].tag == "x" * 7 + ELLIPSIS
    assert obs.dom[1].x == 0 and obs.dom[2].visibility == 0
    assert bound_observation(_obs(dom=[], dom_cut=True)) == ["dom"]  # the worker's own cut is flagged too


def test_bound_observation_leaves_small_pages_alone() -> None:
    elements = [[1, "a", "Home", 0, 0, 5, 5]]
    obs = _obs(url="http://h/a?b=1", title="Home", elements=elements, probe={"done": False})
    assert bound_observation(obs) == []
    assert obs.url == "http://h/a?b=1" and obs.title == "Home" and obs.elements is elements
    assert obs.probe == {"done": False}


def test_bound_observation_caps_elements_of_odd_shapes() -> None:
    # A number for a tag or text (the protocol allows int | float | str) and a short element take the careful path,
    # which still caps the long texts beside them.
    limits = PageLimits(element_text_chars=5, element_tag_chars=3)
    elements = [[1, 7, "a long text", 0, 0, 5, 5], [2, "button", 3.5, 0, 0, 5, 5], [3, "a", "ok", 0, 0, 5, 5]]
    obs = _obs(elements=elements)
    assert bound_observation(obs, limits) == ["element_text"]
    assert obs.elements == [[1, 7, "a lo" + ELLIPSIS, 0, 0, 5, 5], [2, "bu" + ELLIPSIS, 3.5, 0, 0, 5, 5],
                            [3, "a", "ok", 0, 0, 5, 5]]
    assert bound_observation(_obs(elements=[[1, 7, "ok", 0, 0, 5, 5]]), limits) == []


def test_cap_helpers() -> None:
    assert cap_text("abc", 3) == "abc" and cap_text("abcd", 3) == "ab" + ELLIPSIS and cap_text("abcd", 0) == "abcd"
    deep: dict = {}
    node = deep
    for _ in range(20):
        node["n"] = {}
        node = node["n"]
    value, cut = cap_value(deep, PageLimits())
    assert cut  # nesting is bounded too
