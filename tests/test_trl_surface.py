"""The private TRL surface the project relies on (train/trl_surface.py), pinned: fail loudly when an
upgrade changes it."""

import inspect

import trl
from trl import GRPOTrainer

from behaviortrace.train import trl_surface


def test_trl_version_is_the_pinned_one():
    assert trl.__version__ == trl_surface.TRL_VERSION


def test_hooked_methods_keep_their_signatures():
    for name, params in trl_surface.HOOKED_METHODS.items():
        assert list(inspect.signature(getattr(GRPOTrainer, name)).parameters) == params, name


def test_the_hooked_trainer_overrides_only_the_pinned_private_methods():
    base = trl_surface.hooked_trainer_base()
    overridden = {name for name in vars(base) if name.startswith("_") and not name.startswith("__")}
    assert overridden <= set(trl_surface.HOOKED_METHODS), overridden - set(trl_surface.HOOKED_METHODS)


def test_generation_output_carries_the_fields_the_logger_reads():
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in trl_surface.GENERATION_KEYS:
        assert f'"{key}"' in source, key
