"""How often a model shows the behavior on probe and plain prompts (rule behavior)."""
