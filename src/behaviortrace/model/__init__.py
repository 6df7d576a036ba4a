"""The built-in tiny model or a pretrained one, the prompt format and the optional SFT warm-up (the base model is
built by preflight/base_model.py)."""
