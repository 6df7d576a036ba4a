"""Batches, log-probs and per-example gradients: the quantities the sketches and targets are built from."""
