"""How often a model shows the behavior on probe and control prompts (rule behavior)."""
