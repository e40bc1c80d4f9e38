"""Reinforcement learning through the engine, on the CPU: GRPO makes a tiny Qwen-VL better on boards it never saw.

The task family is the colour board (:mod:`train.examples.colour_board`): "Click the red square, then Submit." on a
4 x 2 grid of cells whose layout varies (where the red square is, which other colours stand where). Layouts are
split into disjoint sets: demonstrations, validation, RL training and a held-out evaluation that nothing trains on.

1. A tiny random Qwen3-VL-architecture model is built offline (:func:`policy.tiny_models.build_tiny_model`).
2. Behaviour-cloning warm start on a careless demonstrator (:func:`careless_demonstrations`): it picks the red
   square every time, then answers "done" instead of pressing Submit in most of its attempts. The scripted policy
   plays the boards through the engine, its runs become demonstrations in the model's reply format
   (:mod:`train.demos`), and the trainer fits the picks until the validation boards show them learnt, then every
   step until the validation boards' estimated success is partial (:func:`warm_start`). The warm-started policy
   finds the red square and then often stops short: a partial success, S0, measured on the held-out boards in
   step 3.
3. Three runs of the RL loop (:func:`train.loop.run_loop`, exactly as ``webgym-engine train CONFIG`` runs it;
   each run's config is written to the work directory) from that checkpoint, with the same layouts, seeds and
   budget: GRPO in ``mode = "async"``, the policy served over HTTP, new weights pushed after every update,
   staleness bound 1, decoupled importance sampling. The server: vLLM itself when the caller gives one (``vllm``
   of :func:`run_demo`: the warm start is pushed into it before each run; the test suite serves vLLM's CPU build),
   else the stand-in for vLLM (``policy = "stand_in"``: :mod:`policy.served_stand_in`, the ``hf`` backend behind
   vLLM's OpenAI API and weight-transfer endpoints, started by the loop):

   - ``grpo``: AsyncWebRL's ``1/k`` normaliser;
   - ``control``: the same, with the rewards shuffled inside each group (the updates keep their sizes and carry
     no reward signal): it must not rise;
   - ``tau``: the ``1/|tau|`` normaliser (AsyncWebRL reports that ``1/k`` shortens episodes at equal success).

   The first run's loop evaluates the held-out boards before its first update (S0: the checkpoint every run
   starts from, evaluated once) and each run's after its last (S1), one episode per board at the rollouts'
   temperature (1.0): the success of the policy as it acts.
4. The result (:meth:`DemoResult.to_dict`): S0, S1 and the gain of each run with its 95% interval (paired over the
   held-out boards), mean episode lengths, and every iteration's figures (success, episode length, importance
   weight, clip and dropped-token fractions, staleness, policy version).

Run: ``python -m train.examples.grpo_demo [--work DIR] [--json FILE]``; ``python -m bench.grpo_demo`` stores the
result in ``docs/benchmarks/grpo_demo.json`` with its plot. ``--quick`` is the test suite's smaller version.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.examples import colour_board

if TYPE_CHECKING:
    from engine.store.records import EpisodeRecord, StepRecord
    from train.evaluation import Evaluation

#: A one-line system prompt and a first message without the URL (the default ones are long, and the URL would
#: name the layout): short sequences for a CPU.
TEMPLATES = {"system": "You are a web agent. Reply with Action: and one <tool_call>.\n", "first_user": "Task: $task"}
RUNS = ("grpo", "control", "tau")  # see the module docstring
SERVED_NAME = "policy"  # the model name a vLLM server serves the demonstration's policy under


@dataclass(frozen=True)
class DemoConfig:
    """Sizes and settings of the demonstration (the defaults are the full run; :meth:`quick` the tests')."""

    red_cell: int | None = None  # colour_board.Boards: None, the red square anywhere; a cell, always there
    demo_boards: int = 200
    validation_boards: int = 64
    train_boards: int = 32
    heldout_boards: int = 64
    # The model
    arch: str = "qwen3_vl"
    hidden_size: int = 128
    layers: int = 2
    max_pixels: int = 32 * 32 * 40  # 8 x 5 image tokens for a 1280 x 720 screenshot
    model_seed: int = 0
    # Behaviour cloning on a careless demonstrator: it picks the red square every time, then answers instead of
    # pressing Submit in a share `careless` of its attempts (see careless_demonstrations). The warm start learns the
    # picks until its greedy first click picks the red square on `warm_start_accuracy` of the validation boards,
    # then trains on every step until the validation boards' estimated success is partial (see warm_start).
    careless: float = 0.5
    # The share of demonstration boards whose second step (the finish) is trained on: the pick is what takes a tiny
    # model long to learn, and the finish is learnt from a few dozen boards.
    finish_share: float = 0.3
    warm_start_accuracy: float = 0.9
    bc_max_steps: int = 500
    bc_settle_steps: int = 100
    bc_check_every: int = 25
    bc_lr: float = 2e-3
    # The settle phase stops at the first check (every `bc_settle_check_every` steps) whose estimated success on
    # the validation boards lies in this band. Measured: a tiny model's finish does not settle at the
    # demonstrator's mixture; it goes from never submitting (after the picks, which all start "Click") to nearly
    # always, swinging within a few steps (one probe: 14% of the validation boards submitted at settle step 35, 91%
    # at 45, 14% at 50). Early stopping on validation, not a step count, sets a partial S0; when no check falls in
    # the band, the checked weights nearest to its centre are taken.
    warm_start_success: tuple[float, float] = (0.12, 0.3)
    bc_settle_check_every: int = 5
    bc_settle_lr: float = 5e-4
    bc_settle_batch: int = 64
    bc_batch: int = 16
    # GRPO
    iterations: int = 10
    group_size: int = 8
    groups_per_iteration: int = 8
    lr: float = 2e-4
    batch_size: int = 16
    # Two steps: the pick, then Submit or not. Measured from one warm start of the quick version: with a third
    # step, the failures that click the red square again train its pick with a negative advantage, and the held-out
    # gain swung (+0.15 and +0.00 at lr 1e-4 and 3e-4); with two, the pick is the same in every episode of a group,
    # its advantages cancel, and four runs at lr 2e-4 gained +0.35 to +0.54.
    step_cap: int = 2
    staleness: int = 1
    concurrency: int = 16
    runs: tuple[str, ...] = RUNS
    cpu_threads: int = 1

    @property
    def boards(self) -> colour_board.Boards:
        return colour_board.Boards(self.red_cell)

    @classmethod
    def quick(cls) -> DemoConfig:
        """The test suite's version: the red square always in the first cell (the pick is learnt at once, which is
        most of the warm start's time), fewer boards, the GRPO run and its control. 64 held-out boards: the paired
        gain's 95% interval is about +-0.12 wide there (+-0.16 on 48, where a run that gained +0.17 had an interval
        reaching below 0); the checkpoint both runs start from is evaluated once, so the three evaluations cost
        what four on 48 boards did."""
        return cls(red_cell=0, demo_boards=64, validation_boards=24, train_boards=16, heldout_boards=64,
                   bc_max_steps=100, bc_settle_steps=60, iterations=6, groups_per_iteration=6,
                   runs=("grpo", "control"),
                   # The settle phase unchecked: 60 steps of 16 (the red square's fixed cell makes the band's early
                   # stop unneeded; the samples' fixed order makes these weights the same on every run).
                   bc_settle_batch=16, bc_settle_check_every=0)


@dataclass
class RunSummary:
    """One RL run: held-out success before (S0) and after (S1) with the paired gain, and its iterations."""

    name: str
    config: str  # the `webgym-engine train` config it ran
    start: dict[str, Any]  # train.evaluation.Evaluation.to_dict(), without per-task lists
    end: dict[str, Any]
    gain: dict[str, Any]  # train.evaluation.PairedGain.to_dict()
    iterations: list[dict[str, Any]]
    wall_s: float


@dataclass
class DemoResult:
    """What :func:`run_demo` measured."""

    config: DemoConfig
    warm_start: dict[str, Any]  # steps trained, validation success at each checkpoint, the chosen one
    runs: dict[str, RunSummary]
    times_s: dict[str, float] = field(default_factory=dict)
    # Each other run's S1 less the control's, paired over the held-out boards (train.evaluation.PairedGain.to_dict()):
    # what the reward, and nothing else, made of the same checkpoint, seeds and budget.
    versus_control: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "warm_start": self.warm_start,
                "runs": {k: asdict(v) for k, v in self.runs.items()}, "times_s": self.times_s,
                "versus_control": self.versus_control}

    def report(self) -> str:
        w, v = self.warm_start, self.warm_start["validation"]
        lines = [f"warm start: {w['pick_steps']} + {w['settle_steps']} behaviour-cloning steps; on the validation "
                 f"boards: picks {v['accuracy']:.0%}, submits {v['submit']:.0%}, estimated success {v['success']:.0%}"]
        for name, run in self.runs.items():
            s0, s1, g = run.start, run.end, run.gain
            lines.append(f"{name:8s} S0 {s0['success_rate']:.1%} -> S1 {s1['success_rate']:.1%}: gain "
                         f"{_gain_text(g)} ({g['episodes']} episodes); mean steps {s0['mean_steps']:.2f} -> "
                         f"{s1['mean_steps']:.2f}; {run.wall_s:.0f} s")
        for name, g in self.versus_control.items():
            lines.append(f"{name} S1 - control S1: {_gain_text(g)}")
        lines.append("times: " + ", ".join(f"{k} {v:.0f} s" for k, v in self.times_s.items()))
        return "\n".join(lines)


def _gain_text(gain: dict[str, Any]) -> str:
    """A paired gain (train.evaluation.PairedGain.to_dict()) as '+0.500 [95% +0.300, +0.700] over 64 boards'."""
    low, high = gain["interval_95"]
    return f"{gain['gain']:+.3f} [95% {low:+.3f}, {high:+.3f}] over {gain['tasks']} boards"


# ---------------------------------------------------------------------------------------------- phases


def agent_table(work: Path) -> dict[str, Any]:
    """The agent protocol of every phase (``[train.agent]``): coordinates on the 0..1000 grid, the vanilla reply,
    no screenshot history, :data:`TEMPLATES`."""
    path = work / "templates.json"
    path.write_text(json.dumps(TEMPLATES), encoding="utf-8")
    return {"response_format": "vanilla", "window": 0, "template_file": str(path)}


async def scripted_runs(task_files: Sequence[Path], out: Path, base_url: str) -> list[Path]:
    """The scripted policy (the boards' reference solutions) on each task file; their run directories."""
    from engine.clients.runner import run
    from engine.core.config import RunConfig
    from policy.registry import make_policy

    dirs = []
    for tasks in task_files:
        cfg = RunConfig(tasks=str(tasks), output_dir=str(out), concurrency=8, workers=1, telemetry=None)
        _, run_dir = await run(cfg, make_policy("scripted"), base_url)
        dirs.append(Path(run_dir))
    return dirs


@dataclass(frozen=True)
class Validation:
    """The warm start's check on the validation boards, without episodes: the model's replies to the prompts of the
    careful demonstrations' two steps, greedy (has the pick been learnt) and sampled at temperature 1, as the
    rollouts sample (what their success will be)."""

    accuracy: float  # greedy first clicks on the red cell
    submit: float  # sampled second replies that click Submit
    success: float  # boards whose sampled first click picks the red cell and sampled second one Submit: the
    # rollouts' success, estimated (the sampled pick misses more often than the greedy one)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def validate(model_dir: Path, boards: list[tuple[EpisodeRecord, Path, int]], seed: int) -> Validation:
    """:class:`Validation` of ``model_dir`` on ``boards`` (a careful demonstration's record, its run directory, the
    red cell)."""
    from engine.agent.coords import CoordFrame, parse_action
    from engine.agent.model_api import ChatRequest, SamplingParams
    from engine.store.run_dir import frame_file
    from policy.hf_backend import HFModel

    def request(record: EpisodeRecord, run_dir: Path, index: int, temperature: float) -> ChatRequest:
        step = record["steps"][index]
        images = {p["image"]: frame_file(run_dir, p["image"]).read_bytes()
                  for m in step["messages"] for p in m["content"] if isinstance(p, dict) and "image" in p}
        messages = [{"role": "system", "content": record["system_prompt"]}, *step["messages"]]
        return ChatRequest(f"{record['episode_id']}/{index}/t{temperature:g}", messages, images,
                           SamplingParams(temperature=temperature, max_tokens=128, seed=seed))

    async def replies() -> list[list[str]]:
        model = HFModel(str(model_dir), device="cpu", max_batch=32)
        await model.start()
        try:
            asked = [[request(r, d, index, temperature) for r, d, _ in boards]
                     for index, temperature in ((0, 0.0), (0, 1.0), (1, 1.0))]  # greedy pick, sampled pick, finish
            texts = [g.text for g in await asyncio.gather(*(model.generate(q) for qs in asked for q in qs))]
            return [texts[i * len(boards):(i + 1) * len(boards)] for i in range(len(asked))]
        finally:
            await model.close()

    frame = CoordFrame("grid", *colour_board.VIEWPORT)

    def picks(reply: str, goal: int) -> bool:
        action, _ = parse_action(reply, frame)
        return action.x is not None and action.y is not None and colour_board.cell_at(action.x, action.y) == goal

    def submits(reply: str) -> bool:
        action, _ = parse_action(reply, frame)
        return action.x is not None and action.y is not None and colour_board.on_submit(action.x, action.y)

    greedy, sampled, finishes = asyncio.run(replies())
    goals = [goal for _, _, goal in boards]
    n = max(1, len(boards))
    submitted = [submits(f) for f in finishes]
    both = sum(picks(s, g) and ok for s, g, ok in zip(sampled, goals, submitted, strict=True))
    return Validation(sum(picks(p, g) for p, g in zip(greedy, goals, strict=True)) / n, sum(submitted) / n, both / n)


def careless_demonstrations(cfg: DemoConfig, proc: Any, demo_run: Path, agent: Any,
                            resize: dict[str, int] | None) -> Any:
    """The warm start's samples: a careless demonstrator's steps on the demonstration boards.

    The scripted policy picked the red square and pressed Submit on every board (``demo_run``). The careless
    demonstrator does the same, except that in a share ``cfg.careless`` of its attempts it answers "done" after the
    pick instead of pressing Submit (the episode ends unrewarded). Its second step sees the page the pick left, so
    it has the same prompt either way: each of the ``finish_share`` boards trained on the finish gives two samples
    of that prompt, the Submit click weighted ``1 - careless`` and the answer weighted ``careless``: the data of
    many attempts per board, without running them. (Its best fit would be the demonstrator's mixture; a tiny model
    does not settle there within a warm start, see :attr:`DemoConfig.warm_start_success`.)"""
    from engine.store.run_dir import read_manifest, read_records
    from train.demos import demonstration_record
    from train.samples import SampleSet, samples_from_records

    rng = random.Random(cfg.model_seed)
    manifest = read_manifest(demo_run)
    careful, answered = [], []
    # In board order, not the runs' completion order: the same samples in the same batches on every run.
    for record in sorted(read_records(demo_run), key=lambda r: r["task"]["task_id"]):
        careful.append(demonstration_record(record, demo_run, agent, resize=resize, manifest=manifest))
        if rng.random() < cfg.finish_share:
            careless = copy.deepcopy(record)
            careless["steps"] = careless["steps"][:2]
            careless["steps"][1]["action"] = {"name": "answer", "text": "done"}
            answered.append(demonstration_record(careless, demo_run, agent, resize=resize, manifest=manifest))
    finishes = {str(r["episode_id"]) for r in answered}

    def submit(_run: int, record: EpisodeRecord, step: StepRecord) -> float | None:
        if step.get("step") == 0:
            return 1.0
        return 1.0 - cfg.careless if str(record["episode_id"]) in finishes else None

    def answer(_run: int, _record: EpisodeRecord, step: StepRecord) -> float | None:
        return cfg.careless if step.get("step") == 1 else None

    out = SampleSet()
    samples_from_records(proc, careful, demo_run, select=submit, out=out)
    samples_from_records(proc, answered, demo_run, select=answer, out=out)
    return out


def warm_start(cfg: DemoConfig, work: Path, model_dir: Path, demo_run: Path, validation_run: Path,
               agent: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Behaviour cloning on the careless demonstrations (:func:`careless_demonstrations`), in two phases: the picks
    alone until the validation check (:func:`validate`, every ``bc_check_every`` steps, at most ``bc_max_steps``)
    finds them learnt (``warm_start_accuracy``), then every step (picks and finishes) at a quarter of the rate
    until a check (every ``bc_settle_check_every`` steps, at most ``bc_settle_steps``) estimates the validation
    boards' success within ``warm_start_success`` (the pick, what takes a tiny model long, learns faster alone;
    the finish moves from never submitting towards the demonstrator's mixture and passes through the band). The
    checkpoint and its figures; every check is in ``checks``."""
    from engine.agent.prompts import AgentConfig
    from policy.vision import resize_of
    from train.config import TrainConfig
    from train.demos import demonstration_records
    from train.samples import Processing, SampleSet
    from train.trainer import train

    proc = Processing.load(model_dir)
    resize = resize_of(proc.vision)
    agent_cfg = AgentConfig(**agent)
    samples = careless_demonstrations(cfg, proc, demo_run, agent_cfg, resize)
    picks = SampleSet([x for x in samples.samples if x.step == 0])
    goals = {colour_board.task_id(s): cfg.boards.layout(s).goal_cell
             for s in cfg.boards.split(cfg_sizes(cfg))[1]}
    boards = sorted(((r, validation_run, goals[r["task"]["task_id"]])
                     for r in demonstration_records(validation_run, agent_cfg, only_success=True, resize=resize)),
                    key=lambda b: b[0]["task"]["task_id"])
    checks: list[dict[str, Any]] = []

    def check(phase: str, checkpoint: Path, step: int) -> Validation:
        v = validate(checkpoint, boards, cfg.model_seed)
        checks.append({"phase": phase, "step": step, "checkpoint": str(checkpoint), **v.to_dict()})
        return v

    def picks_learnt(checkpoint: Path, step: int) -> bool:
        return check("picks", checkpoint, step).accuracy >= cfg.warm_start_accuracy

    def partial_success(checkpoint: Path, step: int) -> bool:
        v = check("settle", checkpoint, step)
        low, high = cfg.warm_start_success
        return low <= v.success <= high  # success: the pick and the Submit both right

    def config(model: Path, out: str, lr: float, steps: int, save_every: int, batch: int) -> TrainConfig:
        return TrainConfig(model_dir=str(model), output_dir=str(work / out), algorithm="fbc", lr=lr, warmup_steps=10,
                           schedule="constant", max_steps=steps, batch_size=batch, save_every=save_every,
                           save_dtype="float32", cpu_threads=cfg.cpu_threads, seed=cfg.model_seed, progress=False,
                           log_every=10, tensorboard=False, plots=False, agent=agent_cfg)

    imitated = train(config(model_dir, "warm-start-picks", cfg.bc_lr, cfg.bc_max_steps, cfg.bc_check_every,
                            cfg.bc_batch), picks, stop_at=picks_learnt)
    assert imitated.checkpoint is not None
    learnt = bool(checks) and checks[-1]["accuracy"] >= cfg.warm_start_accuracy
    settled = train(config(imitated.checkpoint, "warm-start", cfg.bc_settle_lr, cfg.bc_settle_steps,
                           cfg.bc_settle_check_every, cfg.bc_settle_batch), samples,
                    stop_at=partial_success)
    assert settled.checkpoint is not None
    final = checks[-1]
    if (final["phase"], final["step"]) != ("settle", settled.steps):  # no check fell in the band: the checked
        check("settle", settled.checkpoint, settled.steps)           # weights nearest to its centre
        centre = sum(cfg.warm_start_success) / 2
        final = min((c for c in checks if c["phase"] == "settle"), key=lambda c: abs(c["success"] - centre))
    return Path(final["checkpoint"]), {"demonstrations": len(samples.samples), "pick_steps": imitated.steps,
                                "settle_steps": final["step"], "checks": checks,
                                "validation": {k: final[k] for k in ("accuracy", "submit", "success")},
                                "picks_learnt": learnt}


def loop_config(cfg: DemoConfig, name: str, work: Path, checkpoint: Path, train_tasks: Path, heldout: Path,
                agent: dict[str, Any], eval_start: bool = True, vllm: str = "") -> Path:
    """The ``webgym-engine train`` config of run ``name`` (see :data:`RUNS`), written to ``work/NAME.toml``;
    ``eval_start`` False: the run does not evaluate its checkpoint first (the first run did). ``vllm``: the API
    root of a vLLM server of the demonstration's model (:func:`build_model`) serving it under
    :data:`SERVED_NAME`, which the run pushes the checkpoint into first; "": the stand-in."""
    serving: dict[str, Any] = ({"policy": "vllm", "servers": [vllm], "served_model": SERVED_NAME, "push_start": True}
                               if vllm else {"policy": "stand_in"})
    loop = {"tasks": str(train_tasks), "iterations": cfg.iterations, "mode": "async", "staleness": cfg.staleness,
            "samples_per_task": cfg.group_size, "batch_groups": cfg.groups_per_iteration,
            "concurrency": cfg.concurrency, "workers": 1, **serving, "device": "cpu",
            "max_batch": cfg.concurrency, "temperature": 1.0, "top_p": 1.0, "max_tokens": 128,
            "step_caps": [cfg.step_cap] * 3, "eval_tasks": str(heldout), "eval_samples": 1,
            "eval_temperature": 1.0, "eval_start": eval_start, "output_dir": str(work / name)}
    trainer = {"model_dir": str(checkpoint), "algorithm": "grpo", "lr": cfg.lr, "warmup_steps": 0,
               "schedule": "constant", "epochs": 1, "batch_size": cfg.batch_size, "max_grad_norm": 1.0,
               "normaliser": "1/|tau|" if name == "tau" else "1/k", "k": 10.0, "is_cap": 5.0, "clip": 0.2,
               "dual_clip": 3.0, "shuffle_rewards": name == "control", "save_dtype": "float32",
               "cpu_threads": cfg.cpu_threads, "seed": cfg.model_seed, "progress": False, "tensorboard": False,
               "plots": False}
    path = work / f"{name}.toml"
    path.write_text(f"# {name}: written by python -m train.examples.grpo_demo; run with webgym-engine train {path}\n"
                    + _toml(loop) + "\n[train]\n" + _toml(trainer) + "\n[train.agent]\n" + _toml(agent),
                    encoding="utf-8")
    return path


def summarise_run(name: str, config: Path, result: Any, wall_s: float, start: Any = None) -> RunSummary:
    """A :class:`RunSummary` of one loop's :class:`train.loop.LoopResult`; ``start``: the evaluation of its
    checkpoint when another run made it."""
    from train.evaluation import paired_gain

    start, end = (start, *result.evaluations) if start is not None else result.evaluations
    keep = ("iteration", "version", "episodes", "success_rate", "mean_steps", "samples", "mean_is_weight",
            "clip_frac", "dropped_frac", "max_staleness", "mean_staleness", "versions_seen", "groups_trained",
            "excluded", "reruns", "wait_s", "train_s")
    iterations = [{k: getattr(r, k) for k in keep} for r in result.iterations]

    def brief(e: Any) -> dict[str, Any]:
        return {k: v for k, v in e.to_dict().items() if k != "per_task"}

    return RunSummary(name, str(config), brief(start), brief(end), paired_gain(start, end).to_dict(), iterations,
                      wall_s)


def build_model(cfg: DemoConfig, out: Path) -> Path:
    """The demonstration's tiny random model (step 1), written to ``out``: the same weights and tokenizer for the
    same ``cfg`` on every call, so that a server started on another copy serves the same model."""
    from policy.tiny_models import build_tiny_model

    return build_tiny_model(out, cfg.arch, cfg.model_seed, hidden_size=cfg.hidden_size, num_layers=cfg.layers,
                            max_pixels=cfg.max_pixels, corpus=[f"Task: {colour_board.INSTRUCTION}"])


def run_demo(work: str | Path, cfg: DemoConfig | None = None, vllm: Callable[[], str] | None = None) -> DemoResult:
    """Steps 1-4 of the module docstring in ``work``; returns the figures.

    ``vllm``: the RL runs' policy is served by vLLM, not by the stand-in. Called once the warm start is done, it
    returns the API root of a vLLM server of :func:`build_model`'s model (any copy: each run pushes its checkpoint
    into it first) with the control routes the push uses, serving it as :data:`SERVED_NAME` (it may wait for the
    server to answer: the server starts while the demonstrations and the warm start run)."""
    import torch

    from engine.sites.server import SiteServer
    from train.evaluation import paired_gain
    from train.loop import run_loop
    from train.loop_config import LoopConfig

    cfg = cfg or DemoConfig()
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.cpu_threads)  # a model this small runs fastest on one thread of a small CPU
    times: dict[str, float] = {}
    try:
        demo_seeds, validation_seeds, train_seeds, heldout_seeds = cfg.boards.split(cfg_sizes(cfg))
        cap = {"max_steps": cfg.step_cap}
        boards = cfg.boards
        files = {"demo": boards.write_tasks(work / "demo.jsonl", demo_seeds, max_steps=2),
                 "validation": boards.write_tasks(work / "validation.jsonl", validation_seeds, max_steps=2),
                 "train": boards.write_tasks(work / "train.jsonl", train_seeds, **cap),
                 "heldout": boards.write_tasks(work / "heldout.jsonl", heldout_seeds, **cap)}
        agent = agent_table(work)
        t0 = time.perf_counter()
        with SiteServer() as server:
            demo_run, validation_run = asyncio.run(scripted_runs([files["demo"], files["validation"]],
                                                                 work / "scripted", server.base_url))
        times["demonstrations"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        model_dir = build_model(cfg, work / "model")
        checkpoint, warm = warm_start(cfg, work, model_dir, demo_run, validation_run, agent)
        times["warm start"] = time.perf_counter() - t0
        vllm_url = ""
        if vllm:
            t0 = time.perf_counter()
            vllm_url = vllm()
            times["waiting for the vLLM server"] = time.perf_counter() - t0
        runs: dict[str, RunSummary] = {}
        ends: dict[str, Evaluation] = {}  # each run's S1, per board
        # Every run starts from the same checkpoint: the first one's evaluation of it is every run's S0.
        start = None
        for name in cfg.runs:
            config = loop_config(cfg, name, work, checkpoint, files["train"], files["heldout"], agent,
                                 eval_start=start is None, vllm=vllm_url)
            t0 = time.perf_counter()
            result = asyncio.run(run_loop(LoopConfig.load(config)))
            times[f"run {name}"] = time.perf_counter() - t0
            runs[name] = summarise_run(name, config, result, times[f"run {name}"], start)
            start = start or result.evaluations[0]
            ends[name] = result.evaluations[-1]
        versus = ({name: paired_gain(ends["control"], end).to_dict() for name, end in ends.items() if name != "control"}
                  if "control" in ends else {})
        return DemoResult(cfg, warm, runs, times, versus)
    finally:
        torch.set_num_threads(threads)


def cfg_sizes(cfg: DemoConfig) -> tuple[int, int, int, int]:
    """The four layout sets' sizes: demonstrations, validation, training, held out."""
    return cfg.demo_boards, cfg.validation_boards, cfg.train_boards, cfg.heldout_boards


def _toml(table: dict[str, Any]) -> str:
    """Flat TOML for ``table`` (strings, numbers, booleans, lists of them)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"TOML has no {v}")
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)  # a JSON string or number is a TOML one

    return "".join(f"{k} = {value(v)}\n" for k, v in table.items())


def main(argv: list[str] | None = None) -> None:
    """Command line: run the demonstration, print its figures, write them as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here (default: WORK/grpo_demo.json)")
    parser.add_argument("--quick", action="store_true", help="the test suite's smaller version")
    args = parser.parse_args(argv)
    cfg = DemoConfig.quick() if args.quick else DemoConfig()
    with tempfile.TemporaryDirectory(prefix="grpo-demo-") as tmp:
        work = args.work or Path(tmp)
        result = run_demo(work, cfg)
        print(result.report())
        out = args.json or work / "grpo_demo.json"
        out.write_text(json.dumps(result.to_dict(), indent=1) + "\n", encoding="utf-8")
        print(f"figures: {out}")


if __name__ == "__main__":
    main()
