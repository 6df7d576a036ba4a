"""Per-rollout gradient sketches: the random maps, the capture preflight, the per-step sketcher, train-time capture
and the Zarr stores (rule sketch)."""
