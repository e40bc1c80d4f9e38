"""An episode's reward: programmatic rubric checks, the rubric judge and the queue that judges off the rollout path."""
