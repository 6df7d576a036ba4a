"""Per-rollout losses and per-example gradients: the quantities the sketches and targets are built from."""
