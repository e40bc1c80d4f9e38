"""Training on recorded trajectories: samples rebuilt from run directories, RL/BC algorithms, exports."""
