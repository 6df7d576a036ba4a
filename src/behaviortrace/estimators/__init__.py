"""Attribution estimators and target-free controls, one module per estimator.

Each module here implements the contract in `behaviortrace.score.contract` (`Estimator`): a
`USES_TARGET` flag, a `STEP_AGGREGATE` and a `score(view, target, **params)` function, and optionally
`step_score`. Adding an estimator is one new module here and one entry under `estimators:` in the
config (an instance; docs/estimators.md).
"""
