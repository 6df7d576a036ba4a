"""GRPO training with TRL, logging every rollout (rule train_grpo), and what a finished run leaves."""
