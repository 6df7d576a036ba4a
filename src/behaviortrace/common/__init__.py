"""Helpers for every layer above config: atomic file writes, logging, devices, seeds, code digests, Markdown tables
and their HTML, and the vector helpers estimators share."""
