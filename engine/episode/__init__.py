"""One episode: the rollout state machine and what a step's page load came to."""
