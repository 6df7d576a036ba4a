"""Behavior target gradients per analysis checkpoint and generation draw, and headroom (rules targets, headroom)."""
