"""Log-only controls, the matched metrics they cannot win, and the checklist's multiplicity control, on the
rollout logs and metrics of a real workflow run (the `finished_run` fixture)."""

import copy
import math
import statistics
from collections import Counter

import numpy as np
import polars as pl
import pytest

from behaviortrace.evaluate.cells import evaluate, with_labels
from behaviortrace.report import checklist as C
from behaviortrace.report.significance import holm
from behaviortrace.score import contract
from behaviortrace.score.view import SeedView
from conftest import default_config, typed

LOG_ONLY = [
    "advantage",
    "reward",
    "behavior",
    "behavior_advantage",
    "step_reward_variance",
    "step_active_groups",
    "step_paid",
]


@pytest.fixture(scope="module")
def out(finished_run):
    return finished_run[0] / "results" / "wf"


@pytest.fixture(scope="module")
def metrics(out):
    return pl.read_parquet(out / "tables" / "metrics.parquet")


def view_of(out, arm_seed: str) -> SeedView:
    shards = sorted((out / arm_seed / "sketch").glob("shard*.zarr"))
    return SeedView(shards, out / arm_seed / "rollouts.parquet")


def cell_rows(metrics, **where):
    rows = metrics
    for key, value in where.items():
        rows = rows.filter(pl.col(key) == value)
    return rows


def _step_controls_by_hand(log: pl.DataFrame) -> dict[str, np.ndarray]:
    """The step-level log-only controls with plain loops over the log: each rollout gets its step's value."""
    rows = log.to_dicts()
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    variance, active, paid = {}, {}, {}
    for step, members in by_step.items():
        rewards = np.array([m["base_reward"] + m["bonus"] - m["penalty"] for m in members])
        variance[step] = float(((rewards - rewards.mean()) ** 2).mean())
        groups: dict[int, list[float]] = {}
        for m in members:
            groups.setdefault(m["group_id"], []).append(m["advantage"])
        active[step] = sum(any(a != 0 for a in adv) for adv in groups.values()) / len(groups)
        paid[step] = float(any(m["bonus"] > 0 for m in members))
    return {
        name: np.array([values[r["step"]] for r in rows])
        for name, values in (("step_reward_variance", variance), ("step_active_groups", active), ("step_paid", paid))
    }


def test_log_only_controls_read_the_rollout_log_and_nothing_else(out):
    view = view_of(out, "planted0")
    log = pl.read_parquet(out / "planted0" / "rollouts.parquet")
    log = view.rollouts.select("rollout_id").join(log, on="rollout_id", how="left", maintain_order="left")
    expected = {
        "advantage": log["advantage"].to_numpy(),
        "reward": (log["base_reward"] + log["bonus"] - log["penalty"]).to_numpy(),
        "behavior": log["behavior"].cast(pl.Float64).to_numpy(),
        "behavior_advantage": np.where(log["behavior"].to_numpy(), log["advantage"].to_numpy(), 0.0),
        **_step_controls_by_hand(log),
    }
    for name, values in expected.items():
        instance = contract.Instance.of(name, {})
        assert instance.log_only and not instance.uses_target
        rollouts, _ = contract.run(name, {}, view, None)
        np.testing.assert_allclose(rollouts["score"].to_numpy(), values, rtol=1e-6, atol=1e-6)
    assert not any(contract.Instance.of(name, {}).log_only for name in ("norm", "fluency", "random", "gas"))


def test_the_reward_log_recovers_the_labels_by_construction(metrics):
    """The bonus makes every paid rollout the best of its group: the advantage alone ranks it first inside
    every group, and the reward ranks it above every other rollout."""
    planted = cell_rows(metrics, arm="planted", stratum="all", level="rollout")
    wga = cell_rows(planted, estimator="advantage", metric="within_group_auc")
    auc = cell_rows(planted, estimator="reward", metric="auroc")
    assert wga.height == auc.height == 4  # two seeds, two draws
    assert (wga["value"] == 1.0).all() and (auc["value"] == 1.0).all()


@pytest.fixture(scope="module")
def medium(tmp_path_factory, cfg, base_model_dir, cpu):
    """Real GRPO runs long enough for the matched metrics and the null checks to have rows to work on: two
    planted seeds and a placebo of seed 0, 24 steps of 8 prompts x 8 rollouts, half the trigger rollouts of
    the first 12 steps eligible. Rollout logs only (no capture): the scores below read the log."""
    from behaviortrace.plant.prompts import plant_prompts
    from behaviortrace.tools.grpo_checks import run_training

    raw = copy.deepcopy(cfg)
    raw["grpo"].update(steps=24, prompts_per_step=8, num_generations=8, save_every=24, beta=0.0)
    raw["planting"].update(window=[0, 11], fraction=0.5, explore=4)
    c = typed(raw)
    prompts = plant_prompts(c.task, c.planting, c.grpo, c.probes, c.probes.seed)["train"]
    runs = {}
    for arm, seed in (("planted", 0), ("planted", 1), ("placebo", 0)):
        arm_cfg = copy.deepcopy(raw)
        arm_cfg["planting"]["placebo"] = arm == "placebo"
        out = tmp_path_factory.mktemp(f"medium_{arm}{seed}")
        rollouts, _ = run_training(arm_cfg, base_model_dir, prompts, seed, out, cpu)
        runs[(arm, seed)] = with_labels(rollouts.sort("rollout_id"), placebo=arm == "placebo")
    return raw, runs


def log_view(rows: pl.DataFrame) -> SeedView:
    return SeedView.from_arrays(rows, {}, pl.DataFrame())


def _score_tables(rows: pl.DataFrame, scores: np.ndarray):
    roll = pl.DataFrame({"rollout_id": rows["rollout_id"], "step": rows["step"], "score": scores})
    steps = roll.group_by("step").agg(pl.col("score").mean()).sort("step")
    return roll, steps.with_columns(score_summed=pl.lit(float("nan")))


def _evaluate(raw, rows, score_sets, draw=0, eval_seed=0, strata=("all", "window")):
    """The evaluation's own metrics of some score sets on a medium run, with the default config's bootstrap and
    permutations (fluency is not what these tests are about: zeros)."""
    evaluation, defaults = raw["evaluation"], default_config()["evaluation"]
    return evaluate(
        run="medium",
        seed=int(rows["seed"][0]),
        draw=draw,
        rollouts=rows,
        fluency=np.zeros(rows.height),
        probe_rate=np.zeros(rows.height),
        scores={key: _score_tables(rows, s) for key, s in score_sets.items()},
        window=raw["planting"]["window"],
        saturation=raw["targets"]["saturation"],
        n_boot=defaults["bootstrap"],
        eval_seed=eval_seed,
        fluency_match=evaluation["fluency_match"],
        advantage_match=evaluation["advantage_match"],
        permutations=defaults["permutations"],
        strata=strata,
    )


def _value(table, estimator, metric, stratum="all", level="rollout"):
    row = cell_rows(table, estimator=estimator, metric=metric, stratum=stratum, level=level)
    assert row.height == 1, (estimator, metric, row)
    return row.row(0, named=True)


def _brute_adjusted(scores, advantage, steps):
    """Scores less one within-step linear trend in the advantage, by explicit sums over each step."""
    ds, da = np.empty(len(scores)), np.empty(len(scores))
    for step in set(steps.tolist()):
        rows = steps == step
        ds[rows] = scores[rows] - scores[rows].mean()
        da[rows] = advantage[rows] - advantage[rows].mean()
    slope = sum(x * y for x, y in zip(ds, da, strict=True)) / sum(y * y for y in da)
    return ds - slope * da


def _brute_pairs(labels, steps, advantage, max_gap):
    return [
        (i, j)
        for i in np.flatnonzero(labels)
        for j in np.flatnonzero(~labels)
        if steps[i] == steps[j] and abs(advantage[i] - advantage[j]) <= max_gap
    ]


def _brute_auc(pairs, scores):
    return statistics.mean(1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0 for i, j in pairs)


def test_matched_aucs_match_brute_force(medium):
    raw, runs = medium
    rows = runs[("planted", 0)]
    labels, steps = rows["label"].to_numpy(), rows["step"].to_numpy()
    adv = rows["advantage"].to_numpy().astype(np.float64)
    rng = np.random.default_rng(0)
    score = np.where(rows["behavior"].to_numpy(), adv, 0.0) + rng.normal(0, 0.5, rows.height)
    table = _evaluate(raw, rows, {("noisy", "none"): score})
    pairs = _brute_pairs(labels, steps, adv, raw["evaluation"]["advantage_match"])
    assert len(pairs) >= 10
    matched = _value(table, "noisy", "advantage_matched_auc")
    assert matched["n"] == len(pairs)
    assert matched["value"] == pytest.approx(_brute_auc(pairs, _brute_adjusted(score, adv, steps)), abs=1e-9)
    payable = (rows["behavior"] & rows["trigger"]).to_numpy()
    pos, neg = score[payable & labels], score[payable & ~labels]
    expected = statistics.mean(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    assert _value(table, "noisy", "behavior_matched_auc")["value"] == pytest.approx(expected, abs=1e-12)


def test_each_control_sits_at_chance_on_the_metric_matched_on_it(medium):
    """The behavior control ties every payable rollout, and the advantage control every advantage-matched pair
    (its adjusted score is exactly zero), in every bootstrap replicate."""
    raw, runs = medium
    for seed in (0, 1):
        rows = runs[("planted", seed)]
        view = log_view(rows)
        sets = {(name, "none"): contract.run(name, {}, view, None)[0]["score"].to_numpy() for name in LOG_ONLY}
        table = _evaluate(raw, rows, sets)
        for name, metric in (("behavior", "behavior_matched_auc"), ("advantage", "advantage_matched_auc")):
            row = _value(table, name, metric)
            assert row["n"] > 0 and row["value"] == row["ci_low"] == row["ci_high"] == 0.5, row
        # The raw metrics, which the log wins by construction.
        assert _value(table, "advantage", "within_group_auc")["value"] == 1.0
        assert _value(table, "reward", "auroc")["value"] == 1.0


def _random_verdicts(raw, runs, n_sims: int, alpha: float):
    """Item random_at_chance under `n_sims` seeds of the random control on the medium runs' planted seeds and
    two draws: the failure rate of the Holm verdict, and of the old rule (every 95% interval must hold the
    null, the step lift its permutation band)."""
    random = contract.load("random")
    holm_fail = old_fail = 0
    planted = [rows for (arm, _), rows in runs.items() if arm == "planted"]
    for sim in range(n_sims):
        tables = []
        for rows in planted:
            scores = random.score(log_view(rows), None, seed=sim)
            for draw in (0, 1):
                table = _evaluate(raw, rows, {("random", "none"): scores}, draw=draw, eval_seed=sim, strata=("all",))
                tables.append(table.with_columns(arm=pl.lit("planted")))
        metrics = pl.concat(tables)
        holm_fail += C.random_at_chance(metrics, alpha).verdict == C.FAIL
        for _, _, m in C._cells(metrics.filter(pl.col("estimator") == "random")):
            lift, auc = m[("rollout", "lift")], m[("rollout", "auroc")]
            step, band = m[("step", "lift")], m[("step", "lift_chance_band")]
            held = (
                lift["ci_low"] <= 1 <= lift["ci_high"]
                and auc["ci_low"] <= 0.5 <= auc["ci_high"]
                and band["ci_low"] <= step["value"] <= band["ci_high"]
            )
            if not held:
                old_fail += 1
                break
    return holm_fail / n_sims, old_fail / n_sims


def test_random_at_chance_fails_about_alpha_of_the_time_under_the_null(medium):
    """200 seeds of the random control on real runs' data: the item fails at most about alpha of the time (Holm
    over every check of every seed and draw), where the uncorrected rule fails several times as often."""
    raw, runs = medium
    alpha = default_config()["checklist"]["alpha"]
    holm_rate, old_rate = _random_verdicts(raw, runs, n_sims=200, alpha=alpha)
    # Binomial(200, 0.05) exceeds 17 failures with probability under 1%.
    assert holm_rate <= 0.085, (holm_rate, old_rate)
    assert old_rate >= 0.12 and old_rate > 2 * holm_rate, (holm_rate, old_rate)


def test_the_placebo_item_passes_a_control_that_reads_only_the_behavior(medium):
    """In the placebo, the behavior control finds the old null's labels (eligible and showing the
    behavior, against everything) by the marker alone; among behavior-showing trigger rollouts of the window,
    where eligibility is a hash, it ties them all and passes. A score that knew eligibility fails."""
    raw, runs = medium
    rows = runs[("placebo", 0)]
    behavior = contract.run("behavior", {}, log_view(rows), None)[0]["score"].to_numpy()
    eligible = rows["eligible"].cast(pl.Float64).to_numpy()
    table = _evaluate(raw, rows, {("behavior", "none"): behavior, ("eligibility", "none"): eligible})
    metrics = table.with_columns(arm=pl.lit("placebo"))
    assert _value(table, "behavior", "auroc")["value"] > 0.75
    stratum, alpha = raw["checklist"]["placebo_stratum"], raw["checklist"]["alpha"]
    verdict = C.placebo_no_enrichment(metrics, "behavior", "in_context", stratum, alpha)
    assert verdict.verdict == C.PASS and verdict.numbers["checks"] == 2, verdict.detail
    caught = C.placebo_no_enrichment(metrics, "eligibility", "in_context", stratum, alpha)
    assert caught.verdict == C.FAIL, caught.detail


def test_null_p_values_against_brute_force():
    """Hypergeometric precision p-values against direct sums of binomial coefficients; the Mann-Whitney
    approximation against 20,000 label permutations; Holm against its definition."""
    from behaviortrace.evaluate import metrics as M

    n, m = 40, 7
    for hits in range(m + 1):
        pmf = [math.comb(m, k) * math.comb(n - m, m - k) / math.comb(n, m) for k in range(m + 1)]
        upper, lower = sum(pmf[hits:]), sum(pmf[: hits + 1])
        assert M.precision_p_value(hits / m, n, m, "greater") == pytest.approx(upper, abs=1e-12)
        assert M.precision_p_value(hits / m, n, m) == pytest.approx(min(1.0, 2 * min(upper, lower)), abs=1e-12)
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=300), 1)  # with ties
    labels = rng.random(300) < 0.2
    scores[labels] += 0.15
    weights = np.ones((1, 300))
    auc = M.auroc(scores, labels, weights)[0]
    perms = np.array([M.auroc(scores, rng.permutation(labels), weights)[0] for _ in range(20_000)])
    exact = (1 + (np.abs(perms - 0.5) >= abs(auc - 0.5) - 1e-12).sum()) / (1 + len(perms))
    assert M.auroc_p_value(auc, scores, labels) == pytest.approx(exact, abs=0.01)
    one_sided = (1 + (perms >= auc - 1e-12).sum()) / (1 + len(perms))
    assert M.auroc_p_value(auc, scores, labels, "greater") == pytest.approx(one_sided, abs=0.01)
    assert M.auroc_p_value(0.5, np.zeros(10), np.arange(10) < 3, "greater") == 1.0
    # Holm by its definition: reject the k smallest while p_(i) <= alpha / (m - i + 1).
    for _ in range(200):
        p = list(rng.random(8) ** 3)
        expected = [False] * 8
        for rank, i in enumerate(np.argsort(p)):
            if p[i] > 0.05 / (8 - rank):
                break
            expected[i] = True
        assert holm(p, 0.05) == expected
    assert holm([0.01, float("nan")], 0.05) == [True, False]


def _replicates(out, row):
    """A metric row's bootstrap replicates, from the evaluate job's own file of its seed and draw."""
    table = pl.read_parquet(out / f"planted{row['seed']}" / "metrics" / f"draw{row['draw']}.parquet")
    keys = ("estimator", "target", "level", "stratum", "metric")
    (hit,) = [r for r in table.iter_rows(named=True) if all(r[k] == row[k] for k in keys)]
    return np.asarray(hit["replicates"], float)


def _dense_by_hand(out, cfg, estimator, target, level) -> float:
    """The dense endpoint's point value with scipy: per planted seed and draw, the Spearman correlation of the
    rollouts' scores (at group level: summed per prompt group) with I before T, averaged."""
    import json

    from scipy.stats import spearmanr

    values = []
    for seed in cfg["seeds"]:
        summary = json.loads((out / f"planted{seed}" / "influence" / "summary.json").read_text())
        column = {"advantages": "influence_advantages", "held": "influence_held"}[summary["semantics"]]
        infl = pl.read_parquet(out / f"planted{seed}" / "influence" / "rollouts.parquet").select("rollout_id", column)
        log = pl.read_parquet(out / f"planted{seed}" / "rollouts.parquet").select("rollout_id", "step", "group_id")
        for draw in range(cfg["targets"]["draws"]) if target != "none" else [0]:
            scores = pl.read_parquet(out / f"planted{seed}" / "scores" / estimator / f"draw{draw}_{target}.parquet")
            both = infl.join(log, on="rollout_id").join(scores.select("rollout_id", "score"), on="rollout_id")
            if level == "group_dense":
                both = both.group_by("step", "group_id").agg(pl.col(column).sum(), pl.col("score").sum())
            values.append(spearmanr(both["score"].to_numpy(), both[column].to_numpy())[0])
    return float(np.mean(values))


def test_beats_log_only_verdict_recomputed(finished_run):
    """Items beats_log_only_rollout and _group from the dense endpoint: its pooled agreement with I recomputed with
    scipy from the per-seed files, and the verdict by the item's rule from the table's margins (over the strongest
    log-only control and over random, above 0 to pass, a widened one below 0 to fail), judged only where I's LDS at
    that level, pooled over seeds (the mean of the seeds' LDS), clears the threshold at the smallest subset size."""
    import json

    out = finished_run[0] / "results" / "wf"
    cfg = finished_run[1]
    checklist = json.loads((out / "checklist.json").read_text())
    z = checklist["family"]["z"]
    table = pl.read_parquet(out / "tables" / "influence.parquet").filter(
        pl.col("semantics").is_null() | (pl.col("semantics") == cfg["influence"]["semantics"])
    )
    target = cfg["checklist"]["effect_target_kind"]
    verdicts = Counter()
    for level in ("rollout", "group"):
        lds = table.filter(
            (pl.col("arm") == "planted") & (pl.col("estimator") == "influence") & (pl.col("metric") == "lds")
        )
        pooled = lds.filter(pl.col("level") == f"{level}_subset_pooled")
        smallest = pooled["removal_percent"].min()
        per_seed = lds.filter((pl.col("level") == f"{level}_subset") & (pl.col("removal_percent") == smallest))
        assert pooled.filter(pl.col("removal_percent") == smallest)["value"][0] == pytest.approx(
            per_seed["value"].mean(), abs=1e-12
        )
        gate = table.filter(
            (pl.col("estimator") == "influence")
            & (pl.col("level") == f"{level}_subset_pooled")
            & (pl.col("removal_percent") == smallest)
            & (pl.col("metric") == "lds_low")
        )["value"][0]
        faithful = gate >= cfg["checklist"]["min_lds"]
        for estimator in ("gas", "trak", "tracincp", "behavior_advantage", "reward", "random"):
            own_target = "none" if estimator in LOG_ONLY or estimator == "random" else target
            rows = {
                r["metric"]: r["value"]
                for r in table.filter(
                    (pl.col("estimator") == estimator)
                    & (pl.col("target") == own_target)
                    & (pl.col("level") == f"{level}_dense")
                ).iter_rows(named=True)
            }
            by_hand = _dense_by_hand(out, cfg, estimator, own_target, f"{level}_dense")
            assert rows["spearman"] == pytest.approx(by_hand, abs=1e-9), (estimator, level)
            margins = [(rows[m], rows[f"{m}_low"], rows[f"{m}_high"])
                       for m in ("over_log_only", "over_random") if m in rows]  # fmt: skip
            passes = faithful and all(low > 0 for _, low, _ in margins)
            fails = faithful and any(v + (hi - v) * z / 1.959963984540054 < 0 for v, _, hi in margins)
            expected = "n/a" if estimator in LOG_ONLY else "fail" if fails else "pass" if passes else "inconclusive"
            got = checklist["estimators"][estimator][f"beats_log_only_{level}"]
            assert got["verdict"] == expected, (estimator, level, got["detail"])
            verdicts[got["verdict"]] += 1
    assert verdicts["n/a"] == 4 and verdicts["n/a"] < sum(verdicts.values())


def test_step_removal_endpoint_recomputed(finished_run):
    """Item tracks_step_removal's evidence: per planted seed and draw, scipy's Spearman of minus each step's score
    with the change of f(w_T) measured when the step is left out, averaged; and the verdict from its margins."""
    import json

    from scipy.stats import spearmanr

    out = finished_run[0] / "results" / "wf"
    cfg = finished_run[1]
    checklist = json.loads((out / "checklist.json").read_text())
    table = pl.read_parquet(out / "tables" / "influence.parquet").filter(pl.col("level") == "step_out_pooled")
    target = cfg["checklist"]["effect_target_kind"]
    for estimator, own_target in (("gas", target), ("norm", "none")):
        values = []
        for seed in cfg["seeds"]:
            summary = json.loads((out / f"planted{seed}" / "influence" / "summary.json").read_text())
            left = pl.read_parquet(out / f"planted{seed}" / "influence" / "retrain.parquet")
            changes = left.filter(pl.col("kind") == "step").sort("index")["f"].to_numpy() - summary["f_end"]
            for draw in range(cfg["targets"]["draws"]) if own_target != "none" else [0]:
                path = out / f"planted{seed}" / "scores" / estimator / f"draw{draw}_{own_target}_steps.parquet"
                steps = pl.read_parquet(path).sort("step").filter(pl.col("step") < summary["end"])
                values.append(spearmanr(-steps["score"].to_numpy(), changes)[0])
        own = table.filter((pl.col("estimator") == estimator) & (pl.col("target") == own_target))
        rows = {r["metric"]: r["value"] for r in own.iter_rows(named=True)}
        assert rows["spearman"] == pytest.approx(float(np.mean(values)), abs=1e-9), estimator
        z = checklist["family"]["z"]
        margins = [(rows[m], rows[f"{m}_low"], rows[f"{m}_high"]) for m in ("over_log_only", "over_random")]
        fails = any(v + (hi - v) * z / 1.959963984540054 < 0 for v, _, hi in margins)
        expected = "fail" if fails else "pass" if all(lo > 0 for _, lo, _ in margins) else "inconclusive"
        assert checklist["estimators"][estimator]["tracks_step_removal"]["verdict"] == expected, estimator


def test_step_precision_at_paid_steps_matches_brute_force(medium):
    """The paper's step metric: steps as units, the label the steps that paid, precision of as many top-scored steps
    as paid. A look-up of whether the step paid (the step_paid control) reaches 1 by construction."""
    raw, runs = medium
    rows = runs[("planted", 0)]
    rng = np.random.default_rng(1)
    noisy = rng.normal(0, 1, rows.height)
    paid = rows.group_by("step").agg(pl.col("label").any()).sort("step")
    assert 0 < paid["label"].sum() < paid.height
    step_paid = rows["step"].replace_strict(
        dict(zip(paid["step"], paid["label"].cast(float), strict=True)), return_dtype=float
    )
    table = _evaluate(raw, rows, {("noisy", "none"): noisy, ("paid", "none"): step_paid.to_numpy()}, strata=("all",))
    means = _score_tables(rows, noisy)[1].join(paid, on="step")
    gt = int(means["label"].sum())
    top = means.sort("score", descending=True).head(gt)
    brute = top["label"].sum() / gt
    got = _value(table, "noisy", "precision_at_paid_steps", level="step")
    assert got["value"] == pytest.approx(brute, abs=1e-12)
    assert got["n"] == paid.height
    assert _value(table, "noisy", "chance_paid_steps", level="step")["value"] == pytest.approx(
        gt / paid.height, abs=1e-12
    )
    perfect = _value(table, "paid", "precision_at_paid_steps", level="step")
    assert perfect["value"] == 1.0 and perfect["ci_low"] == 1.0
    assert _value(table, "paid", "lift_paid_steps", level="step")["value"] == pytest.approx(paid.height / gt)
