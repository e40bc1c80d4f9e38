"""``webgym-engine bench SUITE... [--quick] [--out DIR] [--repeats N] [--publish DOCS]``.

Suites: ceiling, async, async_live, scaling, overhead, codec, policy, or ``all`` (see ``bench/suites/`` for what
each measures and how). Writes a results directory (default ``bench-results/<UTC timestamp>/``) with one
JSON file per suite, the plots and ``summary.md``, and prints the summary table. ``--publish docs`` also
stores the run's results in ``docs/benchmarks/`` and renders ``docs/benchmarks.md`` and the README's figure blocks
from everything stored there (``bench.publish``, the same code as ``python -m bench.publish``).

Also runnable as ``python -m bench.cli``.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from bench.publish import publish, write_summary
from bench.render import FigureError
from bench.suite import (
    QUICK_LIMIT_S,
    SCALES,
    SUITE_NAMES,
    SuiteResult,
    default_results_dir,
    machine_facts,
    summary_table_text,
    write_suite,
)


def run_benchmarks(suites: list[str], scale: str, out: Path, repeats: int | None = None,
                   publish_to: Path | None = None) -> list[SuiteResult]:
    """Run ``suites`` at ``scale`` into ``out`` (JSON per suite as each finishes, then the summary)."""
    import uvloop

    # Imported here: the suites pull in the browser pool, Playwright and the engine, which `--help` does not need.
    from bench.suites import SUITES, run_suite
    from engine.sites.server import SiteServer

    assert set(suites) <= set(SUITES)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_facts()
    results: list[SuiteResult] = []
    with SiteServer() as server:
        for name in suites:
            click.echo(f"[bench] {name} ({scale}) ...")
            t0 = time.monotonic()
            res = uvloop.run(run_suite(name, scale, out, server.base_url, repeats))
            write_suite(out, res, machine)
            results.append(res)
            state = f"skipped: {res.skipped}" if res.skipped else f"{len(res.figures)} figures"
            click.echo(f"[bench] {name}: {state} in {time.monotonic() - t0:.0f} s (budget "
                       f"{res.config.get('budget_s', 0):.0f} s)")
    write_summary(out, results, machine, scale)
    if publish_to is not None:
        try:
            publish(out, publish_to, results)
        except FigureError as exc:  # the run's results are stored by now; only the rendering failed
            raise click.ClickException(f"publishing: {exc} (results stored in {publish_to / 'benchmarks'})") from exc
    return results


@click.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("suites", nargs=-1, required=True,
                type=click.Choice([*SUITE_NAMES, "all"], case_sensitive=False))
@click.option("--quick", is_flag=True, help=f"Shorter windows and fewer levels: `all` in under "
              f"{QUICK_LIMIT_S / 60:.0f} minutes on 2 cores (without a GPU: the policy suite runs only on one).")
@click.option("--tiny", is_flag=True, hidden=True, help="Seconds per suite (the tests' scale).")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results directory (default: bench-results/<UTC timestamp>/).")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Repeats per measurement (default: 3, or 1 with --quick).")
@click.option("--publish", "publish_to", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also store the results in DIR/benchmarks/ and render DIR/benchmarks.md and the README's "
                   "figure blocks from them (e.g. docs).")
def bench(suites: tuple[str, ...], quick: bool, tiny: bool, out: Path | None, repeats: int | None,
          publish_to: Path | None) -> None:
    """Run benchmark SUITES (ceiling, async, async_live, scaling, overhead, codec, policy, or all) and write a results
    directory: one JSON file per suite, PNG plots, summary.md."""
    scale = "tiny" if tiny else "quick" if quick else "full"
    assert scale in SCALES
    names = list(SUITE_NAMES) if "all" in suites else list(dict.fromkeys(s.lower() for s in suites))
    out = out or default_results_dir()
    t0 = time.monotonic()
    results = run_benchmarks(names, scale, out, repeats, publish_to)
    click.echo("")
    click.echo(summary_table_text(results))
    click.echo("")
    click.echo(f"results: {out}  ({time.monotonic() - t0:.0f} s)")
    if publish_to is not None:
        click.echo(f"published: {publish_to / 'benchmarks.md'}")
    failed = [r.suite for r in results if "error" in r.config]
    if failed:
        raise click.ClickException(f"suite(s) failed: {', '.join(failed)} (see their JSON files)")


if __name__ == "__main__":
    bench()
