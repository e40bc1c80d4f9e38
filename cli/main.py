"""The ``webgym-engine`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sys
from collections.abc import Coroutine
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import click
from rich.console import Console

from browserpool.auth import KeyFileError, create_keypair, warn_insecure
from browserpool.config import WorkerConfig
from browserpool.consent import CONSENT_MODES
from cli.console_streams import keep_going_without_a_console
from cli.lazy_group import LazyGroup
from cli.open_files import raise_open_file_limit
from cli.openenv import openenv as openenv_cmd
from cli.options import (
    ObserveKinds,
    check_sockets,
    default_of,
    field_default,
    net_policy_options,
    net_settings,
    traffic_options,
    worker_socket_options,
)
from cli.progress import show_progress, summary_table
from cli.serve import serve as serve_cmd
from cli.serving import require_chromium
from cli.tasks import tasks as tasks_group
from cli.workers import workers_cmd
from engine.agent.model_api import LOGPROBS_KINDS, SamplingParams
from engine.agent.policy_api import Policy
from engine.agent.prompts import (
    ACTION_FORMATS,
    COORD_SYSTEMS,
    INTERACTIONS,
    OBSERVE_KINDS,
    RESPONSE_FORMATS,
    AgentConfig,
)
from engine.clients.runner import load_task_source, run
from engine.core.builders import new_run_dir
from engine.core.config import ORDERS, RunConfig
from engine.core.core import EngineCore
from engine.core.gc_tuning import tune_for_engine_process
from engine.core.shutdown import Terminated, until_signal
from engine.episode.context import MODES, REWARD_MODES
from engine.rewards.judge import JudgeConfig, RubricJudge
from engine.rewards.judge_queue import rejudge
from engine.rewards.programmatic import unrewardable
from engine.store.run_dir import StoreFailed
from engine.store.runlock import RunDirBusy, lock_run_dir
from engine.tasks.miniwob import is_miniwob_spec, miniwob_mount
from engine.tasks.schema import BUNDLED_TASKS, SITES_PLACEHOLDER, Task, TaskFileError
from policy.registry import POLICY_NAMES, BackendConfig, make_judge, make_policy
from train.cli import export as export_cmd
from train.cli import train_loop as train_loop_cmd
from train.cli import train_model as train_model_cmd
from tui.cli import monitor, run_with_tui
from viewer.cli import view as view_cmd

run_default = functools.partial(field_default, "run")
worker_default = functools.partial(field_default, "worker")
T = TypeVar("T")


def _uvloop_run(coro: Coroutine[Any, Any, T]) -> T:
    import uvloop
    return uvloop.run(coro)


def _step_caps(text: str | None) -> tuple[int, int, int] | None:
    """``--step-caps 5,10,15`` as a tuple (RunConfig checks the values)."""
    if text is None:
        return None
    try:
        easy, medium, hard = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--step-caps takes three integers, EASY,MEDIUM,HARD: not {text!r}") from None
    return easy, medium, hard


@click.group(cls=LazyGroup, lazy={"bench": "bench.cli:bench"})  # the benchmarks load only when run
@click.version_option(package_name="webgym-engine")
def main() -> None:
    """webgym-engine: fast asynchronous rollouts for visual web agents."""


@main.command("run")
@click.option("--tasks", "tasks_path", default=str(BUNDLED_TASKS), show_default="bundled tasks",
              help="Task file (WebGym schema, JSONL or JSON), or 'miniwob' / 'miniwob:click-button,...' for "
                   "MiniWoB++ tasks.")
@click.option("--policy", type=click.Choice(POLICY_NAMES), default="scripted", show_default=True)
@click.option("--concurrency", type=click.IntRange(1), default=run_default("concurrency"), show_default=True,
              help="Rollouts in flight at once.")
@click.option("--workers", type=click.IntRange(1), default=run_default("workers"), show_default=True,
              help="Browser worker processes (one Chromium each).")
@click.option("--mode", type=click.Choice(MODES), default=run_default("mode"), show_default=True,
              help="sync: the naive lock-step baseline, for benchmarks only.")
@click.option("--order", type=click.Choice([o.replace("_", "-") for o in ORDERS]),
              default=default_of(RunConfig, "order").replace("_", "-"), show_default=True,
              help="The order episodes start in: those allowed the most steps first (no long episode left to run "
                   "alone at the end), or the task file's. --mode sync always takes the file's.")
@click.option("--episodes", type=click.IntRange(1), default=None,
              help="Episodes to run (cycles over the tasks); default: each task once.")
@click.option("--output", "output_dir", default=run_default("output_dir"), show_default=True,
              help="Where run directories go.")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), default=None,
              help="Continue a run directory: tasks that have a record are skipped.")
@click.option("--summary-json", type=click.Path(dir_okay=False), default=None,
              help="Also write the summary as JSON here.")
@click.option("--retry-lost", type=click.IntRange(0), default=run_default("retry_lost"), show_default=True,
              help="Restarts of an episode whose browser worker died.")
@click.option("--split", type=click.Choice(["train", "test"]), default=run_default("split"), show_default=True,
              help="Step caps by difficulty: train 10/20/30, test 30/50/70.")
@click.option("--step-caps", type=str, default=None, metavar="EASY,MEDIUM,HARD",
              help="Steps allowed per difficulty in this run, instead of the split's (e.g. 5,10,15).")
@click.option("--seed", type=int, default=run_default("seed"), show_default=True)
@click.option("--chromium", default=run_default("chromium"), show_default=True, help="Chromium executable.")
@click.option("--jpeg-quality", type=click.IntRange(1, 100), default=run_default("jpeg_quality"), show_default=True)
@click.option("--settle-timeout", type=float, default=run_default("settle_timeout"), show_default=True,
              help="Hard cap (s) on one action plus waiting for the page to settle.")
@worker_socket_options
@click.option("--telemetry", default=run_default("telemetry"), show_default=True,
              help="Live telemetry for `webgym-engine monitor`: ipc (a socket in the run directory), "
                   "tcp://HOST:PORT (port * = any free one), or off.")
@click.option("--tui", is_flag=True, help="Show the live monitor in this terminal (q closes it; the run goes on).")
# --- model backends (--policy openai | hf | vllm | simulated) ---
@click.option("--model", default=None, help="openai: the served model name; hf/vllm: a local model directory.")
@click.option("--base-url", default=None, help="openai: the server's API root, e.g. http://127.0.0.1:8000/v1.")
@click.option("--api-key-env", default=run_default("api_key_env"), show_default=True,
              help="openai: environment variable that holds the API key.")
@click.option("--image-transport", type=click.Choice(["data_url", "file_url"]), default=run_default("image_transport"),
              show_default=True, help="openai: send screenshots inline, or as file URLs of the run directory.")
@click.option("--token-ids", is_flag=True,
              help="openai: ask the server (vLLM) for the generated token ids as well as their log-probabilities.")
@click.option("--logprobs-of", type=click.Choice(LOGPROBS_KINDS), default=None,
              help="openai: what the server's log-probabilities are of: model (vLLM's default raw_logprobs), "
                   "temperature (SGLang's default), sampler (after truncation). Unset: unknown, and GRPO refuses them.")
@click.option("--request-timeout", type=float, default=run_default("request_timeout"), show_default=True,
              help="openai: seconds per request.")
@click.option("--device", default=run_default("device"), show_default=True, help="hf: cpu, cuda or auto.")
@click.option("--max-batch", type=click.IntRange(1), default=run_default("max_batch"), show_default=True,
              help="hf: requests batched into one generate call.")
@click.option("--policy-concurrency", type=click.IntRange(1), default=run_default("policy_concurrency"),
              show_default=True,
              help="Cap on policy calls in flight.")
@click.option("--sim-speed", type=float, default=run_default("sim_speed"), show_default=True,
              help="simulated: divide the latency model's durations by this.")
# --- agent protocol ---
@click.option("--interaction", type=click.Choice(INTERACTIONS), default=run_default("interaction"),
              show_default=True,
              help="coordinates: screenshot only; som: numbered boxes on the screenshot plus an element list.")
@click.option("--coords", type=click.Choice(COORD_SYSTEMS), default=run_default("coords"),
              show_default=True,
              help="grid: 0..1000 (Qwen3-VL); pixels: the smart_resize'd image (Qwen2.5-VL, UI-TARS).")
@click.option("--response-format", type=click.Choice(RESPONSE_FORMATS),
              default=run_default("response_format"), show_default=True)
@click.option("--action-format", type=click.Choice(ACTION_FORMATS), default=run_default("action_format"),
              show_default=True,
              help="The grammar of the model's replies: qwen (computer_use tool calls: Qwen2/2.5/3-VL), uitars "
                   "(Action: click(start_box=...)), pyautogui (pyautogui code, parsed and never run), browsergym "
                   "(BrowserGym's id-based actions on the accessibility tree: click('12'), fill('7', 'text')...).")
@click.option("--observe", type=ObserveKinds(), default=run_default("observe"), show_default=True,
              help=f"What each step shows the model, comma-separated: {', '.join(OBSERVE_KINDS)} (axtree: the page's "
                   "accessibility tree, ids in brackets; dom: its DOM snapshot, element boxes and visibility, "
                   "recorded and marked on the tree's lines as clickable and visible). axtree alone: a text-only "
                   "prompt (no image), for --action-format browsergym; screenshot,axtree: both (hybrid agents).")
@click.option("--context-window", type=click.IntRange(0), default=run_default("context_window"), show_default=True,
              help="Past rounds kept as full messages; older ones become one-line summaries.")
@click.option("--prompt-template", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Override prompt templates: a text file (the system prompt) or a JSON object of templates.")
@click.option("--temperature", type=float, default=run_default("temperature"), show_default=True)
@click.option("--top-p", type=float, default=run_default("top_p"), show_default=True)
@click.option("--top-k", type=int, default=None)
@click.option("--max-tokens", type=click.IntRange(1), default=run_default("max_tokens"), show_default=True)
# --- rewards ---
@click.option("--reward", type=click.Choice(REWARD_MODES), default=run_default("reward"), show_default=True,
              help="auto: the task's own checks (or the page's reward), else the judge when one is set.")
@click.option("--judge-base-url", default=None, help="The judge's OpenAI-compatible API root.")
@click.option("--judge-model", default=run_default("judge_model"), help="The judge's served model name.")
@click.option("--judge-concurrency", type=click.IntRange(1), default=run_default("judge_concurrency"),
              show_default=True,
              help="Judge calls in flight.")
@click.option("--stragglers", is_flag=True,
              help="Cut the last episodes: once --straggler-fraction of the run has finished, the rest get "
                   "--straggler-grace seconds, then end with an error record that says so.")
@click.option("--straggler-fraction", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True)
@click.option("--straggler-grace", type=click.FloatRange(0), default=run_default("straggler_grace"), show_default=True,
              help="Seconds.")
# --- resource bounds ---
@click.option("--episode-timeout", type=click.FloatRange(0), default=run_default("episode_timeout"), show_default=True,
              help="Wall-clock cap (s) of one episode, retries included; past it the episode ends with an error "
                   "record of kind episode_timeout. 0: no cap.")
@click.option("--policy-step-timeout", type=click.FloatRange(0), default=run_default("policy_step_timeout"),
              show_default=True,
              help="Cap (s) on one policy call, the backend's retries included; past it the episode ends with an "
                   "error record of kind policy_timeout. 0: no cap.")
@click.option("--context-memory-mib", type=click.IntRange(0), default=run_default("context_memory_mib"),
              show_default=True,
              help="A browser context whose page's JS heap is above this when its episode ends is discarded, not "
                   "reused. 0: off.")
@click.option("--page-memory-mib", type=click.IntRange(0), default=run_default("page_memory_mib"),
              show_default=True,
              help="A page's renderer holding more private memory than this while its episode runs is ended, and "
                   "the episode recorded as an error of kind page_memory. 0: off.")
@click.option("--browser-memory-mib", type=click.IntRange(0), default=run_default("browser_memory_mib"),
              show_default=True,
              help="A browser whose process tree (PSS) is above this is recycled between episodes. 0: off.")
# --- websites ---
@click.option("--domain-limit", type=click.IntRange(0), default=run_default("domain_limit"), show_default=True,
              help="Episodes at once on one website (host name); the engine's own sites have no cap. 0: no cap.")
@click.option("--domain-rate", type=click.FloatRange(0), default=run_default("domain_rate"), show_default=True,
              help="Actions (page loads, clicks, typing) per second sent to one website's pages, in bursts of at "
                   "most that many; the engine's own sites have no cap. 0: no cap.")
@click.option("--blocklist", "blocklist_path", type=click.Path(dir_okay=False), default=None,
              help="The blocklist file (shared by several runs); default: blocklist.json in the run directory.")
@click.option("--blocklist-hours", type=click.FloatRange(0, min_open=True), default=12.0, show_default=True,
              help="How long a domain that blocked the agent is skipped.")
# --- traffic (docs/repeatable.md) ---
@traffic_options
@click.option("--traffic-group", type=click.IntRange(0), default=run_default("traffic_group"), show_default=True,
              help="GRPO groups of this many samples per task: each group's first member records, the others "
                   "replay its start page (what they load beyond it comes live). 0: off.")
@click.option("--proxy", "proxies", multiple=True, metavar="URL",
              help="An upstream proxy for the pages, http://[$USER_VAR:$PASS_VAR@]HOST:PORT (credentials named by "
                   "environment variables). Repeatable: each browser context sticks to one, a failing one rotates out.")
@click.option("--proxy-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A file of proxy URLs, one per line (# comments), as --proxy.")
@click.option("--user-agent", default=None,
              help="The browsers' User-Agent (default: headless Chromium's own; docs/open-web.md).")
@click.option("--consent", type=click.Choice(CONSENT_MODES), default=run_default("consent"),
              show_default=True,
              help="Answer a standard consent manager's cookie wall before the first screenshot (recorded in the "
                   "episode's open_events). Off: the model sees the wall as a person would.")
@click.option("--block-requests", "request_rules", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Refuse the requests of the hosts in this hosts file or EasyList file (ads, trackers; domain "
                   "rules). Repeatable. Off by default: it changes what pages show.")
@net_policy_options
def run_cmd(**opts: Any) -> None:
    """Run tasks with a policy and write a run directory of trajectories."""
    o = SimpleNamespace(**opts)
    if not o.tui:  # the monitor draws on the terminal itself
        keep_going_without_a_console()
    console = Console(stderr=True)
    try:
        agent = AgentConfig(interaction=o.interaction, response_format=o.response_format, coords=o.coords,
                            action_format=o.action_format, observe=o.observe, window=o.context_window,
                            template_file=o.prompt_template)
        agent.templates()  # a broken template file fails here, before anything starts
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    require_chromium(o.chromium)
    # Validate the tasks before anything starts.
    miniwob = is_miniwob_spec(o.tasks_path)
    try:
        tasks = load_task_source(o.tasks_path, "http://127.0.0.1")
    except (TaskFileError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if o.resume_dir and not Path(o.resume_dir, "episodes.jsonl").exists():
        raise click.ClickException(f"{o.resume_dir} is not a run directory (no episodes.jsonl)")
    net = net_settings(net_policy=o.net_policy, allow_private_network=o.allow_private_network, net_allow=o.net_allow,
                       net_deny=o.net_deny)
    proxies = _proxy_list(o.proxies, o.proxy_file)
    try:
        cfg = RunConfig(
            tasks=o.tasks_path, concurrency=o.concurrency, workers=o.workers, mode=o.mode,
            order=o.order.replace("-", "_"),
            output_dir=o.output_dir, run_dir=o.resume_dir, episodes=o.episodes, split=o.split,
            step_caps=_step_caps(o.step_caps),
            retry_lost=o.retry_lost, seed=o.seed, listen=o.listen, spawn_workers=not o.no_spawn,
            server_key=o.server_key, allow_keys=o.allow_keys, insecure=o.insecure,
            policy_concurrency=o.policy_concurrency,
            worker=WorkerConfig(endpoint="", chromium_path=o.chromium, jpeg_quality=o.jpeg_quality,
                                settle_timeout_s=o.settle_timeout, context_memory_mib=o.context_memory_mib,
                                browser_memory_mib=o.browser_memory_mib, page_memory_mib=o.page_memory_mib,
                                net=net, proxies=proxies,
                                request_rules=[str(Path(r).resolve()) for r in o.request_rules],
                                user_agent=o.user_agent, consent=o.consent),
            reward=o.reward, secret_env=tuple(dict.fromkeys(["OPENAI_API_KEY", o.api_key_env])),
            straggler_fraction=o.straggler_fraction if o.stragglers else None,
            straggler_grace_s=o.straggler_grace, telemetry=o.telemetry,
            episode_timeout_s=o.episode_timeout, policy_step_timeout_s=o.policy_step_timeout,
            domain_limit=o.domain_limit, domain_rate=o.domain_rate, blocklist=o.blocklist_path,
            blocklist_ttl_s=o.blocklist_hours * 3600, record_traffic=o.record_traffic,
            replay_traffic=o.replay_traffic, traffic_miss=o.traffic_miss, traffic_group=o.traffic_group)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if o.reward == "judge" and not o.judge_base_url:
        raise click.ClickException("--reward judge needs --judge-base-url and --judge-model")
    sampling = SamplingParams(temperature=o.temperature, top_p=o.top_p, top_k=o.top_k, max_tokens=o.max_tokens,
                              seed=o.seed)
    backend = BackendConfig(model=o.model, base_url=o.base_url, api_key_env=o.api_key_env,
                            image_transport=o.image_transport, token_ids=o.token_ids, logprobs_of=o.logprobs_of,
                            timeout_s=o.request_timeout,
                            device=o.device, max_batch=o.max_batch, sim_speed=o.sim_speed)
    check_sockets(cfg, console)
    if o.tui and cfg.telemetry is None:
        raise click.ClickException("--tui needs telemetry (not --telemetry off)")
    cfg.run_dir = o.resume_dir or str(new_run_dir(o.output_dir))  # file URLs and the manifest need it now
    # Verdicts are cached beside the run directories, shared by runs.
    judge_cfg = JudgeConfig(base_url=o.judge_base_url, model=o.judge_model, concurrency=o.judge_concurrency,
                            seed=o.seed, cache_dir=str(Path(cfg.run_dir).parent / "judge-cache"))
    try:
        # One writer per run directory: a second `run --resume` (or a `judge`) of a live run stops here, before
        # anything starts. Held until this process ends (the run's store takes it again, re-entrantly).
        lock_run_dir(cfg.run_dir)
    except RunDirBusy as exc:
        raise click.ClickException(str(exc)) from None
    try:
        policy = make_policy(o.policy, seed=o.seed, agent=agent, sampling=sampling, backend=backend,
                             max_in_flight=o.policy_concurrency, run_dir=str(Path(cfg.run_dir).resolve()))
        judge = make_judge(judge_cfg) if judge_cfg.base_url and o.reward != "program" else None
    except (ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from None
    warning = unrewardable_warning(tasks, judge is not None, o.reward)
    if warning:  # before anything starts, on a terminal or not
        console.print(warning, style="bold yellow", soft_wrap=True, markup=False, highlight=False)
    # The bundled sites' server also serves MiniWoB++'s pages.
    if miniwob:
        sites: dict[str, Path] | None = miniwob_mount()
    else:
        sites = {} if SITES_PLACEHOLDER in Path(o.tasks_path).read_text("utf-8") else None
    try:
        coro = _run_with_progress(cfg, policy, judge, sites, console, show=not o.tui,
                                  manifest={"policy": o.policy, "backend": asdict(backend),
                                            "judge": asdict(judge_cfg)})
        # SIGTERM and SIGHUP are handled like Ctrl-C (engine.core.shutdown).
        tune_for_engine_process()
        raise_open_file_limit()
        try:
            summary = _uvloop_run(until_signal(run_with_tui(coro, cfg.run_dir) if o.tui else coro))
        finally:  # the monitor is done with the terminal, which may have gone away: what follows must not fail on it
            keep_going_without_a_console()
    except (KeyboardInterrupt, Terminated) as exc:
        # Episodes in flight wrote no record: --resume runs them again (and removes their partial frames).
        what = f"stopped by {exc.name}" if isinstance(exc, Terminated) else "interrupted"
        console.print(f"{what}; episodes in flight were left for --resume; "
                      f"continue with: webgym-engine run --resume {cfg.run_dir}")
        sys.exit(exc.exit_code if isinstance(exc, Terminated) else 130)
    except StoreFailed as exc:
        console.print(f"the run stopped: {exc}. Episodes without a record were left for --resume; once there is "
                      f"room (or whatever failed is fixed), continue with: webgym-engine run --resume {cfg.run_dir}")
        sys.exit(2)
    console.print(summary_table(summary, title=f"run summary: {cfg.run_dir}"))
    if o.summary_json:
        Path(o.summary_json).write_text(json.dumps(summary, indent=2))
    if summary["lost"]:
        sys.exit(2)


def unrewardable_warning(tasks: list[Task], judge_configured: bool, reward: str) -> str | None:
    """The warning line ``run`` prints when some tasks cannot be rewarded
    (:func:`engine.rewards.programmatic.unrewardable`): how many, why, and which flag fixes it; None when every task
    can be."""
    found = unrewardable(tasks, judge_configured, reward)
    if not found:
        return None
    head = f"warning: {len(found)} of {len(tasks)} tasks cannot be rewarded"
    tail = "their episodes will be recorded as unrewarded (no reward value, never a failure)"
    if judge_configured:
        return (f"{head}: no programmatic checks, no page reward and nothing for the judge to check (no rubric "
                f"facts, no reference answer); {tail}")
    judge = "--judge-base-url URL --judge-model NAME"
    fix = (f"run with --reward auto and {judge} (--reward program asks no judge)" if reward == "program"
           else f"give a judge with {judge}, or judge the run later with `webgym-engine judge RUN_DIR`")
    return f"{head}: no programmatic checks, no page reward and no judge configured; {tail}. To reward them, {fix}"


def _proxy_list(urls: tuple[str, ...], path: str | None) -> list[str]:
    """The upstream proxies of --proxy and --proxy-file, checked (credential variables set) before anything starts."""
    from browserpool.upstream import parse_proxy

    found = list(urls)
    if path is not None:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        found += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    for url in found:
        try:
            parse_proxy(url)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    return found


async def _run_with_progress(cfg: RunConfig, policy: Policy, judge: RubricJudge | None,
                             sites: dict[str, Path] | None, console: Console, show: bool = True,
                             manifest: dict[str, Any] | None = None) -> dict:
    """Run with a progress display (unless ``show`` is off: the monitor shows the run);
    ``sites``: the site server's extra mounts, or None for no site server."""
    from engine.sites.server import SiteServer

    progress: list[asyncio.Task] = []

    def on_start(core: EngineCore, run_dir: Path) -> None:
        if not show:
            return
        console.print(f"run directory: {run_dir}  ({policy.name} policy, {cfg.mode} mode, "
                      f"concurrency {cfg.concurrency}, {cfg.workers} browser workers)")
        progress.append(asyncio.ensure_future(show_progress(core.stats, console)))

    with contextlib.ExitStack() as stack:
        base_url = stack.enter_context(SiteServer(mounts=sites)).base_url if sites is not None else None
        try:
            stats, _ = await run(cfg, policy, base_url, judge=judge, on_start=on_start, manifest=manifest)
        finally:
            for t in progress:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
    return stats.summary()


main.add_command(tasks_group)
main.add_command(serve_cmd)
main.add_command(openenv_cmd)
main.add_command(workers_cmd)
main.add_command(monitor)
main.add_command(view_cmd)
main.add_command(export_cmd)
main.add_command(train_model_cmd)
main.add_command(train_loop_cmd)


@main.command("judge")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--judge-base-url", required=True, help="The judge's OpenAI-compatible API root.")
@click.option("--judge-model", required=True, help="The judge's served model name.")
@click.option("--all", "judge_all", is_flag=True,
              help="Judge every episode that reached its end again, not only the pending and unrewarded ones.")
@click.option("--judge-concurrency", type=click.IntRange(1), default=16, show_default=True)
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Verdict cache (default: judge-cache beside the run directory).")
def judge_cmd(run_dir: Path, judge_base_url: str, judge_model: str, judge_all: bool, judge_concurrency: int,
              cache_dir: str | None) -> None:
    """(Re)judge the episodes of a finished run: those still pending or unrewarded, or all with --all."""
    if not (run_dir / "episodes.jsonl").exists():
        raise click.ClickException(f"{run_dir} is not a run directory (no episodes.jsonl)")
    cfg = JudgeConfig(base_url=judge_base_url, model=judge_model, concurrency=judge_concurrency,
                      cache_dir=cache_dir or str(run_dir.resolve().parent / "judge-cache"))
    try:
        lock_run_dir(run_dir)  # judgements.jsonl has one writer: not while the run (or another judge) is live
    except RunDirBusy as exc:
        raise click.ClickException(str(exc)) from None
    try:
        counts = _uvloop_run(until_signal(rejudge(run_dir, make_judge(cfg), judge_all)))
    except Terminated as exc:
        # Verdicts already appended stay; the rest stay pending for the next `judge`.
        Console(stderr=True).print(f"stopped by {exc.name}; judge the rest with: webgym-engine judge {run_dir} ...")
        sys.exit(exc.exit_code)
    except StoreFailed as exc:
        Console(stderr=True).print(f"stopped: {exc}. The episodes without a verdict stay pending; make room, then "
                                   f"judge them with: webgym-engine judge {run_dir} ...")
        sys.exit(1)
    Console(stderr=True).print(f"judged {counts['judged']} episodes of {run_dir}: {counts['success']} succeeded, "
                               f"{counts['failure']} failed, {counts['unrewarded']} unrewarded, "
                               f"{counts['blocked']} blocked, {counts['pending']} still pending")
    if counts["pending"]:
        sys.exit(1)


@main.command("worker")
@click.option("--connect", required=True, help="The engine's worker endpoint (tcp://HOST:PORT or ipc://PATH).")
@click.option("--worker-id", default=None, help="Name shown in the engine (default: host-pid).")
@click.option("--chromium", default=worker_default("chromium"), show_default=True)
@click.option("--server-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="CURVE: the engine's public key file (its NAME.key).")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="CURVE: this worker's secret key file (NAME.key_secret; its NAME.key in the engine's --allow-keys).")
@click.option("--insecure", is_flag=True, help="Connect over tcp without CURVE authentication.")
@click.option("--net-deny", multiple=True, metavar="ENTRY",
              help="Refuse page loads from ENTRY on this worker, on top of the engine's network policy (which the "
                   "worker takes from the engine when it joins). Repeatable.")
def worker_cmd(connect: str, worker_id: str | None, chromium: str, server_key: str | None, key: str | None,
               insecure: bool, net_deny: tuple[str, ...]) -> None:
    """Start a browser worker by hand (e.g. on another host) and join an engine.

    The worker's pages follow the engine's network policy; --net-deny can only narrow it."""
    import socket

    from browserpool.worker import main as worker_main
    args = ["--connect", connect, "--worker-id", worker_id or f"{socket.gethostname()}-{os.getpid()}"]
    cfg = WorkerConfig(endpoint=connect, chromium_path=chromium, net=net_settings(net_deny=net_deny))
    args += ["--config", cfg.to_json()]
    args += ["--server-key", server_key] if server_key else []
    args += ["--key", key] if key else []
    args += ["--insecure"] if insecure else []
    if connect.startswith("tcp://") and not (server_key and key):
        if not insecure:
            raise click.ClickException("tcp needs CURVE keys: --server-key ENGINE.key --key WORKER.key_secret "
                                       "(see `webgym-engine keys`), or --insecure")
        Console(stderr=True).print(warn_insecure(connect, "this worker"))
    sys.exit(worker_main(args))


@main.command("keys")
@click.argument("name")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default="keys", show_default=True,
              help="Where the key files go (created with mode 0700).")
def keys_cmd(name: str, directory: str) -> None:
    """Create a CURVE key pair NAME.key (public) and NAME.key_secret (secret), both mode 0600.

    The engine binds with its secret key (run --server-key keys/engine.key_secret) and lets in the public keys
    of --allow-keys (copy each worker's NAME.key there); a worker connects with the engine's public key and
    its own secret key (worker --server-key engine.key --key NAME.key_secret)."""
    try:
        public, secret = create_keypair(directory, name)
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"public key: {public}\nsecret key: {secret} (keep it on this host)")


@main.command("sites")
@click.option("--port", type=int, default=8000, show_default=True)
def sites_cmd(port: int) -> None:
    """Serve the bundled websites on 127.0.0.1 (to look at them in a browser)."""
    from engine.sites.server import main as serve
    sys.exit(serve(["--port", str(port)]))


if __name__ == "__main__":
    main()
