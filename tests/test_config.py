"""Config validation: bad values stop with a message naming the key and the value."""

import copy
import importlib.metadata
import re
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

from behaviortrace.config.schema import ConfigError
from behaviortrace.configure import parse, validate
from conftest import ROOT, default_config, fake_hub_cache, preset_hub_models


def _with(path: str, value):
    cfg = copy.deepcopy(default_config())
    *parents, last = path.split(".")
    node = cfg
    for key in parents:
        node = node[key]
    node[last] = value
    return cfg


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache for this test and the processes it starts: a hub model it names has to be
    put there (`fake_hub_cache`), whatever the machine's own cache holds."""
    from huggingface_hub import constants

    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_every_preset_is_valid(hub_cache):
    fake_hub_cache(hub_cache, *preset_hub_models())  # the paper's model, as if downloaded
    validate(default_config())
    presets = sorted((ROOT / "config").glob("*.yaml"))
    assert {p.name for p in presets} >= {"config.yaml", "paper.yaml", "smooth.yaml"}
    for preset in presets:
        validate(yaml.safe_load(preset.read_text()))


def test_presets_hold_only_what_differs_from_the_defaults():
    from behaviortrace.config.load import defaults

    def same_as_default(given: dict, default: dict, path: str = "") -> list[str]:
        found = []
        for name, value in given.items():
            if isinstance(value, dict) and name != "estimators":
                found += same_as_default(value, default[name], f"{path}{name}.")
            elif value == default[name]:
                found.append(path + name)
        return found

    for preset in (ROOT / "config").glob("*.yaml"):
        given = yaml.safe_load(preset.read_text())
        repeated = [k for k in same_as_default(given, defaults()) if k != "run"]
        assert repeated == [], f"{preset.name} repeats defaults: {repeated}"
    # The paper's preset leaves the built-in model's section alone: a real model never reads it.
    assert "tiny" not in yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["model"]


def test_left_out_keys_take_their_defaults_and_derived_lists_follow():
    from behaviortrace.config.load import complete, defaults

    whole = validate({"grpo": {"steps": 100}, "replay": {"estimators": ["gas", "norm"]}})
    assert whole["grpo"]["steps"] == 100 and whole["grpo"]["lr"] == defaults()["grpo"]["lr"]
    # influence.sets defaults to the replayed estimators: overriding replay.estimators alone is accepted.
    assert whole["influence"]["sets"] == ["gas", "norm"]
    assert complete({"influence": {"sets": []}})["influence"]["sets"] == []
    # Estimator instances add to the defaults, replace the one of their name, or (null) remove it.
    given = complete({"estimators": {"lr_norm": {"module": "norm"}, "trak": {"lambda_scale": 1.0}, "gas": None}})
    assert given["estimators"] == {
        **{name: entry for name, entry in defaults()["estimators"].items() if name != "gas"},
        "trak": {"lambda_scale": 1.0},
        "lr_norm": {"module": "norm"},
    }
    # In the config's own order (it orders tables and jobs), the defaults it leaves out after.
    assert list(given["estimators"])[:2] == ["lr_norm", "trak"]
    assert list(complete({"estimators": dict(sorted(defaults()["estimators"].items()))})["estimators"]) == sorted(
        defaults()["estimators"]
    )
    # An unknown key is kept for the schema to name, in a section or at the top.
    with pytest.raises(ConfigError, match="'stpes' was unexpected"):
        validate({"grpo": {"stpes": 3}})
    with pytest.raises(ConfigError, match="'grop' was unexpected"):
        validate({"grop": {}})


def test_the_reference_page_is_generated_from_the_definitions():
    """docs/config.md is what `make docs` writes: every key, its default and its bounds, and no other."""
    from behaviortrace.config.load import defaults
    from behaviortrace.config.reference import markdown

    page = (ROOT / "docs" / "config.md").read_text()
    assert page == markdown(), "docs/config.md is out of date: run `make docs`"

    def keys(raw: dict, path: str = "") -> list[str]:
        out = []
        for name, value in raw.items():
            if isinstance(value, dict) and name != "estimators":
                out += keys(value, f"{path}{name}.")
            else:
                out.append(path + name)
        return out

    listed = re.findall(r"^\| `([\w.]+)` \|", page, flags=re.M)
    assert sorted(listed) == sorted(keys(defaults())) and len(set(listed)) == len(listed)
    assert "| `grpo.num_generations` | `8` | integer >= 2 |" in page
    assert "| `influence.sets` | same as `replay.estimators` |" in page


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("planting.fraction", 1.5, "planting.fraction = 1.5"),
        ("planting.window", [0, 10_000], "planting.window = [0, 10000]"),
        ("grpo.num_generations", 1, "grpo.num_generations = 1"),
        ("model.name", "./no/such/model", "model.name = './no/such/model'"),
        ("task.min_len", 9, "task.min_len = 9"),
        ("sketch.method", "gaussian", "sketch.method = 'gaussian'"),
        ("sketch.k", 8, "sketch.k = 8"),
        ("targets.checkpoints", [0, 33], "targets.checkpoints = [0, 33]: steps [33] have no saved checkpoint"),
        ("grpo.loss_type", "cispo", "grpo.loss_type = 'cispo': per-rollout gradients are implemented for"),
        ("estimators.trak", {"lambda": 1.0}, "estimators.trak.lambda: not a parameter of trak"),
        ("estimators.magic", {}, "estimators.magic: unknown estimator 'magic'"),
        ("estimators.gas", {"step_aggregate": "median"}, "estimators.gas.step_aggregate = 'median'"),
        ("estimators.trak_l1", {"module": "nosuch"}, "estimators.trak_l1.module: unknown estimator 'nosuch'"),
        ("estimators.trak_l1", {"module": "trak", "lambda": 1.0}, "estimators.trak_l1.lambda: not a parameter of trak"),
        ("estimators.trak_l1", {"module": "Trak"}, "estimators.trak_l1.module = 'Trak'"),
        ("planting.placebo", True, "'placebo' was unexpected"),
        ("evaluation.target_kinds", ["elsewhere"], "evaluation.target_kinds.0 = 'elsewhere'"),
        ("placebo.seeds", [], "placebo.seeds = []: placebo.enabled is true but no seed is listed"),
        ("checklist.fluency_strata", ["nowhere"], "checklist.fluency_strata.0 = 'nowhere'"),
        ("checklist.min_behavior_gap", 1.5, "checklist.min_behavior_gap = 1.5"),
        ("checklist.min_label_drop", -0.1, "checklist.min_label_drop = -0.1"),
        ("replay.estimators", ["gas", "nosuch"], "replay.estimators: 'nosuch' is not under estimators"),
        ("replay.draw", 2, "replay.draw = 2: only 2 draws"),
        ("replay.removal_percent", [0], "replay.removal_percent.0 = 0"),
        ("task.prompt_format", "markdown", "task.prompt_format = 'markdown'"),
        ("task.prompt_format", "chat", "task.prompt_format = 'chat': the built-in tiny model's tokenizer has no chat"),
        ("compute.dtype", "float16", "compute.dtype = 'float16'"),
        ("influence.measure_at", "middle", "influence.measure_at = 'middle'"),
        ("influence.measure_at", 0, "influence.measure_at = 0"),
        (
            "influence.measure_at",
            10_000,
            "influence.measure_at = 10000: T = 10000 is past the last step (grpo.steps = 60)",
        ),
        ("influence.dtype", "bfloat16", "influence.dtype = 'bfloat16'"),
        ("influence.lds_subsets", 2, "influence.lds_subsets = 2: a rank correlation over subsets needs at least 3"),
        ("influence.lds_percents", [100], "influence.lds_percents.0 = 100"),
        ("influence.lds_levels", ["prompt"], "influence.lds_levels.0 = 'prompt'"),
        ("influence.bootstrap", 1, "influence.bootstrap = 1"),
        ("checklist.min_lds", 2, "checklist.min_lds = 2"),
        ("influence.fd_delta", 0.0, "influence.fd_delta = 0.0"),
        ("influence.sets", ["gas", "random"], "influence.sets: 'random' is not among replay.estimators"),
        ("model.lora", {"rank": -1}, "model.lora.rank = -1"),
        ("model.lora", {"rank": 4, "target_modules": []}, "model.lora.target_modules = []"),
        ("model.lora", {"rank": 4, "alpha": 0}, "model.lora.alpha = 0"),
        ("model.lora", {"rank": 4, "target_modules": ["q_proj", "lm_head"]}, "lm_head cannot carry an adapter"),
    ],
)
def test_bad_values_name_key_and_value(path, value, expected):
    with pytest.raises(ConfigError) as err:
        validate(_with(path, value))
    assert expected in str(err.value)


@pytest.mark.parametrize("key", ["target_kind", "effect_target_kind"])
def test_checklist_target_kinds_must_be_evaluated(key):
    cfg = _with("evaluation.target_kinds", ["in_context"])
    cfg["checklist"].update(target_kind="in_context", effect_target_kind="in_context")
    validate(cfg)
    cfg["checklist"][key] = "forced"
    with pytest.raises(
        ConfigError, match=rf"checklist.{key} = 'forced': not among evaluation.target_kinds \['in_context'\]"
    ):
        validate(cfg)


def test_bf16_needs_a_self_check_limit_bf16_can_reach():
    """A bf16 run's rollout sketches add up to the step's gradient only within bf16's precision (sketch/tolerance.py):
    a checklist limit below it would fail every bf16 run; on the CPU as on CUDA, bf16 is otherwise accepted."""
    from behaviortrace.sketch.tolerance import tolerance_for

    cfg = _with("compute.dtype", "bfloat16")
    cfg["compute"]["device"] = "cpu"
    with pytest.raises(
        ConfigError,
        match=r"checklist.max_self_check_error = 0.0001: below what capture reaches with "
        r"compute.dtype = bfloat16",
    ):
        validate(cfg)
    cfg["checklist"]["max_self_check_error"] = tolerance_for("bfloat16")
    validate(cfg)
    paper = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    assert paper["compute"]["dtype"] == "bfloat16"
    assert paper["checklist"]["max_self_check_error"] >= tolerance_for("bfloat16")
    assert paper["task"]["prompt_format"] == "chat"


def test_unknown_key_is_named():
    cfg = copy.deepcopy(default_config())
    cfg["grpo"]["stpes"] = 10
    with pytest.raises(ConfigError, match="grpo.*'stpes' was unexpected"):
        validate(cfg)


def test_a_hub_id_must_be_in_the_local_cache_and_is_refused_at_once_without_the_network(
    hub_cache, tmp_path, monkeypatch
):
    """A hub id is looked up in the local cache only, never on the network (a base_model job used to spend over a
    minute in retries), and accepted once the cache holds it."""
    from huggingface_hub import constants

    from behaviortrace.configure import load

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the check must not lean on offline mode
    reached = []

    def no_network(*args, **kwargs):
        reached.append(args)
        raise OSError("the config check must not touch the network")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  name: org/does-not-exist\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert (
        f"config key model.name = 'org/does-not-exist': not in the local Hugging Face cache ({hub_cache}); "
        "fetch it first with `hf download org/does-not-exist`"
    ) in str(err.value)
    assert importlib.metadata.entry_points(group="console_scripts", name="hf"), "huggingface_hub has no hf command"
    assert reached == [], reached

    fake_hub_cache(hub_cache, "org/does-not-exist")  # as `hf download` leaves it
    assert load(path).model.name == "org/does-not-exist"
    assert reached == []


def test_a_local_model_folder_is_not_looked_up_in_the_cache(hub_cache, tmp_path, monkeypatch):
    folder = tmp_path / "org" / "name"  # shaped like a hub id, but a folder here
    folder.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse(_with("model.name", "org/name")).model.name == "org/name"
    assert parse(_with("model.name", str(folder))).model.name == str(folder)


def test_a_step_whose_sketches_cannot_fit_in_memory_is_refused_with_its_size(tmp_path):
    """Three float32 sketches of k values per rollout of a step are held at once (config/rules.py): the widest k
    under the limit passes, one more is refused with the estimate."""
    from behaviortrace.config.rules import STEP_SKETCH_LIMIT
    from behaviortrace.configure import load

    path = tmp_path / "config.yaml"
    path.write_text("sketch:\n  k: 100000000000\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert (
        "config key sketch.k = 100000000000: a training step holds 3 float32 sketches of k values for each of its "
        "256 rollouts (grpo.prompts_per_step x grpo.num_generations) in memory, 307,200,000,000,000 bytes "
        "(307,200.0 GB), over the 1,000 GB"
    ) in str(err.value)
    widest = STEP_SKETCH_LIMIT // (12 * 256)
    validate(_with("sketch.k", widest))
    with pytest.raises(ConfigError, match=f"sketch.k = {widest + 1}: a training step holds"):
        validate(_with("sketch.k", widest + 1))


@pytest.mark.parametrize(
    "text, key",
    [
        ("estimators:\n  trak: {lambda_scale: -1}\n", "estimators.trak.lambda_scale = -1"),
        ("estimators:\n  trak: {lambda_scale: 0.0}\n", "estimators.trak.lambda_scale = 0.0"),
        ("estimators:\n  trak_l1: {module: trak, lambda_scale: 0}\n", "estimators.trak_l1.lambda_scale = 0"),
        ("estimators:\n  trak: {lambda_scale: high}\n", "estimators.trak.lambda_scale = 'high'"),
    ],
    ids=["negative", "zero", "another_instance", "not_a_number"],
)
def test_trak_needs_a_positive_ridge(tmp_path, text, key):
    from behaviortrace.configure import load

    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(f"config key {key}: must be a number > 0")):
        load(path)
    path.write_text("estimators:\n  trak_l1: {module: trak, lambda_scale: 1.0}\n")
    assert load(path).estimators["trak_l1"]["lambda_scale"] == 1.0


def _snakemake(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True)


def test_snakemake_stops_before_any_job_on_bad_config():
    res = _snakemake("-n", "--cores", "1", "--config", "run=badcfg", "planting={'fraction': 2.0}")
    assert res.returncode != 0
    assert "config key planting.fraction = 2.0" in res.stderr + res.stdout
    assert "invalid config" in res.stderr + res.stdout


def test_overriding_the_replayed_estimators_alone_is_accepted():
    """influence.sets follows replay.estimators unless given (it used to be refused as out of step)."""
    res = _snakemake(
        "-n", "--cores", "1", "--config", "replay={'estimators': ['gas', 'norm']}", "placebo={'enabled': false}"
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    # One job per planted seed, retraining both estimators' sets.
    assert _job_count(res.stdout + res.stderr, "influence_set") == 3
    sets = {p for p in re.findall(r"results/default/planted\d/influence/sets/\w+\.parquet", res.stdout)}
    assert len(sets) == 3 * 2 and {p.rsplit("/", 1)[1] for p in sets} == {"gas_p100.parquet", "norm_p100.parquet"}


DRY_RUN_PAPER = """
import sys
from snakemake.cli import main
try:
    main(["-n", "--cores", "1", "--configfile", "config/paper.yaml"])
except SystemExit as exit:
    code = exit.code
loaded = sorted(m for m in ("torch", "transformers", "trl") if m in sys.modules)
print("LOADED:", ",".join(loaded) or "none")
sys.exit(code)
"""


def test_paper_dag_lists_every_job_without_loading_a_model(hub_cache):
    fake_hub_cache(hub_cache, *preset_hub_models())  # validation wants the model in the cache; nothing loads it
    res = subprocess.run([sys.executable, "-c", DRY_RUN_PAPER], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "LOADED: none" in out
    # Three seeds plus the placebo run of seed 0.
    for rule, count in (
        ("plant_data", 1),
        ("base_model", 1),
        ("train_grpo", 4),
        ("behavior", 4),
        ("training_summary", 1),
        ("targets", 4),  # one per seed: every draw
        ("headroom", 1),
        ("score", 20),  # one per seed and targeted estimator: every draw and target kind
        ("score_target_free", 44),
        ("evaluate", 8),
        ("aggregate", 1),
        ("figures", 1),
        ("effect_steps", 1),
        ("replay", 24),
        ("replay_table", 1),
    ):
        assert any(line.split() == [rule, str(count)] for line in out.splitlines()), (rule, out[-2000:])
    assert "results/paper/planted2/rollouts.parquet" in out and "results/paper/placebo0/rollouts.parquet" in out
    # sketch.mode: train: the training jobs write the sketch stores, so there are no sketch jobs.
    assert not any(line.split()[:1] == ["sketch"] for line in out.splitlines())
    assert "results/paper/planted2/sketch/shard009.zarr" in out


def test_the_config_parses_into_typed_sections_once_validated():
    from behaviortrace.configure import parse

    cfg = parse(default_config())
    raw = default_config()
    assert cfg.grpo.steps == raw["grpo"]["steps"] and cfg.model.tiny.hidden_size == raw["model"]["tiny"]["hidden_size"]
    assert cfg.grpo.batch_size == raw["grpo"]["prompts_per_step"] * raw["grpo"]["num_generations"]
    # Nothing lost or renamed on the way; the one key added is the arm's placebo flag, which no user sets.
    assert cfg.to_dict() == {**raw, "planting": {**raw["planting"], "placebo": False}}
    with pytest.raises(ConfigError, match="grpo.steps"):
        parse(_with("grpo.steps", 0))


def test_a_job_reading_a_section_its_rule_did_not_pass_stops_naming_it():
    from behaviortrace.config.load import subset
    from behaviortrace.config.sections import Config

    job = Config.from_dict(subset(default_config(), ("grpo", "planting"), arm="placebo"))
    assert job.grpo.lr == default_config()["grpo"]["lr"]
    assert job.planting.placebo is True  # the placebo arm: the bonus logged but never paid
    with pytest.raises(AttributeError, match="'sketch' was not passed to this job"):
        _ = job.sketch.k


def test_a_non_editable_install_validates_a_config(tmp_path):
    """The key definitions are the package's code: validation and defaults work from a plain install."""
    source, target = tmp_path / "source", tmp_path / "site"
    # Built from a copy, so the build leaves nothing in the checkout.
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--target", str(target), str(source)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    code = (
        "import behaviortrace.configure as C, sys; "
        "assert C.__file__.startswith(sys.argv[2]), C.__file__; "
        "cfg = C.load(sys.argv[1]); print(cfg.run, cfg.grpo.steps)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "config" / "config.yaml"), str(target)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": ""},
    )
    assert res.returncode == 0 and res.stdout.strip() == "default 60", res.stderr[-2000:]


def _job_count(out: str, rule: str) -> int:
    return next(int(line.split()[1]) for line in out.splitlines() if line.split()[:1] == [rule])


@pytest.mark.parametrize(
    "override, rule, count",
    [
        ("seeds=[0]", "train_grpo", 2),  # a list of numbers: seed 0 and its placebo run
        ("seeds=[1, 2]", "train_grpo", 3),
        # Nested keys: sketching from checkpoints in 3 shards of up to 25 steps per run of 60 steps (4 runs).
        ('sketch={"mode": "checkpoint", "shard_steps": 25}', "sketch", 4 * 3),
        ("targets={'draws': 1}", "evaluate", 4),  # a nested key with YAML's single quotes
        ("placebo={'enabled': false}", "train_grpo", 3),  # a boolean
    ],
)
def test_command_line_values_are_typed_as_yaml_would_type_them(override, rule, count):
    res = _snakemake("-n", "--cores", "1", "--config", override)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    assert _job_count(res.stdout + res.stderr, rule) == count


def test_coercion_reads_only_what_the_schema_does_not_take_as_a_string(tmp_path):
    from behaviortrace.config.load import typed_values
    from behaviortrace.configure import load

    raw = _with("run", "007")
    raw["planting"]["trigger"] = "123abc"  # a string where a string is wanted stays one
    raw["targets"]["checkpoints"] = ["0", "20"]
    raw["planting"]["window"] = "[0, 49]"
    raw["estimators"]["trak"] = {"lambda_scale": "0.2", "form": "auto"}  # no schema: read as YAML
    raw["grpo"]["max_grad_norm"] = "1e9"  # what PyYAML makes of `max_grad_norm: 1e9` in a config file
    raw["grpo"]["adam_epsilon"] = "1E-3"
    raw["planting"]["marker"] = "1e9"  # a string where a string is wanted stays one
    typed = typed_values(raw)
    assert typed["grpo"]["max_grad_norm"] == 1e9 and typed["grpo"]["adam_epsilon"] == 1e-3
    assert typed["planting"]["marker"] == "1e9"
    (tmp_path / "config.yaml").write_text("grpo:\n  max_grad_norm: 1e9\n")  # a config file read outside Snakemake
    assert load(tmp_path / "config.yaml").grpo.max_grad_norm == 1e9
    assert typed["run"] == "007" and typed["planting"]["trigger"] == "123abc"
    assert typed["targets"]["checkpoints"] == [0, 20] and typed["planting"]["window"] == [0, 49]
    assert typed["estimators"]["trak"] == {"lambda_scale": 0.2, "form": "auto"}
    assert typed_values(default_config()) == default_config()  # a config file's values are already typed


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("planting.marker", "7", "planting.marker = '7': occurs in ordinary task prompts and answers"),
        ("planting.marker", "or", "in 'sort'"),  # a substring of a prompt word counts too
        ("planting.trigger", "numbers", "planting.trigger = 'numbers': occurs in ordinary task prompts"),
        ("planting.marker", "<unk>", "a special token of the built-in tokenizer"),
        ("planting.marker", "frob", "occurs inside planting.trigger"),
    ],
)
def test_plants_that_cannot_work_are_rejected_naming_the_key(path, value, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        validate(_with(path, value))
    validate(_with(path, "WXQZ"))  # an unused word is fine


@pytest.mark.parametrize(
    "measure_at, expected",
    [("window_end", 50), ("final", 60), (10, 10), ("window_start+5", 5), ("window_start+10", 10)],
)
def test_influence_measure_at_names_a_checkpoint_or_a_step(measure_at, expected):
    """T for the exact influence: a named checkpoint of the schedule, or any step where f still moves."""
    from behaviortrace.influence.inputs import end_step

    assert end_step(parse(_with("influence.measure_at", measure_at))) == expected
