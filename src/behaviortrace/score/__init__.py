"""The estimator contract and the inputs every estimator sees (rule score)."""
