"""What a training run shows while and after it runs: a progress bar, TensorBoard scalars, loss and reward plots.

Every piece is optional: without ``rich``'s terminal, the ``tensorboard`` package or ``matplotlib`` the trainer
runs the same and writes ``metrics.jsonl`` alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def tensorboard_writer(path: Path) -> Any:
    """A TensorBoard ``SummaryWriter`` logging under ``path``, or None when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # the tensorboard package is optional
        return None
    return SummaryWriter(str(path))


def progress_bar(enabled: bool) -> Any:
    """A ``rich`` progress bar with the step count and the loss (a ``loss`` task field), or None."""
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.4f}"), TimeElapsedColumn())


def plot_curves(history: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """``loss.png`` (loss and, for FBC, token accuracy) and ``reward.png`` (mean reward of the step's samples)."""
    if not history:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: no plots")
        return []
    steps = [m["step"] for m in history]
    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [m["loss"] for m in history], label="loss")
    if "token_acc" in history[0]:
        ax2 = ax.twinx()
        ax2.plot(steps, [m["token_acc"] for m in history], color="tab:orange", label="token accuracy")
        ax2.set_ylabel("token accuracy")
        ax2.set_ylim(0, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("training loss")
    written.append(_save(plt, fig, out_dir / "loss.png"))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [m["reward"] for m in history], label="reward")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward of the step's samples")
    ax.set_title("reward")
    written.append(_save(plt, fig, out_dir / "reward.png"))
    return written


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
