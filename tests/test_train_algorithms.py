"""train.algorithms on small hand-computed examples: FBC selection, GRPO advantages, decoupled PPO."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from train.algorithms import (  # noqa: E402
    assign_advantages,
    chosen_selector,
    decoupled_ppo_loss,
    fbc_select,
    grpo_advantages,
    is_success,
    is_trainable,
)


def rec(episode: str, task: str, reward: float | None, steps: list[dict[str, Any]] | int) -> dict[str, Any]:
    if isinstance(steps, int):
        steps = [{"step": i, "action": {"name": "left_click"}, "page_changed": True} for i in range(steps)]
    return {"episode_id": episode, "task": {"task_id": task}, "steps": steps,
            "reward": None if reward is None else {"value": reward},
            "status": "success" if reward == 1.0 else "failure"}


# ---------------------------------------------------------------------------------------------- FBC


def click(changed: bool | None) -> dict[str, Any]:
    return {"action": {"name": "left_click", "x": 1, "y": 2}, "page_changed": changed}


ANSWER = {"action": {"name": "answer", "text": "42"}}  # no page_changed: the episode ended


def test_fbc_filters_steps_and_weights_by_recency() -> None:
    runs = [
        [rec("old#0", "t", 1.0, [click(True), ANSWER])],  # iteration 0: too old with iterations_back=2
        [rec("mid#0", "t", 1.0, [click(True), click(False), ANSWER]),
         rec("midfail#0", "t", 0.0, [click(True), ANSWER])],  # a failure: nothing kept
        [rec("new#0", "t", 1.0, [click(None), click(True), ANSWER]),
         rec("pending#0", "t", None, [click(True), ANSWER])],  # no reward yet: not a success
    ]
    chosen = fbc_select(runs, iterations_back=2, recency=0.5, n_samples=100, weighting="iteration")
    got = [(c.episode_id, c.step, c.run_index, c.age, c.weight) for c in chosen]
    # Newest first; unchanged (False) and unknown (None) page changes dropped; the final answer kept.
    assert got == [("new#0", 1, 2, 0, 1.0), ("new#0", 2, 2, 0, 1.0),
                   ("mid#0", 0, 1, 1, 0.5), ("mid#0", 2, 1, 1, 0.5)]
    assert chosen[0].step_record is runs[2][0]["steps"][1]
    # With 4 iterations back the oldest run counts too, at 0.5 ** 2.
    assert {(c.episode_id, c.weight) for c in fbc_select(runs, iterations_back=4, weighting="iteration")
            } >= {("old#0", 0.25)}
    # As a build_samples selector: exactly the chosen steps, with uniform or recency loss weights.
    select = chosen_selector(chosen)
    kept = [(i, r["episode_id"], s_i) for i, recs in enumerate(runs) for r in recs
            for s_i, s in enumerate(r["steps"]) if select(i, r, {**s, "step": s_i}) is not None]
    assert kept == [(1, "mid#0", 0), (1, "mid#0", 2), (2, "new#0", 1), (2, "new#0", 2)]
    assert chosen_selector(chosen, "recency")(1, runs[1][0], {"step": 2}) == 0.5


def test_fbc_weights_are_webgyms_position_formula_by_default() -> None:
    # A hand-made pool, chronologically: old (2 eligible steps), then mid (its failure and unchanged step left
    # out), then new: positions 0..4 weigh (i + 1) ** 2 = 1, 4, 9, 16, 25.
    runs = [
        [rec("old#0", "t", 1.0, [click(True), ANSWER])],
        [rec("midfail#0", "t", 0.0, [click(True)]), rec("mid#0", "t", 1.0, [click(False), ANSWER])],
        [rec("new#0", "t", 1.0, [click(True), ANSWER])],
    ]
    weights = {(c.episode_id, c.step): c.weight for c in fbc_select(runs)}
    assert weights == {("old#0", 0): 1.0, ("old#0", 1): 4.0, ("mid#0", 1): 9.0, ("new#0", 0): 16.0,
                       ("new#0", 1): 25.0}
    assert {c.weight for c in fbc_select(runs, recency_bias_power=1.0)} == {1.0, 2.0, 3.0, 4.0, 5.0}
    with pytest.raises(ValueError, match="weighting"):
        fbc_select(runs, weighting="newest")


def test_fbc_samples_in_proportion_to_the_recency_weights() -> None:
    runs = [[rec("old#0", "t", 1.0, [ANSWER])], [rec("new#0", "t", 1.0, [ANSWER])]]
    # One draw out of two steps weighted 1 (new) and 0.5 (old): P(new) = 1 / 1.5 = 2/3.
    draws = [fbc_select(runs, n_samples=1, seed=s, weighting="iteration")[0].episode_id for s in range(1500)]
    assert abs(draws.count("new#0") / len(draws) - 2 / 3) < 0.04
    # WebGym's weights: positions 0 and 1 weigh 1 and 4: P(new) = 4/5.
    draws = [fbc_select(runs, n_samples=1, seed=s)[0].episode_id for s in range(1500)]
    assert abs(draws.count("new#0") / len(draws) - 4 / 5) < 0.04
    assert len(fbc_select(runs, n_samples=2, seed=0)) == 2
    assert fbc_select(runs, n_samples=0) == []
    assert fbc_select(runs, n_samples=1, seed=7) == fbc_select(runs, n_samples=1, seed=7)  # seeded


# ---------------------------------------------------------------------------------------------- GRPO


def test_grpo_one_over_k_and_one_over_tau() -> None:
    group = [rec("a#0", "A", 1.0, 2), rec("a#1", "A", 0.0, 5), rec("a#2", "A", 0.0, 4), rec("a#3", "A", 1.0, 1)]
    # mean 0.5, population std 0.5: normalised rewards +1 / -1 (eps = 0 for exact numbers).
    by_k = grpo_advantages(group, normaliser="1/k", k=10, eps=0.0).by_episode()
    assert by_k == {"a#0": [0.1, 0.1], "a#1": [-0.1] * 5, "a#2": [-0.1] * 4, "a#3": [0.1]}
    by_tau = grpo_advantages(group, normaliser="1/|tau|", eps=0.0).by_episode()
    assert by_tau == {"a#0": [0.5, 0.5], "a#1": [-0.2] * 5, "a#2": [-0.25] * 4, "a#3": [1.0]}
    # 1/|tau| makes the long failure's steps weigh less than the short one's; 1/k treats them alike.
    assert abs(by_tau["a#1"][0]) < abs(by_tau["a#2"][0]) and by_k["a#1"][0] == by_k["a#2"][0]


def test_grpo_uneven_group_and_eps() -> None:
    group = [rec("b#0", "B", 1.0, 1), rec("b#1", "B", 0.0, 1), rec("b#2", "B", 0.0, 1)]
    # mean 1/3, std sqrt(2/9): +sqrt(2) and -1/sqrt(2).
    result = grpo_advantages(group, k=1, eps=0.0)
    assert [t.normalised for t in result.trajectories] == pytest.approx([math.sqrt(2), -1 / math.sqrt(2),
                                                                        -1 / math.sqrt(2)])
    with_eps = grpo_advantages(group, k=1, eps=1e-6).trajectories[0].normalised
    assert with_eps == pytest.approx((2 / 3) / (math.sqrt(2 / 9) + 1e-6), rel=1e-12)


def test_grpo_skips_groups_without_variance() -> None:
    groups = {
        "all-won": [rec("w#0", "all-won", 1.0, 3), rec("w#1", "all-won", 1.0, 2)],
        "all-lost": [rec("l#0", "all-lost", 0.0, 3), rec("l#1", "all-lost", 0.0, 3), rec("l#2", "all-lost", 0.0, 1)],
        "alone": [rec("s#0", "alone", 1.0, 2)],
        "unjudged": [rec("u#0", "unjudged", None, 2)],
        "mixed": [rec("m#0", "mixed", 1.0, 1), rec("m#1", "mixed", 0.0, 1), rec("m#2", "mixed", None, 4)],
    }
    result = grpo_advantages(groups)
    assert set(result.skipped) == {"all-won", "all-lost", "alone", "unjudged"}
    assert "zero reward variance" in result.skipped["all-won"] and "reward 1" in result.skipped["all-won"]
    assert "reward 0" in result.skipped["all-lost"]
    assert result.skipped["unjudged"] == "no rewarded trajectories"
    assert result.unrewarded == 2  # u#0 and m#2
    assert [t.episode_id for t in result.trajectories] == ["m#0", "m#1"]
    assert result.by_episode()["m#0"] == pytest.approx([0.1], rel=1e-5)

    class S:  # a stand-in for train.samples.Sample
        def __init__(self, episode_id: str, step: int) -> None:
            self.episode_id, self.step, self.advantage = episode_id, step, 0.0

    kept = assign_advantages([S("m#1", 0), S("w#0", 1)], result)
    assert [(s.episode_id, round(s.advantage, 4)) for s in kept] == [("m#1", -0.1)]


def test_grpo_never_trains_on_what_the_infrastructure_caused() -> None:
    # A blocked site, a lost worker, a judge without a verdict: none carries the task's verdict, whatever reward
    # value a record might hold; only success and failure records are trained on, and the others are counted.
    won, lost = rec("x#0", "X", 1.0, 2), rec("x#1", "X", 0.0, 2)
    blocked = {**rec("x#2", "X", 0.0, 1), "status": "blocked"}
    lost_worker = {**rec("x#3", "X", 0.0, 3), "status": "error", "error_kind": "worker_lost"}
    pending = {**rec("x#4", "X", None, 2), "status": "judge_pending"}
    assert [is_trainable(r) for r in (won, lost, blocked, lost_worker, pending)] == [True, True, False, False, False]
    assert not is_success({**won, "status": "blocked"})
    result = grpo_advantages([won, lost, blocked, lost_worker, pending], k=1, eps=0.0)
    assert [t.episode_id for t in result.trajectories] == ["x#0", "x#1"]
    assert result.by_episode() == {"x#0": [1.0, 1.0], "x#1": [-1.0, -1.0]}
    assert result.excluded == {"blocked": 1, "error": 1, "judge_pending": 1} and result.unrewarded == 3


def test_grpo_shuffled_rewards_are_the_control() -> None:
    # The control run permutes each group's rewards among its members (seeded): the same reward statistics, no
    # link between a trajectory and its own reward.
    group = [rec(f"s#{i}", "S", float(i < 3), 1) for i in range(8)]
    real = grpo_advantages(group, k=1, eps=0.0)
    assert [t.reward for t in real.trajectories] == [1.0] * 3 + [0.0] * 5
    draws = [grpo_advantages(group, k=1, eps=0.0, shuffle_seed=seed) for seed in range(6)]
    for draw in draws:
        assert sorted(t.reward for t in draw.trajectories) == sorted(t.reward for t in real.trajectories)
        assert sorted(t.normalised for t in draw.trajectories) == pytest.approx(
            sorted(t.normalised for t in real.trajectories))
    assert any([t.reward for t in d.trajectories] != [t.reward for t in real.trajectories] for d in draws)
    again = grpo_advantages(group, k=1, eps=0.0, shuffle_seed=3)
    assert [t.reward for t in again.trajectories] == [t.reward for t in draws[3].trajectories]  # reproducible


def test_wilson_interval_and_paired_gain() -> None:
    from train.evaluation import Evaluation, paired_gain, wilson_interval

    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))

    def evaluation(per_task: dict[str, list[float]]) -> Evaluation:
        n = sum(map(len, per_task.values()))
        return Evaluation(label="x", version=0, episodes=n, rewarded=n, successes=int(sum(map(sum, per_task.values()))),
                          mean_steps=1.0, outcomes={}, per_task=per_task)

    before = evaluation({"a": [0.0, 0.0], "b": [1.0, 0.0], "c": [0.0, 0.0], "gone": [1.0]})
    after = evaluation({"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [0.0, 1.0], "new": [0.0]})
    gain = paired_gain(before, after)  # over a, b, c: differences 1, 0.5, 0.5
    assert (gain.tasks, gain.episodes) == (3, 12)
    se = statistics.stdev([1.0, 0.5, 0.5]) / math.sqrt(3)
    assert gain.gain == pytest.approx(2 / 3) and gain.low == pytest.approx(2 / 3 - 1.959964 * se, rel=1e-6)
    assert gain.high == pytest.approx(2 / 3 + 1.959964 * se, rel=1e-6)


# ---------------------------------------------------------------------------------------------- decoupled PPO


def t(values: list[float]) -> Any:
    return torch.tensor([values], dtype=torch.float64)


def test_is_cap_drops_exactly_the_tokens_above_it() -> None:
    w = [1.0, 4.0, 6.0, 4.9, 5.1]
    prox = t([-1.0] * 5)
    behave = prox - torch.log(t(w))  # w = exp(prox - behave)
    theta = prox.clone()  # ratio 1
    mask = torch.ones(1, 5, dtype=torch.bool)
    loss, stats = decoupled_ppo_loss(theta, prox, behave, torch.tensor([1.0], dtype=torch.float64), mask)
    # Kept: w = 1, 4, 4.9 (6 and 5.1 are above the cap 5); the weight is applied unclipped. AReaL's normalisation:
    # the dropped tokens count as zeros in the mean over all 5 tokens of the mask, not a mean over the 3 kept.
    assert float(loss) == pytest.approx(-(1 + 4 + 4.9) / 5)
    assert stats["dropped_frac"] == pytest.approx(2 / 5) and stats["kept_tokens"] == 3
    assert stats["mean_is_weight"] == pytest.approx((1 + 4 + 4.9) / 3)
    # A masked-out token is neither kept nor counted as dropped.
    mask[0, 2] = False
    _, stats = decoupled_ppo_loss(theta, prox, behave, torch.tensor([1.0], dtype=torch.float64), mask)
    assert stats["dropped_frac"] == pytest.approx(1 / 4)
    # No cap: everything counts.
    loss, _ = decoupled_ppo_loss(theta, prox, behave, torch.tensor([1.0], dtype=torch.float64),
                                 torch.ones(1, 5, dtype=torch.bool), is_cap=None)
    assert float(loss) == pytest.approx(-sum(w) / 5)


def test_ppo_clip_and_dual_clip() -> None:
    ratios = [1.5, 0.5, 0.5, 1.5, 5.0]
    adv = t([1.0, 1.0, -1.0, -1.0, -1.0])
    prox = t([-2.0] * 5)
    theta = (prox + torch.log(t(ratios))).requires_grad_(True)
    mask = torch.ones(1, 5, dtype=torch.bool)
    loss, stats = decoupled_ppo_loss(theta, prox, prox.clone(), adv, mask, clip=0.2, dual_clip=3.0)
    # Objectives: min(1.5, 1.2) = 1.2 (clipped); min(0.5, 0.8) = 0.5; min(-0.5, -0.8) = -0.8 (clipped);
    # min(-1.5, -1.2) = -1.5; min(-5, -1.2) = -5, dual clip: max(-5, 3 * -1) = -3.
    assert float(loss.detach()) == pytest.approx(-(1.2 + 0.5 - 0.8 - 1.5 - 3.0) / 5)
    assert stats["clip_frac"] == pytest.approx(2 / 5) and stats["dual_clip_frac"] == pytest.approx(1 / 5)
    loss.backward()
    # d loss / d logp_theta = -A * ratio / n where the unclipped term is taken, 0 where a clip holds.
    assert theta.grad[0].tolist() == pytest.approx([0.0, -0.5 / 5, 0.0, 1.5 / 5, 0.0])
    # Without the dual clip the huge ratio counts in full.
    loss, stats = decoupled_ppo_loss(theta.detach(), prox, prox.clone(), adv, mask, dual_clip=None)
    assert float(loss) == pytest.approx(-(1.2 + 0.5 - 0.8 - 1.5 - 5.0) / 5) and stats["dual_clip_frac"] == 0


def test_ppo_loss_token_mean_over_a_batch_and_no_kept_tokens() -> None:
    prox = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)  # per sequence, broadcast over its tokens
    loss, stats = decoupled_ppo_loss(prox.clone(), prox, prox.clone(), adv, mask)
    assert float(loss) == pytest.approx(-(2 + 2 - 1) / 3) and stats["kept_tokens"] == 3
    loss, stats = decoupled_ppo_loss(prox.clone(), prox, prox.clone(), adv, torch.zeros(2, 3, dtype=torch.bool))
    assert float(loss) == 0.0 and stats["kept_tokens"] == 0
