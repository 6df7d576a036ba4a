"""The base model: the built-in tiny model or a pretrained one, with an optional SFT warm-up (rule base_model)."""
