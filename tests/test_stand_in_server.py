"""The served-model stand-in itself (policy/served_stand_in.py), without the tests' fault injection.

tests/test_served_policy.py drives it through the test subclass and the loop's weight-sync client; here the
installed class answers raw HTTP calls as a demo or the RL loop would make them, and imports without torch.
"""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from policy.served_stand_in import ServedStandInServer

REPO = Path(__file__).resolve().parents[1]


def test_the_stand_ins_import_without_torch() -> None:
    # sys.modules["torch"] = None makes any `import torch` fail, as in an install without it.
    code = "import sys; sys.modules['torch'] = None; import policy.openai_stand_in, policy.served_stand_in"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def screenshot_url() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


async def chat(http: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
    payload = {"model": "policy", "max_tokens": 6, "temperature": 0.0, "logprobs": True, "return_token_ids": True,
               "return_tokens_as_token_ids": True,
               "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": screenshot_url()}},
                                                         {"type": "text", "text": "click the button"}]}]}
    async with http.post(f"{base_url}/chat/completions", json=payload) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


@pytest.mark.asyncio(loop_scope="session")
async def test_served_stand_in_answers_over_http_and_takes_a_vllm_weight_update(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from policy.hf_backend import HFModel
    from policy.tiny_models import build_tiny_model

    first = build_tiny_model(tmp_path / "model", "qwen3_vl", seed=0, hidden_size=64, num_layers=2)
    second = build_tiny_model(tmp_path / "trained", "qwen3_vl", seed=1, hidden_size=64, num_layers=2)
    async with ServedStandInServer(HFModel(str(first), device="cpu"), "vllm", "policy") as server, \
            aiohttp.ClientSession() as http:
        root = server.base_url.removesuffix("/v1")
        before = await chat(http, server.base_url)
        async with http.get(root + "/weight_info") as resp:
            assert await resp.json() == {"weight_version": "default"}  # vLLM's label before any update
        # vLLM 0.32's reload and label, as policy.weight_sync makes them (the disk backend's calls:
        # tests/test_served_policy.py).
        for path, body in [("/pause", None),
                           ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(second)}}),
                           ("/update_weight_version", {"new_version": "1"}), ("/resume", None)]:
            async with http.post(root + path, json=body) as resp:
                assert resp.status == 200, await resp.text()
        async with http.get(root + "/weight_info") as resp:
            assert await resp.json() == {"weight_version": "1"}
        after = await chat(http, server.base_url)

    for reply in (before, after):
        [choice] = reply["choices"]
        ids = choice["token_ids"]
        assert ids and [t["token"] for t in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in ids]
        assert reply["usage"]["completion_tokens"] == len(ids) and reply["usage"]["prompt_tokens"] > 0
        assert "metadata" not in reply  # vLLM's replies carry no weight version
    assert server.updates == [(str(second), "1")] and server.completed == 2 and server.in_flight == 0

    def logprobs(reply: dict[str, Any]) -> list[float]:
        return [t["logprob"] for t in reply["choices"][0]["logprobs"]["content"]]

    assert logprobs(after) != logprobs(before)  # the second model's weights answer now
