"""The influence figure on a made-up influence table: one row per estimator, as the checklist judges it, and a
size a reader takes in at page width."""

import numpy as np
import polars as pl
from PIL import Image

from behaviortrace.influence.figure import influence_figure, spearman_rows
from behaviortrace.influence.table import COLUMNS

TARGETED = ["gas", "tracincp", "adam_tracin", "trak", "token_alignment"]
CONTROLS = ["norm", "fluency", "random", "advantage", "reward", "behavior", "behavior_advantage"]
LOG_ONLY = ["advantage", "reward", "behavior", "behavior_advantage"]


def _table(seeds=(0, 1, 2), draws=(0, 1)) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    rows = []

    def row(arm, seed, draw, estimator, target, level="rollout", stratum="all", metric="spearman"):
        value = float("nan") if estimator == "random" and seed == 0 else float(rng.uniform(-1, 1))
        rows.append((arm, seed, draw, estimator, target, level, stratum, None, "advantages", metric, value, 100))

    for arm in ("planted", "placebo"):
        for seed in seeds:
            row(arm, seed, None, "label", "none")
            row(arm, seed, None, "label", "none", metric="paid_share_of_positive_influence")
            for draw in draws:
                for est in TARGETED:
                    for target in ("in_context", "forced"):
                        row(arm, seed, draw, est, target)
                        row(arm, seed, draw, est, target, stratum="window")
                        row(arm, seed, draw, est, target, level="step")
                for est in CONTROLS:
                    row(arm, seed, draw, est, "none")
    return pl.DataFrame(rows, schema=COLUMNS, orient="row")


def test_the_figure_draws_the_cells_the_checklist_judges():
    table = _table()
    rows = spearman_rows(table, "forced")
    assert set(rows["arm"]) == {"planted"} and set(rows["level"]) == {"rollout"} and set(rows["stratum"]) == {"all"}
    assert set(rows["target"]) == {"forced", "none"} and set(rows["metric"]) == {"spearman"}
    # Every estimator on every seed and draw, the label once per seed.
    assert rows.filter(pl.col("estimator") != "label").height == len(TARGETED + CONTROLS) * 3 * 2
    assert rows.filter(pl.col("estimator") == "label")["seed"].sort().to_list() == [0, 1, 2]


def test_the_figure_fits_a_page(tmp_path):
    path = tmp_path / "influence.png"
    influence_figure(_table(), "forced", path, LOG_ONLY)
    image = np.asarray(Image.open(path).convert("L"))
    height, width = image.shape
    assert 500 <= width <= 1600 and 300 <= height <= 1200, image.shape
    assert image.std() > 10  # not a blank canvas
    assert not list(tmp_path.glob(".*.tmp.png"))
