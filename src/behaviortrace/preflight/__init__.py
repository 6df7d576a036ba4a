"""Trying a model before anything trains (checks.py: every job that needs it, on it) and building the base model
(base_model.py: the tiny model or a real one, its prompt format and SFT warm-up, checked for capture)."""
