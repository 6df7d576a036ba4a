"""Metrics of every estimator against the labels, per seed and draw (rule evaluate)."""
