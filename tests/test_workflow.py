"""Real Snakemake runs of the workflow on a shrunken default config."""

import copy
import json
import shutil
import subprocess
import sys

import numpy as np
import polars as pl
import yaml

from behaviortrace.sketch.store import open_store, read_rows
from conftest import package_copy, small_config, snakemake


def test_every_output_exists_and_is_consistent(finished_run):
    workdir, cfg = finished_run
    out = workdir / "results" / "wf"
    g = cfg["grpo"]
    evaluated_seeds = set()
    for seed in cfg["seeds"]:
        rollouts = pl.read_parquet(out / f"planted{seed}" / "rollouts.parquet")
        assert rollouts.height == g["steps"] * g["prompts_per_step"] * g["num_generations"]
        assert rollouts["seed"].unique().to_list() == [seed]
        steps = pl.read_parquet(out / f"planted{seed}" / "steps.parquet")
        assert steps["step"].to_list() == list(range(g["steps"]))
        assert ((steps["clip_coef"] > 0) & (steps["clip_coef"] <= 1)).all()
        manifest = json.loads((out / f"planted{seed}" / "checkpoints.json").read_text())
        behavior = pl.read_parquet(out / f"planted{seed}" / "behavior.parquet")
        assert sorted(behavior["step"].unique().to_list()) == [c["step"] for c in manifest["checkpoints"]]
        assert set(behavior["prompt_set"]) == {"probes", "plain"}
        shards = [
            read_rows([out / f"planted{seed}" / "sketch" / f"shard{i:03d}.zarr"], with_sketches=False)[0]
            for i in range(2)
        ]
        assert np.concatenate([r["rollout_id"] for r in shards]).tolist() == rollouts["rollout_id"].sort().to_list()
        # Published from the training directory as hard links: no second copy on disk.
        chunk = next(
            p for p in (out / f"planted{seed}" / "sketch" / "shard000.zarr" / "sketch").rglob("*") if p.is_file()
        )
        assert chunk.stat().st_nlink == 2
        for draw in range(cfg["targets"]["draws"]):
            assert open_store(out / f"planted{seed}" / "targets" / f"draw{draw}.zarr")["forced"].shape[0] == len(
                manifest["checkpoints"]
            )
        for draw in range(cfg["targets"]["draws"]):
            metrics = pl.read_parquet(out / f"planted{seed}" / "metrics" / f"draw{draw}.parquet")
            paid = metrics.filter((pl.col("metric") == "paid_unfindable") & (pl.col("stratum") == "all"))
            assert paid["n"].to_list() == [int(rollouts["paid"].sum())]
            if paid["n"][0] > 0:
                evaluated_seeds.add(seed)
                assert set(metrics["estimator"]) == set(cfg["estimators"]) | {"label", "behavior_tokens"}
                assert set(metrics["level"]) >= {"rollout", "step", "step_summed", "token"}
            else:  # nothing to find: only the label's count
                assert set(metrics["estimator"]) == {"label"}
            assert (metrics["seed"] == seed).all() and (metrics["draw"] == draw).all()
            scores = pl.read_parquet(out / f"planted{seed}" / "scores" / "gas" / f"draw{draw}_in_context.parquet")
            assert scores.height == rollouts.height
    assert evaluated_seeds, "no seed of the small run has paid rollouts to evaluate against"
    for seed in cfg["placebo"]["seeds"]:
        # The placebo arm: same prompts and seed, the bonus logged as eligible but never paid; its ground
        # truth is the set that would have been paid.
        placebo = pl.read_parquet(out / f"placebo{seed}" / "rollouts.parquet")
        planted = pl.read_parquet(out / f"planted{seed}" / "rollouts.parquet")
        assert not placebo["paid"].any() and placebo["eligible"].any()
        assert (
            placebo.filter(pl.col("step") == 0)["prompt"].to_list()
            == planted.filter(pl.col("step") == 0)["prompt"].to_list()
        )
        for draw in range(cfg["targets"]["draws"]):
            metrics = pl.read_parquet(out / f"placebo{seed}" / "metrics" / f"draw{draw}.parquet")
            paid = metrics.filter((pl.col("metric") == "paid_unfindable") & (pl.col("stratum") == "all"))
            assert paid["n"].to_list() == [int((placebo["eligible"] & placebo["behavior"]).sum())]
    headroom = pl.read_parquet(out / "tables" / "headroom.parquet")
    assert headroom.height == len(cfg["seeds"]) * cfg["targets"]["draws"] * len(manifest["checkpoints"])
    assert "| seed | draw | step |" in (out / "tables" / "headroom.md").read_text()
    summary = pl.read_parquet(out / "tables" / "training.parquet")
    assert summary["seed"].to_list() == cfg["seeds"] + cfg["placebo"]["seeds"]
    assert summary["arm"].to_list() == ["planted"] * len(cfg["seeds"]) + ["placebo"] * len(cfg["placebo"]["seeds"])
    assert "n_paid_zero_advantage" in summary.columns
    assert "| seed |" in (out / "tables" / "training.md").read_text()


def test_the_run_records_its_whole_config_and_its_page_opens_with_the_settings(finished_run):
    from behaviortrace.config.load import complete
    from behaviortrace.config.record import read_header

    workdir, cfg = finished_run
    out = workdir / "results" / cfg["run"]
    assert yaml.safe_load((out / "config.yaml").read_text()) == complete(cfg)
    header = read_header(out / "config.yaml")
    assert header["behaviortrace"] and header["commit"]
    page = (out / "results.md").read_text()
    settings = page[page.index("## Settings") : page.index("## Checklist")]
    assert page.index("## Settings") < page.index("## Checklist")
    expected = [
        f"| GRPO steps | {cfg['grpo']['steps']} of {cfg['grpo']['prompts_per_step']} prompts",
        f"epsilon {cfg['grpo']['adam_epsilon']:g}, clipping none",
        f"| T (exact influence) | step {cfg['planting']['window'][1] + 1} (influence.measure_at: window_end) |",
        f"| LDS | {cfg['influence']['lds_subsets']} subsets per cell",
        f"| commit | {header['commit']} |",
    ]
    for line in expected:
        assert line in settings, line


def test_a_failing_job_writes_its_error_into_its_own_log(tmp_path):
    """A job's traceback lands in the rule's log file (as well as on the console), not only on Snakemake's console."""
    log = tmp_path / "logs" / "rule.log"
    code = "import sys; from behaviortrace.common.io import setup_logging; setup_logging(sys.argv[1]); {}['missing']"
    res = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True)
    assert res.returncode == 1
    text = log.read_text()
    assert "job failed" in text and "KeyError: 'missing'" in text and "Traceback" in text
    assert "KeyError: 'missing'" in res.stderr


def test_each_rule_logs_its_progress(finished_run):
    workdir, _ = finished_run
    logs = workdir / "results" / "wf" / "logs"
    assert "supervised step" in (logs / "base_model.log").read_text()
    train_log = (logs / "train_grpo" / "planted0.log").read_text()
    assert "step 6/6" in train_log and "saved checkpoint checkpoint-6" in train_log
    assert "checkpoint 5/5" in (logs / "behavior" / "planted1.log").read_text()
    # sketch.mode: train (the default): the training job sketches every step and checks it against TRL.
    assert not (logs / "sketch").exists()
    seed1_log = (logs / "train_grpo" / "planted1.log").read_text()
    assert "captured shard 1 (steps 3..5): largest self-check error" in seed1_log and "rollouts/s" in seed1_log
    assert "checkpoint 5/5 (step 6)" in (logs / "targets" / "planted0.log").read_text()


def test_every_job_logs_its_start_up_and_the_page_states_the_run_time(finished_run):
    """Every job's log opens with its start-up (common/io.py), shorter than the job, and ends with its CPU time and
    peak memory, which the cost tables read; the results page's run time
    (over the jobs that had ended when its job began) agrees with Snakemake's own record of those jobs' times."""
    import base64

    from behaviortrace.report.cost import elapsed_seconds, fixed_share, read_benchmarks

    workdir, cfg = finished_run
    out = workdir / "results" / cfg["run"]
    jobs = read_benchmarks(out / "benchmarks")
    assert jobs["startup_s"].null_count() == 0, jobs.filter(pl.col("startup_s").is_null())["job"].to_list()
    assert ((jobs["startup_s"] > 0.05) & (jobs["startup_s"] < jobs["wall_s"] + 0.5)).all()
    # Every job logged its end: its CPU time and its peak memory, the kernel's, which is at least the largest of
    # Snakemake's samples of the job's process tree less the shell around it (a few MB).
    assert (jobs["cpu_source"] == "log").all() and jobs["max_rss_mb"].null_count() == 0
    for job in jobs.iter_rows(named=True):
        table = pl.read_csv(out / "benchmarks" / job["job"], separator="\t", null_values=["-", "NA"])
        sampled = table["max_rss"].max()
        assert sampled is None or job["max_rss_mb"] >= sampled - 20, (job["job"], job["max_rss_mb"], sampled)
    assert jobs.filter(pl.col("rule") == "train_grpo")["max_rss_mb"].min() > 200  # it holds the model and TRL
    page_job = jobs.filter(pl.col("rule") == "results_page").row(0, named=True)
    began = page_job["ended"] - page_job["wall_s"]
    seen = jobs.filter(pl.col("ended") < began)
    times = []
    for record in (workdir / ".snakemake" / "metadata").iterdir():
        output = base64.urlsafe_b64decode(record.name + "=" * (-len(record.name) % 4)).decode()
        meta = json.loads(record.read_text())
        benchmarked = meta["rule"] not in ("all", "run_config")  # the rules without a benchmark file
        if benchmarked and output.startswith(f"results/{cfg['run']}/") and meta["endtime"] < began:
            times.append((meta["starttime"], meta["endtime"]))
    recorded = max(end for _, end in times) - min(start for start, _ in times)
    elapsed = elapsed_seconds(seen)
    assert abs(elapsed - recorded) < 5 + 0.02 * recorded, (elapsed, recorded)
    page = (out / "results.md").read_text()
    startup, share, _ = fixed_share(seen)
    logged = f"as {seen.height} of {seen.height} jobs logged it) is {startup:.0f} s, {share:.1%} of their summed wall"
    assert logged in page
    assert f"The run took {elapsed / 60:.1f} min of wall time" in page


def test_snakemake_still_samples_jobs_through_the_interval_the_workflow_sets():
    """workflow/rules/common.smk sets the interval of Snakemake's first benchmark samples of a job to its later one
    (each sample costs Snakemake's process ~20 ms of a model job): the constant must still be the one Snakemake's
    timer reads, or the setting would silently do nothing after an upgrade."""
    import inspect

    import snakemake.benchmark as benchmark

    assert "BENCHMARK_INTERVAL_SHORT" in inspect.getsource(benchmark.ScheduledPeriodicTimer._schedule)
    assert benchmark.BENCHMARK_INTERVAL == 30  # the interval the cost tables' fallback is written for (report/cost.py)


def test_the_preflight_refuses_a_model_before_training_and_says_why_where_users_look(tmp_path):
    """OPT runs its MLP on tokens flattened across the batch, from which the hook-based libraries (kronfluence,
    bergson) cannot take each rollout's gradient: the preflight job fails before the base model is built, so before
    the SFT warm-up, and its reasons are in the rule's log and the console's last lines."""
    from behaviortrace.model import families

    cfg = small_config()
    cfg["run"] = "refused"
    cfg["model"]["name"] = str(families.save_family("opt", tmp_path / "opt", "frobnitz", "QZXBT"))
    cfg["model"]["sft"]["steps"] = 2  # a warm-up that must not start
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(tmp_path, "results/refused/base_model")
    assert res.returncode != 0
    out = tmp_path / "results" / "refused"
    reasons = [
        f"estimators.{name}: (module {name}, library {library}) model.decoder.layers.0.fc1 (Linear) receives its "
        "input as [88, 32], not [rollouts, tokens, features]"
        for name, library in (("ekfac", "kronfluence"), ("trackstar", "bergson"))
    ]
    log = (out / "logs" / "preflight.log").read_text()
    assert all(r in log for r in reasons) and "RefusedModel" in log and "Ways out:" in log
    last = "\n".join(res.stderr.strip().splitlines()[-10:])
    assert all(r in last for r in reasons) and "model.lora.rank > 0" in last and "estimators.<name>: null" in last
    assert not (out / "base_model").exists() and not (out / "logs" / "base_model.log").exists()
    assert not (out / "preflight.json").exists()


def test_the_preflight_runs_before_the_base_model_and_reruns_only_with_it(tmp_path):
    """The preflight tracks only what rebuilds the base model: a new setting of a model estimator reruns neither
    (its score jobs rerun, test_a_new_model_estimator_instance_is_scored_in_one_invocation); a new model both."""
    cfg = small_config()
    cfg["run"] = "pre"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(tmp_path, "results/pre/base_model")
    assert res.returncode == 0, res.stderr[-3000:]
    assert [rule for rule, _ in _jobs_run(res.stderr)] == ["preflight", "base_model"]
    report = json.loads((tmp_path / "results" / "pre" / "preflight.json").read_text())
    assert set(report["seconds"]) == {"capture", "ekfac", "trackstar", "dattri_trak", "influence"}
    changes = (
        (("estimators", "ekfac", "damping", 0.01), {}),
        (("estimators", "trak", "lambda_scale", 0.2), {}),
        (("model", "sft", "steps", cfg["model"]["sft"]["steps"] + 1), {"preflight": 1, "base_model": 1}),
    )
    for (section, name, key, value), reruns in changes:
        edited = copy.deepcopy(cfg)
        edited[section][name][key] = value
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(edited))
        res = snakemake(tmp_path, "results/pre/base_model", "-n", "--configfile", str(path))
        assert res.returncode == 0, res.stderr[-3000:]
        assert job_counts(res.stdout + res.stderr) == reruns, name


def job_counts(output: str) -> dict[str, int]:
    counts, in_table = {}, False
    for line in output.splitlines():
        parts = line.split()
        if parts[:2] == ["job", "count"]:
            in_table = True
        elif in_table and len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            counts[parts[0]] = int(parts[1])
        elif in_table and counts and not parts:
            break
    return counts


def test_changing_one_estimator_reruns_only_its_scores_and_the_evaluation(finished_run):
    workdir, cfg = finished_run
    changed = copy.deepcopy(cfg)
    changed["estimators"]["trak"]["lambda_scale"] = 0.2
    path = workdir / "changed.yaml"
    path.write_text(yaml.safe_dump(changed))
    res = snakemake(workdir, "-n", "--configfile", str(path))
    assert res.returncode == 0, res.stderr[-3000:]
    n_draws, n_targets = cfg["targets"]["draws"], len(cfg["evaluation"]["target_kinds"])
    n_runs = len(cfg["seeds"]) + len(cfg["placebo"]["seeds"])
    expected = {
        "score": n_runs,  # one job per seed: trak's factorization, then every draw and target kind
        "evaluate": n_runs * n_draws,
        "aggregate": 1,
        "effect_steps": 1,  # trak's step scores beside the measured effect
        "figures": 1,
        "results_page": 1,
        "run_config": 1,  # the record of the whole config: any key's change rewrites it
        "influence_metrics": 1,  # trak's scores against the exact influence
        "influence_figure": 1,
        "all": 1,
    }
    assert job_counts(res.stdout + res.stderr) == expected
    outputs = [line for line in res.stdout.splitlines() if line.strip().startswith("output:")]
    written = [o for o in outputs if "/scores/" in o]
    assert len(written) == expected["score"] and all("/scores/trak/" in o for o in written)
    # Each writes its seed's rollout and step scores of every draw and target kind.
    assert all(o.count(".parquet") == 2 * n_draws * n_targets for o in written), written


def test_a_new_model_estimator_instance_is_scored_in_one_invocation(finished_run):
    """An instance of an estimator that needs the model, added to a finished run: the first invocation plans its
    score_model jobs and everything after them (the preflight, behind the base model, stays as it was)."""
    workdir, cfg = finished_run
    changed = copy.deepcopy(cfg)
    changed["estimators"]["trackstar8"] = {"module": "trackstar", "projection_dim": 8}
    path = workdir / "model_estimator.yaml"
    path.write_text(yaml.safe_dump(changed))
    res = snakemake(workdir, "-n", "--configfile", str(path))
    assert res.returncode == 0, res.stderr[-3000:]
    counts = job_counts(res.stdout + res.stderr)
    n_draws, n_targets = cfg["targets"]["draws"], len(cfg["evaluation"]["target_kinds"])
    n_runs = len(cfg["seeds"]) + len(cfg["placebo"]["seeds"])
    # One job per seed: trackstar's rollout side fitted once, then every draw and target kind scored.
    assert counts.get("score_model") == n_runs, counts
    assert counts.get("evaluate") == n_runs * n_draws and counts.get("aggregate") == 1, counts
    assert not {"preflight", "base_model", "train_grpo", "score", "score_target_free"} & set(counts), counts
    outputs = [line for line in res.stdout.splitlines() if line.strip().startswith("output:") and "/scores/" in line]
    assert len(outputs) == n_runs and all("/scores/trackstar8/" in o for o in outputs)
    assert all(o.count(".parquet") == 2 * n_draws * n_targets for o in outputs), outputs


def test_a_finished_run_is_sketched_again_from_its_checkpoints_without_retraining(finished_run):
    """The recipe in docs/sketches.md: checkpoint mode with another k, file times only, sketch rules forced."""
    workdir, cfg = finished_run
    changed = copy.deepcopy(cfg)
    changed["sketch"].update(mode="checkpoint", k=128)
    path = workdir / "resketch.yaml"
    path.write_text(yaml.safe_dump(changed))
    res = snakemake(
        workdir, "-n", "--configfile", str(path), "--rerun-triggers", "mtime", "--forcerun", "sketch", "targets"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    counts = job_counts(res.stdout + res.stderr)
    n_runs = len(cfg["seeds"]) + len(cfg["placebo"]["seeds"])
    n_shards = -(-cfg["grpo"]["steps"] // cfg["sketch"]["shard_steps"])
    assert counts["sketch"] == n_runs * n_shards and counts["targets"] == n_runs  # one targets job per seed
    assert not {"train_grpo", "base_model", "plant_data", "behavior"} & set(counts)
    assert counts["sketch_matrix"] == n_runs and counts["evaluate"] == n_runs * cfg["targets"]["draws"]


ADDED_ESTIMATOR = '''"""A user's estimator, added by a test: the gradient norm times the rollout's advantage."""

import numpy as np

USES_TARGET = False
STEP_AGGREGATE = "sum"


def score(view, target, scale=1.0):
    return scale * np.asarray(view.norms) * view.rollouts["advantage"].to_numpy()
'''


def _jobs_run(log: str) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job a real Snakemake run started."""
    jobs, rule = [], None
    for line in log.splitlines():
        text = line.strip()
        if text.startswith(("rule ", "localrule ")) and text.endswith(":"):
            rule = text.split()[1].rstrip(":")
            jobs.append((rule, ""))
        elif text.startswith("wildcards:") and jobs:
            jobs[-1] = (jobs[-1][0], text)
    return jobs


def test_adding_one_estimator_runs_only_its_scores_and_updates_the_tables(finished_run, tmp_path):
    """What docs/estimators.md tells a user to do: one new module and one config entry, then run again (the module
    added to a copy of the package)."""
    workdir = tmp_path / "copy"
    shutil.copytree(finished_run[0], workdir, symlinks=True)
    cfg = copy.deepcopy(finished_run[1])
    cfg["estimators"]["adv_norm"] = {"scale": 2.0}
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = package_copy(tmp_path)
    (tmp_path / "src" / "behaviortrace" / "estimators" / "adv_norm.py").write_text(ADDED_ESTIMATOR)
    res = snakemake(workdir, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = _jobs_run(res.stderr)
    n_runs = len(cfg["seeds"]) + len(cfg["placebo"]["seeds"])
    rules = sorted({rule for rule, _ in jobs})
    expected = ["aggregate", "all", "effect_steps", "evaluate", "figures", "influence_figure", "influence_metrics"]
    assert rules == [*expected, "results_page", "run_config", "score_target_free"], rules
    scores = [w for rule, w in jobs if rule == "score_target_free"]
    # A control without a target does not depend on the generation draw: one score job per run, read by every draw.
    assert len(scores) == n_runs and all("estimator=adv_norm" in w for w in scores)
    metrics = pl.read_parquet(workdir / "results" / "wf" / "tables" / "metrics.parquet")
    before = pl.read_parquet(finished_run[0] / "results" / "wf" / "tables" / "metrics.parquet")
    assert metrics.filter(pl.col("estimator") == "adv_norm").height > 0
    keys = ["arm", "seed", "draw", "estimator", "target", "level", "stratum", "metric"]
    assert metrics.filter(pl.col("estimator") != "adv_norm").sort(keys).equals(before.sort(keys))
    checklist = json.loads((workdir / "results" / "wf" / "checklist.json").read_text())
    assert "adv_norm" in checklist["estimators"]


def test_second_run_has_nothing_to_do(finished_run):
    workdir, _ = finished_run
    res = snakemake(workdir, "-n")
    assert res.returncode == 0
    assert "Nothing to be done" in res.stdout + res.stderr


def test_editing_a_shared_estimator_helper_reruns_exactly_the_estimators_that_use_it(finished_run, tmp_path):
    """The score jobs' code digest covers the project modules an estimator imports, not just its own file (the helper
    edited in a copy of the package)."""
    from behaviortrace.common.imports import PACKAGE_ROOT
    from behaviortrace.score.contract import dependencies

    workdir, cfg = finished_run
    helper = PACKAGE_ROOT / "common" / "vectors.py"
    modules = {e: (entry or {}).get("module", e) for e, entry in cfg["estimators"].items()}
    users = {e for e, module in modules.items() if helper in dependencies(module)}
    # Not fluency or random; norm_post_clip is an instance of norm.
    assert users == {"adam_tracin", "gas", "norm", "norm_post_clip", "token_alignment", "tracincp", "trak"}
    env = package_copy(tmp_path)
    edited = tmp_path / "src" / "behaviortrace" / "common" / "vectors.py"
    edited.write_text(helper.read_text() + "\n# edited by a test\n")
    res = snakemake(workdir, "-n", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stdout + res.stderr
    rerun = {
        line.split("estimator=")[1].split(",")[0]
        for line in log.splitlines()
        if line.strip().startswith("wildcards:") and "estimator=" in line
    }
    assert rerun == users
    n_runs = len(cfg["seeds"]) + len(cfg["placebo"]["seeds"])
    # One job per seed and estimator: targeted estimators in rule score (every draw and target kind), norm's
    # instances (no target) in rule score_target_free.
    targeted = [e for e in users if modules[e] != "norm"]
    counts = job_counts(log)
    assert counts["score"] == n_runs * len(targeted)
    assert counts["score_target_free"] == n_runs * (len(users) - len(targeted))
    assert snakemake(workdir, "-n").stdout.count("rule score") == 0  # restored: nothing to do again


def test_two_instances_of_one_module_run_side_by_side_and_rerun_apart(finished_run, tmp_path):
    """`trak_l1: {module: trak, lambda_scale: 1.0}` beside `trak`: its own score files and table rows, and a
    change of its settings reruns its jobs only; both instances share the module's code digest."""
    from behaviortrace.score.contract import Instance

    workdir = tmp_path / "copy"
    shutil.copytree(finished_run[0], workdir, symlinks=True)
    cfg = copy.deepcopy(finished_run[1])
    cfg["estimators"]["trak_l1"] = {"module": "trak", "lambda_scale": 1.0}
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(workdir)
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = _jobs_run(res.stderr)
    n_runs = len(cfg["seeds"]) + len(cfg["placebo"]["seeds"])
    own = [w for rule, w in jobs if rule.startswith("score")]
    assert all("estimator=trak_l1" in w for w in own)
    assert len(own) == n_runs  # one job per seed: its factorization, then every draw and target kind
    metrics = pl.read_parquet(workdir / "results" / "wf" / "tables" / "metrics.parquet")
    auc = metrics.filter((pl.col("metric") == "auroc") & (pl.col("level") == "rollout") & (pl.col("stratum") == "all"))
    by = {
        e: auc.filter(pl.col("estimator") == e).sort("arm", "seed", "draw", "target")["value"]
        for e in ("trak", "trak_l1")
    }
    assert by["trak"].len() == by["trak_l1"].len() > 0 and not by["trak"].equals(by["trak_l1"])
    checklist = json.loads((workdir / "results" / "wf" / "checklist.json").read_text())
    assert {"trak", "trak_l1"} <= set(checklist["estimators"])
    # Another setting of the new instance: only its own jobs are planned again.
    cfg["estimators"]["trak_l1"]["lambda_scale"] = 2.0
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(workdir, "-n")
    assert res.returncode == 0, res.stderr[-3000:]
    planned = [line for line in (res.stdout + res.stderr).splitlines() if "estimator=" in line]
    assert planned and all("estimator=trak_l1" in line for line in planned)
    assert Instance.of("trak", {}).source_digest() == Instance.of("trak_l1", {"module": "trak"}).source_digest()
