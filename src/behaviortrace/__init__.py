"""BehaviorTrace: does training-data attribution find the rollouts that taught a GRPO-trained behavior?"""

__version__ = "0.1.0"
