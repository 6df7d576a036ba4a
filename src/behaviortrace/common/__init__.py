"""Helpers every stage uses: atomic file writes, logging, devices, seeds."""
