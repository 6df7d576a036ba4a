"""Shared fixtures: a small but real config, tiny base model and planted data, built once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from behaviortrace.common.job import MODEL_LIBRARIES, settle
from behaviortrace.tools.small_runs import default_config, small_config, workflow_config  # noqa: F401 (fixtures' configs)
from tolerance import install_audit

pytest_plugins = ["cpu_time"]  # --cpu-durations N (tests/cpu_time.py)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
install_audit()  # BT_TOLERANCE_SCALE: a no-op unless set (tests/tolerance.py)
# The model libraries' objects out of the garbage collector's passes, as in a job (common/job.py): the peer libraries'
# gc.collect calls in the tests then cost what they cost in the workflow.
settle(*MODEL_LIBRARIES)


# Modules whose tests compare the floating-point results of two computations (training and its replay, capture
# and autograd, float32 and float64, a trained model's rates and a threshold). `make test` runs them a second
# time under a lower CPU capability (ATEN_CPU_CAPABILITY), so that a tolerance only one processor meets fails
# where it is written (docs/reruns.md). Tests on a whole workflow run are left out: their numbers come from the
# code these tests cover, and the run alone takes longer than all of them.
NUMERIC_MODULES = {
    "test_capture",
    "test_estimators",
    "test_float64",
    "test_grpo",
    "test_influence",
    "test_lora",
    "test_mixed_precision",
    "test_model_families",
    "test_optimizer_effect",
    "test_replay",
    "test_rollout_loss",
    "test_sketch_stage",
    "test_sketchmap",
    "test_tiny_model",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.module.__name__ in NUMERIC_MODULES and "finished_run" not in item.fixturenames:
            item.add_marker(pytest.mark.numerics)
        # Under pytest-xdist (--dist loadgroup), a module's tests that share a module-scoped fixture go to one worker,
        # which computes it once.
        if any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))

    # Tests that wait for a background run last, the run started first (the lowest nice) first: the others run
    # while the runs do.
    def waits(item):
        runs = [BACKGROUND[name][0] for name in item.fixturenames if name in BACKGROUND]
        return (1, min(runs)) if runs else (0, 0)

    items.sort(key=waits)


def fake_hub_cache(root: Path, *repo_ids: str) -> Path:
    """A Hugging Face cache at `root` holding each of `repo_ids` as huggingface_hub lays it out (refs/main naming
    a snapshot that has a config.json): a hit for the hub's cache lookup, which validation asks for a hub id
    (config/rules.py), with nothing downloaded."""
    revision = "0" * 40
    for repo_id in repo_ids:
        repo = root / f"models--{repo_id.replace('/', '--')}"
        (repo / "snapshots" / revision).mkdir(parents=True, exist_ok=True)
        (repo / "snapshots" / revision / "config.json").write_text("{}")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return root


def preset_hub_models() -> list[str]:
    """The hub ids that the presets under config/ name as model.name."""
    names = [
        (yaml.safe_load(p.read_text()) or {}).get("model", {}).get("name") for p in (ROOT / "config").glob("*.yaml")
    ]
    return sorted({name for name in names if name and name != "tiny"})


def typed(raw: dict):
    """The typed config the library takes, from a (possibly edited) config dict."""
    from behaviortrace.config.sections import Config

    return Config.from_dict(raw)


@pytest.fixture(scope="session")
def cfg() -> dict:
    return small_config()


@pytest.fixture(scope="session")
def cpu() -> dict:
    from behaviortrace.common.device import resolve
    from behaviortrace.config.sections import Compute

    return resolve(Compute(device="cpu", dtype="float32"))


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory, cfg, cpu) -> Path:
    from behaviortrace.model import models
    from behaviortrace.preflight.base_model import build_base_model

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("base") / "base_model"
    model, tokenizer = build_base_model(typed(cfg), cpu)
    models.save(model, tokenizer, out)
    return out


@pytest.fixture(scope="session")
def prompts(cfg):
    from behaviortrace.plant.prompts import plant_prompts

    c = typed(cfg)
    return plant_prompts(c.task, c.planting, c.grpo, c.probes, c.probes.seed)


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, cfg, base_model_dir, prompts, cpu) -> dict:
    """One real GRPO run of the small config, with its rollout log, step log and checkpoints on disk."""
    from behaviortrace.tools.grpo_checks import run_training

    out = tmp_path_factory.mktemp("small_run")
    prompts_path = out / "train_prompts.parquet"
    prompts["train"].write_parquet(prompts_path)
    for name in ("probes", "plain"):
        prompts[name].write_parquet(out / f"{name}.parquet")
    rollouts, _ = run_training(cfg, base_model_dir, prompts["train"], 0, out, cpu, probes=prompts["probes"])
    return {"dir": out, "rollouts": rollouts, "cfg": cfg, "base_model": base_model_dir}


def per_row_gradients(model, batch: dict, loss_args: dict) -> dict:
    """Each rollout's gradient by its own backward pass (the independent reference)."""
    from behaviortrace.gradients.batch import completion_logps, rows_of
    from behaviortrace.train.trl_surface import rollout_losses

    n = batch["advantages"].shape[0]
    grads = {name: [] for name, p in model.named_parameters() if p.requires_grad}
    for i in range(n):
        model.zero_grad(set_to_none=True)
        row = rows_of(batch, i, i + 1)
        rollout_losses(
            completion_logps(model, row, loss_args["temperature"]), row, **loss_args["loss"]
        ).sum().backward()
        for name, p in model.named_parameters():
            if p.requires_grad:
                grads[name].append(p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
    model.zero_grad(set_to_none=True)
    return {name: torch.stack(g) for name, g in grads.items()}


@pytest.fixture(scope="session")
def rollout_gradients(small_run, cpu):
    """Real per-rollout gradients of step 1 at checkpoint 0, by autograd one rollout at a time (no KL)."""
    import polars as pl

    from behaviortrace.gradients.batch import step_batch
    from behaviortrace.gradients.per_example import param_layout
    from behaviortrace.model import models

    model, tokenizer = models.load(small_run["dir"] / "train" / "checkpoint-0", cpu)
    batch = step_batch(small_run["rollouts"].filter(pl.col("step") == 1), tokenizer.pad_token_id)
    args = {
        "temperature": 1.0,
        "loss": {
            "loss_type": "dapo",
            "beta": 0.0,
            "max_completion_length": 10,
            "num_items": int(batch["completion_mask"].sum()),
            "n_rows": 12,
        },
    }
    return param_layout(model), per_row_gradients(model, batch, args)


def snakemake_argv(workdir: Path, *args) -> list[str]:
    """A real Snakemake run of the workflow in `workdir`, with its config.yaml merged over the defaults as users pass
    one, on two cores."""
    return [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        *args,
    ]


def snakemake(workdir, *args, env: dict | None = None):
    return subprocess.run(snakemake_argv(workdir, *args), capture_output=True, text=True, env=env)


def package_copy(dest: Path) -> dict:
    """A copy of the package under `dest`/src, and the environment that runs Snakemake and its jobs on it: a test that
    edits the code edits the copy, never the checkout other tests (pytest-xdist workers, background runs) read."""
    package = dest / "src" / "behaviortrace"
    shutil.copytree(ROOT / "src" / "behaviortrace", package, ignore=shutil.ignore_patterns("__pycache__"))
    return {**os.environ, "PYTHONPATH": str(dest / "src")}


# Runs started in the background when the tests are collected (tests/background.py), by the fixture that waits for
# them: name -> (nice, build). `nice` orders them: the lower, the sooner its tests can run (finished_run's are many).
BACKGROUND: dict[str, tuple[int, object]] = {}


def background(fixture: str, nice: int = 0):
    """Register `build(folder) -> [Command]` as the background run that the fixture named `fixture` waits for."""

    def register(build):
        BACKGROUND[fixture] = (nice, build)
        return build

    return register


def shared_root(config) -> Path:
    """The session's temporary folder, which every pytest-xdist worker shares (a worker's own is inside it)."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


def waited(config, name: str) -> Path:
    """The folder of the background run `name` once it has ended, started here if collection did not start it."""
    from background import Background

    nice, build = BACKGROUND[name]
    run = Background(shared_root(config), name)
    run.start(build, nice)
    code, log = run.wait()
    assert code == 0, log
    return run.folder


def study(folder: Path, cfg: dict, *targets: str) -> list:
    """A real Snakemake run of `cfg` (to `targets`, else everything) in `folder`/run."""
    from background import Command

    work = folder / "run"
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    return [Command(snakemake_argv(work, *targets), str(work))]


def second_study_config() -> dict:
    """The small study with other training seeds (their own sampling of every rollout), as far as the items judged
    by intervals read: no placebo arm, no replay of an estimator's set. Its checklist is a rerun that three-valued
    verdicts must not contradict."""
    cfg = workflow_config()
    cfg.update(seeds=[2, 3])
    cfg["placebo"]["enabled"] = False
    cfg["replay"]["estimators"] = []
    cfg["influence"].update(sets=[], lds_both_semantics=False)
    return cfg


background("finished_run")(lambda folder: study(folder, workflow_config()))
background("trained_seed")(lambda folder: study(folder, workflow_config(), "results/wf/planted0/targets/draw0.zarr"))
background("second_study", nice=10)(lambda folder: study(folder, second_study_config(), "results/wf/checklist.json"))


def _run_of(config, name: str) -> tuple[Path, dict]:
    folder = waited(config, name) / "run"
    return folder, yaml.safe_load((folder / "config.yaml").read_text())


@pytest.fixture(scope="session")
def finished_run(request):
    """A real Snakemake run of the whole workflow (two seeds and a placebo seed) on the small config."""
    return _run_of(request.config, "finished_run")


@pytest.fixture(scope="session")
def trained_seed(request):
    """The same workflow run only as far as an estimator that needs the model reads (the first planted seed's
    training and its targets): its numerical checks need no more, and rerun alone under a second CPU. A session that
    runs the whole workflow anyway (finished_run: the same config, so the same files) reads that."""
    if any("finished_run" in item.fixturenames for item in request.session.items):
        return request.getfixturevalue("finished_run")
    return _run_of(request.config, "trained_seed")


@pytest.fixture(scope="session")
def second_study(request):
    """second_study_config's run as far as its checklist."""
    return _run_of(request.config, "second_study")


def pytest_collection_finish(session):
    """Start the background runs the collected tests need (once per session, whichever xdist worker comes first)."""
    from background import Background

    needed = {name for item in session.items for name in item.fixturenames if name in BACKGROUND}
    if "finished_run" in needed:
        needed.discard("trained_seed")  # it reads finished_run's files
    for name in sorted(needed, key=lambda n: BACKGROUND[n][0]):
        nice, build = BACKGROUND[name]
        Background(shared_root(session.config), name).start(build, nice)


def pytest_sessionfinish(session):
    """Stop the background runs nobody waited for (a test failed first, or the session was interrupted)."""
    from background import stop_unfinished

    if not hasattr(session.config, "workerinput"):
        stop_unfinished(shared_root(session.config))


def model_scores(module: str, run, target, **settings) -> np.ndarray:
    """An estimator that needs the model, run as the workflow runs it (score/contract.py): its per-seed preparation,
    then its score of each rollout, in the run's rollout order."""
    from behaviortrace.score import contract

    rollouts, _ = contract.run(module, settings, run, target)
    return rollouts["score"].to_numpy()
