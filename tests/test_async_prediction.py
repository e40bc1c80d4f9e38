"""The latency model's prediction for asynchronous vs lock-step batches (``bench.async_prediction``) and the
simulated model's fixed work it prices. Pure computation: no browsers, no engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.async_prediction import (
    BROWSERS,
    MIXES,
    EpisodeWork,
    StepWork,
    async_makespan,
    lockstep_makespan,
    main,
    mix_ratio,
    planned_work,
    predict,
)
from engine.agent.model_api import ChatRequest
from policy.simulated import LatencyModel, SharedDecoding, SimulatedModel

FLAT = LatencyModel(prefill_ms=100.0, image_ms=0.0, token_ms=10.0, knee=1e12)  # decoding never slows down


def episode(eid: str, tokens: list[int], browser_s: float = 0.5) -> EpisodeWork:
    return EpisodeWork(eid, tuple(StepWork(1, n, browser_s) for n in tokens), open_s=1.0, finish_s=0.0)


def test_the_calibrated_preset_reproduces_its_two_decode_rates() -> None:
    lm = LatencyModel.qwen_vl_7b_h100()
    assert lm.token_s(1) * 1000 == pytest.approx(4.63)
    assert lm.token_s(100) * 1000 == pytest.approx(7.57)
    assert lm.prefill_s(5) == pytest.approx((lm.prefill_ms + 5 * lm.image_ms) / 1000)
    assert LatencyModel() == LatencyModel(40.0, 15.0, 12.0, 64.0)  # the defaults others use are unchanged


def test_a_lockstep_round_waits_for_its_slowest_reply_and_decodes_faster_as_replies_leave() -> None:
    lm = LatencyModel(prefill_ms=100.0, image_ms=0.0, token_ms=10.0, knee=2.0)
    work = [EpisodeWork("a", (StepWork(1, 10, 0.0),), 0.0, 0.0), EpisodeWork("b", (StepWork(1, 30, 0.0),), 0.0, 0.0)]
    total, rounds = lockstep_makespan(work, 2, lm)
    # Both decode 10 tokens at t(2) = 20 ms, then the longer one 20 more at t(1) = 15 ms.
    assert total == pytest.approx(0.1 + 10 * 0.020 + 20 * 0.015)
    assert rounds == 3


def test_the_simulated_server_decodes_a_lockstep_round_as_the_prediction_prices_it() -> None:
    lm = LatencyModel(prefill_ms=100.0, image_ms=0.0, token_ms=10.0, knee=2.0)
    server = SharedDecoding(lm)
    a, b = server.join(0.0), server.join(0.0)
    server.decode(0.1, a, 10)
    server.decode(0.1, b, 30)
    assert server.due() == pytest.approx(0.1 + 10 * 0.020)
    assert server.pop_finished(0.29) == []
    assert server.pop_finished(0.3) == [a] and server.in_flight == 1
    assert server.due() == pytest.approx(0.3 + 20 * 0.015)  # the one left decodes at t(1) from then on
    assert server.pop_finished(0.6) == [b] and server.in_flight == 0 and server.due() is None
    work = [EpisodeWork("a", (StepWork(1, 10, 0.0),), 0.0, 0.0), EpisodeWork("b", (StepWork(1, 30, 0.0),), 0.0, 0.0)]
    assert lockstep_makespan(work, 2, lm)[0] == pytest.approx(0.6)


def test_a_request_joining_slows_the_decoding_ones_until_it_leaves() -> None:
    lm = LatencyModel(prefill_ms=0.0, image_ms=0.0, token_ms=10.0, knee=2.0)  # t(1) 15 ms, t(2) 20 ms
    server = SharedDecoding(lm)
    a = server.join(0.0)
    server.decode(0.0, a, 100)
    assert server.due() == pytest.approx(1.5)
    b = server.join(0.15)  # 10 tokens done; its prefill slows a at once
    assert server.due() == pytest.approx(0.15 + 90 * 0.020)
    assert server.leave(0.35, b)  # cancelled: 10 more tokens at t(2), the other 80 at t(1) again
    assert server.due() == pytest.approx(0.35 + 80 * 0.015)
    assert server.pop_finished(1.55 - 0.0005, slack_s=0.001) == [a]  # a timer a little early still wakes it
    assert not server.leave(1.6, a) and not server.leave(1.6, b)


def test_simulated_replies_take_their_work_and_leave_nothing_behind_done_or_cancelled() -> None:
    lm = LatencyModel(prefill_ms=1.0, image_ms=0.0, token_ms=0.5, knee=4.0, median_tokens=20.0)

    async def scenario() -> None:
        model = SimulatedModel(seed=1, latency=lm, fixed_work=True)
        requests = [ChatRequest(f"e{i}#0/{i}", [], {}) for i in range(6)]
        t0 = asyncio.get_running_loop().time()
        gens = await asyncio.gather(*(model.generate(r) for r in requests))
        elapsed = asyncio.get_running_loop().time() - t0
        longest = max(g.timings_ms["simulated_tokens"] for g in gens)
        assert elapsed >= lm.prefill_s(0) + longest * lm.token_s(1) - 0.002  # never earlier than the work allows
        assert model.in_flight == 0 and model._timer is None and not model._waiting
        stuck = asyncio.ensure_future(model.generate(ChatRequest("x#0/0", [], {})))
        while not model._waiting:
            await asyncio.sleep(0.001)
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        assert model.in_flight == 0 and model._timer is None and not model._waiting

    asyncio.run(scenario())


def test_one_rollout_has_no_barrier_to_lose() -> None:
    work = [episode("a", [50, 80]), episode("b", [120]), episode("c", [10, 10, 10])]
    pred = predict(work, work, 1, FLAT)
    assert pred.ratio == pytest.approx(1.0)


def test_uneven_episodes_cost_the_lockstep_batch_its_longest_one() -> None:
    # Four runners, a batch of one long episode and three short ones, then four short ones: the lock-step side
    # waits for the long one before the second batch starts, the asynchronous side runs them meanwhile.
    work = [episode("long", [100] * 8)] + [episode(f"s{i}", [100]) for i in range(7)]
    pred = predict(work, work, 4, FLAT)
    step = 0.1 + 1.0 + 0.5
    assert pred.sync_s == pytest.approx((1 + 8 * step) + (1 + step))
    assert pred.async_s == pytest.approx(1 + 8 * step)
    assert pred.ratio > 1.1


def test_fixed_work_does_not_depend_on_the_order_of_requests() -> None:
    def replies(order: list[tuple[str, int]]) -> dict[str, tuple[str, int]]:
        model = SimulatedModel(seed=3, latency=LatencyModel(speed=1e6), fixed_work=True)
        out = {}
        for eid, step in order:
            gen = asyncio.run(model.generate(ChatRequest(f"{eid}/{step}", [], {})))
            out[f"{eid}/{step}"] = (gen.text, gen.timings_ms["simulated_tokens"])
        return out

    ids = [(f"task-{i}#0", s) for i in range(3) for s in range(4)]
    first, second = replies(ids), replies(list(reversed(ids)))
    assert first == second
    model = SimulatedModel(seed=3, fixed_work=True)
    for eid, step in ids:
        answers = '"action": "answer"' in first[f"{eid}/{step}"][0]
        assert answers == (step + 1 >= model.answer_step(eid))
        assert first[f"{eid}/{step}"][1] == model.output_tokens(f"{eid}/{step}", 512)


def test_planned_work_follows_the_draws_and_the_step_caps() -> None:
    model = SimulatedModel(seed=0, fixed_work=True)
    plan = [(f"t{i}#0", 3) for i in range(20)]
    work = planned_work(model, plan, window=4, max_tokens=512, browser_s=lambda e, s: 0.25,
                        open_s=lambda e: 1.0, finish_s=lambda e: 0.0)
    for (eid, cap), w in zip(plan, work, strict=True):
        answer = model.answer_step(eid)
        assert len(w.steps) == min(answer, cap)
        assert [s.images for s in w.steps] == [min(s, 4) + 1 for s in range(len(w.steps))]
        if answer <= cap:  # the answering step sends nothing to the browser
            assert w.steps[-1].browser_s == 0.0


def test_slow_and_uneven_page_loads_widen_the_lockstep_loss_and_the_table_is_stored(tmp_path: Path) -> None:
    lm = LatencyModel.qwen_vl_7b_h100()
    local, live = BROWSERS["local sites"], BROWSERS["live web (assumed)"]
    assert local.step_s("a/1") == local.action_s and local.open_s("a/open") == 1.0
    loads = [live.step_s(f"e/{i}") for i in range(400)]
    assert loads == [live.step_s(f"e/{i}") for i in range(400)]  # seeded per step: both modes see the same web
    assert 0.35 < sum(s > live.action_s for s in loads) / len(loads) < 0.65  # about half the steps navigate
    caps = MIXES["caps 10/20/30 (WebGym train)"]
    assert mix_ratio(caps, 32, lm, live).ratio > mix_ratio(caps, 32, lm, local).ratio > 1.0
    assert main(["--concurrency", "4", "--out", str(tmp_path)]) == 0
    stored = json.loads((tmp_path / "async_prediction.json").read_text())
    assert len(stored["summary"]) == len(stored["table"]) == len(BROWSERS) * len(MIXES)
    assert all(r["ratio"] >= 1.0 for r in stored["table"]) and "not measured" in stored["notes"][0]


def test_a_long_episode_started_last_runs_alone_started_first_the_short_ones_fill_in() -> None:
    # Two runners: eight short episodes and one long one. Last in the order, the long one starts after the short
    # ones and runs alone; first (the engine's longest-first order), the short ones run beside it.
    short = [episode(f"s{i}", [100]) for i in range(8)]
    long_ = episode("long", [100] * 8)
    step = 0.1 + 1.0 + 0.5
    assert async_makespan([*short, long_], 2, FLAT)[0] == pytest.approx(4 * (1 + step) + 1 + 8 * step)
    # First: one runner takes the long one, the other six short ones, then each runner takes one more.
    assert async_makespan([long_, *short], 2, FLAT)[0] == pytest.approx(7 * (1 + step))


def test_the_async_suites_plan_is_the_engines_order(tmp_path: Path) -> None:
    from bench.suites.async_sync import episode_plan
    from bench.suites.common import write_task_mix

    tasks = tmp_path / "tasks.jsonl"
    write_task_mix(tasks, 0, seed=0)
    lockstep = episode_plan(tasks, 64, "sync", None)
    asynchronous = episode_plan(tasks, 64, "async", None)
    assert sorted(lockstep) == sorted(asynchronous) and lockstep != asynchronous
    assert asynchronous == sorted(lockstep, key=lambda e: -e[1])  # largest step caps first, ties in file order
    assert len({cap for _, cap in lockstep}) > 1
