"""Parts of a step's and an episode's records that the rollout fills in from what the browser saw: page events,
how a page loaded, the page an episode ended on. Their keys are the records' (:mod:`engine.store.records`)."""

from __future__ import annotations

from typing import Any, TypedDict

from browserpool.protocol import Observation, TrafficStats
from engine.agent.policy_api import StepView
from engine.store.records import EpisodeTraffic, FinalPage, PageEvent, StepRecord, StepTraffic
from engine.web.redact import mask_url


class PageLoad(TypedDict, total=False):
    """The keys of a :class:`~engine.store.records.StepRecord` on how its page loaded, when there is something
    to say."""

    http_status: int
    load: dict[str, Any]


class OpenEvents(TypedDict, total=False):
    """An :class:`~engine.store.records.EpisodeRecord`'s ``open_events``, when the start page did something."""

    open_events: list[PageEvent]


class EpisodeTrafficEntry(TypedDict, total=False):
    """An :class:`~engine.store.records.EpisodeRecord`'s ``traffic``, for an episode that records or replays it."""

    traffic: EpisodeTraffic


def event_entries(obs: Observation) -> list[PageEvent] | None:
    """An observation's page events as record entries (already masked and capped by
    :func:`~engine.web.bounds.bound_observation`)."""
    if not obs.events:
        return None
    return [{"kind": e.kind, "url": e.url, "detail": e.detail} for e in obs.events]


def final_page(view: StepView | None, screenshot: str | None, truncated: list[str]) -> FinalPage | None:
    """The page an episode ended on (None: it never saw one); ``truncated``: what the caps cut from it."""
    if view is None:
        return None
    final: FinalPage = {"url": view.url, "title": view.title, "settled": view.settled, "screenshot": screenshot}
    if truncated:
        final["truncated"] = truncated
    return final


def record_result(step: StepRecord, obs: Observation, screenshot: str | None, cut: list[str],
                  changed: bool | None) -> None:
    """Fill ``step`` with what its action did: the point it acted on, the page's note and events (refused loads,
    popups...), whether the page changed, the page it led to and the page's probe, if any."""
    step["point"] = list(obs.point) if obs.point else None
    step["note"] = obs.note
    events = event_entries(obs)
    if events is not None:
        step["events"] = events
    step["page_changed"] = changed
    step["result"] = {"url": obs.url, "title": obs.title, "settle": obs.settle, "screenshot": screenshot}
    if cut:
        step["result"]["truncated"] = cut
    if obs.probe is not None:
        step["probe"] = obs.probe
    if obs.traffic is not None:
        step["traffic"] = traffic_entry(obs.traffic)


def traffic_entry(stats: TrafficStats) -> StepTraffic:
    """What an observation's loads did to the episode's recorded or replayed traffic, as records keep it (URLs of
    misses masked)."""
    entry: StepTraffic = {"recorded": stats.recorded, "served": stats.served, "misses": stats.misses}
    if stats.miss_urls:
        entry["miss_urls"] = [mask_url(u) for u in stats.miss_urls]
    return entry
