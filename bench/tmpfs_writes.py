"""What writing a screenshot file costs this machine, by itself, as a run's memory grows (no engine involved).

The engine's frame writer is the largest cost per step at thousands of rollouts (``bench.engine_scale``). That cost
is the machine's: each 127 KB JPEG is one file written into tmpfs (``--run-root /dev/shm``) with the frame
writer's own call (``engine._filewrite.write_files``, 64 files per call). This measures that call alone, in three
passes of ``--gib`` GiB each, and reports the CPU per file for each GiB written:

- ``fill``: every file kept, so each GiB lands in memory the run has not used before;
- ``window``: each file removed once ``--window-gib`` GiB more has been written after it, so the same memory is
  used again (as a disk's page cache is, written back and reclaimed);
- ``fill again``: the first pass once more, right after.

On a virtual machine whose memory the host hands over on first touch (and takes back once freed), ``fill`` gets
dearer past what the host has already backed, while ``window`` stays flat.

    python -m bench.tmpfs_writes [--gib 8] [--window-gib 1] [--root /dev/shm] [--json docs/benchmarks/tmpfs_writes.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.null_worker import frames
from bench.suite import machine_facts
from engine._filewrite import write_files

BATCH = 64  # files per call, as the frame writer batches them


def write_pass(folder: Path, jpeg: bytes, files: int, per_chunk: int, window: int | None) -> list[dict[str, Any]]:
    """Write ``files`` copies of ``jpeg`` into ``folder``; per chunk of ``per_chunk`` files, the CPU and wall time
    per file of the writes alone. ``window``: remove each file once that many more have been written (the removals
    are not timed)."""
    folder.mkdir()
    rows: list[dict[str, Any]] = []
    cpu = wall = 0.0
    for start in range(0, files, BATCH):
        names = [str(folder / f"{i:07d}.jpg") for i in range(start, min(files, start + BATCH))]
        c0, w0 = time.thread_time(), time.perf_counter()
        errors = write_files([(name, jpeg, False) for name in names])
        cpu, wall = cpu + time.thread_time() - c0, wall + time.perf_counter() - w0
        if any(errors):
            raise OSError(f"cannot write: {next(e for e in errors if e)}")
        if window is not None:
            for i in range(max(0, start - window), max(0, start + len(names) - window)):
                os.unlink(folder / f"{i:07d}.jpg")
        done = start + len(names)
        if done % per_chunk == 0 or done == files:
            n = per_chunk if done % per_chunk == 0 else done % per_chunk
            rows.append({"gib_written": round(done * len(jpeg) / 2**30, 2),
                         "cpu_us_per_file": round(cpu * 1e6 / n, 1), "wall_us_per_file": round(wall * 1e6 / n, 1)})
            print(f"  {rows[-1]['gib_written']:5.2f} GiB: {rows[-1]['cpu_us_per_file']:6.1f} us CPU per file, "
                  f"{rows[-1]['wall_us_per_file']:6.1f} us wall", flush=True)
            cpu = wall = 0.0
    shutil.rmtree(folder)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=8.0, help="GiB written per pass")
    ap.add_argument("--window-gib", type=float, default=1.0, help="the window pass keeps this much written")
    ap.add_argument("--root", default="/dev/shm")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    jpeg = frames()[0]  # the null workers' screenshot, as the engine benchmarks write it
    files = int(args.gib * 2**30 / len(jpeg))
    per_gib = int(2**30 / len(jpeg)) // BATCH * BATCH
    window = int(args.window_gib * 2**30 / len(jpeg))
    machine = machine_facts()  # before the passes: the memory available at the start
    passes = []
    with tempfile.TemporaryDirectory(prefix="bench-tmpfs-", dir=args.root) as tmp:
        for name, keep in (("fill", None), ("window", window), ("fill again", None)):
            print(f"{name}:", flush=True)
            passes.append({"pass": name, "rows": write_pass(Path(tmp) / name.replace(" ", "-"), jpeg, files, per_gib,
                                                            keep)})
    if args.json:
        args.json.write_text(json.dumps({
            "benchmark": "tmpfs_writes", "machine": machine,
            "config": {"gib": args.gib, "window_gib": args.window_gib, "root": args.root, "file_bytes": len(jpeg),
                       "files_per_call": BATCH},
            "passes": passes}, indent=1) + "\n")


if __name__ == "__main__":
    main()
