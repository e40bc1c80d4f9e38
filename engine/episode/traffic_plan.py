"""Which episodes record their page traffic and which replay it (``browserpool/traffic.py`` does both in the
worker): the run's choice (:class:`TrafficSettings`) turned into each rollout's :class:`TrafficSpec`.

- ``record``: every episode writes ``RUN_DIR/traffic/EPISODE.traffic`` (EPISODE: its frames directory's name).
- ``replay DIR``: every episode replays ``DIR/traffic/EPISODE.traffic`` (or, for a sample the recording did not
  run, the task's sample 0); a task without an archive ends with an error record of kind ``traffic_missing``.
- ``group N`` (GRPO): the samples ``k*N .. k*N+N-1`` of a task are a group. The first of them to start records
  (its whole episode, as ``record``, and what its start page loaded, ``traffic/group-TASK_K.start.traffic``); the
  others wait until it has opened and replay that snapshot, with whatever their own actions load beyond it taken
  from the live sites. A group whose first member fails to open runs the others live.

The engine's own sites are served on a new port in every run: a replay maps their requests to the recording's
origin (its manifest's ``sites_base_url``). Every recorded or replayed episode of a task gets the same seed (from
the task's id), so its pages draw the same random numbers.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

from browserpool.protocol import MissPolicy, TrafficSpec
from engine.store.records import EpisodeTraffic
from engine.store.run_dir import episode_key, frames_name

TRAFFIC_DIR = "traffic"


@dataclass(frozen=True)
class TrafficSettings:
    """The run's traffic choice (RunConfig.record_traffic, replay_traffic, traffic_miss, traffic_group)."""

    record: bool = False
    replay: str | None = None  # a run directory (or its traffic/ folder) to replay
    miss: MissPolicy = "404"
    group: int = 0  # GRPO group size: members replay their first member's start (0: off)

    @property
    def active(self) -> bool:
        return self.record or self.replay is not None or self.group > 0


@dataclass
class RolloutTraffic:
    """A rollout's part: its spec (None: live), what the record says of it, and the group it leads, if any."""

    spec: TrafficSpec | None
    info: EpisodeTraffic
    leads: tuple[str, int] | None = None


class TrafficPlan:
    """The specs of one run's rollouts (see the module docstring)."""

    def __init__(self, settings: TrafficSettings, run_dir: str | Path, sites_url: str | None = None) -> None:
        self.settings = settings
        self.run_dir = Path(run_dir)
        # The engine's own sites get a new port per run: a replay looks their requests up where the recording's were.
        self.rebase: tuple[str, str] | None = None
        if settings.replay is not None and sites_url:
            recorded = _recorded_sites_url(Path(settings.replay))
            if recorded and recorded.rstrip("/") != sites_url.rstrip("/"):
                self.rebase = (recorded.rstrip("/"), sites_url.rstrip("/"))
        self._groups: dict[tuple[str, int], asyncio.Future[str | None]] = {}  # group -> its snapshot (None: none)

    async def episode(self, task_id: str, sample: int, episode_id: str) -> RolloutTraffic:
        """The rollout's spec; a group member waits here for its group's snapshot. Raises FileNotFoundError when
        a replay has no archive for the task."""
        s = self.settings
        seed = zlib.crc32(task_id.encode("utf-8", "surrogatepass"))
        if s.replay is not None:
            path = self._replayed(task_id, sample)
            return RolloutTraffic(TrafficSpec(mode="replay", path=str(path), miss=s.miss, rebase=self.rebase),
                                  {"mode": "replay", "archive": str(path)})
        own = self.run_dir / TRAFFIC_DIR / f"{frames_name(episode_id)}.traffic"
        if s.group > 0:
            group = (task_id, sample // s.group)
            snapshot = self._groups.get(group)
            if snapshot is None:  # the first member to start: it records for the group
                self._groups[group] = asyncio.get_running_loop().create_future()
                start = self.run_dir / TRAFFIC_DIR / f"group-{frames_name(episode_key(*group))}.start.traffic"
                return RolloutTraffic(TrafficSpec(mode="record", path=str(own), seed=seed, snapshot=str(start)),
                                      {"mode": "record", "archive": self._rel(own), "group_start": self._rel(start)},
                                      leads=group)
            start_path = await asyncio.shield(snapshot)
            if start_path is None:
                return RolloutTraffic(None, {"mode": "live", "why": "its group's first member did not open"})
            shared = self._rel(Path(start_path))
            return RolloutTraffic(TrafficSpec(mode="replay", path=start_path, miss="live"),
                                  {"mode": "replay", "archive": shared, "group_start": shared})
        if s.record:
            return RolloutTraffic(TrafficSpec(mode="record", path=str(own), seed=seed),
                                  {"mode": "record", "archive": self._rel(own)})
        return RolloutTraffic(None, {"mode": "live"})

    def opened(self, traffic: RolloutTraffic, ok: bool) -> None:
        """The rollout's first page load is over: a group it leads may now replay its start (or go live)."""
        if traffic.leads is None:
            return
        snapshot = self._groups.get(traffic.leads)
        if snapshot is not None and not snapshot.done():
            snapshot.set_result(traffic.spec.snapshot if ok and traffic.spec is not None else None)

    def _replayed(self, task_id: str, sample: int) -> Path:
        assert self.settings.replay is not None
        root = Path(self.settings.replay)
        folder = root / TRAFFIC_DIR if (root / TRAFFIC_DIR).is_dir() else root
        for key in (episode_key(task_id, sample), episode_key(task_id, 0)):
            path = folder / f"{frames_name(key)}.traffic"
            if path.is_file():
                return path
        raise FileNotFoundError(f"no recorded traffic for task {task_id!r} in {folder}")

    def _rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.run_dir))
        except ValueError:
            return str(path)


def _recorded_sites_url(replayed: Path) -> str | None:
    """Where the recording run served the engine's own sites (its manifest's config's ``sites_base_url``), if it
    says."""
    for folder in (replayed, replayed.parent):
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        config = manifest.get("config") if isinstance(manifest, dict) else None
        url = config.get("sites_base_url") if isinstance(config, dict) else None
        return url if isinstance(url, str) else None
    return None
