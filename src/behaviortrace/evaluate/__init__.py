"""Metrics of every estimator against the label, per seed and draw (rule evaluate)."""
