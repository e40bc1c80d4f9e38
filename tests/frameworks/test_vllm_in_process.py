"""The engine's in-process ``vllm`` backend (policy/vllm_backend.py) on the CPU, in ``.venv-vllm``, on a tiny
Qwen3-VL (docs/models.md serves it and Qwen2.5-VL with vLLM; test_vllm.py serves the Qwen2.5-VL): its greedy reply
to a screenshot is the ``hf`` backend's, token for token, with the same log-probabilities (both float32).

``make test`` runs this file with the project's interpreter, beside test_vllm.py (docs/vllm-cpu.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_in_process import MAX_TOKENS, screenshot_request

from bench.vllm_cpu import KV_CACHE_GIB, VLLM_PYTHON
from policy.hf_backend import HFModel
from policy.tiny_models import build_tiny_model

TIMEOUT_S = 400  # an allowance: the engine starts beside the other tests of make test's first phase


async def test_the_in_process_backend_answers_as_the_hf_backend_on_the_cpu(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """An engine per architecture, in one process of .venv-vllm (tests/frameworks/vllm_in_process.py)."""
    root = tmp_path_factory.mktemp("vllm-archs")
    dirs = {arch: build_tiny_model(root / arch, arch, seed=2, hidden_size=128) for arch in ("qwen3_vl",)}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB}
    proc = subprocess.run([str(VLLM_PYTHON), str(Path(__file__).with_name("vllm_in_process.py")),
                           *map(str, dirs.values())], capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    replies = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["model"] for r in replies] == [str(d) for d in dirs.values()]

    for arch, served in zip(dirs, replies, strict=True):
        assert 0 < len(served["token_ids"]) <= MAX_TOKENS, (arch, served)
        assert (served["logprobs_of"], served["logprobs_vision_masked"]) == ("model", False)
        model = HFModel(dirs[arch], device="cpu", dtype="float32", vision_in_logprobs=True)  # as vLLM's
        await model.start()
        try:
            local = await model.generate(screenshot_request())
        finally:
            await model.close()
        assert served["token_ids"] == local.token_ids, (arch, served["text"], local.text)
        gap = max(abs(a - b) for a, b in zip(served["logprobs"], local.logprobs or [], strict=True))
        print(f"{arch}: {len(local.token_ids or [])} tokens as hf's, log-probs at most {gap:.1e} apart")
        assert gap <= 2e-3, (arch, gap)
