"""Per-rollout gradient sketches: the random maps, the per-step sketcher and the Zarr stores (rule sketch)."""
