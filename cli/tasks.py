"""``webgym-engine tasks ...``: validate, describe, sample and decompose task files; show or clear the blocklist.

Registered on the main command line by ``cli.main``; also runs alone: ``python -m cli.tasks``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cli.task_tools import STRATA, decomposable, decompose_async, model_rewriter, sample, stats, write_jsonl
from engine.tasks.loading import check_file, load_tasks
from engine.tasks.schema import DEFAULT_STEP_CAPS, Task, TaskFileError

_FILE = click.Path(dir_okay=False, path_type=Path)


def _load(path: Path) -> list[Task]:
    """Tasks of a file, placeholders kept (``{SITES}`` stays in what is written back), or a clean CLI error."""
    try:
        return load_tasks(path)
    except TaskFileError as exc:
        raise click.ClickException(f"{exc}\n(`tasks validate {path}` lists every problem)") from None


@click.group("tasks")
def tasks() -> None:
    """Task files (WebGym schema, JSONL or JSON): validate, stats, sample, decompose."""


@tasks.command("validate")
@click.argument("files", nargs=-1, required=True, type=_FILE)
@click.option("--max-errors", type=click.IntRange(0), default=200, show_default=True,
              help="Errors printed per file (0: all); the count is always complete.")
def validate_cmd(files: tuple[Path, ...], max_errors: int) -> None:
    """Check task files completely: every error with file, line (or JSON item) and field. Exit 1 if any."""
    total_errors = 0
    for path in files:
        valid, errors = check_file(path)
        shown = errors if max_errors == 0 else errors[:max_errors]
        for err in shown:
            click.echo(str(err))
        if len(shown) < len(errors):
            click.echo(f"{path}: ... {len(errors) - len(shown)} more errors not shown (--max-errors 0 shows all)")
        verdict = "ok" if not errors else f"{len(errors)} error{'s' * (len(errors) != 1)}"
        click.echo(f"{path}: {len(valid)} valid record{'s' * (len(valid) != 1)}, {verdict}")
        total_errors += len(errors)
    if total_errors:
        sys.exit(1)


def _table(title: str, counts: dict[Any, int], total: int, top: int, extra: dict[Any, str] | None = None,
           extra_name: str = "") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("value")
    table.add_column("tasks", justify="right")
    table.add_column("%", justify="right")
    if extra:
        table.add_column(extra_name, justify="right")
    items = list(counts.items())
    shown = items if top == 0 else items[:top]
    for key, n in shown:
        row = [str(key), str(n), f"{100 * n / total:.1f}" if total else "-"]
        if extra:
            row.append(extra.get(key, ""))
        table.add_row(*row)
    if len(shown) < len(items):
        rest = sum(n for _, n in items[len(shown):])
        table.add_row(f"... {len(items) - len(shown)} more", str(rest), f"{100 * rest / total:.1f}" if total else "-")
    return table


@tasks.command("stats")
@click.argument("file", type=_FILE)
@click.option("--split", type=click.Choice(["train", "test"]), default=None,
              help="The file's split (WebGym files hold one); a record's own 'split' field wins.")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON instead of tables.")
@click.option("--top", type=click.IntRange(0), default=15, show_default=True,
              help="Rows per table for domains, subdomains, hosts, benchmarks (0: all); JSON has all.")
def stats_cmd(file: Path, split: str | None, as_json: bool, top: int) -> None:
    """Counts by split, difficulty bucket and value, domain, subdomain, website host and benchmark."""
    task_list = _load(file)
    s = stats(task_list, split=split)
    if as_json:
        click.echo(json.dumps(s, indent=2, ensure_ascii=False))
        return
    console = Console()
    n = s["total"]
    overview = Table(title=f"{file}", title_justify="left", show_header=False)
    overview.add_column("what")
    overview.add_column("value", justify="right")
    fpt, gpt = s["facts_per_task"], s["groups_per_task"]
    for what, value in [
        ("tasks", n),
        ("facts per task (min / median / max)", f"{fpt['min']} / {fpt['median']:g} / {fpt['max']}"),
        ("fact groups per task (min / median / max)", f"{gpt['min']} / {gpt['median']:g} / {gpt['max']}"),
        ("with a definite answer", s["with_definite_answer"]),
        ("with programmatic checks", s["with_checks"]),
        ("with a reference solution", s["with_reference_solution"]),
        ("decomposable (2+ groups, one with 3+ facts)", s["decomposable"]),
    ]:
        overview.add_row(what, str(value))
    console.print(overview)
    console.print(_table("by split", s["by_split"], n, 0))
    caps = {b: "" for b in s["by_bucket"]}
    if split:  # the step caps this split gives each bucket (the original's)
        for b, d in zip(s["by_bucket"], (1, 4, 7), strict=True):
            caps[b] = str(DEFAULT_STEP_CAPS.cap(d, split))
    labels = {"easy": "easy (1-3)", "medium": "medium (4-6)", "hard": "hard (7+)"}
    console.print(_table("by difficulty bucket", {labels[b]: c for b, c in s["by_bucket"].items()}, n, 0,
                         {labels[b]: c for b, c in caps.items()} if split else None, f"{split} step cap"))
    console.print(_table("by difficulty", s["by_difficulty"], n, 0))
    for key, title in [("by_domain", "by domain"), ("by_subdomain", "by subdomain"),
                       ("by_host", "by website host"), ("by_benchmark", "by benchmark")]:
        console.print(_table(title, s[key], n, top))


@tasks.command("sample")
@click.argument("file", type=_FILE)
@click.argument("n", type=click.IntRange(0))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--stratify", type=click.Choice([*STRATA, "none"]), default="none", show_default=True,
              help="Keep the proportions of this field (largest-remainder rounding).")
@click.option("-o", "--output", type=_FILE, default=None, help="Write the sample here (default: stdout).")
def sample_cmd(file: Path, n: int, seed: int, stratify: str, output: Path | None) -> None:
    """Draw N tasks, deterministically for a seed; writes JSONL in the input's order."""
    task_list = _load(file)
    picked = sample(task_list, n, seed=seed, stratify_by=None if stratify == "none" else stratify)
    records = [t.to_record() for t in picked]
    if output is None:
        for rec in records:
            click.echo(json.dumps(rec, ensure_ascii=False))
    else:
        write_jsonl(records, output)
    summary = Counter(t.bucket for t in picked)
    click.echo(f"sampled {len(picked)} of {len(task_list)} tasks (seed {seed}; easy {summary['easy']}, "
               f"medium {summary['medium']}, hard {summary['hard']})" + (f" -> {output}" if output else ""),
               err=True)


@tasks.command("decompose")
@click.argument("input_file", metavar="IN", type=_FILE)
@click.argument("output_file", metavar="OUT", type=_FILE)
@click.option("--rewrite-base-url", default=None,
              help="Rewrite each sub-task text with an OpenAI-compatible server at this API root "
                   "(e.g. http://127.0.0.1:8000/v1).")
@click.option("--rewrite-model", default=None, help="The served model name for --rewrite-base-url.")
@click.option("--rewrite-api-key-env", default="OPENAI_API_KEY", show_default=True,
              help="Environment variable that holds the API key (if any).")
@click.option("--rewrite-concurrency", type=click.IntRange(1), default=16, show_default=True)
@click.option("--rewrite-timeout", type=float, default=60.0, show_default=True, help="Seconds per request.")
@click.option("--rewrite-retries", type=click.IntRange(0), default=2, show_default=True,
              help="Retries of a request after a transient error (HTTP 429/5xx, timeouts).")
def decompose_cmd(input_file: Path, output_file: Path, rewrite_base_url: str | None, rewrite_model: str | None,
                  rewrite_api_key_env: str, rewrite_concurrency: int, rewrite_timeout: float,
                  rewrite_retries: int) -> None:
    """Derive sub-tasks (proper subsets of fact groups) from tasks with 2+ groups, one of them with 3+ facts.

    Sub-tasks: every single group and every "all groups but one" subset; the text comes from a template,
    or from a model with --rewrite-base-url/--rewrite-model (a failed rewrite keeps the template text and
    records the reason in 'rewrite_error').
    """
    if (rewrite_base_url is None) != (rewrite_model is None):
        raise click.UsageError("--rewrite-base-url and --rewrite-model go together")
    task_list = _load(input_file)
    if rewrite_base_url is None:
        records = asyncio.run(decompose_async(task_list))
    else:
        records = asyncio.run(_decompose_rewritten(task_list, rewrite_base_url, rewrite_model or "",
                                                   os.environ.get(rewrite_api_key_env), rewrite_concurrency,
                                                   rewrite_timeout, rewrite_retries))
    write_jsonl(records, output_file)
    eligible = sum(decomposable(t) for t in task_list)
    by_difficulty = Counter(r["difficulty"] for r in records)
    click.echo(f"{len(task_list)} tasks read, {eligible} eligible parents, {len(records)} sub-tasks written "
               f"to {output_file}")
    click.echo("sub-tasks by difficulty: " + (", ".join(f"{d}: {by_difficulty[d]}" for d in sorted(by_difficulty))
                                              or "none"))
    if rewrite_base_url is not None:
        failed = [r for r in records if "rewrite_error" in r]
        click.echo(f"rewritten: {len(records) - len(failed)}, rewrite failed (template text kept): {len(failed)}")
        if failed:
            click.echo(f"first rewrite error: {failed[0]['task_id']}: {failed[0]['rewrite_error']}")


async def _decompose_rewritten(task_list: list[Task], base_url: str, model_name: str, api_key: str | None,
                               concurrency: int, timeout_s: float, retries: int) -> list[dict[str, Any]]:
    from policy.openai_backend import OpenAIModel

    model = OpenAIModel(base_url, model_name, api_key=api_key, max_in_flight=concurrency, timeout_s=timeout_s,
                        retries=retries)
    await model.start()
    try:
        return await decompose_async(task_list, model_rewriter(model), concurrency=concurrency)
    finally:
        await model.close()


@tasks.command("blocklist")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--clear", "clear_domain", default=None, metavar="DOMAIN",
              help="Remove DOMAIN's entry (\"all\": every entry).")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def blocklist_cmd(path: Path, clear_domain: str | None, as_json: bool) -> None:
    """Show the blocked domains of PATH (a run directory's blocklist.json, or a shared one), or clear entries.

    Domains land there when the judge says the site blocked the agent or a start page was a block page (HTTP 403
    or 429, a challenge page); their tasks are skipped, with a record that says so, until the entry expires."""
    from engine.web.blocklist import Blocklist

    if path.is_dir():
        path = path / "blocklist.json"
    try:
        blocklist = Blocklist(path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if clear_domain is not None:
        removed = blocklist.clear(None if clear_domain == "all" else clear_domain)
        click.echo(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {path}")
        return
    entries = blocklist.entries()
    if as_json:
        click.echo(json.dumps([e.__dict__ for e in entries], indent=1))
        return
    if not entries:
        click.echo(f"{path}: no blocked domain")
        return
    table = Table(title=f"blocked domains ({path})")
    for column in ("domain", "until (UTC)", "source", "reason"):
        table.add_column(column)
    for e in entries:
        table.add_row(e.domain, time.strftime("%Y-%m-%d %H:%M", time.gmtime(e.until)), e.source, e.reason)
    Console().print(table)


if __name__ == "__main__":
    tasks()
