"""Training commands for the ``webgym-engine`` command line (registered by ``engine/cli.py``).

``export RUN_DIR --format sharegpt [-o OUT] [--all]``: the run's steps as a LLaMA-Factory data set.
Also runnable alone: ``python -m train.cli RUN_DIR ...``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

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
    result = export_sharegpt(run_dir, out, only_success=not all_episodes, relative_to=relative_to)
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(result["skipped"].items())) or "none"
    click.echo(f"wrote {result['samples']} samples to {out} (left out: {skipped})")
    click.echo("dataset_info.json entry: " + json.dumps(dataset_info(out.stem, out.name)))


if __name__ == "__main__":
    export()
