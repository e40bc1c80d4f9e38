"""Training commands for the ``webgym-engine`` command line (registered by ``engine/cli.py``).

``export RUN_DIR --format sharegpt [-o OUT] [--all]``: the run's steps as a LLaMA-Factory data set.
``train-model CONFIG --runs RUN_DIR...``: one training iteration (FBC or GRPO) of the model in CONFIG on the runs;
several GPUs with ``torchrun --nproc-per-node N -m train.cli train-model CONFIG --runs ...`` (FSDP2).
Also runnable alone: ``python -m train.cli export RUN_DIR ...``, ``python -m train.cli train-model ...``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from engine.store.records import RecordFormatError
from train.export import dataset_info, export_sharegpt


@click.command("export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--format", "fmt", type=click.Choice(["sharegpt"]), default="sharegpt", show_default=True,
              help="sharegpt: LLaMA-Factory's format (conversations, system, images with <image> placeholders).")
@click.option("-o", "--output", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Output file (.json: one JSON array; .jsonl: one sample per line). "
                   "Default: RUN_DIR/export-sharegpt.json.")
@click.option("--all", "all_episodes", is_flag=True,
              help="Export every episode, not only the successful ones.")
@click.option("--relative-to", type=click.Path(file_okay=False), default=None,
              help="Write image paths relative to this directory (LLaMA-Factory's media_dir) instead of absolute.")
def export(run_dir: str, fmt: str, out_path: str | None, all_episodes: bool, relative_to: str | None) -> None:
    """Export RUN_DIR's steps as a supervised fine-tuning set, one sample per step.

    Steps of model policies keep the exact context the model saw; runs of the scripted policy become
    demonstrations in the model's reply format.
    """
    out = Path(out_path) if out_path else Path(run_dir) / f"export-{fmt}.json"
    try:
        result = export_sharegpt(run_dir, out, only_success=not all_episodes, relative_to=relative_to)
    except RecordFormatError as exc:  # a manifest or a record line this code cannot read: say which, no traceback
        raise click.ClickException(str(exc)) from None
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(result["skipped"].items())) or "none"
    click.echo(f"wrote {result['samples']} samples to {out} (left out: {skipped})")
    click.echo("dataset_info.json entry: " + json.dumps(dataset_info(out.stem, out.name)))


@click.command("train-model")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.argument("run_dirs", nargs=-1, type=click.Path(exists=True, file_okay=False))
@click.option("--runs", "runs", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A run directory to train on (repeatable; oldest first). Positional RUN_DIRS are added after.")
@click.option("--output-dir", default=None, help="Override the config's output_dir.")
@click.option("--max-steps", type=int, default=None, help="Override the config's max_steps.")
@click.option("--lr", type=float, default=None, help="Override the config's lr.")
def train_model(config: str, run_dirs: tuple[str, ...], runs: tuple[str, ...], output_dir: str | None,
                max_steps: int | None, lr: float | None) -> None:
    """Train the model of CONFIG (a TOML, YAML or JSON file of train.config.TrainConfig) on the runs.

    FBC picks the steps of successful episodes (scripted runs become demonstrations in the config's [agent]
    protocol); GRPO takes the runs' group-normalised rewards. Writes checkpoints (Hugging Face format),
    metrics.jsonl and the loss and reward curves to the output directory.
    """
    from train.config import ConfigError, TrainConfig

    all_runs = [*runs, *run_dirs]
    if not all_runs:
        raise click.UsageError("give at least one run directory (--runs RUN_DIR)")
    try:
        cfg = TrainConfig.load(config, output_dir=output_dir, max_steps=max_steps, lr=lr)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    from train.trainer import Trainer, samples_from_runs

    try:
        samples = samples_from_runs(cfg, all_runs)
    except RecordFormatError as exc:
        raise click.ClickException(str(exc)) from None
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(samples.skipped.items())) or "none"
    if not samples.samples:
        raise click.ClickException(f"no training samples in {', '.join(all_runs)} (left out: {skipped})")
    trainer = Trainer(cfg, samples)
    try:
        if trainer.dist.is_main:
            click.echo(f"{cfg.algorithm}: {len(samples)} samples from {len(all_runs)} run(s) (left out: {skipped}); "
                       f"{trainer.total_steps} steps on {trainer.dist.world} process(es), {trainer.device}")
        result = trainer.run()
    finally:
        trainer.close()
    if result.checkpoint is not None:
        click.echo(f"{result.steps} steps, final loss {result.final_loss:.4f}, {result.tokens_per_s:.0f} tokens/s; "
                   f"checkpoint {result.checkpoint}; metrics {result.metrics_path}")


@click.command("train")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
def train_loop(config: str) -> None:
    """Run the RL loop of CONFIG (TOML: the loop's keys, the trainer's in [train]): roll out with the current
    policy, reward, build samples, train, push the new weights into the policy (in-process, or vLLM / SGLang
    servers) in place; repeat."""
    import uvloop

    from engine.store.run_dir import StoreFailed
    from train.config import ConfigError
    from train.loop import run_loop
    from train.loop_config import LoopConfig

    try:
        cfg = LoopConfig.load(config)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        result = uvloop.run(run_loop(cfg))
    except StoreFailed as exc:  # a full disk: the checkpoints written so far stay
        raise click.ClickException(f"the loop stopped: {exc}") from None
    for r in result.iterations:
        busy = r.browser_busy_training
        busy_text = f", browsers {busy:.0%} busy while training" if busy is not None else ""
        kept_out = f", {r.excluded} kept out of training ({r.reruns} rerun)" if r.excluded else ""
        click.echo(f"iteration {r.iteration}: {r.episodes} episodes (versions {r.versions_seen}), success "
                   f"{r.success_rate:.0%}, {r.groups_trained} groups, {r.samples} samples{kept_out} -> version "
                   f"{r.version}  [waited {r.wait_s:.0f} s for rollouts, trained {r.train_s:.0f} s{busy_text}]")
    for e in result.evaluations:
        low, high = e.interval
        click.echo(f"held-out evaluation ({e.label}, version {e.version}): {e.successes}/{e.rewarded} succeeded "
                   f"({e.success_rate:.0%}, 95% interval {low:.0%}-{high:.0%}), {e.mean_steps:.2f} steps per episode")


@click.group()
def cli() -> None:
    """Training commands."""


cli.add_command(export)
cli.add_command(train_model)
cli.add_command(train_loop)


if __name__ == "__main__":
    cli()
