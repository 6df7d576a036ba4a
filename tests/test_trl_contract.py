"""The private TRL methods the rollout logger hooks, pinned: fail loudly when an upgrade changes them."""

import inspect

import trl
from trl import GRPOTrainer


def test_trl_version_is_the_pinned_one():
    assert trl.__version__ == "1.16.0"


def test_hooked_methods_keep_their_signatures():
    expected = {
        "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
        "_generate_and_score_completions": ["self", "inputs"],
        "_save_checkpoint": ["self", "model", "trial"],
        "_clip_grad_norm": ["self", "model"],
        "_compute_loss": ["self", "model", "inputs"],
    }
    for name, params in expected.items():
        assert list(inspect.signature(getattr(GRPOTrainer, name)).parameters) == params, name


def test_generation_output_carries_the_fields_the_logger_reads():
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch"):
        assert f'"{key}"' in source, key
