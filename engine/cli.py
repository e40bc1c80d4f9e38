"""The ``webgym-engine`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from browserpool.config import DEFAULT_CHROMIUM, WorkerConfig
from engine.agent.prompts import COORD_SYSTEMS, INTERACTIONS, RESPONSE_FORMATS, AgentConfig
from engine.progress import show_progress, summary_table
from engine.runner import RunConfig, new_run_dir, run
from engine.tasks import BUNDLED_TASKS, SITES_PLACEHOLDER, TaskFileError, load_tasks
from policy.base import Policy
from policy.model import SamplingParams
from policy.registry import POLICY_NAMES, BackendConfig, make_policy


def _uvloop_run(coro):  # type: ignore[no-untyped-def]
    import uvloop
    return uvloop.run(coro)


@click.group()
@click.version_option(package_name="webgym-engine")
def main() -> None:
    """webgym-engine: fast asynchronous rollouts for visual web agents."""


@main.command("run")
@click.option("--tasks", "tasks_path", default=str(BUNDLED_TASKS), show_default="bundled tasks",
              help="Task file (JSONL, WebGym schema).")
@click.option("--policy", type=click.Choice(POLICY_NAMES), default="scripted", show_default=True)
@click.option("--concurrency", type=click.IntRange(1), default=32, show_default=True,
              help="Rollouts in flight at once.")
@click.option("--workers", type=click.IntRange(1), default=max(1, os.cpu_count() or 1), show_default=True,
              help="Browser worker processes (one Chromium each).")
@click.option("--mode", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="sync: the naive lock-step baseline, for benchmarks only.")
@click.option("--episodes", type=click.IntRange(1), default=None,
              help="Episodes to run (cycles over the tasks); default: each task once.")
@click.option("--output", "output_dir", default="runs", show_default=True, help="Where run directories go.")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), default=None,
              help="Continue a run directory: tasks that have a record are skipped.")
@click.option("--summary-json", type=click.Path(dir_okay=False), default=None,
              help="Also write the summary as JSON here.")
@click.option("--retry-lost", type=click.IntRange(0), default=1, show_default=True,
              help="Restarts of an episode whose browser worker died.")
@click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True,
              help="Step caps by difficulty: train 10/20/30, test 30/50/70.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--chromium", default=DEFAULT_CHROMIUM, show_default=True, help="Chromium executable.")
@click.option("--jpeg-quality", type=click.IntRange(1, 100), default=80, show_default=True)
@click.option("--settle-timeout", type=float, default=10.0, show_default=True,
              help="Hard cap (s) on one action plus waiting for the page to settle.")
@click.option("--listen", default=None, help="Bind the worker socket here (e.g. tcp://0.0.0.0:5555) "
              "so workers on other hosts can join with `webgym-engine worker --connect`.")
@click.option("--no-spawn", is_flag=True, help="Start no local workers; wait for --workers to connect.")
# --- model backends (--policy openai | hf | vllm | simulated) ---
@click.option("--model", default=None, help="openai: the served model name; hf/vllm: a local model directory.")
@click.option("--base-url", default=None, help="openai: the server's API root, e.g. http://127.0.0.1:8000/v1.")
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True,
              help="openai: environment variable that holds the API key.")
@click.option("--image-transport", type=click.Choice(["data_url", "file_url"]), default="data_url",
              show_default=True, help="openai: send screenshots inline, or as file URLs of the run directory.")
@click.option("--token-ids", is_flag=True,
              help="openai: ask the server (vLLM) for the generated token ids as well as their log-probabilities.")
@click.option("--request-timeout", type=float, default=120.0, show_default=True, help="openai: seconds per request.")
@click.option("--device", default="auto", show_default=True, help="hf: cpu, cuda or auto.")
@click.option("--max-batch", type=click.IntRange(1), default=16, show_default=True,
              help="hf: requests batched into one generate call.")
@click.option("--policy-concurrency", type=click.IntRange(1), default=128, show_default=True,
              help="Cap on policy calls in flight.")
@click.option("--sim-speed", type=float, default=1.0, show_default=True,
              help="simulated: divide the latency model's durations by this.")
# --- agent protocol ---
@click.option("--interaction", type=click.Choice(INTERACTIONS), default="coordinates", show_default=True,
              help="coordinates: screenshot only; som: numbered boxes on the screenshot plus an element list.")
@click.option("--coords", type=click.Choice(COORD_SYSTEMS), default="grid", show_default=True,
              help="grid: 0..1000 (Qwen3-VL); pixels: the smart_resize'd image (Qwen2.5-VL, UI-TARS).")
@click.option("--response-format", type=click.Choice(RESPONSE_FORMATS), default="complete", show_default=True)
@click.option("--context-window", type=click.IntRange(0), default=4, show_default=True,
              help="Past rounds kept as full messages; older ones become one-line summaries.")
@click.option("--prompt-template", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Override prompt templates: a text file (the system prompt) or a JSON object of templates.")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-p", type=float, default=0.99, show_default=True)
@click.option("--top-k", type=int, default=None)
@click.option("--max-tokens", type=click.IntRange(1), default=512, show_default=True)
def run_cmd(tasks_path: str, policy: str, concurrency: int, workers: int, mode: str, episodes: int | None,
            output_dir: str, resume_dir: str | None, summary_json: str | None, retry_lost: int, split: str,
            seed: int, chromium: str, jpeg_quality: int, settle_timeout: float, listen: str | None,
            no_spawn: bool, model: str | None, base_url: str | None, api_key_env: str, image_transport: str,
            token_ids: bool, request_timeout: float, device: str, max_batch: int, policy_concurrency: int,
            sim_speed: float,
            interaction: str, coords: str, response_format: str, context_window: int,
            prompt_template: str | None, temperature: float, top_p: float, top_k: int | None,
            max_tokens: int) -> None:
    """Run tasks with a policy and write a run directory of trajectories."""
    console = Console(stderr=True)
    try:
        agent = AgentConfig(interaction=interaction, response_format=response_format, coords=coords,
                            window=context_window, template_file=prompt_template)
        agent.templates()  # a broken template file fails here, before anything starts
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if not Path(chromium).exists():
        raise click.ClickException(f"Chromium not found at {chromium} (apt-get install chromium)")
    # Validate the task file before anything starts.
    try:
        load_tasks(tasks_path, "http://127.0.0.1")
    except TaskFileError as exc:
        raise click.ClickException(str(exc)) from None
    if resume_dir and not Path(resume_dir, "episodes.jsonl").exists():
        raise click.ClickException(f"{resume_dir} is not a run directory (no episodes.jsonl)")
    cfg = RunConfig(
        tasks=tasks_path, policy=policy, concurrency=concurrency, workers=workers, mode=mode,
        output_dir=output_dir, run_dir=resume_dir, episodes=episodes, split=split, retry_lost=retry_lost,
        seed=seed, listen=listen, spawn_workers=not no_spawn, policy_concurrency=policy_concurrency,
        worker=WorkerConfig(endpoint="", chromium_path=chromium, jpeg_quality=jpeg_quality,
                            settle_timeout_s=settle_timeout),
        agent=agent, sampling=SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                             max_tokens=max_tokens, seed=seed),
        backend=BackendConfig(model=model, base_url=base_url, api_key_env=api_key_env,
                              image_transport=image_transport, token_ids=token_ids, timeout_s=request_timeout,
                              device=device, max_batch=max_batch, sim_speed=sim_speed))
    cfg.run_dir = resume_dir or str(new_run_dir(output_dir))  # file URLs and the manifest need it now
    try:
        policy_obj = make_policy(policy, seed=seed, agent=cfg.agent, sampling=cfg.sampling, backend=cfg.backend,
                                 max_in_flight=policy_concurrency, run_dir=str(Path(cfg.run_dir).resolve()))
    except (ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from None
    needs_sites = SITES_PLACEHOLDER in Path(tasks_path).read_text(encoding="utf-8")
    try:
        summary = _uvloop_run(_run_with_progress(cfg, policy_obj, needs_sites, console))
    except KeyboardInterrupt:
        # Episodes in flight wrote no record: --resume runs them again.
        console.print(f"interrupted; continue with: webgym-engine run --resume {cfg.run_dir}")
        sys.exit(130)
    console.print(summary_table(summary, title=f"run summary: {cfg.run_dir}"))
    if summary_json:
        Path(summary_json).write_text(json.dumps(summary, indent=2))
    if summary["lost"]:
        sys.exit(2)


async def _run_with_progress(cfg: RunConfig, policy: Policy, needs_sites: bool, console: Console) -> dict:
    from engine.sites.server import SiteServer

    progress: list[asyncio.Task] = []

    def on_start(engine, run_dir: Path) -> None:  # type: ignore[no-untyped-def]
        console.print(f"run directory: {run_dir}  ({cfg.policy} policy, {cfg.mode} mode, "
                      f"concurrency {cfg.concurrency}, {cfg.workers} browser workers)")
        progress.append(asyncio.ensure_future(show_progress(engine.stats, console)))

    with contextlib.ExitStack() as stack:
        base_url = stack.enter_context(SiteServer()).base_url if needs_sites else None
        try:
            stats, _ = await run(cfg, policy, base_url, on_start=on_start)
        finally:
            for t in progress:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
    return stats.summary()


@main.command("worker")
@click.option("--connect", required=True, help="The engine's worker endpoint (tcp://HOST:PORT or ipc://PATH).")
@click.option("--worker-id", default=None, help="Name shown in the engine (default: host-pid).")
@click.option("--chromium", default=DEFAULT_CHROMIUM, show_default=True)
def worker_cmd(connect: str, worker_id: str | None, chromium: str) -> None:
    """Start a browser worker by hand (e.g. on another host) and join an engine."""
    import socket

    from browserpool.worker import BrowserWorker
    cfg = WorkerConfig(endpoint=connect, worker_id=worker_id or f"{socket.gethostname()}-{os.getpid()}",
                       chromium_path=chromium)
    sys.exit(_uvloop_run(BrowserWorker(cfg).run()))


@main.command("sites")
@click.option("--port", type=int, default=8000, show_default=True)
def sites_cmd(port: int) -> None:
    """Serve the bundled websites on 127.0.0.1 (to look at them in a browser)."""
    from engine.sites.server import main as serve
    sys.exit(serve(["--port", str(port)]))


if __name__ == "__main__":
    main()
