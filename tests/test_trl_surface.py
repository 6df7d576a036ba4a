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


def test_installing_hooks_replaces_exactly_the_pinned_private_methods_and_calls_the_hooks():
    calls = []

    class Seen(trl_surface.Hooks):
        def before_clip(self):
            calls.append("before_clip")

        def on_clip(self, grad_norm):
            calls.append(grad_norm)

    trainer = type("Stand", (), {n: (lambda self, *a: 2.5) for n in trl_surface.HOOKED_METHODS})()
    trl_surface.install_hooks(trainer, Seen())
    assert set(vars(trainer)) == set(trl_surface.HOOKED_METHODS)
    assert trainer._clip_grad_norm(None) == 2.5 and calls == ["before_clip", 2.5]
    assert set(vars(trl_surface.hooked_trainer_base())) - {"__module__", "__qualname__", "__doc__"} == {"__init__"}


def test_generation_output_carries_the_fields_the_logger_reads():
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in trl_surface.GENERATION_KEYS:
        assert f'"{key}"' in source, key
