"""The task, the planted trigger and marker, and the prompts of a run (rule plant_data)."""
