"""The worker's configuration crosses the process edge as JSON, each field checked against its type."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import msgspec
import pytest

from browserpool.config import WorkerConfig
from browserpool.netpolicy import engine_sites
from browserpool.protocol import NetSettings


def test_a_config_comes_back_as_it_went_with_its_tuples_and_choices() -> None:
    cfg = WorkerConfig(endpoint="tcp://127.0.0.1:5555", allowed_schemes=("http",),
                       net=NetSettings(hosts={"a.test": "127.0.0.2"}), consent="reject", user_agent="UA")
    back = WorkerConfig.from_json(cfg.to_json())
    # The engine's own sites (those this process serves) travel as exempt from the network policy.
    assert back.net.exempt == list(dict.fromkeys(engine_sites()))
    assert replace(back, net=msgspec.structs.replace(back.net, exempt=[])) == cfg
    assert isinstance(back.allowed_schemes, tuple)


@pytest.mark.parametrize(("text", "problem"), [
    ('{"endpoint": 3}', "endpoint: expected a string, got 3"),
    ('{"endpoint": "x", "consent": "maybe"}', "consent: must be one of off, reject, accept, got 'maybe'"),
    ('{"endpoint": "x", "slot_count": "64"}', "slot_count: expected an integer, got '64'"),
    ('{"endpoint": "x", "slot_cuont": 64}', "unknown key 'slot_cuont' (did you mean 'slot_count'?)"),
    ('{"endpoint": "x", "net": [true, false, ["10.0.0.0/8"], [], [], {}, 7]}', "net: Expected `array` of at most"),
    ("{}", "missing required field `endpoint`"),
    ("[1]", "expected a table of settings, got list"),
    ("not json", "JSON is malformed"),
])
def test_a_bad_config_is_refused_with_the_field_named(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match="worker config") as exc:
        WorkerConfig.from_json(text)
    assert problem in str(exc.value)


def test_a_worker_given_a_bad_config_exits_2_and_says_which_field() -> None:
    bad = '{"endpoint": "x", "jpeg_quality": "hi"}'
    proc = subprocess.run([sys.executable, "-m", "browserpool.worker", "--config", bad], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "jpeg_quality: expected an integer, got 'hi'" in proc.stderr
