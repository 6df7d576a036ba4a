"""Metrics of every estimator against the ground truth, per seed and draw (rule evaluate)."""
