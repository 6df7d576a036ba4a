"""Leave-out replay: retrain with rollouts left out and measure the behavior (rules replay, replay_table)."""
