"""Build a policy by name (the CLI's ``--policy``)."""

from __future__ import annotations

from policy.base import Policy

POLICY_NAMES = ("scripted", "random", "instant")


def make_policy(name: str, seed: int = 0) -> Policy:
    """A policy instance for ``name``; ValueError for unknown names."""
    if name == "scripted":
        from policy.scripted import ScriptedPolicy
        return ScriptedPolicy()
    if name == "random":
        from policy.random_policy import RandomPolicy
        return RandomPolicy(seed=seed)
    if name == "instant":
        from policy.instant import InstantPolicy
        return InstantPolicy()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
